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
//! `run.json`, see `persist`) before it is reported, so a report
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

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;

use crate::gc::{self, GcOutcome, GcPolicy};
use crate::health::{CheckTarget, HealthChecker, HealthInbox, Verdict};
use crate::isolation::{self, Isolation};
use crate::launcher::{Launcher, Start, StartRequest};
use crate::ports::{self, PortAllocator, PortRange};
use crate::proc::{self, LazySnapshot};
use crate::record::{
    self, DEFAULT_KILL_GRACE_MS, DEFAULT_PATH, ExitRecord, RUN_FILE, RunRecord, SANDBOXES_DIR,
    STDERR_FILE, STDOUT_FILE, TaskPlan,
};
use crate::run::{
    AssignedPort, Command, Health, KillRequest, LogChunk, LogRequest, Phase, PhaseReport, RunId,
    RunPlan, RunReport,
};
use crate::secrets;
use crate::usage::{self, RunUsage, UsageReport};
use crate::volumes::{self, VOLUMES_DIR, VolumeDeletion};

/// Default of `--max-runs`.
pub const DEFAULT_MAX_RUNS: usize = 4096;
/// Default RLIMIT_NOFILE of tasks.
pub const DEFAULT_OPEN_FILES: u64 = 65_536;
/// Most bytes in one `LogChunk`.
pub const MAX_LOG_CHUNK_BYTES: usize = 1 << 20;
/// Reports waiting to be sent, at most (kills of unknown runs are the only
/// reports not bounded by the number of runs).
const MAX_OUTBOX: usize = 65_536;
/// How often polls look at the memory of runs without a cgroup, at most:
/// a `/proc` scan and a `smaps_rollup` read per process each time, however
/// often polls come (every end the launcher records brings one).
const MEMORY_WATCH_INTERVAL_MS: u64 = 200;
/// Variables of the agent's environment that tasks inherit (nothing else:
/// the agent's environment may hold its token).
const INHERITED_ENV: [&str; 3] = ["PATH", "LANG", "TZ"];

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
        }
    }
}

/// When a kill's signals go: the stop signal `delay_ms` after the kill,
/// SIGKILL `grace_ms` after that.
#[derive(Debug, Clone, Copy)]
struct KillTiming {
    delay_ms: u64,
    grace_ms: u64,
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

/// One run the supervisor holds.
#[derive(Debug)]
struct Run {
    record: RunRecord,
    dir: PathBuf,
    /// The task plan, until the first record writes it to the journal.
    plan: Option<TaskPlan>,
    /// The health checker, from RUNNING on (kept, stopped, once the run
    /// has ended or is being killed: its last verdict is still reported).
    checker: Option<HealthChecker>,
    /// The `exit` entry the launcher reported writing (so the journal is
    /// not read back for it).
    exit: Option<ExitRecord>,
    /// Whether the sandbox may hold secrets to remove at the end: false
    /// only for a run this agent launched without any (a run adopted after
    /// a restart may have some).
    may_hold_secrets: bool,
    /// The journal, open (see [`OpenJournal`]).
    journal: Option<OpenJournal>,
}

impl Run {
    fn new(record: RunRecord, dir: PathBuf) -> Run {
        Run {
            record,
            dir,
            plan: None,
            checker: None,
            exit: None,
            may_hold_secrets: true,
            journal: None,
        }
    }

    fn verdict(&self) -> Verdict {
        match (&self.record.health_check, &self.checker) {
            (None, _) => Verdict::none(),
            (Some(_), None) => Verdict::unknown(),
            (Some(_), Some(checker)) => checker.verdict(),
        }
    }

    /// The run's report: its phase, ports and health.
    fn report(&self) -> RunReport {
        let verdict = self.verdict();
        RunReport {
            key: self.record.key.clone(),
            phase: self.record.report.clone(),
            ports: self.record.ports.clone(),
            health: verdict.health,
            health_detail: verdict.detail,
        }
    }

    /// Stops health checks (they may go on a moment: see `HealthChecker`).
    fn stop_checks(&self) {
        if let Some(checker) = &self.checker {
            checker.stop();
        }
    }
}

/// The latest report per run, oldest first.
#[derive(Debug, Default)]
struct Outbox {
    order: VecDeque<RunId>,
    reports: HashMap<RunId, RunReport>,
    dropped: u64,
}

impl Outbox {
    fn push(&mut self, key: &RunId, report: RunReport) {
        if let Some(slot) = self.reports.get_mut(key) {
            *slot = report;
            return;
        }
        if self.reports.len() >= MAX_OUTBOX {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                tracing::warn!(
                    dropped = self.dropped,
                    "report outbox full; dropping reports of unknown runs"
                );
            }
            return;
        }
        // Keys of removed reports linger in `order`; compact before it grows
        // far past the reports it indexes.
        if self.order.len() > 2 * self.reports.len() + 64 {
            let reports = &self.reports;
            self.order.retain(|k| reports.contains_key(k));
        }
        self.order.push_back(key.clone());
        self.reports.insert(key.clone(), report);
    }

    fn take(&mut self, max: usize) -> Vec<RunReport> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if let Some(report) = self.reports.remove(&key) {
                out.push(report);
            }
        }
        out
    }

    fn remove(&mut self, key: &RunId) {
        self.reports.remove(key);
    }
}

/// Where a log read goes, resolved under the supervisor and read without
/// it (see [`Supervisor::log_source`]).
#[derive(Debug, Clone)]
pub struct LogSource {
    result: Result<(PathBuf, PathBuf), String>,
    /// Known when the run is held; else read from its `run.json`.
    ended: Option<bool>,
}

impl LogSource {
    /// Reads up to `max_bytes` (0 or more than 1 MiB: 1 MiB) from `offset`.
    /// Blocking file I/O: call it off the async runtime.
    pub fn read(&self, request_id: u64, offset: u64, max_bytes: u32) -> LogChunk {
        let mut chunk = LogChunk {
            request_id,
            offset,
            ..LogChunk::default()
        };
        let (dir, file) = match &self.result {
            Ok(paths) => paths,
            Err(error) => {
                chunk.error.clone_from(error);
                return chunk;
            }
        };
        // Decided before reading: once a run has ended its files no longer
        // grow, so "ended, and this reaches the end" is then final.
        let ended = match self.ended {
            Some(ended) => ended,
            None => match record::read_run(dir) {
                Ok(run) => run.acked || run.report.phase.is_final(),
                Err(e) => {
                    chunk.error = format!("no sandbox for this run: {e}");
                    return chunk;
                }
            },
        };
        let max = match usize::try_from(max_bytes) {
            Ok(0) | Err(_) => MAX_LOG_CHUNK_BYTES,
            Ok(n) => n.min(MAX_LOG_CHUNK_BYTES),
        };
        match read_range(file, offset, max) {
            // The output files are created with the task: a run that
            // failed before it has none, and nothing to show.
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir.join(RUN_FILE).exists() => {
                chunk.eof = ended;
            }
            Ok((data, len)) => {
                chunk.eof = ended && offset.saturating_add(data.len() as u64) >= len;
                chunk.data = data;
            }
            Err(e) => chunk.error = format!("cannot read {}: {e}", file.display()),
        }
        chunk
    }
}

/// Up to `max` bytes of `path` from `offset`, and the file's length.
fn read_range(path: &Path, offset: u64, max: usize) -> io::Result<(Vec<u8>, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    if offset >= len {
        return Ok((Vec::new(), len));
    }
    file.seek(SeekFrom::Start(offset))?;
    let want = usize::try_from(len - offset).map_or(max, |rest| rest.min(max));
    let mut data = Vec::with_capacity(want);
    file.take(want as u64).read_to_end(&mut data)?;
    Ok((data, len))
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
    doomed_volumes: std::collections::BTreeSet<String>,
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

    /// Starts runs. A run whose sandbox already exists was launched before:
    /// the launch is ignored (launches are idempotent). `now_ms` is the
    /// time of the launch (the wall clock, ms).
    pub fn launch(&mut self, runs: &[RunPlan], now_ms: u64) {
        // Runs on record and ready (in `self.runs` already), whose tasks
        // start together.
        let mut ready = Vec::new();
        for plan in runs {
            if let Some(run) = self.launch_one(plan, now_ms) {
                ready.push(run);
            }
        }
        self.start_tasks(ready, now_ms);
    }

    /// Takes a run in (into `self.runs`, unless it is a known run): its
    /// sandbox made and its first record written, its key is returned with
    /// its sandbox and task plan to have its task started (by
    /// [`Supervisor::start_tasks`]), unless it has failed already.
    fn launch_one(
        &mut self,
        launch: &RunPlan,
        now: u64,
    ) -> Option<(RunId, PathBuf, Option<TaskPlan>)> {
        let key = launch.key.clone();
        if let Err(problem) = key.validate() {
            // No sandbox can be named after it, so this failure is not
            // durable: the server learns of it once.
            self.outbox
                .push(&key, bare_report(&key, PhaseReport::failed(now, problem)));
            return None;
        }
        let dir = self.sandboxes.join(key.sandbox_name());
        if self.runs.contains_key(&key) {
            tracing::debug!(run = %key.sandbox_name(), "launch of a known run ignored");
            return None;
        }
        if self.runs.len() >= self.config.max_runs {
            if dir.join(RUN_FILE).exists() {
                tracing::debug!(run = %key.sandbox_name(), "launch of a known run ignored");
                return None;
            }
            let reason = format!(
                "the agent already holds {} runs (its --max-runs)",
                self.runs.len()
            );
            self.outbox
                .push(&key, bare_report(&key, PhaseReport::failed(now, reason)));
            return None;
        }
        // Created first: a sandbox that exists already is looked at only
        // then (a launch seldom finds one), which saves two lookups a run.
        let mut created = fs::create_dir(&dir);
        if matches!(&created, Err(e) if e.kind() == io::ErrorKind::AlreadyExists) {
            if dir.join(RUN_FILE).exists() {
                // An acknowledged run (the server resent the launch).
                tracing::debug!(run = %key.sandbox_name(), "launch of a known run ignored");
                return None;
            }
            // An agent died creating it, before the record that a task's
            // start always follows: nothing runs there, start afresh.
            created = fs::remove_dir_all(&dir).and_then(|()| fs::create_dir(&dir));
        }
        if let Err(e) = created {
            let reason = format!("cannot create the sandbox {}: {e}", dir.display());
            self.outbox
                .push(&key, bare_report(&key, PhaseReport::failed(now, reason)));
            return None;
        }
        let mut run = Run::new(
            RunRecord {
                key: key.clone(),
                created_ms: now,
                wrapper: None,
                task: None,
                launcher: None,
                ports: Vec::new(),
                cgroup: None,
                kill_requested: false,
                kill_deadline_ms: 0,
                stop_signal_due_ms: None,
                report: PhaseReport::new(Phase::Starting, now),
                acked: false,
                health_check: None,
                volume: None,
                generation: 0,
                kill_grace_ms: match launch.task.as_ref().map_or(0, |t| t.kill_grace_ms) {
                    0 => DEFAULT_KILL_GRACE_MS,
                    ms => ms,
                },
                stop_signal: launch.task.as_ref().ok().and_then(|t| t.stop_signal),
                resident_limit_bytes: None,
                killed_by_agent: None,
                journal: true,
            },
            dir,
        );
        // Debug: the end of the run is logged at info, with its outcome.
        tracing::debug!(run = %key.sandbox_name(), "launching");
        match self.prepare(&mut run, launch) {
            Ok(()) => {
                // Recorded with the first record, and sent to the launcher.
                let plan = run.plan.clone();
                run.may_hold_secrets = !launch.secrets.is_empty();
                self.commit(&mut run);
                // Secrets are written once the run is on record, so that a
                // crash cannot leave them in a sandbox no record owns (such
                // a sandbox is only collected after the age limit).
                match secrets::write(&run.dir, &launch.secrets) {
                    Ok(()) => {
                        let dir = run.dir.clone();
                        self.runs.insert(key.clone(), run);
                        return Some((key, dir, plan));
                    }
                    Err(e) => {
                        let reason = format!("cannot write the secrets into the sandbox: {e}");
                        self.end(&mut run, PhaseReport::failed(now, reason));
                    }
                }
            }
            Err(reason) => self.end(&mut run, PhaseReport::failed(now, reason)),
        }
        self.runs.insert(key, run);
        None
    }

    /// Checks the spec, takes ports, creates the cgroup, sets up the volume
    /// and the secrets, resolves the task plan (written to the journal with
    /// the run's first record).
    fn prepare(&mut self, run: &mut Run, launch: &RunPlan) -> Result<(), String> {
        let spec = launch.task.as_ref().map_err(Clone::clone)?;
        let (program, args) = match &spec.command {
            Command::Exec { program, args } => (program.clone(), args.clone()),
            Command::Shell(line) => ("/bin/sh".to_owned(), vec!["-c".to_owned(), line.clone()]),
        };
        if program.contains('\0') || args.iter().any(|a| a.contains('\0')) {
            return Err("the task's command contains a NUL byte".to_owned());
        }
        run.record.health_check.clone_from(&spec.health_check);
        let mut env: std::collections::BTreeMap<String, String> = INHERITED_ENV
            .iter()
            .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
            .collect();
        env.entry("PATH".to_owned())
            .or_insert_with(|| DEFAULT_PATH.to_owned());
        for (name, value) in &spec.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(format!("env: {name:?} is not a usable variable"));
            }
            env.insert(name.clone(), value.clone());
        }
        let key = &run.record.key;
        env.insert("PELOTON_JOB_ID".to_owned(), key.job_id.clone());
        env.insert("PELOTON_INSTANCE_ID".to_owned(), key.instance.to_string());
        env.insert("PELOTON_RUN_ID".to_owned(), key.run_id.to_string());
        env.insert("PELOTON_TASK_ID".to_owned(), key.task_id());
        env.insert(
            "PELOTON_SANDBOX".to_owned(),
            run.dir.to_string_lossy().into_owned(),
        );
        // Checked before anything is created for the run.
        let volume = match &launch.volume {
            Some(id) => {
                volumes::validate_id(id)?;
                Some((id.clone(), volumes::mount_path(&spec.volume_path)?))
            }
            None => None,
        };
        secrets::validate(&launch.secrets)?;
        let mut port_names = std::collections::BTreeSet::new();
        for name in &spec.ports {
            if name.is_empty() || !port_names.insert(ports::port_env_name(name)) {
                return Err(format!(
                    "ports: {name:?} is empty or names the same variable as another port"
                ));
            }
        }
        let numbers = self.ports.allocate(spec.ports.len())?;
        for (name, number) in spec.ports.iter().zip(&numbers) {
            env.insert(ports::port_env_name(name), number.to_string());
            run.record.ports.push(AssignedPort {
                name: name.clone(),
                port: *number,
            });
        }
        if let Some((id, path)) = volume {
            // Recorded first: while the run lives, its volume is not deleted.
            run.record.volume = Some(id.clone());
            let target = volumes::ensure(&self.volumes, &id)
                .map_err(|e| format!("cannot create the volume {id:?}: {e}"))?;
            let at = volumes::link(&run.dir, &path, &target).map_err(|e| {
                format!(
                    "cannot make the volume {id:?} visible at {:?} in the sandbox: {e}",
                    path.display()
                )
            })?;
            env.insert(
                "PELOTON_VOLUME".to_owned(),
                at.to_string_lossy().into_owned(),
            );
        }
        if !launch.secrets.is_empty() {
            // The values go to their files only (see `launch_one`); the
            // environment, and so the journal's plan, gets the directory.
            env.insert(
                "PELOTON_SECRETS".to_owned(),
                secrets::dir(&run.dir).to_string_lossy().into_owned(),
            );
        }
        let resources = spec.resources;
        let mut plan = TaskPlan {
            program,
            args,
            env: env.into_iter().collect(),
            open_files: Some(self.config.open_files),
            cgroup: None,
        };
        // The memory limit (at least `MEMORY_LIMIT_MIN_BYTES`) limits what
        // the task's processes hold, never the address space they map:
        // `memory.max`, or the agent's watch (either `memory_limit`).
        match &self.config.isolation {
            Isolation::Rlimit => {
                run.record.resident_limit_bytes =
                    isolation::memory_limit_bytes(resources.memory_mb);
            }
            Isolation::CgroupV2 { parent } => {
                let cgroup = isolation::create_run_cgroup(parent, &key.sandbox_name(), &resources)
                    .map_err(|e| format!("cannot create the run's cgroup: {e}"))?;
                run.record.cgroup = Some(cgroup.clone());
                plan.cgroup = Some(cgroup);
            }
        }
        run.plan = Some(plan);
        Ok(())
    }

    /// Starts the tasks of runs taken in by [`Supervisor::launch_one`], in
    /// order, through the launcher in one batch of requests.
    fn start_tasks(&mut self, ready: Vec<(RunId, PathBuf, Option<TaskPlan>)>, now_ms: u64) {
        if ready.is_empty() {
            return;
        }
        let requests: Vec<StartRequest<'_>> = ready
            .iter()
            .map(|(key, dir, plan)| StartRequest {
                key,
                dir,
                plan: plan.as_ref(),
            })
            .collect();
        let starts = self.launcher.start(&requests);
        for ((key, _, _), start) in ready.iter().zip(starts) {
            let Some(mut run) = self.runs.remove(key) else {
                continue;
            };
            if let Err(reason) = self.started(&mut run, start, now_ms) {
                self.end(&mut run, PhaseReport::failed(now_ms, reason));
            }
            self.runs.insert(key.clone(), run);
        }
    }

    /// Takes in what became of the start of `run`'s task.
    fn started(&mut self, run: &mut Run, start: Start, now_ms: u64) -> Result<(), String> {
        match start {
            Start::Running {
                task,
                launcher,
                started_ms,
            } => {
                run.record.task = Some(task);
                run.record.launcher = Some(launcher);
                // The task has executed: it runs (a `started` entry
                // would say no more than this record does) since the
                // launcher's clock said so (the wall clock it stamps the
                // run's `exit` entry with), not since the launch or this
                // answer (a short task may have ended meanwhile). 0 only
                // from a launcher that sends no time. A clock stepped back
                // meanwhile cannot end the run before it started (`end`).
                let started = if started_ms == 0 { now_ms } else { started_ms };
                run.record.report = PhaseReport::new(Phase::Running, started);
                self.commit(run);
                Ok(())
            }
            Start::NotStarted { launcher } => {
                // It could not start; the launcher recorded why.
                run.record.launcher = Some(launcher);
                let exit = record::read_news(&run.dir, true)
                    .map_err(|e| format!("cannot read why the task did not start: {e}"))?
                    .exit
                    .ok_or_else(|| "the task did not start (no reason recorded)".to_owned())?;
                let report = final_report(&exit, run.record.kill_requested);
                self.end(run, report);
                Ok(())
            }
            Start::Failed(reason) => Err(reason),
        }
    }

    /// Takes the launcher's news: which tasks' ends it has recorded.
    fn take_launcher_news(&mut self) {
        for (key, exit) in self.launcher.take_ended() {
            if let Some(run) = self.runs.get_mut(&key) {
                run.exit = Some(exit);
            }
        }
    }

    /// Writes the run's record and queues its report.
    fn commit(&mut self, run: &mut Run) {
        persist(run, &self.open_journals);
        self.outbox.push(&run.record.key, run.report());
    }

    /// The run has ended with `report`: give back its ports and cgroup,
    /// record, report.
    fn end(&mut self, run: &mut Run, report: PhaseReport) {
        debug_assert!(report.phase.is_final());
        // A success is the common case (thousands a second on a busy
        // host): at debug. Failures and kills stay at info.
        if report.phase == Phase::Succeeded {
            tracing::debug!(run = %run.record.key.sandbox_name(), "run succeeded");
        } else {
            tracing::info!(
                run = %run.record.key.sandbox_name(),
                phase = ?report.phase,
                reason = %report.reason,
                "run ended"
            );
        }
        let started_ms = report.started_ms.max(run.record.report.started_ms);
        run.record.report = PhaseReport {
            started_ms,
            // Never before its start: the two may come from different
            // readings of a clock (a launcher's start time after the
            // `now` of the poll that saw it gone) or a clock stepped back.
            time_ms: report.time_ms.max(started_ms),
            ..report
        };
        run.stop_checks();
        // Before the end is recorded: a crash in between leaves a live
        // record, whose end is observed (and this done) again.
        if run.may_hold_secrets {
            remove_secrets(&run.record.key, &run.dir);
        }
        self.ports.release(run.record.ports.iter().map(|p| p.port));
        if let Some(cgroup) = &run.record.cgroup {
            isolation::kill_cgroup(cgroup);
            if let Err(e) = isolation::remove_cgroup(cgroup) {
                tracing::warn!(cgroup = %cgroup.display(), error = %e, "cannot remove the run's cgroup");
            }
        }
        self.commit(run);
        if let Some(id) = run.record.volume.clone()
            && self.doomed_volumes.contains(&id)
            && !self.runs.values().any(|r| {
                r.record.key != run.record.key
                    && !r.record.report.phase.is_final()
                    && r.record.volume.as_deref() == Some(id.as_str())
            })
        {
            self.doomed_volumes.remove(&id);
            // Renamed to trash now (gone from the agent's list); the data
            // goes with the next garbage collection.
            match volumes::to_trash(&self.volumes, &id) {
                Ok(_) => tracing::info!(volume = %id, "volume deleted after its last run ended"),
                Err(e) => tracing::warn!(volume = %id, error = %e, "cannot delete the volume"),
            }
        }
    }

    /// Looks at every live run once: started? exited? task gone? kill
    /// deadline passed? `now_ms` is the wall clock (ms) of the look.
    pub fn poll(&mut self, now_ms: u64) {
        let now = now_ms;
        self.take_launcher_news();
        let keys: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, run)| !run.record.report.phase.is_final())
            .map(|(key, _)| key.clone())
            .collect();
        let mut procs = LazySnapshot::default();
        let watch_memory = now
            >= self
                .memory_watched_ms
                .saturating_add(MEMORY_WATCH_INTERVAL_MS);
        if watch_memory {
            self.memory_watched_ms = now;
        }
        for key in keys {
            let Some(mut run) = self.runs.remove(&key) else {
                continue;
            };
            self.observe(&mut run, now, &mut procs);
            if watch_memory {
                self.watch_memory(&mut run, &mut procs);
            }
            self.runs.insert(key, run);
        }
        self.report_health_changes();
    }

    /// Holds a run without a cgroup to its memory limit: SIGKILL to the
    /// task and its descendants once what they hold (their PSS) is above
    /// it; the run ends FAILED, "memory limit exceeded".
    fn watch_memory(&self, run: &mut Run, procs: &mut LazySnapshot) {
        let Some(limit) = run.record.resident_limit_bytes else {
            return;
        };
        if run.record.kill_requested || run.record.report.phase.is_final() {
            return;
        }
        let Some((root, with_root)) = self.launcher.memory_root(&run.record) else {
            return;
        };
        let mut pids = procs.get().descendants(root.pid);
        if with_root {
            pids.push(root.pid);
        }
        if run.record.killed_by_agent.is_some() {
            // Killed already: anything left (forked meanwhile, or an
            // agent restart between the record and the kill) goes too.
            proc::kill_all(&pids);
            return;
        }
        let used = proc::resident_bytes(&pids);
        if used > limit {
            let why = format!(
                "memory limit exceeded: its processes held {} MiB, above its limit of {} MiB",
                used >> 20,
                limit >> 20
            );
            tracing::warn!(run = %run.record.key.sandbox_name(), %why, "killing");
            run.record.killed_by_agent = Some(why);
            persist(run, &self.open_journals);
            proc::kill_all(&pids);
        }
    }

    /// What every live run uses now (see `usage`): from its cgroup if it
    /// has one, else over its process tree (one `/proc` scan for all); at
    /// most `MAX_USAGE_RUNS` of them, in key order.
    pub fn usage(&self, now_ms: u64) -> UsageReport {
        let mut procs = LazySnapshot::default();
        let mut runs: Vec<RunUsage> = self
            .runs
            .values()
            .filter(|run| !run.record.report.phase.is_final())
            .filter_map(|run| {
                let (cpu_usec, memory_bytes) = match &run.record.cgroup {
                    Some(cgroup) => usage::measure_cgroup(cgroup)?,
                    None => {
                        let (root, with_root) = self.launcher.memory_root(&run.record)?;
                        let mut pids = procs.get().descendants(root.pid);
                        if with_root {
                            pids.push(root.pid);
                        }
                        usage::measure_processes(&pids)
                    }
                };
                Some(RunUsage {
                    key: run.record.key.clone(),
                    cpu_usec,
                    memory_bytes,
                    disk_bytes: 0,
                })
            })
            .collect();
        runs.sort_by(|a, b| a.key.cmp(&b.key));
        runs.truncate(usage::MAX_USAGE_RUNS);
        UsageReport {
            time_ms: now_ms,
            runs,
        }
    }

    /// Queues a RUNNING report for every run whose health changed (it
    /// carries the health of now, which may have changed again since).
    fn report_health_changes(&mut self) {
        for key in self.health_changes.take() {
            if let Some(run) = self.runs.get(&key)
                && run.record.report.phase == Phase::Running
                && !run.record.kill_requested
            {
                self.outbox.push(&key, run.report());
            }
        }
    }

    /// Starts the run's checker if it is RUNNING, has a check, and has no
    /// checker yet (just started, or re-adopted).
    fn start_checks(&self, run: &mut Run) {
        let Some(plan) = &run.record.health_check else {
            return;
        };
        if run.checker.is_some()
            || run.record.report.phase != Phase::Running
            || run.record.kill_requested
        {
            return;
        }
        let target = CheckTarget {
            key: run.record.key.clone(),
            dir: run.dir.clone(),
            ports: run.record.ports.clone(),
            started_ms: run.record.report.started_ms,
        };
        match HealthChecker::start(plan.clone(), target, self.health_changes.clone()) {
            Ok(checker) => run.checker = Some(checker),
            // Tried again at the next poll; meanwhile HEALTH_UNKNOWN.
            Err(e) => tracing::warn!(
                run = %run.record.key.sandbox_name(),
                error = %e,
                "cannot start the health checker"
            ),
        }
    }

    fn observe(&mut self, run: &mut Run, now: u64, procs: &mut LazySnapshot) {
        if run.record.report.phase.is_final() {
            return;
        }
        // Liveness first, then the exit entry: the launcher writes it
        // before it forgets the task, so "gone and no exit entry" is really
        // lost, unless the launcher is still cleaning up after the task.
        let alive = self.launcher.is_alive(&run.record);
        let launcher_recording = !alive && self.launcher.is_recording(&run.record);
        let news = if let Some(exit) = run.exit.take() {
            Ok(record::JournalNews {
                started: None,
                exit: Some(exit),
            })
        } else if run.record.report.phase == Phase::Starting || !alive {
            record::read_news(&run.dir, run.record.journal)
        } else {
            // Running and its task alive: whatever is written about it
            // will have been written when it is gone.
            Ok(record::JournalNews::default())
        };
        let (started, exit) = match news {
            Ok(news) => (news.started, Ok(news.exit)),
            Err(e) => (None, Err(e)),
        };
        if run.record.report.phase == Phase::Starting
            && let Some(started) = started
        {
            run.record.report = PhaseReport::new(Phase::Running, started.time_ms);
            // An older agent's wrapper: reported, not written, its `started` entry is the
            // durable record of it (a restarted agent finds it again), and
            // one write less per run is measurable in launches per second.
            self.outbox.push(&run.record.key, run.report());
        }
        match exit {
            Ok(Some(exit)) => {
                let mut report = final_report(&exit, run.record.kill_requested);
                if let Some(why) = &run.record.killed_by_agent
                    && report.phase != Phase::Succeeded
                {
                    report.phase = Phase::Failed;
                    report.oom_killed = true;
                    report.reason = why.clone();
                }
                self.end(run, report);
                return;
            }
            Err(e) => {
                tracing::warn!(run = %run.record.key.sandbox_name(), error = %e, "unreadable exit record");
            }
            Ok(None) => {}
        }
        if launcher_recording {
            // The task is gone and its launcher has yet to record the end
            // (it is cleaning up after it): the entry comes.
            return;
        }
        if !alive {
            // Whatever the task left behind goes with it.
            self.launcher.sweep(&run.record, &run.dir, now, procs);
            let report = if run.record.kill_requested {
                PhaseReport {
                    reason: "killed on request".to_owned(),
                    signal: Signal::SIGKILL as i32,
                    exit_code: 128 + Signal::SIGKILL as i32,
                    ..PhaseReport::new(Phase::Killed, now)
                }
            } else {
                PhaseReport::failed(now, "agent lost the run's exit status".to_owned())
            };
            self.end(run, report);
            return;
        }
        if run.record.kill_requested
            && let Some(due) = run.record.stop_signal_due_ms
            && now >= due
        {
            run.record.stop_signal_due_ms = None;
            persist(run, &self.open_journals);
            tracing::info!(run = %run.record.key.sandbox_name(), "deregistration delay over: stopping");
            self.launcher.terminate(&run.record, &run.dir, procs);
        }
        if run.record.kill_requested && now >= run.record.kill_deadline_ms {
            self.launcher.sweep(&run.record, &run.dir, now, procs);
        }
        self.start_checks(run);
    }

    /// Stops runs: SIGTERM once `delay_ms` (the task's deregistration
    /// delay) has passed — now, without one — and SIGKILL to the whole tree
    /// `grace_ms` after it (see [`Supervisor::poll`]). A second kill of a
    /// run never puts its signals off: each goes at the earliest time any
    /// kill asked for. An unknown run is reported KILLED at once; an ended
    /// one has its final phase reported again; an acknowledged one stays
    /// silent (it is never reported again). `now_ms` is the time of the
    /// kill.
    pub fn kill(&mut self, requests: &[KillRequest], now_ms: u64) {
        let mut procs = LazySnapshot::default();
        for request in requests {
            let timing = KillTiming {
                delay_ms: request.delay_ms,
                grace_ms: request.grace_ms,
            };
            self.kill_one(request.key.clone(), timing, now_ms, &mut procs);
        }
    }

    fn kill_one(&mut self, key: RunId, timing: KillTiming, now: u64, procs: &mut LazySnapshot) {
        let Some(mut run) = self.runs.remove(&key) else {
            let acked_on_disk = key.validate().is_ok()
                && self
                    .sandboxes
                    .join(key.sandbox_name())
                    .join(RUN_FILE)
                    .exists();
            if acked_on_disk {
                tracing::debug!(run = %key.sandbox_name(), "kill of an acknowledged run ignored");
            } else {
                let report = PhaseReport {
                    reason: "not running on this host".to_owned(),
                    ..PhaseReport::new(Phase::Killed, now)
                };
                let report = bare_report(&key, report);
                self.outbox.push(&key, report);
            }
            return;
        };
        // It may have ended since the last poll; then that is its phase.
        self.observe(&mut run, now, procs);
        if run.record.report.phase.is_final() {
            self.outbox.push(&key, run.report());
        } else {
            let KillTiming { delay_ms, grace_ms } = timing;
            let asked = now.saturating_add(delay_ms);
            let due = match (run.record.kill_requested, run.record.stop_signal_due_ms) {
                (false, _) => asked,
                (true, Some(waiting)) => waiting.min(asked),
                // Sent already: again now, as a repeated kill always did.
                (true, None) => now,
            };
            let deadline = due.saturating_add(grace_ms);
            if !run.record.kill_requested || deadline < run.record.kill_deadline_ms {
                run.record.kill_deadline_ms = deadline;
            }
            run.record.kill_requested = true;
            run.record.stop_signal_due_ms = (due > now).then_some(due);
            // The server has decided; no verdict can change that.
            run.stop_checks();
            // Durable before any signal: a restarted agent must know that
            // this run's end is a KILLED, not a FAILED (and when to signal
            // it, during a deregistration delay).
            persist(&mut run, &self.open_journals);
            if due > now {
                tracing::info!(
                    run = %key.sandbox_name(),
                    delay_ms = due - now,
                    grace_ms,
                    "killing after its deregistration delay"
                );
            } else {
                tracing::info!(run = %key.sandbox_name(), grace_ms, "killing");
                self.launcher.terminate(&run.record, &run.dir, procs);
            }
            self.observe(&mut run, now, procs);
        }
        self.runs.insert(key, run);
    }

    /// Stops every live run as a kill from the server would (SIGTERM now,
    /// SIGKILL once the grace has passed: each run's own kill grace period,
    /// or none with [`StopGrace::Now`]); they end KILLED, reported to the
    /// next session. Used when the agent stops with its tasks
    /// (`--stop-tasks-on-exit`), at `now_ms`. Returns how many runs are
    /// still alive.
    pub fn kill_all(&mut self, grace: StopGrace, now_ms: u64) -> usize {
        let live: Vec<(RunId, KillTiming)> = self
            .runs
            .iter()
            .filter(|(_, run)| !run.record.report.phase.is_final())
            .map(|(key, run)| {
                // The agent is going away: no deregistration delay.
                let grace_ms = match grace {
                    StopGrace::Own => run.record.kill_grace_ms,
                    StopGrace::Now => 0,
                };
                let timing = KillTiming {
                    delay_ms: 0,
                    grace_ms,
                };
                (key.clone(), timing)
            })
            .collect();
        let mut procs = LazySnapshot::default();
        for (key, timing) in live {
            self.kill_one(key, timing, now_ms, &mut procs);
        }
        self.live_runs()
    }

    /// Runs that have not ended.
    pub fn live_runs(&self) -> usize {
        self.runs
            .values()
            .filter(|run| !run.record.report.phase.is_final())
            .count()
    }

    /// The server has recorded these runs' final phases: mark them on disk
    /// and forget them. Acknowledging a run that has not ended is ignored.
    pub fn ack(&mut self, keys: &[RunId]) {
        for key in keys {
            let Some(run) = self.runs.get_mut(key) else {
                continue;
            };
            if !run.record.report.phase.is_final() {
                tracing::warn!(run = %key.sandbox_name(), "acknowledgement of a live run ignored");
                continue;
            }
            run.record.acked = true;
            persist(run, &self.open_journals);
            self.outbox.remove(key);
            self.runs.remove(key);
        }
    }

    /// Reports waiting to be taken.
    pub fn pending_reports(&self) -> usize {
        self.outbox.reports.len()
    }

    /// Up to `max` queued reports, oldest first.
    pub fn take_reports(&mut self, max: usize) -> Vec<RunReport> {
        self.report_health_changes();
        self.outbox.take(max)
    }

    /// The latest report of every run held, for `AgentRegister.runs`. The
    /// queued reports of these runs are dropped: this list supersedes them.
    pub fn registration_runs(&mut self) -> Vec<RunReport> {
        // Superseded too: the list carries every run's health of now.
        self.health_changes.take();
        let mut reports = Vec::with_capacity(self.runs.len());
        for (key, run) in &self.runs {
            self.outbox.remove(key);
            reports.push(run.report());
        }
        reports.sort_by_key(|r| r.phase.time_ms);
        reports
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
        self.log_source(&request.key, request.stderr).read(
            request.request_id,
            request.offset,
            request.max_bytes,
        )
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
    /// server never asks for that; it is logged).
    pub fn delete_volumes(&mut self, ids: &[String]) -> VolumeDeletion {
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
            match volumes::to_trash(&self.volumes, id) {
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

/// A run's journal, kept open from its first append to its last (its
/// acknowledgement): four appends a short run, each of which opened and
/// closed the file before. At most `MAX_OPEN_JOURNALS` at once; past that,
/// a run's appends open the file each time, as before.
#[derive(Debug)]
struct OpenJournal {
    file: File,
    /// The supervisor's count of open journals, which this holds one of.
    open: Arc<AtomicUsize>,
}

impl Drop for OpenJournal {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Journals held open at once, at most (see [`OpenJournal`]): far below
/// the usual limit of 1024 descriptors.
const MAX_OPEN_JOURNALS: usize = 256;

/// Appends the run's next record (and its plan, the first time) to its
/// journal, in one write.
fn persist(run: &mut Run, open_journals: &Arc<AtomicUsize>) {
    let written =
        record::run_entries(&mut run.record, run.plan.take().as_ref()).and_then(|bytes| {
            if run.journal.is_none() && open_journals.load(Ordering::Relaxed) < MAX_OPEN_JOURNALS {
                let file = record::open_journal(&run.dir)?;
                open_journals.fetch_add(1, Ordering::Relaxed);
                run.journal = Some(OpenJournal {
                    file,
                    open: open_journals.clone(),
                });
            }
            match &mut run.journal {
                Some(journal) => journal.file.write_all(&bytes),
                None => record::open_journal(&run.dir)?.write_all(&bytes),
            }
        });
    if let Err(e) = written {
        tracing::error!(
            run = %run.record.key.sandbox_name(),
            error = %e,
            "cannot write run.json; a restarted agent would not know this change"
        );
    }
}

/// How a run whose `exit` entry says how it ended is reported.
fn final_report(exit: &ExitRecord, kill_requested: bool) -> PhaseReport {
    let phase = if kill_requested {
        Phase::Killed
    } else if exit.start_failed || exit.oom_killed || exit.signal != 0 || exit.exit_code != 0 {
        Phase::Failed
    } else {
        Phase::Succeeded
    };
    PhaseReport {
        phase,
        time_ms: exit.time_ms,
        exit_code: exit.exit_code,
        signal: exit.signal,
        oom_killed: exit.oom_killed,
        reason: if kill_requested {
            format!("killed on request ({})", exit.reason)
        } else {
            exit.reason.clone()
        },
        // Filled from the run's RUNNING report by `end`.
        started_ms: 0,
    }
}

/// The report of a run the agent holds no record of (a launch refused
/// before its sandbox exists, a kill of an unknown run).
fn bare_report(key: &RunId, phase: PhaseReport) -> RunReport {
    RunReport {
        key: key.clone(),
        phase,
        ports: Vec::new(),
        health: Health::None,
        health_detail: String::new(),
    }
}
