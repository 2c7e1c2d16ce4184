//! A bounded history: finished jobs are removed once they are older than
//! `CoreConfig::retention_ms` or beyond the newest
//! `CoreConfig::max_finished_jobs`, exactly as a user's delete removes them
//! (engine tasks, waiting queues, updates, old configs, indexes and their
//! store rows), with a job event whose reason is "retention".
//!
//! Terminal jobs are kept in `finished`, ordered by completion time, so a
//! tick looks only at the jobs it removes; it removes at most
//! [`RETENTION_CHUNK`] of them, so that a large backlog (a lowered limit, a
//! restart after a long pause) is worked off over several iterations
//! instead of stalling one.

use rustc_hash::FxHashSet;

use super::Lifecycle;
use super::effects::{Effects, RowKey};
use super::model::{JobKey, JobState};

/// Most jobs one tick removes.
pub const RETENTION_CHUNK: usize = 1000;

/// The reason of a job event for a job retention removed.
pub const REASON_RETENTION: &str = "retention";

/// The reason of a job event for a tick's job its cron job's history
/// bound removed.
pub const REASON_CRON_HISTORY: &str = "cron history";

/// The reason of a job event for a job a user deleted.
pub const REASON_DELETED: &str = "deleted";

/// The reason of a job event for an ended job deleted with its pool.
pub const REASON_POOL_DELETED: &str = "pool deleted";

impl Lifecycle {
    /// When retention next has something to remove (`now` if finished jobs
    /// are beyond the count), if ever.
    pub(super) fn retention_deadline(&self) -> Option<u64> {
        if self.finished.len() > self.config.max_finished_jobs {
            return Some(self.now);
        }
        self.finished
            .first()
            .map(|&(at, _)| at.saturating_add(self.config.retention_ms))
    }

    /// Keeps the index of finished jobs in step with a job's state (called
    /// whenever a job's state or completion time changes).
    pub(super) fn note_job_state(&mut self, k: JobKey, old: (JobState, u64), new: (JobState, u64)) {
        if old.0.is_terminal() {
            self.finished.remove(&(old.1, k));
        }
        if new.0.is_terminal() {
            self.finished.insert((new.1, k));
        }
    }

    /// Removes finished jobs past their age, and the oldest beyond the
    /// count, at most [`RETENTION_CHUNK`] of them.
    pub(super) fn apply_retention(
        &mut self,
        engine: &mut peloton_engine::Engine,
        fx: &mut Effects,
    ) {
        let mut gone = FxHashSet::default();
        while gone.len() < RETENTION_CHUNK {
            let Some(&(at, k)) = self.finished.first() else {
                break;
            };
            let over = self.finished.len() > self.config.max_finished_jobs;
            if !over && at.saturating_add(self.config.retention_ms) > self.now {
                break;
            }
            self.remove_job(engine, k, REASON_RETENTION, fx);
            gone.insert(k);
        }
        if !gone.is_empty() {
            // Rows of these jobs queued earlier in the step are moot.
            fx.rows.retain(|r| {
                !matches!(r, RowKey::Job(x) | RowKey::Task(x, _) | RowKey::Config(x, _) if gone.contains(x))
            });
        }
    }
}
