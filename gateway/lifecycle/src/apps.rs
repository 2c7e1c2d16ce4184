//! Application jobs: a framework's driver (Spark's) keeps a number of
//! executors, the job's instances, through a target.
//!
//! An executor runs once. However it ends (it exits, fails, is killed,
//! preempted or lost with its host) the instance stays ended, and while the
//! target asks for more executors than are alive a new instance is added:
//! executor ids (instance numbers) are never reused, which is what Spark
//! expects of them. Lowering the target stops only executors that have not
//! reached a host yet, newest first; the driver chooses which running ones
//! to kill. Every change is made by [`Lifecycle::reconcile_apps`] at the end
//! of the step that called for it.

use std::sync::Arc;

use peloton_engine::Engine;

use super::model::{JobKey, JobKind, TaskState as S, TaskTemplate};
use super::{Answer, Effects, Error, Lifecycle, RowKey};

/// Why executors beyond a lowered target stop.
pub const REASON_TARGET: &str = "not needed: the application lowered its executor target";
/// An executor that ran this long before it failed starts the count of
/// failures in a row over.
pub const LONG_RUN_MS: u64 = 60_000;
/// Why executors stop when the application ends.
pub const REASON_UNREGISTERED: &str = "the application unregistered";
/// Why executors stop when the driver went silent.
pub const REASON_LAPSED: &str =
    "the application's driver was not heard from for its lease; the application was unregistered";

impl Lifecycle {
    fn app_job(&self, id: &str) -> Result<JobKey, Error> {
        let k = self.job_key(id)?;
        let job = &self.jobs[&k];
        if job.plan.kind != JobKind::Application {
            return Err(Error::Precondition(format!(
                "job {id} is not an application job"
            )));
        }
        Ok(k)
    }

    /// Cluster mode: the driver, instance 0 of an application job, gives
    /// the executor's template (again, after a restart of the driver).
    pub(super) fn app_register(
        &mut self,
        engine: &Engine,
        id: &str,
        executor: Arc<TaskTemplate>,
        max_executors: u32,
        spec: Arc<[u8]>,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let k = self.app_job(id)?;
        let job = &self.jobs[&k];
        let app = job.plan.app.expect("application plans have one");
        if !app.driver_in_job {
            return Err(Error::Precondition(format!(
                "application {id} was registered by its driver already (its job has no driver task)"
            )));
        }
        if job.kill_requested || job.app.closed {
            return Err(Error::Precondition(format!(
                "application {id} has ended; submit it again"
            )));
        }
        if max_executors > self.config.max_instances_per_job {
            return Err(Error::invalid(
                "max_executors",
                format!(
                    "{max_executors} is more than the limit of {} instances per job",
                    self.config.max_instances_per_job
                ),
            ));
        }
        // The executor must be admissible in the job's pool.
        let mut plan = job.plan.clone();
        if !app.registered {
            let driver = std::mem::replace(&mut plan.default, executor);
            plan.overrides.insert(0, driver);
        } else {
            plan.default = executor;
        }
        plan.app.as_mut().expect("application").registered = true;
        plan.spec = spec;
        self.check_admissible(engine, job.pool, &plan, 2)?;
        let job = self.job_mut(k);
        job.plan = plan;
        let plan_app = job.plan.app.as_mut().expect("application");
        plan_app.registered = true;
        plan_app.max_executors = max_executors;
        job.version += 1;
        let config = job.config;
        fx.rows.push(RowKey::Config(k, config));
        self.dirty_jobs.insert(k);
        self.app_dirty.insert(k);
        Ok(Answer::Job(k))
    }

    /// A new target: applied if its generation is newer (or the same
    /// target again), else dropped.
    pub(super) fn app_target(
        &mut self,
        id: &str,
        generation: u64,
        total: u32,
    ) -> Result<Answer, Error> {
        let k = self.app_job(id)?;
        let job = &self.jobs[&k];
        let cur = job.app;
        if job.kill_requested || cur.closed {
            return Err(Error::Precondition(format!(
                "application {id} has ended; no executor starts again"
            )));
        }
        let applied = if generation > cur.generation {
            let job = self.job_mut(k);
            job.app.target = total;
            job.app.generation = generation;
            // A new target tries again after failures.
            job.app.failures = 0;
            self.dirty_jobs.insert(k);
            self.app_dirty.insert(k);
            true
        } else {
            generation == cur.generation && total == cur.target
        };
        let app = self.jobs[&k].app;
        Ok(Answer::Target {
            applied,
            target: app.target,
            generation: app.generation,
        })
    }

    /// Kills executors (instances of the application that are executors;
    /// the caller checked they exist). Ended ones stay as they are.
    pub(super) fn app_kill(
        &mut self,
        engine: &mut Engine,
        id: &str,
        instances: &[u32],
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let k = self.app_job(id)?;
        let job = &self.jobs[&k];
        if let Some(&bad) = instances.iter().find(|&&i| !job.is_executor(i)) {
            return Err(Error::invalid(
                "executor_ids",
                format!("{bad} is not an executor of application {id}"),
            ));
        }
        for &i in instances {
            self.end_run(engine, k, i, S::Killed, "killed by the application", fx);
        }
        self.app_dirty.insert(k);
        Ok(Answer::Job(k))
    }

    /// The application ends: its executors stop and none start again. Its
    /// job ends once they are gone (and, in cluster mode, its driver).
    pub(super) fn app_unregister(
        &mut self,
        engine: &mut Engine,
        id: &str,
        lapsed: bool,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let k = self.app_job(id)?;
        let reason = if lapsed {
            REASON_LAPSED
        } else {
            REASON_UNREGISTERED
        };
        self.close_app(engine, k, reason, fx);
        Ok(Answer::Job(k))
    }

    fn close_app(&mut self, engine: &mut Engine, k: JobKey, reason: &str, fx: &mut Effects) {
        let job = &self.jobs[&k];
        if job.app.closed {
            return;
        }
        let executors = job.executors();
        let job = self.job_mut(k);
        job.app.closed = true;
        job.version += 1;
        self.dirty_jobs.insert(k);
        for i in executors {
            self.end_run(engine, k, i, S::Killed, reason, fx);
        }
    }

    /// An executor whose run was lost or preempted ends (its replacement is
    /// a new instance); the driver of a cluster-mode job runs again.
    pub(super) fn is_executor(&self, k: JobKey, i: u32) -> bool {
        self.jobs[&k].is_executor(i)
    }

    /// Ends an executor whose run was lost or preempted: the instance is
    /// killed, with the reason it went.
    pub(super) fn retire_executor(&mut self, k: JobKey, i: u32, fx: &mut Effects) {
        let t = &self.jobs[&k].tasks[i as usize];
        debug_assert!(matches!(t.state, S::Lost | S::Preempted));
        let reason = t.reason.as_deref().unwrap_or("ended").to_string();
        if let Some(h) = self.held.get_mut(&(k, i)) {
            h.restart = false;
        }
        self.transition(k, i, S::Initialized, None, fx);
        self.transition(k, i, S::Killed, Some(&reason), fx);
    }

    /// Brings the applications whose target, executors or driver changed
    /// in this step to their target.
    pub(super) fn reconcile_apps(&mut self, engine: &mut Engine, fx: &mut Effects) {
        if self.app_dirty.is_empty() {
            return;
        }
        let mut dirty: Vec<JobKey> = self.app_dirty.drain().collect();
        dirty.sort_unstable();
        for k in dirty {
            let Some(job) = self.jobs.get(&k) else {
                continue;
            };
            let Some(app) = job.plan.app else { continue };
            if job.kill_requested || job.app.closed {
                continue;
            }
            if app.driver_in_job && job.tasks.first().is_some_and(|t| t.state.is_terminal()) {
                // The driver ended for good: so does the application.
                self.close_app(engine, k, "the application's driver ended", fx);
                continue;
            }
            if !app.registered {
                continue;
            }
            let n = job.tasks.len() as u32;
            let alive: Vec<u32> = job
                .executors()
                .filter(|&i| !job.tasks[i as usize].state.is_terminal())
                .collect();
            let want = job.executors_wanted();
            let alive_n = alive.len() as u32;
            if alive_n < want && job.app.stalled(app.max_executors) {
                // Executors keep failing (a bad command, a driver gone):
                // no more until the target changes.
                continue;
            }
            if alive_n < want {
                let room = self.config.max_instances_per_job.saturating_sub(n);
                let add = (want - alive_n).min(room);
                if add > 0 {
                    self.scale_to(engine, k, n + add, "", fx);
                    fx.rows.push(RowKey::Config(k, self.jobs[&k].config));
                }
            } else if alive_n > want {
                // Only executors that have not reached a host, newest first.
                let mut surplus = alive_n - want;
                for &i in alive.iter().rev() {
                    if surplus == 0 {
                        break;
                    }
                    let state = self.jobs[&k].tasks[i as usize].state;
                    if state.on_host() {
                        continue;
                    }
                    self.end_run(engine, k, i, S::Killed, REASON_TARGET, fx);
                    surplus -= 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::model::{AppPlan, JobKind, JobPlan, JobState, TaskState as S};
    use crate::sim::{Sim, plan, template};
    use crate::{Answer, Input, RunPhase};

    /// An application job: executors of 1 cpu; with a driver (instance 0,
    /// a controller of 0.5 cpu) in cluster mode.
    fn app_plan(driver: bool) -> JobPlan {
        let mut p = plan("/", u32::from(driver), 1000);
        p.kind = JobKind::Application;
        p.preemptible = true;
        p.app = Some(AppPlan {
            max_executors: 10,
            driver_in_job: driver,
            registered: !driver,
        });
        if driver {
            p.default = Arc::new(template(500, 64));
            p.default_mut().controller = true;
        }
        p
    }

    fn sim(hosts: u32) -> Sim {
        let mut sim = Sim::new();
        sim.quiet = true;
        for h in 0..hosts {
            sim.add_host(&format!("h{h}"), 2, 4096).expect("host");
        }
        sim
    }

    fn create(sim: &mut Sim, id: &str, plan: JobPlan) {
        sim.step(Input::CreateJob {
            id: Arc::from(id),
            plan: Box::new(plan),
        })
        .expect("created");
    }

    fn target(sim: &mut Sim, id: &str, generation: u64, total: u32) -> (bool, u32, u64) {
        let a = sim
            .step(Input::AppTarget {
                id: id.into(),
                generation,
                total,
            })
            .expect("target");
        sim.step(Input::Cycle).expect("cycle");
        match a {
            Answer::Target {
                applied,
                target,
                generation,
            } => (applied, target, generation),
            other => panic!("{other:?}"),
        }
    }

    /// (instance, state) of every instance.
    fn states(sim: &Sim, id: &str) -> Vec<(u32, S)> {
        let k = sim.core.job_key(id).expect("job");
        let job = sim.core.job(k).expect("job");
        (0..job.tasks.len() as u32)
            .map(|i| (i, job.tasks[i as usize].state))
            .collect()
    }

    fn alive(sim: &Sim, id: &str) -> Vec<u32> {
        states(sim, id)
            .into_iter()
            .filter(|(_, s)| !s.is_terminal())
            .map(|(i, _)| i)
            .collect()
    }

    fn job_state(sim: &Sim, id: &str) -> JobState {
        let k = sim.core.job_key(id).expect("job");
        sim.core.job(k).expect("job").state
    }

    #[test]
    fn executors_follow_the_target_and_running_ones_are_never_cut() {
        let mut sim = sim(2);
        create(&mut sim, "a", app_plan(false));
        assert_eq!(job_state(&sim, "a"), JobState::Pending);
        assert_eq!(target(&mut sim, "a", 1, 3), (true, 3, 1));
        assert_eq!(
            states(&sim, "a"),
            vec![(0, S::Running), (1, S::Running), (2, S::Running)]
        );
        // A stale generation is dropped; the same one again is a retry.
        assert_eq!(target(&mut sim, "a", 0, 0), (false, 3, 1));
        assert_eq!(target(&mut sim, "a", 1, 3), (true, 3, 1));
        assert_eq!(target(&mut sim, "a", 1, 2), (false, 3, 1));
        // Down to 1: nothing running is stopped.
        assert_eq!(target(&mut sim, "a", 2, 1), (true, 1, 2));
        assert_eq!(alive(&sim, "a"), vec![0, 1, 2]);
        // The driver kills the ones it chose; none comes back.
        sim.step(Input::AppKill {
            id: "a".into(),
            instances: vec![0, 2],
        })
        .expect("kill");
        sim.confirm_kills(None);
        sim.step(Input::Cycle).expect("cycle");
        assert_eq!(alive(&sim, "a"), vec![1]);
        // Up again: new executors, new ids.
        assert_eq!(target(&mut sim, "a", 3, 3), (true, 3, 3));
        assert_eq!(alive(&sim, "a"), vec![1, 3, 4]);
        // Idle at 0, with no executor: the application lives on.
        assert_eq!(target(&mut sim, "a", 4, 0), (true, 0, 4));
        sim.step(Input::AppKill {
            id: "a".into(),
            instances: vec![1, 3, 4],
        })
        .expect("kill");
        sim.confirm_kills(None);
        assert!(alive(&sim, "a").is_empty());
        assert_eq!(job_state(&sim, "a"), JobState::Running);
        // Not an executor: refused, nothing changes.
        let e = sim
            .step(Input::AppKill {
                id: "a".into(),
                instances: vec![9],
            })
            .expect_err("no such executor");
        assert!(e.to_string().contains("9 is not an executor"), "{e}");
        // Unregistered, the job ends.
        sim.step(Input::AppUnregister {
            id: "a".into(),
            lapsed: false,
        })
        .expect("unregister");
        assert_eq!(job_state(&sim, "a"), JobState::Succeeded);
        let e = sim
            .step(Input::AppTarget {
                id: "a".into(),
                generation: 9,
                total: 1,
            })
            .expect_err("ended");
        assert!(e.to_string().contains("has ended"), "{e}");
    }

    #[test]
    fn a_target_above_the_cluster_waits_and_a_lower_one_cancels_the_newest_waiting() {
        // 2 hosts of 2 cpus: 4 executors of 1 cpu fit, 6 do not.
        let mut sim = sim(2);
        create(&mut sim, "a", app_plan(false));
        target(&mut sim, "a", 1, 6);
        let s = states(&sim, "a");
        assert_eq!(s.len(), 6);
        assert_eq!(s.iter().filter(|(_, s)| *s == S::Running).count(), 4);
        let waiting: Vec<u32> = s
            .iter()
            .filter(|(_, s)| !s.on_host())
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(waiting.len(), 2);
        // Down to 5: the newest waiting one goes.
        target(&mut sim, "a", 2, 5);
        assert_eq!(alive(&sim, "a").len(), 5);
        assert_eq!(states(&sim, "a")[waiting[1] as usize].1, S::Killed);
        // Down to 2: the other waiting one goes, the 4 running stay.
        target(&mut sim, "a", 3, 2);
        let s = states(&sim, "a");
        assert_eq!(s[waiting[0] as usize].1, S::Killed);
        assert_eq!(s.iter().filter(|(_, s)| *s == S::Running).count(), 4);
        assert_eq!(alive(&sim, "a").len(), 4);
    }

    #[test]
    fn a_lost_executor_ends_and_a_new_one_replaces_it() {
        let mut sim = sim(2);
        create(&mut sim, "a", app_plan(false));
        target(&mut sim, "a", 1, 2);
        let on_h1: Vec<u32> = (0..2)
            .filter(|&i| sim.current("a", i).is_some_and(|(h, _)| &*h == "h1"))
            .collect();
        sim.lose_host("h1", true).expect("lost");
        sim.step(Input::Cycle).expect("cycle");
        let s = states(&sim, "a");
        for &i in &on_h1 {
            assert_eq!(s[i as usize].1, S::Killed, "{s:?}");
            let k = sim.core.job_key("a").expect("job");
            let reason = sim.core.job(k).expect("job").tasks[i as usize]
                .reason
                .clone()
                .expect("reason");
            assert!(reason.contains("h1"), "{reason}");
        }
        assert_eq!(alive(&sim, "a").len(), 2);
        assert_eq!(s.len(), 2 + on_h1.len());
        // An executor that fails ends too, and is replaced.
        let i = alive(&sim, "a")[0];
        let (host, key) = sim.current("a", i).expect("placed");
        sim.end_run(&host, key.launch, RunPhase::Failed, 1);
        sim.step(Input::Cycle).expect("cycle");
        assert_eq!(states(&sim, "a")[i as usize].1, S::Failed);
        assert_eq!(alive(&sim, "a").len(), 2);
        // The target and the executors survive a restart of the server.
        sim.crash();
        for h in ["h0", "h1"] {
            let _ = sim.register(h);
        }
        sim.step(Input::Cycle).expect("cycle");
        let k = sim.core.job_key("a").expect("job");
        assert_eq!(sim.core.job(k).expect("job").app.target, 2);
        assert_eq!(alive(&sim, "a").len(), 2);
        assert_eq!(target(&mut sim, "a", 1, 7), (false, 2, 1));
    }

    #[test]
    fn cluster_mode_the_driver_registers_and_its_end_is_the_applications() {
        let mut sim = sim(2);
        create(&mut sim, "d", app_plan(true));
        sim.step(Input::Cycle).expect("cycle");
        assert_eq!(states(&sim, "d"), vec![(0, S::Running)]);
        // A target before the executor is known waits for it.
        target(&mut sim, "d", 1, 2);
        assert_eq!(states(&sim, "d").len(), 1);
        sim.step(Input::AppRegister {
            id: "d".into(),
            executor: Arc::new(template(1000, 128)),
            max_executors: 10,
            spec: Arc::from(&[][..]),
        })
        .expect("register");
        sim.step(Input::Cycle).expect("cycle");
        assert_eq!(
            states(&sim, "d"),
            vec![(0, S::Running), (1, S::Running), (2, S::Running)]
        );
        let k = sim.core.job_key("d").expect("job");
        let job = sim.core.job(k).expect("job");
        assert!(job.template(0).controller, "the driver keeps its template");
        assert_eq!(job.template(1).request, template(1000, 128).request);
        // The driver cannot be killed through the executor API.
        assert!(
            sim.step(Input::AppKill {
                id: "d".into(),
                instances: vec![0],
            })
            .is_err()
        );
        // The driver exits: its executors are stopped, the job succeeds.
        let (host, key) = sim.current("d", 0).expect("driver");
        sim.end_run(&host, key.launch, RunPhase::Succeeded, 0);
        assert_eq!(
            job_state(&sim, "d"),
            JobState::Running,
            "executors stopping"
        );
        sim.confirm_kills(None);
        assert_eq!(job_state(&sim, "d"), JobState::Succeeded);
        assert_eq!(
            states(&sim, "d"),
            vec![(0, S::Succeeded), (1, S::Killed), (2, S::Killed)]
        );
    }

    #[test]
    fn executors_that_keep_failing_stop_being_replaced_until_the_target_changes() {
        let mut sim = sim(2);
        create(&mut sim, "a", app_plan(false));
        target(&mut sim, "a", 1, 2);
        let limit = {
            let k = sim.core.job_key("a").expect("job");
            let job = sim.core.job(k).expect("job");
            job.app
                .failure_limit(job.plan.app.expect("app").max_executors)
        };
        assert_eq!(limit, 4);
        // Every executor fails at once (a bad command): replaced until 4
        // failed in a row, then no more.
        for _ in 0..10 {
            for i in alive(&sim, "a") {
                if let Some((host, key)) = sim.current("a", i) {
                    sim.end_run(&host, key.launch, RunPhase::Failed, 127);
                }
            }
            sim.step(Input::Cycle).expect("cycle");
        }
        let failed = states(&sim, "a")
            .iter()
            .filter(|(_, s)| *s == S::Failed)
            .count();
        assert!(
            (4..=5).contains(&failed),
            "{failed} failed: {:?}",
            states(&sim, "a")
        );
        assert!(alive(&sim, "a").is_empty());
        // A new target tries again.
        target(&mut sim, "a", 2, 2);
        assert_eq!(alive(&sim, "a").len(), 2);
        let k = sim.core.job_key("a").expect("job");
        assert_eq!(sim.core.job(k).expect("job").app.failures, 0);
        // One that failed after running a good while starts the count over.
        sim.now += super::LONG_RUN_MS;
        let i = alive(&sim, "a")[0];
        let (host, key) = sim.current("a", i).expect("placed");
        sim.end_run(&host, key.launch, RunPhase::Failed, 1);
        assert_eq!(sim.core.job(k).expect("job").app.failures, 1);
    }

    #[test]
    fn an_executor_that_could_never_be_admitted_is_refused_at_registration() {
        let mut sim = sim(1);
        create(&mut sim, "d", app_plan(true));
        let e = sim
            .step(Input::AppRegister {
                id: "d".into(),
                executor: Arc::new(template(64_000, 128)),
                max_executors: 10,
                spec: Arc::from(&[][..]),
            })
            .expect_err("bigger than any host");
        assert!(
            e.to_string().contains("spec.default_task.resources.cpu"),
            "{e}"
        );
        let k = sim.core.job_key("d").expect("job");
        assert!(
            !sim.core
                .job(k)
                .expect("job")
                .plan
                .app
                .expect("app")
                .registered
        );
    }

    #[test]
    fn application_jobs_refuse_what_does_not_apply_to_them() {
        let mut sim = sim(1);
        let mut p = app_plan(false);
        p.instance_count = 3;
        assert!(
            sim.step(Input::CreateJob {
                id: "x".into(),
                plan: Box::new(p),
            })
            .is_err()
        );
        create(&mut sim, "a", app_plan(false));
        for action in [crate::JobAction::Scale(3), crate::JobAction::Restart] {
            let e = sim
                .step(Input::JobAction {
                    id: "a".into(),
                    version: 0,
                    action,
                })
                .expect_err("refused");
            assert!(e.to_string().contains("application"), "{e}");
        }
        // Registering a driver on a job that has none is refused.
        assert!(
            sim.step(Input::AppRegister {
                id: "a".into(),
                executor: Arc::new(template(1000, 128)),
                max_executors: 10,
                spec: Arc::from(&[][..]),
            })
            .is_err()
        );
        // Killing the job stops everything.
        target(&mut sim, "a", 1, 1);
        sim.step(Input::JobAction {
            id: "a".into(),
            version: 0,
            action: crate::JobAction::Kill,
        })
        .expect("kill");
        sim.confirm_kills(None);
        assert_eq!(job_state(&sim, "a"), JobState::Killed);
    }
}
