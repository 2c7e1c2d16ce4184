//! Placement of the synthetic workload (`testkit::placement_workload`):
//! 1,000 and 10,000 hosts, 100 tasks per host, strategy pack. Each iteration
//! places the whole batch on a fresh cluster (generation untimed).
//! Throughput is in tasks placed per second.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use peloton_engine::placement::{PlacementConfig, PlacementResult, Placer};
use peloton_engine::task::Strategy;
use peloton_engine::testkit::placement_workload;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("placement");
    group.sample_size(10);
    for hosts in [1_000usize, 10_000] {
        let tasks = hosts * 100;
        group.throughput(Throughput::Elements(tasks as u64));
        for strategy in [Strategy::Pack, Strategy::Spread, Strategy::FirstFit] {
            group.bench_with_input(
                BenchmarkId::new(format!("{strategy}/hosts"), hosts),
                &hosts,
                |b, &hosts| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for i in 0..iters {
                            let mut w = placement_workload(hosts, tasks, strategy, i);
                            let mut placer = Placer::new(PlacementConfig::default());
                            let mut out = PlacementResult::default();
                            let start = Instant::now();
                            placer
                                .place(
                                    &mut w.hosts,
                                    &mut w.tasks,
                                    &w.constraints,
                                    &w.batch,
                                    0,
                                    &mut out,
                                )
                                .unwrap();
                            total += start.elapsed();
                            std::hint::black_box(&out);
                        }
                        total
                    });
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, placement);
criterion_main!(benches);
