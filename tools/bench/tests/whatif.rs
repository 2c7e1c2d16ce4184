//! `peloton-bench whatif` end to end: a real server with simulated hosts,
//! a job that fills them with more waiting, `peloton cluster snapshot`
//! (the CLI's own code, in this process), then the `peloton-bench` binary
//! on the snapshot.

use std::time::{Duration, Instant};

use clap::Parser;
use pb::job_service_client::JobServiceClient;
use pb::resource_pool_service_client::ResourcePoolServiceClient;
use pb::task_service_client::TaskServiceClient;
use peloton_gateway::config::Config;
use peloton_proto::v1 as pb;

/// Runs for ten minutes, and says so.
const RUN_MS: u64 = 600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_live_server_replays_and_more_hosts_shorten_its_waits() {
    let dir = tempfile::tempdir().unwrap();
    // Two simulated hosts of 16 cores.
    let server = peloton_gateway::server::start(&Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        sim_hosts: 2,
        cycle_interval_ms: 5,
        secure: false,
        ..Config::default()
    })
    .await
    .unwrap();
    let url = format!("http://{}", server.addr);
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    ResourcePoolServiceClient::new(channel.clone())
        .create(pb::CreatePoolRequest {
            path: "/w".into(),
            spec: Some(pb::PoolSpec::default()),
        })
        .await
        .unwrap();
    // Twelve 8-core tasks on 32 cores: 4 run, 8 wait (two rounds).
    let job = JobServiceClient::new(channel.clone())
        .create(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                name: "fill".into(),
                owner: "ops".into(),
                pool: "/w".into(),
                instance_count: 12,
                default_task: Some(pb::TaskSpec {
                    command: "/bin/true".into(),
                    resources: Some(pb::Resources {
                        cpu: 8.0,
                        memory_mb: 1024.0,
                        ..Default::default()
                    }),
                    sim: Some(pb::SimSpec {
                        duration_ms: RUN_MS,
                        exit_code: 0,
                    }),
                    expected_runtime_ms: RUN_MS,
                    ..Default::default()
                }),
                sla: Some(pb::Sla {
                    preemptible: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let mut tasks = TaskServiceClient::new(channel);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = tasks
            .list(pb::ListTasksRequest {
                job_id: job.id.clone(),
                states: vec![pb::TaskState::Running as i32],
                from_instance: 0,
                limit: 0,
            })
            .await
            .unwrap()
            .into_inner();
        if listed.tasks.len() == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "4 tasks never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let snap = dir.path().join("snap");
    // An empty config file: none of the developer's settings.
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "{}\n").unwrap();
    let cli = peloton_cli::cli::Cli::try_parse_from([
        "peloton",
        "--server",
        &url,
        "--config",
        config.to_str().unwrap(),
        "-o",
        "json",
        "cluster",
        "snapshot",
        snap.to_str().unwrap(),
    ])
    .unwrap();
    peloton_cli::cmd::run(cli).await.unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peloton-bench"))
        .args(["whatif", "--snapshot"])
        .arg(&snap)
        .args(["--add-hosts", "4", "--add-hosts", "2", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["assumes"]
            .as_str()
            .unwrap()
            .contains("if nothing else is submitted")
    );
    let variants = report["variants"].as_array().unwrap();
    let [base, four, two, _both] = variants.as_slice() else {
        panic!("{report:#}");
    };
    assert_eq!(base["variant"], "baseline");
    assert_eq!(base["hosts"], 2);
    assert_eq!(base["total"]["waiting"], 8, "{report:#}");
    assert_eq!(base["total"]["started"], 8);
    assert_eq!(base["stopped"], "all started and ended");
    // The waiting wait for the running to end (their declared estimate,
    // less what they already ran), then four more for the last four.
    let max = |v: &serde_json::Value| v["total"]["wait_max_s"].as_f64().unwrap();
    let run_s = RUN_MS as f64 / 1000.0;
    assert!(
        max(base) > run_s && max(base) <= 2.0 * run_s,
        "{:#}",
        base["total"]
    );
    assert_eq!(base["pools"][0]["pool"], "/w");
    // Four more hosts (two tasks each) take the whole queue at once; two
    // more take half of it at once and the rest in one round, not two.
    assert_eq!(four["hosts"], 6);
    assert_eq!(max(four), 0.0, "{:#}", four["total"]);
    assert!(max(two) > 0.0 && max(two) < max(base), "{:#}", two["total"]);

    // The table says the same, and what it assumes.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peloton-bench"))
        .args(["whatif", "--snapshot"])
        .arg(&snap)
        .args(["--add-hosts", "4", "--pool", "/w:share=2"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    assert!(out.status.success());
    assert!(table.contains("if nothing else is submitted"), "{table}");
    assert!(table.contains("--add-hosts 4"), "{table}");
    assert!(table.contains("/w "), "{table}");

    // A change the snapshot cannot take: refused, naming the flag.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peloton-bench"))
        .args(["whatif", "--snapshot"])
        .arg(&snap)
        .args(["--pool", "/nope:share=2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--pool /nope:share=2: no pool /nope in the snapshot"),
        "{err}"
    );
}
