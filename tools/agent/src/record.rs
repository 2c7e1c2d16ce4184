//! The files of a sandbox, the records in them, and how they are written.
//!
//! A run lives in `WORK_DIR/sandboxes/<job_id>-<instance>-<run_id>-<launch_id>/`.
//! Everything the agent must remember about it across a restart is in that
//! directory, so the directory *is* the run: the agent writes `run.json`
//! (the run's record) and `task.json` (what to execute); the wrapper writes
//! `started` and `exit.json`; the task writes `stdout` and `stderr`; command
//! health checks write `health-check.out`. A run may also have its secrets
//! in `.peloton-secrets/` (until it ends, see `secrets`) and a symbolic link
//! to its volume, which lives outside the sandbox (see `volumes`). Every JSON file is written to a
//! temporary name, synced and renamed, so a reader (or a restarted agent)
//! sees the old version or the new one, never half of one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use peloton_proto::v1;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::health::HealthCheckPlan;
use crate::proc::ProcessIdentity;

pub(crate) const SANDBOXES_DIR: &str = "sandboxes";
pub(crate) const RUN_FILE: &str = "run.json";
/// The second copy of a run's record (see [`write_run`]).
pub(crate) const RUN_FILE_B: &str = "run.json.b";
pub(crate) const TASK_FILE: &str = "task.json";
pub(crate) const STARTED_FILE: &str = "started";
pub(crate) const EXIT_FILE: &str = "exit.json";
/// Written by the trampoline when `exec` of the task fails.
pub(crate) const START_ERROR_FILE: &str = "start-error";
pub(crate) const STDOUT_FILE: &str = "stdout";
pub(crate) const STDERR_FILE: &str = "stderr";
/// The wrapper's own diagnostics (never mixed into the task's output).
pub(crate) const WRAPPER_LOG_FILE: &str = "wrapper.log";
/// The output of the latest command health check (see `health`).
pub(crate) const HEALTH_OUTPUT_FILE: &str = "health-check.out";

/// Longest job id the agent accepts (it becomes part of a file name).
const MAX_JOB_ID_LEN: usize = 128;

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One launch of one task: the server's `RunKey`, hashable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct RunId {
    pub(crate) job_id: String,
    pub(crate) instance: u32,
    pub(crate) run_id: u32,
    pub(crate) launch_id: u64,
}

impl RunId {
    pub(crate) fn from_proto(key: &v1::RunKey) -> RunId {
        RunId {
            job_id: key.job_id.clone(),
            instance: key.instance,
            run_id: key.run_id,
            launch_id: key.launch_id,
        }
    }

    pub(crate) fn to_proto(&self) -> v1::RunKey {
        v1::RunKey {
            job_id: self.job_id.clone(),
            instance: self.instance,
            run_id: self.run_id,
            launch_id: self.launch_id,
        }
    }

    /// The job id becomes part of a path: only plain file-name characters.
    pub(crate) fn validate(&self) -> Result<(), String> {
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
    pub(crate) fn sandbox_name(&self) -> String {
        format!(
            "{}-{}-{}-{}",
            self.job_id, self.instance, self.run_id, self.launch_id
        )
    }

    /// `PELOTON_TASK_ID`: `<job_id>-<instance>-<run_id>`.
    pub(crate) fn task_id(&self) -> String {
        format!("{}-{}-{}", self.job_id, self.instance, self.run_id)
    }
}

/// A run's phase, as recorded on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    Starting,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl Phase {
    pub(crate) fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Killed)
    }

    pub(crate) fn to_proto(self) -> v1::RunPhase {
        match self {
            Phase::Starting => v1::RunPhase::Starting,
            Phase::Running => v1::RunPhase::Running,
            Phase::Succeeded => v1::RunPhase::Succeeded,
            Phase::Failed => v1::RunPhase::Failed,
            Phase::Killed => v1::RunPhase::Killed,
        }
    }
}

/// The latest phase of a run with its details: what the agent reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PhaseReport {
    pub(crate) phase: Phase,
    pub(crate) time_ms: u64,
    #[serde(default)]
    pub(crate) exit_code: i32,
    #[serde(default)]
    pub(crate) signal: i32,
    #[serde(default)]
    pub(crate) oom_killed: bool,
    #[serde(default)]
    pub(crate) reason: String,
    /// When the task process started (0: never), kept on the final phase.
    #[serde(default)]
    pub(crate) started_ms: u64,
}

impl PhaseReport {
    pub(crate) fn new(phase: Phase, time_ms: u64) -> PhaseReport {
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

    pub(crate) fn failed(time_ms: u64, reason: String) -> PhaseReport {
        PhaseReport {
            reason,
            ..PhaseReport::new(Phase::Failed, time_ms)
        }
    }

    pub(crate) fn to_proto(&self, key: &RunId) -> v1::RunReport {
        v1::RunReport {
            key: Some(key.to_proto()),
            phase: self.phase.to_proto().into(),
            time_ms: self.time_ms,
            exit_code: self.exit_code,
            signal: self.signal,
            oom_killed: self.oom_killed,
            reason: self.reason.clone(),
            started_ms: self.started_ms,
            // Filled by the supervisor, which knows the run's ports and
            // health.
            ..v1::RunReport::default()
        }
    }
}

/// A port handed to a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AssignedPort {
    pub(crate) name: String,
    pub(crate) port: u16,
}

/// `run.json`: the agent's durable record of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    pub(crate) key: RunId,
    pub(crate) created_ms: u64,
    /// The wrapper (also the run's process group id); `None` until spawned.
    pub(crate) wrapper: Option<ProcessIdentity>,
    pub(crate) ports: Vec<AssignedPort>,
    /// The run's cgroup, when isolation is cgroup v2.
    pub(crate) cgroup: Option<PathBuf>,
    pub(crate) kill_requested: bool,
    /// When a requested kill turns to SIGKILL (ms since the epoch; kept on
    /// disk so that a restarted agent finishes a kill it had begun).
    pub(crate) kill_deadline_ms: u64,
    /// The latest phase (final once the run has ended).
    pub(crate) report: PhaseReport,
    /// The server has recorded the final phase: never report it again.
    pub(crate) acked: bool,
    /// Checked while the run is RUNNING (records older than health checks
    /// have none).
    #[serde(default)]
    pub(crate) health_check: Option<HealthCheckPlan>,
    /// The id of the run's volume (`WORK_DIR/volumes/<id>`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) volume: Option<String>,
    /// Bumped on every write; the newer of the two copies wins.
    #[serde(default)]
    pub(crate) generation: u64,
    /// SIGTERM to SIGKILL when the agent stops the run itself (`--stop-tasks-on-exit`):
    /// the task's `kill_grace_period_ms` (records older than it: the API's default).
    #[serde(default = "default_kill_grace_ms")]
    pub(crate) kill_grace_ms: u64,
    /// The signal that asks the task to stop before SIGKILL (`None`:
    /// SIGTERM): the task's `stop_signal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stop_signal: Option<i32>,
    /// Resident memory the agent lets the task's processes use in all
    /// (rlimit isolation with `MEMORY_LIMIT_RESIDENT`), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resident_limit_bytes: Option<u64>,
    /// The agent killed the run itself, and why (its memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) killed_by_agent: Option<String>,
}

/// The API's kill grace period when a task sets none.
pub(crate) const DEFAULT_KILL_GRACE_MS: u64 = 10_000;

fn default_kill_grace_ms() -> u64 {
    DEFAULT_KILL_GRACE_MS
}

/// `task.json`: what the wrapper runs, fully resolved by the agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TaskPlan {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    /// The task's whole environment.
    pub(crate) env: Vec<(String, String)>,
    /// RLIMIT_AS in bytes (rlimit isolation with a memory request).
    pub(crate) address_space_bytes: Option<u64>,
    /// RLIMIT_NOFILE.
    pub(crate) open_files: Option<u64>,
    /// The cgroup the task joins before it executes (cgroup v2 isolation).
    pub(crate) cgroup: Option<PathBuf>,
}

/// `started`: the task process exists.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StartedRecord {
    pub(crate) pid: u32,
    pub(crate) time_ms: u64,
}

/// `exit.json`: how the task ended, from the wrapper that waited for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExitRecord {
    /// The exit code, or 128 + signal when a signal ended it.
    pub(crate) exit_code: i32,
    /// The signal that ended it (0: none).
    pub(crate) signal: i32,
    pub(crate) oom_killed: bool,
    /// The task never started (bad command, no memory, ...).
    pub(crate) start_failed: bool,
    pub(crate) time_ms: u64,
    pub(crate) reason: String,
}

/// Writes `value` as JSON to `path` so that readers see the old or the new
/// content, whole: temporary file, then rename.
///
/// No fsync: the records must survive the *agent* dying (the page cache
/// has them), not the host, since a host crash ends every task with it.
/// After a reboot, runs whose wrapper is gone are reported as ended, and a
/// final report re-sent because its acknowledgement was lost is ignored by
/// the server (it matches no current run). Syncing each of a run's
/// half-dozen writes cost more than the task itself (launches were bound at
/// about 150 per second on this VM's disk).
pub(crate) fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_atomic(path, &bytes)
}

pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    drop(file);
    fs::rename(&tmp, path)
}

/// Reads a run's record from its sandbox: the newer whole copy.
pub(crate) fn read_run(dir: &Path) -> io::Result<RunRecord> {
    let a = read_json::<RunRecord>(&dir.join(RUN_FILE));
    let b = read_json::<RunRecord>(&dir.join(RUN_FILE_B));
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if b.generation > a.generation { b } else { a }),
        (Ok(a), Err(_)) => Ok(a),
        (Err(_), Ok(b)) => Ok(b),
        (Err(e), Err(_)) => Err(e),
    }
}

/// Writes a run's record in place, alternating between two copies (odd
/// generations in `run.json`, even ones in `run.json.b`), so that a write
/// torn by a crash leaves the previous generation whole in the other copy.
///
/// Not temp-file-and-rename: a run's record is rewritten about five times,
/// and every rename freed an inode that ext4's allocator then had to skip
/// as recently deleted. Creating inodes was a third of the agent's CPU and
/// bound launches per second; two fixed files per run create none after
/// the first two writes.
pub(crate) fn write_run(dir: &Path, record: &mut RunRecord) -> io::Result<()> {
    record.generation += 1;
    let name = if record.generation % 2 == 1 {
        RUN_FILE
    } else {
        RUN_FILE_B
    };
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join(name))?;
    file.write_all(&bytes)
}

/// Reads a JSON file; a malformed one is `InvalidData`.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<T> {
    let bytes = fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(job_id: &str) -> RunId {
        RunId {
            job_id: job_id.to_owned(),
            instance: 3,
            run_id: 2,
            launch_id: 77,
        }
    }

    #[test]
    fn a_torn_record_write_leaves_the_previous_generation() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = RunRecord {
            key: id("job"),
            created_ms: 1,
            wrapper: None,
            ports: Vec::new(),
            cgroup: None,
            kill_requested: false,
            kill_deadline_ms: 0,
            report: PhaseReport::new(Phase::Starting, 1),
            acked: false,
            health_check: None,
            volume: None,
            generation: 0,
            kill_grace_ms: DEFAULT_KILL_GRACE_MS,
            stop_signal: None,
            resident_limit_bytes: None,
            killed_by_agent: None,
        };
        write_run(dir.path(), &mut record).unwrap();
        record.kill_requested = true;
        write_run(dir.path(), &mut record).unwrap();
        record.acked = true;
        write_run(dir.path(), &mut record).unwrap();
        let back = read_run(dir.path()).unwrap();
        assert_eq!((back.generation, back.acked), (3, true));
        // Generation 3 went to run.json; a crash tearing it (a prefix is
        // left) falls back to generation 2 in run.json.b.
        let full = fs::read(dir.path().join(RUN_FILE)).unwrap();
        fs::write(dir.path().join(RUN_FILE), &full[..full.len() / 2]).unwrap();
        let back = read_run(dir.path()).unwrap();
        assert_eq!(
            (back.generation, back.kill_requested, back.acked),
            (2, true, false)
        );
    }

    #[test]
    fn names() {
        let key = id("0b6f-4c1a");
        assert_eq!(key.sandbox_name(), "0b6f-4c1a-3-2-77");
        assert_eq!(key.task_id(), "0b6f-4c1a-3-2");
        assert!(key.validate().is_ok());
        for bad in ["", "..", "a/b", ".hidden", "a b", "a\0b"] {
            assert!(id(bad).validate().is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn atomic_write_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.json");
        let started = StartedRecord { pid: 5, time_ms: 6 };
        write_json_atomic(&path, &started).expect("write");
        let back: StartedRecord = read_json(&path).expect("read");
        assert_eq!((back.pid, back.time_ms), (5, 6));
        assert!(!dir.path().join("x.json.tmp").exists());
    }
}
