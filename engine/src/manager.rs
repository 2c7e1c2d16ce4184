//! The resource manager: the pool tree plus each pool's queues, allocation
//! and entitlement, and the batched cycle that ties them together.
//!
//! A cycle is `recompute_entitlement` (demand is read from the queues and
//! allocations) followed by `admit`. Both are plain synchronous calls with no
//! I/O; the gateway's loop thread owns the manager and calls them at its own
//! pace.

use rayon::prelude::*;

use crate::admission::{
    AdmissionError, AdmissionLimits, AdmissionResult, Admitted, Allocation, NeverAdmitted,
    PendingId, PendingTask, PoolCaps, PoolQueues, QueuedEntry, TaskClass, TaskFlags,
};
use crate::entitlement::{EntitlementCalculator, EntitlementInput, Entitlements};
use crate::pool::{PoolConfig, PoolError, PoolId, PoolTree, PoolTreeLimits};
use crate::resources::{Dim, MAX_AMOUNT, N_DIMS, Resources};

/// Below this many queued tasks, admission runs on the calling thread.
const PARALLEL_MIN_QUEUED: u64 = 4096;

/// Pools one admission task takes at least (rayon's `with_min_len`).
const ADMIT_POOLS_PER_TASK: usize = 4;

/// Below this many pool slots (inner and free ones too: what the parallel
/// iterator splits), admission runs on the calling thread: with fewer
/// than two tasks' worth nothing runs in parallel, and handing the one
/// task to the pool costs two thread wake-ups and its workers' idle spin
/// (a tenth of the server's CPU when one big job waits for slots).
const PARALLEL_MIN_POOLS: usize = 2 * ADMIT_POOLS_PER_TASK;

/// The caps admission enforces for the pool in `slot`, or `None` when it
/// has nothing queued (or the slot is free).
fn pool_caps(
    tree: &PoolTree,
    entitlements: &Entitlements,
    slot: usize,
    queue: &PoolQueues,
) -> Option<(PoolId, PoolCaps)> {
    if queue.n_queued_tasks() == 0 {
        return None;
    }
    let pool = tree.lookup_slot(slot)?;
    let config = tree.config(pool);
    // A pool created after the last recomputation reads as zero.
    let entitlement = entitlements.entitlement(slot);
    let slack_entitlement = entitlements.slack_entitlement(slot);
    let slack_cap = entitlements.slack_cap(slot);
    Some((
        pool,
        PoolCaps {
            entitlement,
            reservation: config.reservation(),
            controller: entitlement.percent(config.controller_limit_pct),
            slack_entitlement,
            slack_cap,
        },
    ))
}

/// Bounds and threading of a resource manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceManagerConfig {
    /// Bounds of the pool tree.
    pub pools: PoolTreeLimits,
    /// Bounds of the queues.
    pub admission: AdmissionLimits,
    /// Threads of the engine's own pool for parallel scans (1 = run on the
    /// calling thread). Results do not depend on it.
    pub threads: usize,
}

impl Default for ResourceManagerConfig {
    fn default() -> Self {
        ResourceManagerConfig {
            pools: PoolTreeLimits::default(),
            admission: AdmissionLimits::default(),
            threads: 1,
        }
    }
}

/// Live view of one pool's usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// What the pool holds, by class.
    pub allocation: Allocation,
    /// Summed requests of queued non-revocable tasks.
    pub queued: Resources,
    /// Summed requests of queued revocable tasks.
    pub queued_revocable: Resources,
    /// Queued tasks.
    pub n_queued: u64,
}

/// Pools, queues, allocation and entitlement.
#[derive(Debug)]
pub struct ResourceManager {
    config: ResourceManagerConfig,
    tree: PoolTree,
    /// Runtime state per pool slot (same index as the tree's slots).
    queues: Vec<PoolQueues>,
    n_queued_total: u64,
    next_seq: u64,
    calculator: EntitlementCalculator,
    input: EntitlementInput,
    entitlements: Entitlements,
    threads: Option<std::sync::Arc<rayon::ThreadPool>>,
}

impl ResourceManager {
    /// The engine's thread pool (none: one thread), shared with placement
    /// so the engine runs one pool.
    pub fn thread_pool(&self) -> Option<std::sync::Arc<rayon::ThreadPool>> {
        self.threads.clone()
    }

    /// A manager with only the root pool.
    pub fn new(config: ResourceManagerConfig) -> Self {
        let threads = (config.threads > 1).then(|| {
            std::sync::Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(config.threads)
                    .thread_name(|i| format!("peloton-engine-{i}"))
                    .build()
                    .expect("engine thread pool starts"),
            )
        });
        let tree = PoolTree::new(config.pools);
        let mut manager = ResourceManager {
            config,
            queues: vec![PoolQueues::default(); tree.n_slots()],
            tree,
            n_queued_total: 0,
            next_seq: 1,
            calculator: EntitlementCalculator::new(),
            input: EntitlementInput::default(),
            entitlements: Entitlements::default(),
            threads,
        };
        manager.recompute_entitlement(Resources::ZERO, Resources::ZERO);
        manager
    }

    /// A copy to simulate on (see [`crate::Engine::fork`]): the same tree,
    /// queues, allocation and entitlements, and the same thread pool; the
    /// entitlement plan is built again on first use.
    pub fn fork(&self) -> ResourceManager {
        ResourceManager {
            config: self.config,
            tree: self.tree.clone(),
            queues: self.queues.clone(),
            n_queued_total: self.n_queued_total,
            next_seq: self.next_seq,
            calculator: EntitlementCalculator::default(),
            input: self.input.clone(),
            entitlements: self.entitlements.clone(),
            threads: self.threads.clone(),
        }
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &ResourceManagerConfig {
        &self.config
    }

    /// The pool tree (read-only; change it through the manager).
    pub fn tree(&self) -> &PoolTree {
        &self.tree
    }

    /// Entitlements from the last recomputation, indexed by pool slot. A pool
    /// created since then has zero entitlement until the next one.
    pub fn entitlements(&self) -> &Entitlements {
        &self.entitlements
    }

    /// Creates a pool. Its parent must not hold tasks (tasks live in leaves).
    pub fn create_pool(&mut self, path: &str, config: PoolConfig) -> Result<PoolId, PoolError> {
        if let (Some(parent), _) = crate::pool::split_path(path)?
            && let Some(parent) = self.tree.lookup(parent)
        {
            let n_tasks = self.n_tasks_in_slot(parent.idx());
            if n_tasks > 0 {
                return Err(PoolError::HasTasks {
                    path: self.tree.path(parent).to_owned(),
                    n_tasks,
                    action: "a pool with tasks cannot get child pools",
                });
            }
        }
        let id = self.tree.create(path, config)?;
        if self.queues.len() < self.tree.n_slots() {
            self.queues
                .resize_with(self.tree.n_slots(), PoolQueues::default);
        }
        self.queues[id.idx()].reset();
        // The slot may have held a deleted pool: its old entitlement must
        // not apply to the new pool before the next recomputation.
        self.entitlements.clear_slot(id.idx());
        Ok(id)
    }

    /// Replaces a pool's configuration (see [`PoolTree::update`]).
    pub fn update_pool(&mut self, id: PoolId, config: PoolConfig) -> Result<(), PoolError> {
        self.tree.update(id, config)
    }

    /// Deletes a pool without children and without tasks.
    pub fn delete_pool(&mut self, id: PoolId) -> Result<(), PoolError> {
        self.tree.check(id)?;
        let n_tasks = self.n_tasks_in_slot(id.idx());
        if n_tasks > 0 {
            return Err(PoolError::HasTasks {
                path: self.tree.path(id).to_owned(),
                n_tasks,
                action: "only an empty pool can be deleted",
            });
        }
        self.tree.delete(id)?;
        self.queues[id.idx()].reset();
        self.entitlements.clear_slot(id.idx());
        Ok(())
    }

    /// Queued plus admitted tasks of a live pool.
    pub fn n_tasks(&self, id: PoolId) -> Result<u64, PoolError> {
        self.tree.check(id)?;
        Ok(self.n_tasks_in_slot(id.idx()))
    }

    fn n_tasks_in_slot(&self, slot: usize) -> u64 {
        let q = &self.queues[slot];
        q.n_queued_tasks() + q.allocation.n_tasks
    }

    /// Usage of a live pool.
    pub fn usage(&self, id: PoolId) -> Result<PoolUsage, PoolError> {
        self.tree.check(id)?;
        let q = &self.queues[id.idx()];
        Ok(PoolUsage {
            allocation: q.allocation,
            queued: q.queued(false),
            queued_revocable: q.queued(true),
            n_queued: q.n_queued_tasks(),
        })
    }

    /// Usage of a live pool and every pool below it, together. Tasks queue
    /// and run only in leaf pools, so an inner pool's own [`usage`] is
    /// always empty; this is what it holds as a pool, the way its demand
    /// and entitlement cover its subtree. `O(pools in the subtree)`.
    ///
    /// [`usage`]: ResourceManager::usage
    pub fn subtree_usage(&self, id: PoolId) -> Result<PoolUsage, PoolError> {
        let mut sum = self.usage(id)?;
        let mut stack: Vec<PoolId> = self.tree.children(id).collect();
        while let Some(p) = stack.pop() {
            let q = &self.queues[p.idx()];
            sum.allocation.absorb(&q.allocation);
            sum.queued = sum.queued.saturating_add(&q.queued(false));
            sum.queued_revocable = sum.queued_revocable.saturating_add(&q.queued(true));
            sum.n_queued += q.n_queued_tasks();
            stack.extend(self.tree.children(p));
        }
        Ok(sum)
    }

    /// What non-revocable tasks hold in all pools together.
    pub fn total_allocation(&self) -> Resources {
        self.queues.iter().fold(Resources::ZERO, |sum, q| {
            sum.saturating_add(&q.allocation.total)
        })
    }

    /// Tasks queued in all pools.
    pub fn n_queued_total(&self) -> u64 {
        self.n_queued_total
    }

    /// Tasks queued in a class of a live pool.
    pub fn n_queued_in(&self, id: PoolId, class: TaskClass) -> Result<u64, PoolError> {
        self.tree.check(id)?;
        Ok(self.queues[id.idx()].n_queued_in(class))
    }

    /// The first `limit` (at most [`crate::admission::MAX_QUEUE_READ`])
    /// entries queued in a live pool, in the order admission takes them
    /// (priority, then arrival, over its four queues). A pool with children
    /// queues nothing. Read-only.
    pub fn queue_order(&self, id: PoolId, limit: usize) -> Result<Vec<QueuedEntry>, PoolError> {
        self.tree.check(id)?;
        Ok(self.queues[id.idx()].first_in_order(limit.min(crate::admission::MAX_QUEUE_READ)))
    }

    /// Queue items held in a live pool's heaps, cancelled ones not yet
    /// purged included: the queues' memory footprint in entries.
    pub fn n_heap_items(&self, id: PoolId) -> Result<usize, PoolError> {
        self.tree.check(id)?;
        Ok(self.queues[id.idx()].n_heap_items())
    }

    /// Whether a task or gang of `flags` summing to `total` can never be
    /// admitted in `pool`, whatever the capacity and other pools' demand
    /// (see [`crate::admission::never_admitted`]). Callers refuse such work
    /// when it is submitted rather than queue it where it would block its
    /// queue forever.
    pub fn never_admitted(
        &self,
        pool: PoolId,
        flags: TaskFlags,
        total: &Resources,
    ) -> Result<Option<NeverAdmitted>, AdmissionError> {
        crate::admission::never_admitted(&self.tree, pool, flags, total)
    }

    /// Makes room in `pool`'s queue for `n` more entries with these flags
    /// (a restart knows how many it will queue). Unknown pools and flags
    /// are ignored: [`ResourceManager::enqueue`] reports them.
    pub fn reserve_queue(&mut self, pool: PoolId, flags: TaskFlags, n: usize) {
        if let (Ok(class), Some(queue)) = (TaskClass::of(flags), self.queues.get_mut(pool.idx())) {
            queue.reserve(class, n);
        }
    }

    /// Queues a task or a gang (all members share pool, priority and flags;
    /// admitted together or not at all). Validates everything first; on error
    /// nothing is queued.
    pub fn enqueue(
        &mut self,
        pool: PoolId,
        priority: u32,
        flags: TaskFlags,
        members: &[PendingTask],
    ) -> Result<PendingId, AdmissionError> {
        let class = TaskClass::of(flags)?;
        self.tree
            .check(pool)
            .map_err(|e| AdmissionError::InvalidTask {
                field: "pool",
                problem: e.to_string(),
            })?;
        if !self.tree.is_leaf(pool) {
            return Err(AdmissionError::InvalidTask {
                field: "pool",
                problem: PoolError::NotLeaf {
                    path: self.tree.path(pool).to_owned(),
                }
                .to_string(),
            });
        }
        let limits = self.config.admission;
        if members.is_empty() {
            return Err(AdmissionError::InvalidTask {
                field: "members",
                problem: "a gang needs at least one task".into(),
            });
        }
        if members.len() > limits.max_gang_size {
            return Err(AdmissionError::InvalidTask {
                field: "members",
                problem: format!(
                    "{} tasks exceed the gang size limit of {}",
                    members.len(),
                    limits.max_gang_size
                ),
            });
        }
        let mut total = Resources::ZERO;
        for task in members {
            if task.request.is_zero() {
                return Err(AdmissionError::InvalidTask {
                    field: "request",
                    problem: format!("task {} requests no resources", task.id.0),
                });
            }
            if let Some(d) = task.request.0.iter().position(|&v| v > MAX_AMOUNT) {
                return Err(AdmissionError::InvalidTask {
                    field: "request",
                    problem: format!(
                        "task {} requests {} {} {}, above the maximum {MAX_AMOUNT}",
                        task.id.0,
                        task.request.0[d],
                        Dim::ALL[d].unit(),
                        Dim::ALL[d]
                    ),
                });
            }
            total = total.saturating_add(&task.request);
        }
        if let Some(d) = total.0.iter().position(|&v| v > MAX_AMOUNT) {
            return Err(AdmissionError::InvalidTask {
                field: "members",
                problem: format!(
                    "the gang's summed {} request {} exceeds the maximum {MAX_AMOUNT}",
                    Dim::ALL[d],
                    total.0[d]
                ),
            });
        }
        let queue = &mut self.queues[pool.idx()];
        let n = members.len();
        let queued = queue.n_queued_tasks() as usize;
        if queued + n > limits.max_queued_per_pool {
            return Err(AdmissionError::PoolQueueFull {
                path: self.tree.path(pool).to_owned(),
                queued,
                limit: limits.max_queued_per_pool,
            });
        }
        let queued_total = self.n_queued_total as usize;
        if queued_total + n > limits.max_queued_total {
            return Err(AdmissionError::QueueFull {
                queued: queued_total,
                limit: limits.max_queued_total,
            });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = queue.push(priority, seq, class, flags.controller, members, total);
        self.n_queued_total += n as u64;
        Ok(PendingId { pool, entry, seq })
    }

    /// Removes a queued task or gang before admission.
    pub fn cancel(&mut self, pending: PendingId) -> Result<(), AdmissionError> {
        if !self.tree.contains(pending.pool) {
            return Err(AdmissionError::NotPending);
        }
        let queue = &mut self.queues[pending.pool.idx()];
        let before = queue.n_queued_tasks();
        if !queue.cancel(pending.entry, pending.seq) {
            return Err(AdmissionError::NotPending);
        }
        self.n_queued_total -= before - queue.n_queued_tasks();
        Ok(())
    }

    /// Returns an admitted task's resources to its pool (the task ended or
    /// was preempted). Refuses, changing nothing, a release that its pool's
    /// class does not hold (more than allocated, no task of that class left,
    /// an empty request, or a stale pool).
    pub fn release(&mut self, task: &Admitted) -> Result<(), AdmissionError> {
        self.check_admitted(task)?;
        let controller = task.controller;
        let allocation = &mut self.queues[task.pool.idx()].allocation;
        let (held, n_held) = allocation.held(task.class, controller);
        if task.request.is_zero() || n_held == 0 || !task.request.fits_in(&held) {
            return Err(AdmissionError::OverRelease {
                path: self.tree.path(task.pool).to_owned(),
                class: task.class,
                request: task.request,
                allocated: held,
            });
        }
        allocation.remove(task.class, controller, &task.request);
        Ok(())
    }

    /// Records an allocation made outside admission: a task that already
    /// runs (adopted after the service restarted). It counts against its
    /// pool like an admitted task, even beyond the pool's entitlement
    /// (preemption then brings the pool back within it).
    pub fn charge(&mut self, task: &Admitted) -> Result<(), AdmissionError> {
        self.check_admitted(task)?;
        if task.request.is_zero() {
            return Err(AdmissionError::InvalidTask {
                field: "request",
                problem: "empty request".into(),
            });
        }
        self.queues[task.pool.idx()]
            .allocation
            .add(task.class, task.controller, &task.request);
        Ok(())
    }

    /// A live pool, and a controller flag that fits the class.
    fn check_admitted(&self, task: &Admitted) -> Result<(), AdmissionError> {
        self.tree
            .check(task.pool)
            .map_err(|e| AdmissionError::InvalidTask {
                field: "pool",
                problem: e.to_string(),
            })?;
        let flag_fits_class = match task.class {
            TaskClass::Controller => task.controller,
            TaskClass::NonPreemptible => true,
            TaskClass::Normal | TaskClass::Revocable => !task.controller,
        };
        if !flag_fits_class {
            return Err(AdmissionError::InvalidTask {
                field: "controller",
                problem: format!(
                    "a {} task cannot have controller={}",
                    task.class, task.controller
                ),
            });
        }
        Ok(())
    }

    /// Recomputes every pool's entitlement from the current demand (queued
    /// plus allocated, per leaf) and the given capacities. Amounts above
    /// [`MAX_AMOUNT`] are clamped to it.
    pub fn recompute_entitlement(&mut self, capacity: Resources, slack_capacity: Resources) {
        let n_slots = self.tree.n_slots();
        let input = &mut self.input;
        input.capacity = capacity.min(&Resources::MAX);
        input.slack_capacity = slack_capacity.min(&Resources::MAX);
        for d in 0..N_DIMS {
            input.demand[d].resize(n_slots, 0);
            input.slack_demand[d].resize(n_slots, 0);
        }
        for (slot, q) in self.queues.iter().enumerate() {
            let demand = q
                .queued(false)
                .saturating_add(&q.allocation.total)
                .min(&Resources::MAX);
            let slack = q
                .queued(true)
                .saturating_add(&q.allocation.revocable)
                .min(&Resources::MAX);
            for d in 0..N_DIMS {
                input.demand[d][slot] = demand.0[d];
                input.slack_demand[d][slot] = slack.0[d];
            }
        }
        self.calculator.compute(
            &self.tree,
            &self.input,
            &mut self.entitlements,
            self.threads.as_deref(),
        );
    }

    /// Admits, across all leaf pools, every queued task or gang that fits
    /// the rules against the last computed entitlements. `out` is cleared
    /// first; for every queue left non-empty it says why.
    ///
    /// Pools are independent, so with an engine thread pool (and at least
    /// `PARALLEL_MIN_QUEUED` queued tasks and `PARALLEL_MIN_POOLS` pool
    /// slots, counting inner and free ones) they are admitted in parallel
    /// into per-pool buffers that are then appended in slot order: the
    /// result is the same for any number of threads.
    pub fn admit(&mut self, out: &mut AdmissionResult) {
        out.clear();
        let tree = &self.tree;
        let entitlements = &self.entitlements;
        match &self.threads {
            Some(threads)
                if self.n_queued_total >= PARALLEL_MIN_QUEUED
                    && self.queues.len() >= PARALLEL_MIN_POOLS =>
            {
                threads.install(|| {
                    self.queues
                        .par_iter_mut()
                        .enumerate()
                        .with_min_len(ADMIT_POOLS_PER_TASK)
                        .for_each(|(slot, queue)| {
                            let mut own = std::mem::take(&mut queue.cycle_out);
                            own.clear();
                            if let Some(caps) = pool_caps(tree, entitlements, slot, queue) {
                                queue.admit(tree, caps.0, &caps.1, &mut own);
                            }
                            queue.cycle_out = own;
                        });
                });
                for queue in &mut self.queues {
                    out.admitted.extend_from_slice(&queue.cycle_out.admitted);
                    out.blocked.extend_from_slice(&queue.cycle_out.blocked);
                    queue.cycle_out.clear();
                }
            }
            _ => {
                for (slot, queue) in self.queues.iter_mut().enumerate() {
                    if let Some((pool, caps)) = pool_caps(tree, entitlements, slot, queue) {
                        queue.admit(tree, pool, &caps, out);
                    }
                }
            }
        }
        self.n_queued_total -= out.admitted.len() as u64;
    }

    /// Slots of the pools with queued tasks, ascending.
    pub(crate) fn queued_slots(&self) -> Vec<usize> {
        self.queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.n_queued_tasks() > 0)
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Sets (or clears) the entry of the pool in `slot` that waits for
    /// hosts in the next admission pass: its arrival number and how many
    /// of its tasks fit now (see [`crate::backfill`]).
    pub(crate) fn set_gate(&mut self, slot: usize, gate: Option<(u64, u64)>) {
        if let Some(q) = self.queues.get_mut(slot) {
            q.set_gate(gate);
        }
    }

    /// The head entry of a queue of the pool in `slot`: its arrival
    /// number, members and their summed request.
    pub(crate) fn head_entry(
        &mut self,
        slot: usize,
        class: TaskClass,
    ) -> Option<(u64, &[PendingTask], Resources)> {
        self.queues.get_mut(slot)?.head_entry(class)
    }

    /// Admits, behind the blocked head `head_seq` of a queue of the pool
    /// in `slot`, the entries that pass the pool's rules and end by
    /// `until_ms` or fit `extra` (see [`PoolQueues::backfill`]).
    /// Appends to `out`.
    #[expect(
        clippy::too_many_arguments,
        reason = "the admission context, passed explicitly"
    )]
    pub(crate) fn backfill(
        &mut self,
        slot: usize,
        class: TaskClass,
        head_seq: u64,
        now_ms: u64,
        until_ms: u64,
        extra: Resources,
        fits_now: &mut dyn FnMut(&[PendingTask]) -> bool,
        most_free: &mut dyn FnMut() -> Resources,
        depth: usize,
        out: &mut AdmissionResult,
    ) {
        let before = out.admitted.len();
        let Some(queue) = self.queues.get_mut(slot) else {
            return;
        };
        let Some((pool, caps)) = pool_caps(&self.tree, &self.entitlements, slot, queue) else {
            return;
        };
        queue.backfill(
            pool, &caps, class, head_seq, now_ms, until_ms, extra, fits_now, most_free, depth, out,
        );
        self.n_queued_total -= (out.admitted.len() - before) as u64;
    }

    /// What the pool in `slot` holds (all non-revocable classes) and is
    /// entitled to now.
    pub(crate) fn held_and_entitled(&self, slot: usize) -> (Resources, Resources) {
        let held = self
            .queues
            .get(slot)
            .map_or(Resources::ZERO, |q| q.allocation.total);
        (held, self.entitlements.entitlement(slot))
    }

    /// Panics if any invariant of the tree, the queues or the accounting is
    /// broken.
    pub fn check_invariants(&self) {
        self.tree.check_invariants();
        assert_eq!(self.queues.len(), self.tree.n_slots());
        let mut total = 0;
        for (slot, q) in self.queues.iter().enumerate() {
            q.check_invariants();
            let live = self.tree.lookup_slot(slot);
            match live {
                None => assert_eq!(
                    q.n_queued_tasks() + q.allocation.n_tasks,
                    0,
                    "free slot is empty"
                ),
                Some(pool) => {
                    if !self.tree.is_leaf(pool) {
                        assert_eq!(
                            q.n_queued_tasks() + q.allocation.n_tasks,
                            0,
                            "inner pools hold no tasks"
                        );
                    }
                }
            }
            let a = &q.allocation;
            a.check_invariants();
            assert!(
                a.non_preemptible.fits_in(&a.total),
                "non-preemptible within total"
            );
            assert!(a.controller.fits_in(&a.total), "controller within total");
            total += q.n_queued_tasks();
        }
        assert_eq!(total, self.n_queued_total);
        assert!(total as usize <= self.config.admission.max_queued_total);
    }
}
