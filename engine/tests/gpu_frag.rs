//! The `gpu_frag` strategy: where it puts GPU tasks, which device a shared
//! GPU request gets, the learned mix, and determinism across thread counts.

use peloton_engine::Resources;
use peloton_engine::constraint::ConstraintTable;
use peloton_engine::gpufrag::{GpuMix, MixKey};
use peloton_engine::host::{HostArena, HostLimits, HostSpec};
use peloton_engine::placement::{PlacementConfig, PlacementResult, Placer, check_host_accounting};
use peloton_engine::task::{Strategy, TaskArena, TaskSpec, TaskState};
use peloton_engine::testkit::Rng;

fn host(name: &str, cpu: u64, gpus: u8) -> HostSpec {
    HostSpec {
        name: name.into(),
        capacity: Resources::new(cpu, 1 << 20, 0, u64::from(gpus) * 1000),
        gpu_devices: gpus,
        ports: 0,
        attributes: vec![],
    }
}

fn request(cpu: u64, gpu: u64) -> Resources {
    Resources::new(cpu, 1024, 0, gpu)
}

fn mix(types: &[(Resources, f64)]) -> GpuMix {
    GpuMix::from_counts(types.iter().map(|&(request, n)| {
        (
            MixKey {
                request,
                constraint: 0,
            },
            n,
        )
    }))
}

struct Env {
    hosts: HostArena,
    tasks: TaskArena,
    constraints: ConstraintTable,
    placer: Placer,
    out: PlacementResult,
}

impl Env {
    fn new(specs: &[HostSpec], placer: Placer) -> Env {
        let mut hosts = HostArena::new(HostLimits::default());
        for s in specs {
            hosts.add(s).unwrap();
        }
        Env {
            hosts,
            tasks: TaskArena::new(100_000),
            constraints: ConstraintTable::new(),
            placer,
            out: PlacementResult::default(),
        }
    }

    /// Places one task; its host slot and GPU device mask, if placed.
    fn place(&mut self, request: Resources, strategy: Strategy) -> Option<(u32, u16)> {
        let spec = TaskSpec {
            request,
            strategy,
            ..Default::default()
        };
        let task = self.tasks.add(&spec).unwrap();
        self.tasks.set_state(task, TaskState::Admitted).unwrap();
        self.placer
            .place(
                &mut self.hosts,
                &mut self.tasks,
                &self.constraints,
                &[task],
                0,
                &mut self.out,
            )
            .unwrap();
        check_host_accounting(&self.hosts, &self.tasks);
        self.out.placed.first().map(|p| (p.host, p.gpu.devices))
    }
}

#[test]
fn a_cpu_heavy_gpu_task_goes_where_it_strands_no_gpus() {
    // Host 0: 8 GPUs and 12 cores per GPU (the mix's usual task fills it
    // exactly); host 1: 2 GPUs and plenty of cpu.
    let hosts = [host("dense", 96_000, 8), host("cpu-rich", 104_000, 2)];
    let usual = request(12_000, 1000);
    let heavy = request(40_000, 1000);
    let mut placer = Placer::new(PlacementConfig::default());
    placer.set_gpu_mix(Some(mix(&[(usual, 90.0), (heavy, 10.0)])));
    let mut env = Env::new(&hosts, placer);
    assert_eq!(env.place(heavy, Strategy::GpuFrag).map(|p| p.0), Some(1));
    // The usual task goes to the dense host, where it fits exactly.
    assert_eq!(env.place(usual, Strategy::GpuFrag).map(|p| p.0), Some(0));
}

#[test]
fn a_shared_gpu_request_takes_the_device_its_leftover_suits() {
    // One host, two devices: 530 free on device 0 (after a 470 share) and a
    // whole device 1. Another 470 share should fill device 0, not break
    // device 1, when whole GPUs are in demand.
    let share = request(1000, 470);
    let whole = request(1000, 1000);
    let mut placer = Placer::new(PlacementConfig::default());
    placer.set_gpu_mix(Some(mix(&[(share, 50.0), (whole, 50.0)])));
    let mut env = Env::new(&[host("h", 64_000, 2)], placer);
    let first = env.place(share, Strategy::GpuFrag).unwrap();
    let second = env.place(share, Strategy::GpuFrag).unwrap();
    assert_eq!(first.1, second.1, "both shares on one device");
    assert_eq!(env.place(whole, Strategy::GpuFrag).map(|p| p.0), Some(0));
}

#[test]
fn pack_gpu_tasks_use_the_learned_mix() {
    let mut env = Env::new(
        &[host("a", 96_000, 8), host("b", 104_000, 2)],
        Placer::new(PlacementConfig::default()),
    );
    assert!(env.placer.gpu_mix().is_empty());
    for _ in 0..3 {
        env.place(request(12_000, 1000), Strategy::Pack).unwrap();
    }
    let learned = env.placer.gpu_mix().types().to_vec();
    assert_eq!(learned.len(), 1);
    assert_eq!(learned[0].0.request, request(12_000, 1000));
    // Turned off, the mix is still learned but pack stays pack.
    let mut env = Env::new(
        &[host("a", 96_000, 8)],
        Placer::new(PlacementConfig {
            gpu_frag_for_gpu_tasks: false,
            ..Default::default()
        }),
    );
    env.place(request(12_000, 1000), Strategy::Pack).unwrap();
}

#[test]
fn gpu_frag_is_deterministic_on_any_number_of_threads() {
    let mut rng = Rng::new(7);
    let specs: Vec<HostSpec> = (0..300)
        .map(|i| {
            let gpus = [1u8, 2, 4, 8][rng.below(4) as usize];
            host(&format!("h{i}"), 8_000 * (1 + rng.below(12)), gpus)
        })
        .collect();
    let requests: Vec<Resources> = (0..2_000)
        .map(|_| {
            let gpu = [0u64, 250, 470, 810, 1000, 2000, 4000][rng.below(7) as usize];
            request(1000 * (1 + rng.below(16)), gpu)
        })
        .collect();
    let run = |threads: usize| {
        let config = PlacementConfig {
            parallel_min_candidates: 1,
            allow_cpu_tasks_on_gpu_hosts: true,
            ..Default::default()
        };
        let mut env = Env::new(&specs, Placer::new(config).with_threads(threads));
        requests
            .iter()
            .map(|&r| env.place(r, Strategy::GpuFrag))
            .collect::<Vec<_>>()
    };
    let one = run(1);
    assert!(one.iter().filter(|p| p.is_some()).count() > 100);
    assert_eq!(one, run(2));
    assert_eq!(one, run(3));
}

#[test]
fn unconstrained_tasks_keep_off_the_hosts_a_scarce_model_needs() {
    // One small T4 host (2 of the 66 GPUs) and eight G2 hosts. A fifth of
    // the GPU tasks need a T4, three tenths a G2. FGD weighs the barred
    // types by share alone, so a free task would go to the T4 host (the G2
    // type, the larger, is barred there); weighed by share ÷ the share of
    // GPUs it may use, the T4 type's claim on its one host is far stronger.
    let with_model = |name: &str, gpus: u8, model: &str| HostSpec {
        attributes: vec![("model".to_owned(), model.to_owned())],
        ..host(name, 64_000, gpus)
    };
    let mut specs = vec![with_model("t4", 2, "T4")];
    specs.extend((0..8).map(|i| with_model(&format!("g2-{i}"), 8, "G2")));
    let mut env = Env::new(&specs, Placer::new(PlacementConfig::default()));
    let t4 = env
        .constraints
        .intern("model in {T4}", env.hosts.interner_mut())
        .unwrap();
    let g2 = env
        .constraints
        .intern("model in {G2}", env.hosts.interner_mut())
        .unwrap();
    let one = request(4_000, 1000);
    let key = |constraint| MixKey {
        request: one,
        constraint,
    };
    env.placer.set_gpu_mix(Some(GpuMix::from_counts([
        (key(0), 50.0),
        (key(t4), 20.0),
        (key(g2), 30.0),
    ])));
    let free = env.place(one, Strategy::GpuFrag).unwrap();
    assert_ne!(free.0, 0, "an unconstrained task leaves the T4 host alone");
    // A T4 task still gets it, and with both its GPUs free.
    let spec = TaskSpec {
        request: one,
        strategy: Strategy::GpuFrag,
        constraint: t4,
        ..Default::default()
    };
    for _ in 0..2 {
        let task = env.tasks.add(&spec).unwrap();
        env.tasks.set_state(task, TaskState::Admitted).unwrap();
        env.placer
            .place(
                &mut env.hosts,
                &mut env.tasks,
                &env.constraints,
                &[task],
                0,
                &mut env.out,
            )
            .unwrap();
        assert_eq!(env.out.placed.first().map(|p| p.host), Some(0));
    }
    check_host_accounting(&env.hosts, &env.tasks);
}
