//! Gang rendezvous on a real cluster: a server and three agents on
//! loopback, a gang of four Python ranks that find each other using only
//! what the scheduler gives them (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE` of the `pytorch` framework, and `rendezvous.json`) and do
//! an all-reduce over TCP: each rank sends rank+1 to rank 0, which sums
//! and sends the sum back; every rank checks it is 10. Then the same gang
//! with a member killed before the all-reduce: the gang restarts whole,
//! with a new generation, and completes.

mod common;

use std::collections::BTreeSet;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;

/// One rank: waits for `$HOLD` if set, checks `rendezvous.json` against
/// its environment, then the all-reduce.
const RANK_SCRIPT: &str = r#"
import json, os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
gen = os.environ["PELOTON_GANG_GENERATION"]
with open(os.environ["PELOTON_GANG_FILE"]) as f:
    gang = json.load(f)
assert gang["size"] == world and gang["rank"] == rank, gang
assert gang["leader"]["address"] == addr, gang
assert str(gang["generation"]) == gen, gang
hold = os.environ.get("HOLD")
while hold and not os.path.exists(hold):
    time.sleep(0.05)
deadline = time.time() + 50
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, port))
    server.listen(world)
    server.settimeout(50)
    total, peers = rank + 1, []
    while len(peers) < world - 1:
        conn, _ = server.accept()
        total += int(conn.makefile().readline())
        peers.append(conn)
    for conn in peers:
        conn.sendall(b"%d\n" % total)
else:
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(b"%d\n" % (rank + 1))
    total = int(conn.makefile().readline())
print("rank=%d sum=%d gen=%s" % (rank, total, gen))
sys.exit(0 if total == world * (world + 1) // 2 else 1)
"#;

/// A gang of four ranks with the `pytorch` aliases, at most two on a host.
fn gang_job(name: &str, hold: Option<&str>) -> pb::JobSpec {
    let mut task = task_spec("");
    task.shell = String::new();
    task.command = "python3".into();
    task.args = vec!["-c".into(), RANK_SCRIPT.into()];
    task.ports = vec![pb::PortSpec {
        name: "master".into(),
    }];
    task.max_instances_per_host = 2;
    task.restart = Some(pb::RestartPolicy {
        max_failures: 2,
        backoff_ms: 100,
        max_backoff_ms: 100,
    });
    if let Some(hold) = hold {
        task.env.insert("HOLD".into(), hold.into());
    }
    let mut spec = job(name, 4, task);
    spec.sla.as_mut().expect("sla").min_running_instances = 4;
    spec.rendezvous = Some(pb::RendezvousSpec {
        framework: "pytorch".into(),
        port: String::new(),
    });
    spec
}

/// Every rank printed the sum, in generation `generation`.
async fn check_sums(cluster: &Cluster, id: &str, generation: u32) {
    for i in 0..4 {
        let out = cluster.logs(id, i, false).await;
        assert_eq!(
            out,
            format!("rank={i} sum=10 gen={generation}\n"),
            "instance {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_of_python_ranks_rendezvous_and_all_reduce_again_after_a_member_is_killed() {
    let cluster = Cluster::start(3).await;
    // Agents registered the address their tasks are reachable at: the
    // server is on this machine, so loopback.
    for h in cluster.hosts().await {
        assert_eq!(h.address, "127.0.0.1", "{}", h.name);
    }

    let id = cluster.create(gang_job("allreduce", None)).await;
    cluster.wait_job(&id, J::Succeeded).await;
    check_sums(&cluster, &id, 1).await;
    let hosts: BTreeSet<String> = cluster
        .tasks(&id)
        .await
        .into_iter()
        .map(|t| t.current.expect("run").host)
        .collect();
    assert!(hosts.len() >= 2, "at most two ranks a host: {hosts:?}");

    // The same gang, held before its all-reduce; one member is killed.
    let hold = cluster.dir.path().join("go");
    let id = cluster
        .create(gang_job("killed", Some(&hold.to_string_lossy())))
        .await;
    let running = cluster.wait_running(&id, 4).await;
    for t in &running {
        assert_eq!(t.current.as_ref().expect("run").run_id, 1);
    }
    let victim = format!("PELOTON_TASK_ID={id}-2-1");
    // The task's environment is set by its execve: a process that has it
    // is the rank itself.
    eventually("rank 2's process", async || {
        (!processes_with_env(&victim).is_empty()).then_some(())
    })
    .await;
    kill_processes_with_env(&victim);
    // The gang starts again as one: every member in a new run.
    eventually("the gang restarted whole", async || {
        let tasks = cluster.tasks(&id).await;
        (tasks.len() == 4
            && tasks.iter().all(|t| {
                let run = t.current.as_ref().expect("run");
                run.run_id == 2 && run.state() == T::Running
            }))
        .then_some(())
    })
    .await;
    std::fs::write(&hold, "").expect("marker");
    cluster.wait_job(&id, J::Succeeded).await;
    check_sums(&cluster, &id, 2).await;
}
