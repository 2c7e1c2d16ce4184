//! Preemption that respects checkpoints, with a real server and agent: of
//! two equal running tasks of a pool over its entitlement, the one that
//! touched its `$PELOTON_CHECKPOINT` (and so loses the least work) is the
//! victim; it finds the reason in `$PELOTON_PREEMPTED` when its notice
//! (SIGTERM) comes, saves again during the notice, and is stopped with its
//! own stop signal once the notice is over; the preemption shows the work it
//! cost.

mod common;

use common::{Cluster, ClusterOptions, eventually, job, task_spec};
use peloton_proto::v1 as pb;

/// Instance 0 checkpoints once it runs; every instance reports its notice
/// (with the marker's reason) and saves again, and says when its stop
/// signal (SIGINT) comes.
const SCRIPT: &str = r#"
trap 'echo "notice: $(cat "$PELOTON_PREEMPTED")"; touch "$PELOTON_CHECKPOINT"; echo saved' TERM
trap 'echo stopped; exit 0' INT
if [ "$PELOTON_INSTANCE_ID" = 0 ]; then sleep 0.5; touch "$PELOTON_CHECKPOINT"; echo checkpointed; fi
while :; do sleep 0.1; done
"#;

/// The run `run` of `task`, current or in its history.
fn run_of(task: &pb::Task, run: u32) -> Option<pb::TaskRun> {
    task.current
        .iter()
        .chain(&task.history)
        .find(|r| r.run_id == run)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_victim_is_the_equal_task_that_checkpointed_and_it_gets_its_notice() {
    let cluster = Cluster::start_with(
        1,
        ClusterOptions {
            agent_resources: "cpu=2,mem=4096,disk=10000".into(),
            ..Default::default()
        },
    )
    .await;
    // Pool /t (reserved 1 core) borrows the idle /u's core.
    cluster.create_small_pool("/u").await;
    let mut task = task_spec(SCRIPT);
    task.resources = Some(pb::Resources {
        cpu: 1.0,
        memory_mb: 128.0,
        ..Default::default()
    });
    task.preemption_notice_ms = 2_000;
    task.stop_signal = "SIGINT".into();
    let low = cluster.create(job("low", 2, task)).await;
    cluster.wait_running(&low, 2).await;
    // Instance 0 checkpointed after both started: it would lose less work.
    let checkpoint_ms = eventually("instance 0's checkpoint reported", async || {
        let t = cluster.task(&low, 0).await?;
        let at = t.current?.last_checkpoint_ms;
        (at > 0).then_some(at)
    })
    .await;

    // /u's demand takes its core back: /t is over its entitlement by one.
    let mut urgent = task_spec("sleep 600");
    urgent.resources = Some(pb::Resources {
        cpu: 1.0,
        memory_mb: 128.0,
        ..Default::default()
    });
    let mut spec = job("urgent", 1, urgent);
    spec.pool = "/u".into();
    let urgent = cluster.create(spec).await;
    cluster.wait_running(&urgent, 1).await;

    // Instance 0 was preempted, not instance 1 (the newer, without a
    // checkpoint, which went before checkpoints counted).
    let t0 = cluster.task(&low, 0).await.expect("instance 0");
    let preempted = run_of(&t0, 1).expect("instance 0's first run");
    assert_eq!(preempted.state(), pb::TaskState::Preempted, "{t0:#?}");
    let t1 = cluster.task(&low, 1).await.expect("instance 1");
    let current = t1.current.as_ref().expect("current run");
    assert_eq!(
        (current.run_id, current.state()),
        (1, pb::TaskState::Running),
        "{t1:#?}"
    );
    // The preemption says what it cost, counted from the checkpoint.
    let lost = preempted
        .reason
        .split("lost work: ")
        .nth(1)
        .and_then(|r| r.strip_suffix(" ms since its last checkpoint"))
        .and_then(|ms| ms.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no lost work in {:?}", preempted.reason));
    assert!(
        preempted
            .reason
            .starts_with("preempted: pool over its entitlement in cpu"),
        "{}",
        preempted.reason
    );
    assert!(lost > 0, "{}", preempted.reason);

    // The task heard its notice with the reason, saved, and was stopped by
    // its own stop signal after the notice; its saving during the notice
    // was reported, so the preemption cost nothing in the end.
    let stdout = eventually("the victim's stop", async || {
        let (_, _, dir) = cluster
            .sandboxes()
            .into_iter()
            .find(|(_, name, _)| name.starts_with(&format!("{low}-0-1-")))?;
        let out = std::fs::read_to_string(dir.join("stdout")).ok()?;
        out.contains("stopped").then_some(out)
    })
    .await;
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "checkpointed", "{stdout}");
    assert!(
        lines[1].starts_with("notice: preempted: pool over its entitlement in cpu"),
        "{stdout}"
    );
    assert!(lines[1].ends_with("since its last checkpoint"), "{stdout}");
    assert_eq!(lines[2..], ["saved", "stopped"], "{stdout}");
    let ended = eventually("the victim's end recorded", async || {
        let t = cluster.task(&low, 0).await?;
        let r = run_of(&t, 1)?;
        (r.finished_at_ms > 0 && r.last_checkpoint_ms > checkpoint_ms).then_some(r)
    })
    .await;
    assert_eq!(ended.lost_work_ms, 0, "{ended:#?}");
}
