//! The files of a sandbox, the records in them, and how they are written.
//!
//! A run lives in `WORK_DIR/sandboxes/<job_id>-<instance>-<run_id>-<launch_id>/`.
//! Everything the agent must remember about it across a restart is in that
//! directory, so the directory *is* the run. A launch creates four inodes:
//! the directory, `stdout` and `stderr` (the task's output) and
//! `run.json`, the run's journal: JSON lines, only ever appended to, by the
//! agent (its record of the run, a new generation per change, and the
//! resolved task plan) and by the launcher (`exit`; an older agent's
//! per-run wrapper wrote `started` too). Command health checks write
//! `health-check.out`; the launcher, with something to say about a run,
//! writes `wrapper.log` (the wrapper's name for it); neither exists
//! otherwise. A run may also have its secrets
//! in `.peloton-secrets/` (until it ends, see `secrets`) and a symbolic link
//! to its volume, which lives outside the sandbox (see `volumes`).
//!
//! Appends instead of one file per record, and instead of temporary files
//! renamed into place: creating inodes was most of a launch's cost (ext4's
//! allocator crawls past recently deleted inodes), and every rename freed
//! one. Each entry is one `write` of `\n<json>\n` on an `O_APPEND`
//! descriptor, so the agent's and the launcher's entries never interleave,
//! and an entry torn by a crash (a prefix left) is a line that does not
//! parse and is skipped, without touching the entries before it or, thanks
//! to the leading newline, the next one. Readers take the newest whole
//! entry of each kind (the highest generation for the agent's record).
//!
//! Runs started by an older agent (`RunRecord::journal` false) keep their
//! wrapper's `started` and `exit.json` files and a second record copy in
//! `run.json.b`; those are still read.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::proc::ProcessIdentity;
use crate::run::{AssignedPort, HealthCheckPlan, PhaseReport, RunId};

pub(crate) const SANDBOXES_DIR: &str = "sandboxes";
/// The run's journal (see the module documentation).
pub(crate) const RUN_FILE: &str = "run.json";
/// The second copy of the record of a run started by an older agent.
pub(crate) const RUN_FILE_B: &str = "run.json.b";
/// The task plan of a run started by an older agent.
pub(crate) const TASK_FILE: &str = "task.json";
/// The wrapper's start record, from an older agent's wrapper.
pub(crate) const STARTED_FILE: &str = "started";
/// The wrapper's exit record, from an older agent's wrapper.
pub(crate) const EXIT_FILE: &str = "exit.json";
/// Written by an older agent's trampoline when `exec` of the task failed
/// (reserved: never written any more).
pub(crate) const START_ERROR_FILE: &str = "start-error";
pub(crate) const STDOUT_FILE: &str = "stdout";
/// The task's `PELOTON_CHECKPOINT`: it touches the file when it has saved
/// its work, and the agent reports the file's modification time.
pub(crate) const CHECKPOINT_FILE: &str = "peloton-checkpoint";
/// The task's `PELOTON_PREEMPTED`: written (with the reason) when the run
/// is preempted, before any signal.
pub(crate) const PREEMPTED_FILE: &str = "peloton-preempted";
pub(crate) const STDERR_FILE: &str = "stderr";
/// The launcher's notes about a run (never mixed into the task's output;
/// named after the per-run wrapper of older agents, which wrote it first).
pub(crate) const NOTES_FILE: &str = "wrapper.log";
/// The output of the latest command health check (see `health`).
pub(crate) const HEALTH_OUTPUT_FILE: &str = "health-check.out";

/// `PATH` for a task whose environment has none.
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `run.json`: the agent's durable record of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    pub(crate) key: RunId,
    pub(crate) created_ms: u64,
    /// The run's own wrapper process (also the run's process group id),
    /// for a run an older agent started with a wrapper per run; `None`
    /// otherwise (no wrapper is started any more).
    pub(crate) wrapper: Option<ProcessIdentity>,
    /// The task (also the run's process group id), once the agent's
    /// launcher has started it; `None` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) task: Option<ProcessIdentity>,
    /// The launcher that started the task and records its end (`keeper`
    /// on disk, the launcher's earlier name).
    #[serde(default, rename = "keeper", skip_serializing_if = "Option::is_none")]
    pub(crate) launcher: Option<ProcessIdentity>,
    pub(crate) ports: Vec<AssignedPort>,
    /// The run's cgroup, when isolation is cgroup v2.
    pub(crate) cgroup: Option<PathBuf>,
    pub(crate) kill_requested: bool,
    /// When a requested kill turns to SIGKILL (ms since the epoch; kept on
    /// disk so that a restarted agent finishes a kill it had begun).
    pub(crate) kill_deadline_ms: u64,
    /// When a requested kill's stop signal is due (ms since the epoch): the
    /// kill came with a deregistration delay. None once it is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stop_signal_due_ms: Option<u64>,
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
    /// Resident memory the agent lets the task's processes hold in all
    /// (rlimit isolation with a memory request), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resident_limit_bytes: Option<u64>,
    /// The agent killed the run itself, and why (its memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) killed_by_agent: Option<String>,
    /// The run's `exit` entry (and an older wrapper's `started`) is in the
    /// journal; false for runs started by a still older agent, whose wrapper
    /// writes the files `started` and `exit.json`.
    #[serde(default)]
    pub(crate) journal: bool,
}

impl RunRecord {
    /// The record of a run not started yet: starting since `now`, nothing
    /// spawned, the default kill grace, no stop signal.
    pub(crate) fn starting(key: RunId, now: u64) -> RunRecord {
        RunRecord {
            key,
            created_ms: now,
            wrapper: None,
            task: None,
            launcher: None,
            ports: Vec::new(),
            cgroup: None,
            kill_requested: false,
            kill_deadline_ms: 0,
            stop_signal_due_ms: None,
            report: PhaseReport::new(crate::run::Phase::Starting, now),
            acked: false,
            health_check: None,
            volume: None,
            generation: 0,
            kill_grace_ms: DEFAULT_KILL_GRACE_MS,
            stop_signal: None,
            resident_limit_bytes: None,
            killed_by_agent: None,
            journal: true,
        }
    }
}

/// The API's kill grace period when a task sets none.
pub(crate) const DEFAULT_KILL_GRACE_MS: u64 = 10_000;

fn default_kill_grace_ms() -> u64 {
    DEFAULT_KILL_GRACE_MS
}

/// The journal's `plan` entry: what the launcher runs, fully resolved by
/// the agent (`task.json` for runs of an older agent).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TaskPlan {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    /// The task's whole environment.
    pub(crate) env: Vec<(String, String)>,
    /// RLIMIT_NOFILE.
    pub(crate) open_files: Option<u64>,
    /// The cgroup the task joins before it executes (cgroup v2 isolation).
    pub(crate) cgroup: Option<PathBuf>,
}

/// The journal's `started` entry: the task process exists.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StartedRecord {
    pub(crate) pid: u32,
    pub(crate) time_ms: u64,
}

/// The journal's `exit` entry: how the task ended, from the launcher that
/// reaped it (or an older agent's wrapper).
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

impl ExitRecord {
    /// The `exit` entry of a task that ended with (exit code, signal) —
    /// code 128 + signal for a signal, -1 if its status was lost — at
    /// `time_ms`.
    pub(crate) fn of(exit_code: i32, signal: i32, oom_killed: bool, time_ms: u64) -> ExitRecord {
        let reason = match (signal, oom_killed) {
            (0, false) if exit_code >= 0 => format!("exited with code {exit_code}"),
            (0, true) if exit_code >= 0 => {
                format!("exited with code {exit_code} (a process of the task ran out of memory)")
            }
            (0, _) => "the task's exit status was lost".to_owned(),
            (signal, false) => format!("killed by signal {signal}"),
            (signal, true) => format!("killed by signal {signal} (out of memory)"),
        };
        ExitRecord {
            exit_code,
            signal,
            oom_killed,
            start_failed: false,
            time_ms,
            reason,
        }
    }

    /// The `exit` entry of a task that could not be started, at `time_ms`.
    pub(crate) fn start_failure(reason: String, time_ms: u64) -> ExitRecord {
        ExitRecord {
            exit_code: EXIT_CANNOT_START,
            signal: 0,
            oom_killed: false,
            start_failed: true,
            time_ms,
            reason,
        }
    }
}

/// The exit code of a task that could not be started (as in shells).
pub(crate) const EXIT_CANNOT_START: i32 = 127;

/// A line in the sandbox's notes file ([`NOTES_FILE`], created by the
/// first one): the task's `stderr` is not the place for the agent's notes.
pub(crate) fn note(sandbox: &Path, line: &str) {
    if let Ok(mut log) = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(sandbox.join(NOTES_FILE))
    {
        let _ = writeln!(log, "peloton-agent launcher: {line}");
    }
}

/// The entries of a journal other than the agent's record, each written
/// as `{"<kind>": ...}` (the agent's record is a bare object, as the whole
/// `run.json` of older agents was).
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum Entry<'a> {
    Plan(&'a TaskPlan),
    #[cfg(test)]
    Started(&'a StartedRecord),
    Exit(&'a ExitRecord),
}

#[derive(Deserialize)]
struct PlanEntry {
    plan: TaskPlan,
}

#[derive(Deserialize)]
struct StartedEntry {
    started: StartedRecord,
}

#[derive(Deserialize)]
struct ExitEntry {
    exit: ExitRecord,
}

/// Appends `\n<json>\n` for `value` to `out` (see the module
/// documentation: the leading newline ends a line torn by a crash).
fn push_entry<T: Serialize>(out: &mut Vec<u8>, value: &T) -> io::Result<()> {
    out.push(b'\n');
    serde_json::to_writer(&mut *out, value).map_err(io::Error::other)?;
    out.push(b'\n');
    Ok(())
}

/// The journal of the sandbox `dir`, opened for appending (created if
/// missing).
///
/// No fsync: the records must survive the *agent* dying (the page cache
/// has them), not the host, since a host crash ends every task with it.
/// After a reboot, runs whose task is gone are reported as ended, and a
/// final report re-sent because its acknowledgement was lost is ignored by
/// the server (it matches no current run). Syncing each of a run's writes
/// cost more than the task itself (launches were bound at about 150 per
/// second on this VM's disk).
pub(crate) fn open_journal(dir: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join(RUN_FILE))
}

/// Appends, in one write, the task plan (if any) and the next generation of
/// the run's record to its journal (the supervisor does the same on a
/// journal it keeps open).
#[cfg(test)]
pub(crate) fn write_run(
    dir: &Path,
    record: &mut RunRecord,
    plan: Option<&TaskPlan>,
) -> io::Result<()> {
    let bytes = run_entries(record, plan)?;
    open_journal(dir)?.write_all(&bytes)
}

/// The bytes of one append of the run's record: the task plan (if any)
/// and the record's next generation (its generation from now on).
pub(crate) fn run_entries(record: &mut RunRecord, plan: Option<&TaskPlan>) -> io::Result<Vec<u8>> {
    record.generation += 1;
    let mut bytes = Vec::with_capacity(1024);
    if let Some(plan) = plan {
        push_entry(&mut bytes, &Entry::Plan(plan))?;
    }
    push_entry(&mut bytes, record)?;
    Ok(bytes)
}

/// Appends a `started` entry (an older agent's wrapper wrote them) to an
/// open journal.
#[cfg(test)]
pub(crate) fn append_started(journal: &mut File, started: &StartedRecord) -> io::Result<()> {
    append(journal, &Entry::Started(started))
}

/// Appends the launcher's `exit` entry to an open journal.
pub(crate) fn append_exit(journal: &mut File, exit: &ExitRecord) -> io::Result<()> {
    append(journal, &Entry::Exit(exit))
}

fn append(journal: &mut File, entry: &Entry<'_>) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(256);
    push_entry(&mut bytes, entry)?;
    journal.write_all(&bytes)
}

/// The whole entries of a journal's bytes, as lines.
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes
        .split(|&b| b == b'\n')
        .filter(|line| line.first() == Some(&b'{'))
}

fn newest_record(bytes: &[u8]) -> Option<RunRecord> {
    lines(bytes)
        .filter(|line| line.starts_with(b"{\"key\""))
        .filter_map(|line| serde_json::from_slice::<RunRecord>(line).ok())
        .max_by_key(|record| record.generation)
}

/// What the launcher (or an older agent's wrapper) has written about a run
/// so far.
#[derive(Debug, Default)]
pub(crate) struct JournalNews {
    pub(crate) started: Option<StartedRecord>,
    pub(crate) exit: Option<ExitRecord>,
}

/// Reads the launcher's entries of the run in `dir` (`journal`: the run's
/// record says they are in the journal; else the files of an older
/// wrapper). A missing or unreadable file is no news; an exit entry
/// or file that does not parse is `InvalidData`.
pub(crate) fn read_news(dir: &Path, journal: bool) -> io::Result<JournalNews> {
    let mut news = JournalNews::default();
    if !journal {
        news.started = read_json(&dir.join(STARTED_FILE)).ok();
        match read_json(&dir.join(EXIT_FILE)) {
            Ok(exit) => news.exit = Some(exit),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        return Ok(news);
    }
    let bytes = match fs::read(dir.join(RUN_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(news),
        Err(e) => return Err(e),
    };
    for line in lines(&bytes) {
        if line.starts_with(b"{\"started\"") {
            if let Ok(entry) = serde_json::from_slice::<StartedEntry>(line) {
                news.started = Some(entry.started);
            }
        } else if line.starts_with(b"{\"exit\"") {
            // Written once, last: one that does not parse was torn (its
            // writer was killed writing it).
            match serde_json::from_slice::<ExitEntry>(line) {
                Ok(entry) => news.exit = Some(entry.exit),
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
    }
    Ok(news)
}

/// The task plan of the run in `dir`: the journal's `plan` entry, or an
/// older agent's `task.json`.
pub(crate) fn read_plan(dir: &Path) -> io::Result<TaskPlan> {
    let bytes = fs::read(dir.join(RUN_FILE))?;
    let plan = lines(&bytes)
        .filter(|line| line.starts_with(b"{\"plan\""))
        .find_map(|line| serde_json::from_slice::<PlanEntry>(line).ok());
    match plan {
        Some(entry) => Ok(entry.plan),
        None => read_json(&dir.join(TASK_FILE)),
    }
}

/// Reads a run's record from its sandbox: the newest whole generation in
/// its journal (or, for a run of an older agent, in either of its copies).
pub(crate) fn read_run(dir: &Path) -> io::Result<RunRecord> {
    let journal = fs::read(dir.join(RUN_FILE));
    let newest = match journal.as_deref().ok().and_then(newest_record) {
        Some(record) if record.journal => return Ok(record),
        other => other,
    };
    // An older agent's run: two copies, written alternately.
    let b = read_json::<RunRecord>(&dir.join(RUN_FILE_B)).ok();
    match (newest, b) {
        (Some(a), Some(b)) => Ok(if b.generation > a.generation { b } else { a }),
        (Some(a), None) => Ok(a),
        (None, Some(b)) => Ok(b),
        (None, None) => Err(match journal {
            Err(e) => e,
            Ok(_) => io::Error::new(io::ErrorKind::InvalidData, "no whole run record"),
        }),
    }
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

    fn record(key: RunId) -> RunRecord {
        RunRecord::starting(key, 1)
    }

    fn plan() -> TaskPlan {
        TaskPlan {
            program: "/bin/true".to_owned(),
            args: vec!["a b".to_owned()],
            env: vec![("K".to_owned(), "v\nw".to_owned())],
            open_files: Some(1024),
            cgroup: None,
        }
    }

    fn exit() -> ExitRecord {
        ExitRecord {
            exit_code: 3,
            signal: 0,
            oom_killed: false,
            start_failed: false,
            time_ms: 9,
            reason: "exited with code 3".to_owned(),
        }
    }

    #[test]
    fn a_torn_record_write_leaves_the_previous_generation() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = record(id("job"));
        write_run(dir.path(), &mut record, Some(&plan())).unwrap();
        record.kill_requested = true;
        write_run(dir.path(), &mut record, None).unwrap();
        record.acked = true;
        write_run(dir.path(), &mut record, None).unwrap();
        let back = read_run(dir.path()).unwrap();
        assert_eq!((back.generation, back.acked), (3, true));
        // A crash tearing generation 3 (a prefix of it is left) falls back
        // to generation 2.
        let path = dir.path().join(RUN_FILE);
        let full = fs::read(&path).unwrap();
        let last = full[..full.len() - 1]
            .iter()
            .rposition(|&b| b == b'\n')
            .unwrap();
        let torn = &full[..last + (full.len() - last) / 2];
        fs::write(&path, torn).unwrap();
        let back = read_run(dir.path()).unwrap();
        assert_eq!(
            (back.generation, back.kill_requested, back.acked),
            (2, true, false)
        );
        // The next entry, by the agent or the launcher, is whole again: the
        // leading newline ends the torn line.
        let mut journal = open_journal(dir.path()).unwrap();
        append_exit(&mut journal, &exit()).unwrap();
        record.generation = 3;
        write_run(dir.path(), &mut record, None).unwrap();
        let back = read_run(dir.path()).unwrap();
        assert_eq!((back.generation, back.acked), (4, true));
        let news = read_news(dir.path(), true).unwrap();
        assert_eq!(news.exit, Some(exit()));
        assert_eq!(read_plan(dir.path()).unwrap().env, plan().env);
    }

    #[test]
    fn a_torn_exit_entry_is_invalid_data_and_other_torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = open_journal(dir.path()).unwrap();
        append_started(&mut journal, &StartedRecord { pid: 5, time_ms: 6 }).unwrap();
        let news = read_news(dir.path(), true).unwrap();
        assert_eq!(news.started.map(|s| (s.pid, s.time_ms)), Some((5, 6)));
        assert_eq!(news.exit, None);
        // A torn started entry is no news (the wrapper was killed: its
        // liveness tells the rest).
        fs::write(dir.path().join(RUN_FILE), "\n{\"started\":{\"pid\":5,").unwrap();
        let news = read_news(dir.path(), true).unwrap();
        assert!(news.started.is_none() && news.exit.is_none());
        fs::write(dir.path().join(RUN_FILE), "\n{\"exit\":{\"exit_code\":0,").unwrap();
        let torn = read_news(dir.path(), true).expect_err("torn exit");
        assert_eq!(torn.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn runs_of_an_older_agent_are_read_from_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = record(id("job"));
        old.journal = false;
        // An older agent's record: one bare object per copy, no newline.
        old.generation = 2;
        fs::write(
            dir.path().join(RUN_FILE_B),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        old.generation = 1;
        fs::write(dir.path().join(RUN_FILE), serde_json::to_vec(&old).unwrap()).unwrap();
        fs::write(
            dir.path().join(TASK_FILE),
            serde_json::to_vec_pretty(&plan()).unwrap(),
        )
        .unwrap();
        fs::write(
            dir.path().join(STARTED_FILE),
            serde_json::to_vec_pretty(&StartedRecord { pid: 7, time_ms: 8 }).unwrap(),
        )
        .unwrap();
        let mut back = read_run(dir.path()).unwrap();
        assert_eq!((back.generation, back.journal), (2, false));
        assert_eq!(read_plan(dir.path()).unwrap().program, "/bin/true");
        let news = read_news(dir.path(), false).unwrap();
        assert_eq!(news.started.map(|s| s.pid), Some(7));
        assert_eq!(news.exit, None);
        fs::write(
            dir.path().join(EXIT_FILE),
            serde_json::to_vec_pretty(&exit()).unwrap(),
        )
        .unwrap();
        assert_eq!(read_news(dir.path(), false).unwrap().exit, Some(exit()));
        // A newer agent appends its generations to the old run.json.
        back.acked = true;
        write_run(dir.path(), &mut back, None).unwrap();
        let again = read_run(dir.path()).unwrap();
        assert_eq!((again.generation, again.acked), (3, true));
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
    fn journal_entries_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut record = record(id("job"));
        write_run(dir.path(), &mut record, Some(&plan())).expect("write");
        let mut journal = open_journal(dir.path()).expect("open");
        append_started(&mut journal, &StartedRecord { pid: 5, time_ms: 6 }).expect("append");
        append_exit(&mut journal, &exit()).expect("append");
        let back = read_plan(dir.path()).expect("plan");
        assert_eq!((back.program, back.args), (plan().program, plan().args));
        let news = read_news(dir.path(), true).expect("news");
        assert_eq!(news.started.map(|s| (s.pid, s.time_ms)), Some((5, 6)));
        assert_eq!(news.exit, Some(exit()));
        assert_eq!(read_run(dir.path()).expect("record").generation, 1);
        // Nothing but the journal was written.
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![RUN_FILE]);
    }
}
