//! The loop's commands, routed by group (access, pools, jobs, hosts,
//! agents, updates): each turns a command into a core input or a read,
//! and answers after the commit ([`Scheduler::defer`]).

use std::sync::Arc;

use peloton_proto::v1 as pb;

use crate::agent_hub::Registration;
use crate::codec::run_report;
use crate::convert::{self, JobPlan};
use crate::lifecycle::Error;
use crate::lifecycle::{Answer, HostRegistration, Input, JobKey, Secret};
use crate::refused::Refused;
use crate::{hostpools, reads};

use super::Scheduler;
use crate::command::{
    AccessCommand, AgentCommand, Command, HostCommand, JobCommand, PoolCommand, Reply,
    UpdateCommand,
};

impl Scheduler {
    /// Answers after this iteration's commit, so that an answer never shows
    /// a change that is not durable yet. Errors change nothing: at once.
    /// While the store cannot write only reads get here, answered at once
    /// from memory.
    /// The one place a refusal becomes the answer's status.
    pub(super) fn defer<T: Send + 'static, E: Into<Refused>>(
        &mut self,
        reply: Reply<T>,
        value: Result<T, E>,
    ) {
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
    pub(super) fn apply(&mut self, input: Input) -> Result<Answer, Error> {
        self.core
            .step(&mut self.engine, input, self.now, &mut self.fx)
    }

    pub(super) fn handle(&mut self, c: Command) {
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
            Command::Access(c) => self.handle_access(c),
            Command::Pools(c) => self.handle_pools(c),
            Command::Jobs(c) => self.handle_jobs(c),
            Command::Hosts(c) => self.handle_hosts(c),
            Command::Agents(c) => self.handle_agents(c),
            Command::Updates(c) => self.handle_updates(c),
            // Answered by the loop's caller.
            Command::Shutdown => {}
        }
    }

    /// Applications, tokens, certificates and the audit log.
    pub(super) fn handle_access(&mut self, c: AccessCommand) {
        match c {
            AccessCommand::CreateToken { token, reply } => self.create_token(*token, reply),
            AccessCommand::RevokeToken { name, reply } => self.revoke_token(name, reply),
            AccessCommand::IssueCertificate {
                name,
                certificate,
                reply,
            } => self.issue_certificate(name, certificate, reply),
            AccessCommand::RevokeCertificate {
                name,
                fingerprint,
                reply,
            } => self.revoke_certificate(name, fingerprint, reply),
            AccessCommand::ListTokens { reply } => {
                let _ = reply.send(Ok(self.list_tokens()));
            }
            AccessCommand::Audit(entry) => self.audit(*entry),
            AccessCommand::ListAudit { request, reply } => {
                let r = self.list_audit(&request);
                self.defer(reply, r);
            }
        }
    }

    /// Resource pools and their queues.
    pub(super) fn handle_pools(&mut self, c: PoolCommand) {
        match c {
            PoolCommand::CreatePool {
                path,
                config,
                reply,
            } => {
                let r = self
                    .apply(Input::CreatePool { path, config })
                    .map(|a| self.pool_answer(a));
                self.defer(reply, r);
            }
            PoolCommand::UpdatePool {
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
            PoolCommand::DeletePool {
                path,
                version,
                force,
                reply,
            } => {
                let r = self
                    .apply(Input::DeletePool {
                        path,
                        version,
                        force,
                    })
                    .map(|_| ());
                self.defer(reply, r);
            }
            PoolCommand::GetPool { path, reply } => {
                let r = self
                    .engine
                    .resources()
                    .tree()
                    .resolve(&path)
                    .map_err(Error::Pool)
                    .map(|id| {
                        let used = reads::pool_usage(&self.engine, &self.core);
                        reads::with_pool_usage(
                            reads::pool_to_pb(&self.engine, &self.core, id),
                            used.get(&id),
                        )
                    });
                self.defer(reply, r);
            }
            PoolCommand::ListPools {
                request,
                viewer,
                reply,
            } => {
                let viewer = viewer.as_ref().map(|c| &c.principal);
                let r = Ok::<_, Refused>(reads::list_pools(
                    &self.engine,
                    &self.core,
                    &request,
                    viewer,
                ));
                self.defer(reply, r);
            }
            PoolCommand::ListQueue { path, limit, reply } => {
                let r = reads::list_queue(&self.engine, &self.core, &path, limit);
                self.defer(reply, r);
            }
        }
    }

    /// Jobs and tasks.
    pub(super) fn handle_jobs(&mut self, c: JobCommand) {
        match c {
            JobCommand::CreateJob {
                plan,
                secrets,
                reply,
            } => {
                let r = self.create_job(*plan, secrets);
                self.defer(reply, r);
            }
            JobCommand::GetJob { id, reply } => {
                let r = self
                    .core
                    .job_key(&id)
                    .map(|k| reads::with_usage(&self.core, k, self.job_to_pb(k)));
                self.defer(reply, r);
            }
            JobCommand::QueryJobs {
                request,
                viewer,
                reply,
            } => {
                let r = Ok::<_, Refused>(reads::query_jobs(
                    &self.core,
                    &request,
                    viewer.as_ref().map(|c| &c.principal),
                ));
                self.defer(reply, r);
            }
            JobCommand::PlanJob { plan, reply } => {
                let r = self
                    .core
                    .plan_job(&self.engine, &plan, &self.config.forecast)
                    .map(|a| reads::plan_to_pb(&a));
                self.defer(reply, r);
            }
            JobCommand::ListUsage {
                request,
                viewer,
                reply,
            } => {
                let r =
                    reads::list_usage(&self.core, &request, viewer.as_ref().map(|c| &c.principal));
                self.defer(reply, r);
            }
            JobCommand::JobAction {
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
                        // A scaled job's spec shows its new count: reads
                        // derive it from the plan.
                        Answer::Job(k) => Some(self.job_to_pb(k)),
                        _ => {
                            self.metrics.jobs.set(self.core.n_jobs() as i64);
                            None
                        }
                    });
                self.defer(reply, r);
            }
            JobCommand::ListTasks { request, reply } => {
                let r = reads::list_tasks(&self.engine, &self.core, &request);
                self.defer(reply, r);
            }
            JobCommand::GetTask {
                job_id,
                instance,
                reply,
            } => {
                let r = reads::get_task(&self.engine, &self.core, &job_id, instance);
                self.defer(reply, r);
            }
            JobCommand::TaskAction {
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
        }
    }

    /// Hosts, host pools, maintenance and watches.
    pub(super) fn handle_hosts(&mut self, c: HostCommand) {
        match c {
            HostCommand::ListHosts { request, reply } => {
                let r = Ok::<_, Refused>(reads::list_hosts(
                    &self.engine,
                    &self.core,
                    self.hub.as_deref(),
                    &request,
                ));
                self.defer(reply, r);
            }
            HostCommand::CreateHostPool { name, reply } => {
                let r = self
                    .apply(Input::CreateHostPool { name: name.clone() })
                    .map(|_| pb::HostPool {
                        name,
                        hosts: Vec::new(),
                    });
                self.defer(reply, r);
            }
            HostCommand::DeleteHostPool { name, reply } => {
                let r = self.apply(Input::DeleteHostPool { name }).map(|_| ());
                self.defer(reply, r);
            }
            HostCommand::ListHostPools { request, reply } => {
                let r = Ok::<_, Refused>(hostpools::list(
                    self.core.host_pools(),
                    &self.engine,
                    &request,
                ));
                self.defer(reply, r);
            }
            HostCommand::MoveHosts {
                hosts,
                to,
                force,
                reply,
            } => {
                let r = self
                    .apply(Input::MoveHosts { hosts, to, force })
                    .map(|_| ());
                self.defer(reply, r);
            }
            HostCommand::Maintenance {
                hosts,
                start,
                reply,
            } => {
                let r = self.apply(Input::Maintenance { hosts, start }).map(|_| ());
                self.defer(reply, r);
            }
            HostCommand::Watch { reply } => {
                // Committed revision: events of this iteration, of the
                // batch in flight and of a failed one are not yet
                // committed and will be broadcast after their commits.
                let unwritten = self
                    .outage
                    .failed
                    .as_ref()
                    .map_or(0, |f| f.pending.events.len())
                    + self.in_flight.as_ref().map_or(0, |p| p.events.len());
                let committed = self.core.revision() - (self.fx.events.len() + unwritten) as u64;
                let _ = reply.send((committed, self.events_tx.subscribe()));
            }
        }
    }

    /// Agents' sessions and the logs they serve.
    pub(super) fn handle_agents(&mut self, c: AgentCommand) {
        match c {
            AgentCommand::AgentRegister {
                registration,
                reply,
            } => {
                let r = self.agent_registered(*registration);
                self.defer(reply, r);
            }
            AgentCommand::AgentReports {
                host,
                session,
                reports,
            } => {
                if !self
                    .hub
                    .as_ref()
                    .is_some_and(|a| a.is_current(&host, session))
                {
                    tracing::debug!(%host, session, "reports of a replaced session dropped");
                    return;
                }
                let reports = reports.into_iter().filter_map(run_report).collect();
                self.step(Input::AgentReports { host, reports });
            }
            AgentCommand::AgentUsage { session, report } => {
                if self
                    .hub
                    .as_ref()
                    .is_some_and(|a| a.is_current(&report.host, session))
                {
                    self.step(Input::Usage(report));
                }
            }
            AgentCommand::AgentGone { host, session } => {
                if let Some(a) = &self.hub
                    && a.detach(&host, session)
                {
                    self.step(Input::AgentDisconnected { host });
                }
            }
            AgentCommand::LogTarget {
                job_id,
                instance,
                run_id,
                reply,
            } => {
                let r = reads::log_target(&self.core, &job_id, instance, run_id)
                    .map_err(Refused::from)
                    .and_then(|(key, host)| {
                        let Some(hub) = &self.hub else {
                            return Err(Refused::SimulatedHosts(
                                "runs on simulated hosts have no logs",
                            ));
                        };
                        let Some(session) = hub.session(&host) else {
                            return Err(Refused::AgentNotConnected(host.to_string()));
                        };
                        Ok((key, session.tx))
                    });
                self.defer(reply, r);
            }
        }
    }

    /// Updates and volumes (and the stop, which the iteration acts on).
    pub(super) fn handle_updates(&mut self, c: UpdateCommand) {
        match c {
            UpdateCommand::UpdateJob {
                job_id,
                version,
                plan,
                secrets,
                update,
                reply,
            } => {
                let r = self.update_job(job_id, version, *plan, secrets, update);
                self.defer(reply, r);
            }
            UpdateCommand::GetUpdate { id, reply } => {
                let r = self
                    .core
                    .update(&id)
                    .map(|u| reads::update_to_pb(&self.core, u))
                    .ok_or(Error::UpdateNotFound(id));
                self.defer(reply, r);
            }
            UpdateCommand::ListUpdates { job_id, reply } => {
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
            UpdateCommand::UpdateAction { id, action, reply } => {
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
            UpdateCommand::ListVolumes { request, reply } => {
                let r = reads::list_volumes(&self.core, &request);
                self.defer(reply, r);
            }
            UpdateCommand::GetVolume { id, reply } => {
                let r = self
                    .core
                    .volume(&id)
                    .map(|v| reads::volume_to_pb(&self.core, v))
                    .ok_or(Error::VolumeNotFound(id));
                self.defer(reply, r);
            }
            UpdateCommand::DeleteVolume { id, reply } => {
                let r = self.apply(Input::DeleteVolume { id }).map(|_| ());
                self.defer(reply, r);
            }
        }
    }

    pub(super) fn update_job(
        &mut self,
        job_id: String,
        version: u64,
        plan: JobPlan,
        secrets: Vec<Secret>,
        update: crate::lifecycle::UpdateSpec,
    ) -> Result<(Option<pb::Update>, pb::Job), Refused> {
        // The new set replaces the job's; an empty value keeps the current
        // value of its name. Checked before anything changes.
        let secrets = self
            .core
            .resolve_secrets(self.core.job_key(&job_id).ok(), secrets)?;
        let batch = self
            .core
            .job_key(&job_id)
            .ok()
            .and_then(|k| self.core.job(k))
            .filter(|job| job.plan.kind == crate::lifecycle::JobKind::Batch);
        if let Some(job) = batch {
            // A batch job is not rolled: a spec that differs only in what
            // an edit changes is that edit (anything else is refused,
            // naming the field).
            let plan = if self.shared_access.is_some() {
                convert::with_owner(plan, job.plan.owner.clone())
            } else {
                plan
            };
            let edit =
                crate::edit::batch_edit(&reads::job_spec(&job.plan), &reads::job_spec(&plan))?;
            let answer = self.apply(Input::JobAction {
                id: job_id,
                version,
                action: crate::lifecycle::JobAction::Edit(edit),
            })?;
            let Answer::Job(k) = answer else {
                unreachable!("an edit answers its job");
            };
            let job_id = self.core.job(k).expect("live").id.to_string();
            self.step(Input::SetSecrets { job_id, secrets });
            return Ok((None, self.job_to_pb(k)));
        }
        // On a secure server a job's owner is the token that created it:
        // an update keeps it, whoever sends it and whatever its spec says.
        let plan = match self
            .core
            .job_key(&job_id)
            .ok()
            .and_then(|k| self.core.job(k))
        {
            Some(job) if self.shared_access.is_some() => {
                convert::with_owner(plan, job.plan.owner.clone())
            }
            _ => plan,
        };
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
        Ok((Some(reads::update_to_pb(&self.core, u)), self.job_to_pb(k)))
    }

    pub(super) fn pool_answer(&self, a: Answer) -> pb::Pool {
        match a {
            Answer::Pool(id) => reads::pool_to_pb(&self.engine, &self.core, id),
            other => unreachable!("a pool command answers a pool, not {other:?}"),
        }
    }

    pub(super) fn job_to_pb(&self, k: JobKey) -> pb::Job {
        reads::job_to_pb(&self.core, k)
    }

    pub(super) fn create_job(
        &mut self,
        plan: JobPlan,
        secrets: Vec<Secret>,
    ) -> Result<pb::Job, Refused> {
        let secrets = self.core.resolve_secrets(None, secrets)?;
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
        self.metrics.jobs.set(self.core.n_jobs() as i64);
        Ok(self.job_to_pb(k))
    }

    pub(super) fn agent_registered(&mut self, reg: Registration) -> Result<(), Refused> {
        let Some(hub) = self.hub.clone() else {
            return Err(Refused::SimulatedHosts(
                "this server runs simulated hosts and accepts no agents",
            ));
        };
        let (r, spec) = (reg.register, reg.spec);
        let host: Arc<str> = Arc::from(r.host.as_str());
        let agent_id = reg.session.agent_id.clone();
        // The session holding the host now: the core refuses the newcomer
        // while it is alive (and the holder keeps its session).
        let holder = hub.session(&host).map(|s| crate::lifecycle::Holder {
            agent_id: s.agent_id,
            last_heard_ms: hub.last_seen(&host).unwrap_or(0),
        });
        let taken_from = holder
            .as_ref()
            .filter(|h| h.agent_id != agent_id)
            .map(|h| h.agent_id.clone());
        let registration = HostRegistration {
            address: r.address.as_str().into(),
            // Checked by `agents::check_register`.
            port_ranges: crate::agents::port_ranges(&r.port_ranges).unwrap_or_default(),
            spec,
            isolation: convert::agent_text(r.isolation),
            runs: r.runs.into_iter().filter_map(run_report).collect(),
            volumes: r.volumes,
            agent_id: agent_id.clone(),
            holder,
        };
        if let Err(e) = self.apply(Input::AgentRegistered(Box::new(registration))) {
            tracing::warn!(%host, agent = %agent_id, "registration refused: {e}");
            return Err(Refused::from(e));
        }
        if let Some(holder) = taken_from {
            tracing::warn!(
                %host,
                %holder,
                agent = %agent_id,
                "host taken over from a silent session by another agent"
            );
        }
        // Attached before the commit: acknowledgements of the reports the
        // registration carried, sent after it, go to this session.
        hub.touch(&host, self.now);
        hub.attach(host, reg.session);
        Ok(())
    }
}
