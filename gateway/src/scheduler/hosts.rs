//! The loop's side of agents' hosts: hosts that went silent are declared
//! lost; acknowledgements and volume deletions are sent to their agents'
//! sessions once durable.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use rustc_hash::FxHashMap;

use crate::lifecycle::Input;

use super::{LOST_CHECK_INTERVAL_MS, RECONNECT_SLACK_MS, Scheduler};

impl Scheduler {
    pub(super) fn check_lost_hosts(&mut self) {
        let Some(hub) = self.hub.clone() else {
            return;
        };
        if let Some(leading) = &self.leading
            && !*leading.borrow()
        {
            self.started_at = self.now;
            // Looked at again after the interval, as when leading (the
            // next wake counts from it: the loop must not spin).
            self.last_lost_check = self.now;
            return;
        }
        if self.now < self.last_lost_check + LOST_CHECK_INTERVAL_MS {
            return;
        }
        self.last_lost_check = self.now;
        let after = self.config.host_lost_after.as_millis() as u64;
        let floor = self.started_at + RECONNECT_SLACK_MS;
        let mut lost: Vec<(Arc<str>, u64)> = self
            .core
            .watched_agent_hosts()
            .filter_map(|name| {
                let seen = hub.last_seen(name).unwrap_or(floor).max(floor);
                let silent = self.now.saturating_sub(seen);
                (silent > after).then(|| (name.clone(), silent))
            })
            .collect();
        lost.sort_unstable();
        for (host, silent_ms) in lost {
            tracing::warn!(%host, "host lost: no heartbeat for {silent_ms} ms");
            if let Some(s) = hub.session(&host).map(|s| s.id) {
                hub.detach(&host, s);
            }
            self.step(Input::HostLost {
                host,
                silent_ms: after,
            });
        }
    }

    /// Final reports recorded by this commit: their agents forget them.
    pub(super) fn send_acks(&mut self) {
        let acks = std::mem::take(&mut self.fx.acks);
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
    pub(super) fn send_volume_deletes(&mut self) {
        let deletes = std::mem::take(&mut self.fx.volume_deletes);
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
