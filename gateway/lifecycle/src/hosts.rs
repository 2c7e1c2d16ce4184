//! Hosts: stopping runs and waiting for their hosts to confirm (holds),
//! agents registering and reporting, hosts lost and found, drains.
//!
//! Reconciliation is the heart of it. When an agent registers it lists the
//! runs it has; the core compares that list with its own view of the host:
//! - a run that is the instance's current run stays (adopted into the engine
//!   if the service restarted meanwhile) and its reported phase is applied;
//! - a run being stopped is confirmed gone if it ended, or told again to stop;
//! - any other live run was replaced (or its job is gone) and is killed;
//! - runs the core placed there that the agent does not list are lost and
//!   start again.

use std::sync::Arc;

use peloton_engine::Engine;
use peloton_engine::host::HostState;

use super::effects::{Effects, Kill, RowKey};
use super::model::{
    Health, HostSlot, JobKey, JobKind, LaunchId, RunRef, TaskState as S, lost_work_ms,
};
use super::{
    AgentHost, Answer, Error, Held, HostRegistration, Lifecycle, RunPhase, RunReport, RunStatus,
    TaskUpdate, TimerKind,
};

impl Lifecycle {
    /// Tells the current run's host to stop it, and holds the run (its
    /// engine task, so its resources) until the host confirms.
    pub(super) fn stop_on_host(
        &mut self,
        k: JobKey,
        i: u32,
        preempted: Option<&str>,
        fx: &mut Effects,
    ) {
        let job = self.jobs.get_mut(&k).expect("live job");
        let grace_ms = job.template(i).kill_grace_ms;
        let delay_ms = job.template(i).shutdown_delay_ms;
        let notice_ms = preempted.map_or(0, |_| job.template(i).preemption_notice_ms);
        let job_id = job.id.clone();
        let t = &mut job.tasks[i as usize];
        let handle = t.handle.take();
        // A recovered run (orphan) becomes a held one: still counted.
        t.orphan = false;
        let run = RunRef {
            job: k,
            instance: i,
            run: t.run,
            launch: t.launch,
        };
        let host = t.host;
        job.held += 1;
        if let Some(h) = host
            && let Some(list) = self.orphans.get_mut(&h)
        {
            list.retain(|&x| x != (k, i));
        }
        if preempted.is_some() {
            self.n_held_preempted += 1;
        }
        let held = Held {
            launch: run.launch,
            handle,
            host,
            restart: false,
            preempted: preempted.is_some(),
        };
        self.mark_dirty(k, i, fx);
        if let Some(old) = self.held.insert((k, i), held) {
            // Only an instance scaled away and added back while its old run
            // was still stopping gets here (fill waits for such runs), so
            // this cannot happen with a current run on a host.
            unreachable!("{job_id}/{i}: a second held run ({old:?})");
        }
        if let Some(h) = host {
            if delay_ms > 0 {
                // News before the signal: clients stop sending it requests.
                let reason = format!("stopping: deregistration delay {delay_ms} ms");
                self.task_event(k, i, &reason, fx);
            }
            fx.kills.push(Kill {
                run,
                host: self.host_names[h.idx()].clone(),
                job_id,
                grace_ms,
                delay_ms,
                preempted: preempted.map(Arc::from),
                notice_ms,
            });
        }
    }

    fn finish_held(&mut self, engine: &mut Engine, k: JobKey, h: Held) {
        if h.preempted {
            self.n_held_preempted -= 1;
        }
        if let Some(handle) = h.handle {
            engine
                .finish(handle)
                .expect("a held run's engine task is live");
            self.needs_cycle = true;
        }
        if let Some(job) = self.jobs.get_mut(&k) {
            job.held -= 1;
            job.active -= 1;
            // Room under max_running_instances, or an instance that waited
            // for this run to be gone.
            if !job.waiting.is_empty() || job.plan.gang > 1 {
                self.need_fill.insert(k);
            }
            self.dirty_jobs.insert(k);
        }
    }

    /// The host confirmed that a held run is gone.
    pub(super) fn confirm_end(&mut self, engine: &mut Engine, k: JobKey, i: u32, fx: &mut Effects) {
        let Some(h) = self.held.remove(&(k, i)) else {
            return;
        };
        let (host, restart) = (h.host, h.restart);
        self.finish_held(engine, k, h);
        self.mark_dirty(k, i, fx);
        self.pin_changed(k, i);
        if let Some(job) = self.jobs.get(&k)
            && i as usize >= job.tasks.len()
        {
            // The stopping run of an instance scaled away is gone: so is
            // its row.
            fx.rows.push(RowKey::TaskDeleted(job.id.clone(), i));
        }
        if let Some(job) = self.jobs.get(&k)
            && let Some(t) = job.tasks.get(i as usize)
            // Lost and preempted runs always start again (or end killed).
            && (restart || matches!(t.state, S::Preempted | S::Lost))
        {
            let state = t.state;
            if job.kill_requested {
                match state {
                    S::Preempted | S::Lost => {
                        self.transition(k, i, S::Initialized, None, fx);
                        self.transition(k, i, S::Killed, Some("job killed"), fx);
                    }
                    S::Backoff => self.transition(k, i, S::Killed, Some("job killed"), fx),
                    _ => {}
                }
            } else if matches!(
                state,
                S::Preempted | S::Lost | S::Killed | S::Succeeded | S::Failed | S::Backoff
            ) {
                self.new_run(k, i, fx);
            }
        }
        if let Some(host) = host {
            self.check_drained(engine, host, fx);
        }
    }

    /// A draining host with nothing left on it goes Down.
    pub(super) fn check_drained(&mut self, engine: &mut Engine, slot: HostSlot, fx: &mut Effects) {
        if !self.maintenance.contains(&slot) {
            return;
        }
        let Some(id) = engine.hosts().lookup_slot(slot.idx()) else {
            return;
        };
        if engine.hosts().state(id) != HostState::Draining {
            return;
        }
        let busy = self.held.values().any(|h| h.host == Some(slot))
            || engine.tasks().on_host(slot.0).next().is_some()
            || self.orphans.get(&slot).is_some_and(|o| !o.is_empty());
        if busy {
            return;
        }
        engine
            .hosts_mut()
            .set_state(id, HostState::Down)
            .expect("live host");
        fx.rows.push(RowKey::Host(slot));
    }

    /// Stops what may be stopped now on a draining host: every batch run,
    /// and a service's instances only while fewer than its
    /// `max_unavailable` instances are down or unhealthy (replacements must
    /// be healthy elsewhere before more go).
    ///
    /// Instances pinned to this host (their volume is here) are not counted
    /// in that: they can only run here, so whether they are down waiting
    /// for the host or stopped by the drain, none can be back before the
    /// drain ends. Waiting for them would hold the drain forever; so the
    /// drain stops all of a job's instances pinned here once the rest of
    /// the job is within its SLA, and they come back when the host is up
    /// (or elsewhere, if the job relocates after `host_down_timeout_ms`).
    /// They still count for the job's instances elsewhere (other drains).
    fn drain(&mut self, engine: &mut Engine, slot: HostSlot, fx: &mut Effects) {
        let mut on_it = self.instances_on(engine, slot);
        on_it.sort_unstable();
        let reason = format!(
            "host {} drained for maintenance",
            self.host_names[slot.idx()]
        );
        // A job's unavailable count, kept while its instances are skipped
        // (one scan per job, not per instance); a stop may change more than
        // the one instance (gangs), so it is counted again after one.
        let mut unavailable: rustc_hash::FxHashMap<JobKey, u32> = Default::default();
        let mut daemons = Vec::new();
        for (k, i) in on_it {
            let job = &self.jobs[&k];
            if job.plan.kind == JobKind::Daemon {
                // Daemons go last: once nothing else is left.
                daemons.push((k, i));
                continue;
            }
            if job.plan.kind == JobKind::Service {
                let down = *unavailable
                    .entry(k)
                    .or_insert_with(|| self.unavailable_beside(k, slot));
                if down >= self.jobs[&k].plan.max_unavailable {
                    continue;
                }
            }
            unavailable.remove(&k);
            if self.end_run(engine, k, i, S::Preempted, &reason, fx) {
                self.restart_after_loss(engine, k, i, fx);
            }
        }
        if daemons.is_empty() {
            return;
        }
        let others_left = self.instances_on(engine, slot).len() > daemons.len()
            || self.held.iter().any(|(&(k, _), h)| {
                h.host == Some(slot)
                    && self
                        .jobs
                        .get(&k)
                        .is_none_or(|j| j.plan.kind != JobKind::Daemon)
            })
            || self.orphans.get(&slot).is_some_and(|o| !o.is_empty());
        if !others_left {
            for (k, i) in daemons {
                self.retire_daemon_instance(engine, k, i, &reason, fx);
            }
        }
    }

    /// Instances of a job that are not running healthy, but for those
    /// pinned to the draining host `draining` (see [`Lifecycle::drain`];
    /// instances a user stopped for good do not count either: they are not
    /// coming back).
    fn unavailable_beside(&self, k: JobKey, draining: HostSlot) -> u32 {
        let job = &self.jobs[&k];
        (0..job.tasks.len() as u32)
            .filter(|&i| {
                if self.pin_of(k, i) == Some(draining) {
                    return false;
                }
                let t = &job.tasks[i as usize];
                let stopped = t.state == S::Killed && !self.held.contains_key(&(k, i));
                let available = t.state == S::Running
                    && (t.health == Health::Healthy
                        || (t.health == Health::None && !job.template(i).health_check));
                !stopped && !available
            })
            .count() as u32
    }

    /// Goes on with every drain waiting for service instances.
    pub(super) fn advance_drains(&mut self, engine: &mut Engine, fx: &mut Effects) {
        if self.draining.is_empty() {
            return;
        }
        let mut slots: Vec<HostSlot> = self.draining.iter().copied().collect();
        slots.sort_unstable();
        for slot in slots {
            let draining = engine
                .hosts()
                .lookup_slot(slot.idx())
                .is_some_and(|id| engine.hosts().state(id) == HostState::Draining);
            if !draining {
                self.draining.remove(&slot);
                continue;
            }
            self.drain(engine, slot, fx);
            self.check_drained(engine, slot, fx);
        }
    }

    pub(super) fn maintenance(
        &mut self,
        engine: &mut Engine,
        names: &[String],
        start: bool,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        if names.is_empty() {
            return Err(Error::invalid("hosts", "name at least one host"));
        }
        let mut ids = Vec::new();
        for n in names {
            let id = engine
                .hosts()
                .lookup(n)
                .ok_or_else(|| Error::HostNotFound(n.clone()))?;
            ids.push(id);
        }
        for (id, name) in ids.into_iter().zip(names) {
            let slot = HostSlot(id.idx() as u32);
            if start {
                if self.maintenance.insert(slot) {
                    engine
                        .hosts_mut()
                        .set_state(id, HostState::Draining)
                        .expect("live host");
                }
                // Runs recovered there and not reported yet go at once.
                let orphans: Vec<(JobKey, u32)> = self
                    .orphans
                    .get(&slot)
                    .into_iter()
                    .flatten()
                    .copied()
                    .collect();
                let reason = format!("host {name} drained for maintenance");
                for (k, i) in orphans {
                    if self.end_run(engine, k, i, S::Preempted, &reason, fx) {
                        self.restart_after_loss(engine, k, i, fx);
                    }
                }
                self.draining.insert(slot);
                self.drain(engine, slot, fx);
                // Down once every run there is confirmed gone (at once if
                // none is left).
                self.check_drained(engine, slot, fx);
            } else {
                self.maintenance.remove(&slot);
                self.draining.remove(&slot);
                let connected = self.agent_hosts.get(&slot).is_none_or(|h| h.connected);
                // A disconnected agent host comes up when its agent registers.
                let state = if connected {
                    HostState::Up
                } else {
                    HostState::Down
                };
                engine.hosts_mut().set_state(id, state).expect("live host");
            }
            fx.rows.push(RowKey::Host(slot));
        }
        self.needs_cycle = true;
        Ok(Answer::Done)
    }

    /// Sets `key=value` on each host (validated for all before any
    /// changes). Placed runs keep their hosts; the next cycle places by the
    /// new value.
    pub(super) fn set_host_attribute(
        &mut self,
        engine: &mut Engine,
        names: &[String],
        key: &str,
        value: &str,
    ) -> Result<Answer, Error> {
        if key == super::hostpools::HOST_POOL_ATTRIBUTE {
            return Err(Error::invalid(
                "attribute",
                format!("{key} is the host's host pool: move the host instead"),
            ));
        }
        self.set_attribute(engine, names, key, value)
    }

    /// Sets one attribute of live hosts (all exist, or nothing changes).
    pub(super) fn set_attribute(
        &mut self,
        engine: &mut Engine,
        names: &[String],
        key: &str,
        value: &str,
    ) -> Result<Answer, Error> {
        peloton_engine::host::validate_attribute_word(key)
            .and_then(|()| peloton_engine::host::validate_attribute_word(value))
            .map_err(|p| Error::invalid("attribute", p))?;
        let mut specs = Vec::with_capacity(names.len());
        for n in names {
            let id = engine
                .hosts()
                .lookup(n)
                .ok_or_else(|| Error::HostNotFound(n.clone()))?;
            let mut spec = engine.hosts().spec(id).expect("live host");
            spec.attributes.retain(|(k, _)| k != key);
            spec.attributes.push((key.to_string(), value.to_string()));
            spec.attributes.sort_unstable();
            if spec.attributes.len() > peloton_engine::host::MAX_ATTRIBUTES {
                return Err(Error::invalid(
                    "attribute",
                    format!(
                        "host {n} has {} attributes already",
                        peloton_engine::host::MAX_ATTRIBUTES
                    ),
                ));
            }
            specs.push((id, spec));
        }
        for (id, spec) in specs {
            engine
                .hosts_mut()
                .update(id, &spec)
                .expect("same capacity, a valid attribute: cannot be refused");
        }
        self.needs_cycle = true;
        Ok(Answer::Done)
    }

    pub(super) fn agent_registered(
        &mut self,
        engine: &mut Engine,
        reg: HostRegistration,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        if !self.config.agent_mode {
            return Err(Error::Precondition(
                "this server runs simulated hosts and accepts no agents".into(),
            ));
        }
        super::hostpools::check_registration_attributes(&reg.spec.attributes)?;
        let mut spec = reg.spec.clone();
        self.host_pools.tag(&mut spec);
        let spec = &spec;
        self.check_agent_identity(engine, &spec.name, &reg.agent_id)?;
        self.check_takeover(&spec.name, &reg.agent_id, reg.holder.as_ref())?;
        let slot = match engine.hosts().lookup(&spec.name) {
            Some(id) => {
                // Runs placed there may hold more than it now offers: then
                // the old capacity stays until they end.
                let _ = engine.hosts_mut().update(id, spec);
                HostSlot(id.idx() as u32)
            }
            None => {
                let id = engine
                    .hosts_mut()
                    .add(spec)
                    .map_err(|e| Error::invalid("register", e))?;
                let slot = HostSlot(id.idx() as u32);
                self.set_host_name(slot, &spec.name);
                slot
            }
        };
        let id = engine.hosts().lookup_slot(slot.idx()).expect("live");
        let state = if self.maintenance.contains(&slot) {
            match engine.hosts().state(id) {
                HostState::Up => HostState::Draining,
                s => s,
            }
        } else {
            HostState::Up
        };
        engine.hosts_mut().set_state(id, state).expect("live host");
        if state == HostState::Draining {
            self.draining.insert(slot);
        }
        self.agent_hosts.insert(
            slot,
            AgentHost {
                lost: false,
                isolation: reg.isolation.clone(),
                connected: true,
                agent_id: reg.agent_id.clone(),
                address: reg.address.clone(),
                port_ranges: reg.port_ranges.clone(),
            },
        );
        fx.rows.push(RowKey::Host(slot));
        self.reconcile_volumes(slot, &reg.volumes, fx);
        let host: Arc<str> = self.host_names[slot.idx()].clone();
        let mut reported = rustc_hash::FxHashSet::default();
        // Non-revocable runs are adopted first: after a restart the host
        // lends nothing until it reports usage, and a revocable run adopted
        // first could take the room a service's run needs (then only
        // revocable work is lost).
        let mut runs = reg.runs;
        runs.sort_by_key(|r| self.is_revocable(&r.key.job_id, r.key.instance));
        for report in runs {
            reported.insert(report.key.launch);
            self.agent_report(engine, slot, &host, report, fx);
        }
        // What the agent does not have: runs whose launch never reached
        // it (sent again: see `launch_again_or_lose`), or runs lost with
        // the agent. Instances the engine holds first: an orphan taken
        // over below joins them.
        let reason = format!("host {host}: its agent does not have the run");
        // Elastic gangs' members there may have missed a membership change
        // while it was away: told again at the end of the step.
        self.retell_members_on(engine, slot);
        for (k, i) in self.instances_on(engine, slot) {
            let launch = self.jobs[&k].tasks[i as usize].launch;
            if !reported.contains(&launch.0) {
                self.launch_again_or_lose(engine, k, i, slot, &reason, fx);
            }
        }
        for (k, i) in self.orphans.remove(&slot).unwrap_or_default() {
            self.launch_again_or_lose(engine, k, i, slot, &reason, fx);
        }
        let mut gone: Vec<(JobKey, u32)> = self
            .held
            .iter()
            .filter(|(_, h)| h.host == Some(slot) && !reported.contains(&h.launch.0))
            .map(|(&ki, _)| ki)
            .collect();
        gone.sort_unstable();
        for (k, i) in gone {
            self.confirm_end(engine, k, i, fx);
        }
        self.check_drained(engine, slot, fx);
        self.needs_cycle = true;
        Ok(Answer::Done)
    }

    /// A live run a host reports that is not its instance's current run
    /// (its host was lost, and came back): if the instance is pinned to
    /// that host (its volume is there) or belongs to a daemon job, the run
    /// is held — told to stop, and the instance's next run waits until
    /// the host confirms its end, so two runs never share a volume or a
    /// host's daemon slot. Returns whether it was held (and its kill sent).
    fn hold_stale_run(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        slot: HostSlot,
        run: RunRef,
        fx: &mut Effects,
    ) -> bool {
        let launch = run.launch;
        let job = &self.jobs[&k];
        let Some(t) = job.tasks.get(i as usize) else {
            return false;
        };
        let pinned_here = self.pin_of(k, i) == Some(slot) || job.plan.kind == JobKind::Daemon;
        if !pinned_here || self.held.contains_key(&(k, i)) || t.state.on_host() || t.orphan {
            return false;
        }
        let state = t.state;
        let job = self.job_mut(k);
        job.held += 1;
        job.active += 1;
        self.held.insert(
            (k, i),
            Held {
                launch,
                handle: None,
                host: Some(slot),
                restart: false,
                preempted: false,
            },
        );
        self.mark_dirty(k, i, fx);
        self.pin_changed(k, i);
        self.dirty_jobs.insert(k);
        let job = &self.jobs[&k];
        // The stale run's own key (its run id, not the current run's):
        // the agent knows runs by it.
        fx.kills.push(Kill {
            run,
            host: self.host_names[slot.idx()].clone(),
            job_id: job.id.clone(),
            grace_ms: job.template(i).kill_grace_ms,
            delay_ms: 0,
            preempted: None,
            notice_ms: 0,
        });
        if matches!(state, S::Pending | S::Ready | S::Placing) {
            // Queued for this host: back to wait for the old run's end.
            let reason = format!(
                "waiting for its earlier run on host {} to end",
                self.host_names[slot.idx()]
            );
            if self.end_run(engine, k, i, S::Preempted, &reason, fx) {
                self.new_run(k, i, fx);
            }
        }
        true
    }

    pub(super) fn agent_reports(
        &mut self,
        engine: &mut Engine,
        host: &Arc<str>,
        reports: Vec<RunReport>,
        fx: &mut Effects,
    ) {
        let Some(id) = engine.hosts().lookup(host) else {
            return;
        };
        let slot = HostSlot(id.idx() as u32);
        for r in reports {
            self.agent_report(engine, slot, host, r, fx);
        }
    }

    fn agent_report(
        &mut self,
        engine: &mut Engine,
        slot: HostSlot,
        host: &Arc<str>,
        report: RunReport,
        fx: &mut Effects,
    ) {
        let phase = report.phase;
        let key = report.key.clone();
        let ended = matches!(
            phase,
            RunPhase::Succeeded | RunPhase::Failed | RunPhase::Killed
        );
        if ended {
            fx.acks.push((host.clone(), key.clone()));
        }
        let i = key.instance;
        let job_key = self.by_id.get(&*key.job_id).copied();
        let Some(k) = job_key else {
            if !ended {
                fx.kills.push(Kill {
                    run: RunRef {
                        job: JobKey(u32::MAX),
                        instance: i,
                        run: key.run,
                        launch: super::LaunchId(key.launch),
                    },
                    host: host.clone(),
                    job_id: key.job_id,
                    grace_ms: 10_000,
                    delay_ms: 0,
                    preempted: None,
                    notice_ms: 0,
                });
            }
            return;
        };
        let run = RunRef {
            job: k,
            instance: i,
            run: key.run,
            launch: super::LaunchId(key.launch),
        };
        if self
            .held
            .get(&(k, i))
            .is_some_and(|h| h.launch == run.launch && h.host == Some(slot))
        {
            self.held_checkpoint(k, i, run.launch, report.checkpoint_ms, fx);
            if ended {
                let exited_0 = phase == RunPhase::Succeeded;
                self.held_run_ended(engine, k, i, report.time_ms, exited_0, fx);
            } else {
                // Told again, with its delay and notice: the agent keeps
                // the earlier time its stop signal is due.
                fx.kills.push(self.kill_again(k, i, run, host));
            }
            return;
        }
        let job = &self.jobs[&k];
        let current = job
            .tasks
            .get(i as usize)
            .is_some_and(|t| t.launch == run.launch && t.state.on_host() && t.host == Some(slot));
        if !current {
            if !ended {
                // Replaced by a newer run, or its instance is gone. A
                // pinned instance's old run on its host is held: the next
                // run waits for its end (they would share the volume).
                if !self.hold_stale_run(engine, k, i, slot, run, fx) {
                    let grace = self.jobs[&k]
                        .tasks
                        .get(i as usize)
                        .map_or(10_000, |_| self.jobs[&k].template(i).kill_grace_ms);
                    fx.kills.push(Kill {
                        run,
                        host: host.clone(),
                        job_id: key.job_id,
                        grace_ms: grace,
                        delay_ms: 0,
                        preempted: None,
                        notice_ms: 0,
                    });
                }
            }
            return;
        }
        if job.tasks[i as usize].handle.is_none() && !ended {
            // Recovered after a restart and still running: the engine
            // takes it over. (An ended one just has its end applied.)
            if let Err(e) = self.adopt(engine, k, i, slot) {
                self.stop_on_host(k, i, None, fx);
                self.transition(
                    k,
                    i,
                    S::Lost,
                    Some(&format!("cannot take the run over: {e}")),
                    fx,
                );
                self.restart_after_loss(engine, k, i, fx);
                return;
            }
        }
        if !report.ports.is_empty() {
            let t = &mut self.job_mut(k).tasks[i as usize];
            let ports: super::model::AssignedPorts = report
                .ports
                .iter()
                .map(|(n, p)| (n.as_str().into(), *p))
                .collect();
            if t.ports.as_deref() != Some(&ports) {
                t.ports = Some(ports);
                self.mark_dirty(k, i, fx);
            }
        }
        // A run that ended before its RUNNING report went out still ran.
        if report.started_ms > 0 && phase != RunPhase::Running {
            self.apply_update(
                engine,
                TaskUpdate {
                    run,
                    status: RunStatus::Running,
                    time_ms: report.started_ms,
                },
                fx,
            );
        }
        let status = match phase {
            RunPhase::Unknown | RunPhase::Starting => None,
            RunPhase::Running => Some(RunStatus::Running),
            RunPhase::Succeeded => Some(RunStatus::Exited(0)),
            RunPhase::Failed => Some(RunStatus::Failed(
                report.exit_code,
                if report.reason.is_empty() {
                    format!("exited with code {}", report.exit_code)
                } else {
                    report.reason.clone()
                },
            )),
            RunPhase::Killed => Some(RunStatus::Killed),
        };
        if let Some(status) = status {
            self.apply_update(
                engine,
                TaskUpdate {
                    run,
                    status,
                    time_ms: report.time_ms,
                },
                fx,
            );
        }
        if phase == RunPhase::Running {
            self.apply_checkpoint(engine, k, i, report.checkpoint_ms, fx);
            self.apply_health(engine, k, i, report.health, &report.health_detail, fx);
        }
        // Decisions taken while the run was out of sight.
        let job = &self.jobs[&k];
        if job.tasks[i as usize].state.on_host() {
            if job.kill_requested {
                self.end_run(engine, k, i, S::Killed, "job killed", fx);
            } else if self.maintenance.contains(&slot) && job.plan.kind == JobKind::Batch {
                // (Services leave a draining host as their SLA allows.)
                let reason = format!("host {host} drained for maintenance");
                if self.end_run(engine, k, i, S::Preempted, &reason, fx) {
                    self.restart_after_loss(engine, k, i, fx);
                }
            }
        }
    }

    /// A running run's checkpoint (`at`, 0: none reported): a later one
    /// than the run's last is recorded with the run (its row, so a
    /// restarted server knows it) and given to the engine, whose victim
    /// order prefers the runs that lose the least work. No event: it is
    /// no change of state.
    fn apply_checkpoint(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        at: u64,
        fx: &mut Effects,
    ) {
        let t = &mut self.job_mut(k).tasks[i as usize];
        if at <= t.checkpoint_at || t.state != S::Running {
            return;
        }
        t.checkpoint_at = at;
        if let Some(h) = t.handle {
            engine
                .checkpoint(h, at)
                .expect("a running run's engine task is placed");
        }
        self.mark_dirty(k, i, fx);
    }

    /// A preempted run still stopping reports a later checkpoint (made
    /// during its notice): the work it loses shrinks by what it saved.
    fn held_checkpoint(&mut self, k: JobKey, i: u32, launch: LaunchId, at: u64, fx: &mut Effects) {
        let Some(t) = self
            .jobs
            .get_mut(&k)
            .and_then(|j| j.tasks.get_mut(i as usize))
        else {
            return;
        };
        if t.launch != launch || t.state != S::Preempted || at <= t.checkpoint_at {
            return;
        }
        // Told to stop when it had lost `lost_work` since it last saved.
        let saved = t.started_at.max(t.checkpoint_at);
        let told = saved.saturating_add(t.lost_work);
        t.lost_work = lost_work_ms(t.started_at, at, told);
        t.checkpoint_at = at;
        self.mark_dirty(k, i, fx);
    }

    /// The kill sent again to a run told to stop that still runs: the same
    /// grace, delay and notice as the first.
    fn kill_again(&self, k: JobKey, i: u32, run: RunRef, host: &Arc<str>) -> Kill {
        let job = &self.jobs[&k];
        let tmpl = job.template(i);
        // The reason is the run's while it is the instance's current run
        // (an instance scaled away and back has another, or none).
        let preempted = self
            .held
            .get(&(k, i))
            .is_some_and(|h| h.preempted)
            .then(|| {
                job.tasks
                    .get(i as usize)
                    .filter(|t| t.launch == run.launch)
                    .and_then(|t| t.reason.as_deref())
                    .map_or_else(|| Arc::from("preempted"), Arc::from)
            });
        Kill {
            run,
            host: host.clone(),
            job_id: job.id.clone(),
            grace_ms: tmpl.kill_grace_ms,
            delay_ms: tmpl.shutdown_delay_ms,
            notice_ms: if preempted.is_some() {
                tmpl.preemption_notice_ms
            } else {
                0
            },
            preempted,
        }
    }

    /// A running task's health verdict: a change is an event; an unhealthy
    /// task is stopped and fails (its restart policy applies).
    pub(super) fn apply_health(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        health: Health,
        detail: &str,
        fx: &mut Effects,
    ) {
        let job = self.job_mut(k);
        let checked = job.template(i).health_check;
        let t = &mut job.tasks[i as usize];
        if t.state != S::Running || !checked || health == Health::None || t.health == health {
            return;
        }
        t.health = health;
        if health != Health::Unhealthy {
            self.task_event(k, i, "", fx);
            return;
        }
        let reason = if detail.is_empty() {
            "unhealthy: its health check failed".to_string()
        } else {
            format!("unhealthy: {detail}")
        };
        self.task_event(k, i, &reason, fx);
        self.stop_on_host(k, i, None, fx);
        let now = self.now;
        self.job_mut(k).tasks[i as usize].finished_at = now;
        self.fail(engine, k, i, &reason, fx);
    }

    fn adopt(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        slot: HostSlot,
    ) -> Result<(), String> {
        let task = super::runs::new_task(engine, self, k, i, self.pin_of(k, i));
        let host = engine
            .hosts()
            .lookup_slot(slot.idx())
            .ok_or("host is gone")?;
        // Placed when it was, not now: its age ranks it for preemption and
        // dates its estimated end in forecasts.
        let placed_at = match self.jobs[&k].tasks[i as usize].placed_at {
            0 => self.now,
            at => at.min(self.now),
        };
        // The run keeps the GPU devices its process was started with.
        let gpu = self.jobs[&k].tasks[i as usize].gpu;
        engine.hosts_mut().pin_gpu_grant(slot.idx(), gpu);
        let adopted = engine.adopt(&task, host, placed_at);
        engine.hosts_mut().clear_gpu_pin();
        let h = adopted.map_err(|e| e.to_string())?;
        // Its last checkpoint ranks it for preemption as before.
        let checkpoint_at = self.jobs[&k].tasks[i as usize].checkpoint_at;
        if checkpoint_at > 0 {
            engine
                .checkpoint(h, checkpoint_at)
                .expect("an adopted task is placed");
        }
        let gpu = engine.tasks().gpu(h).unwrap_or_default();
        let job = self.job_mut(k);
        // An orphan was counted in `active` already.
        job.tasks[i as usize].handle = Some(h);
        job.tasks[i as usize].gpu = gpu;
        job.tasks[i as usize].orphan = false;
        let t = &job.tasks[i as usize];
        let limit = job.plan.max_running_time_ms;
        if limit > 0 && t.state == S::Running && t.started_at > 0 {
            // The run-time limit holds across the restart.
            let at = t.started_at.saturating_add(limit);
            let run = RunRef {
                job: k,
                instance: i,
                run: t.run,
                launch: t.launch,
            };
            self.timers
                .push(std::cmp::Reverse((at, TimerKind::Deadline, run)));
        }
        if let Some(list) = self.orphans.get_mut(&slot) {
            list.retain(|&x| x != (k, i));
        }
        Ok(())
    }

    /// A run its host's agent registered without. One the agent never
    /// reported running (placed or launching) never started there: its
    /// launch went to a session that had already ended (the server had not
    /// heard yet, or heard only once its store could write again), or the
    /// server stopped between the commit and the send. It is launched
    /// again — the same run and launch id, so the instance keeps its run
    /// and nothing counts as lost — unless its job is being killed or its
    /// host drained. A run the agent had reported running and no longer
    /// has was lost with it (its work directory, say).
    fn launch_again_or_lose(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        slot: HostSlot,
        reason: &str,
        fx: &mut Effects,
    ) {
        let job = &self.jobs[&k];
        let Some(t) = job.tasks.get(i as usize) else {
            return;
        };
        let never_started = matches!(t.state, S::Placed | S::Launching) && t.host == Some(slot);
        if never_started
            && !job.kill_requested
            && !self.maintenance.contains(&slot)
            && (t.handle.is_some() || self.adopt(engine, k, i, slot).is_ok())
        {
            let launch = self.launch_of(k, i, slot, fx);
            fx.launches.push(launch);
            return;
        }
        self.lose_run(engine, k, i, slot, reason, fx);
    }

    fn lose_run(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        slot: HostSlot,
        reason: &str,
        fx: &mut Effects,
    ) {
        let now = self.now;
        let Some(t) = self
            .jobs
            .get_mut(&k)
            .and_then(|j| j.tasks.get_mut(i as usize))
        else {
            return;
        };
        if !t.state.on_host() || t.host != Some(slot) {
            return;
        }
        t.finished_at = now;
        self.release(engine, k, i, fx);
        self.transition(k, i, S::Lost, Some(reason), fx);
        if self.jobs[&k].kill_requested {
            self.transition(k, i, S::Initialized, None, fx);
            self.transition(k, i, S::Killed, Some("job killed"), fx);
        } else {
            self.restart_after_loss(engine, k, i, fx);
        }
    }

    /// Whether instance `i` of job `job_id` runs on slack.
    fn is_revocable(&self, job_id: &str, i: u32) -> bool {
        self.by_id
            .get(job_id)
            .and_then(|k| self.jobs.get(k))
            .is_some_and(|j| j.template(i).revocable)
    }

    /// The agent's session ended: no new work for a host nobody would
    /// launch it on; its runs stay until it returns or is declared lost.
    pub(super) fn agent_disconnected(&mut self, engine: &mut Engine, host: &str) {
        if let Some(id) = engine.hosts().lookup(host)
            && let Some(h) = self.agent_hosts.get_mut(&HostSlot(id.idx() as u32))
        {
            h.connected = false;
            if engine.hosts().state(id) == HostState::Up {
                engine
                    .hosts_mut()
                    .set_state(id, HostState::Down)
                    .expect("live host");
            }
        }
    }

    /// An agent host went silent: it goes Down, its runs are lost and start
    /// again elsewhere, its held runs count as ended.
    pub(super) fn host_lost(
        &mut self,
        engine: &mut Engine,
        host: &str,
        silent_ms: u64,
        fx: &mut Effects,
    ) {
        let Some(id) = engine.hosts().lookup(host) else {
            return;
        };
        let slot = HostSlot(id.idx() as u32);
        match self.agent_hosts.get_mut(&slot) {
            Some(h) if !h.lost => {
                h.lost = true;
                h.connected = false;
            }
            _ => return,
        }
        engine
            .hosts_mut()
            .set_state(id, HostState::Down)
            .expect("live host");
        let reason = format!("host {host} lost: no heartbeat for {silent_ms} ms");
        for (k, i) in self.instances_on(engine, slot) {
            self.lose_run(engine, k, i, slot, &reason, fx);
        }
        for (k, i) in self.orphans.remove(&slot).unwrap_or_default() {
            self.lose_run(engine, k, i, slot, &reason, fx);
        }
        let mut held: Vec<(JobKey, u32)> = self
            .held
            .iter()
            .filter(|(_, h)| h.host == Some(slot))
            .map(|(&ki, _)| ki)
            .collect();
        held.sort_unstable();
        for (k, i) in held {
            self.confirm_end(engine, k, i, fx);
        }
        if self.maintenance.contains(&slot) {
            fx.rows.push(RowKey::Host(slot));
        }
        self.needs_cycle = true;
    }
}

#[cfg(test)]
mod set_attribute_tests {
    use super::super::sim::{Sim, plan};
    use super::super::{Error, Input};

    fn set(sim: &mut Sim, hosts: &[&str], value: &str) -> Result<super::Answer, Error> {
        sim.step(Input::SetHostAttribute {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            key: "pool".into(),
            value: value.into(),
        })
    }

    #[test]
    fn placement_follows_a_changed_attribute_and_placed_runs_stay() {
        let mut sim = Sim::new();
        sim.add_host("h1", 4, 4096).unwrap();
        sim.add_host("h2", 4, 4096).unwrap();
        let mut p = plan("/", 1, 1000);
        p.default_mut().constraint = "pool == a".into();
        sim.step(Input::CreateJob {
            id: "j".into(),
            plan: Box::new(p),
        })
        .unwrap();
        sim.step(Input::Cycle).unwrap();
        assert!(sim.current("j", 0).is_none(), "no host has pool=a yet");
        // All or nothing: an unknown host changes no host.
        assert!(matches!(
            set(&mut sim, &["h2", "nope"], "a"),
            Err(Error::HostNotFound(h)) if h == "nope"
        ));
        assert!(matches!(
            set(&mut sim, &["h2"], "a b"),
            Err(Error::Invalid { .. })
        ));
        sim.step(Input::Cycle).unwrap();
        assert!(sim.current("j", 0).is_none());
        set(&mut sim, &["h2"], "a").unwrap();
        sim.step(Input::Cycle).unwrap();
        assert_eq!(&*sim.current("j", 0).expect("placed").0, "h2");
        // Moving the host away leaves the run where it is.
        set(&mut sim, &["h2"], "b").unwrap();
        sim.step(Input::Cycle).unwrap();
        assert_eq!(&*sim.current("j", 0).expect("placed").0, "h2");
        let h2 = sim.engine.hosts().lookup("h2").unwrap();
        let spec = sim.engine.hosts().spec(h2).unwrap();
        assert!(spec.attributes.contains(&("pool".into(), "b".into())));
        assert_eq!(
            spec.attributes.iter().filter(|(k, _)| k == "pool").count(),
            1
        );
    }
}

#[cfg(test)]
mod kill_again_tests {
    use super::super::sim::{Sim, plan};
    use super::super::{Health, Input, RunPhase};
    use crate::effects::Effects;

    /// A drained host's run, still running, is reported again: the kill
    /// sent again keeps the task's grace, its notice and why it was
    /// preempted (else the agent would cut the grace and the notice short).
    #[test]
    fn a_kill_sent_again_keeps_the_grace_and_the_notice() {
        let mut sim = Sim::new();
        sim.add_host("h1", 4, 4096).unwrap();
        let mut p = plan("/", 1, 1000);
        p.default_mut().kill_grace_ms = 60_000;
        p.default_mut().preemption_notice_ms = 30_000;
        sim.step(Input::CreateJob {
            id: "j".into(),
            plan: Box::new(p),
        })
        .unwrap();
        sim.step(Input::Cycle).unwrap();
        let (host, key) = sim.current("j", 0).expect("placed");
        sim.step(Input::Maintenance {
            hosts: vec!["h1".into()],
            start: true,
        })
        .unwrap();
        let report = sim.report(key, RunPhase::Running, 0, Health::None);
        let mut fx = Effects::default();
        let now = sim.now;
        sim.core
            .step(
                &mut sim.engine,
                Input::AgentReports {
                    host,
                    reports: vec![report],
                },
                now,
                &mut fx,
            )
            .unwrap();
        let [kill] = fx.kills.as_slice() else {
            panic!("one kill: {:?}", fx.kills);
        };
        assert_eq!((kill.grace_ms, kill.notice_ms), (60_000, 30_000));
        assert_eq!(
            kill.preempted.as_deref(),
            Some("host h1 drained for maintenance; lost work: 0 ms since its start")
        );
    }
}
