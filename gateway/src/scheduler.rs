//! The scheduling loop: one thread owns the engine, the jobs and their
//! tasks, the host backend and the store's write side.
//!
//! gRPC handlers send [`Command`]s over a bounded channel (a full channel
//! makes senders wait: backpressure) and await a reply. One iteration:
//! 1. wait for a command or the next deadline (cycle, timer, simulated run
//!    end), then drain up to `max_batch` commands;
//! 2. apply them to memory, collecting changed rows and events;
//! 3. submit waiting instances, run a cycle if one is due (entitlement,
//!    admission, placement, preemption), hand launches and kills to the
//!    backend, apply its status updates and fire timers (back-off, run-time
//!    limits);
//! 4. derive job states, commit everything in one store transaction, then
//!    answer the mutating commands and publish the events.
//!
//! A failed commit stops the process: memory is ahead of the store and a
//! restart recovers from the store.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use peloton_engine::admission::{TaskClass, TaskFlags};
use peloton_engine::host::HostState;
use peloton_engine::task::{TaskHandle, TaskState as EngineTaskState};
use peloton_engine::{Dim, Engine, NewTask, PoolConfig, PoolError, PoolId};
use peloton_proto::v1 as pb;
use prost::Message;
use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::{broadcast, mpsc, oneshot};
use tonic::Status;

use crate::agents::{Outbox, Registration};
use crate::backend::{HostBackend, Kill, Launch, RunRef, RunStatus, TaskUpdate};
use crate::convert::{self, JobPlan, Limits};
use crate::metrics::{Metrics, PoolDimLabels, PoolLabels};
use crate::store::{Snapshot, Store, WriteBatch};

mod hosts;

/// A reply channel.
pub type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// Events of one commit, as published to watchers.
pub type EventBatch = Arc<Vec<pb::Event>>;

/// A request to the loop.
#[derive(Debug)]
pub enum Command {
    /// Create a pool.
    CreatePool {
        /// Path.
        path: String,
        /// Validated configuration.
        config: PoolConfig,
        /// Reply.
        reply: Reply<pb::Pool>,
    },
    /// Update a pool.
    UpdatePool {
        /// Path.
        path: String,
        /// Validated configuration.
        config: PoolConfig,
        /// Expected version (0: any).
        version: u64,
        /// Reply.
        reply: Reply<pb::Pool>,
    },
    /// Delete a pool.
    DeletePool {
        /// Path.
        path: String,
        /// Expected version (0: any).
        version: u64,
        /// Reply.
        reply: Reply<()>,
    },
    /// Read a pool.
    GetPool {
        /// Path.
        path: String,
        /// Reply.
        reply: Reply<pb::Pool>,
    },
    /// Read all pools.
    ListPools {
        /// Reply.
        reply: Reply<Vec<pb::Pool>>,
    },
    /// Create a job.
    CreateJob {
        /// As sent.
        spec: Box<pb::JobSpec>,
        /// Validated.
        plan: Box<JobPlan>,
        /// Reply.
        reply: Reply<pb::Job>,
    },
    /// Read a job.
    GetJob {
        /// Job id.
        id: String,
        /// Reply.
        reply: Reply<pb::Job>,
    },
    /// Find jobs.
    QueryJobs {
        /// Filters and page.
        request: pb::QueryJobsRequest,
        /// Reply.
        reply: Reply<pb::QueryJobsResponse>,
    },
    /// Kill, delete, scale or restart a job.
    JobAction {
        /// Job id.
        id: String,
        /// Expected version (0: any).
        version: u64,
        /// What to do.
        action: JobAction,
        /// Reply (the job after the change; `None` once deleted).
        reply: Reply<Option<pb::Job>>,
    },
    /// List a job's tasks.
    ListTasks {
        /// Filters and page.
        request: pb::ListTasksRequest,
        /// Reply.
        reply: Reply<pb::ListTasksResponse>,
    },
    /// Read a task.
    GetTask {
        /// Job id.
        job_id: String,
        /// Instance.
        instance: u32,
        /// Reply.
        reply: Reply<pb::Task>,
    },
    /// Kill or restart tasks.
    TaskAction {
        /// Job id.
        job_id: String,
        /// Instances (empty: none).
        instances: Vec<u32>,
        /// Expected job version (0: any).
        version: u64,
        /// Restart (true) or kill.
        restart: bool,
        /// Reply.
        reply: Reply<()>,
    },
    /// Read hosts.
    ListHosts {
        /// Page.
        request: pb::ListHostsRequest,
        /// Reply.
        reply: Reply<pb::ListHostsResponse>,
    },
    /// Start or complete maintenance.
    Maintenance {
        /// Host names.
        hosts: Vec<String>,
        /// Start (drain) or complete (up).
        start: bool,
        /// Reply.
        reply: Reply<()>,
    },
    /// Subscribe to events: the reply holds the last committed revision and
    /// a receiver of every later commit's events.
    Watch {
        /// Reply.
        reply: oneshot::Sender<(u64, broadcast::Receiver<EventBatch>)>,
    },
    /// An agent registered (or registered again) on a new session.
    AgentRegister {
        /// Its session and what it said.
        registration: Box<Registration>,
        /// Reply (an error ends the session).
        reply: Reply<()>,
    },
    /// Run reports from an agent.
    AgentReports {
        /// Host name (the reports carry launch ids, so whichever session
        /// of the host they came on, they apply).
        host: Arc<str>,
        /// The reports.
        reports: Vec<pb::RunReport>,
    },
    /// An agent's session ended.
    AgentGone {
        /// Host name.
        host: Arc<str>,
        /// The session that ended.
        session: u64,
    },
    /// Where a run's logs are: its key and its agent's outbox (whether the
    /// run has ended, the agent says with each chunk).
    LogTarget {
        /// Job id.
        job_id: String,
        /// Instance.
        instance: u32,
        /// Run (0: the current or latest launched run).
        run_id: u32,
        /// Reply.
        reply: Reply<(pb::RunKey, Outbox)>,
    },
    /// Finish the current batch and stop.
    Shutdown,
}

/// What to do to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobAction {
    /// Kill every task.
    Kill,
    /// Forget a finished job.
    Delete,
    /// Change the instance count.
    Scale(u32),
    /// New runs of every task.
    Restart,
}

/// Options of the loop.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// Least time between two cycles while work arrives.
    pub cycle_interval: Duration,
    /// A cycle runs at least this often.
    pub idle_cycle_interval: Duration,
    /// Most commands applied in one iteration (one commit).
    pub max_batch: usize,
    /// Request limits.
    pub limits: Limits,
    /// Events kept in the store for resuming watches.
    pub event_retention: u64,
    /// Earlier runs kept per task.
    pub max_history: usize,
    /// An agent host not heard from for this long is lost.
    pub host_lost_after: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            cycle_interval: Duration::from_millis(20),
            idle_cycle_interval: Duration::from_millis(1000),
            max_batch: 1024,
            limits: Limits::default(),
            event_retention: 5_000_000,
            max_history: 8,
            host_lost_after: Duration::from_secs(10),
        }
    }
}

const NO_HOST: u32 = u32::MAX;
const N_STATES: usize = 14;

/// Wall-clock milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

use pb::TaskState as S;

/// Whether a task may go from `from` to `to`.
pub fn legal(from: S, to: S) -> bool {
    use S::*;
    matches!(
        (from, to),
        (Initialized, Pending | Killed)
            | (Pending, Ready | Initialized | Killed)
            | (Ready, Placing | Placed | Killed | Preempted)
            | (Placing, Placed | Killed | Preempted)
            | (Placed, Launching | Killed | Preempted | Lost)
            | (
                Launching,
                Running | Succeeded | Failed | Killed | Preempted | Lost
            )
            | (Running, Succeeded | Failed | Killed | Preempted | Lost)
            | (Failed, Backoff | Initialized)
            | (Backoff, Initialized | Killed)
            | (Lost | Preempted | Succeeded | Killed, Initialized)
    )
}

fn is_terminal(s: S) -> bool {
    matches!(s, S::Succeeded | S::Failed | S::Killed)
}

fn on_host(s: S) -> bool {
    matches!(s, S::Placed | S::Launching | S::Running)
}

#[derive(Debug)]
struct TaskEntry {
    state: S,
    run: u32,
    /// Launch number of the current run (0: not launched since start).
    seq: u64,
    handle: Option<TaskHandle>,
    host: u32,
    created_at: u64,
    placed_at: u64,
    started_at: u64,
    finished_at: u64,
    exit_code: i32,
    failures: u32,
    reason: Option<Box<str>>,
    /// Boxed: a thin pointer per task (most tasks never restart).
    #[allow(clippy::box_collection)]
    history: Option<Box<Vec<pb::TaskRun>>>,
    dirty: bool,
}

impl TaskEntry {
    fn new(now: u64) -> Self {
        TaskEntry {
            state: S::Initialized,
            run: 1,
            seq: 0,
            handle: None,
            host: NO_HOST,
            created_at: now,
            placed_at: 0,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            failures: 0,
            reason: None,
            history: None,
            dirty: false,
        }
    }
}

#[derive(Debug)]
struct JobEntry {
    id: Arc<str>,
    spec: pb::JobSpec,
    plan: JobPlan,
    pool: PoolId,
    version: u64,
    state: pb::JobState,
    created_at: u64,
    completed_at: u64,
    kill_requested: bool,
    tasks: Vec<TaskEntry>,
    counts: [u32; N_STATES],
    /// Instances in Initialized waiting to be submitted, in order.
    waiting: VecDeque<u32>,
    /// Instances holding an engine task.
    active: u32,
    /// Runs being killed whose end the host has not confirmed yet.
    held: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Backoff,
    Deadline,
}

type Deferred = Box<dyn FnOnce() + Send>;

/// A run that was told to stop and whose end its host has not confirmed:
/// it keeps its resources on the host, and its instance does not start
/// again, until then (so an instance never runs twice at once).
#[derive(Debug)]
struct Held {
    /// Launch id of the run.
    seq: u64,
    /// Its engine task (none for a run recovered after a restart and not
    /// adopted).
    handle: Option<TaskHandle>,
    host: u32,
    /// Start the instance's next run once this one is gone.
    restart: bool,
    /// It was preempted (while preemptions are unconfirmed, no new victims
    /// are chosen: the engine still counts the held runs' allocation).
    preempted: bool,
}

/// What the loop knows of a host run by an agent.
#[derive(Debug, Default)]
struct AgentHost {
    /// Declared lost (no heartbeat in time); cleared when it registers.
    lost: bool,
    /// How it isolates tasks.
    isolation: String,
    /// Registered since this process started.
    connected: bool,
}

/// The loop's state. Create with [`Scheduler::new`], then [`Scheduler::run`]
/// on its own thread.
pub struct Scheduler {
    engine: Engine,
    store: Arc<dyn Store>,
    backend: Box<dyn HostBackend>,
    config: LoopConfig,
    metrics: Arc<Metrics>,
    jobs: FxHashMap<u32, JobEntry>,
    next_key: u32,
    by_id: BTreeMap<Arc<str>, u32>,
    owners: Vec<Option<(u32, u32)>>,
    pool_versions: FxHashMap<String, u64>,
    host_names: Vec<Arc<str>>,
    revision: u64,
    last_trim: u64,
    events: Vec<pb::Event>,
    batch: WriteBatch,
    dirty_tasks: Vec<(u32, u32)>,
    dirty_jobs: FxHashSet<u32>,
    deleted_jobs: Vec<String>,
    need_fill: FxHashSet<u32>,
    deferred: Vec<Deferred>,
    timers: BinaryHeap<Reverse<(u64, TimerKind, RunRef)>>,
    events_tx: broadcast::Sender<EventBatch>,
    launches: Vec<Launch>,
    kills: Vec<Kill>,
    updates: Vec<TaskUpdate>,
    /// Jobs whose next gang the engine refused (queues full): retried
    /// after the next cycle.
    retry_fill: FxHashSet<u32>,
    /// Runs being killed, by (job, instance).
    held: FxHashMap<(u32, u32), Held>,
    /// Held runs that were preempted.
    n_held_preempted: u32,
    /// Runs recovered on agent hosts whose agents have not reported yet,
    /// by host slot.
    orphans: FxHashMap<u32, Vec<(u32, u32)>>,
    /// Agent hosts by slot (empty with simulated hosts).
    agent_hosts: FxHashMap<u32, AgentHost>,
    /// Hosts in maintenance (draining or down), by slot.
    maintenance: FxHashSet<u32>,
    /// The hub agents' last-seen times are read from.
    hub: Option<Arc<crate::agents::AgentHub>>,
    started_at: u64,
    last_lost_check: u64,
    needs_cycle: bool,
    last_cycle: Option<Instant>,
    last_pool_metrics: Option<Instant>,
    now: u64,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("jobs", &self.jobs.len())
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

fn pool_error(e: PoolError) -> Status {
    match e {
        PoolError::NotFound { .. } | PoolError::ParentNotFound { .. } => {
            Status::not_found(e.to_string())
        }
        PoolError::AlreadyExists { .. } => Status::already_exists(e.to_string()),
        PoolError::TooManyPools { .. } => Status::resource_exhausted(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

fn stale(what: &str, given: u64, current: u64) -> Status {
    Status::failed_precondition(format!(
        "{what}: version {given} is stale; the current version is {current}"
    ))
}

impl Scheduler {
    /// A loop over `engine` (hosts already registered), recovering the
    /// store's contents.
    pub fn new(
        engine: Engine,
        store: Arc<dyn Store>,
        backend: Box<dyn HostBackend>,
        config: LoopConfig,
        metrics: Arc<Metrics>,
        snapshot: Snapshot,
        hub: Option<Arc<crate::agents::AgentHub>>,
    ) -> anyhow::Result<Self> {
        // Bounded by commits; a watcher that falls further behind catches up
        // from the store.
        let (events_tx, _) = broadcast::channel(256);
        let mut host_names = Vec::new();
        for slot in engine.hosts().live_hosts().iter() {
            let id = engine.hosts().lookup_slot(slot as usize).expect("live");
            let slot = slot as usize;
            if host_names.len() <= slot {
                host_names.resize(slot + 1, Arc::from(""));
            }
            host_names[slot] = Arc::from(engine.hosts().name(id));
        }
        let mut s = Scheduler {
            engine,
            store,
            backend,
            config,
            metrics,
            jobs: FxHashMap::default(),
            next_key: 0,
            by_id: BTreeMap::new(),
            owners: Vec::new(),
            pool_versions: FxHashMap::default(),
            host_names,
            revision: snapshot.revision,
            last_trim: snapshot.revision,
            events: Vec::new(),
            batch: WriteBatch::default(),
            dirty_tasks: Vec::new(),
            dirty_jobs: FxHashSet::default(),
            deleted_jobs: Vec::new(),
            need_fill: FxHashSet::default(),
            deferred: Vec::new(),
            timers: BinaryHeap::new(),
            events_tx,
            launches: Vec::new(),
            kills: Vec::new(),
            updates: Vec::new(),
            retry_fill: FxHashSet::default(),
            held: FxHashMap::default(),
            n_held_preempted: 0,
            orphans: FxHashMap::default(),
            agent_hosts: FxHashMap::default(),
            maintenance: FxHashSet::default(),
            hub,
            started_at: now_ms(),
            last_lost_check: 0,
            needs_cycle: true,
            last_cycle: None,
            last_pool_metrics: None,
            now: now_ms(),
        };
        s.pool_versions.insert("/".into(), 1);
        s.recover(snapshot)?;
        Ok(s)
    }

    fn recover(&mut self, snap: Snapshot) -> anyhow::Result<()> {
        for (path, bytes) in &snap.pools {
            let pool = pb::Pool::decode(bytes.as_slice())?;
            let config = convert::pool_config(pool.spec.as_ref())
                .map_err(|e| anyhow::anyhow!("stored pool {path}: {}", e.message()))?;
            if path == "/" {
                let root = self.engine.resources().tree().root();
                self.engine
                    .resources_mut()
                    .update_pool(root, config)
                    .map_err(|e| anyhow::anyhow!("stored pool /: {e}"))?;
            } else {
                self.engine
                    .resources_mut()
                    .create_pool(path, config)
                    .map_err(|e| anyhow::anyhow!("stored pool {path}: {e}"))?;
            }
            self.pool_versions.insert(path.clone(), pool.version);
        }
        let agent_mode = self.hub.is_some();
        for (name, bytes) in &snap.hosts {
            let host = pb::Host::decode(bytes.as_slice())?;
            if agent_mode {
                self.recover_agent_host(&host)?;
            } else if let Some(id) = self.engine.hosts().lookup(name)
                && host.state() != pb::HostState::Up
            {
                self.engine.hosts_mut().set_state(id, HostState::Down)?;
                self.maintenance.insert(id.idx() as u32);
            }
        }
        let mut tasks_by_job: FxHashMap<&str, Vec<(u32, &[u8])>> = FxHashMap::default();
        for ((job, instance), bytes) in &snap.tasks {
            tasks_by_job
                .entry(job.as_str())
                .or_default()
                .push((*instance, bytes.as_slice()));
        }
        let now = now_ms();
        for (id, bytes) in &snap.jobs {
            let job = pb::Job::decode(bytes.as_slice())?;
            let spec = job.spec.clone().unwrap_or_default();
            // Stored jobs were valid when accepted; limits configured lower
            // since must not make them unreadable.
            let lenient = Limits {
                max_instances_per_job: u32::MAX,
                max_ports: usize::MAX,
                max_list_len: usize::MAX,
                max_string_len: usize::MAX,
                max_overrides: usize::MAX,
            };
            let plan = convert::job_plan(&spec, &lenient)
                .map_err(|e| anyhow::anyhow!("stored job {id}: {}", e.message()))?;
            let status = job.status.clone().unwrap_or_default();
            let pool = self.engine.resources().tree().lookup(&spec.pool);
            let key = self.next_key;
            self.next_key += 1;
            let id: Arc<str> = Arc::from(id.as_str());
            let n = spec.instance_count;
            let mut entry = JobEntry {
                id: id.clone(),
                plan,
                pool: pool.unwrap_or(self.engine.resources().tree().root()),
                version: job.version,
                state: status.state(),
                created_at: status.created_at_ms,
                completed_at: status.completed_at_ms,
                kill_requested: status.kill_requested
                    || matches!(status.state(), pb::JobState::Killing),
                tasks: (0..n)
                    .map(|_| TaskEntry::new(status.created_at_ms))
                    .collect(),
                counts: [0; N_STATES],
                waiting: VecDeque::new(),
                active: 0,
                held: 0,
                spec,
            };
            // Runs whose end their host had not confirmed: (host, instance,
            // launch, restart once confirmed).
            let mut stopping: Vec<(u32, u32, u64, bool)> = Vec::new();
            let mut stopping_instances = FxHashSet::default();
            for (instance, bytes) in tasks_by_job.remove(&*id).unwrap_or_default() {
                let Some(t) = entry.tasks.get_mut(instance as usize) else {
                    continue;
                };
                let row = pb::Task::decode(bytes)?;
                let cur = row.current.unwrap_or_default();
                t.state = cur.state();
                t.run = cur.run_id.max(1);
                t.created_at = cur.created_at_ms;
                t.placed_at = cur.placed_at_ms;
                t.started_at = cur.started_at_ms;
                t.finished_at = cur.finished_at_ms;
                t.exit_code = cur.exit_code;
                t.seq = cur.launch_id;
                t.host = self
                    .engine
                    .hosts()
                    .lookup(&cur.host)
                    .map_or(NO_HOST, |h| h.idx() as u32);
                t.failures = row.failure_count;
                if agent_mode && row.stopping && t.host != NO_HOST && t.seq != 0 {
                    stopping.push((t.host, instance, t.seq, row.restart_when_stopped));
                    stopping_instances.insert(instance);
                }
                t.reason = (!cur.reason.is_empty()).then(|| cur.reason.into_boxed_str());
                t.history = (!row.history.is_empty()).then(|| Box::new(row.history));
            }
            // Runs that were not finished: queued ones start over. Ones on
            // agent hosts wait for their agents to report them (kept, or
            // lost if the agent does not have them); on simulated hosts they
            // are lost (those hosts restarted with us).
            let mut lost = Vec::new();
            let mut orphans = Vec::new();
            for (i, t) in entry.tasks.iter_mut().enumerate() {
                match t.state {
                    S::Initialized | S::Pending | S::Ready | S::Placing | S::Unknown => {
                        // Initialized instances are exactly the waiting ones.
                        t.state = S::Initialized;
                        t.host = NO_HOST;
                        entry.waiting.push_back(i as u32);
                    }
                    S::Placed | S::Launching | S::Running if agent_mode && t.host != NO_HOST => {
                        orphans.push((t.host, i as u32));
                    }
                    S::Lost | S::Preempted if stopping_instances.contains(&(i as u32)) => {
                        // Restarted once its host confirms the end.
                    }
                    S::Placed | S::Launching | S::Running | S::Lost | S::Preempted => {
                        lost.push(i as u32);
                    }
                    S::Backoff => {
                        self.timers.push(Reverse((
                            now,
                            TimerKind::Backoff,
                            RunRef {
                                job: key,
                                instance: i as u32,
                                run: t.run,
                                seq: t.seq,
                            },
                        )));
                    }
                    S::Succeeded | S::Failed | S::Killed => {}
                }
                entry.counts[t.state as usize] += 1;
            }
            entry.held = stopping.len() as u32;
            self.by_id.insert(id, key);
            self.jobs.insert(key, entry);
            self.need_fill.insert(key);
            for (host, i) in orphans {
                self.orphans.entry(host).or_default().push((key, i));
            }
            for (host, i, seq, restart) in stopping {
                self.held.insert(
                    (key, i),
                    Held {
                        seq,
                        handle: None,
                        host,
                        restart,
                        preempted: false,
                    },
                );
            }
            for i in lost {
                let t = &mut self.jobs.get_mut(&key).expect("inserted").tasks[i as usize];
                if matches!(t.state, S::Placed | S::Launching | S::Running) {
                    t.finished_at = now;
                    self.transition(
                        key,
                        i,
                        S::Lost,
                        Some("the server restarted and its simulated hosts lost the run"),
                    );
                }
                let kill = self.jobs[&key].kill_requested;
                if kill {
                    self.transition(key, i, S::Initialized, None);
                    self.transition(key, i, S::Killed, None);
                } else {
                    self.new_run(key, i);
                }
            }
            self.dirty_jobs.insert(key);
            if pool.is_none() && !is_terminal_job(self.jobs[&key].state) {
                tracing::warn!(job = %self.jobs[&key].id, pool = %self.jobs[&key].spec.pool, "job's pool is gone");
            }
        }
        self.metrics.jobs.set(self.jobs.len() as i64);
        Ok(())
    }

    /// Runs until a [`Command::Shutdown`] or until every sender is gone.
    pub fn run(mut self, mut rx: mpsc::Receiver<Command>, rt: tokio::runtime::Handle) {
        let mut commands = Vec::with_capacity(self.config.max_batch);
        // Commit what recovery changed before serving.
        self.finish_iteration();
        loop {
            let wait = self.time_to_next_deadline();
            let first = rt.block_on(async { tokio::time::timeout(wait, rx.recv()).await });
            let mut stop = false;
            match first {
                Ok(Some(c)) => commands.push(c),
                Ok(None) => stop = true,
                Err(_) => {}
            }
            while commands.len() < self.config.max_batch {
                match rx.try_recv() {
                    Ok(c) => commands.push(c),
                    Err(_) => break,
                }
            }
            self.now = now_ms();
            for c in commands.drain(..) {
                if matches!(c, Command::Shutdown) {
                    stop = true;
                    continue;
                }
                self.handle(c);
            }
            self.work();
            self.finish_iteration();
            if stop {
                tracing::info!(revision = self.revision, "scheduling loop stopped");
                return;
            }
        }
    }

    fn time_to_next_deadline(&self) -> Duration {
        let now = Instant::now();
        let mut until = match self.last_cycle {
            None => now,
            Some(last) if self.needs_cycle => last + self.config.cycle_interval,
            Some(last) => last + self.config.idle_cycle_interval,
        };
        let wall = now_ms();
        let mut ms_deadline = self.timers.peek().map(|Reverse((t, _, _))| *t);
        if let Some(b) = self.backend.next_deadline() {
            ms_deadline = Some(ms_deadline.map_or(b, |t| t.min(b)));
        }
        if let Some(t) = ms_deadline {
            until = until.min(now + Duration::from_millis(t.saturating_sub(wall)));
        }
        until.saturating_duration_since(now)
    }

    /// Fills, cycles, backend updates and timers.
    fn work(&mut self) {
        self.fill_all();
        let due = match self.last_cycle {
            None => true,
            Some(last) => {
                let since = last.elapsed();
                (self.needs_cycle && since >= self.config.cycle_interval)
                    || since >= self.config.idle_cycle_interval
            }
        };
        if due {
            self.cycle();
            self.need_fill.extend(self.retry_fill.drain());
            self.fill_all();
        }
        let now_dispatch = !self.backend.dispatch_after_commit();
        if now_dispatch {
            self.backend.launch(self.now, &mut self.launches);
            self.backend.kill(self.now, &mut self.kills);
        }
        self.now = now_ms();
        self.backend.poll(self.now, &mut self.updates);
        let mut updates = std::mem::take(&mut self.updates);
        for u in updates.drain(..) {
            self.apply_update(u);
        }
        self.updates = updates;
        self.fire_timers();
        self.check_lost_hosts();
        if now_dispatch {
            // Kills issued while applying updates and timers.
            self.backend.kill(self.now, &mut self.kills);
        }
        self.fill_all();
    }

    fn finish_iteration(&mut self) {
        self.derive_job_states();
        self.collect_rows();
        if !self.batch.is_empty() {
            let start = Instant::now();
            self.batch.revision = self.revision;
            if let Err(e) = self.store.commit(&self.batch) {
                tracing::error!(error = %e, "store commit failed; stopping so that a restart recovers");
                std::process::exit(70);
            }
            self.metrics
                .commit_seconds
                .observe(start.elapsed().as_secs_f64());
            self.batch = WriteBatch::default();
        }
        // Real hosts hear of launches and kills only once they are durable:
        // a crash before the commit must not leave a run the store does not
        // know (it would run twice), nor a kill it does not know of. (For
        // the simulator these are what is left of the iteration.)
        self.backend.launch(self.now, &mut self.launches);
        self.backend.kill(self.now, &mut self.kills);
        for d in self.deferred.drain(..) {
            d();
        }
        if !self.events.is_empty() {
            let events = Arc::new(std::mem::take(&mut self.events));
            // No receivers is fine.
            let _ = self.events_tx.send(events);
        }
    }

    fn collect_rows(&mut self) {
        for (k, i) in std::mem::take(&mut self.dirty_tasks) {
            let Some(job) = self.jobs.get_mut(&k) else {
                continue;
            };
            let Some(t) = job.tasks.get_mut(i as usize) else {
                continue;
            };
            t.dirty = false;
            let mut row = task_row(t, &self.host_names);
            if let Some(h) = self.held.get(&(k, i)) {
                row.stopping = true;
                row.restart_when_stopped = h.restart;
            }
            self.batch
                .tasks
                .push(((job.id.clone(), i), Some(row.encode_to_vec())));
        }
        for k in std::mem::take(&mut self.dirty_jobs) {
            let Some(job) = self.jobs.get(&k) else {
                continue;
            };
            let row = job_to_pb(job);
            self.batch
                .jobs
                .push((job.id.to_string(), Some(row.encode_to_vec())));
        }
        for id in self.deleted_jobs.drain(..) {
            self.batch.jobs.push((id.clone(), None));
            self.batch.delete_tasks_of.push(id);
        }
        if !self.events.is_empty() {
            let first = self.events[0].revision;
            // A `WatchResponse` is its events as field 1, encoded in place.
            let len: usize = self
                .events
                .iter()
                .map(|e| prost::encoding::message::encoded_len(1, e))
                .sum();
            let mut bytes = Vec::with_capacity(len);
            for e in &self.events {
                prost::encoding::message::encode(1, e, &mut bytes);
            }
            self.batch.events = Some((first, bytes));
            let retention = self.config.event_retention;
            if self.revision > self.last_trim + retention / 10 + 1 && self.revision > retention {
                self.batch.trim_events_before = Some(self.revision - retention);
                self.last_trim = self.revision;
            }
        }
    }

    // ------------------------------------------------------------ tasks

    fn transition(&mut self, k: u32, i: u32, to: S, reason: Option<&str>) {
        let now = self.now;
        let job = self.jobs.get_mut(&k).expect("live job");
        let t = &mut job.tasks[i as usize];
        let from = t.state;
        debug_assert!(
            legal(from, to),
            "illegal task transition {from:?} -> {to:?}"
        );
        if !legal(from, to) {
            tracing::error!(job = %job.id, instance = i, ?from, ?to, "illegal task transition");
        }
        job.counts[from as usize] -= 1;
        job.counts[to as usize] += 1;
        t.state = to;
        if let Some(r) = reason {
            t.reason = Some(r.into());
        }
        // Queued states and a first run's start need no row: recovery
        // treats a missing or older row the same way.
        let skip = matches!(to, S::Pending | S::Ready | S::Placing)
            || (to == S::Initialized && t.run == 1);
        let persist = !skip;
        if persist && !t.dirty {
            t.dirty = true;
            self.dirty_tasks.push((k, i));
        }
        self.dirty_jobs.insert(k);
        self.revision += 1;
        let host = host_name(&self.host_names, t.host);
        self.events.push(pb::Event {
            revision: self.revision,
            time_ms: now,
            kind: Some(pb::event::Kind::Task(pb::TaskEvent {
                job_id: job.id.to_string(),
                instance: i,
                run_id: t.run,
                state: to as i32,
                host,
                reason: reason.unwrap_or_default().to_string(),
            })),
        });
    }

    /// Ends the current run's hold on the engine (and on its host).
    fn release(&mut self, k: u32, i: u32) {
        let job = self.jobs.get_mut(&k).expect("live job");
        let Some(h) = job.tasks[i as usize].handle.take() else {
            return;
        };
        job.active -= 1;
        if !job.waiting.is_empty() {
            // Room under max_running_instances for the next gang.
            self.need_fill.insert(k);
        }
        self.owners[h.idx()] = None;
        match self.engine.tasks().state(h) {
            Ok(EngineTaskState::Pending) => {
                let members = self.engine.cancel(h).expect("queued task");
                for m in members {
                    if m == h {
                        continue;
                    }
                    // The rest of its gang goes back to waiting, in order.
                    let (mk, mi) = self.owners[m.idx()].take().expect("owned");
                    let job = self.jobs.get_mut(&mk).expect("live job");
                    job.tasks[mi as usize].handle = None;
                    job.active -= 1;
                    self.back_to_waiting(mk, mi);
                }
            }
            Ok(_) => self.engine.finish(h).expect("live engine task"),
            Err(e) => tracing::error!(error = %e, "task handle out of sync with the engine"),
        }
        self.needs_cycle = true;
    }

    /// Ends the current run in `to` (Killed, Preempted, Lost or Failed),
    /// stopping it on its host if it has one. Returns whether a run ended
    /// in `to` (false: it had already ended, or it was only queued and went
    /// back to waiting).
    fn end_run(&mut self, k: u32, i: u32, to: S, reason: &str) -> bool {
        let state = self.jobs[&k].tasks[i as usize].state;
        if to == S::Killed
            && let Some(h) = self.held.get_mut(&(k, i))
        {
            // A kill wins over a restart still waiting for the old run.
            h.restart = false;
            self.mark_dirty(k, i);
            if matches!(state, S::Lost | S::Preempted) {
                self.transition(k, i, S::Initialized, None);
                self.transition(k, i, S::Killed, Some(reason));
                return true;
            }
        }
        if is_terminal(state) || matches!(state, S::Lost | S::Preempted) {
            return false;
        }
        if on_host(state) {
            self.stop_on_host(k, i, to == S::Preempted);
        }
        let job = self.jobs.get_mut(&k).expect("live job");
        let t = &mut job.tasks[i as usize];
        if state == S::Initialized
            && to == S::Killed
            && let Some(at) = job.waiting.iter().position(|&w| w == i)
        {
            job.waiting.remove(at);
        }
        t.finished_at = self.now;
        self.release(k, i);
        if state == S::Backoff || state == S::Initialized {
            if to == S::Killed {
                self.transition(k, i, S::Killed, Some(reason));
                return true;
            }
            return false;
        }
        if state == S::Pending && to != S::Killed {
            // Never left the queue: nothing to preempt or lose; it waits
            // again.
            self.back_to_waiting(k, i);
            return false;
        }
        self.transition(k, i, to, Some(reason));
        if to == S::Preempted {
            self.metrics.preemptions.inc();
        }
        true
    }

    /// Starts a new run of an instance whose run has ended.
    fn new_run(&mut self, k: u32, i: u32) {
        if let Some(h) = self.held.get_mut(&(k, i)) {
            // The old run is still stopping: start again once it is gone.
            h.restart = true;
            self.mark_dirty(k, i);
            return;
        }
        let max_history = self.config.max_history;
        let now = self.now;
        let job = self.jobs.get_mut(&k).expect("live job");
        let t = &mut job.tasks[i as usize];
        let mut run = task_run(t, &self.host_names);
        if t.state == S::Backoff {
            // History says how the run ended.
            run.state = S::Failed as i32;
        }
        let history = t.history.get_or_insert_with(Default::default);
        history.insert(0, run);
        history.truncate(max_history);
        t.run += 1;
        t.seq = 0;
        t.host = NO_HOST;
        t.created_at = now;
        t.placed_at = 0;
        t.started_at = 0;
        t.finished_at = 0;
        t.exit_code = 0;
        t.reason = None;
        self.back_to_waiting(k, i);
    }

    /// Makes an instance Initialized and puts it in its job's `waiting`
    /// queue, in instance order (the two always go together).
    fn back_to_waiting(&mut self, k: u32, i: u32) {
        self.transition(k, i, S::Initialized, None);
        let job = self.jobs.get_mut(&k).expect("live job");
        let at = job.waiting.partition_point(|&w| w < i);
        job.waiting.insert(at, i);
        self.need_fill.insert(k);
    }

    fn fill_all(&mut self) {
        if self.need_fill.is_empty() {
            return;
        }
        let mut keys: Vec<u32> = self.need_fill.drain().collect();
        keys.sort_unstable();
        for k in keys {
            self.fill(k);
        }
    }

    /// Submits waiting instances of a job, gang by gang, up to its running
    /// limit. What the engine refuses waits for the next try.
    fn fill(&mut self, k: u32) {
        let Some(job) = self.jobs.get_mut(&k) else {
            return;
        };
        if job.kill_requested {
            return;
        }
        let mut gang = Vec::new();
        let mut members = Vec::new();
        loop {
            let job = self.jobs.get_mut(&k).expect("live job");
            if job.waiting.is_empty() {
                return;
            }
            let room = if job.plan.max_running == 0 {
                u32::MAX
            } else {
                job.plan.max_running.saturating_sub(job.active)
            };
            let size = (job.plan.gang as usize).min(job.waiting.len());
            if (room as usize) < size {
                return;
            }
            members.clear();
            members.extend(job.waiting.iter().take(size).copied());
            if members.iter().any(|&i| self.held.contains_key(&(k, i))) {
                // An earlier run of one (scaled away and added back) is
                // still stopping: wait for it (confirm_end fills again).
                return;
            }
            gang.clear();
            for &i in &members {
                gang.push(new_task(job, k, i));
            }
            match self.engine.submit(&gang) {
                Ok(handles) => {
                    let job = self.jobs.get_mut(&k).expect("live job");
                    job.waiting.drain(..size);
                    job.active += size as u32;
                    for (&i, h) in members.iter().zip(handles) {
                        job.tasks[i as usize].handle = Some(h);
                        if self.owners.len() <= h.idx() {
                            self.owners.resize(h.idx() + 1, None);
                        }
                        self.owners[h.idx()] = Some((k, i));
                    }
                    for &i in &members {
                        self.transition(k, i, S::Pending, None);
                    }
                    self.needs_cycle = true;
                }
                Err(e) => {
                    let reason: Box<str> = format!("cannot queue yet: {e}").into();
                    let job = self.jobs.get_mut(&k).expect("live job");
                    for &i in &members {
                        job.tasks[i as usize].reason = Some(reason.clone());
                    }
                    // Retried after the next cycle.
                    self.retry_fill.insert(k);
                    return;
                }
            }
        }
    }

    fn cycle(&mut self) {
        let start = Instant::now();
        self.engine.cycle(self.now);
        self.last_cycle = Some(start);
        self.needs_cycle = false;
        let n_admitted = self.engine.report().admission.admitted.len();
        for idx in 0..n_admitted {
            let h = TaskHandle::from_u64(self.engine.report().admission.admitted[idx].task.0);
            if let Some(Some((k, i))) = self.owners.get(h.idx()).copied() {
                self.transition(k, i, S::Ready, None);
            }
        }
        let n_placed = self.engine.report().placement.placed.len();
        let wants_specs = self.backend.wants_specs();
        for idx in 0..n_placed {
            let p = self.engine.report().placement.placed[idx];
            let Some(Some((k, i))) = self.owners.get(p.task.idx()).copied() else {
                continue;
            };
            let job = self.jobs.get_mut(&k).expect("live job");
            let tmpl = job.plan.template(i);
            let (duration, code) = (tmpl.sim_duration_ms, tmpl.sim_exit_code);
            let t = &mut job.tasks[i as usize];
            t.host = p.host;
            t.placed_at = self.now;
            let run = t.run;
            self.transition(k, i, S::Placed, None);
            // The Placed event's revision names the launch: unique for the
            // store's whole life, so also across restarts.
            let seq = self.revision;
            let job = self.jobs.get_mut(&k).expect("live job");
            job.tasks[i as usize].seq = seq;
            let job_id = job.id.clone();
            let spec = wants_specs.then(|| Arc::new(instance_spec(&job.spec, i).clone()));
            self.transition(k, i, S::Launching, None);
            self.launches.push(Launch {
                run: RunRef {
                    job: k,
                    instance: i,
                    run,
                    seq,
                },
                host: self.host_names[p.host as usize].clone(),
                job_id,
                spec,
                sim_duration_ms: duration,
                sim_exit_code: code,
            });
        }
        self.metrics.placements.inc_by(n_placed as u64);
        let n_unplaced = self.engine.report().placement.unplaced.len();
        self.metrics.placement_failures.inc_by(n_unplaced as u64);
        for idx in 0..n_unplaced {
            let u = self.engine.report().placement.unplaced[idx].task;
            if let Some(Some((k, i))) = self.owners.get(u.idx()).copied()
                && self.jobs[&k].tasks[i as usize].state == S::Ready
            {
                self.transition(k, i, S::Placing, None);
            }
        }
        // While preempted runs are still stopping, the engine still counts
        // them: choosing more victims now would preempt twice for one need.
        let victims: Vec<(TaskHandle, String)> = self
            .engine
            .report()
            .victims
            .iter()
            .filter(|_| self.n_held_preempted == 0)
            .map(|v| (v.task, format!("preempted: {}", v.reason)))
            .collect();
        for (h, reason) in victims {
            if let Some(Some((k, i))) = self.owners.get(h.idx()).copied()
                && self.end_run(k, i, S::Preempted, &reason)
            {
                self.new_run(k, i);
            }
        }
        self.metrics
            .cycle_seconds
            .observe(start.elapsed().as_secs_f64());
        self.update_pool_metrics();
    }

    fn apply_update(&mut self, u: TaskUpdate) {
        let (k, i) = (u.run.job, u.run.instance);
        // Held runs first: a scaled-away instance has no task entry.
        if self.held.get(&(k, i)).is_some_and(|h| h.seq == u.run.seq) {
            if !matches!(u.status, RunStatus::Running) {
                self.confirm_end(k, i);
            }
            return;
        }
        let Some(job) = self.jobs.get_mut(&k) else {
            return;
        };
        let Some(t) = job.tasks.get_mut(i as usize) else {
            return;
        };
        if t.run != u.run.run || t.seq != u.run.seq || !on_host(t.state) {
            return; // a run we already ended
        }
        match u.status {
            RunStatus::Running => {
                if t.state == S::Launching {
                    t.started_at = u.time_ms;
                    let limit = job.plan.max_running_time_ms;
                    if limit > 0 {
                        self.timers.push(Reverse((
                            u.time_ms.saturating_add(limit),
                            TimerKind::Deadline,
                            u.run,
                        )));
                    }
                    self.transition(k, i, S::Running, None);
                }
            }
            RunStatus::Exited(code) => {
                t.finished_at = u.time_ms;
                t.exit_code = code;
                self.metrics.runs_finished.inc();
                self.release(k, i);
                if code == 0 {
                    self.transition(k, i, S::Succeeded, None);
                } else {
                    self.fail(k, i, &format!("exited with code {code}"));
                }
            }
            RunStatus::Failed(code, reason) => {
                t.finished_at = u.time_ms;
                t.exit_code = code;
                self.metrics.runs_finished.inc();
                self.release(k, i);
                self.fail(k, i, &reason);
            }
            RunStatus::Killed => {
                t.finished_at = u.time_ms;
                self.release(k, i);
                self.transition(k, i, S::Killed, Some("killed on its host"));
            }
            RunStatus::Lost(reason) => {
                t.finished_at = u.time_ms;
                self.release(k, i);
                self.transition(k, i, S::Lost, Some(&reason));
                self.new_run(k, i);
            }
        }
    }

    /// The current run failed: back off and retry, or give up.
    fn fail(&mut self, k: u32, i: u32, reason: &str) {
        self.transition(k, i, S::Failed, Some(reason));
        let job = self.jobs.get_mut(&k).expect("live job");
        let policy = job.plan.template(i).restart;
        let kill = job.kill_requested;
        let t = &mut job.tasks[i as usize];
        t.failures += 1;
        if kill || t.failures > policy.max_failures {
            return;
        }
        let at = self.now.saturating_add(policy.backoff(t.failures));
        let (run, seq) = (t.run, t.seq);
        self.timers.push(Reverse((
            at,
            TimerKind::Backoff,
            RunRef {
                job: k,
                instance: i,
                run,
                seq,
            },
        )));
        self.transition(k, i, S::Backoff, Some(reason));
    }

    fn fire_timers(&mut self) {
        while let Some(&Reverse((at, kind, run))) = self.timers.peek() {
            if at > self.now {
                break;
            }
            self.timers.pop();
            let Some(job) = self.jobs.get(&run.job) else {
                continue;
            };
            let Some(t) = job.tasks.get(run.instance as usize) else {
                continue;
            };
            if t.run != run.run || t.seq != run.seq {
                continue;
            }
            match kind {
                TimerKind::Backoff if t.state == S::Backoff => {
                    self.new_run(run.job, run.instance);
                }
                TimerKind::Deadline if t.state == S::Running => {
                    let limit = job.plan.max_running_time_ms;
                    let reason = format!("ran longer than max_running_time_ms {limit}");
                    self.stop_on_host(run.job, run.instance, false);
                    let t = &mut self.jobs.get_mut(&run.job).expect("live").tasks
                        [run.instance as usize];
                    t.finished_at = self.now;
                    // A failure like any other: the restart policy applies.
                    self.fail(run.job, run.instance, &reason);
                }
                _ => {}
            }
        }
    }

    fn derive_job_states(&mut self) {
        let keys: Vec<u32> = self.dirty_jobs.iter().copied().collect();
        for k in keys {
            let Some(job) = self.jobs.get_mut(&k) else {
                continue;
            };
            let c = &job.counts;
            let n = job.tasks.len() as u32;
            let terminal = c[S::Succeeded as usize] + c[S::Failed as usize] + c[S::Killed as usize];
            let new = if terminal == n && job.held > 0 {
                // Ended in our books; a host still has to confirm.
                if job.kill_requested {
                    pb::JobState::Killing
                } else {
                    pb::JobState::Running
                }
            } else if terminal == n {
                if job.kill_requested {
                    pb::JobState::Killed
                } else if c[S::Failed as usize] > 0 {
                    pb::JobState::Failed
                } else if c[S::Killed as usize] > 0 {
                    pb::JobState::Killed
                } else {
                    pb::JobState::Succeeded
                }
            } else if job.kill_requested {
                pb::JobState::Killing
            } else if c[S::Running as usize] > 0 {
                pb::JobState::Running
            } else if c[S::Initialized as usize] == n - terminal {
                pb::JobState::Initialized
            } else {
                pb::JobState::Pending
            };
            if new != job.state {
                job.state = new;
                job.completed_at = if is_terminal_job(new) { self.now } else { 0 };
                self.revision += 1;
                self.events
                    .push(job_event(self.revision, self.now, job, false));
            }
        }
    }

    fn update_pool_metrics(&mut self) {
        if self
            .last_pool_metrics
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_pool_metrics = Some(Instant::now());
        let rm = self.engine.resources();
        let tree = rm.tree();
        let mut ids = tree.list();
        ids.sort_by(|a, b| tree.path(*a).cmp(tree.path(*b)));
        let ent = rm.entitlements();
        for id in ids.into_iter().take(self.metrics.max_pools) {
            let path = tree.path(id).to_string();
            let slot = id.idx();
            let usage = rm.usage(id).expect("listed pool");
            self.metrics
                .pending_tasks
                .get_or_create(&PoolLabels { pool: path.clone() })
                .set(usage.n_queued as i64);
            let alloc = usage
                .allocation
                .total
                .saturating_add(&usage.allocation.revocable);
            for d in Dim::ALL {
                let labels = PoolDimLabels {
                    pool: path.clone(),
                    dim: d.name().to_string(),
                };
                let e = ent.entitlement(slot)[d].min(i64::MAX as u64) as i64;
                self.metrics.entitlement.get_or_create(&labels).set(e);
                self.metrics
                    .allocation
                    .get_or_create(&labels)
                    .set(alloc[d] as i64);
                self.metrics
                    .demand
                    .get_or_create(&labels)
                    .set(ent.demand(slot)[d].min(i64::MAX as u64) as i64);
            }
        }
        self.metrics
            .hosts_up
            .set(self.engine.hosts().in_state(HostState::Up).len() as i64);
        self.metrics.jobs.set(self.jobs.len() as i64);
    }

    // ------------------------------------------------------------ commands

    /// Answers a read after this iteration's commit, so that it never shows
    /// a change that is not durable yet.
    fn defer_read<T: Send + 'static>(&mut self, reply: Reply<T>, value: Result<T, Status>) {
        self.deferred.push(Box::new(move || {
            let _ = reply.send(value);
        }));
    }

    fn defer<T: Send + 'static>(&mut self, reply: Reply<T>, value: Result<T, Status>) {
        match value {
            // Errors change nothing: answer at once.
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok(v) => self.deferred.push(Box::new(move || {
                let _ = reply.send(Ok(v));
            })),
        }
    }

    fn handle(&mut self, c: Command) {
        match c {
            Command::CreatePool {
                path,
                config,
                reply,
            } => {
                let r = self.create_pool(&path, config);
                self.defer(reply, r);
            }
            Command::UpdatePool {
                path,
                config,
                version,
                reply,
            } => {
                let r = self.update_pool(&path, config, version);
                self.defer(reply, r);
            }
            Command::DeletePool {
                path,
                version,
                reply,
            } => {
                let r = self.delete_pool(&path, version);
                self.defer(reply, r);
            }
            Command::GetPool { path, reply } => {
                let r = self
                    .engine
                    .resources()
                    .tree()
                    .resolve(&path)
                    .map_err(pool_error)
                    .map(|id| self.pool_to_pb(id));
                self.defer_read(reply, r);
            }
            Command::ListPools { reply } => {
                let tree = self.engine.resources().tree();
                let mut ids = tree.list();
                ids.sort_by(|a, b| tree.path(*a).cmp(tree.path(*b)));
                let pools = ids.into_iter().map(|id| self.pool_to_pb(id)).collect();
                self.defer_read(reply, Ok(pools));
            }
            Command::CreateJob { spec, plan, reply } => {
                let r = self.create_job(*spec, *plan);
                self.defer(reply, r);
            }
            Command::GetJob { id, reply } => {
                let r = self.job_key(&id).map(|k| job_to_pb(&self.jobs[&k]));
                self.defer_read(reply, r);
            }
            Command::QueryJobs { request, reply } => {
                let r = self.query_jobs(&request);
                self.defer_read(reply, r);
            }
            Command::JobAction {
                id,
                version,
                action,
                reply,
            } => {
                let r = self.job_action(&id, version, action);
                self.defer(reply, r);
            }
            Command::ListTasks { request, reply } => {
                let r = self.list_tasks(&request);
                self.defer_read(reply, r);
            }
            Command::GetTask {
                job_id,
                instance,
                reply,
            } => {
                let r = self.get_task(&job_id, instance);
                self.defer_read(reply, r);
            }
            Command::TaskAction {
                job_id,
                instances,
                version,
                restart,
                reply,
            } => {
                let r = self.task_action(&job_id, &instances, version, restart);
                self.defer(reply, r);
            }
            Command::ListHosts { request, reply } => {
                let r = Ok(self.list_hosts(&request));
                self.defer_read(reply, r);
            }
            Command::Maintenance {
                hosts,
                start,
                reply,
            } => {
                let r = self.maintenance(&hosts, start);
                self.defer(reply, r);
            }
            Command::Watch { reply } => {
                // Committed revision: events of this iteration are not yet
                // committed and will be broadcast after the commit.
                let committed = self.revision - self.events.len() as u64;
                let _ = reply.send((committed, self.events_tx.subscribe()));
            }
            Command::AgentRegister {
                registration,
                reply,
            } => {
                let r = self.agent_registered(*registration);
                self.defer(reply, r);
            }
            Command::AgentReports { host, reports } => self.agent_reports(&host, reports),
            Command::AgentGone { host, session } => self.agent_gone(&host, session),
            Command::LogTarget {
                job_id,
                instance,
                run_id,
                reply,
            } => {
                let r = self.log_target(&job_id, instance, run_id);
                self.defer_read(reply, r);
            }
            Command::Shutdown => {}
        }
    }

    fn pool_row(&mut self, id: PoolId) {
        let pool = self.pool_to_pb(id);
        self.batch
            .pools
            .push((pool.path.clone(), Some(pool.encode_to_vec())));
    }

    fn create_pool(&mut self, path: &str, config: PoolConfig) -> Result<pb::Pool, Status> {
        let id = self
            .engine
            .resources_mut()
            .create_pool(path, config)
            .map_err(pool_error)?;
        self.pool_versions.insert(path.to_string(), 1);
        self.pool_row(id);
        self.needs_cycle = true;
        Ok(self.pool_to_pb(id))
    }

    fn check_pool_version(&self, path: &str, version: u64) -> Result<PoolId, Status> {
        let id = self
            .engine
            .resources()
            .tree()
            .resolve(path)
            .map_err(pool_error)?;
        let current = self.pool_versions.get(path).copied().unwrap_or(1);
        if version != 0 && version != current {
            return Err(stale(&format!("pool {path}"), version, current));
        }
        Ok(id)
    }

    fn update_pool(
        &mut self,
        path: &str,
        config: PoolConfig,
        version: u64,
    ) -> Result<pb::Pool, Status> {
        let id = self.check_pool_version(path, version)?;
        self.engine
            .resources_mut()
            .update_pool(id, config)
            .map_err(pool_error)?;
        *self.pool_versions.entry(path.to_string()).or_insert(1) += 1;
        self.pool_row(id);
        self.needs_cycle = true;
        Ok(self.pool_to_pb(id))
    }

    fn delete_pool(&mut self, path: &str, version: u64) -> Result<(), Status> {
        let id = self.check_pool_version(path, version)?;
        if let Some(job) = self
            .jobs
            .values()
            .find(|j| j.pool == id && !is_terminal_job(j.state))
        {
            return Err(Status::failed_precondition(format!(
                "pool {path} has the unfinished job {}; kill it first",
                job.id
            )));
        }
        self.engine
            .resources_mut()
            .delete_pool(id)
            .map_err(|e| match e {
                PoolError::HasChildren { .. } | PoolError::HasTasks { .. } => {
                    Status::failed_precondition(e.to_string())
                }
                PoolError::InvalidPath { .. } if path == "/" => {
                    Status::failed_precondition(e.to_string())
                }
                e => pool_error(e),
            })?;
        self.pool_versions.remove(path);
        self.batch.pools.push((path.to_string(), None));
        self.metrics.forget_pool(path);
        self.needs_cycle = true;
        Ok(())
    }

    fn pool_to_pb(&self, id: PoolId) -> pb::Pool {
        let rm = self.engine.resources();
        let tree = rm.tree();
        let path = tree.path(id).to_string();
        let usage = rm.usage(id).expect("live pool");
        let ent = rm.entitlements();
        let slot = id.idx();
        let alloc = usage
            .allocation
            .total
            .saturating_add(&usage.allocation.revocable);
        pb::Pool {
            spec: Some(convert::pool_spec_to_pb(tree.config(id))),
            status: Some(pb::PoolStatus {
                entitlement: Some(convert::resources_to_pb(ent.entitlement(slot))),
                allocation: Some(convert::resources_to_pb(alloc)),
                demand: Some(convert::resources_to_pb(ent.demand(slot))),
                pending_tasks: usage.n_queued,
                running_tasks: usage.allocation.n_tasks,
            }),
            version: self.pool_versions.get(&path).copied().unwrap_or(1),
            children: tree
                .children(id)
                .map(|c| tree.path(c).to_string())
                .collect(),
            path,
        }
    }

    fn job_key(&self, id: &str) -> Result<u32, Status> {
        self.by_id
            .get(id)
            .copied()
            .ok_or_else(|| Status::not_found(format!("job {id} not found")))
    }

    fn resolve_job_pool(&self, path: &str) -> Result<PoolId, Status> {
        let tree = self.engine.resources().tree();
        let id = tree
            .resolve(path)
            .map_err(|e| Status::not_found(format!("spec.pool: {e}")))?;
        if !tree.is_leaf(id) {
            return Err(convert::invalid(
                "spec.pool",
                format!("{path} has child pools; jobs go to leaf pools"),
            ));
        }
        Ok(id)
    }

    fn create_job(&mut self, spec: pb::JobSpec, plan: JobPlan) -> Result<pb::Job, Status> {
        let pool = self.resolve_job_pool(&spec.pool)?;
        let id: Arc<str> = Arc::from(uuid::Uuid::new_v4().to_string());
        let key = self.next_key;
        self.next_key += 1;
        let n = spec.instance_count;
        let mut entry = JobEntry {
            id: id.clone(),
            spec,
            plan,
            pool,
            version: 1,
            state: pb::JobState::Initialized,
            created_at: self.now,
            completed_at: 0,
            kill_requested: false,
            tasks: (0..n).map(|_| TaskEntry::new(self.now)).collect(),
            counts: [0; N_STATES],
            waiting: (0..n).collect(),
            active: 0,
            held: 0,
        };
        entry.counts[S::Initialized as usize] = n;
        self.jobs.insert(key, entry);
        self.by_id.insert(id, key);
        // Queue what the job may queue now; if the engine refuses the very
        // first gang (queues full), the job is refused and leaves no trace.
        let before = self.revision;
        let events_before = self.events.len();
        self.fill(key);
        let job = &self.jobs[&key];
        if job.active == 0 && !job.waiting.is_empty() {
            let reason = job.tasks[job.waiting[0] as usize]
                .reason
                .as_deref()
                .unwrap_or("the engine refused the job")
                .to_string();
            self.jobs.remove(&key);
            self.by_id.retain(|_, &mut v| v != key);
            self.events.truncate(events_before);
            self.revision = before;
            self.dirty_jobs.remove(&key);
            return Err(Status::resource_exhausted(reason));
        }
        self.dirty_jobs.insert(key);
        self.metrics.tasks_accepted.inc_by(u64::from(n));
        self.metrics.jobs.set(self.jobs.len() as i64);
        self.derive_job_states();
        Ok(job_to_pb(&self.jobs[&key]))
    }

    fn job_action(
        &mut self,
        id: &str,
        version: u64,
        action: JobAction,
    ) -> Result<Option<pb::Job>, Status> {
        let k = self.job_key(id)?;
        let job = &self.jobs[&k];
        if version != 0 && version != job.version {
            return Err(stale(&format!("job {id}"), version, job.version));
        }
        let n = job.tasks.len() as u32;
        match action {
            JobAction::Kill => {
                if is_terminal_job(job.state) {
                    // Nothing runs: killing changes nothing.
                    return Ok(Some(job_to_pb(job)));
                }
                let job = self.jobs.get_mut(&k).expect("live");
                job.kill_requested = true;
                // Waiting instances end without a search each.
                let waiting = std::mem::take(&mut job.waiting);
                for &i in &waiting {
                    self.transition(k, i, S::Killed, Some("job killed"));
                }
                for i in 0..n {
                    self.end_run(k, i, S::Killed, "job killed");
                }
            }
            JobAction::Delete => {
                if !is_terminal_job(job.state) {
                    return Err(Status::failed_precondition(format!(
                        "job {id} is {}; kill it before deleting it",
                        job.state.as_str_name()
                    )));
                }
                let job = self.jobs.remove(&k).expect("live");
                self.by_id.remove(id);
                self.revision += 1;
                self.events
                    .push(job_event(self.revision, self.now, &job, true));
                self.dirty_jobs.remove(&k);
                self.need_fill.remove(&k);
                self.deleted_jobs.push(job.id.to_string());
                self.metrics.jobs.set(self.jobs.len() as i64);
                return Ok(None);
            }
            JobAction::Scale(count) => {
                if count == 0 {
                    return Err(convert::invalid(
                        "instance_count",
                        "must be at least 1 (kill the job to stop it)",
                    ));
                }
                if count > self.config.limits.max_instances_per_job {
                    return Err(convert::invalid(
                        "instance_count",
                        format!(
                            "{count} is more than the limit of {} instances per job",
                            self.config.limits.max_instances_per_job
                        ),
                    ));
                }
                if job.kill_requested {
                    return Err(Status::failed_precondition(format!(
                        "job {id} was killed; restart it first"
                    )));
                }
                if count < job.plan.gang {
                    return Err(convert::invalid(
                        "instance_count",
                        format!("{count} is less than the gang size {}", job.plan.gang),
                    ));
                }
                if count > n {
                    self.check_job_pool(k)?;
                }
                if count < n {
                    let job = self.jobs.get_mut(&k).expect("live");
                    let gone: Vec<u32> = job
                        .waiting
                        .iter()
                        .copied()
                        .filter(|&w| w >= count)
                        .collect();
                    job.waiting.retain(|&w| w < count);
                    for i in gone {
                        self.transition(k, i, S::Killed, Some("job scaled down"));
                    }
                    for i in count..n {
                        self.end_run(k, i, S::Killed, "job scaled down");
                        if let Some(h) = self.held.get_mut(&(k, i)) {
                            h.restart = false;
                        }
                    }
                    let job = self.jobs.get_mut(&k).expect("live");
                    for t in job.tasks.drain(count as usize..) {
                        job.counts[t.state as usize] -= 1;
                    }
                    // Overrides of removed instances go with them (a stored
                    // spec must stay valid).
                    job.spec.overrides.retain(|o| o.instance < count);
                    job.plan.overrides.retain(|&i, _| i < count);
                    let id = job.id.clone();
                    for i in count..n {
                        self.batch.tasks.push(((id.clone(), i), None));
                    }
                } else {
                    let job = self.jobs.get_mut(&k).expect("live");
                    for i in n..count {
                        job.tasks.push(TaskEntry::new(self.now));
                        job.counts[S::Initialized as usize] += 1;
                        job.waiting.push_back(i);
                    }
                    self.metrics.tasks_accepted.inc_by(u64::from(count - n));
                    self.need_fill.insert(k);
                }
                self.jobs.get_mut(&k).expect("live").spec.instance_count = count;
            }
            JobAction::Restart => {
                self.check_job_pool(k)?;
                self.jobs.get_mut(&k).expect("live").kill_requested = false;
                for i in 0..n {
                    self.restart_instance(k, i);
                }
            }
        }
        let job = self.jobs.get_mut(&k).expect("live");
        job.version += 1;
        self.dirty_jobs.insert(k);
        self.derive_job_states();
        Ok(Some(job_to_pb(&self.jobs[&k])))
    }

    /// Makes sure the job's pool still exists (it may have been deleted
    /// while the job was finished, and maybe created again).
    fn check_job_pool(&mut self, k: u32) -> Result<(), Status> {
        let job = &self.jobs[&k];
        let tree = self.engine.resources().tree();
        if !tree.contains(job.pool) || tree.path(job.pool) != job.spec.pool {
            let pool = self.resolve_job_pool(&job.spec.pool.clone())?;
            self.jobs.get_mut(&k).expect("live").pool = pool;
        }
        Ok(())
    }

    /// A new run of an instance (the current one is killed first). An
    /// instance still waiting (Initialized) keeps its place.
    fn restart_instance(&mut self, k: u32, i: u32) {
        let state = self.jobs[&k].tasks[i as usize].state;
        match state {
            S::Initialized => {
                // Initialized instances are always in `waiting`.
                self.jobs.get_mut(&k).expect("live").tasks[i as usize].failures = 0;
                self.need_fill.insert(k);
                return;
            }
            S::Failed | S::Succeeded | S::Killed => {}
            _ => {
                if !self.end_run(k, i, S::Killed, "restarted") {
                    // It was only queued and now waits again.
                    self.jobs.get_mut(&k).expect("live").tasks[i as usize].failures = 0;
                    return;
                }
            }
        }
        self.jobs.get_mut(&k).expect("live").tasks[i as usize].failures = 0;
        self.new_run(k, i);
    }

    fn task_action(
        &mut self,
        job_id: &str,
        instances: &[u32],
        version: u64,
        restart: bool,
    ) -> Result<(), Status> {
        let k = self.job_key(job_id)?;
        let current = self.jobs[&k].version;
        if version != 0 && version != current {
            return Err(stale(&format!("job {job_id}"), version, current));
        }
        let n = self.jobs[&k].tasks.len() as u32;
        if instances.is_empty() {
            return Err(convert::invalid("instances", "name at least one instance"));
        }
        if let Some(&bad) = instances.iter().find(|&&i| i >= n) {
            return Err(Status::not_found(format!(
                "job {job_id} has no instance {bad} (it has {n})"
            )));
        }
        if restart && self.jobs[&k].kill_requested {
            return Err(Status::failed_precondition(format!(
                "job {job_id} was killed; restart the job instead"
            )));
        }
        if restart {
            self.check_job_pool(k)?;
        }
        // Checks done: from here the request changes the job.
        self.jobs.get_mut(&k).expect("live").version += 1;
        self.dirty_jobs.insert(k);
        if restart {
            for &i in instances {
                self.restart_instance(k, i);
            }
            return Ok(());
        }
        let named: FxHashSet<u32> = instances.iter().copied().collect();
        let job = self.jobs.get_mut(&k).expect("live");
        let waiting: Vec<u32> = job
            .waiting
            .iter()
            .copied()
            .filter(|w| named.contains(w))
            .collect();
        job.waiting.retain(|w| !named.contains(w));
        for i in waiting {
            self.transition(k, i, S::Killed, Some("killed by request"));
        }
        for &i in &named {
            self.end_run(k, i, S::Killed, "killed by request");
        }
        Ok(())
    }

    fn query_jobs(&self, r: &pb::QueryJobsRequest) -> Result<pb::QueryJobsResponse, Status> {
        let page = match r.page_size {
            0 => 100,
            n => n.min(1000),
        } as usize;
        let states: Vec<i32> = r.states.clone();
        let mut out = pb::QueryJobsResponse::default();
        let range = if r.page_token.is_empty() {
            self.by_id.range::<str, _>(..)
        } else {
            self.by_id.range::<str, _>((
                std::ops::Bound::Excluded(r.page_token.as_str()),
                std::ops::Bound::Unbounded,
            ))
        };
        for (id, k) in range {
            let job = &self.jobs[k];
            let s = &job.spec;
            if (!r.pool.is_empty() && s.pool != r.pool)
                || (!states.is_empty() && !states.contains(&(job.state as i32)))
                || (!r.name.is_empty() && !s.name.contains(&r.name))
                || (!r.owner.is_empty() && s.owner != r.owner)
                || r.labels.iter().any(|(k, v)| s.labels.get(k) != Some(v))
            {
                continue;
            }
            if out.jobs.len() == page {
                out.next_page_token = out.jobs.last().map(|j| j.id.clone()).unwrap_or_default();
                break;
            }
            let _ = id;
            out.jobs.push(job_to_pb(job));
        }
        Ok(out)
    }

    fn list_tasks(&self, r: &pb::ListTasksRequest) -> Result<pb::ListTasksResponse, Status> {
        let k = self.job_key(&r.job_id)?;
        let job = &self.jobs[&k];
        let limit = match r.limit {
            0 => 1000,
            n => n.min(10_000),
        } as usize;
        let mut out = pb::ListTasksResponse::default();
        for i in r.from_instance..job.tasks.len() as u32 {
            let t = &job.tasks[i as usize];
            if !r.states.is_empty() && !r.states.contains(&(t.state as i32)) {
                continue;
            }
            if out.tasks.len() == limit {
                out.next_instance = i;
                break;
            }
            let mut task = task_row(t, &self.host_names);
            task.job_id = job.id.to_string();
            task.instance = i;
            if let Some(h) = self.held.get(&(k, i)) {
                task.stopping = true;
                task.restart_when_stopped = h.restart;
            }
            out.tasks.push(task);
        }
        Ok(out)
    }

    fn get_task(&self, job_id: &str, instance: u32) -> Result<pb::Task, Status> {
        let k = self.job_key(job_id)?;
        let job = &self.jobs[&k];
        let Some(t) = job.tasks.get(instance as usize) else {
            return Err(Status::not_found(format!(
                "job {job_id} has no instance {instance} (it has {})",
                job.tasks.len()
            )));
        };
        let mut task = task_row(t, &self.host_names);
        task.job_id = job.id.to_string();
        task.instance = instance;
        task.pending_reason = self.pending_reason(job, instance, t);
        if let Some(h) = self.held.get(&(k, instance)) {
            task.stopping = true;
            task.restart_when_stopped = h.restart;
        }
        Ok(task)
    }

    fn pending_reason(&self, job: &JobEntry, instance: u32, t: &TaskEntry) -> String {
        let report = self.engine.report();
        match t.state {
            S::Initialized => {
                if let Some(r) = &t.reason {
                    r.to_string()
                } else if job.plan.max_running != 0 && job.active >= job.plan.max_running {
                    format!(
                        "waiting: the job already has max_running_instances {} tasks queued or running",
                        job.plan.max_running
                    )
                } else {
                    format!(
                        "waiting to be queued with its gang of {} (instances are queued gang by gang)",
                        job.plan.gang
                    )
                }
            }
            S::Pending => {
                let tmpl = job.plan.template(instance);
                let class = TaskClass::of(TaskFlags {
                    preemptible: job.plan.preemptible,
                    controller: tmpl.controller,
                    revocable: tmpl.revocable,
                });
                report
                    .admission
                    .blocked
                    .iter()
                    .find(|b| b.pool == job.pool && Ok(b.class) == class)
                    .map_or_else(
                        || "queued for admission; the next cycle decides".to_string(),
                        |b| format!("not admitted: {b}"),
                    )
            }
            S::Ready | S::Placing => t
                .handle
                .and_then(|h| report.placement.unplaced.iter().find(|u| u.task == h))
                .map_or_else(
                    || "admitted; waiting for placement".to_string(),
                    |u| {
                        format!(
                            "not placed: {}",
                            report
                                .placement
                                .reason_of(u)
                                .describe(self.engine.hosts(), self.engine.constraints())
                        )
                    },
                ),
            S::Backoff => format!(
                "restarting after failure {} ({})",
                t.failures,
                t.reason.as_deref().unwrap_or("")
            ),
            _ => String::new(),
        }
    }

    fn list_hosts(&self, r: &pb::ListHostsRequest) -> pb::ListHostsResponse {
        let limit = match r.limit {
            0 => 1000,
            n => n.min(10_000),
        } as usize;
        let hosts = self.engine.hosts();
        let mut names: Vec<(&str, u32)> = hosts
            .live_hosts()
            .iter()
            .map(|slot| {
                let id = hosts.lookup_slot(slot as usize).expect("live");
                (hosts.name(id), slot)
            })
            .filter(|(name, _)| r.after.is_empty() || *name > r.after.as_str())
            .collect();
        names.sort_unstable();
        let mut more = names.len() > limit;
        names.truncate(limit);
        // A page also ends once its hosts hold this many tasks (at least one
        // host per page), so that it stays far below the message limit.
        const MAX_TASK_REFS: usize = 100_000;
        let mut load = vec![0usize; hosts.n_slots()];
        for v in self.engine.tasks().placed_views() {
            load[v.host as usize] += 1;
        }
        let mut refs = 0;
        let mut end = names.len();
        for (n, &(_, slot)) in names.iter().enumerate() {
            if n > 0 && refs + load[slot as usize] > MAX_TASK_REFS {
                end = n;
                more = true;
                break;
            }
            refs += load[slot as usize];
        }
        names.truncate(end);
        let in_page: FxHashSet<u32> = names.iter().map(|&(_, slot)| slot).collect();
        let mut tasks: FxHashMap<u32, Vec<pb::TaskRef>> = FxHashMap::default();
        for v in self.engine.tasks().placed_views() {
            if !in_page.contains(&v.host) {
                continue;
            }
            if let Some(Some((k, i))) = self.owners.get(v.task.idx()) {
                tasks.entry(v.host).or_default().push(pb::TaskRef {
                    job_id: self.jobs[k].id.to_string(),
                    instance: *i,
                });
            }
        }
        let mut out = pb::ListHostsResponse::default();
        for &(name, slot) in &names {
            let id = hosts.lookup_slot(slot as usize).expect("live");
            out.hosts.push(pb::Host {
                name: name.to_string(),
                capacity: Some(convert::resources_to_pb(hosts.capacity(slot as usize))),
                free: Some(convert::resources_to_pb(hosts.free(slot as usize))),
                state: match hosts.state(id) {
                    HostState::Up => pb::HostState::Up,
                    HostState::Draining => pb::HostState::Draining,
                    HostState::Down => pb::HostState::Down,
                } as i32,
                attributes: hosts::host_attributes(hosts, slot),
                tasks: tasks.remove(&slot).unwrap_or_default(),
                connected: self.agent_hosts.get(&slot).is_some_and(|h| h.connected),
                last_seen_ms: self
                    .hub
                    .as_ref()
                    .and_then(|hub| hub.last_seen(name))
                    .unwrap_or(0),
                isolation: match self.agent_hosts.get(&slot) {
                    Some(h) => h.isolation.clone(),
                    None => "simulated".into(),
                },
            });
        }
        if more {
            out.next_after = names.last().map(|(n, _)| n.to_string()).unwrap_or_default();
        }
        out
    }

    fn maintenance(&mut self, names: &[String], start: bool) -> Result<(), Status> {
        if names.is_empty() {
            return Err(convert::invalid("hosts", "name at least one host"));
        }
        let mut ids = Vec::new();
        for n in names {
            let id = self
                .engine
                .hosts()
                .lookup(n)
                .ok_or_else(|| Status::not_found(format!("host {n} not found")))?;
            ids.push(id);
        }
        for (id, name) in ids.into_iter().zip(names) {
            let slot = id.idx() as u32;
            if start {
                if self.maintenance.insert(slot) {
                    self.engine
                        .hosts_mut()
                        .set_state(id, HostState::Draining)
                        .map_err(|e| Status::internal(e.to_string()))?;
                }
                let mut on_it: Vec<(u32, u32)> = self.instances_on(slot);
                on_it.extend(self.orphans.get(&slot).into_iter().flatten().copied());
                let reason = format!("host {name} drained for maintenance");
                for (k, i) in on_it {
                    if self.end_run(k, i, S::Preempted, &reason) {
                        self.new_run(k, i);
                    }
                }
                // Down once every run there is confirmed gone (at once if
                // none is left).
                self.check_drained(slot);
            } else {
                self.maintenance.remove(&slot);
                let connected = self.agent_hosts.get(&slot).is_none_or(|h| h.connected);
                let state = if connected {
                    HostState::Up
                } else {
                    // Up when its agent registers.
                    HostState::Down
                };
                self.engine
                    .hosts_mut()
                    .set_state(id, state)
                    .map_err(|e| Status::internal(e.to_string()))?;
            }
            self.host_row(slot);
        }
        self.needs_cycle = true;
        Ok(())
    }
}

fn is_terminal_job(s: pb::JobState) -> bool {
    matches!(
        s,
        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Killed
    )
}

/// The name of the host in `slot` ("" for none).
fn host_name(host_names: &[Arc<str>], slot: u32) -> String {
    if slot == NO_HOST {
        String::new()
    } else {
        host_names[slot as usize].to_string()
    }
}

fn job_event(revision: u64, time_ms: u64, job: &JobEntry, deleted: bool) -> pb::Event {
    pb::Event {
        revision,
        time_ms,
        kind: Some(pb::event::Kind::Job(pb::JobEvent {
            job_id: job.id.to_string(),
            state: job.state as i32,
            deleted,
        })),
    }
}

fn task_run(t: &TaskEntry, host_names: &[Arc<str>]) -> pb::TaskRun {
    pb::TaskRun {
        run_id: t.run,
        state: t.state as i32,
        host: host_name(host_names, t.host),
        created_at_ms: t.created_at,
        placed_at_ms: t.placed_at,
        started_at_ms: t.started_at,
        finished_at_ms: t.finished_at,
        exit_code: t.exit_code,
        reason: t.reason.as_deref().unwrap_or_default().to_string(),
        launch_id: t.seq,
    }
}

/// The engine task of instance `i` of job `k`.
fn new_task(job: &JobEntry, k: u32, i: u32) -> NewTask {
    let t = job.plan.template(i);
    NewTask {
        job: k,
        instance: i,
        pool: job.pool,
        priority: job.plan.priority,
        request: t.request,
        ports: t.ports,
        flags: TaskFlags {
            preemptible: job.plan.preemptible,
            controller: t.controller,
            revocable: t.revocable,
        },
        constraint: t.constraint.clone(),
        strategy: job.plan.strategy,
        max_per_host: t.max_per_host,
        limit_key: k,
    }
}

/// The spec an instance runs: its override, or the job's default task.
fn instance_spec(spec: &pb::JobSpec, instance: u32) -> &pb::TaskSpec {
    static EMPTY: std::sync::OnceLock<pb::TaskSpec> = std::sync::OnceLock::new();
    spec.overrides
        .iter()
        .find(|o| o.instance == instance)
        .and_then(|o| o.spec.as_ref())
        .or(spec.default_task.as_ref())
        .unwrap_or_else(|| EMPTY.get_or_init(pb::TaskSpec::default))
}

fn task_row(t: &TaskEntry, host_names: &[Arc<str>]) -> pb::Task {
    pb::Task {
        job_id: String::new(),
        instance: 0,
        current: Some(task_run(t, host_names)),
        failure_count: t.failures,
        pending_reason: String::new(),
        history: t.history.as_deref().cloned().unwrap_or_default(),
        // Set from the loop's held runs where it matters (rows, reads).
        stopping: false,
        restart_when_stopped: false,
    }
}

fn job_to_pb(job: &JobEntry) -> pb::Job {
    pb::Job {
        id: job.id.to_string(),
        spec: Some(job.spec.clone()),
        status: Some(pb::JobStatus {
            state: job.state as i32,
            created_at_ms: job.created_at,
            completed_at_ms: job.completed_at,
            task_counts: job
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(s, c)| pb::StateCount {
                    state: s as i32,
                    count: *c,
                })
                .collect(),
            kill_requested: job.kill_requested,
        }),
        version: job.version,
    }
}
