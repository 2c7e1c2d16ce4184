//! `peloton-agent --server` with several addresses, against a real
//! `pelotond`: a dead first address is skipped, and when the server goes
//! away and comes back at another address of the list (the same data
//! directory, as a new leader would have the same state), the agent finds
//! it and hands over its running task, which is taken over, not run again.

mod common;

use common::{Clients, Cluster, free_port, job, task_spec};
use peloton_proto::v1::JobState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_skips_a_dead_address_and_follows_the_server_to_the_next() {
    let mut cluster = Cluster::start(0).await;
    let next_port = free_port();
    // Nothing listens on port 1: connections are refused.
    let servers = format!(
        "http://127.0.0.1:1,http://127.0.0.1:{},http://127.0.0.1:{next_port}",
        cluster.port
    );
    cluster.start_agent_at("a0", &servers).await;
    cluster.wait_hosts_up(1).await;
    let id = cluster.create(job("moves", 1, task_spec("sleep 3"))).await;
    let before = cluster.wait_running(&id, 1).await;
    let run = before[0].current.as_ref().expect("run").run_id;

    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    cluster.port = next_port;
    cluster.c = Clients::new(next_port);
    cluster.start_server().await;

    cluster.wait_job(&id, JobState::Succeeded).await;
    let task = cluster.task(&id, 0).await.expect("task");
    let current = task.current.expect("run");
    assert_eq!(
        current.run_id, run,
        "taken over, not run again: {current:?}"
    );
    assert_eq!(current.host, "a0");
}
