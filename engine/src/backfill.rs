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
use crate::host::{HostArena, HostState};
use crate::pool::PoolId;
use crate::resources::{N_DIMS, Resources};
use crate::task::{TaskArena, flags};

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
}

impl Default for BackfillConfig {
    fn default() -> Self {
        BackfillConfig {
            enabled: true,
            max_reservations: 8,
            depth: 64,
            horizon_ms: 7 * 24 * 3_600_000,
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

/// How many copies of `request` fit in `avail` (at most `cap`).
pub(crate) fn copies(avail: &Resources, request: &Resources, cap: u64) -> u64 {
    let mut k = cap;
    for d in 0..N_DIMS {
        if let Some(copies) = avail.0[d].checked_div(request.0[d]) {
            k = k.min(copies);
        }
    }
    k
}

/// How many of `n` tasks of `request` (at most `cap` a host) fit the up
/// hosts' free resources now; counts up to `n` only.
pub(crate) fn fit_now(hosts: &HostArena, request: &Resources, cap: u64, n: u64) -> u64 {
    let mut have = 0;
    for slot in hosts.in_state(HostState::Up) {
        have += copies(&hosts.free(slot as usize), request, cap);
        if have >= n {
            return n;
        }
    }
    have
}

/// When `n` tasks of `request` (at most `cap` a host) fit the up hosts,
/// by the placed tasks' expected ends, and on which hosts (ascending);
/// none if never by the estimates.
pub(crate) fn hosts_time(
    hosts: &HostArena,
    tasks: &TaskArena,
    request: &Resources,
    cap: u64,
    n: u64,
    now_ms: u64,
) -> Option<(u64, Vec<u32>)> {
    let mut have = 0;
    let mut chosen = Vec::new();
    let up = hosts.in_state(HostState::Up);
    for slot in up {
        let k = copies(&hosts.free(slot as usize), request, cap);
        if k > 0 {
            have += k;
            chosen.push(slot);
            if have >= n {
                chosen.sort_unstable();
                return Some((now_ms, chosen));
            }
        }
    }
    // When each host fits one more copy, from its tasks' ends.
    let mut events: Vec<(u64, u32, u64)> = Vec::new();
    let mut ends: Vec<(u64, Resources)> = Vec::new();
    for slot in up {
        let mut avail = hosts.free(slot as usize);
        let mut k = copies(&avail, request, cap);
        if k >= cap {
            continue;
        }
        ends.clear();
        ends.extend(
            tasks
                .placed_on_host(slot)
                .map(|v| (v.expected_end(now_ms), v.request))
                .filter(|&(end, _)| end != u64::MAX),
        );
        ends.sort_unstable_by_key(|&(end, _)| end);
        for &(end, freed) in &ends {
            avail = avail.saturating_add(&freed);
            let now_k = copies(&avail, request, cap);
            if now_k > k {
                events.push((end, slot, now_k - k));
                k = now_k;
                if k >= cap {
                    break;
                }
            }
        }
    }
    events.sort_unstable();
    for (at, slot, dk) in events {
        have += dk;
        chosen.push(slot);
        if have >= n {
            chosen.sort_unstable();
            chosen.dedup();
            return Some((at, chosen));
        }
    }
    None
}

/// When a pool that lacks `deficit` of its entitlement gets it back, by
/// the expected ends of what it holds (`ends`: end, request; sorted
/// here); `u64::MAX` if never by the estimates.
pub(crate) fn entitlement_time(deficit: Resources, ends: &mut [(u64, Resources)]) -> u64 {
    if deficit.is_zero() {
        return 0;
    }
    ends.sort_unstable_by_key(|&(end, _)| end);
    let mut left = deficit;
    for &(end, freed) in ends.iter() {
        if end == u64::MAX {
            break;
        }
        left = left.saturating_sub(&freed);
        if left.is_zero() {
            return end;
        }
    }
    u64::MAX
}

/// The expected ends (and requests) of what the pool in `slot` holds
/// against its entitlement: its placed non-revocable tasks, and its
/// admitted ones still waiting for a host (as if they started now).
pub(crate) fn pool_ends(
    tasks: &TaskArena,
    waiting: &[crate::task::TaskHandle],
    slot: u32,
    now_ms: u64,
) -> Vec<(u64, Resources)> {
    let mut ends: Vec<(u64, Resources)> = tasks
        .placed_in_pool(slot)
        .filter(|v| v.flags & flags::REVOCABLE == 0)
        .map(|v| (v.expected_end(now_ms), v.request))
        .collect();
    for &t in waiting {
        let Ok((pool, bits, request)) = tasks.pool_flags_request(t) else {
            continue;
        };
        if pool != slot || bits & flags::REVOCABLE != 0 {
            continue;
        }
        if tasks.state(t) != Ok(crate::task::TaskState::Admitted) {
            continue;
        }
        let runtime = tasks.runtime_ms(t).unwrap_or(0);
        ends.push((crate::task::expected_end(now_ms, runtime, now_ms), request));
    }
    ends
}
