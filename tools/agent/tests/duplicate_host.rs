//! Two real agents given one `--host`: the second is refused while the
//! first holds the host (it says so on its log and asks again with a
//! back-off), the first keeps its host and its runs (no run is lost or
//! started again) — also while it is away, until the host is declared
//! lost; only then may the second take the name. The first, back on its
//! own work directory after that, is refused and stops the runs it still
//! has (they were declared lost and run on the second now).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use peloton_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_with_a_held_host_name_is_refused_and_the_first_keeps_its_runs() {
    // A host-lost timeout longer than the twin's back-off after 4 s of
    // refusals (1, 2, 4 s…), so that it asks while the first is away.
    let mut cluster = Cluster::start_with(
        1,
        ClusterOptions {
            host_lost_after_ms: 9_000,
            ..Default::default()
        },
    )
    .await;
    let id = cluster.create(job("held", 1, task_spec("sleep 300"))).await;
    let before = cluster.wait_running(&id, 1).await;
    let run_before = before[0].current.clone().expect("current run");

    // The twin: another work directory, the same host name.
    let twin_dir = cluster.work_dir("a0-twin");
    std::fs::create_dir_all(&twin_dir).expect("work dir");
    let mut twin = Command::new(env!("CARGO_BIN_EXE_peloton-agent"))
        .args(["--server", &cluster.url()])
        // A certificate naming a0 too: the host name is refused for being
        // held, not for the certificate.
        .args(cluster.agent_tls_args("a0"))
        .arg("--work-dir")
        .arg(&twin_dir)
        .args(["--host", "a0", "--token", TOKEN])
        .args(["--resources", "cpu=4,mem=4096,disk=10000"])
        .args(["--ports", "19000-19009"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("twin starts");
    let mut lines = BufReader::new(twin.stderr.take().expect("stderr")).lines();
    let refusal = within("the twin to report its refusal", async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            if line.contains("another agent holds this host name") {
                return line;
            }
        }
        panic!("the twin exited without reporting a refusal");
    })
    .await;
    assert!(refusal.contains("ERROR"), "{refusal}");
    assert!(refusal.contains("AlreadyExists"), "{refusal}");
    assert!(
        refusal.contains("host a0 belongs to another agent"),
        "{refusal}"
    );
    let (log_tx, mut log_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = log_tx.send(line);
        }
    });

    // Meanwhile (the twin keeps asking, with a back-off) the first agent
    // keeps the host and its run: same run, still running, nothing launched
    // on the twin.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let task = cluster.task(&id, 0).await.expect("task");
    let run = task.current.expect("current run");
    assert_eq!(run.state(), pb::TaskState::Running, "{run:?}");
    assert_eq!(run.run_id, run_before.run_id, "the run was started again");
    assert_eq!(run.launch_id, run_before.launch_id);
    let hosts = cluster.hosts().await;
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert!(hosts[0].connected);
    let twin_sandboxes = std::fs::read_dir(twin_dir.join("sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(twin_sandboxes, 0, "the twin launched something");
    // Back-off: 1 s, 2 s, 4 s... so at most 3 refusals in 4 s after the
    // first, logged at the 2nd (and 4th): no hammering.
    let mut more = 0;
    while let Ok(line) = log_rx.try_recv() {
        if line.contains("another agent holds this host name") {
            more += 1;
        }
    }
    assert!(more <= 2, "{more} more refusals logged in 4 s");
    assert!(twin.try_wait().expect("wait").is_none(), "the twin gave up");

    let holder_id = cluster.hosts().await[0].agent_id.clone();
    assert!(
        !holder_id.is_empty(),
        "the host names the agent it is bound to"
    );

    // The first agent goes (its connection closes; its task runs on). Its
    // host is not lost yet: the twin, asking again meanwhile, is refused,
    // and the run is still the first's.
    cluster.sigkill_agent("a0").await;
    let killed_at = std::time::Instant::now();
    within("the twin to ask again while a0 is away", async {
        loop {
            let line = log_rx.recv().await.expect("the twin's log");
            if line.contains("host a0 belongs to another agent") {
                return;
            }
        }
    })
    .await;
    assert!(
        killed_at.elapsed() < Duration::from_millis(9_000),
        "the twin asked only after the host-lost timeout"
    );
    let task = cluster.task(&id, 0).await.expect("task");
    let run = task.current.expect("current run");
    assert_eq!(run.run_id, run_before.run_id, "the twin took the runs over");
    let hosts = cluster.hosts().await;
    assert_eq!(hosts[0].agent_id, holder_id, "{hosts:?}");
    assert!(!hosts[0].connected);

    // Once the host is declared lost the twin may take its name: the run
    // the first left behind is lost and started again on the twin.
    let again = eventually("the run to start again on the twin", async || {
        let t = cluster.task(&id, 0).await?;
        let r = t.current?;
        (r.state() == pb::TaskState::Running && r.run_id > run_before.run_id).then_some(r)
    })
    .await;
    assert_eq!(again.run_id, run_before.run_id + 1, "{again:?}");
    let twin_sandboxes = std::fs::read_dir(twin_dir.join("sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(twin_sandboxes, 1);
    assert_ne!(cluster.hosts().await[0].agent_id, holder_id);

    // The first agent back on its own work directory: refused (the name is
    // the twin's now), it stops the run it still had, which would
    // otherwise run beside its replacement for good.
    let first_runs = format!("PELOTON_SANDBOX={}/", cluster.work_dir("a0").display());
    // (Each task is its shell and the sleep it starts.)
    assert!(
        !processes_with_env(&first_runs).is_empty(),
        "a0's old task lives on"
    );
    let twin_runs = format!("PELOTON_SANDBOX={}/", twin_dir.display());
    let twin_processes = processes_with_env(&twin_runs);
    assert!(!twin_processes.is_empty());
    let twin_child = twin;
    cluster.start_agent("a0").await;
    eventually("a0's old run to be stopped", async || {
        processes_with_env(&first_runs).is_empty().then_some(())
    })
    .await;
    let t = cluster.task(&id, 0).await.expect("task");
    let r = t.current.expect("current");
    assert_eq!(r.run_id, again.run_id);
    assert_eq!(r.state(), pb::TaskState::Running);
    assert_eq!(
        processes_with_env(&twin_runs),
        twin_processes,
        "the twin's run goes on"
    );
    let first = cluster.agents.remove("a0").expect("a0");
    drop(first);
    cluster.agents.insert("a0".into(), twin_child);
}
