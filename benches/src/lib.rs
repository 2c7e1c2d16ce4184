//! criterion suites for the engine live in `benches/`; run them with
//! `cargo bench -p peloton-benches`. This library is empty on purpose: the
//! workloads come from `peloton_engine::testkit`, shared with `peloton-bench`.
