//! GPUs in the task, on a real server and agent: the agent finds 6 GPUs
//! through a fake `nvidia-smi` on its `PATH` (there is no GPU here), and
//! every task sees in its environment exactly the devices the engine gave
//! it, as the API reads them: whole-GPU tasks never share a device, a
//! half-GPU task gets its share (`PELOTON_GPU_SHARE_MILLI`). A server restarted while they run takes them
//! over on the devices they were started with, so new work goes to the
//! device they left free, not to one a running task uses.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{Cluster, ClusterOptions, eventually, job, task_spec};
use peloton_proto::v1 as pb;

const GPUS: u32 = 6;

/// A directory holding an `nvidia-smi` that answers the agent's question
/// (`--query-gpu=index --format=csv,noheader`) with `GPUS` devices, and the
/// `PATH` that puts it first.
fn fake_nvidia_smi(dir: &Path) -> OsString {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let script = bin.join("nvidia-smi");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = --query-gpu=index ] || exit 9\nseq 0 {}\n",
            GPUS - 1
        ),
    )
    .expect("write nvidia-smi");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut path = bin.into_os_string();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    path
}

/// A job of `n` tasks asking `gpu` GPUs each, in pool /g, that write their
/// environment to `env` in their sandbox and keep running.
fn gpu_job(name: &str, n: u32, gpu: f64) -> pb::JobSpec {
    let mut task = task_spec(
        "env > \"$PELOTON_SANDBOX/env.tmp\" && mv \"$PELOTON_SANDBOX/env.tmp\" \
         \"$PELOTON_SANDBOX/env\"; exec sleep 600",
    );
    task.resources.as_mut().expect("resources").gpu = gpu;
    // The spec's own value is overwritten by the agent's.
    task.env
        .insert("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3,4,5".into());
    let mut spec = job(name, n, task);
    spec.pool = "/g".into();
    spec
}

/// A running task as the API reads it, with the environment it wrote.
struct Seen {
    name: String,
    api: Vec<u32>,
    share_milli: u32,
    env: BTreeMap<String, String>,
}

impl Seen {
    /// The devices its environment names (CUDA_VISIBLE_DEVICES).
    fn devices(&self) -> Vec<u32> {
        let list = self.env.get("CUDA_VISIBLE_DEVICES").expect("set");
        list.split(',')
            .filter(|d| !d.is_empty())
            .map(|d| d.parse().expect("a device index"))
            .collect()
    }
}

async fn seen(cluster: &Cluster, id: &str, i: u32, name: &str) -> Seen {
    eventually(
        &format!("{name}/{i} running with its env written"),
        async || {
            let t = cluster.task(id, i).await?;
            let run = t.current?;
            if run.state() != pb::TaskState::Running {
                return None;
            }
            let file = cluster
                .work_dir("a0")
                .join("sandboxes")
                .join(format!("{id}-{i}-{}-{}", run.run_id, run.launch_id))
                .join("env");
            let text = std::fs::read_to_string(file).ok()?;
            let env = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Some(Seen {
                name: format!("{name}/{i}"),
                api: run.gpu_devices,
                share_milli: run.gpu_share_milli,
                env,
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_sees_the_devices_the_engine_gave_it() {
    let fake = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start_with(
        1,
        ClusterOptions {
            // No gpu= here: the agent asks nvidia-smi.
            agent_resources: "cpu=8,mem=8192,disk=10000".into(),
            agent_env: vec![("PATH".into(), fake_nvidia_smi(fake.path()))],
            ..Default::default()
        },
    )
    .await;
    let hosts = cluster.hosts().await;
    let capacity = hosts[0].capacity.expect("capacity");
    assert_eq!(capacity.gpu, f64::from(GPUS), "{:?}", hosts[0]);
    let mut pools = cluster.c.pools.clone();
    pools
        .create(pb::CreatePoolRequest {
            path: "/g".into(),
            spec: Some(pb::PoolSpec {
                reservation: Some(pb::Resources {
                    cpu: 4.0,
                    memory_mb: 2048.0,
                    gpu: f64::from(GPUS),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .expect("pool /g");

    // The first takes device 0 and gives it back later.
    let first = cluster.create(gpu_job("first", 1, 1.0)).await;
    let first_seen = seen(&cluster, &first, 0, "first").await;
    assert_eq!(first_seen.api, [0]);
    // (A task asking no GPU is not placed on a GPU host: the engine keeps
    // them for GPU work. The agent's unit tests show what it would see.)
    let jobs = [("one", 2, 1.0), ("two", 1, 2.0), ("half", 1, 0.5)];
    let mut ids = Vec::new();
    for (name, n, gpu) in jobs {
        ids.push((name, n, gpu, cluster.create(gpu_job(name, n, gpu)).await));
    }
    // (GPUs asked, what was seen), first's included.
    let mut all = vec![(1.0, first_seen)];
    for (name, n, gpu, id) in &ids {
        for i in 0..*n {
            all.push((*gpu, seen(&cluster, id, i, name).await));
        }
    }
    let mut used = BTreeSet::new();
    for (gpu, s) in &all {
        let name = &s.name;
        assert_eq!(
            s.devices(),
            s.api,
            "{name}: its env is the engine's: {:?}",
            s.env
        );
        assert_eq!(s.api.len(), gpu.ceil() as usize, "{name}: {:?}", s.api);
        let list = s.env["CUDA_VISIBLE_DEVICES"].clone();
        assert_eq!(s.env["NVIDIA_VISIBLE_DEVICES"], list, "{name}");
        assert_eq!(s.env["PELOTON_GPU_DEVICES"], list, "{name}");
        assert_eq!(s.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID", "{name}");
        let share = if *gpu < 1.0 { 500 } else { 0 };
        assert_eq!(s.share_milli, share, "{name}");
        assert_eq!(
            s.env.get("PELOTON_GPU_SHARE_MILLI").map(String::as_str),
            (share > 0).then_some("500"),
            "{name}"
        );
        for d in &s.api {
            assert!(*d < GPUS, "{name}: device {d}");
            // No two tasks share a device (the half one has it alone
            // here: whole-GPU tasks take only wholly free devices).
            assert!(used.insert(*d), "{name}: device {d} given twice: {used:?}");
        }
    }
    assert_eq!(used.len(), 6, "every device in use: {used:?}");
    // `peloton task list -o json` shows them too.
    let two_id = &ids[1].3;
    let out = cluster
        .cli()
        .args(["task", "list", two_id, "-o", "json"])
        .output()
        .await
        .expect("peloton runs");
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        listed["tasks"][0]["current"]["gpu_devices"],
        serde_json::json!(all[3].1.api),
        "{listed}"
    );

    // Device 0 goes back; the server restarts while the rest run.
    cluster.kill_job(&first).await;
    cluster.wait_job(&first, pb::JobState::Killed).await;
    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    cluster.start_server().await;
    // New work gets device 0, the one the running tasks left free.
    let after = cluster.create(gpu_job("after", 1, 1.0)).await;
    let after_seen = seen(&cluster, &after, 0, "after").await;
    assert_eq!(after_seen.api, [0], "{:?}", after_seen.env);
    assert_eq!(after_seen.devices(), [0]);
    // And the API still shows each running task on its devices.
    let mut k = 1;
    for (name, n, _, id) in &ids {
        for i in 0..*n {
            let t = cluster.task(id, i).await.expect("task");
            let run = t.current.expect("run");
            assert_eq!(run.run_id, 1, "{name}/{i} was taken over, not restarted");
            assert_eq!(
                run.gpu_devices, all[k].1.api,
                "{name}/{i} after the restart"
            );
            assert_eq!(run.gpu_devices, all[k].1.devices(), "{name}/{i}");
            k += 1;
        }
    }
}
