//! An elastic gang on a real cluster: a server and two agents of two cores,
//! a gang of one-core Python members that may run with 2 to 4 members.
//! With two cores taken by other work it starts with 2; when that work
//! ends it grows to 4 without restarting the first two; when another pool
//! takes a core back one member is preempted and the other 3 go on; once
//! that pool's work ends the fourth joins again. Each member follows its
//! gang only through `rendezvous.json`, which its agent rewrites at every
//! change (a new generation), and prints each membership it sees.

mod common;

use common::{Cluster, ClusterOptions, eventually, job, task_spec};
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;

/// A member: prints every membership its `rendezvous.json` shows (a new
/// generation), until `$STOP` exists.
const MEMBER: &str = r#"
import json, os, sys, time
path, stop = os.environ["PELOTON_GANG_FILE"], os.environ["STOP"]
seen = None
while True:
    try:
        with open(path) as f:
            g = json.load(f)
    except (OSError, ValueError):
        g = None
    if g is not None and g["generation"] != seen:
        seen = g["generation"]
        me = g["members"][g["rank"]]["instance"]
        assert me == int(os.environ["PELOTON_INSTANCE_ID"]), g
        assert [m["rank"] for m in g["members"]] == list(range(g["size"])), g
        print("gen=%d size=%d rank=%d" % (g["generation"], g["size"], g["rank"]), flush=True)
    if os.path.exists(stop):
        sys.exit(0)
    time.sleep(0.05)
"#;

fn one_core(mut task: pb::TaskSpec) -> pb::TaskSpec {
    task.resources = Some(pb::Resources {
        cpu: 1.0,
        memory_mb: 128.0,
        ..Default::default()
    });
    task
}

/// The sizes instance `i`'s current run printed, in order.
async fn sizes(cluster: &Cluster, id: &str, i: u32) -> Vec<u32> {
    cluster
        .logs(id, i, false)
        .await
        .lines()
        .filter_map(|l| l.split("size=").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// The running instances of job `id` and their runs.
async fn running(cluster: &Cluster, id: &str) -> Vec<(u32, u32)> {
    cluster
        .tasks(id)
        .await
        .into_iter()
        .filter_map(|t| {
            let run = t.current?;
            (run.state() == T::Running).then_some((t.instance, run.run_id))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elastic_gang_starts_with_two_grows_to_four_and_shrinks_to_three() {
    let cluster = Cluster::start_with(
        2,
        ClusterOptions {
            agent_resources: "cpu=2,mem=4096,disk=10000".into(),
            ..Default::default()
        },
    )
    .await;
    cluster.create_small_pool("/u").await;

    // Two cores taken by other work of the same pool.
    let blocker = cluster
        .create(job("blocker", 2, one_core(task_spec("sleep 600"))))
        .await;
    cluster.wait_running(&blocker, 2).await;

    let stop = cluster.dir.path().join("stop");
    let mut task = one_core(task_spec(""));
    task.shell = String::new();
    task.command = "python3".into();
    task.args = vec!["-c".into(), MEMBER.into()];
    task.env
        .insert("STOP".into(), stop.to_string_lossy().into_owned());
    let mut spec = job("elastic", 4, task);
    let sla = spec.sla.as_mut().expect("sla");
    sla.min_running_instances = 4;
    sla.elastic_min_instances = 2;
    sla.preemptible = true;
    let id = cluster.create(spec).await;

    // It starts with the two members that fit.
    let first = cluster.wait_running(&id, 2).await;
    let first: Vec<u32> = first.iter().map(|t| t.instance).collect();
    eventually("both members saw a gang of 2", async || {
        for &i in &first {
            if sizes(&cluster, &id, i).await != [2] {
                return None;
            }
        }
        Some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(running(&cluster, &id).await.len(), 2, "no room for more");

    // The other work ends: it grows to 4, the first two not restarted.
    cluster.kill_job(&blocker).await;
    eventually("4 members", async || {
        (running(&cluster, &id).await.len() == 4).then_some(())
    })
    .await;
    for &i in &first {
        let t = cluster.task(&id, i).await.expect("task");
        assert_eq!(
            t.current.expect("run").run_id,
            1,
            "instance {i} kept its run"
        );
    }
    eventually("every member saw a gang of 4", async || {
        for i in 0..4 {
            if sizes(&cluster, &id, i).await.last() != Some(&4) {
                return None;
            }
        }
        Some(())
    })
    .await;

    // Pool /u takes its core back: one member is preempted, 3 go on.
    let mut urgent = job("urgent", 1, one_core(task_spec("sleep 600")));
    urgent.pool = "/u".into();
    let urgent = cluster.create(urgent).await;
    cluster.wait_running(&urgent, 1).await;
    let three = eventually("3 members", async || {
        let r = running(&cluster, &id).await;
        (r.len() == 3).then_some(r)
    })
    .await;
    let preempted: Vec<u32> = (0..4)
        .filter(|i| !three.iter().any(|&(j, _)| j == *i))
        .collect();
    let [preempted] = preempted[..] else {
        panic!("one member preempted: {three:?}");
    };
    let t = cluster.task(&id, preempted).await.expect("task");
    let first_run = t
        .current
        .iter()
        .chain(&t.history)
        .find(|r| r.run_id == 1)
        .expect("its first run");
    assert_eq!(first_run.state(), T::Preempted, "{t:#?}");
    for &(i, run) in &three {
        if first.contains(&i) {
            assert_eq!(run, 1, "instance {i} was not restarted");
        }
    }
    eventually("the 3 saw a gang of 3", async || {
        for &(i, _) in &three {
            if sizes(&cluster, &id, i).await.last() != Some(&3) {
                return None;
            }
        }
        Some(())
    })
    .await;

    // /u's work ends: the fourth joins again; then all stop.
    cluster.kill_job(&urgent).await;
    eventually("4 members again", async || {
        (running(&cluster, &id).await.len() == 4).then_some(())
    })
    .await;
    eventually("every member saw a gang of 4 again", async || {
        for i in 0..4 {
            if sizes(&cluster, &id, i).await.last() != Some(&4) {
                return None;
            }
        }
        Some(())
    })
    .await;
    // A member there from the start saw every membership: 2, 4, 3, 4.
    for &i in &first {
        if three.iter().any(|&(j, _)| j == i) {
            let seen = sizes(&cluster, &id, i).await;
            let mut collapsed = seen.clone();
            collapsed.dedup();
            assert!(
                collapsed == [2, 4, 3, 4] || collapsed == [2, 3, 4, 3, 4],
                "instance {i} saw {seen:?}"
            );
        }
    }
    std::fs::write(&stop, "").expect("stop marker");
    cluster.wait_job(&id, J::Succeeded).await;
}
