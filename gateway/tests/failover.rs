//! Two `pelotond` processes on one real PostgreSQL (from the system's
//! packages): one leads, the other stands by and names it; the leader
//! killed with SIGKILL ten times in a row under load, a standby leads and
//! places again within 10 s each time, no acknowledged job is lost and no
//! instance runs twice at once (real agents, real processes holding a
//! lock per instance); a leader frozen past its lease (SIGSTOP) and woken
//! (SIGCONT) writes nothing and stops; the database restarted under load
//! loses no acknowledged job.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Clients, TIMEOUT, database_for, eventually, free_port};
use peloton_proto::v1 as pb;
use tokio::process::Child;
use tonic::Code;

const TOKEN: &str = "failover-test-token";
const LEASE_MS: u64 = 1500;

/// A `pelotond` process on the shared database.
struct Pelotond {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Pelotond {
    /// Starts a server on `port` and waits until it listens (it may stand
    /// by).
    async fn start(dir: &Path, name: &str, port: u16, db: &str, sim_hosts: u32) -> Pelotond {
        Self::start_with_lease(dir, name, port, db, sim_hosts, LEASE_MS).await
    }

    async fn start_with_lease(
        dir: &Path,
        name: &str,
        port: u16,
        db: &str,
        sim_hosts: u32,
        lease_ms: u64,
    ) -> Pelotond {
        Self::start_opts(dir, name, port, db, sim_hosts, lease_ms, 20_000).await
    }

    async fn start_opts(
        dir: &Path,
        name: &str,
        port: u16,
        db: &str,
        sim_hosts: u32,
        lease_ms: u64,
        host_lost_after_ms: u64,
    ) -> Pelotond {
        let child = common::spawn_pelotond(
            dir,
            name,
            port,
            &common::PgServer {
                db,
                agent_token: TOKEN,
                lease_ms,
                host_lost_after_ms,
                sim_hosts,
            },
        )
        .await;
        let log = dir.join(format!("{name}.log"));
        Pelotond { child, port, log }
    }

    /// The URL it advertises (https: it is secure).
    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id().expect("running") as i32)
    }

    fn signal(&self, s: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), s).expect("signal");
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Clients of one server, without retries.
async fn clients(port: u16) -> Clients {
    Clients::connect(format!("127.0.0.1:{port}").parse().expect("addr")).await
}

/// Whether the server on `port` serves (leads): a read answers.
async fn serves(port: u16) -> Result<(), tonic::Status> {
    let mut c = clients(port).await;
    c.hosts
        .list(pb::ListHostsRequest::default())
        .await
        .map(drop)
}

/// Waits until one of `ports` serves; returns it.
async fn leader(ports: &[u16]) -> u16 {
    eventually("a leader", TIMEOUT, async || {
        let mut said = Vec::new();
        for &p in ports {
            match serves(p).await {
                Ok(()) => return Ok(p),
                Err(e) => said.push(format!("{p}: {}", e.message())),
            }
        }
        Err(said.join("; "))
    })
    .await
}

async fn create_pool(port: u16) {
    common::create_pool(
        &mut clients(port).await,
        "/t",
        common::pool_spec(1.0, 512.0),
    )
    .await;
}

/// A real `peloton-agent` named `host` (work dir `DIR/agent-HOST`) given
/// the server list `servers`, offering `ports`.
fn spawn_agent(dir: &Path, host: &str, servers: &str, ports: &str) -> Child {
    common::spawn_agent(
        dir,
        host,
        &common::AgentProcess {
            servers,
            agent_token: TOKEN,
            resources: "cpu=8,mem=8192,disk=10000",
            ports,
            log_file: false,
        },
    )
}

/// Waits until the server on `port` lists `n` hosts.
async fn wait_hosts(port: u16, n: usize) {
    eventually(&format!("{n} agents registered"), TIMEOUT, async || {
        let mut c = clients(port).await;
        let got = c
            .hosts
            .list(pb::ListHostsRequest::default())
            .await
            .map_err(|e| e.to_string())?
            .into_inner()
            .hosts
            .len();
        (got == n).then_some(()).ok_or(format!("{got} hosts"))
    })
    .await;
}

fn job(name: &str, n: u32, task: pb::TaskSpec) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        pool: "/t".into(),
        instance_count: n,
        default_task: Some(task),
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sim_task(duration_ms: u64) -> pb::TaskSpec {
    pb::TaskSpec {
        command: "/bin/true".into(),
        resources: Some(common::res(0.1, 64.0)),
        sim: Some(pb::SimSpec {
            duration_ms,
            exit_code: 0,
        }),
        ..Default::default()
    }
}

/// Submits `spec` to `port`: the job id if acknowledged.
async fn submit(port: u16, spec: pb::JobSpec) -> Result<String, tonic::Status> {
    let mut c = clients(port).await;
    Ok(c.jobs
        .create(pb::CreateJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job
        .expect("job")
        .id)
}

async fn job_state(port: u16, id: &str) -> Result<pb::Job, tonic::Status> {
    common::get_job(&mut clients(port).await, id).await
}

fn running(job: &pb::Job) -> u32 {
    common::count_in(job, pb::TaskState::Running) + common::count_in(job, pb::TaskState::Succeeded)
}

/// The lease row: (epoch, address).
fn lease_row(db: &str) -> (i64, String) {
    let db = db.to_owned();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&db, postgres::NoTls).expect("connect");
        let r = c
            .query_one("SELECT epoch, address FROM peloton_leader", &[])
            .expect("lease");
        (r.get(0), r.get(1))
    })
    .join()
    .expect("lease row")
}

/// Epochs of the event rows from revision `from` on.
fn event_epochs_from(db: &str, from: i64) -> Vec<i64> {
    let db = db.to_owned();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&db, postgres::NoTls).expect("connect");
        c.query(
            "SELECT DISTINCT epoch FROM peloton_events WHERE first >= $1 ORDER BY epoch",
            &[&from],
        )
        .expect("events")
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
    .join()
    .expect("events")
}

fn last_revision(db: &str) -> i64 {
    let db = db.to_owned();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&db, postgres::NoTls).expect("connect");
        c.query_opt("SELECT value FROM peloton_meta WHERE key = 'revision'", &[])
            .expect("meta")
            .map_or(0, |r| r.get(0))
    })
    .join()
    .expect("revision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_names_the_leader_over_grpc_and_http_and_takes_over_a_graceful_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    // A long lease: taking over before it would expire shows the release.
    let lease_ms = 20_000;
    let a = Pelotond::start_with_lease(dir.path(), "a", free_port(), &db, 2, lease_ms).await;
    assert_eq!(leader(&[a.port]).await, a.port);
    let b = Pelotond::start_with_lease(dir.path(), "b", free_port(), &db, 2, lease_ms).await;
    // gRPC: UNAVAILABLE naming the leader (once the standby has looked),
    // in the message and metadata.
    let mut c = clients(b.port).await;
    let err = eventually("the standby to name the leader", TIMEOUT, async || {
        let err = c
            .jobs
            .create(pb::CreateJobRequest {
                spec: Some(job("refused", 1, sim_task(10))),
            })
            .await
            .expect_err("a standby refuses writes");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        if err
            .message()
            .starts_with("not the leader: the leader is at")
        {
            Ok(err)
        } else {
            Err(err.message().to_string())
        }
    })
    .await;
    assert_eq!(
        err.message(),
        format!("not the leader: the leader is at {}", a.url())
    );
    assert_eq!(
        err.metadata()
            .get("peloton-leader")
            .and_then(|v| v.to_str().ok()),
        Some(a.url().as_str())
    );
    // The HTTP mirror: a redirect to the same path on the leader.
    let answer = common::https_request(
        format!("127.0.0.1:{}", b.port).parse().expect("addr"),
        format!(
            "GET /v1/jobs?x=1 HTTP/1.1\r\nHost: localhost\r\n{}Connection: close\r\n\r\n",
            common::admin_header()
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 307"), "{answer}");
    let location = answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| v.trim().to_string())
        });
    assert_eq!(
        location.as_deref(),
        Some(format!("{}/v1/jobs?x=1", a.url()).as_str()),
        "{answer}"
    );
    // Nothing was written by the refused call.
    create_pool(a.port).await;
    let id = submit(a.port, job("kept", 3, sim_task(60_000)))
        .await
        .expect("the leader accepts");
    // A graceful stop gives the lease up: the standby leads at once.
    let (epoch_a, _) = lease_row(&db);
    a.signal(nix::sys::signal::Signal::SIGTERM);
    let stopped = Instant::now();
    let mut a = a;
    let status = tokio::time::timeout(TIMEOUT, a.child.wait())
        .await
        .expect("a stops")
        .expect("wait");
    assert!(status.success(), "{status}: {}", a.log_text());
    assert_eq!(leader(&[b.port]).await, b.port);
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_millis(lease_ms / 2),
        "a released lease is taken before it would expire: {took:?}"
    );
    let (epoch_b, address) = lease_row(&db);
    assert_eq!((epoch_b, address), (epoch_a + 1, b.url()));
    let got = job_state(b.port, &id).await.expect("the job survived");
    assert_eq!(got.spec.expect("spec").instance_count, 3);
    let jobs = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert_eq!(jobs.jobs.len(), 1, "the refused job was never created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_lease_writes_nothing_when_it_wakes_and_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    let a = Pelotond::start(dir.path(), "a", free_port(), &db, 4).await;
    leader(&[a.port]).await;
    let b = Pelotond::start(dir.path(), "b", free_port(), &db, 4).await;
    create_pool(a.port).await;
    // Work that keeps the leader writing: short tasks, retried jobs.
    for i in 0..5 {
        submit(a.port, job(&format!("busy-{i}"), 50, sim_task(50)))
            .await
            .expect("accepted");
    }
    let (epoch_a, _) = lease_row(&db);
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    let frozen = Instant::now();
    assert_eq!(leader(&[b.port]).await, b.port);
    let took_over = frozen.elapsed();
    assert!(
        took_over <= Duration::from_secs(10),
        "took over after {took_over:?}"
    );
    let (epoch_b, _) = lease_row(&db);
    assert_eq!(epoch_b, epoch_a + 1);
    let takeover_revision = last_revision(&db);
    let id = submit(b.port, job("after", 20, sim_task(100)))
        .await
        .expect("the new leader accepts");
    // Wake the old leader: it must not write, and stops.
    a.signal(nix::sys::signal::Signal::SIGCONT);
    let mut a = a;
    let status = tokio::time::timeout(TIMEOUT, a.child.wait())
        .await
        .expect("the deposed leader stops")
        .expect("wait");
    assert_eq!(status.code(), Some(75), "{}", a.log_text());
    assert!(a.log_text().contains("deposed"), "{}", a.log_text());
    // Every commit since the takeover was the new leader's.
    assert_eq!(event_epochs_from(&db, takeover_revision + 1), [epoch_b]);
    let got = eventually("the new leader's job to finish", TIMEOUT, async || {
        let j = job_state(b.port, &id).await.map_err(|e| e.to_string())?;
        (common::count_in(&j, pb::TaskState::Succeeded) == 20)
            .then_some(j)
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    assert_eq!(got.spec.expect("spec").instance_count, 20);
    eprintln!("takeover after SIGSTOP: {took_over:?}");
}

/// A leader's commit stuck inside a `COPY` of task rows (its process
/// frozen mid-stream) is not idle in its transaction, so the database's
/// idle timeout never ends it, and it holds the fence's share lock. The
/// standby that takes the expired lease ends that session and leads within
/// the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_stuck_in_a_copy_does_not_hold_the_takeover_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    let a = Pelotond::start(dir.path(), "a", free_port(), &db, 4).await;
    leader(&[a.port]).await;
    // The stuck commit: the fence's lock taken as a commit takes it, a
    // COPY opened and its first bytes sent, never finished.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<i32>();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let url = db.clone();
    let stuck = std::thread::spawn(move || {
        use std::io::Write;
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        let pid: i32 = c
            .query_one("SELECT pg_backend_pid()", &[])
            .expect("pid")
            .get(0);
        let mut tx = c.transaction().expect("begin");
        tx.query_one(
            "SELECT epoch FROM peloton_leader WHERE id = 1 FOR SHARE",
            &[],
        )
        .expect("the fence");
        let mut copy = tx
            .copy_in(peloton_gateway::pgstore::COPY_TASKS)
            .expect("copy");
        copy.write_all(b"PGCOPY\n\xff\r\n\0")
            .and_then(|()| copy.flush())
            .expect("the stream's first bytes");
        ready_tx.send(pid).expect("ready");
        let _ = end_rx.recv();
        drop(copy);
    });
    let stuck_pid = ready_rx.recv().expect("the copy is open");
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    let frozen = Instant::now();
    let b = Pelotond::start(dir.path(), "b", free_port(), &db, 4).await;
    assert_eq!(leader(&[b.port]).await, b.port, "{}", b.log_text());
    let took_over = frozen.elapsed();
    assert!(
        took_over <= Duration::from_secs(10),
        "took over after {took_over:?}"
    );
    assert!(
        b.log_text().contains("ended the expired leader's commit"),
        "{}",
        b.log_text()
    );
    // The stuck commit's session is gone (not merely failed).
    // (A session frees its locks a moment before it leaves the view.)
    let url = db.clone();
    let alive: i64 = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        let mut alive = 1;
        for _ in 0..50 {
            alive = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&stuck_pid],
                )
                .expect("pg_stat_activity")
                .get(0);
            if alive == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        alive
    })
    .join()
    .expect("pg_stat_activity's thread");
    assert_eq!(alive, 0, "the stuck commit's session was ended");
    drop(end_tx);
    stuck.join().expect("the stuck commit's thread");
    let (_, address) = lease_row(&db);
    assert_eq!(address, b.url());
    a.signal(nix::sys::signal::Signal::SIGCONT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_restarted_under_load_loses_no_acknowledged_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A server of its own: restarting it must not disturb other tests.
    let (pg, db) = common::own_postgres("restart");
    let a = Pelotond::start(dir.path(), "a", free_port(), &db, 4).await;
    leader(&[a.port]).await;
    create_pool(a.port).await;
    let port = a.port;
    let load = async move {
        let mut acked = Vec::new();
        let mut refused = 0;
        let until = Instant::now() + Duration::from_secs(8);
        let mut i = 0;
        while Instant::now() < until {
            i += 1;
            let spec = job(&format!("load-{i}"), 10, sim_task(20));
            match submit(port, spec).await {
                Ok(id) => acked.push(id),
                Err(e) => {
                    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        (acked, refused)
    };
    let restart = {
        let pg = pg.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            tokio::task::spawn_blocking(move || {
                let mut pg = pg.lock().expect("pg");
                pg.kill();
                std::thread::sleep(Duration::from_millis(500));
                pg.restart().expect("PostgreSQL restarts");
            })
            .await
            .expect("restart");
        }
    };
    let ((acked, refused), ()) = tokio::join!(load, restart);
    assert!(acked.len() > 20, "{} acknowledged", acked.len());
    eprintln!(
        "{} jobs acknowledged, {refused} refused while the database restarted",
        acked.len()
    );
    // The service carries on, and every acknowledged job is there.
    leader(&[a.port]).await;
    for id in &acked {
        job_state(a.port, id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {id} lost: {e:?}"));
    }
    // Also across a restart of the server itself (from the database only).
    let mut a = a;
    a.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = a.child.wait().await;
    let a2 = Pelotond::start(dir.path(), "a2", free_port(), &db, 4).await;
    leader(&[a2.port]).await;
    for id in &acked {
        job_state(a2.port, id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {id} lost after a restart: {e:?}"));
    }
    drop(pg);
}

/// Counts instances of a job in Running or Succeeded.
async fn placed(port: u16, id: &str) -> Result<u32, String> {
    job_state(port, id)
        .await
        .map(|j| running(&j))
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_ten_times_under_load_loses_nothing_and_runs_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    // Each port is picked just before its server binds it: picked early,
    // it could meanwhile become the source port of another connection.
    let first_port = free_port();
    let mut servers: Vec<Option<Pelotond>> = vec![
        Some(Pelotond::start(dir.path(), "s0", first_port, &db, 0).await),
        None,
    ];
    let first = leader(&[first_port]).await;
    let ports = [first_port, free_port()];
    servers[1] = Some(Pelotond::start(dir.path(), "s1", ports[1], &db, 0).await);
    // Real agents that follow the leader through the list.
    let list = format!(
        "https://127.0.0.1:{},https://127.0.0.1:{}",
        ports[0], ports[1]
    );
    let agents = [
        spawn_agent(dir.path(), "h0", &list, "31000-31049"),
        spawn_agent(dir.path(), "h1", &list, "31050-31099"),
    ];
    wait_hosts(first, 2).await;
    create_pool(first).await;
    // Each run holds a lock on its instance for its whole life: a second
    // run of the same instance while the first lives records "twice".
    let locks = dir.path().join("locks");
    std::fs::create_dir_all(&locks).expect("locks dir");
    let shell = format!(
        "exec 9>{locks}/$PELOTON_JOB_ID-$PELOTON_INSTANCE_ID; \
         flock -n 9 || echo \"$PELOTON_TASK_ID\" >> {locks}/twice; sleep 2",
        locks = locks.display()
    );
    let task = pb::TaskSpec {
        shell: shell.clone(),
        resources: Some(common::res(0.1, 32.0)),
        ..Default::default()
    };
    let mut acked: Vec<String> = Vec::new();
    let mut took = Vec::new();
    let mut current = first;
    for round in 0..10 {
        // Load: jobs acknowledged by the leader before it dies.
        for j in 0..3 {
            let id = submit(current, job(&format!("r{round}-{j}"), 4, task.clone()))
                .await
                .expect("the leader accepts");
            acked.push(id);
        }
        let which = usize::from(current == ports[1]);
        let mut dead = servers[which].take().expect("the leader's process");
        dead.child.kill().await.expect("SIGKILL");
        let killed = Instant::now();
        let next = ports[1 - which];
        // Time to the next placement: a probe job placed by the new
        // leader.
        let probe = eventually("the standby to accept a job", TIMEOUT, async || {
            submit(next, job(&format!("probe-{round}"), 1, task.clone()))
                .await
                .map_err(|e| e.message().to_string())
        })
        .await;
        eventually("the probe to be placed", TIMEOUT, async || {
            let n = placed(next, &probe).await?;
            (n >= 1).then_some(()).ok_or(format!("{n} placed"))
        })
        .await;
        let t = killed.elapsed();
        took.push(t);
        acked.push(probe);
        assert!(
            t <= Duration::from_secs(10),
            "round {round}: placing again took {t:?}"
        );
        // The killed server comes back as a standby.
        servers[which] =
            Some(Pelotond::start(dir.path(), &format!("s{which}"), ports[which], &db, 0).await);
        current = next;
    }
    eprintln!("time from SIGKILL of the leader to the next placement: {took:?}");
    // Every acknowledged job is there and finishes; nothing ran twice.
    for id in &acked {
        eventually(
            &format!("job {id} to succeed"),
            Duration::from_secs(90),
            async || {
                let j = job_state(current, id).await.map_err(|e| e.to_string())?;
                let done = common::count_in(&j, pb::TaskState::Succeeded);
                (done == j.spec.as_ref().map_or(0, |s| s.instance_count))
                    .then_some(())
                    .ok_or(format!("{done} succeeded"))
            },
        )
        .await;
    }
    let twice = std::fs::read_to_string(locks.join("twice")).unwrap_or_default();
    assert!(twice.is_empty(), "instances ran twice at once: {twice}");
    drop(agents);
}

/// A TCP proxy that can black-hole its connections (a network partition:
/// bytes stop flowing, sockets stay open) and heal.
struct Proxy {
    port: u16,
    blocked: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let blocked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let b = blocked.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let b = b.clone();
                tokio::spawn(async move {
                    // New connections hang too while partitioned.
                    while b.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let pump =
                        |mut r: tokio::net::tcp::OwnedReadHalf,
                         mut w: tokio::net::tcp::OwnedWriteHalf,
                         b: std::sync::Arc<std::sync::atomic::AtomicBool>| async move {
                            use tokio::io::{AsyncReadExt, AsyncWriteExt};
                            let mut buf = vec![0u8; 64 * 1024];
                            loop {
                                let n = match r.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => n,
                                };
                                while b.load(Ordering::Relaxed) {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                if w.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        };
                    tokio::spawn(pump(cr, sw, b.clone()));
                    tokio::spawn(pump(sr, cw, b));
                });
            }
        });
        Proxy { port, blocked }
    }

    fn set_blocked(&self, blocked: bool) {
        self.blocked
            .store(blocked, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_partitioned_from_the_database_lapses_its_agents_move_and_it_stops_when_healed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    let pg_port = common::local_postgres().port();
    let proxy = Proxy::start(pg_port).await;
    let through_proxy = db.replace(&format!(":{pg_port}/"), &format!(":{}/", proxy.port));
    // Each port is picked just before its server binds it: picked early,
    // it could meanwhile become the source port of another connection.
    let a_port = free_port();
    let a = Pelotond::start(dir.path(), "a", a_port, &through_proxy, 0).await;
    leader(&[a_port]).await;
    let ports = [a_port, free_port()];
    let b = Pelotond::start(dir.path(), "b", ports[1], &db, 0).await;
    let list = format!(
        "https://127.0.0.1:{},https://127.0.0.1:{}",
        ports[0], ports[1]
    );
    let _agent = spawn_agent(dir.path(), "h0", &list, "31100-31149");
    wait_hosts(ports[0], 1).await;
    create_pool(ports[0]).await;
    let task = pb::TaskSpec {
        shell: "sleep 600".into(),
        resources: Some(common::res(0.1, 32.0)),
        ..Default::default()
    };
    let id = submit(ports[0], job("long", 2, task))
        .await
        .expect("accepted");
    eventually("both instances running", TIMEOUT, async || {
        let j = job_state(ports[0], &id).await.map_err(|e| e.to_string())?;
        let n = common::count_in(&j, pb::TaskState::Running);
        (n == 2).then_some(()).ok_or(format!("{n} running"))
    })
    .await;
    // A watch on the leader before the partition.
    let mut watch = clients(ports[0])
        .await
        .watch
        .watch(pb::WatchRequest::default())
        .await
        .expect("watch")
        .into_inner();
    proxy.set_blocked(true);
    let cut = Instant::now();
    // The standby leads; the agent moves to it and its tasks keep running
    // (adopted, not started again).
    assert_eq!(leader(&ports[1..]).await, ports[1]);
    let took = cut.elapsed();
    eventually(
        "the running instances adopted by the new leader",
        TIMEOUT,
        async || {
            let j = job_state(ports[1], &id).await.map_err(|e| e.to_string())?;
            let n = common::count_in(&j, pb::TaskState::Running);
            let mut c = clients(ports[1]).await;
            let up = c
                .hosts
                .list(pb::ListHostsRequest::default())
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .hosts
                .iter()
                .filter(|h| h.state() == pb::HostState::Up)
                .count();
            (n == 2 && up == 1)
                .then_some(())
                .ok_or(format!("{n} running, {up} hosts up"))
        },
    )
    .await;
    let mut c = clients(ports[1]).await;
    let tasks = c
        .tasks
        .list(pb::ListTasksRequest {
            job_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("tasks")
        .into_inner()
        .tasks;
    for t in &tasks {
        let run = t.current.as_ref().expect("run");
        assert_eq!(run.run_id, 1, "not started again: {t:?}");
    }
    // Its watch ended, telling the watcher to look for the leader.
    let ended = tokio::time::timeout(TIMEOUT, async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the watch ends");
    let err = ended.expect_err("the watch ends with an error");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().starts_with("not the leader"), "{err:?}");
    // The partitioned leader refuses calls meanwhile.
    let err = serves(ports[0]).await.expect_err("a lapsed leader refuses");
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().starts_with("not the leader"), "{err:?}");
    // Healed: it finds the lease taken and stops.
    proxy.set_blocked(false);
    let mut a = a;
    let status = tokio::time::timeout(TIMEOUT, a.child.wait())
        .await
        .expect("the deposed leader stops")
        .expect("wait");
    assert_eq!(status.code(), Some(75), "{}", a.log_text());
    assert!(took <= Duration::from_secs(10), "took over after {took:?}");
    eprintln!("partition to the standby serving: {took:?}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_after_a_crash_takes_its_own_lease_back_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    // A long lease: waiting for it to expire would show.
    let lease_ms = 60_000;
    let port = free_port();
    let a = Pelotond::start_with_lease(dir.path(), "a", port, &db, 2, lease_ms).await;
    leader(&[port]).await;
    create_pool(port).await;
    let id = submit(port, job("kept", 2, sim_task(60_000)))
        .await
        .expect("accepted");
    let (epoch, _) = lease_row(&db);
    let mut a = a;
    a.child.kill().await.expect("SIGKILL");
    let killed = Instant::now();
    // Another server (its own data dir) must still wait for the lease.
    let other =
        Pelotond::start_with_lease(dir.path(), "other", free_port(), &db, 2, lease_ms).await;
    // The same server (same data dir) takes it back at once.
    let again = Pelotond::start_with_lease(dir.path(), "a", port, &db, 2, lease_ms).await;
    leader(&[again.port]).await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_millis(lease_ms / 2),
        "took {took:?} with a {lease_ms} ms lease"
    );
    assert_eq!(lease_row(&db).0, epoch + 1);
    job_state(again.port, &id).await.expect("the job survived");
    let err = serves(other.port).await.expect_err("the other stands by");
    assert!(err.message().starts_with("not the leader"), "{err:?}");
    eprintln!("restart to serving with a {lease_ms} ms lease: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_stopped_before_it_leads_exits_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    let a = Pelotond::start(dir.path(), "a", free_port(), &db, 1).await;
    leader(&[a.port]).await;
    let mut b = Pelotond::start(dir.path(), "b", free_port(), &db, 1).await;
    b.signal(nix::sys::signal::Signal::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(10), b.child.wait())
        .await
        .expect("a stopped standby exits")
        .expect("wait");
    assert!(status.success(), "{status}: {}", b.log_text());
    // The leader was not disturbed.
    serves(a.port).await.expect("the leader serves");
}

/// Per instance of job `id` on the server at `port`: its current run's id
/// and state, and the states of its earlier runs.
async fn runs_of(
    port: u16,
    id: &str,
    n: u32,
) -> Result<Vec<(u32, pb::TaskState, Vec<pb::TaskState>)>, String> {
    let mut c = clients(port).await;
    let mut out = Vec::new();
    for i in 0..n {
        let t = c
            .tasks
            .get(pb::GetTaskRequest {
                job_id: id.into(),
                instance: i,
            })
            .await
            .map_err(|e| e.to_string())?
            .into_inner()
            .task
            .ok_or("no task")?;
        let current = t.current.ok_or("no current run")?;
        out.push((
            current.run_id,
            current.state(),
            t.history.iter().map(|r| r.state()).collect(),
        ));
    }
    Ok(out)
}

fn shell_task(shell: &str, cpu: f64) -> pb::TaskSpec {
    pb::TaskSpec {
        shell: shell.into(),
        resources: Some(common::res(cpu, 64.0)),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_changes_nothing_that_runs_and_finished_runs_keep_their_result() {
    // One server on a database of its own, stopped for more than twice the
    // lease: the lease lapses, the agent's session ends, writes fail. Once
    // the database is back the server leads again and its agent returns:
    // every running task is still on its first run (nothing preempted for
    // the hosts that looked gone), and tasks that exited 0 meanwhile are
    // SUCCEEDED on their first run, not preempted and run again.
    let dir = tempfile::tempdir().expect("tempdir");
    let (pg, db) = common::own_postgres("lapse");
    let a = Pelotond::start(dir.path(), "a", free_port(), &db, 0).await;
    leader(&[a.port]).await;
    let _agent = spawn_agent(dir.path(), "h0", &a.url(), "31200-31249");
    wait_hosts(a.port, 1).await;
    create_pool(a.port).await;
    let long = submit(a.port, job("long", 6, shell_task("sleep 300", 1.0)))
        .await
        .expect("accepted");
    let short = submit(a.port, job("short", 2, shell_task("sleep 3", 1.0)))
        .await
        .expect("accepted");
    eventually("8 tasks running", TIMEOUT, async || {
        let runs = [
            runs_of(a.port, &long, 6).await?,
            runs_of(a.port, &short, 2).await?,
        ];
        runs.iter()
            .flatten()
            .all(|(_, s, _)| *s == pb::TaskState::Running)
            .then_some(())
            .ok_or_else(|| format!("{runs:?}"))
    })
    .await;
    // Stopped for 4 s (the lease is 1.5 s); the short tasks end meanwhile.
    {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || {
            let mut pg = pg.lock().expect("pg");
            pg.kill();
            std::thread::sleep(Duration::from_secs(4));
            pg.restart().expect("PostgreSQL restarts");
        })
        .await
        .expect("restart");
    }
    leader(&[a.port]).await;
    let short_runs = eventually("the short tasks to be recorded", TIMEOUT, async || {
        let runs = runs_of(a.port, &short, 2).await?;
        runs.iter()
            .all(|(_, s, _)| *s != pb::TaskState::Running)
            .then_some(runs.clone())
            .ok_or_else(|| format!("{runs:?}"))
    })
    .await;
    for (run, state, history) in &short_runs {
        assert_eq!(
            (*run, *state),
            (1, pb::TaskState::Succeeded),
            "{short_runs:?}"
        );
        assert!(history.is_empty(), "{short_runs:?}");
    }
    // Give a wrong verdict time to show (cycles every 5 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let long_runs = runs_of(a.port, &long, 6).await.expect("tasks");
    for (run, state, history) in &long_runs {
        assert_eq!((*run, *state), (1, pb::TaskState::Running), "{long_runs:?}");
        assert!(history.is_empty(), "{long_runs:?}");
    }
    assert!(
        a.log_text().contains("the lease lapsed"),
        "the lease did lapse: {}",
        a.log_text()
    );
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gracefully_stopping_leader_hands_its_agents_over_at_once() {
    // Two servers; a real agent knowing both; hosts are lost after 5 s.
    // SIGTERM the leader: it exits promptly (it used to keep the agent's
    // session until it exited 20 s later), the agent moves to the new
    // leader at once with its runs, and the new leader, which gives agents
    // their reconnect time from when it leads, loses no host and no run.
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_for(dir.path());
    let (pa, pb_) = (free_port(), free_port());
    let a = Pelotond::start_opts(dir.path(), "a", pa, &db, 0, LEASE_MS, 5_000).await;
    leader(&[pa]).await;
    let b = Pelotond::start_opts(dir.path(), "b", pb_, &db, 0, LEASE_MS, 5_000).await;
    let list = format!("{},{}", a.url(), b.url());
    let _agent = spawn_agent(dir.path(), "h0", &list, "31250-31299");
    wait_hosts(pa, 1).await;
    create_pool(pa).await;
    let id = submit(pa, job("kept", 3, shell_task("sleep 300", 1.0)))
        .await
        .expect("accepted");
    eventually("3 tasks running", TIMEOUT, async || {
        let runs = runs_of(pa, &id, 3).await?;
        runs.iter()
            .all(|(_, s, _)| *s == pb::TaskState::Running)
            .then_some(())
            .ok_or_else(|| format!("{runs:?}"))
    })
    .await;
    a.signal(nix::sys::signal::Signal::SIGTERM);
    let stopped = Instant::now();
    let mut a = a;
    let status = tokio::time::timeout(TIMEOUT, a.child.wait())
        .await
        .expect("a stops")
        .expect("wait");
    let exited_after = stopped.elapsed();
    assert!(status.success(), "{status}: {}", a.log_text());
    assert!(
        exited_after < Duration::from_secs(5),
        "a server with a connected agent took {exited_after:?} to stop: {}",
        a.log_text()
    );
    assert_eq!(leader(&[pb_]).await, pb_);
    eventually("the agent on the new leader", TIMEOUT, async || {
        let mut c = clients(pb_).await;
        let hosts = c
            .hosts
            .list(pb::ListHostsRequest::default())
            .await
            .map_err(|e| e.to_string())?
            .into_inner()
            .hosts;
        hosts
            .iter()
            .any(|h| h.name == "h0" && h.connected)
            .then_some(())
            .ok_or_else(|| format!("{hosts:?}"))
    })
    .await;
    let moved_after = stopped.elapsed();
    // Past the new leader's reconnect slack and lost timeout (10 + 5 s
    // from when it led): nothing was lost or started again.
    tokio::time::sleep(Duration::from_secs(16).saturating_sub(moved_after)).await;
    let runs = runs_of(pb_, &id, 3).await.expect("tasks");
    for (run, state, history) in &runs {
        assert_eq!((*run, *state), (1, pb::TaskState::Running), "{runs:?}");
        assert!(history.is_empty(), "{runs:?}");
    }
    eprintln!("graceful stop: exited after {exited_after:?}, agent moved after {moved_after:?}");
    drop(b);
}
