//! `peloton-bench bigsmall`: big gangs among small jobs, replayed through
//! the engine in simulated time with and without reservations and
//! backfill (`peloton_engine::backfill`), beside Slurm's figures on the
//! same workload (`scripts/bigsmall/`).
//!
//! The workload is a CSV file (`id,submit_s,kind,hosts,cpus_per_host,
//! duration_s`, as `scripts/bigsmall/gen.py` writes it): a small job is one
//! task of `cpus_per_host` cores; a gang is `hosts` tasks of
//! `cpus_per_host` cores each (8 on 8-core hosts: whole hosts), started
//! together. Every task declares its true duration as its runtime
//! estimate (as Slurm's jobs declare it as their time limit). The engine
//! runs a cycle at every submission and end, and again at the same moment
//! until nothing more is admitted or placed: no scheduling delay is added.
//!
//! Reported per policy: the gangs' longest and median wait (submission to
//! start), the small jobs' median and 90th-percentile wait, utilization
//! (busy core-seconds over the cores × the time from the first submission
//! to the last end), and the forecast's error: when a job does not start
//! at once, a forecast is made right after its submission, and its start
//! compared with the start that then happens, as a share of the wait.
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use peloton_engine::backfill::BackfillConfig;
use peloton_engine::forecast::{ForecastConfig, forecast};
use peloton_engine::host::HostSpec;
use peloton_engine::task::TaskHandle;
use peloton_engine::{Engine, EngineConfig, NewTask, PoolConfig, ResourceManagerConfig, Resources};
use serde_json::{Value, json};
use std::collections::HashMap;

/// One job of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    /// When it is submitted, ms from the start.
    pub submit_ms: u64,
    /// A gang (all its tasks start together) or one small task.
    pub gang: bool,
    /// Tasks (hosts of a gang; 1 for a small job).
    pub tasks: u32,
    /// Cores of each task.
    pub cores: u32,
    /// How long it runs, ms (declared as its estimate).
    pub duration_ms: u64,
}

/// Reads the workload CSV.
pub fn read_workload(path: &Path) -> Result<Vec<Job>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut lines = text.lines();
    let header = lines.next().context("the workload is empty")?;
    if header.trim() != "id,submit_s,kind,hosts,cpus_per_host,duration_s" {
        bail!(
            "{}: the header is {header:?}, not id,submit_s,kind,hosts,cpus_per_host,duration_s",
            path.display()
        );
    }
    let mut jobs = Vec::new();
    for (n, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let row = n + 2;
        if f.len() != 6 {
            bail!("{}:{row}: {} fields, not 6", path.display(), f.len());
        }
        let num = |i: usize, name: &str| -> Result<u64> {
            f[i].parse::<u64>().with_context(|| {
                format!(
                    "{}:{row}: {name} {:?} is not a number",
                    path.display(),
                    f[i]
                )
            })
        };
        let gang = match f[2] {
            "gang" => true,
            "small" => false,
            other => bail!(
                "{}:{row}: kind {other:?} is neither small nor gang",
                path.display()
            ),
        };
        let tasks = num(3, "hosts")? as u32;
        let cores = num(4, "cpus_per_host")? as u32;
        let duration_ms = num(5, "duration_s")? * 1000;
        if tasks == 0 || cores == 0 || duration_ms == 0 {
            bail!(
                "{}:{row}: hosts, cpus_per_host and duration_s must be positive",
                path.display()
            );
        }
        jobs.push(Job {
            submit_ms: num(1, "submit_s")? * 1000,
            gang,
            tasks,
            cores,
            duration_ms,
        });
    }
    jobs.sort_by_key(|j| j.submit_ms);
    Ok(jobs)
}

/// The cluster of the replay.
#[derive(Clone, Copy, Debug)]
pub struct Cluster {
    /// Hosts.
    pub hosts: usize,
    /// Cores of each.
    pub cores: u64,
}

fn cores(n: u64) -> Resources {
    // 4 GiB a core.
    Resources::new(n * 1000, n * 4096, 0, 0)
}

/// The value at fraction `q` of `v` (sorted here; 0 if empty).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::forecast::quantile(v, q)
}

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

/// Replays `jobs` on `cluster`, backfill on or off; returns the figures
/// (see the module's text) as JSON.
pub fn replay(jobs: &[Job], cluster: Cluster, backfill: bool, forecasts: bool) -> Result<Value> {
    let mut engine = Engine::new(EngineConfig {
        resources: ResourceManagerConfig {
            threads: 1,
            ..Default::default()
        },
        backfill: BackfillConfig {
            enabled: backfill,
            ..BackfillConfig::default()
        },
        ..Default::default()
    });
    for i in 0..cluster.hosts {
        engine.hosts_mut().add(&HostSpec {
            name: format!("h{i}"),
            capacity: cores(cluster.cores),
            ..Default::default()
        })?;
    }
    let pool = engine
        .resources_mut()
        .create_pool("/batch", PoolConfig::default())?;
    let mut handles: Vec<Vec<TaskHandle>> = vec![Vec::new(); jobs.len()];
    let mut started: Vec<Option<u64>> = vec![None; jobs.len()];
    let mut placed_tasks: Vec<u32> = vec![0; jobs.len()];
    let mut predicted: Vec<Option<u64>> = vec![None; jobs.len()];
    let mut job_of: HashMap<TaskHandle, usize> = HashMap::new();
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let runtime = |job: u32, _instance: u32| jobs.get(job as usize).map(|j| j.duration_ms);
    let config = ForecastConfig::default();
    let mut next = 0;
    let mut busy_core_ms: u128 = 0;
    let mut last_end = 0;
    while next < jobs.len() || !ends.is_empty() {
        let t_submit = jobs.get(next).map_or(u64::MAX, |j| j.submit_ms);
        let t_end = ends.peek().map_or(u64::MAX, |e| e.0.0);
        let t = t_submit.min(t_end);
        while let Some(&Reverse((end, j))) = ends.peek() {
            if end > t {
                break;
            }
            ends.pop();
            for &h in &handles[j] {
                engine.finish(h)?;
            }
            last_end = last_end.max(end);
        }
        let first_new = next;
        while next < jobs.len() && jobs[next].submit_ms == t {
            let j = jobs[next];
            let tasks: Vec<NewTask> = (0..j.tasks)
                .map(|i| NewTask {
                    runtime_ms: j.duration_ms,
                    ..peloton_engine::testkit::plain_task(
                        next as u32,
                        i,
                        pool,
                        cores(u64::from(j.cores)),
                    )
                })
                .collect();
            let got = engine.submit(&tasks)?;
            for &h in &got {
                job_of.insert(h, next);
            }
            handles[next] = got;
            next += 1;
        }
        loop {
            let report = engine.cycle_with(t, false);
            let changed = !report.placed().is_empty() || report.admitted() > 0;
            let placed: Vec<TaskHandle> = report.placed().iter().map(|p| p.task).collect();
            for h in placed {
                let j = job_of[&h];
                placed_tasks[j] += 1;
                if placed_tasks[j] == jobs[j].tasks {
                    started[j] = Some(t);
                    let end = t + jobs[j].duration_ms;
                    ends.push(Reverse((end, j)));
                    busy_core_ms += u128::from(jobs[j].duration_ms)
                        * u128::from(jobs[j].tasks)
                        * u128::from(jobs[j].cores);
                }
            }
            if !changed {
                break;
            }
        }
        if forecasts && (first_new..next).any(|j| started[j].is_none()) {
            let f = forecast(&engine, t, &runtime, &config);
            for j in first_new..next {
                if started[j].is_some() {
                    continue;
                }
                let starts: Option<Vec<u64>> = handles[j]
                    .iter()
                    .map(|&h| f.get(h).and_then(|x| x.start).map(|s| s.at_ms))
                    .collect();
                predicted[j] = starts.and_then(|s| s.into_iter().max());
            }
        }
    }
    if started.iter().any(Option::is_none) {
        bail!("some jobs never started");
    }
    let first = jobs.first().map_or(0, |j| j.submit_ms);
    let makespan_ms = last_end.saturating_sub(first).max(1);
    let total_cores = cluster.hosts as u128 * u128::from(cluster.cores);
    let utilization = busy_core_ms as f64 / (total_cores as f64 * makespan_ms as f64);
    let wait = |j: usize| (started[j].unwrap() - jobs[j].submit_ms) as f64 / 1000.0;
    let mut gang_waits: Vec<f64> = (0..jobs.len())
        .filter(|&j| jobs[j].gang)
        .map(wait)
        .collect();
    let mut small_waits: Vec<f64> = (0..jobs.len())
        .filter(|&j| !jobs[j].gang)
        .map(wait)
        .collect();
    // Forecast error as a share of the wait, of jobs that waited.
    let error = |gang: bool| -> (Vec<f64>, usize) {
        let mut errs = Vec::new();
        let mut missing = 0;
        for j in 0..jobs.len() {
            if jobs[j].gang != gang {
                continue;
            }
            let w = started[j].unwrap() - jobs[j].submit_ms;
            if w == 0 {
                continue;
            }
            match predicted[j] {
                Some(p) => errs.push(p.abs_diff(started[j].unwrap()) as f64 / w as f64),
                None => missing += 1,
            }
        }
        (errs, missing)
    };
    let (mut gang_err, gang_missing) = error(true);
    let (mut small_err, small_missing) = error(false);
    Ok(json!({
        "policy": if backfill { "peloton-backfill" } else { "peloton-strict" },
        "jobs": jobs.len(),
        "gangs": gang_waits.len(),
        "gang_wait_max_s": gang_waits.iter().copied().fold(0.0, f64::max),
        "gang_wait_median_s": median(&mut gang_waits),
        "small_wait_median_s": median(&mut small_waits),
        "small_wait_p90_s": quantile(&mut small_waits, 0.9),
        "utilization": utilization,
        "makespan_s": makespan_ms as f64 / 1000.0,
        "estimate_error_median_gang": forecasts.then(|| median(&mut gang_err)),
        "estimate_error_median_small": forecasts.then(|| median(&mut small_err)),
        "estimates_missing": forecasts.then_some(gang_missing + small_missing),
    }))
}

/// Prints the policies side by side.
pub fn print_table(rows: &[Value]) {
    println!(
        "{:<20} {:>6} {:>10} {:>10} {:>10} {:>10} {:>7} {:>9} {:>9}",
        "policy",
        "jobs",
        "gang max",
        "gang med",
        "small med",
        "small p90",
        "util",
        "err gang",
        "err small"
    );
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    for r in rows {
        let err = |k: &str| f(r, k).map_or("-".to_string(), |e| format!("{e:.2}"));
        println!(
            "{:<20} {:>6} {:>9.0}s {:>9.0}s {:>9.0}s {:>9.0}s {:>7.3} {:>9} {:>9}",
            r.get("policy").and_then(Value::as_str).unwrap_or("?"),
            r.get("jobs").and_then(Value::as_u64).unwrap_or(0),
            f(r, "gang_wait_max_s").unwrap_or(0.0),
            f(r, "gang_wait_median_s").unwrap_or(0.0),
            f(r, "small_wait_median_s").unwrap_or(0.0),
            f(r, "small_wait_p90_s").unwrap_or(0.0),
            f(r, "utilization").unwrap_or(0.0),
            err("estimate_error_median_gang"),
            err("estimate_error_median_small"),
        );
    }
}
