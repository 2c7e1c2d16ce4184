//! The agents' gRPC service (`AgentService.Session`): each agent holds one
//! bidirectional stream. The handler checks the agent's token and its
//! registration, then turns what the agent says into loop commands
//! (registration, run reports, departure) and touches the host's last-seen
//! time in the [`AgentHub`] on every message; heartbeats never reach the
//! loop. Launches and kills go the other way through
//! [`crate::agent_backend::AgentBackend`].
//!
//! Log reads go from a `TaskService.Logs` handler straight to the agent's
//! outbox (the loop only names the run and the outbox); the agent's answer
//! comes back through the hub, keyed by request id.

use std::sync::Arc;
use std::time::Duration;

use peloton_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::agent_hub::{
    AgentHub, MAX_REPORTS_PER_MESSAGE, OUTBOX_LEN, Outbox, Registration, Session,
};
use crate::clock::wall_ms as now_ms;
use crate::command::{AgentCommand, Command};
use crate::leader::Role;

/// Most runs an agent may list when it registers.
pub const MAX_RUNS_PER_REGISTRATION: usize = 100_000;
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
    /// Whether a registration may open a session: the agent token, the
    /// message's bounds and (when required) a client certificate naming
    /// exactly the host.
    fn admit(&self, register: &pb::AgentRegister, cert: Option<Vec<u8>>) -> Result<(), Status> {
        if register.token.len() > MAX_TOKEN_BYTES || !self.hub.token_matches(&register.token) {
            let host = crate::convert::shown(&register.host);
            tracing::warn!(%host, "agent refused: wrong token");
            return Err(Status::unauthenticated(format!(
                "agent {host}: the token does not match the server's agent token"
            )));
        }
        check_register(register)?;
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
        Ok(())
    }

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

/// At most this many port ranges in a registration.
pub const MAX_PORT_RANGES: usize = 64;

/// `register.address`: empty, or an IP address.
fn check_address(address: &str) -> Result<(), Status> {
    if address.is_empty() || (address.len() <= 64 && address.parse::<std::net::IpAddr>().is_ok()) {
        return Ok(());
    }
    let shown: String = address.chars().take(64).collect();
    Err(crate::convert::invalid(
        "register.address",
        format!("{shown:?} is not an IP address"),
    ))
}

/// `register.port_ranges` as the core's ranges: at most
/// [`MAX_PORT_RANGES`], each within 1..=65535 and not empty.
pub fn port_ranges(
    ranges: &[pb::PortRange],
) -> Result<Vec<crate::lifecycle::rendezvous::PortRange>, Status> {
    too_many("register.port_ranges", ranges.len(), MAX_PORT_RANGES)?;
    ranges
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let port = |p: u32| u16::try_from(p).ok().filter(|&p| p > 0);
            match (port(r.first), port(r.last)) {
                (Some(first), Some(last)) if first <= last => {
                    Ok(crate::lifecycle::rendezvous::PortRange { first, last })
                }
                _ => Err(crate::convert::invalid(
                    &format!("register.port_ranges[{i}]"),
                    format!(
                        "{}-{} is not a range of ports (1 to 65535, first <= last)",
                        r.first, r.last
                    ),
                )),
            }
        })
        .collect()
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
    check_address(&r.address)?;
    port_ranges(&r.port_ranges)?;
    check_address(&r.address)?;
    port_ranges(&r.port_ranges)?;
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
        self.admit(&register, cert)?;
        let spec = crate::convert::host_spec(
            &register.host,
            register.resources.as_ref(),
            &register.attributes,
            register.ports,
        )?;
        let host: Arc<str> = Arc::from(register.host.as_str());
        let (tx, rx) = mpsc::channel(OUTBOX_LEN);
        let outbox = tx.clone();
        tx.send(Ok(pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Registered(pb::Registered {
                heartbeat_interval_ms: self.hub.heartbeat_interval_ms(),
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
            .send(Command::Agents(AgentCommand::AgentRegister {
                registration: Box::new(Registration {
                    session: Session { id, agent_id, tx },
                    register,
                    spec,
                }),
                reply: reply_tx,
            }))
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        reply_rx
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))??;
        tracing::info!(%host, session = id, "agent registered");
        tokio::spawn(relay(
            inbound,
            host,
            id,
            outbox,
            self.hub.clone(),
            self.commands.clone(),
            self.role.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Relays an admitted agent's messages to the loop until the stream ends,
/// the agent goes or this server stops leading; then says it is gone.
async fn relay(
    mut inbound: Streaming<pb::AgentMessage>,
    host: Arc<str>,
    id: u64,
    outbox: Outbox,
    hub: Arc<AgentHub>,
    commands: mpsc::Sender<Command>,
    role: Option<Arc<Role>>,
) {
    let mut leading = role.as_ref().map(|r| r.watch_leading());
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
        hub.touch(&host, now_ms());
        match msg.kind {
            Some(pb::agent_message::Kind::Reports(r)) => {
                let mut reports = r.reports;
                reports.truncate(MAX_REPORTS_PER_MESSAGE);
                // A report out of bounds is dropped (the agent
                // lists the run again when it registers).
                reports.retain(|r| check_report("reports", r).is_ok());
                let c = Command::Agents(AgentCommand::AgentReports {
                    host: host.clone(),
                    session: id,
                    reports,
                });
                if commands.send(c).await.is_err() {
                    break;
                }
            }
            Some(pb::agent_message::Kind::Log(chunk)) => hub.deliver_log(chunk, &outbox),
            Some(pb::agent_message::Kind::Usage(u)) => {
                let c = Command::Agents(AgentCommand::AgentUsage {
                    session: id,
                    report: Box::new(crate::codec::usage_report(host.clone(), u)),
                });
                if commands.send(c).await.is_err() {
                    break;
                }
            }
            Some(pb::agent_message::Kind::Heartbeat(_)) | None => {}
            Some(pb::agent_message::Kind::Register(_)) => {
                tracing::warn!(%host, "agent registered twice on one session; ignored");
            }
        }
    }
    tracing::info!(%host, session = id, "agent disconnected");
    let _ = commands
        .send(Command::Agents(AgentCommand::AgentGone {
            host: host.clone(),
            session: id,
        }))
        .await;
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

    /// A registration's address is an IP address (or empty) and its port
    /// ranges are ranges of ports, each refusal naming its field.
    #[test]
    fn an_address_and_port_ranges_are_checked() {
        let register = |address: &str, ranges: &[(u32, u32)]| pb::AgentRegister {
            host: "h1".into(),
            address: address.into(),
            port_ranges: ranges
                .iter()
                .map(|&(first, last)| pb::PortRange { first, last })
                .collect(),
            ..Default::default()
        };
        let error = |r: &pb::AgentRegister| check_register(r).unwrap_err().message().to_owned();
        assert!(check_register(&register("", &[])).is_ok());
        assert!(check_register(&register("10.0.0.7", &[(31000, 31999), (5, 5)])).is_ok());
        assert!(check_register(&register("fe80::1", &[])).is_ok());
        assert_eq!(
            error(&register("node-7", &[])),
            "register.address: \"node-7\" is not an IP address"
        );
        assert_eq!(
            error(&register("", &[(31000, 31999), (9, 3)])),
            "register.port_ranges[1]: 9-3 is not a range of ports (1 to 65535, first <= last)"
        );
        assert!(error(&register("", &[(0, 3)])).starts_with("register.port_ranges[0]"));
        assert!(error(&register("", &[(1, 70000)])).starts_with("register.port_ranges[0]"));
        assert!(
            error(&register("", &[(1, 1); MAX_PORT_RANGES + 1]))
                .starts_with("register.port_ranges")
        );
    }
}
