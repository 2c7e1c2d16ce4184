//! Random lifecycle operations (pools, jobs, stateful and daemon jobs, volume
//! deletions, host zones and joins, cycles, time, run ends, health
//! verdicts, kills and their confirmations, job and task actions, drains,
//! hosts lost and back, server crashes and recoveries, rolling updates and
//! actions on them) on the lifecycle core over a simulated cluster, checked
//! against a model after every step and for liveness at the end. The driver lives in
//! `peloton_lifecycle::sim::ops` so the committed corpus also replays as an
//! ordinary test on stable Rust.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peloton_lifecycle::sim::ops::fuzz_lifecycle_ops(data);
});
