//! The application API on the loop thread: registration (a new job, or the
//! driver's own job in cluster mode), targets, kills, unregistration, and
//! an application as the API shows it.

use peloton_proto::v1 as pb;

use super::{AppCommand, Scheduler};
use crate::convert::{self, TaskTemplate};
use crate::lifecycle::{Answer, Error, Input, JobKey, JobKind, TaskState as S};
use crate::reads;

/// At most this many executors are listed in an application.
pub const MAX_LISTED_EXECUTORS: usize = 1000;

impl Scheduler {
    pub(super) fn handle_app(&mut self, c: AppCommand) {
        match &c {
            AppCommand::Create { .. } => {}
            AppCommand::Attach { id, .. }
            | AppCommand::Get { id, .. }
            | AppCommand::Target { id, .. }
            | AppCommand::Kill { id, .. }
            | AppCommand::Unregister { id, .. } => {
                // Any call about it renews its driver's lease (an open
                // executor stream calls every second). Nothing is stepped
                // while the store cannot write: the renewal waits for it.
                if self.outage.failed.is_some() {
                    self.outage.hold_heard(id);
                } else {
                    let _ = self.core.step(
                        &mut self.engine,
                        Input::AppHeard { id: id.clone() },
                        self.now,
                        &mut self.fx,
                    );
                }
            }
        }
        match c {
            AppCommand::Create { mut plan, reply } => {
                // A registered application is named after the Spark
                // application (a label Spark chose, not a Peloton name):
                // the first of NAME, NAME-2, … that no unfinished job of
                // the pool holds.
                plan.name = self.core.free_job_name(&plan.pool, &plan.name);
                let r = self
                    .create_job(*plan, Vec::new())
                    .and_then(|job| Ok(self.app_of(&job.id)?));
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

    fn app_key(&self, id: &str) -> Result<JobKey, Error> {
        let k = self.core.job_key(id)?;
        if self
            .core
            .job(k)
            .is_some_and(|j| j.plan.kind != JobKind::Application)
        {
            return Err(Error::Precondition(format!(
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
    ) -> Result<(), Error> {
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
    ) -> Result<pb::KillExecutorsResponse, Error> {
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
    pub(super) fn app_of(&self, id: &str) -> Result<pb::Application, Error> {
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
