//! Forecasts: the engine's own cycle run forward on a fork. They change
//! nothing, and they say what then happens when the live engine is driven
//! through the same ends.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use peloton_engine::forecast::{ForecastConfig, Stopped, forecast};
use peloton_engine::host::HostSpec;
use peloton_engine::task::{TaskHandle, TaskState};
use peloton_engine::testkit::Rng;
use peloton_engine::{Engine, EngineConfig, NewTask, PoolConfig, PoolId, Resources};

fn cores(n: u64) -> Resources {
    Resources::new(n * 1000, n * 1024, 0, 0)
}

fn task(job: u32, instance: u32, pool: PoolId, n_cores: u64) -> NewTask {
    peloton_engine::testkit::plain_task(job, instance, pool, cores(n_cores))
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

/// Every end on its own step: forecasts exact to the millisecond.
fn exact() -> ForecastConfig {
    ForecastConfig {
        min_step_ms: 0,
        resolution: u32::MAX,
        ..ForecastConfig::default()
    }
}

/// A gang of two whole hosts waits for both running tasks to end; the
/// small task queued behind it waits for the gang (admission is in order
/// against the pool's entitlement: no backfill yet).
#[test]
fn a_gang_waits_for_whole_hosts_and_small_work_waits_behind_it() {
    let mut engine = engine_with_hosts(2, 4);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    engine.submit(&[task(1, 0, pool, 4)]).unwrap();
    engine.submit(&[task(1, 1, pool, 4)]).unwrap();
    assert_eq!(engine.cycle(0).placed().len(), 2);
    let gang = engine
        .submit(&[task(2, 0, pool, 4), task(2, 1, pool, 4)])
        .unwrap();
    let small = engine.submit(&[task(3, 0, pool, 1)]).unwrap()[0];
    let runtime = |job: u32, instance: u32| match (job, instance) {
        (1, 0) => Some(10_000),
        (1, 1) => Some(20_000),
        (2, _) => Some(5_000),
        _ => Some(1_000),
    };
    let f = forecast(&engine, 1_000, &runtime, &exact());
    assert_eq!(f.stopped, Stopped::AllStarted);
    assert_eq!(f.tasks.len(), 3);
    let mut hosts = Vec::new();
    for (n, &g) in gang.iter().enumerate() {
        let t = f.get(g).unwrap();
        let start = t.start.unwrap();
        assert_eq!((start.at_ms, start.earliest_ms), (20_000, 20_000));
        assert_eq!(t.position, n as u32 + 1);
        hosts.push(start.host);
    }
    hosts.sort_unstable();
    assert_eq!(hosts, [0, 1], "the gang takes both hosts");
    let s = f.get(small).unwrap();
    assert_eq!(s.start.unwrap().at_ms, 25_000, "after the gang");
    assert_eq!(s.position, 3);
    // The live engine is as it was: the gang still queued.
    assert_eq!(engine.tasks().state(gang[0]).unwrap(), TaskState::Pending);
    assert_eq!(engine.tasks().len(), 5);
    engine.check_invariants();
}

#[test]
fn a_forecast_stops_at_its_bounds() {
    let mut engine = engine_with_hosts(1, 4);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    engine.submit(&[task(1, 0, pool, 4)]).unwrap();
    engine.cycle(0);
    let waiting = engine.submit(&[task(2, 0, pool, 4)]).unwrap()[0];
    // The running task has no estimate: the waiting one never starts.
    let f = forecast(&engine, 0, &|job, _| (job != 1).then_some(1_000), &exact());
    assert_eq!(f.stopped, Stopped::NoMoreEnds);
    assert_eq!(f.unending, 1);
    assert_eq!(f.get(waiting).unwrap().start, None);
    // It ends past the horizon.
    let far = ForecastConfig {
        horizon_ms: 60_000,
        ..exact()
    };
    let f = forecast(&engine, 0, &|_, _| Some(61_000), &far);
    assert_eq!(f.stopped, Stopped::Horizon);
    assert_eq!(f.get(waiting).unwrap().start, None);
    // One step only.
    let short = ForecastConfig {
        max_steps: 1,
        ..exact()
    };
    let f = forecast(&engine, 0, &|_, _| Some(1_000), &short);
    assert_eq!((f.stopped, f.steps), (Stopped::Steps, 1));
    // Within the bounds it starts when the other ends.
    let f = forecast(&engine, 0, &|_, _| Some(1_000), &exact());
    assert_eq!(f.get(waiting).unwrap().start.unwrap().at_ms, 1_000);
}

/// Ends close together are one step: a start is late by at most the
/// step's window, and says the earliest it could be.
#[test]
fn ends_close_together_are_one_step() {
    let mut engine = engine_with_hosts(1, 2);
    let pool = engine
        .resources_mut()
        .create_pool("/a", PoolConfig::default())
        .unwrap();
    engine.submit(&[task(1, 0, pool, 1)]).unwrap();
    engine.submit(&[task(1, 1, pool, 1)]).unwrap();
    engine.cycle(0);
    let waiting = engine.submit(&[task(2, 0, pool, 2)]).unwrap()[0];
    let runtime = |job: u32, instance: u32| {
        Some(if job == 1 {
            10_000 + 400 * u64::from(instance)
        } else {
            1
        })
    };
    let coarse = ForecastConfig {
        min_step_ms: 1_000,
        ..ForecastConfig::default()
    };
    let start = forecast(&engine, 0, &runtime, &coarse)
        .get(waiting)
        .unwrap()
        .start
        .unwrap();
    assert_eq!((start.earliest_ms, start.at_ms), (10_000, 10_400));
    let f = forecast(&engine, 0, &runtime, &exact());
    assert_eq!(f.get(waiting).unwrap().start.unwrap().at_ms, 10_400);
}

/// What the engine holds, to compare before and after.
fn snapshot(engine: &Engine) -> Vec<(TaskHandle, TaskState, Option<u32>)> {
    engine
        .tasks()
        .all()
        .map(|(t, s)| (t, s, engine.tasks().host(t).unwrap()))
        .collect()
}

/// A random cluster, random queues with gangs and per-host limits: the
/// forecast changes nothing, and driving the live engine through the same
/// ends (finish what ended, cycle until nothing changes) starts every
/// waiting task when and where the forecast said.
#[test]
fn a_forecast_is_what_then_happens() {
    for seed in 0..8 {
        let mut rng = Rng::new(seed);
        let mut engine = engine_with_hosts(12, 8);
        let pools: Vec<PoolId> = ["/a", "/b", "/c"]
            .iter()
            .map(|p| {
                engine
                    .resources_mut()
                    .create_pool(p, PoolConfig::default())
                    .unwrap()
            })
            .collect();
        let mut job = 0;
        let mut submit = |engine: &mut Engine, rng: &mut Rng| {
            job += 1;
            let pool = pools[rng.below(3) as usize];
            let n = if rng.chance(0.2) { rng.range(2, 5) } else { 1 };
            let size = rng.range(1, 6);
            let mut gang: Vec<NewTask> = (0..n).map(|i| task(job, i as u32, pool, size)).collect();
            if rng.chance(0.3) {
                gang.iter_mut().for_each(|t| t.max_per_host = 1);
            }
            engine.submit(&gang).unwrap();
        };
        for _ in 0..40 {
            submit(&mut engine, &mut rng);
        }
        engine.cycle(0);
        for _ in 0..60 {
            submit(&mut engine, &mut rng);
        }
        let runtime = |job: u32, instance: u32| {
            Some(1_000 * (1 + u64::from(job.wrapping_mul(2_654_435_761) ^ instance) % 90))
        };
        let before = snapshot(&engine);
        let f = forecast(&engine, 500, &runtime, &exact());
        assert_eq!(
            snapshot(&engine),
            before,
            "seed {seed}: the forecast changed nothing"
        );
        engine.check_invariants();
        assert_eq!(f.stopped, Stopped::AllStarted, "seed {seed}");
        assert!(f.tasks.len() > 50, "seed {seed}: {} waited", f.tasks.len());
        // Drive the live engine through the same ends.
        let mut ends = BinaryHeap::new();
        for (t, s) in engine.tasks().all() {
            if s == TaskState::Placed {
                let (j, i) = engine.tasks().owner(t).unwrap();
                let end = engine.tasks().start_ms(t).unwrap() + runtime(j, i).unwrap();
                ends.push(Reverse((end.max(501), t)));
            }
        }
        let mut now = 500;
        let mut seen = 0;
        loop {
            loop {
                let report = engine.cycle_with(now, false);
                let placed: Vec<_> = report.placed().to_vec();
                let admitted = report.admitted();
                for p in &placed {
                    let (j, i) = engine.tasks().owner(p.task).unwrap();
                    ends.push(Reverse((now + runtime(j, i).unwrap(), p.task)));
                    let fc = f.get(p.task).expect("it waited");
                    let start = fc.start.expect("forecast to start");
                    assert_eq!((start.at_ms, start.host), (now, p.host), "seed {seed}");
                    seen += 1;
                }
                if placed.is_empty() && admitted == 0 {
                    break;
                }
            }
            let Some(Reverse((first, _))) = ends.peek().copied() else {
                break;
            };
            now = first;
            while ends.peek().is_some_and(|Reverse((e, _))| *e == first) {
                let Reverse((_, t)) = ends.pop().unwrap();
                engine.finish(t).unwrap();
            }
            if engine.tasks().is_empty() {
                break;
            }
        }
        assert_eq!(
            seen,
            f.tasks.len(),
            "seed {seed}: every waiting task started"
        );
        engine.check_invariants();
    }
}

/// A forecast's fork places without saying why tasks stay unplaced (it
/// reads no reasons; counting them was two thirds of its time on 10k
/// hosts): the same placements, empty reasons, none counted.
#[test]
fn placement_without_reasons_places_the_same() {
    let build = || {
        let mut engine = engine_with_hosts(4, 8);
        let pool = engine
            .resources_mut()
            .create_pool("/a", PoolConfig::default())
            .unwrap();
        // Four fit, one per host; the rest are admitted (12 cores are
        // free) but fit no host.
        for job in 0..5 {
            engine.submit(&[task(job, 0, pool, 5)]).unwrap();
        }
        engine
            .submit(&[task(8, 0, pool, 2), task(8, 1, pool, 5)])
            .unwrap();
        engine.submit(&[task(9, 0, pool, 2)]).unwrap();
        engine
    };
    let mut explained = build();
    let mut silent = build();
    silent.set_placement_reasons(false);
    for now in 0..3 {
        let a = explained.cycle(now).clone();
        let b = silent.cycle(now).clone();
        assert_eq!(a.placed(), b.placed(), "cycle {now}");
        assert_eq!(a.unplaced(), b.unplaced(), "cycle {now}");
        assert!(!a.unplaced().is_empty(), "some tasks wait for a host");
        for u in b.unplaced() {
            let r = b.placement.reason_of(u);
            assert!(r.counts.is_empty() && r.n_hosts == 0, "{r:?}");
        }
        assert!(a.placement.reason_of(&a.unplaced()[0]).n_hosts > 0);
    }
    silent.check_invariants();
}

/// An owner pool's task on a cluster full of a borrower's preemptible
/// gangs: without preemption the forecast waits for the borrower's ends;
/// with it, the fork preempts what the live engine's cycle then chooses
/// (and the rest of the victims' gangs), the owner's task starts at once,
/// and the victims are queued again. The live engine is left as it was.
#[test]
fn a_forecast_with_preemption_takes_the_victims_the_live_cycle_takes() {
    let mut engine = engine_with_hosts(2, 4);
    let owner = engine
        .resources_mut()
        .create_pool("/owner", PoolConfig::default().with_reservation(cores(4)))
        .unwrap();
    let borrower = engine
        .resources_mut()
        .create_pool("/borrower", PoolConfig::default())
        .unwrap();
    // Four gangs of two one-core tasks, priorities 1..=4.
    for g in 0..4u32 {
        let gang: Vec<NewTask> = (0..2)
            .map(|i| {
                let mut t = task(1, 2 * g + i, borrower, 1);
                t.flags.preemptible = true;
                t.priority = g + 1;
                t
            })
            .collect();
        engine.submit(&gang).unwrap();
    }
    assert_eq!(engine.cycle(0).placed().len(), 8);
    let mine = engine.submit(&[task(2, 0, owner, 1)]).unwrap()[0];
    let runtime = |job: u32, _| Some(if job == 1 { 60_000 } else { 5_000 });
    let before = snapshot(&engine);

    let f = forecast(&engine, 1_000, &runtime, &exact());
    assert!(f.victims.is_empty(), "preemption is off by default");
    assert_eq!(f.get(mine).unwrap().start.unwrap().at_ms, 60_000);

    let with = ForecastConfig {
        preempt: true,
        ..exact()
    };
    let f = forecast(&engine, 1_000, &runtime, &with);
    assert_eq!(snapshot(&engine), before, "a forecast changes nothing");
    assert_eq!(f.get(mine).unwrap().start.unwrap().at_ms, 1_000);
    let mut chosen: Vec<(TaskHandle, u32, u32, u64)> = f
        .victims
        .iter()
        .filter(|v| v.mate_of.is_none())
        .map(|v| (v.task, v.job, v.priority, v.at_ms))
        .collect();
    chosen.sort_unstable();
    // The borrower is over by one core: one lowest-priority task (its
    // gang mate is stopped with it, to start again as one gang; it is
    // listed with it, not chosen).
    assert_eq!(chosen.len(), 1, "{:?}", f.victims);
    let mates: Vec<_> = f.victims.iter().filter(|v| v.mate_of.is_some()).collect();
    assert_eq!(mates.len(), 1, "{:?}", f.victims);
    assert_eq!(mates[0].mate_of, Some(chosen[0].0));
    assert_eq!((mates[0].job, mates[0].priority), (1, 1));
    assert!(
        chosen
            .iter()
            .all(|&(_, job, prio, at)| (job, prio, at) == (1, 1, 1_000))
    );

    // The live cycle chooses the same.
    let report = engine.cycle(1_000);
    let mut live: Vec<TaskHandle> = report.victims.iter().map(|v| v.task).collect();
    live.sort_unstable();
    let forecast_chose: Vec<TaskHandle> = chosen.iter().map(|c| c.0).collect();
    assert_eq!(live, forecast_chose);
    engine.check_invariants();
}

/// A victim's gang ends with it (its members start again as one gang):
/// the room its mate held is free in the same step, and work waiting in
/// the victim's pool takes it then, ahead of the gang queued again.
#[test]
fn a_victims_gang_ends_with_it_in_a_forecast() {
    let mut engine = engine_with_hosts(1, 4);
    let owner = engine
        .resources_mut()
        .create_pool("/owner", PoolConfig::default().with_reservation(cores(4)))
        .unwrap();
    let borrower = engine
        .resources_mut()
        .create_pool("/borrower", PoolConfig::default())
        .unwrap();
    let preemptible = |job, instance| {
        let mut t = task(job, instance, borrower, 2);
        t.flags.preemptible = true;
        t
    };
    engine
        .submit(&[preemptible(1, 0), preemptible(1, 1)])
        .unwrap();
    assert_eq!(engine.cycle(0).placed().len(), 2);
    let waiting = engine.submit(&[preemptible(2, 0)]).unwrap()[0];
    let mine = engine.submit(&[task(3, 0, owner, 2)]).unwrap()[0];
    let runtime = |job: u32, _| Some(if job == 1 { 60_000 } else { 5_000 });
    let with = ForecastConfig {
        preempt: true,
        ..exact()
    };
    let f = forecast(&engine, 1_000, &runtime, &with);
    // One member is chosen; its mate, running, is listed after it.
    assert_eq!(f.victims.len(), 2, "{:?}", f.victims);
    assert_eq!(f.victims[0].job, 1);
    assert_eq!(f.victims[0].mate_of, None);
    assert_eq!(
        (f.victims[1].job, f.victims[1].mate_of),
        (1, Some(f.victims[0].task))
    );
    assert_ne!(f.victims[1].instance, f.victims[0].instance);
    assert_eq!(f.get(mine).unwrap().start.unwrap().at_ms, 1_000);
    assert_eq!(
        f.get(waiting).unwrap().start.unwrap().at_ms,
        1_000,
        "its mate's room is free at once"
    );
    assert_eq!(f.stopped, Stopped::AllStarted);
}
