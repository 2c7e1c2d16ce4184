//! A full disk, for real: the server's data directory on a small tmpfs that
//! the test fills. Writes are refused with UNAVAILABLE while reads go on,
//! writes resume by themselves once space returns, no acknowledged write is
//! lost, and a server restarted on the still-full disk starts and serves
//! reads instead of dying at its first commit.
//!
//! Mounting a tmpfs needs root (CAP_SYS_ADMIN). Without it the test says so
//! and passes on a developer's machine, and fails in CI (`CI` set), where it
//! must run.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use peloton_gateway::server::{self, Server};
use peloton_proto::v1 as pb;
use tonic::Code;

/// A tmpfs of `size_mb` MiB mounted on a fresh directory, unmounted when
/// dropped.
struct SmallDisk {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size_mb: u32) -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(&mount)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(SmallDisk { mount, _dir: dir })
    }

    /// Writes a filler file until the disk is full.
    fn fill(&self) {
        let mut f = std::fs::File::create(self.mount.join("filler")).expect("filler");
        let block = vec![0xa5u8; 64 << 10];
        loop {
            match f.write_all(&block) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        // Whatever partial block is left.
        while f.write(&[0xa5u8; 512]).is_ok_and(|n| n > 0) {}
        let _ = f.sync_all();
    }

    fn free(&self) {
        std::fs::remove_file(self.mount.join("filler")).expect("free the disk");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .status();
    }
}

async fn start(dir: &Path) -> (Server, Clients) {
    let mut config = config(dir, 4);
    config.store_cache_mb = 4;
    let server = within("the server to start", server::start(&config))
        .await
        .unwrap_or_else(|e| panic!("server does not start: {e:#}"));
    let clients = Clients::connect(server.addr).await;
    (server, clients)
}

/// A job whose secrets (192 KiB) make its commit take new pages of the
/// store file: on a full disk that commit fails.
fn bulky_job(n: usize) -> pb::JobSpec {
    let mut spec = job_spec("/a", 1, 0.1, 0);
    spec.name = format!("bulky-{n}");
    spec.secrets = (0..3)
        .map(|i| pb::Secret {
            name: format!("blob{i}"),
            value: vec![b'a' + (n % 26) as u8; 64 << 10],
            size: 0,
        })
        .collect();
    spec
}

async fn create(c: &Clients, spec: pb::JobSpec) -> Result<pb::Job, tonic::Status> {
    let mut jobs = c.jobs.clone();
    jobs.create(pb::CreateJobRequest { spec: Some(spec) })
        .await
        .map(|r| r.into_inner().job.expect("job"))
}

/// Creates bulky jobs until one is refused with UNAVAILABLE (the store
/// cannot write). Returns the jobs acknowledged meanwhile and the calls
/// still waiting (their batch failed: they are answered once it lands).
async fn write_until_refused(
    c: &Clients,
    first: usize,
) -> (
    Vec<pb::Job>,
    Vec<tokio::task::JoinHandle<Result<pb::Job, tonic::Status>>>,
    tonic::Status,
) {
    let mut acknowledged = Vec::new();
    let mut waiting = Vec::new();
    for n in first..first + 1000 {
        let c2 = c.clone();
        let call = tokio::spawn(async move { create(&c2, bulky_job(n)).await });
        // An answer within a second, or the call is held by a failed commit.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while !call.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !call.is_finished() {
            waiting.push(call);
            continue;
        }
        match call.await.expect("call") {
            Ok(job) => acknowledged.push(job),
            Err(s) if s.code() == Code::Unavailable => return (acknowledged, waiting, s),
            Err(s) => panic!("unexpected refusal: {s:?}"),
        }
    }
    panic!("writes never failed on a full disk");
}

/// The calls a failed commit held: each is answered once space returns.
async fn held_calls_answered(
    waiting: Vec<tokio::task::JoinHandle<Result<pb::Job, tonic::Status>>>,
) -> Vec<pb::Job> {
    let mut jobs = Vec::new();
    for call in waiting {
        jobs.push(
            within("a held call to be answered", call)
                .await
                .expect("call")
                .expect("a held write lands once space returns"),
        );
    }
    jobs
}

/// A small job, created as soon as writes are accepted again.
async fn created_once_writable(c: &Clients, what: &str) -> pb::Job {
    eventually(what, TIMEOUT, async || {
        create(c, job_spec("/a", 1, 0.1, 0))
            .await
            .map_err(|s| format!("{s:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_serves_reads_and_resumes_by_itself() {
    let disk = match SmallDisk::mount(24) {
        Ok(d) => d,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the full-disk test, but a tmpfs cannot be mounted: {why}"
            );
            eprintln!("SKIPPED: a tmpfs cannot be mounted here (needs root): {why}");
            return;
        }
    };
    let data = disk.mount.join("data");
    let (server, mut c) = start(&data).await;
    create_reserved_pool(&mut c, "/a").await;
    let before = create_job(&mut c, job_spec("/a", 2, 0.1, 0)).await;

    disk.fill();
    let (mut acknowledged, waiting, refusal) = write_until_refused(&c, 0).await;
    eprintln!(
        "full disk: {} writes acknowledged, {} held, then refused: {}",
        acknowledged.len(),
        waiting.len(),
        refusal.message()
    );
    assert!(
        refusal.message().contains("the store cannot write"),
        "{refusal:?}"
    );
    assert!(
        refusal.message().contains("No space left on device"),
        "{refusal:?}"
    );

    // Reads are served from memory, every kind of write is refused at once.
    for _ in 0..3 {
        let job = get_job(&mut c, &before.id).await.expect("a read");
        assert_eq!(job.id, before.id);
        assert_eq!(list_hosts(&mut c).await.len(), 4);
        assert!(!list_pools(&mut c).await.is_empty());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_status(
        c.pools
            .create(pb::CreatePoolRequest {
                path: "/b".into(),
                spec: Some(pool_spec(1.0, 256.0)),
            })
            .await,
        Code::Unavailable,
        "writes are refused until it can",
    );
    assert_status(
        c.jobs
            .kill(pb::KillJobRequest {
                id: before.id.clone(),
                ..Default::default()
            })
            .await,
        Code::Unavailable,
        "the store cannot write",
    );

    // Space returns: the failed batch lands by itself, its calls are
    // answered, and writes are accepted again.
    disk.free();
    acknowledged.extend(held_calls_answered(waiting).await);
    acknowledged.push(created_once_writable(&c, "writes to be accepted again").await);
    acknowledged.push(before);
    let n_before_restart = acknowledged.len();

    // Full again, then a restart on the still-full disk: the server starts,
    // serves what it has, refuses writes, and resumes once space returns.
    disk.fill();
    let (more, waiting, _) = write_until_refused(&c, 10_000).await;
    acknowledged.extend(more);
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
    for call in waiting {
        // Never acknowledged: the server stopped before the batch landed.
        let r = within("a held call to end", call).await.expect("call");
        assert!(r.is_err(), "{r:?}");
    }
    let (server, mut c) = start(&data).await;
    for job in &acknowledged {
        let got = get_job(&mut c, &job.id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {} lost: {e:?}", job.id));
        assert_eq!(
            got.spec.expect("spec").name,
            job.spec.clone().expect("spec").name
        );
    }
    let (more, waiting, refused) = write_until_refused(&c, 20_000).await;
    eprintln!(
        "after a restart on the full disk: {} writes acknowledged, {} held, then refused",
        more.len(),
        waiting.len()
    );
    acknowledged.extend(more);
    assert!(refused.message().contains("the store cannot write"));
    assert!(get_job(&mut c, &acknowledged[0].id).await.is_ok());
    disk.free();
    acknowledged.extend(held_calls_answered(waiting).await);
    acknowledged.push(created_once_writable(&c, "writes to resume after the restart").await);
    assert!(acknowledged.len() > n_before_restart);

    // Everything acknowledged is there after a last restart.
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
    let (server, mut c) = start(&data).await;
    for job in &acknowledged {
        get_job(&mut c, &job.id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {} lost: {e:?}", job.id));
    }
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

const TOKEN: &str = "full-disk-agent-token";

/// A stand-in agent's two halves.
type AgentSession = (
    tonic::Streaming<pb::ServerMessage>,
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
);

/// Registers a stand-in agent for `host` that heartbeats every 50 ms for
/// as long as the returned stream is held.
async fn agent(addr: std::net::SocketAddr, host: &str) -> Result<AgentSession, tonic::Status> {
    // TLS with a certificate naming its host, as a secure server wants.
    let mut client = pb::agent_service_client::AgentServiceClient::new(
        agent_channel(addr, host).await.expect("connect"),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Register(pb::AgentRegister {
            token: TOKEN.into(),
            host: host.into(),
            agent_id: format!("{host}-agent"),
            resources: Some(res(4.0, 4096.0)),
            ..Default::default()
        })),
    })
    .await
    .expect("queued");
    let stream = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let beats = tx.clone();
    tokio::spawn(async move {
        let beat = pb::AgentMessage {
            kind: Some(pb::agent_message::Kind::Heartbeat(pb::AgentHeartbeat {})),
        };
        while beats.send(beat.clone()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    Ok((stream, tx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_heartbeats_are_served_through_a_full_disk_and_no_host_is_lost() {
    let disk = match SmallDisk::mount(24) {
        Ok(d) => d,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the full-disk test, but a tmpfs cannot be mounted: {why}"
            );
            eprintln!("SKIPPED: a tmpfs cannot be mounted here (needs root): {why}");
            return;
        }
    };
    let mut config = config(&disk.mount.join("data"), 0);
    config.store_cache_mb = 4;
    config.agent_token = Some(TOKEN.into());
    config.agent_heartbeat_ms = 100;
    config.host_lost_after_ms = 1000;
    let server = within("the server to start", server::start(&config))
        .await
        .expect("server starts");
    let mut c = Clients::connect(server.addr).await;
    let (mut a1, a1_tx) = agent(server.addr, "a1").await.expect("a1 registers");
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 1, 0.1, 0)).await;
    let key = within("a launch on a1", async {
        loop {
            let m = a1.message().await.expect("stream").expect("open");
            if let Some(pb::server_message::Kind::Launch(l)) = m.kind {
                return l.runs[0].key.clone().expect("key");
            }
        }
    })
    .await;

    disk.fill();
    let (_, waiting, _) = write_until_refused(&c, 0).await;
    // Three times as long as a silent host takes to be lost: the agent's
    // heartbeats keep it up; a new agent cannot register (that is a write).
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts.len(), 1);
    assert!(hosts[0].connected, "{hosts:?}");
    assert_eq!(hosts[0].state(), pb::HostState::Up, "{hosts:?}");
    assert_status(
        agent(server.addr, "a2").await.map(|_| ()),
        Code::Unavailable,
        "the store cannot write",
    );
    // A report that comes now is held, not lost: it is applied once the
    // store writes.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    a1_tx
        .send(pb::AgentMessage {
            kind: Some(pb::agent_message::Kind::Reports(pb::AgentReports {
                reports: vec![pb::RunReport {
                    key: Some(key),
                    phase: pb::RunPhase::Running as i32,
                    time_ms: now_ms,
                    started_ms: now_ms,
                    ..Default::default()
                }],
            })),
        })
        .await
        .expect("report sent");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let task = get_task(&mut c, &job.id, 0).await;
    assert_ne!(
        task_state(&task),
        pb::TaskState::Running,
        "a report was applied while the store could not write it"
    );

    disk.free();
    held_calls_answered(waiting).await;
    let _a2 = eventually("a new agent to register", TIMEOUT, async || {
        agent(server.addr, "a2").await.map_err(|s| format!("{s:?}"))
    })
    .await;
    eventually("the held report to be applied", TIMEOUT, async || {
        let task = get_task(&mut c.clone(), &job.id, 0).await;
        (task_state(&task) == pb::TaskState::Running)
            .then_some(())
            .ok_or_else(|| format!("{task:?}"))
    })
    .await;
    // Past the lost-host delay after the outage, a1 is still up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts.len(), 2);
    for h in &hosts {
        assert!(h.connected, "{hosts:?}");
        assert_eq!(h.state(), pb::HostState::Up, "{hosts:?}");
    }
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

/// Starts the `pelotond` binary on `data_dir` with simulated hosts.
async fn spawn_daemon(data_dir: &Path) -> (tokio::process::Child, std::net::SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    // Secure with the tests' certificates and admin token (nothing to
    // generate in the data directory, which is on the full disk).
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pelotond"))
        .args(pelotond_secure_args())
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--no-metrics",
            "--sim-hosts",
            "4",
        ])
        .args(["--store-cache-mb", "4"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("pelotond starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = within("pelotond to serve", async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some(url) = line.strip_prefix("pelotond: serving gRPC on https://") {
                return url.trim().parse().expect("address");
            }
        }
        panic!("pelotond exited before serving (on a full disk?)");
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_during_an_outage_starts_again_on_the_still_full_disk() {
    let disk = match SmallDisk::mount(24) {
        Ok(d) => d,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the full-disk test, but a tmpfs cannot be mounted: {why}"
            );
            eprintln!("SKIPPED: a tmpfs cannot be mounted here (needs root): {why}");
            return;
        }
    };
    let data = disk.mount.join("data");
    let (mut daemon, addr) = spawn_daemon(&data).await;
    let mut c = Clients::connect(addr).await;
    create_reserved_pool(&mut c, "/a").await;
    let mut acknowledged = vec![create_job(&mut c, job_spec("/a", 2, 0.1, 0)).await];

    disk.fill();
    let (more, _waiting, _) = write_until_refused(&c, 0).await;
    acknowledged.extend(more);
    // Killed while its store is closed after a failed commit (the file as
    // the failed transaction left it), on a disk that is still full.
    daemon.kill().await.expect("SIGKILL");
    let (mut daemon, addr) = spawn_daemon(&data).await;
    let mut c = Clients::connect(addr).await;
    for job in &acknowledged {
        get_job(&mut c, &job.id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {} lost: {e:?}", job.id));
    }
    let (more, waiting, _) = write_until_refused(&c, 100).await;
    acknowledged.extend(more);
    disk.free();
    acknowledged.extend(held_calls_answered(waiting).await);
    acknowledged.push(created_once_writable(&c, "writes to resume").await);
    daemon.kill().await.expect("SIGKILL");
    let (_daemon, addr) = spawn_daemon(&data).await;
    let mut c = Clients::connect(addr).await;
    for job in &acknowledged {
        get_job(&mut c, &job.id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged job {} lost: {e:?}", job.id));
    }
}
