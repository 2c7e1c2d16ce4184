//! The gRPC services: thin handlers that validate what needs no engine
//! state, send a [`Command`] to the loop and await its answer. They never
//! touch engine state themselves.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use pb::host_pool_service_server::HostPoolService;
use pb::host_service_server::HostService;
use pb::job_service_server::JobService;
use pb::resource_pool_service_server::ResourcePoolService;
use pb::task_service_server::TaskService;
use pb::update_service_server::UpdateService;
use pb::volume_service_server::VolumeService;
use peloton_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::access::{self, Access, Caller};
use crate::agent_hub::AgentHub;
use crate::command::{
    AgentCommand, Command, HostCommand, JobCommand, PoolCommand, Reply, UpdateCommand,
};
use crate::convert::{self, Limits};
use crate::lifecycle::JobAction;
use crate::lifecycle::{UpdateAction, UpdateSpec};
use crate::metrics::Metrics;
use crate::paging;
use crate::store::Store;
use peloton_authz::Permission;

mod access_service;
mod apps;
mod watch;
pub mod watch_buffers;

pub use watch_buffers::{DEFAULT_WATCH_BUFFER_BYTES, DEFAULT_WATCH_MEMORY_BYTES, WatchMemory};

/// Handlers of every service.
#[derive(Clone, Debug)]
pub struct Api {
    tx: mpsc::Sender<Command>,
    limits: Limits,
    store: Arc<dyn Store>,
    hub: Option<Arc<AgentHub>>,
    metrics: Option<Arc<Metrics>>,
    /// This server's standing (PostgreSQL store): watch streams end with
    /// UNAVAILABLE when it stops leading, so clients look for the leader.
    role: Option<Arc<crate::leader::Role>>,
    /// Tokens and jobs' pools.
    access: Arc<Access>,
    /// What every watch's buffer holds, bounded.
    watch_memory: Arc<WatchMemory>,
}

/// Largest log chunk asked of an agent.
const LOG_CHUNK_BYTES: u32 = 256 * 1024;
/// Most lines a log read's tail goes back (`TaskLogsRequest.tail_lines`;
/// the agent's bound too).
const MAX_LOG_TAIL_LINES: u32 = 100_000;
/// How long an agent has to answer a log read.
const LOG_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a followed log is polled once it has no new bytes.
const LOG_FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(250);

fn gone() -> Status {
    Status::unavailable("the server is shutting down")
}

impl Api {
    /// Handlers sending to the loop behind `tx`.
    pub fn new(tx: mpsc::Sender<Command>, limits: Limits, store: Arc<dyn Store>) -> Self {
        Api {
            tx,
            limits,
            store,
            hub: None,
            metrics: None,
            role: None,
            access: Arc::new(Access::insecure()),
            watch_memory: WatchMemory::new(
                DEFAULT_WATCH_MEMORY_BYTES,
                DEFAULT_WATCH_BUFFER_BYTES,
                None,
            ),
        }
    }

    /// Handlers whose watches' buffers share `memory`.
    pub fn with_watch_memory(mut self, memory: Arc<WatchMemory>) -> Self {
        self.watch_memory = memory;
        self
    }

    /// Handlers checking callers against `access`.
    pub fn with_access(mut self, access: Arc<Access>) -> Self {
        self.access = access;
        self
    }

    /// The caller, if reads must be filtered for it (it does not see
    /// everything).
    fn viewer<T>(request: &Request<T>) -> Result<Option<Arc<Caller>>, Status> {
        let c = access::caller(request)?;
        Ok((!c.principal.sees_everything()).then_some(c))
    }

    /// What `Create` and `Plan` check of a new job's spec: JobsWrite on its
    /// pool, its owner (see [`Api::owner_of`]), and the spec itself; the
    /// spec as it will be kept and its plan.
    fn new_job<T>(
        &self,
        request: &Request<T>,
        spec: Option<&pb::JobSpec>,
    ) -> Result<(pb::JobSpec, Box<crate::lifecycle::JobPlan>), Status> {
        let spec = spec.ok_or_else(|| convert::invalid("spec", "missing"))?;
        let (pool, name) = (&spec.pool, &spec.name);
        access::require(
            request,
            Permission::JobsWrite,
            pool,
            format!("{pool} {name}"),
        )?;
        let owner = self.owner_of(request, "spec.owner", &spec.owner)?;
        convert::job_name("spec.name", &spec.name)?;
        let mut spec = convert::cluster_mode_spec(spec.clone())?;
        spec.owner = owner;
        self.resolve_after(&*access::caller(request)?, &mut spec)?;
        let plan = Box::new(convert::job_plan(&spec, &self.limits)?);
        Ok((spec, plan))
    }

    /// Puts the full id of each job `spec.after` names in its place (the
    /// id, or a unique start of it among the jobs `caller` may read), so
    /// the stored spec names whole ids. A job the caller may not read is
    /// NOT_FOUND, as one that does not exist (which the core refuses): a
    /// job cannot wait for a job its creator cannot see, and so learn how
    /// that one ended.
    fn resolve_after(&self, caller: &access::Caller, spec: &mut pb::JobSpec) -> Result<(), Status> {
        let Some(after) = spec.after.as_mut() else {
            return Ok(());
        };
        let n = after.succeeded.len() + after.finished.len() + after.failed.len();
        if n > crate::lifecycle::MAX_DEPENDENCIES {
            // Refused by validation, before a lookup per entry.
            return Ok(());
        }
        for (name, list) in [
            ("succeeded", &mut after.succeeded),
            ("finished", &mut after.finished),
            ("failed", &mut after.failed),
        ] {
            for (i, given) in list.iter_mut().enumerate() {
                let field = format!("spec.after.{name}[{i}]");
                if let Some(full) = self.access.resolve_job(caller, &field, given)? {
                    *given = full.to_string();
                }
                if let Some(pool) = self.access.job_pool(given)
                    && access::allow(caller, Permission::JobsRead, &pool).is_err()
                {
                    return Err(Status::not_found(format!("{field}: job {given} not found")));
                }
            }
        }
        Ok(())
    }

    /// The owner of a job `request` creates: on a secure server the name
    /// of its token (the authenticated principal), whatever the spec says;
    /// on an insecure one the spec's `owner`.
    pub(crate) fn owner_of<T>(
        &self,
        request: &Request<T>,
        field: &str,
        spec_owner: &str,
    ) -> Result<String, Status> {
        // What was sent is checked even when it is replaced.
        convert::bounded(field, spec_owner, convert::MAX_NAME_BYTES)?;
        if !self.access.is_secure() {
            return Ok(spec_owner.to_string());
        }
        Ok(access::caller(request)?.principal.name().to_string())
    }

    /// Puts the full id of the job the request's `field` names in its
    /// place (the id, or a unique start of it: [`access::Access::resolve_job`])
    /// and checks `permission` on the job's pool (see
    /// [`access::require_job`]).
    fn on_job<T>(
        &self,
        request: &mut Request<T>,
        permission: Permission,
        field: &str,
        id: impl Fn(&mut T) -> &mut String,
    ) -> Result<(), Status> {
        self.full_job_id(request, field, &id)?;
        let job = id(request.get_mut()).clone();
        access::require_job(&self.access, request, permission, &job).map(drop)
    }

    /// Puts the full id of the job the request's `field` names in its
    /// place, if it names one (the id, or a unique start of it among the
    /// jobs the caller reads: [`access::Access::resolve_job`]); for filters
    /// that need no permission of their own.
    fn full_job_id<T>(
        &self,
        request: &mut Request<T>,
        field: &str,
        id: &impl Fn(&mut T) -> &mut String,
    ) -> Result<(), Status> {
        let caller = access::caller(request)?;
        let given = id(request.get_mut());
        if let Some(full) = self.access.resolve_job(&caller, field, given)? {
            *given = full.to_string();
        }
        Ok(())
    }

    /// Handlers whose watch streams end when `role` stops leading.
    pub fn with_role(mut self, role: Arc<crate::leader::Role>) -> Self {
        self.role = Some(role);
        self
    }

    /// Handlers that count their watch streams and buffers in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Handlers that can read logs from agents through `hub`.
    pub fn with_hub(mut self, hub: Option<Arc<AgentHub>>) -> Self {
        self.hub = hub;
        self
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Status> {
        let (reply, answer) = oneshot::channel();
        // A full channel makes this wait: backpressure on every client.
        self.tx.send(make(reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

fn check_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(convert::invalid(field, "must not be empty"));
    }
    convert::id(field, id)
}

fn check_path(path: &str) -> Result<(), Status> {
    if path.is_empty() {
        return Err(convert::invalid("path", "must not be empty"));
    }
    convert::pool_path("path", path)
}

/// Most host names in one call.
const MAX_HOSTS_PER_CALL: usize = 10_000;

/// Refuses a list of host names that is too long or holds a name that is
/// empty or too long.
fn check_hosts(field: &str, hosts: &[String]) -> Result<(), Status> {
    if hosts.len() > MAX_HOSTS_PER_CALL {
        return Err(convert::invalid(
            field,
            format!("{} hosts; the limit is {MAX_HOSTS_PER_CALL}", hosts.len()),
        ));
    }
    for (i, h) in hosts.iter().enumerate() {
        check_id(&format!("{field}[{i}]"), h)?;
    }
    Ok(())
}

/// Refuses a filter value that is not one of the enum's named values, or
/// is its UNKNOWN value (which matches nothing): never a silent empty
/// answer.
fn check_enum_filter<E: TryFrom<i32>>(
    field: &str,
    values: &[i32],
    what: &str,
) -> Result<(), Status> {
    for (i, &v) in values.iter().enumerate() {
        if v == 0 || E::try_from(v).is_err() {
            return Err(convert::invalid(
                &format!("{field}[{i}]"),
                format!("{v} is not a {what} a filter can match"),
            ));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl ResourcePoolService for Api {
    async fn create(
        &self,
        request: Request<pb::CreatePoolRequest>,
    ) -> Result<Response<pb::CreatePoolResponse>, Status> {
        let path = request.get_ref().path.clone();
        access::require(&request, Permission::PoolsWrite, &path, path.clone())?;
        let r = request.into_inner();
        check_path(&r.path)?;
        let config = convert::pool_config(r.spec.as_ref())?;
        let pool = self
            .call(|reply| {
                Command::Pools(PoolCommand::CreatePool {
                    path: r.path,
                    config,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::CreatePoolResponse { pool: Some(pool) }))
    }

    async fn get(
        &self,
        request: Request<pb::GetPoolRequest>,
    ) -> Result<Response<pb::GetPoolResponse>, Status> {
        let path = request.get_ref().path.clone();
        access::require(&request, Permission::PoolsRead, &path, path.clone())?;
        let r = request.into_inner();
        check_path(&r.path)?;
        let pool = self
            .call(|reply| {
                Command::Pools(PoolCommand::GetPool {
                    path: r.path,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::GetPoolResponse { pool: Some(pool) }))
    }

    async fn update(
        &self,
        request: Request<pb::UpdatePoolRequest>,
    ) -> Result<Response<pb::UpdatePoolResponse>, Status> {
        let path = request.get_ref().path.clone();
        access::require(&request, Permission::PoolsWrite, &path, path.clone())?;
        let r = request.into_inner();
        check_path(&r.path)?;
        let config = convert::pool_config(r.spec.as_ref())?;
        let pool = self
            .call(|reply| {
                Command::Pools(PoolCommand::UpdatePool {
                    path: r.path,
                    config,
                    version: r.version,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::UpdatePoolResponse { pool: Some(pool) }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeletePoolRequest>,
    ) -> Result<Response<pb::DeletePoolResponse>, Status> {
        let path = request.get_ref().path.clone();
        access::require(&request, Permission::PoolsWrite, &path, path.clone())?;
        let r = request.into_inner();
        check_path(&r.path)?;
        self.call(|reply| {
            Command::Pools(PoolCommand::DeletePool {
                path: r.path,
                version: r.version,
                force: r.force,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::DeletePoolResponse {}))
    }

    async fn list(
        &self,
        request: Request<pb::ListPoolsRequest>,
    ) -> Result<Response<pb::ListPoolsResponse>, Status> {
        let viewer = Self::viewer(&request)?;
        let request = request.into_inner();
        paging::page_token_key("page_token", paging::PageKind::Pools, &request.page_token)?;
        let out = self
            .call(|reply| {
                Command::Pools(PoolCommand::ListPools {
                    request,
                    viewer,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(out))
    }

    async fn list_queue(
        &self,
        request: Request<pb::ListQueueRequest>,
    ) -> Result<Response<pb::ListQueueResponse>, Status> {
        let path = request.get_ref().path.clone();
        access::require(&request, Permission::PoolsRead, &path, path.clone())?;
        let r = request.into_inner();
        check_path(&r.path)?;
        if r.limit as usize > peloton_engine::MAX_QUEUE_READ {
            return Err(convert::invalid(
                "limit",
                format!(
                    "{} is above the most entries read at once, {}",
                    r.limit,
                    peloton_engine::MAX_QUEUE_READ
                ),
            ));
        }
        let out = self
            .call(|reply| {
                Command::Pools(PoolCommand::ListQueue {
                    path: r.path,
                    limit: r.limit,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(out))
    }
}

impl Api {
    /// `caller` may do `permission` on `job`'s pool (the job is known: its
    /// record was just read).
    fn allow_job(&self, caller: &Caller, permission: Permission, job: &str) -> Result<(), Status> {
        let pool = self
            .access
            .job_pool_or_deleted(job)
            .unwrap_or_else(|| "/".into());
        access::allow(caller, permission, &pool)
    }

    /// Refuses a list of instances longer than a job may have.
    fn check_instances(&self, instances: &[u32]) -> Result<(), Status> {
        let max = self.limits.max_instances_per_job as usize;
        if instances.len() > max {
            return Err(convert::invalid(
                "instances",
                format!("{} instances; a job has at most {max}", instances.len()),
            ));
        }
        Ok(())
    }

    async fn job_action(
        &self,
        id: String,
        version: u64,
        action: JobAction,
    ) -> Result<Option<pb::Job>, Status> {
        check_id("id", &id)?;
        self.call(|reply| {
            Command::Jobs(JobCommand::JobAction {
                id,
                version,
                action,
                reply,
            })
        })
        .await
    }
}

#[tonic::async_trait]
impl JobService for Api {
    async fn create(
        &self,
        request: Request<pb::CreateJobRequest>,
    ) -> Result<Response<pb::CreateJobResponse>, Status> {
        let spec = request.get_ref().spec.as_ref();
        let (mut spec, plan) = self.new_job(&request, spec)?;
        let secrets = crate::codec::from_pb(std::mem::take(&mut spec.secrets));
        let job = self
            .call(|reply| {
                Command::Jobs(JobCommand::CreateJob {
                    plan,
                    secrets,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::CreateJobResponse { job: Some(job) }))
    }

    async fn plan(
        &self,
        request: Request<pb::PlanJobRequest>,
    ) -> Result<Response<pb::PlanJobResponse>, Status> {
        let spec = request.get_ref().spec.as_ref();
        let (_, plan) = self.new_job(&request, spec)?;
        let answer = self
            .call(|reply| Command::Jobs(JobCommand::PlanJob { plan, reply }))
            .await?;
        Ok(Response::new(answer))
    }

    async fn get(
        &self,
        mut request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "id", |r| &mut r.id)?;
        let id = request.into_inner().id;
        check_id("id", &id)?;
        let job = self
            .call(|reply| Command::Jobs(JobCommand::GetJob { id, reply }))
            .await?;
        Ok(Response::new(pb::GetJobResponse { job: Some(job) }))
    }

    async fn query(
        &self,
        request: Request<pb::QueryJobsRequest>,
    ) -> Result<Response<pb::QueryJobsResponse>, Status> {
        let viewer = Self::viewer(&request)?;
        let request = request.into_inner();
        if !request.pool.is_empty() {
            convert::pool_path("pool", &request.pool)?;
        }
        check_enum_filter::<pb::JobState>("states", &request.states, "job state")?;
        convert::bounded("name", &request.name, convert::MAX_NAME_BYTES)?;
        convert::bounded("owner", &request.owner, convert::MAX_NAME_BYTES)?;
        convert::labels("labels", &request.labels, &self.limits)?;
        paging::page_token_key("page_token", paging::PageKind::Jobs, &request.page_token)?;
        let out = self
            .call(|reply| {
                Command::Jobs(JobCommand::QueryJobs {
                    request,
                    viewer,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(out))
    }

    async fn list_usage(
        &self,
        mut request: Request<pb::ListUsageRequest>,
    ) -> Result<Response<pb::ListUsageResponse>, Status> {
        let viewer = Self::viewer(&request)?;
        if !request.get_ref().job_id.is_empty() {
            self.full_job_id(&mut request, "job_id", &|r: &mut pb::ListUsageRequest| {
                &mut r.job_id
            })?;
        }
        let request = request.into_inner();
        if !request.pool.is_empty() {
            convert::pool_path("pool", &request.pool)?;
        }
        convert::bounded("owner", &request.owner, convert::MAX_NAME_BYTES)?;
        if !request.job_id.is_empty() {
            check_id("job_id", &request.job_id)?;
        }
        if pb::UsageGroupBy::try_from(request.group_by).is_err() {
            return Err(convert::invalid(
                "group_by",
                format!("unknown grouping {}", request.group_by),
            ));
        }
        if request.until_ms != 0 && request.until_ms <= request.since_ms {
            return Err(convert::invalid(
                "until_ms",
                format!(
                    "{} is not after since_ms {}",
                    request.until_ms, request.since_ms
                ),
            ));
        }
        paging::page_token_key("page_token", paging::PageKind::Usage, &request.page_token)?;
        let out = self
            .call(|reply| {
                Command::Jobs(JobCommand::ListUsage {
                    request,
                    viewer,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(out))
    }

    async fn kill(
        &self,
        mut request: Request<pb::KillJobRequest>,
    ) -> Result<Response<pb::KillJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "id", |r| &mut r.id)?;
        let r = request.into_inner();
        let job = self.job_action(r.id, r.version, JobAction::Kill).await?;
        Ok(Response::new(pb::KillJobResponse { job }))
    }

    async fn delete(
        &self,
        mut request: Request<pb::DeleteJobRequest>,
    ) -> Result<Response<pb::DeleteJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "id", |r| &mut r.id)?;
        let r = request.into_inner();
        self.job_action(r.id, r.version, JobAction::Delete).await?;
        Ok(Response::new(pb::DeleteJobResponse {}))
    }

    async fn scale(
        &self,
        mut request: Request<pb::ScaleJobRequest>,
    ) -> Result<Response<pb::ScaleJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "id", |r| &mut r.id)?;
        let r = request.into_inner();
        let job = self
            .job_action(r.id, r.version, JobAction::Scale(r.instance_count))
            .await?;
        Ok(Response::new(pb::ScaleJobResponse { job }))
    }

    async fn edit(
        &self,
        mut request: Request<pb::EditJobRequest>,
    ) -> Result<Response<pb::EditJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "id", |r| &mut r.id)?;
        let r = request.into_inner();
        let edit = crate::lifecycle::JobEdit {
            priority: r.priority,
            max_running: r.max_running_instances,
            max_running_time_ms: r.max_running_time_ms,
            max_failures: r.max_failures,
        };
        let job = self
            .job_action(r.id, r.version, JobAction::Edit(edit))
            .await?;
        Ok(Response::new(pb::EditJobResponse { job }))
    }

    async fn cron_action(
        &self,
        mut request: Request<pb::CronActionRequest>,
    ) -> Result<Response<pb::CronActionResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "id", |r| &mut r.id)?;
        let r = request.into_inner();
        let action = match pb::CronActionKind::try_from(r.action) {
            Ok(pb::CronActionKind::RunNow) => JobAction::CronRunNow,
            Ok(pb::CronActionKind::Suspend) => JobAction::CronSuspend(true),
            Ok(pb::CronActionKind::Resume) => JobAction::CronSuspend(false),
            _ => {
                return Err(convert::invalid(
                    "action",
                    format!("{} is not an action: RUN_NOW, SUSPEND or RESUME", r.action),
                ));
            }
        };
        let job = self.job_action(r.id, r.version, action).await?;
        Ok(Response::new(pb::CronActionResponse { job }))
    }

    async fn restart(
        &self,
        mut request: Request<pb::RestartJobRequest>,
    ) -> Result<Response<pb::RestartJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "id", |r| &mut r.id)?;
        let r = request.into_inner();
        let job = self.job_action(r.id, r.version, JobAction::Restart).await?;
        Ok(Response::new(pb::RestartJobResponse { job }))
    }
}

type LogStream = Pin<Box<dyn Stream<Item = Result<pb::TaskLogsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl TaskService for Api {
    type LogsStream = LogStream;

    async fn logs(
        &self,
        mut request: Request<pb::TaskLogsRequest>,
    ) -> Result<Response<LogStream>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "job_id", |r| {
            &mut r.job_id
        })?;
        let caller = access::caller(&request)?;
        let r = request.into_inner();
        check_id("job_id", &r.job_id)?;
        if r.tail_lines > MAX_LOG_TAIL_LINES {
            return Err(convert::invalid(
                "tail_lines",
                format!("{} is more than {MAX_LOG_TAIL_LINES}", r.tail_lines),
            ));
        }
        let Some(hub) = self.hub.clone() else {
            return Err(Status::failed_precondition(
                "runs on simulated hosts have no logs",
            ));
        };
        let job_id = r.job_id.clone();
        let target = move |run_id: u32| {
            let (job_id, instance) = (job_id.clone(), r.instance);
            move |reply| {
                Command::Agents(AgentCommand::LogTarget {
                    job_id,
                    instance,
                    run_id,
                    reply,
                })
            }
        };
        let mut current = self.call(target(r.run_id)).await?;
        let (tx, rx) = mpsc::channel(4);
        let api = self.clone();
        tokio::spawn(async move {
            let mut offset = r.offset;
            // The tail and the time go with the first read only: it finds
            // where to start, the others go on from there.
            let mut first = true;
            // Errors inside the stream keep the contract too (an agent's
            // error text is not ours to trust).
            let fail = |e: Status| async {
                let _ = tx.send(Err(crate::status::contract(e))).await;
            };
            loop {
                let (key, outbox) = &current;
                let run_id = key.run_id;
                let id = hub.next_id();
                let answer = hub.expect_log(id, outbox);
                let ask = pb::ServerMessage {
                    kind: Some(pb::server_message::Kind::ReadLog(pb::ReadLog {
                        request_id: id,
                        key: Some(key.clone()),
                        stderr: r.stderr,
                        offset,
                        max_bytes: LOG_CHUNK_BYTES,
                        tail_lines: if first { r.tail_lines } else { 0 },
                        since_ms: if first { r.since_ms } else { 0 },
                        times: r.timestamps,
                    })),
                };
                if outbox.send(Ok(ask)).await.is_err() {
                    hub.forget_log(id);
                    return fail(Status::unavailable("the run's agent disconnected")).await;
                }
                let chunk = match tokio::time::timeout(LOG_READ_TIMEOUT, answer).await {
                    Ok(Ok(c)) => c,
                    _ => {
                        hub.forget_log(id);
                        return fail(Status::unavailable("the run's agent did not answer")).await;
                    }
                };
                if !chunk.error.is_empty() {
                    return fail(Status::not_found(chunk.error)).await;
                }
                let n = chunk.data.len() as u64;
                first = false;
                // A tail or a time may start the output later than asked.
                offset = offset.max(chunk.offset.saturating_add(n));
                if n > 0 {
                    let out = pb::TaskLogsResponse {
                        data: chunk.data,
                        offset: chunk.offset,
                        marks: chunk.marks,
                    };
                    if tx.send(Ok(out)).await.is_err() {
                        return; // the client left
                    }
                }
                if chunk.eof || (n == 0 && !r.follow) {
                    return;
                }
                if n == 0 {
                    tokio::time::sleep(LOG_FOLLOW_POLL).await;
                    // The run may have ended or its agent reconnected.
                    current = match api.call(target(run_id)).await {
                        Ok(t) => t,
                        Err(e) => return fail(e).await,
                    };
                }
            }
        });
        Ok(Response::new(Box::pin(access::until_revoked(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            caller,
        ))))
    }

    async fn list(
        &self,
        mut request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "job_id", |r| {
            &mut r.job_id
        })?;
        let request = request.into_inner();
        check_id("job_id", &request.job_id)?;
        check_enum_filter::<pb::TaskState>("states", &request.states, "task state")?;
        let out = self
            .call(|reply| Command::Jobs(JobCommand::ListTasks { request, reply }))
            .await?;
        Ok(Response::new(out))
    }

    async fn get(
        &self,
        mut request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "job_id", |r| {
            &mut r.job_id
        })?;
        let r = request.into_inner();
        check_id("job_id", &r.job_id)?;
        let task = self
            .call(|reply| {
                Command::Jobs(JobCommand::GetTask {
                    job_id: r.job_id,
                    instance: r.instance,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::GetTaskResponse { task: Some(task) }))
    }

    async fn kill(
        &self,
        mut request: Request<pb::KillTaskRequest>,
    ) -> Result<Response<pb::KillTaskResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "job_id", |r| {
            &mut r.job_id
        })?;
        let r = request.into_inner();
        check_id("job_id", &r.job_id)?;
        self.check_instances(&r.instances)?;
        self.call(|reply| {
            Command::Jobs(JobCommand::TaskAction {
                job_id: r.job_id,
                instances: r.instances,
                version: r.job_version,
                restart: false,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::KillTaskResponse {}))
    }

    async fn restart(
        &self,
        mut request: Request<pb::RestartTaskRequest>,
    ) -> Result<Response<pb::RestartTaskResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "job_id", |r| {
            &mut r.job_id
        })?;
        let r = request.into_inner();
        check_id("job_id", &r.job_id)?;
        self.check_instances(&r.instances)?;
        self.call(|reply| {
            Command::Jobs(JobCommand::TaskAction {
                job_id: r.job_id,
                instances: r.instances,
                version: r.job_version,
                restart: true,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::RestartTaskResponse {}))
    }
}

#[tonic::async_trait]
impl HostService for Api {
    async fn list(
        &self,
        request: Request<pb::ListHostsRequest>,
    ) -> Result<Response<pb::ListHostsResponse>, Status> {
        access::require(&request, Permission::HostsRead, "/", "")?;
        let viewer = Self::viewer(&request)?;
        let request = request.into_inner();
        convert::id("after", &request.after)?;
        let mut out = self
            .call(|reply| Command::Hosts(HostCommand::ListHosts { request, reply }))
            .await?;
        if let Some(v) = viewer {
            // Hosts are everyone's; the tasks on them only their owners'
            // (`tasks_total` still counts every task).
            for h in &mut out.hosts {
                h.tasks.retain(|t| self.access.sees_job(&v, &t.job_id));
            }
        }
        Ok(Response::new(out))
    }

    async fn start_maintenance(
        &self,
        request: Request<pb::StartMaintenanceRequest>,
    ) -> Result<Response<pb::StartMaintenanceResponse>, Status> {
        let target = request.get_ref().hosts.join(",");
        access::require(&request, Permission::HostsWrite, "/", target)?;
        let hosts = request.into_inner().hosts;
        check_hosts("hosts", &hosts)?;
        self.call(|reply| {
            Command::Hosts(HostCommand::Maintenance {
                hosts,
                start: true,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::StartMaintenanceResponse {}))
    }

    async fn complete_maintenance(
        &self,
        request: Request<pb::CompleteMaintenanceRequest>,
    ) -> Result<Response<pb::CompleteMaintenanceResponse>, Status> {
        let target = request.get_ref().hosts.join(",");
        access::require(&request, Permission::HostsWrite, "/", target)?;
        let hosts = request.into_inner().hosts;
        check_hosts("hosts", &hosts)?;
        self.call(|reply| {
            Command::Hosts(HostCommand::Maintenance {
                hosts,
                start: false,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::CompleteMaintenanceResponse {}))
    }
}

#[tonic::async_trait]
impl HostPoolService for Api {
    async fn create(
        &self,
        request: Request<pb::CreateHostPoolRequest>,
    ) -> Result<Response<pb::CreateHostPoolResponse>, Status> {
        let target = request.get_ref().name.clone();
        access::require(&request, Permission::HostsWrite, "/", target)?;
        let name = request.into_inner().name;
        convert::host_pool_name("name", &name)?;
        let pool = self
            .call(|reply| Command::Hosts(HostCommand::CreateHostPool { name, reply }))
            .await?;
        Ok(Response::new(pb::CreateHostPoolResponse {
            pool: Some(pool),
        }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteHostPoolRequest>,
    ) -> Result<Response<pb::DeleteHostPoolResponse>, Status> {
        let target = request.get_ref().name.clone();
        access::require(&request, Permission::HostsWrite, "/", target)?;
        let name = request.into_inner().name;
        convert::host_pool_name("name", &name)?;
        self.call(|reply| Command::Hosts(HostCommand::DeleteHostPool { name, reply }))
            .await?;
        Ok(Response::new(pb::DeleteHostPoolResponse {}))
    }

    async fn list(
        &self,
        request: Request<pb::ListHostPoolsRequest>,
    ) -> Result<Response<pb::ListHostPoolsResponse>, Status> {
        access::require(&request, Permission::HostsRead, "/", "")?;
        let request = request.into_inner();
        paging::page_token_key(
            "page_token",
            paging::PageKind::HostPools,
            &request.page_token,
        )?;
        let out = self
            .call(|reply| Command::Hosts(HostCommand::ListHostPools { request, reply }))
            .await?;
        Ok(Response::new(out))
    }

    async fn move_hosts(
        &self,
        request: Request<pb::MoveHostsRequest>,
    ) -> Result<Response<pb::MoveHostsResponse>, Status> {
        let target = format!(
            "{} -> {}",
            request.get_ref().hosts.join(","),
            request.get_ref().to
        );
        access::require(&request, Permission::HostsWrite, "/", target)?;
        let r = request.into_inner();
        convert::host_pool_name("to", &r.to)?;
        if r.hosts.is_empty() {
            return Err(convert::invalid("hosts", "name at least one host"));
        }
        if r.hosts.len() > self.limits.max_list_len {
            return Err(convert::invalid(
                "hosts",
                format!(
                    "{} hosts; the limit is {}",
                    r.hosts.len(),
                    self.limits.max_list_len
                ),
            ));
        }
        check_hosts("hosts", &r.hosts)?;
        self.call(|reply| {
            Command::Hosts(HostCommand::MoveHosts {
                hosts: r.hosts,
                to: r.to,
                force: r.force,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::MoveHostsResponse {}))
    }
}

/// Largest batch of an update.
const MAX_UPDATE_BATCH: u32 = 100_000;

fn update_spec(u: Option<&pb::UpdateSpec>) -> Result<UpdateSpec, Status> {
    let u = u.cloned().unwrap_or_default();
    if u.batch_size > MAX_UPDATE_BATCH {
        return Err(convert::invalid(
            "update.batch_size",
            format!(
                "{} is more than the limit of {MAX_UPDATE_BATCH}",
                u.batch_size
            ),
        ));
    }
    Ok(UpdateSpec {
        batch_size: u.batch_size.max(1),
        max_instance_retries: u.max_instance_retries,
        max_failed_instances: u.max_failed_instances,
        rollback_on_failure: u.rollback_on_failure,
        start_paused: u.start_paused,
    })
}

impl Api {
    async fn update_action(
        &self,
        request: Request<pb::UpdateActionRequest>,
        action: UpdateAction,
    ) -> Result<Response<pb::UpdateActionResponse>, Status> {
        access::note(&request, request.get_ref().id.clone());
        let caller = access::caller(&request)?;
        let id = request.into_inner().id;
        check_id("id", &id)?;
        // An update's job never changes: its pool is checked first.
        let current = self
            .call(|reply| {
                Command::Updates(UpdateCommand::GetUpdate {
                    id: id.clone(),
                    reply,
                })
            })
            .await?;
        self.allow_job(&caller, Permission::JobsWrite, &current.job_id)?;
        let update = self
            .call(|reply| Command::Updates(UpdateCommand::UpdateAction { id, action, reply }))
            .await?;
        Ok(Response::new(pb::UpdateActionResponse {
            update: Some(update),
        }))
    }
}

#[tonic::async_trait]
impl UpdateService for Api {
    async fn create(
        &self,
        mut request: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::UpdateJobResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "job_id", |r| {
            &mut r.job_id
        })?;
        let caller = access::caller(&request)?;
        let r = request.into_inner();
        check_id("job_id", &r.job_id)?;
        let mut spec = r.spec.ok_or_else(|| convert::invalid("spec", "missing"))?;
        self.resolve_after(&caller, &mut spec)?;
        let plan = Box::new(convert::job_plan(&spec, &self.limits)?);
        let secrets = crate::codec::from_pb(std::mem::take(&mut spec.secrets));
        let update = update_spec(r.update.as_ref())?;
        let (update, job) = self
            .call(|reply| {
                Command::Updates(UpdateCommand::UpdateJob {
                    job_id: r.job_id,
                    version: r.version,
                    plan,
                    secrets,
                    update,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::UpdateJobResponse {
            update,
            job: Some(job),
        }))
    }

    async fn get(
        &self,
        request: Request<pb::GetUpdateRequest>,
    ) -> Result<Response<pb::GetUpdateResponse>, Status> {
        let caller = access::caller(&request)?;
        let id = request.into_inner().id;
        check_id("id", &id)?;
        let update = self
            .call(|reply| Command::Updates(UpdateCommand::GetUpdate { id, reply }))
            .await?;
        self.allow_job(&caller, Permission::JobsRead, &update.job_id)?;
        Ok(Response::new(pb::GetUpdateResponse {
            update: Some(update),
        }))
    }

    async fn list(
        &self,
        mut request: Request<pb::ListUpdatesRequest>,
    ) -> Result<Response<pb::ListUpdatesResponse>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "job_id", |r| {
            &mut r.job_id
        })?;
        let job_id = request.into_inner().job_id;
        check_id("job_id", &job_id)?;
        let updates = self
            .call(|reply| Command::Updates(UpdateCommand::ListUpdates { job_id, reply }))
            .await?;
        Ok(Response::new(pb::ListUpdatesResponse { updates }))
    }

    async fn pause(
        &self,
        request: Request<pb::UpdateActionRequest>,
    ) -> Result<Response<pb::UpdateActionResponse>, Status> {
        self.update_action(request, UpdateAction::Pause).await
    }

    async fn resume(
        &self,
        request: Request<pb::UpdateActionRequest>,
    ) -> Result<Response<pb::UpdateActionResponse>, Status> {
        self.update_action(request, UpdateAction::Resume).await
    }

    async fn abort(
        &self,
        request: Request<pb::UpdateActionRequest>,
    ) -> Result<Response<pb::UpdateActionResponse>, Status> {
        self.update_action(request, UpdateAction::Abort).await
    }

    async fn rollback(
        &self,
        request: Request<pb::UpdateActionRequest>,
    ) -> Result<Response<pb::UpdateActionResponse>, Status> {
        self.update_action(request, UpdateAction::Rollback).await
    }
}

#[tonic::async_trait]
impl VolumeService for Api {
    async fn list(
        &self,
        mut request: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        let viewer = Self::viewer(&request)?;
        if !request.get_ref().job_id.is_empty() {
            if viewer.is_some() {
                self.on_job(&mut request, Permission::JobsRead, "job_id", |r| {
                    &mut r.job_id
                })?;
            } else {
                self.full_job_id(&mut request, "job_id", &|r: &mut pb::ListVolumesRequest| {
                    &mut r.job_id
                })?;
            }
        }
        let request = request.into_inner();
        convert::id("job_id", &request.job_id)?;
        convert::id("host", &request.host)?;
        paging::page_token_key("page_token", paging::PageKind::Volumes, &request.page_token)?;
        let out = self
            .call(|reply| Command::Updates(UpdateCommand::ListVolumes { request, reply }))
            .await?;
        let mut out = out;
        if let Some(v) = viewer {
            // A page may hold fewer volumes than asked: follow its token.
            out.volumes
                .retain(|vol| self.access.sees_job(&v, &vol.job_id));
        }
        Ok(Response::new(out))
    }

    async fn get(
        &self,
        request: Request<pb::GetVolumeRequest>,
    ) -> Result<Response<pb::GetVolumeResponse>, Status> {
        let caller = access::caller(&request)?;
        let id = request.into_inner().id;
        check_id("id", &id)?;
        let volume = self
            .call(|reply| Command::Updates(UpdateCommand::GetVolume { id, reply }))
            .await?;
        self.allow_job(&caller, Permission::JobsRead, &volume.job_id)?;
        Ok(Response::new(pb::GetVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        access::note(&request, request.get_ref().id.clone());
        let caller = access::caller(&request)?;
        let id = request.into_inner().id;
        check_id("id", &id)?;
        // A volume's job never changes: its pool is checked first.
        let volume = self
            .call(|reply| {
                Command::Updates(UpdateCommand::GetVolume {
                    id: id.clone(),
                    reply,
                })
            })
            .await?;
        self.allow_job(&caller, Permission::JobsWrite, &volume.job_id)?;
        self.call(|reply| Command::Updates(UpdateCommand::DeleteVolume { id, reply }))
            .await?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }
}
