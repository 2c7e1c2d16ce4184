//! A real cluster on loopback: the `pelotond` binary and `peloton-agent`
//! processes running real tasks. Checks what only real processes show:
//! output read back through the API, retries of a failing command, a kill
//! taking the whole process tree, an agent or the server killed with
//! SIGKILL, and a drain moving tasks.
//!
//! The cluster and its helpers are in `common` (shared with `services.rs`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_world_output_is_readable_through_the_api_and_the_cli() {
    let cluster = Cluster::start(2).await;
    let id = cluster
        .create(job(
            "hello",
            3,
            task_spec("echo \"hello from $PELOTON_TASK_ID\"; echo oops >&2"),
        ))
        .await;
    cluster.wait_job(&id, J::Succeeded).await;
    for i in 0..3 {
        let t = cluster.task(&id, i).await.expect("task");
        let run = t.current.expect("run");
        assert_eq!(run.exit_code, 0);
        assert!(run.host == "a0" || run.host == "a1", "{run:?}");
        assert!(run.started_at_ms > 0 && run.finished_at_ms >= run.started_at_ms);
        let out = cluster.logs(&id, i, false).await;
        assert_eq!(out, format!("hello from {id}-{i}-1\n"));
        assert_eq!(cluster.logs(&id, i, true).await, "oops\n");
    }
    // The CLI reads the same bytes.
    let out = cluster
        .cli()
        .args(["task", "logs", &id, "2"])
        .output()
        .await
        .expect("peloton runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("hello from {id}-2-1\n")
    );
    let out = cluster
        .cli()
        .args(["task", "logs", &id, "2", "--stderr"])
        .output()
        .await
        .expect("peloton runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "oops\n");
    // Hosts report how they isolate tasks.
    for h in cluster.hosts().await {
        assert!(
            h.isolation == "rlimit" || h.isolation == "cgroup-v2",
            "{h:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_failed_with_the_exit_code_or_a_readable_reason() {
    let cluster = Cluster::start(1).await;
    let mut failing = task_spec("echo try; exit 3");
    failing.restart = Some(pb::RestartPolicy {
        max_failures: 2,
        backoff_ms: 100,
        max_backoff_ms: 1000,
    });
    let id = cluster.create(job("failing", 1, failing)).await;
    cluster.wait_job(&id, J::Failed).await;
    let t = cluster.task(&id, 0).await.expect("task");
    let run = t.current.expect("run");
    assert_eq!(run.state(), T::Failed);
    assert_eq!(run.exit_code, 3);
    assert_eq!(run.run_id, 3, "two retries");
    assert_eq!(t.failure_count, 3);
    assert_eq!(t.history.len(), 2);
    for h in &t.history {
        assert_eq!(h.state(), T::Failed);
        assert_eq!(h.exit_code, 3);
    }
    // Back-off: each retry started after the previous run had ended.
    let mut runs = t.history.clone();
    runs.reverse();
    runs.push(run);
    for w in runs.windows(2) {
        assert!(w[1].created_at_ms >= w[0].finished_at_ms + 100, "{w:?}");
    }

    let mut missing = task_spec("");
    missing.shell.clear();
    missing.command = "/no/such/binary".into();
    let id = cluster.create(job("missing", 1, missing)).await;
    cluster.wait_job(&id, J::Failed).await;
    let run = cluster
        .task(&id, 0)
        .await
        .expect("task")
        .current
        .expect("run");
    assert!(
        run.reason.contains("/no/such/binary") && run.reason.contains("No such file"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_stops_the_whole_process_tree_within_the_grace_period() {
    let cluster = Cluster::start(1).await;
    // Everything ignores SIGTERM (inherited): only the SIGKILL after the
    // grace period ends the tree.
    let mut spec = task_spec("trap '' TERM; sleep 600 & sleep 600 & setsid sleep 600 & wait");
    spec.kill_grace_period_ms = 1000;
    let id = cluster.create(job("tree", 1, spec)).await;
    cluster.wait_running(&id, 1).await;
    let needle = format!("PELOTON_JOB_ID={id}");
    // The shell and its three sleeps (one in a new session).
    eventually("the tree started", async || {
        (processes_with_env(&needle).len() >= 4).then_some(())
    })
    .await;
    let killed_at = std::time::Instant::now();
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
    // The job is KILLED only once the agent confirmed the tree is gone.
    assert!(killed_at.elapsed() >= Duration::from_millis(900));
    let left = processes_with_env(&needle);
    assert!(left.is_empty(), "processes survived the kill: {left:?}");
    let t = cluster.task(&id, 0).await.expect("task");
    assert_eq!(t.current.expect("run").state(), T::Killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_an_agent_killed_with_sigkill_run_again_elsewhere() {
    let mut cluster = Cluster::start(1).await;
    let id = cluster
        .create(job("moving", 3, task_spec("sleep 4; echo done")))
        .await;
    let before = cluster.wait_running(&id, 3).await;
    assert!(
        before
            .iter()
            .all(|t| t.current.as_ref().unwrap().host == "a0")
    );
    cluster.start_agent("a1").await;
    cluster.wait_hosts_up(2).await;
    cluster.sigkill_agent("a0").await;
    cluster.wait_job(&id, J::Succeeded).await;
    for i in 0..3 {
        let t = cluster.task(&id, i).await.expect("task");
        let run = t.current.expect("run");
        assert_eq!(run.host, "a1", "instance {i}: {run:?}");
        assert_eq!(run.run_id, 2);
        let lost = &t.history[0];
        assert_eq!(lost.state(), T::Lost);
        assert!(lost.reason.contains("host a0 lost"), "{lost:?}");
    }
    let hosts = cluster.hosts().await;
    let a0 = hosts.iter().find(|h| h.name == "a0").expect("a0");
    assert_eq!(a0.state(), pb::HostState::Down);
    assert!(!a0.connected);
}

/// Start and last-alive times of every run of every instance, from the
/// files the tasks themselves wrote in their sandboxes.
fn run_intervals(cluster: &Cluster, job_id: &str) -> BTreeMap<u32, Vec<(u128, u128, String)>> {
    let mut out: BTreeMap<u32, Vec<(u128, u128, String)>> = BTreeMap::new();
    for (agent, name, path) in cluster.sandboxes() {
        let Some(rest) = name.strip_prefix(&format!("{job_id}-")) else {
            continue;
        };
        let instance: u32 = rest.split('-').next().unwrap().parse().unwrap();
        let read = |f: &str| -> Option<u128> {
            std::fs::read_to_string(path.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (Some(start), Some(alive)) = (read("start"), read("alive")) else {
            continue; // never got to run its first line
        };
        out.entry(instance)
            .or_default()
            .push((start, alive, format!("{agent}/{name}")));
    }
    out
}

const RECORDING_TASK: &str = "date +%s%N > start; i=0; \
     while [ $i -lt 25 ]; do date +%s%N > alive; sleep 0.1; i=$((i+1)); done; \
     date +%s%N > alive";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_run_completes_every_job_and_never_runs_an_instance_twice_at_once() {
    let mut cluster = Cluster::start(2).await;
    let a = cluster
        .create(job("rec-a", 4, task_spec(RECORDING_TASK)))
        .await;
    let b = cluster
        .create(job("rec-b", 2, task_spec(RECORDING_TASK)))
        .await;
    cluster.wait_running(&a, 4).await;
    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    // Acknowledged while the server was down? Nothing: it is down. Restart.
    cluster.start_server().await;
    cluster.wait_job(&a, J::Succeeded).await;
    cluster.wait_job(&b, J::Succeeded).await;
    for id in [&a, &b] {
        let runs = run_intervals(&cluster, id);
        let n = if *id == a { 4 } else { 2 };
        assert_eq!(runs.len(), n, "every instance ran: {runs:?}");
        for (instance, mut rs) in runs {
            rs.sort();
            for w in rs.windows(2) {
                assert!(
                    w[0].1 < w[1].0,
                    "instance {instance} of {id} ran twice at once: {w:?}"
                );
            }
        }
    }
    // The runs survived the restart: they were taken over, not restarted.
    for i in 0..4 {
        let t = cluster.task(&a, i).await.expect("task");
        assert_eq!(t.current.expect("run").run_id, 1, "instance {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_host_moves_its_tasks_elsewhere() {
    let cluster = Cluster::start(3).await;
    let mut spec = task_spec("sleep 600");
    spec.max_instances_per_host = 1;
    spec.kill_grace_period_ms = 500;
    let id = cluster.create(job("drained", 2, spec)).await;
    let tasks = cluster.wait_running(&id, 2).await;
    let drained = tasks[0].current.as_ref().unwrap().host.clone();
    let other = tasks[1].current.as_ref().unwrap().host.clone();
    let mut hosts = cluster.c.hosts.clone();
    hosts
        .start_maintenance(pb::StartMaintenanceRequest {
            hosts: vec![drained.clone()],
        })
        .await
        .expect("drain");
    let sandboxes = format!("PELOTON_SANDBOX={}", cluster.work_dir(&drained).display());
    eventually("the drained host down once empty", async || {
        let hs = cluster.hosts().await;
        let h = hs.iter().find(|h| h.name == drained)?;
        (h.state() == pb::HostState::Down && h.tasks.is_empty()).then_some(())
    })
    .await;
    assert!(processes_with_env(&sandboxes).is_empty());
    // Instance 0 runs again on the third host (one per host).
    let tasks = cluster.wait_running(&id, 2).await;
    let moved = &tasks[0];
    let run = moved.current.as_ref().unwrap();
    assert_eq!(run.run_id, 2, "{moved:?}");
    assert!(run.host != drained && run.host != other, "{moved:?}");
    assert_eq!(moved.history[0].state(), T::Preempted);
    assert!(moved.history[0].reason.contains("drained"), "{moved:?}");
    assert_eq!(tasks[1].current.as_ref().unwrap().run_id, 1, "untouched");
    hosts
        .complete_maintenance(pb::CompleteMaintenanceRequest {
            hosts: vec![drained.clone()],
        })
        .await
        .expect("up");
    cluster.wait_hosts_up(3).await;
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}

/// Restarts instance 0 of `id` and returns once the server answered.
async fn restart_task(cluster: &Cluster, id: &str) {
    let mut tasks = cluster.c.tasks.clone();
    tasks
        .restart(pb::RestartTaskRequest {
            job_id: id.into(),
            instances: vec![0],
            job_version: 0,
        })
        .await
        .expect("restart");
}

/// A task that ignores SIGTERM (so a stop lasts the whole grace period)
/// and records when it runs.
const STUBBORN_TASK: &str = "trap '' TERM; date +%s%N > start; \
     while true; do date +%s%N > alive; sleep 0.1; done";

/// Waits until the stubborn task has recorded its start, so it ignores
/// SIGTERM: RUNNING is reported as soon as its shell is executed, before
/// the shell has run its `trap`.
async fn wait_stubborn(cluster: &Cluster, id: &str) {
    eventually("the stubborn task ignores SIGTERM", async || {
        let rs = run_intervals(cluster, id).remove(&0)?;
        (!rs.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_wins_over_a_restart_still_waiting_for_the_old_run() {
    let cluster = Cluster::start(1).await;
    let mut spec = task_spec(STUBBORN_TASK);
    spec.kill_grace_period_ms = 2000;
    let id = cluster.create(job("stubborn", 1, spec)).await;
    cluster.wait_running(&id, 1).await;
    wait_stubborn(&cluster, &id).await;
    restart_task(&cluster, &id).await;
    // The old run is stopping; the new one waits for it.
    let t = cluster.task(&id, 0).await.expect("task");
    assert!(t.stopping && t.restart_when_stopped, "{t:?}");
    assert_eq!(t.current.as_ref().unwrap().run_id, 1);
    let mut tasks = cluster.c.tasks.clone();
    tasks
        .kill(pb::KillTaskRequest {
            job_id: id.clone(),
            instances: vec![0],
            job_version: 0,
        })
        .await
        .expect("kill");
    let t = cluster.task(&id, 0).await.expect("task");
    assert!(t.stopping && !t.restart_when_stopped, "{t:?}");
    let t = eventually("the old run confirmed gone", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.stopping).then_some(t)
    })
    .await;
    // Killed for good: no second run.
    let run = t.current.unwrap();
    assert_eq!((run.run_id, run.state()), (1, T::Killed));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run = cluster.task(&id, 0).await.unwrap().current.unwrap();
    assert_eq!((run.run_id, run.state()), (1, T::Killed));
    assert!(processes_with_env(&format!("PELOTON_JOB_ID={id}")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_waiting_for_the_old_run_survives_a_server_crash() {
    let mut cluster = Cluster::start(1).await;
    let mut spec = task_spec(STUBBORN_TASK);
    spec.kill_grace_period_ms = 3000;
    let id = cluster.create(job("stubborn", 1, spec)).await;
    cluster.wait_running(&id, 1).await;
    wait_stubborn(&cluster, &id).await;
    restart_task(&cluster, &id).await;
    // Acknowledged, so stored: the crash must not lose the restart.
    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    cluster.start_server().await;
    let t = eventually("the new run running", async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        (run.run_id == 2 && run.state() == T::Running).then_some(t)
    })
    .await;
    assert!(!t.stopping);
    // The sandboxes' own records: run 2 started after run 1's last sign
    // of life. (Running is reported once its process runs; its shell
    // writes its first records a moment later.)
    let mut rs = eventually("both runs' records", async || {
        let rs = run_intervals(&cluster, &id).remove(&0)?;
        (rs.len() >= 2).then_some(rs)
    })
    .await;
    rs.sort();
    assert_eq!(rs.len(), 2, "{rs:?}");
    assert!(rs[0].1 < rs[1].0, "ran twice at once: {rs:?}");
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}
