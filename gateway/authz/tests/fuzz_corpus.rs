//! Replays the committed fuzz corpus (`fuzz/corpus/authz_check`) and
//! pseudo-random inputs through the fuzz driver, so the `authz_check`
//! target's checks run in every `cargo test` on stable Rust.

use peloton_authz::fuzzing::{Stats, run};
use peloton_authz::{Permission, Role};

fn corpus() -> Vec<std::path::PathBuf> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/authz_check");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 12,
        "the authz_check corpus has inputs ({} found)",
        entries.len()
    );
    entries
}

/// Every role was granted, some grant refused, and every permission both
/// allowed and refused.
fn assert_reaches_everything(what: &str, total: &Stats) {
    for (role, n) in Role::ALL.iter().zip(total.granted) {
        assert!(n > 0, "{what} grants {role}: {total:?}");
    }
    assert!(total.refused > 0, "{what} has refused grants: {total:?}");
    for (i, permission) in Permission::ALL.iter().enumerate() {
        assert!(
            total.allowed[i] > 0,
            "{what} allows {permission}: {total:?}"
        );
        assert!(
            total.denied[i] > 0,
            "{what} refuses {permission}: {total:?}"
        );
    }
}

#[test]
fn committed_corpus_replays_cleanly() {
    let mut total = Stats::default();
    for path in corpus() {
        let data = std::fs::read(&path).unwrap();
        let stats = run(&data);
        eprintln!("{}: {stats:?}", path.display());
        total.add(&stats);
    }
    assert_reaches_everything("the corpus", &total);
}

/// SplitMix64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn below(&mut self, n: u64) -> u8 {
        (self.next() % n) as u8
    }
}

/// An input built the way the driver reads it, biased towards valid grants
/// and short paths so that requests often fall inside a grant's subtree.
fn structured(rng: &mut Rng) -> Vec<u8> {
    let mut data = Vec::new();
    let grants = rng.below(5);
    let header = grants | if rng.below(8) == 0 { 0x08 } else { 0 };
    data.push(header);
    let segment = |rng: &mut Rng, data: &mut Vec<u8>| {
        if rng.below(16) == 0 {
            let len = rng.below(4);
            data.push(0xF0 | len);
            data.extend((0..len).map(|_| [b'.', b'/', b'a', 0xFF][usize::from(rng.below(4))]));
        } else {
            data.push(rng.below(4));
        }
    };
    for _ in 0..grants {
        let role = rng.below(4) | if rng.below(8) == 0 { 0x80 } else { 0 };
        data.push(role);
        if role != 3 {
            let depth = rng.below(3);
            data.push(depth);
            for _ in 0..depth {
                segment(rng, &mut data);
            }
        }
    }
    if header & 0x08 != 0 {
        // A raw pool of 5 or 10 bytes.
        data.push(rng.byte());
        let len = 1 + rng.below(2);
        data.push(len);
        let raw = [b'/', b'a', b'b', b'.'];
        data.extend((0..5 * len).map(|_| raw[usize::from(rng.below(4))]));
    }
    for _ in 0..rng.below(32) {
        let depth = rng.below(4);
        data.push(rng.below(8) + 8 * depth);
        for _ in 0..depth {
            segment(rng, &mut data);
        }
    }
    data
}

#[test]
fn pseudo_random_inputs_agree_with_the_model() {
    let mut rng = Rng(0x5EED_A017);
    let mut total = Stats::default();
    for _ in 0..2000 {
        total.add(&run(&structured(&mut rng)));
    }
    eprintln!("structured: {total:?}");
    assert_reaches_everything("the structured inputs", &total);
    for _ in 0..2000 {
        let len = usize::from(rng.byte());
        let data: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
        total.add(&run(&data));
    }
    eprintln!("with uniform bytes: {total:?}");
}
