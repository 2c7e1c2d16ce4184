//! The README's main command: `pelotond --local-agents 3 --demo` starts a
//! local cluster, runs the hello-world job for real and prints each task's
//! output read back through the API (here with `--exit-after-demo`, twice
//! on one data dir, as a user re-running the quick start would: the second
//! time the agents re-open their work dirs). Secure, as by default: TLS,
//! the agents with certificates from the server's CA, the demo as the
//! admin.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_quick_start_runs_hello_world_on_local_agents_and_shows_its_output() {
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_peloton-agent"));
    let pelotond = agent.with_file_name("pelotond");
    assert!(pelotond.exists(), "{} not built", pelotond.display());
    let dir = tempfile::tempdir().unwrap();
    for round in 0..2 {
        let out = Command::new(&pelotond)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--listen", "127.0.0.1:0", "--no-metrics"])
            .args(["--local-agents", "3", "--demo", "--exit-after-demo"])
            .arg("--agent-bin")
            .arg(&agent)
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
        assert!(
            stdout.contains("pelotond: serving gRPC on https://127.0.0.1:"),
            "round {round}: {stdout}"
        );
        assert!(
            stdout.contains(&format!(
                "the admin token is in {}",
                dir.path().join("admin-token").display()
            )),
            "round {round}: {stdout}"
        );
        for i in 0..4 {
            assert!(
                stdout.contains(&format!("demo: [task {i} stdout] hello, world from ")),
                "round {round}, task {i}: {stdout}"
            );
        }
        assert_eq!(stdout.matches("started agent local-").count(), 3);
    }
    // The agents stopped with the server.
    let needle = dir.path().display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect();
    assert!(left.is_empty(), "processes left: {left:?}");
}
