//! A secure server over a real TLS socket: TLS only, a bearer token on
//! every call but the health check, tokens created, listed and revoked by
//! a cluster admin, per-pool-subtree roles (refusals are PERMISSION_DENIED
//! naming the permission and the pool, and change nothing; reads and watch
//! events are filtered), the audit log of every mutating call, all of it
//! surviving a restart, the JSON/HTTP mirror over TLS, and client
//! certificates issued for tokens (recorded, revoked with their token or
//! alone).
//!

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pb::access_service_client::AccessServiceClient;
use pb::host_service_client::HostServiceClient;
use pb::job_service_client::JobServiceClient;
use pb::resource_pool_service_client::ResourcePoolServiceClient;
use pb::task_service_client::TaskServiceClient;
use pb::watch_service_client::WatchServiceClient;
use peloton_gateway::config::Config;
use peloton_gateway::server::{self, Server};
use peloton_proto::v1 as pb;
use peloton_tls::rustls::pki_types::ServerName;
use peloton_tls::tokio_rustls::TlsConnector;
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

// ------------------------------------------------------------- the server

/// The bootstrap admin token of every server here.
const ADMIN_TOKEN: &str = "pel_test_admin_token_0123456789";
/// Simulated hosts of every server here.
const SIM_HOSTS: u32 = 4;

/// The configuration of a secure test server on `data_dir`: no
/// certificate configured, so the server makes its private CA in
/// `DATA_DIR/tls` (once: a restart keeps it) and issues its own.
fn secure_config(data_dir: &Path) -> Config {
    Config {
        secure: true,
        tls_cert: None,
        tls_key: None,
        tls_client_ca: None,
        admin_token: Some(ADMIN_TOKEN.into()),
        ..config(data_dir, SIM_HOSTS)
    }
}

/// A secure server started in-process, with the CA its clients trust and
/// one open TLS channel.
struct Secure {
    server: Option<Server>,
    addr: SocketAddr,
    data_dir: PathBuf,
    /// The private CA the server created in `DATA_DIR/tls/ca.pem`.
    ca_pem: String,
    /// One TLS connection, shared by the clients of [`Secure::client`].
    channel: Channel,
    _dir: Option<tempfile::TempDir>,
}

impl Secure {
    /// A secure server on a fresh directory.
    async fn start() -> Secure {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = Secure::start_in(dir.path()).await;
        s._dir = Some(dir);
        s
    }

    /// A secure server on `data_dir` (which the caller keeps).
    async fn start_in(data_dir: &Path) -> Secure {
        let config = secure_config(data_dir);
        let server = within("the secure server to start", server::start(&config))
            .await
            .unwrap_or_else(|e| panic!("secure server does not start: {e:#}"));
        let ca_pem = std::fs::read_to_string(data_dir.join("tls").join("ca.pem"))
            .expect("the server wrote its CA to DATA_DIR/tls/ca.pem");
        let channel = common::tls_channel_to(server.addr, &ca_pem).await;
        Secure {
            addr: server.addr,
            server: Some(server),
            data_dir: data_dir.to_path_buf(),
            ca_pem,
            channel,
            _dir: None,
        }
    }

    /// Clients sending `authorization: <auth>` (none: no header) on the
    /// shared channel.
    fn client(&self, auth: Option<&str>) -> Api {
        Api::new(self.channel.clone(), auth)
    }

    /// Clients of the bearer token `secret`.
    fn as_token(&self, secret: &str) -> Api {
        self.client(Some(&bearer(secret)))
    }

    /// Clients of the bootstrap admin.
    fn admin(&self) -> Api {
        self.as_token(ADMIN_TOKEN)
    }

    /// Shuts down gracefully and starts again on the same directory and
    /// configuration.
    async fn restart(mut self) -> Secure {
        let server = self.server.take().expect("running");
        within("graceful shutdown before a restart", server.shutdown())
            .await
            .expect("graceful shutdown");
        let mut again = Secure::start_in(&self.data_dir).await;
        again._dir = self._dir.take();
        again
    }

    async fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            within("graceful shutdown", s.shutdown())
                .await
                .expect("graceful shutdown");
        }
    }
}

// ---------------------------------------------------------------- clients

/// Sets the `authorization` metadata of every call (or none).
#[derive(Clone, Debug)]
struct Auth(Option<AsciiMetadataValue>);

impl Interceptor for Auth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

type Svc = InterceptedService<Channel, Auth>;

/// The clients of one caller (cheap to clone: one shared channel).
#[derive(Clone, Debug)]
struct Api {
    pools: ResourcePoolServiceClient<Svc>,
    jobs: JobServiceClient<Svc>,
    tasks: TaskServiceClient<Svc>,
    hosts: HostServiceClient<Svc>,
    watch: WatchServiceClient<Svc>,
    access: AccessServiceClient<Svc>,
}

impl Api {
    fn new(channel: Channel, auth: Option<&str>) -> Api {
        let auth = Auth(auth.map(|a| a.parse().expect("an ASCII header value")));
        let svc = InterceptedService::new(channel, auth);
        Api {
            pools: ResourcePoolServiceClient::new(svc.clone()),
            jobs: JobServiceClient::new(svc.clone()),
            tasks: TaskServiceClient::new(svc.clone()),
            hosts: HostServiceClient::new(svc.clone()),
            watch: WatchServiceClient::new(svc.clone()),
            access: AccessServiceClient::new(svc),
        }
    }

    async fn who_am_i(&self) -> Result<pb::Token, tonic::Status> {
        Ok(self
            .access
            .clone()
            .who_am_i(pb::WhoAmIRequest {})
            .await?
            .into_inner()
            .token
            .expect("token"))
    }

    async fn create_job(&self, spec: pb::JobSpec) -> Result<pb::Job, tonic::Status> {
        Ok(self
            .jobs
            .clone()
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await?
            .into_inner()
            .job
            .expect("job"))
    }

    async fn get_job(&self, id: &str) -> Result<pb::Job, tonic::Status> {
        Ok(self
            .jobs
            .clone()
            .get(pb::GetJobRequest { id: id.into() })
            .await?
            .into_inner()
            .job
            .expect("job"))
    }

    async fn kill(&self, id: &str) -> Result<pb::KillJobResponse, tonic::Status> {
        Ok(self
            .jobs
            .clone()
            .kill(pb::KillJobRequest {
                id: id.into(),
                version: 0,
            })
            .await?
            .into_inner())
    }

    async fn scale(&self, id: &str, instances: u32) -> Result<pb::ScaleJobResponse, tonic::Status> {
        Ok(self
            .jobs
            .clone()
            .scale(pb::ScaleJobRequest {
                id: id.into(),
                instance_count: instances,
                version: 0,
            })
            .await?
            .into_inner())
    }

    async fn restart_job(&self, id: &str) -> Result<pb::RestartJobResponse, tonic::Status> {
        Ok(self
            .jobs
            .clone()
            .restart(pb::RestartJobRequest {
                id: id.into(),
                version: 0,
            })
            .await?
            .into_inner())
    }

    async fn delete_job(&self, id: &str) -> Result<pb::DeleteJobResponse, tonic::Status> {
        Ok(self
            .jobs
            .clone()
            .delete(pb::DeleteJobRequest {
                id: id.into(),
                version: 0,
            })
            .await?
            .into_inner())
    }

    async fn list_tasks(&self, job_id: &str) -> Result<Vec<pb::Task>, tonic::Status> {
        Ok(self
            .tasks
            .clone()
            .list(pb::ListTasksRequest {
                job_id: job_id.into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .tasks)
    }

    /// The ids of the jobs a query without filters returns (one page:
    /// the tests hold a few jobs).
    async fn job_ids(&self) -> Result<Vec<String>, tonic::Status> {
        let r = self
            .jobs
            .clone()
            .query(pb::QueryJobsRequest::default())
            .await?
            .into_inner();
        assert!(r.next_page_token.is_empty(), "one page expected: {r:?}");
        let mut ids: Vec<String> = r.jobs.into_iter().map(|j| j.id).collect();
        ids.sort();
        Ok(ids)
    }

    /// The paths of the pools listed (one page).
    async fn pool_paths(&self) -> Result<Vec<String>, tonic::Status> {
        let r = self
            .pools
            .clone()
            .list(pb::ListPoolsRequest::default())
            .await?
            .into_inner();
        assert!(r.next_page_token.is_empty(), "one page expected: {r:?}");
        Ok(r.pools.into_iter().map(|p| p.path).collect())
    }

    async fn create_pool(&self, path: &str, spec: pb::PoolSpec) -> Result<pb::Pool, tonic::Status> {
        Ok(self
            .pools
            .clone()
            .create(pb::CreatePoolRequest {
                path: path.into(),
                spec: Some(spec),
            })
            .await?
            .into_inner()
            .pool
            .expect("pool"))
    }

    async fn list_tokens(&self) -> Result<Vec<pb::Token>, tonic::Status> {
        Ok(self
            .access
            .clone()
            .list_tokens(pb::ListTokensRequest {})
            .await?
            .into_inner()
            .tokens)
    }

    async fn revoke(&self, name: &str) -> Result<pb::RevokeTokenResponse, tonic::Status> {
        Ok(self
            .access
            .clone()
            .revoke_token(pb::RevokeTokenRequest { name: name.into() })
            .await?
            .into_inner())
    }

    async fn audit(
        &self,
        principal: &str,
        limit: u32,
        before_seq: u64,
    ) -> Result<Vec<pb::AuditEntry>, tonic::Status> {
        Ok(self
            .access
            .clone()
            .list_audit(pb::ListAuditRequest {
                before_seq,
                limit,
                principal: principal.into(),
            })
            .await?
            .into_inner()
            .entries)
    }

    async fn watch(
        &self,
        from_revision: u64,
        job_id: &str,
    ) -> Result<tonic::Streaming<pb::WatchResponse>, tonic::Status> {
        Ok(self
            .watch
            .clone()
            .watch(pb::WatchRequest {
                from_revision,
                job_id: job_id.into(),
            })
            .await?
            .into_inner())
    }
}

/// The `authorization` header value of a bearer token.
fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

fn grant(role: pb::Role, pool: &str) -> pb::Grant {
    pb::Grant {
        role: role as i32,
        pool: pool.into(),
    }
}

/// Creates the token `name` with one grant as `admin`; its secret.
async fn create_token(admin: &Api, name: &str, role: pb::Role, pool: &str) -> String {
    let r = admin
        .access
        .clone()
        .create_token(pb::CreateTokenRequest {
            name: name.into(),
            grants: vec![grant(role, pool)],
        })
        .await
        .unwrap_or_else(|e| panic!("create token {name}: {e:?}"))
        .into_inner();
    assert!(r.secret.starts_with("pel_"), "secret {:?}", r.secret);
    let token = r.token.expect("token");
    assert_eq!(token.name, name);
    assert_eq!(token.grants, vec![grant(role, pool)]);
    r.secret
}

/// Pools `/a` and `/b`, each reserving room for its jobs.
async fn create_pools_a_and_b(admin: &Api) {
    for path in ["/a", "/b"] {
        admin
            .create_pool(path, pool_spec(4.0, 4096.0))
            .await
            .unwrap_or_else(|e| panic!("create pool {path}: {e:?}"));
    }
}

/// A job of two tasks that run for ten minutes (longer than any test).
fn long_job(pool: &str) -> pb::JobSpec {
    job_spec(pool, 2, 0.5, 600_000)
}

/// A job of one task that runs 50 ms and succeeds.
fn short_job(pool: &str) -> pb::JobSpec {
    job_spec(pool, 1, 0.5, 50)
}

/// Polls the job (as `api`) until it is in `want`.
async fn wait_state(api: &Api, id: &str, want: pb::JobState) -> pb::Job {
    eventually(
        &format!("job {id} to be {}", want.as_str_name()),
        TIMEOUT,
        async || {
            let job = api.get_job(id).await.map_err(|e| format!("{e:?}"))?;
            if job_state(&job) == want {
                Ok(job)
            } else {
                Err(format!("{:?}", job.status))
            }
        },
    )
    .await
}

/// Asserts `r` is PERMISSION_DENIED with exactly `who lacks permission
/// <permission> on pool <pool>`.
#[track_caller]
fn assert_denied<T: std::fmt::Debug>(
    r: Result<T, tonic::Status>,
    who: &str,
    permission: &str,
    pool: &str,
) {
    assert_status(
        r,
        Code::PermissionDenied,
        &format!("{who} lacks permission {permission} on pool {pool}"),
    );
}

/// The job a watch event is about.
fn job_of(e: &pb::Event) -> &str {
    match &e.kind {
        Some(pb::event::Kind::Job(j)) => &j.job_id,
        Some(pb::event::Kind::Task(t)) => &t.job_id,
        None => "",
    }
}

/// Whether `events` hold the job event of `job` reaching `state`.
fn has_job_state(events: &[pb::Event], job: &str, state: pb::JobState) -> bool {
    events.iter().any(|e| {
        matches!(&e.kind, Some(pb::event::Kind::Job(j)) if j.job_id == job && j.state() == state)
    })
}

/// Whether a gRPC method only reads (and so is never audited).
fn is_read(method: &str) -> bool {
    let m = method.rsplit('/').next().unwrap_or("");
    ["Get", "List", "Query", "Watch", "WhoAmI", "Logs", "Check"]
        .iter()
        .any(|r| m.starts_with(r))
}

// -------------------------------------------------------- HTTPS (the mirror)

/// An HTTP answer: status and JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Json,
}

/// One HTTP/1.1 call over TLS (ALPN `http/1.1`, trusting only the server's
/// CA), with `authorization: Bearer <token>` when given.
async fn https(s: &Secure, method: &str, path: &str, token: Option<&str>, body: &str) -> Answer {
    https_as(s, None, &[], method, path, token, body).await
}

/// [`https`], presenting the client certificate `identity` when given.
async fn https_as(
    s: &Secure,
    identity: Option<&peloton_tls::CertPair>,
    headers: &[(&str, &str)],
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Answer {
    let mut config = peloton_tls::client_config(&s.ca_pem, identity).expect("client TLS config");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let raw = within(&format!("HTTPS {method} {path}"), async {
        let tcp = tokio::net::TcpStream::connect(s.addr)
            .await
            .expect("connect");
        let name = ServerName::try_from("localhost").expect("a server name");
        let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Accept: application/json\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n",
            body.len()
        );
        if let Some(t) = token {
            request.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        tls.write_all(request.as_bytes()).await.expect("send");
        tls.flush().await.expect("flush");
        let mut raw = Vec::new();
        match tls.read_to_end(&mut raw).await {
            Ok(_) => {}
            // A peer closing without close_notify: what was read is all.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(e) => panic!("read the answer to {method} {path}: {e}"),
        }
        raw
    })
    .await;
    parse_http(&raw)
}

/// Parses a whole HTTP/1.1 answer (content-length or chunked body).
fn parse_http(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let mut lines = head.lines();
    let status_line = lines.next().expect("status line");
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status: u16 = status_line[9..12].parse().expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut out = String::new();
        let mut rest = rest;
        loop {
            let (size, after) = rest.split_once("\r\n").expect("chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        out
    } else {
        let len: usize = header("content-length")
            .expect("content-length or chunked")
            .parse()
            .expect("content-length");
        assert!(rest.len() >= len, "short body: {rest:?}");
        rest[..len].to_owned()
    };
    let body = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    Answer { status, body }
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_tls_with_a_valid_token_gets_in_but_the_health_check_is_open() {
    let s = Secure::start().await;
    let admin = s.admin();

    // Plaintext gRPC to the TLS port is never served, even with the
    // admin's token.
    let plain = within("a plaintext call to the TLS port", async {
        let channel = Endpoint::from_shared(format!("http://{}", s.addr))
            .expect("valid url")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        Api::new(channel, Some(&bearer(ADMIN_TOKEN)))
            .job_ids()
            .await
            .map_err(|e| format!("call: {e:?}"))
    })
    .await;
    assert!(plain.is_err(), "a plaintext client was served: {plain:?}");

    // A client that trusts another CA does not get a connection.
    let other = tempfile::tempdir().expect("temp dir");
    let other_ca = peloton_tls::ensure_local_ca(other.path()).expect("another CA");
    let stranger = within("a client trusting another CA", async {
        Endpoint::from_shared(format!("https://{}", s.addr))
            .expect("valid url")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&other_ca.ca_cert_pem))
                    .domain_name("localhost"),
            )
            .expect("tls config")
            .connect()
            .await
    })
    .await;
    assert!(stranger.is_err(), "a client trusting another CA connected");

    // No token: UNAUTHENTICATED, for reads and writes alike.
    let anon = s.client(None);
    assert_status(anon.job_ids().await, Code::Unauthenticated, "no token");
    assert_status(
        anon.create_pool("/a", pool_spec(1.0, 256.0)).await,
        Code::Unauthenticated,
        "no token",
    );
    assert_status(anon.who_am_i().await, Code::Unauthenticated, "no token");
    // A token the server never issued, and a header that is not a bearer
    // token.
    let garbage = s.as_token("pel_0123456789abcdef0123456789abcdef");
    assert_status(garbage.job_ids().await, Code::Unauthenticated, "not valid");
    assert_status(
        garbage.create_pool("/a", pool_spec(1.0, 256.0)).await,
        Code::Unauthenticated,
        "not valid",
    );
    let basic = s.client(Some(&format!("Basic {ADMIN_TOKEN}")));
    assert_status(
        basic.job_ids().await,
        Code::Unauthenticated,
        "Bearer <token>",
    );
    // Nothing of it was created.
    assert_eq!(admin.pool_paths().await.expect("list pools"), vec!["/"]);

    // The health check needs no token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(s.channel.clone());
    for service in ["", "peloton.v1.JobService"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health check of {service:?} without a token: {e:?}"))
            .into_inner();
        assert_eq!(
            r.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }

    // The bootstrap token is the cluster admin "admin".
    let me = admin.who_am_i().await.expect("whoami");
    assert_eq!(me.name, "admin");
    assert_eq!(me.grants, vec![grant(pb::Role::ClusterAdmin, "/")]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_created_listed_without_secrets_checked_and_revoked_at_once() {
    let s = Secure::start().await;
    let admin = s.admin();

    let alice = create_token(&admin, "alice", pb::Role::Submitter, "/a").await;
    let bob = create_token(&admin, "bob", pb::Role::Viewer, "/").await;
    assert_ne!(alice, bob);
    assert!(alice.len() >= 4 + 64, "256 random bits in hex: {alice}");

    // Listed by name, never with a secret: the Token message has no field
    // for one (this destructuring stops compiling if one is added), and no
    // secret is anywhere in the encoded answer.
    let r = admin
        .access
        .clone()
        .list_tokens(pb::ListTokensRequest {})
        .await
        .expect("list tokens")
        .into_inner();
    let wire = prost::Message::encode_to_vec(&r);
    for secret in [&alice, &bob] {
        assert!(
            !wire.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "ListTokens carries a secret"
        );
    }
    let mut names = Vec::new();
    for t in &r.tokens {
        let pb::Token {
            name,
            grants,
            created_at_ms,
            created_by,
            certificates,
        } = t;
        assert!(certificates.is_empty(), "{name}: certificates");
        assert_eq!(created_by, "admin", "{name}");
        assert!(*created_at_ms > 0, "{name}: created_at_ms");
        let want = match name.as_str() {
            "alice" => grant(pb::Role::Submitter, "/a"),
            "bob" => grant(pb::Role::Viewer, "/"),
            other => panic!("unexpected token {other}"),
        };
        assert_eq!(grants, &vec![want], "{name}");
        names.push(name.clone());
    }
    assert_eq!(names, vec!["alice", "bob"]);

    // WhoAmI: the token as listed.
    let a = s.as_token(&alice);
    let me = a.who_am_i().await.expect("alice whoami");
    assert_eq!(me.name, "alice");
    assert_eq!(me.grants, vec![grant(pb::Role::Submitter, "/a")]);
    assert_eq!(me.created_by, "admin");
    // (That it is the token exactly as listed, created_at_ms included, is
    // `whoami_shows_the_token_as_listed`'s.)

    // Refusals, each naming the field.
    let create = |name: &str, grants: Vec<pb::Grant>| {
        let mut c = admin.access.clone();
        let req = pb::CreateTokenRequest {
            name: name.into(),
            grants,
        };
        async move { c.create_token(req).await.map(|r| r.into_inner().token) }
    };
    let viewer_a = || vec![grant(pb::Role::Viewer, "/a")];
    assert_status(
        create("alice", viewer_a()).await,
        Code::AlreadyExists,
        "alice",
    );
    assert_status(
        create("a b", viewer_a()).await,
        Code::InvalidArgument,
        "name:",
    );
    assert_status(create("", viewer_a()).await, Code::InvalidArgument, "name:");
    assert_status(
        create("admin", viewer_a()).await,
        Code::InvalidArgument,
        "name:",
    );
    assert_status(
        create("unauthenticated", viewer_a()).await,
        Code::InvalidArgument,
        "reserved",
    );
    assert_status(
        create("carol", vec![]).await,
        Code::InvalidArgument,
        "grants:",
    );
    assert_status(
        create("carol", vec![grant(pb::Role::ClusterAdmin, "/a")]).await,
        Code::InvalidArgument,
        "grants[0].pool",
    );
    assert_status(
        create(
            "carol",
            vec![grant(pb::Role::Viewer, "/a"), grant(pb::Role::Viewer, "b")],
        )
        .await,
        Code::InvalidArgument,
        "grants[1].pool",
    );
    assert_status(
        create("carol", vec![grant(pb::Role::Viewer, "/a/")]).await,
        Code::InvalidArgument,
        "grants[0].pool",
    );
    assert_status(
        create(
            "carol",
            vec![pb::Grant {
                role: 99,
                pool: "/a".into(),
            }],
        )
        .await,
        Code::InvalidArgument,
        "grants[0].role",
    );
    assert_status(
        create("carol", vec![grant(pb::Role::Unspecified, "/a")]).await,
        Code::InvalidArgument,
        "grants[0].role",
    );
    // Only a cluster admin manages tokens.
    let b = s.as_token(&bob);
    for who in [&a, &b] {
        let name = who.who_am_i().await.expect("whoami").name;
        let cluster = format!("{name} lacks permission tokens.admin (cluster-wide)");
        assert_status(
            who.access
                .clone()
                .create_token(pb::CreateTokenRequest {
                    name: "carol".into(),
                    grants: viewer_a(),
                })
                .await,
            Code::PermissionDenied,
            &cluster,
        );
        assert_status(who.list_tokens().await, Code::PermissionDenied, &cluster);
        assert_status(who.revoke("alice").await, Code::PermissionDenied, &cluster);
    }
    // None of the refused calls created or revoked anything.
    let names: Vec<String> = admin
        .list_tokens()
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, vec!["alice", "bob"]);
    a.who_am_i().await.expect("alice still valid");

    // Revoking stops a token at once: its next call on a connection that
    // is already open is refused.
    let bob_channel = common::tls_channel_to(s.addr, &s.ca_pem).await;
    let b = Api::new(bob_channel, Some(&bearer(&bob)));
    assert_eq!(b.who_am_i().await.expect("bob whoami").name, "bob");
    b.job_ids().await.expect("bob reads");
    admin.revoke("bob").await.expect("revoke bob");
    assert_status(b.who_am_i().await, Code::Unauthenticated, "not valid");
    assert_status(b.job_ids().await, Code::Unauthenticated, "not valid");
    assert_status(admin.revoke("bob").await, Code::NotFound, "bob");
    // The bootstrap token is configuration, not revocable.
    assert_status(
        admin.revoke("admin").await,
        Code::FailedPrecondition,
        "name:",
    );
    assert_eq!(admin.who_am_i().await.expect("admin whoami").name, "admin");
    // A revoked name can be issued again, with a new secret; the old one
    // stays refused.
    let bob2 = create_token(&admin, "bob", pb::Role::Viewer, "/a").await;
    assert_ne!(bob2, bob);
    assert_status(b.who_am_i().await, Code::Unauthenticated, "not valid");
    let me = s.as_token(&bob2).who_am_i().await.expect("new bob");
    assert_eq!(me.grants, vec![grant(pb::Role::Viewer, "/a")]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_and_a_viewer_act_only_in_their_pool() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let sub = s.as_token(&create_token(&admin, "sub-a", pb::Role::Submitter, "/a").await);
    let view = s.as_token(&create_token(&admin, "view-a", pb::Role::Viewer, "/a").await);
    let jb = admin
        .create_job(long_job("/b"))
        .await
        .expect("admin creates in /b");
    wait_state(&admin, &jb.id, pb::JobState::Running).await;

    // The submitter runs jobs in /a.
    let ja = sub
        .create_job(long_job("/a"))
        .await
        .expect("sub creates in /a");
    assert_eq!(ja.spec.as_ref().expect("spec").pool, "/a");
    wait_state(&sub, &ja.id, pb::JobState::Running).await;
    let b_before = admin.get_job(&jb.id).await.expect("jb");

    // ... and nothing in /b: each refusal names the permission and /b.
    assert_denied(
        sub.create_job(long_job("/b")).await,
        "sub-a",
        "jobs.write",
        "/b",
    );
    assert_denied(sub.kill(&jb.id).await, "sub-a", "jobs.write", "/b");
    assert_denied(sub.scale(&jb.id, 5).await, "sub-a", "jobs.write", "/b");
    assert_denied(sub.restart_job(&jb.id).await, "sub-a", "jobs.write", "/b");
    assert_denied(sub.delete_job(&jb.id).await, "sub-a", "jobs.write", "/b");
    assert_denied(sub.get_job(&jb.id).await, "sub-a", "jobs.read", "/b");
    assert_denied(sub.list_tasks(&jb.id).await, "sub-a", "jobs.read", "/b");
    assert_denied(
        sub.tasks
            .clone()
            .kill(pb::KillTaskRequest {
                job_id: jb.id.clone(),
                instances: vec![0],
                job_version: 0,
            })
            .await,
        "sub-a",
        "jobs.write",
        "/b",
    );
    assert_denied(sub.watch(0, &jb.id).await, "sub-a", "jobs.read", "/b");
    // A job nobody knows: the submitter, who could not act on it anywhere
    // but /a, is told NOT_FOUND (as the admin is, by the loop).
    let unknown = "00000000-0000-4000-8000-000000000000";
    assert_status(sub.kill(unknown).await, Code::NotFound, unknown);
    assert_status(sub.get_job(unknown).await, Code::NotFound, unknown);
    assert_status(admin.kill(unknown).await, Code::NotFound, unknown);
    // No hosts, no pools, no tokens.
    assert_status(
        sub.hosts
            .clone()
            .start_maintenance(pb::StartMaintenanceRequest {
                hosts: vec!["sim-00000".into()],
            })
            .await,
        Code::PermissionDenied,
        "sub-a lacks permission hosts.write (cluster-wide)",
    );
    assert_denied(
        sub.create_pool("/a/x", pool_spec(0.0, 0.0)).await,
        "sub-a",
        "pools.write",
        "/a/x",
    );
    assert_denied(
        sub.create_pool("/c", pool_spec(0.0, 0.0)).await,
        "sub-a",
        "pools.write",
        "/c",
    );

    // Reads are filtered to /a.
    assert_eq!(sub.job_ids().await.expect("sub query"), vec![ja.id.clone()]);
    let in_b = sub
        .jobs
        .clone()
        .query(pb::QueryJobsRequest {
            pool: "/b".into(),
            ..Default::default()
        })
        .await
        .expect("sub queries /b")
        .into_inner();
    assert!(in_b.jobs.is_empty(), "{in_b:?}");
    assert_eq!(sub.pool_paths().await.expect("sub pools"), vec!["/a"]);
    assert_denied(
        sub.pools
            .clone()
            .get(pb::GetPoolRequest { path: "/b".into() })
            .await,
        "sub-a",
        "pools.read",
        "/b",
    );
    // Hosts are for everyone to see.
    let hosts = sub
        .hosts
        .clone()
        .list(pb::ListHostsRequest::default())
        .await
        .expect("sub lists hosts")
        .into_inner()
        .hosts;
    assert_eq!(hosts.len(), SIM_HOSTS as usize);
    assert!(
        hosts.iter().all(|h| h.state() == pb::HostState::Up),
        "{hosts:?}"
    );

    // The viewer of /a reads it ...
    let ja_now = view.get_job(&ja.id).await.expect("viewer gets ja");
    assert_eq!(ja_now.id, ja.id);
    assert_eq!(
        view.job_ids().await.expect("viewer query"),
        vec![ja.id.clone()]
    );
    assert_eq!(
        view.list_tasks(&ja.id).await.expect("viewer tasks").len(),
        2
    );
    assert_eq!(view.pool_paths().await.expect("viewer pools"), vec!["/a"]);
    // ... and changes nothing in it.
    assert_denied(
        view.create_job(long_job("/a")).await,
        "view-a",
        "jobs.write",
        "/a",
    );
    assert_denied(view.kill(&ja.id).await, "view-a", "jobs.write", "/a");
    assert_denied(view.scale(&ja.id, 5).await, "view-a", "jobs.write", "/a");
    assert_denied(view.restart_job(&ja.id).await, "view-a", "jobs.write", "/a");
    assert_denied(view.delete_job(&ja.id).await, "view-a", "jobs.write", "/a");
    assert_denied(view.get_job(&jb.id).await, "view-a", "jobs.read", "/b");
    let ja_after = admin.get_job(&ja.id).await.expect("ja");
    assert_eq!(ja_after.version, ja_now.version, "a viewer changed ja");
    assert_eq!(ja_after.spec, ja_now.spec);
    assert_eq!(job_state(&ja_after), pb::JobState::Running);
    assert_eq!(admin.job_ids().await.expect("admin query").len(), 2);

    // The submitter's own job: scaled and killed.
    let scaled = sub
        .scale(&ja.id, 3)
        .await
        .expect("sub scales ja")
        .job
        .expect("job");
    assert_eq!(scaled.spec.as_ref().expect("spec").instance_count, 3);
    assert!(scaled.version > ja_after.version);
    sub.kill(&ja.id).await.expect("sub kills ja");
    wait_state(&sub, &ja.id, pb::JobState::Killed).await;

    // And the job in /b is as it was.
    let b_after = admin.get_job(&jb.id).await.expect("jb");
    assert_eq!(
        b_after.version, b_before.version,
        "a refused call changed jb"
    );
    assert_eq!(b_after.spec, b_before.spec);
    assert_eq!(job_state(&b_after), pb::JobState::Running);
    assert!(!b_after.status.expect("status").kill_requested);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_admin_configures_only_the_pools_below_its_own() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let pa = s.as_token(&create_token(&admin, "pa-a", pb::Role::PoolAdmin, "/a").await);

    pa.create_pool("/a/x", pool_spec(1.0, 256.0))
        .await
        .expect("a pool admin of /a creates /a/x");
    // Its own pool's share is its parent's business.
    assert_denied(
        pa.pools
            .clone()
            .update(pb::UpdatePoolRequest {
                path: "/a".into(),
                spec: Some(pool_spec(8.0, 8192.0)),
                version: 0,
            })
            .await,
        "pa-a",
        "pools.write",
        "/a",
    );
    assert_denied(
        pa.create_pool("/b/x", pool_spec(0.0, 0.0)).await,
        "pa-a",
        "pools.write",
        "/b/x",
    );
    // A grant on /a does not cover /ab.
    assert_denied(
        pa.create_pool("/ab", pool_spec(0.0, 0.0)).await,
        "pa-a",
        "pools.write",
        "/ab",
    );
    assert_eq!(pa.pool_paths().await.expect("pools"), vec!["/a", "/a/x"]);
    // A pool admin also runs jobs in its subtree.
    pa.create_job(short_job("/a/x"))
        .await
        .expect("a pool admin of /a runs a job in /a/x");
    assert_eq!(
        admin.pool_paths().await.expect("pools"),
        vec!["/", "/a", "/a/x", "/b"]
    );
    let a = admin
        .pools
        .clone()
        .get(pb::GetPoolRequest { path: "/a".into() })
        .await
        .expect("get /a")
        .into_inner()
        .pool
        .expect("pool");
    assert_eq!(a.version, 1, "a refused update changed /a");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_watches_only_the_events_of_its_pools_jobs() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let view = s.as_token(&create_token(&admin, "view-a", pb::Role::Viewer, "/a").await);

    // Watching from now, before either job exists.
    let mut live = view.watch(0, "").await.expect("viewer watches");
    // /b's job runs to its end before /a's starts: every event of it comes
    // before any of /a's job in revision order, so once /a's job's last
    // event arrived, any event of /b's job would have too.
    let jb = admin.create_job(short_job("/b")).await.expect("job in /b");
    wait_state(&admin, &jb.id, pb::JobState::Succeeded).await;
    let ja = admin.create_job(short_job("/a")).await.expect("job in /a");
    let events = collect_events(&mut live, |e| {
        has_job_state(e, &ja.id, pb::JobState::Succeeded)
    })
    .await;
    let check = |events: &[pb::Event], what: &str| {
        let strangers: Vec<&pb::Event> = events.iter().filter(|e| job_of(e) != ja.id).collect();
        assert!(
            strangers.is_empty(),
            "{what}: events not of /a's job: {strangers:#?}"
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(&e.kind, Some(pb::event::Kind::Task(t)) if t.job_id == ja.id)),
            "{what}: no task event of /a's job: {events:#?}"
        );
        for w in events.windows(2) {
            assert!(
                w[0].revision < w[1].revision,
                "{what}: revisions out of order"
            );
        }
    };
    check(&events, "live");

    // Replayed from the first revision: the same filter.
    let mut replay = view.watch(1, "").await.expect("viewer replays");
    let events = collect_events(&mut replay, |e| {
        has_job_state(e, &ja.id, pb::JobState::Succeeded)
    })
    .await;
    check(&events, "replay");
    // The admin's replay holds /b's job (what the filter took out).
    let mut all = admin.watch(1, "").await.expect("admin replays");
    let events = collect_events(&mut all, |e| {
        has_job_state(e, &ja.id, pb::JobState::Succeeded)
    })
    .await;
    assert!(
        has_job_state(&events, &jb.id, pb::JobState::Succeeded),
        "the admin sees /b's job: {events:#?}"
    );

    // One job's watch: /a's allowed, /b's refused.
    let mut one = view.watch(1, &ja.id).await.expect("viewer watches ja");
    collect_events(&mut one, |e| {
        has_job_state(e, &ja.id, pb::JobState::Succeeded)
    })
    .await;
    assert_denied(view.watch(1, &jb.id).await, "view-a", "jobs.read", "/b");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_records_every_mutating_call_and_its_outcome() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let sub = s.as_token(&create_token(&admin, "sub-a", pb::Role::Submitter, "/a").await);
    let view = s.as_token(&create_token(&admin, "view-a", pb::Role::Viewer, "/a").await);
    let jb = admin.create_job(long_job("/b")).await.expect("job in /b");
    let ja = sub.create_job(long_job("/a")).await.expect("job in /a");
    assert_denied(sub.kill(&jb.id).await, "sub-a", "jobs.write", "/b");
    assert_status(
        s.client(None).create_pool("/z", pool_spec(0.0, 0.0)).await,
        Code::Unauthenticated,
        "no token",
    );
    // Reads, allowed and refused: never audited.
    view.get_job(&ja.id).await.expect("viewer reads ja");
    view.job_ids().await.expect("viewer queries");
    sub.who_am_i().await.expect("whoami");
    assert_status(
        sub.audit("", 0, 0).await,
        Code::PermissionDenied,
        "sub-a lacks permission audit.read (cluster-wide)",
    );
    assert_status(
        view.audit("", 0, 0).await,
        Code::PermissionDenied,
        "view-a lacks permission audit.read (cluster-wide)",
    );

    let log = admin.audit("", 1000, 0).await.expect("list audit");
    let find = |principal: &str, method: &str, target: &str| {
        log.iter()
            .find(|e| e.principal == principal && e.method == method && e.target == target)
            .unwrap_or_else(|| panic!("no entry {principal} {method} {target:?} in {log:#?}"))
    };
    let denied = find("sub-a", "/peloton.v1.JobService/Kill", &jb.id);
    assert_eq!(denied.code, Code::PermissionDenied as i32);
    assert_eq!(
        denied.message,
        "sub-a lacks permission jobs.write on pool /b"
    );
    let name = |j: &pb::Job| j.spec.as_ref().expect("spec").name.clone();
    let created = find(
        "sub-a",
        "/peloton.v1.JobService/Create",
        &format!("/a {}", name(&ja)),
    );
    assert_eq!(created.code, 0);
    assert_eq!(created.message, "");
    assert!(created.seq < denied.seq, "the create came first");
    let anon = find(
        "unauthenticated",
        "/peloton.v1.ResourcePoolService/Create",
        "",
    );
    assert_eq!(anon.code, Code::Unauthenticated as i32);
    assert!(anon.message.contains("no token"), "{anon:?}");
    let token = find("admin", "/peloton.v1.AccessService/CreateToken", "sub-a");
    assert_eq!(token.code, 0);
    let pool = find("admin", "/peloton.v1.ResourcePoolService/Create", "/b");
    assert_eq!(pool.code, 0);
    find(
        "admin",
        "/peloton.v1.JobService/Create",
        &format!("/b {}", name(&jb)),
    );
    // Exactly the mutating calls made: 2 pools, 2 tokens, 2 jobs, the
    // refused kill and the unauthenticated pool; no read.
    assert_eq!(log.len(), 8, "{log:#?}");
    let reads: Vec<&pb::AuditEntry> = log.iter().filter(|e| is_read(&e.method)).collect();
    assert!(reads.is_empty(), "reads audited: {reads:#?}");
    // Newest first, sequence numbers strictly decreasing, times set.
    assert_eq!(
        log[0].seq, anon.seq,
        "the unauthenticated call was the last"
    );
    for w in log.windows(2) {
        assert!(w[0].seq > w[1].seq, "not newest first: {w:#?}");
        assert!(w[0].time_ms >= w[1].time_ms, "time goes back: {w:#?}");
    }
    assert!(log.iter().all(|e| e.time_ms > 0));

    // One principal's entries.
    let subs = admin.audit("sub-a", 0, 0).await.expect("sub-a's entries");
    let want: Vec<pb::AuditEntry> = log
        .iter()
        .filter(|e| e.principal == "sub-a")
        .cloned()
        .collect();
    assert_eq!(subs, want);
    assert_eq!(subs.len(), 2);
    assert!(admin.audit("nobody", 0, 0).await.expect("none").is_empty());
    // Paging: a limit, and entries before a sequence number.
    let newest = admin.audit("", 1, 0).await.expect("limit 1");
    assert_eq!(newest, log[..1].to_vec());
    let older = admin.audit("", 3, log[2].seq).await.expect("before");
    assert_eq!(older, log[3..6].to_vec());
    assert_eq!(admin.audit("", 1000, 0).await.expect("limit 1000"), log);
    assert_status(
        admin.audit("", 1001, 0).await,
        Code::InvalidArgument,
        "limit",
    );
    // Listing the log is itself not audited.
    assert_eq!(admin.audit("", 1000, 0).await.expect("again"), log);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_revocations_job_pools_and_the_audit_log_survive_a_restart() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let keep = create_token(&admin, "keep", pb::Role::Submitter, "/a").await;
    let gone = create_token(&admin, "gone", pb::Role::Viewer, "/").await;
    admin.revoke("gone").await.expect("revoke");
    let jb = admin.create_job(long_job("/b")).await.expect("job in /b");
    let ja = s
        .as_token(&keep)
        .create_job(long_job("/a"))
        .await
        .expect("keep's job");
    assert_denied(
        s.as_token(&keep).kill(&jb.id).await,
        "keep",
        "jobs.write",
        "/b",
    );
    let before = admin.audit("", 1000, 0).await.expect("audit");
    let last_seq = before[0].seq;
    let ca_before = s.ca_pem.clone();

    let s = s.restart().await;
    assert_eq!(s.ca_pem, ca_before, "the private CA is kept");
    let admin = s.admin();
    let k = s.as_token(&keep);
    let me = k.who_am_i().await.expect("keep still works");
    assert_eq!(me.name, "keep");
    assert_eq!(me.grants, vec![grant(pb::Role::Submitter, "/a")]);
    assert_status(
        s.as_token(&gone).who_am_i().await,
        Code::Unauthenticated,
        "not valid",
    );
    let names: Vec<String> = admin
        .list_tokens()
        .await
        .expect("tokens")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, vec!["keep"]);
    // Jobs' pools are known again: /b's job is refused by name, not
    // unknown; /a's is keep's to read.
    assert_denied(k.kill(&jb.id).await, "keep", "jobs.write", "/b");
    assert_eq!(
        k.job_ids().await.expect("keep's query"),
        vec![ja.id.clone()]
    );

    // The log holds every earlier entry as it was, and goes on after them.
    let after = admin.audit("", 1000, 0).await.expect("audit after restart");
    let old: Vec<pb::AuditEntry> = after
        .iter()
        .filter(|e| e.seq <= last_seq)
        .cloned()
        .collect();
    assert_eq!(old, before, "entries lost or changed by the restart");
    let new = &after[..after.len() - old.len()];
    assert_eq!(new.len(), 1, "only the refused kill since: {new:#?}");
    assert_eq!(new[0].principal, "keep");
    assert_eq!(new[0].method, "/peloton.v1.JobService/Kill");
    assert_eq!(new[0].code, Code::PermissionDenied as i32);
    assert!(new[0].seq > last_seq);
    create_token(&admin, "later", pb::Role::Viewer, "/b").await;
    let newest = &admin.audit("", 1, 0).await.expect("newest")[0];
    assert_eq!(newest.method, "/peloton.v1.AccessService/CreateToken");
    assert_eq!(newest.target, "later");
    assert!(newest.seq > new[0].seq);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_mirror_over_tls_wants_a_token_and_filters_alike() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let view = create_token(&admin, "view-a", pb::Role::Viewer, "/a").await;
    let ja = admin.create_job(long_job("/a")).await.expect("job in /a");
    let jb = admin.create_job(long_job("/b")).await.expect("job in /b");

    let ids = |a: &Answer| -> Vec<String> {
        let mut ids: Vec<String> = a.body["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("no jobs: {a:?}"))
            .iter()
            .map(|j| j["id"].as_str().expect("id").to_owned())
            .collect();
        ids.sort();
        ids
    };
    let paths = |a: &Answer| -> Vec<String> {
        a.body["pools"]
            .as_array()
            .unwrap_or_else(|| panic!("no pools: {a:?}"))
            .iter()
            .map(|p| p["path"].as_str().expect("path").to_owned())
            .collect()
    };

    // A viewer of /a: /a's job and pool only, as over gRPC.
    let jobs = https(&s, "GET", "/v1/jobs", Some(&view), "").await;
    assert_eq!(jobs.status, 200, "{jobs:?}");
    assert_eq!(ids(&jobs), vec![ja.id.clone()]);
    let pools = https(&s, "GET", "/v1/pools", Some(&view), "").await;
    assert_eq!(pools.status, 200, "{pools:?}");
    assert_eq!(paths(&pools), vec!["/a"]);
    let refused = https(&s, "GET", &format!("/v1/jobs/{}", jb.id), Some(&view), "").await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(refused.body["error"]["status"], "PERMISSION_DENIED");
    assert_eq!(
        refused.body["error"]["message"],
        "view-a lacks permission jobs.read on pool /b"
    );
    let kill = https(
        &s,
        "POST",
        &format!("/v1/jobs/{}/kill", ja.id),
        Some(&view),
        "{}",
    )
    .await;
    assert_eq!(kill.status, 403, "{kill:?}");
    // The admin sees both.
    let all = https(&s, "GET", "/v1/jobs", Some(ADMIN_TOKEN), "").await;
    assert_eq!(all.status, 200, "{all:?}");
    let mut both = vec![ja.id.clone(), jb.id.clone()];
    both.sort();
    assert_eq!(ids(&all), both);

    // No token, or one never issued: 401 UNAUTHENTICATED.
    for token in [None, Some("pel_0123456789abcdef0123456789abcdef")] {
        for path in ["/v1/jobs", "/v1/pools"] {
            let a = https(&s, "GET", path, token, "").await;
            assert_eq!(a.status, 401, "{path} {token:?}: {a:?}");
            assert_eq!(a.body["error"]["status"], "UNAUTHENTICATED", "{a:?}");
        }
    }
    let a = https(&s, "POST", &format!("/v1/jobs/{}/kill", ja.id), None, "{}").await;
    assert_eq!(a.status, 401, "{a:?}");
    // The health probe needs none.
    let health = https(&s, "GET", "/v1/health", None, "").await;
    assert_eq!(health.status, 200, "{health:?}");

    // Nothing was killed; HTTP calls are audited as their gRPC method.
    let ja_now = admin.get_job(&ja.id).await.expect("ja");
    assert!(!ja_now.status.expect("status").kill_requested);
    let log = admin.audit("", 1000, 0).await.expect("audit");
    let kills: Vec<(&str, i32)> = log
        .iter()
        .filter(|e| e.method == "/peloton.v1.JobService/Kill")
        .map(|e| (e.principal.as_str(), e.code))
        .collect();
    assert_eq!(
        kills,
        vec![
            ("unauthenticated", Code::Unauthenticated as i32),
            ("view-a", Code::PermissionDenied as i32)
        ]
    );

    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = within("plain HTTP to the TLS port", async {
        let mut tcp = tokio::net::TcpStream::connect(s.addr)
            .await
            .expect("connect");
        tcp.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut raw = Vec::new();
        let _ = tcp.read_to_end(&mut raw).await;
        raw
    })
    .await;
    assert!(
        !plain.starts_with(b"HTTP/"),
        "plain HTTP was answered: {:?}",
        String::from_utf8_lossy(&plain)
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_shows_the_token_as_listed() {
    let s = Secure::start().await;
    let admin = s.admin();
    let secret = create_token(&admin, "alice", pb::Role::Submitter, "/a").await;
    let listed = admin.list_tokens().await.expect("tokens");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].created_at_ms > 0);
    let me = s.as_token(&secret).who_am_i().await.expect("whoami");
    assert_eq!(me, listed[0], "WhoAmI differs from ListTokens");
    let s = s.restart().await;
    let me = s
        .as_token(&secret)
        .who_am_i()
        .await
        .expect("whoami after restart");
    assert_eq!(
        me, listed[0],
        "WhoAmI differs from ListTokens after a restart"
    );
    s.shutdown().await;
}

/// A viewer's watch must carry the deletion of its own pool's job (the
/// admin's does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_the_deletion_of_its_pools_job() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let view = s.as_token(&create_token(&admin, "view-a", pb::Role::Viewer, "/a").await);
    let mut live = view.watch(0, "").await.expect("viewer watches");
    let mut all = admin.watch(0, "").await.expect("admin watches");
    let ja = admin.create_job(short_job("/a")).await.expect("job in /a");
    let done = wait_state(&admin, &ja.id, pb::JobState::Succeeded).await;
    admin
        .jobs
        .clone()
        .delete(pb::DeleteJobRequest {
            id: ja.id.clone(),
            version: done.version,
        })
        .await
        .expect("delete ja");
    let deleted = |events: &[pb::Event]| {
        events.iter().any(
            |e| matches!(&e.kind, Some(pb::event::Kind::Job(j)) if j.job_id == ja.id && j.deleted),
        )
    };
    collect_events(&mut all, deleted).await;
    collect_events(&mut live, deleted).await;
    s.shutdown().await;
}

/// A revoked token's open watch ends at its next message, UNAUTHENTICATED.
/// Reads a watch until it ends; the error it must end with.
async fn watch_end(live: &mut tonic::Streaming<pb::WatchResponse>) -> tonic::Status {
    let end = within("the watch to end", async {
        loop {
            match live.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await;
    end.expect_err("the stream ends with an error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_open_watch() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let view = s.as_token(&create_token(&admin, "view-a", pb::Role::Viewer, "/a").await);
    let mut live = view.watch(0, "").await.expect("viewer watches");
    let first = admin.create_job(short_job("/a")).await.expect("job in /a");
    collect_events(&mut live, |events| {
        events.iter().any(|e| job_of(e) == first.id)
    })
    .await;
    admin.revoke("view-a").await.expect("revoke");
    admin
        .create_job(short_job("/a"))
        .await
        .expect("another job in /a");
    let e = watch_end(&mut live).await;
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("revoked"), "{e:?}");
    s.shutdown().await;
}

/// Calls without a token are audited at a bounded rate: anyone can make
/// them, and they must not flush the log's history. The next kept entry
/// counts those not logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_calls_cannot_flood_the_audit_log() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let stranger = s.client(None);
    for _ in 0..200 {
        let e = stranger
            .create_job(short_job("/a"))
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Code::Unauthenticated);
    }
    let entries = admin
        .audit("unauthenticated", 1000, 0)
        .await
        .expect("audit");
    // 20 a second at most; the calls may straddle a second or two.
    assert!(
        entries.len() <= 3 * peloton_gateway::audit::MAX_UNAUTHENTICATED_AUDITS_PER_S as usize,
        "{} entries",
        entries.len()
    );
    // Later, one entry says how many were not logged.
    eventually(
        "an entry counting the calls not logged",
        TIMEOUT,
        async || {
            let _ = stranger.create_job(short_job("/a")).await;
            let entries = admin
                .audit("unauthenticated", 1000, 0)
                .await
                .map_err(|e| e.to_string())?;
            entries
                .iter()
                .find(|e| e.target.contains("were not logged"))
                .map(|_| ())
                .ok_or_else(|| "no entry counts the dropped ones yet".to_owned())
        },
    )
    .await;
    // The admin's own entries are all still there.
    let mine = admin.audit("admin", 1000, 0).await.expect("audit");
    assert!(mine.len() >= 2, "{mine:?}");
    s.shutdown().await;
}

// ------------------------------------------------ client certificates

/// Asks the server (as `api`) to sign a new key's request for the token
/// `name`; the answer and the key (PEM).
async fn issue_cert(
    api: &Api,
    name: &str,
    days: u32,
) -> Result<(pb::IssueCertificateResponse, String), tonic::Status> {
    let csr = peloton_tls::user_csr(name).expect("a key and a request");
    let issued = api
        .access
        .clone()
        .issue_certificate(pb::IssueCertificateRequest {
            name: name.into(),
            csr_pem: csr.csr_pem,
            valid_days: days,
        })
        .await?
        .into_inner();
    Ok((issued, csr.key_pem))
}

/// Clients presenting a client certificate (and no bearer header), on a
/// connection of their own.
async fn as_cert(s: &Secure, cert_pem: &str, key_pem: &str) -> Api {
    let channel = tls_channel_as(s.addr, &s.ca_pem, cert_pem, key_pem)
        .await
        .expect("a TLS connection with a client certificate");
    Api::new(channel, None)
}

/// The fingerprints listed with the token `name`.
async fn listed_certs(admin: &Api, name: &str) -> Vec<String> {
    admin
        .list_tokens()
        .await
        .expect("tokens")
        .into_iter()
        .find(|t| t.name == name)
        .map(|t| t.certificates.into_iter().map(|c| c.fingerprint).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_issued_for_a_token_acts_as_it_until_revoked() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let alice = create_token(&admin, "alice", pb::Role::Submitter, "/a").await;

    // Issued: signed by the server's CA, recorded with the token.
    let (first, first_key) = issue_cert(&admin, "alice", 0).await.expect("issue");
    assert_eq!(first.ca_pem, s.ca_pem);
    let c1 = first.certificate.clone().expect("certificate");
    assert_eq!(c1.fingerprint.len(), 64, "{c1:?}");
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let days = (c1.not_after_ms - now_ms) as f64 / 86_400_000.0;
    assert!(
        (89.9..=90.1).contains(&days),
        "default validity: {days} days"
    );
    assert!(c1.issued_at_ms > 0 && c1.issued_at_ms <= now_ms + 1000);
    assert_eq!(
        listed_certs(&admin, "alice").await,
        vec![c1.fingerprint.clone()]
    );
    let audit = admin.audit("admin", 1, 0).await.expect("audit");
    assert_eq!(
        audit[0].method,
        "/peloton.v1.AccessService/IssueCertificate"
    );
    assert_eq!(audit[0].target, format!("alice {}", c1.fingerprint));

    // With it and no header, a call is alice's: her grants, her audit entries.
    let by_cert = as_cert(&s, &first.certificate_pem, &first_key).await;
    let me = by_cert.who_am_i().await.expect("whoami with a certificate");
    assert_eq!(me.name, "alice");
    assert_eq!(me.grants, vec![grant(pb::Role::Submitter, "/a")]);
    by_cert
        .create_job(short_job("/a"))
        .await
        .expect("alice's job in /a, by certificate");
    assert_denied(
        by_cert.create_job(short_job("/b")).await,
        "alice",
        "jobs.write",
        "/b",
    );
    let newest = admin.audit("alice", 2, 0).await.expect("audit");
    assert_eq!(newest.len(), 2, "{newest:#?}");
    assert_eq!(newest[0].code, Code::PermissionDenied as i32);
    assert_eq!(newest[1].method, "/peloton.v1.JobService/Create");
    assert_eq!(newest[1].code, Code::Ok as i32);
    // A bearer header wins over the certificate.
    let channel = tls_channel_as(s.addr, &s.ca_pem, &first.certificate_pem, &first_key)
        .await
        .expect("connect");
    let both = Api::new(channel, Some(&bearer(ADMIN_TOKEN)));
    assert_eq!(both.who_am_i().await.expect("admin").name, "admin");
    // The JSON mirror takes the certificate alike.
    let pair = peloton_tls::CertPair {
        cert_pem: first.certificate_pem.clone(),
        key_pem: first_key.clone(),
    };
    let a = https_as(&s, Some(&pair), &[], "GET", "/v1/whoami", None, "").await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body["token"]["name"], "alice", "{a:?}");
    let a = https_as(&s, Some(&pair), &[], "GET", "/v1/tokens", None, "").await;
    assert_eq!(a.status, 403, "{a:?}");
    // But not from a browser: another site's page could use a certificate
    // the browser holds (a forged request), so browsers need a token.
    for header in [
        ("Origin", "https://elsewhere.example"),
        ("Sec-Fetch-Site", "cross-site"),
    ] {
        let a = https_as(&s, Some(&pair), &[header], "POST", "/v1/jobs", None, "{}").await;
        assert_eq!(a.status, 401, "{header:?}: {a:?}");
    }

    // Bad requests name the field and change nothing.
    assert_status(
        issue_cert(&s.as_token(&alice), "alice", 0).await,
        Code::PermissionDenied,
        "alice lacks permission tokens.admin",
    );
    assert_status(
        issue_cert(&admin, "nobody", 0).await,
        Code::NotFound,
        "token nobody",
    );
    assert_status(
        issue_cert(&admin, "alice", 366).await,
        Code::InvalidArgument,
        "valid_days",
    );
    assert_status(
        issue_cert(&admin, "admin", 0).await,
        Code::FailedPrecondition,
        "bootstrap admin",
    );
    let junk = admin
        .access
        .clone()
        .issue_certificate(pb::IssueCertificateRequest {
            name: "alice".into(),
            csr_pem: "-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n".into(),
            valid_days: 0,
        })
        .await;
    assert_status(junk, Code::InvalidArgument, "csr_pem");
    let revoke = |name: &str, fingerprint: &str| {
        let mut access = admin.access.clone();
        let r = pb::RevokeCertificateRequest {
            name: name.into(),
            fingerprint: fingerprint.into(),
        };
        async move { access.revoke_certificate(r).await }
    };
    assert_status(
        revoke("alice", "xyz").await,
        Code::InvalidArgument,
        "fingerprint",
    );
    assert_status(
        revoke("alice", &"0".repeat(64)).await,
        Code::NotFound,
        "no certificate",
    );
    assert_status(
        revoke("nobody", &c1.fingerprint).await,
        Code::NotFound,
        "token nobody",
    );
    assert_eq!(
        listed_certs(&admin, "alice").await,
        vec![c1.fingerprint.clone()]
    );

    // A certificate the server's own CA signed for "user:alice" but that was
    // never issued through the API is not alice: only recorded ones count.
    let ca = peloton_tls::ensure_local_ca(&s.data_dir.join("tls")).expect("the server's CA");
    let forged_csr = peloton_tls::user_csr("alice").expect("a request");
    let forged = ca
        .sign_user_csr("alice", &forged_csr.csr_pem, 1)
        .expect("signed");
    let unrecorded = as_cert(&s, &forged.cert_pem, &forged_csr.key_pem).await;
    assert_status(
        unrecorded.who_am_i().await,
        Code::Unauthenticated,
        "not recorded",
    );
    // One from another CA does not get through the TLS handshake.
    let other_ca = tempfile::tempdir().expect("temp dir");
    let other = peloton_tls::ensure_local_ca(other_ca.path()).expect("another CA");
    let stranger = other
        .sign_user_csr("alice", &forged_csr.csr_pem, 1)
        .expect("signed");
    let handshake = async {
        let channel =
            tls_channel_as(s.addr, &s.ca_pem, &stranger.cert_pem, &forged_csr.key_pem).await?;
        Api::new(channel, None)
            .who_am_i()
            .await
            .map_err(|e| e.to_string())
    };
    assert!(
        handshake.await.is_err(),
        "a certificate of another CA was accepted"
    );

    // A second certificate; revoking the first refuses it at once, on its
    // open connection, and leaves the second working.
    let (second, second_key) = issue_cert(&admin, "alice", 7).await.expect("issue");
    let c2 = second.certificate.clone().expect("certificate");
    let by_second = as_cert(&s, &second.certificate_pem, &second_key).await;
    assert_eq!(by_second.who_am_i().await.expect("second").name, "alice");
    // Both watch; revoking the first ends its watch, not the second's.
    let mut live_first = by_cert.watch(0, "").await.expect("watch by the first");
    let mut live_second = by_second.watch(0, "").await.expect("watch by the second");
    revoke("alice", &c1.fingerprint)
        .await
        .expect("revoke the first");
    let marker = admin
        .create_job(short_job("/a"))
        .await
        .expect("a job in /a");
    let e = watch_end(&mut live_first).await;
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    collect_events(&mut live_second, |events| {
        events.iter().any(|e| job_of(e) == marker.id)
    })
    .await;
    drop(live_second);
    assert_status(
        by_cert.who_am_i().await,
        Code::Unauthenticated,
        "not recorded",
    );
    assert_eq!(by_second.who_am_i().await.expect("second").name, "alice");
    assert_eq!(
        listed_certs(&admin, "alice").await,
        vec![c2.fingerprint.clone()]
    );
    // (the marker job came after the revocation)
    let audit = admin.audit("admin", 2, 0).await.expect("audit");
    assert_eq!(
        audit[1].method,
        "/peloton.v1.AccessService/RevokeCertificate"
    );
    assert_eq!(audit[1].target, format!("alice {}", c1.fingerprint));

    // At most 16 unexpired certificates per token; the 17th is refused
    // and changes nothing.
    for _ in 1..16 {
        issue_cert(&admin, "alice", 1)
            .await
            .expect("under the limit");
    }
    assert_eq!(listed_certs(&admin, "alice").await.len(), 16);
    assert_status(
        issue_cert(&admin, "alice", 1).await,
        Code::ResourceExhausted,
        "16 certificates",
    );
    assert_eq!(listed_certs(&admin, "alice").await.len(), 16);

    // Kept across a restart.
    let s = s.restart().await;
    let admin = s.admin();
    let by_second = as_cert(&s, &second.certificate_pem, &second_key).await;
    assert_eq!(
        by_second.who_am_i().await.expect("after restart").name,
        "alice"
    );
    let by_first = as_cert(&s, &first.certificate_pem, &first_key).await;
    assert_status(
        by_first.who_am_i().await,
        Code::Unauthenticated,
        "not recorded",
    );

    // Revoking the token refuses its certificates at once; a new token of
    // the same name does not bring them back.
    admin.revoke("alice").await.expect("revoke alice");
    assert_status(
        by_second.who_am_i().await,
        Code::Unauthenticated,
        "not recorded",
    );
    create_token(&admin, "alice", pb::Role::Viewer, "/").await;
    assert_status(
        by_second.who_am_i().await,
        Code::Unauthenticated,
        "not recorded",
    );
    assert!(listed_certs(&admin, "alice").await.is_empty());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_its_own_client_ca_signs_only_when_given_its_key() {
    // The tests' CA plays an operator's client CA (--tls-client-ca).
    let pki = peloton_tls::testkit::shared();
    let ca_pem = std::fs::read_to_string(&pki.ca_file).expect("the test CA");
    for with_key in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = Config {
            tls_client_ca_key: with_key.then(|| pki.pki.dir.join("ca.key")),
            ..common::config(dir.path(), SIM_HOSTS)
        };
        let server = within("start", server::start(&config))
            .await
            .expect("starts");
        let mut admin = AccessServiceClient::new(common::admin_channel(server.addr).await);
        admin
            .create_token(pb::CreateTokenRequest {
                name: "dave".into(),
                grants: vec![grant(pb::Role::Viewer, "/")],
            })
            .await
            .expect("token");
        let csr = peloton_tls::user_csr("dave").expect("a request");
        let issued = admin
            .issue_certificate(pb::IssueCertificateRequest {
                name: "dave".into(),
                csr_pem: csr.csr_pem,
                valid_days: 1,
            })
            .await;
        if with_key {
            let issued = issued.expect("signed with the configured key").into_inner();
            assert_eq!(issued.ca_pem, ca_pem);
            let channel =
                tls_channel_as(server.addr, &ca_pem, &issued.certificate_pem, &csr.key_pem)
                    .await
                    .expect("connect");
            let me = AccessServiceClient::new(channel)
                .who_am_i(pb::WhoAmIRequest {})
                .await
                .expect("whoami by certificate")
                .into_inner();
            assert_eq!(me.token.expect("token").name, "dave");
        } else {
            assert_status(issued, Code::FailedPrecondition, "--tls-client-ca-key");
        }
        within("shutdown", server.shutdown())
            .await
            .expect("shutdown");
    }
}

/// A job's owner is the name of the token that created it, whatever its
/// spec says, and an update by another token keeps it; usage reads show
/// only the runs of pools the caller may read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_owner_is_its_creators_token_and_usage_shows_only_readable_pools() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let sub = s.as_token(&create_token(&admin, "sub-a", pb::Role::Submitter, "/a").await);
    let view_b = s.as_token(&create_token(&admin, "view-b", pb::Role::Viewer, "/b").await);
    let mut spec = short_job("/a");
    spec.owner = "someone-else".into();
    let short = sub.create_job(spec).await.expect("sub creates in /a");
    assert_eq!(short.spec.as_ref().expect("spec").owner, "sub-a");
    let mut spec = long_job("/a");
    spec.r#type = pb::JobType::Service as i32;
    let long = sub.create_job(spec.clone()).await.expect("a service in /a");
    let b = admin
        .create_job(short_job("/b"))
        .await
        .expect("admin in /b");
    wait_state(&admin, &short.id, pb::JobState::Succeeded).await;
    wait_state(&admin, &b.id, pb::JobState::Succeeded).await;

    // The admin updates sub-a's service, naming itself as the owner: the
    // job stays sub-a's.
    spec.owner = "admin".into();
    task_of(&mut spec).env.insert("V".into(), "2".into());
    let mut updates = pb::update_service_client::UpdateServiceClient::new(InterceptedService::new(
        s.channel.clone(),
        Auth(Some(bearer(ADMIN_TOKEN).parse().expect("ASCII"))),
    ));
    let updated = updates
        .create(pb::UpdateJobRequest {
            job_id: long.id.clone(),
            version: 0,
            spec: Some(spec),
            update: Some(pb::UpdateSpec {
                batch_size: 2,
                ..Default::default()
            }),
        })
        .await
        .expect("the admin updates the service")
        .into_inner();
    let job = updated.job.expect("job");
    assert_eq!(job.status.expect("status").config_version, 2);
    assert_eq!(job.spec.expect("spec").owner, "sub-a");
    let job = admin.get_job(&long.id).await.expect("get");
    assert_eq!(job.spec.expect("spec").owner, "sub-a");

    let usage = |api: &Api, group_by: pb::UsageGroupBy| {
        let mut jobs = api.jobs.clone();
        async move {
            jobs.list_usage(pb::ListUsageRequest {
                group_by: group_by as i32,
                ..Default::default()
            })
            .await
            .expect("list usage")
            .into_inner()
        }
    };
    let all = usage(&admin, pb::UsageGroupBy::Owner).await;
    // (The update's replaced runs are sub-a's too.)
    let owners: Vec<&str> = all.sums.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(owners, ["admin", "sub-a"], "{all:?}");
    assert_eq!(all.sums[0].runs, 1, "{all:?}");
    // A viewer of /b sees the runs of /b only.
    let seen = usage(&view_b, pb::UsageGroupBy::None).await;
    let pools: Vec<&str> = seen.records.iter().map(|r| r.pool.as_str()).collect();
    assert_eq!(pools, ["/b"], "{seen:?}");
    s.shutdown().await;
}

/// A start of a job id is matched only against the jobs the caller may
/// read: a viewer of /a names its job by a start that a job of /b shares
/// (which the admin, who sees both, is refused as ambiguous), and learns
/// nothing of /b's job by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_of_a_job_id_is_matched_among_the_jobs_the_caller_reads() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let view = s.as_token(&create_token(&admin, "view-a", pb::Role::Viewer, "/a").await);
    let ja = admin.create_job(short_job("/a")).await.expect("job in /a");
    // Jobs in /b until one shares the first character of /a's job's id.
    let mut jb = None;
    for _ in 0..200 {
        let j = admin.create_job(short_job("/b")).await.expect("job in /b");
        if j.id[..1] == ja.id[..1] {
            jb = Some(j);
            break;
        }
    }
    let jb = jb.expect("a /b job's id starts as /a's");
    let shared = &ja.id[..1];
    let e = admin.get_job(shared).await.expect_err("two jobs start so");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains(&*jb.id), "{e:?}");
    let got = view.get_job(shared).await.expect("the viewer's one job");
    assert_eq!(got.id, ja.id);
    // The start of /b's job alone is not the viewer's to resolve.
    let b_only = (2..=jb.id.len())
        .map(|n| &jb.id[..n])
        .find(|p| !ja.id.starts_with(p))
        .expect("ids differ");
    let e = view.get_job(b_only).await.expect_err("not the viewer's");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(!e.message().contains(&*jb.id), "{e:?}");
}

/// A job may wait only for jobs its creator may read: a submitter of /a
/// naming /b's job in `spec.after` (by its whole id) is told NOT_FOUND, as
/// for a job that does not exist; naming its own pool's job is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_only_for_jobs_its_creator_may_read() {
    let s = Secure::start().await;
    let admin = s.admin();
    create_pools_a_and_b(&admin).await;
    let submit = s.as_token(&create_token(&admin, "submit-a", pb::Role::Submitter, "/a").await);
    let ja = admin.create_job(long_job("/a")).await.expect("job in /a");
    let jb = admin.create_job(long_job("/b")).await.expect("job in /b");
    let after = |job: &str| {
        let mut spec = short_job("/a");
        spec.after = Some(pb::JobDependencies {
            finished: vec![job.to_string()],
            ..Default::default()
        });
        spec
    };
    let e = submit
        .create_job(after(&jb.id))
        .await
        .expect_err("not the submitter's to read");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().contains("spec.after.finished[0]"), "{e:?}");
    let waiting = submit
        .create_job(after(&ja.id))
        .await
        .expect("its own pool's job");
    let waiting = wait_state(&submit, &waiting.id, pb::JobState::Pending).await;
    let status = waiting.status.expect("status");
    assert_eq!(
        status.waiting_for.map(|w| w.finished),
        Some(vec![ja.id.clone()])
    );
    s.shutdown().await;
}
