//! The `peloton-agent` binary against a stand-in `AgentService` on
//! loopback: registration, launches and reports, log reads, SIGTERM
//! leaving tasks running, re-registration with the runs of the previous
//! agent, acknowledgements, and a refused token.
//!
//! The stand-in only records what the agent says and lets the test speak
//! for the server; the real server's side is tested with `pelotond`. Like
//! a secure `pelotond` (the default), it serves TLS only (peloton-tls's
//! acceptor, the test CA's server certificate) and wants a client
//! certificate naming the agent's host.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use peloton_proto::v1;
use peloton_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use v1::RunPhase as P;

const TIMEOUT: Duration = Duration::from_secs(30);
const TOKEN: &str = "session-test-token";

/// One agent session as the test sees it.
struct Session {
    register: v1::AgentRegister,
    to_agent: mpsc::Sender<Result<v1::ServerMessage, Status>>,
    from_agent: mpsc::UnboundedReceiver<v1::AgentMessage>,
    heartbeats: usize,
}

struct StandIn {
    sessions: mpsc::UnboundedSender<Session>,
}

#[tonic::async_trait]
impl AgentService for StandIn {
    type SessionStream = ReceiverStream<Result<v1::ServerMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<v1::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let cert = request
            .peer_certs()
            .and_then(|c| c.first().map(|c| c.as_ref().to_vec()));
        let mut inbound = request.into_inner();
        let first = inbound.message().await?;
        let Some(v1::AgentMessage {
            kind: Some(v1::agent_message::Kind::Register(register)),
        }) = first
        else {
            return Err(Status::invalid_argument("register first"));
        };
        if register.token != TOKEN {
            return Err(Status::unauthenticated("wrong token"));
        }
        if !cert.is_some_and(|c| peloton_tls::cert_allows_host(&c, &register.host)) {
            return Err(Status::permission_denied("no certificate naming the host"));
        }
        let (to_agent, rx) = mpsc::channel(64);
        to_agent
            .send(Ok(server(v1::server_message::Kind::Registered(
                v1::Registered {
                    heartbeat_interval_ms: 100,
                },
            ))))
            .await
            .map_err(|_| Status::internal("closed"))?;
        let (forward, from_agent) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                if forward.send(msg).is_err() {
                    break;
                }
            }
        });
        let _ = self.sessions.send(Session {
            register,
            to_agent,
            from_agent,
            heartbeats: 0,
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn server(kind: v1::server_message::Kind) -> v1::ServerMessage {
    v1::ServerMessage { kind: Some(kind) }
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

impl Session {
    async fn send(&self, kind: v1::server_message::Kind) {
        self.to_agent
            .send(Ok(server(kind)))
            .await
            .expect("agent stream open");
    }

    /// The next message that is not a heartbeat.
    async fn next(&mut self) -> v1::agent_message::Kind {
        loop {
            let msg = within("a message from the agent", self.from_agent.recv())
                .await
                .expect("session open");
            match msg.kind {
                Some(v1::agent_message::Kind::Heartbeat(_)) => self.heartbeats += 1,
                Some(kind) => return kind,
                None => {}
            }
        }
    }

    /// Waits for a report of `key` in `phase`.
    async fn report(&mut self, key: &v1::RunKey, phase: P) -> v1::RunReport {
        self.report_where(key, |r| r.phase() == phase).await
    }

    /// Waits for a report of `key` that satisfies `want`.
    async fn report_where(
        &mut self,
        key: &v1::RunKey,
        want: impl Fn(&v1::RunReport) -> bool,
    ) -> v1::RunReport {
        loop {
            if let v1::agent_message::Kind::Reports(reports) = self.next().await
                && let Some(r) = reports
                    .reports
                    .into_iter()
                    .find(|r| r.key.as_ref() == Some(key) && want(r))
            {
                return r;
            }
        }
    }

    /// Waits for a heartbeat (or returns at once if one came already).
    async fn heartbeat(&mut self) {
        while self.heartbeats == 0 {
            let msg = within("a heartbeat", self.from_agent.recv())
                .await
                .expect("session open");
            if let Some(v1::agent_message::Kind::Heartbeat(_)) = msg.kind {
                self.heartbeats += 1;
            }
        }
    }

    async fn log(&mut self, request_id: u64) -> v1::LogChunk {
        loop {
            if let v1::agent_message::Kind::Log(chunk) = self.next().await
                && chunk.request_id == request_id
            {
                return chunk;
            }
        }
    }
}

async fn start_stand_in() -> (u16, mpsc::UnboundedReceiver<Session>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let pki = peloton_tls::testkit::shared();
    let read = |p: &Path| std::fs::read_to_string(p).expect("test certificate");
    let tls = peloton_tls::server_config(
        &read(&pki.server_cert),
        &read(&pki.server_key),
        Some(&pki.pki.ca_cert_pem),
    )
    .expect("TLS config");
    let (sessions, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(StandIn { sessions }))
            .serve_with_incoming(peloton_tls::tls_incoming(listener, tls)),
    );
    (port, rx)
}

/// The agents' `--cert-file` and `--key-file`: a certificate naming h1,
/// made once per test process.
fn h1_certificate() -> &'static (PathBuf, PathBuf) {
    static FILES: OnceLock<(tempfile::TempDir, (PathBuf, PathBuf))> = OnceLock::new();
    &FILES
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            let files = peloton_tls::testkit::shared()
                .client_files("h1", dir.path())
                .expect("agent certificate");
            (dir, files)
        })
        .1
}

/// Starts an agent; its log goes to the test's stderr unless `capture`.
fn agent(port: u16, work_dir: &Path, token: &str, capture: bool) -> Child {
    let (cert, key) = h1_certificate();
    Command::new(env!("CARGO_BIN_EXE_peloton-agent"))
        .args(["--server", &format!("https://127.0.0.1:{port}")])
        .arg("--ca-file")
        .arg(&peloton_tls::testkit::shared().ca_file)
        .arg("--cert-file")
        .arg(cert)
        .arg("--key-file")
        .arg(key)
        .arg("--work-dir")
        .arg(work_dir)
        .args(["--host", "h1", "--token", token])
        .args(["--resources", "cpu=2,mem=1024,disk=1000,gpu=0"])
        .args(["--attr", "zone=z1", "--ports", "19300-19309"])
        .args(["--poll-interval-ms", "50", "--isolation", "rlimit"])
        .env("RUST_LOG", if capture { "info" } else { "warn" })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if capture {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts")
}

/// SIGTERM; the agent must exit 0.
async fn stop(mut child: Child) {
    let pid = child.id().expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = within("the agent exits", child.wait()).await.expect("wait");
    assert!(status.success(), "agent exited with {status}");
}

fn key(instance: u32) -> v1::RunKey {
    v1::RunKey {
        job_id: "job-s".to_owned(),
        instance,
        run_id: 1,
        launch_id: 500 + u64::from(instance),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_report_log_restart_ack() {
    let (port, mut sessions) = start_stand_in().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let first = agent(port, dir.path(), TOKEN, false);
    let mut s = within("registration", sessions.recv())
        .await
        .expect("session");
    assert_eq!(s.register.host, "h1");
    assert_eq!(s.register.isolation, "rlimit");
    assert_eq!(s.register.ports, 10);
    assert_eq!(
        s.register.attributes.get("zone").map(String::as_str),
        Some("z1")
    );
    let r = s.register.resources.expect("resources");
    assert_eq!(
        (r.cpu, r.memory_mb, r.disk_mb, r.gpu),
        (2.0, 1024.0, 1000.0, 0.0)
    );
    assert!(s.register.runs.is_empty());

    let k = key(0);
    let spec = v1::TaskSpec {
        shell: "echo hi; while [ ! -f go ]; do sleep 0.05; done; echo bye".to_owned(),
        ports: vec![v1::PortSpec {
            name: "http".to_owned(),
        }],
        ..v1::TaskSpec::default()
    };
    s.send(v1::server_message::Kind::Launch(v1::LaunchRuns {
        runs: vec![v1::LaunchRun {
            key: Some(k.clone()),
            spec: Some(spec),
            ..Default::default()
        }],
    }))
    .await;
    s.report(&k, P::Running).await;
    // A kill of a run the agent never had is answered at once.
    let stranger = key(7);
    s.send(v1::server_message::Kind::Kill(v1::KillRuns {
        runs: vec![v1::KillRun {
            key: Some(stranger.clone()),
            grace_ms: 0,
            delay_ms: 0,
            ..Default::default()
        }],
    }))
    .await;
    let killed = s.report(&stranger, P::Killed).await;
    assert_eq!(killed.reason, "not running on this host");

    // The log, once the first line is there.
    let mut request_id = 0;
    let chunk = loop {
        request_id += 1;
        s.send(v1::server_message::Kind::ReadLog(v1::ReadLog {
            request_id,
            key: Some(k.clone()),
            stderr: false,
            offset: 0,
            max_bytes: 100,
            ..Default::default()
        }))
        .await;
        let chunk = s.log(request_id).await;
        if !chunk.data.is_empty() {
            break chunk;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(chunk.data, b"hi\n");
    assert!(!chunk.eof, "the run is still going");
    s.heartbeat().await;

    // SIGTERM: the agent goes, the task stays.
    stop(first).await;
    let sandbox = dir
        .path()
        .canonicalize()
        .expect("canonical")
        .join("sandboxes")
        .join("job-s-0-1-500");
    assert!(sandbox.join("run.json").exists());
    assert!(!sandbox.join("exit.json").exists(), "the task kept running");

    // A new agent registers with the run, still RUNNING, and sees it end.
    let second = agent(port, dir.path(), TOKEN, false);
    let mut s = within("re-registration", sessions.recv())
        .await
        .expect("session");
    let runs: Vec<_> = s
        .register
        .runs
        .iter()
        .map(|r| (r.key.clone().expect("key"), r.phase()))
        .collect();
    assert_eq!(runs, vec![(k.clone(), P::Running)]);
    std::fs::write(sandbox.join("go"), "").expect("touch go");
    let done = s.report(&k, P::Succeeded).await;
    assert_eq!(done.exit_code, 0);
    s.send(v1::server_message::Kind::Ack(v1::AckRuns {
        keys: vec![k.clone()],
    }))
    .await;
    // Acknowledged durably before the agent stops: wait for run.json.
    within("acknowledgement recorded", async {
        loop {
            let run = run_record(&sandbox);
            if run["acked"] == serde_json::Value::Bool(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop(second).await;

    let third = agent(port, dir.path(), TOKEN, false);
    let s = within("third registration", sessions.recv())
        .await
        .expect("session");
    assert!(s.register.runs.is_empty(), "{:?}", s.register.runs);
    stop(third).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_verdicts_and_ports_reach_the_server() {
    let (port, mut sessions) = start_stand_in().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let child = agent(port, dir.path(), TOKEN, false);
    let mut s = within("registration", sessions.recv())
        .await
        .expect("session");
    let k = key(1);
    let spec = v1::TaskSpec {
        shell: "sleep 600".to_owned(),
        ports: vec![v1::PortSpec {
            name: "http".to_owned(),
        }],
        health_check: Some(v1::HealthCheck {
            kind: Some(v1::health_check::Kind::Command(
                "[ -f ok ] || { echo no ok; exit 1; }".to_owned(),
            )),
            interval_ms: 100,
            max_consecutive_failures: 2,
            ..v1::HealthCheck::default()
        }),
        ..v1::TaskSpec::default()
    };
    s.send(v1::server_message::Kind::Launch(v1::LaunchRuns {
        runs: vec![v1::LaunchRun {
            key: Some(k.clone()),
            spec: Some(spec),
            ..Default::default()
        }],
    }))
    .await;
    // The first report: RUNNING (the launcher answers once the task has
    // executed), with the assigned port.
    let starting = s.report(&k, P::Running).await;
    let assigned = starting.ports.get("http").copied().expect("the http port");
    assert!((19300..=19309).contains(&assigned), "{starting:?}");
    let unhealthy = s
        .report_where(&k, |r| {
            r.phase() == P::Running && r.health() == v1::Health::Unhealthy
        })
        .await;
    assert_eq!(unhealthy.health_detail, "exited with code 1: no ok");
    assert_eq!(unhealthy.ports, starting.ports);
    let sandbox = dir
        .path()
        .canonicalize()
        .expect("canonical")
        .join("sandboxes")
        .join("job-s-1-1-501");
    std::fs::write(sandbox.join("ok"), "").expect("touch ok");
    let healthy = s
        .report_where(&k, |r| {
            r.phase() == P::Running && r.health() == v1::Health::Healthy
        })
        .await;
    assert!(healthy.health_detail.is_empty(), "{healthy:?}");
    s.send(v1::server_message::Kind::Kill(v1::KillRuns {
        runs: vec![v1::KillRun {
            key: Some(k.clone()),
            grace_ms: 1_000,
            delay_ms: 0,
            ..Default::default()
        }],
    }))
    .await;
    s.report(&k, P::Killed).await;
    stop(child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_registered_and_deleted_on_request() {
    let (port, mut sessions) = start_stand_in().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let first = agent(port, dir.path(), TOKEN, false);
    let mut s = within("registration", sessions.recv())
        .await
        .expect("session");
    assert!(s.register.volumes.is_empty());
    let k = key(2);
    s.send(v1::server_message::Kind::Launch(v1::LaunchRuns {
        runs: vec![v1::LaunchRun {
            key: Some(k.clone()),
            spec: Some(v1::TaskSpec {
                shell: "echo data > \"$PELOTON_VOLUME/f\"".to_owned(),
                ..v1::TaskSpec::default()
            }),
            volume: Some(v1::VolumeMount {
                id: "vol-s".to_owned(),
                size_mb: 1,
            }),
            ..v1::LaunchRun::default()
        }],
    }))
    .await;
    let done = s.report(&k, P::Succeeded).await;
    assert_eq!(done.exit_code, 0, "{done:?}");
    let volume = dir
        .path()
        .canonicalize()
        .expect("canonical")
        .join("volumes")
        .join("vol-s");
    assert!(volume.join("f").exists());
    stop(first).await;

    // The next registration lists it; a deletion removes it.
    let second = agent(port, dir.path(), TOKEN, false);
    let s = within("re-registration", sessions.recv())
        .await
        .expect("session");
    assert_eq!(s.register.volumes, ["vol-s"]);
    s.send(v1::server_message::Kind::DeleteVolumes(v1::DeleteVolumes {
        ids: vec!["vol-s".to_owned(), "never-was".to_owned()],
    }))
    .await;
    within("the volume is deleted", async {
        while volume.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop(second).await;

    let third = agent(port, dir.path(), TOKEN, false);
    let s = within("third registration", sessions.recv())
        .await
        .expect("session");
    assert!(s.register.volumes.is_empty(), "{:?}", s.register.volumes);
    stop(third).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_agent_says_so_and_keeps_trying() {
    let (port, mut sessions) = start_stand_in().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = agent(port, dir.path(), "wrong-token", true);
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    within("the refusal is logged", async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line.contains("refused this agent") && line.contains("Unauthenticated") {
                return;
            }
        }
        panic!("the agent exited without logging the refusal");
    })
    .await;
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
    assert!(sessions.try_recv().is_err(), "no session was accepted");
    // Keep reading its log so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    stop(child).await;
}

/// The agent's record of a run: the newest whole generation in its
/// journal (`run.json`: JSON lines, appended to; the launcher's entry is
/// `{"exit": ...}`).
fn run_record(sandbox: &std::path::Path) -> serde_json::Value {
    std::fs::read(sandbox.join("run.json"))
        .expect("a journal")
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter(|v| v.get("generation").is_some())
        .max_by_key(|v| v["generation"].as_u64().unwrap_or(0))
        .expect("a run record")
}
