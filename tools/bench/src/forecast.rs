//! `peloton-bench forecast`: what the engine's forecast
//! (`peloton_engine::forecast`) costs, and how close its starts are to what
//! then happens.
//!
//! Cost: a synthetic cluster (`--hosts` hosts of 32 cores and 128 GiB,
//! `--pools` pools) with `--running` tasks placed at moments spread over
//! the last four hours and `--waiting` more queued (jobs of 1–32 single
//! tasks of 1–8 cores, and one job in 30 a gang of 2–16 half or whole
//! hosts); runtimes come from a hash of (job, instance), 10 s to 4 h,
//! log-uniform, and a running task has that much left to run. The fork
//! and the whole forecast are timed over `--runs` runs; with
//! `--no-window-steps` the same forecast with every end on its own step
//! says what the step window costs in accuracy.
//!
//! Accuracy (`--trace`): the Alibaba 2017 batch trace replayed through the
//! engine in simulated time (see [`replay`]). Machines are hosts (their
//! `add` rows; soft errors are not replayed), memory 1.0 = 256 GiB for
//! machines and tasks alike. Each Terminated task row is a job of
//! `instance_num` × `--scale` (rounded up, at most `--max-instances`)
//! independent instances, submitted at its create time, each running
//! end − create (its true duration); other rows (Waiting, Running, Failed:
//! no known duration) and rows without a request are skipped and counted.
//! Every `--every` simulated seconds a forecast is made; a waiting job's
//! forecast start is that of its last waiting instance, its real start
//! when its last instance started in the replay, and the error is
//! reported as a share of the job's wait (creation to start) and of what
//! was left of it at the forecast.
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use peloton_engine::forecast::{Forecast, ForecastConfig, Stopped, forecast, forecast_fork};
use peloton_engine::host::HostSpec;
use peloton_engine::task::{Strategy, TaskHandle};
use peloton_engine::{
    Engine, EngineConfig, NewTask, PoolConfig, PoolId, ResourceManagerConfig, Resources, TaskFlags,
};
use serde_json::{Value, json};

/// Cores of a simulated host in the cost part.
const HOST_CORES: u64 = 32;
/// Memory of a simulated host, MiB (128 GiB).
const HOST_MEMORY_MIB: u64 = 128 * 1024;
/// The cost part's "now": four hours after the first running task started.
const COST_NOW_MS: u64 = 4 * 3_600_000;
/// Moments over the last four hours at which running tasks were placed.
const COST_START_MOMENTS: u64 = 16;
/// Shortest and longest runtime of the cost part, ms.
const RUNTIME_MIN_MS: f64 = 10_000.0;
const RUNTIME_MAX_MS: f64 = 4.0 * 3_600_000.0;

/// Options of the cost part.
#[derive(Clone, Copy, Debug)]
pub struct CostOptions {
    /// Simulated hosts.
    pub hosts: usize,
    /// Tasks placed before the forecast.
    pub running: usize,
    /// Tasks queued before the forecast.
    pub waiting: usize,
    /// Leaf pools.
    pub pools: usize,
    /// Timed forecasts.
    pub runs: usize,
    /// Seed of the hash of runtimes and shapes.
    pub seed: u64,
    /// Threads of the engine's pool.
    pub threads: usize,
    /// Step bound of the forecast without a step window that the default
    /// one is compared with (0: no comparison).
    pub no_window_max_steps: u32,
    /// Bounds of the timed forecasts.
    pub config: ForecastConfig,
}

/// A well-mixed 64-bit hash (splitmix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform number in [0, 1) from a hash of the arguments.
fn unit(seed: u64, a: u64, b: u64) -> f64 {
    (mix(mix(mix(seed) ^ a) ^ b) >> 11) as f64 / (1u64 << 53) as f64
}

/// One of `choices`, picked by a hash of the arguments.
fn pick<T: Copy>(choices: &[T], seed: u64, a: u64, b: u64) -> T {
    choices[(unit(seed, a, b) * choices.len() as f64) as usize % choices.len()]
}

/// A runtime from 10 s to 4 h, log-uniform, from a hash of (job, instance).
pub fn hashed_runtime_ms(seed: u64, job: u32, instance: u32) -> u64 {
    let u = unit(seed ^ 0x5eed, u64::from(job), u64::from(instance));
    (RUNTIME_MIN_MS * (RUNTIME_MAX_MS / RUNTIME_MIN_MS).powf(u)) as u64
}

fn cores(millis: u64) -> Resources {
    // 4 GiB per core, as the hosts have.
    Resources::new(millis, millis * HOST_MEMORY_MIB / (HOST_CORES * 1000), 0, 0)
}

fn new_task(seed: u64, job: u32, instance: u32, pool: PoolId, cpu_millis: u64) -> NewTask {
    // Its runtime is declared, as the lifecycle passes its estimates on:
    // the forecast's fork backfills with them as the live engine would.
    NewTask {
        runtime_ms: hashed_runtime_ms(seed, job, instance),
        ..peloton_engine::testkit::plain_task(job, instance, pool, cores(cpu_millis))
    }
}

fn engine_config(threads: usize, max_hosts: usize) -> EngineConfig {
    let mut config = EngineConfig {
        resources: ResourceManagerConfig {
            threads,
            ..Default::default()
        },
        ..Default::default()
    };
    config.hosts.max_hosts = config.hosts.max_hosts.max(max_hosts);
    config
}

/// The cost part's cluster: the engine, and when each running job started
/// (index: job number; waiting jobs have none).
pub struct CostCluster {
    /// The engine, at [`COST_NOW_MS`].
    pub engine: Engine,
    /// Start of each running job, ms, by job number.
    pub running_job_start_ms: Vec<u64>,
    /// Jobs and gangs queued.
    pub waiting_jobs: usize,
    /// Gangs among them.
    pub waiting_gangs: usize,
    /// Seed of the runtimes' hash.
    pub seed: u64,
}

impl CostCluster {
    /// How long a task of (job, instance) runs in all: a running task has
    /// run since its start and has a hashed runtime left.
    pub fn runtime_ms(&self, job: u32, instance: u32) -> Option<u64> {
        let left = hashed_runtime_ms(self.seed, job, instance);
        Some(match self.running_job_start_ms.get(job as usize) {
            Some(&start) => COST_NOW_MS - start + left,
            None => left,
        })
    }
}

/// Builds the cost part's cluster.
pub fn build_cost_cluster(o: &CostOptions) -> Result<CostCluster> {
    if !(1..=200_000).contains(&o.hosts) {
        bail!("--hosts must be between 1 and 200000");
    }
    if !(1..=100).contains(&o.pools) {
        bail!("--pools must be between 1 and 100");
    }
    if o.running > 5_000_000 || o.waiting > 5_000_000 {
        bail!("--running and --waiting must each be at most 5000000");
    }
    let seed = o.seed;
    let mut engine = Engine::new(engine_config(o.threads, o.hosts));
    for i in 0..o.hosts {
        engine
            .hosts_mut()
            .add(&HostSpec {
                name: format!("h{i}"),
                capacity: cores(HOST_CORES * 1000),
                ..Default::default()
            })
            .context("adding a host")?;
    }
    let pools: Vec<PoolId> = (0..o.pools)
        .map(|i| {
            engine
                .resources_mut()
                .create_pool(&format!("/p{i}"), PoolConfig::default())
                .context("creating a pool")
        })
        .collect::<Result<_>>()?;
    engine.reserve_tasks(o.running + o.waiting);
    // Running: jobs of 1–16 tasks of ½–2 cores (≈ 75 % of the cluster at
    // the defaults), placed at 16 moments over the last four hours.
    let mut running_job_start_ms = Vec::new();
    let mut batch = Vec::new();
    let mut handles = Vec::new();
    let mut n_running = 0;
    for moment in 0..COST_START_MOMENTS {
        let at_ms = moment * (COST_NOW_MS / COST_START_MOMENTS);
        let goal = o.running * (moment as usize + 1) / COST_START_MOMENTS as usize;
        while n_running < goal {
            let job = running_job_start_ms.len() as u32;
            let n = (1 + (unit(seed, 1, u64::from(job)) * 16.0) as usize).min(goal - n_running);
            let pool = pick(&pools, seed, 2, u64::from(job));
            let cpu = pick(&[500, 1000, 1000, 1500, 2000], seed, 3, u64::from(job));
            batch.clear();
            // A running task has run since `at_ms` and has its hashed
            // runtime left at the forecast (`CostCluster::runtime_ms`).
            batch.extend((0..n as u32).map(|i| {
                let mut t = new_task(seed, job, i, pool, cpu);
                t.runtime_ms += COST_NOW_MS - at_ms;
                t
            }));
            engine
                .submit_each(&batch, &mut handles)
                .context("queueing running tasks")?;
            running_job_start_ms.push(at_ms);
            n_running += n;
        }
        cycle_until_quiet(&mut engine, at_ms);
        let waiting = engine.waiting_tasks().len();
        if waiting > 0 {
            bail!(
                "{waiting} of the --running tasks do not fit {} hosts: fewer tasks or more hosts",
                o.hosts
            );
        }
    }
    // Waiting: jobs of 1–32 tasks of 1–8 cores, and one job in 30 a gang of
    // 2–16 half or whole hosts.
    let mut n_waiting = 0;
    let mut waiting_jobs = 0;
    let mut waiting_gangs = 0;
    let mut job = running_job_start_ms.len() as u32;
    while n_waiting < o.waiting {
        let key = u64::from(job);
        let pool = pick(&pools, seed, 2, key);
        batch.clear();
        if unit(seed, 4, key) < 1.0 / 30.0 {
            let n = (2 + (unit(seed, 5, key) * 15.0) as usize).min(o.waiting - n_waiting);
            let cpu = pick(&[16_000, 32_000], seed, 6, key);
            batch.extend((0..n as u32).map(|i| new_task(seed, job, i, pool, cpu)));
            engine.submit(&batch).context("queueing a gang")?;
            waiting_gangs += 1;
        } else {
            let n = (1 + (unit(seed, 5, key) * 32.0) as usize).min(o.waiting - n_waiting);
            let cpu = pick(&[1000, 2000, 4000, 8000], seed, 6, key);
            batch.extend((0..n as u32).map(|i| new_task(seed, job, i, pool, cpu)));
            engine
                .submit_each(&batch, &mut handles)
                .context("queueing waiting tasks")?;
        }
        n_waiting += batch.len();
        waiting_jobs += 1;
        job += 1;
    }
    Ok(CostCluster {
        engine,
        running_job_start_ms,
        waiting_jobs,
        waiting_gangs,
        seed,
    })
}

/// Cycles at `now_ms` until a cycle admits and places nothing (what a
/// forecast does at each step).
fn cycle_until_quiet(engine: &mut Engine, now_ms: u64) -> Vec<peloton_engine::placement::Placed> {
    let mut placed = Vec::new();
    loop {
        let report = engine.cycle_with(now_ms, false);
        placed.extend_from_slice(report.placed());
        if report.placed().is_empty() && report.admitted() == 0 {
            return placed;
        }
    }
}

/// Every end on its own step: the forecast without a step window.
pub fn exact_config() -> ForecastConfig {
    ForecastConfig {
        max_steps: 1_000_000,
        min_step_ms: 0,
        resolution: u32::MAX,
        ..ForecastConfig::default()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The value at fraction `q` of sorted `values` (0 if empty).
pub(crate) fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values[((values.len() - 1) as f64 * q).round() as usize]
}

fn stopped_name(s: Stopped) -> &'static str {
    match s {
        Stopped::AllStarted => "all started",
        Stopped::NoMoreEnds => "no more ends",
        Stopped::Horizon => "horizon",
        Stopped::Steps => "step bound",
    }
}

/// How far a forecast's starts are from a reference forecast's (the same
/// tasks, no step window), in seconds and as a share of the reference's
/// wait from now.
fn compare_starts(f: &Forecast, reference: &Forecast) -> Value {
    let mut late_s = Vec::new();
    let mut relative = Vec::new();
    let mut missing = 0;
    for t in &reference.tasks {
        let Some(r) = t.start else { continue };
        match f.get(t.task).and_then(|x| x.start) {
            Some(s) => {
                let d = s.at_ms.abs_diff(r.at_ms) as f64;
                late_s.push(d / 1e3);
                let wait = r.at_ms.saturating_sub(reference.now_ms);
                if wait > 0 {
                    relative.push(d / wait as f64);
                }
            }
            None => missing += 1,
        }
    }
    late_s.sort_by(f64::total_cmp);
    relative.sort_by(f64::total_cmp);
    json!({
        "tasks_compared": late_s.len(),
        "tasks_without_start": missing,
        "error_s_median": quantile(&late_s, 0.5),
        "error_s_p90": quantile(&late_s, 0.9),
        "error_s_max": late_s.last().copied().unwrap_or(0.0),
        "error_of_wait_median": quantile(&relative, 0.5),
        "error_of_wait_p90": quantile(&relative, 0.9),
    })
}

/// The cost part: builds the cluster, times forks and forecasts.
/// CPU time the process has used (user and system, every thread), in ms:
/// a forecast's cost on a machine busy with other work, where wall time
/// also counts the waits for a core.
fn cpu_ms() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let t = u.user_time() + u.system_time();
        t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3
    })
}

pub fn cost(o: &CostOptions) -> Result<Value> {
    if !(1..=100).contains(&o.runs) {
        bail!("--runs must be between 1 and 100");
    }
    let started = Instant::now();
    let cluster = build_cost_cluster(o)?;
    let build = started.elapsed();
    let engine = &cluster.engine;
    let runtime = |job: u32, instance: u32| cluster.runtime_ms(job, instance);
    let config = o.config;
    let mut fork_ms = Vec::new();
    let mut forecast_ms = Vec::new();
    let mut forecast_cpu_ms = Vec::new();
    let mut last = None;
    for _ in 0..o.runs {
        let t0 = Instant::now();
        let cpu0 = cpu_ms();
        let sim = engine.fork();
        let forked = t0.elapsed();
        let f = forecast_fork(sim, COST_NOW_MS, &runtime, &config);
        forecast_ms.push(ms(t0.elapsed()));
        forecast_cpu_ms.push(cpu_ms() - cpu0);
        fork_ms.push(ms(forked));
        last = Some(f);
    }
    let f = last.expect("at least one run");
    fork_ms.sort_by(f64::total_cmp);
    forecast_ms.sort_by(f64::total_cmp);
    forecast_cpu_ms.sort_by(f64::total_cmp);
    let placed_at_once = f
        .tasks
        .iter()
        .filter(|t| t.start.is_some_and(|s| s.at_ms == COST_NOW_MS))
        .count();
    let horizon_s = f
        .tasks
        .iter()
        .filter_map(|t| t.start)
        .map(|s| s.at_ms - COST_NOW_MS)
        .max()
        .unwrap_or(0) as f64
        / 1e3;
    let mut report = json!({
        "benchmark": "forecast",
        "hosts": o.hosts,
        "pools": o.pools,
        "running": o.running,
        "waiting": f.tasks.len(),
        "waiting_jobs": cluster.waiting_jobs,
        "waiting_gangs": cluster.waiting_gangs,
        "threads": o.threads,
        "seed": o.seed,
        "runs": o.runs,
        "build_s": build.as_secs_f64(),
        "fork_ms_median": quantile(&fork_ms, 0.5),
        "fork_ms_max": fork_ms.last().copied().unwrap_or(0.0),
        "forecast_ms_median": quantile(&forecast_ms, 0.5),
        "forecast_ms_max": forecast_ms.last().copied().unwrap_or(0.0),
        "forecast_cpu_ms_median": quantile(&forecast_cpu_ms, 0.5),
        "steps": f.steps,
        "started": f.n_started(),
        "started_at_once": placed_at_once,
        "last_start_s_ahead": horizon_s,
        "stopped": stopped_name(f.stopped),
        "config": format!("{config:?}"),
    });
    if o.no_window_max_steps > 0 {
        // The same forecast without a step window: what the window costs.
        let t0 = Instant::now();
        let exact = forecast(
            engine,
            COST_NOW_MS,
            &runtime,
            &ForecastConfig {
                max_steps: o.no_window_max_steps,
                ..exact_config()
            },
        );
        report["no_window_ms"] = json!(ms(t0.elapsed()));
        report["no_window_steps"] = json!(exact.steps);
        report["no_window_started"] = json!(exact.n_started());
        report["no_window_stopped"] = json!(stopped_name(exact.stopped));
        report["window_error"] = compare_starts(&f, &exact);
    }
    engine.check_invariants();
    report["peak_rss_mb"] = json!(crate::peak_rss_mb());
    Ok(report)
}
/// Memory of one normalised unit of the 2017 trace, MiB: the trace's
/// machines have 0.69 (≈ 177 GiB), its tasks 0.0028–0.127 (0.7–33 GiB).
pub const TRACE_MEM_MIB_PER_UNIT: f64 = 256.0 * 1024.0;
/// Largest trace file read, bytes.
const MAX_TRACE_FILE_BYTES: u64 = 256 << 20;

/// A machine of `server_event.csv`: its `add` row.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// `machine_id`.
    pub id: u64,
    /// `cpus`: cores.
    pub cpus: u64,
    /// `mem`: normalised memory.
    pub mem: f64,
}

/// The last state of a task of `batch_task.csv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    /// Ended; its end time is when.
    Terminated,
    /// Still waiting at the trace's end.
    Waiting,
    /// Still running at the trace's end.
    Running,
    /// Failed.
    Failed,
}

/// One row of `batch_task.csv`: a task of `instances` identical instances.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchTask {
    /// `create_timestamp`, s from the trace's start (may be negative).
    pub create_s: i64,
    /// `modify/end timestamp`, s.
    pub end_s: i64,
    /// `job_id`.
    pub job_id: u64,
    /// `task_id`.
    pub task_id: u64,
    /// `instance_num`.
    pub instances: u64,
    /// `status`.
    pub status: TaskStatus,
    /// `plan_cpu`: 1/100 core per instance (none where empty).
    pub plan_cpu: Option<u64>,
    /// `plan_mem`: normalised memory per instance (none where empty).
    pub plan_mem: Option<f64>,
}

fn read_trace_file(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len > MAX_TRACE_FILE_BYTES {
        bail!(
            "{}: {len} bytes, more than the {MAX_TRACE_FILE_BYTES} read",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The fields of a CSV line (CR, LF and spaces around fields removed).
fn fields(line: &str) -> Vec<&str> {
    line.trim_end_matches(['\r', '\n'])
        .split(',')
        .map(str::trim)
        .collect()
}

fn field<T: std::str::FromStr>(
    file: &str,
    line_no: usize,
    fields: &[&str],
    i: usize,
    name: &str,
) -> Result<T> {
    let text = fields
        .get(i)
        .with_context(|| format!("{file} line {line_no}: no field {name} (column {})", i + 1))?;
    text.parse::<T>()
        .map_err(|_| anyhow::anyhow!("{file} line {line_no}: {name} {text:?} is not a number"))
}

fn optional_field<T: std::str::FromStr>(
    file: &str,
    line_no: usize,
    fields: &[&str],
    i: usize,
    name: &str,
) -> Result<Option<T>> {
    match fields.get(i) {
        None | Some(&"") => Ok(None),
        Some(_) => field(file, line_no, fields, i, name).map(Some),
    }
}

/// The machines of `server_event.csv` (no header: timestamp, machine_id,
/// event_type, event_detail, cpus, mem, disk): one per `add` row, the
/// first if a machine is added twice. Soft errors are not replayed.
pub fn parse_machines(text: &str) -> Result<Vec<Machine>> {
    const FILE: &str = "server_event.csv";
    let mut machines: Vec<Machine> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let f = fields(line);
        if f.iter().all(|x| x.is_empty()) {
            continue;
        }
        if f.len() != 7 {
            bail!("{FILE} line {line_no}: {} fields, expected 7", f.len());
        }
        if f[2] != "add" {
            continue;
        }
        let id: u64 = field(FILE, line_no, &f, 1, "machine_id")?;
        let cpus: u64 = field(FILE, line_no, &f, 4, "cpus")?;
        let mem: f64 = field(FILE, line_no, &f, 5, "mem")?;
        if !(1..=4096).contains(&cpus) {
            bail!("{FILE} line {line_no}: cpus {cpus} is not in 1..=4096");
        }
        if !(mem > 0.0 && mem <= 16.0) {
            bail!("{FILE} line {line_no}: mem {mem} is not in (0, 16]");
        }
        if seen.insert(id) {
            machines.push(Machine { id, cpus, mem });
        }
    }
    if machines.is_empty() {
        bail!("{FILE}: no machine is added");
    }
    Ok(machines)
}

/// The tasks of `batch_task.csv` (create, end, job_id, task_id,
/// instance_num, status, plan_cpu, plan_mem). A first line that does not
/// start with a number is a header and is skipped; CRLF line ends are
/// taken.
pub fn parse_batch_tasks(text: &str) -> Result<Vec<BatchTask>> {
    const FILE: &str = "batch_task.csv";
    let mut tasks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let f = fields(line);
        if f.iter().all(|x| x.is_empty()) {
            continue;
        }
        if i == 0 && f[0].parse::<i64>().is_err() {
            continue;
        }
        if f.len() != 8 {
            bail!("{FILE} line {line_no}: {} fields, expected 8", f.len());
        }
        let status = match f[5] {
            "Terminated" => TaskStatus::Terminated,
            "Waiting" => TaskStatus::Waiting,
            "Running" => TaskStatus::Running,
            "Failed" => TaskStatus::Failed,
            other => bail!("{FILE} line {line_no}: status {other:?} is not one the trace uses"),
        };
        let task = BatchTask {
            create_s: field(FILE, line_no, &f, 0, "create_timestamp")?,
            end_s: field(FILE, line_no, &f, 1, "end_timestamp")?,
            job_id: field(FILE, line_no, &f, 2, "job_id")?,
            task_id: field(FILE, line_no, &f, 3, "task_id")?,
            instances: field(FILE, line_no, &f, 4, "instance_num")?,
            status,
            plan_cpu: optional_field(FILE, line_no, &f, 6, "plan_cpu")?,
            plan_mem: optional_field(FILE, line_no, &f, 7, "plan_mem")?,
        };
        if task.instances == 0 {
            bail!("{FILE} line {line_no}: instance_num is 0");
        }
        if task.plan_mem.is_some_and(|m| !(m > 0.0 && m <= 16.0)) {
            bail!("{FILE} line {line_no}: plan_mem is not in (0, 16]");
        }
        tasks.push(task);
    }
    if tasks.is_empty() {
        bail!("{FILE}: no tasks");
    }
    Ok(tasks)
}

/// How the trace is cut down to replay in a minute or two.
#[derive(Clone, Copy, Debug)]
pub struct TraceScale {
    /// Each job's instances × this, rounded up.
    pub scale: f64,
    /// The machines × this. The trace's durations are end − create, its
    /// own waits included, and requests (memory above all) are honoured,
    /// so at `scale` the load is far above what the cluster ran (jobs queue
    /// for hours): about 2.4 × `scale` keeps waits to minutes.
    pub machine_scale: f64,
    /// At most this many instances per job (after scaling).
    pub max_instances: u32,
    /// Only jobs created in the first this many seconds of the trace.
    pub window_s: u64,
}

/// A job of the replay: one terminated trace task.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    /// Submitted at, ms from the first creation.
    pub create_ms: u64,
    /// How long each instance runs (the trace's end − create), ms.
    pub duration_ms: u64,
    /// Instances.
    pub instances: u32,
    /// Request of each instance.
    pub request: Resources,
    /// Its class for the learned estimate: plan_cpu, plan_mem in 1/1000
    /// units, ⌈log₂ instances⌉.
    pub class: (u64, u64, u32),
}

/// What the replay took from the trace.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TraceSelection {
    /// Rows replayed (as jobs).
    pub jobs: usize,
    /// Instances replayed.
    pub instances: u64,
    /// Rows not Terminated (their duration is unknown): skipped.
    pub skipped_not_terminated: usize,
    /// Terminated rows without plan_cpu or plan_mem: skipped.
    pub skipped_no_request: usize,
    /// Rows created after the window: skipped.
    pub skipped_after_window: usize,
}

/// The hosts of the replay: `scale` of the machines, evenly spread over
/// the list (so the few larger machines keep their share).
pub fn trace_hosts(machines: &[Machine], scale: f64) -> Vec<HostSpec> {
    let n = ((machines.len() as f64 * scale).round() as usize).clamp(1, machines.len());
    (0..n)
        .map(|k| &machines[k * machines.len() / n])
        .map(|m| HostSpec {
            name: format!("m{}", m.id),
            capacity: Resources::new(
                m.cpus * 1000,
                (m.mem * TRACE_MEM_MIB_PER_UNIT).round() as u64,
                0,
                0,
            ),
            ..Default::default()
        })
        .collect()
}

/// The replay's jobs, in creation order (stable): terminated rows with a
/// request, created within the window, instances scaled and capped.
pub fn trace_jobs(tasks: &[BatchTask], s: &TraceScale) -> (Vec<TraceJob>, TraceSelection) {
    let mut sel = TraceSelection::default();
    let first_s = tasks.iter().map(|t| t.create_s).min().unwrap_or(0);
    let mut jobs = Vec::new();
    for t in tasks {
        if t.status != TaskStatus::Terminated || t.end_s < t.create_s {
            sel.skipped_not_terminated += 1;
            continue;
        }
        let (Some(cpu), Some(mem)) = (t.plan_cpu, t.plan_mem) else {
            sel.skipped_no_request += 1;
            continue;
        };
        let create_s = (t.create_s - first_s) as u64;
        if create_s >= s.window_s {
            sel.skipped_after_window += 1;
            continue;
        }
        let instances = ((t.instances as f64 * s.scale).ceil() as u64)
            .clamp(1, u64::from(s.max_instances.max(1))) as u32;
        jobs.push(TraceJob {
            create_ms: create_s * 1000,
            duration_ms: (t.end_s - t.create_s) as u64 * 1000,
            instances,
            request: Resources::new(
                (cpu * 10).max(1),
                ((mem * TRACE_MEM_MIB_PER_UNIT).round() as u64).max(1),
                0,
                0,
            ),
            class: (
                cpu,
                (mem * 1000.0).round() as u64,
                instances.next_power_of_two().trailing_zeros(),
            ),
        });
        sel.instances += u64::from(instances);
    }
    jobs.sort_by_key(|j| j.create_ms);
    sel.jobs = jobs.len();
    (jobs, sel)
}

/// How a replay's forecasts estimate runtimes and how they step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// The trace's true durations, the default step window.
    True,
    /// True durations, every end its own step.
    TrueNoWindow,
    /// Learned: the p90 of the durations of the jobs of the same class
    /// (plan_cpu, plan_mem, ⌈log₂ instances⌉) that ended so far; else the
    /// p90 of all that ended; else a minute.
    Learned,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::True, Variant::TrueNoWindow, Variant::Learned];

    fn name(self) -> &'static str {
        match self {
            Variant::True => "true_durations",
            Variant::TrueNoWindow => "true_durations_no_window",
            Variant::Learned => "learned_p90_by_class",
        }
    }
}

/// One waiting job at one sampled moment, with its forecast start.
struct Observation {
    job: u32,
    variant: Variant,
    at_ms: u64,
    /// The start of its last waiting instance (none: some instance has no
    /// start within the bounds).
    predicted_ms: Option<u64>,
}

/// The learned estimate: the p90 of the durations that ended so far, by
/// class, and of all.
#[derive(Default)]
struct Learner {
    ended: std::collections::HashMap<(u64, u64, u32), Vec<u64>>,
    all: Vec<u64>,
}

impl Learner {
    fn record(&mut self, class: (u64, u64, u32), duration_ms: u64) {
        self.ended.entry(class).or_default().push(duration_ms);
        self.all.push(duration_ms);
    }

    fn p90(values: &[u64]) -> u64 {
        let mut v = values.to_vec();
        v.sort_unstable();
        v[((v.len() - 1) as f64 * 0.9).round() as usize]
    }

    /// The estimates now, by class, and the fallback.
    fn estimates(&self) -> (std::collections::HashMap<(u64, u64, u32), u64>, u64) {
        let fallback = if self.all.is_empty() {
            60_000
        } else {
            Learner::p90(&self.all)
        };
        let by_class = self
            .ended
            .iter()
            .map(|(&c, v)| (c, Learner::p90(v)))
            .collect();
        (by_class, fallback)
    }
}

/// Replays `jobs` on `hosts` in simulated time, as a forecast drives the
/// engine: at each moment something happens (a job is created, instances
/// end) the instances that ended finish, new jobs are queued (each
/// instance a task of its own, in one pool), and the engine cycles until a
/// cycle changes nothing. Every `every_ms` (when some job waits) forecasts
/// are made with each [`Variant`]; once the replay is over, each waiting
/// job's forecast start (that of its last waiting instance) is compared
/// with when its last instance really started.
pub fn replay(
    hosts: &[HostSpec],
    jobs: &[TraceJob],
    every_ms: u64,
    config: &ForecastConfig,
    threads: usize,
) -> Result<Value> {
    if every_ms == 0 {
        bail!("--every must be at least 1 s");
    }
    if jobs.len() > u32::MAX as usize / 2 {
        bail!("too many jobs");
    }
    let started = Instant::now();
    let mut engine = Engine::new(engine_config(threads, hosts.len()));
    for h in hosts {
        engine
            .hosts_mut()
            .add(h)
            .with_context(|| format!("host {}", h.name))?;
    }
    let pool = engine
        .resources_mut()
        .create_pool("/batch", PoolConfig::default())
        .context("creating the pool")?;
    let mut ends: BinaryHeap<Reverse<(u64, TaskHandle)>> = BinaryHeap::new();
    let mut n_placed = vec![0u32; jobs.len()];
    let mut last_start_ms: Vec<Option<u64>> = vec![None; jobs.len()];
    let mut ended = vec![false; jobs.len()];
    let mut learner = Learner::default();
    let mut observations = Vec::new();
    let mut forecast_ms: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut steps: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut samples = 0u64;
    let mut cycles_at = 0u64;
    let mut next_job = 0usize;
    let mut next_sample = jobs.first().map_or(0, |j| j.create_ms) + every_ms;
    let mut batch = Vec::new();
    let mut handles = Vec::new();
    loop {
        let next_create = jobs.get(next_job).map(|j| j.create_ms);
        let next_end = ends.peek().map(|Reverse((e, _))| *e);
        let Some(t) = [next_create, next_end].into_iter().flatten().min() else {
            break;
        };
        let t = t.min(next_sample);
        while let Some(&Reverse((end, task))) = ends.peek() {
            if end > t {
                break;
            }
            ends.pop();
            let (job, _) = engine.tasks().owner(task).expect("running");
            let j = job as usize;
            if !ended[j] {
                ended[j] = true;
                learner.record(jobs[j].class, jobs[j].duration_ms);
            }
            engine.finish(task).context("finishing a task")?;
        }
        while next_job < jobs.len() && jobs[next_job].create_ms <= t {
            let j = &jobs[next_job];
            batch.clear();
            batch.extend((0..j.instances).map(|i| NewTask {
                job: next_job as u32,
                instance: i,
                pool,
                priority: 1,
                request: j.request,
                ports: 0,
                flags: TaskFlags::default(),
                constraint: String::new(),
                strategy: Strategy::Pack,
                max_per_host: 0,
                limit_key: next_job as u32,
                desired_host: None,
                daemon: false,
                // True durations declared: backfill plans with them.
                runtime_ms: j.duration_ms,
            }));
            engine
                .submit_each(&batch, &mut handles)
                .context("queueing a job")?;
            handles.clear();
            next_job += 1;
        }
        for p in cycle_until_quiet(&mut engine, t) {
            let (job, _) = engine.tasks().owner(p.task).expect("placed");
            let j = job as usize;
            n_placed[j] += 1;
            if n_placed[j] == jobs[j].instances {
                last_start_ms[j] = Some(t);
            }
            ends.push(Reverse((t + jobs[j].duration_ms.max(1), p.task)));
        }
        cycles_at += 1;
        if t == next_sample {
            next_sample += every_ms;
            if engine.tasks().len() > ends.len() {
                samples += 1;
                let (by_class, fallback) = learner.estimates();
                for (v, variant) in Variant::ALL.into_iter().enumerate() {
                    let t0 = Instant::now();
                    let f = match variant {
                        Variant::True | Variant::TrueNoWindow => {
                            let config = if variant == Variant::True {
                                *config
                            } else {
                                exact_config()
                            };
                            let runtime = |job: u32, _: u32| Some(jobs[job as usize].duration_ms);
                            forecast(&engine, t, &runtime, &config)
                        }
                        Variant::Learned => {
                            let runtime = |job: u32, _: u32| {
                                let class = jobs[job as usize].class;
                                Some(by_class.get(&class).copied().unwrap_or(fallback))
                            };
                            forecast(&engine, t, &runtime, config)
                        }
                    };
                    forecast_ms[v].push(ms(t0.elapsed()));
                    steps[v].push(f64::from(f.steps));
                    observe(&engine, &f, variant, &mut observations);
                }
            }
        }
    }
    let replay_s = started.elapsed().as_secs_f64();
    let never_started = last_start_ms.iter().filter(|s| s.is_none()).count();
    let mut waited: Vec<f64> = jobs
        .iter()
        .zip(&last_start_ms)
        .filter_map(|(j, s)| s.map(|s| (s - j.create_ms) as f64 / 1e3))
        .filter(|&w| w > 0.0)
        .collect();
    waited.sort_by(f64::total_cmp);
    let mut variants = Vec::new();
    for (v, variant) in Variant::ALL.into_iter().enumerate() {
        let mut report = accuracy(
            observations.iter().filter(|o| o.variant == variant),
            jobs,
            &last_start_ms,
        );
        forecast_ms[v].sort_by(f64::total_cmp);
        steps[v].sort_by(f64::total_cmp);
        report["variant"] = json!(variant.name());
        report["forecast_ms_median"] = json!(quantile(&forecast_ms[v], 0.5));
        report["forecast_ms_max"] = json!(forecast_ms[v].last().copied().unwrap_or(0.0));
        report["steps_median"] = json!(quantile(&steps[v], 0.5));
        report["steps_max"] = json!(steps[v].last().copied().unwrap_or(0.0));
        variants.push(report);
    }
    engine.check_invariants();
    Ok(json!({
        "hosts": hosts.len(),
        "every_s": every_ms as f64 / 1e3,
        "samples": samples,
        "moments_cycled": cycles_at,
        "jobs_that_waited": waited.len(),
        "wait_s_median": quantile(&waited, 0.5),
        "wait_s_p90": quantile(&waited, 0.9),
        "jobs_never_started": never_started,
        "replay_s": replay_s,
        "variants": variants,
    }))
}

/// Records the forecast start of each job waiting in `f`: that of its
/// last waiting instance.
fn observe(engine: &Engine, f: &Forecast, variant: Variant, out: &mut Vec<Observation>) {
    let mut by_job: std::collections::HashMap<u32, Option<u64>> = Default::default();
    for t in &f.tasks {
        let (job, _) = engine.tasks().owner(t.task).expect("waiting");
        let start = t.start.map(|s| s.at_ms);
        by_job
            .entry(job)
            .and_modify(|p| *p = p.zip(start).map(|(a, b)| a.max(b)))
            .or_insert(start);
    }
    let mut list: Vec<_> = by_job.into_iter().collect();
    list.sort_unstable_by_key(|&(job, _)| job);
    out.extend(list.into_iter().map(|(job, predicted_ms)| Observation {
        job,
        variant,
        at_ms: f.now_ms,
        predicted_ms,
    }));
}

/// Errors of forecast starts against real ones: as a share of the job's
/// wait (creation to its last instance's start) and of what was left of
/// it at the forecast, and in seconds.
fn accuracy<'a>(
    observations: impl Iterator<Item = &'a Observation>,
    jobs: &[TraceJob],
    last_start_ms: &[Option<u64>],
) -> Value {
    let (mut of_wait, mut of_left, mut error_s) = (Vec::new(), Vec::new(), Vec::new());
    let (mut no_estimate, mut not_started, mut exact) = (0, 0, 0);
    let mut distinct = std::collections::HashSet::new();
    for o in observations {
        let j = o.job as usize;
        let Some(actual) = last_start_ms[j] else {
            not_started += 1;
            continue;
        };
        let Some(predicted) = o.predicted_ms else {
            no_estimate += 1;
            continue;
        };
        distinct.insert(o.job);
        let error = predicted.abs_diff(actual) as f64;
        if error == 0.0 {
            exact += 1;
        }
        error_s.push(error / 1e3);
        of_wait.push(error / (actual - jobs[j].create_ms).max(1) as f64);
        of_left.push(error / actual.saturating_sub(o.at_ms).max(1) as f64);
    }
    for v in [&mut of_wait, &mut of_left, &mut error_s] {
        v.sort_by(f64::total_cmp);
    }
    json!({
        "observations": error_s.len(),
        "jobs": distinct.len(),
        "exact": exact,
        "without_estimate": no_estimate,
        "never_started": not_started,
        "error_of_wait_median": quantile(&of_wait, 0.5),
        "error_of_wait_p90": quantile(&of_wait, 0.9),
        "error_of_wait_left_median": quantile(&of_left, 0.5),
        "error_of_wait_left_p90": quantile(&of_left, 0.9),
        "error_s_median": quantile(&error_s, 0.5),
        "error_s_p90": quantile(&error_s, 0.9),
    })
}

/// Reads the trace in `dir` and replays it.
pub fn accuracy_on_trace(
    dir: &Path,
    scale: &TraceScale,
    every_s: u64,
    config: &ForecastConfig,
    threads: usize,
) -> Result<Value> {
    if !(scale.scale > 0.0 && scale.scale <= 1.0) {
        bail!("--scale must be in (0, 1]");
    }
    if !(scale.machine_scale > 0.0 && scale.machine_scale <= 1.0) {
        bail!("--machine-scale must be in (0, 1]");
    }
    if !(1..=100_000).contains(&scale.max_instances) {
        bail!("--max-instances must be between 1 and 100000");
    }
    if !(1..=86_400).contains(&every_s) {
        bail!("--every must be between 1 and 86400 s");
    }
    let machines = parse_machines(&read_trace_file(&dir.join("server_event.csv"))?)?;
    let tasks = parse_batch_tasks(&read_trace_file(&dir.join("batch_task.csv"))?)?;
    let hosts = trace_hosts(&machines, scale.machine_scale);
    let (jobs, selection) = trace_jobs(&tasks, scale);
    if jobs.is_empty() {
        bail!("no job of the trace is replayed (see --window)");
    }
    let mut report = replay(&hosts, &jobs, every_s * 1000, config, threads)?;
    report["trace"] = json!(dir.display().to_string());
    report["scale"] = json!(scale.scale);
    report["machine_scale"] = json!(scale.machine_scale);
    report["max_instances"] = json!(scale.max_instances);
    report["window_s"] = json!(scale.window_s);
    report["machines_in_trace"] = json!(machines.len());
    report["selection"] = serde_json::to_value(&selection).expect("plain data");
    Ok(report)
}

/// The accuracy report as text.
pub fn print_accuracy(r: &Value) {
    println!(
        "forecast: accuracy on {} (instances × {}, machines × {}, at most {} instances a job, window {} s)",
        r["trace"].as_str().unwrap_or(""),
        r["scale"],
        r["machine_scale"],
        r["max_instances"],
        r["window_s"]
    );
    println!(
        "  {} hosts, {} jobs, {} instances; skipped: {} not terminated, {} without request, {} after the window",
        r["hosts"],
        r["selection"]["jobs"],
        r["selection"]["instances"],
        r["selection"]["skipped_not_terminated"],
        r["selection"]["skipped_no_request"],
        r["selection"]["skipped_after_window"]
    );
    println!(
        "  replay {:.1} s; {} forecasts every {} s; {} jobs waited (median {:.0} s, p90 {:.0} s)",
        r["replay_s"].as_f64().unwrap_or(0.0),
        r["samples"],
        r["every_s"],
        r["jobs_that_waited"],
        r["wait_s_median"].as_f64().unwrap_or(0.0),
        r["wait_s_p90"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  {:<26} {:>8} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9}",
        "estimates",
        "observ.",
        "jobs",
        "no est.",
        "err/wait",
        "p90",
        "err/left",
        "p90",
        "err s",
        "p90",
        "ms (max)"
    );
    for v in r["variants"].as_array().into_iter().flatten() {
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        println!(
            "  {:<26} {:>8} {:>6} {:>7} {:>8.1}% {:>8.1}% {:>8.1}% {:>8.1}% {:>8.1} {:>8.1} {:>9.1}",
            v["variant"].as_str().unwrap_or(""),
            v["observations"],
            v["jobs"],
            v["without_estimate"],
            100.0 * f("error_of_wait_median"),
            100.0 * f("error_of_wait_p90"),
            100.0 * f("error_of_wait_left_median"),
            100.0 * f("error_of_wait_left_p90"),
            f("error_s_median"),
            f("error_s_p90"),
            f("forecast_ms_max"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINES: &str = "0,1,add,,64,0.69,1\n\
                            0,2,add,,64,1.0,1\n\
                            100,1,softerror,agent_check,0,0,0\n\
                            0,1,add,,64,0.5,1\n";

    const TASKS: &str = "task_create_time, task_end_time, job_id, task_id,number_of_instances, status, plan_cpu,plan_mem\r\n\
                         6459,6524,3,4,15740,Terminated,50,0.007956928\r\n\
                         -10,20,3,5,1,Terminated,100,0.004\r\n\
                         7000,7100,4,6,2,Waiting,,\r\n\
                         7000,7100,4,7,3,Terminated,,\r\n\
                         \r\n";

    #[test]
    fn machines_are_the_add_rows_once_each() {
        let m = parse_machines(MACHINES).unwrap();
        assert_eq!(
            m,
            [
                Machine {
                    id: 1,
                    cpus: 64,
                    mem: 0.69
                },
                Machine {
                    id: 2,
                    cpus: 64,
                    mem: 1.0
                }
            ]
        );
        let err = parse_machines("0,1,add,,64,0.69\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "server_event.csv line 1: 6 fields, expected 7"
        );
        let err = parse_machines("0,1,add,,sixty,0.69,1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "server_event.csv line 1: cpus \"sixty\" is not a number"
        );
        assert!(
            parse_machines("0,1,softerror,x,0,0,0\n").is_err(),
            "no machine"
        );
    }

    #[test]
    fn batch_tasks_take_the_header_crlf_and_empty_requests() {
        let t = parse_batch_tasks(TASKS).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(
            t[0],
            BatchTask {
                create_s: 6459,
                end_s: 6524,
                job_id: 3,
                task_id: 4,
                instances: 15740,
                status: TaskStatus::Terminated,
                plan_cpu: Some(50),
                plan_mem: Some(0.007956928),
            }
        );
        assert_eq!(t[1].create_s, -10);
        assert_eq!(
            (t[2].status, t[2].plan_cpu, t[2].plan_mem),
            (TaskStatus::Waiting, None, None)
        );
        // No header is fine too.
        assert_eq!(
            parse_batch_tasks("1,2,3,4,5,Failed,50,0.01\n")
                .unwrap()
                .len(),
            1
        );
        let err = parse_batch_tasks("h\r\n1,2,3,4,0,Terminated,50,0.01\r\n").unwrap_err();
        assert_eq!(err.to_string(), "batch_task.csv line 2: instance_num is 0");
        let err = parse_batch_tasks("1,2,3,4,5,Lost,50,0.01\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch_task.csv line 1: status \"Lost\" is not one the trace uses"
        );
        let err = parse_batch_tasks("1,2,3,4,5,Failed,x,0.01\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch_task.csv line 1: plan_cpu \"x\" is not a number"
        );
    }

    #[test]
    fn jobs_are_terminated_rows_scaled_capped_and_windowed() {
        let tasks = parse_batch_tasks(TASKS).unwrap();
        let scale = TraceScale {
            scale: 0.01,
            machine_scale: 0.01,
            max_instances: 100,
            window_s: 7_000,
        };
        let (jobs, sel) = trace_jobs(&tasks, &scale);
        assert_eq!(
            (
                sel.jobs,
                sel.skipped_not_terminated,
                sel.skipped_no_request,
                sel.skipped_after_window
            ),
            (2, 1, 1, 0)
        );
        // In creation order, from the first creation (-10 s).
        assert_eq!(jobs[0].create_ms, 0);
        assert_eq!(jobs[0].duration_ms, 30_000);
        assert_eq!(jobs[0].instances, 1, "at least one");
        assert_eq!(jobs[0].request, Resources::new(1000, 1049, 0, 0));
        assert_eq!(jobs[1].create_ms, 6_469_000);
        assert_eq!(jobs[1].instances, 100, "15,740 × 0.01 capped at 100");
        assert_eq!(jobs[1].class, (50, 8, 7));
        let short = TraceScale {
            window_s: 6_000,
            ..scale
        };
        let (jobs, sel) = trace_jobs(&tasks, &short);
        assert_eq!((jobs.len(), sel.skipped_after_window), (1, 1));
        let hosts = trace_hosts(&parse_machines(MACHINES).unwrap(), 1.0);
        assert_eq!(hosts[1].capacity, Resources::new(64_000, 262_144, 0, 0));
    }
}
