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

/// A forecast's fork moves its running tasks into end order: each keeps
/// everything it has under its new handle, the others keep theirs, host
/// and pool lists follow, and a bad order is refused changing nothing.
#[test]
fn placed_tasks_are_renumbered_within_their_own_slots() {
    let mut arena = TaskArena::new(100);
    let tasks: Vec<TaskHandle> = (0..6).map(|i| arena.add(&spec(1, i)).unwrap()).collect();
    let grant = GpuGrant {
        devices: 1,
        milli_per_device: 250,
    };
    // Slots 0, 2, 3, 5 placed (two on host 7); 1 and 4 stay pending.
    for (k, host) in [(0, 7), (2, 9), (3, 7), (5, 11)] {
        arena
            .set_placed(tasks[k], host, grant, 1_000 + k as u64)
            .unwrap();
    }
    arena.check_invariants();
    let before = |a: &TaskArena, t: TaskHandle| {
        (
            a.spec(t).unwrap(),
            a.host(t).unwrap(),
            a.start_ms(t).unwrap(),
            a.arrival(t).unwrap(),
        )
    };
    let order = [tasks[5], tasks[0], tasks[3]];
    let was: Vec<_> = order.iter().map(|&t| before(&arena, t)).collect();
    let pending: Vec<_> = [tasks[1], tasks[4], tasks[2]]
        .iter()
        .map(|&t| before(&arena, t))
        .collect();
    // Refused: a pending task, a task twice, a stale handle.
    for bad in [
        vec![tasks[5], tasks[1]],
        vec![tasks[5], tasks[5]],
        vec![TaskHandle::from_u64(u64::MAX)],
    ] {
        assert!(arena.renumber_placed(&bad).is_err(), "{bad:?}");
        assert_eq!(before(&arena, tasks[5]), was[0]);
    }
    let new = arena.renumber_placed(&order).unwrap();
    assert_eq!(
        new.iter().map(|t| t.idx()).collect::<Vec<_>>(),
        vec![0, 3, 5],
        "the order's tasks take its slots in ascending order"
    );
    for (t, w) in new.iter().zip(&was) {
        assert_eq!(&before(&arena, *t), w, "a moved task keeps what it has");
    }
    for (t, w) in [tasks[1], tasks[4], tasks[2]].iter().zip(&pending) {
        assert_eq!(&before(&arena, *t), w, "the others keep their handles");
    }
    let mut on_7: Vec<u32> = arena
        .placed_on_host(7)
        .map(|v| v.task.idx() as u32)
        .collect();
    on_7.sort_unstable();
    assert_eq!(on_7, vec![3, 5], "host lists name the new slots");
    arena.check_invariants();
    // Ending a moved task frees its new slot only.
    arena.set_unplaced(new[0], TaskState::Admitted).unwrap();
    arena.remove(new[0]).unwrap();
    assert_eq!(arena.spec(new[1]).unwrap(), was[1].0);
    arena.check_invariants();
}
