//! One scheduling engine: pools, admission, hosts, tasks and placement tied
//! into a cycle. The gateway's loop thread owns an `Engine`, submits work,
//! reports hosts and finished tasks, and calls [`Engine::cycle`] at its own
//! pace; everything here is synchronous and deterministic.
//!
//! A cycle: capacity = what up hosts offer, plus what tasks hold on hosts
//! that take no new work (draining, or down with tasks still on them: an
//! agent away but not yet declared lost); slack = capacity minus what
//! non-revocable tasks hold (idle now, usable by revocable work until its
//! owners need it); entitlement from demand; admission; placement of every
//! admitted task still without a host; inter-pool victims for pools now
//! over their entitlement (the caller preempts them).

use crate::admission::{
    AdmissionError, AdmissionResult, Admitted, Blocked, PendingTask, TaskClass, TaskFlags, TaskId,
};
use crate::constraint::{ConstraintError, ConstraintTable};
use crate::host::{HostArena, HostLimits, HostState};
use crate::manager::{ResourceManager, ResourceManagerConfig};
use crate::placement::{Placed, PlacementConfig, PlacementResult, Placer, Unplaced};
use crate::pool::PoolId;
use crate::preemption::{Victim, inter_pool_victims};
use crate::resources::{Dim, Resources};
use crate::task::{
    NO_GANG, Strategy, TaskArena, TaskError, TaskHandle, TaskSpec, TaskState, flags,
};

/// Bounds and options of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineConfig {
    /// Pools, queues and the entitlement thread pool.
    pub resources: ResourceManagerConfig,
    /// Hosts.
    pub hosts: HostLimits,
    /// Placement options.
    pub placement: PlacementConfig,
    /// Reservations for blocked heads and backfill behind them.
    pub backfill: crate::backfill::BackfillConfig,
}

/// A task to submit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewTask {
    /// The caller's job number.
    pub job: u32,
    /// Instance within the job.
    pub instance: u32,
    /// Its leaf pool.
    pub pool: PoolId,
    /// Priority (higher first).
    pub priority: u32,
    /// Resources.
    pub request: Resources,
    /// Dynamic ports.
    pub ports: u16,
    /// Preemptible / controller / revocable.
    pub flags: TaskFlags,
    /// Constraint text ("" for none).
    pub constraint: String,
    /// Placement strategy.
    pub strategy: Strategy,
    /// At most this many per host of `limit_key` (0 = no limit).
    pub max_per_host: u16,
    /// What the per-host limit counts (the job by default).
    pub limit_key: u32,
    /// The only host the task may be placed on (its volume's, a daemon's
    /// host); a placement input like the constraint. Resources reserved
    /// for the task's (job, instance) on that host are its to use.
    pub desired_host: Option<crate::host::HostId>,
    /// A daemon (see [`flags::DAEMON`]): with a desired host, placed before
    /// other work and may evict preemptible non-daemon work there.
    pub daemon: bool,
    /// How long it is expected to run once placed, in ms (0: unknown):
    /// declared, learned or its time limit (the caller's estimate).
    /// Backfill lets it start ahead of a blocked head only if it is known
    /// to end before the head's reservation; forecasts end it there.
    pub runtime_ms: u64,
}

/// Why a submission or report was refused (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Admission refused it.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The constraint does not compile.
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    /// The task arena refused it.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// A field of the task is invalid.
    #[error("invalid task: {field}: {problem}")]
    InvalidTask {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

/// What one cycle decided: the admission and placement outputs themselves
/// (kept, not copied, between cycles) and the victims.
#[derive(Clone, Debug, Default)]
pub struct CycleReport {
    /// What admission decided.
    pub admission: AdmissionResult,
    /// What placement decided (reasons of unplaced tasks included).
    pub placement: PlacementResult,
    /// Tasks to preempt so that pools return within their entitlements.
    pub victims: Vec<Victim>,
    /// Hosts held for the blocked heads of queues, earliest first (see
    /// [`crate::backfill`]).
    pub start_reservations: Vec<crate::backfill::StartReservation>,
}

impl CycleReport {
    /// Tasks admitted in this cycle.
    pub fn admitted(&self) -> usize {
        self.admission.admitted.len()
    }

    /// Placements made in this cycle.
    pub fn placed(&self) -> &[Placed] {
        &self.placement.placed
    }

    /// Admitted tasks still without a host (see `placement.reason_of`).
    pub fn unplaced(&self) -> &[Unplaced] {
        &self.placement.unplaced
    }

    /// Queues that stopped admitting, with why.
    pub fn blocked(&self) -> &[Blocked] {
        &self.admission.blocked
    }
}

/// The request checks every new task passes (queued or adopted).
fn check_request(t: &NewTask) -> Result<(), EngineError> {
    crate::host::validate_gpu_request(t.request[Dim::Gpu]).map_err(|problem| {
        EngineError::InvalidTask {
            field: "request.gpu",
            problem,
        }
    })?;
    if t.request[Dim::Cpu] == 0 && t.request[Dim::Memory] == 0 {
        return Err(EngineError::InvalidTask {
            field: "request",
            problem: "a task must request some cpu or memory".into(),
        });
    }
    if t.runtime_ms > MAX_RUNTIME_MS {
        return Err(EngineError::InvalidTask {
            field: "runtime_ms",
            problem: format!(
                "{} ms is over the bound of {MAX_RUNTIME_MS} ms (100 years)",
                t.runtime_ms
            ),
        });
    }
    Ok(())
}

/// Bound on a task's expected runtime (100 years, in ms).
pub const MAX_RUNTIME_MS: u64 = 100 * 365 * 24 * 3_600_000;

/// The task arena's record of a new task.
fn task_spec(t: &NewTask, gang: u32, constraint: u32) -> TaskSpec {
    let mut bits = 0;
    if t.flags.preemptible {
        bits |= flags::PREEMPTIBLE;
    }
    if t.flags.revocable {
        bits |= flags::REVOCABLE;
    }
    if t.flags.controller {
        bits |= flags::CONTROLLER;
    }
    if t.daemon {
        bits |= flags::DAEMON;
    }
    TaskSpec {
        job: t.job,
        instance: t.instance,
        pool: t.pool.idx() as u32,
        priority: t.priority,
        request: t.request,
        ports: t.ports,
        flags: bits,
        gang,
        constraint,
        strategy: t.strategy,
        max_per_host: t.max_per_host,
        limit_key: t.limit_key,
        desired_host: t
            .desired_host
            .map_or(crate::task::NO_HOST, |h| h.idx() as u32),
        runtime_ms: t.runtime_ms,
    }
}

/// Pools, admission, hosts, tasks and placement.
#[derive(Debug)]
pub struct Engine {
    rm: ResourceManager,
    hosts: HostArena,
    tasks: TaskArena,
    constraints: ConstraintTable,
    placer: Placer,
    /// Admitted tasks without a host yet, in admission order. Tasks that
    /// ended meanwhile are dropped at the next cycle (not searched for one
    /// by one: ending a large job would be quadratic).
    waiting: Vec<TaskHandle>,
    /// When the last cycle ran (its fences hold until the next).
    last_cycle_ms: u64,
    /// Parking (a forecast's fork, see [`Engine::set_parking`]): admitted
    /// tasks that found no host in the last cycle, kept out of placement
    /// until a cycle at another time, a task's end or other start
    /// reservations; and what they were last tried under.
    parking: bool,
    parked: Vec<TaskHandle>,
    parked_under: (u64, Vec<(u64, u64, Vec<u32>)>),
    /// Queued gangs by task, to withdraw them.
    queued: QueuedIndex,
    queued_members: rustc_hash::FxHashMap<crate::admission::PendingId, Vec<TaskHandle>>,
    next_gang: u32,
    report: CycleReport,
    /// Resources held on hosts for instances without a task there.
    reservations: crate::placement::Reservations,
    backfill: crate::backfill::BackfillConfig,
    /// The placed tasks' expected ends, for reservations.
    ends: crate::backfill::EndIndex,
    /// Reservations as last worked out, by (pool slot, queue, head's
    /// arrival number): only those of this cycle's blocked heads are kept.
    kept: rustc_hash::FxHashMap<(usize, TaskClass, u64), crate::backfill::Kept>,
}

/// Queued tasks' admission entries by task slot: a column written in
/// order as tasks are queued, where a hash map took a cache miss per task.
/// Each entry keeps its task's handle, so a slot reused by another task
/// does not match.
#[derive(Debug, Default)]
struct QueuedIndex {
    by_slot: Vec<Option<(TaskHandle, crate::admission::PendingId)>>,
}

impl QueuedIndex {
    fn get(&self, task: TaskHandle) -> Option<&(TaskHandle, crate::admission::PendingId)> {
        self.by_slot
            .get(task.idx())
            .and_then(Option::as_ref)
            .filter(|(h, _)| *h == task)
    }

    fn insert(&mut self, task: TaskHandle, pending: crate::admission::PendingId) {
        let i = task.idx();
        if i >= self.by_slot.len() {
            self.by_slot.resize(i + 1, None);
        }
        self.by_slot[i] = Some((task, pending));
    }

    fn remove(&mut self, task: TaskHandle) -> Option<crate::admission::PendingId> {
        let entry = self.by_slot.get_mut(task.idx())?;
        match entry {
            Some((h, p)) if *h == task => {
                let p = *p;
                *entry = None;
                Some(p)
            }
            _ => None,
        }
    }

    /// Room for slots up to `slots`.
    fn reserve(&mut self, slots: usize) {
        self.by_slot
            .reserve(slots.saturating_sub(self.by_slot.len()));
    }
}

impl Engine {
    /// An engine with only the root pool and no hosts.
    pub fn new(config: EngineConfig) -> Self {
        let max_tasks = config.resources.admission.max_queued_total.max(1)
            + crate::task::DEFAULT_MAX_TASKS.min(10_000_000);
        // One pool of threads for the whole engine: entitlement, admission
        // and placement never run at the same time.
        let rm = ResourceManager::new(config.resources);
        let placer = Placer::new(config.placement).with_pool(rm.thread_pool());
        Engine {
            rm,
            hosts: HostArena::new(config.hosts),
            tasks: TaskArena::new(max_tasks.min(u32::MAX as usize - 1)),
            constraints: ConstraintTable::new(),
            placer,
            waiting: Vec::new(),
            last_cycle_ms: 0,
            parking: false,
            parked: Vec::new(),
            parked_under: (0, Vec::new()),
            queued: Default::default(),
            queued_members: Default::default(),
            next_gang: 0,
            report: CycleReport::default(),
            reservations: Default::default(),
            backfill: config.backfill,
            ends: Default::default(),
            kept: Default::default(),
        }
    }

    /// A copy of the whole engine to simulate on (a forecast, a plan):
    /// what it decides from here is what this engine would decide, and
    /// nothing done to it touches this one. It shares this engine's thread
    /// pool; caches (shapes, the entitlement plan) are built again, and
    /// the last cycle's report is not copied.
    pub fn fork(&self) -> Engine {
        Engine {
            rm: self.rm.fork(),
            hosts: self.hosts.fork(),
            tasks: self.tasks.clone(),
            constraints: self.constraints.clone(),
            placer: self.placer.fork(),
            waiting: self.parked.iter().chain(&self.waiting).copied().collect(),
            last_cycle_ms: 0,
            parking: false,
            parked: Vec::new(),
            parked_under: (0, Vec::new()),
            queued: QueuedIndex {
                by_slot: self.queued.by_slot.clone(),
            },
            queued_members: self.queued_members.clone(),
            next_gang: self.next_gang,
            report: CycleReport::default(),
            reservations: self.reservations.clone(),
            backfill: self.backfill,
            ends: self.ends.clone(),
            kept: self.kept.clone(),
        }
    }

    /// Moves placed tasks between their slots so that `order`'s take them
    /// in ascending order ([`TaskArena::renumber_placed`]); returns their
    /// new handles. For a forecast's fork, whose callers see only waiting
    /// tasks' handles (which do not change).
    pub(crate) fn renumber_placed(
        &mut self,
        order: &[TaskHandle],
    ) -> Result<Vec<TaskHandle>, crate::task::TaskError> {
        self.tasks.renumber_placed(order)
    }

    /// How long a reservation holds before it is worked out again (see
    /// [`crate::backfill::BackfillConfig::refresh_ms`]). A forecast's fork
    /// keeps them until their time: in it, running tasks end exactly at
    /// their estimates.
    pub fn set_backfill_refresh(&mut self, refresh_ms: u64) {
        self.backfill.refresh_ms = refresh_ms;
    }

    /// Parks admitted tasks that find no host (off by default), for a fork
    /// driven only by [`Engine::cycle_with`] and [`Engine::finish`] that
    /// does not act on victims (a forecast's): they are not tried again
    /// until a cycle at another time, after a task ended, or under other
    /// start reservations. Between those, placement only takes room, so
    /// they would find none: what is placed is unchanged, and a step's
    /// later cycles try only what they admit. Parked tasks are not in
    /// [`Engine::waiting_tasks`] nor in eviction plans.
    pub fn set_parking(&mut self, on: bool) {
        self.parking = on;
        if !on {
            self.unpark();
        }
    }

    /// Parked tasks back ahead of the waiting ones (they were admitted
    /// first).
    fn unpark(&mut self) {
        if !self.parked.is_empty() {
            let mut parked = std::mem::take(&mut self.parked);
            parked.append(&mut self.waiting);
            self.waiting = parked;
        }
    }

    /// Whether placement says why tasks stay unplaced (see
    /// [`Placer::set_reasons`]); a forecast's fork does without.
    pub fn set_placement_reasons(&mut self, on: bool) {
        self.placer.set_reasons(on);
    }

    /// Pools and admission.
    pub fn resources(&self) -> &ResourceManager {
        &self.rm
    }

    /// Pools and admission, to create and change pools.
    pub fn resources_mut(&mut self) -> &mut ResourceManager {
        &mut self.rm
    }

    /// Hosts.
    pub fn hosts(&self) -> &HostArena {
        &self.hosts
    }

    /// Hosts, to register, update and drain them.
    pub fn hosts_mut(&mut self) -> &mut HostArena {
        &mut self.hosts
    }

    /// Tasks.
    pub fn tasks(&self) -> &TaskArena {
        &self.tasks
    }

    /// Compiled constraints.
    pub fn constraints(&self) -> &ConstraintTable {
        &self.constraints
    }

    /// Admitted tasks without a host, in the order placement tries them
    /// (tasks that ended since the last cycle may still be listed).
    pub fn waiting_tasks(&self) -> &[TaskHandle] {
        &self.waiting
    }

    /// What the last [`Engine::cycle`] decided.
    pub fn report(&self) -> &CycleReport {
        &self.report
    }

    /// Submits a gang (one task is a gang of one): validated whole, then
    /// queued as one admission entry. On error nothing changes.
    pub fn submit(&mut self, gang: &[NewTask]) -> Result<Vec<TaskHandle>, EngineError> {
        if let [one] = gang {
            return Ok(vec![self.submit_one(one)?]);
        }
        let Some(first) = gang.first() else {
            return Err(EngineError::InvalidTask {
                field: "tasks",
                problem: "nothing to submit".into(),
            });
        };
        for t in gang {
            if t.pool != first.pool || t.priority != first.priority || t.flags != first.flags {
                return Err(EngineError::InvalidTask {
                    field: "tasks",
                    problem: "members of a gang share pool, priority and flags".into(),
                });
            }
            check_request(t)?;
        }
        TaskClass::of(first.flags)?;
        for t in gang {
            self.check_desired_host(t)?;
        }
        let mut constraint_ids = Vec::with_capacity(gang.len());
        for t in gang {
            constraint_ids.push(
                self.constraints
                    .intern(&t.constraint, self.hosts.interner_mut())?,
            );
        }
        let gang_id = self.next_gang;
        self.next_gang = (self.next_gang + 1) % NO_GANG;
        let mut handles = Vec::with_capacity(gang.len());
        for (t, &constraint) in gang.iter().zip(&constraint_ids) {
            match self.tasks.add(&task_spec(t, gang_id, constraint)) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    for h in handles {
                        self.tasks.remove(h).expect("just added");
                    }
                    return Err(e.into());
                }
            }
        }
        let members: Vec<PendingTask> = handles
            .iter()
            .zip(gang)
            .map(|(h, t)| PendingTask {
                id: TaskId(h.to_u64()),
                request: t.request,
                runtime_ms: t.runtime_ms,
            })
            .collect();
        match self
            .rm
            .enqueue(first.pool, first.priority, first.flags, &members)
        {
            Ok(pending) => {
                for &h in &handles {
                    self.queued.insert(h, pending);
                }
                self.queued_members.insert(pending, handles.clone());
                Ok(handles)
            }
            Err(e) => {
                for h in handles {
                    self.tasks.remove(h).expect("just added");
                }
                Err(e.into())
            }
        }
    }

    /// Makes room for `additional` more queued tasks at once (a restart
    /// knows how many it will queue), rather than growing columns by
    /// doubling as they come.
    /// At most what the arena may still hold is reserved.
    pub fn reserve_tasks(&mut self, additional: usize) {
        let additional = additional.min(self.tasks.limit().saturating_sub(self.tasks.len()));
        self.tasks.reserve(additional);
        self.queued.reserve(self.tasks.n_slots() + additional);
    }

    /// Makes room in `pool`'s admission queue for `n` more tasks that are
    /// each a gang of one, with these flags.
    pub fn reserve_queue(&mut self, pool: PoolId, flags: TaskFlags, n: usize) {
        self.rm.reserve_queue(pool, flags, n);
    }

    /// Submits tasks that are each a gang of one, appending their handles
    /// to `out` in order: what calling [`Engine::submit`] once per task
    /// does, without a call's allocations (a restart queues a million
    /// instances this way). All are queued, or on error none is: the ones
    /// queued before the failing one are withdrawn again.
    pub fn submit_each(
        &mut self,
        tasks: &[NewTask],
        out: &mut Vec<TaskHandle>,
    ) -> Result<(), EngineError> {
        for t in tasks {
            check_request(t)?;
            TaskClass::of(t.flags)?;
            self.check_desired_host(t)?;
        }
        let start = out.len();
        out.reserve(tasks.len());
        for t in tasks {
            match self.queue_one(t) {
                Ok(h) => out.push(h),
                Err(e) => {
                    for h in out.drain(start..).rev() {
                        self.cancel(h).expect("just queued");
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// A gang of one: no gang number and no member list (its handle is its
    /// own list, see [`Engine::queued_gang`]).
    fn submit_one(&mut self, t: &NewTask) -> Result<TaskHandle, EngineError> {
        check_request(t)?;
        TaskClass::of(t.flags)?;
        self.check_desired_host(t)?;
        self.queue_one(t)
    }

    /// [`Engine::submit_one`] after its checks (done by the caller).
    fn queue_one(&mut self, t: &NewTask) -> Result<TaskHandle, EngineError> {
        let constraint = self
            .constraints
            .intern(&t.constraint, self.hosts.interner_mut())?;
        let h = self.tasks.add(&task_spec(t, NO_GANG, constraint))?;
        let member = PendingTask {
            id: TaskId(h.to_u64()),
            request: t.request,
            runtime_ms: t.runtime_ms,
        };
        match self
            .rm
            .enqueue(t.pool, t.priority, t.flags, std::slice::from_ref(&member))
        {
            Ok(pending) => {
                self.queued.insert(h, pending);
                Ok(h)
            }
            Err(e) => {
                self.tasks.remove(h).expect("just added");
                Err(e.into())
            }
        }
    }

    fn check_desired_host(&self, t: &NewTask) -> Result<(), EngineError> {
        match t.desired_host {
            Some(h) if !self.hosts.contains(h) => Err(EngineError::InvalidTask {
                field: "desired_host",
                problem: "not a live host".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Records a placed task's last checkpoint (when it last saved its
    /// work, [`TaskArena::set_checkpoint`]): among victims otherwise equal,
    /// preemption takes those that lose the least work.
    pub fn checkpoint(&mut self, handle: TaskHandle, at_ms: u64) -> Result<(), EngineError> {
        Ok(self.tasks.set_checkpoint(handle, at_ms)?)
    }

    /// Takes over a task that already runs on `host` (the service restarted
    /// and the host's agent reported the run): it is recorded as admitted
    /// in its pool and placed on the host, skipping the queue, entitlement
    /// and constraints. Refused, changing nothing, if the request is
    /// invalid or does not fit the host's free resources.
    pub fn adopt(
        &mut self,
        t: &NewTask,
        host: crate::host::HostId,
        now_ms: u64,
    ) -> Result<TaskHandle, EngineError> {
        check_request(t)?;
        self.check_live_host(host)?;
        let slot = host.idx();
        let reserved = match self.reservations.get(&(t.job, t.instance)) {
            Some(&(s, amount)) if s as usize == slot => Some(amount),
            _ => None,
        };
        if let Some(amount) = reserved {
            self.hosts.hand_over(slot, &amount);
        }
        let fits = self.hosts.fits(slot, &t.request, u32::from(t.ports));
        if let Some(amount) = reserved {
            self.hosts
                .reserve(slot, &amount)
                .expect("what was handed over is free");
        }
        if let Err(m) = fits {
            return Err(EngineError::InvalidTask {
                field: "request",
                problem: format!(
                    "does not fit the free resources of host {}: {m:?}",
                    self.hosts.name(host)
                ),
            });
        }
        let class = TaskClass::of(t.flags)?;
        self.rm
            .tree()
            .check(t.pool)
            .map_err(|e| EngineError::InvalidTask {
                field: "pool",
                problem: e.to_string(),
            })?;
        let constraint = self
            .constraints
            .intern(&t.constraint, self.hosts.interner_mut())?;
        let handle = self.tasks.add(&task_spec(t, NO_GANG, constraint))?;
        if let Some(amount) = reserved {
            self.hosts.hand_over(slot, &amount);
        }
        // Checked above: both succeed.
        self.rm
            .charge(&Admitted {
                task: TaskId(handle.to_u64()),
                pool: t.pool,
                class,
                controller: t.flags.controller,
                request: t.request,
            })
            .expect("pool and class checked");
        self.tasks
            .set_state(handle, TaskState::Admitted)
            .expect("just added");
        self.placer
            .place_on(
                &mut self.hosts,
                &mut self.tasks,
                handle,
                slot as u32,
                now_ms,
            )
            .expect("fit checked");
        self.ends
            .placed(&self.tasks.placed_view(handle).expect("just placed"));
        if let Some(amount) = reserved {
            crate::placement::keep_unused_reservation(
                &mut self.hosts,
                &mut self.reservations,
                (t.job, t.instance),
                slot as u32,
                amount,
                &t.request,
            );
        }
        Ok(handle)
    }

    /// Runs one cycle at time `now_ms`, inter-pool victims included; the
    /// report lives until the next.
    pub fn cycle(&mut self, now_ms: u64) -> &CycleReport {
        self.cycle_with(now_ms, true)
    }

    /// Runs one cycle at time `now_ms`; chooses inter-pool victims only if
    /// `victims` (a caller that would not act on them saves the scan).
    pub fn cycle_with(&mut self, now_ms: u64, victims: bool) -> &CycleReport {
        self.last_cycle_ms = now_ms;
        let capacity = self.entitled_capacity();
        // Reserved resources stay in the capacity pools are entitled to:
        // the instance a reservation is for must be admitted again in its
        // own pool when it restarts, and cannot be if its reservation were
        // no pool's. Others admitted meanwhile wait in placement, as on a
        // fragmented cluster.
        // Slack: what non-revocable tasks leave unallocated, plus what
        // they are allocated but do not use (what hosts lend).
        let slack = capacity
            .saturating_sub(&self.rm.total_allocation())
            .saturating_add(&self.hosts.total_reclaimable());
        self.rm.recompute_entitlement(capacity, slack);
        let gated = self.gate_gangs(now_ms);
        self.rm.admit(&mut self.report.admission);
        for &slot in &gated {
            self.rm.set_gate(slot, None);
        }
        self.reserve_and_backfill(now_ms);
        if self.parking {
            let under = (
                now_ms,
                self.report
                    .start_reservations
                    .iter()
                    .map(|r| (r.head.0, r.at_ms, r.hosts.clone()))
                    .collect(),
            );
            if under != self.parked_under {
                self.unpark();
                self.parked_under = under;
            }
        }
        for a in &self.report.admission.admitted {
            let handle = TaskHandle::from_u64(a.task.0);
            if let Some(pending) = self.queued.remove(handle) {
                self.queued_members.remove(&pending);
            }
            self.tasks
                .set_state(handle, TaskState::Admitted)
                .expect("admitted tasks are live");
            self.waiting.push(handle);
        }
        let tasks = &self.tasks;
        self.waiting
            .retain(|&t| tasks.state(t) == Ok(TaskState::Admitted));
        let batch_len = self.waiting.len().min(crate::placement::MAX_BATCH);
        // Only tasks placement tried are parked.
        let all_tried = batch_len == self.waiting.len();
        self.place_batch(batch_len, now_ms);
        for p in &self.report.placement.placed {
            let view = self.tasks.placed_view(p.task).expect("placed is live");
            self.ends.placed(&view);
        }
        let tasks = &self.tasks;
        self.waiting
            .retain(|&t| tasks.state(t) != Ok(TaskState::Placed));
        if self.parking && all_tried {
            self.parked.append(&mut self.waiting);
        }
        self.report.victims.clear();
        if victims {
            inter_pool_victims(&self.rm, &self.tasks, &mut self.report.victims);
        }
        &self.report
    }

    /// Gang heads that fit their pool's entitlement but not the hosts now
    /// wait in their queue this cycle (see [`crate::backfill`]); returns
    /// the pool slots whose gate was set, to clear after admission.
    fn gate_gangs(&mut self, now_ms: u64) -> Vec<usize> {
        let mut gated = Vec::new();
        if !self.backfill.enabled {
            return gated;
        }
        let mut looked = 0;
        'pools: for slot in self.rm.queued_slots() {
            if self.strict_order(slot) {
                continue;
            }
            for class in TaskClass::ALL {
                if class == TaskClass::Revocable {
                    continue;
                }
                let Some((seq, members, _)) = self.rm.head_entry(slot, class) else {
                    continue;
                };
                if members.len() < 2 {
                    continue;
                }
                if looked == self.backfill.max_reservations {
                    break 'pools;
                }
                looked += 1;
                // Its reservation still holds: it waits, without a look.
                if let Some(k) = self.kept.get(&(slot, class, seq))
                    && k.holds(now_ms, self.backfill.refresh_ms)
                {
                    self.rm.set_gate(slot, Some((seq, k.fit)));
                    gated.push(slot);
                    continue 'pools;
                }
                let n = members.len() as u64;
                let request = largest_request(members);
                let first = TaskHandle::from_u64(members[0].id.0);
                let Ok(spec) = self.tasks.spec(first) else {
                    continue;
                };
                if spec.desired_host != crate::task::NO_HOST {
                    continue;
                }
                let cap = per_host_cap(spec.max_per_host);
                let (fit, start) =
                    self.ends
                        .hosts_time(&self.hosts, &self.tasks, &request, cap, n, now_ms);
                if fit >= n {
                    continue;
                }
                // Admitted, it may evict lower-priority work of its pool.
                let may_evict = self
                    .ends
                    .min_preemptible_priority(&self.tasks, slot as u32)
                    .is_some_and(|p| p < spec.priority);
                if may_evict {
                    continue;
                }
                // Held back only with hosts reserved for it: one that may
                // never fit by the estimates (hosts down, work with no
                // estimate), or not within the horizon, is admitted and
                // waits in placement as before, not blocking its queue.
                let Some((at_ms, hosts)) = start else {
                    continue;
                };
                if at_ms - now_ms > self.backfill.horizon_ms {
                    continue;
                }
                self.kept.insert(
                    (slot, class, seq),
                    crate::backfill::Kept {
                        computed_at: now_ms,
                        at_ms,
                        hosts,
                        fit,
                    },
                );
                self.rm.set_gate(slot, Some((seq, fit)));
                gated.push(slot);
                continue 'pools;
            }
        }
        gated
    }

    /// Whether the pool in `slot` admits in strict order
    /// ([`PoolConfig::strict_order`]).
    fn strict_order(&self, slot: usize) -> bool {
        self.rm
            .tree()
            .lookup_slot(slot)
            .is_some_and(|id| self.rm.tree().config(id).strict_order)
    }

    /// Reserves hosts for the queues' blocked heads and admits, behind
    /// each, what ends before its reservation begins (see
    /// [`crate::backfill`]).
    fn reserve_and_backfill(&mut self, now_ms: u64) {
        self.report.start_reservations.clear();
        if !self.backfill.enabled {
            return;
        }
        // Gangs held back for hosts first (each has its reservation kept
        // from `gate_gangs`, within the same bound), then heads over their
        // entitlement; one head per pool, so that two reservations do not
        // both spend what its entitlement leaves beside them.
        let mut blocked: Vec<Blocked> = self
            .report
            .admission
            .blocked
            .iter()
            .filter(|b| {
                b.class != TaskClass::Revocable
                    && !self.strict_order(b.pool.idx())
                    && matches!(
                        b.kind,
                        crate::admission::BlockKind::Entitlement
                            | crate::admission::BlockKind::Hosts
                    )
            })
            .copied()
            .collect();
        blocked.sort_by_key(|b| b.kind != crate::admission::BlockKind::Hosts);
        let bound = self
            .backfill
            .max_reservations
            .min(crate::backfill::MAX_RESERVATIONS);
        let mut pools_seen: rustc_hash::FxHashSet<usize> = Default::default();
        let blocked: Vec<Blocked> = blocked
            .into_iter()
            .filter(|b| pools_seen.insert(b.pool.idx()))
            .take(bound)
            .collect();
        let mut seen = Vec::with_capacity(blocked.len());
        let largest: std::cell::Cell<Option<Resources>> = std::cell::Cell::new(None);
        for b in blocked {
            let slot = b.pool.idx();
            let Some((seq, members, total)) = self.rm.head_entry(slot, b.class) else {
                continue;
            };
            if members[0].id != b.head {
                continue;
            }
            let n = members.len() as u64;
            let request = largest_request(members);
            let Ok(spec) = self.tasks.spec(TaskHandle::from_u64(b.head.0)) else {
                continue;
            };
            if spec.desired_host != crate::task::NO_HOST {
                continue;
            }
            let (held, entitled) = self.rm.held_and_entitled(slot);
            let key = (slot, b.class, seq);
            seen.push(key);
            let (at_ms, hosts) = match self.kept.get(&key) {
                Some(k) if k.holds(now_ms, self.backfill.refresh_ms) => (k.at_ms, k.hosts.clone()),
                _ => {
                    let entitled_at = if b.kind == crate::admission::BlockKind::Hosts {
                        now_ms
                    } else {
                        let deficit = held.saturating_add(&total).saturating_sub(&entitled);
                        self.ends.entitlement_time(slot as u32, deficit, now_ms)
                    };
                    if entitled_at == u64::MAX || entitled_at - now_ms > self.backfill.horizon_ms {
                        continue;
                    }
                    // A gang gets hosts; a single task waits for its entitlement
                    // only (it fits some host then, as a rule) and holds none.
                    let (at_ms, hosts) = if n > 1 {
                        let cap = per_host_cap(spec.max_per_host);
                        let (_, Some((hosts_at, hosts))) = self.ends.hosts_time(
                            &self.hosts,
                            &self.tasks,
                            &request,
                            cap,
                            n,
                            now_ms,
                        ) else {
                            continue;
                        };
                        (entitled_at.max(hosts_at), hosts)
                    } else {
                        (entitled_at, Vec::new())
                    };
                    if at_ms - now_ms > self.backfill.horizon_ms {
                        continue;
                    }
                    let fit = if b.kind == crate::admission::BlockKind::Hosts {
                        b.allocated
                    } else {
                        0
                    };
                    self.kept.insert(
                        key,
                        crate::backfill::Kept {
                            computed_at: now_ms,
                            at_ms,
                            hosts: hosts.clone(),
                            fit,
                        },
                    );
                    (at_ms, hosts)
                }
            };
            // What the pool's entitlement leaves beside the head when it
            // starts: work that runs past then may use it, off its hosts.
            let still_held = held.saturating_sub(&self.ends.released_by(slot as u32, at_ms));
            let extra = entitled.saturating_sub(&still_held).saturating_sub(&total);
            let hosts_arena = &self.hosts;
            // Per dimension, the most any up host has free (worked out
            // once a cycle, at the first entry that needs it): an entry
            // that does not fit it fits no host now. (One that fits it may
            // still wait for a host: a gang's tasks on several, or the
            // head's hosts fenced off.) Backfill also reads it to tell
            // whether a look like its last one that admitted nothing could
            // admit anything now.
            let largest = &largest;
            let most_free = || {
                let most = largest
                    .get()
                    .unwrap_or_else(|| crate::backfill::largest_free(hosts_arena));
                largest.set(Some(most));
                most
            };
            let mut fits_now =
                |members: &[PendingTask]| largest_request(members).fits_in(&most_free());
            self.rm.backfill(
                slot,
                b.class,
                seq,
                now_ms,
                at_ms,
                extra,
                &mut fits_now,
                &mut || most_free(),
                self.backfill.depth,
                &mut self.report.admission,
            );
            self.report
                .start_reservations
                .push(crate::backfill::StartReservation {
                    pool: b.pool,
                    class: b.class,
                    head: b.head,
                    n_tasks: n as u32,
                    at_ms,
                    hosts,
                });
        }
        self.report.start_reservations.sort_by_key(|r| r.at_ms);
        self.kept.retain(|k, _| seen.contains(k));
    }

    /// Places the first `batch_len` waiting tasks. While hosts lend what
    /// their non-revocable tasks do not use, revocable tasks are placed in
    /// a pass of their own against it (`HostArena::lend`), after the
    /// others. With start reservations, tasks keep off the hosts of the
    /// reservations they may delay (see [`Engine::set_fences`] and
    /// [`crate::backfill`]).
    fn place_batch(&mut self, batch_len: usize, now_ms: u64) {
        let waiting = std::mem::take(&mut self.waiting);
        let batch = &waiting[..batch_len];
        let fenced = self.has_fences();
        if fenced {
            self.set_fences(batch, now_ms);
        }
        place_split(
            &mut self.placer,
            &mut self.hosts,
            &mut self.tasks,
            &self.constraints,
            &mut self.reservations,
            batch,
            now_ms,
            &mut self.report.placement,
        );
        if fenced {
            self.placer.clear_fences();
        }
        self.waiting = waiting;
    }

    /// The fences of [`Engine::place_batch`] with start reservations. A task
    /// keeps off a reservation's hosts if it was submitted after the
    /// reservation's head (what came first is not held back by what came
    /// later), may run past the reservation's start and is not pinned to
    /// its host; a gang's members keep off the hosts any of them keeps off.
    /// Each task is kept off its hosts as a constraint would keep it
    /// ([`Placer::set_fences`], until the caller clears them): the hosts
    /// stay open to the rest, and lend to revocable work that need not keep
    /// off them.
    fn set_fences(&mut self, batch: &[TaskHandle], now_ms: u64) {
        let (fences, fence_of) = self.fences_of(batch, now_ms);
        self.placer.set_fences(fences, fence_of);
    }

    /// Whether the last cycle's start reservations hold hosts (a task may
    /// have to keep off them).
    fn has_fences(&self) -> bool {
        self.report
            .start_reservations
            .iter()
            .any(|r| !r.hosts.is_empty())
    }

    /// The fences of `batch` at `now_ms` (see [`Engine::set_fences`]): the
    /// hosts each fence keeps off, and each fenced task's fence.
    fn fences_of(
        &self,
        batch: &[TaskHandle],
        now_ms: u64,
    ) -> (Vec<Vec<u32>>, rustc_hash::FxHashMap<TaskHandle, u32>) {
        let res: Vec<(u64, u64)> = self
            .report
            .start_reservations
            .iter()
            .map(|r| {
                let head = TaskHandle::from_u64(r.head.0);
                (r.at_ms, self.tasks.arrival(head).unwrap_or(0))
            })
            .collect();
        let mut mask_of_gang: rustc_hash::FxHashMap<u32, u64> = Default::default();
        let masks: Vec<(u64, u32)> = batch
            .iter()
            .map(|&t| {
                let runtime = self.tasks.runtime_ms(t).unwrap_or(0);
                let end = crate::task::expected_end(now_ms, runtime, now_ms);
                let arrival = self.tasks.arrival(t).unwrap_or(0);
                let spec = self.tasks.spec(t).ok();
                // A task pinned to its host (a daemon, an instance on its
                // volume) has nowhere else to go: it is not fenced.
                let pinned = spec.is_some_and(|s| s.desired_host != crate::task::NO_HOST);
                let mut mask = 0u64;
                for (i, &(at, head_arrival)) in res.iter().enumerate() {
                    if !pinned && arrival > head_arrival && end > at {
                        mask |= 1 << i;
                    }
                }
                let gang = spec.map_or(NO_GANG, |s| s.gang);
                if gang != NO_GANG {
                    *mask_of_gang.entry(gang).or_insert(0) |= mask;
                }
                (mask, gang)
            })
            .collect();
        // One fence per distinct set of reservations kept off: the union
        // of their hosts.
        let mut fence_masks: Vec<u64> = Vec::new();
        let mut fence_of: rustc_hash::FxHashMap<TaskHandle, u32> = Default::default();
        for (&t, &(mask, gang)) in batch.iter().zip(&masks) {
            let mask = if gang == NO_GANG {
                mask
            } else {
                mask_of_gang[&gang]
            };
            if mask == 0 {
                continue;
            }
            let i = match fence_masks.iter().position(|&m| m == mask) {
                Some(i) => i,
                None => {
                    fence_masks.push(mask);
                    fence_masks.len() - 1
                }
            };
            fence_of.insert(t, i as u32);
        }
        let fences: Vec<Vec<u32>> = fence_masks
            .iter()
            .map(|&mask| {
                let mut slots: Vec<u32> = self
                    .report
                    .start_reservations
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| mask & (1 << i) != 0)
                    .flat_map(|(_, r)| r.hosts.iter().copied())
                    .collect();
                slots.sort_unstable();
                slots.dedup();
                slots
            })
            .collect();
        (fences, fence_of)
    }

    /// Refuses a host that is not live.
    fn check_live_host(&self, host: crate::host::HostId) -> Result<(), EngineError> {
        if self.hosts.contains(host) {
            return Ok(());
        }
        Err(EngineError::InvalidTask {
            field: "host",
            problem: "not a live host".into(),
        })
    }

    /// What hosts lend revocable tasks (see [`HostArena::set_reclaimable`]).
    pub fn set_reclaimable(
        &mut self,
        host: crate::host::HostId,
        amount: Resources,
    ) -> Result<(), EngineError> {
        self.check_live_host(host)?;
        self.hosts.set_reclaimable(host.idx(), amount);
        Ok(())
    }

    /// The capacity pools are entitled to: what up hosts offer, plus what
    /// the tasks on hosts that take no new work hold there. A host that
    /// stops taking work (draining, or down while its tasks are still on
    /// it, as when its agent's session dropped and the host is not yet
    /// declared lost) keeps counting what its tasks use: withdrawing it
    /// would leave their pools over an entitlement that shrank under them,
    /// and preempt healthy tasks elsewhere for a host that only blinked.
    /// Its unused rest is not counted (no new work can go there).
    pub fn entitled_capacity(&self) -> Resources {
        let mut capacity = self.hosts.up_capacity();
        for state in [HostState::Draining, HostState::Down] {
            for slot in self.hosts.in_state(state).iter() {
                capacity.add_assign(&self.hosts.held(slot as usize));
            }
        }
        capacity
    }

    /// Eviction plans for admitted tasks still without a host after the last
    /// cycle (see [`crate::preemption::intra_pool_victims`]): per task, a
    /// host and the lower-priority preemptible tasks of its own pool whose
    /// removal makes it fit there. Appends to `out`.
    pub fn eviction_plans(&self, out: &mut Vec<(TaskHandle, u32, Vec<crate::preemption::Victim>)>) {
        let pending: Vec<TaskHandle> = self
            .waiting
            .iter()
            .copied()
            .filter(|&t| self.tasks.state(t) == Ok(TaskState::Admitted))
            .collect();
        if pending.is_empty() {
            return;
        }
        // A task kept off a reservation's hosts in placement evicts nothing
        // there: the room would not be its.
        let (fences, fence_of) = if self.has_fences() {
            self.fences_of(&pending, self.last_cycle_ms)
        } else {
            Default::default()
        };
        let keep_off = |t: TaskHandle| -> &[u32] {
            fence_of
                .get(&t)
                .map_or(&[], |&i| fences[i as usize].as_slice())
        };
        crate::preemption::intra_pool_victims_fenced(
            &self.placer,
            &self.hosts,
            &self.tasks,
            &self.constraints,
            &self.reservations,
            &pending,
            &keep_off,
            out,
        )
        .expect("admitted tasks are live");
    }

    /// A task ended (finished, failed, killed or preempted): its host and
    /// its pool get their resources back and the task is forgotten. A task
    /// still queued for admission is withdrawn with [`Engine::cancel`].
    pub fn finish(&mut self, task: TaskHandle) -> Result<(), EngineError> {
        let (pool_slot, task_flags, request) = self.tasks.pool_flags_request(task)?;
        let state = self.tasks.state(task)?;
        if state == TaskState::Pending {
            return Err(EngineError::InvalidTask {
                field: "task",
                problem: "still queued for admission: cancel it instead".into(),
            });
        }
        // An admitted task still without a host is dropped from `waiting`
        // at the next cycle. What ends may make room for parked tasks.
        self.unpark();
        if state == TaskState::Placed {
            self.ends.removed(&self.tasks.placed_view(task)?);
            self.placer
                .unplace(&mut self.hosts, &mut self.tasks, task)?;
        }
        let flags_of = TaskFlags {
            preemptible: task_flags & flags::PREEMPTIBLE != 0,
            controller: task_flags & flags::CONTROLLER != 0,
            revocable: task_flags & flags::REVOCABLE != 0,
        };
        let pool = self
            .rm
            .tree()
            .lookup_slot(pool_slot as usize)
            .expect("a task's pool is live");
        self.rm.release(&Admitted {
            task: TaskId(task.to_u64()),
            pool,
            class: TaskClass::of(flags_of)?,
            controller: flags_of.controller,
            request,
        })?;
        self.tasks.remove(task)?;
        Ok(())
    }

    /// The members of the queued gang `task` belongs to (empty if it is not
    /// queued for admission).
    pub fn queued_gang(&self, task: TaskHandle) -> &[TaskHandle] {
        match self.queued.get(task) {
            // A gang of one has no member list: it is its own.
            Some((h, p)) => self
                .queued_members
                .get(p)
                .map_or(std::slice::from_ref(h), |m| m.as_slice()),
            None => &[],
        }
    }

    /// Withdraws a task still queued for admission, with the rest of its
    /// gang. Returns the tasks withdrawn.
    pub fn cancel(&mut self, task: TaskHandle) -> Result<Vec<TaskHandle>, EngineError> {
        let Some(&(_, pending)) = self.queued.get(task) else {
            return Err(EngineError::InvalidTask {
                field: "task",
                problem: "not queued for admission".into(),
            });
        };
        self.rm.cancel(pending)?;
        let members = self
            .queued_members
            .remove(&pending)
            .unwrap_or_else(|| vec![task]);
        for &m in &members {
            self.queued.remove(m);
            self.tasks.remove(m)?;
        }
        Ok(members)
    }

    /// Live hosts a task with this constraint and request may use: up
    /// hosts that pass the constraint and the host rules of placement
    /// (exclusive hosts, GPU hosts kept for GPU work), and hosts not up
    /// that match the constraint. Daemon jobs follow this set.
    pub fn hosts_matching(
        &mut self,
        constraint: &str,
        request: Resources,
    ) -> Result<roaring::RoaringBitmap, EngineError> {
        let id = self
            .constraints
            .intern(constraint, self.hosts.interner_mut())?;
        let c = self.constraints.get(id).expect("just interned");
        let matching = c.evaluate(&self.hosts) & self.hosts.live_hosts();
        let not_up = &matching - self.hosts.in_state(HostState::Up);
        let allowed_up = self
            .placer
            .apply_host_rules(&self.hosts, c, matching, request, false);
        Ok(allowed_up | not_up)
    }

    /// Holds `amount` (cpu, memory, disk; GPUs are never reserved) on
    /// `host` for the instance `(job, instance)`, replacing what was held
    /// for it before (anywhere). A task of that instance placed on that
    /// host later uses it first. Refused, changing nothing, if it does not
    /// fit the host's free resources (plus what the instance held there).
    pub fn set_reservation(
        &mut self,
        job: u32,
        instance: u32,
        host: crate::host::HostId,
        amount: Resources,
    ) -> Result<(), EngineError> {
        self.check_live_host(host)?;
        if amount[crate::resources::Dim::Gpu] > 0 {
            return Err(EngineError::InvalidTask {
                field: "reservation",
                problem: "GPUs cannot be reserved".into(),
            });
        }
        let old = self.reservations.remove(&(job, instance));
        if let Some((slot, held)) = old {
            self.hosts.unreserve(slot as usize, &held);
        }
        let slot = host.idx();
        match self.hosts.reserve(slot, &amount) {
            Ok(()) => {
                if !amount.is_zero() {
                    self.reservations
                        .insert((job, instance), (slot as u32, amount));
                }
                Ok(())
            }
            Err(m) => {
                if let Some((slot, held)) = old {
                    self.hosts.reserve_back(slot as usize, &held);
                    self.reservations.insert((job, instance), (slot, held));
                }
                Err(EngineError::InvalidTask {
                    field: "reservation",
                    problem: format!(
                        "{amount} does not fit the free resources of host {}: {m:?}",
                        self.hosts.name(host)
                    ),
                })
            }
        }
    }

    /// Gives back what is held for `(job, instance)`; returns it (host slot
    /// and amount) if anything was.
    pub fn clear_reservation(&mut self, job: u32, instance: u32) -> Option<(u32, Resources)> {
        let (slot, held) = self.reservations.remove(&(job, instance))?;
        self.hosts.unreserve(slot as usize, &held);
        Some((slot, held))
    }

    /// What is held for `(job, instance)`: host slot and amount.
    pub fn reservation(&self, job: u32, instance: u32) -> Option<(u32, Resources)> {
        self.reservations.get(&(job, instance)).copied()
    }

    /// Every reservation: ((job, instance), (host slot, amount)).
    pub fn reservations(&self) -> impl Iterator<Item = ((u32, u32), (u32, Resources))> + '_ {
        self.reservations.iter().map(|(&k, &v)| (k, v))
    }

    /// Panics if any part's invariants are broken.
    pub fn check_invariants(&self) {
        let mut reserved = vec![Resources::ZERO; self.hosts.n_slots()];
        for &(slot, amount) in self.reservations.values() {
            assert!(!amount.is_zero(), "empty reservations are not kept");
            reserved[slot as usize].add_assign(&amount);
        }
        for (slot, r) in reserved.iter().enumerate() {
            assert_eq!(
                *r,
                self.hosts.reserved(slot),
                "reserved on host slot {slot}"
            );
        }
        self.rm.check_invariants();
        self.hosts.check_invariants();
        self.tasks.check_invariants();
        crate::placement::check_host_accounting(&self.hosts, &self.tasks);
        self.ends.check_invariants(&self.tasks);
    }
}

/// Places `batch`: non-revocable tasks against the hosts' free resources,
/// then (while hosts lend what their non-revocable tasks do not use)
/// revocable ones in a pass of their own against it (`HostArena::lend`;
/// fenced tasks keep off their hosts there too, through their classes'
/// masks).
#[expect(
    clippy::too_many_arguments,
    reason = "the placement context, passed explicitly"
)]
fn place_split(
    placer: &mut Placer,
    hosts: &mut HostArena,
    tasks: &mut TaskArena,
    constraints: &ConstraintTable,
    reservations: &mut crate::placement::Reservations,
    batch: &[TaskHandle],
    now_ms: u64,
    out: &mut crate::placement::PlacementResult,
) {
    let revocable = |t: &TaskHandle| tasks.flags(*t).is_ok_and(|f| f & flags::REVOCABLE != 0);
    if hosts.total_reclaimable().is_zero() || !batch.iter().any(revocable) {
        placer
            .place_with(hosts, tasks, constraints, reservations, batch, now_ms, out)
            .expect("waiting tasks are live, admitted and unplaced");
        return;
    }
    let (borrowing, own): (Vec<TaskHandle>, Vec<TaskHandle>) =
        batch.iter().partition(|t| revocable(t));
    placer
        .place_with(hosts, tasks, constraints, reservations, &own, now_ms, out)
        .expect("waiting tasks are live, admitted and unplaced");
    let mut second = crate::placement::PlacementResult::default();
    let lent = hosts.lend();
    let placed = placer.place_with(
        hosts,
        tasks,
        constraints,
        reservations,
        &borrowing,
        now_ms,
        &mut second,
    );
    hosts.settle(lent);
    placed.expect("waiting tasks are live, admitted and unplaced");
    append_placement(out, &mut second);
}

/// Moves what `part` placed and left unplaced (with its reasons) to the
/// end of `out`.
fn append_placement(
    out: &mut crate::placement::PlacementResult,
    part: &mut crate::placement::PlacementResult,
) {
    let offset = out.reasons.len() as u32;
    out.placed.append(&mut part.placed);
    out.unplaced.extend(part.unplaced.drain(..).map(|mut u| {
        u.reason += offset;
        u
    }));
    out.reasons.append(&mut part.reasons);
}

/// The largest request of an entry's tasks, per dimension.
fn largest_request(members: &[PendingTask]) -> Resources {
    members
        .iter()
        .fold(Resources::ZERO, |r, m| r.max(&m.request))
}

/// A task's per-host limit as a cap on copies per host.
fn per_host_cap(max_per_host: u16) -> u64 {
    if max_per_host == 0 {
        u64::MAX
    } else {
        u64::from(max_per_host)
    }
}
