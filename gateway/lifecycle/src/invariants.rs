//! Everything the core believes of itself and of the engine, checked. Run
//! after every step in debug builds and tests; a broken invariant panics.

use peloton_engine::Engine;
use peloton_engine::task::TaskState as EngineTaskState;

use super::Lifecycle;
use super::model::{N_STATES, TaskState as S};

impl Lifecycle {
    /// No two current runs on a host hold one port (the ports the server
    /// chose for gang members, and those agents report).
    fn check_ports(&self) {
        let mut held = rustc_hash::FxHashMap::default();
        for job in self.jobs.values() {
            for (i, t) in job.tasks.iter().enumerate() {
                let (Some(host), Some(ports)) = (t.host, t.ports.as_deref()) else {
                    continue;
                };
                if !matches!(t.state, S::Placed | S::Launching | S::Running) {
                    continue;
                }
                for (name, port) in ports {
                    if let Some(other) = held.insert((host, *port), (&job.id, i)) {
                        panic!(
                            "{}/{i} holds port {port} ({name}) on host {} as {}/{} does",
                            job.id,
                            self.host_names[host.idx()],
                            other.0,
                            other.1
                        );
                    }
                }
            }
        }
    }

    /// Panics unless every invariant holds.
    pub fn check_invariants(&self, engine: &Engine) {
        self.check_usage();
        self.check_ports();
        self.check_elastic();
        self.check_names();
        assert_eq!(self.cron_next.len(), self.cron_due.len(), "cron calendar");
        let mut n_engine_tasks = 0usize;
        for (&k, job) in &self.jobs {
            assert_eq!(
                self.by_id.get(&job.id),
                Some(&k),
                "job {} is indexed",
                job.id
            );
            let mut counts = [0u32; N_STATES];
            let mut active = 0u32;
            for (i, t) in job.tasks.iter().enumerate() {
                let i = i as u32;
                counts[t.state as usize] += 1;
                let held = self.held.get(&(k, i));
                // The engine holds exactly the current runs that are queued,
                // admitted or placed (orphans after a restart are placed on
                // no engine host until adopted).
                match t.handle {
                    Some(h) => {
                        active += 1;
                        n_engine_tasks += 1;
                        assert!(
                            t.state.in_engine(),
                            "{}/{i} holds an engine task in state {:?}",
                            job.id,
                            t.state
                        );
                        assert_eq!(
                            engine.tasks().owner(h),
                            Ok((k.0, i)),
                            "{}/{i}: the engine task is this instance's",
                            job.id
                        );
                        let es = engine.tasks().state(h).expect("live");
                        let expected = match t.state {
                            S::Pending => EngineTaskState::Pending,
                            S::Ready | S::Placing => EngineTaskState::Admitted,
                            _ => EngineTaskState::Placed,
                        };
                        assert_eq!(es, expected, "{}/{i} in {:?}", job.id, t.state);
                        if t.state.on_host() {
                            assert_eq!(
                                engine.tasks().host(h).expect("live"),
                                t.host.map(|s| s.0),
                                "{}/{i}: the core's host is the engine's",
                                job.id
                            );
                            assert_eq!(
                                engine.tasks().gpu(h).expect("live"),
                                t.gpu,
                                "{}/{i}: the core's GPU devices are the engine's",
                                job.id
                            );
                            assert_eq!(
                                engine.tasks().placed_view(h).expect("live").checkpoint_ms,
                                t.checkpoint_at,
                                "{}/{i}: the core's last checkpoint is the engine's",
                                job.id
                            );
                        }
                    }
                    None => {
                        let listed = t.host.is_some_and(|h| {
                            self.orphans.get(&h).is_some_and(|o| o.contains(&(k, i)))
                        });
                        assert_eq!(
                            t.orphan,
                            t.state.on_host() && listed,
                            "{}/{i}: an orphan is a placed run listed for its host",
                            job.id
                        );
                        if t.orphan {
                            active += 1;
                        }
                        assert!(
                            !t.state.in_engine() || t.orphan,
                            "{}/{i} in {:?} without an engine task",
                            job.id,
                            t.state
                        );
                    }
                }
                // No instance runs twice: a run being stopped excludes a
                // current run that is queued or placed.
                if let Some(h) = held {
                    assert!(
                        !t.state.in_engine(),
                        "{}/{i}: a held run and a current run in {:?}",
                        job.id,
                        t.state
                    );
                    let _ = h;
                }
                assert_eq!(
                    t.state == S::Initialized,
                    job.waiting.contains(&i),
                    "{}/{i}: Initialized exactly when waiting",
                    job.id
                );
            }
            assert_eq!(counts, job.counts, "{}: counts equal the tally", job.id);
            // A job waiting for other jobs has queued nothing and run
            // nothing, and is indexed as waiting.
            assert_eq!(
                job.waits_for_jobs,
                self.after_waiting.contains(&k),
                "{}: waits for jobs exactly when indexed so",
                job.id
            );
            assert!(
                !job.waits_for_jobs
                    || (!job.plan.after.is_empty()
                        && job.active == 0
                        && job.held == 0
                        && job
                            .tasks
                            .iter()
                            .all(|t| matches!(t.state, S::Initialized | S::Killed))),
                "{}: a job waiting for jobs has a dependency and queues nothing",
                job.id
            );
            // A cron job has no instances, its state exactly when it has a
            // schedule, and a next tick only while it is not killed.
            assert_eq!(
                job.plan.schedule.is_some(),
                job.cron.is_some(),
                "{}: a cron job's state with its schedule",
                job.id
            );
            if job.cron.is_some() {
                assert!(job.tasks.is_empty(), "{}: a cron job runs nothing", job.id);
                assert!(
                    !job.kill_requested || !self.cron_due.contains_key(&k),
                    "{}: a killed cron job does not tick",
                    job.id
                );
            }
            if let Some(&at) = self.cron_due.get(&k) {
                assert!(job.cron.is_some() && self.cron_next.contains(&(at, k)));
            }
            assert!(
                job.waiting
                    .iter()
                    .zip(job.waiting.iter().skip(1))
                    .all(|(a, b)| a < b),
                "{}: waiting in instance order",
                job.id
            );
            // Held runs (also of instances scaled away) keep their engine
            // tasks until confirmed.
            for ((_, i), h) in self.held.iter().filter(|((hk, _), _)| *hk == k) {
                active += 1;
                if let Some(handle) = h.handle {
                    n_engine_tasks += 1;
                    assert_eq!(engine.tasks().owner(handle), Ok((k.0, *i)));
                }
            }
            let held = self.held.keys().filter(|(hk, _)| *hk == k).count() as u32;
            assert_eq!(held, job.held, "{}: held runs", job.id);
            assert_eq!(active, job.active, "{}: active engine tasks", job.id);
            assert_eq!(job.state, super::runs::derive(job), "{}: job state", job.id);
            assert_eq!(
                self.finished.contains(&(job.completed_at, k)),
                job.state.is_terminal(),
                "{}: finished jobs are indexed by completion time",
                job.id
            );
        }
        for (_, k) in &self.finished {
            assert!(
                self.jobs.get(k).is_some_and(|j| j.state.is_terminal()),
                "the finished index holds only live terminal jobs"
            );
        }
        for &(k, i) in self.held.keys() {
            // A held run of a scaled-away instance outlives its task entry,
            // but never its job.
            assert!(self.jobs.contains_key(&k), "held run {i} of a deleted job");
        }
        for (id, u) in &self.updates {
            let job = self
                .jobs
                .get(&u.job)
                .unwrap_or_else(|| panic!("update {id} of a deleted job"));
            assert!(job.updates.contains(id), "update {id} is listed by its job");
            assert_eq!(
                self.rolling.contains(id),
                u.is_rolling(),
                "update {id}: rolling set"
            );
            assert!(u.from < u.to, "update {id}: versions");
            assert!(
                u.final_counts.is_none() || u.state.is_terminal(),
                "update {id}: only an ended update's counts are frozen"
            );
        }
        for (k, job) in &self.jobs {
            for (i, t) in job.tasks.iter().enumerate() {
                assert!(
                    t.config == job.config || job.old_configs.contains_key(&t.config),
                    "{}/{i} runs config {} which the job no longer knows",
                    job.id,
                    t.config
                );
            }
            for id in &job.updates {
                assert_eq!(
                    self.updates.get(id).map(|u| u.job),
                    Some(*k),
                    "update {id} of its job"
                );
            }
        }
        let preempted = self.held.values().filter(|h| h.preempted).count() as u32;
        assert_eq!(preempted, self.n_held_preempted, "held preemptions");
        assert_eq!(
            n_engine_tasks,
            engine.tasks().len(),
            "every engine task belongs to a current or held run"
        );
        assert_eq!(self.by_id.len(), self.jobs.len());
        self.check_host_pool_invariants(engine);
        self.check_lease_invariants();
        self.check_access_invariants();
        self.check_ledger_invariants();
        self.check_secret_invariants();
    }
}
