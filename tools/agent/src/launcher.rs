//! The launcher: the one way the supervisor starts, watches and stops a run.
//!
//! Words, used the same everywhere in the agent: the **launcher** is one
//! small long-lived process per agent (the agent's own binary, executed
//! once as `peloton-agent launcher`) that starts every task and records how
//! each one ended; a **run** is one launch of a task: its sandbox, its
//! journal and the **task**, the process the launcher starts, leader of the
//! run's process group, with everything it forks. [`Launcher`] is the
//! agent's side of it.
//!
//! Why a separate process: the agent cannot start tasks itself and keep
//! their exits safe (if it dies its children's exit statuses are gone, and
//! it is multi-threaded, so a fork from it is slow and unsafe to run code
//! in). A process per run that forked and waited for its task (the "wrapper"
//! of older agents) cost as much CPU again as a short task: two forks that
//! copy page tables, the copy-on-write faults after them, and two process
//! exits. The launcher starts each task like `posix_spawn` does (`child`),
//! without a process of its own per run, and records each end (`process`);
//! the agent talks to it over a socket (`protocol`, `connection`).
//!
//! The launcher outlives the agent: when the agent's end of the socket
//! closes (it stopped, or died) it goes on recording the ends of its tasks
//! and exits after the last one. A restarted agent watches those runs
//! through `/proc` (the task's and the launcher's identities are in the
//! run's record) and reads their ends from the journals; new launches go
//! to a new launcher. A launcher that dies or breaks is replaced by the
//! next start (a batch it never got is sent to the new one).
//!
//! What this costs in safety: a task's exit status lives in its launcher
//! until it is recorded. A launcher killed outright (SIGKILL, the OOM
//! killer) loses the statuses of the tasks it had running; they carry on,
//! and are reported FAILED ("lost the run's exit status") when they end.
//!
//! Runs started by an older agent's per-run wrapper (`RunRecord::wrapper`)
//! are still watched and stopped here, through `/proc`; no wrapper is
//! started any more.

mod child;
mod connection;
mod process;
mod protocol;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Child;

use nix::sys::signal::Signal;

use self::connection::{Connection, RequestError};
pub use self::process::run_launcher;
use crate::isolation;
use crate::proc::{self, LazySnapshot, ProcSnapshot, ProcessIdentity};
use crate::record::{self, ExitRecord, RunRecord, TaskPlan};
use crate::run::RunId;

/// After a kill's SIGKILL, how long an older agent's wrapper gets to
/// record the exit before it is killed too (and the run is reported from
/// the agent's knowledge alone).
const WRAPPER_KILL_AFTER_MS: u64 = 2_000;

/// A run whose task is to be started: its sandbox (an absolute path whose
/// journal holds the task plan) and, to save the launcher reading it back,
/// its plan.
#[derive(Debug)]
pub(crate) struct StartRequest<'a> {
    pub(crate) key: &'a RunId,
    pub(crate) dir: &'a Path,
    pub(crate) plan: Option<&'a TaskPlan>,
}

/// What became of a [`StartRequest`].
#[derive(Debug)]
pub(crate) enum Start {
    /// The task has executed, as the leader of its own process group.
    Running {
        task: ProcessIdentity,
        /// The launcher that started it and records its end.
        launcher: ProcessIdentity,
        /// The launcher's wall clock (ms) just after the task executed:
        /// the clock its `exit` entry is stamped with. 0 from a launcher
        /// that sends no time.
        started_ms: u64,
    },
    /// The task could not start; the run's journal has an `exit` entry
    /// that says why.
    NotStarted { launcher: ProcessIdentity },
    /// Nothing of the run was started: it fails with this reason.
    Failed(String),
}

/// The agent's side of its launcher (see the module documentation).
#[derive(Debug)]
pub(crate) struct Launcher {
    /// The agent's binary, executed as the launcher.
    exe: PathBuf,
    /// The current launcher process; started on demand.
    connection: Option<Connection>,
    /// Launchers given up (closed, or broken) not yet reaped: each exits
    /// once its tasks have ended.
    unreaped: Vec<Child>,
    /// Runs by their task, while the current launcher will report the
    /// task's end.
    watched: HashMap<ProcessIdentity, RunId>,
}

impl Launcher {
    /// A launcher for the agent binary `exe`, started now (so the first
    /// launch does not wait for it); one that cannot start is tried again
    /// by the next [`Launcher::start`].
    pub(crate) fn new(exe: PathBuf) -> Launcher {
        let mut launcher = Launcher {
            exe,
            connection: None,
            unreaped: Vec::new(),
            watched: HashMap::new(),
        };
        if let Err(e) = launcher.connection() {
            tracing::warn!(error = %e, "cannot start the launcher; trying again at the next launch");
        }
        launcher
    }

    /// The current launcher process, started if there is none.
    fn connection(&mut self) -> std::io::Result<&mut Connection> {
        if self.connection.is_none() {
            let connection = Connection::start(&self.exe)?;
            tracing::debug!(pid = connection.identity().pid, "launcher started");
            self.connection = Some(connection);
        }
        Ok(self.connection.as_mut().expect("just started"))
    }

    /// Gives up the current launcher (it died, broke or did not answer):
    /// its runs are watched through `/proc` from now on; the next start
    /// starts another.
    fn give_up(&mut self) {
        if let Some(child) = self.connection.take().and_then(Connection::close) {
            // It exits once its tasks have ended (it may be broken, not dead).
            self.unreaped.push(child);
        }
        self.watched.clear();
    }

    /// Starts the tasks of `runs`, all in one batch of requests: one result
    /// a run, in order. A batch the launcher never got (it had died) goes
    /// once to a new launcher; a request it may have got is never sent
    /// again (the run fails, and whatever of it runs is killed).
    pub(crate) fn start(&mut self, runs: &[StartRequest<'_>]) -> Vec<Start> {
        let mut results: Vec<Option<Start>> = (0..runs.len()).map(|_| None).collect();
        let mut lost_snapshot: Option<ProcSnapshot> = None;
        for attempt in 0..2 {
            let pending: Vec<usize> = (0..runs.len()).filter(|&i| results[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let connection = match self.connection() {
                Ok(connection) => connection,
                Err(e) => {
                    let reason = format!("cannot start the launcher: {e}");
                    for i in pending {
                        results[i] = Some(Start::Failed(reason.clone()));
                    }
                    break;
                }
            };
            let launcher = connection.identity();
            let requests: Vec<(&Path, Option<&TaskPlan>)> = pending
                .iter()
                .map(|&i| (runs[i].dir, runs[i].plan))
                .collect();
            let answers = connection.start_tasks(&requests);
            let mut given_up = false;
            for (&i, answer) in pending.iter().zip(answers) {
                let run = &runs[i];
                results[i] = match answer {
                    Ok(Some(started)) => {
                        self.watched.insert(started.task, run.key.clone());
                        Some(Start::Running {
                            task: started.task,
                            launcher,
                            started_ms: started.time_ms,
                        })
                    }
                    Ok(None) => Some(Start::NotStarted { launcher }),
                    Err(RequestError::Refused(e)) => {
                        Some(Start::Failed(format!("cannot start the task: {e}")))
                    }
                    Err(RequestError::Gone(e)) => {
                        if !given_up {
                            tracing::warn!(error = %e, "the launcher is gone; starting another");
                            given_up = true;
                        }
                        if attempt == 0 {
                            None
                        } else {
                            Some(Start::Failed(format!("the launcher is gone: {e}")))
                        }
                    }
                    Err(RequestError::Lost(e)) => {
                        // It may have started the task (or may yet): never a
                        // second one. Whatever of it runs now is killed.
                        if !given_up {
                            tracing::warn!(error = %e, "the launcher did not answer; failing its runs");
                            given_up = true;
                        }
                        let snapshot = lost_snapshot.get_or_insert_with(ProcSnapshot::take);
                        proc::kill_all(&snapshot.marked(&proc::sandbox_marker(run.dir)));
                        Some(Start::Failed(format!(
                            "the launcher did not start the task: {e}"
                        )))
                    }
                };
            }
            if given_up {
                self.give_up();
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every request has a result"))
            .collect()
    }

    /// The runs whose ends the launcher has recorded since the last call,
    /// with their `exit` entries; reaps launchers given up that have exited.
    /// A launcher that is gone is given up (its runs are watched through
    /// `/proc`).
    pub(crate) fn take_ended(&mut self) -> Vec<(RunId, ExitRecord)> {
        self.unreaped
            .retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_)) | Err(_)));
        let Some(connection) = &mut self.connection else {
            return Vec::new();
        };
        match connection.take_exited() {
            Ok(exited) => exited
                .into_iter()
                .filter_map(|ended| {
                    let key = self.watched.remove(&ended.task)?;
                    Some((key, ended.exit_record()))
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "the launcher is gone; a new one starts with the next launch");
                self.give_up();
                Vec::new()
            }
        }
    }

    /// Whether the run's task (or an older agent's wrapper) may still be
    /// running: one the current launcher has not reported ended is, without
    /// a look at `/proc`.
    pub(crate) fn is_alive(&self, record: &RunRecord) -> bool {
        match record.task {
            Some(task) => self.watched.contains_key(&task) || task.is_alive(),
            None => record.wrapper.is_some_and(|w| w.is_alive()),
        }
    }

    /// Whether the run's task has ended and the launcher that started it,
    /// alive, has yet to record the end (it is cleaning up after the
    /// task): its `exit` entry comes.
    pub(crate) fn is_recording(&self, record: &RunRecord) -> bool {
        record.task.is_some() && record.launcher.is_some_and(|l| l.is_alive())
    }

    /// The process whose descendants are the run's processes (with itself,
    /// for a task), for the memory watch: `None` once it is gone.
    pub(crate) fn memory_root(&self, record: &RunRecord) -> Option<(ProcessIdentity, bool)> {
        match record.task {
            // Reaped and its pid maybe another's: its end is coming.
            Some(task) => task.is_alive().then_some((task, true)),
            None => record.wrapper.map(|wrapper| (wrapper, false)),
        }
    }

    /// Tells the run's main process `signal` (a preemption notice), nothing
    /// else of the run.
    pub(crate) fn notify(&self, record: &RunRecord, signal: Signal) {
        match record.task {
            Some(task) if task.is_alive() => proc::signal_all(&[task.pid], signal),
            // Ended, not started, or started by an older agent's wrapper:
            // no notice signal (the marker file is there all the same).
            _ => {}
        }
    }

    /// Asks the run to stop: its stop signal to the task alone when it has
    /// its own, else SIGTERM to its process group, every descendant of the
    /// task (some may have left the group) and its cgroup.
    pub(crate) fn terminate(&self, record: &RunRecord, dir: &Path, procs: &mut LazySnapshot) {
        let custom = record.stop_signal.and_then(|n| Signal::try_from(n).ok());
        let signal = custom.unwrap_or(Signal::SIGTERM);
        if let Some(task) = record.task {
            if !task.is_alive() {
                // Ended; the launcher kills what is left and records the end.
                return;
            }
            if custom.is_some() {
                // A task's own stop signal is a request to its main process
                // (as a container's stop signal goes to its first process):
                // helpers it forked may not handle it (pyspark's Python
                // workers die of SIGPWR while their executor
                // decommissions). SIGKILL after the grace takes the tree.
                proc::signal_all(&[task.pid], signal);
                return;
            }
            // Who is signalled is settled before the first signal: a task
            // that handles it may start processes of its own to do so (a
            // shell's trap running `date > file`), and those must not get
            // the signal meant for the tree it had when it was asked.
            let mut tree = procs.get().descendants(task.pid);
            if let Some(cgroup) = &record.cgroup {
                tree.extend(isolation::cgroup_pids(cgroup));
            }
            task.signal_group(signal);
            proc::signal_all(&tree, signal);
            return;
        }
        let Some(wrapper) = record.wrapper.filter(ProcessIdentity::is_alive) else {
            return;
        };
        if custom.is_some()
            && let Ok(record::JournalNews {
                started: Some(started),
                ..
            }) = record::read_news(dir, record.journal)
            && proc::read_stat(started.pid).is_some_and(|s| s.ppid == wrapper.pid)
        {
            proc::signal_all(&[started.pid], signal);
            return;
        }
        // The wrapper blocks every stop signal; the task gets it (one that
        // arrives before the task exists ends the run at once).
        wrapper.signal_group(signal);
        proc::signal_all(&procs.get().descendants(wrapper.pid), signal);
        if let Some(cgroup) = &record.cgroup {
            proc::signal_all(&isolation::cgroup_pids(cgroup), signal);
        }
    }

    /// SIGKILL to everything of the run: its cgroup, the task and its
    /// group, the task's descendants, and any process carrying the run's
    /// environment marker. The launcher records the end once all is gone.
    /// An older agent's wrapper is spared, so that it can still record the
    /// exit, until `WRAPPER_KILL_AFTER_MS` after the kill deadline.
    pub(crate) fn sweep(
        &self,
        record: &RunRecord,
        dir: &Path,
        now_ms: u64,
        procs: &mut LazySnapshot,
    ) {
        if let Some(cgroup) = &record.cgroup {
            isolation::kill_cgroup(cgroup);
        }
        let snapshot = procs.get();
        if let Some(task) = record.task.filter(ProcessIdentity::is_alive) {
            // The task and its group first: a task that outlived its
            // children by a moment would end on its own, not killed.
            let mut victims = snapshot.descendants(task.pid);
            victims.extend(snapshot.marked(&proc::sandbox_marker(dir)));
            task.signal_group(Signal::SIGKILL);
            proc::kill_all(&[task.pid]);
            proc::kill_all(&victims);
            return;
        }
        let wrapper = record.wrapper.filter(ProcessIdentity::is_alive);
        let mut victims = wrapper.map_or_else(Vec::new, |w| snapshot.descendants(w.pid));
        victims.extend(snapshot.marked(&proc::sandbox_marker(dir)));
        if let Some(w) = wrapper {
            victims.retain(|&pid| pid != w.pid);
        }
        proc::kill_all(&victims);
        if let Some(wrapper) = wrapper
            && record.kill_requested
            && now_ms
                >= record
                    .kill_deadline_ms
                    .saturating_add(WRAPPER_KILL_AFTER_MS)
        {
            wrapper.signal_group(Signal::SIGKILL);
        }
    }
}
