//! What a step asks the shell to do, as data: rows to write, events to
//! publish, launches and kills to dispatch and acknowledgements to send
//! (all only after the commit), and counters for the metrics.

use std::sync::Arc;

use super::model::{Health, HostSlot, JobKey, JobState, RunRef, TaskState, TaskTemplate};

/// One event, with its gap-free revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Strictly increasing, gap-free.
    pub revision: u64,
    /// When.
    pub time_ms: u64,
    /// What.
    pub kind: EventKind,
}

/// What an event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A task changed state (or health).
    Task {
        /// Job id.
        job: Arc<str>,
        /// Instance.
        instance: u32,
        /// Run.
        run: u32,
        /// New state.
        state: TaskState,
        /// Host of the run ("" for none).
        host: Arc<str>,
        /// Why ("" for nothing to say).
        reason: Box<str>,
        /// Health of the run.
        health: Health,
    },
    /// A job changed state, or was deleted.
    Job {
        /// Job id.
        job: Arc<str>,
        /// Its state.
        state: JobState,
        /// Deleted (its last event).
        deleted: bool,
        /// Why it was deleted: "deleted" (a user), "retention" (its
        /// retention ran out); "" for a change of state.
        reason: Box<str>,
    },
}

/// Start a run on a host. The one launch type: from the step's effects
/// through the shell's backend to the codec that makes the agent's
/// message.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The run.
    pub run: RunRef,
    /// Host name.
    pub host: Arc<str>,
    /// The job's id.
    pub job_id: Arc<str>,
    /// The job's config version the run runs.
    pub config: u64,
    /// The instance's resolved task (shared with its plan): what a host
    /// runs, and how long a simulated run lasts and how it ends.
    pub template: Arc<TaskTemplate>,
    /// The instance's volume (id, size in MiB), if its task has one.
    pub volume: Option<(Arc<str>, u64)>,
    /// The host's GPU devices the engine gave the run (none: no GPU).
    pub gpu: peloton_engine::host::GpuGrant,
    /// Ports the server chose for the run (gang members; none: its host
    /// chooses).
    pub ports: Option<super::model::AssignedPorts>,
    /// Gang members: their gang.
    pub rendezvous: Option<super::rendezvous::LaunchRendezvous>,
}

/// A running member of an elastic gang told its gang's new membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousUpdate {
    /// The run.
    pub run: RunRef,
    /// Host name.
    pub host: Arc<str>,
    /// The job's id.
    pub job_id: Arc<str>,
    /// The member's new view of its gang.
    pub rendezvous: super::rendezvous::LaunchRendezvous,
}

/// Stop a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The run.
    pub run: RunRef,
    /// Host name.
    pub host: Arc<str>,
    /// The job's id.
    pub job_id: Arc<str>,
    /// SIGTERM to SIGKILL.
    pub grace_ms: u64,
    /// The kill to SIGTERM (the task's deregistration delay).
    pub delay_ms: u64,
    /// Why the run is preempted (`None`: it is not); its agent tells the
    /// task at once (`$PELOTON_PREEMPTED`).
    pub preempted: Option<Arc<str>>,
    /// A preempted run's notice: SIGTERM at once, the stop signal no sooner
    /// than this long after the kill.
    pub notice_ms: u64,
}

/// A run as agents name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AgentRunKey {
    /// Job id.
    pub job_id: Arc<str>,
    /// Instance.
    pub instance: u32,
    /// Run.
    pub run: u32,
    /// Launch.
    pub launch: u64,
}

/// A row of the store that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowKey {
    /// A job's row (status and spec).
    Job(JobKey),
    /// A deleted job (its key, no longer live, and its id): its row, its
    /// tasks' and its configs' rows go, and whatever the shell keeps of it.
    JobDeleted(JobKey, Arc<str>),
    /// A task's row.
    Task(JobKey, u32),
    /// A task row of an instance scaled away.
    TaskDeleted(Arc<str>, u32),
    /// A pool's row.
    Pool(String),
    /// A deleted pool.
    PoolDeleted(String),
    /// A host's row.
    Host(HostSlot),
    /// A job's spec of a config version (written once).
    Config(JobKey, u64),
    /// A config version no longer needed.
    ConfigDeleted(Arc<str>, u64),
    /// An update's row.
    Update(Arc<str>),
    /// An update forgotten.
    UpdateDeleted(Arc<str>),
    /// A volume, by its instance.
    Volume(JobKey, u32),
    /// A volume that is gone, by id.
    VolumeDeleted(Arc<str>),
}

/// A row of the tables kept beside the jobs (host pools, access, secrets):
/// the shell encodes it from the core's state (what is no longer there is
/// deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateRow {
    /// A host pool (besides "default"), by name.
    HostPool(Arc<str>),
    /// A host's membership in a host pool other than "default", by host.
    HostPoolMember(Arc<str>),
    /// A token, by name.
    Token(Arc<str>),
    /// An audit entry, by sequence number.
    Audit(u64),
    /// A job's secrets, by job id.
    Secrets(Arc<str>),
    /// A usage record, by sequence number.
    Usage(u64),
}

/// Counters for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Tasks placed.
    pub placements: u64,
    /// Admitted tasks that found no host in a cycle.
    pub placement_failures: u64,
    /// Runs that ended on their own (succeeded or failed).
    pub runs_finished: u64,
    /// Runs preempted.
    pub preemptions: u64,
    /// Instances accepted (created or scaled up).
    pub tasks_accepted: u64,
}

/// Which rows a task's row mark belongs to: a value no other `Effects`
/// ever had, renewed each time the rows are taken ([`Effects::take_rows`]),
/// so a task marked before is marked (and listed) again after.
#[derive(Debug)]
pub(crate) struct RowsGeneration(pub(crate) u64);

impl Default for RowsGeneration {
    fn default() -> Self {
        RowsGeneration::next()
    }
}

impl RowsGeneration {
    fn next() -> Self {
        // Never 0: a task's mark of 0 means "never marked".
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        RowsGeneration(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Everything steps produced since the shell last took them.
#[derive(Debug, Default)]
pub struct Effects {
    /// Events, in revision order.
    pub events: Vec<Event>,
    /// Rows to write (the shell encodes them from the core's state), each
    /// task's once. Taken with [`Effects::take_rows`] (which lets the
    /// core list a task again when it changes after).
    pub rows: Vec<RowKey>,
    /// The generation task row marks compare with.
    pub(crate) rows_generation: RowsGeneration,
    /// Rows of the tables beside the jobs to write.
    pub state_rows: Vec<StateRow>,
    /// What the shell's authentication table learns after the commit.
    pub access: Vec<super::access::AccessChange>,
    /// Runs to start, after the commit.
    pub launches: Vec<Launch>,
    /// Runs to stop, after the commit.
    pub kills: Vec<Kill>,
    /// Running members of elastic gangs to tell their gang's new
    /// membership, after the commit.
    pub rendezvous_updates: Vec<RendezvousUpdate>,
    /// Final reports durably recorded, to acknowledge to their host after
    /// the commit.
    pub acks: Vec<(Arc<str>, AgentRunKey)>,
    /// Volumes to remove from their hosts' disks: (host, volume id). Sent
    /// to connected agents after the commit; an agent that is away is told
    /// when it registers again (it lists its volumes).
    pub volume_deletes: Vec<(Arc<str>, Arc<str>)>,
    /// Client-mode applications unregistered because their drivers went
    /// silent past their lease (for the shell's log).
    pub lapsed_apps: Vec<Arc<str>>,
    /// Agent hosts declared lost: the shell ends their sessions (at once;
    /// their agents register again when they return).
    pub ended_sessions: Vec<Arc<str>>,
    /// Counters.
    pub counters: Counters,
}

impl Effects {
    /// The rows to write, taken: what changes from now on is listed again.
    pub fn take_rows(&mut self) -> Vec<RowKey> {
        self.rows_generation = RowsGeneration::next();
        std::mem::take(&mut self.rows)
    }

    /// Lists task `(k, i)`'s row unless it is listed already (`mark`: the
    /// task's row mark).
    pub(crate) fn task_row(&mut self, mark: &mut u64, k: super::JobKey, i: u32) {
        if *mark != self.rows_generation.0 {
            *mark = self.rows_generation.0;
            self.rows.push(RowKey::Task(k, i));
        }
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.rows.is_empty() && self.state_rows.is_empty()
    }
}
