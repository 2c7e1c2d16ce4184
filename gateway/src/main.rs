//! `pelotond`: the Peloton server.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use peloton_gateway::config::Config;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Peloton scheduler service: gRPC API, embedded store, and hosts run by
/// `peloton-agent`s (or simulated ones, for tests and benchmarks at scale).
#[derive(Debug, Parser)]
#[command(name = "pelotond", version)]
struct Args {
    /// YAML configuration file; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory of the embedded store.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Prometheus metrics listen address.
    #[arg(long)]
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
    /// Threads of the engine's parallel scans.
    #[arg(long)]
    engine_threads: Option<usize>,
    /// The token agents must present (default: kept in DATA_DIR/agent-token).
    #[arg(long)]
    agent_token: Option<String>,
    /// Milliseconds without a heartbeat before an agent host is lost.
    #[arg(long)]
    host_lost_after_ms: Option<u64>,
    /// Seconds a finished job is kept before it is removed.
    #[arg(long)]
    job_retention_s: Option<u64>,
    /// Finished jobs kept at most (the oldest are removed first).
    #[arg(long)]
    max_finished_jobs: Option<usize>,
    /// Events kept in the store for resuming watches.
    #[arg(long)]
    event_retention: Option<u64>,
    /// Page cache of the embedded store, in MiB.
    #[arg(long)]
    store_cache_mb: Option<usize>,
    /// Start this many `peloton-agent`s on this machine (a local cluster;
    /// work dirs under DATA_DIR/agents). They stop with the server.
    #[arg(long, default_value_t = 0)]
    local_agents: u32,
    /// The agent binary for --local-agents (default: `peloton-agent` next to
    /// this binary).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
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
    if let Some(v) = &args.data_dir {
        c.data_dir = v.clone();
    }
    if let Some(v) = args.listen {
        c.listen = v;
    }
    if let Some(v) = args.metrics_listen {
        c.metrics_listen = Some(v);
    }
    if args.no_metrics {
        c.metrics_listen = None;
    }
    if let Some(v) = args.sim_hosts {
        c.sim_hosts = v;
    }
    if let Some(v) = &args.sim_hosts_file {
        c.sim_hosts_file = Some(v.clone());
    }
    if let Some(v) = args.cycle_interval_ms {
        c.cycle_interval_ms = v;
        c.idle_cycle_interval_ms = c.idle_cycle_interval_ms.max(v);
    }
    if let Some(v) = args.engine_threads {
        c.engine_threads = v;
    }
    if let Some(v) = &args.agent_token {
        c.agent_token = Some(v.clone());
    }
    if let Some(v) = args.host_lost_after_ms {
        c.host_lost_after_ms = v;
    }
    if let Some(v) = args.job_retention_s {
        c.job_retention_s = v;
    }
    if let Some(v) = args.max_finished_jobs {
        c.max_finished_jobs = v;
    }
    if let Some(v) = args.event_retention {
        c.event_retention = v;
    }
    if let Some(v) = args.store_cache_mb {
        c.store_cache_mb = v;
    }
    anyhow::ensure!(
        args.local_agents == 0 || !c.simulated(),
        "--local-agents: not with simulated hosts (--sim-hosts, --sim-hosts-file)"
    );
    anyhow::ensure!(
        args.local_agents <= 64,
        "--local-agents: at most 64 (got {})",
        args.local_agents
    );
    c.validate()?;
    Ok(c)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("can install a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
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
    match rt.block_on(serve(config, &args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pelotond: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config, args: &Args) -> anyhow::Result<()> {
    let server = peloton_gateway::server::start(&config).await?;
    // Tests and scripts read this line to find the port.
    println!("pelotond: serving gRPC on http://{}", server.addr);
    if let Some(m) = server.metrics_addr {
        println!("pelotond: metrics on http://{m}/metrics");
    }
    let agents = match local::start_agents(&config, args, server.addr).await {
        Ok(a) => a,
        Err(e) => {
            server.shutdown().await?;
            return Err(e);
        }
    };
    let result = run_until_stopped(&config, args, &server).await;
    local::stop_agents(agents).await;
    tracing::info!("shutting down");
    server.shutdown().await?;
    result
}

async fn run_until_stopped(
    config: &Config,
    args: &Args,
    server: &peloton_gateway::server::Server,
) -> anyhow::Result<()> {
    if args.demo {
        let real = !config.simulated();
        let state = peloton_gateway::demo::run(server.addr, real).await?;
        println!("demo: finished: {}", state.as_str_name());
        if args.exit_after_demo {
            return Ok(());
        }
        println!(
            "pelotond: still serving; try `cargo run -p peloton-cli -- --server http://{} job query`; Ctrl-C stops",
            server.addr
        );
    }
    shutdown_signal().await;
    Ok(())
}

/// `--local-agents`: agents on this machine, as child processes.
mod local {
    use std::path::PathBuf;
    use std::time::Duration;

    use peloton_gateway::config::Config;
    use tokio::process::{Child, Command};

    use super::Args;

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

    /// Starts `args.local_agents` agents, each with its own work dir, name
    /// (`local-N`), zone attribute and an equal share of this machine's
    /// memory (every agent offers all cores: they are shared, not split).
    pub async fn start_agents(
        config: &Config,
        args: &Args,
        addr: std::net::SocketAddr,
    ) -> anyhow::Result<Vec<Child>> {
        let n = args.local_agents;
        if n == 0 {
            return Ok(Vec::new());
        }
        let bin = agent_bin(args)?;
        let token = config.resolve_agent_token()?;
        let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
        let mem = memory_mb() / u64::from(n);
        let mut children = Vec::new();
        for i in 0..n {
            let dir = config.data_dir.join("agents").join(format!("local-{i}"));
            std::fs::create_dir_all(&dir)?;
            let log = std::fs::File::create(dir.with_extension("log"))?;
            let child = Command::new(&bin)
                .arg("--server")
                .arg(format!("http://{addr}"))
                .arg("--work-dir")
                .arg(&dir)
                .arg("--host")
                .arg(format!("local-{i}"))
                .arg("--token")
                .arg(&token)
                .arg("--resources")
                .arg(format!("cpu={cores},mem={mem}"))
                .arg("--attr")
                .arg(format!("zone=z{}", i % 3 + 1))
                .arg("--ports")
                .arg(format!("{}-{}", 31000 + i * 1000, 31999 + i * 1000))
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", bin.display()))?;
            println!(
                "pelotond: started agent local-{i} (pid {}, work dir {}, log {})",
                child.id().unwrap_or(0),
                dir.display(),
                dir.with_extension("log").display()
            );
            children.push(child);
        }
        Ok(children)
    }

    /// SIGTERM, then SIGKILL after 5 s. The agents leave their tasks
    /// running (a restarted agent takes them over).
    pub async fn stop_agents(children: Vec<Child>) {
        for mut c in children {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status();
            }
            if tokio::time::timeout(Duration::from_secs(5), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}
