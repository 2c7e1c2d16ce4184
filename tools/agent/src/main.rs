//! `peloton-agent`: the host agent binary (see `peloton-agent --help`).
//!
//! The same binary is also each run's wrapper (`peloton-agent exec`) and
//! the trampoline that executes a task (`peloton-agent exec-task`); those
//! hidden modes are recognised by the first argument before anything else,
//! and run without an async runtime or logging setup.
//!
//! SIGTERM and SIGINT stop the agent with exit code 0 and leave its tasks
//! running: they belong to their wrappers, not to the agent, and an agent
//! started again on the same `--work-dir` re-adopts them. With
//! `--stop-tasks-on-exit` the agent stops them first (a second signal kills
//! them at once).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use peloton_agent::{Args, Supervisor, run_session, run_trampoline, run_wrapper};

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let mode = argv.nth(1);
    match mode.as_ref().and_then(|m| m.to_str()) {
        Some("exec") => return hidden_mode(argv.collect(), run_wrapper),
        Some("exec-task") => return hidden_mode(argv.collect(), run_trampoline),
        _ => {}
    }
    let args = Args::parse();
    init_logging(args.log_json);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The log is stderr: one line says it all.
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `exec --sandbox DIR` / `exec-task --sandbox DIR` (internal: only the
/// agent and the wrapper call them).
fn hidden_mode(rest: Vec<OsString>, mode: fn(&std::path::Path) -> i32) -> ExitCode {
    let [flag, dir] = rest.as_slice() else {
        eprintln!("usage (internal): peloton-agent exec|exec-task --sandbox DIR");
        return ExitCode::from(2);
    };
    if flag != "--sandbox" {
        eprintln!("usage (internal): peloton-agent exec|exec-task --sandbox DIR");
        return ExitCode::from(2);
    }
    let code = mode(&PathBuf::from(dir));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal, not in log files.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the agent's own binary")?;
    let config = args.resolve(exe)?;
    let isolation = &config.supervisor.isolation;
    if let Some(why) = &config.isolation_fallback {
        tracing::info!(%why, "cgroup v2 isolation is not available");
    }
    tracing::info!(
        isolation = isolation.name(),
        enforced = %isolation.summary(config.supervisor.open_files),
        "isolation"
    );
    let resources = &config.session.resources;
    tracing::info!(
        host = %config.session.host,
        cpu = resources.cpu,
        memory_mb = resources.memory_mb,
        disk_mb = resources.disk_mb,
        gpu = resources.gpu,
        ports = %config
            .supervisor
            .ports
            .map_or_else(|| "none".to_owned(), |p| p.to_string()),
        work_dir = %config.supervisor.work_dir.display(),
        "offering"
    );
    let supervisor = Supervisor::open(config.supervisor)?;
    tracing::info!(
        runs = supervisor.run_count(),
        "runs taken over from the work directory"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (stop_tx, stop_rx) = tokio::sync::mpsc::channel(4);
    runtime.spawn(forward_stop_signals(stop_tx));
    runtime.block_on(run_session(config.session, supervisor, stop_rx));
    // Blocking work in flight (a launch, a log read) gets a moment to finish.
    runtime.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}

/// Every SIGTERM or SIGINT becomes a stop request (the first stops the
/// agent; with `--stop-tasks-on-exit` a second kills the tasks at once).
async fn forward_stop_signals(stop: tokio::sync::mpsc::Sender<()>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => Some(terminate),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the agent");
            None
        }
    };
    loop {
        let received = match terminate.as_mut() {
            Some(terminate) => tokio::select! {
                _ = terminate.recv() => true,
                interrupted = tokio::signal::ctrl_c() => interrupted.is_ok(),
            },
            None => tokio::signal::ctrl_c().await.is_ok(),
        };
        if !received {
            // No signal can be listened for: nothing will ever stop us.
            tracing::warn!("cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
        if stop.send(()).await.is_err() {
            return;
        }
    }
}
