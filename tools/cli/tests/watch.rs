//! `peloton watch` against a real server (simulated hosts): without
//! `--from` it shows events from now on, `--from 1` replays from the first
//! event kept, `--from N` from revision N, and `--from 0` is refused with a
//! message that says what to use instead. The server is secure (see
//! `common`).

mod common;

use std::process::Stdio;
use std::time::Duration;

use peloton_gateway::config::Config;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const TIMEOUT: Duration = Duration::from_secs(60);

fn examples() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn peloton(server: &str) -> Command {
    let mut cmd = common::cli();
    cmd.arg("--server").arg(server);
    cmd
}

/// `peloton -o json watch ARGS`, its events read line by line.
struct Watch {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Watch {
    fn start(server: &str, args: &[&str]) -> Watch {
        let mut child = peloton(server)
            .args(["-o", "json", "watch"])
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("peloton watch starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Watch { child, lines }
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(TIMEOUT, self.lines.next_line())
            .await
            .expect("an event within the timeout")
            .expect("stdout")
            .expect("the watch goes on");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Creates hello.yaml's job and waits for it; returns its id.
async fn run_hello(server: &str) -> String {
    let out = peloton(server)
        .args(["-o", "json", "job", "create", "--wait"])
        .arg(examples().join("hello.yaml"))
        .output()
        .await
        .expect("peloton runs");
    assert!(out.status.success(), "{out:?}");
    let job: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    job["job"]["id"].as_str().expect("id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_from_now_or_replays_from_a_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = peloton_gateway::server::start(&Config {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        sim_hosts: 4,
        cycle_interval_ms: 5,
        ..common::secure_config()
    })
    .await
    .unwrap();
    let url = common::url(server.addr);
    let out = peloton(&url)
        .args(["respool", "create"])
        .arg(examples().join("pools.yaml"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let first = run_hello(&url).await;

    // --from 1: the first job's history, from its very first event.
    let mut replay = Watch::start(&url, &["--from", "1"]);
    let event = replay.next().await;
    assert_eq!(event["revision"], 1, "{event}");
    assert_eq!(event["task"]["job_id"], first.as_str(), "{event}");
    let mut last = 1;
    while last < 5 {
        let event = replay.next().await;
        let revision = event["revision"].as_u64().unwrap();
        assert_eq!(revision, last + 1, "gap-free: {event}");
        last = revision;
    }

    // --from N starts at N.
    let mut middle = Watch::start(&url, &["--from", "3"]);
    assert_eq!(middle.next().await["revision"], 3);

    // No --from: nothing of the past; the first event shown is one of the
    // next job's (the first job is over: it makes no more events).
    let mut now = Watch::start(&url, &[]);
    let second = run_hello(&url).await;
    let event = now.next().await;
    let job = event["task"]["job_id"]
        .as_str()
        .or(event["job"]["job_id"].as_str())
        .expect("a job or task event");
    assert_eq!(job, second, "{event}");

    // --from 0 is refused, naming the flag and what to use instead.
    let out = peloton(&url)
        .args(["watch", "--from", "0"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--from") && stderr.contains("revisions start at 1"),
        "{stderr}"
    );
    drop((replay, middle, now));
    server.shutdown().await.unwrap();
}
