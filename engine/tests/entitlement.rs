//! Entitlement: hand-checked examples and property tests against an
//! independent reference.

use expect_test::{Expect, expect};
use peloton_engine::testkit::{Rng, check_entitlement_invariants};
use peloton_engine::{
    DimConfig, EntitlementCalculator, EntitlementInput, Entitlements, MAX_AMOUNT, N_DIMS,
    PoolConfig, PoolKind, PoolTree, PoolTreeLimits, Resources,
};
use proptest::prelude::*;

/// Builds a tree from a fixture and computes entitlements for cpu. Lines:
/// `capacity N [slack=N]` and
/// `pool PATH [reservation=N] [limit=N] [share=N] [static] [demand=N] [slack_demand=N] [slack_pct=N]`.
/// Values apply to cpu; other dimensions are left without demand.
fn run(fixture: &str) -> (PoolTree, EntitlementInput, Entitlements) {
    let mut tree = PoolTree::new(PoolTreeLimits::default());
    let mut demands = Vec::new();
    let mut capacity = 0;
    let mut slack = 0;
    for line in fixture.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        match words.next().unwrap() {
            "capacity" => {
                capacity = words.next().unwrap().parse().unwrap();
                if let Some(s) = words.next() {
                    slack = s.strip_prefix("slack=").unwrap().parse().unwrap();
                }
            }
            "pool" => {
                let path = words.next().unwrap();
                let mut dim = DimConfig::default();
                let mut config = PoolConfig::default();
                let (mut demand, mut slack_demand) = (0, 0);
                for word in words {
                    let (key, value) = word.split_once('=').unwrap_or((word, ""));
                    match key {
                        "reservation" => dim.reservation = value.parse().unwrap(),
                        "limit" => dim.limit = value.parse().unwrap(),
                        "share" => dim.share = value.parse().unwrap(),
                        "static" => dim.kind = PoolKind::Static,
                        "demand" => demand = value.parse().unwrap(),
                        "slack_demand" => slack_demand = value.parse().unwrap(),
                        "slack_pct" => config.slack_limit_pct = value.parse().unwrap(),
                        other => panic!("unknown key {other}"),
                    }
                }
                config.dims[0] = dim;
                let id = tree.create(path, config).unwrap();
                demands.push((id, demand, slack_demand));
            }
            other => panic!("unknown line {other}"),
        }
    }
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    input.capacity = Resources::new(capacity, 0, 0, 0);
    input.slack_capacity = Resources::new(slack, 0, 0, 0);
    for (id, demand, slack_demand) in demands {
        input.demand[0][id.idx()] = demand;
        input.slack_demand[0][id.idx()] = slack_demand;
    }
    let mut out = Entitlements::default();
    EntitlementCalculator::new().compute(&tree, &input, &mut out, None);
    check_entitlement_invariants(&tree, &input, &out);
    (tree, input, out)
}

fn check(fixture: &str, expected: Expect) {
    let (tree, _, out) = run(fixture);
    let cpu = &out.dims[0];
    let mut table = String::new();
    for id in tree.list() {
        let i = id.idx();
        table.push_str(&format!(
            "{:<8} demand={:<4} entitlement={:<4} slack_demand={:<3} slack={}\n",
            tree.path(id),
            cpu.demand[i],
            cpu.entitlement[i],
            cpu.slack_demand[i],
            cpu.slack_entitlement[i]
        ));
    }
    expected.assert_eq(&table);
}

#[test]
fn idle_reservation_is_lent_and_taken_back() {
    // /a is idle: /b borrows all but what /a uses.
    check(
        "capacity 100
         pool /a reservation=50 demand=10
         pool /b reservation=50 demand=100",
        expect![[r#"
            /        demand=110  entitlement=100  slack_demand=0   slack=0
            /a       demand=10   entitlement=10   slack_demand=0   slack=0
            /b       demand=100  entitlement=90   slack_demand=0   slack=0
        "#]],
    );
    // /a's demand returns: it gets its reservation back at the next recomputation.
    check(
        "capacity 100
         pool /a reservation=50 demand=60
         pool /b reservation=50 demand=100",
        expect![[r#"
            /        demand=160  entitlement=100  slack_demand=0   slack=0
            /a       demand=60   entitlement=50   slack_demand=0   slack=0
            /b       demand=100  entitlement=50   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn extra_capacity_goes_by_share_and_is_water_filled() {
    // 1:3 shares, both unsatisfied.
    check(
        "capacity 100
         pool /a share=1 demand=100
         pool /b share=3 demand=100",
        expect![[r#"
            /        demand=200  entitlement=100  slack_demand=0   slack=0
            /a       demand=100  entitlement=25   slack_demand=0   slack=0
            /b       demand=100  entitlement=75   slack_demand=0   slack=0
        "#]],
    );
    // /a needs only 10 of its 33: the rest is split between /b and /c.
    check(
        "capacity 100
         pool /a demand=10
         pool /b demand=50
         pool /c demand=100",
        expect![[r#"
            /        demand=160  entitlement=100  slack_demand=0   slack=0
            /a       demand=10   entitlement=10   slack_demand=0   slack=0
            /b       demand=50   entitlement=45   slack_demand=0   slack=0
            /c       demand=100  entitlement=45   slack_demand=0   slack=0
        "#]],
    );
    // Rounding: 100 over three equal pools is 34 + 33 + 33, nothing lost.
    check(
        "capacity 100
         pool /a demand=100
         pool /b demand=100
         pool /c demand=100",
        expect![[r#"
            /        demand=300  entitlement=100  slack_demand=0   slack=0
            /a       demand=100  entitlement=34   slack_demand=0   slack=0
            /b       demand=100  entitlement=33   slack_demand=0   slack=0
            /c       demand=100  entitlement=33   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn reservation_first_then_share_beyond_it() {
    // /a's reservation of 60 comes first; the remaining 40 splits evenly.
    check(
        "capacity 100
         pool /a reservation=60 demand=100
         pool /b demand=100",
        expect![[r#"
            /        demand=200  entitlement=100  slack_demand=0   slack=0
            /a       demand=100  entitlement=80   slack_demand=0   slack=0
            /b       demand=100  entitlement=20   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn remainder_is_handed_out_up_to_limits() {
    // All demand is met with 70 left: divided by share, /a capped at its limit.
    check(
        "capacity 100
         pool /a limit=40 demand=10
         pool /b demand=20",
        expect![[r#"
            /        demand=30   entitlement=100  slack_demand=0   slack=0
            /a       demand=10   entitlement=40   slack_demand=0   slack=0
            /b       demand=20   entitlement=60   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn static_pools_get_exactly_their_reservation() {
    check(
        "capacity 100
         pool /s reservation=30 static demand=0
         pool /e demand=100",
        expect![[r#"
            /        demand=130  entitlement=100  slack_demand=0   slack=0
            /e       demand=100  entitlement=70   slack_demand=0   slack=0
            /s       demand=0    entitlement=30   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn short_capacity_scales_guarantees_down() {
    check(
        "capacity 50
         pool /a reservation=40 demand=40
         pool /b reservation=40 demand=100",
        expect![[r#"
            /        demand=140  entitlement=50   slack_demand=0   slack=0
            /a       demand=40   entitlement=25   slack_demand=0   slack=0
            /b       demand=100  entitlement=25   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn hierarchy_divides_level_by_level() {
    // /org1 is reserved 60 but its teams want only 30; /org2 borrows the rest.
    // Inside /org2, /t3 (share 2) gets twice /t4's extra.
    check(
        "capacity 120
         pool /org1 reservation=60
         pool /org1/t1 reservation=20 demand=10
         pool /org1/t2 reservation=20 demand=20
         pool /org2 reservation=40
         pool /org2/t3 share=2 demand=200
         pool /org2/t4 share=1 demand=200",
        expect![[r#"
            /        demand=430  entitlement=120  slack_demand=0   slack=0
            /org1    demand=30   entitlement=30   slack_demand=0   slack=0
            /org1/t1 demand=10   entitlement=10   slack_demand=0   slack=0
            /org1/t2 demand=20   entitlement=20   slack_demand=0   slack=0
            /org2    demand=400  entitlement=90   slack_demand=0   slack=0
            /org2/t3 demand=200  entitlement=60   slack_demand=0   slack=0
            /org2/t4 demand=200  entitlement=30   slack_demand=0   slack=0
        "#]],
    );
}

#[test]
fn shares_are_per_dimension() {
    // Siblings with crossed weights and unbounded demand: /a weighs cpu
    // 3:1 against /b, /b weighs memory 3:1 against /a. The spare capacity
    // beyond the reservations (1000 cpu, 2000 MiB) splits 3/4 : 1/4 in
    // cpu and 1/4 : 3/4 in memory; disk and gpu (equal shares) split evenly.
    let mut tree = PoolTree::new(PoolTreeLimits::default());
    let reservation = Resources::new(500, 1000, 0, 0);
    let a = tree
        .create(
            "/a",
            PoolConfig::default()
                .with_reservation(reservation)
                .with_shares([3.0, 1.0, 2.0, 2.0]),
        )
        .unwrap();
    let b = tree
        .create(
            "/b",
            PoolConfig::default()
                .with_reservation(reservation)
                .with_shares([1.0, 3.0, 2.0, 2.0]),
        )
        .unwrap();
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    let unbounded = Resources::new(1 << 40, 1 << 40, 1 << 40, 1 << 40);
    input.set_demand(a.idx(), unbounded);
    input.set_demand(b.idx(), unbounded);
    input.capacity = Resources::new(2000, 4000, 800, 8000);
    let mut out = Entitlements::default();
    EntitlementCalculator::new().compute(&tree, &input, &mut out, None);
    check_entitlement_invariants(&tree, &input, &out);
    let (ea, eb) = (out.entitlement(a.idx()), out.entitlement(b.idx()));
    // cpu: 500 + 3/4 of 1000 and 500 + 1/4 of it; memory the other way round.
    assert_eq!(ea, Resources::new(1250, 1500, 400, 4000));
    assert_eq!(eb, Resources::new(750, 2500, 400, 4000));
}

#[test]
fn slack_goes_to_revocable_demand_within_slack_limits() {
    // 40 of slack; /a may take at most half of it.
    check(
        "capacity 100 slack=40
         pool /a demand=10 slack_demand=100 slack_pct=50
         pool /b demand=10 slack_demand=5",
        expect![[r#"
            /        demand=20   entitlement=100  slack_demand=105 slack=40
            /a       demand=10   entitlement=50   slack_demand=100 slack=20
            /b       demand=10   entitlement=50   slack_demand=5   slack=20
        "#]],
    );
}

// ---------------------------------------------------------------------------
// Property tests against an independent reference.

/// A random valid tree: parents picked at random (unbalanced), small numbers
/// so ties and edge cases are common. Returns the tree and the pool ids in
/// creation order.
fn random_tree(
    rng: &mut Rng,
    n_pools: usize,
    max_depth: usize,
    scale: u64,
) -> (PoolTree, Vec<peloton_engine::PoolId>) {
    let mut tree = PoolTree::new(PoolTreeLimits::default());
    let root = tree.root();
    let mut ids = vec![root];
    let mut depth = vec![0usize];
    let mut budget: Vec<[u64; N_DIMS]> = vec![[rng.range(0, 2000) * scale; N_DIMS]];
    let mut names = vec![0usize];
    for _ in 1..n_pools {
        let candidates: Vec<usize> = (0..ids.len()).filter(|&i| depth[i] < max_depth).collect();
        let p = candidates[rng.below(candidates.len() as u64) as usize];
        let parent = ids[p];
        let parent_config = *tree.config(parent);
        let mut config = PoolConfig::default();
        let mut child_budget = [0u64; N_DIMS];
        for d in 0..N_DIMS {
            let reservation = if rng.chance(0.3) {
                0
            } else {
                rng.range(0, budget[p][d]) / 2
            };
            budget[p][d] -= reservation;
            child_budget[d] = reservation;
            let parent_limit = parent_config.dims[d].limit.min(5000 * scale);
            let limit = if rng.chance(0.3) {
                parent_config.dims[d].limit
            } else {
                rng.range(reservation, parent_limit.max(reservation))
            };
            config.dims[d] = DimConfig {
                reservation,
                limit,
                // Mostly small ratios (ties and exact splits), sometimes the
                // whole allowed range (0.001 to 1,000,000).
                share: if rng.chance(0.1) {
                    [0.001, 0.37, 1e6, 999.5, 12345.678][rng.below(5) as usize]
                } else {
                    [1.0, 1.0, 2.0, 3.0, 0.5, 7.25][rng.below(6) as usize]
                },
                kind: if rng.chance(0.1) {
                    PoolKind::Static
                } else {
                    PoolKind::Elastic
                },
            };
        }
        config.slack_limit_pct = [100.0, 50.0, 10.0][rng.below(3) as usize];
        let path = if tree.path(parent) == "/" {
            format!("/q{}", names[p])
        } else {
            format!("{}/q{}", tree.path(parent), names[p])
        };
        names[p] += 1;
        let id = tree
            .create(&path, config)
            .expect("generated config is valid");
        ids.push(id);
        depth.push(depth[p] + 1);
        budget.push(child_budget);
        names.push(0);
    }
    (tree, ids)
}

/// The literal algorithm of the issue, in real numbers, written without
/// looking at the engine's: guarantees, then repeated proportional division
/// of what is left among unsatisfied children, then the remainder up to
/// limits. Returns (entitlement, slack entitlement) per slot for one dimension.
///
/// A slack cap is a step function of the parent's *integer* slack
/// entitlement (`floor(parent × pct / 100)`), so the reference takes the
/// parent's value for the caps from `engine_slack` (the engine's output);
/// otherwise a parent at 9.97 here and 10 there would differ by whole caps.
/// `check_entitlement_invariants` checks the caps themselves.
fn reference(
    tree: &PoolTree,
    input: &EntitlementInput,
    d: usize,
    engine_slack: &[u64],
) -> (Vec<f64>, Vec<f64>) {
    let n = tree.n_slots();
    let cfg = |i: peloton_engine::PoolId| tree.config(i).dims[d];

    fn demand_of(
        tree: &PoolTree,
        id: peloton_engine::PoolId,
        leaf: &dyn Fn(peloton_engine::PoolId) -> f64,
        d: usize,
        statics: bool,
        out: &mut Vec<f64>,
    ) -> f64 {
        let c = tree.config(id).dims[d];
        let raw = if tree.is_leaf(id) {
            leaf(id)
        } else {
            tree.children(id)
                .map(|k| {
                    let v = demand_of(tree, k, leaf, d, statics, out);
                    let kc = tree.config(k).dims[d];
                    if statics && kc.kind == PoolKind::Static {
                        kc.reservation as f64
                    } else {
                        v
                    }
                })
                .sum()
        };
        let v = raw.min(c.limit as f64);
        out[id.idx()] = v;
        v
    }

    /// Repeated proportional division of `left` among children whose
    /// `have < cap`; returns what is left.
    fn share_out(left: &mut f64, kids: &[usize], share: &[f64], cap: &[f64], have: &mut [f64]) {
        for _ in 0..=kids.len() {
            let active: Vec<usize> = kids
                .iter()
                .copied()
                .filter(|&k| cap[k] - have[k] > 1e-9)
                .collect();
            if active.is_empty() || *left <= 1e-9 {
                return;
            }
            let total_share: f64 = active.iter().map(|&k| share[k]).sum();
            let pot = *left;
            for &k in &active {
                let give = (pot * share[k] / total_share).min(cap[k] - have[k]);
                have[k] += give;
                *left -= give;
            }
        }
    }

    let root = tree.root();
    let mut demand = vec![0.0; n];
    let leaf_demand = |id: peloton_engine::PoolId| input.demand[d][id.idx()] as f64;
    demand_of(tree, root, &leaf_demand, d, true, &mut demand);
    let mut slack_demand = vec![0.0; n];
    let leaf_slack = |id: peloton_engine::PoolId| input.slack_demand[d][id.idx()] as f64;
    demand_of(tree, root, &leaf_slack, d, false, &mut slack_demand);

    let mut ent = vec![0.0; n];
    let mut slack = vec![0.0; n];
    ent[root.idx()] = (input.capacity.0[d] as f64).min(cfg(root).limit as f64);
    slack[root.idx()] = (input.slack_capacity.0[d] as f64).min(cfg(root).limit as f64);
    let share: Vec<f64> = (0..n)
        .map(|i| tree.lookup_slot(i).map_or(0.0, |id| cfg(id).share))
        .collect();
    for p in tree.breadth_first() {
        let kids: Vec<usize> = tree.children(p).map(|k| k.idx()).collect();
        if kids.is_empty() {
            continue;
        }
        let ids: Vec<_> = tree.children(p).collect();
        // Non-revocable.
        let e = ent[p.idx()];
        let guarantee: Vec<f64> = ids
            .iter()
            .map(|&k| {
                let c = cfg(k);
                if c.kind == PoolKind::Static {
                    c.reservation as f64
                } else {
                    demand[k.idx()].min(c.reservation as f64)
                }
            })
            .collect();
        let total: f64 = guarantee.iter().sum();
        if total > e {
            for (j, &k) in kids.iter().enumerate() {
                ent[k] = guarantee[j] * e / total;
            }
        } else {
            for (j, &k) in kids.iter().enumerate() {
                ent[k] = guarantee[j];
            }
            let mut left = e - total;
            let elastic: Vec<usize> = ids
                .iter()
                .filter(|&&k| cfg(k).kind == PoolKind::Elastic)
                .map(|k| k.idx())
                .collect();
            let mut cap = vec![0.0; n];
            for &k in &elastic {
                cap[k] = demand[k];
            }
            share_out(&mut left, &elastic, &share, &cap, &mut ent);
            for &k in &ids {
                cap[k.idx()] = cfg(k).limit as f64;
            }
            share_out(&mut left, &elastic, &share, &cap, &mut ent);
        }
        // Revocable.
        let s = slack[p.idx()];
        let mut cap = vec![0.0; n];
        for &k in &ids {
            let pct = tree.config(k).slack_limit_pct;
            let parent_slack = engine_slack[p.idx()] as f64;
            cap[k.idx()] = (cfg(k).limit as f64).min((parent_slack * pct / 100.0).floor());
        }
        let mut left = s;
        let mut want = vec![0.0; n];
        for &k in &kids {
            want[k] = slack_demand[k].min(cap[k]);
        }
        share_out(&mut left, &kids, &share, &want, &mut slack);
        share_out(&mut left, &kids, &share, &cap, &mut slack);
    }
    (ent, slack)
}

fn random_input(rng: &mut Rng, tree: &PoolTree, scale: u64) -> EntitlementInput {
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    for d in 0..N_DIMS {
        input.capacity.0[d] = rng.range(0, 4000) * scale;
        input.slack_capacity.0[d] = rng.range(0, 1000) * scale;
    }
    for id in tree.list() {
        for d in 0..N_DIMS {
            input.demand[d][id.idx()] = if rng.chance(0.2) {
                0
            } else {
                rng.range(0, 1500) * scale
            };
            input.slack_demand[d][id.idx()] = if rng.chance(0.5) {
                0
            } else {
                rng.range(0, 300) * scale
            };
        }
    }
    input
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_reference_and_keeps_invariants(
        seed in any::<u64>(),
        n_pools in 2usize..=200,
        max_depth in 1usize..=5,
        scale in prop_oneof![Just(1u64), Just(1000), Just(1 << 30), Just(1 << 38)],
    ) {
        let mut rng = Rng::new(seed);
        let (tree, _) = random_tree(&mut rng, n_pools, max_depth, scale);
        let mut calculator = EntitlementCalculator::new();
        let mut out = Entitlements::default();
        // Several demand snapshots on the same tree: buffers are reused.
        for _ in 0..3 {
            let input = random_input(&mut rng, &tree, scale);
            calculator.compute(&tree, &input, &mut out, None);
            check_entitlement_invariants(&tree, &input, &out);
            // Each level rounds by less than one unit and passes its error
            // on; at large scales floating point adds a relative error.
            let slack_tolerance = 2.0 * (max_depth as f64 + 1.0);
            let tolerance = slack_tolerance + 1e-9 * (4000 * scale) as f64;
            for d in 0..N_DIMS {
                let (ent, slack) = reference(&tree, &input, d, &out.dims[d].slack_entitlement);
                for id in tree.list() {
                    let i = id.idx();
                    let got = out.dims[d].entitlement[i] as f64;
                    prop_assert!((got - ent[i]).abs() <= tolerance,
                        "{} dim {}: engine {} reference {}", tree.path(id), d, got, ent[i]);
                    let got = out.dims[d].slack_entitlement[i] as f64;
                    prop_assert!((got - slack[i]).abs() <= slack_tolerance + 1e-9 * (1000 * scale) as f64,
                        "{} dim {} slack: engine {} reference {}", tree.path(id), d, got, slack[i]);
                }
            }
        }
    }
}

#[test]
fn same_result_on_one_and_two_threads() {
    let mut rng = Rng::new(7);
    let (tree, _) = random_tree(&mut rng, 3000, 4, 1000);
    let input = random_input(&mut rng, &tree, 1000);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut one = Entitlements::default();
    let mut two = Entitlements::default();
    EntitlementCalculator::new().compute(&tree, &input, &mut one, None);
    EntitlementCalculator::new().compute(&tree, &input, &mut two, Some(&pool));
    assert_eq!(one, two);
    check_entitlement_invariants(&tree, &input, &one);
}

#[test]
fn five_thousand_siblings_match_the_reference() {
    let mut tree = PoolTree::new(PoolTreeLimits::default());
    let mut ids = Vec::new();
    for i in 0..5000u64 {
        let id = tree
            .create(
                &format!("/c{i}"),
                PoolConfig::default().with_share(1.0 + (i % 7) as f64),
            )
            .unwrap();
        ids.push(id);
    }
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    for (i, id) in ids.iter().enumerate() {
        input.set_demand(id.idx(), Resources::new((i as u64 * 37) % 1000, 1, 1, 1));
    }
    input.capacity = Resources::new(300_000, 10, 10, 10);
    let mut out = Entitlements::default();
    let mut calculator = EntitlementCalculator::new();
    calculator.compute(&tree, &input, &mut out, None);
    check_entitlement_invariants(&tree, &input, &out);
    let (reference_cpu, _) = reference(&tree, &input, 0, &out.dims[0].slack_entitlement);
    for id in ids {
        let got = out.dims[0].entitlement[id.idx()] as f64;
        assert!(
            (got - reference_cpu[id.idx()]).abs() <= 2.0,
            "{got} vs {}",
            reference_cpu[id.idx()]
        );
    }
}

#[test]
fn one_child_capped_per_round_takes_the_sorting_path() {
    // Shares halve from child to child, and each child's demand is placed
    // between two successive water levels, so every round caps exactly one
    // child: more than MAX_ROUNDS rounds, and the sort fallback must finish.
    let k = 30;
    let amount = 1_000_000_000_000_000u64;
    let shares: Vec<f64> = (0..k)
        .map(|j| (1e6 * 0.5f64.powi(j as i32)).max(0.001))
        .collect();
    let mut demands = Vec::new();
    let mut active: f64 = shares.iter().sum();
    let mut fixed = 0.0;
    let mut previous_level = amount as f64 / active;
    let mut level = previous_level;
    for j in 0..k {
        let ratio = if j == 0 {
            previous_level * 0.5
        } else {
            (previous_level + level) / 2.0
        };
        let demand = (ratio * shares[j]) as u64;
        demands.push(demand);
        fixed += demand as f64;
        active -= shares[j];
        previous_level = level;
        level = (amount as f64 - fixed) / active;
    }
    demands[k - 1] = 1 << 49; // the last child wants more than is left
    let mut tree = PoolTree::new(PoolTreeLimits::default());
    let mut input = EntitlementInput::with_slots(k + 1);
    for j in 0..k {
        let mut config = PoolConfig::default();
        config.dims[0].share = shares[j];
        let id = tree.create(&format!("/c{j}"), config).unwrap();
        input.demand[0][id.idx()] = demands[j];
    }
    input.capacity = Resources::new(amount, 0, 0, 0);
    let mut out = Entitlements::default();
    let mut calculator = EntitlementCalculator::new();
    calculator.compute(&tree, &input, &mut out, None);
    let stats = calculator.water_fill_stats();
    assert!(stats.sorted > 0, "{stats:?}");
    check_entitlement_invariants(&tree, &input, &out);
    let (expected, _) = reference(&tree, &input, 0, &out.dims[0].slack_entitlement);
    for id in tree.list() {
        let got = out.dims[0].entitlement[id.idx()] as f64;
        let want = expected[id.idx()];
        assert!(
            (got - want).abs() <= 2.0 + want * 1e-12,
            "{}: {got} vs {want}",
            tree.path(id)
        );
    }
}

#[test]
fn a_parent_of_many_leaves_at_the_maximum_keeps_its_reservation() {
    // 2^14 leaves each demanding MAX_AMOUNT (2^50) sum to 2^64: a sum that
    // wrapped would read as no demand at all, and /p would lose even its
    // reservation to /q. Saturated, /p demands its limit and gets its
    // reservation (/q, with its own, takes the rest).
    let n_leaves = 1 << 14;
    let mut tree = PoolTree::new(PoolTreeLimits {
        max_pools: n_leaves + 3,
    });
    let cpu =
        |reservation| PoolConfig::default().with_reservation(Resources::new(reservation, 0, 0, 0));
    let p = tree.create("/p", cpu(100)).unwrap();
    let q = tree.create("/q", cpu(100)).unwrap();
    let mut leaves = Vec::with_capacity(n_leaves);
    for i in 0..n_leaves {
        leaves.push(
            tree.create(&format!("/p/l{i}"), PoolConfig::default())
                .unwrap(),
        );
    }
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    input.capacity = Resources::new(300, 0, 0, 0);
    for &leaf in &leaves {
        input.demand[0][leaf.idx()] = MAX_AMOUNT;
    }
    input.demand[0][q.idx()] = 1000;
    let mut out = Entitlements::default();
    EntitlementCalculator::new().compute(&tree, &input, &mut out, None);
    check_entitlement_invariants(&tree, &input, &out);
    let cpu = &out.dims[0];
    assert_eq!(cpu.demand[p.idx()], MAX_AMOUNT, "capped at /p's limit");
    assert_eq!(cpu.demand[tree.root().idx()], MAX_AMOUNT);
    // Guarantees first (100 each), then the 100 left by share (1:1).
    assert_eq!(cpu.entitlement[p.idx()], 150);
    assert_eq!(cpu.entitlement[q.idx()], 150);
}
