//! Desired hosts as a placement input: pinned tasks go only to their host,
//! before other work; reservations hold resources on a host for an
//! instance between its runs and are used by that instance's next task;
//! daemons evict preemptible work of any pool on their host.

use peloton_engine::host::{HostId, HostSpec};
use peloton_engine::task::TaskState;
use peloton_engine::{Engine, EngineConfig, NewTask, PoolConfig, PoolId, Resources};

fn cores(n: u64) -> Resources {
    Resources::new(n * 1000, n * 1024, 0, 0)
}

fn task(pool: PoolId, job: u32, instance: u32, n_cores: u64) -> NewTask {
    peloton_engine::testkit::plain_task(job, instance, pool, cores(n_cores))
}

fn setup(n_hosts: usize, n_cores: u64) -> (Engine, PoolId, Vec<HostId>) {
    let mut engine = Engine::new(EngineConfig::default());
    let hosts = (0..n_hosts)
        .map(|i| {
            engine
                .hosts_mut()
                .add(&HostSpec {
                    name: format!("h{i}"),
                    capacity: Resources::new(n_cores * 1000, n_cores * 1024, 100_000, 0),
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

fn host_of(engine: &Engine, t: peloton_engine::task::TaskHandle) -> Option<u32> {
    engine.tasks().host(t).unwrap()
}

#[test]
fn a_pinned_task_goes_only_to_its_host_and_says_why_it_waits() {
    let (mut engine, pool, hosts) = setup(3, 4);
    // Fill host 2.
    let mut filler = task(pool, 9, 0, 4);
    filler.desired_host = Some(hosts[2]);
    let f = engine.submit(&[filler]).unwrap()[0];
    engine.cycle(1);
    assert_eq!(host_of(&engine, f), Some(hosts[2].idx() as u32));
    // A pinned task for host 2 waits although hosts 0 and 1 are empty.
    let mut pinned = task(pool, 1, 0, 1);
    pinned.desired_host = Some(hosts[2]);
    let p = engine.submit(&[pinned]).unwrap()[0];
    assert!(engine.cycle(2).placed().is_empty());
    let report = engine.report();
    let why = report
        .placement
        .reason_of(&report.unplaced()[0])
        .describe(engine.hosts(), engine.constraints());
    assert!(
        why.contains("2 not the host the task is pinned to"),
        "{why}"
    );
    assert!(why.contains("insufficient cpu"), "{why}");
    engine.check_invariants();
    // Its host frees up: it goes there.
    engine.finish(f).unwrap();
    engine.cycle(3);
    assert_eq!(host_of(&engine, p), Some(hosts[2].idx() as u32));
    engine.check_invariants();
}

#[test]
fn pinned_tasks_are_placed_before_other_work_in_a_batch() {
    let (mut engine, pool, hosts) = setup(2, 4);
    // Six unpinned 1-core tasks first in admission order, then a 2-core
    // task pinned to host 0. Packing alone would fill host 0 with the
    // others first; the pinned task goes first, so all seven fit.
    let others: Vec<_> = (0..6)
        .map(|i| engine.submit(&[task(pool, 1, i, 1)]).unwrap()[0])
        .collect();
    let mut pinned = task(pool, 2, 0, 2);
    pinned.desired_host = Some(hosts[0]);
    pinned.daemon = true;
    let p = engine.submit(&[pinned]).unwrap()[0];
    engine.cycle(1);
    assert_eq!(host_of(&engine, p), Some(0));
    assert!(others.iter().all(|&t| host_of(&engine, t).is_some()));
    engine.check_invariants();
}

#[test]
fn a_reservation_holds_resources_for_its_instance_only() {
    let (mut engine, pool, hosts) = setup(1, 4);
    // Instance (1, 0) ran here with 2 cores and a 5 GiB volume; between runs
    // both stay reserved.
    let held = Resources::new(2000, 2048, 5120, 0);
    engine.set_reservation(1, 0, hosts[0], held).unwrap();
    engine.check_invariants();
    assert_eq!(
        engine.hosts().free(0),
        Resources::new(2000, 2048, 100_000 - 5120, 0)
    );
    // Another job's 3-core task does not fit any more.
    let other_pool = engine
        .resources_mut()
        .create_pool("/b", PoolConfig::default())
        .unwrap();
    let other = engine.submit(&[task(other_pool, 7, 0, 3)]).unwrap()[0];
    engine.cycle(1);
    assert_eq!(host_of(&engine, other), None);
    // The instance's next run (its request includes the volume's disk) uses
    // its reservation; nothing stays reserved, since it took it all.
    let mut next = task(pool, 1, 0, 2);
    next.request = Resources::new(2000, 2048, 5120, 0);
    next.desired_host = Some(hosts[0]);
    let n = engine.submit(&[next]).unwrap()[0];
    engine.cycle(2);
    assert_eq!(host_of(&engine, n), Some(0));
    assert_eq!(engine.reservation(1, 0), None);
    assert_eq!(engine.hosts().reserved(0), Resources::ZERO);
    engine.check_invariants();
    // It ends; the volume alone stays reserved.
    engine.finish(n).unwrap();
    engine
        .set_reservation(1, 0, hosts[0], Resources::new(0, 0, 5120, 0))
        .unwrap();
    engine.cycle(3);
    assert_eq!(host_of(&engine, other), Some(0));
    engine.check_invariants();
    // A reservation that does not fit is refused and changes nothing.
    let before = engine.hosts().free(0);
    assert!(
        engine
            .set_reservation(1, 0, hosts[0], Resources::new(4000, 0, 5120, 0))
            .is_err()
    );
    assert_eq!(engine.hosts().free(0), before);
    assert_eq!(
        engine.reservation(1, 0),
        Some((0, Resources::new(0, 0, 5120, 0)))
    );
    // GPUs are never reserved.
    assert!(
        engine
            .set_reservation(1, 1, hosts[0], Resources::new(0, 0, 0, 1000))
            .is_err()
    );
    assert_eq!(
        engine.clear_reservation(1, 0),
        Some((0, Resources::new(0, 0, 5120, 0)))
    );
    assert_eq!(engine.hosts().reserved(0), Resources::ZERO);
    engine.check_invariants();
}

#[test]
fn a_pinned_task_keeps_what_it_does_not_use_of_its_reservation() {
    let (mut engine, pool, hosts) = setup(1, 4);
    engine
        .set_reservation(1, 0, hosts[0], Resources::new(1000, 1024, 5120, 0))
        .unwrap();
    let mut next = task(pool, 1, 0, 1);
    next.desired_host = Some(hosts[0]);
    let n = engine.submit(&[next]).unwrap()[0];
    engine.cycle(1);
    assert_eq!(host_of(&engine, n), Some(0));
    assert_eq!(
        engine.reservation(1, 0),
        Some((0, Resources::new(0, 0, 5120, 0)))
    );
    engine.check_invariants();
}

/// A revocable task of `pool` (instance `instance` of job `job`).
fn revocable(pool: PoolId, job: u32, instance: u32, n_cores: u64) -> NewTask {
    NewTask {
        flags: peloton_engine::TaskFlags {
            preemptible: true,
            controller: false,
            revocable: true,
        },
        ..task(pool, job, instance, n_cores)
    }
}

/// One 8-core host: a service of 4 cores that uses 1; instance (1, 0) has
/// 2 cores reserved while it restarts; a revocable task takes the 2 free
/// cores and borrows 3 of the service's unused ones.
fn host_with_loans() -> (Engine, PoolId, HostId) {
    let (mut engine, pool, hosts) = setup(1, 8);
    let service = engine.submit(&[task(pool, 9, 0, 4)]).unwrap()[0];
    engine.cycle(1);
    assert_eq!(host_of(&engine, service), Some(0));
    engine.set_reservation(1, 0, hosts[0], cores(2)).unwrap();
    engine.set_reclaimable(hosts[0], cores(3)).unwrap();
    let borrower = engine.submit(&[revocable(pool, 8, 0, 5)]).unwrap()[0];
    engine.cycle(2);
    assert_eq!(host_of(&engine, borrower), Some(0));
    assert_eq!(engine.hosts().free(0), Resources::new(0, 0, 100_000, 0));
    assert_eq!(engine.hosts().borrowed(0), cores(3));
    engine.check_invariants();
    (engine, pool, hosts[0])
}

#[test]
fn an_instance_takes_its_whole_reservation_on_a_host_with_loans() {
    let (mut engine, pool, host) = host_with_loans();
    // The instance's next run (revocable too, as in a revocable stateful
    // job) takes all of its reservation: the loan is not repaid from it.
    let mut next = revocable(pool, 1, 0, 2);
    next.desired_host = Some(host);
    let n = engine.submit(&[next]).unwrap()[0];
    engine.cycle(3);
    assert_eq!(host_of(&engine, n), Some(0));
    assert_eq!(engine.reservation(1, 0), None);
    assert_eq!(engine.hosts().borrowed(0), cores(3));
    assert_eq!(engine.hosts().free(0), Resources::new(0, 0, 100_000, 0));
    engine.check_invariants();
    // When it ends, what it frees repays the loan first (the borrower was
    // lent its unused room too), so its place cannot be reserved again in
    // full until the borrower ends or is evicted (the lifecycle then holds
    // the volume and tries again).
    engine.finish(n).unwrap();
    assert_eq!(engine.hosts().borrowed(0), cores(1));
    engine.set_reservation(1, 0, host, cores(2)).unwrap_err();
    engine.check_invariants();
}

#[test]
fn adoption_takes_the_whole_reservation_on_a_host_with_loans() {
    let (mut engine, pool, host) = host_with_loans();
    // The service restarted; the agent reports the instance's run.
    let t = engine.adopt(&task(pool, 1, 0, 2), host, 5).unwrap();
    assert_eq!(engine.tasks().state(t).unwrap(), TaskState::Placed);
    assert_eq!(engine.reservation(1, 0), None);
    assert_eq!(engine.hosts().borrowed(0), cores(3));
    engine.check_invariants();
}

#[test]
fn adoption_uses_the_instances_reservation() {
    let (mut engine, pool, hosts) = setup(1, 2);
    engine
        .set_reservation(1, 0, hosts[0], Resources::new(2000, 2048, 0, 0))
        .unwrap();
    let t = engine.adopt(&task(pool, 1, 0, 2), hosts[0], 5).unwrap();
    assert_eq!(engine.tasks().state(t).unwrap(), TaskState::Placed);
    assert_eq!(engine.reservation(1, 0), None);
    engine.check_invariants();
    // Another instance cannot be adopted into someone else's reservation.
    engine.finish(t).unwrap();
    engine
        .set_reservation(1, 0, hosts[0], Resources::new(2000, 2048, 0, 0))
        .unwrap();
    assert!(engine.adopt(&task(pool, 1, 1, 1), hosts[0], 6).is_err());
    engine.check_invariants();
}

#[test]
fn a_daemon_evicts_preemptible_work_of_any_pool_on_its_host_only() {
    let (mut engine, pool, hosts) = setup(2, 4);
    let other_pool = engine
        .resources_mut()
        .create_pool("/b", PoolConfig::default())
        .unwrap();
    // Host 0 full of preemptible work of another pool, at a higher
    // priority than the daemon; a daemon of another job there too.
    let mut fill = Vec::new();
    for i in 0..3 {
        let mut t = task(other_pool, 5, i, 1);
        t.priority = 10;
        t.flags.preemptible = true;
        t.desired_host = Some(hosts[0]);
        fill.push(engine.submit(&[t]).unwrap()[0]);
    }
    let mut keep = task(other_pool, 6, 0, 1);
    keep.daemon = true;
    keep.desired_host = Some(hosts[0]);
    let keep = engine.submit(&[keep]).unwrap()[0];
    engine.cycle(1);
    engine.check_invariants();
    let mut daemon = task(pool, 1, 0, 2);
    daemon.desired_host = Some(hosts[0]);
    daemon.daemon = true;
    let d = engine.submit(&[daemon]).unwrap()[0];
    engine.cycle(2);
    assert_eq!(
        host_of(&engine, d),
        None,
        "host 0 is full; host 1 is not its"
    );
    let mut plans = Vec::new();
    engine.eviction_plans(&mut plans);
    assert_eq!(plans.len(), 1);
    let (task_, slot, victims) = &plans[0];
    assert_eq!((*task_, *slot), (d, 0));
    assert_eq!(victims.len(), 2, "two 1-core victims make room for 2 cores");
    assert!(
        victims
            .iter()
            .all(|v| v.task != keep && fill.contains(&v.task)),
        "{victims:?} {fill:?} {keep:?}"
    );
    // A pinned non-daemon task of a low priority finds no victims of other
    // pools or higher priorities.
    engine.finish(d).unwrap();
    let mut plain = task(pool, 2, 0, 2);
    plain.desired_host = Some(hosts[0]);
    let _ = engine.submit(&[plain]).unwrap()[0];
    engine.cycle(3);
    let mut plans = Vec::new();
    engine.eviction_plans(&mut plans);
    assert!(plans.is_empty(), "{plans:?}");
    engine.check_invariants();
}
