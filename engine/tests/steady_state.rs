//! Steady-state entitlement recomputation and admission allocate nothing:
//! after a warm-up, a counting allocator sees no allocation on this thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use peloton_engine::testkit::{
    Rng, TreeSpec, bench_capacity, build_random_tree, random_leaf_demand,
};
use peloton_engine::{
    AdmissionResult, EntitlementCalculator, EntitlementInput, Entitlements, PendingTask,
    PoolTreeLimits, ResourceManager, ResourceManagerConfig, Resources, TaskFlags, TaskId,
};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; the
// thread-local counter is const-initialised and never allocates.
#[expect(unsafe_code, reason = "a counting allocator needs GlobalAlloc")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn the_counter_sees_allocations() {
    let before = allocations();
    let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(16));
    assert_eq!(allocations() - before, 1);
    drop(v);
}

#[test]
fn entitlement_recomputation_does_not_allocate() {
    let mut rng = Rng::new(3);
    let capacity = bench_capacity();
    let mut rm = ResourceManager::new(ResourceManagerConfig {
        pools: PoolTreeLimits { max_pools: 2_000 },
        ..Default::default()
    });
    let leaves = build_random_tree(&mut rm, &TreeSpec::new(2_000, 4, capacity), &mut rng);
    let inputs: Vec<EntitlementInput> = (0..3)
        .map(|_| {
            let mut input = EntitlementInput::default();
            random_leaf_demand(rm.tree(), &leaves, capacity, &mut rng, &mut input);
            input
        })
        .collect();
    let mut calculator = EntitlementCalculator::new();
    let mut out = Entitlements::default();
    calculator.compute(rm.tree(), &inputs[0], &mut out, None); // warm-up
    let before = allocations();
    for input in inputs.iter().cycle().take(10) {
        calculator.compute(rm.tree(), input, &mut out, None);
    }
    assert_eq!(
        allocations() - before,
        0,
        "steady-state recomputation allocated"
    );
}

#[test]
fn a_manager_cycle_does_not_allocate_once_warm() {
    let mut rng = Rng::new(4);
    let mut rm = ResourceManager::new(ResourceManagerConfig {
        pools: PoolTreeLimits { max_pools: 300 },
        ..Default::default()
    });
    let leaves = build_random_tree(&mut rm, &TreeSpec::new(300, 3, bench_capacity()), &mut rng);
    let mut out = AdmissionResult::default();
    let request = Resources::new(1000, 1024, 0, 0);
    let mut next = 0u64;
    let mut cycle = |rm: &mut ResourceManager, out: &mut AdmissionResult| {
        for &leaf in &leaves {
            next += 1;
            let task = PendingTask {
                id: TaskId(next),
                request,
                runtime_ms: 0,
            };
            rm.enqueue(leaf, 1, TaskFlags::default(), &[task]).unwrap();
        }
        rm.recompute_entitlement(bench_capacity(), Resources::ZERO);
        rm.admit(out);
        for a in &out.admitted {
            rm.release(a).unwrap();
        }
    };
    // Warm-up: queue heaps, entry slabs and the output reach their sizes.
    for _ in 0..3 {
        cycle(&mut rm, &mut out);
    }
    assert_eq!(out.admitted.len(), leaves.len());
    let before = allocations();
    for _ in 0..5 {
        cycle(&mut rm, &mut out);
    }
    assert_eq!(allocations() - before, 0, "a warm cycle allocated");
    rm.check_invariants();
}

#[test]
fn a_warm_placement_batch_allocates_per_class_not_per_task() {
    use peloton_engine::placement::{PlacementConfig, PlacementResult, Placer};
    use peloton_engine::task::Strategy;
    use peloton_engine::testkit::placement_workload;
    for strategy in [Strategy::Pack, Strategy::Spread, Strategy::FirstFit] {
        let mut w = placement_workload(2_000, 60_000, strategy, 5);
        let mut placer = Placer::new(PlacementConfig::default());
        let mut out = PlacementResult::default();
        let mut batch = |placer: &mut Placer, out: &mut PlacementResult| {
            placer
                .place(&mut w.hosts, &mut w.tasks, &w.constraints, &w.batch, 0, out)
                .unwrap();
            for p in out.placed.clone() {
                placer.unplace(&mut w.hosts, &mut w.tasks, p.task).unwrap();
            }
        };
        // Warm-up: scratch, output lists and per-host task lists reach their
        // sizes.
        for _ in 0..2 {
            batch(&mut placer, &mut out);
        }
        out.placed.reserve(60_000);
        let before = allocations();
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
        let allocated = allocations() - before;
        let stats = placer.stats();
        let per_class = stats.heap_classes + stats.shape_builds + stats.reasons;
        assert!(out.placed.len() > 10_000, "{strategy:?}: a real batch");
        // Classes, shapes and reasons allocate (maps, prefixes, reason
        // lists); tasks do not: 60,000 tasks, a few hundred classes.
        assert!(
            allocated <= 16 * per_class + 160,
            "{strategy:?}: {allocated} allocations for {} tasks and {stats:?}",
            out.placed.len() + out.unplaced.len()
        );
    }
}
