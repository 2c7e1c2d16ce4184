//! The host manager for real hosts: sessions of `peloton-agent`s.
//!
//! Each agent holds one bidirectional gRPC stream (`AgentService.Session`).
//! The stream's handler here checks the agent's token, then turns what the
//! agent says into loop commands (registration, run reports, departure) and
//! touches the host's last-seen time on every message; heartbeats never
//! reach the loop. The loop owns [`AgentBackend`], the table of sessions it
//! sends launches and kills to: a session only receives launches once the
//! loop has processed its registration, so reconciling the agent's list of
//! runs against the loop's view never races with a launch in flight.
//!
//! Log reads go from a `TaskService.Logs` handler straight to the agent's
//! outbox (the loop only names the run and the outbox); the agent's answer
//! comes back through [`AgentHub`], keyed by request id.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use peloton_proto::v1 as pb;
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::backend::{HostBackend, Kill, Launch, RunRef, TaskUpdate};
use crate::clock::wall_ms as now_ms;
use crate::command::Command;

/// Messages to one agent.
pub type Outbox = mpsc::Sender<Result<pb::ServerMessage, Status>>;

/// Messages queued to one agent before its session is considered broken
/// (it reconnects and reconciles).
pub const OUTBOX_LEN: usize = 1024;
/// Most runs in one launch or kill message.
pub const MAX_RUNS_PER_MESSAGE: usize = 1000;
/// Most runs an agent may list when it registers.
pub const MAX_RUNS_PER_REGISTRATION: usize = 100_000;
/// Most reports in one message.
pub const MAX_REPORTS_PER_MESSAGE: usize = 10_000;
/// Most volume ids an agent may list when it registers.
pub const MAX_VOLUMES_PER_REGISTRATION: usize = 100_000;
/// Most ports a host may hand out: every TCP port there is.
pub const MAX_HOST_PORTS: u32 = 65_535;
/// Most cores a host may offer.
pub const MAX_HOST_CPUS: f64 = 65_536.0;
/// Most memory a host may offer: 128 TiB.
pub const MAX_HOST_MEMORY_MB: f64 = (1u64 << 27) as f64;
/// Most disk a host may offer: 1 PiB.
pub const MAX_HOST_DISK_MB: f64 = (1u64 << 30) as f64;
/// Longest isolation name, agent version or agent id.
pub const MAX_AGENT_WORD_BYTES: usize = 256;
/// Longest agent token compared (a longer one is refused unread).
pub const MAX_TOKEN_BYTES: usize = 4096;
/// Most ports one run report may name.
pub const MAX_PORTS_PER_REPORT: usize = 64;
/// A host whose session is connected may be taken over by an agent of
/// another identity once it has been silent for this many heartbeat
/// intervals (its connection is then presumed dead).
pub const TAKEOVER_AFTER_HEARTBEATS: u64 = 3;

/// State shared by the session handlers, the log readers and the loop.
#[derive(Debug)]
pub struct AgentHub {
    token: String,
    heartbeat_interval_ms: u64,
    last_seen: Mutex<FxHashMap<Arc<str>, u64>>,
    /// Log requests waiting for their chunk, with the session (its outbox)
    /// they were sent to: a chunk from any other session is dropped.
    logs: Mutex<FxHashMap<u64, (oneshot::Sender<pb::LogChunk>, Outbox)>>,
    next_id: AtomicU64,
}

impl AgentHub {
    /// A hub accepting agents that present `token`.
    pub fn new(token: String, heartbeat_interval_ms: u64) -> Self {
        AgentHub {
            token,
            heartbeat_interval_ms,
            last_seen: Mutex::new(FxHashMap::default()),
            logs: Mutex::new(FxHashMap::default()),
            next_id: AtomicU64::new(1),
        }
    }

    /// A fresh id for a session or a log request.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The host was heard from now.
    pub fn touch(&self, host: &Arc<str>) {
        let now = now_ms();
        let mut seen = self.last_seen.lock().expect("not poisoned");
        match seen.get_mut(host) {
            Some(t) => *t = (*t).max(now),
            None => {
                seen.insert(host.clone(), now);
            }
        }
    }

    /// How long a connected host must be silent before an agent of another
    /// identity may take it over.
    pub fn takeover_after_ms(&self) -> u64 {
        self.heartbeat_interval_ms * TAKEOVER_AFTER_HEARTBEATS
    }

    /// Whether `token` is the agents' token, in time that depends on the
    /// server's token's length only (see [`tokens_equal`]).
    pub fn token_matches(&self, token: &str) -> bool {
        tokens_equal(self.token.as_bytes(), token.as_bytes())
    }

    /// When the host was last heard from (since this process started).
    pub fn last_seen(&self, host: &str) -> Option<u64> {
        self.last_seen
            .lock()
            .expect("not poisoned")
            .get(host)
            .copied()
    }

    /// Registers a log request; the agent's answer arrives on the receiver.
    pub fn expect_log(&self, request_id: u64, from: &Outbox) -> oneshot::Receiver<pb::LogChunk> {
        let (tx, rx) = oneshot::channel();
        self.logs
            .lock()
            .expect("not poisoned")
            .insert(request_id, (tx, from.clone()));
        rx
    }

    /// Drops a log request that timed out.
    pub fn forget_log(&self, request_id: u64) {
        self.logs.lock().expect("not poisoned").remove(&request_id);
    }

    /// A chunk from the session whose outbox is `from`: delivered only if
    /// its request was sent to that session (an agent cannot answer
    /// another host's log request).
    fn deliver_log(&self, chunk: pb::LogChunk, from: &Outbox) {
        let mut logs = self.logs.lock().expect("not poisoned");
        let ours = logs
            .get(&chunk.request_id)
            .is_some_and(|(_, asked)| asked.same_channel(from));
        if !ours {
            return;
        }
        if let Some((w, _)) = logs.remove(&chunk.request_id) {
            let _ = w.send(chunk);
        }
    }
}

/// Whether `given` equals `expected`, without an early exit: every byte
/// of `expected` is compared whatever differs first, so the time taken
/// tells nothing of how much of a guess was right. The length of
/// `expected` (the server's token) is the only thing it depends on.
pub fn tokens_equal(expected: &[u8], given: &[u8]) -> bool {
    // Folded into the accumulator rather than returned early.
    let mut differ = u8::from(expected.len() != given.len());
    for (i, e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!*e);
        differ |= std::hint::black_box(e ^ g);
    }
    std::hint::black_box(differ) == 0
}

/// One connected agent, as the loop sees it.
#[derive(Debug, Clone)]
pub struct Session {
    /// Unique per connection.
    pub id: u64,
    /// The agent's identity (`AgentRegister.agent_id`; empty from agents
    /// that do not send one).
    pub agent_id: Arc<str>,
    /// Its outbound messages.
    pub tx: Outbox,
}

/// An agent's registration, as the loop receives it.
#[derive(Debug)]
pub struct Registration {
    /// The session it came on.
    pub session: Session,
    /// What the agent said.
    pub register: pb::AgentRegister,
}

/// The wire name of a run.
pub fn run_key(job_id: &str, run: RunRef) -> pb::RunKey {
    pb::RunKey {
        job_id: job_id.to_string(),
        instance: run.instance,
        run_id: run.run,
        launch_id: run.launch.0,
    }
}

/// Launches and kills to connected agents. Messages to an agent that is
/// not connected are dropped: when it registers again, the loop reconciles
/// (runs it does not report are lost and start again; kills are sent again).
#[derive(Debug)]
pub struct AgentBackend {
    sessions: FxHashMap<Arc<str>, Session>,
}

impl Default for AgentBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentBackend {
    /// No agents yet.
    pub fn new() -> Self {
        AgentBackend {
            sessions: FxHashMap::default(),
        }
    }

    /// Makes `session` the host's session (replacing an older one, whose
    /// stream then ends). The loop has checked that the new session may
    /// take the host (`Scheduler::agent_registered`).
    pub fn attach(&mut self, host: Arc<str>, session: Session) {
        if let Some(old) = self.sessions.insert(host.clone(), session) {
            // Ends the old stream even if a log reader still holds its
            // outbox (an error item ends a gRPC response stream).
            let _ = old.tx.try_send(Err(Status::aborted(format!(
                "host {host}: this session was replaced by a newer registration of the host"
            ))));
        }
    }

    /// Whether `id` is the host's current session (reports of a session
    /// that was replaced are not the host's).
    pub fn is_current(&self, host: &str, id: u64) -> bool {
        self.sessions.get(host).is_some_and(|s| s.id == id)
    }

    /// Forgets the host's session if it is still `id`.
    pub fn detach(&mut self, host: &str, id: u64) -> bool {
        if self.sessions.get(host).is_some_and(|s| s.id == id) {
            if let Some(s) = self.sessions.remove(host) {
                let _ =
                    s.tx.try_send(Err(Status::unavailable("session closed by the server")));
            }
            return true;
        }
        false
    }

    /// The host's session, if connected.
    pub fn session(&self, host: &str) -> Option<&Session> {
        self.sessions.get(host)
    }

    /// Sends to the host's agent. A full outbox means the agent stopped
    /// reading: the session is dropped (its stream ends, the agent
    /// reconnects and reconciles) rather than letting memory grow.
    pub fn send(&mut self, host: &str, msg: pb::server_message::Kind) -> bool {
        let Some(s) = self.sessions.get(host) else {
            return false;
        };
        match s.tx.try_send(Ok(pb::ServerMessage { kind: Some(msg) })) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(%host, "agent is not reading its messages; dropping its session");
                self.sessions.remove(host);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.sessions.remove(host);
                false
            }
        }
    }
}

/// Bytes of launches in one message: far below the message limit, since
/// launches carry their jobs' secrets (up to 256 KiB each).
const MAX_LAUNCH_BYTES: usize = 4 << 20;

/// Launches cut into messages of at most [`MAX_RUNS_PER_MESSAGE`] runs and
/// about [`MAX_LAUNCH_BYTES`] (at least one run each).
fn launch_chunks(runs: &[pb::LaunchRun]) -> Vec<&[pb::LaunchRun]> {
    use prost::Message;
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, r) in runs.iter().enumerate() {
        let len = r.encoded_len();
        if i > start && (i - start >= MAX_RUNS_PER_MESSAGE || bytes + len > MAX_LAUNCH_BYTES) {
            out.push(&runs[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < runs.len() {
        out.push(&runs[start..]);
    }
    out
}

impl HostBackend for AgentBackend {
    fn launch(&mut self, _now_ms: u64, launches: &mut Vec<Launch>) {
        let mut by_host: FxHashMap<Arc<str>, Vec<pb::LaunchRun>> = FxHashMap::default();
        for l in launches.drain(..) {
            by_host
                .entry(l.host.clone())
                .or_default()
                .push(pb::LaunchRun {
                    key: Some(run_key(&l.job_id, l.run)),
                    spec: l.spec.as_deref().cloned(),
                    volume: l.volume.as_ref().map(|(id, size_mb)| pb::VolumeMount {
                        id: id.to_string(),
                        size_mb: *size_mb,
                    }),
                    secrets: l.secrets.as_deref().map(<[_]>::to_vec).unwrap_or_default(),
                });
        }
        let mut hosts: Vec<_> = by_host.into_iter().collect();
        hosts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (host, runs) in hosts {
            for chunk in launch_chunks(&runs) {
                let msg = pb::server_message::Kind::Launch(pb::LaunchRuns {
                    runs: chunk.to_vec(),
                });
                if !self.send(&host, msg) {
                    tracing::debug!(%host, n = chunk.len(), "launches not sent: agent not connected");
                    break;
                }
            }
        }
    }

    fn kill(&mut self, _now_ms: u64, kills: &mut Vec<Kill>) {
        let mut by_host: FxHashMap<Arc<str>, Vec<pb::KillRun>> = FxHashMap::default();
        for k in kills.drain(..) {
            by_host
                .entry(k.host.clone())
                .or_default()
                .push(pb::KillRun {
                    key: Some(run_key(&k.job_id, k.run)),
                    grace_ms: k.grace_ms,
                    delay_ms: k.delay_ms,
                });
        }
        let mut hosts: Vec<_> = by_host.into_iter().collect();
        hosts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (host, runs) in hosts {
            for chunk in runs.chunks(MAX_RUNS_PER_MESSAGE) {
                let msg = pb::server_message::Kind::Kill(pb::KillRuns {
                    runs: chunk.to_vec(),
                });
                if !self.send(&host, msg) {
                    break;
                }
            }
        }
    }

    fn poll(&mut self, _now_ms: u64, _out: &mut Vec<TaskUpdate>) {
        // Agents' reports arrive as loop commands.
    }

    fn next_deadline(&self) -> Option<u64> {
        None
    }

    fn wants_specs(&self) -> bool {
        true
    }

    fn dispatch_after_commit(&self) -> bool {
        true
    }

    fn agents(&mut self) -> Option<&mut AgentBackend> {
        Some(self)
    }
}

/// The `AgentService` gRPC handler.
#[derive(Debug, Clone)]
pub struct AgentApi {
    hub: Arc<AgentHub>,
    commands: mpsc::Sender<Command>,
    /// This server's standing (PostgreSQL store): sessions end when it
    /// stops leading, so agents look for the leader.
    role: Option<Arc<crate::leader::Role>>,
    /// A secure server's agents present a client certificate (checked by
    /// the TLS layer against the agents' CA) that names the host they
    /// register.
    require_cert: bool,
}

impl AgentApi {
    /// A handler feeding `commands`.
    pub fn new(hub: Arc<AgentHub>, commands: mpsc::Sender<Command>) -> Self {
        AgentApi {
            hub,
            commands,
            role: None,
            require_cert: false,
        }
    }

    /// Agents must present a certificate naming their host.
    pub fn requiring_certificates(mut self, require: bool) -> Self {
        self.require_cert = require;
        self
    }

    /// Ends sessions when `role` stops leading.
    pub fn with_role(mut self, role: Arc<crate::leader::Role>) -> Self {
        self.role = Some(role);
        self
    }
}

/// A count above its limit, naming the field.
fn too_many(field: &str, n: usize, max: usize) -> Result<(), Status> {
    if n > max {
        return Err(crate::convert::invalid(
            field,
            format!("{n} entries; the limit is {max}"),
        ));
    }
    Ok(())
}

/// Every field of a registration within its bounds (checked on tokio,
/// before the loop sees it), each refusal naming its field.
fn check_register(r: &pb::AgentRegister) -> Result<(), Status> {
    use crate::convert::{bounded, id, invalid};
    use peloton_engine::host::{MAX_ATTRIBUTE_LEN, MAX_ATTRIBUTES, validate_attribute_word};
    if r.host.is_empty() {
        return Err(invalid("register.host", "must not be empty"));
    }
    id("register.host", &r.host)?;
    if let Err(problem) = validate_attribute_word(&r.host) {
        return Err(invalid("register.host", problem));
    }
    bounded("register.agent_id", &r.agent_id, MAX_AGENT_WORD_BYTES)?;
    bounded("register.isolation", &r.isolation, MAX_AGENT_WORD_BYTES)?;
    bounded(
        "register.agent_version",
        &r.agent_version,
        MAX_AGENT_WORD_BYTES,
    )?;
    if r.ports > MAX_HOST_PORTS {
        return Err(invalid(
            "register.ports",
            format!("{} ports; a host has at most {MAX_HOST_PORTS}", r.ports),
        ));
    }
    if let Some(res) = &r.resources {
        for (field, value, max) in [
            ("register.resources.cpu", res.cpu, MAX_HOST_CPUS),
            (
                "register.resources.memory_mb",
                res.memory_mb,
                MAX_HOST_MEMORY_MB,
            ),
            ("register.resources.disk_mb", res.disk_mb, MAX_HOST_DISK_MB),
        ] {
            if !value.is_finite() || !(0.0..=max).contains(&value) {
                return Err(invalid(field, format!("must be 0–{max} (got {value})")));
            }
        }
        // The GPU count is checked where the host is built (a whole number
        // of devices, 0–16).
    }
    // The server adds `host` and `peloton.host_pool` to the host's own.
    too_many(
        "register.attributes",
        r.attributes.len(),
        MAX_ATTRIBUTES - 2,
    )?;
    for (k, v) in &r.attributes {
        // Quoted by its first characters: the key may be long.
        let field = format!("register.attributes.{}", crate::convert::shown(k));
        if k.len() > MAX_ATTRIBUTE_LEN || v.len() > MAX_ATTRIBUTE_LEN {
            return Err(invalid(
                &field,
                format!("keys and values are at most {MAX_ATTRIBUTE_LEN} bytes"),
            ));
        }
        for word in [k, v] {
            validate_attribute_word(word).map_err(|p| invalid(&field, p))?;
        }
    }
    too_many(
        "register.volumes",
        r.volumes.len(),
        MAX_VOLUMES_PER_REGISTRATION,
    )?;
    for (i, v) in r.volumes.iter().enumerate() {
        id(&format!("register.volumes[{i}]"), v)?;
    }
    too_many("register.runs", r.runs.len(), MAX_RUNS_PER_REGISTRATION)?;
    for (i, run) in r.runs.iter().enumerate() {
        check_report(&format!("register.runs[{i}]"), run)?;
    }
    Ok(())
}

/// A run report's key and port names within bounds (its free text is cut
/// where it comes in, `convert::agent_text`).
fn check_report(field: &str, r: &pb::RunReport) -> Result<(), Status> {
    if let Some(key) = &r.key {
        crate::convert::id(&format!("{field}.key.job_id"), &key.job_id)?;
    }
    too_many(
        &format!("{field}.ports"),
        r.ports.len(),
        MAX_PORTS_PER_REPORT,
    )?;
    for name in r.ports.keys() {
        crate::convert::id(&format!("{field}.ports"), name)?;
    }
    Ok(())
}

/// Whether a stream error only says that the peer's connection is gone (a
/// broken pipe, a reset, an end of file): an orderly end when an agent
/// stops, not a fault of either side.
fn connection_closed(status: &Status) -> bool {
    use std::io::ErrorKind;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        cause = error.source();
    }
    false
}

#[tonic::async_trait]
impl pb::agent_service_server::AgentService for AgentApi {
    type SessionStream = ReceiverStream<Result<pb::ServerMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // The first certificate of the chain is the agent's own.
        let cert = request
            .peer_certs()
            .and_then(|c| c.first().map(|c| c.as_ref().to_vec()));
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(Duration::from_secs(30), inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no registration within 30 s"))??;
        let Some(pb::AgentMessage {
            kind: Some(pb::agent_message::Kind::Register(register)),
        }) = first
        else {
            return Err(Status::invalid_argument(
                "the first message of a session must be a register",
            ));
        };
        if register.token.len() > MAX_TOKEN_BYTES || !self.hub.token_matches(&register.token) {
            let host = crate::convert::shown(&register.host);
            tracing::warn!(%host, "agent refused: wrong token");
            return Err(Status::unauthenticated(format!(
                "agent {host}: the token does not match the server's agent token"
            )));
        }
        check_register(&register)?;
        if self.require_cert {
            let host = crate::convert::shown(&register.host);
            let Some(cert) = cert else {
                tracing::warn!(%host, "agent refused: no client certificate");
                return Err(Status::unauthenticated(format!(
                    "agent {host}: this server wants a client certificate naming the host \
                     (peloton-agent --cert-file/--key-file)"
                )));
            };
            if peloton_tls::is_user_cert(&cert) {
                tracing::warn!(%host, "agent refused: it presented a user certificate");
                return Err(Status::permission_denied(format!(
                    "agent {host}: a user certificate (CN=user:...) cannot register an agent"
                )));
            }
            // Exactly the name (hosts are exact keys here, so a certificate
            // for `host-a` must not register `HOST-A` as another host).
            let names = peloton_tls::cert_names(&cert).unwrap_or_default();
            if !names.contains(&register.host) {
                tracing::warn!(%host, ?names, "agent refused: its certificate names another host");
                return Err(Status::permission_denied(format!(
                    "agent {host}: its certificate names {names:?}, not this host"
                )));
            }
        }
        let host: Arc<str> = Arc::from(register.host.as_str());
        let (tx, rx) = mpsc::channel(OUTBOX_LEN);
        let outbox = tx.clone();
        tx.send(Ok(pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Registered(pb::Registered {
                heartbeat_interval_ms: self.hub.heartbeat_interval_ms,
            })),
        }))
        .await
        .map_err(|_| Status::internal("outbox closed"))?;
        let id = self.hub.next_id();
        // The loop touches the host once it accepts the registration: a
        // refused agent must not keep the holder's host looking alive.
        let (reply_tx, reply_rx) = oneshot::channel();
        let agent_id: Arc<str> = Arc::from(register.agent_id.as_str());
        self.commands
            .send(Command::AgentRegister {
                registration: Box::new(Registration {
                    session: Session { id, agent_id, tx },
                    register,
                }),
                reply: reply_tx,
            })
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        reply_rx
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))??;
        tracing::info!(%host, session = id, "agent registered");
        let hub = self.hub.clone();
        let commands = self.commands.clone();
        let role = self.role.clone();
        let mut leading = role.as_ref().map(|r| r.watch_leading());
        tokio::spawn(async move {
            loop {
                let next = async {
                    match leading.as_mut() {
                        Some(l) => {
                            let _ = l.wait_for(|leading| !leading).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                let message = tokio::select! {
                    m = inbound.message() => m,
                    () = next => {
                        let why = role
                            .as_ref()
                            .and_then(|r| r.refusal())
                            .map_or_else(|| "not the leader".to_owned(), |r| r.0);
                        tracing::warn!(%host, session = id, "ending the agent's session: {why}");
                        let _ = outbox.send(Err(Status::unavailable(why))).await;
                        break;
                    }
                };
                let msg = match message {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    // An agent process that exited (or a connection reset)
                    // ends the stream like a goodbye: no error to report.
                    Err(e) if connection_closed(&e) => {
                        tracing::debug!(%host, error = %e, "agent connection closed");
                        break;
                    }
                    Err(e) => {
                        tracing::info!(%host, error = %e, "agent session broke");
                        break;
                    }
                };
                hub.touch(&host);
                match msg.kind {
                    Some(pb::agent_message::Kind::Reports(r)) => {
                        let mut reports = r.reports;
                        reports.truncate(MAX_REPORTS_PER_MESSAGE);
                        // A report out of bounds is dropped (the agent
                        // lists the run again when it registers).
                        reports.retain(|r| check_report("reports", r).is_ok());
                        let c = Command::AgentReports {
                            host: host.clone(),
                            session: id,
                            reports,
                        };
                        if commands.send(c).await.is_err() {
                            break;
                        }
                    }
                    Some(pb::agent_message::Kind::Log(chunk)) => hub.deliver_log(chunk, &outbox),
                    Some(pb::agent_message::Kind::Heartbeat(_)) | None => {}
                    Some(pb::agent_message::Kind::Register(_)) => {
                        tracing::warn!(%host, "agent registered twice on one session; ignored");
                    }
                }
            }
            tracing::info!(%host, session = id, "agent disconnected");
            let _ = commands
                .send(Command::AgentGone {
                    host: host.clone(),
                    session: id,
                })
                .await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_chunk_reaches_its_request_only_from_the_session_asked() {
        let hub = AgentHub::new("t".into(), 1000);
        let (asked, _a) = mpsc::channel(1);
        let (other, _b) = mpsc::channel(1);
        let id = hub.next_id();
        let mut answer = hub.expect_log(id, &asked);
        let chunk = |data: &[u8]| pb::LogChunk {
            request_id: id,
            data: data.to_vec(),
            ..Default::default()
        };
        // Another host's agent answering the request (its id guessed) is
        // ignored, and the request still waits.
        hub.deliver_log(chunk(b"forged"), &other);
        assert!(answer.try_recv().is_err());
        hub.deliver_log(chunk(b"real"), &asked);
        assert_eq!(answer.try_recv().expect("delivered").data, b"real");
    }

    /// `error` as the cause of a stream error, one level down as hyper
    /// wraps the connection's I/O error.
    fn broken(kind: std::io::ErrorKind) -> Status {
        #[derive(Debug, thiserror::Error)]
        #[error("error reading a body from connection")]
        struct Wrapper(#[source] std::io::Error);
        let mut status = Status::unknown("h2 protocol error");
        status.set_source(Arc::new(Wrapper(std::io::Error::new(
            kind,
            "stream closed",
        ))));
        status
    }

    #[test]
    fn tokens_are_equal_only_when_every_byte_and_the_length_agree() {
        assert!(tokens_equal(b"secret", b"secret"));
        assert!(tokens_equal(b"", b""));
        for given in [
            &b"secreT"[..],
            b"secre",
            b"secrets",
            b"",
            b"Secret",
            b"\0ecret",
        ] {
            assert!(!tokens_equal(b"secret", given), "{given:?}");
        }
        // A byte that happens to equal the complement of the expected one
        // past the end cannot make a shorter guess match.
        assert!(!tokens_equal(b"ab", b"a"));
        assert!(!tokens_equal(b"", b"x"));
    }

    #[test]
    fn a_closed_connection_is_an_orderly_end_and_other_errors_are_not() {
        use std::io::ErrorKind;
        assert!(connection_closed(&broken(ErrorKind::BrokenPipe)));
        assert!(connection_closed(&broken(ErrorKind::ConnectionReset)));
        assert!(!connection_closed(&broken(ErrorKind::PermissionDenied)));
        assert!(!connection_closed(&Status::internal("broken pipe")));
    }
}
