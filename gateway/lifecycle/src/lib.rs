//! Peloton's lifecycle core: jobs, instances, runs, holds, timers and host
//! reconciliation, as a pure state machine over the engine.
//!
//! One entry point, [`Lifecycle::step`]: an [`Input`] (a command from the
//! API, a host's reports, a timer tick, a cycle) at a time `now` passed in,
//! applied to the core and the engine, producing [`Effects`] as data — rows
//! to write, events, launches, kills and acknowledgements — and an
//! [`Answer`] or a typed [`Error`]. The core does no I/O: no tonic, prost,
//! tokio, redb or clock. The shell (`crate::scheduler`) batches inputs,
//! commits the effects in one transaction per iteration and only then
//! dispatches them and answers.
//!
//! One source of truth per fact: the engine's task arena owns where a task
//! is (queued, admitted, placed, on which host) and which instance it is
//! (`TaskArena::owner`); the core keeps what only it knows: plans, runs and
//! their history, timers, held runs, orphans after a restart, maintenance.
//!
//! After every step `check_invariants` runs in debug builds and tests: a
//! broken invariant is a crash, not a log line.

mod access;
mod accounting;
mod admissible;
mod after;
mod apps;
mod cron;
mod edit;
mod effects;
mod elastic;
mod error;
mod forecast;
mod hostpools;
mod hosts;
mod invariants;
mod jobs;
mod leases;
mod liveness;
mod model;
mod names;
mod overcommit;
mod pinned;
mod plan;
mod recover;
pub mod rendezvous;
mod retention;
mod runs;
pub mod runtime;
mod secrets;
#[cfg(any(test, feature = "testkit"))]
pub mod sim;
#[cfg(test)]
mod tests;
pub mod units;
mod updates;
pub mod usage;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use peloton_engine::host::HostSpec;
use peloton_engine::task::TaskHandle;
use peloton_engine::{Engine, PoolConfig, PoolId};
use rustc_hash::{FxHashMap, FxHashSet};

pub use access::{
    AccessChange, AccessState, AuditEntry, Certificate, Digest32, MAX_AUDIT_ENTRIES,
    MAX_CERTS_PER_TOKEN, MAX_TOKENS, Token, hex as digest_hex,
};
pub use accounting::{Ledger, MAX_USAGE_RECORDS, USAGE_RETENTION_MS, UsageRecord};
pub use admissible::never_admitted_reason;
pub use after::MAX_DEPENDENCIES;
pub use cron::{
    CronState, CronTick, DEFAULT_KEEP_FAILED, DEFAULT_KEEP_SUCCEEDED, MAX_ACTIVE_TICKS,
    MAX_CRON_HISTORY, MAX_CRON_JOBS, Overlap, STARTING_DEADLINE_MS, Schedule, tick_job_id,
};
pub use edit::JobEdit;
pub use effects::{
    AgentRunKey, Counters, Effects, Event, EventKind, Kill, Launch, RendezvousUpdate, RowKey,
    StateRow,
};
pub use error::Error;
pub use forecast::{FORECAST_INTERVAL_MS, ForecastRequest, InstanceForecast, JobForecast};
pub use hostpools::{
    DEFAULT_HOST_POOL, HOST_POOL_ATTRIBUTE, HostPools, MAX_HOST_POOLS,
    check_registration_attributes,
};
pub use leases::leased;
pub use liveness::{Holder, LIVENESS_CHECK_MS, RECONNECT_SLACK_MS};
pub use model::{
    AfterCondition, AppPlan, AppState, Dependency, Health, HostSlot, Job, JobKey, JobKind, JobPlan,
    JobRow, JobState, LaunchId, N_STATES, RestartPolicy, RunRecord, RunRef, Task, TaskRow,
    TaskState, TaskTemplate, Volume, VolumePolicy, VolumeTemplate, legal,
};
pub use overcommit::OvercommitConfig;
pub use pinned::DEFAULT_HOST_DOWN_TIMEOUT_MS;
pub use plan::{JobPlanAnswer, PlannedInstance, PlannedVictim};
pub use recover::{Recovered, RecoveredHost, RecoveredJob, RecoveredTask, RecoveredVolume};
pub use runtime::{
    Estimate, EstimateSource, MAX_RUNTIME_KEYS, MIN_LEARNED_SAMPLES, RUNTIME_WINDOW,
    RuntimeEstimator, command_key, runtime_key,
};
pub use secrets::{MAX_SECRETS_TOTAL_BYTES, Secret};
pub use updates::{
    MAX_UPDATES_PER_JOB, Update, UpdateAction, UpdateCounts, UpdateRequest, UpdateSpec, UpdateState,
};

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
    /// Change a batch job's priority, limits or running-instance cap for
    /// the instances that have not started (see [`edit`](crate::edit)).
    Edit(JobEdit),
    /// A cron job's tick now, as a tick of its schedule would run (its
    /// overlap policy applies); its schedule goes on (see [`cron`](crate::cron)).
    CronRunNow,
    /// Suspend (true: no ticks until resumed) or resume (false: ticks from
    /// now on) a cron job's schedule.
    CronSuspend(bool),
}

/// How a run's host says it went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunPhase {
    /// Nothing known yet.
    Unknown,
    /// Being started.
    Starting,
    /// Its process runs.
    Running,
    /// Exited 0.
    Succeeded,
    /// Ended otherwise.
    Failed,
    /// Stopped on request.
    Killed,
}

/// One report of an agent about one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// Which run.
    pub key: AgentRunKey,
    /// Its phase.
    pub phase: RunPhase,
    /// When the phase was entered.
    pub time_ms: u64,
    /// Exit code.
    pub exit_code: i32,
    /// Explanation ("" for none).
    pub reason: String,
    /// When its process started (0: never).
    pub started_ms: u64,
    /// Health check verdict.
    pub health: Health,
    /// Why it is unhealthy.
    pub health_detail: String,
    /// Ports the host gave it.
    pub ports: Vec<(String, u32)>,
    /// When it last checkpointed (0: never).
    pub checkpoint_ms: u64,
}

/// How a run ended or went, as the simulator reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// It started.
    Running,
    /// It ended on its own.
    Exited(i32),
    /// It failed, with the host's explanation.
    Failed(i32, String),
    /// It was stopped on request.
    Killed,
    /// Its host can no longer tell.
    Lost(String),
}

/// A run's status change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskUpdate {
    /// The run.
    pub run: RunRef,
    /// Its new status.
    pub status: RunStatus,
    /// When, in ms since the epoch.
    pub time_ms: u64,
}

/// An agent's registration, validated by the shell.
#[derive(Clone, Debug)]
pub struct HostRegistration {
    /// What the host offers.
    pub spec: HostSpec,
    /// How it isolates tasks.
    pub isolation: String,
    /// Every run it has (alive, or ended and not acknowledged).
    pub runs: Vec<RunReport>,
    /// Ids of the volumes on its disk.
    pub volumes: Vec<String>,
    /// The agent's identity (drawn once per work directory; empty from
    /// agents that send none). A host is bound to the identity that
    /// registered it until it is declared lost.
    pub agent_id: Arc<str>,
    /// The address its tasks are reachable at ("": unknown).
    pub address: Arc<str>,
    /// The ports it hands out to tasks.
    pub port_ranges: Vec<rendezvous::PortRange>,
    /// The session that holds the host now, if another does: the
    /// registration is refused while it is alive (see
    /// [`liveness`](crate::liveness)).
    pub holder: Option<Holder>,
}

/// One input of a step.
#[derive(Debug)]
pub enum Input {
    /// Create a pool.
    CreatePool {
        /// Path.
        path: String,
        /// Validated configuration.
        config: PoolConfig,
    },
    /// Change a pool.
    UpdatePool {
        /// Path.
        path: String,
        /// Validated configuration.
        config: PoolConfig,
        /// Expected version (0: any).
        version: u64,
    },
    /// Delete a pool. Refused while it holds jobs; with `force`, its
    /// ended jobs are deleted with it (unfinished ones still refuse it).
    DeletePool {
        /// Path.
        path: String,
        /// Expected version (0: any).
        version: u64,
        /// Delete the pool's ended jobs with it.
        force: bool,
    },
    /// Create a job with this (fresh) id.
    CreateJob {
        /// Its id.
        id: Arc<str>,
        /// Validated plan.
        plan: Box<JobPlan>,
    },
    /// Kill, delete, scale or restart a job.
    JobAction {
        /// Job id.
        id: String,
        /// Expected version (0: any).
        version: u64,
        /// What.
        action: JobAction,
    },
    /// Kill or restart some instances.
    TaskAction {
        /// Job id.
        job_id: String,
        /// Instances.
        instances: Vec<u32>,
        /// Expected job version (0: any).
        version: u64,
        /// Restart (true) or kill.
        restart: bool,
    },
    /// Start (drain) or complete maintenance of hosts.
    Maintenance {
        /// Host names.
        hosts: Vec<String>,
        /// Start or complete.
        start: bool,
    },
    /// Create a host pool.
    CreateHostPool {
        /// Its name (validated by the shell).
        name: String,
    },
    /// Delete a host pool (empty, and named by no job that runs).
    DeleteHostPool {
        /// Its name.
        name: String,
    },
    /// Move live hosts into a host pool. Refused while they run tasks of
    /// jobs of other host pools, unless `force`: those runs are then
    /// preempted and start again in their own host pools.
    MoveHosts {
        /// Host names (all must exist, or nothing changes).
        hosts: Vec<String>,
        /// The host pool.
        to: String,
        /// Preempt the runs that do not belong in `to`.
        force: bool,
    },
    /// Set one attribute of live hosts (its value replaced, or added);
    /// runs placed there stay. Not the host pool's (see
    /// [`Input::MoveHosts`]).
    SetHostAttribute {
        /// Host names (all must exist, or nothing changes).
        hosts: Vec<String>,
        /// Attribute key.
        key: String,
        /// Its new value.
        value: String,
    },
    /// An agent registered on a new session.
    AgentRegistered(Box<HostRegistration>),
    /// Reports of an agent.
    AgentReports {
        /// Host.
        host: Arc<str>,
        /// Reports.
        reports: Vec<RunReport>,
    },
    /// An agent's current session ended.
    AgentDisconnected {
        /// Host.
        host: Arc<str>,
    },
    /// Whether agents can reach this server now (see
    /// [`liveness`](crate::liveness)): false while it does not lead; true
    /// (again) when it starts, leads again or its store writes again —
    /// hosts then get the reconnect slack before their silence counts.
    AgentsReachable(bool),
    /// When the watched agent hosts were last heard (ms; 0: not since this
    /// server started): hosts silent past the timeout are declared lost.
    AgentsHeard {
        /// Host, last heard.
        heard: Vec<(Arc<str>, u64)>,
    },
    /// An agent host was not heard from for too long.
    HostLost {
        /// Host.
        host: Arc<str>,
        /// For how long.
        silent_ms: u64,
    },
    /// Status changes from the simulated hosts.
    Updates(Vec<TaskUpdate>),
    /// Start a rolling update of a service to a new plan.
    UpdateJob(Box<UpdateRequest>),
    /// Pause, resume, abort or roll back an update.
    UpdateAction {
        /// Update id.
        id: String,
        /// What.
        action: UpdateAction,
    },
    /// Delete a volume (refused while a run of its instance holds the
    /// host).
    DeleteVolume {
        /// Volume id.
        id: String,
    },
    /// Cluster mode: the driver of an application job (its instance 0)
    /// registers the executor's template.
    AppRegister {
        /// Job id.
        id: String,
        /// The executor.
        executor: Arc<TaskTemplate>,
        /// At most this many executors at once.
        max_executors: u32,
        /// The job's spec from now on, as the shell encodes it (the
        /// executor its default task, the driver instance 0's own).
        spec: Arc<[u8]>,
    },
    /// An application's executor target.
    AppTarget {
        /// Job id.
        id: String,
        /// Generation (a lower one than the current is dropped).
        generation: u64,
        /// Executors wanted.
        total: u32,
    },
    /// Kill executors of an application.
    AppKill {
        /// Job id.
        id: String,
        /// Their instances.
        instances: Vec<u32>,
    },
    /// The driver of a client-mode application was heard from (any call
    /// about it): its lease starts again. Nothing for other jobs.
    AppHeard {
        /// Job id.
        id: String,
    },
    /// An application ends.
    AppUnregister {
        /// Job id.
        id: String,
        /// Its driver's lease lapsed (it was not heard from), rather than
        /// it unregistered.
        lapsed: bool,
    },
    /// Replace a job's secrets (an empty value keeps the current value of
    /// its name; an empty set removes them).
    SetSecrets {
        /// Job id.
        job_id: String,
        /// The new set.
        secrets: Vec<Secret>,
    },
    /// Store a token (a secure server's; its name, grants and secret
    /// checked by the shell; its creation time is set here).
    CreateToken(Box<Token>),
    /// Revoke a token.
    RevokeToken {
        /// Its name.
        name: String,
    },
    /// Record a client certificate (signed by the shell) with a token.
    IssueCertificate {
        /// The token's name.
        name: String,
        /// The certificate (its issue time is set here).
        certificate: Certificate,
    },
    /// Forget one client certificate of a token.
    RevokeCertificate {
        /// The token's name.
        name: String,
        /// The certificate's fingerprint.
        fingerprint: Digest32,
    },
    /// Append to the audit log (its sequence number and time are set
    /// here).
    Audit(Box<AuditEntry>),
    /// Run a scheduling cycle (entitlement, admission, placement,
    /// preemption).
    Cycle,
    /// Fire the timers due by now.
    Tick,
    /// A host's usage report (soft state: writes nothing).
    Usage(Box<usage::UsageReport>),
    /// The answer to a [`ForecastRequest`] (soft state: writes nothing).
    Forecast(Box<peloton_engine::Forecast>),
}

/// What a successful step answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Done, nothing to report.
    Done,
    /// The pool created or changed.
    Pool(PoolId),
    /// The job created or changed.
    Job(JobKey),
    /// The job is gone.
    JobDeleted,
    /// An application's target in force after a new one was offered.
    Target {
        /// The offered target was applied (or was the current one again).
        applied: bool,
        /// Target in force.
        target: u32,
        /// Its generation.
        generation: u64,
    },
}

/// Settings of the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreConfig {
    /// Earlier runs kept per task.
    pub max_history: usize,
    /// Instances of one job.
    pub max_instances_per_job: u32,
    /// Hosts are agents (runs survive a restart of the server and are
    /// reconciled) rather than simulated (they restart with the server).
    pub agent_mode: bool,
    /// A finished job (terminal) is removed this long after it finished.
    pub retention_ms: u64,
    /// At most this many finished jobs are kept (the oldest go first).
    pub max_finished_jobs: usize,
    /// A client-mode application whose driver was not heard from for this
    /// long is unregistered.
    pub app_lease_ms: u64,
    /// Audit entries kept (the oldest beyond go).
    pub max_audit_entries: usize,
    /// Usage records kept (the oldest beyond go).
    pub max_usage_records: usize,
    /// Usage records are kept this long after their runs ended.
    pub usage_retention_ms: u64,
    /// An agent host not heard from for this long is lost.
    pub host_lost_after_ms: u64,
    /// While work waits, a start forecast is due this often (0: never;
    /// see [`Lifecycle::forecast_due`]).
    pub forecast_interval_ms: u64,
    /// A host held by a session silent this long may be taken over by
    /// another agent.
    pub takeover_after_ms: u64,
    /// What hosts lend revocable tasks of what non-revocable ones do not
    /// use.
    pub overcommit: OvercommitConfig,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            max_history: 8,
            max_instances_per_job: 100_000,
            agent_mode: false,
            retention_ms: 7 * 24 * 3600 * 1000,
            max_finished_jobs: 10_000,
            app_lease_ms: 60_000,
            max_audit_entries: MAX_AUDIT_ENTRIES,
            max_usage_records: MAX_USAGE_RECORDS,
            usage_retention_ms: USAGE_RETENTION_MS,
            host_lost_after_ms: 10_000,
            forecast_interval_ms: FORECAST_INTERVAL_MS,
            takeover_after_ms: 3_000,
            overcommit: OvercommitConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Backoff,
    Deadline,
}

/// A run that was told to stop and whose end its host has not confirmed:
/// it keeps its resources on the host, and its instance does not start
/// again, until then (so an instance never runs twice at once).
#[derive(Clone, Copy, Debug)]
pub struct Held {
    /// Launch of the run.
    pub launch: LaunchId,
    /// Its engine task (none for a run recovered after a restart and not
    /// adopted).
    pub handle: Option<TaskHandle>,
    /// Its host.
    pub host: Option<HostSlot>,
    /// Start the instance's next run once this one is gone.
    pub restart: bool,
    /// It was preempted (while preemptions are unconfirmed, no new victims
    /// are chosen: the engine still counts the held runs' allocation).
    pub preempted: bool,
}

/// What the core knows of a host run by an agent.
#[derive(Clone, Debug, Default)]
pub struct AgentHost {
    /// Declared lost; cleared when it registers.
    pub lost: bool,
    /// How it isolates tasks.
    pub isolation: String,
    /// Registered since this process started and not disconnected.
    pub connected: bool,
    /// The agent the host is bound to (empty: any agent may take it).
    pub agent_id: Arc<str>,
    /// The address its tasks are reachable at, as its agent registered it
    /// ("": not registered since this server started).
    pub address: Arc<str>,
    /// The ports it hands out to tasks (gang members' are chosen from
    /// them at placement).
    pub port_ranges: Vec<rendezvous::PortRange>,
}

/// The lifecycle core's state.
#[derive(Debug)]
pub struct Lifecycle {
    config: CoreConfig,
    jobs: FxHashMap<JobKey, Job>,
    next_key: u32,
    by_id: BTreeMap<Arc<str>, JobKey>,
    /// Named jobs by (pool, name) (see `names`).
    names: names::JobNames,
    pool_versions: FxHashMap<String, u64>,
    host_names: Vec<Arc<str>>,
    revision: u64,
    timers: BinaryHeap<Reverse<(u64, TimerKind, RunRef)>>,
    held: FxHashMap<(JobKey, u32), Held>,
    n_held_preempted: u32,
    orphans: FxHashMap<HostSlot, Vec<(JobKey, u32)>>,
    agent_hosts: FxHashMap<HostSlot, AgentHost>,
    maintenance: FxHashSet<HostSlot>,
    need_fill: FxHashSet<JobKey>,
    retry_fill: FxHashSet<JobKey>,
    /// Elastic gangs whose membership changed in this step: their running
    /// members are told at its end (see `announce_memberships`).
    elastic_changed: FxHashSet<JobKey>,
    /// Members of elastic gangs that left a host in this step, and how
    /// (see `settle_elastic`).
    elastic_left: Vec<(JobKey, u32, TaskState)>,
    /// Jobs whose counts or holds changed in this step (state derived and
    /// row written at its end).
    dirty_jobs: FxHashSet<JobKey>,
    /// Updates by id (bounded per job).
    updates: FxHashMap<Arc<str>, Update>,
    /// Updates moving instances now.
    rolling: FxHashSet<Arc<str>>,
    /// Draining hosts that still hold service instances.
    draining: FxHashSet<HostSlot>,
    /// Terminal jobs by (completion time, key): what retention removes,
    /// oldest first.
    finished: BTreeSet<(u64, JobKey)>,
    /// Jobs that wait for the jobs they depend on (`Job::waits_for_jobs`).
    after_waiting: BTreeSet<JobKey>,
    /// Some job ended (or one waiting was created, restarted or recovered)
    /// in this step: waiting jobs are looked at again at its end.
    after_dirty: bool,
    /// Cron jobs not killed by their next tick (see `cron`).
    cron_next: BTreeSet<(u64, JobKey)>,
    /// The same, by job.
    cron_due: FxHashMap<JobKey, u64>,
    /// Volumes by instance.
    volumes: BTreeMap<(JobKey, u32), Volume>,
    /// Volume ids to their instance.
    volume_ids: FxHashMap<Arc<str>, (JobKey, u32)>,
    /// Pinned instances whose host reservation may have to change (synced
    /// at the end of the step).
    pin_dirty: FxHashSet<(JobKey, u32)>,
    /// Host pools and their members.
    host_pools: HostPools,
    /// Tokens and the audit log.
    access: AccessState,
    /// Jobs' secrets.
    secrets: FxHashMap<JobKey, Arc<[Secret]>>,
    /// Daemon jobs.
    daemon_jobs: std::collections::BTreeSet<JobKey>,
    /// Application jobs whose target, executors or driver changed in this
    /// step (reconciled at its end).
    app_dirty: FxHashSet<JobKey>,
    /// Batch jobs whose controller instance (0) reached a terminal state in
    /// this step: the others are stopped at its end if it is still there.
    controller_ended: FxHashSet<JobKey>,
    /// Client-mode applications by when their drivers were last heard
    /// from (their leases).
    app_seen: FxHashMap<JobKey, u64>,
    /// Since when hosts holding volumes are seen down.
    down_since: FxHashMap<HostSlot, u64>,
    /// When a relocating job's volume may be given up next (kept by
    /// `check_volume_hosts`).
    volume_deadline: Option<u64>,
    /// Whether agents can reach this server, and when hosts were last
    /// looked at.
    liveness: liveness::Liveness,
    /// Hosts whose lending is worked out again at the end of the step.
    overcommit: overcommit::Pending,
    needs_cycle: bool,
    /// What current runs use, by host (soft state; see `usage`).
    usage: usage::UsageTable,
    /// The latest start forecast (soft state).
    forecasts: forecast::Forecasts,
    /// Ended runs' accounts.
    ledger: accounting::Ledger,
    /// Learned run times (from the ledger's succeeded runs).
    runtimes: runtime::RuntimeEstimator,
    now: u64,
}

impl Lifecycle {
    /// An empty core over `engine`'s hosts, at revision `revision`.
    pub fn new(config: CoreConfig, engine: &Engine, revision: u64) -> Self {
        let mut core = Lifecycle {
            config,
            jobs: FxHashMap::default(),
            next_key: 0,
            by_id: BTreeMap::new(),
            names: Default::default(),
            pool_versions: FxHashMap::default(),
            host_names: Vec::new(),
            revision,
            timers: BinaryHeap::new(),
            held: FxHashMap::default(),
            n_held_preempted: 0,
            orphans: FxHashMap::default(),
            agent_hosts: FxHashMap::default(),
            maintenance: FxHashSet::default(),
            need_fill: FxHashSet::default(),
            retry_fill: FxHashSet::default(),
            elastic_changed: FxHashSet::default(),
            elastic_left: Vec::new(),
            dirty_jobs: FxHashSet::default(),
            updates: FxHashMap::default(),
            rolling: FxHashSet::default(),
            draining: FxHashSet::default(),
            finished: BTreeSet::new(),
            after_waiting: BTreeSet::new(),
            after_dirty: false,
            cron_next: BTreeSet::new(),
            cron_due: FxHashMap::default(),
            volumes: BTreeMap::new(),
            volume_ids: FxHashMap::default(),
            pin_dirty: FxHashSet::default(),
            host_pools: HostPools::default(),
            access: AccessState::default(),
            secrets: FxHashMap::default(),
            daemon_jobs: Default::default(),
            app_dirty: FxHashSet::default(),
            controller_ended: FxHashSet::default(),
            app_seen: FxHashMap::default(),
            down_since: FxHashMap::default(),
            volume_deadline: None,
            liveness: liveness::Liveness::from(0),
            overcommit: overcommit::Pending::default(),
            needs_cycle: true,
            usage: usage::UsageTable::default(),
            forecasts: forecast::Forecasts::default(),
            ledger: accounting::Ledger::default(),
            runtimes: runtime::RuntimeEstimator::default(),
            now: 0,
        };
        core.pool_versions.insert("/".into(), 1);
        for slot in engine.hosts().live_hosts().iter() {
            let id = engine.hosts().lookup_slot(slot as usize).expect("live");
            core.set_host_name(HostSlot(slot), engine.hosts().name(id));
        }
        core
    }

    /// Applies one input at time `now` (ms since the epoch), then queues
    /// what may be queued and derives job states. On error nothing changed.
    pub fn step(
        &mut self,
        engine: &mut Engine,
        input: Input,
        now: u64,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        self.now = now;
        let host_change = matches!(
            input,
            Input::HostLost { .. }
                | Input::AgentsHeard { .. }
                | Input::Maintenance { .. }
                | Input::AgentRegistered(_)
                | Input::AgentDisconnected { .. }
        );
        let answer = match input {
            Input::CreatePool { path, config } => self.create_pool(engine, &path, config, fx),
            Input::UpdatePool {
                path,
                config,
                version,
            } => self.update_pool(engine, &path, config, version, fx),
            Input::DeletePool {
                path,
                version,
                force,
            } => self.delete_pool(engine, &path, version, force, fx),
            Input::CreateJob { id, plan } => self.create_job(engine, id, *plan, fx),
            Input::JobAction {
                id,
                version,
                action,
            } => self.job_action(engine, &id, version, action, fx),
            Input::TaskAction {
                job_id,
                instances,
                version,
                restart,
            } => self.task_action(engine, &job_id, &instances, version, restart, fx),
            Input::Maintenance { hosts, start } => self.maintenance(engine, &hosts, start, fx),
            Input::CreateHostPool { name } => self.create_host_pool(&name, fx),
            Input::DeleteHostPool { name } => self.delete_host_pool(&name, fx),
            Input::MoveHosts { hosts, to, force } => {
                self.move_hosts(engine, &hosts, &to, force, fx)
            }
            Input::SetHostAttribute { hosts, key, value } => {
                self.set_host_attribute(engine, &hosts, &key, &value)
            }
            Input::AgentRegistered(reg) => self.agent_registered(engine, *reg, fx),
            Input::AgentReports { host, reports } => {
                self.agent_reports(engine, &host, reports, fx);
                Ok(Answer::Done)
            }
            Input::AgentDisconnected { host } => {
                self.agent_disconnected(engine, &host);
                Ok(Answer::Done)
            }
            Input::AgentsReachable(reachable) => {
                self.agents_reachable_now(reachable);
                Ok(Answer::Done)
            }
            Input::AgentsHeard { heard } => {
                self.agents_heard(engine, &heard, fx);
                Ok(Answer::Done)
            }
            Input::HostLost { host, silent_ms } => {
                self.host_lost(engine, &host, silent_ms, fx);
                Ok(Answer::Done)
            }
            Input::Updates(updates) => {
                for u in updates {
                    self.apply_update(engine, u, fx);
                }
                Ok(Answer::Done)
            }
            Input::UpdateJob(request) => self.create_update(engine, *request, fx),
            Input::UpdateAction { id, action } => self.update_action(engine, &id, action, fx),
            Input::DeleteVolume { id } => self.delete_volume(engine, &id, fx),
            Input::AppRegister {
                id,
                executor,
                max_executors,
                spec,
            } => self.app_register(engine, &id, executor, max_executors, spec, fx),
            Input::AppTarget {
                id,
                generation,
                total,
            } => self.app_target(&id, generation, total),
            Input::AppKill { id, instances } => self.app_kill(engine, &id, &instances, fx),
            Input::AppUnregister { id, lapsed } => self.app_unregister(engine, &id, lapsed, fx),
            Input::AppHeard { id } => {
                let k = self.job_key(&id)?;
                self.app_heard(k);
                Ok(Answer::Done)
            }
            Input::SetSecrets { job_id, secrets } => self.set_secrets(&job_id, secrets, fx),
            Input::CreateToken(token) => self.create_token(*token, fx),
            Input::RevokeToken { name } => self.revoke_token(&name, fx),
            Input::IssueCertificate { name, certificate } => {
                self.issue_certificate(&name, certificate, fx)
            }
            Input::RevokeCertificate { name, fingerprint } => {
                self.revoke_certificate(&name, fingerprint, fx)
            }
            Input::Audit(entry) => Ok(self.audit(*entry, fx)),
            Input::Cycle => {
                self.reconcile_daemons(engine, fx);
                self.check_volume_hosts(engine, fx);
                // Instances the daemons just got are queued for this cycle.
                self.fill_all(engine, fx);
                self.cycle(engine, fx);
                self.need_fill.extend(self.retry_fill.drain());
                Ok(Answer::Done)
            }
            Input::Usage(report) => {
                self.apply_usage(engine, *report);
                Ok(Answer::Done)
            }
            Input::Forecast(forecast) => {
                self.apply_forecast(engine, &forecast);
                Ok(Answer::Done)
            }
            Input::Tick => {
                self.fire_timers(engine, fx);
                self.fire_crons(engine, fx);
                self.expire_leases(engine, fx);
                self.apply_retention(engine, fx);
                self.prune_ledger(fx);
                self.check_volume_hosts(engine, fx);
                Ok(Answer::Done)
            }
        };
        if answer.is_ok() {
            self.advance_updates(engine, fx);
            self.advance_drains(engine, fx);
            if host_change {
                // Down-times of volume hosts count from now.
                self.check_volume_hosts(engine, fx);
            }
        }
        self.reconcile_apps(engine, fx);
        self.forget_leases();
        self.stop_after_controllers(engine, fx);
        self.sync_overcommit(engine, fx);
        self.settle_elastic(engine, fx);
        self.fill_all(engine, fx);
        self.announce_memberships(fx);
        self.sync_reservations(engine);
        self.derive_job_states(fx);
        self.settle_dependencies(engine, fx);
        if cfg!(debug_assertions) {
            self.check_invariants(engine);
        }
        answer
    }

    // ------------------------------------------------------------ reads

    /// The last revision handed out (committed once the shell commits).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Whether a cycle would have work (inputs since the last one).
    pub fn wants_cycle(&self) -> bool {
        self.needs_cycle
    }

    /// When a [`Input::Tick`] is next due: the earliest timer, the
    /// retention of finished jobs, a volume to give up, an application's
    /// lease, an old usage record or a cron job's tick, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        let timer = self.timers.peek().map(|Reverse((t, _, _))| *t);
        [
            timer,
            self.retention_deadline(),
            self.volume_deadline,
            self.lease_deadline(),
            self.ledger_deadline(),
            self.cron_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The core's settings.
    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// Number of finished (terminal) jobs kept.
    pub fn n_finished_jobs(&self) -> usize {
        self.finished.len()
    }

    /// A job by key.
    pub fn job(&self, key: JobKey) -> Option<&Job> {
        self.jobs.get(&key)
    }

    /// A job's key by id.
    pub fn job_key(&self, id: &str) -> Result<JobKey, Error> {
        self.by_id
            .get(id)
            .copied()
            .ok_or_else(|| Error::JobNotFound(id.to_string()))
    }

    /// Jobs by id, from `after` (exclusive; "" from the start).
    pub fn jobs_by_id<'a>(&'a self, after: &str) -> impl Iterator<Item = (JobKey, &'a Job)> + 'a {
        let range = if after.is_empty() {
            self.by_id.range::<str, _>(..)
        } else {
            self.by_id
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
        };
        range.map(|(_, &k)| (k, &self.jobs[&k]))
    }

    /// Number of jobs.
    pub fn n_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// The held run of an instance, if any.
    pub fn held(&self, key: JobKey, instance: u32) -> Option<&Held> {
        self.held.get(&(key, instance))
    }

    /// A pool's version.
    pub fn pool_version(&self, path: &str) -> u64 {
        self.pool_versions.get(path).copied().unwrap_or(1)
    }

    /// Name of a host slot.
    pub fn host_name(&self, slot: HostSlot) -> &Arc<str> {
        &self.host_names[slot.idx()]
    }

    /// An agent host's record.
    pub fn agent_host(&self, slot: HostSlot) -> Option<&AgentHost> {
        self.agent_hosts.get(&slot)
    }

    /// Agent hosts not declared lost, by name.
    /// Whether the agent `agent_id` may register `host` now: a host is
    /// bound to the agent that registered it (its identity comes from its
    /// work directory, so its runs come with it) until the host is
    /// declared lost; another agent given the same `--host` is refused
    /// meanwhile, so it can never take over, and start again, the runs of
    /// an agent that is only restarting. An empty identity (an agent that
    /// sends none) binds nothing.
    pub fn check_agent_identity(
        &self,
        engine: &Engine,
        host: &str,
        agent_id: &str,
    ) -> Result<(), Error> {
        let Some(id) = engine.hosts().lookup(host) else {
            return Ok(());
        };
        let Some(h) = self.agent_hosts.get(&HostSlot(id.idx() as u32)) else {
            return Ok(());
        };
        if h.lost || h.agent_id.is_empty() || agent_id.is_empty() || *h.agent_id == *agent_id {
            return Ok(());
        }
        Err(Error::HostHeld {
            host: host.to_string(),
            holder: h.agent_id.to_string(),
            agent: agent_id.to_string(),
        })
    }

    pub fn watched_agent_hosts(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.agent_hosts
            .iter()
            .filter(|(_, h)| !h.lost)
            .map(|(slot, _)| &self.host_names[slot.idx()])
    }

    /// Whether a host is in maintenance (draining or down for it).
    pub fn in_maintenance(&self, slot: HostSlot) -> bool {
        self.maintenance.contains(&slot)
    }

    /// The instance an engine task belongs to, if it is current (the run
    /// holding it, not a held one).
    pub fn instance_of(&self, engine: &Engine, h: TaskHandle) -> Option<(JobKey, u32)> {
        let (k, i) = engine.tasks().owner(h).ok()?;
        let k = JobKey(k);
        let t = self.jobs.get(&k)?.tasks.get(i as usize)?;
        (t.handle == Some(h)).then_some((k, i))
    }

    /// The instances whose current runs are placed on a host.
    pub fn instances_on(&self, engine: &Engine, slot: HostSlot) -> Vec<(JobKey, u32)> {
        engine
            .tasks()
            .on_host(slot.0)
            .filter_map(|h| self.instance_of(engine, h))
            .collect()
    }

    /// The run records of an instance as they would be stored.
    pub fn run_record(&self, t: &Task) -> RunRecord {
        RunRecord {
            run: t.run,
            state: t.state,
            host: t
                .host
                .map_or_else(|| Arc::from(""), |h| self.host_names[h.idx()].clone()),
            created_at: t.created_at,
            placed_at: t.placed_at,
            started_at: t.started_at,
            // Never before its start: a start from the agent's clock and an
            // end from the server's (a lost host, a deadline) may disagree.
            finished_at: match t.finished_at {
                0 => 0,
                at => at.max(t.started_at),
            },
            exit_code: t.exit_code,
            reason: t.reason.clone(),
            launch: t.launch,
            checkpoint_at: t.checkpoint_at,
            lost_work: t.lost_work,
        }
    }

    fn set_host_name(&mut self, slot: HostSlot, name: &str) {
        if self.host_names.len() <= slot.idx() {
            self.host_names.resize(slot.idx() + 1, Arc::from(""));
        }
        self.host_names[slot.idx()] = Arc::from(name);
    }
}
