//! `peloton-bench e2e`: the whole service measured through its gRPC API.
//!
//! Starts `pelotond` (the release binary next to this one, on a fresh
//! temporary data dir with simulated hosts) or connects to `--server`,
//! creates a pool, and submits `jobs × tasks_per_job` task instances from
//! several concurrent clients. The started server is secure, as servers
//! are by default (TLS, a bearer token on every call, roles checked, the
//! audit log written): the clients trust the CA it makes in its data dir
//! and send its admin token; `--insecure` measures without all that.
//! Reports:
//! - `tasks_per_s`: instances acknowledged (durably stored) per second,
//!   from the first submission to the last acknowledgement;
//! - `placed_p50_ms` / `placed_p99_ms`: from the client starting a job's
//!   submission to each of its tasks being placed (the server's placement
//!   timestamp; client and server share this machine's clock);
//! - `server_rss_mb`: the server's peak resident set (VmHWM).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use pb::job_service_client::JobServiceClient;
use pb::task_service_client::TaskServiceClient;
use peloton_gateway::client::{Authed, Bearer};
use peloton_gateway::pgstore::copy_pairs;
use peloton_proto::v1 as pb;
use serde_json::{Value, json};
use tonic::service::interceptor::InterceptedService;

/// Options of one run.
#[derive(Debug, Clone)]
pub struct E2eOptions {
    /// Simulated hosts of a started server.
    pub hosts: u32,
    /// Jobs to submit.
    pub jobs: u32,
    /// Instances per job.
    pub tasks_per_job: u32,
    /// Concurrent submitting clients.
    pub clients: usize,
    /// Connect here instead of starting a server.
    pub server: Option<String>,
    /// With `server`: its process id, to read its RSS.
    pub server_pid: Option<u32>,
    /// The started server's store (a PostgreSQL URL).
    pub store: Option<String>,
    /// Start a throwaway PostgreSQL for the started server's store.
    pub postgres: bool,
    /// Further flags for the started server.
    pub server_args: Vec<String>,
    /// Start the server with `--insecure` (plaintext, no tokens).
    pub insecure: bool,
    /// With `server` (https): the CA its certificate is signed by.
    pub ca_file: Option<PathBuf>,
    /// With `server`: a file holding the bearer token.
    pub token_file: Option<PathBuf>,
}

/// How the clients reach a server: its URL and, for a secure one
/// (https), the CA that signed its certificate and the bearer token they
/// send on every call.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) url: String,
    ca_file: Option<PathBuf>,
    token: Option<String>,
}

impl Target {
    /// A server given by the user: `url`, its CA file (https) and token.
    pub(crate) fn given(
        url: &str,
        ca_file: Option<&Path>,
        token_file: Option<&Path>,
    ) -> Result<Target> {
        let token = match token_file {
            Some(path) => Some(read_token(path)?),
            None => None,
        };
        anyhow::ensure!(
            !url.starts_with("https://") || ca_file.is_some(),
            "--server {url}: an https server needs --ca-file (the CA that signed its certificate)"
        );
        anyhow::ensure!(
            url.starts_with("https://") || token.is_none(),
            "--server {url}: a token is not sent over plain http"
        );
        Ok(Target {
            url: url.to_owned(),
            ca_file: ca_file.map(Path::to_path_buf),
            token,
        })
    }

    /// A server this bench started on `data_dir`, serving at `url`: when
    /// secure (https), it keeps its private CA in `DATA_DIR/tls/ca.pem`
    /// and its admin token in `DATA_DIR/admin-token`.
    pub(crate) fn started(url: String, data_dir: &Path) -> Result<Target> {
        if !url.starts_with("https://") {
            return Ok(Target {
                url,
                ca_file: None,
                token: None,
            });
        }
        Ok(Target {
            url,
            ca_file: Some(data_dir.join("tls").join("ca.pem")),
            token: Some(read_token(&data_dir.join("admin-token"))?),
        })
    }

    /// A new connection (over TLS with the token when secure).
    pub(crate) async fn connect(&self) -> Result<Authed> {
        let channel = peloton_gateway::client::endpoint(&self.url, self.ca_file.as_deref())?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {}", self.url))?;
        Ok(InterceptedService::new(
            channel,
            Bearer::new(self.token.as_deref())?,
        ))
    }
}

fn read_token(path: &Path) -> Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token in {}", path.display()))?;
    let token = token.trim();
    anyhow::ensure!(!token.is_empty(), "{}: no token", path.display());
    Ok(token.to_owned())
}

/// `--ca-file`, `--cert-file` and `--key-file` for an agent registering
/// `host` with the secure server on `data_dir`: a certificate naming the
/// host from the server's private CA (as `pelotond --local-agents` gives
/// its agents), written into `dir`. Nothing for an insecure server.
pub(crate) fn agent_tls_args(
    target: &Target,
    data_dir: &Path,
    host: &str,
    dir: &Path,
) -> Result<Vec<String>> {
    let Some(ca_file) = &target.ca_file else {
        return Ok(Vec::new());
    };
    let pki = peloton_tls::ensure_local_ca(&data_dir.join("tls"))?;
    std::fs::create_dir_all(dir)?;
    let (cert, key) = (
        dir.join(format!("{host}.pem")),
        dir.join(format!("{host}.key")),
    );
    pki.issue_client(host)?.write(&cert, &key)?;
    Ok([
        "--ca-file".into(),
        ca_file.display().to_string(),
        "--cert-file".into(),
        cert.display().to_string(),
        "--key-file".into(),
        key.display().to_string(),
    ]
    .to_vec())
}

pub(crate) struct Spawned {
    pub(crate) child: Child,
    dir: Option<tempfile::TempDir>,
}

impl Spawned {
    /// The server's data directory.
    pub(crate) fn data_dir(&self) -> &std::path::Path {
        self.dir.as_ref().expect("kept until dropped").path()
    }

    /// SIGKILL (a crash, nothing flushed or stopped in order); the data
    /// directory is kept for the next server.
    pub(crate) fn crash(mut self) -> Result<tempfile::TempDir> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(self.dir.take().expect("kept until dropped"))
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.dir.is_some() {
            stop_child(&mut self.child, Duration::from_secs(30));
        }
    }
}

/// SIGTERM, then SIGKILL if the child is still there after `patience`.
pub(crate) fn stop_child(child: &mut Child, patience: Duration) {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A release binary next to this one (`packages`: what builds it).
pub(crate) fn sibling_binary(name: &str, packages: &str) -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .context("the benchmark binary has no directory")?
        .join(name);
    if !bin.exists() {
        bail!(
            "{} not found: build it first with `cargo build --release {packages}`",
            bin.display()
        );
    }
    Ok(bin)
}

/// A server with `hosts` simulated hosts; secure unless `insecure`.
pub(crate) fn spawn_server(hosts: u32, insecure: bool) -> Result<(Spawned, Target)> {
    spawn_server_with(hosts, &[], insecure)
}

/// A server with `hosts` simulated hosts and these further flags.
pub(crate) fn spawn_server_with(
    hosts: u32,
    flags: &[String],
    insecure: bool,
) -> Result<(Spawned, Target)> {
    spawn_server_in(tempfile::tempdir()?, hosts, flags, insecure)
}

/// A server on the data directory `dir` (new or one a server used before):
/// secure (the default: TLS with the private CA it makes in `dir`, its
/// admin token), or with `--insecure`.
pub(crate) fn spawn_server_in(
    dir: tempfile::TempDir,
    hosts: u32,
    flags: &[String],
    insecure: bool,
) -> Result<(Spawned, Target)> {
    let bin = sibling_binary("pelotond", "-p peloton-gateway")?;
    let mut child = std::process::Command::new(&bin)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--no-metrics", "--sim-hosts"])
        .arg(hosts.to_string())
        .args(insecure.then_some("--insecure"))
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(server_log()?)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = std::io::BufReader::new(stdout).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            bail!("pelotond exited before serving");
        };
        let line = line?;
        if let Some(url) = line.strip_prefix("pelotond: serving gRPC on ") {
            break url.to_string();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let spawned = Spawned {
        child,
        dir: Some(dir),
    };
    let target = Target::started(addr, spawned.data_dir())?;
    Ok((spawned, target))
}

/// The server's log: appended to the file `PELOTON_BENCH_SERVER_LOG`
/// names, else dropped.
fn server_log() -> Result<Stdio> {
    Ok(match std::env::var_os("PELOTON_BENCH_SERVER_LOG") {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("PELOTON_BENCH_SERVER_LOG: cannot open {path:?}"))?
            .into(),
        None => Stdio::null(),
    })
}

/// Milliseconds since the Unix epoch.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn job_spec(pool: &str, i: u32, tasks: u32) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("bench-{i}"),
        owner: "peloton-bench".into(),
        pool: pool.to_string(),
        instance_count: tasks,
        default_task: Some(pb::TaskSpec {
            command: "/bin/true".into(),
            resources: Some(pb::Resources {
                cpu: 0.1,
                memory_mb: 64.0,
                ..Default::default()
            }),
            // Long enough that every task is still running when measured.
            sim: Some(pb::SimSpec {
                duration_ms: 3_600_000,
                exit_code: 0,
            }),
            ..Default::default()
        }),
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs the benchmark.
pub async fn run(opts: E2eOptions) -> Result<Value> {
    // Kept until the run ends.
    let local_pg = if opts.postgres {
        Some(
            tokio::task::spawn_blocking(|| {
                peloton_gateway::local_pg::LocalPostgres::start(true)
                    .context("cannot start PostgreSQL")
            })
            .await??,
        )
    } else {
        None
    };
    let store = match local_pg {
        Some(pg) => {
            let (pg, url) = tokio::task::spawn_blocking(move || {
                let url = pg.create_db("bench");
                (pg, url)
            })
            .await?;
            (Some(pg), Some(url?))
        }
        None => (None, opts.store.clone()),
    };
    let (local_pg, store) = store;
    let (spawned, target, pid) = match &opts.server {
        Some(a) => (
            None,
            Target::given(a, opts.ca_file.as_deref(), opts.token_file.as_deref())?,
            opts.server_pid,
        ),
        None => {
            let flags: Vec<String> = store
                .iter()
                .flat_map(|url| ["--store".to_owned(), url.clone()])
                .chain(opts.server_args.iter().cloned())
                .collect();
            let (s, t) = spawn_server_with(opts.hosts, &flags, opts.insecure)?;
            let pid = s.child.id();
            (Some(s), t, Some(pid))
        }
    };
    let addr = target.url.clone();
    let mut channels = Vec::new();
    for _ in 0..opts.clients.clamp(1, 4) {
        channels.push(target.connect().await?);
    }
    // A pool of this run's own, so that a server used before (--server)
    // does not count earlier jobs.
    let pool = format!("/bench-{}", wall_ms());
    create_pool(&channels[0], &pool).await?;
    let total = u64::from(opts.jobs) * u64::from(opts.tasks_per_job);
    let start = Instant::now();
    let submitted = submit(
        &channels,
        &pool,
        opts.jobs,
        opts.tasks_per_job,
        opts.clients,
    )
    .await?;
    let accept_s = start.elapsed().as_secs_f64();
    // Wait until every task is placed.
    let mut jobs_client = JobServiceClient::new(channels[0].clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let placed = count_placed(&mut jobs_client, &pool).await?;
        if placed >= total {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {placed} of {total} tasks placed after 600 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_placed_s = start.elapsed().as_secs_f64();
    let mut tasks_client =
        TaskServiceClient::new(channels[0].clone()).max_decoding_message_size(64 << 20);
    let mut latencies = Vec::with_capacity(total as usize);
    for (id, at) in &submitted {
        let mut from = 0;
        loop {
            let page = tasks_client
                .list(pb::ListTasksRequest {
                    job_id: id.clone(),
                    from_instance: from,
                    limit: 10_000,
                    ..Default::default()
                })
                .await?
                .into_inner();
            for t in &page.tasks {
                let placed = t.current.as_ref().map_or(0, |r| r.placed_at_ms);
                latencies.push(placed.saturating_sub(*at));
            }
            if page.next_instance == 0 {
                break;
            }
            from = page.next_instance;
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        latencies[((latencies.len() - 1) as f64 * p).round() as usize]
    };
    let (rss, rss_now) = pid.map_or((0.0, 0.0), |p| {
        let p = p.to_string();
        (
            crate::proc_status_mb(&p, "VmHWM:"),
            crate::proc_status_mb(&p, "VmRSS:"),
        )
    });
    drop(spawned);
    // On the throwaway PostgreSQL (never a database given with --store), the
    // bound: the database alone taking as many rows of the task table's
    // shape (up to a million), once the server has stopped. A failure costs
    // the bound, not the run's figures.
    let pg_bound = match (&local_pg, &store) {
        (Some(_), Some(url)) => {
            let url = url.clone();
            let per_job = opts.tasks_per_job;
            let rows = total.min(BOUND_MAX_ROWS);
            match tokio::task::spawn_blocking(move || pg_rows_alone(&url, rows, per_job)).await? {
                Ok(bound) => Some(bound),
                Err(e) => {
                    eprintln!("e2e: PostgreSQL's own rate not measured: {e:#}");
                    None
                }
            }
        }
        _ => None,
    };
    let tasks_per_s = total as f64 / accept_s;
    Ok(json!({
        "benchmark": "e2e",
        "server": addr,
        "store": if opts.server.is_some() {
            "as the server has it"
        } else if store.is_some() {
            "postgres"
        } else {
            "embedded (redb)"
        },
        "hosts": opts.hosts,
        "jobs": opts.jobs,
        "tasks_per_job": opts.tasks_per_job,
        "clients": opts.clients,
        "tasks": total,
        "accept_s": accept_s,
        "tasks_per_s": tasks_per_s,
        "all_placed_s": all_placed_s,
        "placed_p50_ms": pct(0.50),
        "placed_p99_ms": pct(0.99),
        "placed_max_ms": latencies.last().copied().unwrap_or(0),
        "server_rss_mb": rss,
        "server_rss_now_mb": rss_now,
        "pg_rows_alone_per_s": pg_bound.as_ref().map(|b| b.rows_per_s),
        "pg_rows_alone": pg_bound.as_ref().map(|b| b.rows),
        "pg_row_bytes": pg_bound.as_ref().map(|b| b.value_bytes),
        "pg_event_bytes_per_task": pg_bound.as_ref().map(|b| b.event_bytes_per_row),
        "of_pg_rows_alone": pg_bound.as_ref().map(|b| tasks_per_s / b.rows_per_s),
    }))
}

/// What PostgreSQL alone does with the rows of a run (`pg_rows_alone`).
struct PgBound {
    /// Task rows written (and found written).
    rows: u64,
    /// Task rows a second, with their share of the events.
    rows_per_s: f64,
    /// The rows' mean value size (as the run's task rows).
    value_bytes: u64,
    /// The run's event bytes a task.
    event_bytes_per_row: f64,
}

/// Rows written per transaction by [`pg_rows_alone`]: far more than a
/// loop's commit, so that its syncs cost next to nothing.
const BOUND_ROWS_PER_COMMIT: usize = 100_000;

/// Most rows [`pg_rows_alone`] writes (a rate; a larger run's bound is
/// measured on this many).
const BOUND_MAX_ROWS: u64 = 1_000_000;

/// Rows a statement (one binary `COPY`, the store's own) in
/// [`pg_rows_alone`].
const BOUND_ROWS_PER_STATEMENT: usize = 10_000;

/// The bound of an end-to-end run on PostgreSQL: every task costs at least
/// its row in `peloton_tasks` and its share of the events the run wrote to
/// `peloton_events` (the stored events' bytes over the stored task rows;
/// events the server trimmed, past its retention of revisions, are not
/// counted, which only loosens the bound),
/// through the one connection the store commits on. With nothing else
/// running, `rows` rows of the same shape (the run's mean
/// job-id and value sizes, `per_job` instances a job) go into a table like
/// it (`LIKE` it), as the store writes new rows (its own binary `COPY`, [`copy_pairs`],
/// 10,000 rows a statement),
/// each statement followed by an events row of those rows' share of the
/// run's event bytes, in large transactions; the tables are dropped after.
fn pg_rows_alone(url: &str, rows: u64, per_job: u32) -> Result<PgBound> {
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    let shape = c.query_one(
        "SELECT avg(octet_length(job))::int8, avg(octet_length(value))::int8, \
                (SELECT coalesce(sum(octet_length(value)), 0)::int8 FROM peloton_events), \
                count(*) \
         FROM peloton_tasks",
        &[],
    )?;
    let stored: i64 = shape.get(3);
    if stored == 0 {
        bail!("the run stored no task rows to take the shape of");
    }
    let (job_bytes, value_bytes, event_bytes): (i64, i64, i64) =
        (shape.get(0), shape.get(1), shape.get(2));
    let event_bytes_per_row = event_bytes as f64 / stored as f64;
    // What the run left to do (the autovacuum of a million inserts, dirty
    // pages) is done first, so that it does not slow the rows timed.
    // (One statement at a time: VACUUM runs outside a transaction.)
    c.batch_execute("VACUUM peloton_tasks, peloton_events")?;
    c.batch_execute("CHECKPOINT")?;
    // The store's own tables' definitions (columns, collation, key, the
    // events' out-of-line storage), taken from the database.
    c.batch_execute(
        "DROP TABLE IF EXISTS peloton_bench_rows; \
         DROP TABLE IF EXISTS peloton_bench_events; \
         CREATE TABLE peloton_bench_rows (LIKE peloton_tasks INCLUDING ALL); \
         CREATE TABLE peloton_bench_events (LIKE peloton_events INCLUDING ALL)",
    )?;
    // Prepared once, as the store's connection prepares its own.
    let copy =
        c.prepare("COPY peloton_bench_rows (job, instance, value) FROM STDIN (FORMAT binary)")?;
    let insert_events =
        c.prepare("INSERT INTO peloton_bench_events (first, epoch, value) VALUES ($1, 0, $2)")?;
    let per_job = u64::from(per_job.max(1));
    let width = usize::try_from(job_bytes.max(1)).unwrap_or(36);
    // Built before the clock starts: only the database's part is timed.
    let keys: Vec<(String, i64)> = (0..rows)
        .map(|i| {
            (
                format!("{:0>width$}", i / per_job),
                i64::try_from(i % per_job).unwrap_or(0),
            )
        })
        .collect();
    let value = vec![0xa5u8; usize::try_from(value_bytes.max(1)).unwrap_or(150)];
    let events = vec![0x5au8; (event_bytes_per_row * BOUND_ROWS_PER_STATEMENT as f64) as usize];
    let start = Instant::now();
    let mut first = 0i64;
    for txn in keys.chunks(BOUND_ROWS_PER_COMMIT) {
        let mut tx = c.transaction()?;
        for chunk in txn.chunks(BOUND_ROWS_PER_STATEMENT) {
            let rows: Vec<((&str, i64), &[u8])> = chunk
                .iter()
                .map(|k| ((k.0.as_str(), k.1), value.as_slice()))
                .collect();
            copy_pairs(&mut tx, &copy, &rows)?;
            let share = events.len() * chunk.len() / BOUND_ROWS_PER_STATEMENT;
            if share > 0 {
                tx.execute(&insert_events, &[&first, &&events[..share]])?;
                first += 1;
            }
        }
        tx.commit()?;
    }
    let took = start.elapsed().as_secs_f64();
    let written: i64 = c
        .query_one("SELECT count(*) FROM peloton_bench_rows", &[])?
        .get(0);
    c.batch_execute("DROP TABLE peloton_bench_rows; DROP TABLE peloton_bench_events")?;
    let written = u64::try_from(written).unwrap_or(0);
    if written != rows {
        bail!("{written} of {rows} rows were written");
    }
    Ok(PgBound {
        rows,
        rows_per_s: rows as f64 / took.max(1e-9),
        value_bytes: u64::try_from(value_bytes).unwrap_or(0),
        event_bytes_per_row,
    })
}

/// Creates the pool `path` with the default spec.
pub(crate) async fn create_pool(channel: &Authed, path: &str) -> Result<()> {
    pb::resource_pool_service_client::ResourcePoolServiceClient::new(channel.clone())
        .create(pb::CreatePoolRequest {
            path: path.into(),
            spec: None,
        })
        .await
        .with_context(|| format!("ResourcePoolService.Create {path}"))?;
    Ok(())
}

/// Submits `jobs` jobs of `per_job` instances to `pool` from `clients`
/// concurrent clients; each job's id and the wall time its submission began.
pub(crate) async fn submit(
    channels: &[Authed],
    pool: &str,
    jobs: u32,
    per_job: u32,
    clients: usize,
) -> Result<Vec<(String, u64)>> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients.max(1) {
        let channel: Authed = channels[c % channels.len()].clone();
        let next = next.clone();
        let pool = pool.to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = JobServiceClient::new(channel)
                .max_decoding_message_size(16 << 20)
                .max_encoding_message_size(16 << 20);
            let mut submitted = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= jobs {
                    break;
                }
                let at = wall_ms();
                let job = client
                    .create(pb::CreateJobRequest {
                        spec: Some(job_spec(&pool, i, per_job)),
                    })
                    .await?
                    .into_inner()
                    .job
                    .context("no job in the answer")?;
                submitted.push((job.id, at));
            }
            Ok::<_, anyhow::Error>(submitted)
        }));
    }
    let mut submitted = Vec::new();
    for t in tasks {
        submitted.extend(t.await??);
    }
    Ok(submitted)
}

/// Instances of `pool`'s jobs in these states, from the jobs' task counts.
pub(crate) async fn count_in(
    jobs: &mut JobServiceClient<Authed>,
    pool: &str,
    states: &[pb::TaskState],
) -> Result<u64> {
    let mut n = 0u64;
    let mut token = String::new();
    loop {
        let page = jobs
            .query(pb::QueryJobsRequest {
                pool: pool.to_string(),
                page_size: 1000,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        for j in &page.jobs {
            for c in j.status.iter().flat_map(|s| &s.task_counts) {
                let s = pb::TaskState::try_from(c.state).unwrap_or_default();
                if states.contains(&s) {
                    n += u64::from(c.count);
                }
            }
        }
        if page.next_page_token.is_empty() {
            return Ok(n);
        }
        token = page.next_page_token;
    }
}

/// Instances of `pool`'s jobs placed or further on (placed, launching,
/// running).
pub(crate) async fn count_placed(jobs: &mut JobServiceClient<Authed>, pool: &str) -> Result<u64> {
    use pb::TaskState as S;
    count_in(jobs, pool, &[S::Placed, S::Launching, S::Running]).await
}
