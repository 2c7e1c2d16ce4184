//! Running work does not notice a blink of the control plane: real agents
//! killed (SIGKILL) or stopped (SIGTERM) and started again within the
//! host-lost timeout leave every task running as it was — the same run,
//! nothing preempted, on the restarted host or on the healthy one — because
//! a host whose session dropped keeps counting what its tasks hold until
//! it is declared lost.

mod common;

use std::time::Duration;

use common::*;
use peloton_proto::v1 as pb;

/// Per task: (run id, launch id, host) of its current run, which must be
/// running.
async fn running_runs(cluster: &Cluster, id: &str, n: u32) -> Vec<(u32, u64, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let t = cluster.task(id, i).await.expect("task");
        let run = t.current.expect("current run");
        assert_eq!(run.state(), pb::TaskState::Running, "{id}/{i}: {run:?}");
        out.push((run.run_id, run.launch_id, run.host.clone()));
    }
    out
}

/// Waits until `host`'s agent is connected again.
async fn wait_connected(cluster: &Cluster, host: &str) {
    eventually(&format!("{host} connected again"), async || {
        cluster
            .hosts()
            .await
            .iter()
            .any(|h| h.name == host && h.connected && h.state() == pb::HostState::Up)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_restarted_within_the_lost_timeout_disturb_no_task() {
    // Two hosts of 2 cpus; one pool; 8 preemptible tasks of 0.45 cpu fill
    // both (1.8 of 2 each). Before the fix, a restarting agent took its
    // host's 2 cpus out of the pool's entitlement at once: the pool held
    // 3.6 against 2 and gave 4 tasks back, some from the healthy host.
    let mut cluster = Cluster::start_with(
        2,
        ClusterOptions {
            host_lost_after_ms: 15_000,
            agent_resources: "cpu=2,mem=4096,disk=10000".into(),
            ..Default::default()
        },
    )
    .await;
    let mut spec = task_spec("sleep 300");
    spec.resources = Some(pb::Resources {
        cpu: 0.45,
        memory_mb: 64.0,
        ..Default::default()
    });
    let id = cluster.create(job("blip", 8, spec)).await;
    cluster.wait_running(&id, 8).await;
    let before = running_runs(&cluster, &id, 8).await;
    let hosts: std::collections::BTreeSet<&str> =
        before.iter().map(|(_, _, h)| h.as_str()).collect();
    assert_eq!(hosts.len(), 2, "both hosts hold tasks: {before:?}");

    // SIGKILL, back after 3 s; then SIGTERM, back after 1 s.
    cluster.sigkill_agent("a1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.start_agent("a1").await;
    wait_connected(&cluster, "a1").await;
    cluster.sigterm_agent("a1").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.start_agent("a1").await;
    wait_connected(&cluster, "a1").await;
    // Cycles run every few ms: a preemption would have been decided by now.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let after = running_runs(&cluster, &id, 8).await;
    assert_eq!(after, before, "every task kept its run");
    for i in 0..8 {
        let t = cluster.task(&id, i).await.expect("task");
        assert!(
            t.history
                .iter()
                .all(|r| r.state() != pb::TaskState::Preempted && r.state() != pb::TaskState::Lost),
            "{id}/{i} was disturbed: {:?}",
            t.history
        );
    }
}
