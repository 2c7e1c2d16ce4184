//! `pelotond`: the Peloton server.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use peloton_gateway::config::Config;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Peloton scheduler service (gRPC API, embedded store, simulated hosts).
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
    match rt.block_on(serve(config, args.demo, args.exit_after_demo)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pelotond: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config, demo: bool, exit_after_demo: bool) -> anyhow::Result<()> {
    let server = peloton_gateway::server::start(&config).await?;
    // Tests and scripts read this line to find the port.
    println!("pelotond: serving gRPC on http://{}", server.addr);
    if let Some(m) = server.metrics_addr {
        println!("pelotond: metrics on http://{m}/metrics");
    }
    if demo {
        let state = peloton_gateway::demo::run(server.addr).await?;
        println!("demo: finished: {}", state.as_str_name());
        if exit_after_demo {
            server.shutdown().await?;
            return Ok(());
        }
        println!(
            "pelotond: still serving; try `cargo run -p peloton-cli -- --server http://{} job query`; Ctrl-C stops",
            server.addr
        );
    }
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.shutdown().await?;
    Ok(())
}
