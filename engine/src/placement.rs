//! Batched placement: admitted tasks onto hosts.
//!
//! Tasks of a batch are grouped into equivalence classes (same request,
//! ports, constraint, strategy and per-host limit), so each class's
//! candidate hosts are computed once, with bitmap algebra: hosts that are
//! up, match the constraint, are not exclusive to others, and are not GPU
//! hosts kept for GPU work. Each class then walks its candidates:
//!
//! - `first_fit`: in slot order, filling each host with as many tasks of the
//!   class as fit before moving on;
//! - `pack` and `spread`: a heap of the candidates that fit, keyed by score
//!   (lower is better) then slot; the best host takes one task, is re-scored
//!   and goes back if it still fits. That is exactly per-task greedy choice,
//!   at O(candidates + tasks · log candidates) per class instead of a scan of
//!   every host per task.
//!
//! Scores: `pack` is the capacity left on the host after the task,
//! normalised per dimension and summed (tightest fit first, so fewer hosts
//! are used and less capacity is stranded); with the GPU-aware option a
//! fractional-GPU task prefers the partly used device it fills best and
//! avoids breaking a whole device, and a whole-GPU task prefers hosts that
//! keep fewer whole devices idle. `spread` is the host's allocated fraction
//! (least allocated first).
//!
//! Gangs are placed first, member by member, and rolled back completely if
//! any member finds no host. Every task that is not placed gets a reason:
//! for each live host, the first check it failed, counted.
//!
//! Processing order (which the reference placer in the tests follows):
//! gangs in batch order, then classes in order of first appearance, tasks of
//! a class in batch order. Large candidate sets are scored in parallel (see
//! `build_heap`), merged in a fixed order: results do not depend on the
//! number of threads.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rayon::prelude::*;
use rustc_hash::FxHashMap;
use std::fmt;

use roaring::RoaringBitmap;

use crate::constraint::{ConstraintCache, ConstraintTable};
use crate::host::{
    EXCLUSIVE_KEY, GpuGrant, HostArena, HostState, MAX_GPU_DEVICES, MILLI_GPUS_PER_DEVICE, Misfit,
};
use crate::resources::{Dim, Resources};
use crate::task::{NO_GANG, NO_HOST, Strategy, TaskArena, TaskHandle, TaskState};

/// Most tasks in one placement batch.
pub const MAX_BATCH: usize = 1_000_000;

/// Placement options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementConfig {
    /// GPU hosts take tasks without GPUs too (default: no, they are kept for
    /// GPU work).
    pub allow_cpu_tasks_on_gpu_hosts: bool,
    /// The `pack` score avoids fragmenting GPUs (default: yes).
    pub gpu_aware: bool,
    /// Candidate sets at least this large are scored in parallel when the
    /// placer has threads (default 4,096; smaller sets cost more to split
    /// than they save).
    pub parallel_min_candidates: u64,
    /// GPU tasks with the `pack` strategy are placed by `gpu_frag` once a
    /// workload mix is known (default: yes; `gpu_frag` beats the GPU-aware
    /// pack on every GPU trace we replay).
    pub gpu_frag_for_gpu_tasks: bool,
    /// Fewest best hosts a class's shape keeps between scans (default
    /// 4,096; it keeps four times the class's tasks when that is more).
    /// Results do not depend on it, only the work does; tests set it low so
    /// that small clusters take the paths of large ones.
    pub shape_prefix_min: usize,
    /// Shapes are kept from one batch to the next, brought up to date with
    /// the hosts changed in between (default: yes). Results do not depend
    /// on it, only the work does.
    pub keep_shapes: bool,
    /// Batches of at least this many tasks are validated and grouped on
    /// the placer's threads, a part each (default 16,384). Results do not
    /// depend on it; tests set it low.
    pub parallel_min_batch: usize,
}

/// Default of [`PlacementConfig::parallel_min_batch`]: below it a second
/// thread's wake-up costs about what it saves.
pub const PARALLEL_MIN_BATCH: usize = 16_384;

/// Default of [`PlacementConfig::shape_prefix_min`].
pub const SHAPE_PREFIX_MIN: usize = 4096;

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            allow_cpu_tasks_on_gpu_hosts: false,
            gpu_aware: true,
            parallel_min_candidates: PARALLEL_MIN_CANDIDATES,
            gpu_frag_for_gpu_tasks: true,
            shape_prefix_min: SHAPE_PREFIX_MIN,
            keep_shapes: true,
            parallel_min_batch: PARALLEL_MIN_BATCH,
        }
    }
}

/// One check a host can fail for a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// The host is draining or down.
    HostNotUp,
    /// The task's constraint does not match the host.
    Constraint,
    /// The host is exclusive and the constraint does not name it.
    Exclusive,
    /// A GPU host, kept for GPU tasks.
    GpuHostReserved,
    /// The job already has its maximum of instances on the host.
    PerHostLimit,
    /// Not enough of a resource is free.
    Insufficient(Dim),
    /// Enough GPU in total, but not on one device / as whole devices.
    GpuFragmented,
    /// Not enough free ports.
    Ports,
    /// The task is pinned to another host (its volume's, a daemon's).
    Pinned,
    /// The host is held for a waiting gang's start reservation, and the
    /// task may run past that start (see [`crate::backfill`]).
    Reserved,
}

const N_CHECKS: usize = 13;

impl Check {
    /// Every check, in order.
    pub const ALL: [Check; N_CHECKS] = [
        Check::HostNotUp,
        Check::Constraint,
        Check::Exclusive,
        Check::GpuHostReserved,
        Check::PerHostLimit,
        Check::Insufficient(Dim::Cpu),
        Check::Insufficient(Dim::Memory),
        Check::Insufficient(Dim::Disk),
        Check::Insufficient(Dim::Gpu),
        Check::GpuFragmented,
        Check::Ports,
        Check::Pinned,
        Check::Reserved,
    ];

    /// The check a host fails when its resources do not fit.
    fn of(misfit: Misfit) -> Check {
        match misfit {
            Misfit::Insufficient(d) => Check::Insufficient(d),
            Misfit::GpuFragmented | Misfit::InvalidGpuRequest => Check::GpuFragmented,
            Misfit::Ports => Check::Ports,
        }
    }

    fn index(self) -> usize {
        match self {
            Check::HostNotUp => 0,
            Check::Constraint => 1,
            Check::Exclusive => 2,
            Check::GpuHostReserved => 3,
            Check::PerHostLimit => 4,
            Check::Insufficient(d) => 5 + d.idx(),
            Check::GpuFragmented => 9,
            Check::Ports => 10,
            Check::Pinned => 11,
            Check::Reserved => 12,
        }
    }
}

/// Why a task was not placed: how many hosts failed each check (each host
/// counted once, at the first check it failed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// Live hosts considered.
    pub n_hosts: u32,
    /// Failed checks with their host counts, most common first.
    pub counts: Vec<(Check, u32)>,
    /// The task's constraint number (to name it).
    pub constraint: u32,
    /// For a gang: its size (the counts are those of the member that found
    /// no host, after the members before it were placed); 0 otherwise.
    pub gang_size: u32,
}

impl Reason {
    /// A sentence such as `0/10000 hosts: 9120 insufficient gpu, 880
    /// constraint zone==b not met`.
    pub fn describe(&self, hosts: &HostArena, constraints: &ConstraintTable) -> String {
        let mut s = String::new();
        if self.gang_size > 0 {
            s.push_str(&format!(
                "gang of {} could not be placed whole; for its first unplaceable member: ",
                self.gang_size
            ));
        }
        s.push_str(&format!("0/{} hosts:", self.n_hosts));
        for (i, (check, n)) in self.counts.iter().enumerate() {
            s.push_str(if i == 0 { " " } else { ", " });
            let what = match check {
                Check::HostNotUp => "not up".to_owned(),
                Check::Constraint => {
                    let c = constraints.get(self.constraint).expect("known constraint");
                    format!("constraint {} not met", c.display(hosts.interner()))
                }
                Check::Exclusive => "exclusive to other work".to_owned(),
                Check::GpuHostReserved => "GPU hosts kept for GPU tasks".to_owned(),
                Check::PerHostLimit => "per-host instance limit reached".to_owned(),
                Check::Insufficient(d) => format!("insufficient {d}"),
                Check::GpuFragmented => "GPU free but fragmented".to_owned(),
                Check::Ports => "insufficient ports".to_owned(),
                Check::Pinned => "not the host the task is pinned to".to_owned(),
                Check::Reserved => "held for a waiting gang's reservation".to_owned(),
            };
            s.push_str(&format!("{n} {what}"));
        }
        if self.counts.is_empty() {
            s.push_str(" no hosts");
        }
        s
    }
}

/// A task placed on a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The task.
    pub task: TaskHandle,
    /// Host slot.
    pub host: u32,
    /// GPU devices it holds.
    pub gpu: GpuGrant,
}

/// A task left unplaced, with why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaced {
    /// The task.
    pub task: TaskHandle,
    /// Why: an index into [`PlacementResult::reasons`] (all unplaced tasks
    /// of one class or gang share one reason).
    pub reason: u32,
}

/// What one placement call did (for benchmarks and tuning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementStats {
    /// Classes (and gang groups) placed from a heap.
    pub heap_classes: u64,
    /// Shape prefixes built (each a scan of the open hosts).
    pub shape_builds: u64,
    /// Shape prefixes brought up to date from the change log (no scan).
    pub shape_refreshes: u64,
    /// Classes that scanned every candidate (past their shape's prefix).
    pub full_scans: u64,
    /// Changed hosts scored afresh for classes.
    pub changed_scored: u64,
    /// Reasons computed.
    pub reasons: u64,
}

/// Output of one placement call; reuse it across calls.
#[derive(Clone, Debug, Default)]
pub struct PlacementResult {
    /// Placements, in processing order.
    pub placed: Vec<Placed>,
    /// Tasks without a host.
    pub unplaced: Vec<Unplaced>,
    /// The reasons unplaced tasks point to.
    pub reasons: Vec<Reason>,
}

impl PlacementResult {
    /// Why `unplaced` found no host.
    pub fn reason_of(&self, unplaced: &Unplaced) -> &Reason {
        &self.reasons[unplaced.reason as usize]
    }

    /// Empties all lists, keeping their capacity.
    pub fn clear(&mut self) {
        self.placed.clear();
        self.unplaced.clear();
        self.reasons.clear();
    }
}

/// Why a batch was refused (nothing was placed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// More than [`MAX_BATCH`] tasks.
    #[error("a batch of {n} tasks exceeds the limit of {MAX_BATCH}")]
    BatchTooLarge {
        /// Tasks in the batch.
        n: usize,
    },
    /// A task handle is stale, already placed, listed twice, or has an
    /// invalid request.
    #[error("task {index} of the batch: {problem}")]
    InvalidTask {
        /// Position in the batch.
        index: usize,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ClassKey {
    request: Resources,
    ports: u16,
    constraint: u32,
    strategy: Strategy,
    /// The limit key (job or label), when a per-host limit applies
    /// (otherwise `u32::MAX`).
    limit_key: u32,
    max_per_host: u16,
    /// The task may use GPU hosts without requesting GPUs.
    may_use_gpu_hosts: bool,
    /// The only host slot the class may use ([`NO_HOST`]: any).
    desired_host: u32,
    /// The hosts it keeps off (`Placer::set_fences`; 0: none, else the
    /// fence's number plus one).
    fence: u32,
}

impl ClassKey {
    /// The class with its shape's host rules only: no constraint, no
    /// per-host limit (what a shape's hosts are fitted and scored as).
    fn shape_class(&self) -> ClassKey {
        ClassKey {
            constraint: 0,
            limit_key: u32::MAX,
            max_per_host: 0,
            fence: 0,
            ..*self
        }
    }
}

/// What a class's candidate scores depend on: classes of one shape differ
/// only by constraint and per-host limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShapeKey {
    request: Resources,
    ports: u16,
    strategy: Strategy,
    gpu_hosts_out: bool,
    names_exclusive: bool,
}

/// What a reason's counts depend on, besides the per-host limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ReasonKey {
    request: Resources,
    ports: u16,
    constraint: u32,
    gpu_hosts_out: bool,
    desired_host: u32,
}

/// A shape's best hosts as of log position `built_at`, sorted by (score,
/// slot): every fitting host of the shape that is not in `prefix` has a
/// key above `bound` (`complete`: `prefix` is every fitting host). A
/// refresh keeps it so as hosts change (see `Placer::refresh_shape`).
#[derive(Debug, Default)]
struct Shape {
    built_at: u32,
    complete: bool,
    prefix: Vec<(u64, u32)>,
    /// The last key kept when it was built.
    bound: (u64, u32),
    /// Hosts kept when it was built.
    built_len: usize,
}

/// Resources held on a host for an instance that has no task there (its
/// volume, or its resources while it restarts): (job, instance) → (host
/// slot, amount). A task of that instance placed on that host uses them
/// first.
pub type Reservations = FxHashMap<(u32, u32), (u32, Resources)>;

/// Placement state kept between batches: per-host instance counts of jobs
/// with a per-host limit, the constraint cache, and the shapes (scored
/// hosts) with the change log that keeps them exact. A placer keeps shapes
/// only for the last arena it placed on, and must be the only placer on
/// that arena (it consumes [`HostArena::take_changes`]).
#[derive(Debug, Default)]
pub struct Placer {
    config: PlacementConfig,
    /// Per job with a per-host limit: instances per host slot.
    job_host: FxHashMap<u32, FxHashMap<u32, u16>>,
    cache: ConstraintCache,
    /// Smallest cpu and memory request of the batch.
    min_request: (u64, u64),
    /// The arena and smallest request the host words (`open_words` and the
    /// others) were last built for: a batch on the same arena with the
    /// same smallest request only brings the hosts changed since up to
    /// date.
    words_for: Option<(u64, (u64, u64))>,
    classes: FxHashMap<ClassKey, usize>,
    /// Host slots each fence keeps its tasks off, and each fenced task's
    /// fence (see [`Placer::set_fences`]).
    fences: Vec<Vec<u32>>,
    fence_of: FxHashMap<TaskHandle, u32>,
    /// Per-batch scratch arena (class membership), reset every batch.
    bump: bumpalo::Bump,
    class_keys: Vec<ClassKey>,
    gangs: Vec<(u32, Vec<TaskHandle>)>,
    /// Scratch: the batch's tasks with a desired host.
    pinned: Vec<TaskHandle>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    /// The engine-owned pool for parallel candidate scans (none: one thread).
    threads: Option<std::sync::Arc<rayon::ThreadPool>>,
    /// Dense forms (one bit per host slot, see [`crate::scan`]) of the
    /// batch's host sets: open hosts (up, and able to take the batch's
    /// smallest request; full hosts leave it and stay out of every later
    /// scan), exclusive hosts, GPU hosts, and each constraint's hosts.
    words: usize,
    open_words: Vec<u64>,
    exclusive_words: Vec<u64>,
    gpu_words: Vec<u64>,
    constraint_words: FxHashMap<u32, Vec<u64>>,
    /// Scratch: one class's candidate hosts, as words.
    mask: Vec<u64>,
    /// Live and up hosts, as words (for reasons).
    live_words: Vec<u64>,
    up_words: Vec<u64>,
    /// Per shape of class (see `fill_heap`): its best hosts, sorted. Kept
    /// between batches for the arena `arena` (0: none).
    shapes: FxHashMap<ShapeKey, Shape>,
    arena: u64,
    /// Hosts changed, in order (a host at most once between two `fill_heap`
    /// calls), since the shapes were last all dropped (kept between batches
    /// with the shapes; the hosts changed between batches are appended at
    /// the start of a batch); per host, 1 + the index of its latest entry
    /// (0: unchanged), and the `class_no` it was last logged in.
    change_log: Vec<u32>,
    changed_at: Vec<u32>,
    stamp: Vec<u32>,
    /// Counts `fill_heap` calls.
    class_no: u32,
    /// Counts host changes in the batch (memoised reasons hold while it
    /// stays the same).
    changes: u64,
    reason_memo: FxHashMap<ReasonKey, (u64, [u32; N_CHECKS], u32)>,
    /// Unplaced tasks get an empty reason, not counted (a forecast reads
    /// none; counting them was most of its time).
    no_reasons: bool,
    stats: PlacementStats,
    /// Scratch for shapes: their host mask and scored hosts.
    shape_mask: Vec<u64>,
    scored: Vec<Reverse<(u64, u32)>>,
    /// Scratch: one list per part of a parallel scan, kept (with their
    /// room) between scans so that a scan allocates nothing.
    parts: Vec<Vec<Reverse<(u64, u32)>>>,
    /// Prefix lists of the last batch's shapes, reused by this batch's.
    spare_prefixes: Vec<Vec<(u64, u32)>>,
    /// Scratch: the batch's tasks for the GPU mix learner.
    learn: Vec<TaskHandle>,
    /// Scratch: task indices seen in the batch being validated.
    seen: Vec<u64>,
    /// Scratch: the parts a batch is grouped in (one per thread).
    group_parts: Vec<GroupPart>,
    /// Scratch: hosts changed between batches.
    seen_hosts: Vec<u32>,
    /// The `gpu_frag` score's compiled mix and memo.
    frag: crate::gpufrag::FragModel,
    /// The mix set by the caller (none: learned from the tasks seen).
    given_mix: Option<crate::gpufrag::GpuMix>,
    learner: crate::gpufrag::MixLearner,
}

impl Placer {
    /// A placer with these options.
    pub fn new(config: PlacementConfig) -> Self {
        Placer {
            config,
            ..Default::default()
        }
    }

    /// A placer for a fork of the arenas it places on (see
    /// [`crate::Engine::fork`]): the same options, thread pool, per-host
    /// counts and `gpu_frag` mix, so it decides as this one would; the
    /// cached shapes are built again.
    pub fn fork(&self) -> Self {
        let mut placer = Placer {
            config: self.config,
            job_host: self.job_host.clone(),
            threads: self.threads.clone(),
            given_mix: self.given_mix.clone(),
            learner: self.learner.clone(),
            no_reasons: self.no_reasons,
            ..Default::default()
        };
        let mix = placer
            .given_mix
            .clone()
            .unwrap_or_else(|| placer.learner.mix());
        placer.frag.set_mix(&mix);
        placer
    }

    /// The same placer scanning large candidate sets on `threads` threads
    /// (of its own pool); results are identical for any number.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = (threads > 1).then(|| {
            std::sync::Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("peloton-place-{i}"))
                    .build()
                    .expect("placement thread pool starts"),
            )
        });
        self
    }

    /// The same placer scanning on `pool` (the engine's own; `None`: one
    /// thread), so the engine runs one pool rather than one per part.
    pub fn with_pool(mut self, pool: Option<std::sync::Arc<rayon::ThreadPool>>) -> Self {
        self.threads = pool;
        self
    }

    /// Sets the workload mix the `gpu_frag` score measures fragmentation
    /// against (`None`: learn it from the tasks seen, the default).
    pub fn set_gpu_mix(&mut self, mix: Option<crate::gpufrag::GpuMix>) {
        let compiled = mix.clone().unwrap_or_else(|| self.learner.mix());
        self.frag.set_mix(&compiled);
        self.drop_frag_shapes();
        self.given_mix = mix;
    }

    /// Drops the shapes scored by `gpu_frag` (their scores depend on the
    /// mix, which changed).
    fn drop_frag_shapes(&mut self) {
        let spare = &mut self.spare_prefixes;
        self.shapes.retain(|key, shape| {
            if key.strategy == Strategy::GpuFrag {
                keep_spare(spare, std::mem::take(&mut shape.prefix));
                return false;
            }
            true
        });
    }

    /// The mix the `gpu_frag` score used in the last batch.
    pub fn gpu_mix(&self) -> &crate::gpufrag::GpuMix {
        self.frag.mix()
    }

    /// Rebuilds the learned mix as it grows (`MixLearner::due`); a given
    /// mix was compiled when it was set.
    fn refresh_gpu_mix(&mut self) {
        if self.given_mix.is_none()
            && (self.learner.due() || (self.frag.is_empty() && self.learner.since_built > 0))
        {
            self.frag.set_mix(&self.learner.mix());
            self.drop_frag_shapes();
            self.learner.since_built = 0;
        }
    }

    /// Sets which hosts each type of the mix may use, for a batch that
    /// places by `gpu_frag` (constraints are evaluated through the batch's
    /// cache).
    fn refresh_gpu_eligibility(&mut self, hosts: &HostArena, constraints: &ConstraintTable) {
        let cache = &mut self.cache;
        let reweighed = self
            .frag
            .set_eligible(hosts, |id| match constraints.get(id) {
                None | Some(crate::constraint::Constraint::True) => None,
                Some(c) => Some(cache.evaluate(c, hosts).clone()),
            });
        if reweighed {
            self.drop_frag_shapes();
        }
    }

    /// The strategy a task is placed with: `pack` GPU tasks use `gpu_frag`
    /// when configured and a mix is known; without a mix `gpu_frag` is
    /// `pack`.
    fn effective(&self, strategy: Strategy, request: &Resources) -> Strategy {
        effective_strategy(&self.config, !self.frag.is_empty(), strategy, request)
    }

    /// What the last batch did.
    pub fn stats(&self) -> PlacementStats {
        self.stats
    }

    /// Whether unplaced tasks are told why (default: yes). Without, each
    /// gets an empty reason (no host counts) for its constraint: what is
    /// placed does not change, only what is explained.
    pub fn set_reasons(&mut self, on: bool) {
        self.no_reasons = !on;
    }

    /// Keeps tasks off hosts in the batches placed until
    /// [`Placer::clear_fences`]: the task `t` with `fence_of[t] = i` may not
    /// be placed on the hosts `fences[i]` (a gang's members keep off the
    /// same hosts). As a constraint does, through the classes' host masks;
    /// the hosts stay open to every other task. Unplaced tasks count the
    /// hosts as [`Check::Reserved`].
    pub fn set_fences(&mut self, fences: Vec<Vec<u32>>, fence_of: FxHashMap<TaskHandle, u32>) {
        debug_assert!(fence_of.values().all(|&i| (i as usize) < fences.len()));
        self.fences = fences;
        self.fence_of = fence_of;
    }

    /// Ends [`Placer::set_fences`].
    pub fn clear_fences(&mut self) {
        self.fences.clear();
        self.fence_of.clear();
    }

    /// The fence of `task` as a class key holds it.
    fn fence(&self, task: TaskHandle) -> u32 {
        fence_key(&self.fence_of, task)
    }

    /// Instances of `job` on the host in `slot` (for jobs with a per-host
    /// limit).
    pub fn instances_on_host(&self, job: u32, slot: u32) -> u16 {
        self.job_host
            .get(&job)
            .and_then(|hosts| hosts.get(&slot))
            .copied()
            .unwrap_or(0)
    }

    /// Places a batch of unplaced tasks. Validates the whole batch first: on
    /// error nothing is placed. `out` is cleared first.
    pub fn place(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        constraints: &ConstraintTable,
        batch: &[TaskHandle],
        now_ms: u64,
        out: &mut PlacementResult,
    ) -> Result<(), PlacementError> {
        self.place_with(
            hosts,
            tasks,
            constraints,
            &mut Reservations::default(),
            batch,
            now_ms,
            out,
        )
    }

    /// [`Placer::place`] with host reservations: tasks with a desired host
    /// are placed first, one by one (before gangs and classes), each using
    /// what is reserved for its instance on that host; what it does not
    /// need stays reserved.
    #[expect(
        clippy::too_many_arguments,
        reason = "the placement context, passed explicitly"
    )]
    pub fn place_with(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        constraints: &ConstraintTable,
        reservations: &mut Reservations,
        batch: &[TaskHandle],
        now_ms: u64,
        out: &mut PlacementResult,
    ) -> Result<(), PlacementError> {
        out.clear();
        if batch.len() > MAX_BATCH {
            return Err(PlacementError::BatchTooLarge { n: batch.len() });
        }
        // Validate and group (gangs by gang number, the rest by class), then
        // put class members in one flat slice ordered by class (a counting
        // sort), in the batch's scratch arena, which is reset for the next
        // batch. A refused batch changes only scratch state.
        self.cache.clear();
        self.refresh_gpu_mix();
        let mut bump = std::mem::take(&mut self.bump);
        bump.reset();
        let class_of: &mut [u32] = bump.alloc_slice_fill_copy(batch.len(), u32::MAX);
        let mut pinned = std::mem::take(&mut self.pinned);
        let mut learn = std::mem::take(&mut self.learn);
        let grouped = self.group(tasks, constraints, batch, class_of, &mut pinned, &mut learn);
        let uses_frag = match grouped {
            Ok(uses_frag) => uses_frag,
            Err(e) => {
                self.learn = learn;
                self.bump = bump;
                self.pinned = pinned;
                self.gangs.clear();
                return Err(e);
            }
        };
        for &task in learn.iter() {
            if self
                .learner
                .first_sight(tasks.arrival(task).expect("validated"))
            {
                let spec = tasks.spec(task).expect("validated");
                self.learner.observe(crate::gpufrag::MixKey {
                    request: spec.request,
                    constraint: spec.constraint,
                });
            }
        }
        self.learn = learn;
        let n_classes = self.class_keys.len();
        let offsets: &mut [u32] = bump.alloc_slice_fill_copy(n_classes + 1, 0);
        for &c in class_of.iter().filter(|&&c| c != u32::MAX) {
            offsets[c as usize + 1] += 1;
        }
        for c in 0..n_classes {
            offsets[c + 1] += offsets[c];
        }
        let cursor: &mut [u32] = bump.alloc_slice_copy(&offsets[..n_classes]);
        let flat: &mut [TaskHandle] = bump.alloc_slice_fill_copy(
            offsets[n_classes] as usize,
            batch.first().copied().unwrap_or(TaskHandle::from_u64(0)),
        );
        for (i, &c) in class_of.iter().enumerate() {
            if c != u32::MAX {
                flat[cursor[c as usize] as usize] = batch[i];
                cursor[c as usize] += 1;
            }
        }

        if uses_frag {
            self.refresh_gpu_eligibility(hosts, constraints);
        }
        let words = crate::scan::n_words(hosts.n_slots());
        let keep_words = self.config.keep_shapes
            && self.arena != 0
            && self.arena == hosts.id()
            && self.words == words
            && self.words_for.is_some_and(|(arena, _)| arena == hosts.id());
        self.words = words;
        self.start_change_log(hosts);
        if keep_words {
            // Only the hosts changed since the last batch (every change of
            // a host's resources, state, attributes or liveness is in the
            // arena's list, which `start_change_log` took).
            let changed = std::mem::take(&mut self.seen_hosts);
            for &slot in &changed {
                self.refresh_host_words(hosts, slot);
            }
            self.seen_hosts = changed;
            if self
                .words_for
                .is_some_and(|(_, min)| min != self.min_request)
            {
                self.build_open_words(hosts);
            }
            #[cfg(debug_assertions)]
            {
                // Debug builds (every test) check them against a rebuild.
                let kept = [
                    self.open_words.clone(),
                    self.up_words.clone(),
                    self.live_words.clone(),
                    self.gpu_words.clone(),
                    self.exclusive_words.clone(),
                ];
                self.build_host_words(hosts);
                let built = [
                    &self.open_words,
                    &self.up_words,
                    &self.live_words,
                    &self.gpu_words,
                    &self.exclusive_words,
                ];
                for (k, b) in kept.iter().zip(built) {
                    assert_eq!(k, b, "host words kept up to date equal a rebuild");
                }
            }
        } else {
            self.build_host_words(hosts);
        }
        self.words_for = Some((hosts.id(), self.min_request));
        self.constraint_words.clear();
        self.reason_memo.clear();
        self.stats = PlacementStats::default();
        for &task in pinned.iter() {
            self.place_pinned(hosts, tasks, constraints, reservations, task, now_ms, out);
        }
        self.pinned = pinned;
        let gangs = std::mem::take(&mut self.gangs);
        for (_, members) in &gangs {
            self.place_gang(hosts, tasks, constraints, members, now_ms, out);
        }
        self.gangs = gangs;
        for class in 0..n_classes {
            let key = self.class_keys[class];
            let members = &flat[offsets[class] as usize..offsets[class + 1] as usize];
            self.place_class(hosts, tasks, constraints, key, members, now_ms, out);
        }
        self.bump = bump;
        // Every change this batch made went through `touch`, so the
        // arena's list of changes holds nothing the log does not.
        let changed_at = &self.changed_at;
        hosts.take_changes(|slot| {
            debug_assert!(
                changed_at.get(slot as usize).is_none_or(|&at| at > 0),
                "host {slot} changed in the batch without a log entry"
            );
        });
        self.arena = hosts.id();
        Ok(())
    }

    /// Readies the change log for a batch. Shapes are kept when they were
    /// made for these hosts (and the options allow): the hosts changed since
    /// the last batch are logged, as changes within a batch are, so each
    /// shape is brought up to date when next used. Otherwise every shape is
    /// dropped and the log starts empty. A long log is cut by half, dropping
    /// the shapes older than the cut.
    /// Builds the host words of a batch from the arena: open hosts (up,
    /// able to take the batch's smallest request), exclusive, GPU, live
    /// and up hosts.
    fn build_host_words(&mut self, hosts: &HostArena) {
        let no_hosts = RoaringBitmap::new();
        crate::scan::to_words(
            hosts.exclusive_hosts().unwrap_or(&no_hosts),
            self.words,
            &mut self.exclusive_words,
        );
        crate::scan::to_words(hosts.gpu_hosts(), self.words, &mut self.gpu_words);
        crate::scan::to_words(hosts.live_hosts(), self.words, &mut self.live_words);
        crate::scan::to_words(
            hosts.in_state(HostState::Up),
            self.words,
            &mut self.up_words,
        );
        self.build_open_words(hosts);
    }

    /// Open hosts from the up hosts' words: those able to take the batch's
    /// smallest request.
    fn build_open_words(&mut self, hosts: &HostArena) {
        self.open_words.clear();
        self.open_words.resize(self.words, 0);
        for (w, &up) in self.up_words.iter().enumerate() {
            let mut bits = up;
            let mut open = 0u64;
            while bits != 0 {
                let b = bits.trailing_zeros();
                if self.is_open(hosts, w as u32 * 64 + b) {
                    open |= 1 << b;
                }
                bits &= bits - 1;
            }
            self.open_words[w] = open;
        }
    }

    /// Brings one host's bits in the host words up to date.
    fn refresh_host_words(&mut self, hosts: &HostArena, slot: u32) {
        let up = hosts.in_state(HostState::Up).contains(slot);
        let open = up && self.is_open(hosts, slot);
        crate::scan::set_bit(&mut self.open_words, slot, open);
        crate::scan::set_bit(&mut self.up_words, slot, up);
        crate::scan::set_bit(
            &mut self.live_words,
            slot,
            hosts.live_hosts().contains(slot),
        );
        crate::scan::set_bit(&mut self.gpu_words, slot, hosts.gpu_hosts().contains(slot));
        crate::scan::set_bit(
            &mut self.exclusive_words,
            slot,
            hosts.exclusive_hosts().is_some_and(|x| x.contains(slot)),
        );
    }

    fn start_change_log(&mut self, hosts: &mut HostArena) {
        let n_slots = hosts.n_slots();
        let keep = self.config.keep_shapes && self.arena != 0 && self.arena == hosts.id();
        if !keep {
            // Their lists are kept for the next shapes.
            for (_, shape) in self.shapes.drain() {
                keep_spare(&mut self.spare_prefixes, shape.prefix);
            }
            self.change_log.clear();
            self.changed_at.clear();
            self.stamp.clear();
            self.class_no = 1;
            hosts.take_changes(|_| {});
        } else if self.change_log.len() > LOG_CUT_AT.max(16 * n_slots) {
            let cut = (self.change_log.len() / 2) as u32;
            let spare = &mut self.spare_prefixes;
            self.shapes.retain(|_, shape| {
                if shape.built_at < cut {
                    keep_spare(spare, std::mem::take(&mut shape.prefix));
                    return false;
                }
                shape.built_at -= cut;
                true
            });
            self.change_log.drain(..cut as usize);
            for at in &mut self.changed_at {
                *at = at.saturating_sub(cut);
            }
        }
        // Shapes too stale to be brought up to date would be built again
        // when used: they are dropped now rather than kept in memory.
        let (log_len, stale) = (self.change_log.len(), stale_after(n_slots));
        let spare = &mut self.spare_prefixes;
        self.shapes.retain(|_, shape| {
            if log_len - shape.built_at as usize > stale {
                keep_spare(spare, std::mem::take(&mut shape.prefix));
                return false;
            }
            true
        });
        self.changed_at
            .resize(n_slots.max(self.changed_at.len()), 0);
        self.stamp.resize(n_slots.max(self.stamp.len()), 0);
        // A new window: each host changed since the last batch gets an entry.
        self.next_window();
        let mut changed = std::mem::take(&mut self.seen_hosts);
        changed.clear();
        hosts.take_changes(|slot| changed.push(slot));
        for &slot in &changed {
            self.touch(slot);
        }
        self.seen_hosts = changed;
    }

    /// Validates the batch and groups it: tasks with a desired host (and
    /// no gang) into `pinned`, gang members into `self.gangs` by gang
    /// number, the rest into classes (`self.class_keys`, and each task's
    /// class in `class_of`, in order of first appearance); the tasks that
    /// teach the GPU mix into `learn`; sets the batch's smallest request.
    /// Large batches are grouped in parts on the placer's threads and the
    /// parts merged in batch order, so the result is the same for any
    /// number of threads. Returns whether any class uses `gpu_frag`, or the
    /// first bad task's error (in batch order), with nothing changed but
    /// scratch state.
    fn group(
        &mut self,
        tasks: &TaskArena,
        constraints: &ConstraintTable,
        batch: &[TaskHandle],
        class_of: &mut [u32],
        pinned: &mut Vec<TaskHandle>,
        learn: &mut Vec<TaskHandle>,
    ) -> Result<bool, PlacementError> {
        let n_parts = match &self.threads {
            Some(pool) if batch.len() >= self.config.parallel_min_batch.max(1) => {
                pool.current_num_threads().max(1)
            }
            _ => 1,
        };
        let part_len = batch.len().div_ceil(n_parts).max(1);
        let mut parts = std::mem::take(&mut self.group_parts);
        parts.resize_with(batch.len().div_ceil(part_len), GroupPart::default);
        let rules = GroupRules {
            config: self.config,
            frag_on: !self.frag.is_empty(),
            learn_mix: self.given_mix.is_none(),
            fence_of: &self.fence_of,
        };
        let job =
            |((part_tasks, part_classes), part): ((&[TaskHandle], &mut [u32]), &mut GroupPart)| {
                part.group(&rules, tasks, constraints, part_tasks, part_classes);
            };
        match &self.threads {
            Some(pool) if parts.len() > 1 => pool.install(|| {
                batch
                    .par_chunks(part_len)
                    .zip(class_of.par_chunks_mut(part_len))
                    .zip(parts.par_iter_mut())
                    .for_each(job);
            }),
            _ => batch
                .chunks(part_len)
                .zip(class_of.chunks_mut(part_len))
                .zip(parts.iter_mut())
                .for_each(job),
        }
        // A task listed twice (in one part or two) is found here.
        let top = batch.iter().map(|t| t.idx()).max().unwrap_or(0);
        if self.seen.len() <= top / 64 {
            self.seen.resize(top / 64 + 1, 0);
        }
        let mut bad = parts.iter().any(|p| p.bad);
        if !bad {
            for &task in batch {
                let i = task.idx() as u32;
                if crate::scan::bit(&self.seen, i) {
                    bad = true;
                    break;
                }
                crate::scan::set_bit(&mut self.seen, i, true);
            }
        }
        self.clear_seen(batch);
        if bad {
            // The checks again, one task at a time, to name the first bad
            // one as a serial pass would.
            self.group_parts = parts;
            let refused = batch
                .iter()
                .enumerate()
                .find_map(|(i, &task)| self.check_task(tasks, constraints, i, task).err())
                .expect("a part or the duplicate pass found a bad task");
            self.clear_seen(batch);
            return Err(refused);
        }
        // Merge the parts in batch order: a class or gang gets the number
        // of its first appearance, members keep their order.
        self.classes.clear();
        self.class_keys.clear();
        self.gangs.clear();
        pinned.clear();
        learn.clear();
        self.min_request = (u64::MAX, u64::MAX);
        let mut uses_frag = false;
        let mut gang_index: FxHashMap<u32, usize> = FxHashMap::default();
        let mut start = 0;
        for part in &mut parts {
            part.remap.clear();
            for key in &part.keys {
                let n_classes = self.class_keys.len();
                let class = *self.classes.entry(*key).or_insert(n_classes);
                if class == n_classes {
                    self.class_keys.push(*key);
                }
                part.remap.push(class as u32);
            }
            let end = (start + part_len).min(batch.len());
            if part.remap.iter().enumerate().any(|(i, &c)| c as usize != i) {
                for c in &mut class_of[start..end] {
                    if *c != u32::MAX {
                        *c = part.remap[*c as usize];
                    }
                }
            }
            start = end;
            pinned.extend_from_slice(&part.pinned);
            learn.extend_from_slice(&part.learn);
            for (gang, members) in part.gangs.drain(..) {
                match gang_index.get(&gang) {
                    Some(&g) => self.gangs[g].1.extend_from_slice(&members),
                    None => {
                        gang_index.insert(gang, self.gangs.len());
                        self.gangs.push((gang, members));
                    }
                }
            }
            self.min_request.0 = self.min_request.0.min(part.min_request.0);
            self.min_request.1 = self.min_request.1.min(part.min_request.1);
            uses_frag |= part.uses_frag;
        }
        self.group_parts = parts;
        Ok(uses_frag)
    }

    /// Empties the seen-set of a batch's tasks.
    fn clear_seen(&mut self, batch: &[TaskHandle]) {
        for &task in batch {
            crate::scan::set_bit(&mut self.seen, task.idx() as u32, false);
        }
    }

    /// Checks task `index` of the batch (live, not placed, listed once, a
    /// valid request and a known constraint), marking it in `seen`.
    fn check_task(
        &mut self,
        tasks: &TaskArena,
        constraints: &ConstraintTable,
        index: usize,
        task: TaskHandle,
    ) -> Result<crate::task::TaskSpec, PlacementError> {
        let invalid = |problem: String| PlacementError::InvalidTask { index, problem };
        let spec = tasks.spec(task).map_err(|e| invalid(e.to_string()))?;
        if tasks.state(task) == Ok(TaskState::Placed) {
            return Err(invalid("already placed".into()));
        }
        let i = task.idx() as u32;
        if crate::scan::bit(&self.seen, i) {
            return Err(invalid("listed twice in the batch".into()));
        }
        crate::scan::set_bit(&mut self.seen, i, true);
        crate::host::validate_gpu_request(spec.request[Dim::Gpu]).map_err(invalid)?;
        if spec.request[Dim::Cpu] == 0 && spec.request[Dim::Memory] == 0 {
            return Err(invalid("a task must request some cpu or memory".into()));
        }
        if constraints.get(spec.constraint).is_none() {
            return Err(invalid(format!("unknown constraint {}", spec.constraint)));
        }
        Ok(spec)
    }

    /// Takes a placed task off its host (it ended or was preempted): frees
    /// its resources and per-host count; the task goes back to `Admitted`.
    pub fn unplace(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        task: TaskHandle,
    ) -> Result<(), crate::task::TaskError> {
        let (request, ports, max_per_host, limit_key) = tasks.release_view(task)?;
        let Some(host) = tasks.host(task)? else {
            return Err(crate::task::TaskError::NotFound);
        };
        let gpu = tasks.gpu(task)?;
        hosts.release(host as usize, &request, u32::from(ports), gpu);
        self.touch(host);
        if max_per_host > 0 {
            let job_hosts = self
                .job_host
                .get_mut(&limit_key)
                .expect("counted on placement");
            let count = job_hosts.get_mut(&host).expect("counted on placement");
            *count -= 1;
            if *count == 0 {
                job_hosts.remove(&host);
                if job_hosts.is_empty() {
                    self.job_host.remove(&limit_key);
                }
            }
        }
        if hosts.in_state(HostState::Up).contains(host) && self.is_open(hosts, host) {
            crate::scan::set_bit(&mut self.open_words, host, true);
        }
        tasks.set_unplaced(task, TaskState::Admitted)?;
        Ok(())
    }

    /// Records a task that already runs on the host in `slot` (adopted
    /// after the service restarted): takes its resources there without
    /// checking constraints or per-host limits, since it is there already.
    /// Refused, changing nothing, if its resources are not free on the host.
    pub fn place_on(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        task: TaskHandle,
        slot: u32,
        now_ms: u64,
    ) -> Result<(), String> {
        let spec = tasks.spec(task).map_err(|e| e.to_string())?;
        if tasks.state(task) == Ok(TaskState::Placed) {
            return Err("already placed".into());
        }
        if !hosts.live_hosts().contains(slot) {
            return Err(format!("host slot {slot} is not live"));
        }
        hosts
            .fits(slot as usize, &spec.request, u32::from(spec.ports))
            .map_err(|m| format!("does not fit on the host: {m:?}"))?;
        let key = self.key_of(&spec);
        self.commit(hosts, tasks, task, slot, &key, now_ms);
        Ok(())
    }

    fn key_of(&self, spec: &crate::task::TaskSpec) -> ClassKey {
        class_key(spec, self.effective(spec.strategy, &spec.request))
    }

    /// Places one task with a desired host, using what is reserved for its
    /// instance there (taken back if the task does not fit after all).
    #[expect(
        clippy::too_many_arguments,
        reason = "the placement context, passed explicitly"
    )]
    fn place_pinned(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        constraints: &ConstraintTable,
        reservations: &mut Reservations,
        task: TaskHandle,
        now_ms: u64,
        out: &mut PlacementResult,
    ) {
        let spec = tasks.spec(task).expect("validated");
        let key = self.key_of(&spec);
        let slot = spec.desired_host;
        let owner = (spec.job, spec.instance);
        let reserved = match reservations.get(&owner) {
            Some(&(s, amount)) if s == slot => Some(amount),
            _ => None,
        };
        // (Not the open-host filter: a host whose free resources are all
        // reserved for this instance is not open; resources are checked
        // below, with the reservation released.)
        if self.pin_allowed(hosts, constraints, &key) {
            if let Some(amount) = reserved {
                hosts.hand_over(slot as usize, &amount);
                self.touch(slot);
            }
            if self.host_fits(hosts, slot, &key) {
                let placed = self.commit(hosts, tasks, task, slot, &key, now_ms);
                out.placed.push(placed);
                if let Some(amount) = reserved {
                    keep_unused_reservation(
                        hosts,
                        reservations,
                        owner,
                        slot,
                        amount,
                        &spec.request,
                    );
                }
                return;
            }
            if let Some(amount) = reserved {
                hosts
                    .reserve(slot as usize, &amount)
                    .expect("what was handed over is free");
            }
        }
        let reason = out.reasons.len() as u32;
        out.reasons.push(self.reason(hosts, constraints, &key));
        out.unplaced.push(Unplaced { task, reason });
    }

    /// Whether the class's desired host passes its constraint and the host
    /// rules (resources and the open-host filter aside).
    fn pin_allowed(
        &mut self,
        hosts: &HostArena,
        constraints: &ConstraintTable,
        key: &ClassKey,
    ) -> bool {
        let constraint = constraints.get(key.constraint).expect("validated");
        self.ensure_constraint_words(hosts, constraint, key.constraint);
        self.passes_attributes(hosts, constraint, key, key.desired_host)
    }

    /// Hosts a task may use at all, before resources: up, matching its
    /// constraint, not exclusive to others, and not GPU hosts kept for GPU
    /// work. (The same rules as placement, for preemption planning.)
    pub fn hosts_for(
        &self,
        hosts: &HostArena,
        constraint: &crate::constraint::Constraint,
        spec: &crate::task::TaskSpec,
    ) -> RoaringBitmap {
        let may_use = spec.flags & crate::task::flags::MAY_USE_GPU_HOSTS != 0;
        let mut matching = constraint.evaluate(hosts);
        if spec.desired_host != NO_HOST {
            matching = pinned_to(&matching, spec.desired_host);
        }
        self.apply_host_rules(hosts, constraint, matching, spec.request, may_use)
    }

    /// Narrows `matching` (the constraint's hosts) by the rules every task
    /// obeys: up hosts only, exclusive hosts only if the constraint names
    /// them, GPU hosts only for GPU work unless allowed.
    pub(crate) fn apply_host_rules(
        &self,
        hosts: &HostArena,
        constraint: &crate::constraint::Constraint,
        mut out: RoaringBitmap,
        request: Resources,
        may_use_gpu_hosts: bool,
    ) -> RoaringBitmap {
        out &= hosts.in_state(HostState::Up);
        if let Some(exclusive) = hosts.exclusive_hosts()
            && !names_exclusive(hosts, constraint)
        {
            out -= exclusive;
        }
        if request[Dim::Gpu] == 0 && !self.config.allow_cpu_tasks_on_gpu_hosts && !may_use_gpu_hosts
        {
            out -= hosts.gpu_hosts();
        }
        out
    }

    /// True if the host can take the batch's smallest cpu and memory request.
    fn is_open(&self, hosts: &HostArena, slot: u32) -> bool {
        let s = slot as usize;
        hosts.free_column(Dim::Cpu)[s] >= self.min_request.0
            && hosts.free_column(Dim::Memory)[s] >= self.min_request.1
    }

    /// Sets `mask` to the hosts a class may use at all: open (so up),
    /// matching its constraint, not exclusive to others, not GPU hosts kept
    /// for GPU work, below its job's per-host limit. Resources are left to
    /// the fit kernel.
    /// Returns the class's shape.
    fn class_mask(
        &mut self,
        hosts: &HostArena,
        constraints: &ConstraintTable,
        key: &ClassKey,
    ) -> ShapeKey {
        let constraint = constraints.get(key.constraint).expect("validated");
        let shape = ShapeKey {
            request: key.request,
            ports: key.ports,
            strategy: key.strategy,
            gpu_hosts_out: self.gpu_hosts_out(key),
            names_exclusive: names_exclusive(hosts, constraint),
        };
        let everywhere = matches!(constraint, crate::constraint::Constraint::True);
        self.ensure_constraint_words(hosts, constraint, key.constraint);
        let mut mask = std::mem::take(&mut self.mask);
        self.open_by_rules(&shape, &mut mask);
        if !everywhere {
            for (m, c) in mask.iter_mut().zip(&self.constraint_words[&key.constraint]) {
                *m &= c;
            }
        }
        if key.desired_host != NO_HOST {
            let keep = crate::scan::bit(&mask, key.desired_host);
            mask.fill(0);
            crate::scan::set_bit(&mut mask, key.desired_host, keep);
        }
        if key.max_per_host > 0
            && let Some(counts) = self.job_host.get(&key.limit_key)
        {
            for (&slot, &n) in counts {
                if n >= key.max_per_host {
                    crate::scan::set_bit(&mut mask, slot, false);
                }
            }
        }
        if key.fence > 0 {
            for &slot in &self.fences[key.fence as usize - 1] {
                crate::scan::set_bit(&mut mask, slot, false);
            }
        }
        self.mask = mask;
        shape
    }

    /// Sets `mask` to the open hosts the shape's host rules allow: not
    /// exclusive to others, not GPU hosts kept for GPU work.
    fn open_by_rules(&self, shape: &ShapeKey, mask: &mut Vec<u64>) {
        mask.clear();
        mask.extend_from_slice(&self.open_words);
        if !shape.names_exclusive {
            for (m, x) in mask.iter_mut().zip(&self.exclusive_words) {
                *m &= !x;
            }
        }
        if shape.gpu_hosts_out {
            for (m, g) in mask.iter_mut().zip(&self.gpu_words) {
                *m &= !g;
            }
        }
    }

    fn host_fits(&self, hosts: &HostArena, slot: u32, key: &ClassKey) -> bool {
        if key.max_per_host > 0
            && self
                .job_host
                .get(&key.limit_key)
                .and_then(|c| c.get(&slot))
                .is_some_and(|&n| n >= key.max_per_host)
        {
            return false;
        }
        crate::scan::FitColumns::of(hosts).fits_slot(
            slot as usize,
            &key.request,
            u32::from(key.ports),
        ) && (key.request[Dim::Gpu] == 0
            || hosts
                .fits(slot as usize, &key.request, u32::from(key.ports))
                .is_ok())
    }

    fn score(&self, hosts: &HostArena, slot: u32, key: &ClassKey) -> f64 {
        score_for(hosts, slot, key, self.config.gpu_aware, &self.frag)
    }

    /// Fills the heap with the `k` best hosts of `mask` (the class's
    /// candidates) that fit, keyed by (score, slot).
    ///
    /// Keeping only `k` hosts (the class's task count) loses nothing: each
    /// task changes only the host it lands on, so after `t < k` tasks at
    /// least one of the first `k` is still in the heap, untouched, and
    /// scores no worse than any host left out.
    ///
    /// The `k` best come from the class's shape (request, ports, strategy
    /// and host rules; classes differ from it only by constraint and per-host
    /// limit): a sorted prefix of the shape's best hosts as of a point in
    /// the batch's change log, such that every fitting host not in it scores
    /// worse than all of it. Its hosts unchanged since, that the class may
    /// use, come in order; hosts changed since are scored afresh; the best
    /// `k` of the two hold the `k` best of all. Once enough hosts changed,
    /// they are folded into the prefix ([`Placer::refresh_shape`], no scan).
    /// A shape is built (a scan of every open host) when first used, and
    /// again when it has run short: fewer than `k` usable hosts left, after
    /// hosts it held filled up or when a class wants more than it kept. A
    /// class that still runs off its end (a narrow constraint) scans every
    /// candidate instead. Either way the result is exactly what a scan of
    /// every candidate gives.
    fn fill_heap(&mut self, hosts: &HostArena, key: &ClassKey, shape_key: ShapeKey, k: usize) {
        self.next_window();
        self.stats.heap_classes += 1;
        let mut entries = std::mem::take(&mut self.heap).into_vec();
        let mut built = false;
        match self.shapes.get(&shape_key) {
            None => {
                self.build_shape(hosts, key, shape_key, k);
                built = true;
            }
            // After many more changes than hosts (a shape kept from batches
            // ago) a scan costs less than going through them.
            Some(shape)
                if self.change_log.len() - shape.built_at as usize
                    > stale_after(hosts.n_slots()) =>
            {
                self.build_shape(hosts, key, shape_key, k);
                built = true;
            }
            // Changed hosts are rescored for every class until there are
            // enough of them to fold into the prefix once.
            Some(shape)
                if self.change_log.len() - shape.built_at as usize
                    > (shape.prefix.len() / 4).max(self.config.shape_prefix_min / 64) =>
            {
                self.refresh_shape(hosts, key, shape_key);
            }
            Some(_) => {}
        }
        loop {
            entries.clear();
            let shape = &self.shapes[&shape_key];
            let (built_at, complete) = (shape.built_at, shape.complete);
            let mask = &self.mask;
            let changed_at = &self.changed_at;
            for &(score, slot) in &shape.prefix {
                if entries.len() == k {
                    break;
                }
                if changed_at[slot as usize] <= built_at && crate::scan::bit(mask, slot) {
                    entries.push(Reverse((score, slot)));
                }
            }
            if entries.len() < k && !complete {
                let ran_down = shape.prefix.len() < shape.built_len / 2;
                let too_short = shape.built_len < 4 * k;
                if !built && (ran_down || too_short) {
                    self.build_shape(hosts, key, shape_key, k);
                    built = true;
                    continue;
                }
                // Past the prefix: every candidate is scanned.
                self.stats.full_scans += 1;
                entries.clear();
                let mut parts = std::mem::take(&mut self.parts);
                self.scan_into(hosts, key, &self.mask, &mut entries, &mut parts);
                self.parts = parts;
            } else {
                // Hosts changed since the prefix was brought up to date,
                // each once (at its latest log entry).
                for i in built_at as usize..self.change_log.len() {
                    let slot = self.change_log[i];
                    if self.changed_at[slot as usize] as usize != i + 1
                        || !crate::scan::bit(&self.mask, slot)
                        || !self.host_fits(hosts, slot, key)
                    {
                        continue;
                    }
                    entries.push(Reverse((score_key(self.score(hosts, slot, key)), slot)));
                    self.stats.changed_scored += 1;
                }
            }
            break;
        }
        if entries.len() > k && k > 0 {
            entries.select_nth_unstable_by(k, |a, b| a.0.cmp(&b.0));
            entries.truncate(k);
        }
        // Heapify in O(k) rather than k pushes.
        self.heap = BinaryHeap::from(entries);
    }

    /// Brings a shape up to date with the hosts changed since it was built
    /// or last refreshed, without a scan: each changed host leaves the
    /// prefix and comes back, rescored, if it is still open, allowed and
    /// fitting, and scores no worse than the prefix's bound. Hosts outside
    /// the prefix that did not change still score above the bound, so the
    /// prefix keeps its promise. Costs O(prefix + changes).
    fn refresh_shape(&mut self, hosts: &HostArena, key: &ClassKey, shape_key: ShapeKey) {
        let log_len = self.change_log.len() as u32;
        let mut shape = self.shapes.remove(&shape_key).expect("the shape exists");
        if shape.built_at == log_len {
            self.shapes.insert(shape_key, shape);
            return;
        }
        self.stats.shape_refreshes += 1;
        let built_at = shape.built_at;
        let changed_at = &self.changed_at;
        shape
            .prefix
            .retain(|&(_, slot)| changed_at[slot as usize] <= built_at);
        let mut rules = std::mem::take(&mut self.shape_mask);
        self.open_by_rules(&shape_key, &mut rules);
        let shape_class = key.shape_class();
        let mut fresh = std::mem::take(&mut self.scored);
        fresh.clear();
        for i in built_at as usize..log_len as usize {
            let slot = self.change_log[i];
            // Each host once, at its latest entry.
            if self.changed_at[slot as usize] as usize != i + 1
                || !crate::scan::bit(&rules, slot)
                || !self.host_fits(hosts, slot, &shape_class)
            {
                continue;
            }
            let entry = (score_key(self.score(hosts, slot, &shape_class)), slot);
            if shape.complete || entry <= shape.bound {
                fresh.push(Reverse(entry));
            }
            self.stats.changed_scored += 1;
        }
        if !fresh.is_empty() {
            fresh.sort_unstable_by_key(|r| r.0);
            // Merged in place from the back: the prefix grows by the fresh
            // entries and nothing else is allocated. Keys are unique (a
            // changed host left the prefix above), so the order is total.
            let prefix = &mut shape.prefix;
            let (mut i, mut j) = (prefix.len(), fresh.len());
            prefix.resize(i + j, (0, 0));
            let mut at = prefix.len();
            while j > 0 {
                at -= 1;
                if i > 0 && prefix[i - 1] > fresh[j - 1].0 {
                    prefix[at] = prefix[i - 1];
                    i -= 1;
                } else {
                    prefix[at] = fresh[j - 1].0;
                    j -= 1;
                }
            }
            // Hosts that got better (a task lowers a `pack` score) join the
            // prefix; past twice its built size it is cut back to that size.
            // Every host cut scores above the new bound, and every host
            // outside scored above the old one, so the promise holds.
            let keep = shape.built_len.max(1);
            if prefix.len() > 2 * keep {
                prefix.truncate(keep);
                shape.bound = prefix[keep - 1];
                shape.complete = false;
            }
        }
        shape.built_at = log_len;
        self.scored = fresh;
        self.shape_mask = rules;
        self.shapes.insert(shape_key, shape);
    }

    /// Whether GPU hosts are kept from the class (it requests no GPU).
    fn gpu_hosts_out(&self, key: &ClassKey) -> bool {
        key.request[Dim::Gpu] == 0
            && !self.config.allow_cpu_tasks_on_gpu_hosts
            && !key.may_use_gpu_hosts
    }

    /// Scores every open host the shape's host rules allow, and keeps the
    /// best (at least `shape_prefix_min`, and four times the class's tasks)
    /// sorted.
    fn build_shape(&mut self, hosts: &HostArena, key: &ClassKey, shape_key: ShapeKey, k: usize) {
        self.stats.shape_builds += 1;
        let mut mask = std::mem::take(&mut self.shape_mask);
        self.open_by_rules(&shape_key, &mut mask);
        let mut shape = self.shapes.remove(&shape_key).unwrap_or_else(|| Shape {
            prefix: self.spare_prefixes.pop().unwrap_or_default(),
            ..Shape::default()
        });
        let mut entries = std::mem::take(&mut shape.prefix);
        entries.clear();
        let mut scored = std::mem::take(&mut self.scored);
        scored.clear();
        // The shape's hosts, whatever the constraint and per-host limit.
        let shape_class = key.shape_class();
        let mut parts = std::mem::take(&mut self.parts);
        self.scan_into(hosts, &shape_class, &mask, &mut scored, &mut parts);
        self.parts = parts;
        let keep = (4 * k).max(self.config.shape_prefix_min.max(1));
        shape.complete = scored.len() <= keep;
        if !shape.complete {
            scored.select_nth_unstable_by(keep, |a, b| a.0.cmp(&b.0));
            scored.truncate(keep);
        }
        scored.sort_unstable_by_key(|a| a.0);
        entries.extend(scored.iter().map(|r| r.0));
        shape.bound = entries.last().copied().unwrap_or((u64::MAX, u32::MAX));
        shape.built_len = entries.len();
        shape.prefix = entries;
        shape.built_at = self.change_log.len() as u32;
        self.shapes.insert(shape_key, shape);
        self.scored = scored;
        self.shape_mask = mask;
    }

    /// Every host of `mask` that fits the class, with its score, in slot
    /// order. The fit test runs as a column kernel over 64 hosts at a time;
    /// only hosts that pass it are scored. Large sets are scanned in
    /// parallel over contiguous ranges of hosts and concatenated in range
    /// order, so the result does not depend on the number of threads.
    fn scan_into(
        &self,
        hosts: &HostArena,
        key: &ClassKey,
        mask: &[u64],
        entries: &mut Vec<Reverse<(u64, u32)>>,
        parts: &mut Vec<Vec<Reverse<(u64, u32)>>>,
    ) {
        let gpu_aware = self.config.gpu_aware;
        let frag = &self.frag;
        let columns = crate::scan::FitColumns::of(hosts);
        let ports = u32::from(key.ports);
        let check_devices = key.request[Dim::Gpu] > 0;
        let scan = |words: std::ops::Range<usize>, out: &mut Vec<Reverse<(u64, u32)>>| {
            for w in words {
                if mask[w] == 0 {
                    continue;
                }
                let mut bits = mask[w] & columns.fit_word(w, &key.request, ports);
                while bits != 0 {
                    let slot = (w * 64) as u32 + bits.trailing_zeros();
                    bits &= bits - 1;
                    if check_devices && hosts.fits(slot as usize, &key.request, ports).is_err() {
                        continue;
                    }
                    let score = score_for(hosts, slot, key, gpu_aware, frag);
                    out.push(Reverse((score_key(score), slot)));
                }
            }
        };
        let n_words = mask.len();
        let parallel = self.threads.as_ref().filter(|_| {
            let n: u64 = mask.iter().map(|w| u64::from(w.count_ones())).sum();
            n >= self.config.parallel_min_candidates
        });
        match parallel {
            Some(threads) => {
                let n_parts = threads.current_num_threads() * 4;
                let per = n_words.div_ceil(n_parts).max(1);
                parts.resize_with(n_parts, Vec::new);
                threads.install(|| {
                    parts[..n_parts]
                        .par_iter_mut()
                        .enumerate()
                        .for_each(|(i, part)| {
                            part.clear();
                            let lo = (i * per).min(n_words);
                            scan(lo..(lo + per).min(n_words), part);
                        });
                });
                for part in &parts[..n_parts] {
                    entries.extend_from_slice(part);
                }
            }
            None => scan(0..n_words, entries),
        }
    }

    /// Starts a new window of the change log (between two `fill_heap`
    /// calls, a host gets at most one entry). Window numbers wrap: at 0 every
    /// host's stamp is cleared, so an old stamp is never taken for the
    /// current window.
    fn next_window(&mut self) {
        self.class_no = self.class_no.wrapping_add(1);
        if self.class_no == 0 {
            self.stamp.fill(0);
            self.class_no = 1;
        }
    }

    /// Notes that the host in `slot` changed in this batch (for the shapes'
    /// change log), once per class.
    fn touch(&mut self, slot: u32) {
        let s = slot as usize;
        self.changes += 1;
        if s >= self.changed_at.len() {
            return;
        }
        // No shape is built between two `fill_heap` calls, so one entry
        // per host between them is enough.
        if self.stamp[s] != self.class_no {
            self.stamp[s] = self.class_no;
            self.change_log.push(slot);
            self.changed_at[s] = self.change_log.len() as u32;
        }
    }

    fn commit(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        task: TaskHandle,
        slot: u32,
        key: &ClassKey,
        now_ms: u64,
    ) -> Placed {
        let device = if key.strategy == Strategy::GpuFrag {
            self.frag.delta(hosts, slot as usize, &key.request).1
        } else {
            None
        };
        let gpu = hosts
            .allocate_on(slot as usize, &key.request, u32::from(key.ports), device)
            .expect("the host was checked to fit");
        if key.max_per_host > 0 {
            *self
                .job_host
                .entry(key.limit_key)
                .or_default()
                .entry(slot)
                .or_insert(0) += 1;
        }
        self.touch(slot);
        if !self.is_open(hosts, slot) {
            crate::scan::set_bit(&mut self.open_words, slot, false);
        }
        tasks
            .set_placed(task, slot, gpu, now_ms)
            .expect("validated");
        Placed {
            task,
            host: slot,
            gpu,
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the placement context, passed explicitly"
    )]
    fn place_class(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        constraints: &ConstraintTable,
        key: ClassKey,
        members: &[TaskHandle],
        now_ms: u64,
        out: &mut PlacementResult,
    ) {
        let shape = self.class_mask(hosts, constraints, &key);
        let mut next = 0;
        match key.strategy {
            Strategy::FirstFit => {
                'hosts: for w in 0..self.mask.len() {
                    let mut bits = self.mask[w];
                    while bits != 0 {
                        let slot = (w * 64) as u32 + bits.trailing_zeros();
                        bits &= bits - 1;
                        while next < members.len() && self.host_fits(hosts, slot, &key) {
                            let placed =
                                self.commit(hosts, tasks, members[next], slot, &key, now_ms);
                            out.placed.push(placed);
                            next += 1;
                        }
                        if next == members.len() {
                            break 'hosts;
                        }
                    }
                }
            }
            Strategy::Pack | Strategy::Spread | Strategy::GpuFrag => {
                self.fill_heap(hosts, &key, shape, members.len());
                next = self.take_from_heap(hosts, tasks, &key, members, now_ms, out);
            }
        }
        if next < members.len() {
            let reason = out.reasons.len() as u32;
            out.reasons.push(self.reason(hosts, constraints, &key));
            out.unplaced.extend(
                members[next..]
                    .iter()
                    .map(|&task| Unplaced { task, reason }),
            );
        }
    }

    /// Places `members` one by one on the best host of the heap, putting
    /// the host back with its new score while it still fits; returns how
    /// many were placed (the rest found no host).
    fn take_from_heap(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        key: &ClassKey,
        members: &[TaskHandle],
        now_ms: u64,
        out: &mut PlacementResult,
    ) -> usize {
        // The best host is rescored in place at the top of the heap and
        // sifted down once (for `pack` it usually stays on top), rather than
        // popped and pushed.
        let mut heap = std::mem::take(&mut self.heap);
        let mut placed_all = members.len();
        for (n, &task) in members.iter().enumerate() {
            let Some(mut top) = heap.peek_mut() else {
                placed_all = n;
                break;
            };
            let slot = top.0.1;
            let placed = self.commit(hosts, tasks, task, slot, key, now_ms);
            out.placed.push(placed);
            if self.host_fits(hosts, slot, key) {
                top.0.0 = score_key(self.score(hosts, slot, key));
            } else {
                std::collections::binary_heap::PeekMut::pop(top);
            }
        }
        self.heap = heap;
        placed_all
    }

    /// Places a gang whole or not at all. Its members are grouped by class
    /// (in order of first appearance; a gang is usually one class), and each
    /// group is placed as a class is, from one scan; if a member finds no
    /// host, every member placed so far is taken back, in O(members).
    fn place_gang(
        &mut self,
        hosts: &mut HostArena,
        tasks: &mut TaskArena,
        constraints: &ConstraintTable,
        members: &[TaskHandle],
        now_ms: u64,
        out: &mut PlacementResult,
    ) {
        let start = out.placed.len();
        let mut groups: Vec<(ClassKey, Vec<TaskHandle>)> = Vec::new();
        let mut group_of: FxHashMap<ClassKey, usize> = FxHashMap::default();
        // States other than Admitted before placement, restored on rollback.
        let mut before: Vec<(TaskHandle, TaskState)> = Vec::new();
        for &task in members {
            let mut key = self.key_of(&tasks.spec(task).expect("validated"));
            key.fence = self.fence(task);
            let g = *group_of.entry(key).or_insert_with(|| {
                groups.push((key, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(task);
            let state = tasks.state(task).expect("validated");
            if state != TaskState::Admitted {
                before.push((task, state));
            }
        }
        let mut failed = None;
        for (key, group) in &groups {
            let shape = self.class_mask(hosts, constraints, key);
            self.fill_heap(hosts, key, shape, group.len());
            if self.take_from_heap(hosts, tasks, key, group, now_ms, out) < group.len() {
                failed = Some(*key);
                break;
            }
        }
        let Some(key) = failed else {
            return;
        };
        // The reason is taken before the rollback: why this member found no
        // host with the members before it in place.
        let mut reason = self.reason(hosts, constraints, &key);
        reason.gang_size = members.len() as u32;
        // Roll back: nothing of a partial gang stays reserved.
        for i in start..out.placed.len() {
            let task = out.placed[i].task;
            self.unplace(hosts, tasks, task).expect("just placed");
        }
        out.placed.truncate(start);
        for (task, state) in before {
            tasks.set_state(task, state).expect("live");
        }
        out.reasons.push(reason);
        let reason = out.reasons.len() as u32 - 1;
        out.unplaced
            .extend(members.iter().map(|&task| Unplaced { task, reason }));
    }

    /// Why the class's tasks find no host: each live host counted once, at
    /// the first check it fails. Whole groups of hosts are counted with word
    /// operations (state, constraint, exclusivity, GPU hosts, then each
    /// resource column as a kernel); only GPU device fragmentation is looked
    /// at host by host.
    fn reason(
        &mut self,
        hosts: &HostArena,
        constraints: &ConstraintTable,
        key: &ClassKey,
    ) -> Reason {
        if self.no_reasons {
            return Reason {
                n_hosts: 0,
                counts: Vec::new(),
                constraint: key.constraint,
                gang_size: 0,
            };
        }
        self.stats.reasons += 1;
        let constraint = constraints.get(key.constraint).expect("validated");
        let memo_key = ReasonKey {
            request: key.request,
            ports: key.ports,
            constraint: key.constraint,
            gpu_hosts_out: self.gpu_hosts_out(key),
            desired_host: key.desired_host,
        };
        // Counts without the per-host limit: the same for every class of
        // this key while no host changes.
        let (mut counts, n_hosts) = match self.reason_memo.get(&memo_key) {
            Some(&(at, counts, n_hosts)) if at == self.changes => (counts, n_hosts),
            _ => {
                let (counts, n_hosts) = self.reason_counts(hosts, constraint, key);
                self.reason_memo
                    .insert(memo_key, (self.changes, counts, n_hosts));
                (counts, n_hosts)
            }
        };
        if key.max_per_host > 0
            && let Some(job_counts) = self.job_host.get(&key.limit_key)
        {
            // A host at the limit that passed the attribute checks counts
            // as at the limit, not at the resource check it fails.
            for (&slot, &n) in job_counts {
                if n >= key.max_per_host && self.passes_attributes(hosts, constraint, key, slot) {
                    counts[Check::PerHostLimit.index()] += 1;
                    if let Err(misfit) =
                        hosts.fits(slot as usize, &key.request, u32::from(key.ports))
                    {
                        counts[Check::of(misfit).index()] -= 1;
                    }
                }
            }
        }
        if key.fence > 0 {
            // A fenced host that passed the attribute checks (and is not
            // at the per-host limit, counted above) counts as reserved, not
            // at the resource check it may fail.
            let at_limit = |slot: u32| {
                key.max_per_host > 0
                    && self
                        .job_host
                        .get(&key.limit_key)
                        .and_then(|c| c.get(&slot))
                        .is_some_and(|&n| n >= key.max_per_host)
            };
            for &slot in &self.fences[key.fence as usize - 1] {
                if self.passes_attributes(hosts, constraint, key, slot) && !at_limit(slot) {
                    counts[Check::Reserved.index()] += 1;
                    if let Err(misfit) =
                        hosts.fits(slot as usize, &key.request, u32::from(key.ports))
                    {
                        counts[Check::of(misfit).index()] -= 1;
                    }
                }
            }
        }
        let mut counts: Vec<(Check, u32)> = Check::ALL
            .iter()
            .map(|&c| (c, counts[c.index()]))
            .filter(|&(_, n)| n > 0)
            .collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Reason {
            n_hosts,
            counts,
            constraint: key.constraint,
            gang_size: 0,
        }
    }

    /// Whether the host in `slot` passes the class's attribute checks (live,
    /// pinned host, up, constraint, exclusivity, GPU hosts).
    fn passes_attributes(
        &self,
        hosts: &HostArena,
        constraint: &crate::constraint::Constraint,
        key: &ClassKey,
        slot: u32,
    ) -> bool {
        crate::scan::bit(&self.live_words, slot)
            && (key.desired_host == NO_HOST || key.desired_host == slot)
            && crate::scan::bit(&self.up_words, slot)
            && (matches!(constraint, crate::constraint::Constraint::True)
                || crate::scan::bit(&self.constraint_words[&key.constraint], slot))
            && (names_exclusive(hosts, constraint)
                || !crate::scan::bit(&self.exclusive_words, slot))
            && !(self.gpu_hosts_out(key) && crate::scan::bit(&self.gpu_words, slot))
    }

    /// A reason's counts, per check, and the live hosts, leaving out the
    /// per-host limit.
    fn reason_counts(
        &mut self,
        hosts: &HostArena,
        constraint: &crate::constraint::Constraint,
        key: &ClassKey,
    ) -> ([u32; N_CHECKS], u32) {
        let names_exclusive = names_exclusive(hosts, constraint);
        let gpu_hosts_out = self.gpu_hosts_out(key);
        self.ensure_constraint_words(hosts, constraint, key.constraint);
        let everywhere = matches!(constraint, crate::constraint::Constraint::True);
        let words = self.words;
        let mut counts = [0u32; N_CHECKS];
        let ones = |x: u64| x.count_ones();
        let mut n_hosts = 0;
        // The hosts left after the attribute checks, into `mask`.
        self.mask.clear();
        self.mask.resize(words, 0);
        let constraint_words = (!everywhere).then(|| &self.constraint_words[&key.constraint]);
        for w in 0..words {
            let mut l = self.live_words[w];
            n_hosts += ones(l);
            if key.desired_host != NO_HOST {
                let pin = if key.desired_host as usize / 64 == w {
                    1u64 << (key.desired_host % 64)
                } else {
                    0
                };
                counts[Check::Pinned.index()] += ones(l & !pin);
                l &= pin;
            }
            let u = l & self.up_words[w];
            counts[Check::HostNotUp.index()] += ones(l & !u);
            let mut r = match constraint_words {
                None => u,
                Some(c) => u & c[w],
            };
            counts[Check::Constraint.index()] += ones(u & !r);
            if !names_exclusive {
                let x = r & self.exclusive_words[w];
                counts[Check::Exclusive.index()] += ones(x);
                r &= !x;
            }
            if gpu_hosts_out {
                let g = r & self.gpu_words[w];
                counts[Check::GpuHostReserved.index()] += ones(g);
                r &= !g;
            }
            self.mask[w] = r;
        }
        let columns = crate::scan::FitColumns::of(hosts);
        for w in 0..words {
            let mut r = self.mask[w];
            if r == 0 {
                continue;
            }
            let has = columns.has_words(w, &key.request, u32::from(key.ports));
            for d in Dim::ALL {
                let short = r & !has[d.idx()];
                counts[Check::Insufficient(d).index()] += ones(short);
                r &= !short;
            }
            let short = r & !has[4];
            counts[Check::Ports.index()] += ones(short);
            r &= !short;
            if key.request[Dim::Gpu] > 0 {
                while r != 0 {
                    let slot = w * 64 + r.trailing_zeros() as usize;
                    r &= r - 1;
                    if let Err(misfit) = hosts.fits(slot, &key.request, u32::from(key.ports)) {
                        // Every column has room: the devices do not.
                        counts[Check::of(misfit).index()] += 1;
                    }
                }
            }
        }
        (counts, n_hosts)
    }

    /// Makes sure `constraint_words` holds constraint `id`'s hosts (not
    /// needed for the constraint that matches every host).
    fn ensure_constraint_words(
        &mut self,
        hosts: &HostArena,
        constraint: &crate::constraint::Constraint,
        id: u32,
    ) {
        if !matches!(constraint, crate::constraint::Constraint::True)
            && !self.constraint_words.contains_key(&id)
        {
            let mut words = Vec::new();
            crate::scan::to_words(
                self.cache.evaluate(constraint, hosts),
                self.words,
                &mut words,
            );
            self.constraint_words.insert(id, words);
        }
    }
}

/// The strategy a task is placed with: `gpu_frag` falls back to `pack`
/// until a mix is known (`frag_on`), and GPU tasks asking for `pack` get
/// `gpu_frag` once one is (unless configured off).
fn effective_strategy(
    config: &PlacementConfig,
    frag_on: bool,
    strategy: Strategy,
    request: &Resources,
) -> Strategy {
    match strategy {
        Strategy::GpuFrag if !frag_on => Strategy::Pack,
        Strategy::Pack if config.gpu_frag_for_gpu_tasks && request[Dim::Gpu] > 0 && frag_on => {
            Strategy::GpuFrag
        }
        other => other,
    }
}

/// A task's fence in its class key: 0 for none, else its fence's number
/// plus one (see [`Placer::set_fences`]).
fn fence_key(fence_of: &FxHashMap<TaskHandle, u32>, task: TaskHandle) -> u32 {
    if fence_of.is_empty() {
        return 0;
    }
    fence_of.get(&task).map_or(0, |&i| i + 1)
}

/// What grouping a batch reads of the placer (shared by its threads).
struct GroupRules<'a> {
    config: PlacementConfig,
    /// A `gpu_frag` mix is known.
    frag_on: bool,
    /// The mix is learned from the tasks (none was given).
    learn_mix: bool,
    fence_of: &'a FxHashMap<TaskHandle, u32>,
}

/// One part of a batch, grouped on its own thread ([`Placer::group`]):
/// what the serial pass would have found in these tasks, with classes and
/// gangs numbered within the part until the parts are merged.
#[derive(Debug, Default)]
struct GroupPart {
    /// Classes in order of first appearance in the part; `classes` maps
    /// each to its number in the part.
    keys: Vec<ClassKey>,
    classes: FxHashMap<ClassKey, u32>,
    pinned: Vec<TaskHandle>,
    /// Gangs in order of first appearance, with their members in order.
    gangs: Vec<(u32, Vec<TaskHandle>)>,
    gang_index: FxHashMap<u32, usize>,
    learn: Vec<TaskHandle>,
    min_request: (u64, u64),
    uses_frag: bool,
    /// A task failed a check (the batch is then checked again serially,
    /// which names the first bad task).
    bad: bool,
    /// Merge scratch: the part's class numbers as the batch's.
    remap: Vec<u32>,
}

impl GroupPart {
    fn group(
        &mut self,
        rules: &GroupRules<'_>,
        tasks: &TaskArena,
        constraints: &ConstraintTable,
        batch: &[TaskHandle],
        class_of: &mut [u32],
    ) {
        self.keys.clear();
        self.classes.clear();
        self.pinned.clear();
        self.gangs.clear();
        self.gang_index.clear();
        self.learn.clear();
        self.min_request = (u64::MAX, u64::MAX);
        self.uses_frag = false;
        self.bad = false;
        let mut last: Option<(ClassKey, u32)> = None;
        for (i, &task) in batch.iter().enumerate() {
            let Some(spec) = task_valid(tasks, constraints, task) else {
                self.bad = true;
                return;
            };
            let strategy =
                effective_strategy(&rules.config, rules.frag_on, spec.strategy, &spec.request);
            self.uses_frag |= strategy == Strategy::GpuFrag;
            // Without a given mix, it is learned from the tasks that ask for
            // GPU hosts, each counted once (by arrival number), placed or not.
            if rules.learn_mix
                && (spec.request[Dim::Gpu] > 0
                    || rules.config.allow_cpu_tasks_on_gpu_hosts
                    || spec.flags & crate::task::flags::MAY_USE_GPU_HOSTS != 0)
            {
                self.learn.push(task);
            }
            self.min_request.0 = self.min_request.0.min(spec.request[Dim::Cpu]);
            self.min_request.1 = self.min_request.1.min(spec.request[Dim::Memory]);
            if spec.desired_host != NO_HOST && spec.gang == NO_GANG {
                self.pinned.push(task);
                continue;
            }
            if spec.gang != NO_GANG {
                let gangs = &mut self.gangs;
                let g = *self.gang_index.entry(spec.gang).or_insert_with(|| {
                    gangs.push((spec.gang, Vec::new()));
                    gangs.len() - 1
                });
                self.gangs[g].1.push(task);
                continue;
            }
            let mut key = class_key(&spec, strategy);
            key.fence = fence_key(rules.fence_of, task);
            // Tasks of a job come together: most share the previous class.
            let class = match last {
                Some((k, c)) if k == key => c,
                _ => {
                    let n_classes = self.keys.len() as u32;
                    let class = *self.classes.entry(key).or_insert(n_classes);
                    if class == n_classes {
                        self.keys.push(key);
                    }
                    last = Some((key, class));
                    class
                }
            };
            class_of[i] = class;
        }
    }
}

/// The task's spec if it may be placed: live, not placed, a valid request
/// and a known constraint (whether it is listed twice is checked apart).
/// [`Placer::check_task`] says what is wrong.
fn task_valid(
    tasks: &TaskArena,
    constraints: &ConstraintTable,
    task: TaskHandle,
) -> Option<crate::task::TaskSpec> {
    let spec = tasks.spec(task).ok()?;
    let ok = tasks.state(task) != Ok(TaskState::Placed)
        && crate::host::gpu_request_ok(spec.request[Dim::Gpu])
        && (spec.request[Dim::Cpu] > 0 || spec.request[Dim::Memory] > 0)
        && constraints.get(spec.constraint).is_some();
    ok.then_some(spec)
}

/// The class of a task placed with `strategy` (its effective one).
#[inline]
fn class_key(spec: &crate::task::TaskSpec, strategy: Strategy) -> ClassKey {
    ClassKey {
        request: spec.request,
        ports: spec.ports,
        constraint: spec.constraint,
        strategy,
        limit_key: if spec.max_per_host > 0 {
            spec.limit_key
        } else {
            u32::MAX
        },
        max_per_host: spec.max_per_host,
        may_use_gpu_hosts: spec.flags & crate::task::flags::MAY_USE_GPU_HOSTS != 0,
        desired_host: spec.desired_host,
        fence: 0,
    }
}

/// Whether `constraint` names the `exclusive` attribute (so exclusive hosts
/// are open to it).
fn names_exclusive(hosts: &HostArena, constraint: &crate::constraint::Constraint) -> bool {
    hosts
        .interner()
        .get(EXCLUSIVE_KEY)
        .is_some_and(|k| constraint.mentions(k))
}

/// The one desired host of `matching` (empty if it does not match), without
/// copying the whole set.
fn pinned_to(matching: &RoaringBitmap, desired: u32) -> RoaringBitmap {
    let mut one = RoaringBitmap::new();
    if matching.contains(desired) {
        one.insert(desired);
    }
    one
}

/// A task of instance `owner` was just placed on `slot` with `request`,
/// after its reservation there (`amount`) was released: what it did not
/// take is reserved again for the instance; nothing is kept if it took all.
pub(crate) fn keep_unused_reservation(
    hosts: &mut HostArena,
    reservations: &mut Reservations,
    owner: (u32, u32),
    slot: u32,
    amount: Resources,
    request: &Resources,
) {
    reservations.remove(&owner);
    let mut rest = amount.saturating_sub(request);
    rest.0[Dim::Gpu.idx()] = 0;
    if !rest.is_zero() {
        // What the task did not take of the reservation handed over to it
        // (`HostArena::hand_over`): still free, so this cannot fail.
        hosts
            .reserve(slot as usize, &rest)
            .expect("what the task did not take is free");
        reservations.insert(owner, (slot, rest));
    }
}

/// A change log longer than this (or 16 entries per host slot) is cut by
/// half at the start of a batch.
const LOG_CUT_AT: usize = 1 << 22;

/// Changes since a shape was built after which it is built again rather
/// than brought up to date: twice the host slots, and at least 4,096 (for
/// small clusters, where both are cheap).
fn stale_after(n_slots: usize) -> usize {
    (2 * n_slots).max(4096)
}

/// Spare prefix lists kept for later shapes: at most this many, each of at
/// most `SPARE_MAX_LEN` entries' room (a huge class's list is freed).
const SPARE_MAX: usize = 512;
const SPARE_MAX_LEN: usize = 1 << 16;

/// Keeps a dropped shape's list for a later shape, within the bounds.
fn keep_spare(spare: &mut Vec<Vec<(u64, u32)>>, mut list: Vec<(u64, u32)>) {
    if spare.len() < SPARE_MAX && list.capacity() <= SPARE_MAX_LEN {
        list.clear();
        spare.push(list);
    }
}

/// Default size from which candidate sets are scored in parallel.
const PARALLEL_MIN_CANDIDATES: u64 = 4096;

/// The class's score on the host in `slot` (lower is better).
fn score_for(
    hosts: &HostArena,
    slot: u32,
    key: &ClassKey,
    gpu_aware: bool,
    frag: &crate::gpufrag::FragModel,
) -> f64 {
    let slot = slot as usize;
    match key.strategy {
        Strategy::GpuFrag => {
            // The growth of fragmentation (GPUs, may be negative), offset to
            // stay positive; ties go to the tighter fit.
            let (delta, _) = frag.delta(hosts, slot, &key.request);
            (FRAG_OFFSET + delta).max(0.0) + 1e-4 * pack_score(hosts, slot, &key.request, false)
        }
        Strategy::FirstFit => slot as f64,
        Strategy::Spread => {
            let mut allocated = 0.0;
            for d in Dim::ALL {
                let cap = hosts.capacity_column(d)[slot];
                if cap > 0 {
                    allocated += (cap - hosts.free_column(d)[slot]) as f64 / cap as f64;
                }
            }
            allocated
        }
        Strategy::Pack => pack_score(hosts, slot, &key.request, gpu_aware),
    }
}

/// Added to `gpu_frag`'s fragmentation growth (at most a few GPUs either
/// way) so scores stay non-negative.
const FRAG_OFFSET: f64 = 1000.0;

/// Orders non-negative scores as integers (IEEE-754 bits of non-negative
/// floats sort like the values).
fn score_key(score: f64) -> u64 {
    debug_assert!(score >= 0.0);
    score.max(0.0).to_bits()
}

/// Capacity left on the host after the task, normalised and summed over
/// dimensions (lower = tighter fit). GPU-aware: a fractional request scores
/// the leftover on the device it would use and a penalty for breaking a
/// whole device; a whole-GPU request scores the whole devices left idle.
pub fn pack_score(hosts: &HostArena, slot: usize, request: &Resources, gpu_aware: bool) -> f64 {
    let mut score = 0.0;
    for d in [Dim::Cpu, Dim::Memory, Dim::Disk] {
        let cap = hosts.capacity_column(d)[slot];
        if cap > 0 {
            score += hosts.free_column(d)[slot].saturating_sub(request[d]) as f64 / cap as f64;
        }
    }
    let gpu_cap = hosts.capacity_column(Dim::Gpu)[slot];
    if gpu_cap == 0 {
        return score;
    }
    let gpu = request[Dim::Gpu];
    let gpu_free = hosts.free_column(Dim::Gpu)[slot];
    if !gpu_aware {
        return score + gpu_free.saturating_sub(gpu) as f64 / gpu_cap as f64;
    }
    if gpu == 0 {
        // A task without GPUs on a GPU host (where allowed) takes cpu and
        // memory the host's idle GPUs will need: prefer hosts without idle
        // GPUs, and hosts without GPUs over any of them.
        return score + 1.0 + 4.0 * gpu_free as f64 / gpu_cap as f64;
    }
    let devices = hosts.gpu_free(slot);
    let whole = devices
        .iter()
        .filter(|&&f| u64::from(f) == MILLI_GPUS_PER_DEVICE)
        .count();
    if gpu < MILLI_GPUS_PER_DEVICE {
        // The device best fit would choose: least free that still fits.
        let best = devices
            .iter()
            .filter(|&&f| u64::from(f) >= gpu)
            .min()
            .copied()
            .unwrap_or(0);
        let leftover = u64::from(best).saturating_sub(gpu) as f64 / MILLI_GPUS_PER_DEVICE as f64;
        let breaks_whole = if u64::from(best) == MILLI_GPUS_PER_DEVICE {
            1.0
        } else {
            0.0
        };
        score + 4.0 * (leftover + breaks_whole)
    } else {
        let used = (gpu / MILLI_GPUS_PER_DEVICE) as usize;
        let idle_after = whole.saturating_sub(used) as f64 / MAX_GPU_DEVICES as f64;
        score + 4.0 * idle_after
    }
}

/// Panics unless every live host's free resources plus what its placed
/// tasks hold equal its capacity, and no task sits on a free slot: the
/// accounting invariant tests, fuzz targets and the engine check.
pub fn check_host_accounting(hosts: &HostArena, tasks: &TaskArena) {
    let mut held = vec![Resources::ZERO; hosts.n_slots()];
    for (_, host, request) in tasks.placed() {
        held[host as usize].add_assign(&request);
    }
    for (slot, held) in held.iter().enumerate() {
        if hosts.lookup_slot(slot).is_some() {
            assert_eq!(
                hosts
                    .free(slot)
                    .saturating_add(held)
                    .saturating_add(&hosts.reserved(slot)),
                hosts.capacity(slot).saturating_add(&hosts.borrowed(slot)),
                "host {slot}"
            );
        } else {
            assert!(held.is_zero(), "tasks on free host slot {slot}");
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}
