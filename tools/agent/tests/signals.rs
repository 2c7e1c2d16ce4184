//! Signal dispositions do not leak from the agent into tasks: an agent
//! started the way `nohup` or a script with `trap '' INT TERM` starts it
//! (those signals ignored) still gives its tasks every signal at its
//! default action. Ignored signals survive fork and exec, so without the
//! trampoline's reset a task would inherit them (and, for one, could not be
//! stopped with Ctrl-C or SIGTERM by its own children's logic).

mod common;

use common::{Cluster, TOKEN, eventually, job};
use peloton_proto::v1 as pb;
use std::process::Stdio;
use tokio::process::Command;

/// The signals ignored in the agent's environment (a superset of `nohup`'s
/// SIGHUP and a shell script's `trap '' INT TERM`).
const IGNORED: &str = "INT TERM HUP QUIT USR1 USR2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_with_signals_ignored_gives_tasks_default_dispositions() {
    let mut cluster = Cluster::start(0).await;
    let work = cluster.work_dir("nohup");
    std::fs::create_dir_all(&work).expect("work dir");
    // `sh -c 'trap "" ...; exec AGENT ARGS'`: the agent process itself
    // starts with those signals ignored.
    let script = format!("trap '' {IGNORED}; exec \"$0\" \"$@\"");
    let agent = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_peloton-agent"))
        .args(["--server", &format!("http://127.0.0.1:{}", cluster.port)])
        .arg("--work-dir")
        .arg(&work)
        .args(["--host", "nohup", "--token", TOKEN])
        .args(["--resources", "cpu=4,mem=4096,disk=10000"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts");
    let pid = agent.id().expect("pid");
    cluster.agents.insert("nohup".to_owned(), agent);
    cluster.wait_hosts_up(1).await;
    // The premise: the agent really runs with them ignored.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    let agent_ignored = mask(&status, "SigIgn:");
    let sighup = 1u64 << (nix::sys::signal::Signal::SIGHUP as i32 - 1);
    assert_ne!(agent_ignored & sighup, 0, "agent: {status}");

    // `grep` is executed directly (no shell in between, whose own
    // handling of signals would blur this).
    let task = pb::TaskSpec {
        command: "grep".into(),
        args: vec![
            "-E".into(),
            "^Sig(Blk|Ign)".into(),
            "/proc/self/status".into(),
        ],
        resources: Some(pb::Resources {
            cpu: 0.1,
            memory_mb: 64.0,
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = cluster.create(job("dispositions", 1, task)).await;
    cluster.wait_job(&id, pb::JobState::Succeeded).await;
    let out = eventually("the task's output", async || {
        let out = cluster.logs(&id, 0, false).await;
        out.contains("SigIgn:").then_some(out)
    })
    .await;
    assert_eq!(mask(&out, "SigBlk:"), 0, "{out}");
    // Only the standard signals: glibc keeps two real-time signals (32,
    // 33) for itself and refuses to change them.
    assert_eq!(mask(&out, "SigIgn:") & 0x7fff_ffff, 0, "{out}");
}

/// The hexadecimal mask on the line starting with `name`.
fn mask(status: &str, name: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {status:?}"));
    u64::from_str_radix(line.trim(), 16).expect("hex mask")
}
