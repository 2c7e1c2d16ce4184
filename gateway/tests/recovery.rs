//! The real `pelotond` binary: a SIGKILL while tasks run loses no
//! acknowledged job, SIGTERM shuts down cleanly, and a store written by a
//! newer pelotond is refused at start.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SIM_HOSTS: u32 = 4;

/// Starts `pelotond` on `data_dir` and returns it with its gRPC address,
/// read from the line it prints once serving.
async fn spawn_daemon(data_dir: &Path) -> (Child, std::net::SocketAddr) {
    // Secure, as every server: the tests' certificates and admin token.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pelotond"))
        .args(pelotond_secure_args())
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0", "--no-metrics"])
        .args(["--sim-hosts", &SIM_HOSTS.to_string()])
        .args(["--cycle-interval-ms", "5"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("pelotond starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let addr = within("pelotond to print its address", async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(url) = line.strip_prefix("pelotond: serving gRPC on https://") {
                return url.trim().parse().expect("address");
            }
        }
        panic!("pelotond exited before serving");
    })
    .await;
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

async fn sigterm(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_no_acknowledged_job() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut child, addr) = spawn_daemon(dir.path()).await;
    let mut c = Clients::connect(addr).await;
    create_reserved_pool(&mut c, "/a").await;
    let mut ids = Vec::new();
    for k in 0..5u64 {
        // 5 × 20 one-core tasks of 300–1500 ms on 80 cores: some queue.
        let job = create_job(&mut c, job_spec("/a", 20, 1.0, 300 + 300 * k)).await;
        ids.push(job.id);
    }
    // Crash while tasks run.
    let mut cc = c.clone();
    eventually("tasks running before the crash", TIMEOUT, async || {
        let mut running = 0;
        for id in &ids {
            running += count_in(
                &get_job(&mut cc, id).await.map_err(|e| e.to_string())?,
                T::Running,
            );
        }
        if running >= 20 {
            Ok(())
        } else {
            Err(format!("{running} running"))
        }
    })
    .await;
    child.kill().await.expect("SIGKILL");
    drop(c);

    let (mut child, addr) = spawn_daemon(dir.path()).await;
    let mut c = Clients::connect(addr).await;
    let q = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    let mut found: Vec<String> = q.jobs.iter().map(|j| j.id.clone()).collect();
    found.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(found, want, "acknowledged jobs after the crash");
    let mut lost_runs = 0;
    for id in &ids {
        let done = wait_job(&c, id, J::Succeeded).await;
        assert_eq!(count_in(&done, T::Succeeded), 20, "{done:?}");
        for t in list_tasks(&mut c, id).await {
            lost_runs += t.history.iter().filter(|r| r.state() == T::Lost).count();
        }
    }
    assert!(
        lost_runs > 0,
        "no run was recorded as lost across the crash"
    );
    sigterm(&child).await;
    let status = within("pelotond to exit", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_and_keeps_everything() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut child, addr) = spawn_daemon(dir.path()).await;
    let mut c = Clients::connect(addr).await;
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 3, 1.0, 20)).await;
    wait_job(&c, &job.id, J::Succeeded).await;
    sigterm(&child).await;
    let status = within("pelotond to exit after SIGTERM", child.wait())
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
    drop(c);

    let (mut child, addr) = spawn_daemon(dir.path()).await;
    let mut c = Clients::connect(addr).await;
    get_pool(&mut c, "/a").await;
    let j = get_job(&mut c, &job.id).await.expect("job after restart");
    assert_eq!(job_state(&j), J::Succeeded);
    child.kill().await.expect("SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_watch_open_exits_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut child, addr) = spawn_daemon(dir.path()).await;
    let mut c = Clients::connect(addr).await;
    let mut stream = c
        .watch
        .watch(pb::WatchRequest::default())
        .await
        .expect("watch")
        .into_inner();
    sigterm(&child).await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let status = match status {
        Ok(s) => s.expect("wait"),
        Err(_) => {
            child.kill().await.expect("SIGKILL");
            panic!("pelotond did not exit within 10 s of SIGTERM while a watch was open");
        }
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    let end = within("the watch to end", stream.message()).await;
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

/// A pelotond rolled back onto a store that a newer one wrote refuses to
/// start, naming both schema versions, rather than failing on some row it
/// cannot read; the store is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_by_a_newer_pelotond_is_refused_at_start() {
    use peloton_gateway::store::SCHEMA_VERSION;
    use redb::{ReadableDatabase, TableDefinition};
    const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("peloton.redb");
    let newer = SCHEMA_VERSION + 1;
    {
        let db = redb::Database::create(&file).expect("create the store");
        let txn = db.begin_write().expect("write");
        txn.open_table(META)
            .expect("meta")
            .insert("schema_version", newer)
            .expect("insert");
        txn.commit().expect("commit");
    }
    let out = within(
        "pelotond to refuse the store",
        Command::new(env!("CARGO_BIN_EXE_pelotond"))
            .args(pelotond_secure_args())
            .arg("--data-dir")
            .arg(dir.path())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--no-metrics",
                "--sim-hosts",
                "1",
            ])
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("pelotond runs");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "store schema version {newer} was written by a newer pelotond; this binary reads up \
             to {SCHEMA_VERSION}"
        )),
        "{stderr}"
    );
    let db = redb::Database::open(&file).expect("open the store");
    let txn = db.begin_read().expect("read");
    let version = txn.open_table(META).expect("meta").get("schema_version");
    assert_eq!(version.expect("get").map(|v| v.value()), Some(newer));
    let tables = txn.list_tables().expect("tables").count();
    assert_eq!(tables, 1, "pelotond created tables in a store it refused");
}
