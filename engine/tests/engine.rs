//! The engine's cycle end to end: submit, admit, place, finish; idle
//! capacity lent and taken back through preemption; gangs; bad input.

use peloton_engine::host::HostSpec;
use peloton_engine::task::{Strategy, TaskState};
use peloton_engine::{
    Engine, EngineConfig, EngineError, NewTask, PoolConfig, PoolId, Resources, TaskFlags,
};

fn cores(n: u64) -> Resources {
    Resources::new(n * 1000, n * 1024, 0, 0)
}

fn task(pool: PoolId, priority: u32, n_cores: u64) -> NewTask {
    NewTask {
        job: 1,
        instance: 0,
        pool,
        priority,
        request: cores(n_cores),
        ports: 0,
        flags: TaskFlags::default(),
        constraint: String::new(),
        strategy: Strategy::Pack,
        max_per_host: 0,
        limit_key: 1,
        desired_host: None,
        daemon: false,
        runtime_ms: 0,
    }
}

fn engine_with_hosts(n: usize, n_cores: u64) -> Engine {
    let mut engine = Engine::new(EngineConfig::default());
    for i in 0..n {
        let spec = HostSpec {
            name: format!("h{i}"),
            capacity: cores(n_cores),
            ..Default::default()
        };
        engine.hosts_mut().add(&spec).unwrap();
    }
    engine
}

#[test]
fn submitted_work_is_admitted_placed_and_released() {
    let mut engine = engine_with_hosts(2, 8);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    let mut handles = Vec::new();
    for _ in 0..5 {
        handles.extend(engine.submit(&[task(pool, 1, 3)]).unwrap());
    }
    let report = engine.cycle(1);
    // 16 cores: five 3-core tasks are entitled (15), but only 2 fit per host.
    assert_eq!(report.admitted(), 5);
    assert_eq!(report.placed().len(), 4);
    assert_eq!(report.unplaced().len(), 1);
    assert!(report.victims.is_empty());
    engine.check_invariants();
    // One finishes: the waiting one gets its host in the next cycle.
    let done = engine.tasks().placed_views().next().unwrap().task;
    engine.finish(done).unwrap();
    let report = engine.cycle(2);
    assert_eq!(report.placed().len(), 1);
    assert!(report.unplaced().is_empty());
    engine.check_invariants();
    for h in handles.into_iter().filter(|&h| h != done) {
        engine.finish(h).unwrap();
    }
    engine.check_invariants();
    assert_eq!(engine.tasks().len(), 0);
    assert_eq!(
        engine.resources().usage(pool).unwrap().allocation.n_tasks,
        0
    );
    engine.resources_mut().delete_pool(pool).unwrap();
}

#[test]
fn an_owner_takes_its_reservation_back_through_preemption() {
    let mut engine = engine_with_hosts(1, 8);
    let owner = engine
        .resources_mut()
        .create_pool("/owner", PoolConfig::default().with_reservation(cores(6)))
        .unwrap();
    let borrower = engine
        .resources_mut()
        .create_pool("/borrower", PoolConfig::default())
        .unwrap();
    for priority in [1, 2, 3, 4] {
        engine.submit(&[task(borrower, priority, 2)]).unwrap();
    }
    assert_eq!(
        engine.cycle(1).placed().len(),
        4,
        "the owner is idle: the borrower fills the host"
    );
    let urgent = engine.submit(&[task(owner, 0, 4)]).unwrap()[0];
    let report = engine.cycle(2).clone();
    // The owner is entitled to 4 and admitted, but the host is full; the
    // borrower (entitled to 4, holding 8) must give back 4: its two
    // lowest-priority tasks.
    assert_eq!(report.admitted(), 1);
    assert_eq!(report.unplaced().len(), 1);
    let victims: Vec<_> = report.victims.iter().map(|v| v.task).collect();
    let priorities: Vec<u32> = victims
        .iter()
        .map(|&v| engine.tasks().spec(v).unwrap().priority)
        .collect();
    assert_eq!(priorities, vec![1, 2]);
    for v in victims {
        engine.finish(v).unwrap();
    }
    let report = engine.cycle(3);
    assert_eq!(report.placed().len(), 1);
    assert_eq!(report.placed()[0].task, urgent);
    assert!(report.victims.is_empty());
    assert_eq!(engine.tasks().state(urgent).unwrap(), TaskState::Placed);
    engine.check_invariants();
}

#[test]
fn gangs_bad_input_and_cancellation() {
    let mut engine = engine_with_hosts(2, 5);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    // Three 3-core members on two 5-core hosts (9 of 10 cores entitled):
    // each host fits one member, now and ever, so the gang gets no
    // reservation and is not held back: admitted, none is placed.
    let gang = engine
        .submit(&[task(pool, 1, 3), task(pool, 1, 3), task(pool, 1, 3)])
        .unwrap();
    let report = engine.cycle(1);
    assert_eq!(report.admitted(), 3, "{:?}", report.blocked());
    assert!(report.placed().is_empty());
    assert_eq!(report.unplaced().len(), 3);
    assert!(report.start_reservations.is_empty());
    engine.check_invariants();
    for h in gang {
        engine.finish(h).unwrap();
    }
    // Bad input changes nothing.
    let before = engine.tasks().len();
    let mut bad = task(pool, 1, 1);
    bad.constraint = "zone = a".into();
    assert!(matches!(
        engine.submit(&[bad]),
        Err(EngineError::Constraint(_))
    ));
    let mut empty = task(pool, 1, 1);
    empty.request = Resources::ZERO;
    assert!(matches!(
        engine.submit(&[empty]),
        Err(EngineError::InvalidTask { .. })
    ));
    let mut mixed = task(pool, 2, 1);
    mixed.priority = 3;
    assert!(engine.submit(&[task(pool, 2, 1), mixed]).is_err());
    let root = engine.resources().tree().root();
    assert!(matches!(
        engine.submit(&[task(root, 1, 1)]),
        Err(EngineError::Admission(_))
    ));
    assert_eq!(engine.tasks().len(), before);
    // A queued gang can be withdrawn whole; the engine forgets it.
    let big = engine
        .submit(&[task(pool, 1, 100), task(pool, 1, 100)])
        .unwrap();
    assert!(matches!(
        engine.finish(big[0]),
        Err(EngineError::InvalidTask { .. })
    ));
    assert_eq!(engine.cancel(big[1]).unwrap(), big);
    assert_eq!(engine.tasks().len(), before);
    assert_eq!(engine.resources().usage(pool).unwrap().n_queued, 0);
    engine.check_invariants();
}

#[test]
fn adopted_tasks_hold_their_host_and_pool_until_finished() {
    let mut engine = engine_with_hosts(2, 8);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    let h0 = engine.hosts().lookup("h0").unwrap();
    let a = engine.adopt(&task(pool, 1, 3), h0, 5).unwrap();
    let b = engine.adopt(&task(pool, 1, 3), h0, 5).unwrap();
    engine.check_invariants();
    assert_eq!(engine.tasks().state(a), Ok(TaskState::Placed));
    assert_eq!(engine.tasks().host(b), Ok(Some(h0.idx() as u32)));
    assert_eq!(engine.hosts().free(h0.idx()), cores(2));
    assert_eq!(
        engine.resources().usage(pool).unwrap().allocation.n_tasks,
        2
    );
    // A third does not fit what is left: refused, nothing changes.
    let err = engine.adopt(&task(pool, 1, 3), h0, 5).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not fit the free resources of host h0"),
        "{err}"
    );
    assert_eq!(engine.tasks().len(), 2);
    engine.check_invariants();
    // New work sees the adopted tasks' hold: a 3-core task goes to h1.
    let queued = engine.submit(&[task(pool, 1, 3)]).unwrap();
    let report = engine.cycle(6);
    assert_eq!(report.placed().len(), 1);
    assert_eq!(
        engine.tasks().host(queued[0]),
        Ok(Some(engine.hosts().lookup("h1").unwrap().idx() as u32))
    );
    for h in [a, b, queued[0]] {
        engine.finish(h).unwrap();
    }
    engine.check_invariants();
    assert_eq!(engine.hosts().free(h0.idx()), cores(8));
    assert_eq!(
        engine.resources().usage(pool).unwrap().allocation.n_tasks,
        0
    );
}

/// `submit_each` queues as many one-task submits would: the same handles,
/// the same admissions and placements; each is its own gang; and a batch
/// refused part-way (a bad task, a full queue) leaves nothing queued.
#[test]
fn a_batch_of_single_tasks_is_queued_as_one_by_one() {
    let mut config = EngineConfig::default();
    config.resources.admission.max_queued_per_pool = 40;
    let setup = |config: &EngineConfig| {
        let mut engine = Engine::new(*config);
        for i in 0..3 {
            let spec = HostSpec {
                name: format!("h{i}"),
                capacity: cores(8),
                ..Default::default()
            };
            engine.hosts_mut().add(&spec).unwrap();
        }
        let pool = engine
            .resources_mut()
            .create_pool("/a", PoolConfig::default())
            .unwrap();
        (engine, pool)
    };
    let tasks = |pool: PoolId| -> Vec<NewTask> {
        (0..30u32)
            .map(|i| NewTask {
                instance: i,
                ..task(pool, 1 + i % 3, 1 + u64::from(i % 2))
            })
            .collect()
    };
    let (mut one_by_one, pool) = setup(&config);
    let mut want = Vec::new();
    for t in tasks(pool) {
        want.extend(one_by_one.submit(&[t]).unwrap());
    }
    let (mut batched, pool) = setup(&config);
    let mut got = Vec::new();
    batched.submit_each(&tasks(pool), &mut got).unwrap();
    assert_eq!(got, want);
    for &h in &got {
        assert_eq!(batched.queued_gang(h), &[h]);
    }
    // A single withdrawn from the batch takes only itself.
    assert_eq!(batched.cancel(got[7]).unwrap(), vec![got[7]]);
    assert_eq!(one_by_one.cancel(want[7]).unwrap(), vec![want[7]]);
    assert!(batched.queued_gang(got[7]).is_empty());
    let a = one_by_one.cycle(1).clone();
    let b = batched.cycle(1).clone();
    assert_eq!(a.admitted(), b.admitted());
    assert_eq!(a.placed(), b.placed());
    assert_eq!(a.unplaced().len(), b.unplaced().len());
    batched.check_invariants();

    // Refused part-way: nothing of the batch stays queued.
    let (mut engine, pool) = setup(&config);
    let live = engine.tasks().len();
    let mut bad = tasks(pool);
    bad[12].request = Resources::ZERO;
    let mut out = Vec::new();
    let err = engine.submit_each(&bad, &mut out).unwrap_err();
    assert!(matches!(err, EngineError::InvalidTask { .. }), "{err}");
    assert!(out.is_empty());
    assert_eq!(engine.tasks().len(), live);
    // 30 fit the queue of 40; 30 more do not: the first 10 of them were
    // queued before the queue filled, and are withdrawn again.
    engine.submit_each(&tasks(pool), &mut out).unwrap();
    let err = engine.submit_each(&tasks(pool), &mut out).unwrap_err();
    assert!(err.to_string().contains("queue"), "{err}");
    assert_eq!(out.len(), 30);
    assert_eq!(engine.tasks().len(), live + 30);
    engine.check_invariants();
    // The same as 30 submitted one by one and nothing refused.
    let fresh = {
        let (mut e, p) = setup(&config);
        for t in tasks(p) {
            e.submit(&[t]).unwrap();
        }
        e.cycle(1).placed().to_vec()
    };
    assert_eq!(engine.cycle(1).placed(), fresh.as_slice());
}

/// A host that takes no new work — down with its tasks still on it (an
/// agent whose session dropped, not yet declared lost) or draining — keeps
/// counting what its tasks hold: its pools stay entitled to it, so nothing
/// is preempted anywhere for a host that only blinked, and nothing more is
/// admitted against its unused rest. Once its tasks are gone, so is its
/// share of the capacity.
#[test]
fn a_host_taking_no_new_work_keeps_what_its_tasks_hold_in_the_capacity() {
    use peloton_engine::host::HostState;
    let mut engine = engine_with_hosts(2, 2);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    let mut t = task(pool, 1, 0);
    t.request = Resources::new(450, 0, 0, 0);
    t.flags.preemptible = true;
    t.strategy = Strategy::Spread;
    for _ in 0..8 {
        engine.submit(std::slice::from_ref(&t)).unwrap();
    }
    assert_eq!(engine.cycle(1).placed().len(), 8);
    let h1 = engine.hosts().lookup("h1").unwrap();
    let on_h1: Vec<_> = engine
        .tasks()
        .placed_views()
        .filter(|v| v.host == h1.idx() as u32)
        .map(|v| v.task)
        .collect();
    assert_eq!(on_h1.len(), 4, "spread over both hosts");
    for (i, state) in [HostState::Down, HostState::Draining]
        .into_iter()
        .enumerate()
    {
        engine.hosts_mut().set_state(h1, state).unwrap();
        let report = engine.cycle(2 + i as u64);
        assert!(
            report.victims.is_empty(),
            "h1 {state:?}: nothing is preempted, {:?}",
            report.victims
        );
        // 2000 offered by h0 + 1800 held on h1.
        assert_eq!(engine.entitled_capacity().0[0], 3800, "{state:?}");
        engine.check_invariants();
    }
    // Nothing is admitted against h1's unused 200: 3600 + 450 > 3800.
    let extra = engine.submit(std::slice::from_ref(&t)).unwrap()[0];
    let report = engine.cycle(10);
    assert_eq!(report.admitted(), 0);
    assert!(report.victims.is_empty());
    assert_eq!(engine.tasks().state(extra).unwrap(), TaskState::Pending);
    // Its tasks end (the host was declared lost): what it held leaves the
    // capacity with them, and the pool, now holding 1800 of 2000, is still
    // within its entitlement.
    engine.hosts_mut().set_state(h1, HostState::Down).unwrap();
    for task in on_h1 {
        engine.finish(task).unwrap();
    }
    let report = engine.cycle(11);
    assert!(report.victims.is_empty());
    assert_eq!(engine.entitled_capacity().0[0], 2000);
    engine.check_invariants();
}

#[test]
fn revocable_tasks_borrow_what_non_revocable_tasks_do_not_use() {
    let mut engine = engine_with_hosts(1, 8);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    let host = engine.hosts().lookup("h0").unwrap();
    let service = engine.submit(&[task(pool, 1, 6)]).unwrap()[0];
    assert_eq!(engine.cycle(1).placed().len(), 1);
    let revocable = |n_cores| NewTask {
        instance: 1,
        flags: TaskFlags {
            preemptible: true,
            controller: false,
            revocable: true,
        },
        ..task(pool, 0, n_cores)
    };
    // Nothing lent: only the 2 unallocated cores are slack, too few.
    let batch = engine.submit(&[revocable(5)]).unwrap()[0];
    let report = engine.cycle(2);
    assert_eq!(report.admitted(), 0);
    engine.check_invariants();
    // The service uses 2 of its 6 cores: 4 lent. The batch task takes the
    // 2 free cores and borrows 3.
    engine.set_reclaimable(host, cores(4)).unwrap();
    let report = engine.cycle(3);
    assert_eq!(report.admitted(), 1);
    assert_eq!(report.placed().len(), 1);
    engine.check_invariants();
    let slot = host.idx();
    assert_eq!(engine.hosts().free(slot), Resources::ZERO);
    assert_eq!(engine.hosts().borrowed(slot), cores(3));
    assert_eq!(engine.hosts().held(slot), cores(11));
    // The service's use rises: less is lent, what was borrowed stays (the
    // caller evicts), and a new non-revocable task finds no room.
    engine.set_reclaimable(host, cores(1)).unwrap();
    let more = engine
        .submit(&[NewTask {
            instance: 2,
            ..task(pool, 1, 1)
        }])
        .unwrap()[0];
    let report = engine.cycle(4);
    assert_eq!(report.placed().len(), 0);
    engine.check_invariants();
    // It may take the borrowed room back: the borrower is its victim,
    // though it is of another job and any priority.
    let mut plans = Vec::new();
    engine.eviction_plans(&mut plans);
    assert_eq!(plans.len(), 1, "{plans:?}");
    let (for_task, plan_slot, victims) = &plans[0];
    assert_eq!((*for_task, *plan_slot as usize), (more, slot));
    assert_eq!(
        victims.iter().map(|v| v.task).collect::<Vec<_>>(),
        vec![batch]
    );
    // The borrower ends: the loan is repaid first, then the rest is free,
    // and the waiting task gets its core.
    engine.finish(batch).unwrap();
    assert_eq!(engine.hosts().borrowed(slot), Resources::ZERO);
    assert_eq!(engine.hosts().free(slot), cores(2));
    let report = engine.cycle(5);
    assert_eq!(report.placed().len(), 1);
    engine.check_invariants();
    engine.finish(more).unwrap();
    engine.finish(service).unwrap();
    assert_eq!(engine.hosts().free(slot), cores(8));
    engine.check_invariants();
}
