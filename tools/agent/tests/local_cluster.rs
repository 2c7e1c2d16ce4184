//! `pelotond --local-agents N` as the quick start runs it: real server, real
//! agents (its children), real tasks. Ctrl-C stops the tasks (each with its
//! kill grace period, so a task sees SIGTERM first) and the agents, without
//! an error in any log; `--keep-tasks-on-exit` leaves them running for the
//! next start, whose agents take them over. SIGHUP stops the cluster as
//! Ctrl-C does; if the server dies (SIGKILL), its agents stop their tasks
//! and exit all the same. The agents share the machine's cores and memory
//! and get the token by file, not on their command line. The server is
//! secure, as by default: it makes its CA in its data dir, gives each agent
//! a certificate naming its host, and the tests' clients use TLS with its
//! admin token.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::{Clients, eventually, processes_with_env, sibling, within};
use peloton_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running `pelotond --local-agents 3` on a data dir.
struct LocalCluster {
    server: Child,
    data: PathBuf,
    stdout: Arc<Mutex<String>>,
    /// local-N → pid.
    agents: BTreeMap<String, u32>,
    /// The server exited after a Ctrl-C (and its agents with it).
    stopped: bool,
    c: Clients,
}

impl LocalCluster {
    async fn start(data: &Path, extra: &[&str]) -> LocalCluster {
        let mut server = Command::new(sibling("pelotond"))
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--no-metrics"])
            .args(["--local-agents", "3", "--cycle-interval-ms", "5"])
            .arg("--agent-bin")
            .arg(env!("CARGO_BIN_EXE_peloton-agent"))
            .args(extra)
            .stdout(Stdio::piped())
            // The server's log, kept for the checks at the end.
            .stderr(std::fs::File::create(data.with_extension("server.log")).expect("log"))
            .kill_on_drop(true)
            .spawn()
            .expect("pelotond starts");
        let stdout = Arc::new(Mutex::new(String::new()));
        let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
        let seen = stdout.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut seen = seen.lock().unwrap();
                seen.push_str(&line);
                seen.push('\n');
            }
        });
        let (port, agents) = eventually("pelotond to serve and start 3 agents", async || {
            let out = stdout.lock().unwrap().clone();
            let port = out
                .lines()
                .find_map(|l| l.strip_prefix("pelotond: serving gRPC on https://"))?
                .rsplit(':')
                .next()?
                .parse::<u16>()
                .ok()?;
            let agents: BTreeMap<String, u32> = out
                .lines()
                .filter_map(|l| l.strip_prefix("pelotond: started agent "))
                .filter_map(|l| {
                    let (name, rest) = l.split_once(" (pid ")?;
                    let pid = rest.split([',', ')']).next()?.parse().ok()?;
                    Some((name.to_owned(), pid))
                })
                .collect();
            (agents.len() == 3).then_some((port, agents))
        })
        .await;
        let cluster = LocalCluster {
            server,
            data: data.to_path_buf(),
            stdout,
            agents,
            stopped: false,
            // The server made its CA and admin token in its data dir.
            c: Clients::of_data_dir(port, data),
        };
        eventually("3 local hosts up", async || {
            let mut hosts = cluster.c.hosts.clone();
            let list = hosts.list(pb::ListHostsRequest::default()).await.ok()?;
            let up = list
                .into_inner()
                .hosts
                .into_iter()
                .filter(|h| h.state() == pb::HostState::Up && h.connected)
                .collect::<Vec<_>>();
            (up.len() == 3).then_some(())
        })
        .await;
        cluster
    }

    fn sandbox_marker(&self) -> String {
        format!("PELOTON_SANDBOX={}", self.data.display())
    }

    /// Ctrl-C, as a terminal sends it to the server, and its exit.
    async fn interrupt(&mut self) {
        self.stop_with(nix::sys::signal::Signal::SIGINT).await;
    }

    /// `signal` to the server, and its exit (with success).
    async fn stop_with(&mut self, signal: nix::sys::signal::Signal) {
        let pid = self.server.id().expect("server pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            signal,
        )
        .expect("signal the server");
        let status = within("pelotond to stop", self.server.wait())
            .await
            .expect("wait");
        self.stopped = true;
        assert!(status.success(), "pelotond exited with {status}");
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    async fn create_pool(&self) {
        let mut pools = self.c.pools.clone();
        let pool = pb::CreatePoolRequest {
            path: "/t".into(),
            spec: Some(pb::PoolSpec {
                reservation: Some(pb::Resources {
                    cpu: 0.3,
                    memory_mb: 256.0,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        match pools.create(pool).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::AlreadyExists => {}
            Err(s) => panic!("pool: {s}"),
        }
    }

    /// A service of `n` tasks that note a SIGTERM in their sandbox
    /// (`got-term`) and exit.
    async fn create_service(&self, n: u32) -> String {
        let mut jobs = self.c.jobs.clone();
        let spec = pb::JobSpec {
            name: "sleepers".into(),
            r#type: pb::JobType::Service as i32,
            pool: "/t".into(),
            instance_count: n,
            default_task: Some(pb::TaskSpec {
                shell: "trap 'echo term > got-term; exit 0' TERM; sleep 1000 & wait".into(),
                resources: Some(pb::Resources {
                    cpu: 0.1,
                    memory_mb: 64.0,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        jobs.create(pb::CreateJobRequest { spec: Some(spec) })
            .await
            .expect("create job")
            .into_inner()
            .job
            .expect("job")
            .id
    }

    /// The job's tasks once all `n` are running.
    async fn wait_running(&self, id: &str, n: u32) -> Vec<pb::Task> {
        eventually(&format!("{n} tasks of {id} running"), async || {
            let mut tasks = self.c.tasks.clone();
            let list = tasks
                .list(pb::ListTasksRequest {
                    job_id: id.into(),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner()
                .tasks;
            let running = list
                .iter()
                .filter(|t| {
                    t.current
                        .as_ref()
                        .is_some_and(|r| r.state() == pb::TaskState::Running)
                })
                .count();
            (running == n as usize).then_some(list)
        })
        .await
    }

    /// Every sandbox directory of the local agents.
    fn sandboxes(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for agent in self.agents.keys() {
            let dir = self.data.join("agents").join(agent).join("sandboxes");
            if let Ok(entries) = std::fs::read_dir(dir) {
                out.extend(entries.flatten().map(|e| e.path()));
            }
        }
        out
    }

    /// Everything the server and the agents logged.
    fn logs(&self) -> String {
        let mut all =
            std::fs::read_to_string(self.data.with_extension("server.log")).unwrap_or_default();
        for agent in self.agents.keys() {
            let log = self.data.join("agents").join(format!("{agent}.log"));
            all.push_str(&std::fs::read_to_string(log).unwrap_or_default());
        }
        all
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // Whatever a failed test left: the server, its agents, the tasks.
        let _ = self.server.start_kill();
        // (Once stopped, their pids may belong to someone else.)
        for pid in self.agents.values().filter(|_| !self.stopped) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        common::kill_processes_with_env(&self.sandbox_marker());
    }
}

/// Whether a process with this pid exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// Waits until each of the `n` sleepers runs its `sleep`, which it starts
/// after setting its trap: from then on a SIGTERM is noted in its sandbox.
async fn until_sleepers_trap(marker: &str, n: usize) {
    until("the tasks' `sleep`s", || {
        processes_with_env(marker)
            .iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "sleep")
            })
            .count()
            >= n
    })
    .await;
}

/// The sandboxes whose task noted a SIGTERM.
fn sandboxes_with_term(cluster: &LocalCluster) -> usize {
    cluster
        .sandboxes()
        .iter()
        .filter(|s| s.join("got-term").exists())
        .count()
}

/// Polls until `check` holds (processes take a moment to be reaped).
async fn until(what: &str, check: impl Fn() -> bool) {
    eventually(what, async || check().then_some(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_on_the_local_cluster_stops_its_tasks_and_agents_quietly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut cluster = LocalCluster::start(&data, &[]).await;

    // The token is passed by a file only its owner may read, never on a
    // command line.
    let token_file = data.join("agent-token");
    let token = std::fs::read_to_string(&token_file).expect("token file");
    let token = token.trim();
    assert!(!token.is_empty());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", token_file.display());
    for (name, pid) in &cluster.agents {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(token), "{name}: {cmdline}");
        assert!(cmdline.contains("--token-file"), "{name}: {cmdline}");
        // Its own certificate, from the server's CA, for its host.
        let cert = data.join("agents").join(name).join("agent.pem");
        assert!(
            cmdline.contains(&format!("--cert-file {}", cert.display())),
            "{name}: {cmdline}"
        );
    }

    // The agents share the machine: together they offer its cores and
    // memory, not three times them.
    let mut hosts = cluster.c.hosts.clone();
    let list = hosts
        .list(pb::ListHostsRequest::default())
        .await
        .expect("hosts")
        .into_inner()
        .hosts;
    let cores = std::thread::available_parallelism().unwrap().get() as f64;
    let cpu: f64 = list.iter().map(|h| h.capacity.unwrap().cpu).sum();
    assert!(cpu <= cores + 0.001, "{cpu} cores offered on {cores}");
    assert!(cpu > cores * 0.9, "{cpu} cores offered on {cores}");
    let mem_total_mb = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap()
        / 1024.0;
    let mem: f64 = list.iter().map(|h| h.capacity.unwrap().memory_mb).sum();
    assert!(mem <= mem_total_mb, "{mem} MiB offered of {mem_total_mb}");

    cluster.create_pool().await;
    let id = cluster.create_service(3).await;
    cluster.wait_running(&id, 3).await;
    let marker = cluster.sandbox_marker();
    until_sleepers_trap(&marker, 3).await;

    cluster.interrupt().await;
    assert!(
        cluster
            .stdout()
            .contains("stopping the local agents and their tasks"),
        "{}",
        cluster.stdout()
    );
    // Nothing of the cluster is left: no task, no agent.
    let left = processes_with_env(&marker);
    assert!(left.is_empty(), "task processes left: {left:?}");
    for (name, pid) in &cluster.agents {
        assert!(!alive(*pid), "agent {name} (pid {pid}) still runs");
    }
    // Each task was asked first (SIGTERM), not just SIGKILLed.
    assert_eq!(
        sandboxes_with_term(&cluster),
        3,
        "sandboxes: {:?}",
        cluster.sandboxes()
    );
    // An orderly stop is no error, and nothing broke.
    let logs = cluster.logs();
    let lower = logs.to_lowercase();
    for bad in ["broken pipe", "brokenpipe", "session broke", "reconnecting"] {
        assert!(!lower.contains(bad), "{bad:?} in the logs:\n{logs}");
    }
    for level in ["ERROR", "WARN"] {
        assert!(!logs.contains(level), "{level} in the logs:\n{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_tasks_on_exit_leaves_the_tasks_to_the_next_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut first = LocalCluster::start(&data, &["--keep-tasks-on-exit"]).await;
    first.create_pool().await;
    let id = first.create_service(1).await;
    let before = first.wait_running(&id, 1).await;
    let marker = first.sandbox_marker();
    first.interrupt().await;
    assert!(
        first.stdout().contains("their tasks keep running"),
        "{}",
        first.stdout()
    );
    let left = processes_with_env(&marker);
    assert!(!left.is_empty(), "the task should still run");

    // The next start's agents take the run over: the same run, still
    // running; this time Ctrl-C stops it.
    let mut second = LocalCluster::start(&data, &[]).await;
    let after = second.wait_running(&id, 1).await;
    let run = |t: &[pb::Task]| t[0].current.as_ref().map(|r| r.launch_id);
    assert_eq!(run(&before), run(&after));
    for pid in &left {
        assert!(alive(*pid), "pid {pid} of the adopted run");
    }
    second.interrupt().await;
    let left = processes_with_env(&marker);
    assert!(left.is_empty(), "task processes left: {left:?}");
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_the_local_cluster_like_ctrl_c() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut cluster = LocalCluster::start(&data, &[]).await;
    cluster.create_pool().await;
    let id = cluster.create_service(2).await;
    cluster.wait_running(&id, 2).await;
    let marker = cluster.sandbox_marker();
    until_sleepers_trap(&marker, 2).await;

    // The terminal closed: the same orderly stop as Ctrl-C.
    cluster.stop_with(nix::sys::signal::Signal::SIGHUP).await;
    assert!(
        cluster
            .stdout()
            .contains("stopping the local agents and their tasks"),
        "{}",
        cluster.stdout()
    );
    let left = processes_with_env(&marker);
    assert!(left.is_empty(), "task processes left: {left:?}");
    for (name, pid) in &cluster.agents {
        assert!(!alive(*pid), "agent {name} (pid {pid}) still runs");
    }
    assert_eq!(sandboxes_with_term(&cluster), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_agents_stop_their_tasks_when_pelotond_dies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut cluster = LocalCluster::start(&data, &[]).await;
    // Set for the server only: what the agents do on its death.
    for (name, pid) in &cluster.agents {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains("--exit-with-parent"), "{name}: {cmdline}");
    }
    cluster.create_pool().await;
    let id = cluster.create_service(2).await;
    cluster.wait_running(&id, 2).await;
    let marker = cluster.sandbox_marker();
    until_sleepers_trap(&marker, 2).await;

    // SIGKILL: the server stops nothing itself.
    cluster.server.start_kill().expect("SIGKILL");
    within("pelotond to die", cluster.server.wait())
        .await
        .expect("wait");
    let agents: Vec<u32> = cluster.agents.values().copied().collect();
    until("the agents to exit", || {
        agents.iter().all(|pid| !alive(*pid))
    })
    .await;
    // (Their pids may be reused from here on.)
    cluster.stopped = true;
    until("the tasks to end", || {
        processes_with_env(&marker).is_empty()
    })
    .await;
    // An orderly stop: each task was asked first (SIGTERM).
    assert_eq!(sandboxes_with_term(&cluster), 2);
}
