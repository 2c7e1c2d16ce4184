//! Entitlement: hand-checked examples and property tests against an
//! independent reference.

use expect_test::{Expect, expect};
use peloton_engine::testkit::{Rng, check_entitlement_invariants};
use peloton_engine::{
    DimConfig, EntitlementCalculator, EntitlementInput, Entitlements, N_DIMS, PoolConfig, PoolKind,
    PoolTree, PoolTreeLimits, Resources,
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
) -> (PoolTree, Vec<peloton_engine::PoolId>) {
    let mut tree = PoolTree::new(PoolTreeLimits::default());
    let root = tree.root();
    let mut ids = vec![root];
    let mut depth = vec![0usize];
    let mut budget: Vec<[u64; N_DIMS]> = vec![[rng.range(0, 2000); N_DIMS]];
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
            let parent_limit = parent_config.dims[d].limit.min(5000);
            let limit = if rng.chance(0.3) {
                parent_config.dims[d].limit
            } else {
                rng.range(reservation, parent_limit.max(reservation))
            };
            config.dims[d] = DimConfig {
                reservation,
                limit,
                share: [1.0, 1.0, 2.0, 3.0, 0.5, 7.25][rng.below(6) as usize],
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
fn reference(tree: &PoolTree, input: &EntitlementInput, d: usize) -> (Vec<f64>, Vec<f64>) {
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
            cap[k.idx()] = (cfg(k).limit as f64).min((s.floor() * pct / 100.0).floor());
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

fn random_input(rng: &mut Rng, tree: &PoolTree) -> EntitlementInput {
    let mut input = EntitlementInput::with_slots(tree.n_slots());
    for d in 0..N_DIMS {
        input.capacity.0[d] = rng.range(0, 4000);
        input.slack_capacity.0[d] = rng.range(0, 1000);
    }
    for id in tree.list() {
        for d in 0..N_DIMS {
            input.demand[d][id.idx()] = if rng.chance(0.2) {
                0
            } else {
                rng.range(0, 1500)
            };
            input.slack_demand[d][id.idx()] = if rng.chance(0.5) {
                0
            } else {
                rng.range(0, 300)
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
    ) {
        let mut rng = Rng::new(seed);
        let (tree, _) = random_tree(&mut rng, n_pools, max_depth);
        let mut calculator = EntitlementCalculator::new();
        let mut out = Entitlements::default();
        // Several demand snapshots on the same tree: buffers are reused.
        for _ in 0..3 {
            let input = random_input(&mut rng, &tree);
            calculator.compute(&tree, &input, &mut out, None);
            check_entitlement_invariants(&tree, &input, &out);
            // Each level rounds by less than one unit and passes its error on.
            let tolerance = 2.0 * (max_depth as f64 + 1.0);
            for d in 0..N_DIMS {
                let (ent, slack) = reference(&tree, &input, d);
                for id in tree.list() {
                    let i = id.idx();
                    let got = out.dims[d].entitlement[i] as f64;
                    prop_assert!((got - ent[i]).abs() <= tolerance,
                        "{} dim {}: engine {} reference {}", tree.path(id), d, got, ent[i]);
                    let got = out.dims[d].slack_entitlement[i] as f64;
                    prop_assert!((got - slack[i]).abs() <= tolerance,
                        "{} dim {} slack: engine {} reference {}", tree.path(id), d, got, slack[i]);
                }
            }
        }
    }
}

#[test]
fn same_result_on_one_and_two_threads() {
    let mut rng = Rng::new(7);
    let (tree, _) = random_tree(&mut rng, 3000, 4);
    let input = random_input(&mut rng, &tree);
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
fn many_children_take_the_sorting_path() {
    // One node with 5,000 children whose caps are all different forces more
    // than MAX_ROUNDS water-filling rounds.
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
    EntitlementCalculator::new().compute(&tree, &input, &mut out, None);
    check_entitlement_invariants(&tree, &input, &out);
    let (reference_cpu, _) = reference(&tree, &input, 0);
    for id in ids {
        let got = out.dims[0].entitlement[id.idx()] as f64;
        assert!(
            (got - reference_cpu[id.idx()]).abs() <= 2.0,
            "{got} vs {}",
            reference_cpu[id.idx()]
        );
    }
}
