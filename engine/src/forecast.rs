//! When and where waiting tasks would start: the engine's own cycle run
//! forward on a fork of the live state.
//!
//! A forecast copies the engine ([`Engine::fork`]) and steps the copy
//! through time: running tasks end at their estimated ends (start plus the
//! caller's runtime estimate; a task with no estimate runs forever), and
//! after each batch of ends the copy runs [`Engine::cycle_with`] — the
//! same entitlement, admission and placement code the live loop runs, not
//! a model of it. A waiting task's forecast start is the time of the step
//! whose cycle placed it, on the host it was placed on; its queue position
//! is the order in which admission took the waiting tasks of its pool.
//!
//! Preemption is off by default (victims are not chosen: a periodic
//! forecast of queued work need not pay for it); with
//! [`ForecastConfig::preempt`] (a plan) the fork's cycles choose victims
//! and act on them as the live loop does (`forecast/preempt.rs`), and the
//! forecast lists them ([`Forecast::victims`]). What it does not model:
//! work submitted later, hosts that come or go, the time a launch or a
//! kill takes. It answers "if nothing else happens".
//!
//! Cost is bounded: ends close together are taken as one step (a step
//! covers the ends within `max(min_step_ms, (t - now) / resolution)` of
//! its first, so the error of a start is at most that window), there are
//! at most `max_steps` cycles and nothing is looked at past `horizon_ms`.
//! Tasks not started within those bounds have no start.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::engine::Engine;
use crate::task::{TaskHandle, TaskState};

mod preempt;
pub use preempt::Preemption;

/// Bounds of a forecast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForecastConfig {
    /// Cycles at most (each step runs at least one).
    pub max_steps: u32,
    /// How far ahead of now to look, in ms.
    pub horizon_ms: u64,
    /// Ends within this many ms of a step's first are one step.
    pub min_step_ms: u64,
    /// Further ahead, a step also takes the ends within 1/`resolution` of
    /// the time from now (a start an hour ahead is within a minute).
    pub resolution: u32,
    /// Whether cycles choose victims and preempt them as the live loop
    /// would (see the module's text; off: nothing is preempted).
    pub preempt: bool,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig {
            max_steps: 2_000,
            horizon_ms: 7 * 24 * 3_600_000,
            min_step_ms: 1_000,
            resolution: 64,
            preempt: false,
        }
    }
}

/// When and where a waiting task would start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    /// The start forecast: when the last end of its step frees room.
    pub at_ms: u64,
    /// The earliest it may start: the first end of its step (equal to
    /// `at_ms` for a task started at once).
    pub earliest_ms: u64,
    /// The host slot it would be placed on.
    pub host: u32,
}

/// The forecast of one task that waited when it began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskForecast {
    /// The task.
    pub task: TaskHandle,
    /// Its pool slot.
    pub pool: u32,
    /// Its place among its pool's waiting tasks in the order admission
    /// takes them (1: next); tasks admitted and waiting for a host come
    /// first. 0: not admitted within the forecast.
    pub position: u32,
    /// When and where it would start; none if not within the bounds.
    pub start: Option<Start>,
}

/// Why a forecast stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stopped {
    /// Every waiting task starts.
    #[default]
    AllStarted,
    /// Tasks still wait, and no running task has an estimated end: they
    /// wait for work that runs forever, or that has no estimate.
    NoMoreEnds,
    /// The next end is past the horizon.
    Horizon,
    /// The step bound was reached.
    Steps,
}

/// What a forecast found.
#[derive(Clone, Debug, Default)]
pub struct Forecast {
    /// When it was made.
    pub now_ms: u64,
    /// Every task that waited (queued, or admitted without a host), by
    /// handle.
    pub tasks: Vec<TaskForecast>,
    /// Cycles run.
    pub steps: u32,
    /// Running or started tasks with no runtime estimate (they never end).
    pub unending: u32,
    /// Why it stopped.
    pub stopped: Stopped,
    /// The tasks preempted, in the order chosen (with
    /// [`ForecastConfig::preempt`]; else none).
    pub victims: Vec<Preemption>,
}

impl Forecast {
    /// The forecast of `task`, if it waited when the forecast began.
    pub fn get(&self, task: TaskHandle) -> Option<&TaskForecast> {
        self.tasks
            .binary_search_by_key(&task, |t| t.task)
            .ok()
            .map(|i| &self.tasks[i])
    }

    /// Waiting tasks that start within the bounds.
    pub fn n_started(&self) -> usize {
        self.tasks.iter().filter(|t| t.start.is_some()).count()
    }
}

/// Estimated ends still to come, earliest first (ties by task): those of
/// the tasks running when the forecast began, sorted once and read in
/// order, merged with those of the tasks it starts, in a radix heap. One
/// binary heap of them all took a sixth of a forecast's time popping
/// (200k running tasks: a cache miss per level); a binary heap of the
/// 100k started ones alone still took a twentieth, most of it in sifts.
#[derive(Default)]
struct Ends {
    running: Vec<(u64, TaskHandle)>,
    next: usize,
    started: RadixHeap,
}

impl Ends {
    fn peek(&mut self) -> Option<(u64, TaskHandle)> {
        let a = self.running.get(self.next).copied();
        let b = self.started.peek();
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn pop(&mut self) -> Option<(u64, TaskHandle)> {
        let first = self.peek()?;
        if self.running.get(self.next) == Some(&first) {
            self.next += 1;
        } else {
            self.started.pop();
        }
        Some(first)
    }
}

/// A priority queue of `(end, task)`, smallest first, for keys that
/// mostly go forward: a radix heap (Ahuja, Mehlhorn, Orlin and Tarjan)
/// and, beside it, a binary heap for the few that do not. Bucket `b`
/// holds the entries whose end first differs from `last` (the end last
/// popped from the buckets) at bit `b - 1`; bucket 0 those equal to it,
/// sorted largest first. An entry only ever moves to a lower bucket, each
/// move a sequential copy, where a binary heap's sift missed the cache at
/// every level. A task a forecast starts at `t` ends after `t`, and every
/// end popped is at most `t`, except the stale end of a task a forecast
/// preempted, popped unread ahead of time: an end pushed that is not after
/// `last` then goes to `early`.
struct RadixHeap {
    last: u64,
    /// Entries in the buckets.
    len: usize,
    /// The smallest entry of the first bucket above 0 that is not empty,
    /// once found (while bucket 0 is empty).
    peeked: Option<(u64, TaskHandle)>,
    buckets: [Vec<(u64, TaskHandle)>; 65],
    early: BinaryHeap<Reverse<(u64, TaskHandle)>>,
}

impl Default for RadixHeap {
    fn default() -> Self {
        RadixHeap {
            last: 0,
            len: 0,
            peeked: None,
            buckets: std::array::from_fn(|_| Vec::new()),
            early: BinaryHeap::new(),
        }
    }
}

impl RadixHeap {
    fn bucket(last: u64, end: u64) -> usize {
        (64 - (end ^ last).leading_zeros()) as usize
    }

    /// The first bucket above 0 that is not empty (there are entries and
    /// bucket 0 is empty).
    fn first_bucket(&self) -> usize {
        (1..65)
            .find(|&b| !self.buckets[b].is_empty())
            .expect("len counts the entries")
    }

    fn push(&mut self, end: u64, task: TaskHandle) {
        if end <= self.last {
            self.early.push(Reverse((end, task)));
            return;
        }
        self.buckets[Self::bucket(self.last, end)].push((end, task));
        if self.peeked.is_some_and(|p| (end, task) < p) {
            self.peeked = Some((end, task));
        }
        self.len += 1;
    }

    /// The smallest entry of the buckets, without moving any: bucket 0's,
    /// or the smallest of the first bucket that is not empty.
    fn peek_buckets(&mut self) -> Option<(u64, TaskHandle)> {
        if self.len == 0 {
            return None;
        }
        if let Some(&e) = self.buckets[0].last() {
            return Some(e);
        }
        if self.peeked.is_none() {
            self.peeked = self.buckets[self.first_bucket()].iter().min().copied();
        }
        self.peeked
    }

    fn peek(&mut self) -> Option<(u64, TaskHandle)> {
        let early = self.early.peek().map(|r| r.0);
        match (early, self.peek_buckets()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes the smallest entry. From the buckets with bucket 0 empty, the
    /// first bucket that is not is spread over the buckets below it around
    /// its smallest end (the new `last`): its entries of that end go to
    /// bucket 0, sorted largest first.
    fn pop(&mut self) -> Option<(u64, TaskHandle)> {
        let first = self.peek()?;
        if self.early.peek().is_some_and(|r| r.0 == first) {
            return self.early.pop().map(|r| r.0);
        }
        if self.buckets[0].is_empty() {
            // `first` is that bucket's smallest, found by the peek.
            let b = self.first_bucket();
            let mut moved = std::mem::take(&mut self.buckets[b]);
            let last = first.0;
            self.last = last;
            for &(end, task) in &moved {
                self.buckets[Self::bucket(last, end)].push((end, task));
            }
            // The bucket's allocation is kept for what comes later.
            moved.clear();
            if self.buckets[b].is_empty() {
                self.buckets[b] = moved;
            }
            self.buckets[0].sort_unstable_by(|a, b| b.cmp(a));
            self.peeked = None;
        }
        self.len -= 1;
        self.buckets[0].pop()
    }
}

/// Ends read ahead at a time (`TaskArena::warm_for_end`): enough to
/// overlap their misses, few enough that what they read stays in cache
/// until they end.
const WARM_CHUNK: usize = 64;

/// Where each waiting task's forecast is, by the task's slot (a lookup
/// for every task admitted and placed: a hash map of 100k handles was a
/// tenth of a forecast). A slot freed and taken by a new task in the fork
/// (a preempted task queued again) does not match: the handle is kept.
#[derive(Default)]
struct Index {
    by_slot: Vec<(TaskHandle, u32)>,
}

impl Index {
    fn insert(&mut self, task: TaskHandle, i: u32) {
        let slot = task.idx();
        if self.by_slot.len() <= slot {
            self.by_slot
                .resize(slot + 1, (TaskHandle::from_u64(u64::MAX), u32::MAX));
        }
        self.by_slot[slot] = (task, i);
    }

    fn get(&self, task: TaskHandle) -> Option<u32> {
        self.by_slot
            .get(task.idx())
            .filter(|(t, _)| *t == task)
            .map(|&(_, i)| i)
    }
}

/// Gives a waiting task the next place in its pool's order (once: the
/// first time admission or placement reaches it).
fn take_position(t: &mut TaskForecast, positions: &mut FxHashMap<u32, u32>) {
    if t.position == 0 {
        let n = positions.entry(t.pool).or_insert(0);
        *n += 1;
        t.position = *n;
    }
}

/// Forecasts the engine's waiting tasks from `now_ms`, changing nothing:
/// see the module's text. `runtime(job, instance)` is how long a task of
/// that instance runs once started, in ms (none: forever).
pub fn forecast(
    engine: &Engine,
    now_ms: u64,
    runtime: &dyn Fn(u32, u32) -> Option<u64>,
    config: &ForecastConfig,
) -> Forecast {
    forecast_fork(engine.fork(), now_ms, runtime, config)
}

/// [`forecast`] on a fork the caller made (and may have changed first:
/// e.g. submitted a job to see where and when it would start).
pub fn forecast_fork(
    mut sim: Engine,
    now_ms: u64,
    runtime: &dyn Fn(u32, u32) -> Option<u64>,
    config: &ForecastConfig,
) -> Forecast {
    // Nothing reads why tasks stay unplaced: counting it for every class
    // left unplaced at every step was two thirds of a forecast's time.
    sim.set_placement_reasons(false);
    // Ends come exactly at their estimates here, so a reservation holds
    // until its time (worked out again each step, they were most of a
    // forecast's time).
    sim.set_backfill_refresh(u64::MAX);
    // Tasks that find no host are tried again only when room may have
    // come (not in a step's later cycles). Preemption's eviction plans
    // are made for the tasks without a host: none are parked then.
    sim.set_parking(!config.preempt);
    let mut out = Forecast {
        now_ms,
        ..Forecast::default()
    };
    // The waiting tasks, by handle; where each is in `out.tasks`.
    let mut index = Index::default();
    let mut ends = Ends::default();
    let mut positions: FxHashMap<u32, u32> = FxHashMap::default();
    // Tasks preempted: their ends are stale.
    let mut gone: FxHashSet<TaskHandle> = FxHashSet::default();
    {
        let tasks = sim.tasks();
        for (task, state) in tasks.all() {
            let (job, instance) = tasks.owner(task).expect("live");
            match state {
                TaskState::Placed => {
                    let start = tasks.start_ms(task).expect("live");
                    match runtime(job, instance) {
                        Some(ms) => {
                            let end = start.saturating_add(ms).max(now_ms.saturating_add(1));
                            ends.running.push((end, task));
                        }
                        None => out.unending += 1,
                    }
                }
                TaskState::Pending | TaskState::Admitted => {
                    let (pool, _, _) = tasks.pool_flags_request(task).expect("live");
                    out.tasks.push(TaskForecast {
                        task,
                        pool,
                        position: 0,
                        start: None,
                    });
                }
            }
        }
    }
    out.tasks.sort_unstable_by_key(|t| t.task);
    ends.running.sort_unstable();
    // Running tasks take their own slots again in the order they end, so
    // that ending them walks the task columns forward (at random slots,
    // each end waited for a dozen cache misses). Only their handles
    // change, and only in the fork; with preemption, victims are named by
    // handle, so they keep theirs.
    if !config.preempt {
        let order: Vec<TaskHandle> = ends.running.iter().map(|&(_, t)| t).collect();
        let renumbered = sim
            .renumber_placed(&order)
            .expect("running tasks are placed, each once");
        for (e, t) in ends.running.iter_mut().zip(renumbered) {
            e.1 = t;
        }
    }
    for (i, t) in out.tasks.iter().enumerate() {
        index.insert(t.task, i as u32);
    }
    // Admitted tasks still without a host are ahead of the queues, in the
    // order placement tries them.
    for &task in sim.waiting_tasks() {
        if let Some(i) = index.get(task) {
            take_position(&mut out.tasks[i as usize], &mut positions);
        }
    }
    let mut left = out.tasks.len();
    let mut step_ends: Vec<TaskHandle> = Vec::new();
    let mut t = now_ms;
    let mut earliest = now_ms;
    loop {
        // Cycles at `t` until one changes nothing (a cycle places at most
        // a batch; a placement changes what admission sees).
        loop {
            if out.steps >= config.max_steps {
                out.stopped = Stopped::Steps;
                return out;
            }
            sim.cycle_with(t, config.preempt);
            out.steps += 1;
            let report = sim.report();
            for a in &report.admission.admitted {
                let task = TaskHandle::from_u64(a.task.0);
                if let Some(i) = index.get(task) {
                    take_position(&mut out.tasks[i as usize], &mut positions);
                }
            }
            for p in &report.placement.placed {
                if let Some(i) = index.get(p.task) {
                    let f = &mut out.tasks[i as usize];
                    if f.start.is_none() {
                        f.start = Some(Start {
                            at_ms: t,
                            earliest_ms: earliest,
                            host: p.host,
                        });
                        left -= 1;
                    }
                }
                let (job, instance) = sim.tasks().owner(p.task).expect("placed is live");
                match runtime(job, instance) {
                    Some(ms) => ends.started.push(t.saturating_add(ms.max(1)), p.task),
                    None => out.unending += 1,
                }
            }
            let idle = report.placement.placed.is_empty() && report.admission.admitted.is_empty();
            let n_preempted = if config.preempt {
                preempt::act_on_victims(&mut sim, t, &mut out.victims, &mut gone)
            } else {
                0
            };
            if idle && n_preempted == 0 {
                break;
            }
        }
        if left == 0 {
            out.stopped = Stopped::AllStarted;
            return out;
        }
        // A reservation's time is a moment to look again too: its head
        // is held back until then, and no end may come at it (the fork's
        // ends are the caller's estimates, the reservation's the engine's).
        let wake = sim
            .report()
            .start_reservations
            .iter()
            .map(|r| r.at_ms)
            .filter(|&at| at > t)
            .min();
        // A preempted task's end is stale.
        while let Some((_, task)) = ends.peek()
            && !gone.is_empty()
            && gone.contains(&task)
        {
            ends.pop();
        }
        let next_end = ends.peek().map(|(end, _)| end);
        if let Some(at) = wake
            && next_end.is_none_or(|end| at < end)
        {
            if at.saturating_sub(now_ms) > config.horizon_ms {
                out.stopped = Stopped::Horizon;
                return out;
            }
            earliest = at;
            t = at;
            continue;
        }
        let Some(first) = next_end else {
            out.stopped = Stopped::NoMoreEnds;
            return out;
        };
        if first.saturating_sub(now_ms) > config.horizon_ms {
            out.stopped = Stopped::Horizon;
            return out;
        }
        let window = config
            .min_step_ms
            .max(first.saturating_sub(now_ms) / u64::from(config.resolution.max(1)));
        earliest = first;
        t = first;
        step_ends.clear();
        while let Some((end, task)) = ends.peek() {
            if end > first.saturating_add(window) {
                break;
            }
            ends.pop();
            if !gone.is_empty() && gone.contains(&task) {
                continue;
            }
            t = end;
            step_ends.push(task);
        }
        // The step's ends at random task slots: their columns read first,
        // a chunk at a time (independent reads overlap; see
        // `TaskArena::warm_for_end`), then each ended as the loop ends it.
        for chunk in step_ends.chunks(WARM_CHUNK) {
            let tasks = sim.tasks();
            let warm = chunk
                .iter()
                .fold(0u64, |x, &task| x ^ tasks.warm_for_end(task));
            std::hint::black_box(warm);
            for &task in chunk {
                sim.finish(task).expect("a placed task ends once");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The radix heap pops and peeks what a binary heap does, ties by
        /// task: pushes after the last end popped (as a forecast makes
        /// them), at or before it (a preempted task's stale end popped
        /// ahead), far ahead, and peeks between pushes.
        #[test]
        fn radix_heap_pops_in_order(
            ops in proptest::collection::vec((0u8..6, 0u64..5_000, 0u32..50, 0u32..40), 1..400),
        ) {
            use std::cmp::Reverse;
            let mut radix = RadixHeap::default();
            let mut reference = std::collections::BinaryHeap::new();
            let mut now = 0u64;
            for (op, delta, task, shift) in ops {
                let task = TaskHandle::from_u64(u64::from(task));
                let end = match op {
                    0 => {
                        prop_assert_eq!(radix.peek(), reference.peek().map(|r: &Reverse<(u64, TaskHandle)>| r.0));
                        continue;
                    }
                    1 => {
                        let popped = radix.pop();
                        prop_assert_eq!(popped, reference.pop().map(|r| r.0));
                        if let Some((end, _)) = popped {
                            now = end;
                        }
                        continue;
                    }
                    // After now, sometimes with equal ends.
                    2 => now + 1 + delta % 3,
                    3 => now + 1 + delta,
                    // Far ahead.
                    4 => now.saturating_add(delta << shift),
                    // At or before the last popped.
                    _ => now.saturating_sub(delta % 50),
                };
                radix.push(end, task);
                reference.push(Reverse((end, task)));
            }
            while let Some(r) = reference.pop() {
                prop_assert_eq!(radix.peek(), Some(r.0));
                prop_assert_eq!(radix.pop(), Some(r.0));
            }
            prop_assert_eq!(radix.peek(), None);
            prop_assert_eq!(radix.pop(), None);
        }
    }
}
