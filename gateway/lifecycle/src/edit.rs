//! Editing a batch job in place: its priority, running-instance cap, run
//! time limit and tolerated failures, for the instances that have not
//! started yet.
//!
//! An edit makes a new config version of the job (as an update does, but
//! nothing is stopped or rolled): every instance that holds no host moves
//! to it (waiting, queued, backing off, ended), and the queued ones are
//! queued again, so the engine orders them by the new priority and the new
//! cap bounds how many are queued. Runs on hosts keep their config — their
//! limit and the priority the engine placed them with — but not their
//! tolerated failures: every failure after the edit is counted against the
//! new `max_failures` (see `back_off`). Instances queued from now on take
//! the new priority.

use std::collections::BTreeSet;

use peloton_engine::Engine;

use super::effects::{Effects, RowKey};
use super::model::{JobKey, JobKind, TaskState as S};
use super::{Error, Lifecycle};

/// What an edit changes (`None`: kept).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobEdit {
    /// `sla.priority`.
    pub priority: Option<u32>,
    /// `sla.max_running_instances` (0: no limit).
    pub max_running: Option<u32>,
    /// `sla.max_running_time_ms` (0: no limit).
    pub max_running_time_ms: Option<u64>,
    /// `restart.max_failures` of the default task and every override.
    pub max_failures: Option<u32>,
}

impl JobEdit {
    /// Nothing would change.
    pub fn is_empty(&self) -> bool {
        *self == JobEdit::default()
    }
}

impl Lifecycle {
    /// Applies `edit` to batch job `k` (`id` as its caller named it). The
    /// caller checked the version and bumps it.
    pub(super) fn edit_job(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        id: &str,
        edit: JobEdit,
        fx: &mut Effects,
    ) -> Result<(), Error> {
        let job = &self.jobs[&k];
        if job.plan.kind != JobKind::Batch {
            let kind = match job.plan.kind {
                JobKind::Service => "a service",
                JobKind::Daemon => "a daemon job",
                _ => "an application",
            };
            return Err(Error::Precondition(format!(
                "job {id} is {kind}: only batch jobs are edited in place; \
                 services change by a rolling update (job update)"
            )));
        }
        if edit.is_empty() {
            return Err(Error::invalid("edit", "nothing to change"));
        }
        if job.state.is_terminal() {
            return Err(Error::Precondition(format!(
                "job {id} has ended ({}): no instance is left to edit (restart it first)",
                job.state.name()
            )));
        }
        if job.kill_requested {
            return Err(Error::Precondition(format!(
                "job {id} is being killed: no instance is left to edit"
            )));
        }
        if let Some(m) = edit.max_running
            && m != 0
            && m < job.plan.gang
        {
            return Err(Error::invalid(
                "sla.max_running_instances",
                format!("{m} is less than the gang size {}", job.plan.gang),
            ));
        }
        let mut plan = job.plan.clone();
        if let Some(p) = edit.priority {
            plan.priority = p;
        }
        if let Some(m) = edit.max_running {
            plan.max_running = m;
        }
        if let Some(ms) = edit.max_running_time_ms {
            plan.max_running_time_ms = ms;
        }
        if let Some(n) = edit.max_failures {
            plan.default_mut().restart.max_failures = n;
            for t in plan.overrides.values_mut() {
                std::sync::Arc::make_mut(t).restart.max_failures = n;
            }
        }
        let requeue =
            plan.priority != job.plan.priority || plan.max_running != job.plan.max_running;
        // Config versions are never reused (an update's rolled-back goal
        // keeps its number).
        let from = job.config;
        let to = job
            .updates
            .iter()
            .filter_map(|u| self.updates.get(u))
            .map(|u| u.to)
            .chain(job.old_configs.keys().copied())
            .fold(from, u64::max)
            + 1;
        // Instances that hold a host (or may: an orphan, a run still
        // stopping) keep their config; the others move.
        let moving: Vec<u32> = (0..job.tasks.len() as u32)
            .filter(|&i| {
                let t = &job.tasks[i as usize];
                !t.state.on_host() && !t.orphan && !self.held.contains_key(&(k, i))
            })
            .collect();
        let queued: Vec<u32> = if requeue {
            moving
                .iter()
                .copied()
                .filter(|&i| job.tasks[i as usize].state == S::Pending)
                .collect()
        } else {
            Vec::new()
        };
        let job = self.job_mut(k);
        let old = std::mem::replace(&mut job.plan, plan);
        job.old_configs.insert(from, old);
        job.config = to;
        for &i in &moving {
            job.tasks[i as usize].config = to;
        }
        for &i in &moving {
            // Recovery takes an instance without a row to be on the first
            // config: every moved one gets a row.
            self.mark_dirty(k, i, fx);
        }
        for i in queued {
            // Queued again: with its new priority, under its new cap. A
            // gang's mates go back with their first (`release`).
            if self.jobs[&k].tasks[i as usize].state == S::Pending {
                self.release(engine, k, i, fx);
                self.back_to_waiting(k, i, fx);
            }
        }
        self.need_fill.insert(k);
        self.gc_configs(k, fx);
        fx.rows.push(RowKey::Config(k, to));
        self.dirty_jobs.insert(k);
        debug_assert!({
            let job = &self.jobs[&k];
            let live: BTreeSet<u64> = job.tasks.iter().map(|t| t.config).collect();
            live.iter()
                .all(|&v| v == to || job.old_configs.contains_key(&v))
        });
        Ok(())
    }
}
