//! Dependencies between jobs (Slurm's afterok, afterany, afternotok). A
//! job whose plan names jobs in `after` is created and stored at once, but
//! none of its instances is queued until each of those ended as asked
//! (`Job::waits_for_jobs`). A dependency that can no longer be met (a
//! `succeeded` job that failed or was killed, a `failed` job that
//! succeeded, a job that no longer exists) kills the waiting job at once,
//! its instances' reason naming the dependency, as Slurm cancels a job
//! whose dependency is never satisfied.
//!
//! Every dependency is settled by its job's first terminal state, which is
//! when waiting jobs are looked at again (`after_dirty`, at the end of the
//! step): releasing one, or killing it, may settle others in turn.

use peloton_engine::Engine;

use super::effects::Effects;
use super::model::{Dependency, JobKey, JobKind, JobPlan};
use super::{Error, Lifecycle};

/// At most this many dependencies per job.
pub const MAX_DEPENDENCIES: usize = 64;

/// What a dependency says now.
enum Verdict {
    /// Its job ended as asked.
    Met,
    /// Its job has not ended yet.
    Waits,
    /// It can never be met: why.
    Never(String),
}

/// The spec's field of the `n`th dependency of `after`.
fn field_of(after: &[Dependency], n: usize) -> String {
    let condition = after[n].condition;
    let within = after[..n]
        .iter()
        .filter(|d| d.condition == condition)
        .count();
    format!("spec.after.{}[{within}]", condition.name())
}

impl Lifecycle {
    /// Checks a new job's dependencies: at most [`MAX_DEPENDENCIES`], each
    /// an existing job (full ids: the shell puts unique prefixes' jobs in
    /// their place), not the job itself.
    pub(super) fn check_after(&self, id: &str, plan: &JobPlan) -> Result<(), Error> {
        let after = &plan.after;
        if after.is_empty() {
            return Ok(());
        }
        if after.len() > MAX_DEPENDENCIES {
            return Err(Error::invalid(
                "spec.after",
                format!(
                    "{} dependencies; a job has at most {MAX_DEPENDENCIES}",
                    after.len()
                ),
            ));
        }
        if plan.kind == JobKind::Application {
            return Err(Error::invalid(
                "spec.after",
                "an application job cannot wait for other jobs",
            ));
        }
        for (n, d) in after.iter().enumerate() {
            if &*d.job == id {
                return Err(Error::invalid(
                    &field_of(after, n),
                    "a job cannot wait for itself",
                ));
            }
            if !self.by_id.contains_key(&d.job) {
                return Err(Error::NotFound(format!(
                    "{}: job {} not found",
                    field_of(after, n),
                    d.job
                )));
            }
        }
        Ok(())
    }

    fn verdict(&self, d: &Dependency) -> Verdict {
        let Some(k) = self.by_id.get(&d.job) else {
            // Gone (deleted, or past retention): it ended long ago, and a
            // job still waiting on it was killed then.
            return Verdict::Never(format!(
                "dependency {} no longer exists: {} cannot be met",
                d.job,
                d.condition.slurm_name()
            ));
        };
        let state = self.jobs[k].state;
        if !state.is_terminal() {
            Verdict::Waits
        } else if d.condition.met_by(state) {
            Verdict::Met
        } else {
            Verdict::Never(format!(
                "dependency {} {}: {} cannot be met",
                d.job,
                state.name(),
                d.condition.slurm_name()
            ))
        }
    }

    /// Why a job of `plan` would not start now for its dependencies: the
    /// first that could never be met (it would be killed at once), else
    /// those it would wait for; none if every one is met.
    pub(super) fn plan_waits(&self, plan: &JobPlan) -> Option<String> {
        let mut waits = Vec::new();
        for d in plan.after.iter() {
            match self.verdict(d) {
                Verdict::Met => {}
                Verdict::Waits => waits.push(format!("{} ({})", d.job, d.condition.slurm_name())),
                Verdict::Never(why) => return Some(format!("it would be killed at once: {why}")),
            }
        }
        (!waits.is_empty()).then(|| format!("waits for jobs to end as asked: {}", waits.join(", ")))
    }

    /// The dependencies job `k` still waits for (none once it no longer
    /// waits).
    pub fn waiting_for(&self, k: JobKey) -> Vec<Dependency> {
        let Some(job) = self.jobs.get(&k) else {
            return Vec::new();
        };
        if !job.waits_for_jobs {
            return Vec::new();
        }
        job.plan
            .after
            .iter()
            .filter(|d| matches!(self.verdict(d), Verdict::Waits))
            .cloned()
            .collect()
    }

    /// Starts a new job waiting for its dependencies, if it has any.
    pub(super) fn start_waiting(&mut self, k: JobKey) {
        let job = self.job_mut(k);
        job.waits_for_jobs = !job.plan.after.is_empty();
        if job.waits_for_jobs {
            self.after_waiting.insert(k);
            // Jobs that ended already settle it in this step.
            self.after_dirty = true;
        }
    }

    /// Looks at waiting jobs again once some job ended: releases those
    /// whose dependencies are all met (their instances are queued), kills
    /// those with one that can never be met. Ends with job states derived.
    pub(super) fn settle_dependencies(&mut self, engine: &mut Engine, fx: &mut Effects) {
        // Each round releases or kills a waiting job, or stops.
        while std::mem::take(&mut self.after_dirty) {
            let mut released = Vec::new();
            let mut never = Vec::new();
            for &k in &self.after_waiting {
                let job = &self.jobs[&k];
                let mut met = true;
                for d in job.plan.after.iter() {
                    match self.verdict(d) {
                        Verdict::Met => {}
                        Verdict::Waits => met = false,
                        Verdict::Never(why) => {
                            // One already killed stays so (a restart
                            // looks again).
                            if !job.kill_requested {
                                never.push((k, why));
                            }
                            met = false;
                            break;
                        }
                    }
                }
                if met {
                    released.push(k);
                }
            }
            if released.is_empty() && never.is_empty() {
                break;
            }
            for k in released {
                self.after_waiting.remove(&k);
                self.job_mut(k).waits_for_jobs = false;
                self.need_fill.insert(k);
                self.dirty_jobs.insert(k);
            }
            for (k, why) in never {
                self.kill_job(engine, k, &why, fx);
            }
            self.fill_all(engine, fx);
            self.derive_job_states(fx);
        }
        self.after_dirty = false;
    }
}
