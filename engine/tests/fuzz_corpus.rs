//! Replays the committed fuzz corpus (`fuzz/corpus/pool_ops`) and random
//! operation sequences through the fuzz driver, so the fuzz target's checks
//! run in every `cargo test` on stable Rust.

use peloton_engine::testkit::{Rng, fuzz_placement_ops, fuzz_pool_ops};
use proptest::prelude::*;

fn corpus(target: &str) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 10,
        "the {target} corpus has inputs ({} found)",
        entries.len()
    );
    entries
}

#[test]
fn committed_corpus_replays_cleanly() {
    for path in corpus("pool_ops") {
        let _ = fuzz_pool_ops(&std::fs::read(&path).unwrap());
    }
}

#[test]
fn committed_placement_corpus_replays_cleanly() {
    let mut placed = 0;
    for path in corpus("placement_ops") {
        placed += fuzz_placement_ops(&std::fs::read(&path).unwrap());
    }
    assert!(placed > 0, "the corpus reaches placements");
}

#[test]
fn structured_placement_streams_place_tasks() {
    let mut placed = 0;
    for seed in 0..30 {
        let mut rng = Rng::new(seed);
        let mut data = Vec::new();
        for _ in 0..300 {
            data.push([0u8, 0, 1, 2, 3, 3, 3, 4, 5, 6, 7][rng.below(11) as usize]);
            for _ in 0..3 {
                data.push(rng.next_u64() as u8);
            }
        }
        placed += fuzz_placement_ops(&data);
        if let Ok(dir) = std::env::var("PELOTON_WRITE_PLACEMENT_CORPUS") {
            std::fs::write(format!("{dir}/structured-{seed:02}"), &data).unwrap();
        }
    }
    assert!(placed > 100, "structured streams place tasks ({placed})");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_placement_sequences_keep_invariants(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let _ = fuzz_placement_ops(&data);
    }

    #[test]
    fn random_operation_sequences_keep_invariants(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let _ = fuzz_pool_ops(&data);
    }
}

/// An operation stream biased towards valid operations: it reaches deeper
/// states than uniform bytes (many creates, enqueues and cycles).
pub fn structured_stream(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut data = Vec::new();
    for _ in 0..400 {
        let op = [0u8, 1, 4, 4, 4, 6, 7, 7, 8, 2, 3, 5][rng.below(12) as usize];
        data.push(op);
        for _ in 0..rng.range(1, 40) {
            data.push(if rng.chance(0.7) {
                rng.below(40) as u8
            } else {
                rng.next_u64() as u8
            });
        }
    }
    data
}

#[test]
fn structured_operation_streams_keep_invariants() {
    let mut total = peloton_engine::testkit::FuzzStats::default();
    for seed in 0..40 {
        let stats = fuzz_pool_ops(&structured_stream(seed));
        total.pools_created += stats.pools_created;
        total.enqueued += stats.enqueued;
        total.admitted += stats.admitted;
        total.released += stats.released;
        total.refused += stats.refused;
    }
    eprintln!("structured streams: {total:?}");
    // The streams exercise every kind of operation, not only refusals.
    assert!(total.pools_created > 100, "{total:?}");
    assert!(
        total.enqueued > 100 && total.admitted > 100 && total.released > 10,
        "{total:?}"
    );
    assert!(total.refused > 0, "{total:?}");
    // Writes the streams as seed inputs of the fuzz corpus when asked.
    if let Ok(dir) = std::env::var("PELOTON_WRITE_CORPUS") {
        for seed in 0..16 {
            std::fs::write(
                format!("{dir}/structured-{seed:02}"),
                structured_stream(seed),
            )
            .unwrap();
        }
    }
}
