//! `peloton-bench whatif`: capacity planning from a cluster snapshot.
//!
//! Loads a snapshot (`peloton cluster snapshot DIR`: hosts.arrow,
//! pools.arrow, tasks.arrow), builds an engine from it — the up hosts with
//! their capacity, the pool tree as the server builds it from the pools'
//! specs (`peloton_gateway::convert::pool_config`), running tasks adopted
//! on their hosts, waiting tasks submitted in the order they were queued
//! (gangs as gangs) — and replays it in simulated time through the
//! engine's own cycle, once as it is (the baseline) and once per change
//! given on the command line: hosts added or removed, a pool's reservation,
//! limit, share or kind, backfill on, off or bounded. It answers "what if
//! nothing else is submitted": no new work arrives, running tasks end at
//! their runtime estimates (a task with none, such as a service, runs
//! forever; one past its estimate ends at once), waiting tasks run for
//! their estimates once started. Inter-pool preemption is not replayed
//! (as the start forecast does not), nor are constraints, host pools and
//! ports (the snapshot does not carry them): a task may run on any host.
//!
//! The replay runs a cycle at the snapshot's time and at every end, again
//! at the same moment while anything is admitted or placed, until every
//! waiting task has started and every one with an estimate has ended, or
//! the horizon or the step bound is reached. Reported per variant, in
//! total and per leaf pool: waiting tasks, how many started, the median,
//! 90th percentile and longest wait (from the snapshot's time; a task that
//! never started counts the whole replay, so figures are then lower
//! bounds), the makespan (until the last waiting task ended, or started if
//! it has no estimate), utilization per dimension (allocated over capacity,
//! time-averaged over the replay), and fairness: Jain's index, over the
//! leaf pools with tasks still waiting and some cpu entitlement, of each
//! pool's cpu allocation over its cpu entitlement, time-averaged (1: every pool with waiting work
//! holds the same fraction of what it is entitled to).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use arrow_array::{
    Array, BooleanArray, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use peloton_engine::backfill::{BackfillConfig, MAX_RESERVATIONS};
use peloton_engine::host::HostSpec;
use peloton_engine::task::{Strategy, TaskHandle};
use peloton_engine::{
    Dim, Engine, EngineConfig, NewTask, PoolConfig, PoolId, ResourceManagerConfig, Resources,
    TaskFlags,
};
use peloton_proto::v1 as pb;
use serde_json::{Value, json};

/// The schema metadata key of the snapshot's time (written by `peloton
/// cluster snapshot`).
const TAKEN_AT_KEY: &str = "peloton.snapshot.taken_at_ms";

/// Most hosts `--add-hosts` may add in one change.
pub const MAX_ADDED_HOSTS: u32 = 100_000;

/// Longest horizon: a year.
pub const MAX_HORIZON_MS: u64 = 365 * 24 * 3_600_000;

/// Most cycles run at one moment of the replay (each admits or places
/// something, or the moment is over).
const MAX_CYCLES_AT_ONCE: usize = 1_000;

/// A snapshot's host.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRow {
    /// Its name.
    pub name: String,
    /// "up", "draining", "down" (only up hosts take part).
    pub state: String,
    /// Capacity in the engine's units.
    pub capacity: Resources,
}

/// A snapshot's pool: its path and spec as the API gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolRow {
    /// Absolute path.
    pub path: String,
    /// Its spec (API units).
    pub spec: pb::PoolSpec,
}

/// A snapshot's task.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    /// Its job's id.
    pub job_id: String,
    /// Its job's leaf pool.
    pub pool: String,
    /// Instance within the job.
    pub instance: u32,
    /// Its current run's state ("running", "pending", …).
    pub state: String,
    /// Its host, if placed.
    pub host: Option<String>,
    /// When its run started (or was placed), ms since the epoch.
    pub started_at_ms: Option<u64>,
    /// When its run was created (queued), ms since the epoch.
    pub created_at_ms: Option<u64>,
    /// When its job was created.
    pub job_created_at_ms: Option<u64>,
    /// The job's priority.
    pub priority: u32,
    /// The job's flags.
    pub flags: TaskFlags,
    /// The job's gang size (1: no gang).
    pub gang_size: u32,
    /// The job's running limit (`sla.max_running_instances`; 0: none).
    pub max_running: u32,
    /// How long a run is expected to last (None: unknown, runs forever).
    pub runtime_ms: Option<u64>,
    /// Its request in the engine's units.
    pub request: Resources,
}

/// What a replay starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// When it was taken, ms since the epoch.
    pub taken_at_ms: u64,
    /// Every host.
    pub hosts: Vec<HostRow>,
    /// Every pool, parents first.
    pub pools: Vec<PoolRow>,
    /// Every task.
    pub tasks: Vec<TaskRow>,
}

/// Task states of a run that waits for admission or a host (a task in
/// back-off is queued again when it ends).
const WAITING_STATES: [&str; 5] = ["initialized", "pending", "ready", "placing", "backoff"];
/// Task states of a run that holds its host.
const RUNNING_STATES: [&str; 3] = ["placed", "launching", "running"];

// ------------------------------------------------------------------ reading

fn read_batches(path: &Path) -> Result<Vec<RecordBatch>> {
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "open {} (take the snapshot with `peloton cluster snapshot DIR`)",
            path.display()
        )
    })?;
    let reader = arrow_ipc::reader::FileReader::try_new(file, None)
        .with_context(|| format!("{}: not an Arrow IPC file", path.display()))?;
    reader
        .map(|b| b.with_context(|| format!("read {}", path.display())))
        .collect()
}

/// Typed access to one batch's columns, with errors naming the file and
/// the column.
struct Columns<'a> {
    file: &'a str,
    batch: &'a RecordBatch,
}

impl<'a> Columns<'a> {
    fn get<T: Array + 'static>(&self, name: &str, kind: &str) -> Result<&'a T> {
        self.batch
            .column_by_name(name)
            .ok_or_else(|| {
                anyhow!(
                    "{}: no column {name} (a snapshot from an older peloton? take it again)",
                    self.file
                )
            })?
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| anyhow!("{}: column {name} is not {kind}", self.file))
    }

    fn strings(&self, name: &str) -> Result<&'a StringArray> {
        self.get(name, "strings")
    }

    fn f64s(&self, name: &str) -> Result<&'a Float64Array> {
        self.get(name, "float64")
    }

    fn u64s(&self, name: &str) -> Result<&'a UInt64Array> {
        self.get(name, "uint64")
    }

    fn u32s(&self, name: &str) -> Result<&'a UInt32Array> {
        self.get(name, "uint32")
    }

    fn bools(&self, name: &str) -> Result<&'a BooleanArray> {
        self.get(name, "booleans")
    }

    /// The four resource columns `{prefix}cpu` … `{prefix}gpu`, row `i`,
    /// in the API's units.
    fn api_resources(&self, prefix: &str, i: usize) -> Result<pb::Resources> {
        let v = |d: &str| -> Result<f64> { Ok(self.f64s(&format!("{prefix}{d}"))?.value(i)) };
        Ok(pb::Resources {
            cpu: v("cpu")?,
            memory_mb: v("memory_mb")?,
            disk_mb: v("disk_mb")?,
            gpu: v("gpu")?,
        })
    }

    /// The same in the engine's units, checked as the server checks a
    /// request.
    fn resources(&self, prefix: &str, i: usize) -> Result<Resources> {
        let r = self.api_resources(prefix, i)?;
        peloton_gateway::convert::resources(prefix.trim_end_matches('_'), Some(&r))
            .map_err(|s| anyhow!("{} row {i}: {}", self.file, s.message()))
    }
}

fn opt_u64(a: &UInt64Array, i: usize) -> Option<u64> {
    a.is_valid(i).then(|| a.value(i))
}

fn opt_str(a: &StringArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| a.value(i).to_owned())
}

impl Snapshot {
    /// Reads DIR/hosts.arrow, DIR/pools.arrow and DIR/tasks.arrow.
    pub fn read(dir: &Path) -> Result<Snapshot> {
        if !dir.is_dir() {
            bail!("--snapshot {}: not a directory", dir.display());
        }
        let mut taken_at_ms = 0;
        let mut read = |name: &str| -> Result<Vec<RecordBatch>> {
            let batches = read_batches(&dir.join(name))?;
            if let Some(b) = batches.first()
                && let Some(t) = b.schema().metadata().get(TAKEN_AT_KEY)
            {
                let t: u64 = t
                    .parse()
                    .with_context(|| format!("{name}: {TAKEN_AT_KEY} {t:?} is not a number"))?;
                taken_at_ms = taken_at_ms.max(t);
            }
            Ok(batches)
        };
        let mut snap = Snapshot {
            taken_at_ms: 0,
            hosts: Vec::new(),
            pools: Vec::new(),
            tasks: Vec::new(),
        };
        for batch in read("hosts.arrow")? {
            let c = Columns {
                file: "hosts.arrow",
                batch: &batch,
            };
            let (name, state) = (c.strings("name")?, c.strings("state")?);
            for i in 0..batch.num_rows() {
                snap.hosts.push(HostRow {
                    name: name.value(i).to_owned(),
                    state: state.value(i).to_owned(),
                    capacity: c.resources("capacity_", i)?,
                });
            }
        }
        for batch in read("pools.arrow")? {
            let c = Columns {
                file: "pools.arrow",
                batch: &batch,
            };
            let (path, kind) = (c.strings("path")?, c.strings("kind")?);
            let (share, controller, slack) = (
                c.f64s("share")?,
                c.f64s("controller_limit_pct")?,
                c.f64s("slack_limit_pct")?,
            );
            // Snapshots before pools had it: reservations as configured.
            let strict = c.bools("strict_order").ok();
            for i in 0..batch.num_rows() {
                let kind = match kind.value(i) {
                    "elastic" => pb::PoolKind::Elastic,
                    "static" => pb::PoolKind::Static,
                    other => bail!("pools.arrow row {i}: unknown pool kind {other:?}"),
                };
                let shares = c.api_resources("shares_", i)?;
                snap.pools.push(PoolRow {
                    path: path.value(i).to_owned(),
                    spec: pb::PoolSpec {
                        reservation: Some(c.api_resources("reservation_", i)?),
                        limit: Some(c.api_resources("limit_", i)?),
                        share: share.value(i),
                        kind: kind as i32,
                        controller_limit_pct: controller.value(i),
                        slack_limit_pct: slack.value(i),
                        shares: Some(shares),
                        strict_order: strict.is_some_and(|s| s.value(i)),
                    },
                });
            }
        }
        for batch in read("tasks.arrow")? {
            let c = Columns {
                file: "tasks.arrow",
                batch: &batch,
            };
            let (job_id, pool, instance, state, host) = (
                c.strings("job_id")?,
                c.strings("pool")?,
                c.u32s("instance")?,
                c.strings("state")?,
                c.strings("host")?,
            );
            let (placed_at, started_at, created_at, job_created_at) = (
                c.u64s("placed_at_ms")?,
                c.u64s("started_at_ms")?,
                c.u64s("created_at_ms")?,
                c.u64s("job_created_at_ms")?,
            );
            let (priority, gang, runtime) = (
                c.u32s("priority")?,
                c.u32s("gang_size")?,
                c.u64s("expected_runtime_ms")?,
            );
            // Snapshots before the column: no limits.
            let max_running = c.u32s("max_running_instances").ok();
            let (preemptible, revocable, controller) = (
                c.bools("preemptible")?,
                c.bools("revocable")?,
                c.bools("controller")?,
            );
            for i in 0..batch.num_rows() {
                snap.tasks.push(TaskRow {
                    job_id: job_id.value(i).to_owned(),
                    pool: pool.value(i).to_owned(),
                    instance: instance.value(i),
                    state: state.value(i).to_owned(),
                    host: opt_str(host, i),
                    started_at_ms: opt_u64(started_at, i).or(opt_u64(placed_at, i)),
                    created_at_ms: opt_u64(created_at, i),
                    job_created_at_ms: opt_u64(job_created_at, i),
                    priority: priority.value(i),
                    flags: TaskFlags {
                        preemptible: preemptible.value(i),
                        controller: controller.value(i),
                        revocable: revocable.value(i),
                    },
                    gang_size: gang.value(i).max(1),
                    max_running: max_running.map_or(0, |m| m.value(i)),
                    runtime_ms: opt_u64(runtime, i).filter(|&ms| ms > 0),
                    request: c.resources("request_", i)?,
                });
            }
        }
        // Without the stamp (a snapshot written by hand): the latest time
        // it records.
        snap.taken_at_ms = if taken_at_ms > 0 {
            taken_at_ms
        } else {
            snap.tasks
                .iter()
                .flat_map(|t| [t.started_at_ms, t.created_at_ms, t.job_created_at_ms])
                .flatten()
                .max()
                .unwrap_or(0)
        };
        Ok(snap)
    }
}

// ------------------------------------------------------------------ changes

/// A pool setting `--pool` changes.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolSetting {
    /// `reservation.DIM=X` (API units: cores, MiB, GPUs).
    Reservation(Dim, f64),
    /// `limit.DIM=X` (0: no limit).
    Limit(Dim, f64),
    /// `share=X` (every dimension).
    Share(f64),
    /// `kind=elastic|static`.
    Kind(pb::PoolKind),
}

/// Backfill as `--backfill` sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backfill {
    /// Off: a queue waits behind its head.
    Off,
    /// On, with at most this many reservations a cycle.
    On(usize),
}

/// One change to the cluster or its policies.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Add `n` hosts shaped like `like` (a host's name) or like the most
    /// common shape of the up hosts.
    AddHosts {
        /// How many.
        n: u32,
        /// The host to copy.
        like: Option<String>,
    },
    /// Take away the `n` least loaded up hosts; their tasks queue again.
    RemoveHosts(u32),
    /// Change settings of a pool.
    Pool {
        /// Its path.
        path: String,
        /// What to set.
        settings: Vec<PoolSetting>,
    },
    /// Backfill on, off or bounded.
    Backfill(Backfill),
}

/// A dimension's name in the API (and the snapshot's columns).
fn api_name(d: Dim) -> &'static str {
    match d {
        Dim::Cpu => "cpu",
        Dim::Memory => "memory_mb",
        Dim::Disk => "disk_mb",
        Dim::Gpu => "gpu",
    }
}

fn dim_of(name: &str) -> Option<Dim> {
    match name {
        "cpu" => Some(Dim::Cpu),
        "memory_mb" => Some(Dim::Memory),
        "disk_mb" => Some(Dim::Disk),
        "gpu" => Some(Dim::Gpu),
        _ => None,
    }
}

/// Parses `--add-hosts N[:LIKE]`.
pub fn parse_add_hosts(text: &str) -> Result<Change> {
    let flag = format!("--add-hosts {text}");
    let (n, like) = match text.split_once(':') {
        Some((n, like)) if !like.is_empty() => (n, Some(like.to_owned())),
        Some(_) => bail!("{flag}: the host to copy is empty (N or N:HOST)"),
        None => (text, None),
    };
    let n: u32 = n
        .parse()
        .map_err(|_| anyhow!("{flag}: {n:?} is not a host count (N or N:HOST)"))?;
    if n == 0 || n > MAX_ADDED_HOSTS {
        bail!("{flag}: the count must be 1 to {MAX_ADDED_HOSTS}");
    }
    Ok(Change::AddHosts { n, like })
}

/// Parses `--remove-hosts N`.
pub fn parse_remove_hosts(text: &str) -> Result<Change> {
    let n: u32 = text
        .parse()
        .map_err(|_| anyhow!("--remove-hosts {text}: not a host count"))?;
    if n == 0 {
        bail!("--remove-hosts {text}: the count must be at least 1");
    }
    Ok(Change::RemoveHosts(n))
}

/// Parses `--pool PATH:KEY=VALUE[,KEY=VALUE…]`.
pub fn parse_pool(text: &str) -> Result<Change> {
    let flag = format!("--pool {text}");
    let Some((path, settings)) = text.split_once(':') else {
        bail!("{flag}: expected PATH:KEY=VALUE[,KEY=VALUE…]");
    };
    if !path.starts_with('/') {
        bail!("{flag}: the pool path {path:?} does not start with /");
    }
    let mut out = Vec::new();
    for setting in settings.split(',') {
        let Some((key, value)) = setting.split_once('=') else {
            bail!("{flag}: {setting:?} is not KEY=VALUE");
        };
        let number = || -> Result<f64> {
            let v: f64 = value
                .parse()
                .map_err(|_| anyhow!("{flag}: {key}: {value:?} is not a number"))?;
            if !v.is_finite() || v < 0.0 {
                bail!("{flag}: {key}: must be a finite number ≥ 0 (got {value})");
            }
            Ok(v)
        };
        let dim = |rest: &str| {
            dim_of(rest).ok_or_else(|| {
                anyhow!("{flag}: {key}: unknown dimension {rest:?} (cpu, memory_mb, disk_mb, gpu)")
            })
        };
        out.push(match key.split_once('.') {
            Some(("reservation", d)) => PoolSetting::Reservation(dim(d)?, number()?),
            Some(("limit", d)) => PoolSetting::Limit(dim(d)?, number()?),
            None if key == "share" => PoolSetting::Share(number()?),
            None if key == "kind" => PoolSetting::Kind(match value {
                "elastic" => pb::PoolKind::Elastic,
                "static" => pb::PoolKind::Static,
                _ => bail!("{flag}: kind: {value:?} is neither elastic nor static"),
            }),
            _ => bail!(
                "{flag}: unknown setting {key:?} (reservation.DIM, limit.DIM, share, kind; \
                 DIM is cpu, memory_mb, disk_mb or gpu)"
            ),
        });
    }
    Ok(Change::Pool {
        path: path.to_owned(),
        settings: out,
    })
}

/// Parses `--backfill on|off|N` (N: at most N reservations a cycle).
pub fn parse_backfill(text: &str) -> Result<Change> {
    Ok(Change::Backfill(match text {
        "on" => Backfill::On(BackfillConfig::default().max_reservations),
        "off" => Backfill::Off,
        n => {
            let n: usize = n.parse().map_err(|_| {
                anyhow!("--backfill {text}: expected on, off or a reservation count")
            })?;
            if n == 0 || n > MAX_RESERVATIONS {
                bail!("--backfill {text}: the reservation count must be 1 to {MAX_RESERVATIONS}");
            }
            Backfill::On(n)
        }
    }))
}

/// Parses a horizon: a number with d, h, m, s or ms.
pub fn parse_duration_ms(text: &str) -> Result<u64> {
    let (digits, unit_ms) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix('d') {
        (n, 24 * 3_600_000)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3_600_000)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000)
    } else {
        bail!("--horizon {text}: give a unit (e.g. 7d, 12h, 30m, 600s)");
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| anyhow!("--horizon {text}: {digits:?} is not a whole number"))?;
    let ms = n.saturating_mul(unit_ms);
    if ms == 0 || ms > MAX_HORIZON_MS {
        bail!("--horizon {text}: must be more than 0 and at most 365d");
    }
    Ok(ms)
}

/// A change as its flag reads.
pub fn describe(change: &Change) -> String {
    match change {
        Change::AddHosts { n, like: None } => format!("--add-hosts {n}"),
        Change::AddHosts { n, like: Some(h) } => format!("--add-hosts {n}:{h}"),
        Change::RemoveHosts(n) => format!("--remove-hosts {n}"),
        Change::Pool { path, settings } => {
            let s: Vec<String> = settings
                .iter()
                .map(|s| match s {
                    PoolSetting::Reservation(d, v) => format!("reservation.{}={v}", api_name(*d)),
                    PoolSetting::Limit(d, v) => format!("limit.{}={v}", api_name(*d)),
                    PoolSetting::Share(v) => format!("share={v}"),
                    PoolSetting::Kind(k) => format!(
                        "kind={}",
                        if *k == pb::PoolKind::Static {
                            "static"
                        } else {
                            "elastic"
                        }
                    ),
                })
                .collect();
            format!("--pool {path}:{}", s.join(","))
        }
        Change::Backfill(Backfill::Off) => "--backfill off".into(),
        Change::Backfill(Backfill::On(n)) => format!("--backfill {n}"),
    }
}

// ------------------------------------------------------------------ setup

/// Bounds of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Simulated time after the snapshot's, ms.
    pub horizon_ms: u64,
    /// Moments (ends) replayed at most.
    pub max_steps: u64,
}

/// One waiting task of the replay.
struct Waiter {
    pool: usize,
    runtime_ms: Option<u64>,
    request: Resources,
    start_ms: Option<u64>,
}

/// A replay's setup: the snapshot with a set of changes applied.
struct Setup {
    hosts: Vec<(String, Resources)>,
    pools: Vec<(String, PoolConfig)>,
    backfill: BackfillConfig,
}

fn spec_dim(r: &mut pb::Resources, d: Dim) -> &mut f64 {
    match d {
        Dim::Cpu => &mut r.cpu,
        Dim::Memory => &mut r.memory_mb,
        Dim::Disk => &mut r.disk_mb,
        Dim::Gpu => &mut r.gpu,
    }
}

/// The snapshot's hosts, pools and backfill with `changes` applied; every
/// error names the change.
fn setup(snap: &Snapshot, changes: &[Change]) -> Result<Setup> {
    let up: Vec<&HostRow> = snap.hosts.iter().filter(|h| h.state == "up").collect();
    // Cpu held on each host by its running tasks: which to remove first.
    let mut load: HashMap<&str, u64> = HashMap::new();
    for t in &snap.tasks {
        if let Some(h) = &t.host
            && RUNNING_STATES.contains(&t.state.as_str())
        {
            *load.entry(h.as_str()).or_default() += t.request[Dim::Cpu];
        }
    }
    let mut hosts: Vec<(String, Resources)> =
        up.iter().map(|h| (h.name.clone(), h.capacity)).collect();
    let mut specs: Vec<(String, pb::PoolSpec)> = snap
        .pools
        .iter()
        .filter(|p| p.path != "/")
        .map(|p| (p.path.clone(), p.spec))
        .collect();
    let mut backfill = BackfillConfig::default();
    let mut added = 0u32;
    for change in changes {
        let flag = describe(change);
        match change {
            Change::AddHosts { n, like } => {
                let shape = match like {
                    Some(name) => {
                        snap.hosts
                            .iter()
                            .find(|h| &h.name == name)
                            .ok_or_else(|| anyhow!("{flag}: no host {name} in the snapshot"))?
                            .capacity
                    }
                    None => most_common_shape(&up)
                        .ok_or_else(|| anyhow!("{flag}: no up host to copy; name one (N:HOST)"))?,
                };
                for _ in 0..*n {
                    added += 1;
                    hosts.push((format!("whatif-added-{added:06}"), shape));
                }
            }
            Change::RemoveHosts(n) => {
                let n = *n as usize;
                // Only the snapshot's hosts are removed, not ones another
                // change added.
                let added = |name: &str| name.starts_with("whatif-added-");
                let theirs = hosts.iter().filter(|h| !added(&h.0)).count();
                if n > theirs {
                    bail!("{flag}: there are only {theirs} up hosts");
                }
                // The least loaded first (then by name, last first); added
                // hosts are kept.
                hosts.sort_by(|a, b| {
                    let (la, lb) = (
                        load.get(a.0.as_str()).copied().unwrap_or(0),
                        load.get(b.0.as_str()).copied().unwrap_or(0),
                    );
                    added(&b.0)
                        .cmp(&added(&a.0))
                        .then(lb.cmp(&la))
                        .then_with(|| a.0.cmp(&b.0))
                });
                hosts.truncate(hosts.len() - n);
            }
            Change::Pool { path, settings } => {
                let spec = specs
                    .iter_mut()
                    .find(|(p, _)| p == path)
                    .map(|(_, s)| s)
                    .ok_or_else(|| anyhow!("{flag}: no pool {path} in the snapshot"))?;
                for s in settings {
                    match *s {
                        PoolSetting::Reservation(d, v) => {
                            *spec_dim(spec.reservation.get_or_insert_default(), d) = v;
                        }
                        PoolSetting::Limit(d, v) => {
                            *spec_dim(spec.limit.get_or_insert_default(), d) = v;
                        }
                        PoolSetting::Share(v) => {
                            spec.share = v;
                            spec.shares = None;
                        }
                        PoolSetting::Kind(k) => spec.kind = k as i32,
                    }
                }
            }
            Change::Backfill(b) => match *b {
                Backfill::Off => backfill.enabled = false,
                Backfill::On(n) => {
                    backfill.enabled = true;
                    backfill.max_reservations = n;
                }
            },
        }
    }
    let mut pools = Vec::with_capacity(specs.len());
    for (path, spec) in specs {
        let config = peloton_gateway::convert::pool_config(Some(&spec))
            .map_err(|s| anyhow!("pool {path}: {}", s.message()))?;
        pools.push((path, config));
    }
    Ok(Setup {
        hosts,
        pools,
        backfill,
    })
}

/// The most common capacity of `hosts` (ties: the first host's).
fn most_common_shape(hosts: &[&HostRow]) -> Option<Resources> {
    let mut counts: Vec<(Resources, usize)> = Vec::new();
    for h in hosts {
        match counts.iter_mut().find(|(r, _)| *r == h.capacity) {
            Some((_, n)) => *n += 1,
            None => counts.push((h.capacity, 1)),
        }
    }
    let best = counts.iter().map(|(_, n)| *n).max()?;
    counts.into_iter().find(|(_, n)| *n == best).map(|(r, _)| r)
}

// ------------------------------------------------------------------ replay

fn new_task(job: u32, t: &TaskRow, pool: PoolId, runtime_ms: u64) -> NewTask {
    NewTask {
        job,
        instance: t.instance,
        pool,
        priority: t.priority,
        request: t.request,
        ports: 0,
        flags: t.flags,
        constraint: String::new(),
        strategy: Strategy::Pack,
        max_per_host: 0,
        limit_key: job,
        desired_host: None,
        daemon: false,
        runtime_ms: runtime_ms.min(peloton_engine::engine::MAX_RUNTIME_MS),
    }
}

/// The value at fraction `q` of sorted `v` (0 if empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    crate::forecast::quantile(v, q)
}

/// Wait figures of a set of waiting tasks, in seconds.
fn wait_figures(waits_ms: &mut [u64], started: usize) -> Value {
    waits_ms.sort_unstable();
    let s: Vec<f64> = waits_ms.iter().map(|&w| w as f64 / 1000.0).collect();
    json!({
        "waiting": s.len(),
        "started": started,
        "wait_median_s": quantile(&s, 0.5),
        "wait_p90_s": quantile(&s, 0.9),
        "wait_max_s": s.last().copied().unwrap_or(0.0),
    })
}

/// Tasks left out of a replay: how many, and the first reason.
#[derive(Default)]
struct LeftOut {
    n: usize,
    why: Option<String>,
}

impl LeftOut {
    fn add(&mut self, n: usize, why: impl FnOnce() -> String) {
        self.n += n;
        self.why.get_or_insert_with(why);
    }
}

/// Sums over the replay's intervals, weighted by their length.
struct Sums {
    /// Allocated amount × ms, per dimension.
    busy: [u128; 4],
    /// Jain's index × ms, and the ms it was defined.
    fairness: (f64, u64),
    /// Per pool: allocation over entitlement × ms, and the ms it waited.
    met: Vec<(f64, u64)>,
}

/// An engine built from a snapshot, and what the replay keeps beside it.
struct Replay<'a> {
    engine: Engine,
    t0: u64,
    capacity: Resources,
    pool_ids: Vec<PoolId>,
    pool_index: HashMap<&'a str, usize>,
    job_numbers: HashMap<&'a str, u32>,
    /// (end, task handle), earliest first.
    ends: BinaryHeap<Reverse<(u64, u64)>>,
    /// What placed tasks hold, in all and each.
    allocated: Resources,
    requests: HashMap<TaskHandle, Resources>,
    waiters: Vec<Waiter>,
    waiter_of: HashMap<TaskHandle, usize>,
    waiting_in_pool: Vec<usize>,
    n_not_started: usize,
    n_to_end: usize,
    last_event: u64,
    requeued: usize,
    left_out: LeftOut,
    /// Jobs with a running limit, and which of their tasks are in the
    /// engine.
    limited: HashMap<&'a str, Limited<'a>>,
    job_of: HashMap<TaskHandle, &'a str>,
}

/// A job with a running limit (`sla.max_running_instances`): as the
/// server's core does, its instances are queued while fewer than the
/// limit are queued or running, the next ones as those end.
struct Limited<'a> {
    limit: u32,
    /// Its tasks in the engine (adopted, or submitted and not ended).
    active: u32,
    /// Groups held back, in order, with their waiters.
    held: VecDeque<(Vec<&'a TaskRow>, Vec<usize>)>,
}

impl<'a> Replay<'a> {
    /// The engine with the setup's hosts and pools, nothing else yet.
    fn new(snap: &Snapshot, setup: &'a Setup) -> Result<Self> {
        let mut engine = Engine::new(EngineConfig {
            resources: ResourceManagerConfig {
                threads: 1,
                ..Default::default()
            },
            backfill: setup.backfill,
            ..Default::default()
        });
        let mut capacity = Resources::ZERO;
        for (name, cap) in &setup.hosts {
            engine
                .hosts_mut()
                .add(&HostSpec {
                    name: name.clone(),
                    capacity: *cap,
                    gpu_devices: (cap[Dim::Gpu] / 1000).min(u64::from(u8::MAX)) as u8,
                    ..Default::default()
                })
                .with_context(|| format!("host {name}"))?;
            capacity = capacity.saturating_add(cap);
        }
        let mut pool_ids = Vec::new();
        let mut pool_index = HashMap::new();
        for (path, config) in &setup.pools {
            let id = engine
                .resources_mut()
                .create_pool(path, *config)
                .map_err(|e| anyhow!("pool {path}: {e}"))?;
            pool_index.insert(path.as_str(), pool_ids.len());
            pool_ids.push(id);
        }
        let n_pools = pool_ids.len();
        Ok(Replay {
            engine,
            t0: snap.taken_at_ms,
            capacity,
            pool_ids,
            pool_index,
            job_numbers: HashMap::new(),
            ends: BinaryHeap::new(),
            allocated: Resources::ZERO,
            requests: HashMap::new(),
            waiters: Vec::new(),
            waiter_of: HashMap::new(),
            waiting_in_pool: vec![0; n_pools],
            n_not_started: 0,
            n_to_end: 0,
            last_event: snap.taken_at_ms,
            requeued: 0,
            left_out: LeftOut::default(),
            limited: HashMap::new(),
            job_of: HashMap::new(),
        })
    }

    /// The engine's number of a job (dense, in order of first sight).
    fn job(&mut self, id: &'a str) -> u32 {
        let n = self.job_numbers.len() as u32;
        *self.job_numbers.entry(id).or_insert(n)
    }

    fn pool_of(&mut self, t: &TaskRow) -> Option<usize> {
        let p = self.pool_index.get(t.pool.as_str()).copied();
        if p.is_none() {
            self.left_out
                .add(1, || format!("no pool {} in pools.arrow", t.pool));
        }
        p
    }

    /// A task now holds `request`; it ends at `end` if known.
    fn holds(&mut self, h: TaskHandle, request: Resources, end: Option<u64>) {
        self.allocated = self.allocated.saturating_add(&request);
        self.requests.insert(h, request);
        if let Some(e) = end {
            self.ends.push(Reverse((e, h.to_u64())));
        }
    }

    /// Adopts the snapshot's running tasks on their hosts, ending at their
    /// estimates (at once if past them); returns those whose host is not
    /// in the replay (or seems full: the snapshot is not atomic).
    fn adopt_running(&mut self, snap: &'a Snapshot) -> Vec<&'a TaskRow> {
        let t0 = self.t0;
        let mut requeue = Vec::new();
        for t in snap
            .tasks
            .iter()
            .filter(|t| RUNNING_STATES.contains(&t.state.as_str()))
        {
            let Some(p) = self.pool_of(t) else {
                continue;
            };
            let Some(host) = t
                .host
                .as_deref()
                .and_then(|h| self.engine.hosts().lookup(h))
            else {
                requeue.push(t);
                continue;
            };
            let end = t
                .runtime_ms
                .map(|r| t.started_at_ms.unwrap_or(t0).saturating_add(r).max(t0));
            let job = self.job(&t.job_id);
            let task = new_task(job, t, self.pool_ids[p], end.map_or(0, |e| e - t0));
            match self.engine.adopt(&task, host, t0) {
                Ok(h) => {
                    self.holds(h, t.request, end);
                    self.count_active(t, h);
                }
                Err(_) => requeue.push(t),
            }
        }
        self.requeued = requeue.len();
        requeue
    }

    /// Submits `rows` in order, a job's gangs (instances `0..g`, `g..2g`,
    /// …; their waiting members) together, as the server queues them.
    fn submit(&mut self, rows: Vec<&'a TaskRow>) {
        let mut groups: Vec<Vec<&TaskRow>> = Vec::new();
        let mut group_of: HashMap<(&str, u32), usize> = HashMap::new();
        for t in rows {
            if t.gang_size > 1 {
                let key = (t.job_id.as_str(), t.instance / t.gang_size);
                if let Some(&g) = group_of.get(&key) {
                    groups[g].push(t);
                    continue;
                }
                group_of.insert(key, groups.len());
            }
            groups.push(vec![t]);
        }
        for group in groups {
            let Some(p) = self.pool_of(group[0]) else {
                self.left_out.n += group.len() - 1;
                continue;
            };
            let n = group.len() as u32;
            let hold = group[0].max_running > 0 && {
                let l = self.limit_of(group[0]);
                !l.held.is_empty() || l.active + n > l.limit
            };
            if hold {
                let waiters = group.iter().map(|t| self.new_waiter(p, t)).collect();
                self.limit_of(group[0]).held.push_back((group, waiters));
                continue;
            }
            self.submit_group(p, group, None);
        }
    }

    /// The running limit of `t`'s job (which has one).
    fn limit_of(&mut self, t: &'a TaskRow) -> &mut Limited<'a> {
        self.limited
            .entry(t.job_id.as_str())
            .or_insert_with(|| Limited {
                limit: t.max_running,
                active: 0,
                held: VecDeque::new(),
            })
    }

    /// `h`, a task of `t`'s job, is in the engine now.
    fn count_active(&mut self, t: &'a TaskRow, h: TaskHandle) {
        if t.max_running > 0 {
            self.limit_of(t).active += 1;
            self.job_of.insert(h, t.job_id.as_str());
        }
    }

    /// A waiting task's figures, not started.
    fn new_waiter(&mut self, p: usize, t: &TaskRow) -> usize {
        self.waiters.push(Waiter {
            pool: p,
            runtime_ms: t.runtime_ms,
            request: t.request,
            start_ms: None,
        });
        self.waiting_in_pool[p] += 1;
        self.n_not_started += 1;
        self.n_to_end += usize::from(t.runtime_ms.is_some());
        self.waiters.len() - 1
    }

    /// Submits one group (a gang, or one task) of pool `p`; `waiters`:
    /// theirs, if they were made when it was held back.
    fn submit_group(&mut self, p: usize, group: Vec<&'a TaskRow>, waiters: Option<Vec<usize>>) {
        let tasks: Vec<NewTask> = group
            .iter()
            .map(|t| {
                let job = self.job(&t.job_id);
                new_task(job, t, self.pool_ids[p], t.runtime_ms.unwrap_or(0))
            })
            .collect();
        // The engine refuses what the server would not queue (e.g. a
        // job whose resources are only in per-instance overrides,
        // which the snapshot does not carry).
        let handles = match self.engine.submit(&tasks) {
            Ok(h) => h,
            Err(e) => {
                let (job, instance) = (&group[0].job_id, group[0].instance);
                self.left_out.add(group.len(), || {
                    format!("job {job} instance {instance}: {e}")
                });
                // Held back, they were counted as waiting: no longer.
                for (&w, t) in waiters.iter().flatten().zip(&group) {
                    self.waiting_in_pool[self.waiters[w].pool] -= 1;
                    self.n_not_started -= 1;
                    self.n_to_end -= usize::from(t.runtime_ms.is_some());
                }
                return;
            }
        };
        for (i, (h, t)) in handles.into_iter().zip(group).enumerate() {
            let w = match &waiters {
                Some(w) => w[i],
                None => self.new_waiter(p, t),
            };
            self.waiter_of.insert(h, w);
            self.count_active(t, h);
        }
    }

    /// A task of a job with a running limit ended: the groups it held back
    /// that now fit the limit are submitted, in order.
    fn release(&mut self, job: &'a str) {
        let Some(l) = self.limited.get_mut(job) else {
            return;
        };
        l.active -= 1;
        loop {
            let l = self.limited.get_mut(job).expect("a limited job");
            if l.held
                .front()
                .is_none_or(|(g, _)| l.active + g.len() as u32 > l.limit)
            {
                break;
            }
            let (group, waiters) = l.held.pop_front().expect("a front");
            let p = self.waiters[waiters[0]].pool;
            self.submit_group(p, group, Some(waiters));
        }
    }

    /// Cycles at `t` until nothing more is admitted or placed.
    fn cycles_at(&mut self, t: u64) {
        for _ in 0..MAX_CYCLES_AT_ONCE {
            let report = self.engine.cycle_with(t, false);
            let changed = !report.placed().is_empty() || report.admitted() > 0;
            let placed: Vec<TaskHandle> = report.placed().iter().map(|p| p.task).collect();
            for h in placed {
                let Some(&w) = self.waiter_of.get(&h) else {
                    continue;
                };
                let waiter = &mut self.waiters[w];
                waiter.start_ms = Some(t);
                let (pool, request, runtime) = (waiter.pool, waiter.request, waiter.runtime_ms);
                self.n_not_started -= 1;
                self.waiting_in_pool[pool] -= 1;
                self.last_event = self.last_event.max(t);
                self.holds(h, request, runtime.map(|r| t.saturating_add(r)));
            }
            if !changed {
                break;
            }
        }
    }

    /// Ends every task due by `t`.
    fn ends_at(&mut self, t: u64) -> Result<()> {
        while let Some(&Reverse((end, h))) = self.ends.peek() {
            if end > t {
                break;
            }
            self.ends.pop();
            let h = TaskHandle::from_u64(h);
            self.engine.finish(h)?;
            if let Some(job) = self.job_of.remove(&h) {
                self.release(job);
            }
            if let Some(r) = self.requests.remove(&h) {
                self.allocated = self.allocated.saturating_sub(&r);
            }
            if self.waiter_of.contains_key(&h) {
                self.n_to_end -= 1;
                self.last_event = self.last_event.max(t);
            }
        }
        Ok(())
    }

    /// Adds the `dt` ms from now, as the last cycle left things, to `sums`.
    fn add_interval(&self, dt: u64, sums: &mut Sums) {
        for d in Dim::ALL {
            sums.busy[d.idx()] += u128::from(self.allocated[d]) * u128::from(dt);
        }
        if dt == 0 {
            return;
        }
        let rm = self.engine.resources();
        let mut ratios = Vec::new();
        for (p, &id) in self.pool_ids.iter().enumerate() {
            let entitlement = rm.entitlements().entitlement(id.idx())[Dim::Cpu];
            if self.waiting_in_pool[p] == 0 || entitlement == 0 {
                continue;
            }
            let allocation = rm.usage(id).map_or(0, |u| u.allocation.total[Dim::Cpu]);
            let r = allocation as f64 / entitlement as f64;
            sums.met[p].0 += r * dt as f64;
            sums.met[p].1 += dt;
            ratios.push(r);
        }
        if let Some(j) = jain(&ratios) {
            sums.fairness.0 += j * dt as f64;
            sums.fairness.1 += dt;
        }
    }

    /// Runs from the snapshot's time to the end or a bound; returns where
    /// it stopped, when, and the sums.
    fn run(&mut self, bounds: Bounds) -> Result<(&'static str, u64, Sums)> {
        let mut sums = Sums {
            busy: [0; 4],
            fairness: (0.0, 0),
            met: vec![(0.0, 0); self.pool_ids.len()],
        };
        let horizon = self.t0.saturating_add(bounds.horizon_ms);
        let mut t = self.t0;
        let mut steps = 0u64;
        let stopped = loop {
            self.cycles_at(t);
            if self.n_not_started == 0 && self.n_to_end == 0 {
                break "all started and ended";
            }
            let Some(&Reverse((next, _))) = self.ends.peek() else {
                break "nothing more ends";
            };
            self.add_interval(next.min(horizon).saturating_sub(t), &mut sums);
            if next > horizon {
                t = horizon;
                break "horizon";
            }
            steps += 1;
            if steps > bounds.max_steps {
                break "steps";
            }
            t = next;
            self.ends_at(t)?;
        };
        Ok((stopped, t, sums))
    }
}

/// The waiting tasks in the order they were queued (their run's creation,
/// then their job's, then by job and instance).
fn waiting_in_order(snap: &Snapshot) -> Vec<&TaskRow> {
    let mut rows: Vec<&TaskRow> = snap
        .tasks
        .iter()
        .filter(|t| WAITING_STATES.contains(&t.state.as_str()))
        .collect();
    let key = |t: &TaskRow| {
        (
            t.created_at_ms.or(t.job_created_at_ms).unwrap_or(0),
            t.job_created_at_ms.unwrap_or(0),
        )
    };
    rows.sort_by(|a, b| {
        key(a)
            .cmp(&key(b))
            .then_with(|| a.job_id.cmp(&b.job_id))
            .then_with(|| a.instance.cmp(&b.instance))
    });
    rows
}

/// Replays the snapshot with `changes`; returns the figures as JSON (see
/// the module's text).
pub fn replay(snap: &Snapshot, changes: &[Change], bounds: Bounds) -> Result<Value> {
    let setup = setup(snap, changes)?;
    let mut r = Replay::new(snap, &setup)?;
    // Tasks whose host is gone queue again first, then the waiting.
    let mut rows = r.adopt_running(snap);
    rows.extend(waiting_in_order(snap));
    r.submit(rows);
    let (stopped, t, sums) = r.run(bounds)?;

    let t0 = r.t0;
    let span_ms = t.saturating_sub(t0);
    let wait_of = |w: &Waiter| w.start_ms.map_or(span_ms, |s| s - t0);
    let figures = |pool: Option<usize>| {
        let of_pool = |w: &&Waiter| pool.is_none_or(|p| w.pool == p);
        let mut waits: Vec<u64> = r.waiters.iter().filter(of_pool).map(wait_of).collect();
        let started = r
            .waiters
            .iter()
            .filter(of_pool)
            .filter(|w| w.start_ms.is_some())
            .count();
        wait_figures(&mut waits, started)
    };
    let mut total = figures(None);
    let utilization: serde_json::Map<String, Value> = Dim::ALL
        .iter()
        .filter(|d| r.capacity[**d] > 0)
        .map(|d| {
            let u = (span_ms > 0)
                .then(|| sums.busy[d.idx()] as f64 / (r.capacity[*d] as f64 * span_ms as f64));
            (api_name(*d).to_string(), json!(u))
        })
        .collect();
    total["utilization"] = Value::Object(utilization);
    let done = r.n_not_started == 0 && r.n_to_end == 0;
    total["makespan_s"] = json!(done.then(|| r.last_event.saturating_sub(t0) as f64 / 1000.0));
    let (f_sum, f_ms) = sums.fairness;
    total["fairness_jain"] = json!((f_ms > 0).then(|| f_sum / f_ms as f64));
    let mut pools = Vec::new();
    for (p, (path, _)) in setup.pools.iter().enumerate() {
        if r.waiters.iter().all(|w| w.pool != p) {
            continue;
        }
        let mut row = figures(Some(p));
        let (m_sum, m_ms) = sums.met[p];
        row["pool"] = json!(path);
        row["entitlement_met"] = json!((m_ms > 0).then(|| m_sum / m_ms as f64));
        pools.push(row);
    }
    let name = if changes.is_empty() {
        "baseline".to_string()
    } else {
        changes.iter().map(describe).collect::<Vec<_>>().join(" ")
    };
    Ok(json!({
        "variant": name,
        "hosts": setup.hosts.len(),
        "capacity": {
            "cpu": r.capacity[Dim::Cpu] as f64 / 1000.0,
            "memory_mb": r.capacity[Dim::Memory],
            "disk_mb": r.capacity[Dim::Disk],
            "gpu": r.capacity[Dim::Gpu] as f64 / 1000.0,
        },
        "backfill": setup.backfill.enabled.then_some(setup.backfill.max_reservations),
        "requeued": r.requeued,
        "skipped": r.left_out.n,
        "skipped_why": r.left_out.why,
        "replayed_s": span_ms as f64 / 1000.0,
        "stopped": stopped,
        "total": total,
        "pools": pools,
    }))
}

/// Jain's fairness index of `x` (None if empty or all zero).
fn jain(x: &[f64]) -> Option<f64> {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    (squares > 0.0).then(|| sum * sum / (x.len() as f64 * squares))
}

/// The variants to run: the baseline, each change alone, and all together
/// when there are several.
pub fn variants(changes: &[Change]) -> Vec<Vec<Change>> {
    let mut out = vec![Vec::new()];
    out.extend(changes.iter().map(|c| vec![c.clone()]));
    if changes.len() > 1 {
        out.push(changes.to_vec());
    }
    out
}

/// Runs every variant; the report as JSON.
pub fn run(dir: &Path, changes: &[Change], bounds: Bounds) -> Result<Value> {
    let snap = Snapshot::read(dir)?;
    // Every change checked against the snapshot before any replay.
    for c in changes {
        setup(&snap, std::slice::from_ref(c))?;
    }
    let mut rows = Vec::new();
    for v in variants(changes) {
        rows.push(replay(&snap, &v, bounds)?);
    }
    Ok(json!({
        "benchmark": "whatif",
        "snapshot": PathBuf::from(dir),
        "taken_at_ms": snap.taken_at_ms,
        "horizon_s": bounds.horizon_ms as f64 / 1000.0,
        "assumes": ASSUMES,
        "variants": rows,
    }))
}

/// What every answer assumes (printed with it).
pub const ASSUMES: &str = "if nothing else is submitted: running tasks end at their runtime \
    estimates (none: never), waiting tasks run for theirs; no preemption, constraints or host \
    pools; waits from the snapshot's time";

/// Prints the variants side by side, then each pool.
pub fn print_table(report: &Value) {
    let empty = Vec::new();
    let rows = report["variants"].as_array().unwrap_or(&empty);
    let horizon_s = report["horizon_s"].as_f64().unwrap_or(0.0) as u64;
    let horizon = match horizon_s {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s => format!("{s}s"),
    };
    println!("what if ({ASSUMES}); horizon {horizon}\n");
    let secs = |v: &Value| v.as_f64().map_or("-".to_string(), |s| format!("{s:.0}s"));
    let frac = |v: &Value| v.as_f64().map_or("-".to_string(), |s| format!("{s:.3}"));
    println!(
        "{:<40} {:>6} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>10} {:>8}",
        "variant",
        "hosts",
        "waiting",
        "started",
        "wait med",
        "wait p90",
        "wait max",
        "cpu",
        "mem",
        "makespan",
        "fairness"
    );
    for r in rows {
        let t = &r["total"];
        println!(
            "{:<40} {:>6} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>10} {:>8}",
            r["variant"].as_str().unwrap_or("?"),
            r["hosts"].to_string(),
            t["waiting"].to_string(),
            t["started"].to_string(),
            secs(&t["wait_median_s"]),
            secs(&t["wait_p90_s"]),
            secs(&t["wait_max_s"]),
            frac(&t["utilization"]["cpu"]),
            frac(&t["utilization"]["memory_mb"]),
            secs(&t["makespan_s"]),
            frac(&t["fairness_jain"]),
        );
    }
    println!(
        "\n{:<24} {:<40} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "pool", "variant", "waiting", "started", "wait med", "wait p90", "wait max", "ent. met"
    );
    let mut paths: Vec<&str> = rows
        .iter()
        .flat_map(|r| r["pools"].as_array().unwrap_or(&empty))
        .filter_map(|p| p["pool"].as_str())
        .collect();
    paths.sort_unstable();
    paths.dedup();
    for path in paths {
        for r in rows {
            let Some(p) = r["pools"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["pool"] == path))
            else {
                continue;
            };
            println!(
                "{:<24} {:<40} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
                path,
                r["variant"].as_str().unwrap_or("?"),
                p["waiting"].to_string(),
                p["started"].to_string(),
                secs(&p["wait_median_s"]),
                secs(&p["wait_p90_s"]),
                secs(&p["wait_max_s"]),
                frac(&p["entitlement_met"]),
            );
        }
    }
    for r in rows {
        let name = r["variant"].as_str().unwrap_or("?");
        let stopped = r["stopped"].as_str().unwrap_or("?");
        if stopped != "all started and ended" {
            println!(
                "\n{name}: stopped at {stopped} ({}s replayed); waits of tasks not started are \
                 lower bounds",
                r["replayed_s"]
            );
        }
        if r["requeued"].as_u64().unwrap_or(0) > 0 {
            println!(
                "\n{name}: {} running tasks queued again (their host is down, draining or \
                 removed)",
                r["requeued"]
            );
        }
        if r["skipped"].as_u64().unwrap_or(0) > 0 {
            println!(
                "\n{name}: {} tasks left out, e.g. {}",
                r["skipped"],
                r["skipped_why"].as_str().unwrap_or("?")
            );
        }
    }
}

#[cfg(test)]
mod tests;
