//! Per-pool pending queues and the admission rules.
//!
//! Each leaf pool keeps four queues, one per [`TaskClass`], each ordered by
//! priority (higher first) then arrival. Admission takes, within a pool, the
//! best head among the queues that are not blocked; when a head does not fit,
//! only its own queue stops for this cycle, so a controller task at its limit
//! never blocks normal tasks, and revocable tasks waiting for slack never
//! block anything. Within a queue order is strict, so a large high-priority
//! task is not starved by a stream of small ones behind it.
//!
//! A queue entry is a gang: one or more tasks admitted together on their
//! summed request, or not at all. A single task is a gang of one.

use std::collections::BinaryHeap;
use std::fmt;

use crate::pool::{PoolId, PoolTree};
use crate::resources::{Dim, MAX_AMOUNT, N_DIMS, Resources};

/// Default bound on queued tasks per leaf pool.
pub const DEFAULT_MAX_QUEUED_PER_POOL: usize = 1_000_000;
/// Default bound on queued tasks over all pools.
pub const DEFAULT_MAX_QUEUED_TOTAL: usize = 10_000_000;
/// Default bound on the members of one gang.
pub const DEFAULT_MAX_GANG_SIZE: usize = 100_000;

/// The caller's handle of a task (the gateway's task arena index, a test's
/// counter). The engine does not interpret it and does not check uniqueness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

/// Which queue, and which admission rules, a task is subject to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskClass {
    /// Never preempted; may only use the pool's reservation.
    NonPreemptible = 0,
    /// A controller (e.g. a Spark driver); capped by the controller limit.
    Controller = 1,
    /// Ordinary preemptible work within the entitlement.
    Normal = 2,
    /// Best-effort work on slack capacity; first to be preempted.
    Revocable = 3,
}

impl TaskClass {
    /// All classes, in queue order.
    pub const ALL: [TaskClass; 4] = [
        TaskClass::NonPreemptible,
        TaskClass::Controller,
        TaskClass::Normal,
        TaskClass::Revocable,
    ];

    /// Lower-case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            TaskClass::NonPreemptible => "non_preemptible",
            TaskClass::Controller => "controller",
            TaskClass::Normal => "normal",
            TaskClass::Revocable => "revocable",
        }
    }

    /// The class of a task with these flags. A non-preemptible controller
    /// is queued as non-preemptible and checked against both limits.
    pub fn of(flags: TaskFlags) -> Result<TaskClass, AdmissionError> {
        match (flags.revocable, flags.preemptible, flags.controller) {
            (true, false, _) => Err(AdmissionError::InvalidTask {
                field: "revocable",
                problem: "a revocable task must be preemptible".into(),
            }),
            (true, true, true) => Err(AdmissionError::InvalidTask {
                field: "revocable",
                problem: "a controller task cannot be revocable".into(),
            }),
            (true, true, false) => Ok(TaskClass::Revocable),
            (false, false, _) => Ok(TaskClass::NonPreemptible),
            (false, true, true) => Ok(TaskClass::Controller),
            (false, true, false) => Ok(TaskClass::Normal),
        }
    }
}

impl fmt::Display for TaskClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Scheduling flags of a task (or of every member of a gang).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskFlags {
    /// May be preempted to make room for others.
    pub preemptible: bool,
    /// Is a controller task (counts against the controller limit).
    pub controller: bool,
    /// Runs on slack capacity.
    pub revocable: bool,
}

impl Default for TaskFlags {
    fn default() -> Self {
        TaskFlags {
            preemptible: true,
            controller: false,
            revocable: false,
        }
    }
}

/// One task waiting for admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingTask {
    /// The caller's handle.
    pub id: TaskId,
    /// What it needs.
    pub request: Resources,
    /// How long it is expected to run once placed, in ms (0: unknown):
    /// backfill admits it ahead of a blocked head only if it is known to
    /// end before the head's reservation begins.
    pub runtime_ms: u64,
}

/// Handle of a queued gang, to cancel it before admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PendingId {
    pub(crate) pool: PoolId,
    pub(crate) entry: u32,
    pub(crate) seq: u64,
}

/// Bounds on queued work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Queued tasks per leaf pool.
    pub max_queued_per_pool: usize,
    /// Queued tasks over all pools.
    pub max_queued_total: usize,
    /// Members of one gang.
    pub max_gang_size: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            max_queued_per_pool: DEFAULT_MAX_QUEUED_PER_POOL,
            max_queued_total: DEFAULT_MAX_QUEUED_TOTAL,
            max_gang_size: DEFAULT_MAX_GANG_SIZE,
        }
    }
}

/// Why a task or gang could not be queued or released.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// A field of the submitted task is invalid.
    #[error("invalid task: {field}: {problem}")]
    InvalidTask {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The pool's queue bound is reached.
    #[error("pool {path} already queues {queued} task(s); the limit is {limit}")]
    PoolQueueFull {
        /// The pool.
        path: String,
        /// Tasks queued now.
        queued: usize,
        /// The bound.
        limit: usize,
    },
    /// The bound on all queued tasks is reached.
    #[error("{queued} task(s) are queued in all pools; the limit is {limit}")]
    QueueFull {
        /// Tasks queued now.
        queued: usize,
        /// The bound.
        limit: usize,
    },
    /// The pending handle does not name a queued entry (already admitted or
    /// cancelled).
    #[error("no such pending task or gang")]
    NotPending,
    /// A release does not match what the pool holds.
    #[error(
        "pool {path}: cannot release {request} of class {class}: only {allocated} is allocated"
    )]
    OverRelease {
        /// The pool.
        path: String,
        /// The class released.
        class: TaskClass,
        /// The amount released.
        request: Resources,
        /// What that class holds.
        allocated: Resources,
    },
}

/// Which admission rule stopped a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// allocation + request would exceed the pool's entitlement.
    Entitlement,
    /// non-preemptible allocation + request would exceed the reservation.
    Reservation,
    /// controller allocation + request would exceed the controller limit.
    ControllerLimit,
    /// revocable allocation + request would exceed the slack entitlement.
    SlackEntitlement,
    /// revocable allocation + request would exceed the pool's slack limit.
    SlackLimit,
    /// A gang that fits its pool's entitlement but not the hosts' free
    /// resources now: it waits in its queue, with hosts reserved for it
    /// where they free up first, rather than holding its share while it
    /// waits for them (see [`crate::backfill`]).
    Hosts,
}

impl BlockKind {
    /// Short phrase for reports.
    pub fn describe(self) -> &'static str {
        match self {
            BlockKind::Entitlement => "entitlement exhausted",
            BlockKind::Reservation => "reservation exhausted (non-preemptible)",
            BlockKind::ControllerLimit => "controller limit reached",
            BlockKind::SlackEntitlement => "slack entitlement exhausted",
            BlockKind::SlackLimit => "slack limit reached",
            BlockKind::Hosts => "not enough hosts free for the gang",
        }
    }
}

/// Why one queue of one pool stopped admitting in a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The pool.
    pub pool: PoolId,
    /// The queue.
    pub class: TaskClass,
    /// The rule that failed.
    pub kind: BlockKind,
    /// The first dimension in which it failed.
    pub dim: Dim,
    /// The head entry's request in that dimension.
    pub request: u64,
    /// What the class already holds in that dimension ([`BlockKind::Hosts`]:
    /// how many of the gang's tasks fit the free hosts now).
    pub allocated: u64,
    /// The cap the rule enforces in that dimension ([`BlockKind::Hosts`]:
    /// the gang's size).
    pub cap: u64,
    /// Tasks still waiting in the queue.
    pub n_waiting: u64,
    /// The head entry's first task (which tasks wait behind it, and which
    /// is it, callers tell by this).
    pub head: TaskId,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == BlockKind::Hosts {
            return write!(
                f,
                "{} queue: {}: {} of its {} tasks fit the free hosts now ({} task(s) waiting)",
                self.class,
                self.kind.describe(),
                self.allocated,
                self.cap,
                self.n_waiting
            );
        }
        write!(
            f,
            "{} queue: {} in {}: needs {} {}, {} of {} in use ({} task(s) waiting)",
            self.class,
            self.kind.describe(),
            self.dim,
            self.request,
            self.dim.unit(),
            self.allocated,
            self.cap,
            self.n_waiting
        )
    }
}

/// The ceiling a task or gang can never get past in its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ceiling {
    /// Non-preemptible work: the pool's own reservation.
    Reservation,
    /// Non-revocable work: the pool's entitlement, which can never exceed
    /// the limit of the pool or of an ancestor (named by `pool`).
    Limit,
    /// Non-revocable work: the entitlement of a STATIC pool (the pool or
    /// an ancestor, named by `pool`) is exactly its reservation.
    StaticReservation,
    /// Revocable work: the pool's limit and slack limit, compounded down
    /// the path from the root.
    SlackLimit,
}

impl Ceiling {
    /// Short phrase for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Ceiling::Reservation => "reservation",
            Ceiling::Limit => "limit",
            Ceiling::StaticReservation => "reservation (a STATIC pool)",
            Ceiling::SlackLimit => "slack limit",
        }
    }
}

/// Why a task or gang can never be admitted in its pool, whatever the
/// cluster's capacity and the other pools' demand: its summed request is
/// above the most its class could ever hold there. Such work would sit at
/// the head of its queue and block everything behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeverAdmitted {
    /// The rule.
    pub ceiling: Ceiling,
    /// The pool whose configuration sets the ceiling (the task's pool or an
    /// ancestor).
    pub pool: PoolId,
    /// The first dimension above the ceiling.
    pub dim: Dim,
    /// The summed request in that dimension.
    pub request: u64,
    /// The ceiling in that dimension.
    pub cap: u64,
}

/// The admission rules of [`PoolQueues::admit`] with every entitlement at
/// its largest possible value (capacity unbounded, no competing demand):
/// `Some` when a task or gang of `flags` summing to `total` can never be
/// admitted in the leaf pool `pool`. The bounds: an entitlement never
/// exceeds the limits on the pool's path, nor a STATIC pool's reservation;
/// the slack cap is the pool's limit and its slack percentage of its
/// parent's slack cap. The controller limit never makes a single task
/// unadmittable: a pool's first controller is admitted whatever the limit
/// (a gang of controllers still has to fit it).
pub fn never_admitted(
    tree: &PoolTree,
    pool: PoolId,
    flags: TaskFlags,
    total: &Resources,
) -> Result<Option<NeverAdmitted>, AdmissionError> {
    let class = TaskClass::of(flags)?;
    tree.check(pool).map_err(|e| AdmissionError::InvalidTask {
        field: "pool",
        problem: e.to_string(),
    })?;
    Ok(never_admitted_in(tree, pool, class, total))
}

/// [`never_admitted`] for a checked pool and class: what admission calls
/// for a queue head that does not fit, with no conversion back to flags.
pub(crate) fn never_admitted_in(
    tree: &PoolTree,
    pool: PoolId,
    class: TaskClass,
    total: &Resources,
) -> Option<NeverAdmitted> {
    // The path from the pool up to the root (at most MAX_DEPTH + 1 pools),
    // on the stack: admission calls this for queue heads that do not fit.
    let mut path_buf = [pool; crate::pool::MAX_DEPTH + 1];
    let mut n_path = 0;
    let mut at = Some(pool);
    while let Some(p) = at {
        path_buf[n_path] = p;
        n_path += 1;
        at = tree.parent(p);
    }
    let path = &path_buf[..n_path];
    let over = |ceiling: Ceiling, cap: &[(u64, PoolId); N_DIMS]| {
        Dim::ALL
            .into_iter()
            .find(|&d| total[d] > cap[d.idx()].0)
            .map(|d| NeverAdmitted {
                ceiling,
                pool: cap[d.idx()].1,
                dim: d,
                request: total[d],
                cap: cap[d.idx()].0,
            })
    };
    if class == TaskClass::Revocable {
        // Top-down from the root: min(limit, pct% of the parent's cap).
        let mut cap = [(MAX_AMOUNT, pool); N_DIMS];
        for (n, &p) in path.iter().rev().enumerate() {
            let config = tree.config(p);
            for d in Dim::ALL {
                let limit = config.dims[d.idx()].limit;
                let from_parent = if n == 0 {
                    MAX_AMOUNT
                } else {
                    crate::resources::percent_of(cap[d.idx()].0, config.slack_limit_pct)
                };
                cap[d.idx()] = (limit.min(from_parent), pool);
            }
        }
        return over(Ceiling::SlackLimit, &cap);
    }
    let config = tree.config(pool);
    if class == TaskClass::NonPreemptible {
        let cap = std::array::from_fn(|d| (config.dims[d].reservation, pool));
        if let Some(never) = over(Ceiling::Reservation, &cap) {
            return Some(never);
        }
    }
    // The largest entitlement, and which pool's configuration bounds it.
    let root = tree.root();
    let mut ent = [(MAX_AMOUNT, root, Ceiling::Limit); N_DIMS];
    for &p in path {
        let c = tree.config(p);
        for d in 0..N_DIMS {
            let static_pool = p != root && c.dims[d].kind == crate::pool::PoolKind::Static;
            let (bound, ceiling) = if static_pool {
                (c.dims[d].reservation, Ceiling::StaticReservation)
            } else {
                (c.dims[d].limit, Ceiling::Limit)
            };
            if bound < ent[d].0 {
                ent[d] = (bound, p, ceiling);
            }
        }
    }
    if let Some(d) = Dim::ALL.into_iter().find(|&d| total[d] > ent[d.idx()].0) {
        let (cap, p, ceiling) = ent[d.idx()];
        return Some(NeverAdmitted {
            ceiling,
            pool: p,
            dim: d,
            request: total[d],
            cap,
        });
    }
    None
}

/// One admitted task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The caller's handle.
    pub task: TaskId,
    /// Its pool.
    pub pool: PoolId,
    /// Its class.
    pub class: TaskClass,
    /// Whether it is a controller task (a non-preemptible controller is in
    /// the non-preemptible class and also counts against the controller
    /// limit).
    pub controller: bool,
    /// Its request.
    pub request: Resources,
}

/// Output of one admission call; reuse it across calls to avoid allocation.
#[derive(Clone, Debug, Default)]
pub struct AdmissionResult {
    /// Admitted tasks, pool by pool (in slot order), gangs contiguous.
    pub admitted: Vec<Admitted>,
    /// For every queue left non-empty, why it stopped.
    pub blocked: Vec<Blocked>,
}

impl AdmissionResult {
    /// Empties both lists, keeping their capacity.
    pub fn clear(&mut self) {
        self.admitted.clear();
        self.blocked.clear();
    }
}

/// What one pool holds. All in the units of [`Dim`]. The public sums are
/// what the admission rules check; the per-class breakdown behind them is
/// what a release is validated against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// All non-revocable tasks (checked against the entitlement).
    pub total: Resources,
    /// Non-preemptible tasks (checked against the reservation).
    pub non_preemptible: Resources,
    /// Controller tasks, preemptible or not (checked against the controller
    /// limit).
    pub controller: Resources,
    /// Revocable tasks (checked against the slack entitlement).
    pub revocable: Resources,
    /// Number of tasks admitted and not yet released.
    pub n_tasks: u64,
    /// Held per [`TaskClass`].
    by_class: [Resources; 4],
    /// Tasks held per [`TaskClass`].
    n_by_class: [u64; 4],
    /// Held by non-preemptible controller tasks (also in `by_class`).
    non_preemptible_controller: Resources,
    /// Number of non-preemptible controller tasks held.
    n_non_preemptible_controller: u64,
}

impl Allocation {
    pub(crate) fn add(&mut self, class: TaskClass, controller: bool, request: &Resources) {
        self.by_class[class as usize].add_assign(request);
        self.n_by_class[class as usize] += 1;
        match class {
            TaskClass::Revocable => self.revocable.add_assign(request),
            TaskClass::NonPreemptible => {
                self.total.add_assign(request);
                self.non_preemptible.add_assign(request);
                if controller {
                    self.controller.add_assign(request);
                    self.non_preemptible_controller.add_assign(request);
                    self.n_non_preemptible_controller += 1;
                }
            }
            TaskClass::Controller => {
                self.total.add_assign(request);
                self.controller.add_assign(request);
            }
            TaskClass::Normal => self.total.add_assign(request),
        }
        self.n_tasks += 1;
    }

    /// Adds what another allocation holds (summing a subtree's pools);
    /// amounts saturate (many pools' allocations may pass 2^64).
    pub(crate) fn absorb(&mut self, other: &Allocation) {
        let add = |mine: &mut Resources, theirs: &Resources| *mine = mine.saturating_add(theirs);
        add(&mut self.total, &other.total);
        add(&mut self.non_preemptible, &other.non_preemptible);
        add(&mut self.controller, &other.controller);
        add(&mut self.revocable, &other.revocable);
        add(
            &mut self.non_preemptible_controller,
            &other.non_preemptible_controller,
        );
        for (mine, theirs) in self.by_class.iter_mut().zip(&other.by_class) {
            add(mine, theirs);
        }
        self.n_tasks += other.n_tasks;
        for (mine, theirs) in self.n_by_class.iter_mut().zip(&other.n_by_class) {
            *mine += theirs;
        }
        self.n_non_preemptible_controller += other.n_non_preemptible_controller;
    }

    /// What tasks of this class (and controller flag) hold, and how many
    /// there are: what one release may return at most.
    pub fn held(&self, class: TaskClass, controller: bool) -> (Resources, u64) {
        let (all, n_all) = (
            self.by_class[class as usize],
            self.n_by_class[class as usize],
        );
        match (class, controller) {
            (TaskClass::NonPreemptible, true) => (
                self.non_preemptible_controller,
                self.n_non_preemptible_controller,
            ),
            (TaskClass::NonPreemptible, false) => (
                all.saturating_sub(&self.non_preemptible_controller),
                n_all - self.n_non_preemptible_controller,
            ),
            _ => (all, n_all),
        }
    }

    /// Returns one task's resources. The caller has checked with
    /// [`Allocation::held`] that they are held.
    pub(crate) fn remove(&mut self, class: TaskClass, controller: bool, request: &Resources) {
        self.by_class[class as usize].sub_assign(request);
        self.n_by_class[class as usize] -= 1;
        match class {
            TaskClass::Revocable => self.revocable.sub_assign(request),
            TaskClass::NonPreemptible => {
                self.total.sub_assign(request);
                self.non_preemptible.sub_assign(request);
                if controller {
                    self.controller.sub_assign(request);
                    self.non_preemptible_controller.sub_assign(request);
                    self.n_non_preemptible_controller -= 1;
                }
            }
            TaskClass::Controller => {
                self.total.sub_assign(request);
                self.controller.sub_assign(request);
            }
            TaskClass::Normal => self.total.sub_assign(request),
        }
        self.n_tasks -= 1;
    }

    /// Panics unless the public sums agree with the per-class breakdown.
    pub(crate) fn check_invariants(&self) {
        let by = |c: TaskClass| self.by_class[c as usize];
        let mut total = by(TaskClass::NonPreemptible);
        total.add_assign(&by(TaskClass::Controller));
        total.add_assign(&by(TaskClass::Normal));
        assert_eq!(
            self.total, total,
            "total is the sum of the non-revocable classes"
        );
        assert_eq!(self.non_preemptible, by(TaskClass::NonPreemptible));
        let mut controller = by(TaskClass::Controller);
        controller.add_assign(&self.non_preemptible_controller);
        assert_eq!(self.controller, controller, "controller sum");
        assert_eq!(self.revocable, by(TaskClass::Revocable));
        assert!(
            self.non_preemptible_controller
                .fits_in(&self.non_preemptible)
        );
        assert!(self.n_non_preemptible_controller <= self.n_by_class[0]);
        assert_eq!(
            self.n_tasks,
            self.n_by_class.iter().sum::<u64>(),
            "task counts"
        );
        for class in TaskClass::ALL {
            if self.n_by_class[class as usize] == 0 {
                assert!(
                    by(class).is_zero(),
                    "no tasks of class {class}, nothing held"
                );
            }
        }
    }
}

/// Most entries [`crate::ResourceManager::queue_order`] returns.
pub const MAX_QUEUE_READ: usize = 100;

/// One entry of a pool's queues, as a read of the order admission takes
/// them in ([`crate::ResourceManager::queue_order`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedEntry {
    /// Its queue.
    pub class: TaskClass,
    /// Its priority (higher first).
    pub priority: u32,
    /// Its arrival number in the pool (smaller: queued earlier; a task
    /// queued again gets a new one).
    pub seq: u64,
    /// The task, or the first member of a gang.
    pub head: TaskId,
    /// Tasks in the entry (1, or the gang's size).
    pub n_tasks: u32,
    /// Summed request.
    pub total: Resources,
}

#[derive(Clone, Debug)]
enum Members {
    One(PendingTask),
    Gang(Box<[PendingTask]>),
}

impl Members {
    fn as_slice(&self) -> &[PendingTask] {
        match self {
            Members::One(task) => std::slice::from_ref(task),
            Members::Gang(tasks) => tasks,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    /// Arrival sequence number; 0 marks a free slot.
    seq: u64,
    class: TaskClass,
    controller: bool,
    total: Resources,
    members: Members,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QueueItem {
    priority: u32,
    seq: u64,
    entry: u32,
}

impl Ord for QueueItem {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Max-heap: higher priority first, then earlier arrival.
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for QueueItem {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Queues and accounting of one pool slot.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolQueues {
    heaps: [BinaryHeap<QueueItem>; 4],
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    /// Queued tasks (not entries) per class.
    n_queued: [u64; 4],
    /// Heap items whose entry was cancelled.
    n_stale: usize,
    /// Summed requests of queued non-revocable and revocable tasks; wide so
    /// a million queued tasks of maximal size cannot overflow.
    queued: [[u128; N_DIMS]; 2],
    pub(crate) allocation: Allocation,
    /// This pool's output of a parallel admission pass, appended to the
    /// caller's result in slot order afterwards; kept to reuse its capacity.
    pub(crate) cycle_out: AdmissionResult,
    /// Heads set aside during one admission pass because they can never be
    /// admitted as the pool is now; put back before it returns. Kept to
    /// reuse its capacity.
    skipped: Vec<(TaskClass, QueueItem)>,
    /// A head entry (by arrival number) that waits for hosts this cycle,
    /// and how many of its tasks fit the free hosts now: admission stops
    /// its queue there with [`BlockKind::Hosts`]. Set by the engine before
    /// each admission pass (`set_gate`), cleared by it.
    gate: Option<(u64, u64)>,
    /// Bumped whenever the set of queued entries changes (an entry queued,
    /// admitted or cancelled): a backfill look that admitted nothing looked
    /// at the same entries again only while it is unchanged.
    version: u64,
    /// The last backfill look that admitted nothing, and what it saw
    /// (see [`PoolQueues::backfill`]).
    backfill_miss: Option<BackfillMiss>,
}

/// What a backfill look that admitted nothing saw. A later look over the
/// same entries in which nothing is easier (the same queue, time no
/// earlier, the head's start no later, no more room beside it, the pool
/// holding no less, caps no higher, no host with more free) would admit
/// nothing either: each rule it applies only gets harder along those.
#[derive(Clone, Copy, Debug)]
struct BackfillMiss {
    class: TaskClass,
    head_seq: u64,
    version: u64,
    depth: usize,
    now_ms: u64,
    until_ms: u64,
    extra: Resources,
    allocation: Allocation,
    caps: PoolCaps,
    /// The most any host had free, if the look asked (`None`: every entry
    /// failed before asking, whatever the hosts had free).
    most_free: Option<Resources>,
}

impl BackfillMiss {
    /// Whether a look with these inputs finds nothing easier than this one
    /// did. `most_free` is asked only if this one asked.
    #[expect(
        clippy::too_many_arguments,
        reason = "the inputs of a backfill look, passed explicitly"
    )]
    fn still_misses(
        &self,
        class: TaskClass,
        head_seq: u64,
        version: u64,
        depth: usize,
        now_ms: u64,
        until_ms: u64,
        extra: &Resources,
        allocation: &Allocation,
        caps: &PoolCaps,
        most_free: &mut dyn FnMut() -> Resources,
    ) -> bool {
        let held_no_less = |now: &Resources, then: &Resources| then.fits_in(now);
        self.class == class
            && self.head_seq == head_seq
            && self.version == version
            && self.depth == depth
            && now_ms >= self.now_ms
            && until_ms <= self.until_ms
            && extra.fits_in(&self.extra)
            && held_no_less(&allocation.total, &self.allocation.total)
            && held_no_less(
                &allocation.non_preemptible,
                &self.allocation.non_preemptible,
            )
            && held_no_less(&allocation.controller, &self.allocation.controller)
            && held_no_less(&allocation.revocable, &self.allocation.revocable)
            && caps.entitlement.fits_in(&self.caps.entitlement)
            && caps.reservation.fits_in(&self.caps.reservation)
            && caps.controller.fits_in(&self.caps.controller)
            && caps.slack_entitlement.fits_in(&self.caps.slack_entitlement)
            && caps.slack_cap.fits_in(&self.caps.slack_cap)
            && self.most_free.is_none_or(|then| most_free().fits_in(&then))
    }
}

/// Caps one pool's admission works against in a cycle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolCaps {
    pub entitlement: Resources,
    pub reservation: Resources,
    pub controller: Resources,
    pub slack_entitlement: Resources,
    pub slack_cap: Resources,
}

impl PoolQueues {
    /// Room for `n` more queued entries of `class`.
    pub(crate) fn reserve(&mut self, class: TaskClass, n: usize) {
        self.entries
            .reserve(n.saturating_sub(self.free_entries.len()));
        self.heaps[class as usize].reserve(n);
    }

    pub(crate) fn reset(&mut self) {
        *self = PoolQueues::default();
    }

    pub(crate) fn n_queued_tasks(&self) -> u64 {
        self.n_queued.iter().sum()
    }

    pub(crate) fn n_heap_items(&self) -> usize {
        self.heaps.iter().map(BinaryHeap::len).sum()
    }

    pub(crate) fn n_queued_in(&self, class: TaskClass) -> u64 {
        self.n_queued[class as usize]
    }

    /// Summed requests of queued tasks, non-revocable (`false`) or
    /// revocable (`true`), saturated at [`MAX_AMOUNT`].
    pub(crate) fn queued(&self, revocable: bool) -> Resources {
        let wide = &self.queued[usize::from(revocable)];
        Resources(std::array::from_fn(|d| {
            wide[d].min(u128::from(MAX_AMOUNT)) as u64
        }))
    }

    pub(crate) fn push(
        &mut self,
        priority: u32,
        seq: u64,
        class: TaskClass,
        controller: bool,
        members: &[PendingTask],
        total: Resources,
    ) -> u32 {
        debug_assert!(seq > 0 && !members.is_empty());
        let entry = Entry {
            seq,
            class,
            controller,
            total,
            members: if members.len() == 1 {
                Members::One(members[0])
            } else {
                Members::Gang(members.into())
            },
        };
        let idx = match self.free_entries.pop() {
            Some(idx) => {
                self.entries[idx as usize] = entry;
                idx
            }
            None => {
                self.entries.push(entry);
                u32::try_from(self.entries.len() - 1).expect("entries per pool fit in u32")
            }
        };
        self.heaps[class as usize].push(QueueItem {
            priority,
            seq,
            entry: idx,
        });
        self.version += 1;
        self.account_queued(class, members.len() as u64, &total, true);
        idx
    }

    fn account_queued(&mut self, class: TaskClass, n: u64, total: &Resources, add: bool) {
        let wide = &mut self.queued[usize::from(class == TaskClass::Revocable)];
        for d in 0..N_DIMS {
            if add {
                wide[d] += u128::from(total.0[d]);
            } else {
                wide[d] -= u128::from(total.0[d]);
            }
        }
        if add {
            self.n_queued[class as usize] += n;
        } else {
            self.n_queued[class as usize] -= n;
        }
    }

    /// Removes a queued entry; `false` if it is not queued (admitted,
    /// cancelled, or a stale handle).
    pub(crate) fn cancel(&mut self, entry: u32, seq: u64) -> bool {
        let Some(e) = self.entries.get_mut(entry as usize) else {
            return false;
        };
        if e.seq != seq || seq == 0 {
            return false;
        }
        e.seq = 0;
        let (class, n, total) = (e.class, e.members.as_slice().len() as u64, e.total);
        e.members = Members::Gang(Box::new([]));
        self.version += 1;
        self.account_queued(class, n, &total, false);
        self.free_entries.push(entry);
        self.n_stale += 1;
        if self.n_stale > 1024 && self.n_stale > self.n_queued_tasks() as usize {
            self.purge_stale();
        }
        true
    }

    fn purge_stale(&mut self) {
        let entries = &self.entries;
        for heap in &mut self.heaps {
            heap.retain(|item| entries[item.entry as usize].seq == item.seq);
        }
        self.n_stale = 0;
    }

    /// Head of a queue, dropping cancelled items on the way.
    fn head(&mut self, class: TaskClass) -> Option<QueueItem> {
        let heap = &mut self.heaps[class as usize];
        while let Some(&top) = heap.peek() {
            if self.entries[top.entry as usize].seq == top.seq {
                return Some(top);
            }
            heap.pop();
            self.n_stale -= 1;
        }
        None
    }

    /// Admits everything that fits, appending to `out`.
    ///
    /// A head that does not fit holds its queue (order within a queue is
    /// strict), unless it can never be admitted as the pool is configured
    /// now ([`never_admitted`]: the pool shrank below it after it was
    /// queued, or it was recovered from an older store): such an entry
    /// stays queued, where it is, but is passed over in this pass so that
    /// it does not block the entries behind it. It is checked only when it
    /// does not fit, so a pool that grows again admits it in order.
    pub(crate) fn admit(
        &mut self,
        tree: &PoolTree,
        pool: PoolId,
        caps: &PoolCaps,
        out: &mut AdmissionResult,
    ) {
        let mut blocked = [false; 4];
        for class in TaskClass::ALL {
            blocked[class as usize] = self.n_queued[class as usize] == 0;
        }
        loop {
            // The best head among the queues still admitting.
            let mut best: Option<(TaskClass, QueueItem)> = None;
            for class in TaskClass::ALL {
                if blocked[class as usize] {
                    continue;
                }
                match self.head(class) {
                    Some(item) if best.is_none_or(|(_, b)| item > b) => best = Some((class, item)),
                    Some(_) => {}
                    None => blocked[class as usize] = true,
                }
            }
            let Some((class, item)) = best else { break };
            let entry = &self.entries[item.entry as usize];
            let gated = self
                .gate
                .filter(|&(seq, _)| seq == item.seq)
                .map(|(_, fit)| {
                    let n = entry.members.as_slice().len() as u64;
                    (BlockKind::Hosts, Dim::Cpu, n, fit)
                });
            if let Some((kind, dim, cap, allocated)) =
                check(caps, &self.allocation, entry).or(gated)
            {
                if kind != BlockKind::Hosts
                    && never_admitted_in(tree, pool, class, &entry.total).is_some()
                {
                    self.heaps[class as usize].pop();
                    self.skipped.push((class, item));
                    continue;
                }
                out.blocked.push(Blocked {
                    pool,
                    class,
                    kind,
                    dim,
                    request: entry.total[dim],
                    allocated,
                    cap,
                    n_waiting: self.n_queued[class as usize],
                    head: entry.members.as_slice()[0].id,
                });
                blocked[class as usize] = true;
                continue;
            }
            self.heaps[class as usize].pop();
            self.take(class, item, pool, out);
        }
        for (class, item) in self.skipped.drain(..) {
            self.heaps[class as usize].push(item);
        }
    }

    /// Sets (or clears) the head entry that waits for hosts this cycle: see
    /// the `gate` field.
    pub(crate) fn set_gate(&mut self, gate: Option<(u64, u64)>) {
        self.gate = gate;
    }

    /// The head entry of a queue: its arrival number, members and their
    /// summed request.
    pub(crate) fn head_entry(
        &mut self,
        class: TaskClass,
    ) -> Option<(u64, &[PendingTask], Resources)> {
        let item = self.head(class)?;
        let e = &self.entries[item.entry as usize];
        Some((item.seq, e.members.as_slice(), e.total))
    }

    /// Backfill behind a blocked head (see [`crate::backfill`]): looks at
    /// up to `depth` entries of `class` after the head (arrival number
    /// `head_seq`), in admission order, and admits each that passes the
    /// pool's rules now, may fit a host now (`fits_now`: admitted, it
    /// should start now, not wait in placement holding its share) and
    /// either has a known runtime for every task and ends by `until_ms`
    /// if started at `now_ms`, or fits within `extra` (what the pool's
    /// entitlement leaves beside the head at its start; used up as entries
    /// take it; placement keeps it off the head's hosts). The head and
    /// everything not admitted stay queued where they were. Appends to
    /// `out`.
    #[expect(
        clippy::too_many_arguments,
        reason = "the admission context, passed explicitly"
    )]
    pub(crate) fn backfill(
        &mut self,
        pool: PoolId,
        caps: &PoolCaps,
        class: TaskClass,
        head_seq: u64,
        now_ms: u64,
        until_ms: u64,
        mut extra: Resources,
        fits_now: &mut dyn FnMut(&[PendingTask]) -> bool,
        most_free: &mut dyn FnMut() -> Resources,
        depth: usize,
        out: &mut AdmissionResult,
    ) {
        if let Some(miss) = &self.backfill_miss
            && miss.still_misses(
                class,
                head_seq,
                self.version,
                depth,
                now_ms,
                until_ms,
                &extra,
                &self.allocation,
                caps,
                most_free,
            )
        {
            return;
        }
        let version = self.version;
        let miss = BackfillMiss {
            class,
            head_seq,
            version,
            depth,
            now_ms,
            until_ms,
            extra,
            allocation: self.allocation,
            caps: *caps,
            most_free: None,
        };
        let mut asked = false;
        let mut held: Vec<QueueItem> = Vec::new();
        let mut looked = 0;
        while looked < depth {
            let Some(item) = self.head(class) else { break };
            self.heaps[class as usize].pop();
            if item.seq == head_seq {
                held.push(item);
                continue;
            }
            looked += 1;
            let entry = &self.entries[item.entry as usize];
            if check(caps, &self.allocation, entry).is_some() {
                held.push(item);
                continue;
            }
            let members = entry.members.as_slice();
            asked = true;
            if !fits_now(members) {
                held.push(item);
                continue;
            }
            let ends_in_time = members
                .iter()
                .all(|m| m.runtime_ms > 0 && now_ms.saturating_add(m.runtime_ms) <= until_ms);
            if !ends_in_time {
                if !entry.total.fits_in(&extra) {
                    held.push(item);
                    continue;
                }
                extra = extra.saturating_sub(&entry.total);
            }
            self.take(class, item, pool, out);
        }
        for item in held {
            self.heaps[class as usize].push(item);
        }
        self.backfill_miss = (self.version == version).then(|| BackfillMiss {
            most_free: asked.then(most_free),
            ..miss
        });
    }

    /// Admits the entry of `item` (already popped from its heap).
    fn take(&mut self, class: TaskClass, item: QueueItem, pool: PoolId, out: &mut AdmissionResult) {
        self.version += 1;
        let entry = &mut self.entries[item.entry as usize];
        entry.seq = 0;
        let members = std::mem::replace(&mut entry.members, Members::Gang(Box::new([])));
        let (controller, total) = (entry.controller, entry.total);
        for task in members.as_slice() {
            self.allocation.add(class, controller, &task.request);
            out.admitted.push(Admitted {
                task: task.id,
                pool,
                class,
                controller,
                request: task.request,
            });
        }
        self.account_queued(class, members.as_slice().len() as u64, &total, false);
        self.free_entries.push(item.entry);
    }

    /// The first `limit` live entries in the order admission takes them:
    /// the four queues merged by priority (higher first), then arrival —
    /// the order [`PoolQueues::admit`] follows while everything fits (a
    /// head that does not fit stops only its own queue). A read: one pass
    /// over the heaps keeping the best `limit` items (O(n log limit)),
    /// nothing moves.
    pub(crate) fn first_in_order(&self, limit: usize) -> Vec<QueuedEntry> {
        use std::cmp::Reverse;
        if limit == 0 {
            return Vec::new();
        }
        // A min-heap of the best items seen so far: its top is the worst.
        let mut best: BinaryHeap<Reverse<(QueueItem, u8)>> = BinaryHeap::with_capacity(limit + 1);
        for class in TaskClass::ALL {
            for &item in self.heaps[class as usize].iter() {
                if self.entries[item.entry as usize].seq != item.seq {
                    continue; // cancelled
                }
                if best.len() == limit {
                    if best.peek().is_some_and(|Reverse((w, _))| item <= *w) {
                        continue;
                    }
                    best.pop();
                }
                best.push(Reverse((item, class as u8)));
            }
        }
        let mut items: Vec<(QueueItem, u8)> = best.into_iter().map(|Reverse(x)| x).collect();
        items.sort_unstable_by_key(|x| Reverse(x.0));
        items
            .into_iter()
            .map(|(item, class)| {
                let e = &self.entries[item.entry as usize];
                let members = e.members.as_slice();
                QueuedEntry {
                    class: TaskClass::ALL[class as usize],
                    priority: item.priority,
                    seq: item.seq,
                    head: members[0].id,
                    n_tasks: u32::try_from(members.len()).unwrap_or(u32::MAX),
                    total: e.total,
                }
            })
            .collect()
    }

    /// Panics if the queue accounting disagrees with the entries.
    pub(crate) fn check_invariants(&self) {
        let mut n_queued = [0u64; 4];
        let mut queued = [[0u128; N_DIMS]; 2];
        let mut live_items = 0usize;
        for heap in &self.heaps {
            for item in heap.iter() {
                let e = &self.entries[item.entry as usize];
                if e.seq != item.seq {
                    continue;
                }
                live_items += 1;
                let members = e.members.as_slice();
                assert!(!members.is_empty());
                let mut total = Resources::ZERO;
                for m in members {
                    total.add_assign(&m.request);
                }
                assert_eq!(total, e.total, "entry total is the sum of its members");
                n_queued[e.class as usize] += members.len() as u64;
                for d in 0..N_DIMS {
                    queued[usize::from(e.class == TaskClass::Revocable)][d] +=
                        u128::from(total.0[d]);
                }
            }
        }
        let live_entries = self.entries.iter().filter(|e| e.seq != 0).count();
        assert_eq!(
            live_items, live_entries,
            "every live entry is in exactly one heap"
        );
        assert_eq!(live_entries + self.free_entries.len(), self.entries.len());
        assert_eq!(
            n_queued, self.n_queued,
            "queued task counts match the queues"
        );
        assert_eq!(queued, self.queued, "queued sums match the queues");
    }
}

/// The first rule the entry breaks: (rule, dimension, cap, allocated).
fn check(
    caps: &PoolCaps,
    allocation: &Allocation,
    entry: &Entry,
) -> Option<(BlockKind, Dim, u64, u64)> {
    let over = |kind: BlockKind, held: &Resources, cap: &Resources| {
        held.saturating_add(&entry.total)
            .first_exceeding(cap)
            .map(|d| (kind, d, cap[d], held[d]))
    };
    match entry.class {
        TaskClass::Revocable => {
            over(
                BlockKind::SlackEntitlement,
                &allocation.revocable,
                &caps.slack_entitlement,
            )
            .map(|(_, d, cap, held)| {
                // Name the slack limit when it, not the shared slack, binds.
                if caps.slack_entitlement[d] >= caps.slack_cap[d] {
                    (BlockKind::SlackLimit, d, cap, held)
                } else {
                    (BlockKind::SlackEntitlement, d, cap, held)
                }
            })
        }
        class => over(BlockKind::Entitlement, &allocation.total, &caps.entitlement)
            .or_else(|| {
                (class == TaskClass::NonPreemptible)
                    .then(|| {
                        over(
                            BlockKind::Reservation,
                            &allocation.non_preemptible,
                            &caps.reservation,
                        )
                    })
                    .flatten()
            })
            .or_else(|| {
                // At least one controller runs, whatever the limit (as YARN
                // always lets one application master run): the cap is a
                // share of the entitlement, which follows demand, so a lone
                // driver would otherwise wait forever for the demand of the
                // executors it has not started yet.
                let lone_first =
                    allocation.controller.is_zero() && matches!(entry.members, Members::One(_));
                (entry.controller && !lone_first)
                    .then(|| {
                        over(
                            BlockKind::ControllerLimit,
                            &allocation.controller,
                            &caps.controller,
                        )
                    })
                    .flatten()
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u64) -> Resources {
        Resources::new(n, n, 0, 0)
    }

    /// A remembered fruitless backfill look covers a later one only while
    /// nothing is easier: each input made easier alone makes the look due.
    #[test]
    fn a_backfill_miss_covers_only_looks_where_nothing_got_easier() {
        let caps = PoolCaps {
            entitlement: r(100),
            reservation: r(100),
            controller: r(100),
            slack_entitlement: r(100),
            slack_cap: r(100),
        };
        let mut allocation = Allocation::default();
        allocation.add(TaskClass::Normal, false, &r(50));
        let miss = BackfillMiss {
            class: TaskClass::Normal,
            head_seq: 7,
            version: 3,
            depth: 64,
            now_ms: 1_000,
            until_ms: 9_000,
            extra: r(10),
            allocation,
            caps,
            most_free: Some(r(8)),
        };
        let look = |class,
                    seq,
                    version,
                    now,
                    until,
                    extra: Resources,
                    alloc: &Allocation,
                    caps: &PoolCaps,
                    most: Resources| {
            miss.still_misses(
                class,
                seq,
                version,
                64,
                now,
                until,
                &extra,
                alloc,
                caps,
                &mut || most,
            )
        };
        let p = TaskClass::Normal;
        assert!(look(p, 7, 3, 1_000, 9_000, r(10), &allocation, &caps, r(8)));
        assert!(
            look(p, 7, 3, 2_000, 8_000, r(5), &allocation, &caps, r(4)),
            "later, sooner, less room, less free: still nothing"
        );
        assert!(
            !look(p, 7, 4, 1_000, 9_000, r(10), &allocation, &caps, r(8)),
            "queue changed"
        );
        assert!(
            !look(p, 8, 3, 1_000, 9_000, r(10), &allocation, &caps, r(8)),
            "another head"
        );
        assert!(
            !look(p, 7, 3, 999, 9_000, r(10), &allocation, &caps, r(8)),
            "earlier"
        );
        assert!(
            !look(p, 7, 3, 1_000, 9_001, r(10), &allocation, &caps, r(8)),
            "head later"
        );
        assert!(
            !look(p, 7, 3, 1_000, 9_000, r(11), &allocation, &caps, r(8)),
            "more room"
        );
        assert!(
            !look(p, 7, 3, 1_000, 9_000, r(10), &allocation, &caps, r(9)),
            "a host freer"
        );
        let mut less = Allocation::default();
        less.add(TaskClass::Normal, false, &r(49));
        assert!(
            !look(p, 7, 3, 1_000, 9_000, r(10), &less, &caps, r(8)),
            "pool holds less"
        );
        let higher = PoolCaps {
            entitlement: r(101),
            ..caps
        };
        assert!(
            !look(p, 7, 3, 1_000, 9_000, r(10), &allocation, &higher, r(8)),
            "higher cap"
        );
        let unasked = BackfillMiss {
            most_free: None,
            ..miss
        };
        assert!(unasked.still_misses(
            p,
            7,
            3,
            64,
            1_000,
            9_000,
            &r(10),
            &allocation,
            &caps,
            &mut || { panic!("not asked when the look never asked") }
        ),);
    }
}
