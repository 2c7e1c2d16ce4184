//! Runs: transitions and their events, queueing waiting instances gang by
//! gang, the cycle (admission, placement, both kinds of preemption), run
//! updates, failures and restarts, timers, and job states.

use std::cmp::Reverse;
use std::sync::Arc;

use peloton_engine::admission::TaskFlags;
use peloton_engine::host::GpuGrant;
use peloton_engine::task::{TaskHandle, TaskState as EngineTaskState};
use peloton_engine::{Engine, NewTask};

use super::effects::{Effects, Event, EventKind, Launch, RowKey};
use super::model::{
    Health, Job, JobKey, JobKind, JobState, LaunchId, RunRef, TaskState as S, lost_work_ms,
};
use super::rendezvous::{Gang, GangMember, LaunchRendezvous};
use super::{Lifecycle, RunStatus, TaskUpdate, TimerKind, legal};

/// What a task of this template asks the engine for: its request, plus
/// its volume's disk.
pub(super) fn engine_request(t: &super::TaskTemplate) -> peloton_engine::Resources {
    let mut request = t.request;
    if let Some(v) = &t.volume {
        let disk = peloton_engine::resources::Dim::Disk.idx();
        request.0[disk] = request.0[disk].saturating_add(v.size_mb);
    }
    request
}

/// Instances of one job submitted to the engine in one call.
const FILL_BATCH: usize = 4096;

/// The engine task of instance `i` of job `k`, pinned to `pin` if given
/// (its volume's or daemon's host). A task with a volume asks for the
/// volume's disk too: the volume lives on the host it is placed on. It
/// carries the instance's runtime estimate (what backfill plans with).
pub(super) fn new_task(
    engine: &Engine,
    core: &Lifecycle,
    k: JobKey,
    i: u32,
    pin: Option<super::HostSlot>,
) -> NewTask {
    let job = &core.jobs[&k];
    let runtime_ms = core.runtime_estimate(k, i).map_or(0, |e| e.ms);
    new_task_of(
        engine,
        &job.plan,
        job.template(i),
        job.pool,
        k,
        i,
        pin,
        runtime_ms,
    )
}

/// The engine task of instance `i` of job `k` of `plan`, on `template`, in
/// `pool` (also for a job not created yet: a plan), expected to run
/// `runtime_ms` (0: unknown).
#[expect(
    clippy::too_many_arguments,
    reason = "every part of an engine task, passed explicitly"
)]
pub(super) fn new_task_of(
    engine: &Engine,
    plan: &super::JobPlan,
    t: &super::TaskTemplate,
    pool: peloton_engine::PoolId,
    k: JobKey,
    i: u32,
    pin: Option<super::HostSlot>,
    runtime_ms: u64,
) -> NewTask {
    NewTask {
        job: k.0,
        instance: i,
        pool,
        priority: plan.priority,
        request: engine_request(t),
        ports: t.ports,
        flags: TaskFlags {
            preemptible: plan.preemptible,
            controller: t.controller,
            revocable: t.revocable,
        },
        constraint: t.constraint.clone(),
        strategy: plan.strategy,
        max_per_host: t.max_per_host,
        limit_key: k.0,
        desired_host: pin.and_then(|s| engine.hosts().lookup_slot(s.idx())),
        daemon: plan.kind == JobKind::Daemon,
        runtime_ms: runtime_ms.min(peloton_engine::engine::MAX_RUNTIME_MS),
    }
}

impl Lifecycle {
    pub(super) fn job_mut(&mut self, k: JobKey) -> &mut Job {
        self.jobs.get_mut(&k).expect("live job")
    }

    /// Moves instance `i` of job `k` to `to`, with an event (and a row
    /// where recovery needs one).
    pub(super) fn transition(
        &mut self,
        k: JobKey,
        i: u32,
        to: S,
        reason: Option<&str>,
        fx: &mut Effects,
    ) {
        let (from, host) = {
            let t = &self.jobs[&k].tasks[i as usize];
            (t.state, t.host)
        };
        if from.on_host() && !to.on_host() {
            let job = &self.jobs[&k];
            if job.elastic.is_some() && job.tasks[i as usize].gang == Some(job.next_gang) {
                // An elastic gang's member left: settled at the end of the
                // step.
                self.elastic_left.push((k, i, to));
            }
        }
        if from.on_host()
            && !to.on_host()
            && let Some(slot) = host
        {
            // The run ended: its account goes to the ledger, and what it
            // used no longer counts on its host.
            self.account_run(k, i, slot, to, fx);
            if self.usage.forget_run(slot, (k, i)).is_some() {
                // What it did not use is no longer lent: the host's lending
                // is worked out again at the end of the step.
                self.overcommit_reported(slot);
            }
        }
        let job = self.jobs.get_mut(&k).expect("live job");
        let executor = job.is_executor(i);
        let t = &mut job.tasks[i as usize];
        assert!(
            legal(from, to),
            "illegal task transition {from:?} -> {to:?} of {}/{i}",
            job.id
        );
        job.counts[from as usize] -= 1;
        job.counts[to as usize] += 1;
        t.state = to;
        // A recovered waiting instance moves within the queue silently; it
        // is news again once it leaves it.
        let queued = matches!(to, S::Pending | S::Ready | S::Placing);
        let quiet = t.requeued && queued;
        t.requeued &= queued;
        let started_at = t.started_at;
        if to.is_terminal() || matches!(from, S::Initialized | S::Backoff) {
            // Room under max_running_instances, or a gang that waited for
            // this member, may let waiting instances go.
            self.need_fill.insert(k);
        }
        if i == 0 && to.is_terminal() && job.plan.has_controller_instance() {
            // The job's controller may have ended for good (a failed run
            // may still back off): seen at the end of the step.
            self.controller_ended.insert(k);
        }
        if job.plan.kind == JobKind::Application {
            if to.is_terminal() {
                // An executor to replace, or a driver that ended.
                self.app_dirty.insert(k);
            }
            if to == S::Failed && executor {
                // Failures in a row; one that ran a good while first starts
                // the count over (a driver that is gone, a bad command or
                // image fail at once, again and again).
                let ran = started_at != 0
                    && self.now.saturating_sub(started_at) >= super::apps::LONG_RUN_MS;
                job.app.failures = if ran {
                    1
                } else {
                    job.app.failures.saturating_add(1)
                };
            }
        }
        if let Some(r) = reason {
            t.reason = Some(r.into());
        }
        if to != S::Running {
            t.health = Health::None;
        } else {
            job.started = true;
        }
        // Queued states and a first run's start need no row: recovery
        // treats a missing or older row the same way.
        let skip = matches!(to, S::Pending | S::Ready | S::Placing)
            || (to == S::Initialized && t.run == 1);
        if !skip {
            fx.task_row(&mut t.row_mark, k, i);
        }
        self.dirty_jobs.insert(k);
        self.pin_changed(k, i);
        if !quiet {
            self.task_event(k, i, reason.unwrap_or_default(), fx);
        }
    }

    /// An event with the instance's current state, host and health.
    pub(super) fn task_event(&mut self, k: JobKey, i: u32, reason: &str, fx: &mut Effects) {
        let job = &self.jobs[&k];
        let t = &job.tasks[i as usize];
        self.revision += 1;
        fx.events.push(Event {
            revision: self.revision,
            time_ms: self.now,
            kind: EventKind::Task {
                job: job.id.clone(),
                instance: i,
                run: t.run,
                state: t.state,
                host: t.host.map_or_else(
                    || std::sync::Arc::from(""),
                    |h| self.host_names[h.idx()].clone(),
                ),
                reason: reason.into(),
                health: t.health,
            },
        });
    }

    pub(super) fn mark_dirty(&mut self, k: JobKey, i: u32, fx: &mut Effects) {
        if let Some(t) = self
            .jobs
            .get_mut(&k)
            .and_then(|j| j.tasks.get_mut(i as usize))
        {
            fx.task_row(&mut t.row_mark, k, i);
        }
    }

    /// Ends the current run's hold on the engine (and on its host).
    pub(super) fn release(&mut self, engine: &mut Engine, k: JobKey, i: u32, fx: &mut Effects) {
        let job = self.jobs.get_mut(&k).expect("live job");
        let t = &mut job.tasks[i as usize];
        let Some(h) = t.handle.take() else {
            if t.orphan {
                // A recovered run that ends before its agent reported it.
                t.orphan = false;
                job.active -= 1;
                self.need_fill.insert(k);
            }
            return;
        };
        job.active -= 1;
        if !job.waiting.is_empty() {
            // Room under max_running_instances for the next gang.
            self.need_fill.insert(k);
        }
        match engine
            .tasks()
            .state(h)
            .expect("a current run's engine task is live")
        {
            EngineTaskState::Pending => {
                let mates: Vec<u32> = engine
                    .queued_gang(h)
                    .iter()
                    .filter(|&&m| m != h)
                    .map(|&m| engine.tasks().owner(m).expect("queued task is live").1)
                    .collect();
                engine.cancel(h).expect("queued task");
                for mi in mates {
                    // The rest of its gang goes back to waiting, in order.
                    let mk = k;
                    let job = self.jobs.get_mut(&mk).expect("live job");
                    job.tasks[mi as usize].handle = None;
                    job.active -= 1;
                    self.back_to_waiting(mk, mi, fx);
                }
            }
            _ => engine.finish(h).expect("live engine task"),
        }
        self.needs_cycle = true;
    }

    /// Ends the current run in `to` (Killed, Preempted, Lost or Failed),
    /// stopping it on its host if it has one. Returns whether a run ended
    /// in `to` (false: it had already ended, or it was only queued and went
    /// back to waiting).
    pub(super) fn end_run(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        to: S,
        reason: &str,
        fx: &mut Effects,
    ) -> bool {
        let state = self.jobs[&k].tasks[i as usize].state;
        if to == S::Killed
            && let Some(h) = self.held.get_mut(&(k, i))
        {
            // A kill wins over a restart still waiting for the old run.
            h.restart = false;
            self.mark_dirty(k, i, fx);
            if matches!(state, S::Lost | S::Preempted) {
                self.transition(k, i, S::Initialized, None, fx);
                self.transition(k, i, S::Killed, Some(reason), fx);
                return true;
            }
        }
        if state.is_terminal() || matches!(state, S::Lost | S::Preempted) {
            return false;
        }
        // A preempted run that started loses what it did since it last
        // saved: shown with the reason, kept with the run.
        let lost = (to == S::Preempted).then(|| {
            let t = &self.jobs[&k].tasks[i as usize];
            lost_work_ms(t.started_at, t.checkpoint_at, self.now)
        });
        let with_loss;
        let reason = match lost {
            Some(ms) if self.jobs[&k].tasks[i as usize].started_at > 0 => {
                let since = if self.jobs[&k].tasks[i as usize].checkpoint_at > 0 {
                    "its last checkpoint"
                } else {
                    "its start"
                };
                with_loss = format!("{reason}; lost work: {ms} ms since {since}");
                with_loss.as_str()
            }
            _ => reason,
        };
        self.job_mut(k).tasks[i as usize].lost_work = lost.unwrap_or(0);
        if state.on_host() {
            self.stop_on_host(k, i, (to == S::Preempted).then_some(reason), fx);
        }
        let job = self.jobs.get_mut(&k).expect("live job");
        if state == S::Initialized
            && to == S::Killed
            && let Some(at) = job.waiting.iter().position(|&w| w == i)
        {
            job.waiting.remove(at);
        }
        // Until its host confirms the end (`held_run_ended`), a run on a
        // host ended when it was told to stop.
        job.tasks[i as usize].finished_at = self.now;
        self.release(engine, k, i, fx);
        if state == S::Backoff || state == S::Initialized {
            if to == S::Killed {
                self.transition(k, i, S::Killed, Some(reason), fx);
                return true;
            }
            return false;
        }
        if state == S::Pending && to != S::Killed {
            // Never left the queue: nothing to preempt or lose; it waits
            // again.
            self.back_to_waiting(k, i, fx);
            return false;
        }
        self.transition(k, i, to, Some(reason), fx);
        if to == S::Preempted {
            fx.counters.preemptions += 1;
        }
        true
    }

    /// Starts a new run of an instance whose run has ended.
    pub(super) fn new_run(&mut self, k: JobKey, i: u32, fx: &mut Effects) {
        if let Some(h) = self.held.get_mut(&(k, i)) {
            // The old run is still stopping: start again once it is gone.
            h.restart = true;
            self.mark_dirty(k, i, fx);
            return;
        }
        let max_history = self.config.max_history;
        let mut run = self.run_record(&self.jobs[&k].tasks[i as usize]);
        let now = self.now;
        let t = &mut self.job_mut(k).tasks[i as usize];
        if t.state == S::Backoff {
            // History says how the run ended.
            run.state = if t.exit_code == 0 && t.reason.is_none() {
                S::Succeeded
            } else {
                S::Failed
            };
        }
        // Most instances restart rarely: room for one run at first (a
        // default Vec takes four).
        let history = t
            .history
            .get_or_insert_with(|| Box::new(Vec::with_capacity(1)));
        history.insert(0, run);
        history.truncate(max_history);
        t.run += 1;
        t.launch = LaunchId(0);
        t.host = None;
        t.created_at = now;
        t.placed_at = 0;
        t.started_at = 0;
        t.finished_at = 0;
        t.exit_code = 0;
        t.checkpoint_at = 0;
        t.lost_work = 0;
        t.reason = None;
        t.ports = None;
        t.gpu = GpuGrant::default();
        self.back_to_waiting(k, i, fx);
    }

    /// Makes an instance Initialized and puts it in its job's `waiting`
    /// queue, in instance order (the two always go together).
    pub(super) fn back_to_waiting(&mut self, k: JobKey, i: u32, fx: &mut Effects) {
        self.transition(k, i, S::Initialized, None, fx);
        let job = self.job_mut(k);
        let at = job.waiting.partition_point(|&w| w < i);
        job.waiting.insert(at, i);
        self.need_fill.insert(k);
    }

    pub(super) fn fill_all(&mut self, engine: &mut Engine, fx: &mut Effects) {
        if self.need_fill.is_empty() {
            return;
        }
        let mut keys: Vec<JobKey> = self.need_fill.drain().collect();
        keys.sort_unstable();
        for k in keys {
            self.fill(engine, k, fx);
        }
    }

    /// Submits waiting instances of a job, gang by gang, up to its running
    /// limit. What the engine refuses waits for the next try.
    pub(super) fn fill(&mut self, engine: &mut Engine, k: JobKey, fx: &mut Effects) {
        let Some(job) = self.jobs.get(&k) else {
            return;
        };
        if job.kill_requested || job.waits_for_jobs {
            return;
        }
        let mut gang = Vec::new();
        let mut members = Vec::new();
        let mut handles = Vec::new();
        // Instances that are not gangs go to the engine in batches; after
        // a refused batch, one by one (what fits is queued).
        let mut batches = true;
        loop {
            let job = &self.jobs[&k];
            if job.waiting.is_empty() {
                return;
            }
            let room = job.room();
            if batches && job.plan.gang == 1 && room > 1 && job.waiting.len() > 1 {
                let n = (room as usize).min(job.waiting.len()).min(FILL_BATCH);
                members.clear();
                gang.clear();
                for &i in job.waiting.iter().take(n) {
                    // The one-by-one path below handles an instance that
                    // must wait.
                    let pin = self.pin_of(k, i);
                    if self.held.contains_key(&(k, i))
                        || pin.is_some_and(|s| engine.hosts().lookup_slot(s.idx()).is_none())
                    {
                        break;
                    }
                    members.push(i);
                    gang.push(new_task(engine, self, k, i, pin));
                }
                if !members.is_empty() {
                    handles.clear();
                    if engine.submit_each(&gang, &mut handles).is_ok() {
                        let job = self.job_mut(k);
                        job.waiting.drain(..members.len());
                        job.active += members.len() as u32;
                        for (&i, &h) in members.iter().zip(&handles) {
                            job.tasks[i as usize].handle = Some(h);
                            job.tasks[i as usize].gang = None;
                        }
                        for &i in &members {
                            self.transition(k, i, S::Pending, None, fx);
                        }
                        self.needs_cycle = true;
                        continue;
                    }
                    batches = false;
                }
            }
            let mut want = job.plan.gang;
            let mut grows = false;
            if job.plan.elastic_min > 0 {
                match self.elastic_queue(k) {
                    super::elastic::ElasticQueue::Start(n) => {
                        if job.held > 0 {
                            // Its earlier members are still stopping.
                            return;
                        }
                        want = n;
                    }
                    super::elastic::ElasticQueue::Wait => return,
                    super::elastic::ElasticQueue::Grow => {
                        want = 1;
                        grows = true;
                    }
                }
            }
            let job = &self.jobs[&k];
            let size = (want as usize).min(job.waiting.len());
            if size < want as usize && (job.counts[S::Backoff as usize] > 0 || job.held > 0) {
                // A gang restarts as one: its members that are backing off
                // or still stopping join the others before it is queued.
                return;
            }
            if (room as usize) < size {
                return;
            }
            members.clear();
            members.extend(job.waiting.iter().take(size).copied());
            if members.iter().any(|&i| self.held.contains_key(&(k, i))) {
                // An earlier run of one (scaled away and added back) is
                // still stopping: wait for it (confirm_end fills again).
                return;
            }
            gang.clear();
            for &i in &members {
                let pin = self.pin_of(k, i);
                if pin.is_some_and(|s| engine.hosts().lookup_slot(s.idx()).is_none()) {
                    // Its host is gone from the cluster: it waits (a
                    // daemon's instance is retired at the next cycle).
                    self.retry_fill.insert(k);
                    return;
                }
                gang.push(new_task(engine, self, k, i, pin));
            }
            match engine.submit(&gang) {
                Ok(handles) => {
                    let job = self.job_mut(k);
                    job.waiting.drain(..size);
                    job.active += size as u32;
                    // An elastic gang's later members join its gang.
                    let gang_no = (job.plan.gang > 1).then(|| {
                        if !grows {
                            job.next_gang += 1;
                        }
                        job.next_gang
                    });
                    for (&i, h) in members.iter().zip(handles) {
                        job.tasks[i as usize].handle = Some(h);
                        job.tasks[i as usize].gang = gang_no;
                    }
                    for &i in &members {
                        self.transition(k, i, S::Pending, None, fx);
                    }
                    if self.jobs[&k].plan.elastic_min > 0 && !grows {
                        self.elastic_started(k);
                    }
                    self.needs_cycle = true;
                }
                Err(e) => {
                    let reason: Box<str> = format!("cannot queue yet: {e}").into();
                    let job = self.job_mut(k);
                    for &i in &members {
                        job.tasks[i as usize].reason = Some(reason.clone());
                    }
                    // Retried after the next cycle.
                    self.retry_fill.insert(k);
                    return;
                }
            }
        }
    }

    /// One scheduling cycle: admission and placement in the engine, then
    /// launches for what was placed and stops for the victims of both
    /// kinds of preemption.
    pub(super) fn cycle(&mut self, engine: &mut Engine, fx: &mut Effects) {
        // While preempted runs are still stopping, the engine still counts
        // them: choosing more victims now would preempt twice for one need.
        let want_victims = self.n_held_preempted == 0;
        engine.cycle_with(self.now, want_victims);
        self.needs_cycle = false;
        let n_admitted = engine.report().admission.admitted.len();
        for idx in 0..n_admitted {
            let h = TaskHandle::from_u64(engine.report().admission.admitted[idx].task.0);
            if let Some((k, i)) = self.instance_of(engine, h) {
                self.transition(k, i, S::Ready, None, fx);
            }
        }
        let n_placed = engine.report().placement.placed.len();
        let mut placed = Vec::with_capacity(n_placed);
        for idx in 0..n_placed {
            let p = engine.report().placement.placed[idx];
            let Some((k, i)) = self.instance_of(engine, p.task) else {
                continue;
            };
            let host = super::HostSlot(p.host);
            // Gang members' ports are chosen now (after those of the runs
            // placed on the host before them): their peers learn them at
            // launch.
            let ports = self.gang_ports(engine, k, i, host);
            let now = self.now;
            let t = &mut self.job_mut(k).tasks[i as usize];
            t.host = Some(host);
            t.placed_at = now;
            t.gpu = p.gpu;
            t.gave_way = false;
            t.ports = ports;
            self.transition(k, i, S::Placed, None, fx);
            // The Placed event's revision names the launch: unique for the
            // store's whole life, so also across restarts.
            let launch = LaunchId(self.revision);
            self.job_mut(k).tasks[i as usize].launch = launch;
            self.transition(k, i, S::Launching, None, fx);
            placed.push((k, i, host));
        }
        // Elastic gangs that members joined: a new membership, which the
        // joining members get with their launch and the others at the end
        // of the step.
        let mut joined: Vec<JobKey> = placed
            .iter()
            .filter(|(k, _, _)| self.jobs[k].plan.elastic_min > 0)
            .map(|&(k, _, _)| k)
            .collect();
        joined.sort_unstable();
        joined.dedup();
        for k in joined {
            self.elastic_changed(k, true);
        }
        // Launched once every member of a gang has its host and ports.
        let mut gang = None;
        for (k, i, host) in placed {
            let rendezvous = self.rendezvous_of(k, i, &mut gang);
            let launch = self.launch_with(k, i, host, rendezvous, fx);
            fx.launches.push(launch);
        }
        fx.counters.placements += n_placed as u64;
        let n_unplaced = engine.report().placement.unplaced.len();
        fx.counters.placement_failures += n_unplaced as u64;
        for idx in 0..n_unplaced {
            let u = engine.report().placement.unplaced[idx].task;
            if let Some((k, i)) = self.instance_of(engine, u)
                && self.jobs[&k].tasks[i as usize].state == S::Ready
            {
                self.transition(k, i, S::Placing, None, fx);
            }
        }
        if !want_victims {
            return;
        }
        // Inter-pool: pools over their entitlement give back the overage.
        let victims: Vec<(TaskHandle, String)> = engine
            .report()
            .victims
            .iter()
            .map(|v| (v.task, format!("preempted: {}", v.reason)))
            .collect();
        let mut preempted_any = false;
        for (h, reason) in victims {
            if let Some((k, i)) = self.instance_of(engine, h)
                && self.end_run(engine, k, i, S::Preempted, &reason, fx)
            {
                preempted_any = true;
                self.job_mut(k).tasks[i as usize].gave_way = true;
                self.restart_after_loss(engine, k, i, fx);
            }
        }
        if preempted_any || n_unplaced == 0 {
            return;
        }
        // Intra-pool: an admitted task that fits nowhere evicts
        // lower-priority preemptible tasks of its own pool from one host.
        let mut plans = Vec::new();
        engine.eviction_plans(&mut plans);
        for (for_task, slot, victims) in plans {
            let owner = self.instance_of(engine, for_task);
            let beneficiary = owner
                .map(|(k, i)| format!("{}/{i}", self.jobs[&k].id))
                .unwrap_or_default();
            let daemon = owner.is_some_and(|(k, _)| self.jobs[&k].plan.kind == JobKind::Daemon);
            let reason = if daemon {
                format!(
                    "preempted: daemon {beneficiary} needs room on host {}",
                    self.host_names[slot as usize]
                )
            } else {
                format!(
                    "preempted: a higher-priority task of its pool ({beneficiary}) needs room on host {}",
                    self.host_names[slot as usize]
                )
            };
            let borrowed = format!(
                "preempted: revocable, and {beneficiary} (not revocable) needs the room revocable \
                 work holds on host {}",
                self.host_names[slot as usize]
            );
            for v in victims {
                let revocable = engine
                    .tasks()
                    .flags(v.task)
                    .is_ok_and(|f| f & peloton_engine::task::flags::REVOCABLE != 0);
                let why = if revocable && !daemon {
                    &borrowed
                } else {
                    &reason
                };
                if let Some((k, i)) = self.instance_of(engine, v.task)
                    && self.end_run(engine, k, i, S::Preempted, why, fx)
                {
                    self.job_mut(k).tasks[i as usize].gave_way = true;
                    self.restart_after_loss(engine, k, i, fx);
                }
            }
        }
    }

    /// The launch of instance `i`'s current run on `host`, with the
    /// instance's volume if its task has one (made at the first launch;
    /// the same one again for a launch sent again).
    pub(super) fn launch_of(
        &mut self,
        k: JobKey,
        i: u32,
        host: super::HostSlot,
        fx: &mut Effects,
    ) -> Launch {
        let rendezvous = self.rendezvous_of(k, i, &mut None);
        self.launch_with(k, i, host, rendezvous, fx)
    }

    /// [`launch_of`](Self::launch_of) with the member's rendezvous given.
    fn launch_with(
        &mut self,
        k: JobKey,
        i: u32,
        host: super::HostSlot,
        rendezvous: Option<LaunchRendezvous>,
        fx: &mut Effects,
    ) -> Launch {
        let volume = self.volume_at_placement(k, i, host, fx);
        if let Some(r) = &rendezvous
            && let Some(e) = self.job_mut(k).elastic.as_deref_mut()
        {
            e.told.insert(i, r.gang.generation);
        }
        let job = &self.jobs[&k];
        let tmpl = job.template(i);
        let t = &job.tasks[i as usize];
        let gang_member = rendezvous.is_some();
        Launch {
            run: RunRef {
                job: k,
                instance: i,
                run: t.run,
                launch: t.launch,
            },
            host: self.host_names[host.idx()].clone(),
            job_id: job.id.clone(),
            config: t.config,
            template: tmpl.clone(),
            volume,
            gpu: t.gpu,
            ports: t.ports.clone().filter(|_| gang_member),
            rendezvous,
        }
    }

    /// Ports for instance `i` placed on `host`, if it is a gang member
    /// with named ports and the host is an agent's with port ranges:
    /// the first free ones of its ranges from the top, less the ports its
    /// runs hold (current ones, and those told to stop whose end it has
    /// not confirmed: they keep their engine tasks, and their instances'
    /// ports until a new run). `None` leaves the choice to the agent.
    fn gang_ports(
        &self,
        engine: &Engine,
        k: JobKey,
        i: u32,
        host: super::HostSlot,
    ) -> Option<super::model::AssignedPorts> {
        let job = &self.jobs[&k];
        let names = &job.template(i).port_names;
        if job.plan.gang <= 1 || names.is_empty() {
            return None;
        }
        let ranges = &self.agent_hosts.get(&host)?.port_ranges;
        let taken: rustc_hash::FxHashSet<u32> = engine
            .tasks()
            .on_host(host.0)
            .filter_map(|h| engine.tasks().owner(h).ok())
            .filter(|&(kk, ii)| (JobKey(kk), ii) != (k, i))
            .filter_map(|(kk, ii)| self.jobs.get(&JobKey(kk))?.tasks.get(ii as usize))
            .filter(|t| t.host == Some(host))
            .filter_map(|t| t.ports.as_deref())
            .flatten()
            .map(|&(_, port)| port)
            .collect();
        super::rendezvous::choose_ports(ranges, &taken, names)
    }

    /// The gang of instance `i`'s current run as it sees it (none if it is
    /// not a gang member): its members are the instances queued with it
    /// (same gang number), ranked by instance. `last` keeps the last gang
    /// built, shared by its members' launches.
    pub(super) fn rendezvous_of(
        &self,
        k: JobKey,
        i: u32,
        last: &mut Option<(JobKey, Arc<Gang>)>,
    ) -> Option<LaunchRendezvous> {
        let job = &self.jobs[&k];
        let number = job.tasks[i as usize].gang.filter(|_| job.plan.gang > 1)?;
        // An elastic gang's members are those on a host now; its
        // generation changes with them.
        let elastic = job.elastic.as_deref();
        let generation = elastic.map_or(u64::from(number), |e| e.generation);
        let gang = match last {
            Some((kk, g)) if *kk == k && g.generation == generation => g.clone(),
            _ => {
                let members = job
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| {
                        t.gang == Some(number) && (elastic.is_none() || t.state.on_host())
                    })
                    .enumerate()
                    .map(|(rank, (instance, t))| {
                        let host = t.host;
                        GangMember {
                            rank: rank as u32,
                            instance: instance as u32,
                            host: host.map_or_else(
                                || Arc::from(""),
                                |h| self.host_names[h.idx()].clone(),
                            ),
                            address: host
                                .and_then(|h| self.agent_hosts.get(&h))
                                .map_or_else(|| Arc::from(""), |a| a.address.clone()),
                            ports: t.ports.clone().unwrap_or_default(),
                        }
                    })
                    .collect();
                let g = Arc::new(Gang {
                    generation,
                    members,
                    ask: job.plan_of(job.tasks[i as usize].config).rendezvous.clone(),
                });
                *last = Some((k, g.clone()));
                g
            }
        };
        let rank = gang.members.iter().position(|m| m.instance == i)? as u32;
        Some(LaunchRendezvous { rank, gang })
    }

    /// Applies a run's status change (from the simulator, or an agent's
    /// report).
    pub(super) fn apply_update(&mut self, engine: &mut Engine, u: TaskUpdate, fx: &mut Effects) {
        let (k, i) = (u.run.job, u.run.instance);
        // Held runs first: a scaled-away instance has no task entry.
        if self
            .held
            .get(&(k, i))
            .is_some_and(|h| h.launch == u.run.launch)
        {
            if !matches!(u.status, RunStatus::Running) {
                let exited_0 = matches!(u.status, RunStatus::Exited(0));
                self.held_run_ended(engine, k, i, u.time_ms, exited_0, fx);
            }
            return;
        }
        let Some(job) = self.jobs.get_mut(&k) else {
            return;
        };
        // The limit of the config the run is on (an edit changes it for
        // instances not started yet).
        let limit = job
            .tasks
            .get(i as usize)
            .map_or(0, |t| job.plan_of(t.config).max_running_time_ms);
        let health_check = job.template(i).health_check;
        let Some(t) = job.tasks.get_mut(i as usize) else {
            return;
        };
        if t.run != u.run.run || t.launch != u.run.launch || !t.state.on_host() {
            return; // a run we already ended
        }
        match u.status {
            RunStatus::Running => {
                if t.state == S::Launching {
                    t.started_at = u.time_ms;
                    if limit > 0 {
                        self.timers.push(Reverse((
                            u.time_ms.saturating_add(limit),
                            TimerKind::Deadline,
                            u.run,
                        )));
                    }
                    self.transition(k, i, S::Running, None, fx);
                    // Agents report a checked run's health; the simulator
                    // has no process to check and reports every run healthy.
                    let agent_mode = self.config.agent_mode;
                    let t = &mut self.job_mut(k).tasks[i as usize];
                    t.health = match (health_check, agent_mode) {
                        (false, _) => Health::None,
                        (true, true) => Health::Unknown,
                        (true, false) => Health::Healthy,
                    };
                }
            }
            RunStatus::Exited(code) => {
                t.finished_at = u.time_ms;
                t.exit_code = code;
                fx.counters.runs_finished += 1;
                self.release(engine, k, i, fx);
                if self.jobs[&k].plan.kind.keeps_running() {
                    self.service_exited(engine, k, i, code, fx);
                } else if code == 0 {
                    self.transition(k, i, S::Succeeded, None, fx);
                } else {
                    self.fail(engine, k, i, &format!("exited with code {code}"), fx);
                }
            }
            RunStatus::Failed(code, reason) => {
                t.finished_at = u.time_ms;
                t.exit_code = code;
                fx.counters.runs_finished += 1;
                self.release(engine, k, i, fx);
                self.fail(engine, k, i, &reason, fx);
            }
            RunStatus::Killed => {
                t.finished_at = u.time_ms;
                self.release(engine, k, i, fx);
                self.transition(k, i, S::Killed, Some("killed on its host"), fx);
                if self.jobs[&k].plan.kind.keeps_running() && !self.jobs[&k].kill_requested {
                    // Not by us: a service keeps running.
                    self.new_run(k, i, fx);
                }
            }
            RunStatus::Lost(reason) => {
                t.finished_at = u.time_ms;
                self.release(engine, k, i, fx);
                self.transition(k, i, S::Lost, Some(&reason), fx);
                self.restart_after_loss(engine, k, i, fx);
            }
        }
    }

    /// The host reports that the held run of instance `i` ended at
    /// `time_ms` (by its clock): that is when the run ended, not when it
    /// was told to stop (a deregistration delay and the grace period lie
    /// between), if it is still the instance's current run (a held run's
    /// instance starts no other run until then; an instance scaled away
    /// and added back has another launch).
    ///
    /// A preempted batch run that the host says exited 0 by itself (it
    /// finished before the kill reached it) keeps its result: SUCCEEDED,
    /// not run again — work that is done is not done twice.
    pub(super) fn held_run_ended(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        time_ms: u64,
        exited_0: bool,
        fx: &mut Effects,
    ) {
        let Some(held) = self.held.get(&(k, i)).map(|h| (h.launch, h.preempted)) else {
            return;
        };
        let (launch, preempted) = held;
        let executor = self.is_executor(k, i);
        let mut finished_itself = false;
        if let Some(job) = self.jobs.get_mut(&k)
            && let Some(t) = job.tasks.get_mut(i as usize)
            && t.launch == launch
        {
            if time_ms > 0 {
                t.finished_at = time_ms;
            }
            finished_itself = exited_0
                && preempted
                && t.state == S::Preempted
                && job.plan.kind == JobKind::Batch
                && job.plan.gang <= 1
                && !job.kill_requested
                && !executor;
            if finished_itself {
                t.exit_code = 0;
                t.gave_way = false;
            }
        }
        if finished_itself {
            if let Some(h) = self.held.get_mut(&(k, i)) {
                h.restart = false;
            }
            self.transition(
                k,
                i,
                S::Succeeded,
                Some("exited 0 before its preemption reached it: its result stands"),
                fx,
            );
        }
        self.confirm_end(engine, k, i, fx);
    }

    /// A new run of an instance whose run was lost or preempted (not its
    /// fault: no failure counted); its gang restarts with it.
    pub(super) fn restart_after_loss(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        fx: &mut Effects,
    ) {
        if self.is_executor(k, i) {
            // An executor runs once: a new instance replaces it.
            self.retire_executor(k, i, fx);
            return;
        }
        // A preempted member's mates are preempted with it: they get its
        // notice (time to checkpoint) and their lost work is counted.
        let preempted = self.jobs[&k].tasks[i as usize].state == S::Preempted;
        // An elastic gang goes on without it, if it still may.
        let shrinks = self.elastic_shrinks(k, i);
        self.new_run(k, i, fx);
        if !shrinks {
            self.stop_gang_as(engine, k, i, true, preempted, fx);
        }
    }

    /// A service's run ended by itself (any exit code): it starts again
    /// after a back-off, until the job is killed. A run that lasted at least
    /// the longest back-off starts the back-off over.
    fn service_exited(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        code: i32,
        fx: &mut Effects,
    ) {
        let reason = format!("service exited with code {code}");
        if code == 0 {
            self.transition(k, i, S::Succeeded, Some(&reason), fx);
        } else {
            self.transition(k, i, S::Failed, Some(&reason), fx);
        }
        self.back_off(engine, k, i, &reason, fx);
    }

    /// The current run failed: back off and retry, or give up.
    pub(super) fn fail(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        reason: &str,
        fx: &mut Effects,
    ) {
        self.transition(k, i, S::Failed, Some(reason), fx);
        self.back_off(engine, k, i, reason, fx);
    }

    /// After a Failed (or a service's Succeeded) run: a back-off timer and
    /// then a new run, or the end for a batch task out of retries. The
    /// other members of its gang are stopped, to start again with it.
    fn back_off(&mut self, engine: &mut Engine, k: JobKey, i: u32, reason: &str, fx: &mut Effects) {
        let now = self.now;
        // Failures of an instance an update is moving are its retries: they
        // are never forgiven for having run long.
        let updating = self.in_update_batch(k, i);
        let job = self.job_mut(k);
        let mut policy = job.template(i).restart;
        let service = job.plan.kind.keeps_running();
        if !service {
            // A batch instance tolerates its job's current failures: an
            // edit (`JobService.Edit`) changes them also for the runs that
            // were on hosts then (which keep their config's limit).
            policy.max_failures = job.plan.template(i).restart.max_failures;
        }
        let kill = job.kill_requested;
        let t = &mut job.tasks[i as usize];
        if service
            && !updating
            && t.started_at > 0
            && t.finished_at.saturating_sub(t.started_at) >= policy.max_backoff_ms
        {
            // It ran fine for a while: not a crash loop.
            t.failures = 0;
        }
        t.failures += 1;
        let gives_up = !service && t.failures > policy.max_failures;
        if kill || gives_up {
            if gives_up {
                self.stop_gang(engine, k, i, false, fx);
            }
            return;
        }
        let at = now.saturating_add(policy.backoff(t.failures));
        let run = RunRef {
            job: k,
            instance: i,
            run: t.run,
            launch: t.launch,
        };
        self.timers.push(Reverse((at, TimerKind::Backoff, run)));
        self.transition(k, i, S::Backoff, Some(reason), fx);
        if !self.elastic_shrinks(k, i) {
            self.stop_gang(engine, k, i, true, fx);
        }
    }

    /// Stops the other running members of instance `i`'s gang (instances
    /// are queued in gangs of `gang` consecutive waiting instances, so its
    /// members are the instances placed with it: same engine gang). With
    /// `restart`, they start again with it as one gang.
    pub(super) fn stop_gang(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        restart: bool,
        fx: &mut Effects,
    ) {
        self.stop_gang_as(engine, k, i, restart, false, fx);
    }

    /// [`Lifecycle::stop_gang`]; with `preempted` (member `i` was
    /// preempted) the others end preempted too, each with its own notice
    /// and lost work, and start again with it.
    fn stop_gang_as(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        restart: bool,
        preempted: bool,
        fx: &mut Effects,
    ) {
        let job = &self.jobs[&k];
        if job.plan.gang <= 1 || job.kill_requested {
            return;
        }
        let Some(gang) = job.tasks[i as usize].gang else {
            return;
        };
        let mates: Vec<u32> = job.instances_where(|t| t.gang == Some(gang) && t.state.in_engine());
        let reason = if preempted {
            format!("gang member {i} preempted: the gang starts again as one")
        } else if restart {
            format!("gang member {i} ended: the gang starts again as one")
        } else {
            format!("gang member {i} failed for good")
        };
        let to = if preempted { S::Preempted } else { S::Killed };
        for m in mates {
            if m == i {
                continue;
            }
            if self.end_run(engine, k, m, to, &reason, fx) && restart {
                self.new_run(k, m, fx);
            }
        }
    }

    pub(super) fn fire_timers(&mut self, engine: &mut Engine, fx: &mut Effects) {
        while let Some(&Reverse((at, kind, run))) = self.timers.peek() {
            if at > self.now {
                break;
            }
            self.timers.pop();
            let Some(job) = self.jobs.get(&run.job) else {
                continue;
            };
            let Some(t) = job.tasks.get(run.instance as usize) else {
                continue;
            };
            if t.run != run.run || t.launch != run.launch {
                continue;
            }
            match kind {
                TimerKind::Backoff if t.state == S::Backoff => {
                    self.new_run(run.job, run.instance, fx);
                }
                TimerKind::Deadline if t.state == S::Running => {
                    let limit = job.plan_of(t.config).max_running_time_ms;
                    let reason = format!("ran longer than max_running_time_ms {limit}");
                    self.stop_on_host(run.job, run.instance, None, fx);
                    let now = self.now;
                    self.job_mut(run.job).tasks[run.instance as usize].finished_at = now;
                    // A failure like any other: the restart policy applies.
                    self.fail(engine, run.job, run.instance, &reason, fx);
                }
                _ => {}
            }
        }
    }

    /// Batch jobs whose controller task (instance 0) ended for good in this
    /// step: their other instances are stopped (killed, as by a job kill,
    /// though the job is not killed: it ends as its controller did). Not
    /// again later: an instance restarted after its controller ended runs.
    pub(super) fn stop_after_controllers(&mut self, engine: &mut Engine, fx: &mut Effects) {
        if self.controller_ended.is_empty() {
            return;
        }
        let mut ended: Vec<JobKey> = self.controller_ended.drain().collect();
        ended.sort_unstable();
        for k in ended {
            let Some(job) = self.jobs.get(&k) else {
                continue;
            };
            let Some(controller) = job.tasks.first().map(|t| t.state) else {
                continue;
            };
            if job.kill_requested || !controller.is_terminal() {
                // Killed as a whole already, or backing off to run again.
                continue;
            }
            let reason = format!(
                "the job's controller task (instance 0) {}",
                controller.name()
            );
            let others = job.instances_where(|t| !t.state.is_terminal());
            for i in others {
                self.end_run(engine, k, i, S::Killed, &reason, fx);
            }
        }
    }

    /// Job states from their counts, for jobs changed in this step.
    pub(super) fn derive_job_states(&mut self, fx: &mut Effects) {
        let mut seen: Vec<JobKey> = self.dirty_jobs.drain().collect();
        seen.sort_unstable();
        for k in seen {
            let Some(job) = self.jobs.get_mut(&k) else {
                continue;
            };
            fx.rows.push(RowKey::Job(k));
            let new = derive(job);
            if new != job.state {
                let old = (job.state, job.completed_at);
                job.state = new;
                job.completed_at = if new.is_terminal() { self.now } else { 0 };
                let now = (new, job.completed_at);
                self.revision += 1;
                fx.events.push(Event {
                    revision: self.revision,
                    time_ms: self.now,
                    kind: EventKind::Job {
                        job: job.id.clone(),
                        state: new,
                        deleted: false,
                        reason: "".into(),
                    },
                });
                self.note_job_state(k, old, now);
                // Jobs waiting for it may go, or never will.
                self.after_dirty |= new.is_terminal();
            }
        }
    }
}

/// A job's state from its counts and holds.
pub(super) fn derive(job: &Job) -> JobState {
    let c = &job.counts;
    let n = job.tasks.len() as u32;
    let terminal = c[S::Succeeded as usize] + c[S::Failed as usize] + c[S::Killed as usize];
    if job.plan.schedule.is_some() && !job.kill_requested {
        // A cron job lives until it is killed; its ticks' jobs run.
        return JobState::Running;
    }
    if job.plan.kind == JobKind::Daemon && !job.kill_requested {
        // A daemon job never ends by itself: with no matching host it has
        // nothing to run yet.
        return if c[S::Running as usize] > 0 || job.started {
            JobState::Running
        } else {
            JobState::Pending
        };
    }
    if job.plan.kind == JobKind::Application && !job.kill_requested && !job.app.closed {
        // An application lives until it unregisters (or its driver ends),
        // with or without executors.
        return if c[S::Running as usize] > 0 || job.started {
            JobState::Running
        } else {
            JobState::Pending
        };
    }
    if terminal == n && job.held > 0 {
        // Ended in our books; a host still has to confirm.
        if job.kill_requested {
            JobState::Killing
        } else {
            JobState::Running
        }
    } else if terminal == n {
        if job.kill_requested {
            JobState::Killed
        } else if job.plan.has_controller_instance() {
            // Its controller's end is the job's (as in Peloton): the others
            // may have failed, or been stopped because it ended.
            match job.tasks[0].state {
                S::Failed => JobState::Failed,
                S::Killed => JobState::Killed,
                _ => JobState::Succeeded,
            }
        } else if job.plan.kind == JobKind::Application {
            // Unregistered: its driver's end is the application's (its
            // executors were stopped on purpose).
            let driver = job.plan.app.is_some_and(|a| a.driver_in_job);
            match job.tasks.first().map(|t| t.state) {
                Some(S::Failed) if driver => JobState::Failed,
                Some(S::Killed) if driver => JobState::Killed,
                _ => JobState::Succeeded,
            }
        } else if c[S::Failed as usize] > 0 {
            JobState::Failed
        } else if job.plan.elastic_min > 0 && c[S::Succeeded as usize] > 0 {
            // An elastic gang that finished: the instances that never
            // joined were not needed.
            JobState::Succeeded
        } else if c[S::Killed as usize] > 0 {
            JobState::Killed
        } else {
            JobState::Succeeded
        }
    } else if job.kill_requested {
        JobState::Killing
    } else if c[S::Running as usize] > 0 || (job.plan.kind.keeps_running() && job.started) {
        // A service that has run stays RUNNING while instances restart.
        JobState::Running
    } else if c[S::Initialized as usize] == n - terminal && !job.waits_for_jobs {
        // (One waiting for other jobs is pending, as in Slurm.)
        JobState::Initialized
    } else {
        JobState::Pending
    }
}
