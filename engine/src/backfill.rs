//! Reservations for blocked heads, and backfill behind them (EASY
//! backfill, as Slurm's and Maui's, on the engine's own columns).
//!
//! A pool admits its queues in strict order, so a head that cannot start
//! (a gang waiting for whole hosts, or anything over the pool's
//! entitlement) used to stop everything behind it. Now, every cycle:
//!
//! 1. **Gangs wait in the queue, not in placement.** A gang head that
//!    fits the pool's entitlement but not the hosts' free resources now is
//!    not admitted ([`BlockKind::Hosts`]): admitted, it would hold its
//!    share of the pool while it waited for hosts, and nothing could use
//!    that gap. (Not when lower-priority preemptible tasks of its pool
//!    run: admitted, it may evict them, as before.)
//! 2. **A reservation for each blocked head** (up to
//!    [`BackfillConfig::max_reservations`] a cycle): from the running
//!    tasks' expected ends (start + runtime estimate), the earliest time
//!    `at_ms` the head fits both its pool's entitlement and enough hosts,
//!    and those hosts. A head that may never start by the estimates (it
//!    waits for work with no estimate) gets none, and its queue stays in
//!    strict order.
//! 3. **Backfill.** Behind a reserved head, the next
//!    [`BackfillConfig::depth`] entries of its queue are admitted if they
//!    pass the pool's rules now and either every task of theirs has a
//!    runtime estimate and ends by `at_ms`, or they fit what the pool's
//!    entitlement leaves beside the head at `at_ms` and on hosts other
//!    than the head's (EASY's "extra" resources; used up as they take
//!    them): by the estimates, they cannot delay the head.
//! 4. **Fenced hosts.** A task submitted after a reservation's head that
//!    may run past the reservation's `at_ms` (or has no estimate) is not
//!    placed on that reservation's hosts, so they are free when the head's
//!    time comes. (What was submitted before the head is not held back by
//!    it: an admitted gang still waiting for hosts keeps its place.)
//!
//! Reservations hold nothing: the head is admitted by the usual rules
//! when it fits, so a reservation never holds resources its pool is not
//! entitled to, and preemption keeps its meaning. They are recomputed
//! every cycle, so they follow the cluster. Estimates are trusted: a
//! backfilled task that overruns its estimate delays the head (a time
//! limit, `max_running_time`, is the estimate that cannot be overrun).
//!
//! What is approximate: the hosts' times ignore constraints, per-host
//! limits beyond the task's own, GPU devices (counted as a total) and
//! what revocable tasks borrowed; other pools' heads are not foreseen.

use crate::admission::TaskClass;
use crate::host::HostArena;
use crate::pool::PoolId;
use crate::resources::{Dim, N_DIMS, Resources};
use std::collections::BTreeMap;

use crate::task::{PlacedView, TaskArena, flags};

/// Most reservations a cycle makes, whatever the configuration.
pub const MAX_RESERVATIONS: usize = 64;

/// Bounds and switch of reservations and backfill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackfillConfig {
    /// Reserve hosts for blocked heads and backfill behind them (off: a
    /// queue waits behind its head, and gangs wait in placement).
    pub enabled: bool,
    /// Reservations made in one cycle at most (the first blocked heads in
    /// pool order; at most [`MAX_RESERVATIONS`]): each costs a pass over
    /// the running tasks.
    pub max_reservations: usize,
    /// Entries looked at behind a reserved head, per cycle.
    pub depth: usize,
    /// A reservation further ahead than this (ms) is not made.
    pub horizon_ms: u64,
    /// A head's reservation is worked out again after this long (ms), or
    /// at its time if sooner; between, its gang stays held back without a
    /// look at the hosts. (Work that ends before its estimate frees hosts
    /// at most this much before the gang sees it.)
    pub refresh_ms: u64,
}

impl Default for BackfillConfig {
    fn default() -> Self {
        BackfillConfig {
            enabled: true,
            max_reservations: 8,
            depth: 64,
            horizon_ms: 7 * 24 * 3_600_000,
            refresh_ms: 1_000,
        }
    }
}

/// Hosts held from a time for the blocked head of a pool's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartReservation {
    /// The pool.
    pub pool: PoolId,
    /// The queue.
    pub class: TaskClass,
    /// The head entry's first task (a task handle's `to_u64`).
    pub head: crate::admission::TaskId,
    /// Tasks in the head entry.
    pub n_tasks: u32,
    /// When it is expected to start: its pool's entitlement and its hosts
    /// fit it by the running tasks' estimated ends.
    pub at_ms: u64,
    /// The host slots held for it, ascending: other tasks go there only if
    /// they end by `at_ms`.
    pub hosts: Vec<u32>,
}

/// A reservation as last worked out, kept for up to
/// [`BackfillConfig::refresh_ms`].
#[derive(Clone, Debug)]
pub(crate) struct Kept {
    /// When it was worked out.
    pub computed_at: u64,
    /// When the head is expected to start, and on which hosts.
    pub at_ms: u64,
    pub hosts: Vec<u32>,
    /// How many of a gang's tasks fit the free hosts then.
    pub fit: u64,
}

impl Kept {
    /// Whether it still holds at `now_ms`.
    pub fn holds(&self, now_ms: u64, refresh_ms: u64) -> bool {
        now_ms < self.at_ms && now_ms < self.computed_at.saturating_add(refresh_ms)
    }
}

/// How many copies of `request` fit in `avail` (at most `cap`).
#[inline]
pub(crate) fn copies(avail: &Resources, request: &Resources, cap: u64) -> u64 {
    // Most hosts of a busy cluster fit none: no division for them.
    if !request.fits_in(avail) {
        return 0;
    }
    let mut k = cap;
    for d in 0..N_DIMS {
        if let Some(copies) = avail.0[d].checked_div(request.0[d]) {
            k = k.min(copies);
        }
    }
    k
}

/// The up hosts' slots, ascending: a scan of the state columns (cheaper
/// than walking the up hosts' bitmap).
fn up_slots(hosts: &HostArena) -> impl Iterator<Item = u32> + '_ {
    (0..hosts.n_slots())
        .filter(|&s| hosts.is_up_slot(s))
        .map(|s| s as u32)
}

/// Per dimension, the most free on any up host: one pass over the free
/// columns (a forecast asks once a cycle; four passes and a column of
/// up flags built each time were 4 % of a forecast).
pub(crate) fn largest_free(hosts: &HostArena) -> Resources {
    let columns: [&[u64]; N_DIMS] = std::array::from_fn(|d| hosts.free_column(Dim::ALL[d]));
    let mut most = [0u64; N_DIMS];
    for slot in 0..hosts.n_slots() {
        // Branch-free: a host that is not up counts as nothing free.
        let up = u64::from(hosts.is_up_slot(slot));
        for d in 0..N_DIMS {
            most[d] = most[d].max(columns[d][slot] * up);
        }
    }
    Resources(most)
}

/// What reservations need to know of the placed tasks, kept as they are
/// placed and end, so that a reservation costs a walk over the hosts and
/// its pool's calendar rather than over every running task (a forecast
/// makes one at nearly every step).
#[derive(Clone, Debug, Default)]
pub(crate) struct EndIndex {
    /// Per pool slot: the requests of its placed non-revocable tasks with
    /// a runtime estimate, by expected end (rounded down to the second).
    pool_ends: Vec<BTreeMap<u64, Resources>>,
    /// Per host slot: when its last placed task is expected to end
    /// (`u64::MAX`: one has no estimate), unless `host_dirty` (a task that
    /// may have been the last ended: worked out again when read).
    host_empty_at: Vec<u64>,
    host_dirty: Vec<bool>,
    /// Per pool slot: the lowest priority of its placed preemptible tasks
    /// and how many have it, unless `pool_min_dirty`.
    pool_min: Vec<Option<(u32, u32)>>,
    pool_min_dirty: Vec<bool>,
}

/// The lowest priority and how many have it, with one more task of
/// priority `p`.
fn with_priority(min: Option<(u32, u32)>, p: u32) -> Option<(u32, u32)> {
    match min {
        Some((q, n)) if q == p => Some((q, n + 1)),
        Some((q, n)) if q < p => Some((q, n)),
        _ => Some((p, 1)),
    }
}

/// An expected end rounded down to the second (the calendar's key): a
/// reservation worked out from it may begin up to a second early, never
/// late (a forecast cycles only at ends, so one kept past the end it
/// waits for would never be looked at again).
fn second_of(end_ms: u64) -> u64 {
    end_ms / 1000 * 1000
}

impl EndIndex {
    fn grow(&mut self, pool: usize, host: usize) {
        if self.pool_ends.len() <= pool {
            self.pool_ends.resize_with(pool + 1, BTreeMap::new);
            self.pool_min.resize(pool + 1, None);
            self.pool_min_dirty.resize(pool + 1, false);
        }
        if self.host_empty_at.len() <= host {
            self.host_empty_at.resize(host + 1, 0);
            self.host_dirty.resize(host + 1, false);
        }
    }

    /// A task was placed.
    pub(crate) fn placed(&mut self, v: &PlacedView) {
        let (pool, host) = (v.pool as usize, v.host as usize);
        self.grow(pool, host);
        let end = v.expected_end(0);
        if v.flags & flags::REVOCABLE == 0 && end != u64::MAX {
            let sum = self.pool_ends[pool].entry(second_of(end)).or_default();
            *sum = sum.saturating_add(&v.request);
        }
        if !self.host_dirty[host] {
            self.host_empty_at[host] = self.host_empty_at[host].max(end);
        }
        if v.flags & flags::PREEMPTIBLE != 0 && !self.pool_min_dirty[pool] {
            self.pool_min[pool] = with_priority(self.pool_min[pool], v.priority);
        }
    }

    /// A placed task ends (or is taken off its host).
    pub(crate) fn removed(&mut self, v: &PlacedView) {
        let (pool, host) = (v.pool as usize, v.host as usize);
        self.grow(pool, host);
        let end = v.expected_end(0);
        if v.flags & flags::REVOCABLE == 0 && end != u64::MAX {
            let key = second_of(end);
            if let Some(sum) = self.pool_ends[pool].get_mut(&key) {
                *sum = sum.saturating_sub(&v.request);
                if sum.is_zero() {
                    self.pool_ends[pool].remove(&key);
                }
            }
        }
        if end >= self.host_empty_at[host] {
            self.host_dirty[host] = true;
        }
        if v.flags & flags::PREEMPTIBLE != 0
            && let Some((p, n)) = self.pool_min[pool]
            && p == v.priority
        {
            if n > 1 {
                self.pool_min[pool] = Some((p, n - 1));
            } else {
                self.pool_min[pool] = None;
                self.pool_min_dirty[pool] = true;
            }
        }
    }

    /// When the host in `slot` is expected to be empty (`u64::MAX`: a task
    /// there has no estimate).
    fn empty_at(&mut self, tasks: &TaskArena, slot: u32) -> u64 {
        let s = slot as usize;
        self.grow(0, s);
        if self.host_dirty[s] {
            self.host_empty_at[s] = tasks
                .placed_on_host(slot)
                .map(|v| v.expected_end(0))
                .max()
                .unwrap_or(0);
            self.host_dirty[s] = false;
        }
        self.host_empty_at[s]
    }

    /// The lowest priority of the pool's placed preemptible tasks.
    pub(crate) fn min_preemptible_priority(&mut self, tasks: &TaskArena, pool: u32) -> Option<u32> {
        let p = pool as usize;
        self.grow(p, 0);
        if self.pool_min_dirty[p] {
            self.pool_min[p] = tasks
                .placed_in_pool(pool)
                .filter(|v| v.flags & flags::PREEMPTIBLE != 0)
                .fold(None, |min, v| with_priority(min, v.priority));
            self.pool_min_dirty[p] = false;
        }
        self.pool_min[p].map(|(q, _)| q)
    }

    /// When the pool in `slot`, lacking `deficit` of its entitlement, gets
    /// it back by its placed tasks' expected ends (never before `now_ms`;
    /// `u64::MAX` if never by the estimates), and what of its holdings
    /// ends by a time: see [`EndIndex::released_by`].
    pub(crate) fn entitlement_time(&mut self, pool: u32, deficit: Resources, now_ms: u64) -> u64 {
        if deficit.is_zero() {
            return now_ms;
        }
        self.grow(pool as usize, 0);
        let mut left = deficit;
        for (&end, freed) in &self.pool_ends[pool as usize] {
            left = left.saturating_sub(freed);
            if left.is_zero() {
                return end.max(now_ms);
            }
        }
        u64::MAX
    }

    /// What the pool in `slot` holds that is expected to end by `at_ms`.
    pub(crate) fn released_by(&mut self, pool: u32, at_ms: u64) -> Resources {
        self.grow(pool as usize, 0);
        self.pool_ends[pool as usize]
            .range(..=at_ms)
            .fold(Resources::ZERO, |sum, (_, r)| sum.saturating_add(r))
    }

    /// How many of `n` tasks of `request` (at most `cap` a host) fit the
    /// up hosts' free resources now (up to `n`), and when all `n` fit and
    /// on which hosts (ascending): the free resources now, else hosts as
    /// they empty by their tasks' expected ends (a host that fits some
    /// only once part of its tasks end is counted when all have: a
    /// reservation may be later than need be, never earlier). No time if
    /// never by the estimates.
    pub(crate) fn hosts_time(
        &mut self,
        hosts: &HostArena,
        tasks: &TaskArena,
        request: &Resources,
        cap: u64,
        n: u64,
        now_ms: u64,
    ) -> (u64, Option<(u64, Vec<u32>)>) {
        let mut have = 0;
        let mut chosen = Vec::new();
        let mut events: Vec<(u64, u32, u64)> = Vec::new();
        for slot in up_slots(hosts) {
            let k = copies(&hosts.free(slot as usize), request, cap);
            if k > 0 {
                have += k;
                chosen.push(slot);
            }
            if have >= n {
                chosen.sort_unstable();
                return (n, Some((now_ms, chosen)));
            }
            let empty = hosts
                .capacity(slot as usize)
                .saturating_sub(&hosts.reserved(slot as usize));
            let k_empty = copies(&empty, request, cap);
            if k_empty > k {
                let at = self.empty_at(tasks, slot);
                if at != u64::MAX {
                    events.push((at.max(now_ms), slot, k_empty - k));
                }
            }
        }
        let fit = have;
        // Each event adds at least one copy, so the first `n - have` of
        // them in time order are enough: only those are sorted.
        let need = usize::try_from(n - have).unwrap_or(usize::MAX);
        if events.len() > need {
            events.select_nth_unstable(need - 1);
            events.truncate(need);
        }
        events.sort_unstable();
        for (at, slot, dk) in events {
            have += dk;
            chosen.push(slot);
            if have >= n {
                chosen.sort_unstable();
                chosen.dedup();
                return (fit, Some((at, chosen)));
            }
        }
        (fit, None)
    }

    /// Panics unless the index agrees with the placed tasks (rebuilt here).
    pub(crate) fn check_invariants(&self, tasks: &TaskArena) {
        let mut pool_ends: Vec<BTreeMap<u64, Resources>> =
            vec![BTreeMap::new(); self.pool_ends.len()];
        let mut empty_at = vec![0u64; self.host_empty_at.len()];
        let mut pool_min: Vec<Option<(u32, u32)>> = vec![None; self.pool_min.len()];
        for v in tasks.placed_views() {
            let (pool, host) = (v.pool as usize, v.host as usize);
            assert!(
                pool < pool_ends.len() && host < empty_at.len(),
                "every placed task is in the end index"
            );
            let end = v.expected_end(0);
            if v.flags & flags::REVOCABLE == 0 && end != u64::MAX {
                let sum = pool_ends[pool].entry(second_of(end)).or_default();
                *sum = sum.saturating_add(&v.request);
            }
            empty_at[host] = empty_at[host].max(end);
            if v.flags & flags::PREEMPTIBLE != 0 {
                pool_min[pool] = with_priority(pool_min[pool], v.priority);
            }
        }
        assert_eq!(pool_ends, self.pool_ends, "pools' calendars of ends");
        for (h, &at) in empty_at.iter().enumerate() {
            if !self.host_dirty[h] {
                assert_eq!(self.host_empty_at[h], at, "host slot {h}: when it empties");
            }
        }
        for (p, &min) in pool_min.iter().enumerate() {
            if !self.pool_min_dirty[p] {
                assert_eq!(
                    self.pool_min[p], min,
                    "pool slot {p}: lowest preemptible priority"
                );
            }
        }
    }
}
