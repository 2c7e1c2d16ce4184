//! What the agents' sessions, the loop and the log readers share: the
//! table of connected sessions, the hosts' last-seen times and the log
//! requests waiting for their answer. A leaf: it knows nothing of the loop,
//! the gRPC service ([`crate::agents`]) or the backend
//! ([`crate::agent_backend`]), which all hold it.
//!
//! Only the loop attaches and detaches sessions (a session receives
//! launches once the loop has processed its registration, so reconciling
//! the agent's list of runs against the loop's view never races with a
//! launch in flight); the session handlers touch last-seen times and
//! deliver log chunks.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use peloton_proto::v1 as pb;
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// Messages to one agent.
pub type Outbox = mpsc::Sender<Result<pb::ServerMessage, Status>>;

/// Messages queued to one agent before its session is considered broken
/// (it reconnects and reconciles).
pub const OUTBOX_LEN: usize = 1024;
/// Most runs (or acknowledgements, or volume ids) in one message.
pub const MAX_RUNS_PER_MESSAGE: usize = 1000;
/// Most reports in one message.
pub const MAX_REPORTS_PER_MESSAGE: usize = 10_000;
/// A host whose session is connected may be taken over by an agent of
/// another identity once it has been silent for this many heartbeat
/// intervals (its connection is then presumed dead).
pub const TAKEOVER_AFTER_HEARTBEATS: u64 = 3;

/// One connected agent.
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
    /// Its host as the engine knows hosts (validated by the agent service).
    pub spec: peloton_engine::host::HostSpec,
}

/// State shared by the session handlers, the log readers, the backend and
/// the loop.
#[derive(Debug)]
pub struct AgentHub {
    token: String,
    heartbeat_interval_ms: u64,
    /// The connected sessions, by host (changed by the loop only).
    sessions: Mutex<FxHashMap<Arc<str>, Session>>,
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
            sessions: Mutex::new(FxHashMap::default()),
            last_seen: Mutex::new(FxHashMap::default()),
            logs: Mutex::new(FxHashMap::default()),
            next_id: AtomicU64::new(1),
        }
    }

    /// How often agents are told to send a heartbeat.
    pub fn heartbeat_interval_ms(&self) -> u64 {
        self.heartbeat_interval_ms
    }

    /// A fresh id for a session or a log request.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The host was heard from at `now_ms` (times never go back).
    pub fn touch(&self, host: &Arc<str>, now_ms: u64) {
        let mut seen = self.last_seen.lock().expect("not poisoned");
        match seen.get_mut(host) {
            Some(t) => *t = (*t).max(now_ms),
            None => {
                seen.insert(host.clone(), now_ms);
            }
        }
    }

    /// How long a connected host must be silent before an agent of another
    /// identity may take it over.
    pub fn takeover_after_ms(&self) -> u64 {
        self.heartbeat_interval_ms * TAKEOVER_AFTER_HEARTBEATS
    }

    /// The agents' token itself (for a cluster admin adding an agent).
    pub fn token(&self) -> &str {
        &self.token
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
    pub fn deliver_log(&self, chunk: pb::LogChunk, from: &Outbox) {
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

    /// Makes `session` the host's session (replacing an older one, whose
    /// stream then ends). The loop has checked that the new session may
    /// take the host (`Scheduler::agent_registered`).
    pub fn attach(&self, host: Arc<str>, session: Session) {
        let old = self
            .sessions
            .lock()
            .expect("not poisoned")
            .insert(host.clone(), session);
        if let Some(old) = old {
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
        self.sessions
            .lock()
            .expect("not poisoned")
            .get(host)
            .is_some_and(|s| s.id == id)
    }

    /// Forgets the host's session if it is still `id`.
    pub fn detach(&self, host: &str, id: u64) -> bool {
        let mut sessions = self.sessions.lock().expect("not poisoned");
        if sessions.get(host).is_some_and(|s| s.id == id) {
            if let Some(s) = sessions.remove(host) {
                let _ =
                    s.tx.try_send(Err(Status::unavailable("session closed by the server")));
            }
            return true;
        }
        false
    }

    /// The host's session, if connected.
    pub fn session(&self, host: &str) -> Option<Session> {
        self.sessions
            .lock()
            .expect("not poisoned")
            .get(host)
            .cloned()
    }

    /// Sends `messages` to the host's agent, in order, until one cannot be
    /// sent; returns how many were. A full outbox means the agent stopped
    /// reading: the session is dropped (its stream ends, the agent
    /// reconnects and reconciles) rather than letting memory grow.
    pub fn send(
        &self,
        host: &str,
        messages: impl IntoIterator<Item = pb::server_message::Kind>,
    ) -> usize {
        let mut sessions = self.sessions.lock().expect("not poisoned");
        let Some(s) = sessions.get(host) else {
            return 0;
        };
        let mut sent = 0;
        for msg in messages {
            match s.tx.try_send(Ok(pb::ServerMessage { kind: Some(msg) })) {
                Ok(()) => sent += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(%host, "agent is not reading its messages; dropping its session");
                    sessions.remove(host);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    sessions.remove(host);
                    break;
                }
            }
        }
        sent
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
    fn a_full_outbox_drops_the_session_and_a_replaced_one_is_not_current() {
        let hub = AgentHub::new("t".into(), 1000);
        let host: Arc<str> = "h".into();
        let (tx, mut rx) = mpsc::channel(2);
        hub.attach(
            host.clone(),
            Session {
                id: 1,
                agent_id: "a".into(),
                tx,
            },
        );
        let ping = || pb::server_message::Kind::Registered(pb::Registered::default());
        assert_eq!(hub.send("h", [ping(), ping(), ping()]), 2);
        assert!(hub.session("h").is_none(), "dropped when its outbox filled");
        assert_eq!(hub.send("h", [ping()]), 0);
        while rx.try_recv().is_ok() {}
        let (tx2, _rx2) = mpsc::channel(2);
        hub.attach(
            host,
            Session {
                id: 2,
                agent_id: "a".into(),
                tx: tx2,
            },
        );
        assert!(!hub.is_current("h", 1) && hub.is_current("h", 2));
        assert!(!hub.detach("h", 1) && hub.detach("h", 2));
    }
}
