//! `pelotond`: the Peloton server.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser};
use peloton_gateway::config::Config;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Peloton scheduler service: gRPC API (and JSON over HTTP on the same
/// port), its store (embedded, or PostgreSQL shared with standbys), and hosts
/// run by `peloton-agent`s (or simulated ones, for tests and benchmarks at
/// scale).
#[derive(Debug, Parser)]
#[command(name = "pelotond", version)]
struct Args {
    /// YAML configuration file; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory: the embedded store, the private CA (tls/), the admin
    /// and agent tokens, and the work dirs of --local-agents.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The store: a PostgreSQL URL (postgres://user:password@host/db),
    /// which several pelotond may share (one leads, the others stand by);
    /// default: the embedded store in DATA_DIR. Prefer the environment
    /// variable or the config file for a URL with a password (the command
    /// line shows in every user's process list).
    #[arg(
        long,
        value_name = "URL",
        env = "PELOTON_STORE",
        hide_env_values = true
    )]
    store: Option<String>,
    /// With a PostgreSQL store: the leader's lease, in milliseconds (a
    /// standby takes over about this long after the leader dies).
    #[arg(long)]
    lease_ms: Option<u64>,
    /// With a PostgreSQL store: the URL clients use to reach this server,
    /// which standbys name (default: https:// and the listen address;
    /// http:// with --insecure).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, env = "PELOTON_LISTEN")]
    listen: Option<SocketAddr>,
    /// Prometheus metrics listen address.
    #[arg(long, env = "PELOTON_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Serve no metrics.
    #[arg(long)]
    no_metrics: bool,
    /// Generate this many simulated hosts.
    #[arg(long)]
    sim_hosts: Option<u32>,
    /// Simulated hosts from a YAML file.
    #[arg(long)]
    sim_hosts_file: Option<PathBuf>,
    /// Least milliseconds between scheduling cycles.
    #[arg(long)]
    cycle_interval_ms: Option<u64>,
    /// Group commit: least milliseconds from a commit to the next under
    /// load (0: commit every iteration at once).
    #[arg(long)]
    commit_spacing_ms: Option<u64>,
    /// Commit on the loop's thread, not on a writer thread while the loop
    /// steps the next batch (for measuring the difference).
    #[arg(long)]
    sync_commit: bool,
    /// Threads of the engine's parallel scans.
    #[arg(long)]
    engine_threads: Option<usize>,
    /// The token agents must present (default: kept in DATA_DIR/agent-token).
    #[arg(long)]
    agent_token: Option<String>,
    /// Milliseconds without a heartbeat before an agent host is lost.
    #[arg(long)]
    host_lost_after_ms: Option<u64>,
    /// Milliseconds between start forecasts while work waits (0: none).
    #[arg(long)]
    forecast_interval_ms: Option<u64>,
    /// Blocked queue heads (a gang waiting for whole hosts, work over its
    /// pool's entitlement) given hosts reserved from their expected start
    /// per scheduling cycle, with backfill behind them: work that ends
    /// before then, or fits beside them then on other hosts, runs first
    /// (0: none, strict queue order; at most 64).
    #[arg(long)]
    backfill_reservations: Option<usize>,
    /// Queue entries looked at behind a reserved head per cycle (1–10000).
    #[arg(long)]
    backfill_depth: Option<usize>,
    /// Seconds a finished job is kept before it is removed.
    #[arg(long)]
    job_retention_s: Option<u64>,
    /// Finished jobs kept at most (the oldest are removed first).
    #[arg(long)]
    max_finished_jobs: Option<usize>,
    /// Milliseconds a client-mode application's driver may go unheard (no
    /// executor stream open, no call) before the application is
    /// unregistered.
    #[arg(long)]
    app_lease_ms: Option<u64>,
    /// Percentage of the CPU non-revocable tasks are allocated that a host
    /// keeps back from lending to revocable tasks, of what they do not use
    /// (100: lend none).
    #[arg(long)]
    overcommit_cpu_margin_pct: Option<u8>,
    /// Likewise for memory.
    #[arg(long)]
    overcommit_memory_margin_pct: Option<u8>,
    /// Events kept in the store for resuming watches.
    #[arg(long)]
    event_retention: Option<u64>,
    /// Page cache of the embedded store, in MiB.
    #[arg(long)]
    store_cache_mb: Option<usize>,
    /// Memory of every watch stream's buffer together, in MiB (past it,
    /// the watches whose clients left a message untaken longest are ended).
    #[arg(long)]
    watch_memory_mb: Option<usize>,
    /// Memory of one watch stream's buffer, in KiB.
    #[arg(long)]
    watch_buffer_kb: Option<usize>,
    /// Start this many `peloton-agent`s on this machine (a local cluster;
    /// work dirs under DATA_DIR/agents), sharing its cores and memory.
    /// They stop with the server (Ctrl-C, SIGTERM, SIGHUP, or its death),
    /// and stop their tasks first (Ctrl-C again kills the tasks at once).
    #[arg(long, default_value_t = 0)]
    local_agents: u32,
    /// With --local-agents: leave the tasks running when the server stops,
    /// for the agents to take over on the next start.
    #[arg(long)]
    keep_tasks_on_exit: bool,
    /// The agent binary for --local-agents (default: `peloton-agent` next to
    /// this binary).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// Serve plaintext to anyone who reaches the port: no TLS, no tokens,
    /// no roles, no audit (for experiments on a closed machine). By
    /// default the server is secure: TLS only, a bearer token on every
    /// call (roles per pool subtree, an audit log), agents with client
    /// certificates naming their hosts; the bootstrap admin token is kept
    /// in DATA_DIR/admin-token and the private CA, unless --tls-cert is
    /// given, in DATA_DIR/tls.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_client_ca", "tls_client_ca_key"])]
    insecure: bool,
    /// Secure: the server's certificate chain (PEM; default: issued by the
    /// private CA in DATA_DIR/tls).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Secure: the private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Secure: serve /metrics over TLS too (default: plaintext, for
    /// Prometheus on a private address).
    #[arg(long)]
    metrics_tls: bool,
    /// Secure: the CA (PEM) agents' client certificates are signed by
    /// (default: the private CA in DATA_DIR/tls; none with --tls-cert, so
    /// give it whenever agents connect).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Secure: the private key (PEM) of --tls-client-ca (PKCS#8), so the
    /// server can sign user certificates (`peloton token cert`); the
    /// private CA's key is the server's already.
    #[arg(long, value_name = "FILE", requires = "tls_client_ca")]
    tls_client_ca_key: Option<PathBuf>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// After starting, submit a hello-world job and print its progress.
    #[arg(long)]
    demo: bool,
    /// With --demo: stop the server when the demo job is done.
    #[arg(long)]
    exit_after_demo: bool,
}

fn config(args: &Args) -> anyhow::Result<Config> {
    let mut c = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    apply_flags(args, &mut c);
    check_local_agents(args, &c)?;
    c.validate()?;
    Ok(c)
}

/// The flags given override the configuration file's values.
fn apply_flags(args: &Args, c: &mut Config) {
    // `field`: a value; `Some field`: an optional value given.
    macro_rules! given {
        ($($field:ident),*) => {
            $(if let Some(v) = &args.$field {
                c.$field = v.clone();
            })*
        };
        (Some $($field:ident),*) => {
            $(if let Some(v) = &args.$field {
                c.$field = Some(v.clone());
            })*
        };
    }
    given!(
        data_dir,
        listen,
        lease_ms,
        sim_hosts,
        commit_spacing_ms,
        engine_threads,
        host_lost_after_ms,
        forecast_interval_ms,
        backfill_reservations,
        backfill_depth,
        job_retention_s,
        max_finished_jobs,
        app_lease_ms,
        overcommit_cpu_margin_pct,
        overcommit_memory_margin_pct,
        event_retention,
        store_cache_mb,
        watch_memory_mb,
        watch_buffer_kb
    );
    given!(
        Some store,
        advertise,
        metrics_listen,
        sim_hosts_file,
        agent_token,
        tls_cert,
        tls_key,
        tls_client_ca,
        tls_client_ca_key
    );
    if args.no_metrics {
        c.metrics_listen = None;
    }
    if let Some(v) = args.cycle_interval_ms {
        c.cycle_interval_ms = v;
        c.idle_cycle_interval_ms = c.idle_cycle_interval_ms.max(v);
    }
    if args.insecure {
        c.secure = false;
    }
    if args.metrics_tls {
        c.metrics_tls = true;
    }
    if args.sync_commit {
        c.sync_commit = true;
    }
}

/// `--local-agents` and the flags it cannot go with.
fn check_local_agents(args: &Args, c: &Config) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.local_agents == 0 || !c.secure || (c.tls_cert.is_none() && c.tls_client_ca.is_none()),
        "--local-agents with --tls-cert or --tls-client-ca: local agents get certificates from the \
         private CA only (start agents yourself with --ca-file, --cert-file and --key-file)"
    );
    anyhow::ensure!(
        args.local_agents == 0 || !c.simulated(),
        "--local-agents: not with simulated hosts (--sim-hosts, --sim-hosts-file)"
    );
    anyhow::ensure!(
        !args.keep_tasks_on_exit || args.local_agents > 0,
        "--keep-tasks-on-exit: only with --local-agents"
    );
    anyhow::ensure!(
        args.local_agents <= 64,
        "--local-agents: at most 64 (got {})",
        args.local_agents
    );
    Ok(())
}

/// SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed), as many
/// times as they come; listened for from creation on (a lazily registered
/// handler would leave a window in which Ctrl-C kills the server
/// outright).
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| anyhow::anyhow!("cannot listen for {name}: {e}"))
        };
        Ok(StopSignals {
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
            hangup: listen(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
            _ = self.hangup.recv() => {}
        }
    }
}

/// A line on stdout that never panics: after SIGHUP the terminal may be
/// gone, and the orderly stop must go on regardless.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// The command line, with every default shown in `--help`. The defaults
/// live in `Config::default()` (a config file may change them, so they
/// cannot be clap's own defaults, which would override the file): they
/// are appended to the help of their flags here, so the two cannot drift.
fn command() -> clap::Command {
    let d = Config::default();
    let defaults = [
        ("data_dir", d.data_dir.display().to_string()),
        ("listen", d.listen.to_string()),
        (
            "metrics_listen",
            d.metrics_listen
                .map_or_else(|| "none".to_owned(), |a| a.to_string()),
        ),
        ("sim_hosts", d.sim_hosts.to_string()),
        ("cycle_interval_ms", d.cycle_interval_ms.to_string()),
        ("commit_spacing_ms", d.commit_spacing_ms.to_string()),
        ("engine_threads", d.engine_threads.to_string()),
        ("host_lost_after_ms", d.host_lost_after_ms.to_string()),
        ("forecast_interval_ms", d.forecast_interval_ms.to_string()),
        ("backfill_reservations", d.backfill_reservations.to_string()),
        ("backfill_depth", d.backfill_depth.to_string()),
        ("job_retention_s", d.job_retention_s.to_string()),
        ("max_finished_jobs", d.max_finished_jobs.to_string()),
        ("app_lease_ms", d.app_lease_ms.to_string()),
        (
            "overcommit_cpu_margin_pct",
            d.overcommit_cpu_margin_pct.to_string(),
        ),
        (
            "overcommit_memory_margin_pct",
            d.overcommit_memory_margin_pct.to_string(),
        ),
        ("event_retention", d.event_retention.to_string()),
        ("store_cache_mb", d.store_cache_mb.to_string()),
        ("watch_memory_mb", d.watch_memory_mb.to_string()),
        ("watch_buffer_kb", d.watch_buffer_kb.to_string()),
        ("lease_ms", d.lease_ms.to_string()),
    ];
    let mut command = Args::command();
    for (id, value) in defaults {
        command = command.mut_arg(id, |arg| {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            arg.help(format!("{help} [default: {value}]"))
        });
    }
    command
}

fn main() -> std::process::ExitCode {
    // No transparent huge pages: with the kernel's usual `defrag=madvise`,
    // each fault on the allocator's huge-page-advised memory may compact
    // memory synchronously, and a restart that builds a million tasks
    // spent more than half its time there (`peloton-bench recovery`: the
    // restart to first placement went from 5.2–6.4 s to 3.3–4.0 s without).
    // Best effort: a kernel without the call keeps its own setting.
    let _ = nix::sys::prctl::set_thp_disable(true);
    let args = match Args::from_arg_matches(&command().get_matches()) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pelotond: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("peloton-io")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pelotond: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(serve(config, &args));
    // Everything was stopped in order; a standby stopped while it waits
    // for the lease leaves that wait on a blocking thread, which must not
    // hold the exit up.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pelotond: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config, args: &Args) -> anyhow::Result<()> {
    // From the start: a Ctrl-C while the agents start or the demo runs
    // stops everything in order too.
    let mut signals = StopSignals::listen()?;
    let shared = config.store.is_some();
    let secure = config.secure;
    let starting = peloton_gateway::server::start_with(&config, |addr| {
        if shared {
            // A standby listens (answering UNAVAILABLE with the leader's
            // address) long before it serves.
            println!(
                "pelotond: listening on {} (standing by until it leads)",
                peloton_gateway::client::url(secure, addr)
            );
        }
    });
    let server = tokio::select! {
        server = starting => server?,
        () = signals.recv() => {
            say(format_args!("pelotond: stopped before it served"));
            return Ok(());
        }
    };
    // Tests and scripts read this line to find the port.
    let url = peloton_gateway::client::url(config.secure, server.addr);
    println!("pelotond: serving gRPC on {url}");
    if config.secure {
        // Where the admin token and the CA are, when the server keeps them
        // (a configured admin_token or --tls-cert keeps them elsewhere).
        let token_file = config.data_dir.join("admin-token");
        let ca_file = config.data_dir.join("tls").join("ca.pem");
        let token = match config.admin_token {
            Some(_) => "set by admin_token".to_owned(),
            None => format!("in {}", token_file.display()),
        };
        let ca = match (&config.tls_cert, &config.tls_client_ca) {
            (None, _) => format!("in {}", ca_file.display()),
            (Some(_), Some(ca)) => format!("in {} (if it signed --tls-cert)", ca.display()),
            (Some(_), None) => "the one that signed --tls-cert".to_owned(),
        };
        println!("pelotond: TLS only, with tokens: the admin token is {token}; the CA is {ca}");
        if config.admin_token.is_none() && config.tls_cert.is_none() {
            println!(
                "pelotond: JSON over HTTP on the same port: curl --cacert {} -H \"authorization: Bearer $(cat {})\" {url}/v1/jobs",
                ca_file.display(),
                token_file.display()
            );
        }
    } else {
        println!("pelotond: JSON over HTTP on the same port: curl {url}/v1");
    }
    println!("pelotond: console on {url}/ui/");
    if let Some(m) = server.metrics_addr {
        let scheme = if config.metrics_tls { "https" } else { "http" };
        println!("pelotond: metrics on {scheme}://{m}/metrics");
    }
    let agents = match local::start_agents(&config, args, server.addr).await {
        Ok(a) => a,
        Err(e) => {
            server.shutdown().await?;
            return Err(e);
        }
    };
    let result = run_until_stopped(&config, args, &server, &mut signals).await;
    local::stop_agents(agents, &mut signals, !args.keep_tasks_on_exit).await;
    tracing::info!("shutting down");
    server.shutdown().await?;
    result
}

async fn run_until_stopped(
    config: &Config,
    args: &Args,
    server: &peloton_gateway::server::Server,
    signals: &mut StopSignals,
) -> anyhow::Result<()> {
    if args.demo {
        let real = !config.simulated();
        let state = tokio::select! {
            state = peloton_gateway::demo::run(config, server.addr, real) => state?,
            () = signals.recv() => return Ok(()),
        };
        println!("demo: finished: {}", state.as_str_name());
        if args.exit_after_demo {
            return Ok(());
        }
        println!(
            "pelotond: still serving; try `cargo run -p peloton-cli -- --server {} job query`{}; Ctrl-C stops",
            peloton_gateway::client::url(config.secure, server.addr),
            if config.secure {
                format!(
                    " with PELOTON_CA_FILE={} and PELOTON_TOKEN_FILE={}",
                    config.data_dir.join("tls/ca.pem").display(),
                    config.data_dir.join("admin-token").display()
                )
            } else {
                String::new()
            }
        );
    }
    signals.recv().await;
    Ok(())
}

/// `--local-agents`: agents on this machine, as child processes.
mod local {
    use std::path::PathBuf;
    use std::time::Duration;

    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};

    use peloton_gateway::config::Config;
    use tokio::process::{Child, Command};

    use super::{Args, StopSignals};

    fn agent_bin(args: &Args) -> anyhow::Result<PathBuf> {
        if let Some(p) = &args.agent_bin {
            return Ok(p.clone());
        }
        let me = std::env::current_exe()?;
        let p = me.with_file_name("peloton-agent");
        anyhow::ensure!(
            p.exists(),
            "--local-agents: {} not found; build it (`cargo build --release -p peloton-agent`) or pass --agent-bin",
            p.display()
        );
        Ok(p)
    }

    fn memory_mb() -> u64 {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(4096, |kb| kb / 1024)
    }

    /// A file holding the agents' token, readable by this user only, for
    /// their `--token-file` (a `--token` argument would show in every
    /// user's process list): the data dir's `agent-token`, or, when the
    /// token is configured, a copy in `DATA_DIR/agents/agent-token`.
    fn token_file(config: &Config) -> anyhow::Result<PathBuf> {
        let token = config.resolve_agent_token()?;
        if config.agent_token.is_none() {
            // resolve_agent_token keeps it there (created 0600).
            return Ok(config.data_dir.join("agent-token"));
        }
        let dir = config.data_dir.join("agents");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("agent-token");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        // `mode` applies only to a file it creates.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        writeln!(file, "{token}")?;
        Ok(path)
    }

    /// One agent's share of this machine: its cores and memory divided
    /// among `n` agents, so that the local cluster offers what the machine
    /// has, not `n` times it. Cores in thousandths (at least 0.01).
    pub fn share(cores: usize, memory_mb: u64, n: u32) -> (String, u64) {
        let millis = (cores as u64 * 1000 / u64::from(n)).max(10);
        (
            format!("{}.{:03}", millis / 1000, millis % 1000),
            memory_mb / u64::from(n),
        )
    }

    /// Starts `args.local_agents` agents, each with its own work dir, name
    /// (`local-N`), zone attribute, port range and an equal share of this
    /// machine's cores and memory. They run in a process group of their
    /// own: a Ctrl-C at the terminal reaches the server only, which stops
    /// them in order (see [`stop_agents`]). Should the server die without
    /// that (SIGKILL, a crash), `--exit-with-parent` makes the kernel send
    /// each one SIGTERM, the same orderly stop.
    pub async fn start_agents(
        config: &Config,
        args: &Args,
        addr: std::net::SocketAddr,
    ) -> anyhow::Result<Vec<Child>> {
        let n = args.local_agents;
        if n == 0 {
            return Ok(Vec::new());
        }
        // The parent-death signal follows the *thread* that forks: only
        // the main thread lives as long as this process.
        anyhow::ensure!(
            std::thread::current().name() == Some("main"),
            "--local-agents: agents must be started from the main thread"
        );
        let bin = agent_bin(args)?;
        let token_file = token_file(config)?;
        // Secure: each agent gets a certificate naming its host, from the
        // private CA.
        let pki = if config.secure {
            Some(peloton_tls::ensure_local_ca(&config.data_dir.join("tls"))?)
        } else {
            None
        };
        let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
        let (cpu, mem) = share(cores, memory_mb(), n);
        // An agent keeps its block over restarts (its tasks may outlive
        // the server): recorded in its work dir.
        let agent_dir = |i: u32| config.data_dir.join("agents").join(format!("local-{i}"));
        let kept: Vec<Option<u16>> = (0..n).map(|i| kept_block(&agent_dir(i))).collect();
        let blocks = claim_port_blocks(&std::env::temp_dir(), &kept)?;
        for i in 0..n {
            std::fs::create_dir_all(agent_dir(i))?;
            std::fs::write(agent_dir(i).join("ports"), blocks[i as usize].to_string())?;
        }
        let mut children = Vec::new();
        for i in 0..n {
            let dir = config.data_dir.join("agents").join(format!("local-{i}"));
            std::fs::create_dir_all(&dir)?;
            let log = std::fs::File::create(dir.with_extension("log"))?;
            let mut command = Command::new(&bin);
            if let Some(pki) = &pki {
                let (cert, key) = (dir.join("agent.pem"), dir.join("agent.key"));
                pki.issue_client(&format!("local-{i}"))?
                    .write(&cert, &key)?;
                command
                    .arg("--ca-file")
                    .arg(pki.dir.join("ca.pem"))
                    .arg("--cert-file")
                    .arg(cert)
                    .arg("--key-file")
                    .arg(key);
            }
            command
                .arg("--server")
                .arg(peloton_gateway::client::url(config.secure, addr))
                .arg("--work-dir")
                .arg(&dir)
                .arg("--host")
                .arg(format!("local-{i}"))
                .arg("--token-file")
                .arg(&token_file)
                .arg("--resources")
                .arg(format!("cpu={cpu},mem={mem}"))
                .arg("--attr")
                .arg(format!("zone=z{}", i % 3 + 1))
                .arg("--ports")
                .arg({
                    let first = blocks[i as usize];
                    format!("{first}-{}", first + PORT_BLOCK - 1)
                })
                .arg("--exit-with-parent")
                .arg(std::process::id().to_string());
            if !args.keep_tasks_on_exit {
                command.arg("--stop-tasks-on-exit");
            }
            let child = command
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", bin.display()))?;
            println!(
                "pelotond: started agent local-{i} (pid {}, {cpu} cores, {mem} MiB, work dir {}, log {})",
                child.id().unwrap_or(0),
                dir.display(),
                dir.with_extension("log").display()
            );
            children.push(child);
        }
        Ok(children)
    }

    /// Ports each local agent offers: a block of this many.
    pub const PORT_BLOCK: u16 = 1000;
    /// The first port of the first block. Blocks are claimed from the
    /// bottom: the first twelve (20000-31999) lie below Linux's default
    /// ephemeral range (32768-60999), whose ports an outgoing connection
    /// may take between an agent's check and its task's bind (the agent
    /// warns when its range overlaps it).
    const FIRST_PORT: u16 = 20000;
    /// Blocks to choose from (up to port 60999).
    const PORT_BLOCKS: u16 = 41;

    /// Locks of the port blocks this process claimed, held until it exits.
    static CLAIMED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

    /// An exclusive lock on the port block starting at `first`, if free.
    fn lock_block(dir: &std::path::Path, first: u16) -> Option<std::fs::File> {
        let path = dir.join(format!("peloton-ports-{first}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o666)
            .open(&path)
            .or_else(|_| std::fs::File::open(&path))
            .ok()?;
        file.try_lock().is_ok().then_some(file)
    }

    /// The first ports of a block of [`PORT_BLOCK`] ports for each local
    /// agent, claimed machine-wide for as long as this process runs (an
    /// exclusive lock on `locks/peloton-ports-FIRST.lock` each): two local
    /// clusters on one machine never give their agents the same ports.
    /// `kept[i]` is the block agent `i` had before (its tasks, kept over a
    /// restart, may hold its ports): it gets that one again, or the claim
    /// fails naming it; the others get free blocks. An error says when too
    /// few blocks are free.
    pub fn claim_port_blocks(
        locks: &std::path::Path,
        kept: &[Option<u16>],
    ) -> anyhow::Result<Vec<u16>> {
        let mut firsts: Vec<Option<u16>> = vec![None; kept.len()];
        let mut held = Vec::with_capacity(kept.len());
        for (i, k) in kept.iter().enumerate() {
            if let Some(first) = *k {
                let Some(lock) = lock_block(locks, first) else {
                    anyhow::bail!(
                        "--local-agents: agent local-{i}'s ports {first}-{} (its tasks may still \
                         hold them) are held by another local cluster on this machine \
                         ({}/peloton-ports-{first}.lock); stop it, or use another data dir",
                        first + PORT_BLOCK - 1,
                        locks.display()
                    );
                };
                firsts[i] = Some(first);
                held.push(lock);
            }
        }
        let mut free = (0..PORT_BLOCKS)
            .map(|b| FIRST_PORT + b * PORT_BLOCK)
            .filter(|f| !kept.contains(&Some(*f)));
        for slot in firsts.iter_mut().filter(|f| f.is_none()) {
            for first in free.by_ref() {
                if let Some(lock) = lock_block(locks, first) {
                    *slot = Some(first);
                    held.push(lock);
                    break;
                }
            }
        }
        let got = firsts.iter().flatten().count();
        anyhow::ensure!(
            got == kept.len(),
            "--local-agents: {} blocks of {PORT_BLOCK} ports wanted, {got} free between \
             {FIRST_PORT} and {} (other local clusters on this machine hold the rest: see \
             {}/peloton-ports-*.lock)",
            kept.len(),
            FIRST_PORT + PORT_BLOCKS * PORT_BLOCK - 1,
            locks.display()
        );
        CLAIMED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(held);
        Ok(firsts.into_iter().flatten().collect())
    }

    /// The port block an agent's work dir records (`ports`: its first
    /// port), if any.
    fn kept_block(agent_dir: &std::path::Path) -> Option<u16> {
        let text = std::fs::read_to_string(agent_dir.join("ports")).ok()?;
        let first: u16 = text.trim().parse().ok()?;
        (first >= FIRST_PORT && (first - FIRST_PORT).is_multiple_of(PORT_BLOCK)).then_some(first)
    }

    fn signal_all(pids: &[u32], signal: &str) {
        for pid in pids {
            let _ = std::process::Command::new("kill")
                .arg(signal)
                .arg(pid.to_string())
                .status();
        }
    }

    /// SIGTERM to every agent, then waits for them. With `stop_tasks` they
    /// stop their tasks first, each with its kill grace period: a further
    /// Ctrl-C (or SIGTERM) makes them kill the tasks at once, one more
    /// SIGKILLs the agents. Without it they leave their tasks running (a
    /// restarted agent takes them over) and are SIGKILLed after 5 s.
    pub async fn stop_agents(
        mut children: Vec<Child>,
        signals: &mut StopSignals,
        stop_tasks: bool,
    ) {
        if children.is_empty() {
            return;
        }
        let pids: Vec<u32> = children.iter().filter_map(Child::id).collect();
        if stop_tasks {
            super::say(format_args!(
                "pelotond: stopping the local agents and their tasks (Ctrl-C again kills the tasks at once)"
            ));
        } else {
            super::say(format_args!(
                "pelotond: stopping the local agents; their tasks keep running"
            ));
        }
        signal_all(&pids, "-TERM");
        let mut exited = std::pin::pin!(async {
            for child in &mut children {
                let _ = child.wait().await;
            }
        });
        let mut requests = 1;
        let mut patience = std::pin::pin!(tokio::time::sleep(Duration::from_secs(5)));
        let mut patient = !stop_tasks;
        loop {
            tokio::select! {
                () = &mut exited => return,
                () = signals.recv() => {
                    requests += 1;
                    if stop_tasks && requests == 2 {
                        super::say(format_args!("pelotond: killing the tasks now (Ctrl-C again kills the agents)"));
                        signal_all(&pids, "-TERM");
                    } else {
                        signal_all(&pids, "-KILL");
                    }
                }
                () = &mut patience, if patient => {
                    patient = false;
                    signal_all(&pids, "-KILL");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::local::{PORT_BLOCK, claim_port_blocks, share};

    /// Two local clusters on one machine get disjoint port blocks; a block
    /// is free again once its holder is gone (here: never, within this
    /// process, so a third claim takes further blocks).
    #[test]
    fn local_clusters_claim_disjoint_port_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let a = claim_port_blocks(dir.path(), &[None; 3]).unwrap();
        let b = claim_port_blocks(dir.path(), &[None; 3]).unwrap();
        assert_eq!(a, [20000, 21000, 22000]);
        for first in &b {
            assert!(
                a.iter().all(|x| x.abs_diff(*first) >= PORT_BLOCK),
                "{a:?} {b:?}"
            );
        }
        let e = claim_port_blocks(dir.path(), &[None; 36]).unwrap_err();
        assert!(e.to_string().contains("35 free"), "{e}");
        // An agent's kept block: its own again if free (this cluster's
        // agent 1 had 40000), refused if another cluster holds it.
        let c = claim_port_blocks(dir.path(), &[None, Some(40000)]).unwrap();
        assert_eq!(c[1], 40000);
        assert!(
            !a.contains(&c[0]) && !b.contains(&c[0]) && c[0] != 40000,
            "{c:?}"
        );
        let e = claim_port_blocks(dir.path(), &[Some(a[0])]).unwrap_err();
        assert!(
            e.to_string().contains("held by another local cluster"),
            "{e}"
        );
    }

    #[test]
    fn local_agents_divide_the_machine() {
        assert_eq!(share(2, 24_000, 3), ("0.666".to_owned(), 8_000));
        assert_eq!(share(8, 16_384, 4), ("2.000".to_owned(), 4_096));
        assert_eq!(share(1, 1_000, 1), ("1.000".to_owned(), 1_000));
        // Never nothing: at least a hundredth of a core.
        assert_eq!(share(1, 640, 64), ("0.015".to_owned(), 10));
        assert_eq!(share(0, 640, 64).0, "0.010");
    }
}
