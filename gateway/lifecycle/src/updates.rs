//! Rolling updates of services: instances move to a new spec a batch at a
//! time; an instance counts as updated once it runs the new spec and is
//! healthy (running, without a health check). At most `batch_size`
//! instances are down because of the update at any moment. Too many failed
//! instances fail the update, or roll it back.
//!
//! Progress is a cursor over the instances plus the set being moved now; the
//! instances' config versions are stored with their tasks, and the update
//! with its own row, so a restarted server resumes where it was.
//!
//! A finished update's record is history: its counts (instances on its goal,
//! instances in all) are frozen when it ends ([`UpdateCounts`]), so later
//! updates of the job do not rewrite them, and the instances that failed on
//! the new spec stay listed through a rollback (those that fail on the way
//! back are listed apart).

use std::collections::BTreeSet;
use std::sync::Arc;

use peloton_engine::Engine;

use super::effects::{Effects, RowKey};
use super::model::{Health, JobKey, JobPlan, TaskState as S};
use super::{Answer, Error, Lifecycle};

/// How an update proceeds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateSpec {
    /// Instances moved at once (at least 1).
    pub batch_size: u32,
    /// Failed runs of one instance on the new spec before it counts as
    /// failed.
    pub max_instance_retries: u32,
    /// The update fails once more instances than this have failed.
    pub max_failed_instances: u32,
    /// A failed update rolls back.
    pub rollback_on_failure: bool,
    /// Created paused.
    pub start_paused: bool,
}

/// Where an update is. Numbering is the API's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum UpdateState {
    /// Created, not started.
    #[default]
    Initialized = 1,
    /// Moving instances to the new spec.
    RollingForward = 2,
    /// Every instance runs the new spec, healthy.
    Succeeded = 3,
    /// Too many instances failed (and no rollback was asked for).
    Failed = 4,
    /// Moving instances back to the old spec.
    RollingBackward = 5,
    /// Every instance runs the old spec again.
    RolledBack = 6,
    /// Stopped for now; resumes to `paused_from`.
    Paused = 7,
    /// Stopped for good where it was.
    Aborted = 8,
}

impl UpdateState {
    /// Nothing more happens.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            UpdateState::Succeeded
                | UpdateState::Failed
                | UpdateState::RolledBack
                | UpdateState::Aborted
        )
    }

    /// The name used in fixtures and logs.
    pub fn name(self) -> &'static str {
        match self {
            UpdateState::Initialized => "initialized",
            UpdateState::RollingForward => "rolling_forward",
            UpdateState::Succeeded => "succeeded",
            UpdateState::Failed => "failed",
            UpdateState::RollingBackward => "rolling_backward",
            UpdateState::RolledBack => "rolled_back",
            UpdateState::Paused => "paused",
            UpdateState::Aborted => "aborted",
        }
    }
}

/// A new update, as asked for.
#[derive(Clone, Debug)]
pub struct UpdateRequest {
    /// The job's id.
    pub job_id: String,
    /// Expected job version (0: any).
    pub version: u64,
    /// The update's (fresh) id.
    pub id: Arc<str>,
    /// The new plan.
    pub plan: JobPlan,
    /// How to roll.
    pub spec: UpdateSpec,
}

/// A user's action on an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateAction {
    /// Start no more instances.
    Pause,
    /// Go on.
    Resume,
    /// Stop for good.
    Abort,
    /// Move the instances back to the old spec.
    Rollback,
}

/// An update of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// Its id.
    pub id: Arc<str>,
    /// The job.
    pub job: JobKey,
    /// How.
    pub spec: UpdateSpec,
    /// Config version it started from.
    pub from: u64,
    /// Config version it rolls to.
    pub to: u64,
    /// Where it is.
    pub state: UpdateState,
    /// While paused: the state it resumes to.
    pub paused_from: Option<UpdateState>,
    /// Instances below this were moved (or skipped) in the current
    /// direction.
    pub cursor: u32,
    /// Instances being moved now.
    pub in_progress: BTreeSet<u32>,
    /// Instances that failed on the new spec (kept through a rollback: its
    /// reason counts them).
    pub failed: BTreeSet<u32>,
    /// Instances that failed on the old spec while rolling back.
    pub failed_back: BTreeSet<u32>,
    /// Its counts when it ended (`None` while it runs, or for an ended
    /// update recovered from a row without them: then they are derived).
    pub final_counts: Option<UpdateCounts>,
    /// Created.
    pub created_at: u64,
    /// Ended (0: not).
    pub completed_at: u64,
    /// Why it failed, was aborted or rolled back.
    pub reason: Option<Box<str>>,
}

impl Update {
    /// The config version instances move to now.
    pub fn goal(&self) -> u64 {
        match self.state {
            UpdateState::RollingBackward | UpdateState::RolledBack => self.from,
            UpdateState::Paused if self.paused_from == Some(UpdateState::RollingBackward) => {
                self.from
            }
            _ => self.to,
        }
    }

    /// Moving instances (not paused, not ended).
    pub fn is_rolling(&self) -> bool {
        matches!(
            self.state,
            UpdateState::RollingForward | UpdateState::RollingBackward
        )
    }

    /// Moving instances back to `from` (or paused while doing so).
    fn backward(&self) -> bool {
        self.state == UpdateState::RollingBackward
            || (self.state == UpdateState::Paused
                && self.paused_from == Some(UpdateState::RollingBackward))
    }

    /// The instances that failed on the spec they are being moved to now:
    /// the ones the update's limits and batch count.
    pub fn failed_now(&self) -> &BTreeSet<u32> {
        if self.backward() {
            &self.failed_back
        } else {
            &self.failed
        }
    }

    fn failed_now_mut(&mut self) -> &mut BTreeSet<u32> {
        if self.backward() {
            &mut self.failed_back
        } else {
            &mut self.failed
        }
    }
}

/// An update's instance counts as the API shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateCounts {
    /// Instances running the update's goal spec, healthy.
    pub done: u32,
    /// The job's instances.
    pub total: u32,
}

/// Updates kept per job (the oldest ended ones go first).
pub const MAX_UPDATES_PER_JOB: usize = 16;

impl Lifecycle {
    /// An update by id.
    pub fn update(&self, id: &str) -> Option<&Update> {
        self.updates.get(id)
    }

    /// An instance its user killed (the kill confirmed or not): an update
    /// does not start it again (its own moves are held to restart).
    fn stopped_by_user(&self, k: JobKey, i: u32) -> bool {
        self.jobs[&k].tasks[i as usize].state == S::Killed
            && self.held(k, i).is_none_or(|h| !h.restart)
    }

    /// Whether instance `i` of job `k` is being moved by the job's update.
    pub(super) fn in_update_batch(&self, k: JobKey, i: u32) -> bool {
        self.jobs
            .get(&k)
            .and_then(|j| j.latest_update())
            .and_then(|id| self.updates.get(id))
            .is_some_and(|u| !u.state.is_terminal() && u.in_progress.contains(&i))
    }

    /// An update's counts: frozen when it ended; while it runs (or for an
    /// ended update recovered without them), the instances of its job that
    /// run its goal spec and are healthy (running, without a health check),
    /// of all its instances.
    pub fn update_counts(&self, u: &Update) -> UpdateCounts {
        if let Some(frozen) = u.final_counts {
            return frozen;
        }
        let Some(job) = self.jobs.get(&u.job) else {
            return UpdateCounts::default();
        };
        let goal = u.goal();
        UpdateCounts {
            done: (0..job.tasks.len() as u32)
                .filter(|&i| self.instance_done(u.job, i, goal))
                .count() as u32,
            total: job.tasks.len() as u32,
        }
    }

    /// Ends an update in `state` (terminal): its counts are frozen as they
    /// are now (against the goal it was moving to), and `reason`, if given,
    /// says why.
    fn end_update(&mut self, id: &str, state: UpdateState, reason: Option<&str>) {
        debug_assert!(state.is_terminal());
        let u = &self.updates[id];
        let counts = self.update_counts(u);
        let now = self.now;
        let u = self.updates.get_mut(id).expect("live update");
        u.state = state;
        u.paused_from = None;
        u.completed_at = now;
        if let Some(reason) = reason {
            u.reason = Some(reason.into());
        }
        u.final_counts = Some(counts);
        self.rolling.remove(id);
    }

    fn instance_done(&self, k: JobKey, i: u32, goal: u64) -> bool {
        let job = &self.jobs[&k];
        let t = &job.tasks[i as usize];
        t.config == goal
            && t.state == S::Running
            && (t.health == Health::Healthy
                || (t.health == Health::None && !job.template(i).health_check))
    }

    pub(super) fn create_update(
        &mut self,
        engine: &mut Engine,
        request: UpdateRequest,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let UpdateRequest {
            job_id,
            version,
            id,
            plan,
            spec,
        } = request;
        let job_id = job_id.as_str();
        self.check_job_host_pool(&plan.host_pool)?;
        let k = self.job_key(job_id)?;
        let job = &self.jobs[&k];
        if version != 0 && version != job.version {
            return Err(Error::Stale {
                what: format!("job {job_id}"),
                given: version,
                current: job.version,
            });
        }
        if !job.plan.kind.keeps_running() {
            return Err(Error::Precondition(format!(
                "job {job_id} is a batch job: rolling updates are for services"
            )));
        }
        if plan.kind != job.plan.kind {
            return Err(Error::invalid(
                "spec.type",
                "an update cannot change the job's type",
            ));
        }
        if plan.pool != job.plan.pool {
            return Err(Error::invalid(
                "spec.pool",
                format!("an update cannot move the job (from {})", job.plan.pool),
            ));
        }
        if plan.name != job.plan.name {
            return Err(Error::invalid(
                "spec.name",
                format!(
                    "an update cannot rename the job (it is named {:?})",
                    &*job.plan.name
                ),
            ));
        }
        if plan.gang != job.plan.gang {
            return Err(Error::invalid(
                "spec.sla.min_running_instances",
                "an update cannot change the gang size",
            ));
        }
        if plan.after != job.plan.after {
            return Err(Error::invalid(
                "spec.after",
                "an update cannot change the jobs the job waits for",
            ));
        }
        if job.kill_requested {
            return Err(Error::Precondition(format!(
                "job {job_id} was killed; restart it first"
            )));
        }
        // The job's pool must still be a leaf (it may have been deleted and
        // created again, or have got child pools while the job was idle),
        // and an ended service it brings back must still own its name.
        self.check_job_pool(engine, k)?;
        self.check_name_kept(k)?;
        let job = &self.jobs[&k];
        if job.plan.gang > 1 {
            return Err(Error::Precondition(format!(
                "job {job_id} runs in gangs of {}: rolling updates of gang jobs are not supported yet",
                job.plan.gang
            )));
        }
        if self.updates.contains_key(&id) {
            return Err(Error::Precondition(format!("update {id} exists already")));
        }
        self.check_admissible(engine, job.pool, &plan, plan.instance_count)?;
        for i in 0..job.tasks.len() as u32 {
            let (old, new) = (&job.template(i).volume, &plan.template(i).volume);
            if old.as_ref().map(|v| v.size_mb) != new.as_ref().map(|v| v.size_mb) {
                return Err(Error::invalid(
                    "spec.default_task.volume",
                    format!(
                        "an update cannot add, remove or resize a volume (instance {i}); \
                         instances are updated in place, on their volumes"
                    ),
                ));
            }
        }
        let mut plan = plan;
        if plan.kind == super::model::JobKind::Daemon {
            // A daemon's count follows the hosts, not the spec.
            plan.instance_count = job.tasks.len() as u32;
        }
        let n_old = job.tasks.len() as u32;
        let count = plan.instance_count;
        let from = job.config;
        // Config versions are never reused, also after a rollback (a rolled
        // back update keeps its `to`).
        let newest = job
            .updates
            .iter()
            .filter_map(|u| self.updates.get(u))
            .map(|u| u.to)
            .chain(job.old_configs.keys().copied())
            .fold(from, u64::max);
        // A new update aborts the one in progress and takes over the
        // instances it was moving (they are down: they count in its batch).
        let carried = self.abort_update_of(k, &format!("replaced by update {id}"), fx);
        let to = newest + 1;
        let now = self.now;
        let job = self.job_mut(k);
        let old = std::mem::replace(&mut job.plan, plan);
        // The old plan's instance count stays as it was: instances that
        // keep it are the old ones.
        job.old_configs.insert(from, old);
        job.config = to;
        job.version += 1;
        let mut update = Update {
            id: id.clone(),
            job: k,
            spec: UpdateSpec {
                batch_size: spec.batch_size.max(1),
                ..spec
            },
            from,
            to,
            state: UpdateState::RollingForward,
            paused_from: None,
            cursor: 0,
            in_progress: BTreeSet::new(),
            failed: BTreeSet::new(),
            failed_back: BTreeSet::new(),
            final_counts: None,
            created_at: now,
            completed_at: 0,
            reason: None,
        };
        if spec.start_paused {
            update.paused_from = Some(UpdateState::RollingForward);
            update.state = UpdateState::Paused;
        }
        job.updates.push_back(id.clone());
        if update.is_rolling() {
            self.rolling.insert(id.clone());
        }
        self.updates.insert(id.clone(), update);
        self.trim_updates(k, fx);
        self.retarget(engine, &id, carried, fx);
        fx.rows.push(RowKey::Config(k, to));
        fx.rows.push(RowKey::Update(id));
        self.dirty_jobs.insert(k);
        if count != n_old {
            // New instances start on the job's config: `to`.
            self.scale_to(engine, k, count, "job updated to fewer instances", fx);
        }
        Ok(Answer::Job(k))
    }

    /// Aborts the job's update in progress, if any.
    pub(super) fn abort_update_of(
        &mut self,
        k: JobKey,
        reason: &str,
        fx: &mut Effects,
    ) -> BTreeSet<u32> {
        let Some(id) = self.jobs[&k].latest_update().cloned() else {
            return BTreeSet::new();
        };
        let u = &self.updates[&id];
        if u.state.is_terminal() {
            return BTreeSet::new();
        }
        let moving = u.in_progress.clone();
        self.end_update(&id, UpdateState::Aborted, Some(reason));
        fx.rows.push(RowKey::Update(id));
        moving
    }

    /// Points instances that are down being moved at the update's goal and
    /// counts them in its batch (a rollback, or a new update taking over).
    fn retarget(
        &mut self,
        engine: &mut Engine,
        id: &Arc<str>,
        moving: BTreeSet<u32>,
        fx: &mut Effects,
    ) {
        let u = &self.updates[id];
        let (k, goal) = (u.job, u.goal());
        let n = self.jobs[&k].tasks.len() as u32;
        for i in moving {
            if i >= n {
                continue;
            }
            let stopped_by_user = self.stopped_by_user(k, i);
            let t = &mut self.job_mut(k).tasks[i as usize];
            if t.config != goal {
                t.config = goal;
                t.failures = 0;
                self.mark_dirty(k, i, fx);
                // (A place kept for it is resized.)
                self.pin_changed(k, i);
                if !stopped_by_user {
                    self.move_instance(engine, k, i, fx);
                }
            }
            if stopped_by_user {
                continue;
            }
            self.updates
                .get_mut(id)
                .expect("live")
                .in_progress
                .insert(i);
        }
    }

    /// Keeps the newest [`MAX_UPDATES_PER_JOB`] updates of a job.
    fn trim_updates(&mut self, k: JobKey, fx: &mut Effects) {
        while self.jobs[&k].updates.len() > MAX_UPDATES_PER_JOB {
            let Some(old) = self.job_mut(k).updates.pop_front() else {
                break;
            };
            self.updates.remove(&old);
            fx.rows.push(RowKey::UpdateDeleted(old));
        }
    }

    pub(super) fn update_action(
        &mut self,
        engine: &mut Engine,
        id: &str,
        action: UpdateAction,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let u = self
            .updates
            .get(id)
            .ok_or_else(|| Error::UpdateNotFound(id.to_string()))?;
        let (k, state) = (u.job, u.state);
        if !self.jobs.contains_key(&k) {
            return Err(Error::UpdateNotFound(id.to_string()));
        }
        if matches!(action, UpdateAction::Resume | UpdateAction::Rollback) {
            // Both start instances again: the job's pool must still be a
            // leaf (it may have got child pools since), and an ended job
            // comes back only if no other unfinished job holds its name.
            self.check_job_pool(engine, k)?;
            self.check_name_kept(k)?;
        }
        let job = &self.jobs[&k];
        let latest = job.latest_update().is_some_and(|l| &**l == id);
        let refuse = |what: &str| {
            Err(Error::Precondition(format!(
                "update {id} is {}: it cannot {what}",
                state.name()
            )))
        };
        let u = self.updates.get_mut(id).expect("checked");
        match action {
            UpdateAction::Pause => {
                if !u.is_rolling() {
                    return refuse("be paused");
                }
                u.paused_from = Some(u.state);
                u.state = UpdateState::Paused;
            }
            UpdateAction::Resume => {
                if u.state != UpdateState::Paused {
                    return refuse("be resumed");
                }
                u.state = u.paused_from.take().unwrap_or(UpdateState::RollingForward);
                self.rolling.insert(Arc::from(id));
            }
            UpdateAction::Abort => {
                if state.is_terminal() {
                    return refuse("be aborted");
                }
                self.end_update(id, UpdateState::Aborted, Some("aborted by request"));
            }
            UpdateAction::Rollback => {
                let backward = state == UpdateState::RollingBackward
                    || u.paused_from == Some(UpdateState::RollingBackward);
                if backward || state == UpdateState::RolledBack || !latest {
                    return refuse("be rolled back (only the job's latest update can, once)");
                }
                if job.kill_requested {
                    return Err(Error::Precondition(format!(
                        "the job of update {id} was killed; restart it first"
                    )));
                }
                self.start_rollback(engine, id, "rolled back by request", fx);
            }
        }
        fx.rows.push(RowKey::Update(Arc::from(id)));
        Ok(Answer::Job(k))
    }

    /// Turns the update around: its instances go back to its `from` spec.
    fn start_rollback(&mut self, engine: &mut Engine, id: &str, reason: &str, fx: &mut Effects) {
        let u = self.updates.get_mut(id).expect("live update");
        let (k, from, to) = (u.job, u.from, u.to);
        u.state = UpdateState::RollingBackward;
        u.paused_from = None;
        u.cursor = 0;
        // The instances being moved are down: they go back first, and count
        // in the batch of the way back. Those that failed on the new spec
        // stay listed (the reason counts them); the way back counts its own.
        let moving = std::mem::take(&mut u.in_progress);
        u.failed_back.clear();
        // An ended update rolled back runs again: its counts are live.
        u.final_counts = None;
        u.completed_at = 0;
        u.reason = Some(reason.into());
        self.rolling.insert(Arc::from(id));
        let job = self.job_mut(k);
        if job.config == to {
            let back = job
                .old_configs
                .remove(&from)
                .expect("an update keeps its from");
            let forward = std::mem::replace(&mut job.plan, back);
            job.old_configs.insert(to, forward);
            job.config = from;
            job.version += 1;
            self.dirty_jobs.insert(k);
            let count = self.jobs[&k].plan.instance_count;
            if self.jobs[&k].plan.kind == super::model::JobKind::Daemon {
                // A daemon's count follows the hosts, not the old spec.
                self.sync_daemon_count(k);
            } else if count != self.jobs[&k].tasks.len() as u32 {
                // New instances start on the job's config: `from` again.
                self.scale_to(engine, k, count, "rolled back to fewer instances", fx);
            }
        }
        self.retarget(engine, &Arc::from(id), moving, fx);
    }

    /// Moves every rolling update along: done and failed instances leave
    /// the batch, new ones enter it, and the update ends when every
    /// instance runs its goal spec.
    pub(super) fn advance_updates(&mut self, engine: &mut Engine, fx: &mut Effects) {
        let mut ids: Vec<Arc<str>> = self.rolling.iter().cloned().collect();
        ids.sort_unstable();
        for id in ids {
            self.advance(engine, &id, fx);
        }
    }

    fn advance(&mut self, engine: &mut Engine, id: &Arc<str>, fx: &mut Effects) {
        let Some(u) = self.updates.get(id) else {
            self.rolling.remove(id);
            return;
        };
        if !u.is_rolling() {
            if u.state.is_terminal() || u.state == UpdateState::Paused {
                self.rolling.remove(id);
                if u.state.is_terminal() {
                    self.gc_configs(u.job, fx);
                }
            }
            return;
        }
        let (k, goal, backward) = (u.job, u.goal(), u.state == UpdateState::RollingBackward);
        let spec = u.spec;
        let mut changed = false;
        // Instances of the batch that are done, or failed.
        let batch: Vec<u32> = u.in_progress.iter().copied().collect();
        let n = self.jobs[&k].tasks.len() as u32;
        let mut leave = Vec::new();
        let mut failed_now = Vec::new();
        for i in batch {
            if i >= n || self.instance_done(k, i, goal) {
                leave.push(i);
                continue;
            }
            let t = &self.jobs[&k].tasks[i as usize];
            if t.config == goal && self.stopped_by_user(k, i) {
                // Killed by a user meanwhile: not the update's to wait for.
                leave.push(i);
            } else if t.config == goal && t.failures > spec.max_instance_retries {
                failed_now.push(i);
            }
        }
        let u = self.updates.get_mut(id).expect("live");
        for i in leave {
            u.in_progress.remove(&i);
            changed = true;
        }
        for i in failed_now {
            u.in_progress.remove(&i);
            u.failed_now_mut().insert(i);
            changed = true;
        }
        let n_failed = u.failed_now().len() as u32;
        if n_failed > spec.max_failed_instances {
            let on = if backward {
                "the old spec while rolling back"
            } else {
                "the new spec"
            };
            let reason = format!(
                "{n_failed} instance(s) failed on {on} (more than max_failed_instances {})",
                spec.max_failed_instances
            );
            if spec.rollback_on_failure && !backward {
                self.start_rollback(engine, id, &reason, fx);
                fx.rows.push(RowKey::Update(id.clone()));
                return self.advance(engine, id, fx);
            }
            self.end_update(id, UpdateState::Failed, Some(&reason));
            fx.rows.push(RowKey::Update(id.clone()));
            self.gc_configs(k, fx);
            return;
        }
        // Start more, up to the batch size. Instances that failed on the new
        // spec and are still down count against it too (but not once their
        // user stopped them: the update does not wait for those).
        let failed_down = self.updates[id]
            .failed_now()
            .iter()
            .filter(|&&i| i < n && !self.instance_done(k, i, goal) && !self.stopped_by_user(k, i))
            .count() as u32;
        loop {
            let u = &self.updates[id];
            if u.in_progress.len() as u32 + failed_down >= spec.batch_size || u.cursor >= n {
                break;
            }
            let i = u.cursor;
            let u = self.updates.get_mut(id).expect("live");
            u.cursor += 1;
            changed = true;
            let t = &self.jobs[&k].tasks[i as usize];
            if t.config == goal || u.failed_now().contains(&i) {
                continue;
            }
            let stopped_by_user = self.stopped_by_user(k, i);
            let t = &mut self.job_mut(k).tasks[i as usize];
            t.config = goal;
            t.failures = 0;
            self.mark_dirty(k, i, fx);
            self.pin_changed(k, i);
            if stopped_by_user {
                // It takes the new spec whenever it is restarted.
                continue;
            }
            self.updates
                .get_mut(id)
                .expect("live")
                .in_progress
                .insert(i);
            self.move_instance(engine, k, i, fx);
        }
        let u = &self.updates[id];
        if u.in_progress.is_empty() && u.cursor >= n {
            let state = if backward {
                UpdateState::RolledBack
            } else {
                UpdateState::Succeeded
            };
            self.end_update(id, state, None);
            changed = true;
            self.gc_configs(k, fx);
        }
        if changed {
            fx.rows.push(RowKey::Update(id.clone()));
        }
    }

    /// Stops an instance's current run so that its next run uses its new
    /// config (an instance not yet running just waits with it).
    fn move_instance(&mut self, engine: &mut Engine, k: JobKey, i: u32, fx: &mut Effects) {
        let state = self.jobs[&k].tasks[i as usize].state;
        match state {
            S::Initialized => {}
            // A run backing off ended already (its history keeps why): the
            // next one starts now, on the new config.
            S::Failed | S::Succeeded | S::Killed | S::Backoff => self.new_run(k, i, fx),
            _ => {
                if self.end_run(engine, k, i, S::Killed, "updated to a new spec", fx) {
                    self.new_run(k, i, fx);
                }
            }
        }
    }

    /// Drops the plans of config versions no instance runs and no update may
    /// roll back to.
    pub(super) fn gc_configs(&mut self, k: JobKey, fx: &mut Effects) {
        let Some(job) = self.jobs.get(&k) else { return };
        let mut keep: BTreeSet<u64> = job.tasks.iter().map(|t| t.config).collect();
        if let Some(latest) = job.latest_update().and_then(|id| self.updates.get(id)) {
            keep.insert(latest.from);
            keep.insert(latest.to);
        }
        let drop: Vec<u64> = job
            .old_configs
            .keys()
            .copied()
            .filter(|v| !keep.contains(v))
            .collect();
        let id = job.id.clone();
        let job = self.job_mut(k);
        for v in drop {
            job.old_configs.remove(&v);
            fx.rows.push(RowKey::ConfigDeleted(id.clone(), v));
        }
    }
}
