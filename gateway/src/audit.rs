//! The authentication layer: wraps every public gRPC service (and so the
//! JSON/HTTP mirror, which calls them in process). It reads the bearer
//! token, or without one the connection's client certificate (recorded
//! with a token), refuses a call without a valid one (UNAUTHENTICATED),
//! hands the [`Caller`] to the handler, and sends every mutating call to the
//! loop's audit log with its outcome. Apart from the access table
//! ([`crate::access`]), which the loop also uses: no import circle.

use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use peloton_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::Status;

use crate::access::{Access, AuditNote, TlsInfo, UNAUTHENTICATED};
use crate::command::{AccessCommand, Command};
use crate::status::truncate;

/// Longest audit message kept.
const MAX_AUDIT_MESSAGE_BYTES: usize = 1024;

/// The state [`layer`] runs with.
#[derive(Clone, Debug)]
pub struct LayerState {
    /// Tokens and callers.
    pub access: Arc<Access>,
    /// Where audit entries go (the loop).
    pub tx: mpsc::Sender<Command>,
    /// Bounds the audit entries of calls without a valid token (anyone can
    /// make those: they must not flush the log's history).
    pub strangers: Arc<StrangerLimit>,
}

/// Audit entries of unauthenticated calls kept per second; the rest are
/// counted and the next kept entry says how many were not logged.
pub const MAX_UNAUTHENTICATED_AUDITS_PER_S: u64 = 20;

/// A per-second budget for unauthenticated calls' audit entries.
#[derive(Debug, Default)]
pub struct StrangerLimit {
    /// (second, entries kept in it, entries dropped since the last kept).
    state: Mutex<(u64, u64, u64)>,
}

impl StrangerLimit {
    /// Whether an entry may be written now, and how many were dropped
    /// before it.
    fn admit(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 != now {
            s.0 = now;
            s.1 = 0;
        }
        if s.1 >= MAX_UNAUTHENTICATED_AUDITS_PER_S {
            s.2 += 1;
            return None;
        }
        s.1 += 1;
        Some(std::mem::take(&mut s.2))
    }
}

/// Longest method name an audit entry keeps (a request path is the
/// caller's to choose).
const MAX_AUDIT_METHOD_BYTES: usize = 128;

/// Whether a gRPC method changes something (and is audited): every method
/// but reads.
pub fn is_mutating(path: &str) -> bool {
    let method = path.rsplit('/').next().unwrap_or("");
    !(method.starts_with("Get")
        || method.starts_with("List")
        || method.starts_with("Query")
        || method.starts_with("Watch")
        || method == "Logs"
        || method == "WhoAmI"
        || method == "Check"
        || method == "Plan")
}

/// Whether a gRPC path is served without a token: health checks and
/// reflection (the schema is public).
fn is_open(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
}

/// Authenticates every call to the public services and audits mutating
/// ones.
pub async fn layer(State(state): State<LayerState>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    if is_open(&path) {
        return next.run(request).await;
    }
    let audited = state.access.is_secure() && is_mutating(&path);
    let peer_certs = request
        .extensions()
        .get::<TlsInfo>()
        .and_then(|info| info.peer_certs());
    // The first certificate of the chain is the client's own.
    let peer_cert = peer_certs
        .as_ref()
        .and_then(|c| c.first())
        .map(|c| c.as_ref());
    let caller = match state.access.authenticate(request.headers(), peer_cert) {
        Ok(c) => c,
        Err(status) => {
            if audited && let Some(dropped) = state.strangers.admit() {
                let target = match dropped {
                    0 => String::new(),
                    n => format!("({n} unauthenticated calls before this one were not logged)"),
                };
                audit(&state, UNAUTHENTICATED, &path, target, &status).await;
            }
            return status.into_http();
        }
    };
    let note = AuditNote::default();
    request.extensions_mut().insert(caller.clone());
    request.extensions_mut().insert(note.clone());
    let response = next.run(request).await;
    if audited {
        // A unary call's refusal comes in the headers (trailers-only); an
        // answer without a status there succeeded.
        let status = Status::from_header_map(response.headers()).unwrap_or_else(|| Status::ok(""));
        let target = note.take();
        audit(&state, caller.principal.name(), &path, target, &status).await;
    }
    response
}

async fn audit(state: &LayerState, who: &str, method: &str, target: String, status: &Status) {
    let message = truncate(status.message(), MAX_AUDIT_MESSAGE_BYTES).into_owned();
    let method = truncate(method, MAX_AUDIT_METHOD_BYTES).into_owned();
    let entry = pb::AuditEntry {
        seq: 0,
        time_ms: 0,
        principal: who.to_owned(),
        method,
        target,
        code: status.code() as i32,
        message,
    };
    // Waits when the loop's queue is full (backpressure); a stopping loop
    // loses it.
    let _ = state
        .tx
        .send(Command::Access(AccessCommand::Audit(Box::new(entry))))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_not_audited_and_everything_else_is() {
        for read in [
            "/peloton.v1.JobService/Get",
            "/peloton.v1.JobService/Query",
            "/peloton.v1.TaskService/Logs",
            "/peloton.v1.WatchService/Watch",
            "/peloton.v1.AccessService/ListAudit",
            "/peloton.v1.AccessService/WhoAmI",
            "/peloton.v1.ResourcePoolService/ListQueue",
            "/peloton.v1.JobService/Plan",
        ] {
            assert!(!is_mutating(read), "{read}");
        }
        for write in [
            "/peloton.v1.JobService/Kill",
            "/peloton.v1.JobService/Create",
            "/peloton.v1.HostService/StartMaintenance",
            "/peloton.v1.AccessService/RevokeToken",
            "/peloton.v1.UpdateService/Pause",
        ] {
            assert!(is_mutating(write), "{write}");
        }
    }
}
