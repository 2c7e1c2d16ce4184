//! Admission: queue order, the four rules, gangs, bounds and reasons.

use expect_test::{Expect, expect};
use peloton_engine::{
    AdmissionError, AdmissionLimits, AdmissionResult, Admitted, PendingTask, PoolConfig, PoolError,
    PoolId, ResourceManager, ResourceManagerConfig, Resources, TaskClass, TaskFlags, TaskId,
    testkit::{check_admission, check_manager_entitlements},
};

const NORMAL: TaskFlags = TaskFlags {
    preemptible: true,
    controller: false,
    revocable: false,
};
const NON_PREEMPTIBLE: TaskFlags = TaskFlags {
    preemptible: false,
    controller: false,
    revocable: false,
};
const CONTROLLER: TaskFlags = TaskFlags {
    preemptible: true,
    controller: true,
    revocable: false,
};
const REVOCABLE: TaskFlags = TaskFlags {
    preemptible: true,
    controller: false,
    revocable: true,
};

fn cpu(millis: u64) -> Resources {
    Resources::new(millis, 0, 0, 0)
}

struct Env {
    rm: ResourceManager,
    next_id: u64,
    out: AdmissionResult,
}

impl Env {
    fn new() -> Self {
        Self::with_limits(AdmissionLimits::default())
    }

    fn with_limits(admission: AdmissionLimits) -> Self {
        let rm = ResourceManager::new(ResourceManagerConfig {
            admission,
            ..Default::default()
        });
        Env {
            rm,
            next_id: 0,
            out: AdmissionResult::default(),
        }
    }

    fn pool(&mut self, path: &str, config: PoolConfig) -> PoolId {
        self.rm.create_pool(path, config).unwrap()
    }

    /// Queues a gang of tasks with these cpu requests; returns their ids.
    fn submit(&mut self, pool: PoolId, priority: u32, flags: TaskFlags, cpus: &[u64]) -> Vec<u64> {
        let members: Vec<PendingTask> = cpus
            .iter()
            .map(|&c| {
                self.next_id += 1;
                PendingTask {
                    id: TaskId(self.next_id),
                    request: cpu(c),
                    runtime_ms: 0,
                }
            })
            .collect();
        self.rm.enqueue(pool, priority, flags, &members).unwrap();
        members.iter().map(|m| m.id.0).collect()
    }

    /// One cycle: entitlement from demand, then admission. Returns a report.
    fn cycle(&mut self, capacity: u64, slack: u64) -> String {
        self.rm.recompute_entitlement(cpu(capacity), cpu(slack));
        check_manager_entitlements(&self.rm, cpu(capacity), cpu(slack));
        self.rm.admit(&mut self.out);
        check_admission(&self.rm, &self.out);
        self.rm.check_invariants();
        let tree = self.rm.tree();
        let mut report = String::new();
        for a in &self.out.admitted {
            report.push_str(&format!(
                "admit t{} {} {} cpu={}\n",
                a.task.0,
                tree.path(a.pool),
                a.class,
                a.request.0[0]
            ));
        }
        for b in &self.out.blocked {
            report.push_str(&format!("blocked {}: {b}\n", tree.path(b.pool)));
        }
        report
    }

    fn check_cycle(&mut self, capacity: u64, slack: u64, expected: Expect) {
        let report = self.cycle(capacity, slack);
        expected.assert_eq(&report);
    }
}

#[test]
fn priority_then_arrival_and_blocked_queues_do_not_block_others() {
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default().with_controller_limit_pct(25.0));
    env.submit(a, 9, CONTROLLER, &[1000]); // t1: the pool's first controller
    env.submit(a, 1, NORMAL, &[3000]); // t2
    env.submit(a, 5, NORMAL, &[2000]); // t3: higher priority, admitted first
    env.submit(a, 1, NORMAL, &[1000]); // t4: same priority as t2, later
    env.submit(a, 8, CONTROLLER, &[4000]); // t5: over the 25% controller limit
    env.submit(a, 0, CONTROLLER, &[500]); // t6: behind t5 in the controller queue
    // Capacity 6000: t1, t3, t2 fit; t4 would not (7000); t5 exceeds the
    // controller limit (1500).
    env.check_cycle(6000, 0, expect![[r#"
        admit t1 /a controller cpu=1000
        admit t3 /a normal cpu=2000
        admit t2 /a normal cpu=3000
        blocked /a: controller queue: controller limit reached in cpu: needs 4000 millicores, 1000 of 1500 in use (2 task(s) waiting)
        blocked /a: normal queue: entitlement exhausted in cpu: needs 1000 millicores, 6000 of 6000 in use (1 task(s) waiting)
    "#]]);
}

#[test]
fn a_pools_first_controller_runs_whatever_the_limit_and_the_next_waits() {
    // The cap is a share of the pool's entitlement, which shrinks as other
    // pools ask for more: a driver above it, alone in its pool, would wait
    // forever (with the executors it would start). Like YARN's first
    // application master, the first controller runs; the next one waits.
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default().with_controller_limit_pct(25.0));
    env.submit(a, 0, CONTROLLER, &[4000]); // t1: above 25% of 10000, alone
    env.submit(a, 0, CONTROLLER, &[1000]); // t2: a second driver
    env.check_cycle(10_000, 0, expect![[r#"
        admit t1 /a controller cpu=4000
        blocked /a: controller queue: controller limit reached in cpu: needs 1000 millicores, 4000 of 2500 in use (1 task(s) waiting)
    "#]]);
}

#[test]
fn non_preemptible_tasks_only_use_the_reservation() {
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default().with_reservation(cpu(2000)));
    env.submit(a, 0, NON_PREEMPTIBLE, &[1500]);
    env.submit(a, 0, NON_PREEMPTIBLE, &[1000]);
    env.submit(a, 0, NORMAL, &[4000]);
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t1 /a non_preemptible cpu=1500
            admit t3 /a normal cpu=4000
            blocked /a: non_preemptible queue: reservation exhausted (non-preemptible) in cpu: needs 1000 millicores, 1500 of 2000 in use (1 task(s) waiting)
        "#]],
    );
}

#[test]
fn a_head_its_shrunk_pool_can_never_admit_does_not_block_its_queue() {
    let mut env = Env::new();
    let reserving = |millis| PoolConfig::default().with_reservation(cpu(millis));
    let a = env.pool("/a", reserving(4000));
    env.submit(a, 0, NON_PREEMPTIBLE, &[2000]); // t1
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t1 /a non_preemptible cpu=2000
        "#]],
    );
    env.submit(a, 0, NON_PREEMPTIBLE, &[3000]); // t2: fits the reservation, not now
    env.submit(a, 0, NON_PREEMPTIBLE, &[500]); // t3: behind it
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            blocked /a: non_preemptible queue: reservation exhausted (non-preemptible) in cpu: needs 3000 millicores, 2000 of 4000 in use (2 task(s) waiting)
        "#]],
    );
    // The reservation shrinks below t2: t2 stays queued but no longer holds
    // t3 back; t4 behind it is held by its own rule.
    env.rm.update_pool(a, reserving(2500)).unwrap();
    env.submit(a, 0, NON_PREEMPTIBLE, &[1000]); // t4
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t3 /a non_preemptible cpu=500
            blocked /a: non_preemptible queue: reservation exhausted (non-preemptible) in cpu: needs 1000 millicores, 2500 of 2500 in use (2 task(s) waiting)
        "#]],
    );
    assert_eq!(env.rm.usage(a).unwrap().n_queued, 2, "t2 is still queued");
    // Grown again, the pool admits t2 first (it is still ahead of t4).
    env.rm.update_pool(a, reserving(6000)).unwrap();
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t2 /a non_preemptible cpu=3000
            blocked /a: non_preemptible queue: reservation exhausted (non-preemptible) in cpu: needs 1000 millicores, 5500 of 6000 in use (1 task(s) waiting)
        "#]],
    );
}

#[test]
fn revocable_tasks_run_on_slack_within_the_slack_limit() {
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default().with_slack_limit_pct(50.0));
    let b = env.pool("/b", PoolConfig::default());
    env.submit(a, 0, REVOCABLE, &[1000, 1000]); // a gang of two revocable tasks
    env.submit(a, 0, REVOCABLE, &[1500]);
    env.submit(b, 0, REVOCABLE, &[1000]);
    // Slack 4000: /a may hold at most 2000 of it.
    env.check_cycle(
        0,
        4000,
        expect![[r#"
            admit t1 /a revocable cpu=1000
            admit t2 /a revocable cpu=1000
            admit t4 /b revocable cpu=1000
            blocked /a: revocable queue: slack limit reached in cpu: needs 1500 millicores, 2000 of 2000 in use (1 task(s) waiting)
        "#]],
    );
}

#[test]
fn gangs_are_admitted_whole_or_not_at_all() {
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default());
    env.submit(a, 5, NORMAL, &[3000, 3000, 3000]); // 9000 together
    env.submit(a, 5, CONTROLLER, &[1000]);
    env.check_cycle(
        8000,
        0,
        expect![[r#"
            admit t4 /a controller cpu=1000
            blocked /a: normal queue: entitlement exhausted in cpu: needs 9000 millicores, 0 of 8000 in use (3 task(s) waiting)
        "#]],
    );
    let usage = env.rm.usage(a).unwrap();
    assert_eq!(
        usage.allocation.n_tasks, 1,
        "no member of the gang holds resources"
    );
    // More capacity: the whole gang goes in one cycle.
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t1 /a normal cpu=3000
            admit t2 /a normal cpu=3000
            admit t3 /a normal cpu=3000
        "#]],
    );
}

#[test]
fn idle_capacity_is_lent_and_the_owner_gets_it_back() {
    let mut env = Env::new();
    let owner = env.pool("/owner", PoolConfig::default().with_reservation(cpu(6000)));
    let borrower = env.pool("/borrower", PoolConfig::default());
    env.submit(borrower, 0, NORMAL, &[2000; 5]);
    // The owner is idle: the borrower takes everything.
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t1 /borrower normal cpu=2000
            admit t2 /borrower normal cpu=2000
            admit t3 /borrower normal cpu=2000
            admit t4 /borrower normal cpu=2000
            admit t5 /borrower normal cpu=2000
        "#]],
    );
    // The owner's demand returns: it is entitled to what it asks, up to its
    // reservation, and admitted at once. The borrower is now above its
    // entitlement; reclaiming that is the preemptor's work.
    env.submit(owner, 0, NORMAL, &[3000]);
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t6 /owner normal cpu=3000
        "#]],
    );
    let ent = env.rm.entitlements();
    assert_eq!(ent.entitlement(owner.idx()).0[0], 3000);
    assert_eq!(ent.entitlement(borrower.idx()).0[0], 7000);
    assert_eq!(
        env.rm.usage(borrower).unwrap().allocation.total.0[0],
        10_000
    );
    // With demand of 9000 the owner gets its full reservation of 6000 back,
    // plus half (equal shares) of the 4000 beyond the reservations.
    env.submit(owner, 0, NORMAL, &[3000]);
    env.submit(owner, 0, NORMAL, &[3000]);
    env.check_cycle(
        10_000,
        0,
        expect![[r#"
            admit t7 /owner normal cpu=3000
            blocked /owner: normal queue: entitlement exhausted in cpu: needs 3000 millicores, 6000 of 8000 in use (1 task(s) waiting)
        "#]],
    );
    assert_eq!(env.rm.entitlements().entitlement(owner.idx()).0[0], 8000);
    assert_eq!(env.rm.entitlements().entitlement(borrower.idx()).0[0], 2000);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mut env = Env::with_limits(AdmissionLimits {
        max_queued_per_pool: 3,
        max_queued_total: 4,
        max_gang_size: 2,
    });
    let org = env.pool("/org", PoolConfig::default());
    let a = env.pool("/org/a", PoolConfig::default());
    let b = env.pool("/org/b", PoolConfig::default());
    let task = |id: u64, c: u64| PendingTask {
        id: TaskId(id),
        request: cpu(c),
        runtime_ms: 0,
    };
    let errors = [
        env.rm.enqueue(org, 0, NORMAL, &[task(1, 1)]).unwrap_err(),
        env.rm.enqueue(a, 0, NORMAL, &[]).unwrap_err(),
        env.rm
            .enqueue(a, 0, NORMAL, &[task(1, 1), task(2, 1), task(3, 1)])
            .unwrap_err(),
        env.rm.enqueue(a, 0, NORMAL, &[task(1, 0)]).unwrap_err(),
        env.rm
            .enqueue(
                a,
                0,
                NORMAL,
                &[PendingTask {
                    id: TaskId(1),
                    request: cpu(1 << 51),
                    runtime_ms: 0,
                }],
            )
            .unwrap_err(),
        env.rm
            .enqueue(
                a,
                0,
                TaskFlags {
                    preemptible: false,
                    controller: false,
                    revocable: true,
                },
                &[task(1, 1)],
            )
            .unwrap_err(),
    ];
    for error in &errors {
        assert!(
            matches!(error, AdmissionError::InvalidTask { .. }),
            "{error}"
        );
    }
    assert_eq!(env.rm.usage(a).unwrap().n_queued, 0);
    env.rm
        .enqueue(a, 0, NORMAL, &[task(1, 1), task(2, 1)])
        .unwrap();
    env.rm.enqueue(a, 0, NORMAL, &[task(3, 1)]).unwrap();
    let full = env.rm.enqueue(a, 0, NORMAL, &[task(4, 1)]).unwrap_err();
    env.rm.enqueue(b, 0, NORMAL, &[task(5, 1)]).unwrap();
    let total = env.rm.enqueue(b, 0, NORMAL, &[task(6, 1)]).unwrap_err();
    let messages: Vec<String> = errors
        .iter()
        .chain([&full, &total])
        .map(ToString::to_string)
        .collect();
    expect![[r#"
        [
            "invalid task: pool: pool /org has child pools: tasks may only be submitted to leaf pools",
            "invalid task: members: a gang needs at least one task",
            "invalid task: members: 3 tasks exceed the gang size limit of 2",
            "invalid task: request: task 1 requests no resources",
            "invalid task: request: task 1 requests 2251799813685248 millicores cpu, above the maximum 1125899906842624",
            "invalid task: revocable: a revocable task must be preemptible",
            "pool /org/a already queues 3 task(s); the limit is 3",
            "4 task(s) are queued in all pools; the limit is 4",
        ]
    "#]]
    .assert_debug_eq(&messages);
    env.rm.check_invariants();

    // A pool with tasks can be neither deleted nor given children.
    assert!(matches!(
        env.rm.delete_pool(a),
        Err(PoolError::HasTasks { n_tasks: 3, .. })
    ));
    assert!(matches!(
        env.rm.create_pool("/org/a/sub", PoolConfig::default()),
        Err(PoolError::HasTasks { .. })
    ));
    env.rm.check_invariants();
}

#[test]
fn cancel_and_release() {
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default());
    let first = env
        .rm
        .enqueue(
            a,
            0,
            NORMAL,
            &[PendingTask {
                id: TaskId(1),
                request: cpu(4000),
                runtime_ms: 0,
            }],
        )
        .unwrap();
    env.submit(a, 0, NORMAL, &[1000]);
    env.rm.cancel(first).unwrap();
    assert_eq!(env.rm.cancel(first), Err(AdmissionError::NotPending));
    assert_eq!(env.rm.usage(a).unwrap().queued, cpu(1000));
    env.check_cycle(
        2000,
        0,
        expect![[r#"
            admit t1 /a normal cpu=1000
        "#]],
    );
    // Releasing more than is held is refused and changes nothing.
    let admitted = env.out.admitted[0];
    let err = env
        .rm
        .release(&Admitted {
            request: cpu(1001),
            ..admitted
        })
        .unwrap_err();
    expect![[r#"pool /a: cannot release cpu=1001 memory=0 disk=0 gpu=0 of class normal: only cpu=1000 memory=0 disk=0 gpu=0 is allocated"#]]
        .assert_eq(&err.to_string());
    assert!(
        env.rm
            .release(&Admitted {
                controller: true,
                ..admitted
            })
            .is_err()
    );
    assert!(
        env.rm
            .release(&Admitted {
                class: TaskClass::Controller,
                ..admitted
            })
            .is_err()
    );
    assert!(
        env.rm
            .release(&Admitted {
                request: Resources::ZERO,
                ..admitted
            })
            .is_err()
    );
    assert_eq!(env.rm.usage(a).unwrap().allocation.n_tasks, 1);
    env.rm.release(&admitted).unwrap();
    assert!(env.rm.release(&admitted).is_err(), "released twice");
    assert_eq!(env.rm.usage(a).unwrap().allocation.n_tasks, 0);
    env.rm.delete_pool(a).unwrap();
    env.rm.check_invariants();
}

#[test]
fn many_cancellations_are_purged_from_the_heaps() {
    let mut env = Env::new();
    let a = env.pool("/a", PoolConfig::default());
    let mut ids = Vec::new();
    for i in 0..5000 {
        ids.push(
            env.rm
                .enqueue(
                    a,
                    i % 7,
                    NORMAL,
                    &[PendingTask {
                        id: TaskId(u64::from(i)),
                        request: cpu(10),
                        runtime_ms: 0,
                    }],
                )
                .unwrap(),
        );
    }
    for id in &ids[..4990] {
        env.rm.cancel(*id).unwrap();
    }
    env.rm.check_invariants();
    // Cancelled items are purged from the heaps once they outnumber the live
    // ones (and exceed 1024), not kept until they reach the head.
    let items = env.rm.n_heap_items(a).unwrap();
    assert!(items <= 10 + 1025, "{items} heap items for 10 queued tasks");
    let report = env.cycle(1_000_000, 0);
    assert_eq!(report.lines().count(), 10);
}

#[test]
fn admission_is_identical_on_one_and_two_threads() {
    use peloton_engine::testkit::{
        Rng, TreeSpec, bench_capacity, build_random_tree, enqueue_random_tasks,
    };
    let run = |threads: usize| {
        let mut rng = Rng::new(11);
        let mut rm = ResourceManager::new(ResourceManagerConfig {
            threads,
            ..Default::default()
        });
        let leaves = build_random_tree(&mut rm, &TreeSpec::new(400, 4, bench_capacity()), &mut rng);
        let demand = enqueue_random_tasks(&mut rm, &leaves, 30_000, &mut rng).unwrap();
        let mut out = AdmissionResult::default();
        let mut cycles = Vec::new();
        for fraction in [30.0, 60.0, 90.0] {
            let capacity = demand.percent(fraction);
            rm.recompute_entitlement(capacity, capacity.percent(10.0));
            rm.admit(&mut out);
            check_admission(&rm, &out);
            rm.check_invariants();
            cycles.push((out.admitted.clone(), out.blocked.clone()));
        }
        cycles
    };
    let one = run(1);
    let two = run(2);
    assert!(
        one.iter()
            .all(|(admitted, blocked)| !admitted.is_empty() && !blocked.is_empty())
    );
    assert_eq!(one, two);
}

/// `never_admitted` for one cpu request, as text: the rule, the pool that
/// sets it and the cap, or "ok".
fn never(env: &Env, pool: PoolId, flags: TaskFlags, millis: u64) -> String {
    match env.rm.never_admitted(pool, flags, &cpu(millis)).unwrap() {
        None => "ok".into(),
        Some(n) => format!(
            "{:?} of {} in {}: {} > {}",
            n.ceiling,
            env.rm.tree().path(n.pool),
            n.dim,
            n.request,
            n.cap
        ),
    }
}

/// /org (reservation 8, limit 20 cores, slack 50%) with /org/team
/// (reservation 2, limit 20, controllers 25%, slack 50%), and /fixed (STATIC, 3
/// cores) with /fixed/leaf. Returns team and fixed/leaf.
fn ceiling_tree(env: &mut Env) -> (PoolId, PoolId) {
    env.pool(
        "/org",
        PoolConfig::default()
            .with_reservation(cpu(8000))
            .with_limit(cpu(20_000))
            .with_slack_limit_pct(50.0),
    );
    let team = env.pool(
        "/org/team",
        PoolConfig::default()
            .with_reservation(cpu(2000))
            .with_limit(cpu(20_000))
            .with_controller_limit_pct(25.0)
            .with_slack_limit_pct(50.0),
    );
    env.pool(
        "/fixed",
        PoolConfig::default()
            .with_reservation(cpu(3000))
            .with_kind(peloton_engine::PoolKind::Static),
    );
    (team, env.pool("/fixed/leaf", PoolConfig::default()))
}

#[test]
fn work_above_what_its_pool_could_ever_give_its_class_is_named() {
    let mut env = Env::new();
    let (team, fixed) = ceiling_tree(&mut env);
    let root = env.rm.tree().root();
    let cases = [
        (
            "non-preemptible at the reservation",
            team,
            NON_PREEMPTIBLE,
            2000,
        ),
        ("non-preemptible above it", team, NON_PREEMPTIBLE, 2001),
        ("normal at the parent's limit", team, NORMAL, 20_000),
        ("normal above it", team, NORMAL, 20_001),
        ("controller at 25% of the limit", team, CONTROLLER, 5000),
        (
            "controller above it (a first one runs anyway)",
            team,
            CONTROLLER,
            5001,
        ),
        ("revocable at 50% of /org's 20", team, REVOCABLE, 10_000),
        ("revocable above it", team, REVOCABLE, 10_001),
        ("normal under a STATIC pool", fixed, NORMAL, 3000),
        ("above its reservation", fixed, NORMAL, 3001),
        ("the root takes anything", root, NON_PREEMPTIBLE, 1 << 40),
    ];
    let report: String = cases
        .iter()
        .map(|(what, pool, flags, millis)| {
            format!("{what}: {}\n", never(&env, *pool, *flags, *millis))
        })
        .collect();
    expect![[r#"
        non-preemptible at the reservation: ok
        non-preemptible above it: Reservation of /org/team in cpu: 2001 > 2000
        normal at the parent's limit: ok
        normal above it: Limit of /org/team in cpu: 20001 > 20000
        controller at 25% of the limit: ok
        controller above it (a first one runs anyway): ok
        revocable at 50% of /org's 20: ok
        revocable above it: SlackLimit of /org/team in cpu: 10001 > 10000
        normal under a STATIC pool: ok
        above its reservation: StaticReservation of /fixed in cpu: 3001 > 3000
        the root takes anything: ok
    "#]]
    .assert_eq(&report);
    // What is "ok" is admitted alone on a huge cluster; what is refused is
    // not admitted however large the cluster is.
    for (what, _, flags, millis) in cases.into_iter().filter(|c| c.1 != root) {
        let mut env = Env::new();
        let (team, fixed) = ceiling_tree(&mut env);
        let pool = if what.contains("STATIC") || what.starts_with("above its") {
            fixed
        } else {
            team
        };
        let ok = never(&env, pool, flags, millis) == "ok";
        let ids = env.submit(pool, 0, flags, &[millis]);
        let report = env.cycle(1 << 45, 1 << 45);
        let admitted = report.contains(&format!("admit t{} ", ids[0]));
        assert_eq!(admitted, ok, "{what}: {report}");
    }
}

#[test]
fn a_gang_is_refused_on_its_summed_request() {
    let mut env = Env::new();
    let (team, _) = ceiling_tree(&mut env);
    assert_eq!(never(&env, team, NON_PREEMPTIBLE, 1000), "ok");
    let gang = env
        .rm
        .never_admitted(team, NON_PREEMPTIBLE, &cpu(3 * 1000))
        .unwrap()
        .expect("three of 1 core exceed a 2-core reservation");
    assert_eq!((gang.request, gang.cap), (3000, 2000));
}

#[test]
fn what_is_refused_is_never_admitted_in_random_trees() {
    use peloton_engine::testkit::{Rng, TreeSpec, bench_capacity, build_random_tree};
    let mut rng = Rng::new(7);
    let mut rm = ResourceManager::new(ResourceManagerConfig::default());
    let capacity = bench_capacity();
    let leaves = build_random_tree(&mut rm, &TreeSpec::new(60, 4, capacity), &mut rng);
    let mut out = AdmissionResult::default();
    let (mut refused, mut accepted) = (0, 0);
    for (n, &leaf) in leaves.iter().enumerate() {
        for flags in [NON_PREEMPTIBLE, NORMAL, CONTROLLER, REVOCABLE] {
            // Around the pool's own reservation and limit.
            let config = *rm.tree().config(leaf);
            let base = if rng.chance(0.5) {
                config.reservation()
            } else {
                config.limit().min(&capacity)
            };
            let request = Resources(std::array::from_fn(|d| {
                (base.0[d] as f64 * (0.5 + rng.unit())) as u64
            }));
            if request.is_zero() {
                continue;
            }
            let never = rm.never_admitted(leaf, flags, &request).unwrap();
            let task = PendingTask {
                id: TaskId(n as u64),
                request,
                runtime_ms: 0,
            };
            let pending = rm.enqueue(leaf, 0, flags, &[task]).unwrap();
            rm.recompute_entitlement(Resources::MAX, Resources::MAX);
            rm.admit(&mut out);
            let admitted = out.admitted.iter().any(|a| a.task == task.id);
            assert!(
                !(admitted && never.is_some()),
                "{} {flags:?} {request:?}: refused ({never:?}) yet admitted",
                rm.tree().path(leaf)
            );
            if admitted {
                accepted += 1;
                for a in &out.admitted {
                    rm.release(a).unwrap();
                }
            } else {
                refused += 1;
                rm.cancel(pending).unwrap();
            }
            rm.check_invariants();
        }
    }
    assert!(
        refused > 10 && accepted > 10,
        "{refused} refused, {accepted} accepted"
    );
}

#[test]
fn queue_order_is_the_order_admission_takes_and_reading_it_changes_nothing() {
    let mut env = Env::new();
    let parent = env.pool("/p", PoolConfig::default().with_reservation(cpu(1000)));
    let a = env.pool("/p/a", PoolConfig::default().with_reservation(cpu(1000)));
    env.submit(a, 1, NORMAL, &[1000]); // t1
    env.submit(a, 5, NORMAL, &[1000]); // t2
    env.submit(a, 5, NON_PREEMPTIBLE, &[500]); // t3
    env.submit(a, 9, CONTROLLER, &[500]); // t4
    env.submit(a, 1, REVOCABLE, &[100]); // t5
    env.submit(a, 5, NORMAL, &[100, 100, 100]); // t6..t8: a gang
    let cancelled = env
        .rm
        .enqueue(
            a,
            7,
            NORMAL,
            &[PendingTask {
                id: TaskId(100),
                request: cpu(1),
                runtime_ms: 0,
            }],
        )
        .unwrap();
    env.submit(a, 0, NORMAL, &[1000]); // t9
    env.rm.cancel(cancelled).unwrap();

    let order = |env: &Env, limit| -> Vec<String> {
        env.rm
            .queue_order(a, limit)
            .unwrap()
            .iter()
            .map(|e| format!("t{}x{} p{} {}", e.head.0, e.n_tasks, e.priority, e.class))
            .collect()
    };
    let all = order(&env, 1000);
    assert_eq!(
        all,
        [
            "t4x1 p9 controller",
            "t2x1 p5 normal",
            "t3x1 p5 non_preemptible",
            "t6x3 p5 normal",
            "t1x1 p1 normal",
            "t5x1 p1 revocable",
            "t9x1 p0 normal",
        ]
    );
    // A prefix for a smaller limit; reading twice gives the same answer.
    assert_eq!(order(&env, 3), all[..3]);
    assert_eq!(order(&env, 1000), all);
    assert!(order(&env, 0).is_empty());
    // Capped at MAX_QUEUE_READ.
    for _ in 0..peloton_engine::MAX_QUEUE_READ {
        env.submit(a, 0, NORMAL, &[1]);
    }
    assert_eq!(order(&env, 10_000).len(), peloton_engine::MAX_QUEUE_READ);
    assert_eq!(order(&env, 10_000)[..all.len()], all);
    // A parent queues nothing; a deleted pool is an error.
    assert!(env.rm.queue_order(parent, 10).unwrap().is_empty());
    let b = env.pool("/b", PoolConfig::default());
    env.rm.delete_pool(b).unwrap();
    assert!(env.rm.queue_order(b, 10).is_err());

    // With room for everything, admission takes the entries in that order.
    env.rm.recompute_entitlement(cpu(1_000_000), cpu(1_000_000));
    env.rm.admit(&mut env.out);
    env.rm.check_invariants();
    let mut admitted: Vec<String> = Vec::new();
    for x in &env.out.admitted {
        let t = format!("t{}", x.task.0);
        if ["t7", "t8"].contains(&t.as_str()) {
            continue; // the gang's other members
        }
        admitted.push(t);
    }
    let heads: Vec<String> = all
        .iter()
        .map(|s| s.split('x').next().unwrap().to_string())
        .collect();
    assert_eq!(admitted[..heads.len()], heads);
}
