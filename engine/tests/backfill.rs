//! Reservations for blocked heads and backfill behind them: work that
//! ends before a blocked head can start runs ahead of it; nothing else
//! does, and nothing may take the head's hosts past its start.

use peloton_engine::admission::BlockKind;
use peloton_engine::backfill::BackfillConfig;
use peloton_engine::host::{HostId, HostSpec};
use peloton_engine::task::{TaskHandle, TaskState};
use peloton_engine::{Engine, EngineConfig, NewTask, PoolConfig, PoolId, Resources};

const S: u64 = 1000;

fn cores(n: u64) -> Resources {
    Resources::new(n * 1000, n * 1024, 0, 0)
}

fn task(pool: PoolId, job: u32, instance: u32, n_cores: u64, runtime_s: u64) -> NewTask {
    NewTask {
        runtime_ms: runtime_s * S,
        ..peloton_engine::testkit::plain_task(job, instance, pool, cores(n_cores))
    }
}

fn setup(backfill: bool, n_hosts: usize, n_cores: u64) -> (Engine, PoolId, Vec<HostId>) {
    let mut engine = Engine::new(EngineConfig {
        backfill: BackfillConfig {
            enabled: backfill,
            ..BackfillConfig::default()
        },
        ..EngineConfig::default()
    });
    let hosts = (0..n_hosts)
        .map(|i| {
            engine
                .hosts_mut()
                .add(&HostSpec {
                    name: format!("h{i}"),
                    capacity: cores(n_cores),
                    ..Default::default()
                })
                .unwrap()
        })
        .collect();
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    (engine, pool, hosts)
}

/// A gang of `n` tasks of job `job`, each `n_cores` for `runtime_s`.
fn submit_gang(
    engine: &mut Engine,
    pool: PoolId,
    job: u32,
    n: u32,
    n_cores: u64,
    runtime_s: u64,
) -> Vec<TaskHandle> {
    let members: Vec<NewTask> = (0..n)
        .map(|i| task(pool, job, i, n_cores, runtime_s))
        .collect();
    engine.submit(&members).unwrap()
}

/// A second pool, "/b", beside the setup's.
fn second_pool(engine: &mut Engine) -> PoolId {
    engine
        .resources_mut()
        .create_pool("/b", PoolConfig::default())
        .unwrap()
}

/// Runs `t` on `host` from `now_ms` (pinned there, so the test chooses).
fn run_on(engine: &mut Engine, mut t: NewTask, host: HostId, now_ms: u64) -> TaskHandle {
    t.desired_host = Some(host);
    let h = engine.submit(&[t]).unwrap()[0];
    engine.cycle(now_ms);
    assert_eq!(engine.tasks().state(h).unwrap(), TaskState::Placed);
    h
}

fn placed(engine: &Engine, t: TaskHandle) -> bool {
    engine.tasks().state(t) == Ok(TaskState::Placed)
}

/// A gang that fits its pool's entitlement but not the hosts waits in its
/// queue with hosts reserved where they free up first; short work runs
/// ahead of it, long or unestimated work does not, and the gang starts
/// when its hosts free up, as the reservation said.
#[test]
fn short_work_runs_ahead_of_a_gang_waiting_for_whole_hosts() {
    for backfill in [true, false] {
        let (mut engine, pool, hosts) = setup(backfill, 4, 8);
        // A 2-core task on each host: h0..h2 end at 60 s, h3 never.
        let runners: Vec<TaskHandle> = hosts
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                let runtime = if i < 3 { 60 } else { 0 };
                run_on(&mut engine, task(pool, 9, i as u32, 2, runtime), h, 0)
            })
            .collect();
        // A gang of three whole hosts (24 of 32 cores: within the
        // entitlement), then a short task, a long one and one with no
        // estimate.
        let gang = submit_gang(&mut engine, pool, 1, 3, 8, 100);
        let short = engine.submit(&[task(pool, 2, 0, 4, 30)]).unwrap()[0];
        let long = engine.submit(&[task(pool, 3, 0, 4, 120)]).unwrap()[0];
        let unknown = engine.submit(&[task(pool, 4, 0, 4, 0)]).unwrap()[0];
        let report = engine.cycle(S);
        if backfill {
            let b = report.blocked();
            assert_eq!(b.len(), 1, "{b:?}");
            assert_eq!(
                (b[0].kind, b[0].allocated, b[0].cap),
                (BlockKind::Hosts, 0, 3)
            );
            assert!(
                b[0].to_string().contains(
                    "not enough hosts free for the gang: 0 of its 3 tasks fit the free hosts now"
                ),
                "{}",
                b[0]
            );
            let r = &report.start_reservations;
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].at_ms, 60 * S);
            assert_eq!(r[0].hosts, vec![0, 1, 2]);
            assert_eq!(r[0].n_tasks, 3);
            assert!(placed(&engine, short), "ends at 31 s, before 60 s");
            // The long task runs past 60 s, but at 60 s the pool's
            // entitlement (32) leaves 6 cores beside the gang (24) and h3's
            // runner (2), and h3 is not the gang's: it goes there. Then
            // only 2 cores are left beside the gang: the task with no
            // estimate waits.
            assert_eq!(engine.tasks().host(long).unwrap(), Some(3));
            assert!(!placed(&engine, unknown));
            assert_eq!(engine.tasks().state(unknown).unwrap(), TaskState::Pending);
        } else {
            // Today's rules: the gang is admitted and holds 24 cores while
            // it waits for hosts; everything behind it waits too.
            assert!(report.start_reservations.is_empty());
            assert!(
                gang.iter()
                    .all(|&g| engine.tasks().state(g) == Ok(TaskState::Admitted))
            );
            assert!(!placed(&engine, short));
        }
        engine.check_invariants();
        // The short task ends at 31 s, the runners at 60 s: the gang starts.
        if backfill {
            engine.finish(short).unwrap();
            engine.cycle(31 * S);
        }
        for &r in &runners[..3] {
            engine.finish(r).unwrap();
        }
        engine.cycle(60 * S);
        assert!(
            gang.iter().all(|&g| placed(&engine, g)),
            "backfill={backfill}"
        );
        let on: Vec<u32> = gang
            .iter()
            .map(|&g| engine.tasks().host(g).unwrap().unwrap())
            .collect();
        let mut on_sorted = on.clone();
        on_sorted.sort_unstable();
        assert_eq!(on_sorted, vec![0, 1, 2]);
        engine.check_invariants();
    }
}

/// A head over its pool's entitlement reserves from when enough of what
/// the pool holds ends; what ends before then is admitted behind it.
#[test]
fn work_that_ends_before_an_entitlement_blocked_head_is_admitted_behind_it() {
    let (mut engine, pool, hosts) = setup(true, 2, 8);
    // 12 of 16 cores run until 100 s.
    let a = run_on(&mut engine, task(pool, 9, 0, 6, 100), hosts[0], 0);
    let b = run_on(&mut engine, task(pool, 9, 1, 6, 100), hosts[1], 0);
    // An 8-core head does not fit the entitlement (16) until they end.
    let head = engine.submit(&[task(pool, 1, 0, 8, 50)]).unwrap()[0];
    // Behind it: a task that ends before 100 s, then one that does not
    // (it may use what the entitlement leaves beside the head at 100 s:
    // 16 - 8 = 8 cores).
    let fits_before = engine.submit(&[task(pool, 2, 0, 2, 90)]).unwrap()[0];
    let too_long = engine.submit(&[task(pool, 3, 0, 2, 110)]).unwrap()[0];
    let report = engine.cycle(5 * S);
    let r = &report.start_reservations;
    assert_eq!(r.len(), 1, "{r:?}");
    // A single task holds no hosts: it fits some host once entitled.
    assert_eq!((r[0].at_ms, r[0].hosts.clone()), (100 * S, vec![]));
    assert_eq!(
        report.blocked()[0].kind,
        BlockKind::Entitlement,
        "{:?}",
        report.blocked()
    );
    assert!(placed(&engine, fits_before), "ends at 95 s");
    assert!(
        placed(&engine, too_long),
        "within what is left beside the head"
    );
    assert!(!placed(&engine, head));
    engine.check_invariants();
    // Past their estimate, running tasks are taken to end at any moment:
    // the reservation is now.
    let report = engine.cycle(101 * S);
    assert_eq!(report.start_reservations[0].at_ms, 101 * S);
    for t in [a, b, fits_before] {
        engine.finish(t).unwrap();
    }
    engine.cycle(102 * S);
    assert!(placed(&engine, head));
    engine.check_invariants();
}

/// Hosts reserved for a head take other pools' work only if it ends before
/// the reservation begins; work that may run longer goes elsewhere or waits.
#[test]
fn reserved_hosts_take_only_work_that_ends_before_the_reservation() {
    let (mut engine, pool, hosts) = setup(true, 4, 8);
    let other = second_pool(&mut engine);
    // h0, h1 free up at 50 s; h2, h3 run work with no estimate.
    for (i, &h) in hosts.iter().enumerate() {
        let runtime = if i < 2 { 50 } else { 0 };
        run_on(&mut engine, task(other, 9, i as u32, 1, runtime), h, 0);
    }
    // Pool /a's gang of two whole hosts waits for h0 and h1.
    let gang = submit_gang(&mut engine, pool, 1, 2, 8, 100);
    // Pool /b: two 3-core tasks with no estimate (packing would put them
    // on h0; only h2 and h3 may take them), and one short task (it may go
    // anywhere).
    let unknown: Vec<TaskHandle> = (0..2)
        .map(|i| engine.submit(&[task(other, 5, i, 3, 0)]).unwrap()[0])
        .collect();
    let short = engine.submit(&[task(other, 6, 0, 3, 10)]).unwrap()[0];
    let report = engine.cycle(S);
    let r = &report.start_reservations;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].at_ms, r[0].hosts.clone()), (50 * S, vec![0, 1]));
    for &t in &unknown {
        let host = engine.tasks().host(t).unwrap();
        assert!(matches!(host, Some(2) | Some(3)), "{t:?} on {host:?}");
    }
    assert!(placed(&engine, short));
    assert!(!gang.iter().any(|&g| placed(&engine, g)));
    // A daemon's task for h0 (it runs until stopped) is not fenced off:
    // it has nowhere else to go.
    let mut daemon = task(other, 7, 0, 1, 0);
    daemon.desired_host = Some(hosts[0]);
    daemon.daemon = true;
    let d = engine.submit(&[daemon]).unwrap()[0];
    engine.cycle(2 * S);
    assert_eq!(engine.tasks().host(d).unwrap(), Some(0));
    // Nothing is left reserved by the fences.
    for slot in 0..4 {
        assert_eq!(engine.hosts().reserved(slot), Resources::ZERO);
    }
    engine.check_invariants();
}

/// The same input gives the same decisions, reservations included.
#[test]
fn backfill_is_deterministic() {
    let run = || {
        let (mut engine, pool, hosts) = setup(true, 6, 8);
        for (i, &h) in hosts.iter().enumerate() {
            run_on(
                &mut engine,
                task(pool, 9, i as u32, 3, 10 + 7 * i as u64),
                h,
                0,
            );
        }
        submit_gang(&mut engine, pool, 1, 4, 8, 60);
        for j in 0..20 {
            engine
                .submit(&[task(
                    pool,
                    10 + j,
                    0,
                    1 + u64::from(j % 3),
                    5 + u64::from(j % 7) * 5,
                )])
                .unwrap();
        }
        let mut log = Vec::new();
        for step in 1..40 {
            let report = engine.cycle(step * 5 * S);
            log.push(format!(
                "{:?} {:?}",
                report.placed(),
                report.start_reservations
            ));
            engine.check_invariants();
            let ends: Vec<TaskHandle> = engine
                .tasks()
                .placed_views()
                .filter(|v| v.expected_end(step * 5 * S) <= step * 5 * S)
                .map(|v| v.task)
                .collect();
            for t in ends {
                engine.finish(t).unwrap();
            }
        }
        log
    };
    assert_eq!(run(), run());
}

/// A gang that may never fit by the estimates (the hosts it needs run
/// work with no estimate) gets no reservation and is not held back: it is
/// admitted and waits for hosts as before, and work behind it goes on.
#[test]
fn a_gang_with_no_foreseeable_start_does_not_block_its_queue() {
    let (mut engine, pool, hosts) = setup(true, 3, 8);
    for &h in &hosts[..2] {
        run_on(&mut engine, task(pool, 9, h.idx() as u32, 2, 0), h, 0);
    }
    let gang = submit_gang(&mut engine, pool, 1, 2, 8, 100);
    let small = engine.submit(&[task(pool, 2, 0, 1, 0)]).unwrap()[0];
    let report = engine.cycle(S);
    assert!(report.start_reservations.is_empty());
    assert!(
        report.blocked().iter().all(|b| b.kind != BlockKind::Hosts),
        "{:?}",
        report.blocked()
    );
    assert!(
        gang.iter()
            .all(|&g| engine.tasks().state(g) == Ok(TaskState::Admitted))
    );
    assert!(placed(&engine, small));
    engine.check_invariants();
}

/// Fenced hosts lend nothing to revocable work that must keep off them:
/// it cannot borrow its way onto a gang's reserved host.
#[test]
fn revocable_work_does_not_borrow_its_way_onto_reserved_hosts() {
    use peloton_engine::TaskFlags;
    let (mut engine, pool, hosts) = setup(true, 4, 8);
    let other = second_pool(&mut engine);
    // h0, h1: services of 4 cores until 50 s; h2, h3 full with no end.
    for (i, &h) in hosts.iter().enumerate() {
        let (cores, runtime) = if i < 2 { (4, 50) } else { (8, 0) };
        run_on(&mut engine, task(pool, 9, i as u32, cores, runtime), h, 0);
    }
    let gang = submit_gang(&mut engine, pool, 1, 2, 8, 100);
    let report = engine.cycle(S);
    assert_eq!(report.start_reservations.len(), 1);
    assert_eq!(report.start_reservations[0].hosts, vec![0, 1]);
    // h0's service uses 1 of its 4 cores: 3 are lent. A revocable task
    // with no estimate, queued after the gang, must not take them.
    engine.set_reclaimable(hosts[0], cores(3)).unwrap();
    let revocable = NewTask {
        flags: TaskFlags {
            preemptible: true,
            controller: false,
            revocable: true,
        },
        ..task(other, 5, 0, 2, 0)
    };
    let r = engine.submit(&[revocable]).unwrap()[0];
    engine.cycle(2 * S);
    assert!(
        !matches!(engine.tasks().host(r).unwrap(), Some(0) | Some(1)),
        "{:?}",
        engine.tasks().host(r)
    );
    assert!(!gang.iter().any(|&g| placed(&engine, g)));
    assert_eq!(engine.hosts().free(0), cores(4));
    engine.check_invariants();
}

/// A task kept off a reservation's hosts, finding room nowhere else, is
/// told why: those hosts count as held for the waiting gang, not as short
/// of a resource.
#[test]
fn a_fenced_task_is_told_the_hosts_are_held_for_a_gang() {
    use peloton_engine::placement::Check;
    let (mut engine, pool, hosts) = setup(true, 3, 8);
    let other = second_pool(&mut engine);
    // h0, h1 free up at 50 s; h2 is full with work with no estimate.
    for (i, &h) in hosts.iter().enumerate() {
        let (cores, runtime) = if i < 2 { (1, 50) } else { (8, 0) };
        run_on(&mut engine, task(other, 9, i as u32, cores, runtime), h, 0);
    }
    let gang = submit_gang(&mut engine, pool, 1, 2, 8, 100);
    // Pool /b (within its half of the cores): 2 cores with no estimate,
    // after the gang: only h2 could take it, and h2 is full.
    let late = engine.submit(&[task(other, 5, 0, 2, 0)]).unwrap()[0];
    let report = engine.cycle(S).clone();
    assert_eq!(report.start_reservations[0].hosts, vec![0, 1]);
    assert!(!placed(&engine, late));
    assert!(!gang.iter().any(|&g| placed(&engine, g)));
    let unplaced = report
        .unplaced()
        .iter()
        .find(|u| u.task == late)
        .expect("the late task is unplaced");
    let reason = &report.placement.reasons[unplaced.reason as usize];
    assert_eq!(
        reason.counts,
        vec![
            (Check::Reserved, 2),
            (Check::Insufficient(peloton_engine::Dim::Cpu), 1)
        ],
        "{reason:?}"
    );
    engine.check_invariants();
}

/// Parking (a forecast's fork) leaves out of a cycle's placement only
/// tasks that would find no host: the same input places the same tasks on
/// the same hosts, cycle by cycle, with several cycles at each moment as a
/// forecast runs them.
#[test]
fn parking_changes_nothing_placed() {
    let run = |parking: bool| {
        let (mut engine, pool, hosts) = setup(true, 6, 8);
        let other = second_pool(&mut engine);
        engine.set_parking(parking);
        for (i, &h) in hosts.iter().enumerate() {
            run_on(
                &mut engine,
                task(pool, 9, i as u32, 3, 10 + 7 * i as u64),
                h,
                0,
            );
        }
        submit_gang(&mut engine, pool, 1, 4, 8, 60);
        for j in 0..30 {
            // Among 1-3 core tasks, 6- and 7-core ones: admitted, they
            // wait for a host with room.
            let n_cores = if j % 5 == 4 {
                6 + u64::from(j % 2)
            } else {
                1 + u64::from(j % 3)
            };
            let p = if j % 2 == 0 { pool } else { other };
            engine
                .submit(&[task(p, 10 + j, 0, n_cores, 5 + u64::from(j % 7) * 5)])
                .unwrap();
        }
        let mut log = Vec::new();
        let mut waited = 0;
        for step in 1..40 {
            for _ in 0..3 {
                let report = engine.cycle(step * 5 * S);
                log.push(format!(
                    "{:?} {:?}",
                    report.placed(),
                    report.start_reservations
                ));
                engine.check_invariants();
            }
            waited += engine
                .tasks()
                .all()
                .filter(|&(_, s)| s == TaskState::Admitted)
                .count();
            let ends: Vec<TaskHandle> = engine
                .tasks()
                .placed_views()
                .filter(|v| v.expected_end(step * 5 * S) <= step * 5 * S)
                .map(|v| v.task)
                .collect();
            for t in ends {
                engine.finish(t).unwrap();
            }
        }
        (log, waited)
    };
    let (without, waited) = run(false);
    // Tasks did wait in placement: parking had something to park.
    assert!(waited > 0);
    assert_eq!(run(true).0, without);
}

/// A pool configured for strict order gets no reservation and no
/// backfill: its gang is admitted and waits in placement, and work behind
/// it waits; another pool's gang on the same cluster still gets its
/// reservation.
#[test]
fn a_strict_order_pool_gets_no_reservation_while_others_do() {
    let (mut engine, pool, hosts) = setup(true, 4, 8);
    let strict = engine
        .resources_mut()
        .create_pool(
            "/strict",
            PoolConfig {
                strict_order: true,
                ..PoolConfig::default()
            },
        )
        .unwrap();
    // Every host runs a 2-core task until 50 s: no whole host is free.
    for (i, &h) in hosts.iter().enumerate() {
        run_on(&mut engine, task(pool, 9, i as u32, 2, 50), h, 0);
    }
    let strict_gang = submit_gang(&mut engine, strict, 1, 2, 8, 100);
    let behind = engine.submit(&[task(strict, 2, 0, 1, 10)]).unwrap()[0];
    let report = engine.cycle(S);
    assert!(
        report.start_reservations.is_empty(),
        "{:?}",
        report.start_reservations
    );
    assert!(
        strict_gang
            .iter()
            .all(|&g| engine.tasks().state(g) == Ok(TaskState::Admitted)),
        "the strict pool's gang is admitted and waits for hosts"
    );
    // Behind the admitted gang, the short task is admitted too (its queue
    // is not blocked): strict order means no reservation, not a stop.
    assert!(placed(&engine, behind));
    // The same gang in the other pool is held back with hosts reserved.
    let gang = submit_gang(&mut engine, pool, 3, 2, 8, 100);
    let report = engine.cycle(2 * S);
    assert_eq!(
        report.start_reservations.len(),
        1,
        "{:?}",
        report.start_reservations
    );
    assert_eq!(
        report.start_reservations[0].head.0,
        gang[0].to_u64(),
        "the reservation is the other pool's gang's"
    );
    engine.check_invariants();
}

/// A task kept off a reservation's hosts evicts nothing there: the room
/// would not be its. (Before, eviction plans ignored fences, so the live
/// loop preempted work on a gang's reserved host for a task that then
/// could not go there.)
#[test]
fn a_fenced_task_evicts_nothing_on_the_reserved_hosts() {
    use peloton_engine::TaskFlags;
    let preemptible = |t: NewTask, priority: u32| NewTask {
        priority,
        flags: TaskFlags {
            preemptible: true,
            controller: false,
            revocable: false,
        },
        ..t
    };
    let (mut engine, pool, hosts) = setup(true, 6, 8);
    let other = second_pool(&mut engine);
    // h0, h1: low-priority work of /b until 50 s; h2..h5: a core each of
    // higher-priority /b work with no estimate (never whole hosts).
    for (i, &h) in hosts.iter().enumerate() {
        let t = if i < 2 {
            preemptible(task(other, 9, i as u32, 8, 50), 1)
        } else {
            preemptible(task(other, 8, i as u32, 1, 0), 10)
        };
        run_on(&mut engine, t, h, 0);
    }
    // /a's gang of two whole hosts: h0 and h1 are reserved for it.
    let gang = submit_gang(&mut engine, pool, 1, 2, 8, 100);
    // /b's 8-core task with no estimate, after the gang: kept off h0, h1,
    // and no other host has 8 cores.
    let urgent = engine
        .submit(&[preemptible(task(other, 5, 0, 8, 0), 5)])
        .unwrap()[0];
    let report = engine.cycle(S);
    assert_eq!(
        report.start_reservations.len(),
        1,
        "{:?}",
        report.start_reservations
    );
    assert_eq!(report.start_reservations[0].hosts, vec![0, 1]);
    assert_eq!(engine.tasks().state(urgent), Ok(TaskState::Admitted));
    assert!(!gang.iter().any(|&g| placed(&engine, g)));
    let mut plans = Vec::new();
    engine.eviction_plans(&mut plans);
    assert!(
        plans.iter().all(|(t, _, _)| *t != urgent),
        "the fenced task would evict on a reserved host: {plans:?}"
    );
    engine.check_invariants();
}

/// A backfill look that admitted nothing is not repeated while nothing got
/// easier, and is as soon as something did: a task behind a held-back
/// gang that fits no host now stays queued cycle after cycle, and is
/// admitted and placed in the first cycle after a host empties for it.
/// (Which input of the remembered look made it due is the unit test's,
/// `a_backfill_miss_covers_only_looks_where_nothing_got_easier`.)
#[test]
fn backfill_looks_again_once_room_comes() {
    let (mut engine, pool, hosts) = setup(true, 4, 8);
    // h0..h2 hold 2 cores until 60 s; h3 holds 7 with no estimate.
    for (i, &h) in hosts.iter().enumerate() {
        let (n, runtime) = if i < 3 { (2, 60) } else { (7, 0) };
        run_on(&mut engine, task(pool, 9, i as u32, n, runtime), h, 0);
    }
    let h3_runner = engine
        .tasks()
        .all()
        .find(|&(t, _)| engine.tasks().host(t).unwrap() == Some(3))
        .unwrap()
        .0;
    let gang = submit_gang(&mut engine, pool, 1, 3, 8, 100);
    // 7 cores for 20 s: ends before the gang's start, but no host has 7
    // free (6 on h0..h2, 1 on h3).
    let big = engine.submit(&[task(pool, 2, 0, 7, 20)]).unwrap()[0];
    for now in [S, 2 * S, 3 * S] {
        let report = engine.cycle(now);
        assert_eq!(report.start_reservations.len(), 1, "at {now}");
        assert_eq!(
            engine.tasks().state(big).unwrap(),
            TaskState::Pending,
            "at {now}: fits no host"
        );
    }
    engine.finish(h3_runner).unwrap();
    engine.cycle(3 * S);
    assert_eq!(
        engine.tasks().host(big).unwrap(),
        Some(3),
        "admitted behind the gang and placed on the host that emptied"
    );
    assert!(gang.iter().all(|&g| !placed(&engine, g)));
    engine.check_invariants();
}
