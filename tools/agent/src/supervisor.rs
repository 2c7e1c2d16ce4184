//! The run supervisor: launches, kills, watches, re-adopts and forgets runs.
//!
//! A plain synchronous struct, usable (and tested) without gRPC or an async
//! runtime: the session calls its methods and sends what comes out of
//! [`Supervisor::take_reports`]. It never waits for a process: tasks are
//! started, watched and stopped through the [`Launcher`] (see `launcher`).
//! Each run is observed by [`Supervisor::poll`] through the launcher's news
//! of ended tasks, its journal (the launcher's `exit` entry, see `record`)
//! and its task's liveness (`/proc` once the current launcher no longer
//! watches it: a re-adopted run, or one whose launcher died), so a
//! restarted agent is no special case. A running run's journal is read
//! only once its task has gone. Kill grace periods are deadlines checked by
//! `poll`, never sleeps.
//!
//! Every change of a run is appended to its record (a new generation in
//! `run.json`, see `held::persist`) before it is reported, so a report
//! is never ahead of the disk (RUNNING of a run an older agent's wrapper
//! started is the exception, its durable record being the wrapper's
//! `started` entry). Reports wait in an
//! outbox that keeps only the latest report per run (it is bounded by the
//! number of runs, itself bounded by `max_runs`).
//!
//! Health checks run on a checker thread per checked run (`health`),
//! started when the run is seen RUNNING (also after a re-adoption) and
//! stopped when it ends or a kill is requested. They never take the
//! supervisor: a change of health lands in a shared inbox, which `poll` and
//! `take_reports` turn into RUNNING reports, and wakes the session through
//! the waker set by [`Supervisor::set_report_waker`]. Every report carries
//! the run's ports and current health.
//!
//! Its parts: `launch` and `prepare` take runs in and start their tasks,
//! `watch` observes them (ends, memory, health, usage), `stop` kills them,
//! `reports` queues and hands out what changed; `held` is one run as held
//! (its record, journal and reports), `outbox` the queue of reports and
//! `logs` a log read.

mod held;
mod launch;
mod logs;
mod outbox;
mod prepare;
mod reports;
mod stop;
mod watch;

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use nix::fcntl::{Flock, FlockArg};

use crate::gc::{self, GcOutcome, GcPolicy};
use crate::health::HealthInbox;
use crate::isolation::Isolation;
use crate::launcher::Launcher;
use crate::ports::{PortAllocator, PortRange};
use crate::record::{self, RunRecord, SANDBOXES_DIR, STDERR_FILE, STDOUT_FILE};
use crate::run::{LogChunk, LogRequest, RunId};
use crate::secrets;
use crate::volumes::{self, VOLUMES_DIR, VolumeDeletion};
use held::Run;
use outbox::Outbox;

pub use logs::{LogSource, MAX_LOG_CHUNK_BYTES};

/// Default of `--max-runs`.
pub const DEFAULT_MAX_RUNS: usize = 4096;

/// Default RLIMIT_NOFILE of tasks.
pub const DEFAULT_OPEN_FILES: u64 = 65_536;

/// What the supervisor needs to know.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Holds `sandboxes/`, `volumes/` and the agent's lock file.
    pub work_dir: PathBuf,
    /// The `peloton-agent` binary (executed once as the launcher).
    pub agent_exe: PathBuf,
    pub isolation: Isolation,
    /// Ports handed to tasks.
    pub ports: Option<PortRange>,
    /// Runs held at once (alive, or ended and not yet acknowledged).
    pub max_runs: usize,
    /// RLIMIT_NOFILE of every task.
    pub open_files: u64,
    /// GPU devices the host offers (indices 0 to `gpus - 1`): a launch may
    /// name only these, and on a host with GPUs a task given none is shown
    /// none (see `supervisor/prepare.rs`).
    pub gpus: u32,
}

impl SupervisorConfig {
    /// Defaults: rlimit isolation, no ports.
    pub fn new(work_dir: impl Into<PathBuf>, agent_exe: impl Into<PathBuf>) -> Self {
        SupervisorConfig {
            work_dir: work_dir.into(),
            agent_exe: agent_exe.into(),
            isolation: Isolation::Rlimit,
            ports: None,
            max_runs: DEFAULT_MAX_RUNS,
            open_files: DEFAULT_OPEN_FILES,
            gpus: 0,
        }
    }
}

/// How long [`Supervisor::kill_all`] lets tasks end after SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopGrace {
    /// Each run's own kill grace period.
    Own,
    /// None: SIGKILL at once.
    Now,
}

/// Why the supervisor cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot use the work directory {path}: {error}")]
    WorkDir { path: PathBuf, error: io::Error },
    #[error("another peloton-agent is using the work directory {path}")]
    Locked { path: PathBuf },
}

/// The runs of one agent (see the module documentation).
#[derive(Debug)]
pub struct Supervisor {
    config: SupervisorConfig,
    sandboxes: PathBuf,
    /// `WORK_DIR/volumes` (see `volumes`).
    volumes: PathBuf,
    /// Volumes the server deleted while a live run still used them: they
    /// go when that run ends (an old run that outlived its host's loss).
    doomed_volumes: BTreeSet<String>,
    runs: HashMap<RunId, Run>,
    ports: PortAllocator,
    outbox: Outbox,
    /// Starts, watches and stops the runs' tasks (see `launcher`).
    launcher: Launcher,
    /// Runs whose health changed, posted by checker threads.
    health_changes: Arc<HealthInbox>,
    /// Runs' journals held open (see [`OpenJournal`]).
    open_journals: Arc<AtomicUsize>,
    /// When the memory of runs without a cgroup was last looked at (ms).
    memory_watched_ms: u64,
    /// When the runs' checkpoint files were last looked at (ms).
    checkpoints_watched_ms: u64,
    /// When the runs' output sizes were last sampled (ms).
    output_sampled_ms: u64,
    /// Held for the supervisor's life: one agent per work directory.
    _lock: Flock<File>,
}

impl Supervisor {
    /// Locks the work directory, then takes over every run found in it:
    /// live ones are watched again, ended-but-unacknowledged ones will be
    /// reported again, ones whose task vanished without a word are ended
    /// (KILLED if a kill was requested, else FAILED), at `now_ms`.
    pub fn open(mut config: SupervisorConfig, now_ms: u64) -> Result<Supervisor, SupervisorError> {
        let given = config.work_dir.clone();
        let work_dir_error = |error| SupervisorError::WorkDir {
            path: given.clone(),
            error,
        };
        fs::create_dir_all(config.work_dir.join(SANDBOXES_DIR)).map_err(work_dir_error)?;
        fs::create_dir_all(config.work_dir.join(VOLUMES_DIR)).map_err(work_dir_error)?;
        // Absolute, because sandbox paths are handed to tasks and matched in
        // their environments.
        let work_dir = fs::canonicalize(&config.work_dir).map_err(work_dir_error)?;
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(work_dir.join("agent.lock"))
            .map_err(work_dir_error)?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            SupervisorError::Locked {
                path: work_dir.clone(),
            }
        })?;
        config.work_dir = work_dir;
        if let Ok((_, hard)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            && config.open_files > hard
        {
            tracing::info!(
                open_files = config.open_files,
                hard_limit = hard,
                "tasks get RLIMIT_NOFILE {hard} (this process's hard limit) where it cannot be raised"
            );
        }
        let sandboxes = config.work_dir.join(SANDBOXES_DIR);
        let volumes = config.work_dir.join(VOLUMES_DIR);
        let agent_exe = config.agent_exe.clone();
        let mut supervisor = Supervisor {
            ports: PortAllocator::new(config.ports),
            config,
            sandboxes,
            volumes,
            doomed_volumes: Default::default(),
            runs: HashMap::new(),
            outbox: Outbox::default(),
            launcher: Launcher::new(agent_exe),
            health_changes: Arc::new(HealthInbox::default()),
            open_journals: Arc::new(AtomicUsize::new(0)),
            memory_watched_ms: 0,
            checkpoints_watched_ms: 0,
            output_sampled_ms: 0,
            _lock: lock,
        };
        supervisor.adopt_all(now_ms).map_err(work_dir_error)?;
        Ok(supervisor)
    }

    fn adopt_all(&mut self, now_ms: u64) -> io::Result<()> {
        for entry in fs::read_dir(&self.sandboxes)? {
            let dir = entry?.path();
            if !dir.is_dir() {
                continue;
            }
            let record: RunRecord = match record::read_run(&dir) {
                Ok(record) => record,
                Err(e) => {
                    // A launch the agent crashed in before its first write,
                    // or GC's trash: nothing to adopt.
                    tracing::debug!(sandbox = %dir.display(), error = %e, "no run record; skipped");
                    continue;
                }
            };
            if record.acked {
                continue;
            }
            if dir.file_name() != Some(record.key.sandbox_name().as_ref()) {
                tracing::warn!(sandbox = %dir.display(), "run record names another sandbox; skipped");
                continue;
            }
            if self.runs.len() >= self.config.max_runs {
                tracing::warn!(
                    sandbox = %dir.display(),
                    max_runs = self.config.max_runs,
                    "more runs on disk than --max-runs; this one is not watched"
                );
                continue;
            }
            let live = !record.report.phase.is_final();
            if live {
                self.ports.mark_used(record.ports.iter().map(|p| p.port));
            } else {
                // `end` removes them before it records the end; this is
                // for a removal that failed.
                remove_secrets(&record.key, &dir);
            }
            tracing::info!(
                run = %record.key.sandbox_name(),
                phase = ?record.report.phase,
                "found run on disk"
            );
            let key = record.key.clone();
            self.runs.insert(key, Run::new(record, dir));
        }
        self.poll(now_ms);
        Ok(())
    }

    /// Called (from a checker thread, without the supervisor) when a run's
    /// health changes: its RUNNING report is then waiting to be taken
    /// (after [`Supervisor::poll`] or in [`Supervisor::take_reports`]).
    pub fn set_report_waker(&mut self, waker: impl Fn() + Send + Sync + 'static) {
        self.health_changes.set_waker(Arc::new(waker));
    }

    /// The isolation every run gets.
    pub fn isolation(&self) -> &Isolation {
        &self.config.isolation
    }

    /// How many ports the agent offers.
    pub fn port_count(&self) -> u32 {
        self.ports.capacity()
    }

    /// The ranges of ports it hands out.
    pub fn port_ranges(&self) -> Vec<crate::ports::PortRange> {
        self.ports.ranges()
    }

    /// Runs held (alive, or ended and not acknowledged).
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// `WORK_DIR/sandboxes`.
    pub fn sandboxes_dir(&self) -> &Path {
        &self.sandboxes
    }

    /// The sandbox directory of a run (whether or not it exists).
    pub fn sandbox_dir(&self, key: &RunId) -> PathBuf {
        self.sandboxes.join(key.sandbox_name())
    }

    /// Runs that have not ended.
    pub fn live_runs(&self) -> usize {
        self.runs
            .values()
            .filter(|run| !run.record.report.phase.is_final())
            .count()
    }

    /// Where to read a run's stdout or stderr. Cheap (no file I/O): the
    /// reading happens in [`LogSource::read`]. A forgotten (acknowledged)
    /// run's log is still readable until its sandbox is collected.
    pub fn log_source(&self, key: &RunId, stderr: bool) -> LogSource {
        if let Err(problem) = key.validate() {
            return LogSource {
                result: Err(problem),
                ended: None,
            };
        }
        let dir = self.sandboxes.join(key.sandbox_name());
        let file = dir.join(if stderr { STDERR_FILE } else { STDOUT_FILE });
        LogSource {
            result: Ok((dir, file)),
            ended: self
                .runs
                .get(key)
                .map(|run| run.record.report.phase.is_final()),
        }
    }

    /// Answers a log read (blocking file I/O).
    pub fn read_log(&self, request: &LogRequest) -> LogChunk {
        self.log_source(&request.key, request.stderr).read(request)
    }

    /// Removes the sandboxes of acknowledged runs that `policy` lets go
    /// (blocking; see [`gc::collect`]), and the trash of volume deletions
    /// that did not finish. Volumes themselves are never collected.
    pub fn collect_garbage(&self, policy: &GcPolicy, now_ms: u64) -> GcOutcome {
        volumes::remove_trash(&self.volumes);
        gc::collect(&self.sandboxes, policy, now_ms)
    }

    /// `WORK_DIR/volumes`.
    pub fn volumes_dir(&self) -> &Path {
        &self.volumes
    }

    /// The ids of the volumes on this agent's disk, for
    /// `AgentRegister.volumes` (reads a directory: blocking, small).
    pub fn volumes(&self) -> Vec<String> {
        volumes::list(&self.volumes)
    }

    /// `DeleteVolumes`: takes these volumes off the disk's list at once;
    /// their data goes with [`VolumeDeletion::finish`], to be called
    /// without the supervisor (it may be slow). Invalid and unknown ids are
    /// ignored; a volume that a live run of this agent uses is kept (the
    /// server never asks for that; it is logged). `now_ms` (the wall clock,
    /// ms) names the trash.
    pub fn delete_volumes(&mut self, ids: &[String], now_ms: u64) -> VolumeDeletion {
        let mut deletion = VolumeDeletion::default();
        for id in ids {
            if let Err(problem) = volumes::validate_id(id) {
                tracing::warn!(%problem, "volume deletion ignored");
                continue;
            }
            let user = self.runs.values().find(|run| {
                !run.record.report.phase.is_final() && run.record.volume.as_deref() == Some(id)
            });
            if let Some(run) = user {
                tracing::info!(
                    volume = %id,
                    run = %run.record.key.sandbox_name(),
                    "a live run uses the volume: deleted once that run ends"
                );
                self.doomed_volumes.insert(id.clone());
                continue;
            }
            match volumes::to_trash(&self.volumes, id, now_ms) {
                Ok(Some(trash)) => {
                    tracing::info!(volume = %id, "volume deleted");
                    deletion.push(trash);
                }
                Ok(None) => tracing::debug!(volume = %id, "deletion of an unknown volume ignored"),
                Err(e) => tracing::warn!(volume = %id, error = %e, "cannot delete the volume"),
            }
        }
        deletion
    }
}

fn remove_secrets(key: &RunId, dir: &Path) {
    if let Err(e) = secrets::remove(dir) {
        tracing::warn!(
            run = %key.sandbox_name(),
            error = %e,
            "cannot remove the run's secrets from its sandbox"
        );
    }
}
