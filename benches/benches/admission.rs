//! Admission of queued work across 1,000 pools: each iteration queues
//! 100,000 random tasks (untimed), recomputes entitlement and admits
//! everything that fits (timed). Throughput is in queued tasks considered;
//! `peloton-bench admission` reports admissions per second.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use peloton_engine::testkit::{
    Rng, TreeSpec, bench_capacity, build_random_tree, enqueue_random_tasks,
};
use peloton_engine::{AdmissionResult, PoolTreeLimits, ResourceManager, ResourceManagerConfig};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TASKS: usize = 100_000;

fn admission(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission");
    group.sample_size(20);
    group.throughput(Throughput::Elements(TASKS as u64));
    for threads in [1usize, 2] {
        group.bench_with_input(
            BenchmarkId::new("admit/pools=1000", threads),
            &threads,
            |b, &threads| {
                let mut out = AdmissionResult::default();
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        let mut rng = Rng::new(i);
                        let mut rm = ResourceManager::new(ResourceManagerConfig {
                            pools: PoolTreeLimits { max_pools: 1_000 },
                            threads,
                            ..Default::default()
                        });
                        let spec = TreeSpec::new(1_000, 4, bench_capacity());
                        let leaves = build_random_tree(&mut rm, &spec, &mut rng);
                        let demand =
                            enqueue_random_tasks(&mut rm, &leaves, TASKS, &mut rng).unwrap();
                        let capacity = demand.percent(70.0);
                        let start = Instant::now();
                        rm.recompute_entitlement(capacity, capacity.percent(10.0));
                        rm.admit(&mut out);
                        total += start.elapsed();
                        std::hint::black_box(&out);
                    }
                    total
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);
