//! Test support shared by unit tests, property tests, fuzz targets and
//! benchmarks: a small deterministic random generator, generators of random
//! pool trees and workloads, invariant checks on entitlements, and the
//! pool-operations fuzz driver.
//!
//! Everything here is deterministic for a given seed, so a benchmark or a
//! failing fuzz input replays exactly.

use crate::AdmissionLimits;
use crate::admission::{
    AdmissionResult, Admitted, PendingId, PendingTask, TaskClass, TaskFlags, TaskId,
};
use crate::entitlement::{EntitlementInput, Entitlements};
use crate::manager::{ResourceManager, ResourceManagerConfig};
use crate::pool::{DimConfig, PoolConfig, PoolId, PoolKind, PoolTree, PoolTreeLimits};
use crate::resources::{MAX_AMOUNT, N_DIMS, Resources};

/// SplitMix64: tiny, fast, and good enough for workloads and fuzz decoding.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Shape of a random pool tree.
#[derive(Clone, Copy, Debug)]
pub struct TreeSpec {
    /// Pools in total, the root included.
    pub n_pools: usize,
    /// Levels including the root (`2` = root and leaves).
    pub depth: usize,
    /// Cluster capacity the reservations are carved from.
    pub capacity: Resources,
    /// Fraction of the capacity reserved at the top level.
    pub reserved_fraction: f64,
    /// Probability that a dimension of a pool is STATIC.
    pub static_probability: f64,
}

impl TreeSpec {
    /// A tree of `n_pools` pools and `depth` levels over `capacity`.
    pub fn new(n_pools: usize, depth: usize, capacity: Resources) -> Self {
        TreeSpec {
            n_pools,
            depth,
            capacity,
            reserved_fraction: 0.6,
            static_probability: 0.02,
        }
    }
}

/// The cluster capacity used by the synthetic benchmarks: 10,000 hosts of
/// 32 cores, 128 GiB memory, 1 TiB disk, and one GPU in ten hosts having 8.
pub fn bench_capacity() -> Resources {
    Resources::new(
        10_000 * 32_000,
        10_000 * 131_072,
        10_000 * 1_048_576,
        1_000 * 8_000,
    )
}

/// Builds a random valid tree in `rm` (breadth first, so it is balanced)
/// and returns its leaf pools in creation order.
pub fn build_random_tree(rm: &mut ResourceManager, spec: &TreeSpec, rng: &mut Rng) -> Vec<PoolId> {
    assert!(spec.depth >= 2 && spec.n_pools >= 2);
    // Children per inner pool so that `depth` levels hold `n_pools` pools.
    let levels = (spec.depth - 1) as f64;
    let fanout = ((spec.n_pools as f64).powf(1.0 / levels)).ceil().max(2.0) as u64;
    let root = rm.tree().root();
    // (pool, level, reservation budget left for its children)
    let mut frontier = std::collections::VecDeque::new();
    let top_budget = Resources(std::array::from_fn(|d| {
        (spec.capacity.0[d] as f64 * spec.reserved_fraction) as u64
    }));
    frontier.push_back((root, 1usize, top_budget, Resources::MAX));
    let mut n = 1;
    let mut leaves = Vec::new();
    while let Some((parent, level, mut budget, parent_limit)) = frontier.pop_front() {
        if level >= spec.depth || n >= spec.n_pools {
            leaves.push(parent);
            continue;
        }
        let n_children = rng.range(fanout.div_ceil(2), fanout + fanout / 2).max(1);
        let parent_path = rm.tree().path(parent).to_owned();
        let mut made = 0;
        for c in 0..n_children {
            if n >= spec.n_pools {
                break;
            }
            let mut config = PoolConfig::default();
            let mut child_budget = Resources::ZERO;
            for d in 0..N_DIMS {
                let want = (budget.0[d] as f64 * rng.unit() * 1.5 / n_children as f64) as u64;
                let reservation = want.min(budget.0[d]);
                budget.0[d] -= reservation;
                child_budget.0[d] = reservation;
                let upper = parent_limit.0[d].min(spec.capacity.0[d].max(1));
                let limit = if rng.chance(0.3) {
                    parent_limit.0[d]
                } else {
                    (reservation
                        + (upper.saturating_sub(reservation) as f64 * (0.3 + 0.7 * rng.unit()))
                            as u64)
                        .min(parent_limit.0[d])
                };
                config.dims[d] = DimConfig {
                    reservation,
                    limit,
                    share: 1.0 + rng.below(9) as f64,
                    kind: if rng.chance(spec.static_probability) {
                        PoolKind::Static
                    } else {
                        PoolKind::Elastic
                    },
                };
            }
            config.controller_limit_pct = [100.0, 50.0, 20.0][rng.below(3) as usize];
            config.slack_limit_pct = [100.0, 60.0][rng.below(2) as usize];
            let path = if parent_path == "/" {
                format!("/p{c}")
            } else {
                format!("{parent_path}/p{c}")
            };
            let id = rm
                .create_pool(&path, config)
                .expect("generated pool config is valid");
            frontier.push_back((id, level + 1, child_budget, config.limit()));
            n += 1;
            made += 1;
        }
        if made == 0 {
            leaves.push(parent);
        }
    }
    leaves.sort_by_key(|p| p.idx());
    leaves.retain(|&p| rm.tree().is_leaf(p));
    leaves
}

/// Random leaf demand: each leaf wants up to twice an even split of the
/// capacity, so the total demand is about the capacity and some pools are
/// idle while others are over their share.
pub fn random_leaf_demand(
    tree: &PoolTree,
    leaves: &[PoolId],
    capacity: Resources,
    rng: &mut Rng,
    input: &mut EntitlementInput,
) {
    *input = EntitlementInput::with_slots(tree.n_slots());
    input.capacity = capacity;
    input.slack_capacity = capacity.percent(20.0);
    let n = leaves.len().max(1) as u64;
    for &leaf in leaves {
        let idle = rng.chance(0.2);
        for d in 0..N_DIMS {
            let even = capacity.0[d] / n;
            input.demand[d][leaf.idx()] = if idle { 0 } else { rng.below(2 * even + 1) };
            input.slack_demand[d][leaf.idx()] = rng.below(even / 2 + 1);
        }
    }
}

/// Queues `n_tasks` random tasks over `leaves`: mostly normal, some
/// non-preemptible, controller and revocable; about 2% of the entries are
/// gangs of 2–8. Returns the summed non-revocable request, or the first
/// refusal (e.g. a queue bound).
pub fn enqueue_random_tasks(
    rm: &mut ResourceManager,
    leaves: &[PoolId],
    n_tasks: usize,
    rng: &mut Rng,
) -> Result<Resources, crate::AdmissionError> {
    let mut total = Resources::ZERO;
    let mut next_id = 0u64;
    let mut members = Vec::with_capacity(8);
    while (next_id as usize) < n_tasks {
        let pool = leaves[rng.below(leaves.len() as u64) as usize];
        let roll = rng.unit();
        let flags = if roll < 0.10 {
            TaskFlags {
                preemptible: false,
                controller: false,
                revocable: false,
            }
        } else if roll < 0.15 {
            TaskFlags {
                preemptible: true,
                controller: true,
                revocable: false,
            }
        } else if roll < 0.20 {
            TaskFlags {
                preemptible: true,
                controller: false,
                revocable: true,
            }
        } else {
            TaskFlags::default()
        };
        let gang = if rng.chance(0.02) {
            rng.range(2, 8) as usize
        } else {
            1
        };
        let gpu = rng.chance(0.05);
        members.clear();
        for _ in 0..gang.min(n_tasks - next_id as usize) {
            let request = Resources::new(
                rng.range(1, 16) * 250,
                rng.range(1, 32) * 512,
                rng.range(0, 20) * 1024,
                if gpu {
                    [500, 1000, 2000][rng.below(3) as usize]
                } else {
                    0
                },
            );
            if !flags.revocable {
                total.add_assign(&request);
            }
            members.push(PendingTask {
                id: TaskId(next_id),
                request,
                runtime_ms: 0,
            });
            next_id += 1;
        }
        let priority = rng.below(10) as u32;
        rm.enqueue(pool, priority, flags, &members)?;
    }
    Ok(total)
}

/// Panics unless `ent` satisfies the entitlement invariants for `tree` and
/// `input`: the children of a pool never get more than it; nobody exceeds its
/// limit; every pool demanding at least its reservation gets it (when
/// capacity covers the top-level guarantees); every pool's entitlement is
/// divided completely among its children up to their limits
/// (work-conserving); and among children with unmet demand, the amount above
/// their guarantee is proportional to share, within one unit of rounding
/// (max-min fair).
pub fn check_entitlement_invariants(tree: &PoolTree, input: &EntitlementInput, ent: &Entitlements) {
    let root = tree.root();
    for d in 0..N_DIMS {
        let col = &ent.dims[d];
        let root_limit = tree.config(root).dims[d].limit;
        assert_eq!(
            col.entitlement[root.idx()],
            input.capacity.0[d].min(root_limit),
            "root gets the capacity"
        );
        assert_eq!(
            col.slack_entitlement[root.idx()],
            input.slack_capacity.0[d].min(root_limit),
            "root gets the slack capacity"
        );
        let guarantee = |c: PoolId| {
            let cfg = &tree.config(c).dims[d];
            match cfg.kind {
                PoolKind::Static => cfg.reservation,
                PoolKind::Elastic => col.demand[c.idx()].min(cfg.reservation),
            }
        };
        let top_guarantees: u64 = tree.children(root).map(guarantee).sum();
        let guarantees_covered = top_guarantees <= col.entitlement[root.idx()];
        for p in tree.breadth_first() {
            let e_p = col.entitlement[p.idx()];
            let cfg_p = &tree.config(p).dims[d];
            let path = tree.path(p);
            assert!(
                e_p <= cfg_p.limit,
                "{path}: entitlement {e_p} above limit {}",
                cfg_p.limit
            );
            assert!(col.slack_entitlement[p.idx()] <= col.slack_cap[p.idx()].min(cfg_p.limit));
            if tree.is_leaf(p) {
                let leaf_demand = input.demand[d][p.idx()].min(cfg_p.limit);
                assert_eq!(
                    col.demand[p.idx()],
                    leaf_demand,
                    "{path}: leaf demand capped at limit"
                );
                continue;
            }
            let kids: Vec<PoolId> = tree.children(p).collect();
            // Sums over children saturate: a pool may have more children
            // than 2^64 / MAX_AMOUNT.
            let kids_demand = kids
                .iter()
                .map(|&c| {
                    let cfg = &tree.config(c).dims[d];
                    match cfg.kind {
                        PoolKind::Static => cfg.reservation,
                        PoolKind::Elastic => col.demand[c.idx()],
                    }
                })
                .fold(0u64, u64::saturating_add);
            assert_eq!(
                col.demand[p.idx()],
                kids_demand.min(cfg_p.limit),
                "{path}: demand is its children's, capped at its limit"
            );
            let sum: u64 = kids.iter().map(|c| col.entitlement[c.idx()]).sum();
            let upper: u64 = kids
                .iter()
                .map(|&c| {
                    let cfg = &tree.config(c).dims[d];
                    if cfg.kind == PoolKind::Static {
                        cfg.reservation
                    } else {
                        cfg.limit
                    }
                })
                .fold(0u64, u64::saturating_add);
            assert_eq!(
                sum,
                e_p.min(upper),
                "{path} dim {d}: children get min(entitlement, their limits)"
            );
            let parent_slack = col.slack_entitlement[p.idx()];
            for &c in &kids {
                let cfg_c = tree.config(c);
                let want = cfg_c.dims[d].limit.min(crate::resources::percent_of(
                    parent_slack,
                    cfg_c.slack_limit_pct,
                ));
                assert_eq!(
                    col.slack_cap[c.idx()],
                    want,
                    "{}: slack cap from the parent's slack",
                    tree.path(c)
                );
            }
            let slack_sum: u64 = kids.iter().map(|c| col.slack_entitlement[c.idx()]).sum();
            let slack_caps: u64 = kids
                .iter()
                .map(|c| col.slack_cap[c.idx()])
                .fold(0u64, u64::saturating_add);
            assert_eq!(
                slack_sum,
                col.slack_entitlement[p.idx()].min(slack_caps),
                "{path}: slack divided"
            );

            let guaranteed: u64 = kids.iter().map(|&c| guarantee(c)).sum();
            if guaranteed > e_p {
                continue; // capacity short of guarantees: scaled down, no fairness claim
            }
            // Max-min fairness among elastic children with unmet demand.
            let mut lam_lo = f64::NEG_INFINITY;
            let mut lam_hi = f64::INFINITY;
            let mut any_unmet = false;
            for &c in &kids {
                let cfg = &tree.config(c).dims[d];
                let e_c = col.entitlement[c.idx()];
                assert!(e_c >= guarantee(c), "{}: gets its guarantee", tree.path(c));
                if guarantees_covered
                    && cfg.kind == PoolKind::Elastic
                    && col.demand[c.idx()] >= cfg.reservation
                {
                    assert!(
                        e_c >= cfg.reservation,
                        "{}: demanding its reservation, gets it",
                        tree.path(c)
                    );
                }
                if cfg.kind == PoolKind::Elastic && e_c < col.demand[c.idx()] {
                    any_unmet = true;
                    let extra = (e_c - guarantee(c)) as f64;
                    lam_lo = lam_lo.max((extra - 1.0) / cfg.share);
                    lam_hi = lam_hi.min((extra + 1.0) / cfg.share);
                }
            }
            if any_unmet {
                let eps = 1e-9 * lam_hi.abs().max(1.0);
                assert!(
                    lam_lo <= lam_hi + eps,
                    "{path} dim {d}: unmet children share in proportion"
                );
                for &c in &kids {
                    let cfg = &tree.config(c).dims[d];
                    let e_c = col.entitlement[c.idx()];
                    if cfg.kind == PoolKind::Elastic {
                        assert!(
                            e_c <= col.demand[c.idx()]
                                .max(cfg.reservation.min(col.demand[c.idx()])),
                            "{}: no extra beyond demand while others wait",
                            tree.path(c)
                        );
                        let extra = (e_c - guarantee(c)) as f64;
                        assert!(
                            (extra - 1.0) / cfg.share <= lam_hi + eps,
                            "{}: no more than the fair level",
                            tree.path(c)
                        );
                    }
                }
            }
        }
    }
}

/// Computes inter-pool victims for the manager's pools and the placed tasks
/// of `tasks`, and checks them: only preemptible tasks, only from pools over
/// an entitlement, and enough of them that no pool stays over unless it ran
/// out of preemptible tasks of that kind.
pub fn check_inter_pool_victims(rm: &ResourceManager, tasks: &crate::task::TaskArena) {
    use crate::task::flags;
    let mut victims = Vec::new();
    crate::preemption::inter_pool_victims(rm, tasks, &mut victims);
    let ent = rm.entitlements();
    let mut freed: std::collections::HashMap<(u32, bool), Resources> = Default::default();
    let mut seen = std::collections::HashSet::new();
    for v in &victims {
        assert!(seen.insert(v.task), "a victim is listed once");
        let spec = tasks.spec(v.task).expect("a live task");
        assert!(
            spec.flags & flags::PREEMPTIBLE != 0,
            "never a non-preemptible victim"
        );
        assert_eq!(spec.pool, v.pool);
        freed
            .entry((v.pool, spec.flags & flags::REVOCABLE != 0))
            .or_default()
            .add_assign(&spec.request);
    }
    for pool in rm.tree().list() {
        let usage = rm.usage(pool).expect("live");
        let slot = pool.idx() as u32;
        for revocable in [false, true] {
            let (held, cap) = if revocable {
                (
                    usage.allocation.revocable,
                    ent.slack_entitlement(pool.idx()),
                )
            } else {
                (usage.allocation.total, ent.entitlement(pool.idx()))
            };
            let over = held.saturating_sub(&cap);
            let got = freed.get(&(slot, revocable)).copied().unwrap_or_default();
            if over.is_zero() {
                assert!(
                    got.is_zero(),
                    "{}: a pool within its entitlement gives nothing",
                    rm.tree().path(pool)
                );
                continue;
            }
            let mut available = Resources::ZERO;
            for t in tasks.placed_views() {
                if t.pool == slot
                    && t.flags & flags::PREEMPTIBLE != 0
                    && (t.flags & flags::REVOCABLE != 0) == revocable
                {
                    available.add_assign(&t.request);
                }
            }
            for d in 0..N_DIMS {
                assert!(
                    got.0[d] >= over.0[d].min(available.0[d]),
                    "{}: freed {} of {} over in dimension {d}",
                    rm.tree().path(pool),
                    got.0[d],
                    over.0[d]
                );
            }
        }
    }
}

/// Decodes fuzz input bytes into values.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn amount(&mut self) -> Option<u64> {
        // Small amounts mostly, occasionally huge ones, to reach edges.
        let b = self.byte()?;
        Some(match b {
            0..=199 => u64::from(b) * 10,
            200..=249 => u64::from(b - 199) * 1000,
            250 => MAX_AMOUNT,
            251 => MAX_AMOUNT + 1,
            _ => 0,
        })
    }
}

/// What a fuzz run did, so tests can tell that inputs reach deep states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuzzStats {
    /// Pools created.
    pub pools_created: u64,
    /// Tasks or gangs queued.
    pub enqueued: u64,
    /// Tasks admitted.
    pub admitted: u64,
    /// Tasks released.
    pub released: u64,
    /// Operations refused with an error.
    pub refused: u64,
}

/// Fuzz driver: applies the pool, queue and cycle operations encoded by
/// `data` to a small resource manager, checking every invariant after every
/// step. Malformed operations are expected to be refused cleanly; an
/// accepted operation must keep every invariant. Panics on a violation.
pub fn fuzz_pool_ops(data: &[u8]) -> FuzzStats {
    let mut stats = FuzzStats::default();
    let config = ResourceManagerConfig {
        pools: PoolTreeLimits { max_pools: 24 },
        admission: AdmissionLimits {
            max_queued_per_pool: 40,
            max_queued_total: 100,
            max_gang_size: 6,
        },
        threads: 1,
    };
    let mut rm = ResourceManager::new(config);
    let mut input = Bytes(data);
    let mut pools: Vec<PoolId> = vec![rm.tree().root()];
    let mut pending: Vec<PendingId> = Vec::new();
    let mut running: Vec<Admitted> = Vec::new();
    let mut result = AdmissionResult::default();
    let mut next_task = 0u64;
    let mut capacity = Resources::ZERO;
    let mut slack = Resources::ZERO;
    // Running tasks mirrored as placed tasks, for inter-pool preemption.
    let mut mirror = crate::task::TaskArena::new(100_000);
    let mut mirrored: std::collections::HashMap<u64, crate::task::TaskHandle> = Default::default();
    let mut priority_of: std::collections::HashMap<u64, u32> = Default::default();
    let mut clock = 0u64;
    while let Some(op) = input.byte() {
        let pick = |b: Option<u8>, n: usize| b.map(|b| usize::from(b) % n.max(1));
        match op % 11 {
            0 | 1 => {
                // create a pool under an existing one
                let Some(parent) = pick(input.byte(), pools.len()).map(|i| pools[i]) else {
                    break;
                };
                let Some(name) = input.byte() else { break };
                let config = decode_config(&mut input);
                let Some(config) = config else { break };
                if !rm.tree().contains(parent) {
                    continue;
                }
                let base = rm.tree().path(parent).to_owned();
                let path = if base == "/" {
                    format!("/n{}", name % 8)
                } else {
                    format!("{base}/n{}", name % 8)
                };
                let before = format!("{:?}", rm.tree());
                match rm.create_pool(&path, config) {
                    Ok(id) => {
                        pools.push(id);
                        stats.pools_created += 1;
                    }
                    Err(_) => {
                        stats.refused += 1;
                        assert_eq!(
                            before,
                            format!("{:?}", rm.tree()),
                            "rejected create changes nothing"
                        );
                    }
                }
            }
            2 => {
                let Some(target) = pick(input.byte(), pools.len()).map(|i| pools[i]) else {
                    break;
                };
                let Some(config) = decode_config(&mut input) else {
                    break;
                };
                let before = format!("{:?}", rm.tree());
                if rm.update_pool(target, config).is_err() {
                    stats.refused += 1;
                    assert_eq!(
                        before,
                        format!("{:?}", rm.tree()),
                        "rejected update changes nothing"
                    );
                }
            }
            3 => {
                let Some(target) = pick(input.byte(), pools.len()).map(|i| pools[i]) else {
                    break;
                };
                let before = format!("{:?}", rm.tree());
                match rm.delete_pool(target) {
                    Ok(()) => pools.retain(|&p| p != target),
                    Err(_) => {
                        stats.refused += 1;
                        assert_eq!(
                            before,
                            format!("{:?}", rm.tree()),
                            "rejected delete changes nothing"
                        );
                    }
                }
            }
            4 => {
                // enqueue a task or gang
                let Some(pool) = pick(input.byte(), pools.len()).map(|i| pools[i]) else {
                    break;
                };
                let (Some(shape), Some(priority)) = (input.byte(), input.byte()) else {
                    break;
                };
                let flags = TaskFlags {
                    preemptible: shape & 1 == 0,
                    controller: shape & 2 != 0,
                    revocable: shape & 4 != 0,
                };
                let n = usize::from(shape >> 5) + 1; // up to 8, above the gang bound
                let mut members = Vec::new();
                for _ in 0..n {
                    let mut request = Resources::ZERO;
                    for d in 0..N_DIMS {
                        let Some(a) = input.amount() else {
                            return stats;
                        };
                        request.0[d] = a;
                    }
                    members.push(PendingTask {
                        id: TaskId(next_task),
                        request,
                        runtime_ms: 0,
                    });
                    priority_of.insert(next_task, u32::from(priority % 4));
                    next_task += 1;
                }
                let queued_before = rm.n_tasks(pool).ok();
                match rm.enqueue(pool, u32::from(priority % 4), flags, &members) {
                    Ok(id) => {
                        pending.push(id);
                        stats.enqueued += 1;
                    }
                    Err(_) => {
                        stats.refused += 1;
                        if let Some(before) = queued_before {
                            assert_eq!(
                                rm.n_tasks(pool).unwrap(),
                                before,
                                "rejected enqueue queues nothing"
                            );
                        }
                    }
                }
            }
            5 => {
                let Some(i) = pick(input.byte(), pending.len()) else {
                    break;
                };
                if let Some(&id) = pending.get(i) {
                    let _ = rm.cancel(id); // may already be admitted
                    pending.swap_remove(i);
                    assert!(rm.cancel(id).is_err(), "cancelling twice is refused");
                }
            }
            6 => {
                for d in 0..N_DIMS {
                    let (Some(a), Some(b)) = (input.byte(), input.byte()) else {
                        return stats;
                    };
                    capacity.0[d] = u64::from(a) * 100;
                    slack.0[d] = u64::from(b) * 20;
                }
                rm.recompute_entitlement(capacity, slack);
                check_manager_entitlements(&rm, capacity, slack);
                check_inter_pool_victims(&rm, &mirror);
            }
            7 | 8 => {
                // 7 recomputes first; 8 admits against the entitlements as
                // they are, possibly stale after pool changes.
                if op % 11 == 7 {
                    rm.recompute_entitlement(capacity, slack);
                    check_manager_entitlements(&rm, capacity, slack);
                }
                rm.admit(&mut result);
                check_admission(&rm, &result);
                running.extend_from_slice(&result.admitted);
                stats.admitted += result.admitted.len() as u64;
                for a in &result.admitted {
                    let mut bits = 0;
                    if a.class != TaskClass::NonPreemptible {
                        bits |= crate::task::flags::PREEMPTIBLE;
                    }
                    if a.class == TaskClass::Revocable {
                        bits |= crate::task::flags::REVOCABLE;
                    }
                    let spec = crate::task::TaskSpec {
                        pool: a.pool.idx() as u32,
                        priority: priority_of[&a.task.0],
                        request: a.request,
                        flags: bits,
                        gang: crate::task::NO_GANG,
                        ..Default::default()
                    };
                    let handle = mirror.add(&spec).expect("mirror bound");
                    clock += 1;
                    mirror
                        .set_placed(handle, 0, Default::default(), clock)
                        .expect("new");
                    mirrored.insert(a.task.0, handle);
                }
            }
            9 => {
                let Some(i) = pick(input.byte(), running.len()) else {
                    break;
                };
                if i < running.len() {
                    let a = running.swap_remove(i);
                    rm.release(&a).expect("releasing an admitted task succeeds");
                    let handle = mirrored.remove(&a.task.0).expect("mirrored");
                    mirror
                        .set_unplaced(handle, crate::task::TaskState::Admitted)
                        .expect("placed");
                    mirror.remove(handle).expect("live");
                    stats.released += 1;
                }
            }
            _ => {
                // Releases that cannot match anything held must be refused
                // and change nothing: more than the class holds in total, a
                // class holding no task, or a controller flag its class
                // cannot have.
                let (Some(i), Some(how)) = (pick(input.byte(), running.len()), input.byte()) else {
                    break;
                };
                if let Some(&a) = running.get(i) {
                    let before = rm.usage(a.pool).expect("pool of a running task is live");
                    let consistent = |class: TaskClass, np_controller: bool| match class {
                        TaskClass::Controller => true,
                        TaskClass::NonPreemptible => np_controller,
                        _ => false,
                    };
                    let mut bogus = a;
                    let refusable = match how % 3 {
                        0 => {
                            bogus.class = TaskClass::ALL[usize::from(how / 3) % 4];
                            bogus.controller = consistent(bogus.class, how & 64 != 0);
                            let (held, _) = before.allocation.held(bogus.class, bogus.controller);
                            bogus.request = held;
                            bogus.request.0[usize::from(how / 12) % N_DIMS] += 1;
                            true
                        }
                        1 => {
                            bogus.class = [
                                TaskClass::Controller,
                                TaskClass::Normal,
                                TaskClass::Revocable,
                            ][usize::from(how / 3) % 3];
                            bogus.controller = !consistent(bogus.class, false);
                            true
                        }
                        _ => {
                            let empty = TaskClass::ALL
                                .iter()
                                .flat_map(|&c| [(c, false), (c, true)])
                                .find(|&(c, flag)| {
                                    consistent(c, flag) == flag
                                        && before.allocation.held(c, flag).1 == 0
                                });
                            if let Some((class, flag)) = empty {
                                bogus.class = class;
                                bogus.controller = flag;
                            }
                            empty.is_some()
                        }
                    };
                    if refusable {
                        assert!(
                            rm.release(&bogus).is_err(),
                            "release {bogus:?} must be refused"
                        );
                        stats.refused += 1;
                        assert_eq!(
                            before,
                            rm.usage(a.pool).unwrap(),
                            "refused release changes nothing"
                        );
                    }
                }
            }
        }
        rm.check_invariants();
        let held: u64 = pools
            .iter()
            .filter(|&&p| rm.tree().contains(p))
            .map(|&p| rm.usage(p).unwrap().allocation.n_tasks)
            .sum();
        assert_eq!(
            held as usize,
            running.len(),
            "allocation counts match the admitted tasks"
        );
    }
    stats
}

fn decode_config(input: &mut Bytes<'_>) -> Option<PoolConfig> {
    let mut config = PoolConfig::default();
    for d in 0..N_DIMS {
        let reservation = input.amount()?;
        let limit_byte = input.byte()?;
        let share = input.byte()?;
        config.dims[d] = DimConfig {
            reservation,
            limit: if limit_byte == 255 {
                MAX_AMOUNT
            } else {
                reservation + u64::from(limit_byte) * 20
            },
            share: f64::from(share % 16),
            kind: if share >= 240 {
                PoolKind::Static
            } else {
                PoolKind::Elastic
            },
        };
    }
    let pct = input.byte()?;
    config.controller_limit_pct = f64::from(pct % 128);
    config.slack_limit_pct = f64::from(pct / 2);
    Some(config)
}

/// Checks the manager's last entitlements against its tree, its demand and
/// the capacities it was given.
pub fn check_manager_entitlements(rm: &ResourceManager, capacity: Resources, slack: Resources) {
    let tree = rm.tree();
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    let ent = rm.entitlements();
    input.capacity = capacity.min(&Resources::MAX);
    input.slack_capacity = slack.min(&Resources::MAX);
    for p in tree.list() {
        if tree.is_leaf(p) {
            let u = rm.usage(p).unwrap();
            input.set_demand(
                p.idx(),
                u.queued
                    .saturating_add(&u.allocation.total)
                    .min(&Resources::MAX),
            );
            input.set_slack_demand(
                p.idx(),
                u.queued_revocable.saturating_add(&u.allocation.revocable),
            );
        }
    }
    check_entitlement_invariants(tree, &input, ent);
}

/// Checks an admission result: every pool that admitted work is within all
/// its caps afterwards, and every blocked queue really cannot take its head.
pub fn check_admission(rm: &ResourceManager, result: &AdmissionResult) {
    use crate::admission::{BlockKind, TaskClass};
    let tree = rm.tree();
    let ent = rm.entitlements();
    // Per pool, which classes admitted something in this call. A pool may be
    // above a cap it did not admit against (its entitlement shrank since),
    // so only the caps that admission actually checked are asserted.
    let mut classes: std::collections::BTreeMap<PoolId, [bool; 4]> = Default::default();
    for a in &result.admitted {
        classes.entry(a.pool).or_default()[a.class as usize] = true;
    }
    for (pool, admitted) in classes {
        let u = rm.usage(pool).unwrap();
        let a = &u.allocation;
        let cfg = tree.config(pool);
        let e = ent.entitlement(pool.idx());
        let path = tree.path(pool);
        let non_revocable = admitted[TaskClass::NonPreemptible as usize]
            || admitted[TaskClass::Controller as usize]
            || admitted[TaskClass::Normal as usize];
        if non_revocable {
            assert!(
                a.total.fits_in(&e),
                "{path}: allocation {} within entitlement {e}",
                a.total
            );
        }
        if admitted[TaskClass::NonPreemptible as usize] {
            assert!(
                a.non_preemptible.fits_in(&cfg.reservation()),
                "{path}: within reservation"
            );
        }
        if admitted[TaskClass::Controller as usize] {
            // Within the limit, or the pool's first controller (admitted
            // whatever the limit).
            let cap = e.percent(cfg.controller_limit_pct);
            let controllers =
                a.held(TaskClass::Controller, true).1 + a.held(TaskClass::NonPreemptible, true).1;
            assert!(
                a.controller.fits_in(&cap) || controllers == 1,
                "{path}: within controller limit"
            );
        }
        if admitted[TaskClass::Revocable as usize] {
            let slack = ent.slack_entitlement(pool.idx());
            assert!(
                a.revocable.fits_in(&slack),
                "{path}: within slack entitlement"
            );
        }
    }
    // Every reason names a cap that, recomputed here from the pool's
    // configuration and entitlement, the head really exceeds.
    for b in &result.blocked {
        let cfg = tree.config(b.pool);
        let slot = b.pool.idx();
        let d = b.dim;
        let e = ent.entitlement(slot);
        if b.kind == BlockKind::Hosts {
            // A gang held back by the engine: fewer of its tasks fit the
            // hosts than it has.
            assert!(b.allocated < b.cap, "blocked for a reason: {b}");
            continue;
        }
        let cap = match b.kind {
            BlockKind::Hosts => unreachable!("handled above"),
            BlockKind::Entitlement => e[d],
            BlockKind::Reservation => cfg.reservation()[d],
            BlockKind::ControllerLimit => e.percent(cfg.controller_limit_pct)[d],
            BlockKind::SlackEntitlement | BlockKind::SlackLimit => ent.slack_entitlement(slot)[d],
        };
        assert_eq!(
            b.cap,
            cap,
            "{}: the reason names the real cap",
            tree.path(b.pool)
        );
        assert!(b.allocated + b.request > cap, "blocked for a reason: {b}");
        if b.kind == BlockKind::SlackLimit {
            assert_eq!(
                ent.slack_cap(slot)[d],
                ent.slack_entitlement(slot)[d],
                "the slack limit binds"
            );
        }
        assert!(rm.n_queued_in(b.pool, b.class).unwrap() > 0);
    }
}

/// A placement workload: hosts, tasks (all admitted), their constraints,
/// and the batch to place.
#[derive(Debug)]
pub struct PlacementWorkload {
    /// The hosts.
    pub hosts: crate::host::HostArena,
    /// The tasks.
    pub tasks: crate::task::TaskArena,
    /// Constraints the tasks name.
    pub constraints: crate::constraint::ConstraintTable,
    /// Every task, in submission order.
    pub batch: Vec<crate::task::TaskHandle>,
}

/// The synthetic cluster of the placement benchmark: `n_hosts` hosts in three
/// shapes (32/64/96 cores, 128/256/512 GiB), attributes `zone` (5 values),
/// `rack` (200) and, on the 10% of hosts with 8 GPUs, `gpu_model`; and
/// `n_tasks` tasks in jobs of 100 with one shape each: 30% of jobs constrained
/// to a zone, 10% limited to one instance per host, 5% requesting GPUs (half
/// of them fractional), all with `strategy`.
pub fn placement_workload(
    n_hosts: usize,
    n_tasks: usize,
    strategy: crate::task::Strategy,
    seed: u64,
) -> PlacementWorkload {
    use crate::host::{HostArena, HostLimits, HostSpec};
    use crate::task::{NO_GANG, TaskArena, TaskSpec};
    let mut rng = Rng::new(seed);
    let mut hosts = HostArena::new(HostLimits {
        max_hosts: n_hosts.max(1),
    });
    for i in 0..n_hosts {
        let shape = rng.below(3);
        let gpus = if rng.chance(0.1) { 8u8 } else { 0 };
        let mut attributes = vec![
            ("zone".to_owned(), format!("z{}", rng.below(5))),
            ("rack".to_owned(), format!("r{}", rng.below(200))),
        ];
        if gpus > 0 {
            attributes.push((
                "gpu_model".to_owned(),
                ["a100", "v100"][rng.below(2) as usize].to_owned(),
            ));
        }
        let spec = HostSpec {
            name: format!("host-{i:06}"),
            capacity: Resources::new(
                32_000 * (shape + 1),
                131_072 * (1 << shape),
                1_048_576,
                u64::from(gpus) * 1000,
            ),
            gpu_devices: gpus,
            ports: 1000,
            attributes,
        };
        hosts.add(&spec).expect("generated host is valid");
    }
    let mut constraints = crate::constraint::ConstraintTable::new();
    let zone_constraints: Vec<u32> = (0..5)
        .map(|z| {
            constraints
                .intern(&format!("zone == z{z}"), hosts.interner_mut())
                .expect("valid")
        })
        .collect();
    let mut tasks = TaskArena::new(n_tasks.max(1));
    tasks.reserve(n_tasks);
    let mut batch = Vec::with_capacity(n_tasks);
    let mut job = 0u32;
    while batch.len() < n_tasks {
        let gpu = if rng.chance(0.05) {
            if rng.chance(0.5) {
                [250, 500][rng.below(2) as usize]
            } else {
                [1000, 2000][rng.below(2) as usize]
            }
        } else {
            0
        };
        let spec = TaskSpec {
            job,
            instance: 0,
            pool: 0,
            priority: rng.below(10) as u32,
            request: Resources::new(
                [250, 500, 1000][rng.below(3) as usize],
                rng.range(1, 8) * 512,
                1024,
                gpu,
            ),
            ports: 0,
            flags: crate::task::flags::PREEMPTIBLE,
            gang: NO_GANG,
            constraint: if rng.chance(0.3) {
                zone_constraints[rng.below(5) as usize]
            } else {
                0
            },
            strategy,
            max_per_host: if rng.chance(0.1) { 1 } else { 0 },
            limit_key: job,
            ..Default::default()
        };
        for instance in 0..100.min(n_tasks - batch.len()) {
            let handle = tasks
                .add(&TaskSpec {
                    instance: instance as u32,
                    ..spec
                })
                .expect("within bound");
            tasks
                .set_state(handle, crate::task::TaskState::Admitted)
                .expect("live");
            batch.push(handle);
        }
        job += 1;
    }
    PlacementWorkload {
        hosts,
        tasks,
        constraints,
        batch,
    }
}

/// Fuzz driver for hosts, tasks, placement and preemption: applies the
/// operations encoded by `data` to a small cluster and checks after every
/// step that the host indexes agree with the columns, that every host's free
/// resources plus what its tasks hold equal its capacity, that every placed
/// task satisfies its constraint and per-host limit, and that intra-pool
/// eviction plans really make their host fit. Returns how many tasks were
/// placed in all.
pub fn fuzz_placement_ops(data: &[u8]) -> u64 {
    use crate::constraint::ConstraintTable;
    use crate::host::{HostArena, HostLimits, HostSpec, HostState};
    use crate::placement::{PlacementConfig, PlacementResult, Placer, check_host_accounting};
    use crate::preemption::intra_pool_victims;
    use crate::task::{NO_GANG, Strategy, TaskArena, TaskHandle, TaskSpec, TaskState, flags};

    const CONSTRAINTS: [&str; 4] = [
        "",
        "zone == a",
        "zone != a && exists rack",
        "exclusive == x",
    ];
    let mut input = Bytes(data);
    let mut hosts = HostArena::new(HostLimits { max_hosts: 12 });
    let mut tasks = TaskArena::new(150);
    let mut constraints = ConstraintTable::new();
    let ids: Vec<u32> = CONSTRAINTS
        .iter()
        .map(|c| constraints.intern(c, hosts.interner_mut()).expect("valid"))
        .collect();
    let mut placer = Placer::new(PlacementConfig::default());
    let mut out = PlacementResult::default();
    let mut live: Vec<TaskHandle> = Vec::new();
    let mut n_placed = 0u64;
    let mut next_host = 0u32;
    while let Some(op) = input.byte() {
        match op % 8 {
            0 | 1 => {
                // add or update a host
                let (Some(shape), Some(attrs), Some(which)) =
                    (input.byte(), input.byte(), input.byte())
                else {
                    break;
                };
                let gpus = if shape & 1 == 1 { shape >> 5 } else { 0 };
                let mut attributes = vec![(
                    "zone".to_owned(),
                    ["a", "b"][usize::from(attrs & 1)].to_owned(),
                )];
                if attrs & 2 != 0 {
                    attributes.push(("rack".to_owned(), format!("r{}", attrs >> 4)));
                }
                if attrs & 4 != 0 {
                    attributes.push(("exclusive".to_owned(), "x".to_owned()));
                }
                let existing = (op % 8 == 1)
                    .then(|| hosts.lookup_slot(usize::from(which) % hosts.n_slots().max(1)))
                    .flatten();
                let name = match existing {
                    Some(id) => hosts.name(id).to_owned(),
                    None => {
                        next_host += 1;
                        format!("h{next_host}")
                    }
                };
                let spec = HostSpec {
                    name,
                    capacity: Resources::new(
                        u64::from(shape % 16 + 1) * 1000,
                        u64::from(shape % 8 + 1) * 1024,
                        0,
                        u64::from(gpus) * 1000,
                    ),
                    gpu_devices: gpus,
                    ports: u32::from(which % 4),
                    attributes,
                };
                let before = format!("{hosts:?}");
                let result = match existing {
                    Some(id) => hosts.update(id, &spec),
                    None => hosts.add(&spec).map(|_| ()),
                };
                if result.is_err() {
                    assert_eq!(
                        before,
                        format!("{hosts:?}"),
                        "a refused host change changes nothing"
                    );
                }
            }
            2 => {
                let (Some(which), Some(state)) = (input.byte(), input.byte()) else {
                    break;
                };
                if let Some(id) = hosts.lookup_slot(usize::from(which) % hosts.n_slots().max(1)) {
                    if state % 4 == 3 {
                        let _ = hosts.remove(id); // refused while it holds tasks
                    } else {
                        hosts
                            .set_state(id, HostState::ALL[usize::from(state % 3)])
                            .expect("live");
                    }
                }
            }
            3 => {
                // add tasks of one shape
                let (Some(n), Some(shape), Some(more)) = (input.byte(), input.byte(), input.byte())
                else {
                    break;
                };
                let gpu = match shape % 8 {
                    0 => 500,
                    1 => 1000,
                    2 => 250,
                    _ => 0,
                };
                let spec = TaskSpec {
                    job: u32::from(more % 4),
                    instance: 0,
                    pool: u32::from(more >> 6),
                    priority: u32::from(shape >> 5),
                    request: Resources::new(
                        u64::from(shape % 4 + 1) * 500,
                        u64::from(more % 3 + 1) * 256,
                        0,
                        gpu,
                    ),
                    ports: u16::from(more & 8 != 0),
                    flags: if more & 16 != 0 {
                        0
                    } else {
                        flags::PREEMPTIBLE
                    },
                    gang: if more & 32 != 0 {
                        u32::from(shape % 3)
                    } else {
                        NO_GANG
                    },
                    constraint: ids[usize::from(more >> 2) % ids.len()],
                    strategy: [Strategy::Pack, Strategy::Spread, Strategy::FirstFit]
                        [usize::from(n) % 3],
                    max_per_host: u16::from(n & 4 != 0),
                    limit_key: u32::from(more % 4),
                    ..Default::default()
                };
                for _ in 0..n % 6 + 1 {
                    match tasks.add(&spec) {
                        Ok(t) => live.push(t),
                        Err(_) => break,
                    }
                }
            }
            4 | 5 => {
                // place every unplaced task, or a prefix of them
                let Some(cut) = input.byte() else { break };
                let pending: Vec<TaskHandle> = live
                    .iter()
                    .copied()
                    .filter(|&t| tasks.state(t) != Ok(TaskState::Placed))
                    .collect();
                let take = if op % 8 == 4 {
                    pending.len()
                } else {
                    usize::from(cut) % (pending.len() + 1)
                };
                placer
                    .place(
                        &mut hosts,
                        &mut tasks,
                        &constraints,
                        &pending[..take],
                        0,
                        &mut out,
                    )
                    .expect("a valid batch");
                assert_eq!(
                    out.placed.len() + out.unplaced.len(),
                    take,
                    "every task placed or explained"
                );
                // Placed where the constraint holds, on an up host (attributes
                // and states may change later; this is checked as placed).
                for p in &out.placed {
                    let spec = tasks.spec(p.task).expect("live");
                    let constraint = constraints.get(spec.constraint).expect("known");
                    assert!(
                        constraint.matches(hosts.attributes(p.host as usize)),
                        "placed where the constraint holds"
                    );
                    let host = hosts.lookup_slot(p.host as usize).expect("live host");
                    assert_eq!(hosts.state(host), HostState::Up, "placed on an up host");
                }
                // Gangs of the batch are complete or absent.
                let mut gangs: std::collections::HashMap<u32, (usize, usize)> = Default::default();
                for &t in &pending[..take] {
                    let gang = tasks.spec(t).expect("live").gang;
                    if gang != NO_GANG {
                        let e = gangs.entry(gang).or_default();
                        e.0 += 1;
                        e.1 += usize::from(tasks.state(t) == Ok(TaskState::Placed));
                    }
                }
                for (gang, (members, placed)) in gangs {
                    assert!(
                        placed == 0 || placed == members,
                        "gang {gang}: {placed} of {members} placed"
                    );
                }
                n_placed += out.placed.len() as u64;
            }
            6 => {
                let Some(which) = input.byte() else { break };
                let placed: Vec<TaskHandle> = live
                    .iter()
                    .copied()
                    .filter(|&t| tasks.state(t) == Ok(TaskState::Placed))
                    .collect();
                if let Some(&t) = placed.get(usize::from(which) % placed.len().max(1)) {
                    placer.unplace(&mut hosts, &mut tasks, t).expect("placed");
                    if which & 1 == 1 {
                        tasks.remove(t).expect("live");
                        live.retain(|&l| l != t);
                    }
                }
            }
            _ => {
                // plan intra-pool evictions for the unplaced tasks and check them
                let pending: Vec<TaskHandle> = live
                    .iter()
                    .copied()
                    .filter(|&t| tasks.state(t) != Ok(TaskState::Placed))
                    .collect();
                let mut plans = Vec::new();
                intra_pool_victims(&placer, &hosts, &tasks, &constraints, &pending, &mut plans)
                    .expect("live tasks");
                let mut plan_hosts = std::collections::HashSet::new();
                let mut plan_victims = std::collections::HashSet::new();
                for (task, host, victims) in &plans {
                    assert!(plan_hosts.insert(*host), "one plan per host");
                    assert!(
                        victims.iter().all(|v| plan_victims.insert(v.task)),
                        "a victim in one plan only"
                    );
                    assert!(!victims.is_empty(), "a plan evicts someone");
                    let spec = tasks.spec(*task).expect("live");
                    let mut freed = Resources::ZERO;
                    let mut ports = 0;
                    let mut grants = Vec::new();
                    for v in victims {
                        let vs = tasks.spec(v.task).expect("live");
                        assert_eq!(vs.pool, spec.pool, "victims come from the same pool");
                        assert!(vs.priority < spec.priority, "victims have lower priority");
                        assert!(
                            vs.flags & flags::PREEMPTIBLE != 0,
                            "victims are preemptible"
                        );
                        assert_eq!(tasks.host(v.task).expect("live"), Some(*host));
                        freed.add_assign(&vs.request);
                        ports += u32::from(vs.ports);
                        grants.push(tasks.gpu(v.task).expect("live"));
                    }
                    assert!(
                        hosts.fits_after_freeing(
                            *host as usize,
                            &spec.request,
                            u32::from(spec.ports),
                            &freed,
                            ports,
                            &grants
                        ),
                        "the eviction makes the host fit"
                    );
                }
            }
        }
        hosts.check_invariants();
        tasks.check_invariants();
        check_host_accounting(&hosts, &tasks);
        for view in tasks.placed_views() {
            let spec = tasks.spec(view.task).expect("live");
            if spec.max_per_host > 0 {
                let on_host = tasks
                    .placed_views()
                    .filter(|o| {
                        o.host == view.host
                            && tasks.spec(o.task).is_ok_and(|os| {
                                os.limit_key == spec.limit_key && os.max_per_host > 0
                            })
                    })
                    .count();
                assert!(
                    on_host <= usize::from(spec.max_per_host),
                    "per-host limit, counted from the tasks"
                );
                assert_eq!(
                    usize::from(placer.instances_on_host(spec.limit_key, view.host)),
                    on_host,
                    "the placer's count"
                );
            }
            let devices = hosts.gpu_free(view.host as usize).len();
            assert!(
                u32::from(view.gpu.devices) < (1 << devices),
                "GPU grant within the host's devices"
            );
            if spec.request[crate::Dim::Gpu] > 0 && spec.request[crate::Dim::Gpu] < 1000 {
                assert_eq!(
                    view.gpu.devices.count_ones(),
                    1,
                    "a fractional GPU stays on one device"
                );
            }
        }
    }
    n_placed
}

/// A host spec from a fixture line `NAME cpu=CORES mem=GIB gpus=N
/// key=value…` (cores and GiB, so fixtures stay short).
pub fn host_spec(line: &str) -> crate::host::HostSpec {
    let mut words = line.split_whitespace();
    let mut spec = crate::host::HostSpec {
        name: words.next().expect("a host name").to_owned(),
        ..Default::default()
    };
    for word in words {
        let (k, v) = word.split_once('=').expect("key=value");
        match k {
            "cpu" => spec.capacity[crate::Dim::Cpu] = v.parse::<u64>().expect("cores") * 1000,
            "mem" => spec.capacity[crate::Dim::Memory] = v.parse::<u64>().expect("GiB") * 1024,
            "gpus" => {
                spec.gpu_devices = v.parse().expect("GPU count");
                spec.capacity[crate::Dim::Gpu] = u64::from(spec.gpu_devices) * 1000;
            }
            _ => spec.attributes.push((k.to_owned(), v.to_owned())),
        }
    }
    spec
}

/// A plain task for tests and benchmarks: instance `instance` of job `job`
/// in `pool`, priority 1, packed, no constraint, ports or per-host limit
/// (the limit key is the job).
pub fn plain_task(
    job: u32,
    instance: u32,
    pool: crate::PoolId,
    request: Resources,
) -> crate::NewTask {
    crate::NewTask {
        job,
        instance,
        pool,
        priority: 1,
        request,
        ports: 0,
        flags: crate::TaskFlags::default(),
        constraint: String::new(),
        strategy: crate::task::Strategy::Pack,
        max_per_host: 0,
        limit_key: job,
        desired_host: None,
        daemon: false,
        runtime_ms: 0,
    }
}
