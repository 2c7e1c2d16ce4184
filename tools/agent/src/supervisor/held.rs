//! One run as the supervisor holds it: its record, its journal kept open,
//! and the reports it makes.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::health::{HealthChecker, Verdict};
use crate::record::{self, ExitRecord, RunRecord, TaskPlan};
use crate::run::{Health, Phase, PhaseReport, RunId, RunReport};

/// One run the supervisor holds.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) record: RunRecord,
    pub(super) dir: PathBuf,
    /// The task plan, until the first record writes it to the journal.
    pub(super) plan: Option<TaskPlan>,
    /// The health checker, from RUNNING on (kept, stopped, once the run
    /// has ended or is being killed: its last verdict is still reported).
    pub(super) checker: Option<HealthChecker>,
    /// The `exit` entry the launcher reported writing (so the journal is
    /// not read back for it).
    pub(super) exit: Option<ExitRecord>,
    /// Whether the sandbox may hold secrets to remove at the end: false
    /// only for a run this agent launched without any (a run adopted after
    /// a restart may have some).
    pub(super) may_hold_secrets: bool,
    /// The journal, open (see [`OpenJournal`]).
    pub(super) journal: Option<OpenJournal>,
    /// The modification time of its `PELOTON_CHECKPOINT` file when last
    /// looked at (ms; 0: none yet). Not recorded: a restarted agent finds
    /// it again.
    pub(super) checkpoint_ms: u64,
    /// Sizes of its stdout and stderr at their last marks (see
    /// `logs::sample_output`; 0 after a restart: the first sample marks
    /// what is there then).
    pub(super) output_sizes: [u64; 2],
}

impl Run {
    pub(super) fn new(record: RunRecord, dir: PathBuf) -> Run {
        Run {
            record,
            dir,
            plan: None,
            checker: None,
            exit: None,
            may_hold_secrets: true,
            journal: None,
            checkpoint_ms: 0,
            output_sizes: [0; 2],
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
    pub(super) fn report(&self) -> RunReport {
        let verdict = self.verdict();
        RunReport {
            key: self.record.key.clone(),
            phase: self.record.report.clone(),
            ports: self.record.ports.clone(),
            health: verdict.health,
            health_detail: verdict.detail,
            checkpoint_ms: self.checkpoint_ms,
        }
    }

    /// Stops health checks (they may go on a moment: see `HealthChecker`).
    pub(super) fn stop_checks(&self) {
        if let Some(checker) = &self.checker {
            checker.stop();
        }
    }
}

/// A run's journal, kept open from its first append to its last (its
/// acknowledgement): four appends a short run, each of which opened and
/// closed the file before. At most `MAX_OPEN_JOURNALS` at once; past that,
/// a run's appends open the file each time, as before.
#[derive(Debug)]
pub(super) struct OpenJournal {
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
pub(super) fn persist(run: &mut Run, open_journals: &Arc<AtomicUsize>) {
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
pub(super) fn final_report(exit: &ExitRecord, kill_requested: bool) -> PhaseReport {
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
pub(super) fn bare_report(key: &RunId, phase: PhaseReport) -> RunReport {
    RunReport {
        key: key.clone(),
        phase,
        ports: Vec::new(),
        health: Health::None,
        health_detail: String::new(),
        checkpoint_ms: 0,
    }
}
