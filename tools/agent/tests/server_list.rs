//! `peloton-agent --server` with several addresses, against real
//! `pelotond`s: a dead first address is skipped, and when the server goes
//! away and comes back at another address of the list (the same data
//! directory, as a new leader would have the same state), the agent finds
//! it and hands over its running task, which is taken over, not run again.
//! With two servers on one PostgreSQL (from the system's packages): the
//! agent registers through the standby, which names the leader, and when
//! the leader is SIGKILLed it follows the standby that takes over, its task
//! still running.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::{
    Clients, Cluster, TOKEN, agent_tls_args, eventually, free_port, job, kill_processes_with_env,
    pki, sibling, task_spec, url, within,
};
use peloton_proto::v1 as pb;
use peloton_proto::v1::JobState;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_skips_a_dead_address_and_follows_the_server_to_the_next() {
    let mut cluster = Cluster::start(0).await;
    let next_port = free_port();
    // Nothing listens on port 1: connections are refused.
    let servers = format!("{},{},{}", url(1), url(cluster.port), url(next_port));
    cluster.start_agent_at("a0", &servers).await;
    cluster.wait_hosts_up(1).await;
    let id = cluster.create(job("moves", 1, task_spec("sleep 3"))).await;
    let before = cluster.wait_running(&id, 1).await;
    let run = before[0].current.as_ref().expect("run").run_id;

    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    cluster.port = next_port;
    cluster.start_server().await;

    cluster.wait_job(&id, JobState::Succeeded).await;
    let task = cluster.task(&id, 0).await.expect("task");
    let current = task.current.expect("run");
    assert_eq!(
        current.run_id, run,
        "taken over, not run again: {current:?}"
    );
    assert_eq!(current.host, "a0");
}

/// A throwaway PostgreSQL for this test binary, from the system's packages
/// (started from a thread that never ends: the server dies with that
/// thread). Fails the test when PostgreSQL is missing.
fn local_postgres() -> &'static peloton_gateway::local_pg::LocalPostgres {
    static PG: std::sync::OnceLock<peloton_gateway::local_pg::LocalPostgres> =
        std::sync::OnceLock::new();
    PG.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(peloton_gateway::local_pg::LocalPostgres::start(false));
            loop {
                std::thread::park();
            }
        });
        rx.recv()
            .expect("the PostgreSQL starter")
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e:#}"))
    })
}

/// The bootstrap admin token of both servers on the shared database: it is
/// each server's configuration (not stored), so the pair is given the same.
const ADMIN_TOKEN: &str = "pel_test_admin_token_of_the_failover_pair";

/// A `pelotond` on the shared database `store`, on `port`, secure with the
/// test certificates and [`ADMIN_TOKEN`]; returns once its stdout has
/// printed a line starting with `wait_for`.
async fn pelotond(dir: &Path, name: &str, port: u16, store: &str, wait_for: &str) -> Child {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(&config, format!("admin_token: {ADMIN_TOKEN}\n")).expect("config file");
    let pki = pki();
    let mut child = Command::new(sibling("pelotond"))
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join(name))
        .arg("--tls-cert")
        .arg(&pki.server_cert)
        .arg("--tls-key")
        .arg(&pki.server_key)
        .arg("--tls-client-ca")
        .arg(&pki.ca_file)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--store", store, "--lease-ms", "1500"])
        .args(["--no-metrics", "--agent-token", TOKEN])
        .args(["--host-lost-after-ms", "20000", "--cycle-interval-ms", "5"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("pelotond starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    within(&format!("pelotond {name}: {wait_for}"), async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if line.starts_with(wait_for) {
                return;
            }
        }
        panic!("pelotond {name} exited before: {wait_for}");
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_registers_through_a_standby_and_follows_the_leader_over_a_failover() {
    let store = tokio::task::spawn_blocking(|| local_postgres().create_db("agent_failover"))
        .await
        .expect("create_db")
        .expect("database");
    let dir = tempfile::tempdir().expect("temp dir");
    let (first_port, second_port) = (free_port(), free_port());
    let mut first = pelotond(
        dir.path(),
        "first",
        first_port,
        &store,
        "pelotond: serving gRPC on",
    )
    .await;
    let _second = pelotond(
        dir.path(),
        "second",
        second_port,
        &store,
        "pelotond: listening on",
    )
    .await;
    let leader = Clients::new(first_port, &pki().ca_file, ADMIN_TOKEN);
    leader
        .pools
        .clone()
        .create(pb::CreatePoolRequest {
            path: "/t".into(),
            spec: Some(pb::PoolSpec {
                reservation: Some(pb::Resources {
                    cpu: 1.0,
                    memory_mb: 512.0,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .expect("pool");

    // The standby first: it names the leader, where the agent registers.
    let work = dir.path().join("agents").join("a0");
    std::fs::create_dir_all(&work).expect("work dir");
    let _agent = Command::new(env!("CARGO_BIN_EXE_peloton-agent"))
        .args([
            "--server",
            &format!("{},{}", url(second_port), url(first_port)),
        ])
        .args(agent_tls_args(&dir.path().join("certs"), "a0"))
        .arg("--work-dir")
        .arg(&work)
        .args(["--host", "a0", "--token", TOKEN])
        .args(["--resources", "cpu=4,mem=4096,disk=10000"])
        .args(["--isolation", "rlimit"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts");
    let host_up = async |clients: &Clients| {
        let mut hosts = clients.hosts.clone();
        let hosts = hosts.list(pb::ListHostsRequest::default()).await.ok()?;
        hosts
            .into_inner()
            .hosts
            .iter()
            .any(|h| h.name == "a0" && h.connected && h.state() == pb::HostState::Up)
            .then_some(())
    };
    eventually("a0 up at the leader", async || host_up(&leader).await).await;
    let mut jobs = leader.jobs.clone();
    let id = jobs
        .create(pb::CreateJobRequest {
            spec: Some(job("failover", 1, task_spec("sleep 6"))),
        })
        .await
        .expect("job")
        .into_inner()
        .job
        .expect("job")
        .id;
    let task = |clients: &Clients| {
        let mut tasks = clients.tasks.clone();
        let id = id.clone();
        async move {
            tasks
                .get(pb::GetTaskRequest {
                    job_id: id,
                    instance: 0,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().task)
        }
    };
    let run = eventually("the task running", async || {
        let current = task(&leader).await?.current?;
        (current.state() == pb::TaskState::Running).then_some(current.run_id)
    })
    .await;

    // The leader dies; the standby takes the lease, and the agent, whose
    // session broke, finds it and hands the running task over.
    first.kill().await.expect("SIGKILL the leader");
    let new_leader = Clients::new(second_port, &pki().ca_file, ADMIN_TOKEN);
    eventually("a0 up at the new leader", async || {
        host_up(&new_leader).await
    })
    .await;
    let done = eventually("the task succeeded at the new leader", async || {
        let current = task(&new_leader).await?.current?;
        (current.state() == pb::TaskState::Succeeded).then_some(current)
    })
    .await;
    assert_eq!(done.run_id, run, "taken over, not run again: {done:?}");
    assert_eq!(done.host, "a0");
    kill_processes_with_env(&format!("PELOTON_SANDBOX={}", dir.path().display()));
}
