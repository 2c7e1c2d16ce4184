//! Starting from what the store holds: pools, hosts, jobs and the rows of
//! their tasks. Queued runs wait again; back-offs resume; runs on agent
//! hosts wait for their agents (orphans), runs on simulated hosts (which
//! restarted with the server) are lost and start again.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::sync::Arc;

use peloton_engine::host::{HostSpec, HostState};
use peloton_engine::{Engine, PoolConfig};

use super::effects::Effects;
use super::model::{
    HostSlot, Job, JobPlan, JobRow, N_STATES, RunRef, Task, TaskRow, TaskState as S,
};
use super::{AgentHost, CoreConfig, Held, Lifecycle, TimerKind, Update};

/// A host as stored.
#[derive(Clone, Debug)]
pub struct RecoveredHost {
    /// Its name.
    pub name: String,
    /// Registration of an agent host (agent mode); simulated hosts come
    /// from [`Recovered::simulated_hosts`].
    pub spec: Option<HostSpec>,
    /// In maintenance (draining or down for it).
    pub maintenance: bool,
    /// How it isolated tasks.
    pub isolation: String,
    /// The agent it is bound to (empty: none recorded).
    pub agent_id: Arc<str>,
}

/// A job as stored.
#[derive(Clone, Debug)]
pub struct RecoveredJob {
    /// Its row.
    pub row: JobRow,
    /// Its plan (of config version `row.config`).
    pub plan: JobPlan,
    /// Plans of its other config versions still kept.
    pub old_configs: Vec<(u64, JobPlan)>,
    /// Its updates, oldest first.
    pub updates: Vec<Update>,
    /// Rows of its tasks, by instance.
    pub tasks: Vec<(u32, TaskRow)>,
}

/// A task as stored.
pub type RecoveredTask = TaskRow;

/// A volume as stored.
#[derive(Clone, Debug)]
pub struct RecoveredVolume {
    /// Id.
    pub id: String,
    /// Its job's id.
    pub job_id: String,
    /// Its instance.
    pub instance: u32,
    /// Its host's name.
    pub host: String,
    /// Size in MiB.
    pub size_mb: u64,
    /// Where it appears in the sandbox.
    pub path: String,
    /// Created.
    pub created_at: u64,
}

/// Everything the store holds (and the simulated cluster, which is
/// configuration).
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The simulated hosts (simulated mode): added to the engine first.
    pub simulated_hosts: Vec<HostSpec>,
    /// Pools, parents first: path, configuration, version.
    pub pools: Vec<(String, PoolConfig, u64)>,
    /// Hosts.
    pub hosts: Vec<RecoveredHost>,
    /// Jobs.
    pub jobs: Vec<RecoveredJob>,
    /// Volumes.
    pub volumes: Vec<RecoveredVolume>,
    /// Host pools besides "default".
    pub host_pools: Vec<String>,
    /// Hosts outside "default": host name, host pool.
    pub host_pool_members: Vec<(String, String)>,
    /// Tokens.
    pub tokens: Vec<super::Token>,
    /// The audit log.
    pub audit: Vec<super::AuditEntry>,
    /// Jobs' secrets, by job id.
    pub secrets: Vec<(String, Vec<super::Secret>)>,
    /// The usage ledger.
    pub usage: Vec<super::UsageRecord>,
}

impl Lifecycle {
    /// A core rebuilt from the store's contents at `revision`. Changes
    /// recovery makes (lost runs, queued runs back to waiting) are effects
    /// like any other, to commit before serving.
    pub fn recover(
        config: CoreConfig,
        engine: &mut Engine,
        revision: u64,
        rec: Recovered,
        now: u64,
        fx: &mut Effects,
    ) -> Result<Self, String> {
        for spec in &rec.simulated_hosts {
            engine
                .hosts_mut()
                .add(spec)
                .map_err(|e| format!("simulated host {}: {e}", spec.name))?;
        }
        let mut core = Lifecycle::new(config, engine, revision);
        core.now = now;
        core.liveness = super::liveness::Liveness::from(now);
        for (path, pool, version) in rec.pools {
            if path == "/" {
                let root = engine.resources().tree().root();
                engine
                    .resources_mut()
                    .update_pool(root, pool)
                    .map_err(|e| format!("stored pool /: {e}"))?;
            } else {
                engine
                    .resources_mut()
                    .create_pool(&path, pool)
                    .map_err(|e| format!("stored pool {path}: {e}"))?;
            }
            core.pool_versions.insert(path, version);
        }
        core.recover_host_pools(rec.host_pools, rec.host_pool_members, fx);
        core.recover_access(rec.tokens, rec.audit, fx);
        core.recover_ledger(rec.usage, fx);
        // The simulated hosts (agent hosts are tagged as they are added).
        core.tag_all_hosts(engine);
        for host in rec.hosts {
            core.recover_host(engine, host)?;
        }
        for job in rec.jobs {
            core.recover_job(engine, job, fx);
        }
        core.recover_secrets(rec.secrets, fx);
        for v in rec.volumes {
            let (Ok(k), Some(host)) = (core.job_key(&v.job_id), engine.hosts().lookup(&v.host))
            else {
                // Its job or host is gone: drop the row.
                fx.rows
                    .push(super::RowKey::VolumeDeleted(v.id.as_str().into()));
                continue;
            };
            let id: std::sync::Arc<str> = v.id.as_str().into();
            core.volume_ids.insert(id.clone(), (k, v.instance));
            core.volumes.insert(
                (k, v.instance),
                super::Volume {
                    id,
                    job: k,
                    instance: v.instance,
                    host: HostSlot(host.idx() as u32),
                    size_mb: v.size_mb,
                    path: v.path.as_str().into(),
                    created_at: v.created_at,
                },
            );
        }
        // Every pinned instance's reservation is set from scratch.
        let pinned: Vec<(super::JobKey, u32)> = core
            .volumes
            .keys()
            .copied()
            .chain(core.daemon_jobs.iter().flat_map(|&k| {
                let n = core.jobs[&k].tasks.len() as u32;
                (0..n).map(move |i| (k, i))
            }))
            .collect();
        core.pin_dirty.extend(pinned);
        // A restart queues every waiting instance it may at once: room
        // first (what a job's running limit or a kill keeps waiting is not
        // counted; the engine caps the total at what it may hold).
        let queued = |j: &super::Job| -> usize {
            if j.kill_requested {
                0
            } else {
                j.waiting.len().min(j.room() as usize)
            }
        };
        engine.reserve_tasks(core.jobs.values().map(queued).sum());
        // Elastic gangs: their running members were told some membership
        // before the restart; it is the current one, under a generation
        // above every one before (the revision only grows).
        for job in core.jobs.values_mut() {
            if job.plan.elastic_min == 0 {
                continue;
            }
            let generation = revision;
            let told: rustc_hash::FxHashMap<u32, u64> = job
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| t.state.on_host() && t.gang == Some(job.next_gang))
                .map(|(i, _)| (i as u32, generation))
                .collect();
            job.elastic = Some(Box::new(super::model::Elastic {
                generation,
                formed: !told.is_empty(),
                finishing: job.counts[super::TaskState::Succeeded as usize] > 0,
                told,
            }));
        }
        let mut per_pool: rustc_hash::FxHashMap<_, usize> = Default::default();
        for job in core.jobs.values().filter(|j| j.plan.gang == 1) {
            let flags = peloton_engine::TaskFlags {
                preemptible: job.plan.preemptible,
                controller: false,
                revocable: false,
            };
            *per_pool.entry((job.pool, flags)).or_default() += queued(job);
        }
        for ((pool, flags), n) in per_pool {
            engine.reserve_queue(pool, flags, n);
        }
        // Recovered client-mode applications: their drivers have a lease
        // from now to come back.
        let leased: Vec<super::JobKey> = core
            .jobs
            .iter()
            .filter(|(_, j)| super::leases::leased(j))
            .map(|(&k, _)| k)
            .collect();
        for k in leased {
            core.app_heard(k);
        }
        core.fill_all(engine, fx);
        core.sync_reservations(engine);
        core.derive_job_states(fx);
        // Waiting jobs are looked at again: what they wait for may have
        // ended before the server stopped.
        core.after_dirty = true;
        core.settle_dependencies(engine, fx);
        if cfg!(debug_assertions) {
            core.check_invariants(engine);
        }
        Ok(core)
    }

    fn recover_host(&mut self, engine: &mut Engine, host: RecoveredHost) -> Result<(), String> {
        let id = match &host.spec {
            Some(spec) if self.config.agent_mode => {
                // Its stored host pool (the attribute is not in its row).
                let mut spec = spec.clone();
                self.host_pools.tag(&mut spec);
                let id = engine
                    .hosts_mut()
                    .add(&spec)
                    .map_err(|e| format!("stored host {}: {e}", host.name))?;
                // Down until its agent registers.
                engine
                    .hosts_mut()
                    .set_state(id, HostState::Down)
                    .expect("just added");
                let slot = HostSlot(id.idx() as u32);
                self.set_host_name(slot, &host.name);
                self.agent_hosts.insert(
                    slot,
                    AgentHost {
                        lost: false,
                        isolation: host.isolation.clone(),
                        connected: false,
                        agent_id: host.agent_id.clone(),
                        // Told again when its agent registers.
                        address: Arc::from(""),
                        port_ranges: Vec::new(),
                    },
                );
                id
            }
            _ => match engine.hosts().lookup(&host.name) {
                Some(id) => {
                    if host.maintenance {
                        engine
                            .hosts_mut()
                            .set_state(id, HostState::Down)
                            .expect("live host");
                    }
                    id
                }
                // A simulated host no longer configured.
                None => return Ok(()),
            },
        };
        if host.maintenance {
            self.maintenance.insert(HostSlot(id.idx() as u32));
        }
        Ok(())
    }

    fn recover_job(&mut self, engine: &mut Engine, rec: RecoveredJob, fx: &mut Effects) {
        let agent_mode = self.config.agent_mode;
        let now = self.now;
        let row = rec.row;
        let pool = engine.resources().tree().lookup(&rec.plan.pool);
        let key = super::JobKey(self.next_key);
        self.next_key += 1;
        let daemon = rec.plan.kind == super::JobKind::Daemon;
        // A daemon's instances all have rows (its count follows the hosts).
        let cron = rec.plan.schedule.is_some();
        let n = if daemon {
            rec.tasks.iter().map(|(i, _)| i + 1).max().unwrap_or(0)
        } else if cron {
            0
        } else {
            rec.plan.instance_count
        };
        let mut job = Job {
            id: row.id.clone(),
            pool: pool.unwrap_or(engine.resources().tree().root()),
            plan: rec.plan,
            version: row.version,
            state: row.state,
            created_at: row.created_at,
            completed_at: row.completed_at,
            kill_requested: row.kill_requested || row.state == super::JobState::Killing,
            // Instances without a row are on the config the job was created
            // with (instances added later on another one have rows).
            tasks: (0..n).map(|_| Task::new(row.created_at)).collect(),
            counts: [0; N_STATES],
            waiting: VecDeque::new(),
            active: 0,
            held: 0,
            next_gang: 0,
            elastic: None,
            started: false,
            config: row.config,
            old_configs: rec.old_configs.into_iter().collect(),
            updates: Default::default(),
            app: row.app,
            waits_for_jobs: row.waits_for_jobs,
            cron: cron.then(|| {
                row.cron.clone().unwrap_or(super::cron::CronState {
                    last_tick: row.created_at,
                    ..Default::default()
                })
            }),
        };
        // Runs whose end their host had not confirmed: (host, instance,
        // launch, restart once confirmed).
        let mut stopping = Vec::new();
        let mut restart_now = Vec::new();
        for (instance, stored) in rec.tasks {
            let host_of = |name: &str| {
                engine
                    .hosts()
                    .lookup(name)
                    .map(|h| HostSlot(h.idx() as u32))
            };
            let held = stored.stopping.as_ref().and_then(|(launch, host)| {
                (agent_mode && launch.0 != 0)
                    .then(|| host_of(host).map(|h| (h, *launch)))
                    .flatten()
            });
            // Gangs queued from now on get new numbers (generations).
            job.next_gang = job.next_gang.max(stored.gang.unwrap_or(0));
            let Some(t) = job.tasks.get_mut(instance as usize) else {
                // An instance scaled away whose run was still stopping.
                if let Some((host, launch)) = held {
                    stopping.push((Some(host), instance, launch, false));
                }
                continue;
            };
            let cur = &stored.current;
            t.state = cur.state;
            t.run = cur.run.max(1);
            t.created_at = cur.created_at;
            t.placed_at = cur.placed_at;
            t.started_at = cur.started_at;
            t.finished_at = cur.finished_at;
            t.exit_code = cur.exit_code;
            t.checkpoint_at = cur.checkpoint_at;
            t.lost_work = cur.lost_work;
            t.launch = cur.launch;
            t.host = host_of(&cur.host);
            t.gpu = stored.gpu;
            t.ports = stored.ports;
            t.gang = stored.gang;
            t.failures = stored.failures;
            t.config = stored.config.max(1);
            t.daemon_host = stored.daemon_host.as_deref().and_then(host_of);
            t.reason = cur.reason.clone();
            t.history = (!stored.history.is_empty()).then(|| Box::new(stored.history));
            if let Some((host, launch)) = held {
                stopping.push((Some(host), instance, launch, stored.restart_when_stopped));
            } else if stored.stopping.is_some() && stored.restart_when_stopped {
                // Simulated hosts restarted with the server: the stopping run
                // is gone, and the new run it waited for starts now.
                restart_now.push(instance);
            }
        }
        let stopping_instances: rustc_hash::FxHashSet<u32> = stopping.iter().map(|s| s.1).collect();
        // Runs that were not finished: queued ones start over. Ones on
        // agent hosts wait for their agents to report them (kept, or lost
        // if the agent does not have them); on simulated hosts they are
        // lost (those hosts restarted with us).
        let mut lost = Vec::new();
        let mut orphans = Vec::new();
        // A job waiting for other jobs queued nothing yet: its release is
        // news.
        let queued_before = !job.waits_for_jobs;
        for (i, t) in job.tasks.iter_mut().enumerate() {
            let i = i as u32;
            if daemon && t.daemon_host.is_none() && !t.state.is_terminal() {
                // Retired (or its host is gone): free for the next host.
                t.state = S::Killed;
            }
            match t.state {
                S::Initialized | S::Pending | S::Ready | S::Placing => {
                    // Initialized instances are exactly the waiting ones.
                    // They are queued again without events: a restart does
                    // not repeat an event per waiting instance (a million
                    // of them would cost seconds), so a watcher keeps the
                    // last event it had of each (Pending, Ready or Placing
                    // before the restart); reads show Pending.
                    t.requeued = queued_before;
                    t.state = S::Initialized;
                    t.host = None;
                    t.gpu = Default::default();
                    job.waiting.push_back(i);
                }
                S::Placed | S::Launching | S::Running if agent_mode && t.host.is_some() => {
                    t.orphan = true;
                    orphans.push((t.host.expect("checked"), i));
                }
                S::Lost | S::Preempted if stopping_instances.contains(&i) => {
                    // Restarted once its host confirms the end.
                }
                S::Placed | S::Launching | S::Running | S::Lost | S::Preempted => lost.push(i),
                S::Backoff => {
                    let run = RunRef {
                        job: key,
                        instance: i,
                        run: t.run,
                        launch: t.launch,
                    };
                    self.timers.push(Reverse((now, TimerKind::Backoff, run)));
                }
                S::Succeeded | S::Failed | S::Killed => {}
            }
            job.counts[t.state as usize] += 1;
        }
        job.held = stopping.len() as u32;
        // Orphans and held runs may hold their hosts: they count against
        // max_running_instances like any run.
        job.active = job.held + orphans.len() as u32;
        // Health is not stored: a checked run that runs has no verdict
        // until its agent reports again.
        for (i, t) in job.tasks.iter_mut().enumerate() {
            if t.state == S::Running {
                let checked = if t.config == job.config {
                    job.plan.template(i as u32).health_check
                } else {
                    job.old_configs
                        .get(&t.config)
                        .is_some_and(|p| p.template(i as u32).health_check)
                };
                if checked {
                    t.health = super::Health::Unknown;
                }
            }
        }
        job.started = job.tasks.iter().any(|t| t.run > 1 || t.state.on_host());
        self.by_id.insert(job.id.clone(), key);
        // The job's latest update is last (updates created in the same
        // millisecond sort by id otherwise).
        let mut updates = rec.updates;
        if let Some(latest) = &row.update
            && let Some(at) = updates.iter().position(|u| &u.id == latest)
        {
            let u = updates.remove(at);
            updates.push(u);
        }
        let job_updates: std::collections::VecDeque<_> =
            updates.iter().map(|u| u.id.clone()).collect();
        for mut u in updates {
            u.job = key;
            if u.is_rolling() {
                self.rolling.insert(u.id.clone());
            }
            self.updates.insert(u.id.clone(), u);
        }
        job.updates = job_updates;
        if job.state.is_terminal() {
            // Stores written before completion times were kept: the
            // retention counts from now.
            if job.completed_at == 0 {
                job.completed_at = now;
            }
            self.finished.insert((job.completed_at, key));
        }
        if daemon {
            self.daemon_jobs.insert(key);
            job.plan.instance_count =
                job.tasks.iter().filter(|t| t.daemon_host.is_some()).count() as u32;
        }
        if job.waits_for_jobs {
            self.after_waiting.insert(key);
        }
        // A cron job's next tick after its last (one due while the server
        // was down fires at the first tick step, within its deadline).
        let cron_from = (cron && !job.kill_requested && !job.state.is_terminal())
            .then(|| job.cron.as_ref().map_or(now, |c| c.last_tick));
        self.names.insert(&job.plan.pool, &job.plan.name, key);
        self.jobs.insert(key, job);
        if let Some(from) = cron_from {
            self.schedule_cron(key, from);
        }
        self.need_fill.insert(key);
        for (host, i) in orphans {
            self.orphans.entry(host).or_default().push((key, i));
        }
        for (host, i, launch, restart) in stopping {
            self.held.insert(
                (key, i),
                Held {
                    launch,
                    handle: None,
                    host,
                    restart,
                    preempted: false,
                },
            );
        }
        for i in restart_now {
            let t = &self.jobs[&key].tasks[i as usize];
            if !self.jobs[&key].kill_requested
                && !self.is_executor(key, i)
                && matches!(t.state, S::Killed | S::Succeeded | S::Failed | S::Backoff)
            {
                self.new_run(key, i, fx);
            }
        }
        for i in lost {
            let t = &mut self.job_mut(key).tasks[i as usize];
            if t.state.on_host() {
                t.finished_at = now;
                self.transition(
                    key,
                    i,
                    S::Lost,
                    Some("the server restarted and its simulated hosts lost the run"),
                    fx,
                );
            }
            if self.jobs[&key].kill_requested {
                self.transition(key, i, S::Initialized, None, fx);
                self.transition(key, i, S::Killed, None, fx);
            } else if self.is_executor(key, i) {
                self.retire_executor(key, i, fx);
            } else {
                self.new_run(key, i, fx);
            }
        }
        if self.jobs[&key].plan.kind == super::JobKind::Application {
            self.app_dirty.insert(key);
        }
        self.dirty_jobs.insert(key);
    }

    /// The row of a job (for the store).
    pub fn job_row(&self, k: super::JobKey) -> Option<JobRow> {
        let job = self.jobs.get(&k)?;
        Some(JobRow {
            id: job.id.clone(),
            version: job.version,
            state: job.state,
            created_at: job.created_at,
            completed_at: job.completed_at,
            kill_requested: job.kill_requested,
            config: job.config,
            update: job.latest_update().cloned(),
            app: job.app,
            waits_for_jobs: job.waits_for_jobs,
            cron: job.cron.clone(),
        })
    }

    /// The row of an instance (for the store). An instance scaled away has
    /// a row only while its run is stopping.
    pub fn task_row(&self, k: super::JobKey, i: u32) -> Option<TaskRow> {
        let held = self.held.get(&(k, i)).copied();
        let stopping = held.map(|h| {
            let host = h.host.map_or_else(
                || std::sync::Arc::from(""),
                |s| self.host_names[s.idx()].clone(),
            );
            (h.launch, host)
        });
        let job = self.jobs.get(&k)?;
        let Some(t) = job.tasks.get(i as usize) else {
            return stopping.map(|stopping| TaskRow {
                stopping: Some(stopping),
                ..TaskRow::default()
            });
        };
        let row = TaskRow {
            current: self.run_record(t),
            failures: t.failures,
            history: t.history.as_deref().cloned().unwrap_or_default(),
            stopping,
            restart_when_stopped: held.is_some_and(|h| h.restart),
            config: t.config,
            daemon_host: t.daemon_host.map(|s| self.host_names[s.idx()].clone()),
            gpu: t.gpu,
            ports: t.ports.clone(),
            gang: t.gang,
        };
        Some(row)
    }
}
