//! Hosts and constraints: fixture examples, GPU device choice, and property
//! tests that the bitmap indexes and constraint evaluation agree with a
//! brute-force scan of every host.

use expect_test::{Expect, expect};
use peloton_engine::constraint::{Constraint, ConstraintCache};
use peloton_engine::host::{
    GpuGrant, HostArena, HostError, HostLimits, HostSpec, HostState, Misfit,
};
use peloton_engine::testkit::{Rng, host_spec};
use peloton_engine::{Dim, Resources};
use proptest::prelude::*;

/// `host NAME cpu=N mem=N gpus=N key=value…` lines.
fn hosts(fixture: &str) -> HostArena {
    let mut arena = HostArena::new(HostLimits::default());
    for line in fixture.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let spec = host_spec(line.strip_prefix("host ").expect("a host line"));
        arena.add(&spec).unwrap();
    }
    arena.check_invariants();
    arena
}

fn check(arena: &mut HostArena, constraint: &str, expected: Expect) {
    let result = match Constraint::parse(constraint, arena.interner_mut()) {
        Ok(c) => {
            let names: Vec<&str> = c
                .evaluate(arena)
                .iter()
                .map(|slot| arena.name(arena.lookup_slot(slot as usize).unwrap()))
                .collect();
            format!("{} -> {names:?}", c.display(arena.interner()))
        }
        Err(e) => e.to_string(),
    };
    expected.assert_eq(&result);
}

const CLUSTER: &str = "
    host h1 cpu=8 mem=32 zone=a rack=r1
    host h2 cpu=8 mem=32 zone=a rack=r2
    host h3 cpu=16 mem=64 zone=b rack=r3 gpus=4 gpu_model=a100
    host h4 cpu=16 mem=64 zone=c rack=r4 exclusive=ml
    host h5 cpu=4 mem=8
";

#[test]
fn constraints_select_hosts() {
    let mut arena = hosts(CLUSTER);
    check(
        &mut arena,
        "zone == a",
        expect![[r#"zone==a -> ["h1", "h2"]"#]],
    );
    check(
        &mut arena,
        "zone != a",
        expect![[r#"zone!=a -> ["h3", "h4", "h5"]"#]],
    );
    check(
        &mut arena,
        "zone in {b, c}",
        expect![[r#"zone in {b,c} -> ["h3", "h4"]"#]],
    );
    check(
        &mut arena,
        "exists gpu_model",
        expect![[r#"exists gpu_model -> ["h3"]"#]],
    );
    check(
        &mut arena,
        "zone == a && rack == r2",
        expect![[r#"(zone==a && rack==r2) -> ["h2"]"#]],
    );
    check(
        &mut arena,
        "zone == a or !exists zone",
        expect![[r#"(zone==a || !exists zone) -> ["h1", "h2", "h5"]"#]],
    );
    check(
        &mut arena,
        "not (zone == a || zone == b) and exists rack",
        expect![[r#"(!(zone==a || zone==b) && exists rack) -> ["h4"]"#]],
    );
    check(
        &mut arena,
        "zone == \"a\"",
        expect![[r#"zone==a -> ["h1", "h2"]"#]],
    );
    check(
        &mut arena,
        "zone == nowhere",
        expect![[r#"zone==nowhere -> []"#]],
    );
    check(
        &mut arena,
        "",
        expect![[r#"true -> ["h1", "h2", "h3", "h4", "h5"]"#]],
    );
}

#[test]
fn bad_constraints_are_refused_with_the_position() {
    let mut arena = hosts(CLUSTER);
    check(
        &mut arena,
        "zone = a",
        expect![[r#"constraint "zone = a": at byte 5: unexpected character '='"#]],
    );
    check(
        &mut arena,
        "zone ==",
        expect![[r#"constraint "zone ==": at byte 7: expected a value, found the end"#]],
    );
    check(
        &mut arena,
        "(zone == a",
        expect![[r#"constraint "(zone == a": at byte 10: expected ')'"#]],
    );
    check(
        &mut arena,
        "zone in {a b}",
        expect![[r#"constraint "zone in {a b}": at byte 11: expected ',' or '}'"#]],
    );
    check(
        &mut arena,
        "zone == a b",
        expect![[
            r#"constraint "zone == a b": at byte 10: unexpected Word("b") after a complete expression"#
        ]],
    );
    check(
        &mut arena,
        "zone",
        expect![[r#"constraint "zone": at byte 0: "zone" needs '==', '!=' or 'in' and a value"#]],
    );
    let deep = format!("{}zone == a{}", "(".repeat(40), ")".repeat(40));
    assert!(Constraint::parse(&deep, arena.interner_mut()).is_err());
    // A valid expression, just too long.
    let long = format!("{}a == b", "a == b && ".repeat(500));
    assert!(long.len() > 4096);
    let err = Constraint::parse(&long, arena.interner_mut()).unwrap_err();
    assert!(err.problem.contains("longer than 4096 bytes"), "{err}");
    // Spelling variants of one expression share a number.
    let mut table = peloton_engine::constraint::ConstraintTable::new();
    let a = table
        .intern("zone in {b, a}", arena.interner_mut())
        .unwrap();
    let b = table
        .intern("zone  in {\"a\",b}", arena.interner_mut())
        .unwrap();
    let c = table
        .intern("zone in {a, c}", arena.interner_mut())
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(table.intern("  ", arena.interner_mut()).unwrap(), 0);
}

#[test]
fn gpu_devices_fill_partly_used_ones_first_and_keep_whole_ones() {
    let mut arena = hosts("host g cpu=64 mem=256 gpus=4");
    let slot = arena.lookup("g").unwrap().idx();
    let gpu = |milli: u64| Resources::new(1000, 1024, 0, milli);
    let half = arena.allocate(slot, &gpu(500), 0).unwrap();
    assert_eq!(
        half,
        GpuGrant {
            devices: 0b0001,
            milli_per_device: 500
        }
    );
    // The next fraction goes to the partly used device, not a whole one.
    let quarter = arena.allocate(slot, &gpu(250), 0).unwrap();
    assert_eq!(quarter.devices, 0b0001);
    // Two whole GPUs take two whole devices.
    let two = arena.allocate(slot, &gpu(2000), 0).unwrap();
    assert_eq!(
        two,
        GpuGrant {
            devices: 0b0110,
            milli_per_device: 1000
        }
    );
    // 1.25 GPUs are free in total: two whole GPUs cannot be had.
    assert_eq!(arena.gpu_free(slot), &[250, 0, 0, 1000]);
    assert_eq!(
        arena.fits(slot, &gpu(2000), 0),
        Err(Misfit::Insufficient(Dim::Gpu))
    );
    let _ = arena.allocate(slot, &gpu(500), 0).unwrap(); // goes to device 3
    assert_eq!(arena.gpu_free(slot), &[250, 0, 0, 500]);
    // 0.75 GPU is free, but 0.6 fits on no single device.
    assert_eq!(arena.fits(slot, &gpu(600), 0), Err(Misfit::GpuFragmented));
    assert_eq!(
        arena.fits(slot, &gpu(1000), 0),
        Err(Misfit::Insufficient(Dim::Gpu))
    );
    arena.check_invariants();
    arena.release(
        slot,
        &gpu(500),
        0,
        GpuGrant {
            devices: 0b1000,
            milli_per_device: 500,
        },
    );
    arena.release(slot, &gpu(2000), 0, two);
    arena.release(slot, &gpu(250), 0, quarter);
    arena.release(slot, &gpu(500), 0, half);
    assert_eq!(arena.gpu_free(slot), &[1000, 1000, 1000, 1000]);
    arena.check_invariants();
}

/// A task taken over on a host keeps the devices it runs on: a pinned
/// grant is honoured when it has the request's shape and room, else the
/// usual choice is made; the pin serves one allocation on its slot.
#[test]
fn a_pinned_gpu_grant_is_taken_when_it_fits() {
    let mut arena = hosts("host g cpu=64 mem=256 gpus=4\nhost h cpu=64 mem=256 gpus=4");
    let slot = arena.lookup("g").unwrap().idx();
    let other = arena.lookup("h").unwrap().idx();
    let gpu = |milli: u64| Resources::new(1000, 1024, 0, milli);
    let grant = |devices: u16, milli_per_device: u16| GpuGrant {
        devices,
        milli_per_device,
    };
    // Whole devices 1 and 3, not the lowest free ones.
    arena.pin_gpu_grant(slot, grant(0b1010, 1000));
    assert_eq!(arena.allocate(slot, &gpu(2000), 0), Ok(grant(0b1010, 1000)));
    // Used once: the next allocation chooses as usual.
    assert_eq!(arena.allocate(slot, &gpu(1000), 0), Ok(grant(0b0001, 1000)));
    // A share of device 2.
    arena.pin_gpu_grant(slot, grant(0b0100, 300));
    assert_eq!(arena.allocate(slot, &gpu(300), 0), Ok(grant(0b0100, 300)));
    // A pin on another slot, of another shape, or on a device without room
    // is not taken.
    arena.pin_gpu_grant(other, grant(0b0100, 1000));
    assert_eq!(arena.allocate(slot, &gpu(200), 0), Ok(grant(0b0100, 200)));
    arena.clear_gpu_pin();
    for pin in [grant(0b0100, 500), grant(0b0010, 400), grant(0b1100, 250)] {
        arena.pin_gpu_grant(slot, pin);
        assert_eq!(
            arena.allocate(slot, &gpu(400), 0),
            Ok(grant(0b0100, 400)),
            "{pin:?}"
        );
        arena.release(slot, &gpu(400), 0, grant(0b0100, 400));
    }
    arena.check_invariants();
}

#[test]
fn bad_hosts_are_refused_and_change_nothing() {
    let mut arena = hosts(CLUSTER);
    let before = format!("{arena:?}");
    let spec = |name: &str| HostSpec {
        name: name.to_owned(),
        capacity: Resources::new(1000, 1024, 0, 0),
        ..Default::default()
    };
    let mut errors = vec![
        arena.add(&spec("h1")).unwrap_err(),
        arena.add(&spec("")).unwrap_err(),
        arena
            .add(&HostSpec {
                gpu_devices: 2,
                ..spec("x")
            })
            .unwrap_err(),
        arena
            .add(&HostSpec {
                gpu_devices: 17,
                capacity: Resources::new(1, 1, 0, 17_000),
                ..spec("x")
            })
            .unwrap_err(),
        arena
            .add(&HostSpec {
                attributes: vec![("zone".into(), "a b".into())],
                ..spec("x")
            })
            .unwrap_err(),
        arena
            .add(&HostSpec {
                attributes: vec![("k".into(), "1".into()), ("k".into(), "2".into())],
                ..spec("x")
            })
            .unwrap_err(),
    ];
    assert_eq!(
        format!("{arena:?}"),
        before,
        "refused additions change nothing"
    );
    let h1 = arena.lookup("h1").unwrap();
    let slot = h1.idx();
    arena
        .allocate(slot, &Resources::new(6000, 1024, 0, 0), 0)
        .unwrap();
    let before_update = format!("{arena:?}");
    errors.push(
        arena
            .update(
                h1,
                &HostSpec {
                    capacity: Resources::new(4000, 32 * 1024, 0, 0),
                    ..spec("h1")
                },
            )
            .unwrap_err(),
    );
    errors.push(arena.remove(h1).unwrap_err());
    assert_eq!(format!("{arena:?}"), before_update);
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    expect![[r#"
        [
            "host h1 already exists",
            "host : name: must be 1 to 253 bytes",
            "host x: capacity.gpu: 0 milli-GPUs, but 2 devices make 2000",
            "host x: gpu_devices: 17 exceeds 16",
            "host x: attributes.zone: value \"a b\" has ' '; use letters, digits and _ . - / :",
            "host x: attributes.k: appears more than once",
            "host h1: 6000 cpu is allocated, more than the new capacity 4000",
            "host h1: cpu=6000 memory=1024 disk=0 gpu=0 is still allocated; move or end its tasks first",
        ]
    "#]]
    .assert_debug_eq(&messages);
    assert!(matches!(errors[0], HostError::AlreadyExists { .. }));
}

#[test]
fn removed_slots_are_reused_with_a_new_generation() {
    let mut arena = hosts(CLUSTER);
    let h2 = arena.lookup("h2").unwrap();
    arena.set_state(h2, HostState::Draining).unwrap();
    assert!(
        arena
            .in_state(HostState::Draining)
            .contains(h2.idx() as u32)
    );
    arena.remove(h2).unwrap();
    arena.check_invariants();
    let spec = HostSpec {
        name: "h6".into(),
        capacity: Resources::new(1000, 1, 0, 0),
        ..Default::default()
    };
    let h6 = arena.add(&spec).unwrap();
    assert_eq!(h6.idx(), h2.idx());
    assert!(!arena.contains(h2) && arena.contains(h6));
    assert!(arena.set_state(h2, HostState::Up).is_err());
    assert_eq!(arena.state(h6), HostState::Up);
    arena.check_invariants();
}

// ---------------------------------------------------------------------------

const KEYS: [&str; 4] = ["zone", "rack", "gpu_model", "exclusive"];
const VALUES: [&str; 5] = ["a", "b", "c", "r1", "x"];

fn random_spec(rng: &mut Rng, name: String) -> HostSpec {
    let mut attributes = Vec::new();
    for key in KEYS {
        if rng.chance(0.5) {
            attributes.push((
                key.to_owned(),
                VALUES[rng.below(VALUES.len() as u64) as usize].to_owned(),
            ));
        }
    }
    let gpus = if rng.chance(0.2) {
        rng.range(1, 8) as u8
    } else {
        0
    };
    HostSpec {
        name,
        capacity: Resources::new(
            rng.range(1, 64) * 1000,
            rng.range(1, 256) * 1024,
            0,
            u64::from(gpus) * 1000,
        ),
        gpu_devices: gpus,
        ports: rng.range(0, 100) as u32,
        attributes,
    }
}

fn random_constraint(rng: &mut Rng, depth: u32) -> String {
    let key = KEYS[rng.below(KEYS.len() as u64) as usize];
    let value = VALUES[rng.below(VALUES.len() as u64) as usize];
    match if depth == 0 {
        rng.below(4)
    } else {
        rng.below(7)
    } {
        0 => format!("{key} == {value}"),
        1 => format!("{key} != {value}"),
        2 => format!("{key} in {{{value}, {}}}", VALUES[rng.below(5) as usize]),
        3 => format!("exists {key}"),
        4 => format!(
            "({} && {})",
            random_constraint(rng, depth - 1),
            random_constraint(rng, depth - 1)
        ),
        5 => format!(
            "({} || {})",
            random_constraint(rng, depth - 1),
            random_constraint(rng, depth - 1)
        ),
        _ => format!("!{}", random_constraint(rng, depth - 1)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random host additions, updates, state changes and removals: the
    /// indexes stay equal to the columns, and every constraint's bitmap is
    /// exactly the set of hosts a brute-force scan matches.
    #[test]
    fn indexes_and_constraints_agree_with_brute_force(seed in any::<u64>(), n_ops in 1usize..300) {
        let mut rng = Rng::new(seed);
        let mut arena = HostArena::new(HostLimits { max_hosts: 64 });
        let mut names = Vec::new();
        let mut cache = ConstraintCache::new();
        for op in 0..n_ops {
            match rng.below(6) {
                0 | 1 => {
                    let name = format!("h{op}");
                    if arena.add(&random_spec(&mut rng, name.clone())).is_ok() {
                        names.push(name);
                    }
                }
                2 if !names.is_empty() => {
                    let name = &names[rng.below(names.len() as u64) as usize];
                    let id = arena.lookup(name).unwrap();
                    arena.update(id, &random_spec(&mut rng, name.clone())).unwrap();
                }
                3 if !names.is_empty() => {
                    let i = rng.below(names.len() as u64) as usize;
                    let id = arena.lookup(&names[i]).unwrap();
                    arena.remove(id).unwrap();
                    names.swap_remove(i);
                }
                4 if !names.is_empty() => {
                    let id = arena.lookup(&names[rng.below(names.len() as u64) as usize]).unwrap();
                    arena.set_state(id, HostState::ALL[rng.below(3) as usize]).unwrap();
                }
                _ => {
                    let text = random_constraint(&mut rng, 3);
                    let c = Constraint::parse(&text, arena.interner_mut()).unwrap();
                    cache.clear();
                    let bitmap = cache.evaluate(&c, &arena).clone();
                    for slot in 0..arena.n_slots() {
                        let expected = arena.lookup_slot(slot).is_some() && c.matches(arena.attributes(slot));
                        prop_assert_eq!(bitmap.contains(slot as u32), expected, "{} on slot {}", text, slot);
                    }
                }
            }
            arena.check_invariants();
        }
    }
}

#[test]
fn a_hosts_spec_reads_back_and_updates_one_attribute() {
    let mut arena = HostArena::new(HostLimits::default());
    let mut h3 = host_spec("h3 cpu=16 mem=64 zone=b rack=r3 gpus=4 gpu_model=a100");
    h3.ports = 10;
    let id = arena.add(&h3).unwrap();
    let task = Resources::new(2000, 1024, 0, 1000);
    let grant = arena.allocate(id.idx(), &task, 2).unwrap();
    let mut spec = arena.spec(id).unwrap();
    assert_eq!(spec.name, "h3");
    assert_eq!(spec.gpu_devices, 4);
    assert_eq!(spec.ports, 10);
    assert_eq!(spec.capacity, arena.capacity(id.idx()));
    let mut attrs = spec.attributes.clone();
    attrs.sort();
    assert_eq!(
        attrs,
        [
            ("gpu_model".to_string(), "a100".to_string()),
            ("rack".into(), "r3".into()),
            ("zone".into(), "b".into()),
        ]
    );
    // Writing it back with one attribute more changes only that.
    let free = arena.free(id.idx());
    let ports = arena.ports_free(id.idx());
    spec.attributes.push(("pool".into(), "p1".into()));
    arena.update(id, &spec).unwrap();
    arena.check_invariants();
    assert_eq!(arena.free(id.idx()), free);
    assert_eq!(arena.ports_free(id.idx()), ports);
    check(&mut arena, "pool == p1", expect![[r#"pool==p1 -> ["h3"]"#]]);
    arena.release(id.idx(), &task, 2, grant);
    arena.check_invariants();
}

#[test]
fn a_lending_host_keeps_its_books_through_reservations_updates_and_state() {
    use peloton_engine::host::HostState;
    let cpu = |n: u64| Resources::new(n * 1000, 0, 0, 0);
    let mut hosts = HostArena::new(HostLimits::default());
    let spec = HostSpec {
        name: "h".into(),
        capacity: cpu(10),
        ..Default::default()
    };
    let id = hosts.add(&spec).unwrap();
    let slot = id.idx();
    hosts.allocate(slot, &cpu(6), 0).unwrap(); // a service
    hosts.reserve(slot, &cpu(2)).unwrap(); // an instance restarting here
    hosts.set_reclaimable(slot, cpu(4)); // the service uses 2 of its 6
    let lent = hosts.lend();
    hosts.allocate(slot, &cpu(5), 0).unwrap(); // a revocable task
    hosts.settle(lent);
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(0), cpu(3)));
    hosts.check_invariants();
    // Taking the reservation off repays the loan first; putting it back
    // borrows again: the books are as they were (a placement that tries the
    // reserved instance and finds it does not fit does exactly this).
    hosts.unreserve(slot, &cpu(2));
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(0), cpu(1)));
    hosts.reserve_back(slot, &cpu(2));
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(0), cpu(3)));
    assert_eq!(hosts.reserved(slot), cpu(2));
    hosts.check_invariants();
    // Handing the reservation to its instance repays no loan: all of it is
    // the instance's to take. What it does not take is reserved again, and
    // the books balance with the loan untouched.
    hosts.hand_over(slot, &cpu(2));
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(2), cpu(3)));
    let grant = hosts.allocate(slot, &cpu(1), 0).unwrap();
    hosts.reserve(slot, &cpu(1)).unwrap();
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(0), cpu(3)));
    assert_eq!(hosts.reserved(slot), cpu(1));
    hosts.check_invariants();
    // Put back as it was (the instance ended; its place is held again).
    hosts.release(slot, &cpu(1), 0, grant);
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(0), cpu(2)));
    hosts.reserve_back(slot, &cpu(1));
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(0), cpu(3)));
    assert_eq!(hosts.reserved(slot), cpu(2));
    hosts.check_invariants();
    // More capacity repays the loan before anything is free.
    let bigger = HostSpec {
        capacity: cpu(16),
        ..spec.clone()
    };
    hosts.update(id, &bigger).unwrap();
    assert_eq!((hosts.free(slot), hosts.borrowed(slot)), (cpu(3), cpu(0)));
    hosts.check_invariants();
    // A host that takes no new work lends nothing.
    hosts.set_state(id, HostState::Draining).unwrap();
    assert_eq!(hosts.reclaimable(slot), Resources::ZERO);
    assert_eq!(hosts.total_reclaimable(), Resources::ZERO);
    hosts.check_invariants();
}
