//! Faults in a loop under load: running work must not notice them.
//!
//! One PostgreSQL of the test's own, two `pelotond` on it (lease 1.5 s,
//! hosts lost after 20 s), three real agents given both servers, one pool;
//! long `sleep` tasks (preemptible and not) fill most of the cluster and a
//! stream of short batch jobs (`sleep 1`..`sleep 3`, a few a second) runs
//! beside them. Then, for `PELOTON_CHAOS_SECS` (45 s by default), one fault
//! at a time chosen by a seeded random generator (`PELOTON_CHAOS_SEED`:
//! 11 by default, `random` draws one and prints it), with pauses between them: an agent
//! killed (SIGKILL) or stopped (SIGTERM) and started again 1–5 s later on
//! its work dir, the leader stopped (SIGTERM) or killed (SIGKILL) and
//! started again as a standby, the database killed and started again after
//! twice the lease. After each fault, once a leader serves and every agent
//! is connected to it, and again at the end, every task of every job is
//! read through the API: runs ended PREEMPTED, LOST, FAILED or KILLED and
//! instances on a run after their first must number 0 — except what a host
//! staying away past its lost timeout explains, which no fault here does.
//! Every acknowledged short job must end SUCCEEDED and every long task be
//! still RUNNING on its first run.
//!
//! The long run (the fault test):
//! `PELOTON_CHAOS_SECS=600 cargo test -p peloton-gateway --test chaos -- --nocapture`
//! (the agent binary must be built: `cargo build -p peloton-agent`). On a
//! failure the test keeps its directory (the servers' and agents' logs)
//! and names it.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Clients, TIMEOUT, free_port, tail};
use peloton_gateway::local_pg::LocalPostgres;
use peloton_proto::v1 as pb;
use tokio::process::Child;

const TOKEN: &str = "chaos-test-token";
const LEASE_MS: u64 = 1500;
/// Well above the longest outage injected (an agent away 5 s plus its
/// reconnect; a leader switch), so no host is ever lost.
const HOST_LOST_AFTER_MS: u64 = 20_000;
const HOSTS: [&str; 3] = ["h0", "h1", "h2"];
/// Each agent offers 2 cpus: 6 in all.
const AGENT_RESOURCES: &str = "cpu=2,mem=4096,disk=10000";
/// Long tasks: 6 preemptible and 3 non-preemptible of 0.5 cpu (4.5 of 6
/// cpus, more than two hosts' worth: a host's capacity withdrawn while its
/// agent is away puts the pool over what it is entitled to).
const LONG_PREEMPTIBLE: u32 = 6;
const LONG_FIXED: u32 = 3;
const LONG_CPU: f64 = 0.5;
const SHORT_CPU: f64 = 0.1;
/// How long the cluster may take to serve again with every agent
/// connected after a fault.
const RECOVERY: Duration = Duration::from_secs(60);
/// Default length of the fault loop; `PELOTON_CHAOS_SECS` sets it.
const DEFAULT_SECS: u64 = 45;
/// `PELOTON_CHAOS_SECS` at most (a day).
const MAX_SECS: u64 = 86_400;

/// The test's settings from the environment: (fault loop length, seed).
fn settings() -> (Duration, u64) {
    let secs = match std::env::var("PELOTON_CHAOS_SECS") {
        Err(_) => DEFAULT_SECS,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if (1..=MAX_SECS).contains(&n) => n,
            _ => panic!("PELOTON_CHAOS_SECS={v:?}: expected whole seconds from 1 to {MAX_SECS}"),
        },
    };
    // A fixed seed by default, so that a suite run is repeatable (CI);
    // `random` draws one (printed) for exploring.
    let seed = match std::env::var("PELOTON_CHAOS_SEED") {
        Err(_) => DEFAULT_SEED,
        Ok(v) if v.trim() == "random" => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        }
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("PELOTON_CHAOS_SEED={v:?}: expected an unsigned integer")),
    };
    (Duration::from_secs(secs), seed)
}

/// The seed of a run that names none.
const DEFAULT_SEED: u64 = 11;

/// SplitMix64: small, seeded, the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

fn addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// Admin clients of the server on `port`, one attempt (a server that is
/// down is an error, not a wait).
async fn connect(port: u16) -> Result<Clients, String> {
    let channel = common::tls_channel(addr(port)).await?;
    Ok(Clients::with_channel(common::with_token(
        channel,
        common::ADMIN_TOKEN,
    )))
}

/// Whether the server on `port` leads: a read answers.
async fn serves(port: u16) -> Result<(), String> {
    let mut c = connect(port).await?;
    c.hosts
        .list(pb::ListHostsRequest::default())
        .await
        .map(drop)
        .map_err(|e| e.message().to_string())
}

/// A `pelotond` on `db` (its data dir `DIR/NAME`, its log `DIR/NAME.log`,
/// appended across restarts), once it listens (it may stand by).
async fn spawn_server(dir: &Path, name: &str, port: u16, db: &str) -> Child {
    common::spawn_pelotond(
        dir,
        name,
        port,
        &common::PgServer {
            db,
            agent_token: TOKEN,
            lease_ms: LEASE_MS,
            host_lost_after_ms: HOST_LOST_AFTER_MS,
            sim_hosts: 0,
        },
    )
    .await
}

/// A real `peloton-agent` for `host` (work dir `DIR/agent-HOST`, log
/// `DIR/agent-HOST.log`) given the server list `servers`.
fn spawn_agent(dir: &Path, host: &str, servers: &str, ports: &str) -> Child {
    common::spawn_agent(
        dir,
        host,
        &common::AgentProcess {
            servers,
            agent_token: TOKEN,
            resources: AGENT_RESOURCES,
            ports,
            log_file: true,
        },
    )
}

fn pid_of(child: &Child) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid"))
}

/// Sends SIGTERM and waits for a clean exit.
async fn stop(child: &mut Child, what: &str) -> Duration {
    let t = Instant::now();
    nix::sys::signal::kill(pid_of(child), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop within {TIMEOUT:?} of SIGTERM"))
        .expect("wait");
    assert!(
        status.success(),
        "{what} exited with {status} after SIGTERM"
    );
    t.elapsed()
}

/// The faults injected, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    AgentKill,
    AgentTerm,
    LeaderTerm,
    LeaderKill,
    DatabaseDown,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::AgentKill,
        Fault::AgentTerm,
        Fault::LeaderTerm,
        Fault::LeaderKill,
        Fault::DatabaseDown,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::AgentKill => "agent SIGKILL",
            Fault::AgentTerm => "agent SIGTERM",
            Fault::LeaderTerm => "leader SIGTERM",
            Fault::LeaderKill => "leader SIGKILL",
            Fault::DatabaseDown => "database down",
        }
    }
}

struct Server {
    name: String,
    port: u16,
    child: Option<Child>,
}

struct Agent {
    host: &'static str,
    ports: String,
    child: Option<Child>,
    /// Its registrations (see [`Cluster::registrations`]) the cluster has
    /// recovered at.
    must_register: usize,
}

/// The cluster under test. Dropped, it kills what it started, tasks too;
/// dropped while panicking, it keeps its directory (the logs) and names it.
struct Cluster {
    dir: Option<tempfile::TempDir>,
    pg: Arc<Mutex<LocalPostgres>>,
    db: String,
    servers: Vec<Server>,
    agents: Vec<Agent>,
    servers_list: String,
    /// What happened, for the failure message: (seconds since start, what).
    timeline: Vec<(f64, String)>,
    started: Instant,
    /// Servers that exited 75 (deposed) and were started again.
    deposed: u32,
}

impl Cluster {
    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("dir").path()
    }

    fn note(&mut self, what: String) {
        let at = self.started.elapsed().as_secs_f64();
        eprintln!("chaos {at:7.1} s: {what}");
        self.timeline.push((at, what));
    }

    fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    /// The port of a running server that leads, if any.
    async fn leader(&self) -> Option<u16> {
        for s in &self.servers {
            if s.child.is_some() && serves(s.port).await.is_ok() {
                return Some(s.port);
            }
        }
        None
    }

    async fn start_server(&mut self, i: usize) {
        let (name, port) = (self.servers[i].name.clone(), self.servers[i].port);
        let child = spawn_server(self.dir(), &name, port, &self.db).await;
        self.servers[i].child = Some(child);
    }

    fn start_agent(&mut self, i: usize) {
        let a = &self.agents[i];
        let child = spawn_agent(self.dir(), a.host, &self.servers_list, &a.ports);
        self.agents[i].child = Some(child);
    }

    /// As a supervisor would: a server that exited 75 (deposed: it lost
    /// its lease and found it taken) starts again as a standby; any other
    /// exit of a server, and any exit of an agent, fails the test.
    async fn supervise(&mut self) {
        for i in 0..self.servers.len() {
            let Some(child) = self.servers[i].child.as_mut() else {
                continue;
            };
            let Some(status) = child.try_wait().expect("try_wait") else {
                continue;
            };
            let name = self.servers[i].name.clone();
            if status.code() != Some(75) {
                self.fail(&format!("server {name} exited on its own with {status}"));
            }
            self.deposed += 1;
            self.note(format!("server {name} exited deposed (75): started again"));
            self.start_server(i).await;
        }
        for i in 0..self.agents.len() {
            let Some(child) = self.agents[i].child.as_mut() else {
                continue;
            };
            if let Some(status) = child.try_wait().expect("try_wait") {
                let host = self.agents[i].host;
                self.fail(&format!("agent {host} exited on its own with {status}"));
            }
        }
    }

    /// How many times agent `i` has registered with a server (its log
    /// says so each time).
    fn registrations(&self, i: usize) -> usize {
        let log = self
            .dir()
            .join(format!("agent-{}.log", self.agents[i].host));
        let text = String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
        strip_ansi(&text)
            .lines()
            .filter(|l| l.contains("peloton_agent::session: registered "))
            .count()
    }

    /// Waits until a server leads, every agent a fault cut off has
    /// registered again (the API may still show a session the server has
    /// not yet heard end) and every agent is connected to the leader and
    /// up; returns the leader's port.
    async fn recover(&mut self) -> u16 {
        let deadline = Instant::now() + RECOVERY;
        loop {
            self.supervise().await;
            let waiting: Vec<&str> = (0..self.agents.len())
                .filter(|&i| self.registrations(i) < self.agents[i].must_register)
                .map(|i| self.agents[i].host)
                .collect();
            let last = match self.leader().await {
                None => "no leader".to_string(),
                Some(_) if !waiting.is_empty() => {
                    format!("agents not registered again since the fault: {waiting:?}")
                }
                Some(port) => match hosts_connected(port).await {
                    Ok(()) => return port,
                    Err(e) => format!("leader {port}: {e}"),
                },
            };
            if Instant::now() > deadline {
                self.fail(&format!(
                    "no recovery within {RECOVERY:?} of a fault; last seen: {last}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a server leads (no agents yet); returns its port.
    async fn recover_leader_only(&mut self) -> u16 {
        let deadline = Instant::now() + RECOVERY;
        loop {
            self.supervise().await;
            if let Some(p) = self.leader().await {
                return p;
            }
            if Instant::now() > deadline {
                self.fail("no leader");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Injects `fault`; returns what it did.
    async fn inject(&mut self, fault: Fault, leader: u16, rng: &mut Rng) -> String {
        // Every fault ends the sessions of the agents it touches (a lapsed
        // or dead leader's, all of them): each registers again.
        let before: Vec<usize> = (0..self.agents.len())
            .map(|i| self.registrations(i))
            .collect();
        let all = !matches!(fault, Fault::AgentKill | Fault::AgentTerm);
        for (i, n) in before.iter().enumerate() {
            if all {
                self.agents[i].must_register = n + 1;
            }
        }
        match fault {
            Fault::AgentKill | Fault::AgentTerm => {
                let i = rng.range(0, self.agents.len() as u64 - 1) as usize;
                self.agents[i].must_register = before[i] + 1;
                let host = self.agents[i].host;
                let mut child = self.agents[i].child.take().expect("agent running");
                if fault == Fault::AgentKill {
                    child.kill().await.expect("SIGKILL");
                } else {
                    stop(&mut child, &format!("agent {host}")).await;
                }
                let away = rng.millis(1000, 5000);
                tokio::time::sleep(away).await;
                self.start_agent(i);
                format!("{} {host}, started again after {away:?}", fault.name())
            }
            Fault::LeaderTerm => {
                let i = self.server_at(leader);
                let name = self.servers[i].name.clone();
                let mut child = self.servers[i].child.take().expect("leader running");
                let took = stop(&mut child, &format!("leader {name}")).await;
                // Started again as a standby once the other leads.
                let other = self.servers[1 - i].port;
                let t = Instant::now();
                while serves(other).await.is_err() && t.elapsed() < RECOVERY {
                    self.supervise().await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let handed = t.elapsed();
                self.start_server(i).await;
                format!(
                    "{} {name}: exited after {took:?}, the other led {handed:?} later; \
                     {name} started again",
                    fault.name()
                )
            }
            Fault::LeaderKill => {
                let i = self.server_at(leader);
                let name = self.servers[i].name.clone();
                let mut child = self.servers[i].child.take().expect("leader running");
                child.kill().await.expect("SIGKILL");
                let away = rng.millis(0, 3000);
                tokio::time::sleep(away).await;
                self.start_server(i).await;
                format!("{} {name}, started again after {away:?}", fault.name())
            }
            Fault::DatabaseDown => {
                let down = Duration::from_millis(2 * LEASE_MS);
                let pg = self.pg.clone();
                tokio::task::spawn_blocking(move || {
                    let mut pg = pg.lock().expect("pg");
                    pg.kill();
                    std::thread::sleep(down);
                    pg.restart().expect("PostgreSQL restarts");
                })
                .await
                .expect("database restart");
                format!("{} (killed, started again after {down:?})", fault.name())
            }
        }
    }

    fn server_at(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port == port)
            .expect("a server on the leader's port")
    }

    /// Fails the test with `what`, the timeline and the ends of the logs;
    /// the directory is kept.
    fn fail(&self, what: &str) -> ! {
        let mut msg = format!("{what}\n\ntimeline:\n");
        for (at, e) in &self.timeline {
            msg.push_str(&format!("  {at:7.1} s: {e}\n"));
        }
        for s in &self.servers {
            let log = self.dir().join(format!("{}.log", s.name));
            msg.push_str(&format!(
                "\nthe end of {}:\n{}\n",
                log.display(),
                tail(&log, 30)
            ));
        }
        let _ = std::fs::write(self.dir().join("failure.txt"), &msg);
        panic!("{msg}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.agents {
            if let Some(c) = a.child.as_mut() {
                let _ = c.start_kill();
            }
        }
        for s in &mut self.servers {
            if let Some(c) = s.child.as_mut() {
                let _ = c.start_kill();
            }
        }
        let Some(mut dir) = self.dir.take() else {
            return;
        };
        // Tasks outlive their agents: end ours.
        kill_tasks_under(dir.path());
        if std::thread::panicking() {
            dir.disable_cleanup(true);
            eprintln!(
                "chaos: the test's directory (servers' and agents' logs) is kept: {}",
                dir.path().display()
            );
        }
    }
}

/// `text` without its terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Kills the processes whose environment names a sandbox under `dir`
/// (the agents put `PELOTON_SANDBOX=<dir>` in every task's).
fn kill_tasks_under(dir: &Path) {
    let needle = format!("PELOTON_SANDBOX={}", dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env
            .split(|&b| b == 0)
            .any(|var| var.starts_with(needle.as_bytes()))
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Whether every agent is connected to the server on `port` and its host
/// up.
async fn hosts_connected(port: u16) -> Result<(), String> {
    let mut c = connect(port).await?;
    let hosts = c
        .hosts
        .list(pb::ListHostsRequest::default())
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner()
        .hosts;
    let ready = hosts
        .iter()
        .filter(|h| h.connected && h.state() == pb::HostState::Up)
        .count();
    if ready == HOSTS.len() {
        Ok(())
    } else {
        Err(format!(
            "{ready} of {} hosts connected and up: {:?}",
            HOSTS.len(),
            hosts
                .iter()
                .map(|h| (h.name.clone(), h.connected, h.state()))
                .collect::<Vec<_>>()
        ))
    }
}

fn sleep_task(shell: &str, cpu: f64) -> pb::TaskSpec {
    pb::TaskSpec {
        shell: shell.into(),
        resources: Some(common::res(cpu, 32.0)),
        ..Default::default()
    }
}

fn job(name: &str, n: u32, task: pb::TaskSpec, preemptible: bool) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        pool: "/t".into(),
        instance_count: n,
        default_task: Some(task),
        sla: Some(pb::Sla {
            preemptible,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the short-job stream did.
#[derive(Debug, Default)]
struct Load {
    /// Acknowledged jobs' ids.
    acked: Vec<String>,
    /// Calls refused or failed (not acknowledged; retried).
    refused: u32,
}

/// Submits short batch jobs to whichever server leads until `stop`: every
/// 250–600 ms one job of 1–2 `sleep 1`..`sleep 3` tasks of 0.1 cpu (every
/// fourth not preemptible), each retried until acknowledged.
async fn short_jobs(
    ports: Vec<u16>,
    hint: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Load {
    let mut rng = Rng(seed ^ 0x5107_7a5c);
    let mut load = Load::default();
    let mut clients: HashMap<u16, Clients> = HashMap::new();
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let n = rng.range(1, 2) as u32;
        let secs = rng.range(1, 3);
        let spec = job(
            &format!("short-{i}"),
            n,
            sleep_task(&format!("sleep {secs}"), SHORT_CPU),
            !i.is_multiple_of(4),
        );
        while !stop.load(Ordering::Relaxed) {
            let port = hint.load(Ordering::Relaxed);
            let answer = match clients.get(&port) {
                Some(c) => Ok(c.clone()),
                None => connect(port).await,
            };
            let answer = match answer {
                Ok(mut c) => {
                    clients.insert(port, c.clone());
                    c.jobs
                        .create(pb::CreateJobRequest {
                            spec: Some(spec.clone()),
                        })
                        .await
                        .map_err(|e| e.message().to_string())
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(r) => {
                    load.acked.push(r.into_inner().job.expect("job").id);
                    break;
                }
                Err(_) => {
                    load.refused += 1;
                    clients.remove(&port);
                    let next = ports
                        [(ports.iter().position(|&p| p == port).unwrap_or(0) + 1) % ports.len()];
                    hint.store(next, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tokio::time::sleep(rng.millis(250, 600)).await;
    }
    load
}

/// A job as read through the API: itself and its tasks.
#[derive(Clone, Debug)]
struct JobView {
    job: pb::Job,
    tasks: Vec<pb::Task>,
}

impl JobView {
    fn name(&self) -> &str {
        self.job.spec.as_ref().map_or("", |s| s.name.as_str())
    }

    fn state(&self) -> pb::JobState {
        common::job_state(&self.job)
    }

    fn is_short(&self) -> bool {
        self.name().starts_with("short-")
    }
}

/// Every job and its tasks, read from the server on `port`. Jobs in
/// `settled` (finished: their tasks no longer change) are not read again;
/// finished jobs read now are added to it.
async fn census(
    port: u16,
    settled: &mut BTreeMap<String, JobView>,
) -> Result<Vec<JobView>, String> {
    let mut c = connect(port).await?;
    let mut jobs = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .jobs
            .query(pb::QueryJobsRequest {
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| e.message().to_string())?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut out = Vec::new();
    for job in jobs {
        if let Some(v) = settled.get(&job.id) {
            out.push(v.clone());
            continue;
        }
        let mut tasks = Vec::new();
        let mut from = 0;
        loop {
            let page = c
                .tasks
                .list(pb::ListTasksRequest {
                    job_id: job.id.clone(),
                    from_instance: from,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.message().to_string())?
                .into_inner();
            tasks.extend(page.tasks);
            if page.next_instance == 0 {
                break;
            }
            from = page.next_instance;
        }
        let v = JobView { job, tasks };
        if matches!(
            v.state(),
            pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Killed
        ) {
            settled.insert(v.job.id.clone(), v.clone());
        }
        out.push(v);
    }
    Ok(out)
}

/// Whether a run's end is explained by its host staying away past the
/// lost timeout (the lifecycle's reason: "host H lost: no heartbeat for
/// N ms").
fn host_lost(run: &pb::TaskRun) -> bool {
    run.reason.starts_with("host ") && run.reason.contains(" lost: no heartbeat")
}

/// What the runs of every task say.
#[derive(Debug, Default)]
struct Tally {
    tasks: usize,
    runs: usize,
    preempted: Vec<String>,
    lost: Vec<String>,
    /// Runs that failed or were killed (a `sleep` does neither here).
    failed: Vec<String>,
    /// Instances on a run after their first.
    reruns: Vec<String>,
    /// Ends explained by a host lost past its timeout.
    excused: Vec<String>,
    /// The disturbed tasks as read (the first few).
    disturbed_tasks: Vec<String>,
}

impl Tally {
    fn of(jobs: &[JobView]) -> Tally {
        let mut t = Tally::default();
        for v in jobs {
            for task in &v.tasks {
                let before = t.disturbed();
                t.tasks += 1;
                let what = format!("{}/{}", v.name(), task.instance);
                let runs: Vec<&pb::TaskRun> =
                    task.current.iter().chain(task.history.iter()).collect();
                let mut excused = false;
                for run in &runs {
                    t.runs += 1;
                    let line = format!(
                        "{what} run {} {:?} on {}: {}",
                        run.run_id,
                        run.state(),
                        run.host,
                        run.reason
                    );
                    let ended = matches!(
                        run.state(),
                        pb::TaskState::Preempted
                            | pb::TaskState::Lost
                            | pb::TaskState::Failed
                            | pb::TaskState::Killed
                    );
                    if !ended {
                        continue;
                    }
                    if host_lost(run) {
                        excused = true;
                        t.excused.push(line);
                        continue;
                    }
                    match run.state() {
                        pb::TaskState::Preempted => t.preempted.push(line),
                        pb::TaskState::Lost => t.lost.push(line),
                        _ => t.failed.push(line),
                    }
                }
                let current = task.current.as_ref().map_or(0, |r| r.run_id);
                if current > 1 && !excused {
                    t.reruns.push(format!("{what} on run {current}"));
                }
                if t.disturbed() > before && t.disturbed_tasks.len() < 10 {
                    t.disturbed_tasks.push(format!("{what}: {task:?}"));
                }
            }
        }
        t
    }

    fn disturbed(&self) -> usize {
        self.preempted.len() + self.lost.len() + self.failed.len() + self.reruns.len()
    }

    fn describe(&self) -> String {
        format!(
            "{} tasks, {} runs: {} preempted, {} lost, {} failed or killed, {} re-run \
             ({} ended by a host lost past its timeout)",
            self.tasks,
            self.runs,
            self.preempted.len(),
            self.lost.len(),
            self.failed.len(),
            self.reruns.len(),
            self.excused.len()
        )
    }

    fn details(&self) -> String {
        let all: Vec<&String> = self
            .preempted
            .iter()
            .chain(&self.lost)
            .chain(&self.failed)
            .chain(&self.reruns)
            .collect();
        all.iter()
            .take(40)
            .chain(self.disturbed_tasks.iter().collect::<Vec<_>>().iter())
            .map(|s| format!("  {s}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Reads everything through the leader (retried while leadership moves).
async fn read_all(cluster: &mut Cluster, settled: &mut BTreeMap<String, JobView>) -> Vec<JobView> {
    let deadline = Instant::now() + RECOVERY;
    loop {
        let port = cluster.recover().await;
        match census(port, settled).await {
            Ok(jobs) => return jobs,
            Err(e) if Instant::now() < deadline => {
                cluster.note(format!("reading the tasks from {port} failed ({e}); again"));
            }
            Err(e) => cluster.fail(&format!("cannot read the tasks: {e}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_in_a_loop_under_load_preempt_lose_and_rerun_nothing() {
    let (length, seed) = settings();
    eprintln!(
        "chaos: seed {seed} (PELOTON_CHAOS_SEED), {} s of faults (PELOTON_CHAOS_SECS)",
        length.as_secs()
    );
    let started = Instant::now();
    let mut rng = Rng(seed);
    let dir = tempfile::Builder::new()
        .prefix("peloton-chaos-")
        .tempdir()
        .expect("tempdir");
    // A database server of its own: stopping it disturbs no other test.
    let (pg, db) = common::own_postgres("chaos");
    let ports = [free_port(), free_port()];
    let servers_list = format!(
        "https://127.0.0.1:{},https://127.0.0.1:{}",
        ports[0], ports[1]
    );
    let base = 32_000 + (std::process::id() % 40) as usize * 150;
    let mut cluster = Cluster {
        dir: Some(dir),
        pg,
        db,
        servers: ["a", "b"]
            .iter()
            .zip(ports)
            .map(|(name, port)| Server {
                name: (*name).to_string(),
                port,
                child: None,
            })
            .collect(),
        agents: HOSTS
            .iter()
            .enumerate()
            .map(|(i, host)| Agent {
                host,
                ports: format!("{}-{}", base + i * 50, base + i * 50 + 49),
                child: None,
                must_register: 0,
            })
            .collect(),
        servers_list,
        timeline: Vec::new(),
        started,
        deposed: 0,
    };
    cluster.start_server(0).await;
    let first = cluster.recover_leader_only().await;
    cluster.start_server(1).await;
    for i in 0..HOSTS.len() {
        cluster.start_agent(i);
    }
    let leader = cluster.recover().await;
    assert_eq!(leader, first);
    common::create_pool(
        &mut connect(leader).await.expect("connect"),
        "/t",
        common::pool_spec(2.0, 1024.0),
    )
    .await;
    let mut c = connect(leader).await.expect("connect");
    for (name, n, preemptible) in [
        ("long-preemptible", LONG_PREEMPTIBLE, true),
        ("long-fixed", LONG_FIXED, false),
    ] {
        c.jobs
            .create(pb::CreateJobRequest {
                spec: Some(job(
                    name,
                    n,
                    sleep_task("sleep 100000", LONG_CPU),
                    preemptible,
                )),
            })
            .await
            .expect("long job accepted");
    }
    let long_tasks = (LONG_PREEMPTIBLE + LONG_FIXED) as usize;
    common::eventually("every long task running", TIMEOUT, async || {
        let jobs = census(leader, &mut BTreeMap::new()).await?;
        let running = jobs
            .iter()
            .flat_map(|v| &v.tasks)
            .filter(|t| {
                t.current
                    .as_ref()
                    .is_some_and(|r| r.state() == pb::TaskState::Running)
            })
            .count();
        (running == long_tasks)
            .then_some(())
            .ok_or(format!("{running} of {long_tasks} running"))
    })
    .await;
    cluster.note(format!(
        "{long_tasks} long tasks running ({} cpu of 6); short jobs start",
        long_tasks as f64 * LONG_CPU
    ));

    let hint = Arc::new(AtomicU16::new(leader));
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(short_jobs(
        cluster.ports(),
        hint.clone(),
        stop_load.clone(),
        seed,
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The faults.
    let mut count: BTreeMap<Fault, u32> = BTreeMap::new();
    let mut recovered_in: BTreeMap<Fault, Vec<Duration>> = BTreeMap::new();
    let mut settled = BTreeMap::new();
    let faults_from = Instant::now();
    let mut leader = cluster.recover().await;
    while faults_from.elapsed() < length {
        let fault = Fault::ALL[rng.range(0, Fault::ALL.len() as u64 - 1) as usize];
        let t = Instant::now();
        let what = cluster.inject(fault, leader, &mut rng).await;
        leader = cluster.recover().await;
        hint.store(leader, Ordering::Relaxed);
        let took = t.elapsed();
        *count.entry(fault).or_default() += 1;
        recovered_in.entry(fault).or_default().push(took);
        cluster.note(format!(
            "{what}; all agents on the leader {took:.1?} after the fault began"
        ));
        let jobs = read_all(&mut cluster, &mut settled).await;
        let tally = Tally::of(&jobs);
        if tally.disturbed() > 0 {
            cluster.fail(&format!(
                "after {what}: {}\n{}",
                tally.describe(),
                tally.details()
            ));
        }
        leader = cluster.recover().await;
        tokio::time::sleep(rng.millis(1500, 4000)).await;
    }
    let faults_took = faults_from.elapsed();

    // The end: the stream stops, every short job finishes.
    stop_load.store(true, Ordering::Relaxed);
    let load = load.await.expect("the short-job stream");
    cluster.note(format!(
        "{} short jobs acknowledged ({} calls refused or failed meanwhile); waiting for them",
        load.acked.len(),
        load.refused
    ));
    let deadline = Instant::now() + RECOVERY;
    loop {
        let jobs = read_all(&mut cluster, &mut settled).await;
        let unfinished: Vec<String> = jobs
            .iter()
            .filter(|v| v.is_short() && !settled.contains_key(&v.job.id))
            .map(|v| format!("{} {}: {:?}", v.name(), v.job.id, v.state()))
            .collect();
        if unfinished.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            cluster.fail(&format!(
                "short jobs unfinished {RECOVERY:?} after the last: {unfinished:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Time for a wrong verdict to show (cycles run every 5 ms), then
    // everything read afresh.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let jobs = read_all(&mut cluster, &mut BTreeMap::new()).await;
    let tally = Tally::of(&jobs);
    if tally.disturbed() > 0 {
        cluster.fail(&format!(
            "at the end: {}\n{}",
            tally.describe(),
            tally.details()
        ));
    }
    let by_id: HashMap<&str, &JobView> = jobs.iter().map(|v| (v.job.id.as_str(), v)).collect();
    for id in &load.acked {
        match by_id.get(id.as_str()) {
            None => cluster.fail(&format!("acknowledged job {id} is gone")),
            Some(v) if v.state() != pb::JobState::Succeeded => cluster.fail(&format!(
                "acknowledged job {} {id} ended {:?}: {:?}",
                v.name(),
                v.state(),
                v.tasks
            )),
            Some(_) => {}
        }
    }
    let shorts = jobs.iter().filter(|v| v.is_short()).count();
    for v in jobs.iter().filter(|v| v.is_short()) {
        if v.state() != pb::JobState::Succeeded {
            cluster.fail(&format!(
                "short job {} {} ended {:?}",
                v.name(),
                v.job.id,
                v.state()
            ));
        }
    }
    let mut long_seen = 0;
    for v in jobs.iter().filter(|v| v.name().starts_with("long-")) {
        for t in &v.tasks {
            long_seen += 1;
            let run = t.current.as_ref().expect("a current run");
            if (run.run_id, run.state()) != (1, pb::TaskState::Running) || !t.history.is_empty() {
                cluster.fail(&format!(
                    "long task {}/{} is not on its first run, running: {run:?}, history {:?}",
                    v.name(),
                    t.instance,
                    t.history
                ));
            }
        }
    }
    assert_eq!(long_seen, long_tasks, "every long task read");

    let faults: Vec<String> = Fault::ALL
        .iter()
        .map(|f| format!("{} {}", f.name(), count.get(f).copied().unwrap_or(0)))
        .collect();
    let recovery: Vec<String> = recovered_in
        .iter()
        .map(|(f, ds)| {
            let max = ds.iter().max().copied().unwrap_or_default();
            let mean = ds.iter().sum::<Duration>() / ds.len() as u32;
            format!("{} mean {mean:.1?} max {max:.1?}", f.name())
        })
        .collect();
    eprintln!(
        "chaos summary: seed {seed}; {} faults in {faults_took:.0?} ({}); servers deposed and \
         started again: {}; short jobs: {} acknowledged, {shorts} created, all SUCCEEDED \
         ({} calls refused or failed while leadership moved); long tasks: {long_seen}, all on \
         run 1 and RUNNING; {}; fault to every agent on a leader: {}; whole test {:.0?}",
        count.values().sum::<u32>(),
        faults.join(", "),
        cluster.deposed,
        load.acked.len(),
        load.refused,
        tally.describe(),
        recovery.join(", "),
        started.elapsed()
    );
}
