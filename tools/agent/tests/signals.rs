//! Signal dispositions do not leak from the agent into tasks: an agent
//! started the way `nohup` or a script with `trap '' INT TERM` starts it
//! (those signals ignored, and also the C library's own real-time signals
//! 32 and 33, which its `signal` cannot reset) still gives its tasks every
//! signal 1..=64 at its default action. Ignored signals survive fork and exec, so without the
//! trampoline's reset a task would inherit them (and, for one, could not be
//! stopped with Ctrl-C or SIGTERM by its own children's logic).

mod common;

use common::{Cluster, TOKEN, eventually, job};
use peloton_proto::v1 as pb;
use std::process::Stdio;
use tokio::process::Command;

/// The signals ignored in the agent's environment: a superset of `nohup`'s
/// SIGHUP and a shell script's `trap '' INT TERM`, and glibc's reserved 32
/// and 33, which only the raw system call can set.
const IGNORED: [i32; 8] = [
    nix::libc::SIGINT,
    nix::libc::SIGTERM,
    nix::libc::SIGHUP,
    nix::libc::SIGQUIT,
    nix::libc::SIGUSR1,
    nix::libc::SIGUSR2,
    32,
    33,
];

/// Sets `signal` to SIG_IGN with the raw `rt_sigaction` system call (the C
/// library refuses 32 and 33). Async-signal-safe: runs between fork and
/// exec.
fn ignore(signal: i32) -> std::io::Result<()> {
    use nix::libc;
    // The kernel's sigaction: the handler first, then flags, restorer and
    // mask, all zero here.
    let action: [u64; 4] = [libc::SIG_IGN as u64, 0, 0, 0];
    let sigset_bytes: libc::c_long = 8;
    // SAFETY: `action` is a valid kernel sigaction (SIG_IGN, nothing else)
    // that the kernel only reads; no old action is asked for.
    #[allow(unsafe_code)]
    let result = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            libc::c_long::from(signal),
            action.as_ptr(),
            std::ptr::null_mut::<u64>(),
            sigset_bytes,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_with_signals_ignored_gives_tasks_default_dispositions() {
    let mut cluster = Cluster::start(0).await;
    let work = cluster.work_dir("nohup");
    std::fs::create_dir_all(&work).expect("work dir");
    // The agent process itself starts with those signals ignored, set
    // between fork and exec as `nohup` or a shell's `trap ''` would.
    let mut agent = Command::new(env!("CARGO_BIN_EXE_peloton-agent"));
    // SAFETY: the closure only makes system calls (async-signal-safe),
    // allocates nothing and touches no lock.
    #[allow(unsafe_code)]
    unsafe {
        agent.pre_exec(|| IGNORED.iter().try_for_each(|&signal| ignore(signal)));
    }
    let agent = agent
        .args(["--server", &cluster.url()])
        .args(cluster.agent_tls_args("nohup"))
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
    // The premise: the agent really runs with them ignored, except those
    // it handles itself (SIGINT, SIGTERM) or the C library does (33).
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    let agent_ignored = mask(&status, "SigIgn:");
    let agent_caught = mask(&status, "SigCgt:");
    for signal in IGNORED {
        let bit = 1u64 << (signal - 1);
        assert_ne!(
            (agent_ignored | agent_caught) & bit,
            0,
            "agent, signal {signal}: {status}"
        );
    }
    for signal in [nix::libc::SIGHUP, nix::libc::SIGUSR1, 32] {
        let bit = 1u64 << (signal - 1);
        assert_ne!(agent_ignored & bit, 0, "agent, signal {signal}: {status}");
    }

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
    // All 64 signals, glibc's own 32 and 33 included.
    assert_eq!(mask(&out, "SigIgn:"), 0, "{out}");
}

/// The hexadecimal mask on the line starting with `name`.
fn mask(status: &str, name: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {status:?}"));
    u64::from_str_radix(line.trim(), 16).expect("hex mask")
}
