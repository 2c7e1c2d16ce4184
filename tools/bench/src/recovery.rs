//! `peloton-bench recovery`: how soon a crashed server schedules again.
//!
//! Starts `pelotond` on a fresh data dir with simulated hosts, submits
//! `jobs × tasks_per_job` long-running instances (more than the hosts hold,
//! so some run and the rest wait), waits until the running count settles,
//! then SIGKILLs the server and starts a new one on the same data dir.
//! Simulated hosts restart with the server, so every run that was running
//! is LOST and must be placed again. Reports, from the new process's start:
//! - `serving_s`: until it serves gRPC (the store read and recovered);
//! - `first_placed_s`: until the first instance is placed again (it
//!   schedules);
//! - `all_running_s`: until as many instances run as before the crash.
//!
//! Times are measured from outside, through the public API (over TLS with
//! the server's admin token, unless `--insecure`), with the polling
//! interval (`poll_ms`) as their resolution.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pb::job_service_client::JobServiceClient;
use peloton_proto::v1 as pb;
use serde_json::{Value, json};

use crate::e2e;

/// Options of one run.
#[derive(Debug, Clone)]
pub struct RecoveryOptions {
    /// Simulated hosts (each holds 160 or 320 of the benchmark's tasks).
    pub hosts: u32,
    /// Jobs to submit.
    pub jobs: u32,
    /// Instances per job.
    pub tasks_per_job: u32,
    /// Concurrent submitting clients.
    pub clients: usize,
    /// Start the servers with `--insecure` (plaintext, no tokens).
    pub insecure: bool,
}

const POLL: Duration = Duration::from_millis(20);

/// Runs the benchmark.
pub async fn run(opts: RecoveryOptions) -> Result<Value> {
    use pb::TaskState as S;
    let (spawned, target) = e2e::spawn_server(opts.hosts, opts.insecure)?;
    let channel = target.connect().await?;
    let pool = "/bench".to_string();
    e2e::create_pool(&channel, &pool).await?;
    let total = u64::from(opts.jobs) * u64::from(opts.tasks_per_job);
    let loaded = Instant::now();
    e2e::submit(
        std::slice::from_ref(&channel),
        &pool,
        opts.jobs,
        opts.tasks_per_job,
        opts.clients,
    )
    .await?;
    // Wait for the running count to settle (unchanged over 1 s).
    let mut jobs = JobServiceClient::new(channel);
    let mut running = 0;
    let mut since = Instant::now();
    loop {
        let now = e2e::count_in(&mut jobs, &pool, &[S::Running]).await?;
        if now != running {
            running = now;
            since = Instant::now();
        } else if running > 0 && since.elapsed() > Duration::from_secs(1) {
            break;
        }
        if loaded.elapsed() > Duration::from_secs(900) {
            bail!("the running count did not settle within 900 s ({running} running)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let load_s = loaded.elapsed().as_secs_f64();
    let server_rss_mb = crate::proc_status_mb(&spawned.child.id().to_string(), "VmRSS:");
    let store_mb = std::fs::metadata(spawned.data_dir().join("peloton.redb"))
        .map_or(0.0, |m| m.len() as f64 / 1_048_576.0);

    let dir = spawned.crash()?;
    if let Some(copy) = std::env::var_os("PELOTON_BENCH_KEEP_CRASHED") {
        // For profiling the restart by hand: the crashed data dir, kept.
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir.path())
            .arg(&copy)
            .status()?;
        anyhow::ensure!(status.success(), "cannot copy the data dir to {copy:?}");
    }
    let restarted = Instant::now();
    let (spawned, target) = e2e::spawn_server_in(dir, opts.hosts, &[], opts.insecure)?;
    let serving_s = restarted.elapsed().as_secs_f64();
    let channel = target
        .connect()
        .await
        .context("cannot connect to the restarted server")?;
    let mut jobs = JobServiceClient::new(channel);
    let deadline = restarted + Duration::from_secs(600);
    let first_placed_s = loop {
        if e2e::count_placed(&mut jobs, &pool).await? > 0 {
            break restarted.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("nothing placed within 600 s of the restart");
        }
        tokio::time::sleep(POLL).await;
    };
    let all_running_s = loop {
        let now = e2e::count_in(&mut jobs, &pool, &[S::Running]).await?;
        if now >= running {
            break restarted.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("{now} of {running} running again after 600 s");
        }
        tokio::time::sleep(POLL).await;
    };
    let rss_after = crate::proc_status_mb(&spawned.child.id().to_string(), "VmHWM:");
    drop(spawned);
    Ok(json!({
        "benchmark": "recovery",
        "hosts": opts.hosts,
        "tasks": total,
        "running_before": running,
        "load_s": load_s,
        "store_mb": store_mb,
        "server_rss_before_mb": server_rss_mb,
        "serving_s": serving_s,
        "first_placed_s": first_placed_s,
        "all_running_s": all_running_s,
        "server_peak_rss_after_mb": rss_after,
        "poll_ms": POLL.as_millis() as u64,
    }))
}
