//! `peloton cluster snapshot DIR` against a real server with simulated
//! hosts: the Arrow IPC files hold every host and every task. The server
//! is secure (see `common`).

mod common;

use std::path::PathBuf;
use std::process::Output;

use arrow_array::{Array, Float64Array, RecordBatch, StringArray, UInt32Array};
use peloton_gateway::config::Config;

async fn peloton(server: &str, args: &[&str]) -> Output {
    common::cli()
        .arg("--server")
        .arg(server)
        .args(args)
        .output()
        .await
        .expect("the CLI runs")
}

fn read(path: &std::path::Path) -> RecordBatch {
    let file = std::fs::File::open(path).unwrap();
    let reader = arrow_ipc::reader::FileReader::try_new(file, None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 1);
    batches.into_iter().next().unwrap()
}

fn strings<'a>(batch: &'a RecordBatch, name: &str) -> &'a StringArray {
    batch
        .column_by_name(name)
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_writes_hosts_and_tasks_as_arrow() {
    let dir = tempfile::tempdir().unwrap();
    let server = peloton_gateway::server::start(&Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        sim_hosts: 3,
        cycle_interval_ms: 5,
        ..common::secure_config()
    })
    .await
    .unwrap();
    let url = common::url(server.addr);
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let ex = |f: &str| examples.join(f).to_string_lossy().into_owned();
    let out = peloton(&url, &["respool", "create", &ex("pools.yaml")]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = peloton(&url, &["job", "create", &ex("hello.yaml"), "--wait"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let snap = dir.path().join("snap");
    let out = peloton(
        &url,
        &[
            "--output",
            "json",
            "cluster",
            "snapshot",
            snap.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["hosts"], 3);
    assert_eq!(summary["jobs"], 1);
    assert!(summary["taken_at_ms"].as_u64().unwrap() > 0);

    let hosts = read(&snap.join("hosts.arrow"));
    assert_eq!(hosts.num_rows(), 3);
    let names = strings(&hosts, "name");
    assert_eq!(
        (0..3).map(|i| names.value(i)).collect::<Vec<_>>(),
        ["sim-00000", "sim-00001", "sim-00002"]
    );
    assert_eq!(strings(&hosts, "state").value(0), "up");
    let cpu = hosts
        .column_by_name("capacity_cpu")
        .unwrap()
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    assert!(cpu.value(0) > 0.0);

    let tasks = read(&snap.join("tasks.arrow"));
    let n = summary["tasks"].as_u64().unwrap() as usize;
    assert!(n > 0);
    assert_eq!(tasks.num_rows(), n);
    let states = strings(&tasks, "state");
    let task_hosts = strings(&tasks, "host");
    for i in 0..n {
        assert_eq!(states.value(i), "succeeded");
        assert!(task_hosts.value(i).starts_with("sim-"), "ran on a host");
    }
    let instances = tasks
        .column_by_name("instance")
        .unwrap()
        .as_any()
        .downcast_ref::<UInt32Array>()
        .unwrap();
    assert_eq!(instances.value(0), 0);
    assert!(tasks.column_by_name("request_cpu").unwrap().null_count() == 0);
    // What a replay needs: priority, gang size, when the job was created.
    let gang = tasks
        .column_by_name("gang_size")
        .unwrap()
        .as_any()
        .downcast_ref::<UInt32Array>()
        .unwrap();
    assert_eq!(gang.value(0), 1, "not a gang");
    let max_running = tasks
        .column_by_name("max_running_instances")
        .unwrap()
        .as_any()
        .downcast_ref::<UInt32Array>()
        .unwrap();
    assert_eq!(max_running.value(0), 0, "no running limit");
    assert_eq!(strings(&tasks, "job_type").value(0), "batch");
    assert_eq!(
        tasks
            .column_by_name("job_created_at_ms")
            .unwrap()
            .null_count(),
        0
    );
    for name in [
        "priority",
        "preemptible",
        "expected_runtime_ms",
        "expected_runtime_source",
    ] {
        assert!(tasks.column_by_name(name).is_some(), "{name}");
    }
    // Every file carries the snapshot's time.
    assert_eq!(
        tasks.schema().metadata()["peloton.snapshot.taken_at_ms"],
        summary["taken_at_ms"].to_string()
    );

    // The pool tree, parents first, with each pool's spec.
    let pools = read(&snap.join("pools.arrow"));
    assert_eq!(
        summary["pools"].as_u64().unwrap() as usize,
        pools.num_rows()
    );
    let paths = strings(&pools, "path");
    let parents = strings(&pools, "parent");
    let row = |path: &str| (0..pools.num_rows()).find(|&i| paths.value(i) == path);
    let demo = row("/demo").expect("/demo is in pools.arrow");
    let web = row("/prod/web").expect("/prod/web is in pools.arrow");
    assert!(row("/prod").unwrap() < web, "parents first");
    assert_eq!(parents.value(web), "/prod");
    assert_eq!(parents.value(demo), "/");
    let f64s = |name: &str| {
        pools
            .column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap()
            .clone()
    };
    assert_eq!(f64s("reservation_cpu").value(demo), 16.0);
    assert_eq!(f64s("limit_cpu").value(demo), 64.0);
    assert_eq!(f64s("reservation_disk_mb").value(demo), 102400.0);
    assert_eq!(f64s("share").value(row("/prod").unwrap()), 2.0);
    assert_eq!(f64s("controller_limit_pct").value(web), 20.0);
    assert_eq!(strings(&pools, "kind").value(demo), "elastic");

    // A file where the directory should be: a clear error, exit non-zero.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = peloton(&url, &["cluster", "snapshot", file.to_str().unwrap()]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
