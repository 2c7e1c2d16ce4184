//! The application API on the loop thread: registration (a new job, or the
//! driver's own job in cluster mode), targets, kills, unregistration, and
//! an application as the API shows it.

use peloton_proto::v1 as pb;
use tonic::Status;

use super::{Reply, Scheduler, reads};
use crate::convert::{self, TaskTemplate};
use crate::lifecycle::{Answer, Input, JobKey, JobKind, TaskState as S};
use crate::status::status;

/// At most this many executors are listed in an application.
pub const MAX_LISTED_EXECUTORS: usize = 1000;

/// An application command, validated by the service.
#[derive(Debug)]
pub enum AppCommand {
    /// A new application job (client mode).
    Create {
        /// Its job spec (type APPLICATION, no instances).
        spec: Box<pb::JobSpec>,
        /// Validated.
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

/// How often drivers' leases are checked.
pub const LEASE_CHECK_INTERVAL_MS: u64 = 1000;

/// An application whose driver holds a lease: client mode, registered, not
/// ended (a cluster-mode driver is a task of the job: its end ends it).
pub(super) fn leased(job: &crate::lifecycle::Job) -> bool {
    job.plan.kind == JobKind::Application
        && job.plan.app.is_some_and(|a| !a.driver_in_job)
        && !job.app.closed
        && !job.kill_requested
}

impl Scheduler {
    /// The driver of application `id` was heard from.
    fn seen(&mut self, id: &str) {
        if let Ok(k) = self.core.job_key(id)
            && self.core.job(k).is_some_and(leased)
        {
            self.app_seen.insert(k, self.now);
        }
    }

    /// Unregisters client-mode applications whose drivers have not been
    /// heard from for the lease (a driver killed outright).
    pub(super) fn check_app_leases(&mut self) {
        if self.app_seen.is_empty() || self.now < self.last_lease_check + LEASE_CHECK_INTERVAL_MS {
            return;
        }
        self.last_lease_check = self.now;
        let lease = self.config.app_lease.as_millis() as u64;
        let mut lapsed = Vec::new();
        let core = &self.core;
        self.app_seen.retain(|&k, &mut seen| match core.job(k) {
            Some(job) if leased(job) => {
                if self.now.saturating_sub(seen) > lease {
                    lapsed.push(job.id.to_string());
                    false
                } else {
                    true
                }
            }
            _ => false,
        });
        lapsed.sort_unstable();
        for id in lapsed {
            tracing::warn!(app = %id, lease_ms = lease, "application unregistered: its driver was not heard from");
            self.step(Input::AppUnregister { id, lapsed: true });
        }
    }

    pub(super) fn handle_app(&mut self, c: AppCommand) {
        match &c {
            AppCommand::Create { .. } => {}
            AppCommand::Attach { id, .. }
            | AppCommand::Get { id, .. }
            | AppCommand::Target { id, .. }
            | AppCommand::Kill { id, .. }
            | AppCommand::Unregister { id, .. } => {
                let id = id.clone();
                self.seen(&id);
            }
        }
        match c {
            AppCommand::Create { spec, plan, reply } => {
                let r = self.create_job(*spec, *plan).and_then(|job| {
                    self.seen(&job.id);
                    self.app_of(&job.id)
                });
                self.defer(reply, r);
            }
            AppCommand::Attach {
                id,
                executor,
                template,
                driver_url,
                max_executors,
                reply,
            } => {
                let r = self
                    .attach(&id, *executor, *template, driver_url, max_executors)
                    .and_then(|()| self.app_of(&id));
                self.defer(reply, r);
            }
            AppCommand::Get { id, reply } => {
                let r = self.app_of(&id);
                self.defer(reply, r);
            }
            AppCommand::Target {
                id,
                generation,
                total,
                reply,
            } => {
                let r = self
                    .apply(Input::AppTarget {
                        id,
                        generation,
                        total,
                    })
                    .map(|a| match a {
                        Answer::Target {
                            applied,
                            target,
                            generation,
                        } => pb::SetExecutorTargetResponse {
                            applied,
                            target,
                            generation,
                        },
                        other => unreachable!("a target answers Target, not {other:?}"),
                    });
                self.defer(reply, r);
            }
            AppCommand::Kill {
                id,
                executor_ids,
                reply,
            } => {
                let r = self.kill_executors(id, executor_ids);
                self.defer(reply, r);
            }
            AppCommand::Unregister { id, reply } => {
                let r = self
                    .apply(Input::AppUnregister {
                        id: id.clone(),
                        lapsed: false,
                    })
                    .and_then(|_| self.app_of(&id));
                self.defer(reply, r);
            }
        }
    }

    fn app_key(&self, id: &str) -> Result<JobKey, Status> {
        let k = self.core.job_key(id).map_err(status)?;
        if self
            .core
            .job(k)
            .is_some_and(|j| j.plan.kind != JobKind::Application)
        {
            return Err(Status::failed_precondition(format!(
                "job {} is not an application job",
                convert::shown(id)
            )));
        }
        Ok(k)
    }

    /// Cluster mode: the driver's job takes the executor; its stored spec
    /// keeps the driver as instance 0's own task.
    fn attach(
        &mut self,
        id: &str,
        executor: pb::TaskSpec,
        template: TaskTemplate,
        driver_url: String,
        max_executors: u32,
    ) -> Result<(), Status> {
        let k = self.app_key(id)?;
        let max_executors = if max_executors == 0 {
            convert::DEFAULT_MAX_EXECUTORS.min(self.core.config().max_instances_per_job)
        } else {
            max_executors
        };
        let mut spec = reads::job_spec(&self.core.job(k).expect("live").plan);
        let app = spec.application.get_or_insert_with(Default::default);
        let first = app.driver_url.is_empty();
        app.driver_url = driver_url;
        app.max_executors = max_executors;
        app.driver_in_job = true;
        if first {
            // The driver keeps its task as instance 0's own.
            let driver = spec.default_task.take();
            spec.overrides.retain(|o| o.instance != 0);
            spec.overrides.push(pb::InstanceOverride {
                instance: 0,
                spec: driver,
            });
        }
        spec.default_task = Some(executor);
        self.apply(Input::AppRegister {
            id: id.to_string(),
            executor: std::sync::Arc::new(template),
            max_executors,
            spec: prost::Message::encode_to_vec(&spec).into(),
        })?;
        Ok(())
    }

    fn kill_executors(
        &mut self,
        id: String,
        executor_ids: Vec<String>,
    ) -> Result<pb::KillExecutorsResponse, Status> {
        let k = self.app_key(&id)?;
        let job = self.core.job(k).expect("live");
        let mut out = pb::KillExecutorsResponse::default();
        let mut instances = Vec::new();
        for e in executor_ids {
            match e.parse::<u32>() {
                Ok(i) if job.is_executor(i) && e == i.to_string() => {
                    instances.push(i);
                    out.killed.push(e);
                }
                // As sent, unless too long to echo.
                _ if e.len() <= 64 => out.unknown.push(e),
                _ => out.unknown.push(convert::shown(&e)),
            }
        }
        if !instances.is_empty() {
            self.apply(Input::AppKill { id, instances })?;
        }
        Ok(out)
    }

    /// An application as the API shows it.
    pub(super) fn app_of(&self, id: &str) -> Result<pb::Application, Status> {
        let k = self.app_key(id)?;
        Ok(app_to_pb(&self.engine, &self.core, k, self.core.revision()))
    }
}

fn app_to_pb(
    engine: &peloton_engine::Engine,
    core: &crate::lifecycle::Lifecycle,
    k: JobKey,
    revision: u64,
) -> pb::Application {
    let job = core.job(k).expect("live");
    let plan = job.plan.app.unwrap_or_default();
    let spec = reads::job_spec(&job.plan);
    let driver_url = spec.application.map(|a| a.driver_url).unwrap_or_default();
    let mut app = pb::Application {
        id: job.id.to_string(),
        name: spec.name,
        pool: job.plan.pool.to_string(),
        driver_url,
        target: job.app.target,
        generation: job.app.generation,
        max_executors: plan.max_executors,
        registered: plan.registered,
        unregistered: job.app.closed,
        state: convert::job_state_to_pb(job.state) as i32,
        revision,
        driver_in_job: plan.driver_in_job,
        ..Default::default()
    };
    for i in job.executors() {
        let t = &job.tasks[i as usize];
        if t.state.is_terminal() {
            app.exited += 1;
            continue;
        }
        if t.state == S::Running {
            app.running += 1;
        } else {
            app.pending += 1;
        }
        if app.executors.len() < MAX_LISTED_EXECUTORS {
            app.executors.push(pb::Executor {
                id: i.to_string(),
                state: convert::task_state_to_pb(t.state) as i32,
                host: t
                    .host
                    .map(|h| core.host_name(h).to_string())
                    .unwrap_or_default(),
                pending_reason: reads::pending_reason(engine, job, i, t),
            });
        }
    }
    let alive = app.running + app.pending;
    if alive < job.executors_wanted() && !job.app.closed && plan.registered {
        let n = job.tasks.len() as u32;
        if job.app.stalled(plan.max_executors) {
            app.stalled = format!(
                "{} executors failed in a row with none running; no new one starts until the target changes (see the exited executors' reasons)",
                job.app.failures
            );
        } else if n >= core.config().max_instances_per_job {
            app.stalled = format!(
                "the application used all {n} instance ids a job may have ({} executors started in all); register it again as a new application",
                job.executors().len()
            );
        }
    }
    app
}
