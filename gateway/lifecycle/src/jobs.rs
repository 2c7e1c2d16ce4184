//! Commands on pools and jobs: validated against the core's state, applied,
//! or refused with nothing changed.

use std::sync::Arc;

use peloton_engine::{Engine, PoolConfig, PoolError, PoolId};
use rustc_hash::FxHashSet;

use super::effects::{Effects, Event, EventKind, RowKey};
use super::model::{Job, JobKey, JobKind, JobPlan, JobState, N_STATES, Task, TaskState as S};
use super::{Answer, Error, JobAction, Lifecycle};

fn stale(what: String, given: u64, current: u64) -> Error {
    Error::Stale {
        what,
        given,
        current,
    }
}

impl Lifecycle {
    pub(super) fn create_pool(
        &mut self,
        engine: &mut Engine,
        path: &str,
        config: PoolConfig,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        // Jobs run in leaf pools: a pool with unfinished jobs takes no
        // children (its waiting instances could never be queued).
        let parent = match path.rfind('/') {
            Some(0) => "/",
            Some(at) => &path[..at],
            None => "",
        };
        if let Ok(parent_id) = engine.resources().tree().resolve(parent)
            && let Some(job) = self
                .jobs
                .values()
                .find(|j| j.pool == parent_id && !j.state.is_terminal())
        {
            return Err(Error::Precondition(format!(
                "pool {parent} has the unfinished job {}; jobs run in leaf pools, so it cannot have children until its jobs end",
                job.id
            )));
        }
        let id = engine
            .resources_mut()
            .create_pool(path, config)
            .map_err(Error::Pool)?;
        self.pool_versions.insert(path.to_string(), 1);
        fx.rows.push(RowKey::Pool(path.to_string()));
        self.needs_cycle = true;
        Ok(Answer::Pool(id))
    }

    fn check_pool_version(
        &self,
        engine: &Engine,
        path: &str,
        version: u64,
    ) -> Result<PoolId, Error> {
        let id = engine
            .resources()
            .tree()
            .resolve(path)
            .map_err(Error::Pool)?;
        let current = self.pool_version(path);
        if version != 0 && version != current {
            return Err(stale(format!("pool {path}"), version, current));
        }
        Ok(id)
    }

    pub(super) fn update_pool(
        &mut self,
        engine: &mut Engine,
        path: &str,
        config: PoolConfig,
        version: u64,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let id = self.check_pool_version(engine, path, version)?;
        engine
            .resources_mut()
            .update_pool(id, config)
            .map_err(Error::Pool)?;
        *self.pool_versions.entry(path.to_string()).or_insert(1) += 1;
        fx.rows.push(RowKey::Pool(path.to_string()));
        self.needs_cycle = true;
        Ok(Answer::Pool(id))
    }

    pub(super) fn delete_pool(
        &mut self,
        engine: &mut Engine,
        path: &str,
        version: u64,
        force: bool,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let id = self.check_pool_version(engine, path, version)?;
        // Its jobs, ended ones included: a job left without its pool could
        // not be restarted, scaled or updated again.
        let mut unfinished: Vec<&str> = Vec::new();
        let mut ended: Vec<JobKey> = Vec::new();
        for (&k, j) in &self.jobs {
            if j.pool != id {
                continue;
            }
            if j.state.is_terminal() && j.held == 0 && j.active == 0 {
                ended.push(k);
            } else {
                unfinished.push(&j.id);
            }
        }
        if !unfinished.is_empty() {
            unfinished.sort_unstable();
            let shown = unfinished
                .iter()
                .take(3)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::Precondition(format!(
                "pool {path} has {} unfinished job(s) ({shown}{}){}; kill them first",
                unfinished.len(),
                if unfinished.len() > 3 { ", …" } else { "" },
                if ended.is_empty() {
                    String::new()
                } else {
                    format!(" and {} ended job(s)", ended.len())
                }
            )));
        }
        ended.sort_unstable();
        if !ended.is_empty() && !force {
            return Err(Error::Precondition(format!(
                "pool {path} holds {} ended job(s), which could not be restarted without it; \
                 delete them first, or a delete with force deletes them with the pool",
                ended.len()
            )));
        }
        engine
            .resources_mut()
            .delete_pool(id)
            .map_err(|e| match e {
                PoolError::HasChildren { .. } | PoolError::HasTasks { .. } => {
                    Error::Precondition(e.to_string())
                }
                PoolError::InvalidPath { .. } if path == "/" => Error::Precondition(e.to_string()),
                e => Error::Pool(e),
            })?;
        // The pool went first (the tree may refuse it): its jobs now.
        for k in ended {
            self.remove_job(engine, k, super::retention::REASON_POOL_DELETED, fx);
            fx.rows.retain(|r| {
                !matches!(r, RowKey::Job(x) | RowKey::Task(x, _) | RowKey::Config(x, _) if *x == k)
            });
        }
        self.pool_versions.remove(path);
        fx.rows.push(RowKey::PoolDeleted(path.to_string()));
        self.needs_cycle = true;
        Ok(Answer::Done)
    }

    fn resolve_job_pool(&self, engine: &Engine, path: &str) -> Result<PoolId, Error> {
        let tree = engine.resources().tree();
        let id = tree.resolve(path).map_err(Error::JobPool)?;
        if !tree.is_leaf(id) {
            return Err(Error::invalid(
                "spec.pool",
                format!("{path} has child pools; jobs go to leaf pools"),
            ));
        }
        Ok(id)
    }

    /// The checks a new job's plan passes (its host pool, its pool, that
    /// it could ever be admitted, what its kind allows); its pool.
    pub(super) fn check_new_job(&self, engine: &Engine, plan: &JobPlan) -> Result<PoolId, Error> {
        self.check_job_host_pool(&plan.host_pool)?;
        let pool = self.resolve_job_pool(engine, &plan.pool)?;
        self.check_admissible(engine, pool, plan, plan.instance_count)?;
        let daemon = plan.kind == JobKind::Daemon;
        if daemon && plan.gang > 1 {
            return Err(Error::invalid(
                "spec.sla.min_running_instances",
                "a daemon job cannot run in gangs",
            ));
        }
        if plan.gang > 1 && (0..plan.instance_count).any(|i| plan.template(i).volume.is_some()) {
            return Err(Error::invalid(
                "spec.default_task.volume",
                "gang jobs cannot have volumes",
            ));
        }
        if daemon && (0..1).any(|i| plan.template(i).volume.is_some()) {
            return Err(Error::invalid(
                "spec.default_task.volume",
                "daemon jobs cannot have volumes",
            ));
        }
        if plan.kind == JobKind::Application {
            let driver = plan.app.is_some_and(|a| a.driver_in_job);
            if plan.app.is_none() || plan.instance_count != u32::from(driver) {
                return Err(Error::invalid(
                    "spec.instance_count",
                    "an application job starts with its driver only (1 instance); its executors follow the target its driver sets",
                ));
            }
            if plan.gang > 1 || plan.default.volume.is_some() {
                return Err(Error::invalid(
                    "spec.type",
                    "an application job has no gangs or volumes",
                ));
            }
        }
        Ok(pool)
    }

    pub(super) fn create_job(
        &mut self,
        engine: &mut Engine,
        id: Arc<str>,
        plan: JobPlan,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let pool = self.check_new_job(engine, &plan)?;
        if self.by_id.contains_key(&id) {
            return Err(Error::Precondition(format!("job {id} exists already")));
        }
        self.check_after(&id, &plan)?;
        self.check_schedule(&plan)?;
        self.check_name_free(&plan.pool, &plan.name)?;
        let daemon = plan.kind == JobKind::Daemon;
        let key = JobKey(self.next_key);
        self.next_key += 1;
        // A daemon's instances follow the hosts (added just below); a cron
        // job has none (its ticks' jobs do).
        let cron = plan.schedule.is_some();
        let n = if daemon || cron {
            0
        } else {
            plan.instance_count
        };
        let mut job = Job {
            id: id.clone(),
            plan,
            pool,
            version: 1,
            state: JobState::Initialized,
            created_at: self.now,
            completed_at: 0,
            kill_requested: false,
            tasks: (0..n).map(|_| Task::new(self.now)).collect(),
            counts: [0; N_STATES],
            waiting: (0..n).collect(),
            active: 0,
            held: 0,
            next_gang: 0,
            elastic: None,
            started: false,
            config: 1,
            old_configs: Default::default(),
            updates: Default::default(),
            app: Default::default(),
            waits_for_jobs: false,
            cron: cron.then(|| super::cron::CronState {
                last_tick: self.now,
                ..Default::default()
            }),
        };
        job.counts[S::Initialized as usize] = n;
        if job.plan.elastic_min > 0 {
            job.elastic = Some(Box::default());
        }
        self.names.insert(&job.plan.pool, &job.plan.name, key);
        self.jobs.insert(key, job);
        self.by_id.insert(id, key);
        // One that waits for other jobs queues nothing yet.
        self.start_waiting(key);
        if daemon {
            self.daemon_jobs.insert(key);
            self.reconcile_daemon(engine, key, fx);
        }
        // Queue what the job may queue now; if the engine refuses the very
        // first gang (queues full), the job is refused and leaves no trace.
        let (revision, events, rows) = (self.revision, fx.events.len(), fx.rows.len());
        self.fill(engine, key, fx);
        let job = &self.jobs[&key];
        if job.active == 0 && !job.waiting.is_empty() && !job.waits_for_jobs {
            let reason = job.tasks[job.waiting[0] as usize]
                .reason
                .as_deref()
                .unwrap_or("the engine refused the job")
                .to_string();
            let job = self.jobs.remove(&key).expect("inserted");
            self.by_id.remove(&job.id);
            self.names.remove(&job.plan.pool, &job.plan.name, key);
            self.retry_fill.remove(&key);
            self.daemon_jobs.remove(&key);
            self.pin_dirty.retain(|&(x, _)| x != key);
            self.dirty_jobs.remove(&key);
            fx.events.truncate(events);
            fx.rows.truncate(rows);
            self.revision = revision;
            self.next_key -= 1;
            return Err(Error::Exhausted(reason));
        }
        self.dirty_jobs.insert(key);
        if cron {
            self.schedule_cron(key, self.now);
        }
        fx.rows.push(RowKey::Config(key, 1));
        if !daemon {
            fx.counters.tasks_accepted += u64::from(n);
        }
        // A client-mode application's driver holds a lease from now.
        self.app_heard(key);
        Ok(Answer::Job(key))
    }

    pub(super) fn job_action(
        &mut self,
        engine: &mut Engine,
        id: &str,
        version: u64,
        action: JobAction,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let k = self.job_key(id)?;
        let job = &self.jobs[&k];
        if version != 0 && version != job.version {
            return Err(stale(format!("job {id}"), version, job.version));
        }
        let n = job.tasks.len() as u32;
        match action {
            JobAction::CronRunNow | JobAction::CronSuspend(_) if job.plan.schedule.is_none() => {
                return Err(Error::Precondition(format!(
                    "job {id} is not a cron job (it has no schedule)"
                )));
            }
            JobAction::CronRunNow | JobAction::CronSuspend(_)
                if job.kill_requested || job.state.is_terminal() =>
            {
                return Err(Error::Precondition(format!(
                    "cron job {id} was killed: its schedule runs again once it is restarted"
                )));
            }
            JobAction::CronRunNow => self.cron_run_now(engine, k, fx)?,
            JobAction::CronSuspend(suspend) => {
                if !self.suspend_cron(k, suspend)? {
                    // So already: no new version.
                    return Ok(Answer::Job(k));
                }
            }
            JobAction::Kill => {
                if job.state.is_terminal() {
                    // Nothing runs: killing changes nothing.
                    return Ok(Answer::Job(k));
                }
                self.kill_cron(engine, k, fx);
                self.kill_job(engine, k, "job killed", fx);
            }
            JobAction::Delete => {
                if !job.state.is_terminal() {
                    return Err(Error::Precondition(format!(
                        "job {id} is {}; kill it before deleting it",
                        job.state.name()
                    )));
                }
                self.remove_job(engine, k, super::retention::REASON_DELETED, fx);
                fx.rows.retain(|r| {
                    !matches!(r, RowKey::Job(x) | RowKey::Task(x, _) | RowKey::Config(x, _) if *x == k)
                });
                return Ok(Answer::JobDeleted);
            }
            JobAction::Scale(_) if job.plan.schedule.is_some() => {
                return Err(Error::Precondition(format!(
                    "job {id} is a cron job: it runs no instances itself (its ticks' jobs do)"
                )));
            }
            JobAction::Restart if job.plan.schedule.is_some() => {
                // A killed cron job's schedule resumes from now (within
                // the bound on cron jobs).
                if job.kill_requested {
                    self.check_name_kept(k)?;
                    if self.cron_next.len() >= super::MAX_CRON_JOBS {
                        return Err(Error::Exhausted(format!(
                            "{} cron jobs are scheduled already, the most there may be; kill one first",
                            super::MAX_CRON_JOBS
                        )));
                    }
                    self.job_mut(k).kill_requested = false;
                    self.resume_cron(k);
                }
            }
            JobAction::Scale(_) if job.plan.kind == JobKind::Daemon => {
                return Err(Error::Precondition(format!(
                    "job {id} is a daemon job: its instance count follows the hosts it matches"
                )));
            }
            JobAction::Scale(_) | JobAction::Restart if job.plan.kind == JobKind::Application => {
                return Err(Error::Precondition(format!(
                    "job {id} is an application: its executors follow the target its driver sets"
                )));
            }
            JobAction::Scale(count) => {
                if count > n {
                    // More instances bring an ended job back.
                    self.check_name_kept(k)?;
                }
                self.scale(engine, k, id, count, fx)?;
            }
            JobAction::Edit(edit) => self.edit_job(engine, k, id, edit, fx)?,
            JobAction::Restart => {
                self.check_job_pool(engine, k)?;
                self.check_name_kept(k)?;
                let job = self.job_mut(k);
                job.kill_requested = false;
                // One still waiting for other jobs looks at them again.
                let waits = job.waits_for_jobs;
                self.after_dirty |= waits;
                for i in 0..n {
                    self.restart_instance(engine, k, i, fx);
                }
            }
        }
        self.job_mut(k).version += 1;
        self.dirty_jobs.insert(k);
        Ok(Answer::Job(k))
    }

    /// Kills a job as a whole: its waiting instances end at once, its runs
    /// are stopped; none starts again until it is restarted.
    pub(super) fn kill_job(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        reason: &str,
        fx: &mut Effects,
    ) {
        self.abort_update_of(k, "the job was killed", fx);
        let job = self.job_mut(k);
        job.kill_requested = true;
        let n = job.tasks.len() as u32;
        // Waiting instances end without a search each.
        let waiting = std::mem::take(&mut job.waiting);
        for &i in &waiting {
            self.transition(k, i, S::Killed, Some(reason), fx);
        }
        for i in 0..n {
            self.end_run(engine, k, i, S::Killed, reason, fx);
        }
        self.dirty_jobs.insert(k);
    }

    /// Forgets a finished job: its indexes, its updates, and its rows in the
    /// store (one `JobDeleted` takes its job, task and config rows), with a
    /// last job event saying why. The caller drops rows of the job queued
    /// earlier in the step.
    pub(super) fn remove_job(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        reason: &str,
        fx: &mut Effects,
    ) {
        // Its volumes go with it (their disk freed, their agents told).
        self.drop_volumes_of(engine, k, fx);
        self.daemon_jobs.remove(&k);
        self.pin_dirty.retain(|&(x, _)| x != k);
        self.unschedule_cron(k);
        let job = self.jobs.remove(&k).expect("live");
        debug_assert!(job.state.is_terminal() && job.held == 0 && job.active == 0);
        self.by_id.remove(&job.id);
        self.names.remove(&job.plan.pool, &job.plan.name, k);
        self.after_waiting.remove(&k);
        self.need_fill.remove(&k);
        self.retry_fill.remove(&k);
        self.dirty_jobs.remove(&k);
        self.note_job_state(k, (job.state, job.completed_at), (JobState::Initialized, 0));
        self.revision += 1;
        fx.events.push(Event {
            revision: self.revision,
            time_ms: self.now,
            kind: EventKind::Job {
                job: job.id.clone(),
                state: job.state,
                deleted: true,
                reason: reason.into(),
            },
        });
        // Its updates go with it.
        for u in &job.updates {
            self.updates.remove(u);
            self.rolling.remove(u);
            fx.rows.push(RowKey::UpdateDeleted(u.clone()));
        }
        self.forget_secrets(k, &job.id, fx);
        fx.rows.push(RowKey::JobDeleted(k, job.id));
    }

    fn scale(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        id: &str,
        count: u32,
        fx: &mut Effects,
    ) -> Result<(), Error> {
        let job = &self.jobs[&k];
        let n = job.tasks.len() as u32;
        if count == 0 {
            return Err(Error::invalid(
                "instance_count",
                "must be at least 1 (kill the job to stop it)",
            ));
        }
        if count > self.config.max_instances_per_job {
            return Err(Error::invalid(
                "instance_count",
                format!(
                    "{count} is more than the limit of {} instances per job",
                    self.config.max_instances_per_job
                ),
            ));
        }
        if job.kill_requested {
            return Err(Error::Precondition(format!(
                "job {id} was killed; restart it first"
            )));
        }
        if job.plan.elastic_min > 0 && count != job.plan.gang {
            return Err(Error::invalid(
                "instance_count",
                format!(
                    "an elastic gang's instances are its most members, {}: it grows and shrinks \
                     between {} and them by itself",
                    job.plan.gang, job.plan.elastic_min
                ),
            ));
        }
        if count < job.plan.gang {
            return Err(Error::invalid(
                "instance_count",
                format!("{count} is less than the gang size {}", job.plan.gang),
            ));
        }
        if count > n {
            self.check_job_pool(engine, k)?;
            let job = &self.jobs[&k];
            self.check_admissible(engine, job.pool, &job.plan, count)?;
        }
        self.scale_to(engine, k, count, "job scaled down", fx);
        Ok(())
    }

    /// Changes the instance count: the highest instances are killed and
    /// removed, or new ones (on the job's current config) wait to start.
    pub(super) fn scale_to(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        count: u32,
        reason: &str,
        fx: &mut Effects,
    ) {
        let n = self.jobs[&k].tasks.len() as u32;
        if count < n {
            let job = self.job_mut(k);
            let gone: Vec<u32> = job
                .waiting
                .iter()
                .copied()
                .filter(|&w| w >= count)
                .collect();
            job.waiting.retain(|&w| w < count);
            self.need_fill.insert(k);
            for i in gone {
                self.transition(k, i, S::Killed, Some(reason), fx);
            }
            for i in count..n {
                self.end_run(engine, k, i, S::Killed, reason, fx);
                if let Some(h) = self.held.get_mut(&(k, i)) {
                    h.restart = false;
                }
            }
            let job = self.job_mut(k);
            for t in job.tasks.drain(count as usize..) {
                job.counts[t.state as usize] -= 1;
            }
            // Overrides of removed instances go with them.
            job.plan.overrides.retain(|&i, _| i < count);
            // A removed instance holds at most its volume's disk now (one
            // that had ended, with a recovered run still stopping, was not
            // marked by a transition).
            (count..n).for_each(|i| self.pin_changed(k, i));
            let job = self.job_mut(k);
            let id = job.id.clone();
            fx.rows
                .retain(|r| !matches!(r, RowKey::Task(x, i) if *x == k && *i >= count));
            for i in count..n {
                if self.held.contains_key(&(k, i)) {
                    // Its stopping run must survive a restart: the row
                    // stays, holding only that, until the host confirms.
                    fx.rows.push(RowKey::Task(k, i));
                } else {
                    fx.rows.push(RowKey::TaskDeleted(id.clone(), i));
                }
            }
        } else {
            let now = self.now;
            let stopping: Vec<bool> = (n..count)
                .map(|i| self.held.contains_key(&(k, i)))
                .collect();
            let job = self.jobs.get_mut(&k).expect("live job");
            let config = job.config;
            for i in n..count {
                let mut t = Task::new(now);
                t.config = config;
                if config != 1 || stopping[(i - n) as usize] {
                    // Recovery takes instances without a row to be on the
                    // job's first config, with no run stopping.
                    fx.task_row(&mut t.row_mark, k, i);
                }
                job.tasks.push(t);
                job.counts[S::Initialized as usize] += 1;
                job.waiting.push_back(i);
            }
            fx.counters.tasks_accepted += u64::from(count - n);
            self.need_fill.insert(k);
            // One scaled back to its volume has its place kept there.
            (n..count).for_each(|i| self.pin_changed(k, i));
        }
        let job = self.job_mut(k);
        job.plan.instance_count = count;
        // The stored spec of the current config carries the count.
        let config = job.config;
        fx.rows.push(RowKey::Config(k, config));
    }

    /// Makes sure the job's pool still exists (it may have been deleted
    /// while the job was finished, and maybe created again).
    pub(super) fn check_job_pool(&mut self, engine: &Engine, k: JobKey) -> Result<(), Error> {
        let job = &self.jobs[&k];
        let tree = engine.resources().tree();
        if !tree.contains(job.pool)
            || tree.path(job.pool) != &*job.plan.pool
            || !tree.is_leaf(job.pool)
        {
            let pool = self.resolve_job_pool(engine, &job.plan.pool.clone())?;
            self.job_mut(k).pool = pool;
        }
        Ok(())
    }

    /// A new run of an instance (the current one is killed first). An
    /// instance still waiting (Initialized) keeps its place.
    fn restart_instance(&mut self, engine: &mut Engine, k: JobKey, i: u32, fx: &mut Effects) {
        let job = &self.jobs[&k];
        if job.plan.kind == JobKind::Daemon && job.tasks[i as usize].daemon_host.is_none() {
            // A retired daemon instance has no host to run on.
            return;
        }
        let state = self.jobs[&k].tasks[i as usize].state;
        match state {
            S::Initialized => {
                // Initialized instances are always in `waiting`.
                self.job_mut(k).tasks[i as usize].failures = 0;
                self.need_fill.insert(k);
                return;
            }
            S::Failed | S::Succeeded | S::Killed => {}
            _ => {
                if !self.end_run(engine, k, i, S::Killed, "restarted", fx) {
                    // It was only queued and now waits again.
                    self.job_mut(k).tasks[i as usize].failures = 0;
                    return;
                }
            }
        }
        self.job_mut(k).tasks[i as usize].failures = 0;
        self.new_run(k, i, fx);
    }

    pub(super) fn task_action(
        &mut self,
        engine: &mut Engine,
        job_id: &str,
        instances: &[u32],
        version: u64,
        restart: bool,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let k = self.job_key(job_id)?;
        let current = self.jobs[&k].version;
        if version != 0 && version != current {
            return Err(stale(format!("job {job_id}"), version, current));
        }
        let n = self.jobs[&k].tasks.len() as u32;
        if instances.is_empty() {
            return Err(Error::invalid("instances", "name at least one instance"));
        }
        if let Some(&bad) = instances.iter().find(|&&i| i >= n) {
            return Err(Error::NoInstance {
                job: job_id.to_string(),
                instance: bad,
                count: n,
            });
        }
        if restart && instances.iter().any(|&i| self.is_executor(k, i)) {
            return Err(Error::Precondition(format!(
                "job {job_id} is an application: an executor runs once (kill it; the target brings a new one)"
            )));
        }
        if restart && self.jobs[&k].kill_requested {
            return Err(Error::Precondition(format!(
                "job {job_id} was killed; restart the job instead"
            )));
        }
        if restart {
            self.check_job_pool(engine, k)?;
            // An ended job that one instance's restart brings back.
            self.check_name_kept(k)?;
        }
        // Checks done: from here the request changes the job.
        self.job_mut(k).version += 1;
        self.dirty_jobs.insert(k);
        if restart {
            for &i in instances {
                self.restart_instance(engine, k, i, fx);
            }
            return Ok(Answer::Job(k));
        }
        let named: FxHashSet<u32> = instances.iter().copied().collect();
        let job = self.job_mut(k);
        let waiting: Vec<u32> = job
            .waiting
            .iter()
            .copied()
            .filter(|w| named.contains(w))
            .collect();
        job.waiting.retain(|w| !named.contains(w));
        for i in waiting {
            self.transition(k, i, S::Killed, Some("killed by request"), fx);
        }
        let mut named: Vec<u32> = named.into_iter().collect();
        named.sort_unstable();
        for i in named {
            self.end_run(engine, k, i, S::Killed, "killed by request", fx);
        }
        Ok(Answer::Job(k))
    }
}
