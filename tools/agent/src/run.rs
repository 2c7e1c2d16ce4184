//! The agent's own words for what the server asks of it and what it tells
//! the server: a run's plan, a kill, a report, a log read. Plain data, no
//! protobuf: the session's codec (`session::codec`) translates at the
//! edge, once, and everything inside the agent works on these.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Longest job id the agent accepts (it becomes part of a file name).
const MAX_JOB_ID_LEN: usize = 128;

/// One launch of one task: the server's `RunKey`, hashable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId {
    pub job_id: String,
    pub instance: u32,
    pub run_id: u32,
    pub launch_id: u64,
}

impl RunId {
    /// The job id becomes part of a path: only plain file-name characters.
    pub fn validate(&self) -> Result<(), String> {
        let id = &self.job_id;
        if id.is_empty() || id.len() > MAX_JOB_ID_LEN {
            return Err(format!("job id must have 1 to {MAX_JOB_ID_LEN} characters"));
        }
        if id.starts_with('.')
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(format!(
                "job id {id:?} is not usable in a file name (letters, digits, '-', '_', '.')"
            ));
        }
        Ok(())
    }

    /// `<job_id>-<instance>-<run_id>-<launch_id>`: unique, because launch
    /// ids never repeat.
    pub fn sandbox_name(&self) -> String {
        format!(
            "{}-{}-{}-{}",
            self.job_id, self.instance, self.run_id, self.launch_id
        )
    }

    /// `PELOTON_TASK_ID`: `<job_id>-<instance>-<run_id>`.
    pub fn task_id(&self) -> String {
        format!("{}-{}-{}", self.job_id, self.instance, self.run_id)
    }
}

/// A run's phase, as recorded on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Starting,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Killed)
    }
}

/// The latest phase of a run with its details: what the agent reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseReport {
    pub phase: Phase,
    pub time_ms: u64,
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub signal: i32,
    #[serde(default)]
    pub oom_killed: bool,
    #[serde(default)]
    pub reason: String,
    /// When the task process started (0: never), kept on the final phase.
    #[serde(default)]
    pub started_ms: u64,
}

impl PhaseReport {
    pub fn new(phase: Phase, time_ms: u64) -> PhaseReport {
        PhaseReport {
            phase,
            time_ms,
            exit_code: 0,
            signal: 0,
            oom_killed: false,
            reason: String::new(),
            started_ms: if phase == Phase::Running { time_ms } else { 0 },
        }
    }

    pub fn failed(time_ms: u64, reason: String) -> PhaseReport {
        PhaseReport {
            reason,
            ..PhaseReport::new(Phase::Failed, time_ms)
        }
    }
}

/// A port handed to a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedPort {
    pub name: String,
    pub port: u16,
}

/// `interval_ms` when the spec says 0.
const DEFAULT_INTERVAL_MS: u64 = 10_000;
/// `timeout_ms` when the spec says 0.
const DEFAULT_TIMEOUT_MS: u64 = 5_000;
/// `max_consecutive_failures` when the spec says 0.
const DEFAULT_MAX_CONSECUTIVE_FAILURES: u32 = 3;
/// Checks more often than this would be a busy loop of shells.
const MIN_INTERVAL_MS: u64 = 100;
/// Longest interval, timeout or initial delay honoured (one day): larger
/// values are clamped, so deadlines never overflow.
const MAX_DURATION_MS: u64 = 86_400_000;
/// What to check, resolved from the spec (`run.json` keeps it, so a
/// restarted agent checks re-adopted runs the same way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// `/bin/sh -c <line>` in the sandbox with the task's environment.
    Command { line: String },
    /// GET `http://127.0.0.1:<port named port><path>`.
    Http { port: String, path: String },
    /// A TCP connection to `127.0.0.1:<port named port>`.
    Tcp { port: String },
}

/// A run's health check with its defaults applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheckPlan {
    pub kind: CheckKind,
    pub initial_delay_ms: u64,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub max_consecutive_failures: u32,
}

impl HealthCheckPlan {
    /// The plan of a task's check as the server gave it (0: the default);
    /// an error for a check the agent cannot run at all (an empty command,
    /// a NUL byte in it).
    pub fn new(
        kind: CheckKind,
        initial_delay_ms: u64,
        interval_ms: u64,
        timeout_ms: u64,
        max_consecutive_failures: u32,
    ) -> Result<HealthCheckPlan, String> {
        let kind = match kind {
            CheckKind::Command { line } => {
                if line.trim().is_empty() || line.contains('\0') {
                    return Err(
                        "the task's health check command is empty or contains a NUL byte"
                            .to_owned(),
                    );
                }
                CheckKind::Command { line }
            }
            CheckKind::Http { port, path } => CheckKind::Http {
                port,
                path: if path.is_empty() {
                    "/".to_owned()
                } else if path.starts_with('/') {
                    path
                } else {
                    format!("/{path}")
                },
            },
            tcp @ CheckKind::Tcp { .. } => tcp,
        };
        let or_default = |ms: u64, default: u64| if ms == 0 { default } else { ms };
        Ok(HealthCheckPlan {
            kind,
            initial_delay_ms: initial_delay_ms.min(MAX_DURATION_MS),
            interval_ms: or_default(interval_ms, DEFAULT_INTERVAL_MS)
                .clamp(MIN_INTERVAL_MS, MAX_DURATION_MS),
            timeout_ms: or_default(timeout_ms, DEFAULT_TIMEOUT_MS).min(MAX_DURATION_MS),
            max_consecutive_failures: if max_consecutive_failures == 0 {
                DEFAULT_MAX_CONSECUTIVE_FAILURES
            } else {
                max_consecutive_failures
            },
        })
    }
}

/// A run's health, as reported with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The task has no health check.
    None,
    /// Not checked yet, or no check has passed yet.
    Unknown,
    Healthy,
    Unhealthy,
}

/// What the agent says of a run: its phase with details, ports and health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub key: RunId,
    pub phase: PhaseReport,
    pub ports: Vec<AssignedPort>,
    pub health: Health,
    /// Set only when unhealthy: the last failed check's output or error.
    pub health_detail: String,
    /// When the task last touched its `PELOTON_CHECKPOINT` (0: never).
    pub checkpoint_ms: u64,
}

/// Resources of a task, or offered by a host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    pub cpu: f64,
    pub memory_mb: f64,
    pub disk_mb: f64,
    pub gpu: f64,
}

/// What a task executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A program with its arguments.
    Exec { program: String, args: Vec<String> },
    /// A line for `/bin/sh -c`.
    Shell(String),
}

/// A secret handed to a run (written to a file in its sandbox; its value
/// is never logged).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub name: String,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The task of a run, as the server specified it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    pub command: Command,
    /// The task's own variables (the agent adds its `PELOTON_*` ones).
    pub env: BTreeMap<String, String>,
    pub resources: Resources,
    /// The names of the ports the task asks for, in order.
    pub ports: Vec<String>,
    pub health_check: Option<HealthCheckPlan>,
    /// From SIGTERM to SIGKILL when the agent stops the run itself.
    pub kill_grace_ms: u64,
    /// The signal that asks the task to stop (`None`: SIGTERM).
    pub stop_signal: Option<i32>,
    /// Where the run's volume appears in the sandbox (empty: the default).
    pub volume_path: String,
}

/// The GPU devices the server gave a run on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuAssignment {
    /// Device indices, ascending, as `nvidia-smi` numbers them (empty:
    /// none).
    pub devices: Vec<u32>,
    /// The run's share of its one device, in milli-GPUs (0: whole
    /// devices).
    pub share_milli: u32,
}

/// One run to launch.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub key: RunId,
    /// The task, or why the launch cannot be understood (the run fails
    /// with that reason).
    pub task: Result<TaskSpec, String>,
    pub secrets: Vec<Secret>,
    /// The id of the run's volume, if it has one.
    pub volume: Option<String>,
    /// Its GPU devices on this host.
    pub gpu: GpuAssignment,
    /// Ports the server chose for it, by name (gang members; empty: the
    /// agent chooses from its range).
    pub ports: BTreeMap<String, u32>,
    /// Its gang, if it is a gang member.
    pub rendezvous: Option<Rendezvous>,
}

/// A gang as one member sees it (see `rendezvous`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendezvous {
    pub size: u32,
    /// This member's rank.
    pub rank: u32,
    /// Grows each time the gang (re)starts.
    pub generation: u64,
    /// Every member, by rank.
    pub members: Vec<GangMember>,
    /// Framework aliases asked for: "pytorch", "tensorflow", "mpi" or "".
    pub framework: String,
    /// The leader's rendezvous port's name ("": the task's first port).
    pub port: String,
}

/// One member of a gang.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GangMember {
    pub rank: u32,
    pub instance: u32,
    pub host: String,
    /// Its host's address ("": use the host's name).
    pub address: String,
    pub ports: BTreeMap<String, u32>,
}

/// One run to stop: its stop signal once `delay_ms` has passed (its
/// deregistration delay) and, for a preempted run with a notice, no sooner
/// than `notice_ms`; SIGKILL `grace_ms` after that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillRequest {
    pub key: RunId,
    pub delay_ms: u64,
    pub grace_ms: u64,
    /// Why the run is preempted (`None`: it is not): written at once into
    /// its `PELOTON_PREEMPTED` file.
    pub preempted: Option<String>,
    /// A preempted run's notice: SIGTERM to its main process at once.
    pub notice_ms: u64,
}

/// A read of a run's `stdout` or `stderr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRequest {
    pub request_id: u64,
    pub key: RunId,
    pub stderr: bool,
    pub offset: u64,
    /// 0 or more than 1 MiB: 1 MiB.
    pub max_bytes: u32,
    /// Start at the last this many lines if that is after `offset` (0:
    /// no; at most `logs::MAX_TAIL_LINES`).
    pub tail_lines: u32,
    /// Start at the output written at or after this time (ms since the
    /// epoch) if that is after `offset` (0: no).
    pub since_ms: u64,
    /// Answer with [`LogChunk::marks`].
    pub times: bool,
}

/// The answer to a [`LogRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogChunk {
    pub request_id: u64,
    pub offset: u64,
    pub data: Vec<u8>,
    /// The run has ended and this reaches the end of the file.
    pub eof: bool,
    /// Set when nothing could be read.
    pub error: String,
    /// With [`LogRequest::times`]: `(offset, time_ms)` in offset order,
    /// each saying the bytes before `offset` had been written by `time_ms`;
    /// the last reaches the end of `data`.
    pub marks: Vec<(u64, u64)>,
}
