//! The task arena: generations, round trips, bounds and size per task.

use peloton_engine::Resources;
use peloton_engine::host::GpuGrant;
use peloton_engine::task::{
    Strategy, TaskArena, TaskError, TaskHandle, TaskSpec, TaskState, flags,
};

fn spec(job: u32, instance: u32) -> TaskSpec {
    TaskSpec {
        job,
        instance,
        pool: 3,
        priority: 7,
        request: Resources::new(500, 1024, 0, 250),
        ports: 2,
        flags: flags::PREEMPTIBLE | flags::CONTROLLER,
        gang: 9,
        constraint: 4,
        strategy: Strategy::Spread,
        max_per_host: 1,
        limit_key: job,
        ..Default::default()
    }
}

#[test]
fn tasks_round_trip_and_slots_are_reused_with_new_generations() {
    let mut arena = TaskArena::new(1_000);
    let a = arena.add(&spec(1, 0)).unwrap();
    let b = arena.add(&spec(1, 1)).unwrap();
    assert_eq!(arena.spec(a).unwrap(), spec(1, 0));
    assert!(arena.arrival(a).unwrap() < arena.arrival(b).unwrap());
    assert_eq!(arena.state(b).unwrap(), TaskState::Pending);
    arena
        .set_placed(
            b,
            42,
            GpuGrant {
                devices: 1,
                milli_per_device: 250,
            },
            1_000,
        )
        .unwrap();
    assert_eq!(arena.host(b).unwrap(), Some(42));
    assert_eq!(arena.state(b).unwrap(), TaskState::Placed);
    arena.remove(a).unwrap();
    assert_eq!(arena.remove(a), Err(TaskError::NotFound));
    let c = arena.add(&spec(2, 0)).unwrap();
    assert_eq!(c.idx(), a.idx());
    assert_ne!(c, a);
    assert_eq!(arena.spec(a), Err(TaskError::NotFound));
    assert_eq!(
        arena.host(c).unwrap(),
        None,
        "a reused slot starts unplaced"
    );
    assert_eq!(TaskHandle::from_u64(c.to_u64()), c);
    arena.check_invariants();
}

#[test]
fn the_bound_is_an_error_and_tasks_are_small() {
    let mut arena = TaskArena::new(2);
    arena.add(&spec(1, 0)).unwrap();
    arena.add(&spec(1, 1)).unwrap();
    assert_eq!(
        arena.add(&spec(1, 2)),
        Err(TaskError::TooManyTasks { limit: 2 })
    );
    // "A few hundred bytes or less per task": the columns take about 100.
    assert!(
        TaskArena::bytes_per_slot() <= 128,
        "{} bytes",
        TaskArena::bytes_per_slot()
    );
}

#[test]
fn two_hundred_thousand_tasks() {
    let mut arena = TaskArena::new(10_000_000);
    arena.reserve(200_000);
    let handles: Vec<_> = (0..200_000)
        .map(|i| arena.add(&spec(i / 100, i % 100)).unwrap())
        .collect();
    for h in handles.iter().step_by(3) {
        arena.remove(*h).unwrap();
    }
    assert_eq!(arena.len(), 200_000 - 66_667);
    arena.check_invariants();
}
