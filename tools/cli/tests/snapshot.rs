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
