//! Preemption: inter-pool victims (revocable first, lowest priority, most
//! recently started, just enough) and intra-pool eviction that makes a host
//! fit a higher-priority task.

use expect_test::expect;
use peloton_engine::constraint::ConstraintTable;
use peloton_engine::host::{HostArena, HostLimits, HostSpec};
use peloton_engine::placement::{PlacementConfig, PlacementResult, Placer};
use peloton_engine::preemption::{Victim, inter_pool_victims, intra_pool_victims};
use peloton_engine::task::{NO_GANG, TaskArena, TaskHandle, TaskSpec, TaskState, flags};
use peloton_engine::testkit::Rng;
use peloton_engine::{
    AdmissionResult, PendingTask, PoolConfig, ResourceManager, ResourceManagerConfig, Resources,
    TaskFlags, TaskId,
};
use proptest::prelude::*;

fn cpu(millis: u64) -> Resources {
    Resources::new(millis, 0, 0, 0)
}

/// Queues and admits tasks through the resource manager and mirrors them as
/// placed tasks in the arena (host slot 0; inter-pool preemption does not
/// look at hosts).
struct World {
    rm: ResourceManager,
    tasks: TaskArena,
    out: AdmissionResult,
    clock: u64,
}

impl World {
    fn new() -> Self {
        World {
            rm: ResourceManager::new(ResourceManagerConfig::default()),
            tasks: TaskArena::new(100_000),
            out: AdmissionResult::default(),
            clock: 0,
        }
    }

    fn run(
        &mut self,
        pool: &str,
        priority: u32,
        task_flags: TaskFlags,
        millis: u64,
        capacity: u64,
        slack: u64,
    ) -> TaskHandle {
        self.try_run(pool, priority, task_flags, millis, capacity, slack)
            .expect("admitted")
    }

    /// Queues one task, runs a cycle, and mirrors it as placed if admitted;
    /// otherwise withdraws it.
    fn try_run(
        &mut self,
        pool: &str,
        priority: u32,
        task_flags: TaskFlags,
        millis: u64,
        capacity: u64,
        slack: u64,
    ) -> Option<TaskHandle> {
        let pool_id = self.rm.tree().lookup(pool).unwrap();
        let mut bits = 0;
        if task_flags.preemptible {
            bits |= flags::PREEMPTIBLE;
        }
        if task_flags.revocable {
            bits |= flags::REVOCABLE;
        }
        let spec = TaskSpec {
            pool: pool_id.idx() as u32,
            priority,
            request: cpu(millis),
            flags: bits,
            gang: NO_GANG,
            ..Default::default()
        };
        let handle = self.tasks.add(&spec).unwrap();
        let task = PendingTask {
            id: TaskId(handle.to_u64()),
            request: cpu(millis),
            runtime_ms: 0,
        };
        let pending = self
            .rm
            .enqueue(pool_id, priority, task_flags, &[task])
            .unwrap();
        self.rm.recompute_entitlement(cpu(capacity), cpu(slack));
        self.rm.admit(&mut self.out);
        if self.out.admitted.is_empty() {
            self.rm.cancel(pending).unwrap();
            self.tasks.remove(handle).unwrap();
            return None;
        }
        assert_eq!(self.out.admitted.len(), 1);
        self.clock += 1;
        self.tasks
            .set_placed(handle, 0, Default::default(), self.clock)
            .unwrap();
        Some(handle)
    }

    fn victims(&self) -> Vec<Victim> {
        let mut v = Vec::new();
        inter_pool_victims(&self.rm, &self.tasks, &mut v);
        v
    }

    fn describe(&self, victims: &[Victim]) -> String {
        victims
            .iter()
            .map(|v| {
                let spec = self.tasks.spec(v.task).unwrap();
                format!(
                    "prio={} cpu={} started={}: {}\n",
                    spec.priority,
                    spec.request[peloton_engine::Dim::Cpu],
                    self.tasks
                        .placed_views()
                        .find(|p| p.task == v.task)
                        .unwrap()
                        .start_ms,
                    v.reason
                )
            })
            .collect()
    }
}

const NORMAL: TaskFlags = TaskFlags {
    preemptible: true,
    controller: false,
    revocable: false,
};
const PINNED: TaskFlags = TaskFlags {
    preemptible: false,
    controller: false,
    revocable: false,
};
const REVOCABLE: TaskFlags = TaskFlags {
    preemptible: true,
    controller: false,
    revocable: true,
};

#[test]
fn the_borrower_gives_back_revocable_first_then_lowest_priority_most_recent() {
    let mut w = World::new();
    w.rm.create_pool("/owner", PoolConfig::default().with_reservation(cpu(6000)))
        .unwrap();
    w.rm.create_pool(
        "/borrower",
        PoolConfig::default().with_reservation(cpu(2000)),
    )
    .unwrap();
    // The owner is idle: the borrower takes the whole cluster, plus slack.
    w.run("/borrower", 1, PINNED, 2000, 10_000, 1000);
    for priority in [3, 1, 1, 2] {
        w.run("/borrower", priority, NORMAL, 2000, 10_000, 1000);
    }
    w.run("/borrower", 0, REVOCABLE, 1000, 10_000, 1000);
    assert!(w.victims().is_empty(), "within entitlement: no victims");
    // The owner's demand returns and the slack is gone.
    let owner = w.rm.tree().lookup("/owner").unwrap();
    w.rm.enqueue(
        owner,
        0,
        NORMAL,
        &[PendingTask {
            id: TaskId(u64::MAX),
            request: cpu(6000),
            runtime_ms: 0,
        }],
    )
    .unwrap();
    w.rm.recompute_entitlement(cpu(10_000), cpu(0));
    let victims = w.victims();
    // 6000 over: the revocable task (slack), then the two priority-1 tasks,
    // most recently started first, then priority 2. The pinned one stays.
    expect![[r#"
        prio=0 cpu=1000 started=6: slack reclaimed in cpu: 1000 held by revocable tasks, 0 entitled
        prio=1 cpu=2000 started=4: pool over its entitlement in cpu: 10000 held, 4000 entitled
        prio=1 cpu=2000 started=3: pool over its entitlement in cpu: 10000 held, 4000 entitled
        prio=2 cpu=2000 started=5: pool over its entitlement in cpu: 10000 held, 4000 entitled
    "#]]
    .assert_eq(&w.describe(&victims));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random pools and tasks, then a capacity cut: victims are preemptible,
    /// come only from pools over an entitlement, free at least the overage
    /// where preemptible tasks allow, and less than one task more.
    #[test]
    fn victims_free_what_is_needed_and_little_more(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut w = World::new();
        let pools = ["/a", "/b", "/c"];
        for p in pools {
            w.rm.create_pool(p, PoolConfig::default().with_reservation(cpu(rng.range(0, 3000)))).unwrap();
        }
        let capacity = 100_000;
        for _ in 0..rng.range(5, 60) {
            let pool = pools[rng.below(3) as usize];
            let f = [NORMAL, NORMAL, PINNED, REVOCABLE][rng.below(4) as usize];
            let _ = w.try_run(pool, rng.below(5) as u32, f, rng.range(1, 20) * 100, capacity, capacity);
        }
        let cut = rng.range(0, 20_000);
        w.rm.recompute_entitlement(cpu(cut), cpu(rng.range(0, 2000)));
        let victims = w.victims();
        let ent = w.rm.entitlements();
        let mut freed: std::collections::HashMap<(u32, bool), u64> = Default::default();
        let mut largest: std::collections::HashMap<(u32, bool), u64> = Default::default();
        for v in &victims {
            let spec = w.tasks.spec(v.task).unwrap();
            prop_assert!(spec.flags & flags::PREEMPTIBLE != 0, "never non-preemptible");
            let revocable = spec.flags & flags::REVOCABLE != 0;
            *freed.entry((v.pool, revocable)).or_default() += spec.request.0[0];
            let l = largest.entry((v.pool, revocable)).or_default();
            *l = (*l).max(spec.request.0[0]);
        }
        for p in pools {
            let id = w.rm.tree().lookup(p).unwrap();
            let slot = id.idx() as u32;
            let usage = w.rm.usage(id).unwrap();
            for revocable in [false, true] {
                let (held, cap) = if revocable {
                    (usage.allocation.revocable.0[0], ent.slack_entitlement(id.idx()).0[0])
                } else {
                    (usage.allocation.total.0[0], ent.entitlement(id.idx()).0[0])
                };
                let need = held.saturating_sub(cap);
                let got = freed.get(&(slot, revocable)).copied().unwrap_or(0);
                // Preemptible tasks of that kind the pool could give.
                let available: u64 = w.tasks.placed_views()
                    .filter(|t| t.pool == slot && t.flags & flags::PREEMPTIBLE != 0 && (t.flags & flags::REVOCABLE != 0) == revocable)
                    .map(|t| t.request.0[0]).sum();
                prop_assert!(got >= need.min(available), "{p} revocable={revocable}: freed {got} of {need}");
                if need == 0 {
                    prop_assert_eq!(got, 0, "{} within its entitlement gives nothing", p);
                } else {
                    let one_task = largest.get(&(slot, revocable)).copied().unwrap_or(0);
                    prop_assert!(got < need + one_task.max(1), "{p}: freed {got} for {need}, more than one task extra");
                }
            }
        }
    }
}

#[test]
fn a_higher_priority_task_evicts_only_where_it_then_fits() {
    let mut hosts = HostArena::new(HostLimits::default());
    for (name, cores) in [("h1", 8u64), ("h2", 8)] {
        hosts
            .add(&HostSpec {
                name: name.into(),
                capacity: Resources::new(cores * 1000, 32 * 1024, 0, 0),
                ..Default::default()
            })
            .unwrap();
    }
    let constraints = ConstraintTable::new();
    let mut tasks = TaskArena::new(1000);
    let mut placer = Placer::new(PlacementConfig::default());
    let spec = |pool: u32, priority: u32, cores: u64, preemptible: bool| TaskSpec {
        pool,
        priority,
        request: Resources::new(cores * 1000, 1024, 0, 0),
        flags: if preemptible { flags::PREEMPTIBLE } else { 0 },
        gang: NO_GANG,
        strategy: peloton_engine::task::Strategy::FirstFit,
        ..Default::default()
    };
    // h1: pool 1 low-priority 3+3 cores and pinned 2; h2: pool 2's 6 cores and pool 1's 2.
    let mut batch = Vec::new();
    for s in [
        spec(1, 1, 3, true),
        spec(1, 2, 3, true),
        spec(1, 1, 2, false),
    ] {
        batch.push(tasks.add(&s).unwrap());
    }
    let mut out = PlacementResult::default();
    placer
        .place(&mut hosts, &mut tasks, &constraints, &batch, 1, &mut out)
        .unwrap();
    let mut batch2 = Vec::new();
    for s in [spec(2, 0, 6, true), spec(1, 0, 2, true)] {
        batch2.push(tasks.add(&s).unwrap());
    }
    placer
        .place(&mut hosts, &mut tasks, &constraints, &batch2, 2, &mut out)
        .unwrap();
    assert_eq!(out.placed.len(), 2);
    // A 5-core priority-5 task of pool 1 fits nowhere.
    let urgent = tasks.add(&spec(1, 5, 5, true)).unwrap();
    tasks.set_state(urgent, TaskState::Admitted).unwrap();
    placer
        .place(&mut hosts, &mut tasks, &constraints, &[urgent], 3, &mut out)
        .unwrap();
    assert_eq!(out.unplaced.len(), 1);
    let mut plans = Vec::new();
    intra_pool_victims(&placer, &hosts, &tasks, &constraints, &[urgent], &mut plans).unwrap();
    // h2 holds only 2 cores of pool 1 (not enough); on h1 evicting the
    // priority-1 three-core task frees 3 + 0 free... 8 - 8 = 0 free, so it
    // takes both preemptible tasks there (6 cores) to fit 5.
    assert_eq!(plans.len(), 1);
    let (task, host, victims) = &plans[0];
    assert_eq!((*task, *host), (urgent, 0));
    let victim_specs: Vec<(u32, u32)> = victims
        .iter()
        .map(|v| {
            let s = tasks.spec(v.task).unwrap();
            (s.priority, (s.request.0[0] / 1000) as u32)
        })
        .collect();
    assert_eq!(victim_specs, vec![(1, 3), (2, 3)]);
    // Acting on the plan really makes room.
    for v in victims {
        placer.unplace(&mut hosts, &mut tasks, v.task).unwrap();
    }
    placer
        .place(&mut hosts, &mut tasks, &constraints, &[urgent], 4, &mut out)
        .unwrap();
    assert_eq!(out.placed.len(), 1);
    assert_eq!(out.placed[0].host, 0);
    // Nothing lower-priority of its pool left to evict for another one.
    let again = tasks.add(&spec(1, 9, 8, true)).unwrap();
    plans.clear();
    intra_pool_victims(&placer, &hosts, &tasks, &constraints, &[again], &mut plans).unwrap();
    assert!(
        plans.is_empty(),
        "no eviction that does not make a host fit: {plans:?}"
    );
}

/// Among victims of equal priority, the one that loses the least work goes:
/// its last checkpoint (else its start) is the latest. Without checkpoints
/// that is the most recently started one, as before.
#[test]
fn equal_priority_victims_that_checkpointed_lose_least_and_go_first() {
    let mut w = World::new();
    w.rm.create_pool("/owner", PoolConfig::default().with_reservation(cpu(4000)))
        .unwrap();
    w.rm.create_pool("/borrower", PoolConfig::default())
        .unwrap();
    // Started at 1, 2 and 3; the first checkpoints at 10, after all started.
    let first = w.run("/borrower", 1, NORMAL, 2000, 6000, 0);
    let _second = w.run("/borrower", 1, NORMAL, 2000, 6000, 0);
    let _third = w.run("/borrower", 1, NORMAL, 2000, 6000, 0);
    w.tasks.set_checkpoint(first, 10).unwrap();
    // An older checkpoint report changes nothing.
    w.tasks.set_checkpoint(first, 5).unwrap();
    let owner = w.rm.tree().lookup("/owner").unwrap();
    w.rm.enqueue(
        owner,
        0,
        NORMAL,
        &[PendingTask {
            id: TaskId(u64::MAX),
            request: cpu(4000),
            runtime_ms: 0,
        }],
    )
    .unwrap();
    w.rm.recompute_entitlement(cpu(6000), cpu(0));
    let victims = w.victims();
    assert_eq!(victims[0].task, first, "the checkpointed task goes first");
    // 4000 over: the checkpointed one, then the most recently started.
    expect![[r#"
        prio=1 cpu=2000 started=1: pool over its entitlement in cpu: 6000 held, 2000 entitled
        prio=1 cpu=2000 started=3: pool over its entitlement in cpu: 6000 held, 2000 entitled
    "#]]
    .assert_eq(&w.describe(&victims));
}

/// An eviction that needs one victim of the same priority on either of two
/// hosts takes the one that checkpointed last, whatever its host's slot.
#[test]
fn an_eviction_takes_the_equal_victim_that_checkpointed_last() {
    let mut hosts = HostArena::new(HostLimits::default());
    for name in ["h1", "h2"] {
        hosts
            .add(&HostSpec {
                name: name.into(),
                capacity: Resources::new(4000, 8 * 1024, 0, 0),
                ..Default::default()
            })
            .unwrap();
    }
    let constraints = ConstraintTable::new();
    let mut tasks = TaskArena::new(100);
    let mut placer = Placer::new(PlacementConfig::default());
    let spec = |priority: u32| TaskSpec {
        pool: 1,
        priority,
        request: Resources::new(4000, 1024, 0, 0),
        flags: flags::PREEMPTIBLE,
        gang: NO_GANG,
        strategy: peloton_engine::task::Strategy::FirstFit,
        ..Default::default()
    };
    let mut out = PlacementResult::default();
    let on_h1 = tasks.add(&spec(1)).unwrap();
    placer
        .place(&mut hosts, &mut tasks, &constraints, &[on_h1], 1, &mut out)
        .unwrap();
    let on_h2 = tasks.add(&spec(1)).unwrap();
    placer
        .place(&mut hosts, &mut tasks, &constraints, &[on_h2], 2, &mut out)
        .unwrap();
    assert_eq!(tasks.host(on_h2).unwrap(), Some(1));
    let urgent = tasks.add(&spec(5)).unwrap();
    tasks.set_state(urgent, TaskState::Admitted).unwrap();
    let victim = |tasks: &TaskArena| {
        let mut plans = Vec::new();
        intra_pool_victims(&placer, &hosts, tasks, &constraints, &[urgent], &mut plans).unwrap();
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].2.len(), 1);
        plans[0].2[0].task
    };
    // Without checkpoints: the most recently started (h2's).
    assert_eq!(victim(&tasks), on_h2);
    // h1's task checkpointed after h2's started: it loses less.
    tasks.set_checkpoint(on_h1, 3).unwrap();
    assert_eq!(victim(&tasks), on_h1);
}
