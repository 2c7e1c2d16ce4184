//! Shared helpers of the agent's cluster tests: a real `pelotond` and real
//! `peloton-agent` processes on 127.0.0.1, their clients, spec builders,
//! polling with a deadline, and the clean-up that leaves no task behind
//! (a `Cluster` SIGKILLs its server, its agents and every process carrying
//! one of its sandboxes in `PELOTON_SANDBOX` when dropped, also on a panic).
//!
//! Every server is secure, as servers are by default: TLS only with the
//! test CA's server certificate (`peloton_tls::testkit`, one CA per test
//! process), agents' client certificates checked against that CA, each
//! agent with a certificate naming its `--host`, and the tests' clients
//! (gRPC and the `peloton` CLI) on TLS with the server's admin token.
//!
//! `pelotond` and `peloton` are found next to this package's agent binary
//! (`cargo test --workspace` builds every binary of the workspace; a single
//! test target needs `cargo build -p peloton-gateway` first).

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pb::JobState as J;
use pb::TaskState as T;
use peloton_gateway::client::{Authed, Bearer};
use peloton_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::service::interceptor::InterceptedService;

pub const TIMEOUT: Duration = Duration::from_secs(60);
pub const TOKEN: &str = "cluster-test-token";
/// Short, so that a killed agent's host is lost quickly.
pub const HOST_LOST_AFTER_MS: u64 = 3000;

pub fn sibling(name: &str) -> PathBuf {
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_peloton-agent"));
    let p = agent.with_file_name(name);
    assert!(
        p.exists(),
        "{} not found: build the workspace's binaries first (cargo test --workspace does)",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {TIMEOUT:?}: {what}"))
}

/// Polls `check` until it returns `Some`.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    within(what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// The test CA and the server certificate every test server uses (for
/// 127.0.0.1, localhost and ::1); the CA signs the agents' certificates.
pub fn pki() -> &'static peloton_tls::testkit::TestPki {
    peloton_tls::testkit::shared()
}

/// The URL of a test server on `port` (TLS only).
pub fn url(port: u16) -> String {
    format!("https://127.0.0.1:{port}")
}

/// The bootstrap admin token a server keeps in `DATA_DIR/admin-token`
/// (written before it serves).
pub fn admin_token(data_dir: &Path) -> String {
    let path = data_dir.join("admin-token");
    let token = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the admin token {}: {e}", path.display()));
    token.trim().to_owned()
}

/// An HTTPS channel to the server on `port` trusting `ca_file`, sending
/// `token` on every call (connected on first use).
pub fn channel(port: u16, ca_file: &Path, token: &str) -> Authed {
    let channel = peloton_gateway::client::endpoint(&url(port), Some(ca_file))
        .expect("an https endpoint")
        .connect_lazy();
    InterceptedService::new(channel, Bearer::new(Some(token)).expect("an ASCII token"))
}

/// `--ca-file`, `--cert-file` and `--key-file` for an agent registering
/// `host`: the test CA and a certificate naming `host`, written under
/// `dir`.
pub fn agent_tls_args(dir: &Path, host: &str) -> Vec<OsString> {
    std::fs::create_dir_all(dir).expect("certificates dir");
    let (cert, key) = pki().client_files(host, dir).expect("agent certificate");
    vec![
        "--ca-file".into(),
        pki().ca_file.clone().into(),
        "--cert-file".into(),
        cert.into(),
        "--key-file".into(),
        key.into(),
    ]
}

#[derive(Clone)]
pub struct Clients {
    pub pools: pb::resource_pool_service_client::ResourcePoolServiceClient<Authed>,
    pub jobs: pb::job_service_client::JobServiceClient<Authed>,
    pub tasks: pb::task_service_client::TaskServiceClient<Authed>,
    pub hosts: pb::host_service_client::HostServiceClient<Authed>,
    pub watch: pb::watch_service_client::WatchServiceClient<Authed>,
    pub volumes: pb::volume_service_client::VolumeServiceClient<Authed>,
    pub apps: pb::application_service_client::ApplicationServiceClient<Authed>,
}

impl Clients {
    /// The clients of the server on `port` (its CA in `ca_file`), as the
    /// holder of `token`.
    pub fn new(port: u16, ca_file: &Path, token: &str) -> Self {
        Clients::with_channel(channel(port, ca_file, token))
    }

    /// The clients of a server that keeps its own CA and admin token in
    /// its data dir (`DATA_DIR/tls/ca.pem`, `DATA_DIR/admin-token`), as
    /// its admin.
    pub fn of_data_dir(port: u16, data_dir: &Path) -> Self {
        Clients::new(
            port,
            &data_dir.join("tls").join("ca.pem"),
            &admin_token(data_dir),
        )
    }

    pub fn with_channel(channel: Authed) -> Self {
        Clients {
            pools: pb::resource_pool_service_client::ResourcePoolServiceClient::new(
                channel.clone(),
            ),
            jobs: pb::job_service_client::JobServiceClient::new(channel.clone()),
            tasks: pb::task_service_client::TaskServiceClient::new(channel.clone()),
            hosts: pb::host_service_client::HostServiceClient::new(channel.clone()),
            watch: pb::watch_service_client::WatchServiceClient::new(channel.clone()),
            volumes: pb::volume_service_client::VolumeServiceClient::new(channel.clone()),
            apps: pb::application_service_client::ApplicationServiceClient::new(channel),
        }
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub server: Option<Child>,
    pub agents: BTreeMap<String, Child>,
    /// As the server's admin.
    pub c: Clients,
    pub options: ClusterOptions,
}

/// How a test cluster's server and agents are started.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The server's `--host-lost-after-ms`.
    pub host_lost_after_ms: u64,
    /// Each agent's `--resources`.
    pub agent_resources: String,
    /// More arguments for each agent.
    pub agent_args: Vec<String>,
    /// More variables of each agent's environment (a `PATH` with a fake
    /// `nvidia-smi`, say).
    pub agent_env: Vec<(String, OsString)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            host_lost_after_ms: HOST_LOST_AFTER_MS,
            agent_resources: "cpu=4,mem=4096,disk=10000".into(),
            agent_args: Vec::new(),
            agent_env: Vec::new(),
        }
    }
}

/// Starts `pelotond` on `data_dir` and `port` with the test certificates;
/// returns once it serves, with its admin's clients.
pub async fn start_pelotond(data_dir: &Path, port: u16) -> (Child, Clients) {
    start_pelotond_losing_hosts_after(data_dir, port, HOST_LOST_AFTER_MS).await
}

/// [`start_pelotond`] with its `--host-lost-after-ms`.
pub async fn start_pelotond_losing_hosts_after(
    data_dir: &Path,
    port: u16,
    host_lost_after_ms: u64,
) -> (Child, Clients) {
    let pki = pki();
    let mut child = Command::new(sibling("pelotond"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert")
        .arg(&pki.server_cert)
        .arg("--tls-key")
        .arg(&pki.server_key)
        .arg("--tls-client-ca")
        .arg(&pki.ca_file)
        .args(["--no-metrics", "--agent-token", TOKEN])
        .args(["--host-lost-after-ms", &host_lost_after_ms.to_string()])
        .args(["--cycle-interval-ms", "5"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("pelotond starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    within("pelotond to serve", async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if line.starts_with("pelotond: serving gRPC on") {
                assert!(
                    line.ends_with(&url(port)),
                    "a secure server serves https: {line}"
                );
                return;
            }
        }
        panic!("pelotond exited before serving");
    })
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let clients = Clients::new(port, &pki.ca_file, &admin_token(data_dir));
    (child, clients)
}

impl Cluster {
    /// A server and `n` agents named a0, a1, …, every host up.
    pub async fn start(n: usize) -> Cluster {
        Self::start_with(n, ClusterOptions::default()).await
    }

    /// [`Cluster::start`] with these options.
    pub async fn start_with(n: usize, options: ClusterOptions) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let (server, c) = start_pelotond_losing_hosts_after(
            &dir.path().join("server"),
            port,
            options.host_lost_after_ms,
        )
        .await;
        let mut cluster = Cluster {
            dir,
            port,
            server: Some(server),
            agents: BTreeMap::new(),
            c,
            options,
        };
        for i in 0..n {
            cluster.start_agent(&format!("a{i}")).await;
        }
        cluster.wait_hosts_up(n).await;
        cluster.create_small_pool("/t").await;
        cluster
    }

    /// A pool at `path` reserving 1 core and 512 MiB.
    pub async fn create_small_pool(&self, path: &str) {
        let mut pools = self.c.pools.clone();
        pools
            .create(pb::CreatePoolRequest {
                path: path.into(),
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
            .unwrap_or_else(|e| panic!("pool {path}: {e:?}"));
    }

    /// (Re)starts the server on the cluster's data dir and `port`, and
    /// connects its clients.
    pub async fn start_server(&mut self) {
        let (server, c) = start_pelotond_losing_hosts_after(
            &self.data_dir(),
            self.port,
            self.options.host_lost_after_ms,
        )
        .await;
        self.server = Some(server);
        self.c = c;
    }

    /// The server's data dir.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("server")
    }

    /// The file holding the server's admin token.
    pub fn admin_token_file(&self) -> PathBuf {
        self.data_dir().join("admin-token")
    }

    /// A channel to the server, as its admin.
    pub fn channel(&self) -> Authed {
        channel(self.port, &pki().ca_file, &admin_token(&self.data_dir()))
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        url(self.port)
    }

    /// The `peloton` CLI on this cluster as its admin: `--server` and
    /// `--ca-file`, the token by file (`PELOTON_TOKEN_FILE`), and nothing
    /// from the environment or the config file of whoever runs the tests.
    pub fn cli(&self) -> Command {
        let mut command = Command::new(sibling("peloton"));
        command
            .args(["--server", &self.url()])
            .arg("--ca-file")
            .arg(&pki().ca_file)
            .env_remove("PELOTON_SERVER")
            .env_remove("PELOTON_CA_FILE")
            .env_remove("PELOTON_TOKEN")
            .env_remove("PELOTON_CONFIG")
            .env("XDG_CONFIG_HOME", self.dir.path().join("no-config"))
            .env("PELOTON_TOKEN_FILE", self.admin_token_file());
        command
    }

    /// `--ca-file`, `--cert-file` and `--key-file` for an agent of this
    /// cluster registering `host`.
    pub fn agent_tls_args(&self, host: &str) -> Vec<OsString> {
        agent_tls_args(&self.dir.path().join("certs"), host)
    }

    pub fn work_dir(&self, host: &str) -> PathBuf {
        self.dir.path().join("agents").join(host)
    }

    pub async fn start_agent(&mut self, host: &str) {
        self.start_agent_with(host, &[]).await;
    }

    /// An agent with host attributes (`KEY=VALUE`) besides its rack.
    pub async fn start_agent_with(&mut self, host: &str, attributes: &[&str]) {
        let server = self.url();
        self.spawn_agent(host, &server, attributes);
    }

    /// An agent given `servers` as its `--server` (a list, say, of
    /// https:// URLs).
    pub async fn start_agent_at(&mut self, host: &str, servers: &str) {
        self.spawn_agent(host, servers, &[]);
    }

    fn spawn_agent(&mut self, host: &str, servers: &str, attributes: &[&str]) {
        let work = self.work_dir(host);
        std::fs::create_dir_all(&work).expect("work dir");
        let mut command = Command::new(env!("CARGO_BIN_EXE_peloton-agent"));
        command
            .args(["--server", servers])
            .args(self.agent_tls_args(host))
            .arg("--work-dir")
            .arg(&work)
            .args(["--host", host, "--token", TOKEN])
            .args(["--resources", &self.options.agent_resources])
            .args(["--attr", &format!("rack=r-{host}")]);
        for a in attributes {
            command.args(["--attr", a]);
        }
        command.args(&self.options.agent_args);
        command.envs(self.options.agent_env.iter().map(|(k, v)| (k, v)));
        let child = command
            .args(["--ports", &agent_port_range()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("agent starts");
        self.agents.insert(host.to_string(), child);
    }

    /// Stops an agent with SIGTERM (it exits 0 and leaves its tasks
    /// running) and waits for it to exit.
    pub async fn sigterm_agent(&mut self, host: &str) {
        let mut child = self.agents.remove(host).expect("agent");
        let pid = child.id().expect("agent pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        let status = within(&format!("agent {host} to exit"), child.wait())
            .await
            .expect("wait");
        assert!(status.success(), "agent {host} exited with {status}");
    }

    pub async fn sigkill_agent(&mut self, host: &str) {
        let mut child = self.agents.remove(host).expect("agent");
        child.kill().await.expect("SIGKILL");
    }

    pub async fn hosts(&self) -> Vec<pb::Host> {
        let mut h = self.c.hosts.clone();
        h.list(pb::ListHostsRequest::default())
            .await
            .map(|r| r.into_inner().hosts)
            .unwrap_or_default()
    }

    pub async fn wait_hosts_up(&self, n: usize) {
        eventually(&format!("{n} hosts up"), async || {
            let up = self
                .hosts()
                .await
                .iter()
                .filter(|h| h.state() == pb::HostState::Up && h.connected)
                .count();
            (up >= n).then_some(())
        })
        .await;
    }

    pub async fn create(&self, spec: pb::JobSpec) -> String {
        let mut jobs = self.c.jobs.clone();
        jobs.create(pb::CreateJobRequest { spec: Some(spec) })
            .await
            .expect("create job")
            .into_inner()
            .job
            .expect("job")
            .id
    }

    pub async fn kill_job(&self, id: &str) {
        let mut jobs = self.c.jobs.clone();
        jobs.kill(pb::KillJobRequest {
            id: id.into(),
            version: 0,
        })
        .await
        .expect("kill");
    }

    pub async fn job(&self, id: &str) -> Option<pb::Job> {
        let mut jobs = self.c.jobs.clone();
        jobs.get(pb::GetJobRequest { id: id.into() })
            .await
            .ok()
            .and_then(|r| r.into_inner().job)
    }

    pub async fn wait_job(&self, id: &str, want: J) -> pb::Job {
        eventually(&format!("job {id} {want:?}"), async || {
            let j = self.job(id).await?;
            let state = j.status.as_ref()?.state();
            if state == want {
                return Some(j);
            }
            assert!(
                !matches!(state, J::Succeeded | J::Failed | J::Killed),
                "job ended {state:?}, not {want:?}: {j:#?}"
            );
            None
        })
        .await
    }

    pub async fn task(&self, id: &str, instance: u32) -> Option<pb::Task> {
        let mut tasks = self.c.tasks.clone();
        tasks
            .get(pb::GetTaskRequest {
                job_id: id.into(),
                instance,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().task)
    }

    /// Every task of job `id` (TaskService.List, one page).
    pub async fn tasks(&self, id: &str) -> Vec<pb::Task> {
        let mut tasks = self.c.tasks.clone();
        tasks
            .list(pb::ListTasksRequest {
                job_id: id.into(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().tasks)
            .unwrap_or_default()
    }

    pub async fn wait_running(&self, id: &str, n: u32) -> Vec<pb::Task> {
        eventually(&format!("{n} tasks of {id} running"), async || {
            let mut out = Vec::new();
            for i in 0..n {
                let t = self.task(id, i).await?;
                if t.current.as_ref()?.state() != T::Running {
                    return None;
                }
                out.push(t);
            }
            Some(out)
        })
        .await
    }

    pub async fn logs(&self, id: &str, instance: u32, stderr: bool) -> String {
        let mut tasks = self.c.tasks.clone();
        let mut stream = tasks
            .logs(pb::TaskLogsRequest {
                job_id: id.into(),
                instance,
                stderr,
                ..Default::default()
            })
            .await
            .expect("logs")
            .into_inner();
        let mut out = Vec::new();
        while let Some(chunk) = stream.message().await.expect("log chunk") {
            out.extend_from_slice(&chunk.data);
        }
        String::from_utf8(out).expect("utf-8")
    }

    /// Every sandbox of every agent, as (agent, dir name, path).
    pub fn sandboxes(&self) -> Vec<(String, String, PathBuf)> {
        let mut out = Vec::new();
        let Ok(agents) = std::fs::read_dir(self.dir.path().join("agents")) else {
            return out;
        };
        for a in agents.flatten() {
            let Ok(dirs) = std::fs::read_dir(a.path().join("sandboxes")) else {
                continue;
            };
            for d in dirs.flatten() {
                out.push((
                    a.file_name().to_string_lossy().into_owned(),
                    d.file_name().to_string_lossy().into_owned(),
                    d.path(),
                ));
            }
        }
        out.sort();
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Tasks left running by a SIGKILLed agent end on their own; kill
        // what is left of ours so that nothing outlives the test.
        for (_, c) in self.agents.iter_mut() {
            let _ = c.start_kill();
        }
        if let Some(s) = self.server.as_mut() {
            let _ = s.start_kill();
        }
        kill_processes_with_env(&format!("PELOTON_SANDBOX={}", self.dir.path().display()));
    }
}

/// Ports per agent.
const PORTS_PER_AGENT: u32 = 20;
/// Agents started by this test process so far.
static AGENTS_STARTED: AtomicU32 = AtomicU32::new(0);

/// A `--ports` range of its own for each agent: distinct within this test
/// process, and offset by the pid so that test processes running at once
/// (or a `pelotond --local-agents`) seldom share one. Agents skip ports
/// something else listens on, so a shared range costs at most a retry.
/// The ranges stay below the kernel's ephemeral range: a port in it passes
/// the agent's bind check and may then be taken by an outgoing connection
/// (a health check, an agent reconnecting) before the task binds it, and
/// the task fails with "address in use" (a flake seen in CI).
fn agent_port_range() -> String {
    const FIRST: u32 = 20_000;
    let below = peloton_agent::ephemeral_range().map_or(32_768, |r| u32::from(r.first));
    // (An ephemeral range starting that low leaves no room below it: the
    // ranges then spread over 20000-39999 as before, seldom shared.)
    let slots = match below.saturating_sub(FIRST) / PORTS_PER_AGENT {
        n if n >= 50 => n,
        _ => 1000,
    };
    let n = AGENTS_STARTED.fetch_add(1, Ordering::Relaxed);
    let slot = (std::process::id().wrapping_mul(37).wrapping_add(n)) % slots;
    let first = FIRST + slot * PORTS_PER_AGENT;
    format!("{first}-{}", first + PORTS_PER_AGENT - 1)
}

/// Waits until a process with `needle` in its environment runs `program`
/// (its first argument): a task that executes it after `trap '' TERM`
/// ignores SIGTERM only from then on, and RUNNING is reported as soon as
/// its shell is executed.
#[allow(dead_code)]
pub async fn wait_exec(needle: &str, program: &str) {
    eventually(&format!("{program} executed"), async || {
        processes_with_env(needle)
            .into_iter()
            .any(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .split(|&b| b == 0)
                    .next()
                    .is_some_and(|arg| arg == program.as_bytes())
            })
            .then_some(())
    })
    .await;
}

/// Pids of processes whose environment has a variable starting with
/// `needle` (our tasks carry their sandbox path in PELOTON_SANDBOX).
pub fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env
            .split(|&b| b == 0)
            .any(|var| var.starts_with(needle.as_bytes()))
        {
            // Zombies keep their environ readable only while alive.
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            if !state.starts_with('Z') {
                out.push(pid);
            }
        }
    }
    out
}

pub fn kill_processes_with_env(needle: &str) {
    for pid in processes_with_env(needle) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

pub fn task_spec(shell: &str) -> pb::TaskSpec {
    pb::TaskSpec {
        shell: shell.into(),
        resources: Some(pb::Resources {
            cpu: 0.5,
            memory_mb: 256.0,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn job(name: &str, n: u32, task: pb::TaskSpec) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        pool: "/t".into(),
        instance_count: n,
        default_task: Some(task),
        // Preemptible work may use more than the pool's reservation.
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}
