//! The core's domain: ids, states and their legal transitions, validated
//! job plans, and the per-job and per-instance records.

use std::collections::VecDeque;
use std::sync::Arc;

use peloton_engine::host::GpuGrant;
use peloton_engine::task::{Strategy, TaskHandle};
use peloton_engine::{PoolId, Resources};
use rustc_hash::FxHashMap;

/// A job's dense number inside the core (never reused while the process
/// lives). The job's external id is a UUID string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey(pub u32);

/// A host's slot in the engine's host arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostSlot(pub u32);

impl HostSlot {
    /// The slot as an index.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// Names one launch for the store's whole life: the revision of the run's
/// Placed event (0: not launched). An instance scaled away and added back
/// starts at run 1 again, but never gets a launch id again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchId(pub u64);

/// One run of one instance. Instances and run ids are the API's numbers
/// (`instance`, `run_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunRef {
    /// The job.
    pub job: JobKey,
    /// Instance within the job.
    pub instance: u32,
    /// Run of the instance (1, 2, …).
    pub run: u32,
    /// The launch.
    pub launch: LaunchId,
}

/// A task's state. The numbering is the API's (`TaskState`), which the
/// shell's conversion relies on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum TaskState {
    /// Waiting to be queued in the engine (exactly the job's `waiting`).
    #[default]
    Initialized = 1,
    /// Queued for admission.
    Pending = 2,
    /// Admitted.
    Ready = 3,
    /// Admitted, not placed by a cycle yet.
    Placing = 4,
    /// Holds resources on a host.
    Placed = 5,
    /// Handed to its host.
    Launching = 6,
    /// Its process runs.
    Running = 7,
    /// Ended with exit code 0.
    Succeeded = 8,
    /// Ended otherwise.
    Failed = 9,
    /// Its host lost it.
    Lost = 10,
    /// Stopped on request.
    Killed = 11,
    /// Stopped to make room.
    Preempted = 12,
    /// Waiting out the back-off before its next run.
    Backoff = 13,
}

/// Number of task states, for per-state counts (index = discriminant).
pub const N_STATES: usize = 14;

impl TaskState {
    /// Every state.
    pub const ALL: [TaskState; 13] = [
        TaskState::Initialized,
        TaskState::Pending,
        TaskState::Ready,
        TaskState::Placing,
        TaskState::Placed,
        TaskState::Launching,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Lost,
        TaskState::Killed,
        TaskState::Preempted,
        TaskState::Backoff,
    ];

    /// A run in this state is final and starts no new run by itself.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Killed
        )
    }

    /// A run in this state holds a host.
    pub fn on_host(self) -> bool {
        matches!(
            self,
            TaskState::Placed | TaskState::Launching | TaskState::Running
        )
    }

    /// A run in this state holds an engine task (queued, admitted or
    /// placed).
    pub fn in_engine(self) -> bool {
        matches!(
            self,
            TaskState::Pending | TaskState::Ready | TaskState::Placing
        ) || self.on_host()
    }

    /// The name used in fixtures and logs.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Initialized => "initialized",
            TaskState::Pending => "pending",
            TaskState::Ready => "ready",
            TaskState::Placing => "placing",
            TaskState::Placed => "placed",
            TaskState::Launching => "launching",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Lost => "lost",
            TaskState::Killed => "killed",
            TaskState::Preempted => "preempted",
            TaskState::Backoff => "backoff",
        }
    }
}

/// Whether a task may go from `from` to `to`.
pub fn legal(from: TaskState, to: TaskState) -> bool {
    use TaskState::*;
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
            // A preempted batch run that exited 0 before the kill reached
            // it keeps its result.
            | (Preempted, Succeeded)
            // A service's run that ended (any code) backs off too.
            | (Failed | Succeeded, Backoff)
            | (Failed, Initialized)
            | (Backoff, Initialized | Killed)
            | (Lost | Preempted | Succeeded | Killed, Initialized)
    )
}

/// A job's state, derived from its tasks' counts. Numbering is the API's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum JobState {
    /// No task queued yet.
    #[default]
    Initialized = 1,
    /// Some task queued, none running.
    Pending = 2,
    /// Some task running.
    Running = 3,
    /// Every task succeeded.
    Succeeded = 4,
    /// Every task ended, some failed.
    Failed = 5,
    /// Killed; some run still stopping.
    Killing = 6,
    /// Killed, every run gone.
    Killed = 7,
}

impl JobState {
    /// Nothing of the job runs or will run.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Killed
        )
    }

    /// The name used in fixtures and logs.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Initialized => "initialized",
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Killing => "killing",
            JobState::Killed => "killed",
        }
    }
}

/// What a job's goal is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// Every instance runs to completion once (retried on failure).
    #[default]
    Batch,
    /// Every instance is kept running: any exit starts it again, after a
    /// back-off, until the job is killed.
    Service,
    /// A service with one instance on every host that matches its
    /// constraint: the instance count follows the cluster.
    Daemon,
    /// A framework's application: executors (instances that run once)
    /// follow a target the driver sets; an ended executor is replaced by a
    /// new instance. Optionally instance 0 is the driver itself.
    Application,
}

impl JobKind {
    /// Instances are kept running (services and daemons).
    pub fn keeps_running(self) -> bool {
        matches!(self, JobKind::Service | JobKind::Daemon)
    }
}

/// A task's persistent volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeTemplate {
    /// Size in MiB (charged to its host's disk).
    pub size_mb: u64,
    /// Where it appears in the sandbox.
    pub path: Arc<str>,
}

/// What happens to an instance whose volume's host is down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumePolicy {
    /// How long the host may be down before `relocate` applies.
    pub host_down_timeout_ms: u64,
    /// Give the volume up and start fresh elsewhere (else: keep waiting).
    pub relocate: bool,
}

/// A persistent volume of one instance, on one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// `<job id>-<instance>-<launch that created it>`.
    pub id: Arc<str>,
    /// Its job.
    pub job: JobKey,
    /// Its instance.
    pub instance: u32,
    /// Its host.
    pub host: HostSlot,
    /// Size in MiB.
    pub size_mb: u64,
    /// Where it appears in the sandbox.
    pub path: Arc<str>,
    /// Created.
    pub created_at: u64,
}

/// What a health check says of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Health {
    /// The task has no check.
    #[default]
    None = 0,
    /// No verdict yet.
    Unknown = 1,
    /// The check passes.
    Healthy = 2,
    /// The check failed too often in a row.
    Unhealthy = 3,
}

/// Restart policy of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Failed runs tolerated (batch). Services restart without end.
    pub max_failures: u32,
    /// First back-off.
    pub backoff_ms: u64,
    /// Largest back-off.
    pub max_backoff_ms: u64,
}

impl RestartPolicy {
    /// Back-off before the run after the `failures`-th failure.
    pub fn backoff(&self, failures: u32) -> u64 {
        let shift = failures.saturating_sub(1).min(40);
        self.backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.max_backoff_ms)
    }
}

/// An instance's task, resolved: what the core and the engine need of
/// it, and the spec a host runs. Plans hold templates shared
/// (`Arc<TaskTemplate>`): a launch carries its instance's template without
/// copying it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskTemplate {
    /// Resources in engine units.
    pub request: Resources,
    /// Dynamic ports.
    pub ports: u16,
    /// Their names, in the spec's order (what the server chooses ports
    /// for when the task is a gang member).
    pub port_names: Box<[Box<str>]>,
    /// Constraint text ("" for none).
    pub constraint: String,
    /// Runs on slack.
    pub revocable: bool,
    /// A controller task (e.g. a Spark driver).
    pub controller: bool,
    /// At most this many instances of the job per host (0: no limit).
    pub max_per_host: u16,
    /// Restart policy.
    pub restart: RestartPolicy,
    /// SIGTERM to SIGKILL.
    pub kill_grace_ms: u64,
    /// Deregistration delay: a run told to stop is shown stopping at once,
    /// and its host sends the stop signal this long after.
    pub shutdown_delay_ms: u64,
    /// Preemption notice: a preempted run gets SIGTERM at once and its stop
    /// signal no sooner than this long after (0: none).
    pub preemption_notice_ms: u64,
    /// The task has a health check (its runs start with an unknown health).
    pub health_check: bool,
    /// Its persistent volume.
    pub volume: Option<VolumeTemplate>,
    /// How long a run is expected to last, as its user declared it (0:
    /// not declared): see `runtime`.
    pub expected_runtime_ms: u64,
    /// The key of its command (`runtime::command_key` of its command and
    /// arguments, or shell line; 0: none): runs of the same owner's same
    /// command teach the learned runtime estimate.
    pub command_key: u64,
    /// Simulated duration.
    pub sim_duration_ms: u64,
    /// Simulated exit code.
    pub sim_exit_code: i32,
    /// The task's spec as its user sent it, encoded by the shell (the
    /// API's message, opaque to the core): what a host runs, and what a
    /// read of the task shows.
    pub spec: Arc<[u8]>,
}

/// A validated job spec.
#[derive(Clone, Debug, PartialEq)]
pub struct JobPlan {
    /// Batch or service.
    pub kind: JobKind,
    /// The job's name (for its usage records).
    pub name: Arc<str>,
    /// Whose it is: on a secure server the token that created it (see
    /// the shell's `convert::job_plan`).
    pub owner: Arc<str>,
    /// The pool's path.
    pub pool: Arc<str>,
    /// The host pool its tasks run in (ANDed into their constraints).
    pub host_pool: Arc<str>,
    /// Instances.
    pub instance_count: u32,
    /// The default task.
    pub default: Arc<TaskTemplate>,
    /// Per-instance replacements.
    pub overrides: FxHashMap<u32, Arc<TaskTemplate>>,
    /// Priority.
    pub priority: u32,
    /// Preemptible.
    pub preemptible: bool,
    /// At most this many running at once (0: no limit).
    pub max_running: u32,
    /// Gang size (1: no gang); an elastic gang's most members.
    pub gang: u32,
    /// Elastic gangs: the fewest members it starts with and runs on (0:
    /// not elastic; else below `gang`, and the job is one gang).
    pub elastic_min: u32,
    /// Run time limit (0: none).
    pub max_running_time_ms: u64,
    /// Services: a drain stops at most this many instances at a time,
    /// counting those already down or unhealthy (at least 1).
    pub max_unavailable: u32,
    /// Placement strategy.
    pub strategy: Strategy,
    /// Instances with a volume whose host is down.
    pub volume_policy: VolumePolicy,
    /// Application jobs: how executors are kept.
    pub app: Option<AppPlan>,
    /// Gang jobs: the framework aliases their members are told (see
    /// `rendezvous`).
    pub rendezvous: Option<Arc<super::rendezvous::RendezvousAsk>>,
    /// Jobs it waits for (fixed at creation: an update keeps them).
    pub after: Arc<[Dependency]>,
    /// A cron job's schedule: the job runs nothing itself; each tick
    /// creates a job of this plan, the schedule left out (see `cron`).
    pub schedule: Option<Arc<super::cron::Schedule>>,
    /// The job's spec of this config version as its user sent it (its
    /// secrets taken out), encoded by the shell: opaque to the core, kept
    /// for reads and the store. What the core changes without a new version
    /// (the instance count, an application's executor) the shell's reads
    /// derive from the plan.
    pub spec: Arc<[u8]>,
}

/// How a job another waits for must end (Slurm's afterok, afterany,
/// afternotok).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AfterCondition {
    /// It succeeded.
    Succeeded,
    /// It ended, in any way.
    Finished,
    /// It failed or was killed.
    Failed,
}

impl AfterCondition {
    /// As the spec spells it.
    pub fn name(self) -> &'static str {
        match self {
            AfterCondition::Succeeded => "succeeded",
            AfterCondition::Finished => "finished",
            AfterCondition::Failed => "failed",
        }
    }

    /// Slurm's name for it.
    pub fn slurm_name(self) -> &'static str {
        match self {
            AfterCondition::Succeeded => "afterok",
            AfterCondition::Finished => "afterany",
            AfterCondition::Failed => "afternotok",
        }
    }

    /// Whether a job that ended in `state` (terminal) meets it.
    pub fn met_by(self, state: JobState) -> bool {
        debug_assert!(state.is_terminal());
        match self {
            AfterCondition::Succeeded => state == JobState::Succeeded,
            AfterCondition::Finished => true,
            AfterCondition::Failed => matches!(state, JobState::Failed | JobState::Killed),
        }
    }
}

/// A job a job waits for, and how it must end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dependency {
    /// The job's id.
    pub job: Arc<str>,
    /// How it must end.
    pub condition: AfterCondition,
}

/// What an application job's plan says of its executors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppPlan {
    /// At most this many executors not ended at once.
    pub max_executors: u32,
    /// Instance 0 is the driver (cluster mode); executors are 1, 2, …
    pub driver_in_job: bool,
    /// The executor's template is known (the default task): executors may
    /// start. A cluster-mode job gets it when its driver registers.
    pub registered: bool,
}

impl AppPlan {
    /// The first executor's instance.
    pub fn first_executor(&self) -> u32 {
        u32::from(self.driver_in_job)
    }
}

/// An application's state: the driver's target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppState {
    /// Executors wanted (not ended).
    pub target: u32,
    /// Generation of the target (a lower one is stale).
    pub generation: u64,
    /// Unregistered (or its driver ended): no executor starts again.
    pub closed: bool,
    /// Executors that failed in a row (one that ran a minute first starts
    /// the count over; not stored: a restart of the server tries again).
    pub failures: u32,
}

impl AppState {
    /// Executors may fail this many times in a row before no replacement
    /// starts until the target changes (Spark's own default on YARN:
    /// twice the executors wanted, at least 3).
    pub fn failure_limit(&self, max_executors: u32) -> u32 {
        self.target.min(max_executors).saturating_mul(2).max(3)
    }

    /// Replacements have stopped: too many executors failed in a row.
    pub fn stalled(&self, max_executors: u32) -> bool {
        self.failures >= self.failure_limit(max_executors)
    }
}

impl JobPlan {
    /// The template of an instance: its override, else the default task
    /// (the one place overrides are resolved).
    pub fn template(&self, instance: u32) -> &Arc<TaskTemplate> {
        self.overrides.get(&instance).unwrap_or(&self.default)
    }

    /// The default task, to change (a copy if a launch still holds it).
    pub fn default_mut(&mut self) -> &mut TaskTemplate {
        Arc::make_mut(&mut self.default)
    }

    /// A batch job whose instance 0 alone is a controller task (Peloton's
    /// controller task: a driver that the other instances work for). It is
    /// queued and capped as a controller, the others as ordinary tasks; once
    /// it ends for good the others are stopped and the job ends as it did.
    pub fn has_controller_instance(&self) -> bool {
        self.kind == JobKind::Batch
            && !self.default.controller
            && self.overrides.get(&0).is_some_and(|t| t.controller)
    }
}

/// One finished earlier run, kept in a task's history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunRecord {
    /// Run id.
    pub run: u32,
    /// How it ended.
    pub state: TaskState,
    /// Where it ran ("" if it never was placed).
    pub host: Arc<str>,
    /// Created.
    pub created_at: u64,
    /// Placed.
    pub placed_at: u64,
    /// Started.
    pub started_at: u64,
    /// Ended.
    pub finished_at: u64,
    /// Exit code.
    pub exit_code: i32,
    /// Why it ended.
    pub reason: Option<Box<str>>,
    /// Launch.
    pub launch: LaunchId,
    /// Its last checkpoint (0: never).
    pub checkpoint_at: u64,
    /// Preempted: the work it lost (see [`lost_work_ms`]).
    pub lost_work: u64,
}

/// The work a run loses when told to stop at `at`: the time since its last
/// checkpoint, or since its start (0: it never started, or it checkpointed
/// since).
pub fn lost_work_ms(started_at: u64, checkpoint_at: u64, at: u64) -> u64 {
    if started_at == 0 {
        return 0;
    }
    at.saturating_sub(started_at.max(checkpoint_at))
}

/// Ports a host gave a run: (name, port), by name.
pub type AssignedPorts = Box<[(Box<str>, u32)]>;

/// Per instance: the current run and what the core remembers of earlier
/// ones.
#[derive(Debug)]
pub struct Task {
    /// State of the current run.
    pub state: TaskState,
    /// Current run id.
    pub run: u32,
    /// Launch of the current run (0: not launched since it was created).
    pub launch: LaunchId,
    /// Its engine task while it holds one (queued, admitted or placed).
    pub handle: Option<TaskHandle>,
    /// Host of the current run.
    pub host: Option<HostSlot>,
    /// Times.
    pub created_at: u64,
    /// Placed.
    pub placed_at: u64,
    /// Started.
    pub started_at: u64,
    /// Ended.
    pub finished_at: u64,
    /// Exit code of the current run.
    pub exit_code: i32,
    /// When the current run last reported a checkpoint (0: never).
    pub checkpoint_at: u64,
    /// The current run was preempted: the work it lost.
    pub lost_work: u64,
    /// Failed runs in a row.
    pub failures: u32,
    /// Why the current run is where it is.
    pub reason: Option<Box<str>>,
    /// Health of the current run.
    pub health: Health,
    /// Ports the host gave the current run, by name.
    pub ports: Option<AssignedPorts>,
    /// The GPU devices the engine gave the current run on its host (none
    /// while it has no host): sent with its launch, stored, and given to
    /// the engine again when a restarted server adopts the run.
    pub gpu: GpuGrant,
    /// The gang the current run was queued with (gang jobs).
    pub gang: Option<u32>,
    /// The current run was recovered on an agent host and waits for its
    /// agent to report it (counted in the job's `active`).
    pub orphan: bool,
    /// Version of the job's spec the instance runs (its next runs too).
    pub config: u64,
    /// A daemon's instance: the host it belongs to (none: retired, free
    /// for the next host that joins).
    pub daemon_host: Option<HostSlot>,
    /// Its last run was preempted to make room for other work: until it
    /// is placed again it holds no place on its pinned host (else it
    /// would take back the room it was preempted for, again and again).
    pub gave_way: bool,
    /// Earlier runs, newest first. Boxed: a thin pointer per task (most
    /// tasks never restart).
    #[allow(clippy::box_collection)]
    pub history: Option<Box<Vec<RunRecord>>>,
    /// The rows generation its row was last listed in (see
    /// `Effects::take_rows`; 0: never).
    pub(crate) row_mark: u64,
    /// Recovered waiting, as it was before the restart: its moves within
    /// the queue (Pending, Ready, Placing) are no news to watchers (no
    /// events); cleared when it leaves the queue.
    pub requeued: bool,
}

impl Task {
    /// A new instance at run 1.
    pub fn new(now: u64) -> Self {
        Task {
            state: TaskState::Initialized,
            run: 1,
            launch: LaunchId(0),
            handle: None,
            host: None,
            created_at: now,
            placed_at: 0,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            checkpoint_at: 0,
            lost_work: 0,
            failures: 0,
            reason: None,
            health: Health::None,
            ports: None,
            gpu: GpuGrant::default(),
            gang: None,
            orphan: false,
            config: 1,
            daemon_host: None,
            gave_way: false,
            history: None,
            row_mark: 0,
            requeued: false,
        }
    }
}

/// An elastic gang's membership as its members know it.
#[derive(Debug, Default)]
pub struct Elastic {
    /// The current membership's generation: new (higher, above every
    /// revision before it) each time members join or leave.
    pub generation: u64,
    /// The generation each member placed with the current gang was last
    /// told (by its launch or an update), by instance.
    pub told: FxHashMap<u32, u64>,
    /// Its first members (`elastic_min`, queued as one engine gang) are
    /// placed: more may join, one by one, as room frees.
    pub formed: bool,
    /// A member succeeded: the gang is finishing, nothing more joins.
    pub finishing: bool,
}

/// A job and its instances.
#[derive(Debug)]
pub struct Job {
    /// External id.
    pub id: Arc<str>,
    /// What it asks for.
    pub plan: JobPlan,
    /// Its pool in the engine.
    pub pool: PoolId,
    /// Bumped by every change a user makes.
    pub version: u64,
    /// Derived from the counts.
    pub state: JobState,
    /// Created.
    pub created_at: u64,
    /// Reached a terminal state (0: not).
    pub completed_at: u64,
    /// Killed as a whole: no task starts again.
    pub kill_requested: bool,
    /// Per instance.
    pub tasks: Vec<Task>,
    /// Tasks per state (index = state discriminant).
    pub counts: [u32; N_STATES],
    /// Instances in Initialized, in order, waiting to be queued.
    pub waiting: VecDeque<u32>,
    /// Instances holding an engine task or recovered on a host (orphans),
    /// plus held runs: every run that may hold a host.
    pub active: u32,
    /// Runs told to stop whose end the host has not confirmed.
    pub held: u32,
    /// Next gang number (gang jobs).
    pub next_gang: u32,
    /// Elastic gangs: the membership its members were last told (see
    /// `rendezvous`); `None` for other jobs.
    pub elastic: Option<Box<Elastic>>,
    /// Some instance has run (a service between runs stays RUNNING).
    pub started: bool,
    /// Version of `plan` (1 at creation; each update adds one).
    pub config: u64,
    /// Earlier plans some instance still runs, or an update may roll back
    /// to, by version.
    pub old_configs: std::collections::BTreeMap<u64, JobPlan>,
    /// The job's updates, oldest first (bounded).
    pub updates: VecDeque<Arc<str>>,
    /// Application jobs: the target.
    pub app: AppState,
    /// It waits for the jobs of `plan.after` (none of its instances is
    /// queued); false once every one was met, or for a job with none.
    pub waits_for_jobs: bool,
    /// A cron job's ticks (set exactly when `plan.schedule` is).
    pub cron: Option<super::cron::CronState>,
}

impl Job {
    /// How many more instances its running limit lets it queue.
    pub(crate) fn room(&self) -> u32 {
        if self.plan.max_running == 0 {
            u32::MAX
        } else {
            self.plan.max_running.saturating_sub(self.active)
        }
    }

    /// The template instance `i` runs: from the plan of its config version.
    pub fn template(&self, i: u32) -> &Arc<TaskTemplate> {
        let config = self.tasks.get(i as usize).map_or(self.config, |t| t.config);
        self.plan_of(config).template(i)
    }

    /// The plan of a config version the job still knows.
    pub fn plan_of(&self, config: u64) -> &JobPlan {
        if config == self.config {
            &self.plan
        } else {
            self.old_configs
                .get(&config)
                .expect("configs of live instances are kept")
        }
    }

    /// An application job's executors: its instances after the driver's
    /// (none for other jobs).
    pub fn executors(&self) -> std::ops::Range<u32> {
        match self.plan.app {
            Some(a) if self.plan.kind == JobKind::Application => {
                a.first_executor()..self.tasks.len() as u32
            }
            _ => 0..0,
        }
    }

    /// Whether instance `i` is one of the application's executors.
    pub fn is_executor(&self, i: u32) -> bool {
        self.executors().contains(&i)
    }

    /// Executors the application wants now: its target, within its bound.
    pub fn executors_wanted(&self) -> u32 {
        self.plan
            .app
            .map_or(0, |a| self.app.target.min(a.max_executors))
    }

    /// The job's latest update.
    pub fn latest_update(&self) -> Option<&Arc<str>> {
        self.updates.back()
    }

    /// The job's tasks that `f` accepts, as instance numbers.
    pub fn instances_where(&self, f: impl Fn(&Task) -> bool) -> Vec<u32> {
        (0..self.tasks.len() as u32)
            .filter(|&i| f(&self.tasks[i as usize]))
            .collect()
    }
}

/// What the store keeps of an instance (written when it matters for
/// recovery: not for queued states, nor for a first run before placement).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskRow {
    /// The current run.
    pub current: RunRecord,
    /// Failed runs in a row.
    pub failures: u32,
    /// Earlier runs, newest first.
    pub history: Vec<RunRecord>,
    /// A run of the instance was told to stop and its host has not
    /// confirmed: its launch and host (it may be an earlier run than
    /// `current`).
    pub stopping: Option<(LaunchId, Arc<str>)>,
    /// Start a new run once the host confirms.
    pub restart_when_stopped: bool,
    /// Config version of the instance.
    pub config: u64,
    /// A daemon's instance: its host.
    pub daemon_host: Option<Arc<str>>,
    /// The GPU devices of the current run on its host.
    pub gpu: GpuGrant,
    /// Ports the server chose for the current run (gang members).
    pub ports: Option<AssignedPorts>,
    /// The gang the current run was queued with (its generation).
    pub gang: Option<u32>,
}

/// What the store keeps of a job besides its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRow {
    /// Id.
    pub id: Arc<str>,
    /// Version.
    pub version: u64,
    /// State.
    pub state: JobState,
    /// Created.
    pub created_at: u64,
    /// Completed (0: not).
    pub completed_at: u64,
    /// Killed as a whole.
    pub kill_requested: bool,
    /// Version of the current spec.
    pub config: u64,
    /// The latest update.
    pub update: Option<Arc<str>>,
    /// Application jobs: the target.
    pub app: AppState,
    /// It waits for the jobs it depends on (see [`Job::waits_for_jobs`]).
    pub waits_for_jobs: bool,
    /// A cron job's ticks (none in rows written before cron jobs, or of
    /// other jobs).
    pub cron: Option<super::cron::CronState>,
}
