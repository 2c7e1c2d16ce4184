//! Accounting end to end: the `peloton` binary against a real, secure
//! server on 127.0.0.1 (port 0) with simulated hosts (whose runs report
//! synthetic usage every 10 s). Ended runs are accounted with what they
//! asked for and used, `job usage` and `usage` answer from stored records
//! across a restart, a job's owner is the token that created it, and bad
//! input is refused naming the field.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use arrow_array::{Array, Float64Array, RecordBatch, StringArray, UInt64Array};
use peloton_gateway::config::Config;
use serde_json::Value;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

async fn peloton(server: &str, token: &str, args: &[&str]) -> Output {
    let mut cmd = common::cli();
    cmd.env("PELOTON_TOKEN", token)
        .arg("--server")
        .arg(server)
        .args(args);
    cmd.output().await.expect("the CLI runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn ok(server: &str, token: &str, args: &[&str]) -> String {
    let out = peloton(server, token, args).await;
    assert!(
        out.status.success(),
        "peloton {args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

async fn ok_json(server: &str, token: &str, args: &[&str]) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    let out = ok(server, token, &all).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("peloton {args:?}: not JSON ({e}): {out}"))
}

/// Fails with a non-zero exit and a message naming `needle`.
async fn fails(server: &str, args: &[&str], needle: &str) {
    let out = peloton(server, common::ADMIN_TOKEN, args).await;
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains(needle),
        "peloton {args:?}: expected a failure naming {needle:?}, got {:?}: {}{err}",
        out.status.code(),
        text(&out.stdout)
    );
}

async fn start_server(data_dir: &Path) -> peloton_gateway::server::Server {
    peloton_gateway::server::start(&Config {
        data_dir: data_dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        sim_hosts: 2,
        cycle_interval_ms: 5,
        ..common::secure_config()
    })
    .await
    .unwrap()
}

/// A batch job of `n` one-core instances that each run `ms` on simulated
/// hosts; its spec names an owner the server must not believe.
fn job_file(dir: &Path, name: &str, n: u32, ms: u64) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nowner: someone-else\ntype: batch\npool: /demo\ninstances: {n}\n\
             task:\n  command: /bin/true\n  resources: {{cpu: 1, memory_mb: 64}}\n  \
             sim: {{duration_ms: {ms}, exit_code: 0}}\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_runs_are_accounted_by_owner_and_kept_across_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let admin = common::ADMIN_TOKEN;
    let server = start_server(data.path()).await;
    let url = common::url(server.addr);
    let pools = examples().join("pools.yaml");
    ok(&url, admin, &["respool", "create", pools.to_str().unwrap()]).await;
    let ana = ok_json(
        &url,
        admin,
        &["token", "create", "ana", "--grant", "submitter:/demo"],
    )
    .await["secret"]
        .as_str()
        .unwrap()
        .to_owned();

    // Ana's job runs 12 s: long enough for its hosts to report usage at
    // least once (every 10 s). The admin's runs 1 s.
    let long = job_file(files.path(), "long", 2, 12_000);
    let short = job_file(files.path(), "short", 1, 1_000);
    let created = ok_json(
        &url,
        &ana,
        &["job", "create", long.to_str().unwrap(), "--wait"],
    )
    .await;
    let long_id = created["job"]["id"].as_str().expect("job id").to_owned();
    let created = ok_json(
        &url,
        admin,
        &["job", "create", short.to_str().unwrap(), "--wait"],
    )
    .await;
    let short_id = created["job"]["id"].as_str().expect("job id").to_owned();

    let usage = ok_json(&url, admin, &["job", "usage", &long_id]).await;
    let runs = usage["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{usage}");
    for r in runs {
        assert_eq!(r["state"], "succeeded", "{r}");
        assert_eq!(r["owner"], "ana", "the token's name, not the spec's: {r}");
        assert_eq!(r["job_name"], "long", "{r}");
        assert_eq!(r["pool"], "/demo", "{r}");
        let wall = r["wall_ms"].as_u64().unwrap();
        assert!((12_000..20_000).contains(&wall), "{r}");
        // One core for the wall time.
        let requested = r["cpu_requested_core_seconds"].as_f64().unwrap();
        assert!((requested - wall as f64 / 1000.0).abs() < 1e-6, "{r}");
        // Simulated runs use a tenth to nine tenths of their request.
        let used = r["cpu_used_core_seconds"].as_f64().unwrap();
        assert!(used > 0.0 && used < requested, "{r}");
        assert!(r["memory_peak_bytes"].as_u64().unwrap() > 0, "{r}");
        // Measured during the run (simulated hosts share the server's clock).
        let measured = r["used_until_ms"].as_u64().unwrap();
        assert!(
            measured > r["started_at_ms"].as_u64().unwrap()
                && measured <= r["finished_at_ms"].as_u64().unwrap(),
            "{r}"
        );
        assert!(!r["host"].as_str().unwrap().is_empty(), "{r}");
    }
    let table = ok(&url, admin, &["job", "usage", &long_id]).await;
    assert!(
        table.contains("CPU USED (core-s)") && table.matches("succeeded").count() == 2,
        "{table}"
    );

    // `task get` shows its ended runs' accounts too.
    let task = ok_json(&url, admin, &["task", "get", &long_id, "1"]).await;
    let mine: Vec<Value> = runs
        .iter()
        .filter(|r| r["instance"] == 1)
        .cloned()
        .collect();
    assert_eq!(task["task"]["usage"].as_array().unwrap(), &mine, "{task}");
    let table = ok(&url, admin, &["task", "get", &long_id, "1"]).await;
    assert!(table.contains("USAGE OF ENDED RUNS"), "{table}");

    let by_owner = ok_json(&url, admin, &["usage", "--by", "owner"]).await;
    let sums = by_owner["sums"].as_array().expect("sums");
    let keys: Vec<(&str, u64)> = sums
        .iter()
        .map(|s| (s["key"].as_str().unwrap(), s["runs"].as_u64().unwrap()))
        .collect();
    assert_eq!(keys, [("admin", 1), ("ana", 2)], "{by_owner}");
    let by_job = ok_json(&url, admin, &["usage", "--by", "job", "--since", "1h"]).await;
    assert_eq!(by_job["sums"].as_array().unwrap().len(), 2, "{by_job}");
    // Nothing ended before an hour ago.
    let none = ok_json(&url, admin, &["usage", "--until", "1h"]).await;
    assert_eq!(none["sums"].as_array().unwrap().len(), 0, "{none}");

    // A restart on the same data: the same records, from the store.
    server.shutdown().await.unwrap();
    let server = start_server(data.path()).await;
    let url = common::url(server.addr);
    let again = ok_json(&url, admin, &["job", "usage", &long_id]).await;
    assert_eq!(again, usage, "the records survive a restart");
    let again = ok_json(&url, admin, &["usage", "--by", "owner"]).await;
    assert_eq!(again, by_owner);
    let short_usage = ok_json(&url, admin, &["job", "usage", &short_id]).await;
    assert_eq!(short_usage["runs"][0]["owner"], "admin", "{short_usage}");

    // The records as Arrow IPC, for notebooks: one row per run.
    let arrow = files.path().join("usage.arrow");
    ok(&url, admin, &["usage", "--arrow", arrow.to_str().unwrap()]).await;
    let reader =
        arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&arrow).unwrap(), None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!(b.num_rows(), 3);
    let column = |name: &str| b.column_by_name(name).unwrap_or_else(|| panic!("{name}"));
    let owners = column("owner")
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let used = column("cpu_used_core_seconds")
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    let mut owners: Vec<&str> = (0..3).map(|i| owners.value(i)).collect();
    owners.sort_unstable();
    assert_eq!(owners, ["admin", "ana", "ana"]);
    // Ana's runs were measured (the admin's 1 s run may have ended before
    // its host reported).
    let measured = (0..3).filter(|&i| used.value(i) > 0.0).count();
    assert!(measured >= 2, "{measured}");
    for r in runs {
        let seq = r["seq"].as_u64().unwrap();
        let seqs = column("seq")
            .as_any()
            .downcast_ref::<UInt64Array>()
            .unwrap();
        assert!(seqs.values().contains(&seq), "{r}");
    }

    // Bad input: named, and a non-zero exit.
    fails(&url, &["job", "usage", "no-such-job"], "no-such-job").await;
    fails(&url, &["usage", "--since", "yesterday"], "--since").await;
    fails(
        &url,
        &["usage", "--until", "2026-13-01T00:00:00Z"],
        "--until",
    )
    .await;
    fails(&url, &["usage", "--by", "team"], "--by").await;
    fails(
        &url,
        &["usage", "--since", "1h", "--until", "2h"],
        "until_ms",
    )
    .await;
    server.shutdown().await.unwrap();
}
