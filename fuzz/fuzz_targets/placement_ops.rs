//! Random host, task, placement, unplacement and eviction-planning
//! operations against the engine's invariants. The driver lives in
//! `peloton_engine::testkit` so the committed corpus also replays as an
//! ordinary test on stable Rust.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peloton_engine::testkit::fuzz_placement_ops(data);
});
