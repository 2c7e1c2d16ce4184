//! What the service's handlers ask of the scheduling loop: one
//! [`Command`] per request, each with its [`Reply`] channel. A leaf: the
//! handlers, the agent sessions and the loop depend on it, it on none of
//! them.

use std::sync::Arc;

use peloton_engine::PoolConfig;
use peloton_proto::v1 as pb;
use tokio::sync::{broadcast, oneshot};
use tonic::Status;

use crate::agent_hub::{Outbox, Registration};
use crate::convert::{self, JobPlan, TaskTemplate};
use crate::lifecycle::JobAction;

/// A reply channel.
pub type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// Events of one commit, as published to watchers.
pub type EventBatch = Arc<Vec<pb::Event>>;

/// A request to the loop, by group (each group has its handler).
#[derive(Debug)]
pub enum Command {
    /// An application command.
    App(AppCommand),
    /// Tokens, certificates and the audit log.
    Access(AccessCommand),
    /// Resource pools and their queues.
    Pools(PoolCommand),
    /// Jobs and their tasks.
    Jobs(JobCommand),
    /// Hosts, host pools, maintenance and the watch.
    Hosts(HostCommand),
    /// Agents' sessions: registrations, reports, goodbyes, log requests.
    Agents(AgentCommand),
    /// Rolling updates and volumes.
    Updates(UpdateCommand),
    /// Finish the current batch and stop.
    Shutdown,
}

/// A command about tokens, certificates or the audit log.
#[derive(Debug)]
pub enum AccessCommand {
    /// Create a token (the caller, name and grants are checked).
    CreateToken {
        /// The token, its grants parsed (its creation time is set by the
        /// core).
        token: Box<crate::lifecycle::Token>,
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
        /// Its fingerprint and expiry (the issue time is set by the core).
        certificate: crate::lifecycle::Certificate,
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
}

/// A command about resource pools.
#[derive(Debug)]
pub enum PoolCommand {
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
        /// Delete its ended jobs with it.
        force: bool,
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
}

/// A command about jobs and tasks.
#[derive(Debug)]
pub enum JobCommand {
    /// Create a job.
    CreateJob {
        /// Validated (its spec as sent, without secrets: `JobPlan::spec`).
        plan: Box<JobPlan>,
        /// Its secrets (names checked; values resolved by the core).
        secrets: Vec<crate::lifecycle::Secret>,
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
    /// Plan a job: where and when it would start (changes nothing).
    PlanJob {
        /// The job's plan (checked).
        plan: Box<crate::lifecycle::JobPlan>,
        /// Reply.
        reply: Reply<pb::PlanJobResponse>,
    },
    /// Read the usage ledger.
    ListUsage {
        /// Filters, grouping and page (checked).
        request: pb::ListUsageRequest,
        /// Only the jobs this caller may read (none: all).
        viewer: Option<Arc<crate::access::Caller>>,
        /// Reply.
        reply: Reply<pb::ListUsageResponse>,
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
}

/// A command about hosts, host pools or the watch.
#[derive(Debug)]
pub enum HostCommand {
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
        /// Preempt their tasks of jobs of other host pools.
        force: bool,
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
}

/// A command from an agent's session.
#[derive(Debug)]
pub enum AgentCommand {
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
    /// A usage report from an agent (soft state: it writes nothing, and
    /// is dropped while the store cannot write).
    AgentUsage {
        /// The session it came on (a replaced session's is dropped).
        session: u64,
        /// The report, in the core's terms.
        report: Box<crate::lifecycle::usage::UsageReport>,
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
}

/// A command about updates or volumes.
#[derive(Debug)]
pub enum UpdateCommand {
    /// Start a rolling update.
    UpdateJob {
        /// Job id.
        job_id: String,
        /// Expected job version (0: any).
        version: u64,
        /// Validated (its spec as sent, without secrets).
        plan: Box<JobPlan>,
        /// The new set of secrets (an empty value keeps the current one).
        secrets: Vec<crate::lifecycle::Secret>,
        /// How to roll.
        update: crate::lifecycle::UpdateSpec,
        /// Reply: the update (none: a batch job, edited in place) and the
        /// job.
        reply: Reply<(Option<pb::Update>, pb::Job)>,
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
}

/// An application command, validated by the service.
#[derive(Debug)]
pub enum AppCommand {
    /// A new application job (client mode).
    Create {
        /// Its job (type APPLICATION, no instances, no secrets), validated.
        plan: Box<convert::JobPlan>,
        /// Reply.
        reply: Reply<pb::Application>,
    },
    /// The driver of an application job registers (cluster mode).
    Attach {
        /// The job.
        id: String,
        /// The executor as sent.
        executor: Box<pb::TaskSpec>,
        /// Validated.
        template: Box<TaskTemplate>,
        /// The driver's URL.
        driver_url: String,
        /// Bound on executors.
        max_executors: u32,
        /// Reply.
        reply: Reply<pb::Application>,
    },
    /// Read one.
    Get {
        /// The job.
        id: String,
        /// Reply.
        reply: Reply<pb::Application>,
    },
    /// A new target.
    Target {
        /// The job.
        id: String,
        /// Generation.
        generation: u64,
        /// Executors wanted.
        total: u32,
        /// Reply.
        reply: Reply<pb::SetExecutorTargetResponse>,
    },
    /// Kill executors by id.
    Kill {
        /// The job.
        id: String,
        /// Executor ids as sent.
        executor_ids: Vec<String>,
        /// Reply.
        reply: Reply<pb::KillExecutorsResponse>,
    },
    /// The application ends.
    Unregister {
        /// The job.
        id: String,
        /// Reply.
        reply: Reply<pb::Application>,
    },
}
