//! `peloton-bench history`: a bounded history, measured. Runs many short
//! simulated tasks (in jobs of `job_size`) through a started `pelotond`
//! whose retention is small, and samples the server's resident set
//! (/proc/PID/status VmRSS) and the store file's size as tasks finish.
//!
//! Clients keep a window of unfinished jobs: each submits a job, and once
//! it has `window / clients` jobs out, waits for its oldest to finish (a
//! job retention already removed answers NOT_FOUND: it finished too).
//! Reports the samples at the first million tasks (`rss_1m_mb`,
//! `store_1m_mb`) and once every task finished (`rss_end_mb`,
//! `store_end_mb`) and their ratios; since one sample moves with what is in
//! flight at that instant, also the peak and mean of the RSS (sampled every
//! 20 ms) over the first and the last million tasks and their ratios; the
//! process's peak (VmHWM), one sample per million tasks, and the jobs the
//! server still holds at the end. Once, after the first million, clients
//! pause until the server is idle (every job finished and retained away):
//! `rss_1m_settled_mb` then and `rss_settled_mb` once every task finished
//! and the server went idle again compare what the server keeps, not what
//! is in flight (`rss_settled_ratio`); the pause is not counted in
//! `run_s`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pb::job_service_client::JobServiceClient;
use peloton_gateway::client::Authed;
use peloton_proto::v1 as pb;
use serde_json::{Value, json};

/// Options of one run.
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    /// Simulated hosts.
    pub hosts: u32,
    /// Tasks to run in all.
    pub tasks: u64,
    /// Instances per job.
    pub job_size: u32,
    /// Jobs out at once, over all clients.
    pub window: u32,
    /// Concurrent clients.
    pub clients: usize,
    /// How long a simulated task runs.
    pub sim_ms: u64,
    /// The server's `--job-retention-s`.
    pub retention_s: u64,
    /// The server's `--max-finished-jobs`.
    pub max_finished_jobs: u64,
    /// The server's `--event-retention` (none: its default).
    pub event_retention: Option<u64>,
    /// Let the server go idle after every million tasks, not only the
    /// first (a series of what it keeps).
    pub settle_every_million: bool,
    /// Further flags for the server.
    pub server_args: Vec<String>,
    /// Start the server with `--insecure` (plaintext, no tokens).
    pub insecure: bool,
}

fn job_spec(pool: &str, i: u32, tasks: u32, sim_ms: u64) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("history-{i}"),
        owner: "peloton-bench".into(),
        pool: pool.to_string(),
        instance_count: tasks,
        default_task: Some(pb::TaskSpec {
            command: "/bin/true".into(),
            resources: Some(pb::Resources {
                cpu: 0.1,
                memory_mb: 64.0,
                ..Default::default()
            }),
            sim: Some(pb::SimSpec {
                duration_ms: sim_ms,
                exit_code: 0,
            }),
            ..Default::default()
        }),
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether a job finished (or was already removed, which only happens to
/// finished jobs).
async fn finished(client: &mut JobServiceClient<Authed>, id: &str) -> Result<bool> {
    match client.get(pb::GetJobRequest { id: id.into() }).await {
        Ok(r) => {
            let state = r
                .into_inner()
                .job
                .and_then(|j| j.status)
                .map_or(pb::JobState::Unknown, |s| s.state());
            Ok(matches!(
                state,
                pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Killed
            ))
        }
        Err(s) if s.code() == tonic::Code::NotFound => Ok(true),
        Err(s) => Err(s.into()),
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    tasks: u64,
    s: f64,
    rss_mb: f64,
    store_mb: f64,
}

impl Sample {
    fn json(&self) -> Value {
        json!({
            "tasks": self.tasks,
            "s": self.s,
            "rss_mb": self.rss_mb,
            "store_mb": self.store_mb,
        })
    }
}

/// Runs the benchmark.
pub async fn run(o: HistoryOptions) -> Result<Value> {
    if o.job_size == 0 || o.tasks < u64::from(o.job_size) {
        bail!("--tasks must be at least --job-size (and --job-size at least 1)");
    }
    let mut flags = vec![
        "--job-retention-s".to_string(),
        o.retention_s.to_string(),
        "--max-finished-jobs".to_string(),
        o.max_finished_jobs.to_string(),
    ];
    if let Some(e) = o.event_retention {
        flags.extend(["--event-retention".to_string(), e.to_string()]);
    }
    flags.extend(o.server_args.iter().cloned());
    let (spawned, target) = crate::e2e::spawn_server_with(o.hosts, &flags, o.insecure)?;
    let pid = spawned.child.id().to_string();
    let store_file = spawned.data_dir().join("peloton.redb");
    let channel = target.connect().await?;
    let pool = "/history".to_string();
    crate::e2e::create_pool(&channel, &pool).await?;
    let n_jobs = u32::try_from(o.tasks / u64::from(o.job_size)).context("too many jobs")?;
    let total = u64::from(n_jobs) * u64::from(o.job_size);
    let per_client = (o.window as usize / o.clients.max(1)).max(1);
    let next = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU64::new(0));
    // Jobs submitted and not yet seen finished; while `paused`, clients
    // submit nothing and wait for theirs.
    let outstanding = Arc::new(AtomicU64::new(0));
    let paused = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..o.clients.max(1) {
        let mut client = JobServiceClient::new(channel.clone());
        let (next, done, pool) = (next.clone(), done.clone(), pool.clone());
        let (outstanding, paused) = (outstanding.clone(), paused.clone());
        let (job_size, sim_ms) = (o.job_size, o.sim_ms);
        clients.push(tokio::spawn(async move {
            let mut out: VecDeque<String> = VecDeque::new();
            loop {
                while paused.load(Ordering::Relaxed) {
                    if let Some(oldest) = out.front()
                        && finished(&mut client, oldest).await?
                    {
                        out.pop_front();
                        done.fetch_add(u64::from(job_size), Ordering::Relaxed);
                        outstanding.fetch_sub(1, Ordering::Relaxed);
                        continue;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let more = i < n_jobs;
                if more {
                    let job = client
                        .create(pb::CreateJobRequest {
                            spec: Some(job_spec(&pool, i, job_size, sim_ms)),
                        })
                        .await?
                        .into_inner()
                        .job
                        .context("no job in the answer")?;
                    out.push_back(job.id);
                    outstanding.fetch_add(1, Ordering::Relaxed);
                }
                while out.len() >= per_client || (!more && !out.is_empty()) {
                    let oldest = out.front().expect("not empty");
                    if finished(&mut client, oldest).await? {
                        out.pop_front();
                        done.fetch_add(u64::from(job_size), Ordering::Relaxed);
                        outstanding.fetch_sub(1, Ordering::Relaxed);
                    } else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                if !more {
                    return Ok::<_, anyhow::Error>(());
                }
            }
        }));
    }
    let sample = |tasks: u64| Sample {
        tasks,
        s: start.elapsed().as_secs_f64(),
        rss_mb: crate::proc_status_mb(&pid, "VmRSS:"),
        store_mb: std::fs::metadata(&store_file).map_or(0.0, |m| m.len() as f64 / 1048576.0),
    };
    let mut series: Vec<Sample> = Vec::new();
    let mut next_mark = 1_000_000u64.min(total);
    // The RSS every 20 ms: the peak and mean of each million tasks (a
    // single sample moves with what is in flight at that instant).
    let mut peak = 0.0f64;
    let (mut sum, mut n) = (0.0f64, 0u32);
    let mut peaks: Vec<(f64, f64)> = Vec::new();
    let settle = Duration::from_secs(o.retention_s.min(30) + 2);
    let mut settled_1m: Option<Sample> = None;
    let mut settled_series: Vec<Sample> = Vec::new();
    let mut paused_s = 0.0f64;
    loop {
        let d = done.load(Ordering::Relaxed);
        let rss = crate::proc_status_mb(&pid, "VmRSS:");
        peak = peak.max(rss);
        sum += rss;
        n += 1;
        while d >= next_mark && next_mark <= total {
            series.push(sample(d));
            peaks.push((peak, sum / f64::from(n.max(1))));
            (peak, sum, n) = (0.0, 0.0, 0);
            next_mark += 1_000_000;
            if (settled_1m.is_none() || o.settle_every_million) && d < total {
                // Once, after the first million: let the server go idle
                // (every job finished, the last ones' retention over), so
                // that its memory is what it keeps, not what is in flight.
                let pause = Instant::now();
                paused.store(true, Ordering::Relaxed);
                while outstanding.load(Ordering::Relaxed) > 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(settle).await;
                let idle = sample(done.load(Ordering::Relaxed));
                settled_series.push(idle);
                settled_1m.get_or_insert(idle);
                paused.store(false, Ordering::Relaxed);
                paused_s += pause.elapsed().as_secs_f64();
            }
        }
        if d >= total || clients.iter().all(|c| c.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        c.await??;
    }
    let run_s = start.elapsed().as_secs_f64() - paused_s;
    let end = sample(done.load(Ordering::Relaxed));
    // Once the last jobs' retention ran out (if it is short).
    tokio::time::sleep(settle).await;
    let settled = sample(total);
    let settled_1m = settled_1m.unwrap_or(settled);
    let left = JobServiceClient::new(channel.clone())
        .query(pb::QueryJobsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .jobs
        .len();
    let peak = crate::proc_status_mb(&pid, "VmHWM:");
    let first = series.first().copied().unwrap_or(end);
    let (first_peak, first_mean) = peaks.first().copied().unwrap_or_default();
    let (last_peak, last_mean) = peaks.last().copied().unwrap_or_default();
    drop(spawned);
    Ok(json!({
        "benchmark": "history",
        "hosts": o.hosts,
        "tasks": total,
        "job_size": o.job_size,
        "jobs": n_jobs,
        "window_jobs": o.window,
        "clients": o.clients,
        "sim_ms": o.sim_ms,
        "retention_s": o.retention_s,
        "max_finished_jobs": o.max_finished_jobs,
        "server_args": o.server_args,
        "run_s": run_s,
        "tasks_per_s": total as f64 / run_s,
        "rss_1m_mb": first.rss_mb,
        "rss_end_mb": end.rss_mb,
        "rss_ratio": end.rss_mb / first.rss_mb,
        "rss_1m_settled_mb": settled_1m.rss_mb,
        "rss_settled_mb": settled.rss_mb,
        "rss_settled_ratio": settled.rss_mb / settled_1m.rss_mb,
        "rss_first_million_peak_mb": first_peak,
        "rss_last_million_peak_mb": last_peak,
        "rss_peak_ratio": last_peak / first_peak,
        "rss_first_million_mean_mb": first_mean,
        "rss_last_million_mean_mb": last_mean,
        "rss_mean_ratio": last_mean / first_mean,
        "rss_peak_mb": peak,
        "store_1m_mb": first.store_mb,
        "store_end_mb": end.store_mb,
        "store_ratio": end.store_mb / first.store_mb,
        "store_1m_settled_mb": settled_1m.store_mb,
        "store_settled_mb": settled.store_mb,
        "jobs_left": left,
        "samples": series
            .iter()
            .zip(&peaks)
            .map(|(s, (peak, mean))| {
                let mut v = s.json();
                v["rss_peak_mb"] = json!(peak);
                v["rss_mean_mb"] = json!(mean);
                v
            })
            .collect::<Vec<_>>(),
        "settled_samples": settled_series.iter().map(Sample::json).collect::<Vec<_>>(),
    }))
}
