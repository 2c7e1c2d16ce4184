//! While the store cannot write: the failed commit kept and retried with a
//! back-off; mutating commands refused at once, reads answered from
//! memory, agents' reports held (up to a bound) until the batch lands.

use std::time::Instant;

use tonic::Status;

use crate::refused::Refused;
use crate::store::WriteBatch;

use super::{MAX_HELD_REPORTS, RETRY_COMMIT_MAX_MS, Scheduler};
use crate::lifecycle::Input;

use crate::command::{
    AccessCommand, AgentCommand, AppCommand, Command, HostCommand, JobCommand, PoolCommand, Reply,
    UpdateCommand,
};

impl Scheduler {
    /// Tries the failed commit again once its time has come. True when no
    /// commit is outstanding (any more): then what waited for it has been
    /// released and the agent commands held meanwhile applied.
    pub(super) fn retry_commit(&mut self) -> bool {
        let Some(failed) = self.outage.failed.as_mut() else {
            return true;
        };
        let now = self.now;
        if now < failed.next_try_ms {
            return false;
        }
        let start = Instant::now();
        if let Err(e) = self.store.commit(&self.batch) {
            failed.attempts += 1;
            failed.error = e.to_string();
            failed.delay_ms = (failed.delay_ms * 2).min(RETRY_COMMIT_MAX_MS);
            failed.next_try_ms = now + failed.delay_ms;
            // The 1st, 2nd, 4th, 8th... failure: a long outage does not
            // flood the log.
            if failed.attempts.is_power_of_two() {
                tracing::error!(
                    error = %e,
                    attempts = failed.attempts,
                    failing_for_ms = now - failed.since_ms,
                    "the store still cannot write; writes stay refused"
                );
            }
            return false;
        }
        self.metrics
            .commit_seconds
            .observe(start.elapsed().as_secs_f64());
        self.metrics.store_unwritable.set(0);
        self.batch = WriteBatch::default();
        let failed = self.outage.failed.take().expect("outstanding");
        tracing::warn!(
            attempts = failed.attempts,
            failed_for_ms = now - failed.since_ms,
            held_agent_commands = self.outage.held.len(),
            "the store writes again: the failed batch is written, its answers released"
        );
        self.release(failed.pending);
        // Agents that went silent meanwhile (their sessions may have been
        // ended) get the reconnect slack a restart gives them before they
        // are declared lost.
        self.step(crate::lifecycle::Input::AgentsReachable(true));
        self.outage.held_reports = 0;
        for id in std::mem::take(&mut self.outage.heard) {
            let _ = self
                .core
                .step(&mut self.engine, Input::AppHeard { id }, now, &mut self.fx);
        }
        for c in std::mem::take(&mut self.outage.held) {
            self.handle(c);
        }
        true
    }

    /// While the store cannot write: refuses a mutating command at once,
    /// holds an agent's reports or goodbye for later, and gives back a read
    /// (answered from memory).
    pub(super) fn while_unwritable(&mut self, c: Command) -> Option<Command> {
        fn refuse<T>(reply: Reply<T>, status: &Status) -> Option<Command> {
            let _ = reply.send(Err(status.clone()));
            None
        }
        let failed = self.outage.failed.as_ref().expect("in an outage");
        let status = crate::status::refused(Refused::StoreUnwritable {
            error: failed.error.clone(),
            for_s: self.now.saturating_sub(failed.since_ms) / 1000,
            retry_s: RETRY_COMMIT_MAX_MS / 1000,
        });
        match c {
            Command::Pools(PoolCommand::CreatePool { reply, .. })
            | Command::Pools(PoolCommand::UpdatePool { reply, .. }) => refuse(reply, &status),
            Command::Pools(PoolCommand::DeletePool { reply, .. }) => refuse(reply, &status),
            Command::Jobs(JobCommand::CreateJob { reply, .. }) => refuse(reply, &status),
            Command::Jobs(JobCommand::JobAction { reply, .. }) => refuse(reply, &status),
            Command::Jobs(JobCommand::TaskAction { reply, .. }) => refuse(reply, &status),
            Command::Hosts(HostCommand::CreateHostPool { reply, .. }) => refuse(reply, &status),
            Command::Hosts(HostCommand::DeleteHostPool { reply, .. }) => refuse(reply, &status),
            Command::Hosts(HostCommand::MoveHosts { reply, .. }) => refuse(reply, &status),
            Command::Hosts(HostCommand::Maintenance { reply, .. }) => refuse(reply, &status),
            Command::Agents(AgentCommand::AgentRegister { reply, .. }) => refuse(reply, &status),
            Command::Updates(UpdateCommand::UpdateJob { reply, .. }) => refuse(reply, &status),
            Command::Updates(UpdateCommand::UpdateAction { reply, .. }) => refuse(reply, &status),
            Command::Updates(UpdateCommand::DeleteVolume { reply, .. }) => refuse(reply, &status),
            Command::Access(AccessCommand::CreateToken { reply, .. }) => refuse(reply, &status),
            Command::Access(AccessCommand::RevokeToken { reply, .. }) => refuse(reply, &status),
            Command::Access(AccessCommand::IssueCertificate { reply, .. }) => {
                refuse(reply, &status)
            }
            Command::Access(AccessCommand::RevokeCertificate { reply, .. }) => {
                refuse(reply, &status)
            }
            // Soft state: the next report after the outage counts.
            Command::Agents(AgentCommand::AgentUsage { .. }) => None,
            // Kept for the commit that ends the outage, up to a bound.
            Command::Access(AccessCommand::Audit(entry)) => {
                if self.outage.held.len() < MAX_HELD_REPORTS {
                    self.outage
                        .held
                        .push(Command::Access(AccessCommand::Audit(entry)));
                } else {
                    tracing::warn!(
                        ?entry,
                        "audit entry dropped: too many held while the store cannot write"
                    );
                }
                None
            }
            Command::App(app) => match app {
                AppCommand::Create { reply, .. } | AppCommand::Attach { reply, .. } => {
                    refuse(reply, &status)
                }
                AppCommand::Target { reply, .. } => refuse(reply, &status),
                AppCommand::Kill { reply, .. } => refuse(reply, &status),
                AppCommand::Unregister { reply, .. } => refuse(reply, &status),
                read @ AppCommand::Get { .. } => Some(Command::App(read)),
            },
            Command::Agents(AgentCommand::AgentReports {
                host,
                session,
                reports,
            }) if self.outage.held_reports + reports.len() > MAX_HELD_REPORTS => {
                tracing::warn!(%host, "too many agent reports held while the store cannot write; closing the agent's session");
                if let Some(hub) = &self.hub {
                    hub.detach(&host, session);
                }
                None
            }
            held @ (Command::Agents(AgentCommand::AgentReports { .. })
            | Command::Agents(AgentCommand::AgentGone { .. })) => {
                if let Command::Agents(AgentCommand::AgentReports { reports, .. }) = &held {
                    self.outage.held_reports += reports.len();
                }
                self.outage.held.push(held);
                None
            }
            read @ (Command::Pools(PoolCommand::GetPool { .. })
            | Command::Pools(PoolCommand::ListPools { .. })
            | Command::Pools(PoolCommand::ListQueue { .. })
            | Command::Jobs(JobCommand::GetJob { .. })
            | Command::Jobs(JobCommand::QueryJobs { .. })
            | Command::Jobs(JobCommand::ListUsage { .. })
            | Command::Jobs(JobCommand::PlanJob { .. })
            | Command::Jobs(JobCommand::ListTasks { .. })
            | Command::Jobs(JobCommand::GetTask { .. })
            | Command::Hosts(HostCommand::ListHosts { .. })
            | Command::Hosts(HostCommand::ListHostPools { .. })
            | Command::Hosts(HostCommand::Watch { .. })
            | Command::Agents(AgentCommand::LogTarget { .. })
            | Command::Updates(UpdateCommand::GetUpdate { .. })
            | Command::Updates(UpdateCommand::ListUpdates { .. })
            | Command::Updates(UpdateCommand::ListVolumes { .. })
            | Command::Updates(UpdateCommand::GetVolume { .. })
            | Command::Access(AccessCommand::ListTokens { .. })
            | Command::Access(AccessCommand::ListAudit { .. })
            | Command::Shutdown) => Some(read),
        }
    }
}
