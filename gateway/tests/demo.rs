//! `pelotond --demo` on simulated hosts runs a job end to end through its
//! own API (here with `--exit-after-demo`, twice on one data dir), secure
//! by default: over TLS with the private CA and admin token it makes in
//! its data dir once, and finds there again. The
//! quick start itself (with `--local-agents`) is tested in
//! `tools/agent/tests/quickstart.rs`.

use std::process::Command;

#[test]
fn the_demo_runs_a_job_to_success_and_can_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut first_token = None;
    for round in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_pelotond"))
            .arg("--data-dir")
            .arg(dir.path())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--no-metrics",
                "--sim-hosts",
                "4",
                "--demo",
                "--exit-after-demo",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "round {round}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("demo: finished: JOB_STATE_SUCCEEDED"),
            "round {round}: {stdout}"
        );
        assert_eq!(
            stdout.matches("TASK_STATE_SUCCEEDED").count(),
            4,
            "round {round}: {stdout}"
        );
        assert!(
            stdout.contains("pelotond: serving gRPC on https://127.0.0.1:"),
            "round {round}: {stdout}"
        );
        let token = std::fs::read_to_string(dir.path().join("admin-token")).unwrap();
        assert!(dir.path().join("tls").join("ca.pem").exists());
        assert_eq!(
            first_token.get_or_insert_with(|| token.clone()),
            &token,
            "round {round}: the admin token changed"
        );
    }
}
