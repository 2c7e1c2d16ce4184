//! Placement: examples with reasons, gangs, and a brute-force reference
//! placer that every strategy must agree with exactly.

use std::collections::HashMap;

use expect_test::{Expect, expect};
use peloton_engine::constraint::ConstraintTable;
use peloton_engine::host::{
    EXCLUSIVE_KEY, GpuGrant, HostArena, HostLimits, HostSpec, HostState, Misfit,
};
use peloton_engine::placement::{
    Check, PlacementConfig, PlacementResult, Placer, check_host_accounting, pack_score,
};
use peloton_engine::task::{NO_GANG, Strategy, TaskArena, TaskHandle, TaskSpec, flags};
use peloton_engine::testkit::{Rng, host_spec};
use peloton_engine::{Dim, Resources};
use proptest::prelude::*;

struct Env {
    hosts: HostArena,
    tasks: TaskArena,
    constraints: ConstraintTable,
    placer: Placer,
    names: Vec<String>,
}

impl Env {
    fn new() -> Self {
        Env {
            hosts: HostArena::new(HostLimits::default()),
            tasks: TaskArena::new(1_000_000),
            constraints: ConstraintTable::new(),
            placer: Placer::new(PlacementConfig::default()),
            names: Vec::new(),
        }
    }

    /// `NAME cpu=N mem=N gpus=N key=value…`
    fn host(&mut self, line: &str) {
        let spec = HostSpec {
            ports: 100,
            ..host_spec(line)
        };
        self.hosts.add(&spec).unwrap();
    }

    /// `N x cpu=N mem=N gpu=MILLI strategy=… constraint="…" job=N max_per_host=N gang=N`
    fn tasks(&mut self, line: &str) -> Vec<TaskHandle> {
        let (count, rest) = line.split_once(" x ").unwrap();
        let (rest, constraint) = match rest.split_once("constraint=\"") {
            Some((a, b)) => (a.to_owned(), b.trim_end_matches('"').to_owned()),
            None => (rest.to_owned(), String::new()),
        };
        let mut spec = TaskSpec {
            gang: NO_GANG,
            ..Default::default()
        };
        spec.constraint = self
            .constraints
            .intern(&constraint, self.hosts.interner_mut())
            .unwrap();
        for word in rest.split_whitespace() {
            let (k, v) = word.split_once('=').unwrap();
            match k {
                "cpu" => spec.request[Dim::Cpu] = v.parse::<u64>().unwrap() * 1000,
                "mem" => spec.request[Dim::Memory] = v.parse::<u64>().unwrap() * 1024,
                "gpu" => spec.request[Dim::Gpu] = v.parse().unwrap(),
                "job" => {
                    spec.job = v.parse().unwrap();
                    spec.limit_key = spec.job;
                }
                "max_per_host" => spec.max_per_host = v.parse().unwrap(),
                "label" => spec.limit_key = v.parse().unwrap(),
                "gang" => spec.gang = v.parse().unwrap(),
                "strategy" => {
                    spec.strategy = match v {
                        "pack" => Strategy::Pack,
                        "spread" => Strategy::Spread,
                        _ => Strategy::FirstFit,
                    }
                }
                other => panic!("unknown key {other}"),
            }
        }
        (0..count.parse::<u32>().unwrap())
            .map(|i| {
                spec.instance = i;
                let t = self.tasks.add(&spec).unwrap();
                self.names.push(format!(
                    "{}#{i}",
                    line.split_whitespace().nth(2).unwrap_or("t")
                ));
                t
            })
            .collect()
    }

    fn place(&mut self, batch: &[TaskHandle]) -> String {
        let mut out = PlacementResult::default();
        self.placer
            .place(
                &mut self.hosts,
                &mut self.tasks,
                &self.constraints,
                batch,
                0,
                &mut out,
            )
            .unwrap();
        check_invariants(&self.hosts, &self.tasks);
        let mut per_host: std::collections::BTreeMap<String, usize> = Default::default();
        for p in &out.placed {
            let name = self
                .hosts
                .name(self.hosts.lookup_slot(p.host as usize).unwrap())
                .to_owned();
            *per_host.entry(name).or_default() += 1;
        }
        let mut report = String::new();
        for (host, n) in per_host {
            report.push_str(&format!("{host}: {n} task(s)\n"));
        }
        let mut reasons: Vec<String> = out
            .unplaced
            .iter()
            .map(|u| out.reason_of(u).describe(&self.hosts, &self.constraints))
            .collect();
        reasons.dedup();
        for r in reasons {
            report.push_str(&format!("unplaced: {r}\n"));
        }
        report
    }

    fn check(&mut self, batch: &[TaskHandle], expected: Expect) {
        let report = self.place(batch);
        expected.assert_eq(&report);
    }
}

/// Every host's free resources plus what its tasks hold equal its capacity.
fn check_invariants(hosts: &HostArena, tasks: &TaskArena) {
    hosts.check_invariants();
    tasks.check_invariants();
    check_host_accounting(hosts, tasks);
}

#[test]
fn pack_fills_the_tightest_hosts_and_spread_balances() {
    let mut env = Env::new();
    for line in ["a cpu=8 mem=32", "b cpu=16 mem=64", "c cpu=4 mem=16"] {
        env.host(line);
    }
    let packed = env.tasks("5 x cpu=2 mem=4 strategy=pack");
    // The smallest host fits tightest: c takes 2, then a takes 3.
    env.check(
        &packed,
        expect![[r#"
        a: 3 task(s)
        c: 2 task(s)
    "#]],
    );
    let mut env = Env::new();
    for line in ["a cpu=8 mem=32", "b cpu=16 mem=64", "c cpu=4 mem=16"] {
        env.host(line);
    }
    // Least allocated fraction first: b, the largest, ends up with most.
    let spread = env.tasks("6 x cpu=2 mem=4 strategy=spread");
    env.check(
        &spread,
        expect![[r#"
        a: 2 task(s)
        b: 3 task(s)
        c: 1 task(s)
    "#]],
    );
}

#[test]
fn constraints_limits_exclusive_and_gpu_hosts_with_reasons() {
    let mut env = Env::new();
    for line in [
        "h1 cpu=8 mem=32 zone=a",
        "h2 cpu=8 mem=32 zone=a",
        "h3 cpu=8 mem=32 zone=b",
        "h4 cpu=32 mem=128 zone=b exclusive=ml",
        "g1 cpu=32 mem=128 zone=b gpus=8",
    ] {
        env.host(line);
    }
    // At most one instance per host, zone a only: 2 of 3 placed.
    let spread = env
        .tasks("3 x cpu=1 mem=1 job=7 max_per_host=1 strategy=first_fit constraint=\"zone == a\"");
    env.check(
        &spread,
        expect![[r#"
        h1: 1 task(s)
        h2: 1 task(s)
        unplaced: 0/5 hosts: 3 constraint zone==a not met, 2 per-host instance limit reached
    "#]],
    );
    // Too big for ordinary hosts; the exclusive and GPU hosts are not theirs.
    let big = env.tasks("1 x cpu=16 mem=8");
    env.check(&big, expect![[r#"
        unplaced: 0/5 hosts: 3 insufficient cpu, 1 exclusive to other work, 1 GPU hosts kept for GPU tasks
    "#]]);
    // Naming the exclusive key opens the exclusive host.
    let ml = env.tasks("1 x cpu=16 mem=8 constraint=\"exclusive == ml\"");
    env.check(
        &ml,
        expect![[r#"
        h4: 1 task(s)
    "#]],
    );
    // Fractional GPUs share a device (4 halves on 2 devices); whole GPUs take
    // whole devices (3 x 2): all 8 devices are used.
    let gpu = env.tasks("4 x cpu=1 mem=1 gpu=500");
    let whole = env.tasks("3 x cpu=1 mem=1 gpu=2000");
    let mut batch = gpu;
    batch.extend(&whole);
    env.check(
        &batch,
        expect![[r#"
        g1: 7 task(s)
    "#]],
    );
    assert_eq!(
        env.hosts.gpu_free(env.hosts.lookup("g1").unwrap().idx()),
        &[0; 8]
    );
    let two = env.tasks("1 x cpu=1 mem=1 gpu=2000");
    env.check(
        &two,
        expect![[r#"
        unplaced: 0/5 hosts: 4 insufficient gpu, 1 exclusive to other work
    "#]],
    );
}

#[test]
fn a_per_host_limit_can_count_a_label_across_jobs() {
    let mut env = Env::new();
    for line in ["a cpu=8 mem=32", "b cpu=8 mem=32", "c cpu=8 mem=32"] {
        env.host(line);
    }
    // Two jobs share label 77, at most one per host: 3 of 4 placed.
    let mut batch = env.tasks("2 x cpu=1 mem=1 job=1 label=77 max_per_host=1");
    batch.extend(env.tasks("2 x cpu=1 mem=1 job=2 label=77 max_per_host=1"));
    env.check(
        &batch,
        expect![[r#"
        a: 1 task(s)
        b: 1 task(s)
        c: 1 task(s)
        unplaced: 0/3 hosts: 3 per-host instance limit reached
    "#]],
    );
}

#[test]
fn gangs_are_placed_whole_or_not_at_all() {
    let mut env = Env::new();
    env.host("a cpu=8 mem=32");
    env.host("b cpu=8 mem=32");
    let gang = env.tasks("3 x cpu=6 mem=1 gang=1");
    let free_before: Vec<Resources> = (0..2).map(|s| env.hosts.free(s)).collect();
    env.check(&gang, expect![[r#"
        unplaced: gang of 3 could not be placed whole; for its first unplaceable member: 0/2 hosts: 2 insufficient cpu
    "#]]);
    let free_after: Vec<Resources> = (0..2).map(|s| env.hosts.free(s)).collect();
    assert_eq!(free_before, free_after, "nothing stays reserved");
    let fits = env.tasks("2 x cpu=6 mem=1 gang=2");
    env.check(
        &fits,
        expect![[r#"
        a: 1 task(s)
        b: 1 task(s)
    "#]],
    );
}

#[test]
fn unplacing_frees_the_host_and_bad_batches_change_nothing() {
    let mut env = Env::new();
    env.host("a cpu=4 mem=8");
    let t = env.tasks("2 x cpu=2 mem=1 job=3 max_per_host=2");
    env.place(&t);
    assert_eq!(env.hosts.free(0)[Dim::Cpu], 0);
    assert_eq!(env.placer.instances_on_host(3, 0), 2);
    let mut out = PlacementResult::default();
    // Already placed: refused, nothing changes.
    let err = env.placer.place(
        &mut env.hosts,
        &mut env.tasks,
        &env.constraints,
        &t,
        0,
        &mut out,
    );
    assert!(err.is_err());
    env.placer
        .unplace(&mut env.hosts, &mut env.tasks, t[0])
        .unwrap();
    assert_eq!(env.hosts.free(0)[Dim::Cpu], 2000);
    assert_eq!(env.placer.instances_on_host(3, 0), 1);
    check_invariants(&env.hosts, &env.tasks);
    // The same task twice in one batch is refused.
    assert!(
        env.placer
            .place(
                &mut env.hosts,
                &mut env.tasks,
                &env.constraints,
                &[t[0], t[0]],
                0,
                &mut out
            )
            .is_err()
    );
    env.placer
        .place(
            &mut env.hosts,
            &mut env.tasks,
            &env.constraints,
            &[t[0]],
            0,
            &mut out,
        )
        .unwrap();
    assert_eq!(out.placed.len(), 1);
    check_invariants(&env.hosts, &env.tasks);
}

// ---------------------------------------------------------------------------
// The reference: every task against every host, in the documented order.

struct Reference {
    hosts: HostArena,
    per_host: HashMap<(u32, u32), u16>,
    config: PlacementConfig,
}

impl Reference {
    fn eligible(&self, constraints: &ConstraintTable, spec: &TaskSpec, slot: usize) -> bool {
        let Some(id) = self.hosts.lookup_slot(slot) else {
            return false;
        };
        if self.hosts.state(id) != HostState::Up {
            return false;
        }
        let c = constraints.get(spec.constraint).unwrap();
        let attributes = self.hosts.attributes(slot);
        if !c.matches(attributes) {
            return false;
        }
        let exclusive = self.hosts.interner().get(EXCLUSIVE_KEY);
        if let Some(key) = exclusive
            && attributes.iter().any(|(k, _)| *k == key)
            && !c.mentions(key)
        {
            return false;
        }
        if spec.request[Dim::Gpu] == 0
            && self.hosts.capacity(slot)[Dim::Gpu] > 0
            && !self.config.allow_cpu_tasks_on_gpu_hosts
            && spec.flags & flags::MAY_USE_GPU_HOSTS == 0
        {
            return false;
        }
        if spec.max_per_host > 0
            && self
                .per_host
                .get(&(spec.job, slot as u32))
                .copied()
                .unwrap_or(0)
                >= spec.max_per_host
        {
            return false;
        }
        self.hosts
            .fits(slot, &spec.request, u32::from(spec.ports))
            .is_ok()
    }

    fn score(&self, spec: &TaskSpec, slot: usize) -> f64 {
        match spec.strategy {
            Strategy::FirstFit => slot as f64,
            Strategy::Spread => {
                let (cap, free) = (self.hosts.capacity(slot), self.hosts.free(slot));
                Dim::ALL
                    .iter()
                    .filter(|d| cap[**d] > 0)
                    .map(|&d| (cap[d] - free[d]) as f64 / cap[d] as f64)
                    .sum()
            }
            Strategy::Pack => pack_score(&self.hosts, slot, &spec.request, self.config.gpu_aware),
            Strategy::GpuFrag => {
                unreachable!("the reference placer covers pack, spread, first_fit")
            }
        }
    }

    /// Why `spec` finds no host: each live host counted at the first check
    /// it fails, most common first (ties in check order).
    fn reason(&self, constraints: &ConstraintTable, spec: &TaskSpec) -> Vec<(Check, u32)> {
        let mut counts: HashMap<Check, u32> = HashMap::new();
        let c = constraints.get(spec.constraint).unwrap();
        let exclusive = self.hosts.interner().get(EXCLUSIVE_KEY);
        for slot in 0..self.hosts.n_slots() {
            let Some(id) = self.hosts.lookup_slot(slot) else {
                continue;
            };
            let attributes = self.hosts.attributes(slot);
            let check = if self.hosts.state(id) != HostState::Up {
                Check::HostNotUp
            } else if !c.matches(attributes) {
                Check::Constraint
            } else if exclusive
                .is_some_and(|key| attributes.iter().any(|(k, _)| *k == key) && !c.mentions(key))
            {
                Check::Exclusive
            } else if spec.request[Dim::Gpu] == 0
                && self.hosts.capacity(slot)[Dim::Gpu] > 0
                && !self.config.allow_cpu_tasks_on_gpu_hosts
                && spec.flags & flags::MAY_USE_GPU_HOSTS == 0
            {
                Check::GpuHostReserved
            } else if spec.max_per_host > 0
                && self
                    .per_host
                    .get(&(spec.limit_key, slot as u32))
                    .copied()
                    .unwrap_or(0)
                    >= spec.max_per_host
            {
                Check::PerHostLimit
            } else {
                match self.hosts.fits(slot, &spec.request, u32::from(spec.ports)) {
                    Ok(()) => continue,
                    Err(Misfit::Insufficient(d)) => Check::Insufficient(d),
                    Err(Misfit::Ports) => Check::Ports,
                    Err(_) => Check::GpuFragmented,
                }
            };
            *counts.entry(check).or_default() += 1;
        }
        let mut counts: Vec<(Check, u32)> = counts.into_iter().collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        counts
    }

    fn place_one(
        &mut self,
        constraints: &ConstraintTable,
        spec: &TaskSpec,
    ) -> Option<(u32, GpuGrant)> {
        let mut best: Option<(f64, usize)> = None;
        for slot in 0..self.hosts.n_slots() {
            if self.eligible(constraints, spec, slot) {
                let s = self.score(spec, slot);
                if best.is_none_or(|(bs, bslot)| s < bs || (s == bs && slot < bslot)) {
                    best = Some((s, slot));
                }
            }
        }
        let (_, slot) = best?;
        let grant = self
            .hosts
            .allocate(slot, &spec.request, u32::from(spec.ports))
            .unwrap();
        if spec.max_per_host > 0 {
            *self
                .per_host
                .entry((spec.limit_key, slot as u32))
                .or_default() += 1;
        }
        Some((slot as u32, grant))
    }

    fn remove(&mut self, spec: &TaskSpec, slot: u32, grant: GpuGrant) {
        self.hosts
            .release(slot as usize, &spec.request, u32::from(spec.ports), grant);
        if spec.max_per_host > 0 {
            *self.per_host.get_mut(&(spec.limit_key, slot)).unwrap() -= 1;
        }
    }
}

/// A random job's task spec (request, ports, one of `constraints`, one of
/// `strategies`), asking for GPUs and limited to one per host with the
/// chances given.
fn random_job_shape(
    rng: &mut Rng,
    job: u32,
    constraints: &[u32],
    strategies: &[Strategy],
    (gpu_chance, limit_chance): (f64, f64),
) -> TaskSpec {
    let gpu = if rng.chance(gpu_chance) {
        [250, 500, 1000, 2000][rng.below(4) as usize]
    } else {
        0
    };
    TaskSpec {
        job,
        limit_key: job,
        request: Resources::new(rng.range(1, 8) * 500, rng.range(1, 16) * 512, 0, gpu),
        ports: rng.range(0, 2) as u16,
        constraint: constraints[rng.below(constraints.len() as u64) as usize],
        strategy: strategies[rng.below(strategies.len() as u64) as usize],
        max_per_host: if rng.chance(limit_chance) { 1 } else { 0 },
        flags: if rng.chance(0.2) {
            flags::MAY_USE_GPU_HOSTS
        } else {
            0
        },
        gang: NO_GANG,
        ..Default::default()
    }
}

fn random_host(rng: &mut Rng, i: usize) -> HostSpec {
    let gpus = if rng.chance(0.2) {
        rng.range(1, 8) as u8
    } else {
        0
    };
    let mut attributes = vec![(
        "zone".to_owned(),
        ["a", "b", "c"][rng.below(3) as usize].to_owned(),
    )];
    if rng.chance(0.1) {
        attributes.push(("exclusive".to_owned(), "ml".to_owned()));
    }
    HostSpec {
        name: format!("h{i}"),
        capacity: Resources::new(
            rng.range(2, 16) * 1000,
            rng.range(2, 64) * 1024,
            0,
            u64::from(gpus) * 1000,
        ),
        gpu_devices: gpus,
        ports: rng.range(0, 20) as u32,
        attributes,
    }
}

const CONSTRAINTS: [&str; 5] = [
    "",
    "zone == a",
    "zone != c",
    "zone in {a, b}",
    "exclusive == ml || zone == c",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn placement_matches_the_brute_force_reference(
        seed in any::<u64>(),
        n_hosts in 1usize..40,
        n_tasks in 1usize..300,
        gpu_aware in any::<bool>(),
    ) {
        let mut rng = Rng::new(seed);
        // Shapes keep few hosts (as on a cluster of thousands), so they run
        // short, are refreshed from the change log, rebuilt, and passed by
        // full scans; or the default, where they hold every host.
        let shape_prefix_min = [1, 2, 3, 5, 8, 4096][rng.below(6) as usize];
        let config = PlacementConfig { gpu_aware, gpu_frag_for_gpu_tasks: false, shape_prefix_min, ..Default::default() };
        let mut hosts = HostArena::new(HostLimits::default());
        let mut reference = Reference { hosts: HostArena::new(HostLimits::default()), per_host: HashMap::new(), config };
        for i in 0..n_hosts {
            let spec = random_host(&mut rng, i);
            let id = hosts.add(&spec).unwrap();
            reference.hosts.add(&spec).unwrap();
            if rng.chance(0.1) {
                let state = [HostState::Draining, HostState::Down][rng.below(2) as usize];
                hosts.set_state(id, state).unwrap();
                reference.hosts.set_state(id, state).unwrap();
            }
        }
        let mut constraints = ConstraintTable::new();
        let ids: Vec<u32> = CONSTRAINTS.iter().map(|c| constraints.intern(c, hosts.interner_mut()).unwrap()).collect();
        for c in CONSTRAINTS {
            constraints.intern(c, reference.hosts.interner_mut()).unwrap();
        }
        let mut tasks = TaskArena::new(100_000);
        let mut batch = Vec::new();
        let mut specs = Vec::new();
        // A few job shapes, repeated, so classes have many tasks.
        let strategies = [Strategy::Pack, Strategy::Spread, Strategy::FirstFit];
        let shapes: Vec<TaskSpec> = (0..8).map(|job| random_job_shape(&mut rng, job, &ids, &strategies, (0.25, 0.3))).collect();
        for i in 0..n_tasks {
            let mut spec = shapes[rng.below(shapes.len() as u64) as usize];
            spec.instance = i as u32;
            if rng.chance(0.05) {
                spec.gang = rng.below(4) as u32;
            }
            batch.push(tasks.add(&spec).unwrap());
            specs.push(spec);
        }
        // The same batch on a copy of the cluster, with two threads and the
        // parallel paths taken for every batch and class: identical results.
        let mut hosts2 = HostArena::new(HostLimits::default());
        for i in 0..hosts.n_slots() {
            let id = hosts.lookup_slot(i).unwrap();
            let spec = HostSpec {
                name: hosts.name(id).to_owned(),
                capacity: hosts.capacity(i),
                gpu_devices: hosts.gpu_free(i).len() as u8,
                ports: hosts.ports_free(i),
                attributes: hosts.attributes(i).iter()
                    .map(|&(k, v)| (hosts.interner().resolve(k).to_owned(), hosts.interner().resolve(v).to_owned()))
                    .collect(),
            };
            let id2 = hosts2.add(&spec).unwrap();
            hosts2.set_state(id2, hosts.state(id)).unwrap();
        }
        let mut constraints2 = ConstraintTable::new();
        for c in CONSTRAINTS {
            constraints2.intern(c, hosts2.interner_mut()).unwrap();
        }
        let mut tasks2 = TaskArena::new(100_000);
        let batch2: Vec<TaskHandle> = specs.iter().map(|s| tasks2.add(s).unwrap()).collect();
        let mut placer2 = Placer::new(PlacementConfig { parallel_min_candidates: 1, parallel_min_batch: 1, ..config }).with_threads(2);
        let mut out2 = PlacementResult::default();
        placer2.place(&mut hosts2, &mut tasks2, &constraints2, &batch2, 0, &mut out2).unwrap();

        let mut placer = Placer::new(config);
        let mut out = PlacementResult::default();
        placer.place(&mut hosts, &mut tasks, &constraints, &batch, 0, &mut out).unwrap();
        check_invariants(&hosts, &tasks);
        let hosts_of = |o: &PlacementResult, b: &[TaskHandle]| -> Vec<(usize, u32)> {
            o.placed.iter().map(|p| (b.iter().position(|&t| t == p.task).unwrap(), p.host)).collect()
        };
        prop_assert_eq!(hosts_of(&out, &batch), hosts_of(&out2, &batch2), "one and two threads agree");

        // The reference, in the documented order: gangs in batch order (a
        // gang's members grouped by class, classes by first appearance),
        // then classes by first appearance, tasks of a class in batch order.
        let mut expected: HashMap<usize, Option<u32>> = HashMap::new();
        // The reason each unplaced task should carry (for a gang: its
        // first unplaceable member's, with the members before it placed).
        let mut expected_reason: HashMap<usize, Vec<(Check, u32)>> = HashMap::new();
        let key = |s: &TaskSpec| (s.request, s.ports, s.constraint, s.strategy, if s.max_per_host > 0 { s.limit_key } else { u32::MAX }, s.max_per_host, s.flags & flags::MAY_USE_GPU_HOSTS);
        let mut gang_order: Vec<u32> = Vec::new();
        for s in &specs {
            if s.gang != NO_GANG && !gang_order.contains(&s.gang) {
                gang_order.push(s.gang);
            }
        }
        for g in gang_order {
            let mut members: Vec<usize> = (0..specs.len()).filter(|&i| specs[i].gang == g).collect();
            let mut keys = Vec::new();
            for &i in &members {
                if !keys.contains(&key(&specs[i])) {
                    keys.push(key(&specs[i]));
                }
            }
            members.sort_by_key(|&i| keys.iter().position(|k| *k == key(&specs[i])).unwrap());
            let mut placed = Vec::new();
            let mut ok = true;
            for &i in &members {
                match reference.place_one(&constraints, &specs[i]) {
                    Some((slot, grant)) => placed.push((i, slot, grant)),
                    None => {
                        let why = reference.reason(&constraints, &specs[i]);
                        for &m in &members {
                            expected_reason.insert(m, why.clone());
                        }
                        ok = false;
                        break;
                    }
                }
            }
            for &i in &members {
                expected.insert(i, None);
            }
            if ok {
                for &(i, slot, _) in &placed {
                    expected.insert(i, Some(slot));
                }
            } else {
                for &(i, slot, grant) in &placed {
                    reference.remove(&specs[i], slot, grant);
                }
            }
        }
        let mut class_order: Vec<(Resources, u16, u32, Strategy, u32, u16, u8)> = Vec::new();
        for s in specs.iter().filter(|s| s.gang == NO_GANG) {
            if !class_order.contains(&key(s)) {
                class_order.push(key(s));
            }
        }
        for k in class_order {
            for i in (0..specs.len()).filter(|&i| specs[i].gang == NO_GANG && key(&specs[i]) == k) {
                let slot = reference.place_one(&constraints, &specs[i]).map(|(slot, _)| slot);
                if slot.is_none() {
                    expected_reason.insert(i, reference.reason(&constraints, &specs[i]));
                }
                expected.insert(i, slot);
            }
        }
        let mut got: HashMap<usize, Option<u32>> = HashMap::new();
        for p in &out.placed {
            got.insert(batch.iter().position(|&t| t == p.task).unwrap(), Some(p.host));
        }
        for u in &out.unplaced {
            let i = batch.iter().position(|&t| t == u.task).unwrap();
            got.insert(i, None);
            if let Some(want) = expected_reason.get(&i) {
                prop_assert_eq!(&out.reason_of(u).counts, want, "reason of task {}", i);
            }
        }
        prop_assert_eq!(got.len(), batch.len(), "every task is placed or has a reason");
        for i in 0..batch.len() {
            prop_assert_eq!(got[&i], expected[&i], "task {} ({:?})", i, specs[i]);
        }
    }
}

#[test]
fn placement_is_identical_on_one_and_two_threads() {
    use peloton_engine::testkit::placement_workload;
    for strategy in [Strategy::Pack, Strategy::Spread] {
        let run = |threads: usize| {
            let mut w = placement_workload(6_000, 60_000, strategy, 9);
            let mut placer = Placer::new(PlacementConfig::default()).with_threads(threads);
            let mut out = PlacementResult::default();
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
            check_invariants(&w.hosts, &w.tasks);
            (out.placed, out.unplaced, out.reasons)
        };
        let one = run(1);
        let two = run(2);
        assert!(one.0.len() > 10_000, "most tasks are placed");
        assert_eq!(one, two, "{strategy}");
    }
}

/// A batch grouped in parts on several threads (classes, gangs and pinned
/// tasks spread over every part, a class and a gang in several) is placed
/// exactly as on one thread.
#[test]
fn a_batch_grouped_in_parts_is_placed_as_on_one_thread() {
    use peloton_engine::testkit::placement_workload;
    let run = |threads: usize| {
        let mut w = placement_workload(400, 3_000, Strategy::Pack, 5);
        // Gangs of 5 and pinned tasks in place of the workload's last 200
        // tasks, interleaved with its jobs: a gang's members are spread
        // over the whole batch.
        for t in w.batch.split_off(w.batch.len() - 200) {
            w.tasks.remove(t).unwrap();
        }
        let mut extra = Vec::new();
        for i in 0..200u32 {
            let spec = TaskSpec {
                job: 10_000 + i % 50,
                instance: i,
                request: Resources::new(500 + 500 * u64::from(i % 3), 1024, 0, 0),
                gang: if i % 2 == 0 { i % 40 } else { NO_GANG },
                desired_host: if i % 2 == 1 {
                    i % 400
                } else {
                    peloton_engine::task::NO_HOST
                },
                ..Default::default()
            };
            let t = w.tasks.add(&spec).unwrap();
            w.tasks
                .set_state(t, peloton_engine::task::TaskState::Admitted)
                .unwrap();
            extra.push(t);
        }
        let step = w.batch.len() / extra.len();
        for (k, t) in extra.into_iter().enumerate() {
            w.batch.insert(k * (step + 1), t);
        }
        // Every path parallel that can be: grouping, scans, and scans cut
        // to their best hosts part by part (short shape prefixes).
        let mut placer = Placer::new(PlacementConfig {
            parallel_min_batch: 1,
            parallel_min_candidates: 1,
            shape_prefix_min: 8,
            ..Default::default()
        })
        .with_threads(threads);
        let place = |placer: &mut Placer, w: &mut peloton_engine::testkit::PlacementWorkload| {
            let mut out = PlacementResult::default();
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
            check_invariants(&w.hosts, &w.tasks);
            (out.placed, out.unplaced, out.reasons)
        };
        let first = place(&mut placer, &mut w);
        // The same batch again, everything taken off first: the GPU mix
        // learned from the first batch's parts now applies (GPU tasks are
        // placed by `gpu_frag`).
        for p in &first.0 {
            placer.unplace(&mut w.hosts, &mut w.tasks, p.task).unwrap();
        }
        let second = place(&mut placer, &mut w);
        (first, second, placer.gpu_mix().clone())
    };
    let one = run(1);
    assert!(
        one.0.0.len() > 1_000 && !one.0.1.is_empty(),
        "some placed, some not"
    );
    assert!(!one.2.is_empty(), "the mix was learned");
    assert_ne!(one.0, one.1, "the learned mix changes where GPU tasks go");
    for threads in [2, 3] {
        assert_eq!(one, run(threads), "{threads} threads");
    }
}

#[test]
fn every_bad_task_refuses_the_batch_naming_it_and_changes_nothing() {
    let mut env = Env::new();
    env.host("a cpu=4 mem=8");
    let good = env.tasks("3 x cpu=1 mem=1");
    let placed = env.tasks("1 x cpu=1 mem=1");
    env.place(&placed);
    assert_eq!(env.hosts.free(0)[Dim::Cpu], 3000);
    let bad = |env: &mut Env, spec: TaskSpec| {
        let t = env.tasks.add(&spec).unwrap();
        env.tasks
            .set_state(t, peloton_engine::task::TaskState::Admitted)
            .unwrap();
        t
    };
    let base = TaskSpec {
        request: Resources::new(1000, 1024, 0, 0),
        ..Default::default()
    };
    let gone = bad(&mut env, base);
    env.tasks.remove(gone).unwrap();
    // Each goes second in a batch of the good tasks (the first of which
    // it repeats, for the second case).
    let cases: Vec<(TaskHandle, &str)> = vec![
        (placed[0], "already placed"),
        (good[0], "listed twice in the batch"),
        (
            bad(
                &mut env,
                TaskSpec {
                    request: Resources::new(1000, 0, 0, 1500),
                    ..base
                },
            ),
            "1500 milli-GPUs: a request above one GPU",
        ),
        (
            bad(
                &mut env,
                TaskSpec {
                    request: Resources::new(1000, 0, 0, 17000),
                    ..base
                },
            ),
            "exceed the 16 devices",
        ),
        (
            bad(
                &mut env,
                TaskSpec {
                    request: Resources::new(0, 0, 0, 0),
                    ..base
                },
            ),
            "must request some cpu or memory",
        ),
        (
            bad(
                &mut env,
                TaskSpec {
                    constraint: 77,
                    ..base
                },
            ),
            "unknown constraint 77",
        ),
        (gone, ""),
    ];
    let free = env.hosts.free(0);
    // On one thread, and on two with the batch validated in two parts (the
    // bad task in the first or the second, a repeat within a part or
    // across the two).
    let placers = [
        Placer::new(PlacementConfig::default()),
        Placer::new(PlacementConfig {
            parallel_min_batch: 1,
            ..Default::default()
        })
        .with_threads(2),
    ];
    for placer in placers {
        env.placer = placer;
        for (task, words) in &cases {
            for at in [1, good.len()] {
                let mut batch = good.clone();
                batch.insert(at, *task);
                let mut out = PlacementResult::default();
                let err = env
                    .placer
                    .place(
                        &mut env.hosts,
                        &mut env.tasks,
                        &env.constraints,
                        &batch,
                        0,
                        &mut out,
                    )
                    .expect_err(words);
                match &err {
                    peloton_engine::placement::PlacementError::InvalidTask { index, problem } => {
                        assert_eq!(*index, at, "{err}");
                        assert!(problem.contains(words), "{problem:?} should say {words:?}");
                    }
                    other => panic!("unexpected {other}"),
                }
                assert!(out.placed.is_empty() && out.unplaced.is_empty());
                assert_eq!(env.hosts.free(0), free, "a refused batch changes nothing");
            }
        }
        // Nothing stays marked as seen: the first case again, named at its
        // own index (a task left marked would be named first, as a repeat).
        let mut batch = good.clone();
        batch.insert(1, cases[0].0);
        let mut out = PlacementResult::default();
        match env.placer.place(
            &mut env.hosts,
            &mut env.tasks,
            &env.constraints,
            &batch,
            0,
            &mut out,
        ) {
            Err(peloton_engine::placement::PlacementError::InvalidTask { index, problem }) => {
                assert_eq!(
                    (index, problem.contains(cases[0].1)),
                    (1, true),
                    "{problem}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // The good tasks still place, each once (nothing stays marked as seen).
    env.place(&good);
    assert_eq!(env.hosts.free(0)[Dim::Cpu], 0);
    check_invariants(&env.hosts, &env.tasks);
}

/// One world of the kept-shapes test: hosts, tasks and a placer.
struct World {
    hosts: HostArena,
    tasks: TaskArena,
    constraints: ConstraintTable,
    ids: Vec<u32>,
    placer: Placer,
    placed: Vec<TaskHandle>,
}

impl World {
    fn new(seed: u64, n_hosts: usize, config: PlacementConfig) -> World {
        let mut rng = Rng::new(seed);
        let mut hosts = HostArena::new(HostLimits::default());
        for i in 0..n_hosts {
            hosts.add(&random_host(&mut rng, i)).unwrap();
        }
        let mut constraints = ConstraintTable::new();
        let ids = CONSTRAINTS
            .iter()
            .map(|c| constraints.intern(c, hosts.interner_mut()).unwrap())
            .collect();
        World {
            hosts,
            tasks: TaskArena::new(100_000),
            constraints,
            ids,
            placer: Placer::new(config),
            placed: Vec::new(),
        }
    }

    /// Places a batch of these specs: where each task went (or its
    /// reason's counts).
    fn place(&mut self, specs: &[TaskSpec]) -> Vec<Result<u32, Vec<(Check, u32)>>> {
        let batch: Vec<TaskHandle> = specs.iter().map(|s| self.tasks.add(s).unwrap()).collect();
        let mut out = PlacementResult::default();
        self.placer
            .place(
                &mut self.hosts,
                &mut self.tasks,
                &self.constraints,
                &batch,
                0,
                &mut out,
            )
            .unwrap();
        check_invariants(&self.hosts, &self.tasks);
        let mut got = vec![Err(Vec::new()); batch.len()];
        for p in &out.placed {
            got[batch.iter().position(|&t| t == p.task).unwrap()] = Ok(p.host);
            self.placed.push(p.task);
        }
        for u in &out.unplaced {
            got[batch.iter().position(|&t| t == u.task).unwrap()] =
                Err(out.reason_of(u).counts.clone());
        }
        got
    }

    /// Applies one change between batches, drawn from `op`.
    fn change(&mut self, op: u64, pick: u64, n: u64) {
        let n_slots = self.hosts.n_slots();
        let slot = (pick as usize) % n_slots.max(1);
        match op {
            // A placed task ends.
            0..=3 if !self.placed.is_empty() => {
                let task = self.placed.swap_remove(pick as usize % self.placed.len());
                self.placer
                    .unplace(&mut self.hosts, &mut self.tasks, task)
                    .unwrap();
            }
            4 | 10 | 11 => {
                if let Some(id) = self.hosts.lookup_slot(slot) {
                    let state =
                        [HostState::Up, HostState::Draining, HostState::Down][n as usize % 3];
                    self.hosts.set_state(id, state).unwrap();
                }
            }
            5 => {
                // New capacity or attributes (refused while in use).
                if let Some(id) = self.hosts.lookup_slot(slot) {
                    let mut spec = random_host(&mut Rng::new(n), slot);
                    spec.name = self.hosts.name(id).to_owned();
                    let _ = self.hosts.update(id, &spec);
                }
            }
            6 => {
                let _ = self
                    .hosts
                    .add(&random_host(&mut Rng::new(n), 1000 + n as usize % 50));
            }
            7 => {
                if let Some(id) = self.hosts.lookup_slot(slot) {
                    let _ = self.hosts.remove(id);
                }
            }
            8 => {
                if self.hosts.lookup_slot(slot).is_some() {
                    let _ = self
                        .hosts
                        .reserve(slot, &Resources::new(500 * (n % 4), 512 * (n % 3), 0, 0));
                }
            }
            _ => {
                let reserved = self.hosts.reserved(slot);
                if self.hosts.lookup_slot(slot).is_some() && !reserved.is_zero() {
                    self.hosts.unreserve(slot, &reserved);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Shapes kept from batch to batch, brought up to date with the hosts
    /// that changed in between (tasks ending, hosts going down, changing,
    /// coming and going, reservations), place exactly as shapes made afresh
    /// for every batch (which the test above checks against the brute-force
    /// reference), for every strategy, with and without `gpu_frag`.
    #[test]
    fn kept_shapes_place_as_fresh_ones_across_batches(
        seed in any::<u64>(),
        n_hosts in 1usize..40,
        rounds in 2usize..8,
        gpu_frag in any::<bool>(),
    ) {
        let mut rng = Rng::new(seed);
        let shape_prefix_min = [1, 2, 3, 5, 8, 4096][rng.below(6) as usize];
        let config = PlacementConfig { gpu_frag_for_gpu_tasks: gpu_frag, shape_prefix_min, ..Default::default() };
        let mut kept = World::new(seed, n_hosts, config);
        let mut fresh = World::new(seed, n_hosts, PlacementConfig { keep_shapes: false, ..config });
        let strategies = [Strategy::Pack, Strategy::Spread, Strategy::FirstFit, Strategy::GpuFrag];
        let shapes: Vec<TaskSpec> = (0..6).map(|job| random_job_shape(&mut rng, job, &kept.ids, &strategies, (0.3, 0.2))).collect();
        let mut instance = 0;
        for round in 0..rounds {
            let n_tasks = rng.range(1, 60) as usize;
            let specs: Vec<TaskSpec> = (0..n_tasks).map(|_| {
                let mut spec = shapes[rng.below(shapes.len() as u64) as usize];
                spec.instance = instance;
                instance += 1;
                if rng.chance(0.03) {
                    spec.gang = rng.below(3) as u32;
                }
                spec
            }).collect();
            let want = fresh.place(&specs);
            let got = kept.place(&specs);
            prop_assert_eq!(got, want, "round {}", round);
            for _ in 0..rng.range(0, 40) {
                let (op, pick, n) = (rng.below(12), rng.below(1 << 20), rng.below(1 << 20));
                kept.change(op, pick, n);
                fresh.change(op, pick, n);
            }
        }
    }
}
