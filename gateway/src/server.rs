//! Starting and stopping the whole service: store, engine, simulated hosts,
//! the loop thread, the gRPC server (with health and reflection), its
//! JSON/HTTP mirror on the same port, and the metrics endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use peloton_engine::{Engine, EngineConfig};
use peloton_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};

use crate::access::Access;
use crate::agent_backend::AgentBackend;
use crate::agent_hub::AgentHub;
use crate::agents::AgentApi;
use crate::backend::{HostBackend, SimBackend};
use crate::command::Command;
use crate::config::Config;
use crate::convert::Limits;
use crate::http::Mirror;
use crate::leader::{Gate, Lease, LeaseConfig, Role, Standing};
use crate::metrics::Metrics;
use crate::pgstore::PgStore;
use crate::reopening::ReopeningStore;
use crate::scheduler::{LoopConfig, Scheduler};
use crate::service::Api;
use crate::status::Contract;
use crate::store::{RedbStore, Store};

/// Largest gRPC message accepted (a job spec with many overrides) by the
/// services that take large specs (pools, jobs, updates; the others keep
/// tonic's 4 MiB), and largest answer every public service may send (pages
/// end before 3 MiB of items; only a job whose own spec was sent larger
/// makes a larger answer).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Most metadata (header names and values, counted as HTTP/2 does: 32
/// bytes more per entry) a request may carry; a call with more fails alone
/// with RESOURCE_EXHAUSTED (an HTTP request: 431).
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// The header list HTTP/2 accepts (advertised as
/// SETTINGS_MAX_HEADER_LIST_SIZE), well above [`MAX_METADATA_BYTES`] so
/// that a call over that limit reaches [`refuse_large_metadata`] and fails
/// alone. Past it h2 refuses the stream itself (HTTP 431, which clients
/// show as UNKNOWN), and it closes the whole connection (GOAWAY
/// ENHANCE_YOUR_CALM) for a list of more than four times it decoded, or
/// sent in more CONTINUATION frames than 1.25 times it over the frame size
/// (16 KiB): past about 1.25 MiB as sent. That is h2's guard against
/// header floods, which no setting turns off; with hyper's default list
/// (16 KiB) it closed the connection past 64 KiB. A connection decodes
/// one header block at a time, so this bounds what that takes; a call
/// keeps at most [`MAX_METADATA_BYTES`].
const MAX_HEADER_LIST_BYTES: u32 = 1 << 20;

/// Refuses a request whose metadata is over [`MAX_METADATA_BYTES`]: a gRPC
/// call with RESOURCE_EXHAUSTED, an HTTP request with 431.
async fn refuse_large_metadata(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 32)
        .sum();
    if size <= MAX_METADATA_BYTES {
        return next.run(request).await;
    }
    let message = format!(
        "request metadata: {size} bytes (names and values, 32 more per entry); the limit is {MAX_METADATA_BYTES}"
    );
    if crate::leader::is_grpc(&request) {
        return tonic::Status::resource_exhausted(message).into_http::<axum::body::Body>();
    }
    let code = axum::http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
    let body = serde_json::json!({
        "error": {"code": code.as_u16(), "status": "RESOURCE_EXHAUSTED", "message": message}
    });
    axum::response::IntoResponse::into_response((
        code,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    ))
}

/// A service as every client sees it: gzip-compressed requests accepted,
/// answers compressed for clients that accept gzip, and errors that keep
/// the contract ([`Contract`]).
macro_rules! public {
    ($service:expr) => {
        Contract(
            $service
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                .send_compressed(tonic::codec::CompressionEncoding::Gzip),
        )
    };
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    /// Where gRPC is served.
    pub addr: SocketAddr,
    /// Where `/metrics` is served.
    pub metrics_addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    serve: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    metrics_task: Option<tokio::task::JoinHandle<()>>,
    tx: mpsc::Sender<Command>,
    loop_thread: Option<std::thread::JoinHandle<()>>,
    store: Arc<dyn Store>,
    /// The leader's lease (PostgreSQL store), released at shutdown.
    lease: Option<Lease>,
    /// Its standing: `Stopping` once shutdown has committed the last batch.
    role: Arc<Role>,
}

/// Listens, opens the store (with a PostgreSQL store: once this server
/// holds the leader's lease, standing by until then), recovers, and
/// serves. Until it serves, every call is answered UNAVAILABLE (naming
/// the leader while it stands by).
pub async fn start(config: &Config) -> anyhow::Result<Server> {
    start_with(config, |_| {}).await
}

/// [`start`], calling `on_listening` with the address as soon as it
/// listens (before it leads, recovers and serves).
pub async fn start_with(
    config: &Config,
    on_listening: impl FnOnce(SocketAddr),
) -> anyhow::Result<Server> {
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    on_listening(addr);
    let role = Role::new();
    let gate = Gate::new(role.clone());
    // HTTP/1.1 is accepted beside HTTP/2 so that plain HTTP clients reach
    // the mirror on the gRPC port.
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .add_routes(tonic::service::Routes::from(
            gate.router()
                .layer(axum::middleware::from_fn(refuse_large_metadata)),
        ));
    // No Nagle delay: small answers must not wait for the client's ACK.
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    let (tls, signer) = match tls_config(config, addr)? {
        Some((tls, signer)) => (Some(tls), signer),
        None => (None, None),
    };
    let serve = match tls.clone() {
        Some(tls) => tokio::spawn(
            router.serve_with_incoming_shutdown(peloton_tls::tls_incoming(listener, tls), stopped),
        ),
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(Duration::from_secs(60)));
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
    };
    match opened(config, addr, role.clone(), &gate, tls, signer).await {
        Ok(mut server) => {
            server.stop = Some(stop);
            server.serve = Some(serve);
            Ok(server)
        }
        Err(e) => {
            let _ = stop.send(());
            let _ = serve.await;
            Err(e)
        }
    }
}

/// A secure server's TLS configuration, and the CA that signs user
/// certificates when the server holds its key.
type TlsSetup = (
    Arc<peloton_tls::rustls::ServerConfig>,
    Option<Arc<peloton_tls::Pki>>,
);

/// A secure server's TLS: its configured certificate, or one issued by
/// the private CA in `DATA_DIR/tls` (created once); client certificates
/// (agents', users') are checked against `tls_client_ca` or that CA. With
/// it, the CA that signs user certificates, when the server holds its key.
fn tls_config(config: &Config, addr: SocketAddr) -> anyhow::Result<Option<TlsSetup>> {
    if !config.secure {
        return Ok(None);
    }
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
    };
    let client_ca = match &config.tls_client_ca {
        Some(p) => Some(read(p)?),
        None => None,
    };
    let mut signer = match (&config.tls_client_ca, &config.tls_client_ca_key) {
        (Some(cert), Some(key)) => Some(Arc::new(peloton_tls::Pki::load(cert, key)?)),
        _ => None,
    };
    let (pair, client_ca) = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => (peloton_tls::load_pem_files(cert, key)?, client_ca),
        _ => {
            let pki = peloton_tls::ensure_local_ca(&config.data_dir.join("tls"))?;
            let mut names = vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ];
            if let Some(h) = nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
            {
                names.push(h);
            }
            if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
                names.push(addr.ip().to_string());
            }
            let pair = pki.ensure_server(&names)?;
            match client_ca {
                Some(ca) => (pair, Some(ca)),
                None => {
                    let ca = pki.ca_cert_pem.clone();
                    signer = Some(Arc::new(pki));
                    (pair, Some(ca))
                }
            }
        }
    };
    let tls = peloton_tls::server_config(&pair.cert_pem, &pair.key_pem, client_ca.as_deref())?;
    Ok(Some((tls, signer)))
}

type TlsStream = peloton_tls::tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// `tls_incoming`'s connections as an axum listener (the metrics endpoint
/// over TLS).
struct TlsListener {
    incoming: std::pin::Pin<Box<dyn futures::Stream<Item = std::io::Result<TlsStream>> + Send>>,
    addr: SocketAddr,
}

impl TlsListener {
    fn new(
        incoming: impl futures::Stream<Item = std::io::Result<TlsStream>> + Send + 'static,
        addr: SocketAddr,
    ) -> Self {
        TlsListener {
            incoming: Box::pin(incoming),
            addr,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TlsStream, SocketAddr) {
        use futures::StreamExt as _;
        loop {
            match self.incoming.next().await {
                Some(Ok(s)) => {
                    let peer = s.get_ref().0.peer_addr().unwrap_or(self.addr);
                    return (s, peer);
                }
                // Failed handshakes are dropped inside `tls_incoming`.
                Some(Err(_)) => continue,
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// The URL standbys name for this server when `advertise` is not set:
/// the listen address, or the host's name when it listens on every
/// address (0.0.0.0 or ::, which no client can dial).
fn default_advertise(addr: SocketAddr, secure: bool) -> String {
    let scheme = if secure { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into());
        tracing::warn!(
            %host,
            "listening on every address without --advertise: standbys will name this server by its host name"
        );
        format!("{scheme}://{host}:{}", addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
}

/// This server's lasting identity, kept in `DATA_DIR/server-id` (created
/// once): a restart after a crash takes its own lease back at once.
fn server_id(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = data_dir.join("server-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    }
    std::fs::create_dir_all(data_dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", data_dir.display()))?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::rename(&tmp, &path)?;
    Ok(id)
}

/// Opens the store, taking the lease first if it is PostgreSQL.
fn open_store(
    config: &Config,
    addr: SocketAddr,
    role: &Arc<Role>,
) -> anyhow::Result<(Arc<dyn Store>, Option<Lease>)> {
    let Some(url) = config.store.clone() else {
        // Reopened after a failed commit (a full disk): the loop keeps
        // serving reads and retries the write until it lands.
        let (data_dir, cache_bytes) = (config.data_dir.clone(), config.store_cache_mb << 20);
        let store = ReopeningStore::open(Box::new(move || {
            RedbStore::open_with_cache(&data_dir, cache_bytes)
                .map(|s| Box::new(s) as Box<dyn Store>)
        }))?;
        return Ok((Arc::new(store), None));
    };
    let lease = Lease::acquire(
        LeaseConfig {
            url: url.clone(),
            address: config
                .advertise
                .clone()
                .unwrap_or_else(|| default_advertise(addr, config.secure)),
            lease: Duration::from_millis(config.lease_ms),
            server_id: server_id(&config.data_dir)?,
        },
        role,
    )?;
    role.set(Standing::Starting);
    let mut lease = lease;
    lease.keep(role.clone());
    let epoch = lease.epoch;
    let stuck_after = (Duration::from_millis(config.lease_ms) / 2).max(Duration::from_millis(200));
    // Reopened after a failed commit (the database restarted): fenced by
    // this server's epoch every time.
    let store = ReopeningStore::open(Box::new(move || {
        PgStore::open_fenced(
            &url,
            epoch,
            stuck_after,
            Box::new(|f| crate::leader::deposed(&f.to_string())),
        )
        .map(|s| Box::new(s) as Box<dyn Store>)
    }))?;
    Ok((Arc::new(store), Some(lease)))
}

/// An empty engine (the core adds the simulated hosts as it recovers).
fn new_engine(config: &Config) -> Engine {
    let mut engine_config = EngineConfig::default();
    engine_config.resources.threads = config.engine_threads;
    engine_config.backfill.enabled = config.backfill_reservations > 0;
    engine_config.backfill.max_reservations = config.backfill_reservations;
    engine_config.backfill.depth = config.backfill_depth;
    Engine::new(engine_config)
}

/// The loop's options from the server's configuration.
fn loop_config(config: &Config, limits: Limits) -> LoopConfig {
    LoopConfig {
        cycle_interval: Duration::from_millis(config.cycle_interval_ms),
        idle_cycle_interval: Duration::from_millis(config.idle_cycle_interval_ms),
        max_batch: config.max_batch,
        commit_spacing: Duration::from_millis(config.commit_spacing_ms),
        pipelined_commit: !config.sync_commit,
        limits,
        event_retention: config.event_retention,
        job_retention: Duration::from_secs(config.job_retention_s),
        max_finished_jobs: config.max_finished_jobs,
        app_lease: Duration::from_millis(config.app_lease_ms),
        overcommit: crate::lifecycle::OvercommitConfig {
            enabled: true,
            cpu_margin_pct: config.overcommit_cpu_margin_pct,
            memory_margin_pct: config.overcommit_memory_margin_pct,
        },
        host_lost_after: Duration::from_millis(config.host_lost_after_ms),
        forecast_interval: Duration::from_millis(config.forecast_interval_ms),
        ..LoopConfig::default()
    }
}

/// Opens the gate on every route: the public services behind the layer
/// that authenticates and audits, their JSON/HTTP mirror, the console and
/// (with agents) the agent service.
fn mount(
    gate: &Gate,
    grpc: tonic::service::Routes,
    access: &Arc<Access>,
    tx: &mpsc::Sender<Command>,
    hub: Option<Arc<AgentHub>>,
    role: &Arc<Role>,
    secure: bool,
) -> anyhow::Result<()> {
    // Every public call (the mirror's too) is authenticated, and mutating
    // ones audited, by one layer.
    let grpc = tonic::service::Routes::from(grpc.into_axum_router().layer(
        axum::middleware::from_fn_with_state(
            crate::audit::LayerState {
                access: access.clone(),
                tx: tx.clone(),
                strangers: Arc::default(),
            },
            crate::audit::layer,
        ),
    ));
    // The JSON/HTTP mirror calls the public services in process (through
    // the same `Contract` wrappers); agents' sessions are gRPC only.
    let mirror = Mirror::new(pb::FILE_DESCRIPTOR_SET, grpc.clone())?;
    let mut routes = grpc;
    if let Some(hub) = hub {
        routes = routes.add_service(public!(
            pb::agent_service_server::AgentServiceServer::new(
                AgentApi::new(hub, tx.clone())
                    .with_role(role.clone())
                    .requiring_certificates(secure)
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ));
    }
    gate.open(crate::console::mount(
        mirror.mount(routes.into_axum_router()),
    ));
    Ok(())
}

/// The health service, every public service marked serving.
async fn health_service()
-> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<pb::job_service_server::JobServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::resource_pool_service_server::ResourcePoolServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::task_service_server::TaskServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::host_service_server::HostServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::watch_service_server::WatchServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::host_pool_service_server::HostPoolServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::update_service_server::UpdateServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::volume_service_server::VolumeServiceServer<Api>>()
        .await;
    health_reporter
        .set_serving::<pb::application_service_server::ApplicationServiceServer<Api>>()
        .await;
    health.max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The public gRPC services (health, reflection and the API), each
/// behind the contract wrapper.
fn public_routes(
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    api: Api,
) -> anyhow::Result<tonic::service::Routes> {
    // Both reflection protocols: released grpcurl, grpc_cli and Python
    // tools still ask v1alpha.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()?
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let grpc = tonic::service::Routes::new(public!(health))
        .add_service(public!(reflection))
        .add_service(public!(reflection_v1alpha))
        .add_service(public!(
            pb::resource_pool_service_server::ResourcePoolServiceServer::new(api.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::job_service_server::JobServiceServer::new(api.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::task_service_server::TaskServiceServer::new(api.clone())
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::host_service_server::HostServiceServer::new(api.clone())
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::update_service_server::UpdateServiceServer::new(api.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::volume_service_server::VolumeServiceServer::new(api.clone())
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::host_pool_service_server::HostPoolServiceServer::new(api.clone())
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::application_service_server::ApplicationServiceServer::new(api.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::access_service_server::AccessServiceServer::new(api.clone())
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ))
        .add_service(public!(
            pb::watch_service_server::WatchServiceServer::new(api)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
        ));
    Ok(grpc)
}

/// The metrics endpoint, if one is configured: its address and task.
async fn serve_metrics(
    config: &Config,
    metrics: &Arc<Metrics>,
    tls: Option<Arc<peloton_tls::rustls::ServerConfig>>,
) -> anyhow::Result<(Option<SocketAddr>, Option<tokio::task::JoinHandle<()>>)> {
    // The server's own certificate (made for the gRPC address).
    let metrics_tls = tls.filter(|_| config.metrics_tls);
    Ok(match config.metrics_listen {
        Some(at) => {
            let listener = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {at} for metrics: {e}"))?;
            let addr = listener.local_addr()?;
            let m = metrics.clone();
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let m = m.clone();
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            m.encode(),
                        )
                    }
                }),
            );
            let tls = metrics_tls;
            let task = tokio::spawn(async move {
                let served = match tls {
                    Some(tls) => {
                        // HTTP/1.1 only: the endpoint is axum's HTTP/1 server.
                        let mut tls = (*tls).clone();
                        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
                        let incoming = peloton_tls::tls_incoming(listener, Arc::new(tls));
                        axum::serve(TlsListener::new(incoming, addr), app).await
                    }
                    None => axum::serve(listener, app).await,
                };
                if let Err(e) = served {
                    tracing::error!(error = %e, "metrics server failed");
                }
            });
            (Some(addr), Some(task))
        }
        None => (None, None),
    })
}

async fn opened(
    config: &Config,
    addr: SocketAddr,
    role: Arc<Role>,
    gate: &Gate,
    tls: Option<Arc<peloton_tls::rustls::ServerConfig>>,
    signer: Option<Arc<peloton_tls::Pki>>,
) -> anyhow::Result<Server> {
    let (store, lease) = {
        let (config, role) = (config.clone(), role.clone());
        tokio::task::spawn_blocking(move || open_store(&config, addr, &role)).await??
    };
    let began = std::time::Instant::now();
    let snapshot = {
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.load()).await??
    };
    let loaded_ms = began.elapsed().as_millis() as u64;
    let engine = new_engine(config);
    let limits = Limits {
        max_instances_per_job: config.max_instances_per_job,
        ..Limits::default()
    };
    let metrics = Arc::new(Metrics::new(config.metrics_max_pools));
    let loop_config = LoopConfig {
        simulated_hosts: config.sim_host_specs()?,
        ..loop_config(config, limits)
    };
    let n_jobs = snapshot.jobs.len();
    let access = Arc::new(if config.secure {
        Access::secure(&config.resolve_admin_token()?, signer)
    } else {
        Access::insecure()
    });
    let (backend, hub): (Box<dyn HostBackend>, _) = if config.simulated() {
        (Box::new(SimBackend::new()), None)
    } else {
        let token = config.resolve_agent_token()?;
        let hub = Arc::new(AgentHub::new(token, config.agent_heartbeat_ms));
        (Box::new(AgentBackend::new(hub.clone())), Some(hub))
    };
    let scheduler = Scheduler::new(
        engine,
        store.clone(),
        backend,
        loop_config,
        metrics.clone(),
        snapshot,
        hub.clone(),
    )?
    .with_leading(role.watch_leading())
    .with_access(access.clone());
    tracing::info!(
        jobs = n_jobs,
        data_dir = %config.data_dir.display(),
        load_ms = loaded_ms,
        recover_ms = began.elapsed().as_millis() as u64 - loaded_ms,
        "recovered"
    );
    let (tx, rx) = mpsc::channel(config.command_queue);
    let rt = tokio::runtime::Handle::current();
    let loop_thread = std::thread::Builder::new()
        .name("peloton-loop".into())
        .spawn(move || scheduler.run(rx, rt))?;

    let api = Api::new(tx.clone(), limits, store.clone())
        .with_watch_memory(crate::service::WatchMemory::new(
            config.watch_memory_mb << 20,
            config.watch_buffer_kb << 10,
            Some(metrics.clone()),
        ))
        .with_hub(hub.clone())
        .with_metrics(metrics.clone())
        .with_role(role.clone())
        .with_access(access.clone());
    let health = health_service().await;
    let grpc = public_routes(health, api)?;
    mount(gate, grpc, &access, &tx, hub, &role, config.secure)?;
    let (metrics_addr, metrics_task) = serve_metrics(config, &metrics, tls).await?;
    role.transition(&Standing::Starting, Standing::Leading);
    tracing::info!(%addr, metrics = ?metrics_addr, epoch = lease.as_ref().map(|l| l.epoch), "serving");
    Ok(Server {
        addr,
        metrics_addr,
        stop: None,
        serve: None,
        metrics_task,
        tx,
        loop_thread: Some(loop_thread),
        store,
        lease,
        role,
    })
}

impl Server {
    /// Stops accepting connections, answers every request the loop already
    /// received (committing its last batch), stops the loop, and then waits
    /// for the connections to close: watch streams end when the loop's
    /// event channel closes, and calls that arrive after the loop stopped get
    /// UNAVAILABLE.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(m) = self.metrics_task.take() {
            m.abort();
        }
        // Commands are answered in order, so everything sent before this is
        // answered (and durable) before the loop stops.
        let _ = self.tx.send(Command::Shutdown).await;
        if let Some(t) = self.loop_thread.take() {
            tokio::task::spawn_blocking(move || t.join())
                .await?
                .map_err(|_| anyhow::anyhow!("the scheduling loop panicked"))?;
        }
        // The last batch is committed: a standby may take over at once.
        if let Some(lease) = self.lease.take() {
            tokio::task::spawn_blocking(move || lease.release()).await?;
        }
        // Hand the agents over now, not when the process exits: their
        // sessions end with "not the leader" (they go on to the next server
        // of their list, or come back to a restarted one), and so do calls
        // still arriving. A new leader measures their reconnect slack from
        // when it leads; agents held here meanwhile would eat into it.
        self.role.set(Standing::Stopping);
        if let Some(mut serve) = self.serve.take() {
            match tokio::time::timeout(Duration::from_secs(10), &mut serve).await {
                Ok(r) => r??,
                Err(_) => {
                    tracing::warn!("connections still open after 10 s; closing them");
                    serve.abort();
                }
            }
        }
        // Watch streams still replaying hold the store; the file stays
        // locked until they let go (they end now that the loop is gone).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&self.store) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}
