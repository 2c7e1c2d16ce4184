//! Measured usage on a real agent and server: a busy loop shows about one
//! core used, a task that holds memory shows it, on the task, its job and
//! its host, next to what they are allocated, and in `peloton host list`
//! and `peloton task get`. The agent reports every second here
//! (`--usage-interval 1`).

mod common;

use common::{Cluster, ClusterOptions, eventually, job, task_spec};
use peloton_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_loop_uses_a_core_and_held_memory_shows() {
    let cluster = Cluster::start_with(
        1,
        ClusterOptions {
            agent_args: vec!["--usage-interval".into(), "1".into()],
            ..Default::default()
        },
    )
    .await;
    // A whole core allocated (a cgroup's cpu.max would hold it to its
    // request).
    let mut busy = task_spec("while :; do :; done");
    busy.resources.as_mut().expect("resources").cpu = 1.0;
    let busy_id = cluster.create(job("busy", 1, busy)).await;
    // `tail` keeps a 200 MiB line it has not seen the end of.
    let mut hold = task_spec("(head -c 209715200 /dev/zero; sleep 600) | tail");
    hold.resources.as_mut().expect("resources").memory_mb = 512.0;
    let hold_id = cluster.create(job("hold", 1, hold)).await;
    cluster.wait_running(&busy_id, 1).await;
    cluster.wait_running(&hold_id, 1).await;

    // Most of a core once two readings are in (a loaded machine may give
    // it less), never more than one (it is one process).
    let used = |t: &pb::Task| t.current.as_ref().and_then(|r| r.used);
    let cpu = eventually("the busy loop's CPU use", async || {
        let t = cluster.task(&busy_id, 0).await?;
        let u = used(&t)?;
        assert!(u.cpu <= 1.2, "a single process used {} cores", u.cpu);
        (u.cpu >= 0.5).then_some(u.cpu)
    })
    .await;
    assert!(cpu <= 1.2, "{cpu}");

    let memory = eventually("the held memory", async || {
        let t = cluster.task(&hold_id, 0).await?;
        let u = used(&t)?;
        (u.memory_mb >= 190.0).then_some(u)
    })
    .await;
    assert!(memory.memory_mb < 300.0, "{memory:?}");
    assert!(memory.memory_peak_mb >= memory.memory_mb, "{memory:?}");
    assert!(memory.reported_at_ms > 0, "{memory:?}");

    // The job's use is its tasks'; the host's is its runs'.
    let job_used = cluster
        .job(&hold_id)
        .await
        .and_then(|j| j.status?.used)
        .expect("the job's usage");
    assert!(job_used.memory_mb >= 190.0, "{job_used:?}");
    let host = eventually("the host's usage", async || {
        let h = cluster.hosts().await.into_iter().next()?;
        let u = h.used?;
        (u.memory_mb >= 190.0 && u.cpu >= 0.5).then_some(h)
    })
    .await;
    let capacity = host.capacity.expect("capacity");
    let free = host.free.expect("free");
    assert_eq!(capacity.cpu - free.cpu, 1.5, "allocated: {host:?}");

    // The CLI shows used next to allocated.
    let out = cluster
        .cli()
        .args(["host", "list"])
        .output()
        .await
        .expect("peloton runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("USED"), "{text}");
    let out = cluster
        .cli()
        .args(["task", "get", &hold_id, "0"])
        .output()
        .await
        .expect("peloton runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("USED:"), "{text}");
}
