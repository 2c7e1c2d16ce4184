//! The loop's commands, routed by group (access, pools, jobs, hosts,
//! agents, updates): each turns a command into a core input or a read,
//! and answers after the commit ([`Scheduler::defer`]).

use std::sync::Arc;

use peloton_proto::v1 as pb;

use crate::agent_hub::Registration;
use crate::codec::{self as secrets, run_report};
use crate::convert::{self, JobPlan};
use crate::lifecycle::Error;
use crate::lifecycle::{Answer, HostRegistration, Input, JobKey};
use crate::refused::Refused;
use crate::{hostpools, reads};

use super::Scheduler;
use crate::command::{Command, Reply};

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
        match group(&c) {
            Group::Access => self.handle_access(c),
            Group::Pools => self.handle_pools(c),
            Group::Jobs => self.handle_jobs(c),
            Group::Hosts => self.handle_hosts(c),
            Group::Agents => self.handle_agents(c),
            Group::Updates => self.handle_updates(c),
        }
    }

    /// Applications, tokens, certificates and the audit log.
    pub(super) fn handle_access(&mut self, c: Command) {
        match c {
            Command::App(c) => self.handle_app(c),
            Command::CreateToken {
                token,
                digest,
                reply,
            } => self.create_token(token, digest, reply),
            Command::RevokeToken { name, reply } => self.revoke_token(name, reply),
            Command::IssueCertificate {
                name,
                certificate,
                reply,
            } => self.issue_certificate(name, certificate, reply),
            Command::RevokeCertificate {
                name,
                fingerprint,
                reply,
            } => self.revoke_certificate(name, fingerprint, reply),
            Command::ListTokens { reply } => {
                let _ = reply.send(Ok(self.list_tokens()));
            }
            Command::Audit(entry) => self.audit(*entry),
            Command::ListAudit { request, reply } => {
                let r = self.list_audit(&request);
                self.defer(reply, r);
            }
            other => unreachable!("{other:?} is not in the access group"),
        }
    }

    /// Resource pools and their queues.
    pub(super) fn handle_pools(&mut self, c: Command) {
        match c {
            Command::CreatePool {
                path,
                config,
                reply,
            } => {
                let r = self
                    .apply(Input::CreatePool { path, config })
                    .map(|a| self.pool_answer(a));
                self.defer(reply, r);
            }
            Command::UpdatePool {
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
            Command::DeletePool {
                path,
                version,
                reply,
            } => {
                let r = self.apply(Input::DeletePool { path, version }).map(|_| ());
                self.defer(reply, r);
            }
            Command::GetPool { path, reply } => {
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
            Command::ListPools {
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
            Command::ListQueue { path, limit, reply } => {
                let r = reads::list_queue(&self.engine, &self.core, &path, limit);
                self.defer(reply, r);
            }
            other => unreachable!("{other:?} is not in the pools group"),
        }
    }

    /// Jobs and tasks.
    pub(super) fn handle_jobs(&mut self, c: Command) {
        match c {
            Command::CreateJob { spec, plan, reply } => {
                let r = self.create_job(*spec, *plan);
                self.defer(reply, r);
            }
            Command::GetJob { id, reply } => {
                let r = self
                    .core
                    .job_key(&id)
                    .map(|k| reads::with_usage(&self.core, k, self.job_to_pb(k)));
                self.defer(reply, r);
            }
            Command::QueryJobs {
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
            Command::JobAction {
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
            Command::ListTasks { request, reply } => {
                let r = reads::list_tasks(&self.core, &request);
                self.defer(reply, r);
            }
            Command::GetTask {
                job_id,
                instance,
                reply,
            } => {
                let r = reads::get_task(&self.engine, &self.core, &job_id, instance);
                self.defer(reply, r);
            }
            Command::TaskAction {
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
            other => unreachable!("{other:?} is not in the jobs group"),
        }
    }

    /// Hosts, host pools, maintenance and watches.
    pub(super) fn handle_hosts(&mut self, c: Command) {
        match c {
            Command::ListHosts { request, reply } => {
                let r = Ok::<_, Refused>(reads::list_hosts(
                    &self.engine,
                    &self.core,
                    self.hub.as_deref(),
                    &request,
                ));
                self.defer(reply, r);
            }
            Command::CreateHostPool { name, reply } => {
                let r = self
                    .apply(Input::CreateHostPool { name: name.clone() })
                    .map(|_| pb::HostPool {
                        name,
                        hosts: Vec::new(),
                    });
                self.defer(reply, r);
            }
            Command::DeleteHostPool { name, reply } => {
                let r = self.apply(Input::DeleteHostPool { name }).map(|_| ());
                self.defer(reply, r);
            }
            Command::ListHostPools { request, reply } => {
                let r = Ok::<_, Refused>(hostpools::list(
                    self.core.host_pools(),
                    &self.engine,
                    &request,
                ));
                self.defer(reply, r);
            }
            Command::MoveHosts { hosts, to, reply } => {
                let r = self.apply(Input::MoveHosts { hosts, to }).map(|_| ());
                self.defer(reply, r);
            }
            Command::Maintenance {
                hosts,
                start,
                reply,
            } => {
                let r = self.apply(Input::Maintenance { hosts, start }).map(|_| ());
                self.defer(reply, r);
            }
            Command::Watch { reply } => {
                // Committed revision: events of this iteration are not yet
                // committed and will be broadcast after the commit.
                let unwritten = self.outage.failed.as_ref().map_or(0, |f| f.events.len());
                let committed = self.core.revision() - (self.fx.events.len() + unwritten) as u64;
                let _ = reply.send((committed, self.events_tx.subscribe()));
            }
            other => unreachable!("{other:?} is not in the hosts group"),
        }
    }

    /// Agents' sessions and the logs they serve.
    pub(super) fn handle_agents(&mut self, c: Command) {
        match c {
            Command::AgentRegister {
                registration,
                reply,
            } => {
                let r = self.agent_registered(*registration);
                self.defer(reply, r);
            }
            Command::AgentReports {
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
            Command::AgentUsage { session, report } => {
                if self
                    .hub
                    .as_ref()
                    .is_some_and(|a| a.is_current(&report.host, session))
                {
                    self.step(Input::Usage(report));
                }
            }
            Command::AgentGone { host, session } => {
                if let Some(a) = &self.hub
                    && a.detach(&host, session)
                {
                    self.step(Input::AgentDisconnected { host });
                }
            }
            Command::LogTarget {
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
            other => unreachable!("{other:?} is not in the agents group"),
        }
    }

    /// Updates and volumes (and the stop, which the iteration acts on).
    pub(super) fn handle_updates(&mut self, c: Command) {
        match c {
            Command::UpdateJob {
                job_id,
                version,
                spec,
                plan,
                update,
                reply,
            } => {
                let r = self.update_job(job_id, version, *spec, *plan, update);
                self.defer(reply, r);
            }
            Command::GetUpdate { id, reply } => {
                let r = self
                    .core
                    .update(&id)
                    .map(|u| reads::update_to_pb(&self.core, u))
                    .ok_or(Error::UpdateNotFound(id));
                self.defer(reply, r);
            }
            Command::ListUpdates { job_id, reply } => {
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
            Command::UpdateAction { id, action, reply } => {
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
            Command::ListVolumes { request, reply } => {
                let r = reads::list_volumes(&self.core, &request);
                self.defer(reply, r);
            }
            Command::GetVolume { id, reply } => {
                let r = self
                    .core
                    .volume(&id)
                    .map(|v| reads::volume_to_pb(&self.core, v))
                    .ok_or(Error::VolumeNotFound(id));
                self.defer(reply, r);
            }
            Command::DeleteVolume { id, reply } => {
                let r = self.apply(Input::DeleteVolume { id }).map(|_| ());
                self.defer(reply, r);
            }
            Command::Shutdown => {}
            other => unreachable!("{other:?} is not in the updates group"),
        }
    }

    pub(super) fn update_job(
        &mut self,
        job_id: String,
        version: u64,
        mut spec: pb::JobSpec,
        plan: JobPlan,
        update: crate::lifecycle::UpdateSpec,
    ) -> Result<(pb::Update, pb::Job), Refused> {
        // The new set replaces the job's; an empty value keeps the current
        // value of its name. Checked before anything changes.
        let secrets = self.core.resolve_secrets(
            self.core.job_key(&job_id).ok(),
            secrets::from_pb(std::mem::take(&mut spec.secrets)),
        )?;
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
        Ok((reads::update_to_pb(&self.core, u), self.job_to_pb(k)))
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
        mut spec: pb::JobSpec,
        plan: JobPlan,
    ) -> Result<pb::Job, Refused> {
        let secrets = self
            .core
            .resolve_secrets(None, secrets::from_pb(std::mem::take(&mut spec.secrets)))?;
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

    /// Whether `session` may take `host`: yes if no session holds it, if
    /// the holder is the same agent (`agent_id`: restarted on its work
    /// directory, its old connection not yet seen to close), or if the
    /// holder has been silent for `AgentHub::takeover_after_ms` (its
    /// connection is presumed dead). Otherwise two agents claim one host
    /// name: the holder keeps it and the newcomer is refused, or each
    /// registration would mark the other's runs lost and launch them again.
    pub(super) fn check_takeover(
        &mut self,
        host: &str,
        session: &crate::agent_hub::Session,
    ) -> Result<(), Refused> {
        let now = self.now;
        let Some(hub) = self.hub.clone() else {
            return Ok(());
        };
        let Some(holder) = hub.session(host) else {
            return Ok(());
        };
        if !holder.agent_id.is_empty() && holder.agent_id == session.agent_id {
            return Ok(());
        }
        let silent_ms = now.saturating_sub(hub.last_seen(host).unwrap_or(0));
        let after_ms = hub.takeover_after_ms();
        if silent_ms > after_ms {
            tracing::warn!(
                %host,
                silent_ms,
                holder = %holder.agent_id,
                agent = %session.agent_id,
                "host taken over from a silent session by another agent"
            );
            return Ok(());
        }
        tracing::warn!(
            %host,
            holder = %holder.agent_id,
            agent = %session.agent_id,
            "registration refused: another agent holds the host"
        );
        Err(Refused::HostHeldBySession {
            host: host.to_string(),
            holder: holder.agent_id.to_string(),
            agent: session.agent_id.to_string(),
            silent_ms,
            after_ms,
        })
    }

    pub(super) fn agent_registered(&mut self, reg: Registration) -> Result<(), Refused> {
        let Some(hub) = self.hub.clone() else {
            return Err(Refused::SimulatedHosts(
                "this server runs simulated hosts and accepts no agents",
            ));
        };
        let (r, spec) = (reg.register, reg.spec);
        // Refused before the session is attached (the core checks it again).
        crate::lifecycle::check_registration_attributes(&spec.attributes)?;
        let host: Arc<str> = Arc::from(r.host.as_str());
        // Refused before the session is attached: a refusal leaves the
        // holder's session (and its runs) as they were.
        let agent_id = reg.session.agent_id.clone();
        self.core
            .check_agent_identity(&self.engine, &host, &agent_id)
            .map_err(|e| {
                tracing::warn!(%host, agent = %agent_id, "registration refused: {e}");
                e
            })?;
        self.check_takeover(&host, &reg.session)?;
        hub.touch(&host, self.now);
        // The session is attached before the step, so that acknowledgements
        // of the reports it carries go to it.
        let session = reg.session.id;
        hub.attach(host.clone(), reg.session);
        let registration = HostRegistration {
            spec,
            isolation: convert::agent_text(r.isolation),
            runs: r.runs.into_iter().filter_map(run_report).collect(),
            volumes: r.volumes,
            agent_id,
        };
        let r = self
            .apply(Input::AgentRegistered(Box::new(registration)))
            .map(|_| ())
            .map_err(Refused::from);
        if r.is_err() {
            // Refused: its stream ends with the error, so no goodbye will
            // come to detach it.
            hub.detach(&host, session);
        }
        r
    }
}

/// The groups of commands, each with its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Access,
    Pools,
    Jobs,
    Hosts,
    Agents,
    Updates,
}

/// A command's group. Exhaustive, without a catch-all: a new command does
/// not build until it is given a group (and its handler, which refuses
/// what is not its own, learns it).
fn group(c: &Command) -> Group {
    match c {
        Command::App(_)
        | Command::CreateToken { .. }
        | Command::RevokeToken { .. }
        | Command::IssueCertificate { .. }
        | Command::RevokeCertificate { .. }
        | Command::ListTokens { .. }
        | Command::Audit(_)
        | Command::ListAudit { .. } => Group::Access,
        Command::CreatePool { .. }
        | Command::UpdatePool { .. }
        | Command::DeletePool { .. }
        | Command::GetPool { .. }
        | Command::ListPools { .. }
        | Command::ListQueue { .. } => Group::Pools,
        Command::CreateJob { .. }
        | Command::GetJob { .. }
        | Command::QueryJobs { .. }
        | Command::JobAction { .. }
        | Command::ListTasks { .. }
        | Command::GetTask { .. }
        | Command::TaskAction { .. } => Group::Jobs,
        Command::ListHosts { .. }
        | Command::CreateHostPool { .. }
        | Command::DeleteHostPool { .. }
        | Command::ListHostPools { .. }
        | Command::MoveHosts { .. }
        | Command::Maintenance { .. }
        | Command::Watch { .. } => Group::Hosts,
        Command::AgentRegister { .. }
        | Command::AgentReports { .. }
        | Command::AgentUsage { .. }
        | Command::AgentGone { .. }
        | Command::LogTarget { .. } => Group::Agents,
        Command::UpdateJob { .. }
        | Command::GetUpdate { .. }
        | Command::ListUpdates { .. }
        | Command::UpdateAction { .. }
        | Command::ListVolumes { .. }
        | Command::GetVolume { .. }
        | Command::DeleteVolume { .. }
        | Command::Shutdown => Group::Updates,
    }
}
