//! The agent's conversation with the server: one `AgentService.Session`
//! stream at a time, re-established for ever.
//!
//! The agent runs on a single-threaded runtime. The supervisor is shared
//! behind a `std::sync::Mutex`, locked only for one synchronous call at a
//! time (never across an `.await`), on the runtime's thread itself: its
//! calls block briefly (the launcher's answers, journal appends, `/proc`
//! scans), and a trip to a blocking thread and back cost more than most of
//! them (see `with_supervisor`). Three tasks use it: a poller (every
//! `poll_interval`, wakes the session when reports are waiting), the
//! garbage collector (every `gc_interval`, without the lock: it reads only
//! the disk) and the session loop (registration, heartbeats, reports,
//! server messages, usage reports). Health checkers (threads of the
//! supervisor's own) wake the session loop when a run's health changes. Log reads run as
//! their own tasks, at most
//! `MAX_CONCURRENT_LOG_READS` at once, so a slow disk delays log chunks,
//! not launches or kills.
//!
//! Nothing is lost across a broken stream: registration carries the latest
//! phase of every run not yet acknowledged, so reports queued for a dead
//! stream are simply superseded. Reconnection backs off exponentially from
//! 100 ms to 5 s; a server that refuses the agent (UNAUTHENTICATED, e.g. a
//! wrong token, or INVALID_ARGUMENT) is logged as an error and retried
//! every 30 s — the agent keeps supervising its runs meanwhile rather than
//! exiting and leaving them unwatched. A server that says another agent
//! holds this host name (ALREADY_EXISTS: two agents given one `--host`) is
//! logged as an error naming the host, and asked again after a back-off
//! from 1 s to 30 s: the server hands the host over once the holder has
//! gone silent, and never while it is alive.
//!
//! `--server` may list several servers, one leading: a session that cannot
//! be made or that breaks moves on to the next address at once (the
//! back-off above applies once per pass over the list), and a standby's
//! refusal (`not the leader`) sends the agent at once to the leader it
//! names (see `servers.rs`). The runs are the agent's, not the server's:
//! the new leader gets them all with the registration, as after a restart.

pub mod codec;
mod identity;
mod servers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use peloton_proto::v1;
use peloton_proto::v1::agent_service_client::AgentServiceClient;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Endpoint;

pub use self::servers::parse_servers;
use self::servers::{Go, Servers};
use crate::clock;
use crate::gc::{self, GcPolicy};
use crate::run::{Resources, RunPlan};
use crate::supervisor::{StopGrace, Supervisor};
use crate::usage::UsageMeter;

/// Reports in one `AgentReports` message, at most.
pub const MAX_REPORTS_PER_MESSAGE: usize = 1024;
/// Launches handled per hold of the supervisor's lock, so that polls and
/// log reads interleave with a large batch.
const LAUNCHES_PER_LOCK: usize = 64;
const MAX_CONCURRENT_LOG_READS: usize = 8;
/// Messages queued towards the server; a full queue makes the session wait.
const OUTBOUND_CAPACITY: usize = 64;
/// Largest server message accepted (a batch of launches carries specs).
const MAX_INBOUND_MESSAGE_BYTES: usize = 16 << 20;
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const REFUSED_RETRY: Duration = Duration::from_secs(30);
/// Back-off while another agent holds this host name.
const HELD_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping agent waits for the server to close the session.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Used when the server asks for heartbeats every 0 ms.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// How an agent reaches a secure server.
#[derive(Clone)]
pub struct AgentTls {
    /// The CA that signed the server's certificate (PEM).
    pub ca_pem: String,
    /// This agent's certificate and key (PEM), naming its host.
    pub identity: Option<(String, String)>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// What the session needs.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The servers' addresses, in the order they are tried (at least one).
    pub servers: Vec<String>,
    pub token: String,
    /// TLS for https:// servers.
    pub tls: Option<AgentTls>,
    pub host: String,
    pub resources: Resources,
    pub attributes: HashMap<String, String>,
    pub poll_interval: Duration,
    pub gc_interval: Duration,
    /// How often usage reports go out (sooner when memory moves; see
    /// `usage::UsageMeter`).
    pub usage_interval: Duration,
    pub gc: GcPolicy,
    pub on_exit: OnExit,
    /// The address tasks here are reachable at, as registered (none: the
    /// local address the machine reaches the server from).
    pub advertise_address: Option<std::net::IpAddr>,
}

type Shared = Arc<Mutex<Supervisor>>;

/// Runs `f` on the supervisor, on the calling thread.
///
/// The supervisor's calls block (the launcher's answer, journal appends,
/// `/proc` scans), yet they run on the runtime's one thread rather than on
/// a blocking thread: each trip to another thread was two context switches,
/// which on a VM cost more than the agent's whole share of a short task,
/// and the session loop waited for the answer either way. What waits
/// meanwhile is this agent's own network traffic and timers, for as long
/// as one call takes (a launch chunk: `LAUNCHES_PER_LOCK` tasks started
/// by the launcher in one batch, milliseconds). The price is paid in a
/// pathological stall: a launcher that does not answer holds the thread up
/// to its 10 s answer timeout (then one `/proc` scan for the batch's
/// runs), and the HTTP/2 keep-alive (5 s) may then end the session; the
/// agent reconnects and registers again, with every run (nothing is lost,
/// and the session loop was as stuck before). Garbage collection, volume
/// deletion and log reads, whose time grows with the data, keep to
/// blocking threads and never take the lock.
fn with_supervisor<T>(supervisor: &Shared, f: impl FnOnce(&mut Supervisor) -> T) -> T {
    let mut guard = supervisor.lock().unwrap_or_else(PoisonError::into_inner);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut guard))) {
        Ok(value) => value,
        // A broken invariant in the supervisor: crash, do not limp on (a
        // panic in a spawned task would only end that task). The panic
        // hook has printed the message.
        Err(_) => std::process::abort(),
    }
}

/// What the agent does with its runs when it is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExit {
    /// Leave them running: an agent started again on the same work
    /// directory takes them over.
    #[default]
    KeepTasks,
    /// Stop them first (SIGTERM, SIGKILL after each run's kill grace
    /// period) and wait until they have ended; a second stop request kills
    /// them at once. Their ends are reported by the next agent on the work
    /// directory.
    StopTasks,
}

/// Serves the server until the first message on `stop`; then closes the
/// session in an orderly way and, per `on_exit`, leaves the runs running
/// (see the crate documentation) or stops them.
pub async fn run(config: SessionConfig, mut supervisor: Supervisor, mut stop: mpsc::Receiver<()>) {
    let sandboxes = supervisor.sandboxes_dir().to_path_buf();
    // The work directory holds the sandboxes; the supervisor holds its lock,
    // so no other agent draws an id for it at the same time.
    let work_dir = sandboxes.parent().unwrap_or(&sandboxes).to_path_buf();
    let agent_id = match identity::load_or_create(&work_dir) {
        Ok(id) => id,
        Err(e) => {
            // Without a kept id the agent still works; after a restart it
            // waits for its old session to close, as another agent would.
            tracing::warn!(work_dir = %work_dir.display(), error = %e, "cannot keep the agent id");
            identity::drawn().unwrap_or_default()
        }
    };
    let volumes = supervisor.volumes_dir().to_path_buf();
    let changed = Arc::new(Notify::new());
    // A health checker's verdict goes out at once, not at the next poll.
    let wake = changed.clone();
    supervisor.set_report_waker(move || wake.notify_one());
    let supervisor: Shared = Arc::new(Mutex::new(supervisor));
    let poller = tokio::spawn(poll_loop(
        supervisor.clone(),
        changed.clone(),
        config.poll_interval,
    ));
    let collector = tokio::spawn(gc_loop(sandboxes, volumes, config.gc, config.gc_interval));
    let (closing_tx, closing) = watch::channel(false);
    let mut sessions = std::pin::pin!(connect_loop(
        &config,
        &agent_id,
        &supervisor,
        &changed,
        closing
    ));
    tokio::select! {
        _ = stop.recv() => {}
        () = &mut sessions => {}
    }
    match config.on_exit {
        OnExit::KeepTasks => {
            tracing::info!("stopping; runs keep running and are re-adopted on restart");
        }
        OnExit::StopTasks => tracing::info!("stopping, with the runs"),
    }
    // An orderly goodbye: the stream ends, the server closes its side, and
    // neither logs a broken connection. A server that does not answer is
    // not waited for long.
    let _ = closing_tx.send(true);
    if tokio::time::timeout(CLOSE_TIMEOUT, &mut sessions)
        .await
        .is_err()
    {
        tracing::debug!("the session did not close in time");
    }
    if config.on_exit == OnExit::StopTasks {
        stop_runs(&supervisor, &mut stop, config.poll_interval).await;
    }
    poller.abort();
    collector.abort();
}

/// Kills every run (each with its own grace period; at once after a
/// second stop request) and waits until all have ended.
async fn stop_runs(supervisor: &Shared, stop: &mut mpsc::Receiver<()>, every: Duration) {
    let live = with_supervisor(supervisor, |s| s.live_runs());
    if live > 0 {
        tracing::info!(
            runs = live,
            "stopping the runs (SIGTERM, SIGKILL after each one's kill grace period; stop again to kill them now)"
        );
    }
    with_supervisor(supervisor, |s| s.kill_all(StopGrace::Own, clock::now_ms()));
    let mut killed_now = false;
    loop {
        let live = with_supervisor(supervisor, |s| {
            s.poll(clock::now_ms());
            s.live_runs()
        });
        if live == 0 {
            tracing::info!("every run has ended");
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            Some(()) = stop.recv(), if !killed_now => {
                killed_now = true;
                tracing::info!(runs = live, "killing the runs now");
                with_supervisor(supervisor, |s| s.kill_all(StopGrace::Now, clock::now_ms()));
            }
        }
    }
}

async fn poll_loop(supervisor: Shared, changed: Arc<Notify>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The launcher sends the agent SIGCHLD once it has recorded a task's
    // end: polling on it reports ends at once instead of up to a tick
    // later (short tasks are bound by this latency). Runs adopted after a
    // restart are another launcher's; the tick covers them.
    let mut child_exited =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
    loop {
        match child_exited.as_mut() {
            Some(sig) => {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = sig.recv() => {}
                }
            }
            None => {
                tick.tick().await;
            }
        }
        let waiting = with_supervisor(&supervisor, |s| {
            s.poll(clock::now_ms());
            s.pending_reports()
        });
        if waiting > 0 {
            changed.notify_one();
        }
    }
}

async fn gc_loop(
    sandboxes: std::path::PathBuf,
    volumes: std::path::PathBuf,
    policy: GcPolicy,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The first tick is immediate: a collection at start.
        tick.tick().await;
        let dir = sandboxes.clone();
        let trash = volumes.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            // Volumes are never collected, only what a deletion left.
            crate::volumes::remove_trash(&trash);
            gc::collect(&dir, &policy, clock::now_ms())
        })
        .await;
        match outcome {
            Ok(outcome) if !outcome.removed.is_empty() => tracing::info!(
                removed = outcome.removed.len(),
                bytes_freed = outcome.bytes_freed,
                bytes_in_use = outcome.bytes_in_use,
                "sandboxes collected"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "garbage collection panicked"),
        }
    }
}

/// How one session ended.
enum SessionEnd {
    /// The agent is stopping and said goodbye.
    Closed,
    /// It registered, then broke: reconnect quickly.
    Broke(String),
    /// It never registered.
    Failed(String),
    /// The server refused the agent.
    Refused(String),
    /// Another agent holds this host name.
    HostHeld(String),
    /// A standby refused it (`not the leader`), naming the leader or not;
    /// at registration, or later (a leader that lost its lease).
    NotLeader {
        why: String,
        leader: Option<String>,
        registered: bool,
    },
}

/// Sessions, one after the other, until `closing` turns true.
async fn connect_loop(
    config: &SessionConfig,
    agent_id: &str,
    supervisor: &Shared,
    changed: &Arc<Notify>,
    mut closing: watch::Receiver<bool>,
) {
    let mut retry = Retry::new();
    let mut servers = Servers::new(config.servers.clone());
    loop {
        let server = servers.current().to_owned();
        let end = session(config, &server, agent_id, supervisor, changed, &mut closing).await;
        if !matches!(end, SessionEnd::HostHeld(_)) {
            retry.host_released();
        }
        let wait = match end {
            SessionEnd::Closed => return,
            SessionEnd::Broke(why) => retry.after_broke(&server, &why, &mut servers),
            SessionEnd::NotLeader {
                why,
                leader,
                registered,
            } => retry.after_not_leader(&server, &why, leader.as_deref(), registered, &mut servers),
            SessionEnd::HostHeld(why) => {
                stop_runs_of_lost_host(config, &server, supervisor, changed);
                retry.after_host_held(config, &server, &why)
            }
            SessionEnd::Failed(why) => retry.after_failed(&server, &why, &mut servers),
            SessionEnd::Refused(why) => {
                tracing::error!(
                    %server,
                    %why,
                    retry_in_s = REFUSED_RETRY.as_secs(),
                    "the server refused this agent (check --token, --host, and --cert-file: a secure server accepts only the host its certificate names)"
                );
                REFUSED_RETRY
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = closing.wait_for(|closing| *closing) => return,
        }
    }
}

/// How long [`connect_loop`] waits before its next session, and the counts
/// that decide it (each log line of a long outage or a held host name
/// goes at warn or error only on the 1st, 2nd, 4th, 8th... time).
#[derive(Debug)]
struct Retry {
    /// The next wait after a failure, doubled each time up to `BACKOFF_MAX`.
    backoff: Duration,
    /// Sessions that failed since the last one that registered.
    failures: u64,
    /// The next wait while another agent holds the host name.
    held_backoff: Duration,
    /// Refusals in a row because another agent holds the host name.
    held: u64,
}

impl Retry {
    fn new() -> Retry {
        Retry {
            backoff: BACKOFF_INITIAL,
            failures: 0,
            held_backoff: HELD_BACKOFF_INITIAL,
            held: 0,
        }
    }

    /// The back-off's wait of now; the next is twice as long.
    fn back_off(&mut self) -> Duration {
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        wait
    }

    /// A session ended otherwise than on a held host name.
    fn host_released(&mut self) {
        self.held_backoff = HELD_BACKOFF_INITIAL;
        self.held = 0;
    }

    /// A registered session broke: the next server may be the new leader.
    fn after_broke(&mut self, server: &str, why: &str, servers: &mut Servers) -> Duration {
        servers.registered();
        let _ = servers.advance();
        tracing::warn!(%server, %why, next = %servers.current(), "session ended; reconnecting");
        self.backoff = BACKOFF_INITIAL;
        self.failures = 0;
        self.backoff
    }

    /// A standby refused the agent, naming the leader or not.
    fn after_not_leader(
        &mut self,
        server: &str,
        why: &str,
        leader: Option<&str>,
        registered: bool,
        servers: &mut Servers,
    ) -> Duration {
        if registered {
            servers.registered();
        }
        match servers.refused_by_standby(leader) {
            Go::AtOnce => {
                if leader.is_some() {
                    tracing::info!(%server, %why, next = %servers.current(), "not the leader; going to the leader it names");
                } else {
                    tracing::debug!(%server, %why, next = %servers.current(), "not the leader; trying the next server");
                }
                Duration::ZERO
            }
            Go::AfterBackoff => {
                self.failures += 1;
                if self.failures.is_power_of_two() {
                    tracing::warn!(%server, %why, failures = self.failures, next = %servers.current(), "no leader found yet; retrying");
                } else {
                    tracing::debug!(%server, %why, failures = self.failures, "no leader found yet");
                }
                self.back_off()
            }
        }
    }

    /// Another agent holds this host name: a configuration to fix, retried
    /// ever more slowly (up to `REFUSED_RETRY`).
    fn after_host_held(&mut self, config: &SessionConfig, server: &str, why: &str) -> Duration {
        self.held += 1;
        let wait = self.held_backoff;
        self.held_backoff = (self.held_backoff * 2).min(REFUSED_RETRY);
        if self.held.is_power_of_two() {
            tracing::error!(
                %server,
                host = %config.host,
                %why,
                refusals = self.held,
                retry_in_ms = wait.as_millis() as u64,
                "another agent holds this host name; give each agent its own --host"
            );
        } else {
            tracing::debug!(host = %config.host, %why, refusals = self.held, "host still held by another agent");
        }
        wait
    }

    /// The server could not be reached: the other addresses of the list
    /// first, then after the back-off.
    fn after_failed(&mut self, server: &str, why: &str, servers: &mut Servers) -> Duration {
        self.failures += 1;
        let go = servers.advance();
        if self.failures.is_power_of_two() {
            tracing::warn!(%server, %why, failures = self.failures, next = %servers.current(), "cannot reach the server; retrying");
        } else {
            tracing::debug!(%server, %why, failures = self.failures, "cannot reach the server");
        }
        match go {
            Go::AtOnce => Duration::ZERO,
            Go::AfterBackoff => self.back_off(),
        }
    }
}

/// The host name is bound to another agent, which the server allows only
/// once this one's host was declared lost: its runs were lost with it and
/// run elsewhere now (or on that agent). Left alone they would run twice,
/// and for good: no server will ever ask this agent to stop them.
fn stop_runs_of_lost_host(
    config: &SessionConfig,
    server: &str,
    supervisor: &Shared,
    changed: &Notify,
) {
    let live = {
        let mut s = supervisor.lock().unwrap_or_else(PoisonError::into_inner);
        let live = s.live_runs();
        if live > 0 {
            s.kill_all(StopGrace::Own, clock::now_ms());
        }
        live
    };
    if live > 0 {
        tracing::error!(
            %server,
            host = %config.host,
            runs = live,
            "the host name belongs to another agent now: stopping this agent's runs, \
             which the server declared lost and started again"
        );
        changed.notify_one();
    }
}

fn classify(status: &tonic::Status) -> SessionEnd {
    let why = format!("{:?}: {}", status.code(), status.message());
    if let Some(leader) = servers::not_leader(status) {
        return SessionEnd::NotLeader {
            why,
            leader,
            registered: false,
        };
    }
    match status.code() {
        Code::Unauthenticated | Code::InvalidArgument | Code::PermissionDenied => {
            SessionEnd::Refused(why)
        }
        Code::AlreadyExists => SessionEnd::HostHeld(why),
        _ => SessionEnd::Failed(why),
    }
}

/// The two halves of a registered session, and its heartbeat interval.
type Registered = (
    mpsc::Sender<v1::AgentMessage>,
    tonic::Streaming<v1::ServerMessage>,
    Duration,
);

/// Connects to `server` and registers.
async fn register(
    config: &SessionConfig,
    server: &str,
    agent_id: &str,
    supervisor: &Shared,
) -> Result<Registered, SessionEnd> {
    let endpoint = match Endpoint::from_shared(server.to_owned()) {
        Ok(endpoint) => endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            // A server that vanished without closing the connection (its
            // machine died or froze, a partition) is noticed within about
            // 10 s, well before a new leader declares this host lost
            // (reconnect slack plus host_lost_after, 20 s by default), so
            // the agent reaches it first and its runs are adopted, never
            // started a second time elsewhere.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5)),
        Err(e) => return Err(SessionEnd::Failed(e.to_string())),
    };
    let endpoint = match (&config.tls, server.starts_with("https://")) {
        (Some(tls), true) => {
            let mut c = tonic::transport::ClientTlsConfig::new().ca_certificate(
                tonic::transport::Certificate::from_pem(tls.ca_pem.as_bytes()),
            );
            if let Some((cert, key)) = &tls.identity {
                c = c.identity(tonic::transport::Identity::from_pem(cert, key));
            }
            match endpoint.tls_config(c) {
                Ok(e) => e,
                Err(e) => return Err(SessionEnd::Failed(format!("tls: {}", with_causes(&e)))),
            }
        }
        _ => endpoint,
    };
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(e) => return Err(SessionEnd::Failed(format!("connect: {}", with_causes(&e)))),
    };
    let mut client =
        AgentServiceClient::new(channel).max_decoding_message_size(MAX_INBOUND_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<v1::AgentMessage>(OUTBOUND_CAPACITY);
    let mut register = registration(config, agent_id, supervisor);
    register.address = match config.advertise_address {
        Some(address) => address.to_string(),
        None => crate::detect::address_toward(server)
            .map(|a| a.to_string())
            .unwrap_or_default(),
    };
    let runs = register.runs.len();
    if tx
        .send(message(v1::agent_message::Kind::Register(register)))
        .await
        .is_err()
    {
        return Err(SessionEnd::Failed("outbound queue closed".to_owned()));
    }
    let response =
        match tokio::time::timeout(REGISTER_TIMEOUT, client.session(ReceiverStream::new(rx))).await
        {
            Ok(Ok(response)) => response,
            Ok(Err(status)) => return Err(classify(&status)),
            Err(_) => {
                return Err(SessionEnd::Failed(
                    "no answer to the registration".to_owned(),
                ));
            }
        };
    let mut inbound = response.into_inner();
    let heartbeat_every = match tokio::time::timeout(REGISTER_TIMEOUT, inbound.message()).await {
        Ok(Ok(Some(v1::ServerMessage {
            kind: Some(v1::server_message::Kind::Registered(registered)),
        }))) => heartbeat_interval(registered.heartbeat_interval_ms),
        Ok(Ok(Some(_))) => {
            return Err(SessionEnd::Failed(
                "the server's first message is not Registered".to_owned(),
            ));
        }
        Ok(Ok(None)) => {
            return Err(SessionEnd::Failed(
                "the server closed the session".to_owned(),
            ));
        }
        Ok(Err(status)) => return Err(classify(&status)),
        Err(_) => {
            return Err(SessionEnd::Failed(
                "no Registered from the server".to_owned(),
            ));
        }
    };
    tracing::info!(
        %server,
        host = %config.host,
        runs,
        heartbeat_ms = heartbeat_every.as_millis(),
        "registered"
    );
    Ok((tx, inbound, heartbeat_every))
}

async fn session(
    config: &SessionConfig,
    server: &str,
    agent_id: &str,
    supervisor: &Shared,
    changed: &Arc<Notify>,
    closing: &mut watch::Receiver<bool>,
) -> SessionEnd {
    let registered = tokio::select! {
        registered = register(config, server, agent_id, supervisor) => registered,
        // Not registered yet: nothing to say goodbye to.
        _ = closing.wait_for(|closing| *closing) => return SessionEnd::Closed,
    };
    let (tx, mut inbound, heartbeat_every) = match registered {
        Ok(registered) => registered,
        Err(end) => return end,
    };
    let log_reads = Arc::new(Semaphore::new(MAX_CONCURRENT_LOG_READS));
    let mut heartbeat = tokio::time::interval(heartbeat_every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A new session's first measurement is reported at once.
    let mut meter =
        UsageMeter::new(u64::try_from(config.usage_interval.as_millis()).unwrap_or(u64::MAX));
    let mut measure = tokio::time::interval(Duration::from_millis(meter.measure_every_ms()));
    measure.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Registration superseded what was queued; anything since goes now.
    changed.notify_one();
    loop {
        let result = tokio::select! {
            received = inbound.message() => match received {
                Ok(Some(msg)) => handle(msg, supervisor, &tx, &log_reads, &mut heartbeat).await,
                Ok(None) => return SessionEnd::Broke("the server closed the session".to_owned()),
                Err(status) => return match classify(&status) {
                    SessionEnd::Failed(why) => SessionEnd::Broke(why),
                    SessionEnd::NotLeader { why, leader, .. } => SessionEnd::NotLeader {
                        why,
                        leader,
                        registered: true,
                    },
                    other => other,
                },
            },
            _ = heartbeat.tick() => send(&tx, v1::agent_message::Kind::Heartbeat(v1::AgentHeartbeat {})).await.map(|()| true),
            () = changed.notified() => Ok(true),
            _ = measure.tick() => send_usage(supervisor, &tx, &mut meter).await.map(|()| false),
            _ = closing.wait_for(|closing| *closing) => {
                // Ends the stream (log reads in flight hold clones until
                // they finish); the server then ends its side.
                drop(tx);
                while let Ok(Some(_)) = inbound.message().await {}
                return SessionEnd::Closed;
            }
        };
        // A turn may have left reports (polls, health changes, or more than
        // one message's worth).
        let flushed = match result {
            Ok(true) => flush_reports(supervisor, &tx).await,
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = flushed {
            return SessionEnd::Broke(e);
        }
    }
}

/// Measures the runs and sends a usage report if one is due.
async fn send_usage(
    supervisor: &Shared,
    tx: &mpsc::Sender<v1::AgentMessage>,
    meter: &mut UsageMeter,
) -> Result<(), String> {
    let now = clock::now_ms();
    let report = with_supervisor(supervisor, |s| s.usage(now));
    if !meter.due(&report, now) {
        return Ok(());
    }
    send(tx, v1::agent_message::Kind::Usage(codec::usage(&report))).await
}

/// `e: cause: cause...` (tonic's transport errors say little on their own).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn heartbeat_interval(ms: u64) -> Duration {
    if ms == 0 {
        DEFAULT_HEARTBEAT
    } else {
        Duration::from_millis(ms.clamp(100, 60_000))
    }
}

fn message(kind: v1::agent_message::Kind) -> v1::AgentMessage {
    v1::AgentMessage { kind: Some(kind) }
}

async fn send(
    tx: &mpsc::Sender<v1::AgentMessage>,
    kind: v1::agent_message::Kind,
) -> Result<(), String> {
    tx.send(message(kind))
        .await
        .map_err(|_| "the stream to the server closed".to_owned())
}

fn registration(config: &SessionConfig, agent_id: &str, supervisor: &Shared) -> v1::AgentRegister {
    let (isolation, runs, ports, port_ranges, volumes) = with_supervisor(supervisor, |s| {
        s.poll(clock::now_ms());
        (
            s.isolation().name(),
            s.registration_runs()
                .into_iter()
                .map(codec::report)
                .collect(),
            s.port_count(),
            s.port_ranges(),
            s.volumes(),
        )
    });
    v1::AgentRegister {
        token: config.token.clone(),
        host: config.host.clone(),
        agent_id: agent_id.to_owned(),
        resources: Some(codec::resources_to_proto(config.resources)),
        attributes: config.attributes.clone(),
        isolation: isolation.to_owned(),
        runs,
        ports,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        volumes,
        // Set by the caller, which knows the server it registers with.
        address: String::new(),
        port_ranges: port_ranges
            .into_iter()
            .map(|r| v1::PortRange {
                first: u32::from(r.first),
                last: u32::from(r.last),
            })
            .collect(),
    }
}

async fn flush_reports(
    supervisor: &Shared,
    tx: &mpsc::Sender<v1::AgentMessage>,
) -> Result<(), String> {
    while with_supervisor_then_send(supervisor, tx, |_| ()).await? {}
    Ok(())
}

/// Runs `f` on the supervisor, takes the reports queued by then, and sends
/// them in one message.
/// True if there may be more to send (a full message's worth was taken).
async fn with_supervisor_then_send(
    supervisor: &Shared,
    tx: &mpsc::Sender<v1::AgentMessage>,
    f: impl FnOnce(&mut Supervisor),
) -> Result<bool, String> {
    let reports = with_supervisor(supervisor, move |s| {
        f(s);
        s.take_reports(MAX_REPORTS_PER_MESSAGE)
    });
    let reports: Vec<v1::RunReport> = reports.into_iter().map(codec::report).collect();
    if reports.is_empty() {
        return Ok(false);
    }
    let full = reports.len() >= MAX_REPORTS_PER_MESSAGE;
    // Taken reports are gone from the outbox; if this send fails the next
    // registration carries the runs' phases instead.
    send(
        tx,
        v1::agent_message::Kind::Reports(v1::AgentReports { reports }),
    )
    .await?;
    Ok(full)
}

/// Handles one message from the server. True if reports may be waiting
/// (the caller sends them); the calls that change runs send what they
/// queued themselves, in the same call to the supervisor.
async fn handle(
    msg: v1::ServerMessage,
    supervisor: &Shared,
    tx: &mpsc::Sender<v1::AgentMessage>,
    log_reads: &Arc<Semaphore>,
    heartbeat: &mut tokio::time::Interval,
) -> Result<bool, String> {
    use v1::server_message::Kind;
    match msg.kind {
        Some(Kind::Launch(launch)) => {
            tracing::debug!(runs = launch.runs.len(), "launch");
            let mut runs = launch
                .runs
                .into_iter()
                .filter_map(codec::run_plan)
                .peekable();
            let mut more = false;
            loop {
                let chunk: Vec<RunPlan> = runs.by_ref().take(LAUNCHES_PER_LOCK).collect();
                if chunk.is_empty() {
                    return Ok(more);
                }
                more = with_supervisor_then_send(supervisor, tx, move |s| {
                    s.launch(&chunk, clock::now_ms());
                })
                .await?;
                if runs.peek().is_some() {
                    // Polls and log reads get their turn between chunks.
                    tokio::task::yield_now().await;
                }
            }
        }
        Some(Kind::Kill(kill)) => {
            tracing::debug!(runs = kill.runs.len(), "kill");
            let kills: Vec<_> = kill.runs.iter().filter_map(codec::kill_request).collect();
            return with_supervisor_then_send(supervisor, tx, move |s| {
                s.kill(&kills, clock::now_ms());
            })
            .await;
        }
        Some(Kind::Rendezvous(update)) => {
            let updates = codec::rendezvous_updates(update);
            with_supervisor(supervisor, move |s| s.update_rendezvous(&updates));
        }
        Some(Kind::Ack(ack)) => {
            let keys: Vec<_> = ack.keys.iter().map(codec::run_id).collect();
            return with_supervisor_then_send(supervisor, tx, move |s| s.ack(&keys)).await;
        }
        Some(Kind::DeleteVolumes(delete)) => {
            tracing::debug!(volumes = delete.ids.len(), "delete volumes");
            let deletion = with_supervisor(supervisor, move |s| {
                s.delete_volumes(&delete.ids, clock::now_ms())
            });
            // The data goes without the supervisor's lock and without
            // holding up the session: a large volume takes a while.
            if !deletion.is_empty() {
                tokio::task::spawn_blocking(move || deletion.finish());
            }
        }
        Some(Kind::ReadLog(read)) => {
            // Waits here when too many reads are in flight: backpressure on
            // the server's log requests, bounded memory for chunks.
            let permit = log_reads
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| "log reads closed".to_owned())?;
            let supervisor = supervisor.clone();
            let tx = tx.clone();
            let read = codec::log_request(&read);
            tokio::spawn(async move {
                let source = with_supervisor(&supervisor, |s| s.log_source(&read.key, read.stderr));
                let chunk = tokio::task::spawn_blocking(move || source.read(&read)).await;
                drop(permit);
                if let Ok(chunk) = chunk {
                    // A closed stream drops the answer; the server's
                    // request failed with the session anyway.
                    let chunk = codec::log_chunk(chunk);
                    let _ = tx.send(message(v1::agent_message::Kind::Log(chunk))).await;
                }
            });
        }
        Some(Kind::Registered(registered)) => {
            *heartbeat =
                tokio::time::interval(heartbeat_interval(registered.heartbeat_interval_ms));
        }
        None => {}
    }
    Ok(true)
}
