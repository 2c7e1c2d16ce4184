//! Full entitlement recomputation over random pool trees of 1,000 and 10,000
//! pools (depth 4, four dimensions), on one thread and on the engine's
//! two-thread pool. Target: ≤ 2 ms for 10,000 pools on the 2-core machine.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use peloton_engine::testkit::{
    Rng, TreeSpec, bench_capacity, build_random_tree, random_leaf_demand,
};
use peloton_engine::{
    EntitlementCalculator, EntitlementInput, Entitlements, PoolTreeLimits, ResourceManager,
    ResourceManagerConfig,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn entitlement(c: &mut Criterion) {
    let mut group = c.benchmark_group("entitlement");
    for pools in [1_000usize, 10_000] {
        let mut rng = Rng::new(42);
        let capacity = bench_capacity();
        let mut rm = ResourceManager::new(ResourceManagerConfig {
            pools: PoolTreeLimits { max_pools: pools },
            ..Default::default()
        });
        let leaves = build_random_tree(&mut rm, &TreeSpec::new(pools, 4, capacity), &mut rng);
        let snapshots: Vec<EntitlementInput> = (0..4)
            .map(|_| {
                let mut input = EntitlementInput::default();
                random_leaf_demand(rm.tree(), &leaves, capacity, &mut rng, &mut input);
                input
            })
            .collect();
        group.throughput(Throughput::Elements(pools as u64));
        for threads in [1usize, 2] {
            let pool = (threads > 1).then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
            });
            let mut calculator = EntitlementCalculator::new();
            let mut out = Entitlements::default();
            let mut i = 0;
            group.bench_with_input(
                BenchmarkId::new(format!("recompute/threads={threads}"), pools),
                &pools,
                |b, _| {
                    b.iter(|| {
                        i += 1;
                        let input = &snapshots[i % snapshots.len()];
                        calculator.compute(rm.tree(), input, &mut out, pool.as_ref());
                    });
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, entitlement);
criterion_main!(benches);
