//! `peloton-bench overcommit`: revocable work on what services reserve and
//! do not use, with real processes.
//!
//! Starts `pelotond` and `--agents` local `peloton-agent`s that split the
//! machine's CPUs between them (and advertise `--agent-memory-mb` each),
//! reporting usage every `--report-interval` seconds. A service (type
//! SERVICE, one instance a host) reserves three quarters of every host and
//! sleeps until a trigger file appears. Then a revocable batch job of busy
//! loops, one a host, each asking for more than its host leaves
//! unallocated: it runs only on what the services lend. Then the trigger
//! makes every service hold most of its memory, into the lent room, and
//! the QoS controller preempts the busy loops. Reports:
//! - `services_reserved_cpu_pct` / `services_used_cpu_pct`: of the
//!   machine's CPUs, what the services are allocated and what they were
//!   measured using (by the server);
//! - `batch_requested_cpu` / `unallocated_cpu`: what the busy loops ask
//!   for in all and what the hosts left unallocated (less: they ran on
//!   lent room);
//! - `machine_cpu_pct_services_only` / `machine_cpu_pct_with_batch`: the
//!   machine's busy CPU (from /proc/stat) over `--window` seconds with only
//!   the services running, and again while the busy loops run; anything
//!   else the machine runs counts too, so `tasks_cpu_pct_*` gives the
//!   share of the tasks' own processes (from /proc);
//! - `preempted_after_ms` (and `_intervals`, in report intervals): per
//!   host, from the first report in which its service uses more than
//!   leaves room for what its busy loop borrowed (CPU or memory, by the
//!   server's default margins; its `reported_at_ms`) to the busy loop's
//!   end as its agent confirmed it; the slowest host;
//! - `gone_after_ms` (and `_intervals`): from the last host's such report
//!   to when no busy loop's process was left on the machine;
//! - `machine_load_1m`: the load average as the run began (the figures
//!   above share the machine with whatever else runs);
//! - `service_runs_failed`: service instances that are not on their first
//!   run, still running, once the busy loops are gone (expect 0).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use peloton_gateway::client::Authed;
use peloton_proto::v1 as pb;
use serde_json::{Value, json};

use crate::launch::{Process, spawn_agent};

/// Options of one run.
#[derive(Debug, Clone)]
pub struct OvercommitOptions {
    /// Local agents to start.
    pub agents: u32,
    /// Memory each agent advertises, MiB.
    pub agent_memory_mb: u64,
    /// The agents' `--usage-interval`, seconds.
    pub report_interval_s: u64,
    /// Seconds each CPU measurement lasts.
    pub window_s: u64,
}

/// How long a stopped child may take before SIGKILL.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long any one phase may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);
/// A service reserves this share of its host (CPU and memory), percent.
const SERVICE_SHARE_PCT: u64 = 75;
/// Once triggered, a service holds this share of what it reserves,
/// percent: within its memory limit, and beyond what its host lends less
/// the 20 % margin.
const RISE_PCT: u64 = 75;
/// A busy loop asks for this share of its host's CPU, percent: more than
/// the quarter left unallocated, less than that and what the service
/// lends (three quarters less 10 %), so one runs on each host.
const BATCH_CPU_PCT: u64 = 80;
/// And this share of its host's memory: more than the quarter left.
const BATCH_MEMORY_PCT: u64 = 37;

/// Runs the benchmark.
pub async fn run(o: OvercommitOptions) -> Result<Value> {
    anyhow::ensure!((1..=16).contains(&o.agents), "--agents: between 1 and 16");
    anyhow::ensure!(
        (1..=60).contains(&o.report_interval_s),
        "--report-interval: between 1 and 60 s"
    );
    anyhow::ensure!(
        (1..=600).contains(&o.window_s),
        "--window: between 1 and 600 s"
    );
    anyhow::ensure!(
        (512..=1 << 20).contains(&o.agent_memory_mb),
        "--agent-memory-mb: between 512 and 1048576"
    );
    let interval_ms = o.report_interval_s * 1000;
    let load_1m: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get()) as u64;
    // The machine's CPUs split between the agents, in millicores.
    let host_cpu_millis = cores * 1000 / u64::from(o.agents);
    let share = |total: u64, pct: u64| total * pct / 100;
    let service_cpu_millis = share(host_cpu_millis, SERVICE_SHARE_PCT);
    let service_memory_mb = share(o.agent_memory_mb, SERVICE_SHARE_PCT);
    let batch_cpu_millis = share(host_cpu_millis, BATCH_CPU_PCT);
    let batch_memory_mb = share(o.agent_memory_mb, BATCH_MEMORY_PCT);
    let rise_mb = share(service_memory_mb, RISE_PCT);

    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("server");
    let token = "bench-token";
    let (server, target) = crate::launch::start_server(&data_dir, token, &[])?;
    let agent_bin = crate::launch::sibling("peloton-agent")?;
    let agents_dir = dir.path().join("agents");
    let resources = format!(
        "cpu={},mem={},disk=100000",
        host_cpu_millis as f64 / 1000.0,
        o.agent_memory_mb
    );
    let mut agents = Vec::new();
    for i in 0..o.agents {
        let host = format!("oc-{i}");
        let mut extra =
            crate::e2e::agent_tls_args(&target, &data_dir, &host, &dir.path().join("certs"))?;
        extra.extend(["--usage-interval".into(), o.report_interval_s.to_string()]);
        let child = spawn_agent(
            &agent_bin,
            &target.url,
            token,
            &agents_dir.join(&host),
            &host,
            &resources,
            &extra,
        )?;
        agents.push(Process(child, PATIENCE));
    }
    let channel = target.connect().await?;
    let c = Clients::new(&channel);
    poll("every agent up", async || {
        let hosts = c.hosts().await?;
        let up = hosts
            .iter()
            .filter(|h| h.connected && h.state() == pb::HostState::Up)
            .count();
        Ok((up == o.agents as usize).then_some(()))
    })
    .await?;
    crate::e2e::create_pool(&channel, "/bench").await?;

    // The services.
    let trigger = dir.path().join("rise");
    let sleeper = format!(
        "while [ ! -e {trigger} ]; do sleep 0.2; done; \
         (head -c {bytes} /dev/zero; sleep 3600) | tail",
        trigger = trigger.display(),
        bytes = rise_mb << 20,
    );
    let services = c
        .create(pb::JobSpec {
            r#type: pb::JobType::Service as i32,
            ..job_spec(
                "services",
                o.agents,
                task(&sleeper, service_cpu_millis, service_memory_mb, false),
            )
        })
        .await?;
    poll("the services running and measured", async || {
        let mut measured = 0;
        for t in c.tasks(&services).await? {
            let Some(run) = t.current.as_ref() else {
                continue;
            };
            if run.state() == pb::TaskState::Running
                && run
                    .used
                    .is_some_and(|u| u.reported_at_ms > run.started_at_ms + 2 * interval_ms)
            {
                measured += 1;
            }
        }
        Ok((measured == o.agents).then_some(()))
    })
    .await?;
    let unallocated_cpu: f64 = c
        .hosts()
        .await?
        .iter()
        .map(|h| h.free.map_or(0.0, |f| f.cpu))
        .sum();
    let sandboxes = format!("PELOTON_SANDBOX={}", agents_dir.display());
    let services_only = measure_cpu(o.window_s, cores, &sandboxes).await;
    let services_used_cpu: f64 = c
        .tasks(&services)
        .await?
        .iter()
        .filter_map(|t| t.current.as_ref()?.used)
        .map(|u| u.cpu)
        .sum();

    // The revocable busy loops.
    let batch = c
        .create(job_spec(
            "busy",
            o.agents,
            task(
                "while :; do :; done",
                batch_cpu_millis,
                batch_memory_mb,
                true,
            ),
        ))
        .await?;
    poll("every busy loop running", async || {
        let running = c
            .tasks(&batch)
            .await?
            .iter()
            .filter(|t| {
                t.current
                    .as_ref()
                    .is_some_and(|r| r.state() == pb::TaskState::Running)
            })
            .count();
        Ok((running == o.agents as usize).then_some(()))
    })
    .await?;
    // Past their start (a shell's exec and the first reports).
    tokio::time::sleep(Duration::from_millis(interval_ms)).await;
    let with_batch = measure_cpu(o.window_s, cores, &sandboxes).await;

    // The services' use rises. Each host's rise counts from the first
    // report (its `reported_at_ms`) in which its service uses more than
    // leaves room for what its busy loop borrowed (in CPU or memory).
    std::fs::write(&trigger, b"").context("the trigger file")?;
    let plan = Plan {
        host_cpu_millis,
        host_memory_mb: o.agent_memory_mb,
        service_cpu_millis,
        service_memory_mb,
        batch_cpu_millis,
        batch_memory_mb,
    };
    let mut first_rise_ms: std::collections::BTreeMap<String, u64> = Default::default();
    let batch_env = format!("PELOTON_SANDBOX={}", agents_dir.display());
    let (ends, gone_ms) = poll("every busy loop gone", async || {
        for t in c.tasks(&services).await? {
            if let Some(run) = t.current
                && let Some(u) = run.used
                && plan.crowds_out(&u)
            {
                let first = first_rise_ms.entry(run.host).or_insert(u.reported_at_ms);
                *first = (*first).min(u.reported_at_ms);
            }
        }
        let mut ends = Vec::new();
        for i in 0..o.agents {
            let t = c.task(&batch, i).await?;
            let Some(run) = t
                .history
                .iter()
                .find(|r| r.state() == pb::TaskState::Preempted)
            else {
                return Ok(None);
            };
            if t.stopping {
                return Ok(None);
            }
            // Its end as its agent confirmed it.
            ends.push(run.clone());
        }
        let loops_left = processes_with_env(&batch_env)
            .iter()
            .filter(|(_, var)| var.contains(&batch))
            .count();
        Ok(
            (loops_left == 0 && first_rise_ms.len() == o.agents as usize)
                .then_some((ends, crate::e2e::wall_ms())),
        )
    })
    .await?;
    // Per host, from its rise's report to its busy loop's confirmed end;
    // the slowest host.
    let preempted_after_ms = ends
        .iter()
        .map(|r| r.finished_at_ms as i64 - first_rise_ms.get(&r.host).map_or(0, |&t| t as i64))
        .max()
        .unwrap_or_default();
    let last_rise_ms = first_rise_ms.values().max().copied().unwrap_or_default();
    let gone_after_ms = gone_ms as i64 - last_rise_ms as i64;
    let mut reasons = Vec::new();
    for i in 0..o.agents {
        let t = c.task(&batch, i).await?;
        if let Some(run) = t
            .history
            .iter()
            .find(|r| r.state() == pb::TaskState::Preempted)
        {
            reasons.push(run.reason.clone());
        }
    }
    reasons.sort();
    reasons.dedup();
    // The services, two report intervals later.
    tokio::time::sleep(Duration::from_millis(2 * interval_ms)).await;
    let mut service_runs_failed = 0;
    for t in c.tasks(&services).await? {
        let healthy = t
            .current
            .as_ref()
            .is_some_and(|r| r.state() == pb::TaskState::Running && r.run_id == 1)
            && t.failure_count == 0
            && t.history.is_empty();
        service_runs_failed += u32::from(!healthy);
    }
    drop(agents);
    drop(server);
    let intervals = |ms: i64| (ms as f64 / interval_ms as f64 * 100.0).round() / 100.0;
    let pct = |x: f64| (x * 10.0).round() / 10.0;
    Ok(json!({
        "agents": o.agents,
        "machine_cpus": cores,
        "machine_load_1m": load_1m,
        "report_interval_ms": interval_ms,
        "window_s": o.window_s,
        "host_cpu": host_cpu_millis as f64 / 1000.0,
        "host_memory_mb": o.agent_memory_mb,
        "services_reserved_cpu_pct": pct(
            (service_cpu_millis * u64::from(o.agents)) as f64 / (cores * 10) as f64
        ),
        "services_used_cpu_pct": pct(services_used_cpu / cores as f64 * 100.0),
        "unallocated_cpu": unallocated_cpu,
        "batch_requested_cpu": (batch_cpu_millis * u64::from(o.agents)) as f64 / 1000.0,
        "machine_cpu_pct_services_only": pct(services_only.machine_pct),
        "machine_cpu_pct_with_batch": pct(with_batch.machine_pct),
        "tasks_cpu_pct_services_only": pct(services_only.tasks_pct),
        "tasks_cpu_pct_with_batch": pct(with_batch.tasks_pct),
        "preempted_after_ms": preempted_after_ms,
        "preempted_after_intervals": intervals(preempted_after_ms),
        "gone_after_ms": gone_after_ms,
        "gone_after_intervals": intervals(gone_after_ms),
        "preempted_because": reasons,
        "service_runs_failed": service_runs_failed,
    }))
}

/// What each host holds, in millicores and MiB.
struct Plan {
    host_cpu_millis: u64,
    host_memory_mb: u64,
    service_cpu_millis: u64,
    service_memory_mb: u64,
    batch_cpu_millis: u64,
    batch_memory_mb: u64,
}

/// pelotond's default margins: what hosts keep back from lending, percent
/// of what their non-revocable tasks are allocated.
const CPU_MARGIN_PCT: f64 = 10.0;
const MEMORY_MARGIN_PCT: f64 = 20.0;

impl Plan {
    /// Whether a service using `u` leaves its host less to lend than its
    /// busy loop borrowed beyond the unallocated room, in CPU or memory
    /// (memory by the larger of now and its decayed peak, as the server
    /// estimates it).
    fn crowds_out(&self, u: &pb::ResourceUsage) -> bool {
        let lends = |allocated: u64, used: f64, margin_pct: f64| {
            allocated as f64 * (1.0 - margin_pct / 100.0) - used
        };
        let borrowed = |batch: u64, host: u64, service: u64| {
            batch.saturating_sub(host.saturating_sub(service)) as f64
        };
        let cpu_lent = lends(self.service_cpu_millis, u.cpu * 1000.0, CPU_MARGIN_PCT);
        let memory_lent = lends(
            self.service_memory_mb,
            u.memory_mb.max(u.memory_peak_mb),
            MEMORY_MARGIN_PCT,
        );
        cpu_lent
            < borrowed(
                self.batch_cpu_millis,
                self.host_cpu_millis,
                self.service_cpu_millis,
            )
            || memory_lent
                < borrowed(
                    self.batch_memory_mb,
                    self.host_memory_mb,
                    self.service_memory_mb,
                )
    }
}

/// The clients the bench uses.
struct Clients {
    jobs: pb::job_service_client::JobServiceClient<Authed>,
    tasks: pb::task_service_client::TaskServiceClient<Authed>,
    hosts: pb::host_service_client::HostServiceClient<Authed>,
}

impl Clients {
    fn new(channel: &Authed) -> Self {
        Clients {
            jobs: pb::job_service_client::JobServiceClient::new(channel.clone()),
            tasks: pb::task_service_client::TaskServiceClient::new(channel.clone()),
            hosts: pb::host_service_client::HostServiceClient::new(channel.clone()),
        }
    }

    async fn hosts(&self) -> Result<Vec<pb::Host>> {
        Ok(self
            .hosts
            .clone()
            .list(pb::ListHostsRequest::default())
            .await?
            .into_inner()
            .hosts)
    }

    async fn create(&self, spec: pb::JobSpec) -> Result<String> {
        Ok(self
            .jobs
            .clone()
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await?
            .into_inner()
            .job
            .context("no job")?
            .id)
    }

    async fn tasks(&self, job: &str) -> Result<Vec<pb::Task>> {
        Ok(self
            .tasks
            .clone()
            .list(pb::ListTasksRequest {
                job_id: job.into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .tasks)
    }

    async fn task(&self, job: &str, instance: u32) -> Result<pb::Task> {
        self.tasks
            .clone()
            .get(pb::GetTaskRequest {
                job_id: job.into(),
                instance,
            })
            .await?
            .into_inner()
            .task
            .context("no task")
    }
}

fn task(shell: &str, cpu_millis: u64, memory_mb: u64, revocable: bool) -> pb::TaskSpec {
    pb::TaskSpec {
        shell: shell.into(),
        resources: Some(pb::Resources {
            cpu: cpu_millis as f64 / 1000.0,
            memory_mb: memory_mb as f64,
            ..Default::default()
        }),
        revocable,
        ..Default::default()
    }
}

fn job_spec(name: &str, instances: u32, task: pb::TaskSpec) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        owner: "peloton-bench".into(),
        pool: "/bench".into(),
        instance_count: instances,
        default_task: Some(task),
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Polls `check` every 20 ms until it gives a value, for at most
/// [`PHASE_TIMEOUT`].
async fn poll<T>(what: &str, mut check: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {PHASE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// CPU use over a window, in percent of the machine's CPUs.
struct CpuUse {
    /// Every CPU's busy time (/proc/stat).
    machine_pct: f64,
    /// The tasks' processes' (those with `needle` in their environment).
    tasks_pct: f64,
}

async fn measure_cpu(window_s: u64, cores: u64, needle: &str) -> CpuUse {
    let (machine0, _) = crate::launch::machine_cpu_s();
    let tasks0 = processes_cpu_s(needle);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(window_s)).await;
    let (machine1, _) = crate::launch::machine_cpu_s();
    let tasks1 = processes_cpu_s(needle);
    let capacity = start.elapsed().as_secs_f64() * cores as f64;
    // Time of processes alive at both ends (the tasks here live through
    // the window).
    let tasks: f64 = tasks1
        .iter()
        .filter_map(|(pid, t)| Some(t - tasks0.get(pid)?))
        .sum();
    CpuUse {
        machine_pct: (machine1 - machine0) / capacity * 100.0,
        tasks_pct: tasks / capacity * 100.0,
    }
}

/// CPU seconds (user + system) of each process with a variable starting
/// with `needle` in its environment, by pid.
fn processes_cpu_s(needle: &str) -> std::collections::HashMap<u32, f64> {
    processes_with_env(needle)
        .into_iter()
        .map(|(pid, _)| (pid, crate::launch::stat_cpu_s(&format!("/proc/{pid}/stat"))))
        .collect()
}

/// Live processes with a variable starting with `needle` in their
/// environment, with that variable.
fn processes_with_env(needle: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let Some(var) = env
            .split(|&b| b == 0)
            .find(|var| var.starts_with(needle.as_bytes()))
        else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if !state.starts_with('Z') {
            out.push((pid, String::from_utf8_lossy(var).into_owned()));
        }
    }
    out
}
