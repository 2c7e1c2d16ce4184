//! Reports: queued per change, handed to the session, superseded by a
//! registration, forgotten once acknowledged.

use super::Supervisor;
use super::held::{Run, persist};
use crate::run::{Phase, RunId, RunReport};

impl Supervisor {
    /// Writes the run's record and queues its report.
    pub(super) fn commit(&mut self, run: &mut Run) {
        persist(run, &self.open_journals);
        self.outbox.push(&run.record.key, run.report());
    }

    /// Queues a RUNNING report for every run whose health changed (it
    /// carries the health of now, which may have changed again since).
    pub(super) fn report_health_changes(&mut self) {
        for key in self.health_changes.take() {
            if let Some(run) = self.runs.get(&key)
                && run.record.report.phase == Phase::Running
                && !run.record.kill_requested
            {
                self.outbox.push(&key, run.report());
            }
        }
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
        self.outbox.len()
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
}
