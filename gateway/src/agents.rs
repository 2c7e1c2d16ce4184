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
use crate::scheduler::{Command, now_ms};

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

/// State shared by the session handlers, the log readers and the loop.
#[derive(Debug)]
pub struct AgentHub {
    token: String,
    heartbeat_interval_ms: u64,
    last_seen: Mutex<FxHashMap<Arc<str>, u64>>,
    logs: Mutex<FxHashMap<u64, oneshot::Sender<pb::LogChunk>>>,
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

    /// When the host was last heard from (since this process started).
    pub fn last_seen(&self, host: &str) -> Option<u64> {
        self.last_seen
            .lock()
            .expect("not poisoned")
            .get(host)
            .copied()
    }

    /// Registers a log request; the agent's answer arrives on the receiver.
    pub fn expect_log(&self, request_id: u64) -> oneshot::Receiver<pb::LogChunk> {
        let (tx, rx) = oneshot::channel();
        self.logs
            .lock()
            .expect("not poisoned")
            .insert(request_id, tx);
        rx
    }

    /// Drops a log request that timed out.
    pub fn forget_log(&self, request_id: u64) {
        self.logs.lock().expect("not poisoned").remove(&request_id);
    }

    fn deliver_log(&self, chunk: pb::LogChunk) {
        let waiter = self
            .logs
            .lock()
            .expect("not poisoned")
            .remove(&chunk.request_id);
        if let Some(w) = waiter {
            let _ = w.send(chunk);
        }
    }
}

/// One connected agent, as the loop sees it.
#[derive(Debug, Clone)]
pub struct Session {
    /// Unique per connection.
    pub id: u64,
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
    /// stream then ends).
    pub fn attach(&mut self, host: Arc<str>, session: Session) {
        if let Some(old) = self.sessions.insert(host, session) {
            // Ends the old stream even if a log reader still holds its
            // outbox (an error item ends a gRPC response stream).
            let _ = old.tx.try_send(Err(Status::aborted(
                "replaced by a newer session of this agent",
            )));
        }
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
}

impl AgentApi {
    /// A handler feeding `commands`.
    pub fn new(hub: Arc<AgentHub>, commands: mpsc::Sender<Command>) -> Self {
        AgentApi { hub, commands }
    }
}

fn check_register(r: &pb::AgentRegister) -> Result<(), Status> {
    if r.host.is_empty() {
        return Err(Status::invalid_argument("register.host: must not be empty"));
    }
    crate::convert::id("register.host", &r.host)?;
    if let Err(problem) = peloton_engine::host::validate_attribute_word(&r.host) {
        return Err(Status::invalid_argument(format!(
            "register.host: {problem}"
        )));
    }
    if r.runs.len() > MAX_RUNS_PER_REGISTRATION {
        return Err(Status::invalid_argument(format!(
            "register.runs: {} runs; the limit is {MAX_RUNS_PER_REGISTRATION}",
            r.runs.len()
        )));
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
        if register.token != self.hub.token {
            let host = crate::convert::shown(&register.host);
            tracing::warn!(%host, "agent refused: wrong token");
            return Err(Status::unauthenticated(format!(
                "agent {host}: the token does not match the server's agent token"
            )));
        }
        check_register(&register)?;
        let host: Arc<str> = Arc::from(register.host.as_str());
        let (tx, rx) = mpsc::channel(OUTBOX_LEN);
        tx.send(Ok(pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Registered(pb::Registered {
                heartbeat_interval_ms: self.hub.heartbeat_interval_ms,
            })),
        }))
        .await
        .map_err(|_| Status::internal("outbox closed"))?;
        let id = self.hub.next_id();
        self.hub.touch(&host);
        let (reply_tx, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::AgentRegister {
                registration: Box::new(Registration {
                    session: Session { id, tx },
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
        tokio::spawn(async move {
            loop {
                let msg = match inbound.message().await {
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
                        let c = Command::AgentReports {
                            host: host.clone(),
                            reports,
                        };
                        if commands.send(c).await.is_err() {
                            break;
                        }
                    }
                    Some(pb::agent_message::Kind::Log(chunk)) => hub.deliver_log(chunk),
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
    fn a_closed_connection_is_an_orderly_end_and_other_errors_are_not() {
        use std::io::ErrorKind;
        assert!(connection_closed(&broken(ErrorKind::BrokenPipe)));
        assert!(connection_closed(&broken(ErrorKind::ConnectionReset)));
        assert!(!connection_closed(&broken(ErrorKind::PermissionDenied)));
        assert!(!connection_closed(&Status::internal("broken pipe")));
    }
}
