//! Preemption: choosing victims, as data. Nothing is killed here; the
//! caller (the gateway) acts on the victims and then releases their
//! resources through admission and placement.
//!
//! - **Inter-pool**: a pool whose allocation exceeds its entitlement
//!   (another pool's demand grew) gives back the overage. Victims are taken
//!   in order — revocable first, then lowest priority, then the least work
//!   lost (the latest checkpoint, else the latest start: [`victim_rank`])
//!   — and a victim is taken only if it reduces a dimension still
//!   over; selection stops when no dimension is over. In the dimension a
//!   victim was taken for, what is freed exceeds the need by less than that
//!   one task. Other dimensions can be freed beyond their need when the only
//!   tasks that free a short dimension are large in them (freeing 100 MiB
//!   from tasks of 10 cores and 1 MiB each takes 100 of them). Revocable
//!   tasks count against the slack entitlement and the others against the
//!   entitlement. Non-preemptible tasks are never victims.
//! - **Intra-pool**: an admitted task that found no host may evict
//!   lower-priority preemptible tasks of its own pool from one host, only if
//!   that makes the host fit it. The host needing the fewest victims wins
//!   (then the lowest victim priority, then the least work lost, then the
//!   lowest slot; victims that turn out unnecessary are dropped), and it is
//!   returned with the victims.
//!   Each host and each victim serves at most one plan per call.

use std::cmp::Reverse;
use std::fmt;

use rustc_hash::FxHashMap;

use crate::constraint::ConstraintTable;
use crate::host::{GpuGrant, HostArena};
use crate::manager::ResourceManager;
use crate::placement::{Placer, Reservations};
use crate::resources::{Dim, N_DIMS, Resources};
use crate::task::{NO_HOST, PlacedView, TaskArena, TaskError, TaskHandle, flags};

/// Why a task was chosen as a victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreemptReason {
    /// Its pool holds more than its entitlement in `dim`.
    OverEntitlement {
        /// A dimension over when the task was chosen.
        dim: Dim,
        /// What the pool held then.
        allocated: u64,
        /// Its entitlement.
        entitlement: u64,
    },
    /// Its pool's revocable tasks hold more than its slack entitlement.
    SlackReclaimed {
        /// A dimension over when the task was chosen.
        dim: Dim,
        /// What the revocable tasks held then.
        allocated: u64,
        /// The slack entitlement.
        slack_entitlement: u64,
    },
    /// It makes room on `host` for a higher-priority task of its pool.
    HigherPriority {
        /// The task it makes room for.
        for_task: TaskHandle,
        /// The host freed.
        host: u32,
    },
}

impl fmt::Display for PreemptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreemptReason::OverEntitlement {
                dim,
                allocated,
                entitlement,
            } => write!(
                f,
                "pool over its entitlement in {dim}: {allocated} held, {entitlement} entitled"
            ),
            PreemptReason::SlackReclaimed {
                dim,
                allocated,
                slack_entitlement,
            } => write!(
                f,
                "slack reclaimed in {dim}: {allocated} held by revocable tasks, {slack_entitlement} entitled"
            ),
            PreemptReason::HigherPriority { for_task, host } => write!(
                f,
                "room for a higher-priority task ({:#x}) on host slot {host}",
                for_task.to_u64()
            ),
        }
    }
}

/// A task to preempt, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Victim {
    /// The task.
    pub task: TaskHandle,
    /// Its pool slot.
    pub pool: u32,
    /// Why.
    pub reason: PreemptReason,
}

/// Victims to bring every pool back within its entitlements, appended to
/// `out` in pool slot order. Pools are compared using the manager's
/// allocation and last computed entitlements; the running tasks are the
/// placed tasks of the arena.
pub fn inter_pool_victims(rm: &ResourceManager, tasks: &TaskArena, out: &mut Vec<Victim>) {
    let tree = rm.tree();
    let ent = rm.entitlements();
    // Per pool slot over an entitlement: what it holds and the overage,
    // (non-revocable, revocable).
    let mut over: FxHashMap<u32, [(Resources, [u64; N_DIMS]); 2]> = FxHashMap::default();
    for slot in 0..tree.n_slots() {
        let Some(pool) = tree.lookup_slot(slot) else {
            continue;
        };
        let Ok(usage) = rm.usage(pool) else { continue };
        let main = usage
            .allocation
            .total
            .saturating_sub(&ent.entitlement(slot));
        let revocable = usage
            .allocation
            .revocable
            .saturating_sub(&ent.slack_entitlement(slot));
        if !main.is_zero() || !revocable.is_zero() {
            over.insert(
                slot as u32,
                [
                    (usage.allocation.total, main.0),
                    (usage.allocation.revocable, revocable.0),
                ],
            );
        }
    }
    if over.is_empty() {
        return;
    }
    // Only the pools over an entitlement are looked at (the arena's pool
    // index), not every placed task.
    let mut candidates: Vec<PlacedView> = over
        .keys()
        .flat_map(|&pool| tasks.placed_in_pool(pool))
        .filter(|t| t.flags & flags::PREEMPTIBLE != 0)
        .collect();
    // Pool, then revocable first, then by victim rank.
    candidates.sort_by(|a, b| {
        a.pool
            .cmp(&b.pool)
            .then_with(|| (b.flags & flags::REVOCABLE).cmp(&(a.flags & flags::REVOCABLE)))
            .then_with(|| victim_rank(a, b))
    });
    for c in candidates {
        let slot = c.pool as usize;
        let revocable_task = c.flags & flags::REVOCABLE != 0;
        let (held, need) =
            &mut over.get_mut(&c.pool).expect("filtered")[usize::from(revocable_task)];
        // Take it only if it reduces a dimension still over.
        let Some(d) = Dim::ALL
            .into_iter()
            .find(|d| need[d.idx()] > 0 && c.request[*d] > 0)
        else {
            continue;
        };
        let reason = if revocable_task {
            PreemptReason::SlackReclaimed {
                dim: d,
                allocated: held[d],
                slack_entitlement: ent.slack_entitlement(slot)[d],
            }
        } else {
            PreemptReason::OverEntitlement {
                dim: d,
                allocated: held[d],
                entitlement: ent.entitlement(slot)[d],
            }
        };
        for i in 0..N_DIMS {
            need[i] = need[i].saturating_sub(c.request.0[i]);
        }
        out.push(Victim {
            task: c.task,
            pool: c.pool,
            reason,
        });
    }
}

/// For each pending task (in order), the host and victims that would make
/// room for it by evicting lower-priority preemptible tasks of its own pool,
/// if any host can be made to fit. The hosts considered are those placement
/// would consider (state, constraint, exclusivity, GPU hosts, per-host
/// limits, via `placer`). A task that already fits some host gets no plan
/// (place it instead). Each host and each victim is used by at most one plan
/// per call, so plans never count the same free capacity twice. Victims are
/// ranked by [`victim_rank`] (lowest priority, then least work lost); after a host
/// fits, victims that turn out unnecessary are dropped again.
///
/// Pass admitted tasks that found no host: admission already checked that
/// their pool's entitlement has room for them.
pub fn intra_pool_victims(
    placer: &Placer,
    hosts: &HostArena,
    tasks: &TaskArena,
    constraints: &ConstraintTable,
    pending: &[TaskHandle],
    out: &mut Vec<(TaskHandle, u32, Vec<Victim>)>,
) -> Result<(), TaskError> {
    intra_pool_victims_with(
        placer,
        hosts,
        tasks,
        constraints,
        &Reservations::default(),
        pending,
        out,
    )
}

/// [`intra_pool_victims`] knowing the hosts' reservations: a pending task
/// with a desired host looks only there, counting what is reserved for its
/// instance as free, and never evicts a daemon; a daemon
/// ([`flags::DAEMON`]) may evict preemptible non-daemon tasks of any pool
/// and priority on its host.
pub fn intra_pool_victims_with(
    placer: &Placer,
    hosts: &HostArena,
    tasks: &TaskArena,
    constraints: &ConstraintTable,
    reservations: &Reservations,
    pending: &[TaskHandle],
    out: &mut Vec<(TaskHandle, u32, Vec<Victim>)>,
) -> Result<(), TaskError> {
    intra_pool_victims_fenced(
        placer,
        hosts,
        tasks,
        constraints,
        reservations,
        pending,
        &|_| &[],
        out,
    )
}

/// [`intra_pool_victims_with`] for tasks that keep off some hosts
/// (`keep_off(task)`, ascending slots: a start reservation's, see
/// [`crate::backfill`]): evicting there would free room the task may not
/// take.
#[expect(
    clippy::too_many_arguments,
    reason = "the placement context, passed explicitly"
)]
pub fn intra_pool_victims_fenced<'k>(
    placer: &Placer,
    hosts: &HostArena,
    tasks: &TaskArena,
    constraints: &ConstraintTable,
    reservations: &Reservations,
    pending: &[TaskHandle],
    keep_off: &dyn Fn(TaskHandle) -> &'k [u32],
    out: &mut Vec<(TaskHandle, u32, Vec<Victim>)>,
) -> Result<(), TaskError> {
    // Victims come from the pending tasks' own pools only (the arena's pool
    // index), not every placed task.
    let mut pools: Vec<u32> = Vec::new();
    for &task in pending {
        pools.push(tasks.spec(task)?.pool);
    }
    pools.sort_unstable();
    pools.dedup();
    let mut by_host: FxHashMap<u32, Vec<PlacedView>> = FxHashMap::default();
    for &pool in &pools {
        for t in tasks.placed_in_pool(pool) {
            if t.flags & flags::PREEMPTIBLE != 0 {
                by_host.entry(t.host).or_default().push(t);
            }
        }
    }
    for list in by_host.values_mut() {
        list.sort_by(victim_rank);
    }
    let mut used_hosts = roaring::RoaringBitmap::new();
    for &task in pending {
        let spec = tasks.spec(task)?;
        let constraint = constraints
            .get(spec.constraint)
            .ok_or(TaskError::NotFound)?;
        let mut candidates = placer.hosts_for(hosts, constraint, &spec);
        for &slot in keep_off(task) {
            candidates.remove(slot);
        }
        let ports = u32::from(spec.ports);
        let under_limit = |slot: u32| {
            spec.max_per_host == 0
                || placer.instances_on_host(spec.limit_key, slot) < spec.max_per_host
        };
        // What is reserved for the task's instance on its desired host is
        // the task's.
        let own = match reservations.get(&(spec.job, spec.instance)) {
            Some(&(slot, amount)) if slot == spec.desired_host => amount,
            _ => Resources::ZERO,
        };
        let fits_freeing = |slot: u32, chosen: &[PlacedView]| {
            fits_without(hosts, slot, &spec.request, ports, chosen, &own)
        };
        if candidates
            .iter()
            .any(|slot| under_limit(slot) && fits_freeing(slot, &[]))
        {
            continue; // it fits without evicting anyone
        }
        let daemon = spec.flags & flags::DAEMON != 0 && spec.desired_host != NO_HOST;
        let mut on_daemon_host: Vec<PlacedView> = Vec::new();
        if daemon {
            on_daemon_host.extend(
                tasks
                    .placed_on_host(spec.desired_host)
                    .filter(|t| t.flags & flags::PREEMPTIBLE != 0 && t.flags & flags::DAEMON == 0),
            );
            on_daemon_host.sort_by(victim_rank);
        }
        let mut best: Option<(HostRank, Vec<PlacedView>)> = None;
        for slot in candidates.iter() {
            if used_hosts.contains(slot) || !under_limit(slot) {
                continue;
            }
            // Revocable tasks that borrowed room on the host (what its
            // non-revocable tasks do not use) give it back first, whatever
            // their pool and priority, to any non-revocable task.
            let borrowers: Vec<PlacedView> = if !daemon
                && spec.flags & flags::REVOCABLE == 0
                && !hosts.borrowed(slot as usize).is_zero()
            {
                let mut b: Vec<PlacedView> = tasks
                    .placed_on_host(slot)
                    .filter(|t| t.flags & flags::REVOCABLE != 0)
                    .collect();
                b.sort_by(victim_rank);
                b
            } else {
                Vec::new()
            };
            let running: &[PlacedView] = if daemon {
                &on_daemon_host
            } else {
                by_host.get(&slot).map_or(&[], |r| r.as_slice())
            };
            if running.is_empty() && borrowers.is_empty() {
                continue;
            }
            // A daemon is never evicted for another pinned task (each
            // would take the other's room back, for ever).
            let pinned = spec.desired_host != NO_HOST;
            let own = running.iter().filter(|r| {
                daemon
                    || (r.pool == spec.pool
                        && r.priority < spec.priority
                        && !(pinned && r.flags & flags::DAEMON != 0)
                        && (borrowers.is_empty() || r.flags & flags::REVOCABLE == 0))
            });
            // Revocable work never harms non-revocable work: a revocable
            // task (a daemon's too) evicts only revocable tasks. (A
            // revocable daemon that evicted a service would lose the room
            // again to it: non-revocable tasks are placed first.)
            let revocable = spec.flags & flags::REVOCABLE != 0;
            let eligible = borrowers
                .iter()
                .chain(own)
                .filter(|r| !revocable || r.flags & flags::REVOCABLE != 0);
            let mut chosen: Vec<PlacedView> = Vec::new();
            let mut fits = false;
            for r in eligible {
                if best.as_ref().is_some_and(|b| chosen.len() >= b.0.0) {
                    break; // cannot beat the best host any more
                }
                chosen.push(*r);
                if fits_freeing(slot, &chosen) {
                    fits = true;
                    break;
                }
            }
            if !fits {
                continue;
            }
            // Drop victims that turned out unnecessary, highest rank last.
            let mut i = 0;
            while i < chosen.len() {
                let removed = chosen.remove(i);
                if fits_freeing(slot, &chosen) {
                    continue;
                }
                chosen.insert(i, removed);
                i += 1;
            }
            let priority_sum: u64 = chosen.iter().map(|c| u64::from(c.priority)).sum();
            // Among as many victims of the same priorities, those that
            // lose the least work: with equal counts, the latest saved
            // times in sum.
            let saved_sum = Reverse(
                chosen
                    .iter()
                    .fold(0u64, |sum, c| sum.saturating_add(c.saved_ms())),
            );
            let rank = (chosen.len(), priority_sum, saved_sum, slot);
            if best.as_ref().is_none_or(|(b, _)| rank < *b) {
                best = Some((rank, chosen));
            }
        }
        if let Some(((_, _, _, slot), chosen)) = best {
            used_hosts.insert(slot);
            let victims = chosen
                .iter()
                .map(|c| Victim {
                    task: c.task,
                    pool: c.pool,
                    reason: PreemptReason::HigherPriority {
                        for_task: task,
                        host: slot,
                    },
                })
                .collect();
            out.push((task, slot, victims));
        }
    }
    Ok(())
}

/// The order victims are taken in (among tasks a rule lets go): lowest
/// priority first, then the one that loses the least work — the latest
/// [`PlacedView::saved_ms`], its last checkpoint or else its start, so
/// without checkpoints the most recently started — then the latest
/// arrival. Deterministic: arrival numbers are unique.
pub fn victim_rank(a: &PlacedView, b: &PlacedView) -> std::cmp::Ordering {
    a.priority
        .cmp(&b.priority)
        .then_with(|| b.saved_ms().cmp(&a.saved_ms()))
        .then_with(|| b.arrival.cmp(&a.arrival))
}

/// How an eviction's host compares (the least wins): victims, their summed
/// priority, the work they lose (their summed saved times, reversed: with
/// equal counts, the latest saved lose least), slot.
type HostRank = (usize, u64, Reverse<u64>, u32);

/// Whether `request` fits the host once `victims` are gone.
fn fits_without(
    hosts: &HostArena,
    slot: u32,
    request: &Resources,
    ports: u32,
    victims: &[PlacedView],
    reserved_for_it: &Resources,
) -> bool {
    let mut freed = *reserved_for_it;
    let mut freed_ports = 0;
    let grants: Vec<GpuGrant> = victims.iter().map(|v| v.gpu).collect();
    for v in victims {
        freed.add_assign(&v.request);
        freed_ports += u32::from(v.ports);
    }
    hosts.fits_after_freeing(slot as usize, request, ports, &freed, freed_ports, &grants)
}
