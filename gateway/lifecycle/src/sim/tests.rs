//! The model-based test of the core: random scenarios (proptest), the
//! committed fuzz corpus (`fuzz/corpus/lifecycle_ops`) replayed, and
//! hand-picked scenarios.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use crate::{Input, TaskState, UpdateRequest, UpdateSpec};

use super::ops::{
    Driver, JobSpec, N_UPDATE_VARIANTS, N_VOLUME_VARIANTS, Op, Scenario, Stats, fuzz_lifecycle_ops,
};

fn job_spec() -> impl Strategy<Value = JobSpec> {
    (
        (any::<bool>(), 0u8..5, 1u8..=3, any::<bool>(), any::<bool>()),
        (
            0u8..4,
            0u8..4,
            any::<bool>(),
            any::<bool>(),
            0u8..3,
            any::<bool>(),
            1u8..=2,
            any::<bool>(),
        ),
        0u8..3,
    )
        .prop_map(
            |(
                (service, pool, instances, gang, big),
                (
                    max_failures,
                    priority,
                    preemptible,
                    health,
                    max_running,
                    deadline,
                    max_unavailable,
                    revocable,
                ),
                elastic_min,
            )| JobSpec {
                service,
                pool,
                instances,
                gang,
                big,
                max_failures,
                priority,
                preemptible,
                health,
                max_running,
                deadline,
                max_unavailable,
                revocable,
                elastic_min,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    let b = any::<u8>;
    prop_oneof![
        2 => b().prop_map(Op::CreatePool),
        1 => b().prop_map(Op::DeletePool),
        14 => job_spec().prop_map(Op::CreateJob),
        14 => Just(Op::Cycle),
        5 => (0u8..5).prop_map(Op::Tick),
        10 => (b(), 0u8..3).prop_map(|(run, outcome)| Op::Exit { run, outcome }),
        2 => (0u8..128, any::<bool>()).prop_map(|(run, healthy)| Op::Health { run, healthy }),
        2 => b().prop_map(Op::Checkpoint),
        2 => b().prop_map(Op::ConfirmKill),
        4 => Just(Op::ConfirmKills),
        2 => b().prop_map(Op::KillJob),
        2 => b().prop_map(Op::RestartJob),
        2 => (b(), 0u8..4).prop_map(|(j, n)| Op::ScaleJob(j, n)),
        2 => (b(), b(), b()).prop_map(|(j, e, f)| Op::EditJob(j, e, f)),
        1 => b().prop_map(Op::DeleteJob),
        2 => (b(), b()).prop_map(|(j, i)| Op::KillTask(j, i)),
        2 => (b(), b()).prop_map(|(j, i)| Op::RestartTask(j, i)),
        2 => b().prop_map(Op::Drain),
        2 => b().prop_map(Op::Up),
        1 => b().prop_map(Op::Disconnect),
        1 => (0u8..128, any::<bool>()).prop_map(|(host, dies)| Op::LoseHost { host, dies }),
        2 => b().prop_map(Op::Register),
        1 => Just(Op::Crash),
        1 => b().prop_map(Op::Stall),
        2 => b().prop_map(Op::StartLaunches),
        4 => (b(), 0..N_UPDATE_VARIANTS).prop_map(|(j, v)| Op::UpdateJob(j, v)),
        3 => (b(), 0u8..4).prop_map(|(j, a)| Op::UpdateAction(j, a)),
        2 => pinned_op(),
    ]
}

/// Stateful and daemon jobs, volume deletions, zones and new hosts.
fn pinned_op() -> impl Strategy<Value = Op> {
    let b = any::<u8>;
    prop_oneof![
        3 => (job_spec(), 0..N_VOLUME_VARIANTS).prop_map(|(s, v)| Op::CreateStatefulJob(s, v)),
        2 => (job_spec(), 0u8..3).prop_map(|(s, c)| Op::CreateDaemonJob(s, c)),
        2 => b().prop_map(Op::DeleteVolume),
        1 => (0u8..85, 0u8..3).prop_map(|(host, zone)| Op::SetZone { host, zone }),
        1 => (0u8..3).prop_map(Op::AddHost),
    ]
}

/// Operations that drive pinned instances more: stateful and daemon
/// jobs, volume deletions, zones and hosts, among any operation (lost
/// hosts and time more often, so volumes are given up).
fn pinned_scenario_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op(),
        4 => pinned_op(),
        1 => (0u8..128, any::<bool>()).prop_map(|(host, dies)| Op::LoseHost { host, dies }),
        2 => (0u8..5).prop_map(Op::Tick),
    ]
}

/// Up to `max_ops` operations, pinned jobs among them, on 2–4 hosts.
fn pinned_scenario(max_ops: usize) -> impl Strategy<Value = Scenario> {
    (
        2u8..=4,
        proptest::collection::vec(pinned_scenario_op(), 0..max_ops),
    )
        .prop_map(|(n_hosts, ops)| Scenario { n_hosts, ops })
}

/// Up to `max_ops` operations on 2–4 hosts.
fn scenario(max_ops: usize) -> impl Strategy<Value = Scenario> {
    (2u8..=4, proptest::collection::vec(op(), 0..max_ops))
        .prop_map(|(n_hosts, ops)| Scenario { n_hosts, ops })
}

/// Operations that drive rolling updates more: services, updates, actions
/// on them, health verdicts and run ends, among any operation.
fn update_op() -> impl Strategy<Value = Op> {
    let b = any::<u8>;
    prop_oneof![
        6 => op(),
        2 => job_spec().prop_map(|spec| Op::CreateJob(JobSpec {
            service: true,
            gang: false,
            elastic_min: 0,
            ..spec
        })),
        3 => (b(), 0..N_UPDATE_VARIANTS).prop_map(|(j, v)| Op::UpdateJob(j, v)),
        2 => (b(), 0u8..4).prop_map(|(j, a)| Op::UpdateAction(j, a)),
        2 => (0u8..128, any::<bool>()).prop_map(|(run, healthy)| Op::Health { run, healthy }),
        2 => b().prop_map(Op::Checkpoint),
        2 => Just(Op::Cycle),
    ]
}

/// Up to `max_ops` operations, updates among them, on 2–4 hosts.
fn update_scenario(max_ops: usize) -> impl Strategy<Value = Scenario> {
    (2u8..=4, proptest::collection::vec(update_op(), 0..max_ops))
        .prop_map(|(n_hosts, ops)| Scenario { n_hosts, ops })
}

fn add(total: &mut Stats, s: Stats) {
    total.ops += s.ops;
    total.refused += s.refused;
    total.jobs += s.jobs;
    total.launches += s.launches;
    total.kills += s.kills;
    total.crashes += s.crashes;
    total.succeeded += s.succeeded;
    total.services_running += s.services_running;
    total.quiesce_rounds = total.quiesce_rounds.max(s.quiesce_rounds);
    total.updates += s.updates;
    total.updates_succeeded += s.updates_succeeded;
    total.updates_rolled_back += s.updates_rolled_back;
    total.updates_stopped += s.updates_stopped;
    total.volumes_created += s.volumes_created;
    total.volumes_deleted += s.volumes_deleted;
    total.volumes_given_up += s.volumes_given_up;
    total.daemon_jobs += s.daemon_jobs;
    total.daemons_running += s.daemons_running;
    total.pinned_waiting += s.pinned_waiting;
}

/// Cases per property: 256, times `PELOTON_SIM_MULT` when set (a longer
/// hunt: `PELOTON_SIM_MULT=100 cargo test -p peloton-lifecycle sim::`).
fn cases() -> u32 {
    let mult = std::env::var("PELOTON_SIM_MULT")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1);
    256 * mult.max(1)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// After every operation the invariants hold and no instance runs
    /// twice; once quiesced, every job reached what its kind promises.
    #[test]
    fn random_operations_keep_the_core_safe_and_live(s in scenario(80)) {
        Driver::run(&s);
    }

    /// The same with rolling updates of services among the operations:
    /// after every step no update has more instances down than its batch
    /// (or the batch it took over); once quiesced every update ended, and
    /// a job's latest update that succeeded (rolled back) left every
    /// instance on its new (old) spec.
    #[test]
    fn random_updates_keep_the_core_safe_and_live(s in update_scenario(80)) {
        Driver::run(&s);
    }

    /// The same with stateful and daemon jobs among the operations:
    /// after every step a run is on its volume's host, volumes are unique
    /// and stored, reservations are only for pinned instances on their
    /// host, a daemon has one instance per host and, after a cycle, one on
    /// every up host it matches; volumes go only by request or when
    /// given up after their host's timeout; once quiesced every pinned
    /// instance runs unless its host has no room for it.
    #[test]
    fn random_pinned_jobs_keep_the_core_safe_and_live(s in pinned_scenario(80)) {
        Driver::run(&s);
    }

    #[test]
    fn scenarios_encode_to_bytes_that_decode_back(s in update_scenario(60)) {
        prop_assert_eq!(Scenario::decode(&s.encode()), s);
    }

    #[test]
    fn pinned_scenarios_encode_to_bytes_that_decode_back(s in pinned_scenario(60)) {
        prop_assert_eq!(Scenario::decode(&s.encode()), s);
    }
}

/// Scenarios drawn from the strategies with a fixed seed (the corpus
/// seeds).
fn seeded_scenarios(n: usize, max_ops: usize) -> Vec<Scenario> {
    seeded(scenario(max_ops), n)
}

fn seeded(strategy: impl Strategy<Value = Scenario>, n: usize) -> Vec<Scenario> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .expect("a scenario")
                .current()
        })
        .collect()
}

#[test]
fn seeded_scenarios_reach_deep_states() {
    let mut total = Stats::default();
    for s in seeded_scenarios(32, 80) {
        add(&mut total, Driver::run(&s));
    }
    eprintln!("seeded scenarios: {total:?}");
    assert!(total.jobs > 50, "{total:?}");
    assert!(total.launches > 100 && total.kills > 20, "{total:?}");
    assert!(total.crashes > 5 && total.refused > 0, "{total:?}");
    assert!(
        total.succeeded > 10 && total.services_running > 10,
        "{total:?}"
    );
    // Writes the seed inputs of the fuzz corpus when asked.
    if let Ok(dir) = std::env::var("PELOTON_WRITE_LIFECYCLE_CORPUS") {
        for (i, s) in seeded_scenarios(32, 80).iter().enumerate() {
            std::fs::write(format!("{dir}/seeded-{i:02}"), s.encode()).expect("write");
        }
    }
}

#[test]
fn seeded_update_scenarios_reach_every_end_of_an_update() {
    let scenarios = seeded(update_scenario(80), 32);
    let mut total = Stats::default();
    for s in &scenarios {
        add(&mut total, Driver::run(s));
    }
    eprintln!("seeded update scenarios: {total:?}");
    assert!(total.updates > 30, "{total:?}");
    assert!(
        total.updates_succeeded > 5 && total.updates_rolled_back > 0 && total.updates_stopped > 5,
        "{total:?}"
    );
    // Writes seed inputs of the fuzz corpus with updates when asked.
    if let Ok(dir) = std::env::var("PELOTON_WRITE_LIFECYCLE_UPDATE_CORPUS") {
        for (i, s) in scenarios.iter().take(8).enumerate() {
            std::fs::write(format!("{dir}/updates-{i:02}"), s.encode()).expect("write");
        }
    }
}

#[test]
fn seeded_pinned_scenarios_reach_volumes_and_daemons() {
    let scenarios = seeded(pinned_scenario(80), 32);
    let mut total = Stats::default();
    for s in &scenarios {
        add(&mut total, Driver::run(s));
    }
    eprintln!("seeded pinned scenarios: {total:?}");
    assert!(
        total.volumes_created > 20 && total.volumes_deleted > 0 && total.volumes_given_up > 0,
        "{total:?}"
    );
    assert!(
        total.daemon_jobs > 10 && total.daemons_running > 10,
        "{total:?}"
    );
    // Writes seed inputs of the fuzz corpus with pinned jobs when asked.
    if let Ok(dir) = std::env::var("PELOTON_WRITE_LIFECYCLE_PINNED_CORPUS") {
        for (i, s) in scenarios.iter().take(8).enumerate() {
            std::fs::write(format!("{dir}/pinned-{i:02}"), s.encode()).expect("write");
        }
    }
}

#[test]
fn committed_corpus_replays_cleanly() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/lifecycle_ops");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 10,
        "the corpus has inputs ({})",
        entries.len()
    );
    let mut total = Stats::default();
    for path in entries {
        let data = std::fs::read(&path).expect("read");
        let stats = std::panic::catch_unwind(|| fuzz_lifecycle_ops(&data))
            .unwrap_or_else(|_| panic!("{} fails", path.display()));
        add(&mut total, stats);
    }
    assert!(total.launches > 0 && total.succeeded > 0, "{total:?}");
}

#[test]
fn any_bytes_decode_and_run() {
    for data in [
        &b""[..],
        b"\x00",
        b"\xff\xff\xff",
        b"\x02\x02\x02\x02\x03\x03",
    ] {
        fuzz_lifecycle_ops(data);
    }
}

/// A scenario written out: a gang service, a drained host, a partition
/// and a crash.
#[test]
fn a_partitioned_host_returns_after_a_crash_and_its_stale_runs_are_stopped() {
    let spec = JobSpec {
        service: true,
        pool: 0,
        instances: 2,
        gang: true,
        elastic_min: 0,
        big: true,
        max_failures: 0,
        priority: 0,
        preemptible: false,
        health: true,
        max_running: 0,
        deadline: false,
        max_unavailable: 1,
        revocable: false,
    };
    let batch = JobSpec {
        service: false,
        gang: false,
        elastic_min: 0,
        instances: 3,
        ..spec
    };
    let s = Scenario {
        n_hosts: 3,
        ops: vec![
            Op::CreateJob(spec),
            Op::CreateJob(batch),
            Op::Cycle,
            Op::Health {
                run: 0,
                healthy: true,
            },
            Op::LoseHost {
                host: 0,
                dies: false,
            },
            Op::Cycle,
            Op::Drain(1),
            Op::Crash,
            Op::Register(2),
            Op::Cycle,
            Op::Register(0),
            Op::ConfirmKill(0),
            Op::Register(1),
            Op::Exit { run: 1, outcome: 0 },
        ],
    };
    let stats = Driver::run(&s);
    assert!(
        stats.launches >= 5 && stats.services_running == 2,
        "{stats:?}"
    );
}

/// A batch job of one instance in the root pool: the shape of the known
/// bugs below.
fn one_task_in_root(max_failures: u8) -> JobSpec {
    JobSpec {
        service: false,
        pool: 0,
        instances: 1,
        gang: false,
        elastic_min: 0,
        big: false,
        max_failures,
        priority: 0,
        preemptible: false,
        health: false,
        max_running: 0,
        deadline: false,
        max_unavailable: 1,
        revocable: false,
    }
}

/// Found by this model, fixed in a9d0a7d: a job's pool got a child pool
/// while the job held no engine task (its only run backing off), and its
/// next run could never be queued ("pool / has child pools"). Now the
/// child pool is refused while the pool has an unfinished job.
#[test]
fn regression_a_job_backing_off_keeps_its_pool_a_leaf() {
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(one_task_in_root(1)),
            Op::Cycle,
            Op::Exit { run: 0, outcome: 1 }, // fails: backs off
            Op::CreatePool(0),               // "/a" under "/": refused
        ],
    };
    let stats = Driver::run(&s);
    assert_eq!((stats.refused, stats.succeeded), (1, 1), "{stats:?}");
}

/// Regression (found by this model, fixed: a restart now checks that the
/// pool is still a leaf): a finished job's pool gets a child
/// pool (allowed: the job is finished); restarting the job is then
/// answered Ok (`check_job_pool` only checks that the pool still exists
/// under its path, not that it is still a leaf), and its new run can never
/// be queued ("cannot queue yet: … pool / has child pools"): the job stays
/// INITIALIZED for ever. Scaling it up or restarting one of its tasks goes
/// through the same check.
/// Fails with: "batch job j0: … job j0 Initialized … 0#2 Initialized".
#[test]
fn regression_a_restart_is_accepted_when_the_pool_became_inner() {
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(one_task_in_root(0)),
            Op::Cycle,
            Op::Exit { run: 0, outcome: 0 }, // succeeds
            Op::CreatePool(0),               // "/a": "/" is no longer a leaf
            Op::RestartJob(0),               // answered Ok
        ],
    };
    Driver::run(&s);
}

/// Regression (found by this model, fixed): after a
/// restart, recovered runs waiting for their agent (orphans), and held runs
/// recovered without an engine task, do not count in the job's `active`,
/// so `fill` queues more instances than `max_running` allows; once the
/// agent registers and the orphan is adopted, the job runs over its limit.
/// Here a service of 2 instances with max_running 1 ends with both
/// running. Fails with: "j0 runs 2 instances, more than its max_running 1".
#[test]
fn regression_max_running_is_exceeded_after_a_crash() {
    let spec = JobSpec {
        service: true,
        instances: 2,
        max_running: 1,
        ..one_task_in_root(0)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(spec), // instance 1 waits for room
            Op::Cycle,           // instance 0 runs
            Op::Crash,           // instance 0 is an orphan: not counted
            Op::Register(0),     // h0 comes back: the next cycle places instance 1
            Op::Register(1),
            Op::Cycle,
        ],
    };
    Driver::run(&s);
}

/// Regression (found by this model, fixed): a
/// gang member waits (INITIALIZED) for a mate that is backing off, to
/// start again with it as one gang; the mate is killed by request
/// (`end_run` Backoff -> Killed) and nothing schedules a `fill` of the job,
/// so the waiting member is never queued: the job stays INITIALIZED for
/// ever. (Scaling the backing-off mate away has the same effect until some
/// other run of the job ends.) Fails with: "batch job j0: … job j0
/// Initialized … waiting=[1] … 0#1 Killed … 1#2 Initialized".
#[test]
fn regression_killing_a_backing_off_gang_member_strands_its_mates() {
    let gang = JobSpec {
        instances: 2,
        gang: true,
        elastic_min: 0,
        ..one_task_in_root(1)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(gang),
            Op::Cycle,
            Op::Exit { run: 0, outcome: 1 }, // j0/0 fails and backs off; j0/1 is stopped
            Op::ConfirmKills,                // j0/1 waits for j0/0
            Op::KillTask(0, 0),              // j0/0: Backoff -> Killed
        ],
    };
    Driver::run(&s);
}

/// Regression (found by this model, fixed):
/// taking waiting instances away (a scale-down, or a task kill of a
/// waiting instance) never schedules a `fill`. That can shrink the next
/// gang to one that fits under `max_running`, and nothing queues it until
/// some other run of the job changes: here a service keeps running one
/// instance of its two wanted with max_running 2. Fails with: "1
/// instances wait with room under max_running: j0 … waiting=[2]".
#[test]
fn regression_a_scale_down_leaves_a_gang_that_fits_waiting() {
    let service = JobSpec {
        service: true,
        instances: 2,
        gang: true,
        elastic_min: 0,
        max_running: 2,
        ..one_task_in_root(0)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(service), // a gang of 2, at most 2 running
            Op::Cycle,
            Op::KillTask(0, 0), // j0/1 runs on alone
            Op::ConfirmKills,
            Op::ScaleJob(0, 3), // 4: the gang {2, 3} does not fit beside j0/1
            Op::ScaleJob(0, 2), // 3: {2} fits, and waits for ever
        ],
    };
    Driver::run(&s);
}

/// Regression, a safety one (found by this model, fixed: the stopping run
/// is stored apart from the current one, and an instance scaled away keeps
/// a row while its run is stopping): a scale-down holds the
/// removed instance's run until its host confirms the end, but only in
/// memory: the instance's task row is deleted (`RowKey::TaskDeleted`), so
/// a restarted server forgets the held run. Scaling the job back up then
/// starts the instance again at once; the agent's old run is killed when
/// it registers, but not held, so both runs live until the kill is
/// confirmed. Fails with: "j0/1 runs twice: on h0 and h0". (The same hole
/// by another door: `regression_an_instance_scaled_back_before_a_crash_runs_twice`.)
#[test]
fn regression_an_instance_scaled_away_and_back_runs_twice_after_a_crash() {
    let batch = JobSpec {
        instances: 2,
        ..one_task_in_root(0)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(batch),
            Op::Cycle,          // j0/0 and j0/1 run on h0
            Op::ScaleJob(0, 0), // 1 instance: j0/1 is told to stop, held
            Op::Crash,          // the hold is not in the store
            Op::ScaleJob(0, 1), // 2 instances: j0/1 is queued at once
            Op::Register(0),    // h0 lists the old j0/1: killed, not held
            Op::Cycle,          // the new j0/1 starts beside the old one
        ],
    };
    Driver::run(&s);
}

/// Found by this model (pinned scenarios), fixed with
/// `HostArena::hand_over`: a revocable stateful instance stayed PLACING
/// forever on its volume's host. The host had the instance's place
/// reserved, no free cpu, and cpu that revocable tasks borrowed; handing
/// the reservation back to its instance went through the path that frees
/// resources, which repays loans first, so the instance did not fit its
/// own reservation. Fails with a liveness error: the instance never runs.
#[test]
fn regression_a_revocable_instance_fits_its_own_reservation_on_a_lending_host() {
    use Op::*;
    let s = Scenario {
        n_hosts: 3,
        ops: vec![
            CreateDaemonJob(one_task_in_root(0), 2),
            AddHost(0),
            AddHost(0),
            LoseHost {
                host: 25,
                dies: false,
            },
            AddHost(0),
            CreateDaemonJob(
                JobSpec {
                    big: true,
                    priority: 1,
                    ..one_task_in_root(0)
                },
                0,
            ),
            RestartTask(187, 158),
            LoseHost {
                host: 5,
                dies: false,
            },
            LoseHost {
                host: 37,
                dies: false,
            },
            CreateStatefulJob(
                JobSpec {
                    instances: 2,
                    max_running: 2,
                    ..one_task_in_root(0)
                },
                0,
            ),
            CreateStatefulJob(
                JobSpec {
                    instances: 3,
                    big: true,
                    revocable: true,
                    ..one_task_in_root(0)
                },
                0,
            ),
            Cycle,
            CreateStatefulJob(
                JobSpec {
                    service: true,
                    revocable: true,
                    ..one_task_in_root(0)
                },
                0,
            ),
            CreateStatefulJob(one_task_in_root(0), 0),
            RestartJob(81),
            Exit { run: 8, outcome: 0 },
            Tick(0),
            ConfirmKill(215),
            Cycle,
        ],
    };
    Driver::run(&s);
}

/// Replays one fuzz input named by `PELOTON_LIFECYCLE_INPUT` (a crash
/// artifact, say), printing its scenario first; with `PELOTON_SIM_LOG=1`
/// a failure ends with the log of every step. Does nothing without it.
#[test]
fn replay_the_input_named_by_the_environment() {
    let Some(path) = std::env::var_os("PELOTON_LIFECYCLE_INPUT") else {
        return;
    };
    let data = std::fs::read(&path).expect("read the input");
    let scenario = Scenario::decode(&data);
    eprintln!("{scenario:#?}");
    Driver::run(&scenario);
}

/// Regression, the same hole as the one above by another door (found by
/// the fuzz target, fixed the same way): the instance is scaled away and added back *before* the
/// crash, while its old run is still held. Its task row then has
/// `stopping: true` but describes the new run (never launched: launch 0),
/// and recovery keeps a hold only for a stored launch, so the old run is
/// forgotten and the new one starts beside it. Fails with: "j0/1 runs
/// twice: on h0 and h0".
#[test]
fn regression_an_instance_scaled_back_before_a_crash_runs_twice() {
    let batch = JobSpec {
        instances: 2,
        ..one_task_in_root(0)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(batch),
            Op::Cycle,          // j0/0 and j0/1 run on h0
            Op::ScaleJob(0, 0), // 1 instance: j0/1 is told to stop, held
            Op::ScaleJob(0, 1), // 2 instances: the new j0/1 waits for the hold
            Op::Crash,          // the row of j0/1 names the new run: hold lost
            Op::Register(0),    // h0 lists the old j0/1: killed, not held
            Op::Register(1),
            Op::Cycle, // the new j0/1 starts beside the old one
        ],
    };
    Driver::run(&s);
}

/// Runs a scenario without forgiving the known bug of updates restarting
/// instances killed by request.
fn run_unforgiving(s: &Scenario) {
    let mut d = Driver::new(s.n_hosts);
    d.forgive_known_bugs = false;
    for op in &s.ops {
        d.apply(op);
    }
    d.quiesce();
    d.check_final();
}

/// Found by this model once it drove updates; not fixed (the model
/// forgives it: `JobModel::kill_pending`). A service's only instance
/// runs; a paused update is created; the user kills the instance (its run
/// is told to stop, held until the agent confirms); the quiesce phase
/// resumes the update before confirming kills. `advance` counts an
/// instance as stopped by its user only once it is `Killed` and no longer
/// held, so it moves this one (`move_instance`): once the kill is
/// confirmed a new run starts on the new spec, and the instance the user
/// killed runs again. (The same happens when a rolling batch reaches an
/// instance whose kill is still unconfirmed.) Fails with: "instance 0 of
/// j0 … left: Running, right: Killed".
#[test]
fn regression_an_update_restarts_an_instance_killed_by_its_user() {
    let service = JobSpec {
        service: true,
        ..one_task_in_root(0)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(service),
            Op::Cycle,
            Op::UpdateJob(0, 108),
            Op::KillTask(0, 0),
        ],
    };
    run_unforgiving(&s);
}

/// Found by this model once it drove updates; not fixed (the model
/// forgives it, as the one above). A service's only instance waits for
/// room (no cycle runs) and is in the batch of update u0; a paused update
/// u1 takes the batch over; the user kills the instance (it ends at once:
/// it never ran); a new update u2 replaces u1 and takes over its batch:
/// `retarget` moves every instance of it, also the one the user stopped,
/// and it starts again (`move_instance` on a KILLED instance starts a new
/// run). A rollback (`start_rollback`) takes a batch over the same way.
/// Fails with: "instance 0 of j0 … left: Running, right: Killed".
#[test]
fn regression_a_replacing_update_restarts_an_instance_killed_by_its_user() {
    let service = JobSpec {
        service: true,
        ..one_task_in_root(0)
    };
    let s = Scenario {
        n_hosts: 2,
        ops: vec![
            Op::CreateJob(service),
            Op::UpdateJob(0, 0),   // u0: cpu +100, batch 1: j0/0 in its batch
            Op::UpdateJob(0, 108), // u1, paused, takes the batch over
            Op::KillTask(0, 0),    // j0/0 killed at once (it never ran)
            Op::UpdateJob(0, 0),   // u2 takes the batch over: j0/0 starts
        ],
    };
    run_unforgiving(&s);
}

/// Found by this model once it drove updates; not fixed (the model does
/// not update a job whose pool is no longer a leaf). A service's only
/// instance is killed by request, so the job ends (KILLED) and its pool
/// "/" may get a child pool; an update to two instances is then accepted
/// (`create_update` does not check, as restarts and scale-ups do, that
/// the job's pool is still a leaf), and its new instance can never be
/// queued: the job stays INITIALIZED. (An update moving a running
/// instance there strands it the same way.) Fails with: "1 instances
/// wait with room under max_running: j0 … waiting=[1]"; asked by hand
/// (the driver steers around it) it fails with "the update's new instance
/// runs … 1#1 Initialized".
#[test]
fn regression_an_update_is_accepted_when_the_pool_became_inner() {
    let service = JobSpec {
        service: true,
        ..one_task_in_root(0)
    };
    let mut d = Driver::new(2);
    d.apply(&Op::CreateJob(service));
    d.apply(&Op::KillTask(0, 0)); // the job ends: KILLED
    d.apply(&Op::CreatePool(0)); // "/a": "/" is no longer a leaf
    // (The driver no longer asks for this update: it is asked here.)
    let k = d.sim.core.job_key("j0").expect("j0");
    let mut plan = d.sim.core.job(k).expect("j0").plan.clone();
    plan.instance_count = 2;
    let r = d.sim.step(Input::UpdateJob(Box::new(UpdateRequest {
        job_id: "j0".into(),
        version: 0,
        id: "u0".into(),
        plan,
        spec: UpdateSpec {
            batch_size: 1,
            ..UpdateSpec::default()
        },
    })));
    // Either refused, or its new instance runs once room is there.
    if r.is_ok() {
        d.quiesce();
        let job = d.sim.core.job(k).expect("j0");
        assert_eq!(
            job.tasks[1].state,
            TaskState::Running,
            "the update's new instance runs\n{}",
            d.describe()
        );
    }
}
