//! Shared helpers of the gateway's integration tests: a real server on
//! 127.0.0.1 (in-process or the `pelotond` binary), its clients, spec
//! builders and polling with a deadline (never a sleep as an assertion).

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pb::application_service_client::ApplicationServiceClient;
use pb::host_pool_service_client::HostPoolServiceClient;
use pb::host_service_client::HostServiceClient;
use pb::job_service_client::JobServiceClient;
use pb::resource_pool_service_client::ResourcePoolServiceClient;
use pb::task_service_client::TaskServiceClient;
use pb::update_service_client::UpdateServiceClient;
use pb::watch_service_client::WatchServiceClient;
use peloton_gateway::client::{Authed, Bearer};
use peloton_gateway::config::Config;
use peloton_gateway::server::{self, Server};
use peloton_proto::v1 as pb;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The bootstrap admin token of every test server.
pub const ADMIN_TOKEN: &str = "pel_test_admin_token_of_the_gateway_suites";

/// An HTTPS channel to a test server (trusting the tests' CA), without a
/// token.
pub async fn tls_channel(addr: std::net::SocketAddr) -> Result<Channel, String> {
    let pki = peloton_tls::testkit::shared();
    let ca = std::fs::read_to_string(&pki.ca_file).map_err(|e| e.to_string())?;
    tls_channel_trusting(addr, &ca).await
}

/// An HTTPS channel to a server trusting only `ca_pem` (a server that made
/// its own private CA), retried until the server accepts.
pub async fn tls_channel_to(addr: std::net::SocketAddr, ca_pem: &str) -> Channel {
    eventually(&format!("connect to {addr}"), TIMEOUT, async || {
        tls_channel_trusting(addr, ca_pem).await
    })
    .await
}

/// An HTTPS channel to a server trusting only `ca_pem`, without a token.
pub async fn tls_channel_trusting(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> Result<Channel, String> {
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
                .domain_name("localhost"),
        )
        .map_err(|e| e.to_string())?
        // A hung call fails the test instead of hanging it (for a watch
        // this bounds only the wait for its headers).
        .timeout(TIMEOUT)
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// `channel` sending `token` on every call.
pub fn with_token(channel: Channel, token: &str) -> Authed {
    InterceptedService::new(channel, Bearer::new(Some(token)).expect("an ASCII token"))
}

/// An HTTPS channel to a test server as its admin, retrying until it
/// accepts.
pub async fn admin_channel(addr: std::net::SocketAddr) -> Authed {
    let channel = eventually(&format!("connect to {addr}"), TIMEOUT, async || {
        tls_channel(addr).await
    })
    .await;
    with_token(channel, ADMIN_TOKEN)
}

/// How long any condition may take before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// Time between two polls.
pub const POLL: Duration = Duration::from_millis(20);

/// Every client of one server (cheap to clone: one shared channel).
#[derive(Clone, Debug)]
pub struct Clients {
    pub pools: ResourcePoolServiceClient<Authed>,
    pub jobs: JobServiceClient<Authed>,
    pub tasks: TaskServiceClient<Authed>,
    pub hosts: HostServiceClient<Authed>,
    pub watch: WatchServiceClient<Authed>,
    pub updates: UpdateServiceClient<Authed>,
    pub host_pools: HostPoolServiceClient<Authed>,
    pub apps: ApplicationServiceClient<Authed>,
}

impl Clients {
    /// Connects to `addr` over TLS as the admin, retrying until the
    /// server accepts.
    pub async fn connect(addr: std::net::SocketAddr) -> Clients {
        Clients::with_channel(admin_channel(addr).await)
    }

    /// Clients on `channel`.
    pub fn with_channel(channel: Authed) -> Clients {
        Clients {
            pools: ResourcePoolServiceClient::new(channel.clone()),
            jobs: JobServiceClient::new(channel.clone()),
            tasks: TaskServiceClient::new(channel.clone()),
            hosts: HostServiceClient::new(channel.clone()),
            updates: UpdateServiceClient::new(channel.clone()),
            host_pools: HostPoolServiceClient::new(channel.clone()),
            apps: ApplicationServiceClient::new(channel.clone()),
            watch: WatchServiceClient::new(channel),
        }
    }
}

/// A server started in-process on a data directory it may own.
#[derive(Debug)]
pub struct TestServer {
    pub server: Option<Server>,
    pub clients: Clients,
    pub data_dir: PathBuf,
    pub sim_hosts: u32,
    _dir: Option<tempfile::TempDir>,
}

/// The configuration of a test server: a free port, no metrics, fast cycles;
/// secure (TLS with the tests' CA and server certificate, the admin token
/// [`ADMIN_TOKEN`]), as every server is by default.
/// With `PELOTON_TEST_STORE=postgres` its store is a database of this test
/// binary's throwaway PostgreSQL server, one per data directory (so a
/// restart on the same directory finds its state): the same suite on the
/// second backend.
pub fn config(data_dir: &Path, sim_hosts: u32) -> Config {
    let store = on_postgres().then(|| database_for(data_dir));
    Config {
        data_dir: data_dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("valid"),
        metrics_listen: None,
        sim_hosts,
        cycle_interval_ms: 5,
        store,
        lease_ms: 1000,
        ..secure_config()
    }
}

/// The configuration of an insecure test server (`pelotond --insecure`:
/// plaintext, no tokens).
pub fn insecure_config(data_dir: &Path, sim_hosts: u32) -> Config {
    Config {
        secure: false,
        tls_cert: None,
        tls_key: None,
        tls_client_ca: None,
        admin_token: None,
        ..config(data_dir, sim_hosts)
    }
}

/// The default configuration with the tests' certificates and admin token.
pub fn secure_config() -> Config {
    let pki = peloton_tls::testkit::shared();
    Config {
        secure: true,
        tls_cert: Some(pki.server_cert.clone()),
        tls_key: Some(pki.server_key.clone()),
        tls_client_ca: Some(pki.ca_file.clone()),
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        ..Config::default()
    }
}

/// Whether this run puts test servers on PostgreSQL.
pub fn on_postgres() -> bool {
    match std::env::var("PELOTON_TEST_STORE").as_deref() {
        Ok("postgres") => true,
        Ok("redb") | Ok("") | Err(_) => false,
        Ok(other) => panic!("PELOTON_TEST_STORE={other}: expected postgres or redb"),
    }
}

/// The URL of a database of [`local_postgres`] named after `data_dir`
/// (created on first use).
pub fn database_for(data_dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data_dir.hash(&mut h);
    let name = format!("t{:016x}", h.finish());
    // The blocking client may not run on an async test's thread.
    std::thread::scope(|s| {
        s.spawn(|| local_postgres().create_db(&name))
            .join()
            .expect("create a test database")
    })
    .unwrap_or_else(|e| panic!("create a test database: {e:#}"))
}

/// The store of a (stopped) test server on `data_dir`, on the backend
/// this run uses.
pub fn open_store(data_dir: &Path) -> Box<dyn peloton_gateway::store::Store> {
    Box::new(OffThread(open_store_here(data_dir)))
}

/// A store whose calls run on a thread of their own: PostgreSQL's blocking
/// client may not run on an async test's thread.
#[derive(Debug)]
struct OffThread(Box<dyn peloton_gateway::store::Store>);

impl peloton_gateway::store::Store for OffThread {
    fn load(&self) -> Result<peloton_gateway::store::Snapshot, peloton_gateway::store::StoreError> {
        std::thread::scope(|s| s.spawn(|| self.0.load()).join().expect("load"))
    }
    fn commit(
        &self,
        batch: &peloton_gateway::store::WriteBatch,
    ) -> Result<(), peloton_gateway::store::StoreError> {
        std::thread::scope(|s| s.spawn(|| self.0.commit(batch)).join().expect("commit"))
    }
    fn events_from(
        &self,
        from: u64,
        max_rows: usize,
    ) -> Result<Vec<Vec<u8>>, peloton_gateway::store::StoreError> {
        std::thread::scope(|s| {
            s.spawn(|| self.0.events_from(from, max_rows))
                .join()
                .expect("events")
        })
    }
}

fn open_store_here(data_dir: &Path) -> Box<dyn peloton_gateway::store::Store> {
    if on_postgres() {
        let url = database_for(data_dir);
        // Opened off any async thread (the blocking client's rule).
        std::thread::spawn(move || {
            Box::new(peloton_gateway::pgstore::PgStore::open(&url).expect("store opens"))
                as Box<dyn peloton_gateway::store::Store>
        })
        .join()
        .expect("open the store")
    } else {
        Box::new(peloton_gateway::store::RedbStore::open(data_dir).expect("store opens"))
    }
}

/// This test binary's PostgreSQL server (started on first use, from the
/// system's packages; see `peloton_gateway::local_pg`). It fails the test
/// when PostgreSQL is missing: tests never pass by skipping it.
pub fn local_postgres() -> &'static peloton_gateway::local_pg::LocalPostgres {
    static PG: std::sync::OnceLock<peloton_gateway::local_pg::LocalPostgres> =
        std::sync::OnceLock::new();
    PG.get_or_init(|| {
        // Started off the (maybe async) test's thread: the blocking client
        // that waits for it may not run there. It dies with this process.
        std::thread::spawn(|| peloton_gateway::local_pg::LocalPostgres::start(false))
            .join()
            .expect("the PostgreSQL starter")
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e:#}"))
    })
}

impl TestServer {
    /// A server with `sim_hosts` simulated hosts on a fresh directory.
    pub async fn start(sim_hosts: u32) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = TestServer::start_in(dir.path(), sim_hosts).await;
        s._dir = Some(dir);
        s
    }

    /// A server on `data_dir` (which the caller keeps).
    pub async fn start_in(data_dir: &Path, sim_hosts: u32) -> TestServer {
        let config = config(data_dir, sim_hosts);
        let server = within("the server to start", server::start(&config))
            .await
            .unwrap_or_else(|e| panic!("server does not start: {e:#}"));
        let clients = Clients::connect(server.addr).await;
        TestServer {
            server: Some(server),
            clients,
            data_dir: data_dir.to_path_buf(),
            sim_hosts,
            _dir: None,
        }
    }

    /// Shuts down gracefully and starts again on the same directory.
    pub async fn restart(mut self) -> TestServer {
        let server = self.server.take().expect("running");
        within("graceful shutdown before a restart", server.shutdown())
            .await
            .expect("graceful shutdown");
        let mut again = TestServer::start_in(&self.data_dir, self.sim_hosts).await;
        again._dir = self._dir.take();
        again
    }

    pub async fn shutdown(mut self) {
        if let Some(s) = self.server.take() {
            within("graceful shutdown", s.shutdown())
                .await
                .expect("graceful shutdown");
        }
    }
}

/// Polls `check` every [`POLL`] until it returns `Ok`; fails the test after
/// `timeout` with `what` and the last `Err` (the state last seen).
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() >= deadline {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Resources of `cpu` cores and `memory_mb` MiB.
pub fn res(cpu: f64, memory_mb: f64) -> pb::Resources {
    pb::Resources {
        cpu,
        memory_mb,
        ..Default::default()
    }
}

/// A pool spec with a cpu and memory reservation (0: none).
pub fn pool_spec(cpu: f64, memory_mb: f64) -> pb::PoolSpec {
    pb::PoolSpec {
        reservation: Some(res(cpu, memory_mb)),
        ..Default::default()
    }
}

/// Creates a pool, failing the test on an error.
pub async fn create_pool(c: &mut Clients, path: &str, spec: pb::PoolSpec) -> pb::Pool {
    c.pools
        .create(pb::CreatePoolRequest {
            path: path.into(),
            spec: Some(spec),
        })
        .await
        .unwrap_or_else(|e| panic!("create pool {path}: {e:?}"))
        .into_inner()
        .pool
        .expect("pool")
}

/// A batch job of `instances` tasks of `cpu` cores and 256 MiB that "run"
/// for `duration_ms` and exit 0, named `test-job-N` (a pool's unfinished
/// jobs have distinct names).
pub fn job_spec(pool: &str, instances: u32, cpu: f64, duration_ms: u64) -> pb::JobSpec {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    pb::JobSpec {
        name: format!("test-job-{n}"),
        owner: "tests".into(),
        r#type: pb::JobType::Batch as i32,
        pool: pool.into(),
        instance_count: instances,
        default_task: Some(pb::TaskSpec {
            command: "/bin/true".into(),
            resources: Some(res(cpu, 256.0)),
            sim: Some(pb::SimSpec {
                duration_ms,
                exit_code: 0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Mutable access to a spec's default task.
pub fn task_of(spec: &mut pb::JobSpec) -> &mut pb::TaskSpec {
    spec.default_task.as_mut().expect("default task")
}

/// Creates a job, failing the test on an error.
pub async fn create_job(c: &mut Clients, spec: pb::JobSpec) -> pb::Job {
    c.jobs
        .create(pb::CreateJobRequest { spec: Some(spec) })
        .await
        .unwrap_or_else(|e| panic!("create job: {e:?}"))
        .into_inner()
        .job
        .expect("job")
}

pub async fn get_job(c: &mut Clients, id: &str) -> Result<pb::Job, tonic::Status> {
    Ok(c.jobs
        .get(pb::GetJobRequest { id: id.into() })
        .await?
        .into_inner()
        .job
        .expect("job"))
}

pub fn job_state(job: &pb::Job) -> pb::JobState {
    job.status
        .as_ref()
        .map_or(pb::JobState::Unknown, |s| s.state())
}

/// Count of tasks of `job` in `state`.
pub fn count_in(job: &pb::Job, state: pb::TaskState) -> u32 {
    job.status.as_ref().map_or(0, |s| {
        s.task_counts
            .iter()
            .filter(|c| c.state() == state)
            .map(|c| c.count)
            .sum()
    })
}

fn is_terminal(s: pb::JobState) -> bool {
    matches!(
        s,
        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Killed
    )
}

fn describe(job: &pb::Job) -> String {
    let counts: Vec<String> = job
        .status
        .as_ref()
        .map(|s| {
            s.task_counts
                .iter()
                .map(|c| format!("{}={}", c.state().as_str_name(), c.count))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "job {} {} tasks [{}]",
        job.id,
        job_state(job).as_str_name(),
        counts.join(" ")
    )
}

/// Polls the job (every 20 ms, up to [`TIMEOUT`]) until it is in `want`;
/// fails at once if it ends in another terminal state.
pub async fn wait_job(c: &Clients, id: &str, want: pb::JobState) -> pb::Job {
    let mut c = c.clone();
    eventually(
        &format!("job {id} to be {}", want.as_str_name()),
        TIMEOUT,
        async || {
            let job = get_job(&mut c, id).await.map_err(|e| format!("{e:?}"))?;
            let s = job_state(&job);
            if s == want {
                return Ok(job);
            }
            assert!(
                !is_terminal(s),
                "job {id} ended {} while waiting for {}: {}",
                s.as_str_name(),
                want.as_str_name(),
                describe(&job)
            );
            Err(describe(&job))
        },
    )
    .await
}

/// Polls until `check` holds for the job.
pub async fn wait_job_where(
    c: &Clients,
    id: &str,
    what: &str,
    check: impl Fn(&pb::Job) -> bool,
) -> pb::Job {
    let mut c = c.clone();
    eventually(what, TIMEOUT, async || {
        let job = get_job(&mut c, id).await.map_err(|e| format!("{e:?}"))?;
        if check(&job) {
            Ok(job)
        } else {
            Err(describe(&job))
        }
    })
    .await
}

/// Every task of a job.
pub async fn list_tasks(c: &mut Clients, job_id: &str) -> Vec<pb::Task> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let r = c
            .tasks
            .list(pb::ListTasksRequest {
                job_id: job_id.into(),
                from_instance: from,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("list tasks of {job_id}: {e:?}"))
            .into_inner();
        out.extend(r.tasks);
        if r.next_instance == 0 {
            return out;
        }
        from = r.next_instance;
    }
}

pub async fn get_task(c: &mut Clients, job_id: &str, instance: u32) -> pb::Task {
    c.tasks
        .get(pb::GetTaskRequest {
            job_id: job_id.into(),
            instance,
        })
        .await
        .unwrap_or_else(|e| panic!("get task {job_id}/{instance}: {e:?}"))
        .into_inner()
        .task
        .expect("task")
}

pub fn task_state(t: &pb::Task) -> pb::TaskState {
    t.current
        .as_ref()
        .map_or(pb::TaskState::Unknown, |r| r.state())
}

/// Every host, page by page (pages of 3 hosts, so that paging is tested
/// wherever hosts are listed).
pub async fn list_hosts(c: &mut Clients) -> Vec<pb::Host> {
    let mut out: Vec<pb::Host> = Vec::new();
    let mut after = String::new();
    loop {
        let page = c
            .hosts
            .list(pb::ListHostsRequest {
                after: after.clone(),
                limit: 3,
            })
            .await
            .expect("list hosts")
            .into_inner();
        assert!(page.hosts.len() <= 3);
        for h in &page.hosts {
            assert!(
                out.last().is_none_or(|l| l.name < h.name),
                "hosts out of order"
            );
        }
        out.extend(page.hosts);
        if page.next_after.is_empty() {
            return out;
        }
        after = page.next_after;
    }
}

/// Every pool, page by page.
pub async fn list_pools(c: &mut Clients) -> Vec<pb::Pool> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .pools
            .list(pb::ListPoolsRequest {
                page_token,
                ..Default::default()
            })
            .await
            .expect("list pools")
            .into_inner();
        out.extend(page.pools);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

pub async fn get_pool(c: &mut Clients, path: &str) -> pb::Pool {
    c.pools
        .get(pb::GetPoolRequest { path: path.into() })
        .await
        .unwrap_or_else(|e| panic!("get pool {path}: {e:?}"))
        .into_inner()
        .pool
        .expect("pool")
}

/// Asserts `r` failed with `code` and a message containing `needle`.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(
    r: Result<T, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) {
    match r {
        Ok(v) => panic!("expected {code:?} mentioning {needle:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(
                s.code(),
                code,
                "wrong code (wanted {code:?} mentioning {needle:?}); message: {}",
                s.message()
            );
            assert!(
                s.message().contains(needle),
                "{code:?} message does not name {needle:?}: {}",
                s.message()
            );
        }
    }
}

/// Events received from a watch until `done` says the collected events are
/// complete, or [`TIMEOUT`].
pub async fn collect_events(
    stream: &mut tonic::Streaming<pb::WatchResponse>,
    mut done: impl FnMut(&[pb::Event]) -> bool,
) -> Vec<pb::Event> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !done(&events) {
        let next = tokio::time::timeout_at(deadline, stream.message()).await;
        match next {
            Err(_) => panic!(
                "timed out after {TIMEOUT:?} collecting watch events; got {} so far: {events:#?}",
                events.len()
            ),
            Ok(Err(e)) => panic!("watch failed: {e:?}"),
            Ok(Ok(None)) => panic!("watch ended after {} events", events.len()),
            Ok(Ok(Some(r))) => events.extend(r.events),
        }
    }
    events
}

/// Runs `f` with a deadline so a hung RPC fails the test instead of
/// hanging it.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {TIMEOUT:?}: {what}"))
}

/// What every host has together.
pub async fn cluster_capacity(c: &mut Clients) -> pb::Resources {
    let mut total = pb::Resources::default();
    for h in list_hosts(c).await {
        let cap = h.capacity.expect("capacity");
        total.cpu += cap.cpu;
        total.memory_mb += cap.memory_mb;
    }
    total
}

/// A pool reserving the whole cluster's cpu and memory, so that
/// non-preemptible jobs (admitted only within reservations) can use all of
/// it.
pub async fn create_reserved_pool(c: &mut Clients, path: &str) -> pb::Pool {
    let total = cluster_capacity(c).await;
    create_pool(c, path, pool_spec(total.cpu, total.memory_mb)).await
}

/// A TLS connection to a test server speaking HTTP/1.1 (ALPN `http/1.1`),
/// trusting the tests' CA, for raw HTTP requests.
pub async fn https_connect(
    addr: std::net::SocketAddr,
) -> std::io::Result<peloton_tls::tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let pki = peloton_tls::testkit::shared();
    let ca = std::fs::read_to_string(&pki.ca_file)?;
    let mut tls = peloton_tls::client_config(&ca, None).map_err(std::io::Error::other)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = peloton_tls::tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = peloton_tls::rustls::pki_types::ServerName::try_from("localhost")
        .expect("a valid name")
        .to_owned();
    connector.connect(name, tcp).await
}

/// The header line that authenticates a raw HTTP request as the admin.
pub fn admin_header() -> String {
    format!("authorization: Bearer {ADMIN_TOKEN}\r\n")
}

/// Sends `request` (raw HTTP/1.1 bytes, which should say `Connection:
/// close`) to a test server over TLS and returns everything it answers
/// until it closes the connection. The request is written while the
/// answer is read, so a server that answers before reading a large body
/// (and closes) still has its answer read.
pub async fn https_request(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = within("a TLS connection", https_connect(addr))
        .await
        .unwrap_or_else(|e| panic!("connect to {addr} over TLS: {e}"));
    let (mut read, mut write) = tokio::io::split(stream);
    let send = async {
        // A server that answered early may close before it all went out.
        let _ = write.write_all(request).await;
        let _ = write.flush().await;
        write
    };
    let receive = async {
        let mut answer = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match read.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                // A peer closing without TLS's close_notify, after its
                // answer: the answer is complete.
                Err(e) if !answer.is_empty() => {
                    let _ = e;
                    break;
                }
                Err(e) => panic!("read the answer from {addr}: {e}"),
            }
        }
        answer
    };
    let (_write, answer) = within("the HTTP answer", async { tokio::join!(send, receive) }).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A TLS channel (no token: agents authenticate by their agent token)
/// presenting a client certificate from the tests' CA naming `host`, as an
/// agent of `host` does.
pub async fn agent_channel(addr: std::net::SocketAddr, host: &str) -> Result<Channel, String> {
    let pki = peloton_tls::testkit::shared();
    let ca = std::fs::read_to_string(&pki.ca_file).map_err(|e| e.to_string())?;
    let pair = pki.pki.issue_client(host).map_err(|e| format!("{e:#}"))?;
    tls_channel_as(addr, &ca, &pair.cert_pem, &pair.key_pem).await
}

/// An HTTPS channel to `addr` trusting only `ca_pem`, presenting the client
/// certificate `cert_pem` with its key `key_pem`.
pub async fn tls_channel_as(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Channel, String> {
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
                .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem))
                .domain_name("localhost"),
        )
        .map_err(|e| e.to_string())?
        .timeout(TIMEOUT)
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// The flags that make a `pelotond` started by a test secure the way
/// [`config`] makes in-process servers: the tests' server certificate, the
/// tests' CA for agents' certificates, and a configuration file giving the
/// admin token [`ADMIN_TOKEN`] (so nothing is generated in its data
/// directory and any client of this process can connect with
/// [`Clients::connect`]).
pub fn pelotond_secure_args() -> Vec<std::ffi::OsString> {
    static CONFIG: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, file) = CONFIG.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a directory for pelotond's configuration");
        let file = dir.path().join("pelotond.yaml");
        std::fs::write(&file, format!("admin_token: {ADMIN_TOKEN}\n"))
            .expect("write pelotond's configuration");
        (dir, file)
    });
    let pki = peloton_tls::testkit::shared();
    vec![
        "--config".into(),
        file.into(),
        "--tls-cert".into(),
        pki.server_cert.clone().into(),
        "--tls-key".into(),
        pki.server_key.clone().into(),
        "--tls-client-ca".into(),
        pki.ca_file.clone().into(),
    ]
}

/// The flags of a `peloton-agent` started by a test for `host`: the tests'
/// CA and a client certificate naming `host` (written to `dir`).
pub fn agent_tls_args(host: &str, dir: &Path) -> Vec<std::ffi::OsString> {
    let pki = peloton_tls::testkit::shared();
    let (cert, key) = pki
        .client_files(host, dir)
        .unwrap_or_else(|e| panic!("a client certificate for {host}: {e:#}"));
    vec![
        "--ca-file".into(),
        pki.ca_file.clone().into(),
        "--cert-file".into(),
        cert.into(),
        "--key-file".into(),
        key.into(),
    ]
}

/// An HTTPS endpoint of a test server trusting the tests' CA, to be
/// tuned before it connects.
pub fn tls_endpoint(addr: std::net::SocketAddr) -> tonic::transport::Endpoint {
    let pki = peloton_tls::testkit::shared();
    let ca = std::fs::read_to_string(&pki.ca_file).expect("the tests' CA");
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .expect("a valid URL")
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .domain_name("localhost"),
        )
        .expect("a valid TLS configuration")
}

/// A free TCP port on 127.0.0.1 (pick it just before binding it: picked
/// early, it could meanwhile become the source port of a connection).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A PostgreSQL server of the test's own (stopping it disturbs no other
/// test) and the URL of a new database `name` on it.
pub fn own_postgres(
    name: &'static str,
) -> (
    std::sync::Arc<std::sync::Mutex<peloton_gateway::local_pg::LocalPostgres>>,
    String,
) {
    std::thread::spawn(move || {
        let pg = peloton_gateway::local_pg::LocalPostgres::start(false).expect("PostgreSQL starts");
        let db = pg.create_db(name).expect("create db");
        (std::sync::Arc::new(std::sync::Mutex::new(pg)), db)
    })
    .join()
    .expect("starter")
}

/// How the multi-process tests (failover, chaos) start a `pelotond` on a
/// PostgreSQL store.
pub struct PgServer<'a> {
    /// The store's URL.
    pub db: &'a str,
    /// The agents' token.
    pub agent_token: &'a str,
    pub lease_ms: u64,
    pub host_lost_after_ms: u64,
    pub sim_hosts: u32,
}

/// Starts the `pelotond` binary (secure: the tests' certificates and admin
/// token) on `port`, its data dir `DIR/NAME` and its log `DIR/NAME.log`
/// (appended across restarts); returns once it listens (it may stand by).
pub async fn spawn_pelotond(
    dir: &Path,
    name: &str,
    port: u16,
    s: &PgServer<'_>,
) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let log = dir.join(format!("{name}.log"));
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .expect("log file");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pelotond"))
        .args(pelotond_secure_args())
        .arg("--data-dir")
        .arg(dir.join(name))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--store", s.db, "--lease-ms", &s.lease_ms.to_string()])
        .args(["--no-metrics", "--agent-token", s.agent_token])
        .args(["--cycle-interval-ms", "5"])
        .args(["--host-lost-after-ms", &s.host_lost_after_ms.to_string()])
        .args(["--sim-hosts", &s.sim_hosts.to_string()])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("pelotond starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if line.starts_with("pelotond: listening on") {
                return;
            }
        }
        panic!(
            "pelotond {name} exited before listening; the end of its log:\n{}",
            tail(&log, 20)
        );
    })
    .await
    .expect("pelotond listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// How a multi-process test starts a real `peloton-agent`.
pub struct AgentProcess<'a> {
    /// The server list (`--server`).
    pub servers: &'a str,
    pub agent_token: &'a str,
    /// `--resources`.
    pub resources: &'a str,
    /// `--ports`.
    pub ports: &'a str,
    /// Its log to `DIR/agent-HOST.log` (appended, at info) rather than the
    /// test's stderr (at warn).
    pub log_file: bool,
}

/// A real `peloton-agent` named `host`, work dir `DIR/agent-HOST`.
pub fn spawn_agent(dir: &Path, host: &str, a: &AgentProcess<'_>) -> tokio::process::Child {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pelotond")).with_file_name("peloton-agent");
    assert!(
        bin.exists(),
        "{} not found: build it first (cargo build -p peloton-agent; cargo test --workspace does)",
        bin.display()
    );
    let work = dir.join(format!("agent-{host}"));
    std::fs::create_dir_all(&work).expect("work dir");
    let (stderr, level) = if a.log_file {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("agent-{host}.log")))
            .expect("agent log");
        (std::process::Stdio::from(log), "info")
    } else {
        (std::process::Stdio::inherit(), "warn")
    };
    tokio::process::Command::new(&bin)
        .args(["--server", a.servers])
        .args(agent_tls_args(host, dir))
        .arg("--work-dir")
        .arg(&work)
        .args(["--host", host, "--token", a.agent_token])
        .args(["--resources", a.resources])
        .args(["--ports", a.ports])
        .env("RUST_LOG", level)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts")
}

/// The value of an unlabelled series in Prometheus text.
pub async fn metric(addr: std::net::SocketAddr, name: &str) -> Result<i64, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .await
        .map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no {name} in the metrics"))
}
