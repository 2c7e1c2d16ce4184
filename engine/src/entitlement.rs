//! Hierarchical max-min fair entitlement.
//!
//! Given the cluster's capacity, the slack capacity (reserved but unused
//! resources that revocable tasks may borrow) and every leaf pool's demand,
//! computes each pool's *entitlement*: what it may hold now. Each dimension is
//! computed independently, top-down; at every inner pool its entitlement `E`
//! is divided among its children:
//!
//! 1. Each child gets `min(demand, reservation)` (a STATIC child gets its
//!    reservation). If capacity is short and these guarantees exceed `E`,
//!    they are scaled down in proportion and nothing else is given.
//! 2. What is left goes to ELASTIC children with unmet demand in proportion to
//!    their share, each capped at its demand (water-filling: the capped
//!    children's excess is divided again among the others).
//! 3. Anything still left (all demand met) is divided by share among ELASTIC
//!    children, capped at their limits, so new work can start before the
//!    next recomputation.
//!
//! An inner pool's demand is the sum of its children's (a STATIC child counts
//! its reservation), capped at its limit; a leaf's demand is capped at its
//! limit.
//!
//! Slack entitlement is computed the same way over the slack capacity with
//! the pools' revocable demand, no reservations, and each pool capped at its
//! limit and at `slack_limit_pct` of its parent's slack entitlement.
//!
//! # Exactness and rounding
//! Water-filling finds the real level `λ` in floating point (child `i` gets
//! `min(headroom_i, λ·share_i)`); the integer results are rounded down and the
//! units lost are handed out to children with room, in child order. So each
//! child is within about one unit of the real value at its node (plus
//! floating-point error, relative 1e-15), a pool's error is at most that of
//! its ancestors added up (the property tests allow 2·(depth+1) units), and
//! the children of a node together receive exactly `min(available, Σ
//! headroom)`: nothing is lost or invented.
//!
//! # Cost
//! `O(n)` per dimension for the demand pass plus, per inner pool with `k`
//! children, `O(k·r)` where `r` is the number of water-filling rounds (each
//! round caps at least one child; after [`MAX_ROUNDS`] the remaining children
//! are sorted by headroom/share, `O(k log k)`). The pool tree is flattened to
//! breadth-first column arrays once per tree change (the *plan*), and all
//! buffers are reused: steady-state recomputation allocates nothing. The four
//! dimensions run in parallel on the caller's thread pool; each is
//! sequential and independent, so results do not depend on the thread count.

use rayon::prelude::*;

use crate::pool::{PoolKind, PoolTree};
use crate::resources::{N_DIMS, Resources, percent_of};

/// Water-filling rounds before falling back to sorting children by ratio.
pub const MAX_ROUNDS: u32 = 8;

/// Trees smaller than this are computed on the calling thread: splitting the
/// four dimensions over threads costs more than it saves.
const PARALLEL_MIN_POOLS: usize = 512;

/// Per-pool demand, indexed by `[dimension][pool slot]`. Only leaf pools'
/// values are read; inner pools' demand is derived from their children.
#[derive(Clone, Debug, Default)]
pub struct EntitlementInput {
    /// Capacity of the cluster available to non-revocable work.
    pub capacity: Resources,
    /// Capacity that revocable tasks may use (reserved but unused, or
    /// allocated but idle).
    pub slack_capacity: Resources,
    /// Non-revocable demand (queued + allocated) per leaf pool.
    pub demand: [Vec<u64>; N_DIMS],
    /// Revocable demand (queued + allocated) per leaf pool.
    pub slack_demand: [Vec<u64>; N_DIMS],
}

impl EntitlementInput {
    /// Zeroed columns for `n_slots` pool slots.
    pub fn with_slots(n_slots: usize) -> Self {
        EntitlementInput {
            capacity: Resources::ZERO,
            slack_capacity: Resources::ZERO,
            demand: std::array::from_fn(|_| vec![0; n_slots]),
            slack_demand: std::array::from_fn(|_| vec![0; n_slots]),
        }
    }

    /// Sets a leaf pool's non-revocable demand.
    pub fn set_demand(&mut self, slot: usize, demand: Resources) {
        for d in 0..N_DIMS {
            self.demand[d][slot] = demand.0[d];
        }
    }

    /// Sets a leaf pool's revocable demand.
    pub fn set_slack_demand(&mut self, slot: usize, demand: Resources) {
        for d in 0..N_DIMS {
            self.slack_demand[d][slot] = demand.0[d];
        }
    }
}

/// Result columns of one dimension, indexed by pool slot (free slots hold 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DimEntitlement {
    /// Effective demand: a leaf's capped at its limit, an inner pool's the
    /// sum of its children's capped at its limit.
    pub demand: Vec<u64>,
    /// Entitlement for non-revocable work.
    pub entitlement: Vec<u64>,
    /// Effective revocable demand.
    pub slack_demand: Vec<u64>,
    /// Entitlement for revocable work.
    pub slack_entitlement: Vec<u64>,
    /// Cap on the slack entitlement from the pool's slack limit.
    pub slack_cap: Vec<u64>,
}

impl DimEntitlement {
    fn columns_mut(&mut self) -> [&mut Vec<u64>; 5] {
        [
            &mut self.demand,
            &mut self.entitlement,
            &mut self.slack_demand,
            &mut self.slack_entitlement,
            &mut self.slack_cap,
        ]
    }
}

/// Entitlement of every pool, per dimension.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entitlements {
    /// One set of columns per dimension, in [`Dim`] order.
    pub dims: [DimEntitlement; N_DIMS],
}

/// Accessors read 0 for slots beyond the last computation (a pool created
/// since has no entitlement until the next one).
impl Entitlements {
    /// Non-revocable entitlement of the pool in `slot`.
    pub fn entitlement(&self, slot: usize) -> Resources {
        Resources(std::array::from_fn(|d| {
            self.dims[d].entitlement.get(slot).copied().unwrap_or(0)
        }))
    }

    /// Revocable entitlement of the pool in `slot`.
    pub fn slack_entitlement(&self, slot: usize) -> Resources {
        Resources(std::array::from_fn(|d| {
            self.dims[d]
                .slack_entitlement
                .get(slot)
                .copied()
                .unwrap_or(0)
        }))
    }

    /// Slack-limit cap of the pool in `slot`.
    pub fn slack_cap(&self, slot: usize) -> Resources {
        Resources(std::array::from_fn(|d| {
            self.dims[d].slack_cap.get(slot).copied().unwrap_or(0)
        }))
    }

    /// Effective demand of the pool in `slot`.
    pub fn demand(&self, slot: usize) -> Resources {
        Resources(std::array::from_fn(|d| {
            self.dims[d].demand.get(slot).copied().unwrap_or(0)
        }))
    }

    /// Forgets everything computed for `slot` (its pool was deleted, or a
    /// new pool took the slot): it reads as zero until the next computation.
    pub fn clear_slot(&mut self, slot: usize) {
        for dim in &mut self.dims {
            for column in dim.columns_mut() {
                if let Some(value) = column.get_mut(slot) {
                    *value = 0;
                }
            }
        }
    }

    /// Number of pool slots covered.
    pub fn n_slots(&self) -> usize {
        self.dims[0].entitlement.len()
    }
}

/// The pool tree flattened into breadth-first columns (position `pos`).
#[derive(Debug, Default)]
struct Plan {
    slot_of: Vec<u32>,
    parent_pos: Vec<u32>,
    child_start: Vec<u32>,
    child_end: Vec<u32>,
    reservation: [Vec<u64>; N_DIMS],
    limit: [Vec<u64>; N_DIMS],
    share: [Vec<f64>; N_DIMS],
    is_static: [Vec<bool>; N_DIMS],
    slack_pct: Vec<f64>,
    /// Positions of inner pools, in breadth-first order.
    inner: Vec<u32>,
}

impl Plan {
    fn rebuild(&mut self, tree: &PoolTree) {
        let order = tree.breadth_first();
        let n = order.len();
        self.slot_of.clear();
        self.parent_pos.clear();
        self.child_start.clear();
        self.child_end.clear();
        self.slack_pct.clear();
        self.inner.clear();
        for d in 0..N_DIMS {
            self.reservation[d].clear();
            self.limit[d].clear();
            self.share[d].clear();
            self.is_static[d].clear();
        }
        let mut pos_of_slot = vec![u32::MAX; tree.n_slots()];
        for (pos, id) in order.iter().enumerate() {
            pos_of_slot[id.idx()] = pos as u32;
        }
        // In breadth-first order each pool's children are contiguous, and they
        // are appended in the same order as `breadth_first` visits them.
        let mut next_child = 1u32;
        for &id in &order {
            self.slot_of.push(id.idx() as u32);
            let parent = tree.parent(id).map_or(u32::MAX, |p| pos_of_slot[p.idx()]);
            self.parent_pos.push(parent);
            let n_children = tree.children(id).len() as u32;
            if n_children > 0 {
                self.inner.push(self.slot_of.len() as u32 - 1);
            }
            self.child_start.push(next_child);
            self.child_end.push(next_child + n_children);
            next_child += n_children;
            let config = tree.config(id);
            for d in 0..N_DIMS {
                let c = &config.dims[d];
                self.reservation[d].push(c.reservation);
                self.limit[d].push(c.limit);
                self.share[d].push(c.share);
                self.is_static[d].push(c.kind == PoolKind::Static);
            }
            self.slack_pct.push(config.slack_limit_pct);
        }
        debug_assert_eq!(next_child as usize, n);
    }

    fn len(&self) -> usize {
        self.slot_of.len()
    }

    fn children(&self, pos: usize) -> std::ops::Range<usize> {
        self.child_start[pos] as usize..self.child_end[pos] as usize
    }
}

/// Reusable per-dimension buffers, indexed by plan position.
#[derive(Debug, Default)]
struct DimScratch {
    demand: Vec<u64>,
    entitlement: Vec<u64>,
    /// Headroom of each child in the current water-filling step.
    head: Vec<u64>,
    /// Integer grant of each child in the current step.
    grant: Vec<u64>,
    /// Children that reached their headroom.
    capped: Vec<bool>,
    /// Shares used when scaling guarantees down.
    weight: Vec<f64>,
    /// Water-filling's sort buffer and counters.
    fill: FillScratch,
}

/// Sort buffer of water-filling's fallback path, and counters.
#[derive(Debug, Default)]
struct FillScratch {
    by_ratio: Vec<(f64, u32)>,
    calls: u64,
    rounds: u64,
    sorted: u64,
    call_start_rounds: u64,
}

impl FillScratch {
    /// True once the current call has used [`MAX_ROUNDS`] rounds.
    fn rounds_this_call(&self) -> bool {
        self.rounds - self.call_start_rounds >= u64::from(MAX_ROUNDS)
    }
}

/// How much water-filling work recomputations did (summed over dimensions
/// and passes since the calculator was created).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaterFillStats {
    /// Divisions that needed a level search (not everything fit).
    pub searches: u64,
    /// Capping rounds over all searches.
    pub rounds: u64,
    /// Searches that fell back to sorting children by ratio.
    pub sorted: u64,
}

impl DimScratch {
    fn resize(&mut self, n: usize) {
        for column in [
            &mut self.demand,
            &mut self.entitlement,
            &mut self.head,
            &mut self.grant,
        ] {
            column.resize(n, 0);
        }
        self.capped.resize(n, false);
        self.weight.resize(n, 0.0);
    }
}

/// Computes entitlements; keeps the flattened tree and all scratch buffers
/// between calls.
#[derive(Debug, Default)]
pub struct EntitlementCalculator {
    /// (tree identity, tree version) the plan was built from.
    plan_version: Option<(u64, u64)>,
    plan: Plan,
    scratch: [DimScratch; N_DIMS],
}

impl EntitlementCalculator {
    /// A calculator with empty buffers; they grow on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Water-filling work done so far, for benchmarks and tests.
    pub fn water_fill_stats(&self) -> WaterFillStats {
        let mut stats = WaterFillStats::default();
        for scratch in &self.scratch {
            stats.searches += scratch.fill.calls;
            stats.rounds += scratch.fill.rounds;
            stats.sorted += scratch.fill.sorted;
        }
        stats
    }

    /// Recomputes every pool's entitlement into `out` (columns indexed by pool
    /// slot, resized to the tree's slot count). With a thread pool, the four
    /// dimensions run in parallel; the result is identical either way.
    pub fn compute(
        &mut self,
        tree: &PoolTree,
        input: &EntitlementInput,
        out: &mut Entitlements,
        threads: Option<&rayon::ThreadPool>,
    ) {
        let n_slots = tree.n_slots();
        for d in 0..N_DIMS {
            assert!(
                input.demand[d].len() >= n_slots && input.slack_demand[d].len() >= n_slots,
                "demand columns cover every pool slot"
            );
        }
        let key = (tree.identity(), tree.version());
        let rebuilt = self.plan_version != Some(key);
        if rebuilt {
            self.plan.rebuild(tree);
            self.plan_version = Some(key);
        }
        let n = self.plan.len();
        for dim in &mut out.dims {
            for column in dim.columns_mut() {
                // Live slots are all overwritten below; free slots keep the
                // zeros written when the set of live slots last changed.
                if rebuilt || column.len() != n_slots {
                    column.clear();
                    column.resize(n_slots, 0);
                }
            }
        }
        for scratch in &mut self.scratch {
            scratch.resize(n);
        }
        let plan = &self.plan;
        let job = |(d, (scratch, out)): (usize, (&mut DimScratch, &mut DimEntitlement))| {
            compute_dim(plan, d, input, scratch, out);
        };
        match threads {
            Some(pool) if n >= PARALLEL_MIN_POOLS => pool.install(|| {
                self.scratch
                    .par_iter_mut()
                    .zip(out.dims.par_iter_mut())
                    .enumerate()
                    .for_each(job);
            }),
            _ => self
                .scratch
                .iter_mut()
                .zip(out.dims.iter_mut())
                .enumerate()
                .for_each(job),
        }
    }
}

fn compute_dim(
    plan: &Plan,
    d: usize,
    input: &EntitlementInput,
    scratch: &mut DimScratch,
    out: &mut DimEntitlement,
) {
    let n = plan.len();
    let limit = &plan.limit[d];
    let reservation = &plan.reservation[d];
    let is_static = &plan.is_static[d];

    // --- Non-revocable pass ---
    aggregate_demand(
        plan,
        &input.demand[d],
        limit,
        Some((reservation, is_static)),
        &mut scratch.demand,
    );
    scratch.entitlement[0] = input.capacity.0[d].min(limit[0]);
    for &pos in &plan.inner {
        divide(plan, d, pos as usize, scratch);
    }
    for pos in 0..n {
        let slot = plan.slot_of[pos] as usize;
        out.demand[slot] = scratch.demand[pos];
        out.entitlement[slot] = scratch.entitlement[pos];
    }

    // --- Revocable (slack) pass, reusing the same buffers ---
    aggregate_demand(
        plan,
        &input.slack_demand[d],
        limit,
        None,
        &mut scratch.demand,
    );
    scratch.entitlement[0] = input.slack_capacity.0[d].min(limit[0]);
    out.slack_cap[plan.slot_of[0] as usize] = scratch.entitlement[0];
    for &pos in &plan.inner {
        divide_slack(plan, d, pos as usize, scratch, &mut out.slack_cap);
    }
    for pos in 0..n {
        let slot = plan.slot_of[pos] as usize;
        out.slack_demand[slot] = scratch.demand[pos];
        out.slack_entitlement[slot] = scratch.entitlement[pos];
    }
}

/// Bottom-up: a leaf's demand is its input capped at its limit; an inner
/// pool's is the sum of its children's contributions capped at its limit. With
/// `statics`, a STATIC child contributes its reservation instead.
fn aggregate_demand(
    plan: &Plan,
    leaf_demand: &[u64],
    limit: &[u64],
    statics: Option<(&[u64], &[bool])>,
    demand: &mut [u64],
) {
    let n = plan.len();
    let demand = &mut demand[..n];
    let limit = &limit[..n];
    let slot_of = &plan.slot_of[..n];
    // Every pool as if it were a leaf (inner pools are overwritten below);
    // inner slots of `leaf_demand` are ignored by contract, so read them as 0.
    for pos in 0..n {
        let leaf = plan.child_start[pos] == plan.child_end[pos];
        let raw = leaf_demand[slot_of[pos] as usize] * u64::from(leaf);
        demand[pos] = raw.min(limit[pos]);
    }
    // Children sit after their parent in breadth-first order, so walking
    // inner pools backwards finishes every child before its parent. Each
    // pool's children are one contiguous run: a sum over a slice, not a
    // scatter into the parent (which would serialise on one address). Both
    // sums saturate: each term is at most MAX_AMOUNT (2^50), but a pool may
    // have more than 2^14 children, and a wrapped sum would read as no
    // demand (the parent would lose even its reservation); the cap at the
    // pool's limit then brings it back below MAX_AMOUNT.
    for &pos in plan.inner.iter().rev() {
        let pos = pos as usize;
        let kids = plan.children(pos);
        let sum: u64 = match statics {
            Some((reservation, is_static)) => {
                let k = kids.len();
                let own = &demand[kids.clone()][..k];
                let reserved = &reservation[kids.clone()][..k];
                let fixed = &is_static[kids][..k];
                (0..k)
                    .map(|i| if fixed[i] { reserved[i] } else { own[i] })
                    .fold(0u64, u64::saturating_add)
            }
            None => demand[kids].iter().fold(0u64, |a, &b| a.saturating_add(b)),
        };
        demand[pos] = sum.min(limit[pos]);
    }
}

/// Divides the entitlement of inner pool `pos` among its children.
fn divide(plan: &Plan, d: usize, pos: usize, s: &mut DimScratch) {
    let kids = plan.children(pos);
    let k = kids.len();
    let available = s.entitlement[pos];
    // Re-slicing every column to exactly `k` lets the compiler drop the
    // bounds checks in the loops below.
    let reservation = &plan.reservation[d][kids.clone()][..k];
    let limit = &plan.limit[d][kids.clone()][..k];
    let share = &plan.share[d][kids.clone()][..k];
    let is_static = &plan.is_static[d][kids.clone()][..k];
    let demand = &s.demand[kids.clone()][..k];
    let ent = &mut s.entitlement[kids.clone()][..k];
    let head = &mut s.head[kids.clone()][..k];
    let grant = &mut s.grant[kids.clone()][..k];
    let capped = &mut s.capped[kids.clone()][..k];

    // (1) Guarantees; `head` holds the unmet demand of elastic children.
    let mut guaranteed = 0u64;
    for i in 0..k {
        let elastic_guarantee = demand[i].min(reservation[i]);
        ent[i] = if is_static[i] {
            reservation[i]
        } else {
            elastic_guarantee
        };
        head[i] = if is_static[i] {
            0
        } else {
            demand[i] - elastic_guarantee
        };
        guaranteed += ent[i];
    }
    if guaranteed > available {
        // Capacity is short of the guarantees: scale them down in proportion.
        let weight = &mut s.weight[kids][..k];
        for i in 0..k {
            head[i] = ent[i];
            weight[i] = as_f64(ent[i]);
        }
        water_fill(available, head, weight, grant, capped, &mut s.fill);
        ent.copy_from_slice(grant);
        return;
    }
    let mut left = available - guaranteed;

    // (2) Unmet demand, by share.
    if left > 0 {
        left -= water_fill(left, head, share, grant, capped, &mut s.fill);
        for i in 0..k {
            ent[i] += grant[i];
        }
    }

    // (3) The remainder, by share, up to limits.
    if left > 0 {
        for i in 0..k {
            head[i] = if is_static[i] { 0 } else { limit[i] - ent[i] };
        }
        water_fill(left, head, share, grant, capped, &mut s.fill);
        for i in 0..k {
            ent[i] += grant[i];
        }
    }
}

/// Divides the slack entitlement of inner pool `pos` among its children: no
/// guarantees; unmet revocable demand by share, then the remainder, each
/// child capped at its limit and at its slack limit.
fn divide_slack(plan: &Plan, d: usize, pos: usize, s: &mut DimScratch, slack_cap: &mut [u64]) {
    let kids = plan.children(pos);
    let k = kids.len();
    let available = s.entitlement[pos];
    let slots = &plan.slot_of[kids.clone()][..k];
    let limit = &plan.limit[d][kids.clone()][..k];
    let share = &plan.share[d][kids.clone()][..k];
    let pct = &plan.slack_pct[kids.clone()][..k];
    let demand = &s.demand[kids.clone()][..k];
    let ent = &mut s.entitlement[kids.clone()][..k];
    let head = &mut s.head[kids.clone()][..k];
    let grant = &mut s.grant[kids.clone()][..k];
    let capped = &mut s.capped[kids][..k];

    if available == 0 {
        // Nothing to divide (the common case where a subtree gets no slack).
        ent.fill(0);
        for &slot in slots {
            slack_cap[slot as usize] = 0;
        }
        return;
    }
    // The caps are kept in `ent` until the grants replace them.
    for i in 0..k {
        let cap = limit[i].min(percent_of(available, pct[i]));
        slack_cap[slots[i] as usize] = cap;
        ent[i] = cap;
        head[i] = demand[i].min(cap);
    }
    let left = available - water_fill(available, head, share, grant, capped, &mut s.fill);
    for i in 0..k {
        let cap = ent[i];
        ent[i] = grant[i];
        head[i] = cap - grant[i];
    }
    if left > 0 {
        water_fill(left, head, share, grant, capped, &mut s.fill);
        for i in 0..k {
            ent[i] += grant[i];
        }
    }
}

/// Divides up to `amount` among children: child `i` gets
/// `min(head[i], λ·share[i])` for the largest `λ` that `amount` allows,
/// rounded to integers so that the total is exactly `min(amount, Σ head)` and
/// each grant is within one unit of its real value. Writes `grant`, returns
/// the total granted.
fn water_fill(
    amount: u64,
    head: &[u64],
    share: &[f64],
    grant: &mut [u64],
    capped: &mut [bool],
    fill: &mut FillScratch,
) -> u64 {
    let k = head.len();
    let (head, share, grant, capped) = (&head[..k], &share[..k], &mut grant[..k], &mut capped[..k]);
    // One pass sums the headroom (saturating: a node may have more children
    // than 2^64 / MAX_AMOUNT) and, for the level search below, marks the
    // children with no headroom as capped and sums the others' shares. The
    // shares are summed in four lanes combined in a fixed order: the same
    // result on every run and thread count, without one long chain of
    // dependent floating-point additions.
    let mut total_head = 0u64;
    let mut share_active = lane_sum(k, |i| {
        total_head = total_head.saturating_add(head[i]);
        capped[i] = head[i] == 0;
        share[i] * f64::from(u8::from(!capped[i]))
    });
    if total_head <= amount {
        grant.copy_from_slice(head);
        return total_head;
    }
    if amount == 0 {
        grant.fill(0);
        return 0;
    }

    // Find λ. Children at their headroom are "capped"; λ only grows as
    // children are capped, so a capped child never becomes uncapped. The
    // loops are branch-free (the outcomes are data-dependent and would be
    // mispredicted), and amounts convert through i64 (exact below 2^50,
    // one instruction on x86-64 where u64 conversions take several).
    let mut fixed = 0u64;
    let mut lambda = as_f64(amount) / share_active;
    fill.calls += 1;
    fill.call_start_rounds = fill.rounds;
    // Each round caps every child whose headroom the level covers and
    // re-sums the shares of those left (re-summing, not subtracting, so that
    // shares of very different sizes cannot cancel out to a wrong level). It
    // also writes every child's integer grant at this level: when the round
    // caps nobody the level is final and so are the grants, and most
    // searches end after one round.
    let mut given;
    let mut grants_final = false;
    loop {
        let mut newly_capped = false;
        given = 0;
        let active = lane_sum(k, |i| {
            let level = lambda * share[i];
            let newly = !capped[i] & (as_f64(head[i]) <= level);
            capped[i] |= newly;
            fixed += head[i] * u64::from(newly);
            newly_capped |= newly;
            let fair = as_u64(level).min(head[i]);
            grant[i] = if capped[i] { head[i] } else { fair };
            given += grant[i];
            share[i] * f64::from(u8::from(!capped[i]))
        });
        fill.rounds += 1;
        if !newly_capped {
            grants_final = true;
            break;
        }
        share_active = active;
        if fixed >= amount || share_active <= 0.0 {
            lambda = 0.0;
            break;
        }
        lambda = as_f64(amount - fixed) / share_active;
        if fill.rounds_this_call() {
            fill.sorted += 1;
            lambda = sweep_by_ratio(
                amount,
                head,
                share,
                capped,
                &mut fixed,
                share_active,
                &mut fill.by_ratio,
            );
            break;
        }
    }

    // Integer grants (unless the last round wrote them), then hand out the
    // units lost to rounding: fewer than one per uncapped child, handed out
    // in bulk so that even a large floating-point error costs a few passes,
    // not one per unit.
    if !grants_final {
        given = 0;
        for i in 0..k {
            let fair = as_u64(lambda * share[i]).min(head[i]);
            grant[i] = if capped[i] { head[i] } else { fair };
            given += grant[i];
        }
    }
    while given > amount {
        // Floating-point overshoot: take units back, last child first.
        let step = ((given - amount) / k as u64).max(1);
        for i in (0..k).rev() {
            let take = grant[i].min(step).min(given - amount);
            grant[i] -= take;
            given -= take;
        }
    }
    let mut eligible = k as u64;
    while given < amount && eligible > 0 {
        let step = ((amount - given) / eligible).max(1);
        eligible = 0;
        for i in 0..k {
            let take = (head[i] - grant[i]).min(step).min(amount - given);
            grant[i] += take;
            given += take;
            eligible += u64::from(grant[i] < head[i]);
        }
    }
    debug_assert_eq!(given, amount.min(total_head));
    given
}

/// Sums `term(i)` for `i` in `0..k`, in order, into four lanes (`i % 4`)
/// combined as `(l0 + l1) + (l2 + l3)`: a fixed order, so the same result on
/// every run, with four independent chains of additions instead of one.
#[inline(always)]
fn lane_sum(k: usize, mut term: impl FnMut(usize) -> f64) -> f64 {
    let mut lanes = [0.0f64; 4];
    let full = k / 4 * 4;
    let mut i = 0;
    while i < full {
        lanes[0] += term(i);
        lanes[1] += term(i + 1);
        lanes[2] += term(i + 2);
        lanes[3] += term(i + 3);
        i += 4;
    }
    for (lane, i) in (full..k).enumerate() {
        lanes[lane] += term(i);
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// Exact level search for the rare case where capping takes many rounds:
/// sorts the uncapped children by `head / share` and caps them in that order
/// while their ratio is below the running level.
fn sweep_by_ratio(
    amount: u64,
    head: &[u64],
    share: &[f64],
    capped: &mut [bool],
    fixed: &mut u64,
    mut share_active: f64,
    by_ratio: &mut Vec<(f64, u32)>,
) -> f64 {
    by_ratio.clear();
    by_ratio.extend(
        (0..head.len())
            .filter(|&i| !capped[i])
            .map(|i| (as_f64(head[i]) / share[i], i as u32)),
    );
    by_ratio.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut lambda = as_f64(amount.saturating_sub(*fixed)) / share_active;
    for &(ratio, i) in by_ratio.iter() {
        if ratio > lambda {
            break;
        }
        let i = i as usize;
        capped[i] = true;
        *fixed += head[i];
        share_active -= share[i];
        if *fixed >= amount || share_active <= 0.0 {
            return 0.0;
        }
        lambda = as_f64(amount - *fixed) / share_active;
    }
    lambda
}

/// An amount as `f64`; exact because amounts are below 2^50.
#[inline(always)]
fn as_f64(amount: u64) -> f64 {
    debug_assert!(amount <= 1 << 53);
    amount as i64 as f64
}

/// A non-negative real as an amount, rounded down (truncation is floor for
/// non-negative values; the saturating cast maps NaN to 0).
#[inline(always)]
fn as_u64(value: f64) -> u64 {
    value as i64 as u64
}
