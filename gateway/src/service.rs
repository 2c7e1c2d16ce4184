//! The gRPC services: thin handlers that validate what needs no engine
//! state, send a [`Command`] to the loop and await its answer. They never
//! touch engine state themselves.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use pb::host_service_server::HostService;
use pb::job_service_server::JobService;
use pb::resource_pool_service_server::ResourcePoolService;
use pb::task_service_server::TaskService;
use pb::watch_service_server::WatchService;
use peloton_proto::v1 as pb;
use prost::Message;
use tokio::sync::{broadcast, mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::convert::{self, Limits};
use crate::scheduler::{Command, JobAction, Reply};
use crate::store::Store;

/// Handlers of every service.
#[derive(Clone, Debug)]
pub struct Api {
    tx: mpsc::Sender<Command>,
    limits: Limits,
    store: Arc<dyn Store>,
}

fn gone() -> Status {
    Status::unavailable("the server is shutting down")
}

impl Api {
    /// Handlers sending to the loop behind `tx`.
    pub fn new(tx: mpsc::Sender<Command>, limits: Limits, store: Arc<dyn Store>) -> Self {
        Api { tx, limits, store }
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Status> {
        let (reply, answer) = oneshot::channel();
        // A full channel makes this wait: backpressure on every client.
        self.tx.send(make(reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

fn check_path(path: &str) -> Result<(), Status> {
    if path.is_empty() {
        return Err(convert::invalid("path", "must not be empty"));
    }
    Ok(())
}

#[tonic::async_trait]
impl ResourcePoolService for Api {
    async fn create(
        &self,
        request: Request<pb::CreatePoolRequest>,
    ) -> Result<Response<pb::CreatePoolResponse>, Status> {
        let r = request.into_inner();
        check_path(&r.path)?;
        let config = convert::pool_config(r.spec.as_ref())?;
        let pool = self
            .call(|reply| Command::CreatePool {
                path: r.path,
                config,
                reply,
            })
            .await?;
        Ok(Response::new(pb::CreatePoolResponse { pool: Some(pool) }))
    }

    async fn get(
        &self,
        request: Request<pb::GetPoolRequest>,
    ) -> Result<Response<pb::GetPoolResponse>, Status> {
        let r = request.into_inner();
        check_path(&r.path)?;
        let pool = self
            .call(|reply| Command::GetPool {
                path: r.path,
                reply,
            })
            .await?;
        Ok(Response::new(pb::GetPoolResponse { pool: Some(pool) }))
    }

    async fn update(
        &self,
        request: Request<pb::UpdatePoolRequest>,
    ) -> Result<Response<pb::UpdatePoolResponse>, Status> {
        let r = request.into_inner();
        check_path(&r.path)?;
        let config = convert::pool_config(r.spec.as_ref())?;
        let pool = self
            .call(|reply| Command::UpdatePool {
                path: r.path,
                config,
                version: r.version,
                reply,
            })
            .await?;
        Ok(Response::new(pb::UpdatePoolResponse { pool: Some(pool) }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeletePoolRequest>,
    ) -> Result<Response<pb::DeletePoolResponse>, Status> {
        let r = request.into_inner();
        check_path(&r.path)?;
        self.call(|reply| Command::DeletePool {
            path: r.path,
            version: r.version,
            reply,
        })
        .await?;
        Ok(Response::new(pb::DeletePoolResponse {}))
    }

    async fn list(
        &self,
        _request: Request<pb::ListPoolsRequest>,
    ) -> Result<Response<pb::ListPoolsResponse>, Status> {
        let pools = self.call(|reply| Command::ListPools { reply }).await?;
        Ok(Response::new(pb::ListPoolsResponse { pools }))
    }
}

impl Api {
    async fn job_action(
        &self,
        id: String,
        version: u64,
        action: JobAction,
    ) -> Result<Option<pb::Job>, Status> {
        if id.is_empty() {
            return Err(convert::invalid("id", "must not be empty"));
        }
        self.call(|reply| Command::JobAction {
            id,
            version,
            action,
            reply,
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
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| convert::invalid("spec", "missing"))?;
        let plan = Box::new(convert::job_plan(&spec, &self.limits)?);
        let job = self
            .call(|reply| Command::CreateJob {
                spec: Box::new(spec),
                plan,
                reply,
            })
            .await?;
        Ok(Response::new(pb::CreateJobResponse { job: Some(job) }))
    }

    async fn get(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        let id = request.into_inner().id;
        let job = self.call(|reply| Command::GetJob { id, reply }).await?;
        Ok(Response::new(pb::GetJobResponse { job: Some(job) }))
    }

    async fn query(
        &self,
        request: Request<pb::QueryJobsRequest>,
    ) -> Result<Response<pb::QueryJobsResponse>, Status> {
        let request = request.into_inner();
        let out = self
            .call(|reply| Command::QueryJobs { request, reply })
            .await?;
        Ok(Response::new(out))
    }

    async fn kill(
        &self,
        request: Request<pb::KillJobRequest>,
    ) -> Result<Response<pb::KillJobResponse>, Status> {
        let r = request.into_inner();
        let job = self.job_action(r.id, r.version, JobAction::Kill).await?;
        Ok(Response::new(pb::KillJobResponse { job }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteJobRequest>,
    ) -> Result<Response<pb::DeleteJobResponse>, Status> {
        let r = request.into_inner();
        self.job_action(r.id, r.version, JobAction::Delete).await?;
        Ok(Response::new(pb::DeleteJobResponse {}))
    }

    async fn scale(
        &self,
        request: Request<pb::ScaleJobRequest>,
    ) -> Result<Response<pb::ScaleJobResponse>, Status> {
        let r = request.into_inner();
        let job = self
            .job_action(r.id, r.version, JobAction::Scale(r.instance_count))
            .await?;
        Ok(Response::new(pb::ScaleJobResponse { job }))
    }

    async fn restart(
        &self,
        request: Request<pb::RestartJobRequest>,
    ) -> Result<Response<pb::RestartJobResponse>, Status> {
        let r = request.into_inner();
        let job = self.job_action(r.id, r.version, JobAction::Restart).await?;
        Ok(Response::new(pb::RestartJobResponse { job }))
    }
}

#[tonic::async_trait]
impl TaskService for Api {
    async fn list(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let request = request.into_inner();
        let out = self
            .call(|reply| Command::ListTasks { request, reply })
            .await?;
        Ok(Response::new(out))
    }

    async fn get(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        let r = request.into_inner();
        let task = self
            .call(|reply| Command::GetTask {
                job_id: r.job_id,
                instance: r.instance,
                reply,
            })
            .await?;
        Ok(Response::new(pb::GetTaskResponse { task: Some(task) }))
    }

    async fn kill(
        &self,
        request: Request<pb::KillTaskRequest>,
    ) -> Result<Response<pb::KillTaskResponse>, Status> {
        let r = request.into_inner();
        self.call(|reply| Command::TaskAction {
            job_id: r.job_id,
            instances: r.instances,
            restart: false,
            reply,
        })
        .await?;
        Ok(Response::new(pb::KillTaskResponse {}))
    }

    async fn restart(
        &self,
        request: Request<pb::RestartTaskRequest>,
    ) -> Result<Response<pb::RestartTaskResponse>, Status> {
        let r = request.into_inner();
        self.call(|reply| Command::TaskAction {
            job_id: r.job_id,
            instances: r.instances,
            restart: true,
            reply,
        })
        .await?;
        Ok(Response::new(pb::RestartTaskResponse {}))
    }
}

#[tonic::async_trait]
impl HostService for Api {
    async fn list(
        &self,
        _request: Request<pb::ListHostsRequest>,
    ) -> Result<Response<pb::ListHostsResponse>, Status> {
        let hosts = self.call(|reply| Command::ListHosts { reply }).await?;
        Ok(Response::new(pb::ListHostsResponse { hosts }))
    }

    async fn start_maintenance(
        &self,
        request: Request<pb::StartMaintenanceRequest>,
    ) -> Result<Response<pb::StartMaintenanceResponse>, Status> {
        let hosts = request.into_inner().hosts;
        self.call(|reply| Command::Maintenance {
            hosts,
            start: true,
            reply,
        })
        .await?;
        Ok(Response::new(pb::StartMaintenanceResponse {}))
    }

    async fn complete_maintenance(
        &self,
        request: Request<pb::CompleteMaintenanceRequest>,
    ) -> Result<Response<pb::CompleteMaintenanceResponse>, Status> {
        let hosts = request.into_inner().hosts;
        self.call(|reply| Command::Maintenance {
            hosts,
            start: false,
            reply,
        })
        .await?;
        Ok(Response::new(pb::CompleteMaintenanceResponse {}))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

/// Streams events with revision ≥ `next` to `out`: first from the store up
/// to `committed`, then live; a watcher that falls behind the live channel
/// catches up from the store.
async fn pump(
    store: Arc<dyn Store>,
    mut next: u64,
    committed: u64,
    job: String,
    mut live: broadcast::Receiver<crate::scheduler::EventBatch>,
    out: mpsc::Sender<Result<pb::WatchResponse, Status>>,
) {
    let send = |events: Vec<pb::Event>| {
        let out = out.clone();
        async move {
            if events.is_empty() {
                return true;
            }
            out.send(Ok(pb::WatchResponse { events })).await.is_ok()
        }
    };
    let keep = |e: &pb::Event, next: u64| -> bool {
        e.revision >= next
            && (job.is_empty()
                || match &e.kind {
                    Some(pb::event::Kind::Job(j)) => j.job_id == job,
                    Some(pb::event::Kind::Task(t)) => t.job_id == job,
                    None => false,
                })
    };
    // Replays from the store from `next` up to `upto` (None: to the end).
    let replay = |next: u64, upto: Option<u64>| {
        let store = store.clone();
        async move {
            let mut next = next;
            let mut batches = Vec::new();
            loop {
                if upto.is_some_and(|u| next > u) {
                    break;
                }
                let s = store.clone();
                let rows = tokio::task::spawn_blocking(move || s.events_from(next, 64))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                    .map_err(|e| Status::internal(e.to_string()))?;
                let mut advanced = false;
                for row in rows {
                    let batch = pb::WatchResponse::decode(row.as_slice())
                        .map_err(|e| Status::internal(e.to_string()))?;
                    let Some(first) = batch.events.first() else {
                        continue;
                    };
                    if first.revision > next && batches.is_empty() && next > 0 {
                        return Err(Status::out_of_range(format!(
                            "revision {next} is no longer kept; the oldest is {}: list the current state and watch from there",
                            first.revision
                        )));
                    }
                    let events: Vec<pb::Event> = batch
                        .events
                        .into_iter()
                        .filter(|e| e.revision >= next && upto.is_none_or(|u| e.revision <= u))
                        .collect();
                    if let Some(last) = events.last() {
                        next = last.revision + 1;
                        advanced = true;
                    }
                    batches.push(events);
                }
                if !advanced {
                    break;
                }
            }
            Ok::<_, Status>((batches, next))
        }
    };
    if next <= committed {
        match replay(next, Some(committed)).await {
            Ok((batches, n)) => {
                for b in batches {
                    let b: Vec<_> = b.into_iter().filter(|e| keep(e, next)).collect();
                    if !send(b).await {
                        return;
                    }
                }
                next = n.max(committed + 1);
            }
            Err(e) => {
                let _ = out.send(Err(e)).await;
                return;
            }
        }
    }
    loop {
        match live.recv().await {
            Ok(batch) => {
                let events: Vec<pb::Event> =
                    batch.iter().filter(|e| keep(e, next)).cloned().collect();
                if let Some(last) = batch.last() {
                    next = next.max(last.revision + 1);
                }
                if !send(events).await {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => match replay(next, None).await {
                Ok((batches, n)) => {
                    for b in batches {
                        let b: Vec<_> = b.into_iter().filter(|e| keep(e, next)).collect();
                        if !send(b).await {
                            return;
                        }
                    }
                    next = n;
                }
                Err(e) => {
                    let _ = out.send(Err(e)).await;
                    return;
                }
            },
            Err(broadcast::error::RecvError::Closed) => {
                let _ = out.send(Err(gone())).await;
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl WatchService for Api {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let r = request.into_inner();
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Watch { reply })
            .await
            .map_err(|_| gone())?;
        let (committed, live) = answer.await.map_err(|_| gone())?;
        let next = if r.from_revision == 0 {
            committed + 1
        } else {
            r.from_revision
        };
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(pump(
            self.store.clone(),
            next,
            committed,
            r.job_id,
            live,
            tx,
        ));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
