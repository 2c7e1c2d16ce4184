//! `ApplicationService`: a framework's driver keeps its executors here.
//! Handlers validate and send [`AppCommand`]s to the loop; the executor
//! event stream is the job's watch, read as executor events, plus the
//! pending reasons of waiting executors as they change.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use pb::application_service_server::ApplicationService;
use pb::watch_service_server::WatchService;
use peloton_proto::v1 as pb;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::{Api, check_id};
use crate::access;
use crate::command::{AppCommand, Command, JobCommand};
use crate::convert;
use peloton_authz::Permission;

/// Most executor ids in one kill.
pub const MAX_KILL_IDS: usize = 10_000;

/// How often a stream looks at the pending reasons of waiting executors.
const PENDING_POLL: Duration = Duration::from_secs(1);

/// Messages a stream may hold for a slow client before it waits.
const STREAM_BUFFER: usize = 64;

type ExecutorStream =
    Pin<Box<dyn Stream<Item = Result<pb::WatchExecutorsResponse, Status>> + Send>>;

impl Api {
    async fn app(&self, id: String) -> Result<pb::Application, Status> {
        self.call(|reply| Command::App(AppCommand::Get { id, reply }))
            .await
    }
}

/// An error about the job spec Register builds, in the request's own
/// field names (`spec.default_task.resources.cpu` → `executor.resources.cpu`).
fn register_fields(s: Status) -> Status {
    let m = s.message();
    let renamed = if let Some(rest) = m.strip_prefix("spec.default_task") {
        format!("executor{rest}")
    } else if let Some(rest) = m.strip_prefix("spec.") {
        rest.to_string()
    } else {
        return s;
    };
    Status::new(s.code(), renamed)
}

/// The executor as the application's job runs it: validated, and run once.
fn executor_spec(
    e: Option<pb::TaskSpec>,
    limits: &convert::Limits,
) -> Result<(pb::TaskSpec, convert::TaskTemplate), Status> {
    let mut e = e.ok_or_else(|| convert::invalid("executor", "missing"))?;
    if e.volume.is_some() {
        return Err(convert::invalid(
            "executor.volume",
            "executors have no volumes (they run once)",
        ));
    }
    // An executor runs once; its replacement is a new executor.
    e.restart = None;
    let t = convert::task_template("executor", Some(&e), limits)?;
    Ok((e, t))
}

#[tonic::async_trait]
impl ApplicationService for Api {
    async fn register(
        &self,
        mut request: Request<pb::RegisterAppRequest>,
    ) -> Result<Response<pb::RegisterAppResponse>, Status> {
        let (job, pool) = (
            request.get_ref().job_id.clone(),
            request.get_ref().pool.clone(),
        );
        if job.is_empty() {
            access::require(&request, Permission::JobsWrite, &pool, pool.clone())?;
        } else {
            self.on_job(&mut request, Permission::JobsWrite, "job_id", |r| {
                &mut r.job_id
            })?;
        }
        let owner = self.owner_of(&request, "owner", &request.get_ref().owner)?;
        let r = request.into_inner();
        if r.driver_url.is_empty() {
            return Err(convert::invalid(
                "driver_url",
                "must say where executors reach the driver",
            ));
        }
        convert::bounded("driver_url", &r.driver_url, convert::MAX_NAME_BYTES)?;
        if r.max_executors > self.limits.max_instances_per_job {
            return Err(convert::invalid(
                "max_executors",
                format!(
                    "{} is more than the limit of {} instances per job",
                    r.max_executors, self.limits.max_instances_per_job
                ),
            ));
        }
        let (executor, template) = executor_spec(r.executor, &self.limits)?;
        let app = if r.job_id.is_empty() {
            if r.pool.is_empty() {
                return Err(convert::invalid(
                    "pool",
                    "must name a leaf pool (or give job_id: the driver's own job)",
                ));
            }
            let spec = pb::JobSpec {
                name: if r.name.is_empty() {
                    "application".into()
                } else {
                    r.name
                },
                owner,
                labels: r.labels,
                r#type: pb::JobType::Application as i32,
                pool: r.pool,
                instance_count: 0,
                default_task: Some(executor),
                sla: Some(pb::Sla {
                    priority: r.priority,
                    preemptible: !r.non_preemptible,
                    ..Default::default()
                }),
                placement: r.placement,
                application: Some(pb::ApplicationSpec {
                    driver_url: r.driver_url,
                    max_executors: r.max_executors,
                    driver_in_job: false,
                }),
                ..Default::default()
            };
            let plan = Box::new(convert::job_plan(&spec, &self.limits).map_err(register_fields)?);
            self.call(|reply| Command::App(AppCommand::Create { plan, reply }))
                .await
                .map_err(register_fields)?
        } else {
            check_id("job_id", &r.job_id)?;
            self.call(|reply| {
                Command::App(AppCommand::Attach {
                    id: r.job_id,
                    executor: Box::new(executor),
                    template: Box::new(template),
                    driver_url: r.driver_url,
                    max_executors: r.max_executors,
                    reply,
                })
            })
            .await
            .map_err(register_fields)?
        };
        Ok(Response::new(pb::RegisterAppResponse { app: Some(app) }))
    }

    async fn get(
        &self,
        mut request: Request<pb::GetAppRequest>,
    ) -> Result<Response<pb::GetAppResponse>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "app_id", |r| {
            &mut r.app_id
        })?;
        let id = request.into_inner().app_id;
        check_id("app_id", &id)?;
        let app = self.app(id).await?;
        Ok(Response::new(pb::GetAppResponse { app: Some(app) }))
    }

    async fn set_executor_target(
        &self,
        mut request: Request<pb::SetExecutorTargetRequest>,
    ) -> Result<Response<pb::SetExecutorTargetResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "app_id", |r| {
            &mut r.app_id
        })?;
        let r = request.into_inner();
        check_id("app_id", &r.app_id)?;
        let answer = self
            .call(|reply| {
                Command::App(AppCommand::Target {
                    id: r.app_id,
                    generation: r.generation,
                    total: r.total,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(answer))
    }

    async fn kill_executors(
        &self,
        mut request: Request<pb::KillExecutorsRequest>,
    ) -> Result<Response<pb::KillExecutorsResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "app_id", |r| {
            &mut r.app_id
        })?;
        let r = request.into_inner();
        check_id("app_id", &r.app_id)?;
        if r.executor_ids.len() > MAX_KILL_IDS {
            return Err(convert::invalid(
                "executor_ids",
                format!("{} ids; the limit is {MAX_KILL_IDS}", r.executor_ids.len()),
            ));
        }
        let answer = self
            .call(|reply| {
                Command::App(AppCommand::Kill {
                    id: r.app_id,
                    executor_ids: r.executor_ids,
                    reply,
                })
            })
            .await?;
        Ok(Response::new(answer))
    }

    async fn unregister(
        &self,
        mut request: Request<pb::UnregisterAppRequest>,
    ) -> Result<Response<pb::UnregisterAppResponse>, Status> {
        self.on_job(&mut request, Permission::JobsWrite, "app_id", |r| {
            &mut r.app_id
        })?;
        let id = request.into_inner().app_id;
        check_id("app_id", &id)?;
        let app = self
            .call(|reply| Command::App(AppCommand::Unregister { id, reply }))
            .await?;
        Ok(Response::new(pb::UnregisterAppResponse { app: Some(app) }))
    }

    type WatchExecutorsStream = ExecutorStream;

    async fn watch_executors(
        &self,
        mut request: Request<pb::WatchExecutorsRequest>,
    ) -> Result<Response<Self::WatchExecutorsStream>, Status> {
        self.on_job(&mut request, Permission::JobsRead, "app_id", |r| {
            &mut r.app_id
        })?;
        let caller = access::caller(&request)?;
        let caller_for_end = caller.clone();
        let r = request.into_inner();
        check_id("app_id", &r.app_id)?;
        let app = self.app(r.app_id.clone()).await?;
        let first = u32::from(app.driver_in_job);
        let watch = self
            .watch({
                let mut w = Request::new(pb::WatchRequest {
                    from_revision: r.from_revision,
                    job_id: r.app_id.clone(),
                });
                w.extensions_mut().insert(caller);
                w
            })
            .await?
            .into_inner();
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut follow = Follow {
            first,
            exited: HashSet::new(),
            pending: HashMap::new(),
        };
        // The first message at once: the executors waiting now, and why.
        let hello = follow.pending_changes(&app);
        if tx
            .send(Ok(pb::WatchExecutorsResponse { events: hello }))
            .await
            .is_err()
        {
            return Err(Status::cancelled("the client went away"));
        }
        tokio::spawn(follow_app(self.clone(), r.app_id, follow, watch, tx));
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            Some((item, rx))
        });
        let stream = access::until_revoked(stream, caller_for_end);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// What one stream remembers of the executors it reported.
struct Follow {
    first: u32,
    /// Executors whose end was reported (their later events are echoes).
    exited: HashSet<u32>,
    /// The last pending reason reported per waiting executor.
    pending: HashMap<u32, String>,
}

impl Follow {
    /// Pending events for waiting executors whose reason changed.
    fn pending_changes(&mut self, app: &pb::Application) -> Vec<pb::ExecutorEvent> {
        let mut out = Vec::new();
        let now = crate::clock::wall_ms();
        for e in &app.executors {
            let Ok(i) = e.id.parse::<u32>() else { continue };
            if e.state == pb::TaskState::Running as i32 || e.pending_reason.is_empty() {
                continue;
            }
            if self.pending.get(&i) != Some(&e.pending_reason) {
                self.pending.insert(i, e.pending_reason.clone());
                out.push(pb::ExecutorEvent {
                    // Not an event of the history: no revision to resume
                    // from (a client keeps its own place in the watch).
                    revision: 0,
                    time_ms: now,
                    executor_id: e.id.clone(),
                    kind: Some(pb::executor_event::Kind::Pending(pb::ExecutorPending {
                        reason: e.pending_reason.clone(),
                    })),
                });
            }
        }
        out
    }

    /// A task event of the application's job as an executor event, if it
    /// is one.
    fn task_event(
        &mut self,
        revision: u64,
        time_ms: u64,
        t: &pb::TaskEvent,
    ) -> Option<pb::ExecutorEvent> {
        use pb::ExecutorExitCause as C;
        if t.instance < self.first {
            return None;
        }
        let state = pb::TaskState::try_from(t.state).ok()?;
        let exited = |cause: C, caused_by_app: bool| {
            pb::executor_event::Kind::Exited(pb::ExecutorExited {
                exit_code: 0,
                cause: cause as i32,
                reason: t.reason.clone(),
                caused_by_app,
            })
        };
        let kind = match state {
            pb::TaskState::Running => {
                self.pending.remove(&t.instance);
                pb::executor_event::Kind::Launched(pb::ExecutorLaunched {
                    host: t.host.clone(),
                })
            }
            pb::TaskState::Pending | pb::TaskState::Initialized if t.run_id == 1 => {
                // A retired executor passes through Initialized on its way
                // to its end: not a new wait.
                if self.pending.contains_key(&t.instance) || self.exited.contains(&t.instance) {
                    return None;
                }
                let reason = "waiting for admission in its pool".to_string();
                self.pending.insert(t.instance, reason.clone());
                pb::executor_event::Kind::Pending(pb::ExecutorPending { reason })
            }
            pb::TaskState::Preempted => exited(C::Preempted, false),
            pb::TaskState::Lost => exited(C::HostLost, false),
            pb::TaskState::Killed => exited(C::Killed, false),
            pb::TaskState::Failed => exited(C::Failed, true),
            pb::TaskState::Succeeded => exited(C::Exited, true),
            _ => return None,
        };
        if matches!(kind, pb::executor_event::Kind::Exited(_)) {
            self.pending.remove(&t.instance);
            if !self.exited.insert(t.instance) {
                // Its end was told already (a lost executor is then killed).
                return None;
            }
        }
        Some(pb::ExecutorEvent {
            revision,
            time_ms,
            executor_id: t.instance.to_string(),
            kind: Some(kind),
        })
    }
}

/// Fills in the exit codes of executors that ended by themselves (the
/// watch's task events carry states, not codes): read from each task.
async fn exit_codes(api: &Api, id: &str, events: &mut [pb::ExecutorEvent]) {
    for e in events {
        let Some(pb::executor_event::Kind::Exited(x)) = &mut e.kind else {
            continue;
        };
        if !matches!(
            x.cause(),
            pb::ExecutorExitCause::Failed | pb::ExecutorExitCause::Exited
        ) {
            continue;
        }
        let Ok(instance) = e.executor_id.parse() else {
            continue;
        };
        let task = api
            .call(|reply| {
                Command::Jobs(JobCommand::GetTask {
                    job_id: id.to_string(),
                    instance,
                    reply,
                })
            })
            .await;
        if let Ok(t) = task
            && let Some(run) = t.current
        {
            x.exit_code = run.exit_code;
        }
    }
}

/// Feeds one client: the job's watch read as executor events, and every
/// `PENDING_POLL` the waiting executors' reasons. Ends when the client goes,
/// the watch ends (its error is the stream's last item), or the job is gone.
async fn follow_app(
    api: Api,
    id: String,
    mut follow: Follow,
    mut watch: super::watch::WatchStream,
    tx: mpsc::Sender<Result<pb::WatchExecutorsResponse, Status>>,
) {
    let mut poll = tokio::time::interval(PENDING_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    loop {
        let events = tokio::select! {
            () = tx.closed() => return,
            item = watch.next() => match item {
                None => return,
                Some(Err(e)) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                Some(Ok(batch)) => {
                    let mut events: Vec<pb::ExecutorEvent> = batch
                        .events
                        .iter()
                        .filter_map(|e| match &e.kind {
                            Some(pb::event::Kind::Task(t)) => {
                                follow.task_event(e.revision, e.time_ms, t)
                            }
                            _ => None,
                        })
                        .collect();
                    exit_codes(&api, &id, &mut events).await;
                    events
                }
            },
            _ = poll.tick() => match api.app(id.clone()).await {
                Ok(app) => follow.pending_changes(&app),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            },
        };
        if events.is_empty() {
            continue;
        }
        if tx
            .send(Ok(pb::WatchExecutorsResponse { events }))
            .await
            .is_err()
        {
            return;
        }
    }
}
