//! `peloton-agent`: the host agent binary (see `peloton-agent --help`).
//!
//! The same binary is also the agent's launcher (`peloton-agent launcher`,
//! which starts every task and records its end); that hidden mode is
//! recognised by the first argument before anything else, and runs without
//! an async runtime or logging setup.
//!
//! SIGTERM and SIGINT stop the agent with exit code 0 and leave its tasks
//! running: they belong to the launcher, not to the agent, and an agent
//! started again on the same `--work-dir` re-adopts them. With
//! `--stop-tasks-on-exit` the agent stops them first (a second signal kills
//! them at once). With `--exit-with-parent PID` the end of that process
//! (its parent, say `pelotond --local-agents`, even SIGKILLed) is such a
//! SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use peloton_agent::{Args, MpirunArgs, Supervisor, run_launcher, run_mpirun, run_session};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The launcher (started once by the agent, see `launcher`): recognised
    // before anything else, and run without an async runtime or logging.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|mode| mode == "launcher")
    {
        return ExitCode::from(u8::try_from(run_launcher()).unwrap_or(1));
    }
    // `peloton-agent mpirun -- PROGRAM ...`, run by a gang member's task
    // (see `mpi`): no runtime, no logging either.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|mode| mode == "mpirun")
    {
        let name = std::ffi::OsString::from("peloton-agent mpirun");
        let args = MpirunArgs::parse_from(std::iter::once(name).chain(std::env::args_os().skip(2)));
        return ExitCode::from(u8::try_from(run_mpirun(args)).unwrap_or(1));
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
    let exit_with_parent = args.exit_with_parent;
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
    if let Some(warning) = config
        .supervisor
        .ports
        .and_then(peloton_agent::ephemeral_overlap_warning)
    {
        tracing::warn!("{warning}");
    }
    let supervisor = Supervisor::open(config.supervisor, peloton_agent::now_ms())?;
    tracing::info!(
        runs = supervisor.run_count(),
        "runs taken over from the work directory"
    );
    // One thread for everything: the session's async work (a gRPC stream,
    // timers, signals) and the supervisor's calls, made on that thread (see
    // `session::with_supervisor`); only garbage collection, volume deletion
    // and log reads go to blocking threads. Two worker threads woke each
    // other for every message, and a thread switch cost more than most of
    // the agent's work for a short task.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (stop_tx, stop_rx) = tokio::sync::mpsc::channel(4);
    // Listening from here on: a SIGTERM from the parent's death (below)
    // is a stop request like any other, never the default action.
    let signals = {
        let _runtime = runtime.enter();
        StopSignals::listen()
    };
    runtime.spawn(forward_stop_signals(
        signals,
        stop_tx.clone(),
        exit_with_parent.is_some(),
    ));
    if let Some(parent) = exit_with_parent
        && !stop_with_parent(parent)?
    {
        tracing::info!(parent, "the parent process has already ended; stopping");
        let _ = stop_tx.try_send(());
    }
    runtime.block_on(run_session(config.session, supervisor, stop_rx));
    // Blocking work in flight (a log read, a volume deletion) gets a moment
    // to finish.
    runtime.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}

/// `--exit-with-parent PID`: the kernel sends this process SIGTERM when
/// its parent ends. Returns whether the parent is still `parent`: if it
/// ended before the request took effect, no signal will come.
fn stop_with_parent(parent: u32) -> anyhow::Result<bool> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
        .context("--exit-with-parent: cannot set the parent-death signal")?;
    Ok(u32::try_from(nix::unistd::getppid().as_raw()) == Ok(parent))
}

/// SIGTERM and SIGINT, listened for from creation on (in a runtime
/// context).
struct StopSignals {
    terminate: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn listen() -> StopSignals {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(signal) => Some(signal),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for {name}");
                None
            }
        };
        StopSignals {
            terminate: listen(SignalKind::terminate(), "SIGTERM"),
            interrupt: listen(SignalKind::interrupt(), "SIGINT"),
        }
    }
}

/// How long after a SIGTERM further ones are taken for the same parent's
/// death (see [`forward_stop_signals`]).
const PARENT_DEATH_ECHO: Duration = Duration::from_secs(1);

/// Every SIGTERM or SIGINT becomes a stop request (the first stops the
/// agent; with `--stop-tasks-on-exit` a second kills the tasks at once).
///
/// With `--exit-with-parent`, SIGTERMs that follow one within
/// [`PARENT_DEATH_ECHO`] are dropped: when a multi-threaded parent dies,
/// the kernel sends the parent-death signal each time the child passes to
/// another of the parent's exiting threads, so one death can arrive as
/// several SIGTERMs, and the second would kill the tasks before they had
/// their grace period.
async fn forward_stop_signals(
    mut signals: StopSignals,
    stop: tokio::sync::mpsc::Sender<()>,
    parent_death: bool,
) {
    async fn next(signal: Option<&mut tokio::signal::unix::Signal>) -> bool {
        match signal {
            Some(signal) => signal.recv().await.is_some(),
            None => std::future::pending().await,
        }
    }
    if signals.terminate.is_none() && signals.interrupt.is_none() {
        // No signal can be listened for: nothing will ever stop us.
        return;
    }
    let mut last_term: Option<std::time::Instant> = None;
    loop {
        let (received, term) = tokio::select! {
            received = next(signals.terminate.as_mut()) => (received, true),
            received = next(signals.interrupt.as_mut()) => (received, false),
        };
        if !received {
            return;
        }
        if term && parent_death {
            let now = std::time::Instant::now();
            let echo = last_term.is_some_and(|t| now.duration_since(t) < PARENT_DEATH_ECHO);
            last_term = Some(now);
            if echo {
                continue;
            }
        }
        if stop.send(()).await.is_err() {
            return;
        }
    }
}
