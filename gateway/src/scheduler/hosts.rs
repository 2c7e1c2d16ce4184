//! The loop's side of agents' hosts: hosts that went silent are declared
//! lost; acknowledgements and volume deletions are sent to their agents'
//! sessions once durable.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use rustc_hash::FxHashMap;

use crate::lifecycle::Input;

use super::Scheduler;

impl Scheduler {
    /// Tells the core whether agents can reach this server (not while it
    /// does not lead) and, when it is due, when each watched host was last
    /// heard: the core declares the silent ones lost, and their sessions
    /// are ended here.
    pub(super) fn follow_liveness(&mut self) {
        let Some(hub) = self.hub.clone() else {
            return;
        };
        if let Some(leading) = &self.leading {
            let leading = *leading.borrow();
            if leading != self.core.agents_reachable() {
                self.step(Input::AgentsReachable(leading));
            }
        }
        if !self.core.liveness_due(self.now) {
            return;
        }
        let heard = self
            .core
            .watched_agent_hosts()
            .map(|h| (h.clone(), hub.last_seen(h).unwrap_or(0)))
            .collect();
        self.step(Input::AgentsHeard { heard });
        let after_ms = self.core.config().host_lost_after_ms;
        for host in std::mem::take(&mut self.fx.ended_sessions) {
            tracing::warn!(%host, "host lost: not heard from for over {after_ms} ms");
            if let Some(s) = hub.session(&host).map(|s| s.id) {
                hub.detach(&host, s);
            }
        }
    }

    /// Final reports recorded by this commit: their agents forget them.
    pub(super) fn send_acks(&mut self, acks: Vec<(Arc<str>, crate::lifecycle::AgentRunKey)>) {
        let keys = acks.into_iter().map(|(host, key)| {
            let key = pb::RunKey {
                job_id: key.job_id.to_string(),
                instance: key.instance,
                run_id: key.run,
                launch_id: key.launch,
            };
            (host, key)
        });
        // A full or closed outbox, or no session: the agent reports again.
        self.send_to_agents(keys, |keys| {
            pb::server_message::Kind::Ack(pb::AckRuns { keys })
        });
    }

    /// Volumes deleted or given up by this commit: their agents remove
    /// them. An agent away now lists them when it registers again, and is
    /// told then.
    pub(super) fn send_volume_deletes(&mut self, deletes: Vec<(Arc<str>, Arc<str>)>) {
        let ids = deletes.into_iter().map(|(host, id)| (host, id.to_string()));
        self.send_to_agents(ids, |ids| {
            pb::server_message::Kind::DeleteVolumes(pb::DeleteVolumes { ids })
        });
    }

    /// Sends items to their hosts' sessions, grouped per host in messages
    /// of at most `MAX_RUNS_PER_MESSAGE`; a host without a session, or whose
    /// outbox is full, gets the rest of its items another time.
    pub(super) fn send_to_agents<T: Clone>(
        &mut self,
        items: impl Iterator<Item = (Arc<str>, T)>,
        message: impl Fn(Vec<T>) -> pb::server_message::Kind,
    ) {
        let mut by_host: FxHashMap<Arc<str>, Vec<T>> = FxHashMap::default();
        for (host, item) in items {
            by_host.entry(host).or_default().push(item);
        }
        if by_host.is_empty() {
            return;
        }
        let Some(hub) = &self.hub else {
            return;
        };
        for (host, items) in by_host {
            let Some(session) = hub.session(&host) else {
                continue;
            };
            for chunk in items.chunks(crate::agent_hub::MAX_RUNS_PER_MESSAGE) {
                let msg = pb::ServerMessage {
                    kind: Some(message(chunk.to_vec())),
                };
                if session.tx.try_send(Ok(msg)).is_err() {
                    break;
                }
            }
        }
    }
}
