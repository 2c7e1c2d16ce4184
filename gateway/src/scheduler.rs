//! The shell around the lifecycle core: one thread owns the engine, the
//! core, the host backend and the store's write side.
//!
//! gRPC handlers send [`Command`]s over a bounded channel (a full channel
//! makes senders wait: backpressure) and await a reply. One iteration:
//! 1. wait for a command or the next deadline (cycle, timer, simulated run
//!    end), then drain up to `max_batch` commands;
//! 2. turn each into a core [`Input`] and [`Lifecycle::step`] it (reads are
//!    answered from the core's state);
//! 3. step a cycle if one is due, the simulator's updates, the timers and
//!    the lost hosts;
//! 4. write the effects' rows and events in one store transaction, then
//!    dispatch launches, kills and acknowledgements, answer, and publish
//!    the events.
//!
//! A failed commit (a full disk) does not stop the process: the batch and
//! everything that waits for it (answers, launches, kills, acknowledgements,
//! events) are kept and the commit is tried again with a back-off; until it
//! lands nothing is stepped, mutating commands are refused at once with
//! UNAVAILABLE, reads are answered from memory, agents' heartbeats go on and
//! their reports are held ([`Outage`]). The clock is read here and passed
//! in.

mod access;
mod apps;
mod hostpools;
mod persist;
pub(crate) use persist::decode_event_row;
mod reads;
mod secrets;

use std::sync::Arc;
use std::time::{Duration, Instant};

use peloton_engine::{Engine, PoolConfig};
use peloton_proto::v1 as pb;
use rustc_hash::FxHashMap;
use tokio::sync::{broadcast, mpsc, oneshot};
use tonic::Status;

use crate::agents::{Outbox, Registration};
use crate::backend::{HostBackend, Kill, Launch, TaskUpdate};
use crate::convert::{self, JobPlan, Limits};
use crate::lifecycle::Error;
use crate::lifecycle::{
    Answer, CoreConfig, Effects, HostRegistration, Input, JobKey, Lifecycle, RunPhase, RunReport,
};
use crate::metrics::Metrics;
use crate::refused::Refused;
use crate::store::{Snapshot, Store, WriteBatch};

pub use crate::lifecycle::JobAction;

/// A reply channel.
pub type Reply<T> = oneshot::Sender<Result<T, Status>>;

pub use apps::AppCommand;

/// Events of one commit, as published to watchers.
pub type EventBatch = Arc<Vec<pb::Event>>;

/// A request to the loop.
#[derive(Debug)]
pub enum Command {
    /// An application command.
    App(AppCommand),
    /// Create a token (the caller, name and grants are checked).
    CreateToken {
        /// As listed (its creation time is set here).
        token: pb::Token,
        /// Its secret's digest.
        digest: crate::access::Digest32,
        /// Reply.
        reply: Reply<pb::Token>,
    },
    /// Revoke a token.
    RevokeToken {
        /// Its name.
        name: String,
        /// Reply.
        reply: Reply<()>,
    },
    /// Record a client certificate (signed by the handler) with a token.
    IssueCertificate {
        /// The token's name.
        name: String,
        /// Its fingerprint and expiry (the issue time is set here).
        certificate: pb::TokenCertificate,
        /// Reply.
        reply: Reply<pb::TokenCertificate>,
    },
    /// Forget one client certificate of a token.
    RevokeCertificate {
        /// The token's name.
        name: String,
        /// The certificate's fingerprint.
        fingerprint: crate::access::Digest32,
        /// Reply.
        reply: Reply<()>,
    },
    /// List the stored tokens.
    ListTokens {
        /// Reply.
        reply: Reply<Vec<pb::Token>>,
    },
    /// Append to the audit log (its sequence number and time are set here).
    Audit(Box<pb::AuditEntry>),
    /// Read the audit log.
    ListAudit {
        /// Filters.
        request: pb::ListAuditRequest,
        /// Reply.
        reply: Reply<pb::ListAuditResponse>,
    },
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
    /// Read a page of pools.
    ListPools {
        /// The page.
        request: pb::ListPoolsRequest,
        /// Only the pools this caller may read (none: all).
        viewer: Option<Arc<crate::access::Caller>>,
        /// Reply.
        reply: Reply<pb::ListPoolsResponse>,
    },
    /// Read the first entries of a pool's queues in admission order.
    ListQueue {
        /// Path.
        path: String,
        /// At most this many (0: the default; checked by the service).
        limit: u32,
        /// Reply.
        reply: Reply<pb::ListQueueResponse>,
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
        /// Only the jobs this caller may read (none: all).
        viewer: Option<Arc<crate::access::Caller>>,
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
    /// Create a host pool.
    CreateHostPool {
        /// Validated name.
        name: String,
        /// Reply.
        reply: Reply<pb::HostPool>,
    },
    /// Delete a host pool.
    DeleteHostPool {
        /// Name.
        name: String,
        /// Reply.
        reply: Reply<()>,
    },
    /// A page of host pools with their hosts.
    ListHostPools {
        /// Page.
        request: pb::ListHostPoolsRequest,
        /// Reply.
        reply: Reply<pb::ListHostPoolsResponse>,
    },
    /// Move hosts into a host pool.
    MoveHosts {
        /// Host names.
        hosts: Vec<String>,
        /// The host pool.
        to: String,
        /// Reply.
        reply: Reply<()>,
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
        /// Host name.
        host: Arc<str>,
        /// The session they came on: reports of a session that was
        /// replaced are dropped (a newer registration of the same agent
        /// listed its runs again; another agent's runs are not the host's).
        session: u64,
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
    /// Start a rolling update.
    UpdateJob {
        /// Job id.
        job_id: String,
        /// Expected job version (0: any).
        version: u64,
        /// The new spec as sent.
        spec: Box<pb::JobSpec>,
        /// Validated.
        plan: Box<JobPlan>,
        /// How to roll.
        update: crate::lifecycle::UpdateSpec,
        /// Reply: the update and the job.
        reply: Reply<(pb::Update, pb::Job)>,
    },
    /// Read an update.
    GetUpdate {
        /// Update id.
        id: String,
        /// Reply.
        reply: Reply<pb::Update>,
    },
    /// A job's updates, newest first.
    ListUpdates {
        /// Job id.
        job_id: String,
        /// Reply.
        reply: Reply<Vec<pb::Update>>,
    },
    /// Pause, resume, abort or roll back an update.
    UpdateAction {
        /// Update id.
        id: String,
        /// What.
        action: crate::lifecycle::UpdateAction,
        /// Reply.
        reply: Reply<pb::Update>,
    },
    /// A page of volumes, filtered by job id and host ("" for any).
    ListVolumes {
        /// Filters and page.
        request: pb::ListVolumesRequest,
        /// Reply.
        reply: Reply<pb::ListVolumesResponse>,
    },
    /// Read a volume.
    GetVolume {
        /// Volume id.
        id: String,
        /// Reply.
        reply: Reply<pb::Volume>,
    },
    /// Delete a volume.
    DeleteVolume {
        /// Volume id.
        id: String,
        /// Reply.
        reply: Reply<()>,
    },
    /// Finish the current batch and stop.
    Shutdown,
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
    /// Least time from one commit to the start of the next iteration that
    /// has commands (see `Config::commit_spacing_ms`).
    pub commit_spacing: Duration,
    /// Request limits.
    pub limits: Limits,
    /// Events kept in the store for resuming watches.
    pub event_retention: u64,
    /// Earlier runs kept per task.
    pub max_history: usize,
    /// An agent host not heard from for this long is lost.
    pub host_lost_after: Duration,
    /// A finished job is removed this long after it finished.
    pub job_retention: Duration,
    /// At most this many finished jobs are kept (the oldest go first).
    pub max_finished_jobs: usize,
    /// A client-mode application not heard from for this long is
    /// unregistered.
    pub app_lease: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            cycle_interval: Duration::from_millis(2),
            idle_cycle_interval: Duration::from_millis(1000),
            max_batch: 1024,
            commit_spacing: Duration::ZERO,
            limits: Limits::default(),
            event_retention: 5_000_000,
            max_history: 8,
            host_lost_after: Duration::from_secs(10),
            job_retention: Duration::from_millis(CoreConfig::default().retention_ms),
            max_finished_jobs: CoreConfig::default().max_finished_jobs,
            app_lease: Duration::from_secs(60),
        }
    }
}

/// An iteration at least this long is logged with its phases.
const SLOW_ITERATION: Duration = Duration::from_millis(250);

/// Least time between the starts of two cycles. While work arrives
/// (`wanted`): the configured interval, or twice the last cycle's length if
/// longer, so that cycles take at most half of the loop's time, however
/// long they get. Otherwise the idle interval (or that, if longer).
fn cycle_spacing(
    interval: Duration,
    last_took: Duration,
    wanted: bool,
    idle: Duration,
) -> Duration {
    let busy = interval.max(last_took.saturating_mul(2));
    if wanted { busy } else { idle.max(busy) }
}

pub(crate) use crate::clock::now_ms;

/// Most events whose list's room an iteration keeps for the next.
const KEPT_EVENT_ROOM: usize = 1 << 18;

/// Agents of a restarted server need time to notice and reconnect (their
/// back-off reaches 5 s).
const RECONNECT_SLACK_MS: u64 = 10_000;
/// How often silent hosts are looked for.
const LOST_CHECK_INTERVAL_MS: u64 = 500;
/// First wait before a failed commit is tried again; it doubles up to
/// [`RETRY_COMMIT_MAX_MS`].
const RETRY_COMMIT_FIRST_MS: u64 = 100;
/// Longest wait between two tries of a failed commit: writes resume at
/// most this long after space returns.
const RETRY_COMMIT_MAX_MS: u64 = 2_000;
/// Agents' run reports held while the store cannot write (a message
/// carries at most `agents::MAX_REPORTS_PER_MESSAGE`). Past it a message's
/// reports are dropped and its agent's session closed: the agent registers
/// again, listing its runs, once the store writes.
const MAX_HELD_REPORTS: usize = 100_000;

/// While a commit has failed (see the module documentation).
#[derive(Debug, Default)]
struct Outage {
    /// The failed commit, kept until a retry writes it (`Scheduler::batch`
    /// holds its rows, `fx` and `deferred` what waits for it).
    failed: Option<FailedCommit>,
    /// Agent commands that came meanwhile (reports, goodbyes), applied
    /// once the batch is written.
    held: Vec<Command>,
    /// Reports in `held`.
    held_reports: usize,
    /// Applications heard from meanwhile: their leases are renewed once
    /// the batch is written (at most [`MAX_HELD_REPORTS`]).
    heard: std::collections::BTreeSet<String>,
}

impl Outage {
    /// An application heard from while the store cannot write.
    fn hold_heard(&mut self, id: &str) {
        if self.heard.len() < MAX_HELD_REPORTS {
            self.heard.insert(id.to_string());
        }
    }
}

#[derive(Debug)]
struct FailedCommit {
    /// The batch's events, published once it is written.
    events: Vec<crate::lifecycle::Event>,
    /// The last error.
    error: String,
    since_ms: u64,
    attempts: u64,
    delay_ms: u64,
    next_try_ms: u64,
}

type Deferred = Box<dyn FnOnce() + Send>;

/// A job's specs by config version.
pub(crate) type Specs = std::collections::BTreeMap<u64, pb::JobSpec>;

/// The loop's state. Create with [`Scheduler::new`], then [`Scheduler::run`]
/// on its own thread.
pub struct Scheduler {
    engine: Engine,
    core: Lifecycle,
    store: Arc<dyn Store>,
    backend: Box<dyn HostBackend>,
    config: LoopConfig,
    metrics: Arc<Metrics>,
    /// Job specs as users sent them, by config version (the core keeps
    /// their plans).
    specs: FxHashMap<JobKey, Specs>,
    fx: Effects,
    batch: WriteBatch,
    deferred: Vec<Deferred>,
    events_tx: broadcast::Sender<EventBatch>,
    launches: Vec<Launch>,
    kills: Vec<Kill>,
    updates: Vec<TaskUpdate>,
    /// The hub agents' last-seen times are read from.
    hub: Option<Arc<crate::agents::AgentHub>>,
    started_at: u64,
    /// Whether this server leads (PostgreSQL store): while it does not
    /// (its lease lapsed), agents cannot reach it and no host is declared
    /// lost; they get the reconnect slack of a restart when it leads again.
    leading: Option<tokio::sync::watch::Receiver<bool>>,
    last_lost_check: u64,
    last_trim: u64,
    last_cycle: Option<Instant>,
    /// How long the last cycle took (see [`cycle_spacing`]).
    last_cycle_took: Duration,
    last_pool_metrics: Option<Instant>,
    now: u64,
    /// Set while the store cannot write.
    outage: Outage,
    /// The authentication table tokens are published to (a secure
    /// server's; none: tokens are refused and no audit log is kept).
    shared_access: Option<Arc<crate::access::Access>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("jobs", &self.core.n_jobs())
            .field("revision", &self.core.revision())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A loop over `engine` (simulated hosts already registered),
    /// recovering the store's contents.
    pub fn new(
        mut engine: Engine,
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
        let core_config = CoreConfig {
            max_history: config.max_history,
            max_instances_per_job: config.limits.max_instances_per_job,
            agent_mode: hub.is_some(),
            retention_ms: config.job_retention.as_millis() as u64,
            max_finished_jobs: config.max_finished_jobs,
            app_lease_ms: config.app_lease.as_millis() as u64,
            ..CoreConfig::default()
        };
        let now = now_ms();
        let revision = snapshot.revision;
        let (mut recovered, specs_by_id) = persist::recovered(&snapshot, core_config.agent_mode)?;
        recovered.host_pools = snapshot.host_pools.clone();
        recovered.host_pool_members = snapshot.host_pool_members.clone();
        (recovered.tokens, recovered.audit) = persist::recovered_access(&snapshot)?;
        recovered.secrets = persist::recovered_secrets(&snapshot)?;
        let mut fx = Effects::default();
        let core = Lifecycle::recover(core_config, &mut engine, revision, recovered, now, &mut fx)
            .map_err(|e| anyhow::anyhow!(e))?;
        let mut specs = FxHashMap::default();
        for (id, versions, from_row) in specs_by_id {
            let key = core.job_key(&id).expect("recovered");
            specs.insert(key, versions);
            if let Some(v) = from_row {
                // An older store kept the spec in the job row only: it goes
                // to the configs table before the row loses it.
                fx.rows.push(crate::lifecycle::RowKey::Config(key, v));
            }
        }
        let batch = WriteBatch::default();
        metrics.jobs.set(core.n_jobs() as i64);
        Ok(Scheduler {
            engine,
            core,
            store,
            backend,
            config,
            metrics,
            specs,
            fx,
            batch,
            deferred: Vec::new(),
            events_tx,
            launches: Vec::new(),
            kills: Vec::new(),
            updates: Vec::new(),
            hub,
            started_at: now,
            leading: None,
            last_lost_check: 0,
            last_trim: revision,
            last_cycle: None,
            last_cycle_took: Duration::ZERO,
            last_pool_metrics: None,
            now,
            outage: Outage::default(),
            shared_access: None,
        })
    }

    /// Runs until a [`Command::Shutdown`] or until every sender is gone.
    pub fn run(mut self, mut rx: mpsc::Receiver<Command>, rt: tokio::runtime::Handle) {
        let mut commands = Vec::with_capacity(self.config.max_batch);
        // What recovery changed and the first cycle go in one commit: a
        // restart writes each instance it starts again once.
        let began = Instant::now();
        self.now = now_ms();
        let recovered_at = self.core.revision() - self.fx.events.len() as u64;
        self.work();
        let worked = began.elapsed();
        let (events, rows) = (self.fx.events.len(), self.fx.rows.len());
        self.finish_iteration();
        tracing::info!(
            recovered_revision = recovered_at,
            revision = self.core.revision(),
            events,
            rows,
            work_ms = worked.as_millis() as u64,
            "recovery and the first cycle committed in {} ms",
            began.elapsed().as_millis()
        );
        // When the last iteration with commands committed.
        let mut last_commit = Instant::now();
        loop {
            let wait = self.time_to_next_deadline();
            let first = rt.block_on(async { tokio::time::timeout(wait, rx.recv()).await });
            let mut stop = false;
            match first {
                Ok(Some(c)) => commands.push(c),
                Ok(None) => stop = true,
                Err(_) => {}
            }
            // Group commit: under load, what arrives within the spacing
            // goes in one commit (a lone command after a quiet spell is
            // committed at once).
            let since = last_commit.elapsed();
            if !commands.is_empty() && since < self.config.commit_spacing {
                std::thread::sleep(self.config.commit_spacing - since);
            }
            while commands.len() < self.config.max_batch {
                match rx.try_recv() {
                    Ok(c) => commands.push(c),
                    Err(_) => break,
                }
            }
            self.now = now_ms();
            let began = Instant::now();
            let n_commands = commands.len();
            for c in commands.drain(..) {
                if matches!(c, Command::Shutdown) {
                    stop = true;
                    continue;
                }
                self.handle(c);
            }
            let handled = began.elapsed();
            self.work();
            let worked = began.elapsed();
            self.finish_iteration();
            if n_commands > 0 {
                last_commit = Instant::now();
            }
            let took = began.elapsed();
            if took >= SLOW_ITERATION {
                tracing::info!(
                    commands = n_commands,
                    handle_ms = handled.as_millis() as u64,
                    work_ms = (worked - handled).as_millis() as u64,
                    commit_ms = (took - worked).as_millis() as u64,
                    revision = self.core.revision(),
                    "slow iteration: {} ms",
                    took.as_millis()
                );
            }
            if stop {
                tracing::info!(revision = self.core.revision(), "scheduling loop stopped");
                return;
            }
        }
    }

    /// Least time from one cycle's start to the next's ([`cycle_spacing`]).
    /// The configured interval is a few milliseconds: a freed slot waits
    /// for the next cycle, so short tasks are bound by it.
    fn cycle_spacing(&self) -> Duration {
        cycle_spacing(
            self.config.cycle_interval,
            self.last_cycle_took,
            self.core.wants_cycle(),
            self.config.idle_cycle_interval,
        )
    }

    fn time_to_next_deadline(&self) -> Duration {
        if let Some(failed) = &self.outage.failed {
            // Nothing else moves until the failed batch is written.
            return Duration::from_millis(failed.next_try_ms.saturating_sub(now_ms()));
        }
        let now = Instant::now();
        let mut until = match self.last_cycle {
            None => now,
            Some(last) => last + self.cycle_spacing(),
        };
        let wall = now_ms();
        let mut ms_deadline = self.core.next_deadline();
        if let Some(b) = self.backend.next_deadline() {
            ms_deadline = Some(ms_deadline.map_or(b, |t| t.min(b)));
        }
        if self.hub.is_some() {
            let next = self.last_lost_check + LOST_CHECK_INTERVAL_MS;
            ms_deadline = Some(ms_deadline.map_or(next, |t| t.min(next)));
        }
        if let Some(t) = ms_deadline {
            until = until.min(now + Duration::from_millis(t.saturating_sub(wall)));
        }
        until.saturating_duration_since(now)
    }

    /// Steps an input the loop itself makes (these cannot be refused).
    fn step(&mut self, input: Input) {
        let r = self
            .core
            .step(&mut self.engine, input, self.now, &mut self.fx);
        debug_assert!(r.is_ok(), "{r:?}");
    }

    /// Cycles, backend updates, timers and lost hosts (none while a failed
    /// commit waits for its retry).
    fn work(&mut self) {
        if !self.retry_commit() {
            return;
        }
        let due = match self.last_cycle {
            None => true,
            Some(last) => last.elapsed() >= self.cycle_spacing(),
        };
        if due {
            let start = Instant::now();
            self.step(Input::Cycle);
            self.last_cycle = Some(start);
            self.last_cycle_took = start.elapsed();
            self.metrics
                .cycle_seconds
                .observe(self.last_cycle_took.as_secs_f64());
            self.update_pool_metrics();
        }
        let now_dispatch = !self.backend.dispatch_after_commit();
        if now_dispatch {
            self.dispatch();
        }
        self.now = now_ms();
        self.backend.poll(self.now, &mut self.updates);
        if !self.updates.is_empty() {
            let updates = std::mem::take(&mut self.updates);
            self.step(Input::Updates(updates));
        }
        if self.core.next_deadline().is_some_and(|t| t <= self.now) {
            self.step(Input::Tick);
        }
        self.check_lost_hosts();
        if now_dispatch {
            // Kills issued while applying updates and timers.
            self.dispatch();
        }
    }

    /// Hands the effects' launches and kills to the backend.
    fn dispatch(&mut self) {
        let wants_specs = self.backend.wants_specs();
        for l in self.fx.launches.drain(..) {
            let spec = wants_specs
                .then(|| self.specs.get(&l.run.job).and_then(|s| s.get(&l.config)))
                .flatten()
                .map(|s| Arc::new(reads::instance_spec(s, l.run.instance).clone()));
            let secrets = if wants_specs {
                self.core
                    .secrets_of(l.run.job)
                    .map(|s| secrets::to_pb(s).into())
            } else {
                None
            };
            self.launches.push(Launch {
                run: l.run,
                host: l.host,
                job_id: l.job_id,
                spec,
                secrets,
                sim_duration_ms: l.sim_duration_ms,
                sim_exit_code: l.sim_exit_code,
                volume: l.volume,
            });
        }
        self.kills.append(&mut self.fx.kills);
        self.backend.launch(self.now, &mut self.launches);
        self.backend.kill(self.now, &mut self.kills);
    }

    /// Publishes tokens and jobs' pools to `access` (a secure server):
    /// tokens are created and revoked, and the audit log kept, only then.
    pub fn with_access(mut self, access: Arc<crate::access::Access>) -> Self {
        if access.is_secure() {
            self.attach_access(access);
            self.publish_all_jobs();
        }
        self
    }

    /// Follows whether this server leads (see `leading`).
    pub fn with_leading(mut self, leading: tokio::sync::watch::Receiver<bool>) -> Self {
        self.leading = Some(leading);
        self
    }

    fn check_lost_hosts(&mut self) {
        let Some(hub) = self.hub.clone() else {
            return;
        };
        if let Some(leading) = &self.leading
            && !*leading.borrow()
        {
            self.started_at = self.now;
            return;
        }
        if self.now < self.last_lost_check + LOST_CHECK_INTERVAL_MS {
            return;
        }
        self.last_lost_check = self.now;
        let after = self.config.host_lost_after.as_millis() as u64;
        let floor = self.started_at + RECONNECT_SLACK_MS;
        let mut lost: Vec<(Arc<str>, u64)> = self
            .core
            .watched_agent_hosts()
            .filter_map(|name| {
                let seen = hub.last_seen(name).unwrap_or(floor).max(floor);
                let silent = self.now.saturating_sub(seen);
                (silent > after).then(|| (name.clone(), silent))
            })
            .collect();
        lost.sort_unstable();
        for (host, silent_ms) in lost {
            tracing::warn!(%host, "host lost: no heartbeat for {silent_ms} ms");
            if let Some(a) = self.backend.agents()
                && let Some(s) = a.session(&host).map(|s| s.id)
            {
                a.detach(&host, s);
            }
            self.step(Input::HostLost {
                host,
                silent_ms: after,
            });
        }
    }

    fn finish_iteration(&mut self) {
        if self.outage.failed.is_some() {
            // Nothing was stepped: the failed batch is all there is.
            return;
        }
        let events = std::mem::take(&mut self.fx.events);
        persist::state_rows(&self.core, &mut self.fx.state_rows, &mut self.batch);
        persist::rows(
            &mut self.core,
            &self.engine,
            &mut self.specs,
            &mut self.fx.rows,
            &mut self.batch,
            &self.metrics,
        );
        if !events.is_empty() {
            self.batch.events = Some(persist::encode_events(&events));
            let retention = self.config.event_retention;
            let revision = self.core.revision();
            if revision > self.last_trim + retention / 10 + 1 && revision > retention {
                self.batch.trim_events_before = Some(revision - retention);
                self.last_trim = revision;
            }
        }
        let c = std::mem::take(&mut self.fx.counters);
        self.metrics.placements.inc_by(c.placements);
        self.metrics.placement_failures.inc_by(c.placement_failures);
        self.metrics.runs_finished.inc_by(c.runs_finished);
        self.metrics.preemptions.inc_by(c.preemptions);
        self.metrics.tasks_accepted.inc_by(c.tasks_accepted);
        if !self.batch.is_empty() {
            let start = Instant::now();
            self.batch.revision = self.core.revision();
            if let Err(e) = self.store.commit(&self.batch) {
                // Memory is ahead of the store: keep the batch and all that
                // waits for it, refuse writes, retry (`retry_commit`).
                tracing::error!(
                    error = %e,
                    "store commit failed: writes are refused and the batch is retried until it lands; reads are served"
                );
                let now = now_ms();
                self.outage.failed = Some(FailedCommit {
                    events,
                    error: e.to_string(),
                    since_ms: now,
                    attempts: 1,
                    delay_ms: RETRY_COMMIT_FIRST_MS,
                    next_try_ms: now + RETRY_COMMIT_FIRST_MS,
                });
                self.metrics.store_unwritable.set(1);
                return;
            }
            self.metrics
                .commit_seconds
                .observe(start.elapsed().as_secs_f64());
            self.batch.clear();
        }
        self.release(events);
    }

    /// What waited for a commit, once it is durable: dispatches, answers,
    /// events.
    fn release(&mut self, events: Vec<crate::lifecycle::Event>) {
        // Handlers check a job's pool before they ask the loop anything:
        // they know of a job before its creator hears of it.
        self.publish_jobs(&events);
        self.publish_access();
        // Real hosts hear of launches and kills only once they are durable:
        // a crash before the commit must not leave a run the store does not
        // know (it would run twice), nor a kill it does not know of. (For
        // the simulator these are what is left of the iteration.)
        self.dispatch();
        self.send_acks();
        self.send_volume_deletes();
        for d in self.deferred.drain(..) {
            d();
        }
        if !events.is_empty() {
            // Built only for watchers (a commit may carry a million);
            // no receivers is fine.
            if self.events_tx.receiver_count() > 0 {
                let _ = self
                    .events_tx
                    .send(Arc::new(persist::events_to_pb(&events)));
            }
        }
        // The list's room serves the next iteration's events (up to a
        // bound: one huge commit, a restart's, does not pin its memory).
        if self.fx.events.is_empty()
            && events.capacity() > self.fx.events.capacity()
            && events.capacity() <= KEPT_EVENT_ROOM
        {
            let mut events = events;
            events.clear();
            self.fx.events = events;
        }
    }

    /// Tries the failed commit again once its time has come. True when no
    /// commit is outstanding (any more): then what waited for it has been
    /// released and the agent commands held meanwhile applied.
    fn retry_commit(&mut self) -> bool {
        let Some(failed) = self.outage.failed.as_mut() else {
            return true;
        };
        let now = now_ms();
        if now < failed.next_try_ms {
            return false;
        }
        let start = Instant::now();
        if let Err(e) = self.store.commit(&self.batch) {
            failed.attempts += 1;
            failed.error = e.to_string();
            failed.delay_ms = (failed.delay_ms * 2).min(RETRY_COMMIT_MAX_MS);
            failed.next_try_ms = now + failed.delay_ms;
            // The 1st, 2nd, 4th, 8th... failure: a long outage does not
            // flood the log.
            if failed.attempts.is_power_of_two() {
                tracing::error!(
                    error = %e,
                    attempts = failed.attempts,
                    failing_for_ms = now - failed.since_ms,
                    "the store still cannot write; writes stay refused"
                );
            }
            return false;
        }
        self.metrics
            .commit_seconds
            .observe(start.elapsed().as_secs_f64());
        self.metrics.store_unwritable.set(0);
        self.batch = WriteBatch::default();
        let failed = self.outage.failed.take().expect("outstanding");
        tracing::warn!(
            attempts = failed.attempts,
            failed_for_ms = now - failed.since_ms,
            held_agent_commands = self.outage.held.len(),
            "the store writes again: the failed batch is written, its answers released"
        );
        self.release(failed.events);
        // Agents that went silent meanwhile get the reconnect slack a
        // restart gives them before they are declared lost.
        self.started_at = now;
        self.outage.held_reports = 0;
        for id in std::mem::take(&mut self.outage.heard) {
            let _ = self
                .core
                .step(&mut self.engine, Input::AppHeard { id }, now, &mut self.fx);
        }
        for c in std::mem::take(&mut self.outage.held) {
            self.handle(c);
        }
        true
    }

    /// While the store cannot write: refuses a mutating command at once,
    /// holds an agent's reports or goodbye for later, and gives back a read
    /// (answered from memory).
    fn while_unwritable(&mut self, c: Command) -> Option<Command> {
        fn refuse<T>(reply: Reply<T>, status: &Status) -> Option<Command> {
            let _ = reply.send(Err(status.clone()));
            None
        }
        let failed = self.outage.failed.as_ref().expect("in an outage");
        let status = crate::status::refused(Refused::StoreUnwritable {
            error: failed.error.clone(),
            for_s: self.now.saturating_sub(failed.since_ms) / 1000,
            retry_s: RETRY_COMMIT_MAX_MS / 1000,
        });
        match c {
            Command::CreatePool { reply, .. } | Command::UpdatePool { reply, .. } => {
                refuse(reply, &status)
            }
            Command::DeletePool { reply, .. } => refuse(reply, &status),
            Command::CreateJob { reply, .. } => refuse(reply, &status),
            Command::JobAction { reply, .. } => refuse(reply, &status),
            Command::TaskAction { reply, .. } => refuse(reply, &status),
            Command::CreateHostPool { reply, .. } => refuse(reply, &status),
            Command::DeleteHostPool { reply, .. } => refuse(reply, &status),
            Command::MoveHosts { reply, .. } => refuse(reply, &status),
            Command::Maintenance { reply, .. } => refuse(reply, &status),
            Command::AgentRegister { reply, .. } => refuse(reply, &status),
            Command::UpdateJob { reply, .. } => refuse(reply, &status),
            Command::UpdateAction { reply, .. } => refuse(reply, &status),
            Command::DeleteVolume { reply, .. } => refuse(reply, &status),
            Command::CreateToken { reply, .. } => refuse(reply, &status),
            Command::RevokeToken { reply, .. } => refuse(reply, &status),
            Command::IssueCertificate { reply, .. } => refuse(reply, &status),
            Command::RevokeCertificate { reply, .. } => refuse(reply, &status),
            // Kept for the commit that ends the outage, up to a bound.
            Command::Audit(entry) => {
                if self.outage.held.len() < MAX_HELD_REPORTS {
                    self.outage.held.push(Command::Audit(entry));
                } else {
                    tracing::warn!(
                        ?entry,
                        "audit entry dropped: too many held while the store cannot write"
                    );
                }
                None
            }
            Command::App(app) => match app {
                AppCommand::Create { reply, .. } | AppCommand::Attach { reply, .. } => {
                    refuse(reply, &status)
                }
                AppCommand::Target { reply, .. } => refuse(reply, &status),
                AppCommand::Kill { reply, .. } => refuse(reply, &status),
                AppCommand::Unregister { reply, .. } => refuse(reply, &status),
                read @ AppCommand::Get { .. } => Some(Command::App(read)),
            },
            Command::AgentReports {
                host,
                session,
                reports,
            } if self.outage.held_reports + reports.len() > MAX_HELD_REPORTS => {
                tracing::warn!(%host, "too many agent reports held while the store cannot write; closing the agent's session");
                if let Some(a) = self.backend.agents() {
                    a.detach(&host, session);
                }
                None
            }
            held @ (Command::AgentReports { .. } | Command::AgentGone { .. }) => {
                if let Command::AgentReports { reports, .. } = &held {
                    self.outage.held_reports += reports.len();
                }
                self.outage.held.push(held);
                None
            }
            read @ (Command::GetPool { .. }
            | Command::ListPools { .. }
            | Command::ListQueue { .. }
            | Command::GetJob { .. }
            | Command::QueryJobs { .. }
            | Command::ListTasks { .. }
            | Command::GetTask { .. }
            | Command::ListHosts { .. }
            | Command::ListHostPools { .. }
            | Command::Watch { .. }
            | Command::LogTarget { .. }
            | Command::GetUpdate { .. }
            | Command::ListUpdates { .. }
            | Command::ListVolumes { .. }
            | Command::GetVolume { .. }
            | Command::ListTokens { .. }
            | Command::ListAudit { .. }
            | Command::Shutdown) => Some(read),
        }
    }

    /// Final reports recorded by this commit: their agents forget them.
    fn send_acks(&mut self) {
        let acks = std::mem::take(&mut self.fx.acks);
        let keys = acks.into_iter().map(|(host, key)| {
            let key = pb::RunKey {
                job_id: key.job_id.to_string(),
                instance: key.instance,
                run_id: key.run,
                launch_id: key.launch,
            };
            (host, key)
        });
        // A full or closed outbox, or no session: the agent reports again.
        self.send_to_agents(keys, |keys| {
            pb::server_message::Kind::Ack(pb::AckRuns { keys })
        });
    }

    /// Volumes deleted or given up by this commit: their agents remove
    /// them. An agent away now lists them when it registers again, and is
    /// told then.
    fn send_volume_deletes(&mut self) {
        let deletes = std::mem::take(&mut self.fx.volume_deletes);
        let ids = deletes.into_iter().map(|(host, id)| (host, id.to_string()));
        self.send_to_agents(ids, |ids| {
            pb::server_message::Kind::DeleteVolumes(pb::DeleteVolumes { ids })
        });
    }

    /// Sends items to their hosts' sessions, grouped per host in messages
    /// of at most `MAX_RUNS_PER_MESSAGE`; a host without a session, or whose
    /// outbox is full, gets the rest of its items another time.
    fn send_to_agents<T: Clone>(
        &mut self,
        items: impl Iterator<Item = (Arc<str>, T)>,
        message: impl Fn(Vec<T>) -> pb::server_message::Kind,
    ) {
        let mut by_host: FxHashMap<Arc<str>, Vec<T>> = FxHashMap::default();
        for (host, item) in items {
            by_host.entry(host).or_default().push(item);
        }
        if by_host.is_empty() {
            return;
        }
        let Some(agents) = self.backend.agents() else {
            return;
        };
        for (host, items) in by_host {
            let Some(session) = agents.session(&host) else {
                continue;
            };
            for chunk in items.chunks(crate::agents::MAX_RUNS_PER_MESSAGE) {
                let msg = pb::ServerMessage {
                    kind: Some(message(chunk.to_vec())),
                };
                if session.tx.try_send(Ok(msg)).is_err() {
                    break;
                }
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
        reads::pool_metrics(&self.engine, &self.metrics);
        self.metrics.jobs.set(self.core.n_jobs() as i64);
    }

    // ------------------------------------------------------------ commands

    /// Answers after this iteration's commit, so that an answer never shows
    /// a change that is not durable yet. Errors change nothing: at once.
    /// While the store cannot write only reads get here, answered at once
    /// from memory.
    /// The one place a refusal becomes the answer's status.
    fn defer<T: Send + 'static, E: Into<Refused>>(&mut self, reply: Reply<T>, value: Result<T, E>) {
        match value {
            Err(e) => {
                let _ = reply.send(Err(crate::status::refused(e.into())));
            }
            Ok(v) if self.outage.failed.is_some() => {
                let _ = reply.send(Ok(v));
            }
            Ok(v) => self.deferred.push(Box::new(move || {
                let _ = reply.send(Ok(v));
            })),
        }
    }

    /// Steps a user's input.
    fn apply(&mut self, input: Input) -> Result<Answer, Error> {
        self.core
            .step(&mut self.engine, input, self.now, &mut self.fx)
    }

    fn handle(&mut self, c: Command) {
        let c = if self.outage.failed.is_some() {
            match self.while_unwritable(c) {
                Some(read) => read,
                None => return,
            }
        } else {
            c
        };
        match c {
            Command::App(c) => self.handle_app(c),
            Command::CreateToken {
                token,
                digest,
                reply,
            } => self.create_token(token, digest, reply),
            Command::RevokeToken { name, reply } => self.revoke_token(name, reply),
            Command::IssueCertificate {
                name,
                certificate,
                reply,
            } => self.issue_certificate(name, certificate, reply),
            Command::RevokeCertificate {
                name,
                fingerprint,
                reply,
            } => self.revoke_certificate(name, fingerprint, reply),
            Command::ListTokens { reply } => {
                let _ = reply.send(Ok(self.list_tokens()));
            }
            Command::Audit(entry) => self.audit(*entry),
            Command::ListAudit { request, reply } => {
                let r = self.list_audit(&request);
                self.defer(reply, r);
            }
            Command::CreatePool {
                path,
                config,
                reply,
            } => {
                let r = self
                    .apply(Input::CreatePool { path, config })
                    .map(|a| self.pool_answer(a));
                self.defer(reply, r);
            }
            Command::UpdatePool {
                path,
                config,
                version,
                reply,
            } => {
                let r = self
                    .apply(Input::UpdatePool {
                        path,
                        config,
                        version,
                    })
                    .map(|a| self.pool_answer(a));
                self.defer(reply, r);
            }
            Command::DeletePool {
                path,
                version,
                reply,
            } => {
                let r = self.apply(Input::DeletePool { path, version }).map(|_| ());
                self.defer(reply, r);
            }
            Command::GetPool { path, reply } => {
                let r = self
                    .engine
                    .resources()
                    .tree()
                    .resolve(&path)
                    .map_err(Error::Pool)
                    .map(|id| reads::pool_to_pb(&self.engine, &self.core, id));
                self.defer(reply, r);
            }
            Command::ListPools {
                request,
                viewer,
                reply,
            } => {
                let viewer = viewer.as_ref().map(|c| &c.principal);
                let r = reads::list_pools(&self.engine, &self.core, &request, viewer);
                self.defer(reply, r);
            }
            Command::ListQueue { path, limit, reply } => {
                let r = reads::list_queue(&self.engine, &self.core, &path, limit);
                self.defer(reply, r);
            }
            Command::CreateJob { spec, plan, reply } => {
                let r = self.create_job(*spec, *plan);
                self.defer(reply, r);
            }
            Command::GetJob { id, reply } => {
                let r = self.core.job_key(&id).map(|k| self.job_to_pb(k));
                self.defer(reply, r);
            }
            Command::QueryJobs {
                request,
                viewer,
                reply,
            } => {
                let r = Ok::<_, Refused>(reads::query_jobs(
                    &self.core,
                    &self.specs,
                    &request,
                    viewer.as_ref().map(|c| &c.principal),
                ));
                self.defer(reply, r);
            }
            Command::JobAction {
                id,
                version,
                action,
                reply,
            } => {
                let r = self
                    .apply(Input::JobAction {
                        id,
                        version,
                        action,
                    })
                    .map(|a| match a {
                        Answer::Job(k) => {
                            let config = self.core.job(k).expect("live").config;
                            if let JobAction::Scale(count) = action
                                && let Some(spec) =
                                    self.specs.get_mut(&k).and_then(|s| s.get_mut(&config))
                            {
                                spec.instance_count = count;
                                // A stored spec must stay valid.
                                spec.overrides.retain(|o| o.instance < count);
                            }
                            Some(self.job_to_pb(k))
                        }
                        _ => {
                            // Its specs go when its deletion is written.
                            self.metrics.jobs.set(self.core.n_jobs() as i64);
                            None
                        }
                    });
                self.defer(reply, r);
            }
            Command::ListTasks { request, reply } => {
                let r = reads::list_tasks(&self.core, &request);
                self.defer(reply, r);
            }
            Command::GetTask {
                job_id,
                instance,
                reply,
            } => {
                let r = reads::get_task(&self.engine, &self.core, &job_id, instance);
                self.defer(reply, r);
            }
            Command::TaskAction {
                job_id,
                instances,
                version,
                restart,
                reply,
            } => {
                let r = self
                    .apply(Input::TaskAction {
                        job_id,
                        instances,
                        version,
                        restart,
                    })
                    .map(|_| ());
                self.defer(reply, r);
            }
            Command::ListHosts { request, reply } => {
                let r = Ok::<_, Refused>(reads::list_hosts(
                    &self.engine,
                    &self.core,
                    self.hub.as_deref(),
                    &request,
                ));
                self.defer(reply, r);
            }
            Command::CreateHostPool { name, reply } => {
                let r = self
                    .apply(Input::CreateHostPool { name: name.clone() })
                    .map(|_| pb::HostPool {
                        name,
                        hosts: Vec::new(),
                    });
                self.defer(reply, r);
            }
            Command::DeleteHostPool { name, reply } => {
                let r = self.apply(Input::DeleteHostPool { name }).map(|_| ());
                self.defer(reply, r);
            }
            Command::ListHostPools { request, reply } => {
                let r = hostpools::list(self.core.host_pools(), &self.engine, &request);
                self.defer(reply, r);
            }
            Command::MoveHosts { hosts, to, reply } => {
                let r = self.apply(Input::MoveHosts { hosts, to }).map(|_| ());
                self.defer(reply, r);
            }
            Command::Maintenance {
                hosts,
                start,
                reply,
            } => {
                let r = self.apply(Input::Maintenance { hosts, start }).map(|_| ());
                self.defer(reply, r);
            }
            Command::Watch { reply } => {
                // Committed revision: events of this iteration are not yet
                // committed and will be broadcast after the commit.
                let unwritten = self.outage.failed.as_ref().map_or(0, |f| f.events.len());
                let committed = self.core.revision() - (self.fx.events.len() + unwritten) as u64;
                let _ = reply.send((committed, self.events_tx.subscribe()));
            }
            Command::AgentRegister {
                registration,
                reply,
            } => {
                let r = self.agent_registered(*registration);
                self.defer(reply, r);
            }
            Command::AgentReports {
                host,
                session,
                reports,
            } => {
                if !self
                    .backend
                    .agents()
                    .is_some_and(|a| a.is_current(&host, session))
                {
                    tracing::debug!(%host, session, "reports of a replaced session dropped");
                    return;
                }
                let reports = reports.into_iter().filter_map(run_report).collect();
                self.step(Input::AgentReports { host, reports });
            }
            Command::AgentGone { host, session } => {
                if let Some(a) = self.backend.agents()
                    && a.detach(&host, session)
                {
                    self.step(Input::AgentDisconnected { host });
                }
            }
            Command::LogTarget {
                job_id,
                instance,
                run_id,
                reply,
            } => {
                let r = reads::log_target(&self.core, &job_id, instance, run_id)
                    .map_err(Refused::from)
                    .and_then(|(key, host)| {
                        let Some(agents) = self.backend.agents() else {
                            return Err(Refused::SimulatedHosts(
                                "runs on simulated hosts have no logs",
                            ));
                        };
                        let Some(session) = agents.session(&host) else {
                            return Err(Refused::AgentNotConnected(host.to_string()));
                        };
                        Ok((key, session.tx.clone()))
                    });
                self.defer(reply, r);
            }
            Command::UpdateJob {
                job_id,
                version,
                spec,
                plan,
                update,
                reply,
            } => {
                let r = self.update_job(job_id, version, *spec, *plan, update);
                self.defer(reply, r);
            }
            Command::GetUpdate { id, reply } => {
                let r = self
                    .core
                    .update(&id)
                    .map(|u| reads::update_to_pb(&self.core, u))
                    .ok_or(Error::UpdateNotFound(id));
                self.defer(reply, r);
            }
            Command::ListUpdates { job_id, reply } => {
                let r = self.core.job_key(&job_id).map(|k| {
                    let job = self.core.job(k).expect("live");
                    job.updates
                        .iter()
                        .rev()
                        .filter_map(|id| self.core.update(id))
                        .map(|u| reads::update_to_pb(&self.core, u))
                        .collect()
                });
                self.defer(reply, r);
            }
            Command::UpdateAction { id, action, reply } => {
                let r = self
                    .apply(Input::UpdateAction {
                        id: id.clone(),
                        action,
                    })
                    .map(|_| {
                        reads::update_to_pb(&self.core, self.core.update(&id).expect("acted on"))
                    });
                self.defer(reply, r);
            }
            Command::ListVolumes { request, reply } => {
                let r = reads::list_volumes(&self.core, &request);
                self.defer(reply, r);
            }
            Command::GetVolume { id, reply } => {
                let r = self
                    .core
                    .volume(&id)
                    .map(|v| reads::volume_to_pb(&self.core, v))
                    .ok_or(Error::VolumeNotFound(id));
                self.defer(reply, r);
            }
            Command::DeleteVolume { id, reply } => {
                let r = self.apply(Input::DeleteVolume { id }).map(|_| ());
                self.defer(reply, r);
            }
            Command::Shutdown => {}
        }
    }

    fn update_job(
        &mut self,
        job_id: String,
        version: u64,
        mut spec: pb::JobSpec,
        plan: JobPlan,
        update: crate::lifecycle::UpdateSpec,
    ) -> Result<(pb::Update, pb::Job), Refused> {
        // The new set replaces the job's; an empty value keeps the current
        // value of its name. Checked before anything changes.
        let secrets = self.core.resolve_secrets(
            self.core.job_key(&job_id).ok(),
            secrets::from_pb(std::mem::take(&mut spec.secrets)),
        )?;
        let id: Arc<str> = Arc::from(uuid::Uuid::new_v4().to_string());
        let answer = self.apply(Input::UpdateJob(Box::new(
            crate::lifecycle::UpdateRequest {
                job_id,
                version,
                id: id.clone(),
                plan,
                spec: update,
            },
        )))?;
        let Answer::Job(k) = answer else {
            unreachable!("an update answers its job");
        };
        let job_id = self.core.job(k).expect("live").id.to_string();
        self.step(Input::SetSecrets { job_id, secrets });
        let u = self.core.update(&id).expect("created");
        self.specs.entry(k).or_default().insert(u.to, spec);
        Ok((reads::update_to_pb(&self.core, u), self.job_to_pb(k)))
    }

    fn pool_answer(&self, a: Answer) -> pb::Pool {
        match a {
            Answer::Pool(id) => reads::pool_to_pb(&self.engine, &self.core, id),
            other => unreachable!("a pool command answers a pool, not {other:?}"),
        }
    }

    fn job_to_pb(&self, k: JobKey) -> pb::Job {
        let secrets = self.core.secrets_of(k).map(|s| secrets::to_pb(s));
        reads::job_to_pb(&self.core, k, self.specs.get(&k), secrets.as_deref())
    }

    fn create_job(&mut self, mut spec: pb::JobSpec, plan: JobPlan) -> Result<pb::Job, Refused> {
        let secrets = self
            .core
            .resolve_secrets(None, secrets::from_pb(std::mem::take(&mut spec.secrets)))?;
        let id: Arc<str> = Arc::from(uuid::Uuid::new_v4().to_string());
        let answer = self.apply(Input::CreateJob {
            id: id.clone(),
            plan: Box::new(plan),
        })?;
        if !secrets.is_empty() {
            self.step(Input::SetSecrets {
                job_id: id.to_string(),
                secrets,
            });
        }
        let Answer::Job(k) = answer else {
            unreachable!("job creation answers the job");
        };
        self.specs.insert(k, Specs::from([(1, spec)]));
        self.metrics.jobs.set(self.core.n_jobs() as i64);
        Ok(self.job_to_pb(k))
    }

    /// Whether `session` may take `host`: yes if no session holds it, if
    /// the holder is the same agent (`agent_id`: restarted on its work
    /// directory, its old connection not yet seen to close), or if the
    /// holder has been silent for `AgentHub::takeover_after_ms` (its
    /// connection is presumed dead). Otherwise two agents claim one host
    /// name: the holder keeps it and the newcomer is refused, or each
    /// registration would mark the other's runs lost and launch them again.
    fn check_takeover(
        &mut self,
        host: &str,
        session: &crate::agents::Session,
    ) -> Result<(), Refused> {
        let now = self.now;
        let Some(hub) = self.hub.clone() else {
            return Ok(());
        };
        let Some(holder) = self.backend.agents().and_then(|a| a.session(host)) else {
            return Ok(());
        };
        if !holder.agent_id.is_empty() && holder.agent_id == session.agent_id {
            return Ok(());
        }
        let silent_ms = now.saturating_sub(hub.last_seen(host).unwrap_or(0));
        let after_ms = hub.takeover_after_ms();
        if silent_ms > after_ms {
            tracing::warn!(
                %host,
                silent_ms,
                holder = %holder.agent_id,
                agent = %session.agent_id,
                "host taken over from a silent session by another agent"
            );
            return Ok(());
        }
        tracing::warn!(
            %host,
            holder = %holder.agent_id,
            agent = %session.agent_id,
            "registration refused: another agent holds the host"
        );
        Err(Refused::HostHeldBySession {
            host: host.to_string(),
            holder: holder.agent_id.to_string(),
            agent: session.agent_id.to_string(),
            silent_ms,
            after_ms,
        })
    }

    fn agent_registered(&mut self, reg: Registration) -> Result<(), Refused> {
        if self.backend.agents().is_none() {
            return Err(Refused::SimulatedHosts(
                "this server runs simulated hosts and accepts no agents",
            ));
        }
        let r = reg.register;
        let spec = reads::host_spec(&r.host, r.resources.as_ref(), &r.attributes, r.ports)?;
        // Refused before the session is attached (the core checks it again).
        crate::lifecycle::check_registration_attributes(&spec.attributes)?;
        let host: Arc<str> = Arc::from(r.host.as_str());
        // Refused before the session is attached: a refusal leaves the
        // holder's session (and its runs) as they were.
        let agent_id = reg.session.agent_id.clone();
        self.core
            .check_agent_identity(&self.engine, &host, &agent_id)
            .map_err(|e| {
                tracing::warn!(%host, agent = %agent_id, "registration refused: {e}");
                e
            })?;
        self.check_takeover(&host, &reg.session)?;
        if let Some(hub) = &self.hub {
            hub.touch(&host);
        }
        // The session is attached before the step, so that acknowledgements
        // of the reports it carries go to it.
        let session = reg.session.id;
        self.backend
            .agents()
            .expect("checked")
            .attach(host.clone(), reg.session);
        let registration = HostRegistration {
            spec,
            isolation: convert::agent_text(r.isolation),
            runs: r.runs.into_iter().filter_map(run_report).collect(),
            volumes: r.volumes,
            agent_id,
        };
        let r = self
            .apply(Input::AgentRegistered(Box::new(registration)))
            .map(|_| ())
            .map_err(Refused::from);
        if r.is_err() {
            // Refused: its stream ends with the error, so no goodbye will
            // come to detach it.
            self.backend
                .agents()
                .expect("checked")
                .detach(&host, session);
        }
        r
    }
}

/// An agent's report in the core's terms (reports without a key are
/// ignored; its free text is cut to `convert::MAX_AGENT_TEXT_BYTES`).
fn run_report(r: pb::RunReport) -> Option<RunReport> {
    let phase = match r.phase() {
        pb::RunPhase::Unknown => RunPhase::Unknown,
        pb::RunPhase::Starting => RunPhase::Starting,
        pb::RunPhase::Running => RunPhase::Running,
        pb::RunPhase::Succeeded => RunPhase::Succeeded,
        pb::RunPhase::Failed => RunPhase::Failed,
        pb::RunPhase::Killed => RunPhase::Killed,
    };
    let health = convert::health_from_pb(r.health());
    let key = r.key?;
    let mut ports: Vec<(String, u32)> = r.ports.into_iter().collect();
    ports.sort_unstable();
    Some(RunReport {
        key: crate::lifecycle::AgentRunKey {
            job_id: key.job_id.into(),
            instance: key.instance,
            run: key.run_id,
            launch: key.launch_id,
        },
        phase,
        time_ms: r.time_ms,
        exit_code: r.exit_code,
        reason: convert::agent_text(r.reason),
        started_ms: r.started_ms,
        health,
        health_detail: convert::agent_text(r.health_detail),
        ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_are_spaced_by_the_interval_or_twice_the_last_cycle() {
        let ms = Duration::from_millis;
        let idle = ms(1000);
        // Cheap cycles while work arrives: the configured interval.
        assert_eq!(cycle_spacing(ms(2), ms(0), true, idle), ms(2));
        assert_eq!(
            cycle_spacing(ms(2), Duration::from_micros(300), true, idle),
            ms(2)
        );
        // A long cycle holds the next one back twice as long as it took
        // (start to start), so cycles take at most half of the loop.
        assert_eq!(cycle_spacing(ms(2), ms(35), true, idle), ms(70));
        assert_eq!(cycle_spacing(ms(2), ms(5000), true, idle), ms(10_000));
        // Nothing to do: the idle interval, unless cycles are that long.
        assert_eq!(cycle_spacing(ms(2), ms(1), false, idle), idle);
        assert_eq!(cycle_spacing(ms(2), ms(800), false, idle), ms(1600));
        assert_eq!(cycle_spacing(ms(50), ms(0), true, ms(20)), ms(50));
    }
}
