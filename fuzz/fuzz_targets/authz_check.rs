//! Random grants × random requests against a segment-wise model of the
//! authorization check (`Grant::new`, `Grant::allows`, `Principal::allows`
//! and `check`, `covers`). The driver lives in `peloton_authz::fuzzing` so
//! the committed corpus also replays as an ordinary test on stable Rust.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peloton_authz::fuzzing::run(data);
});
