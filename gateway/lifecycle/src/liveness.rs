//! Whether agents' hosts are alive, decided from when each was last heard.
//!
//! Agents' heartbeats never reach the loop: the shell's agent hub stamps a
//! host when any message of its session arrives. Every
//! [`LIVENESS_CHECK_MS`] the shell hands the core those stamps for the hosts
//! it watches ([`Input::AgentsHeard`]); the core declares lost every host
//! silent past `CoreConfig::host_lost_after_ms` and tells the shell to end
//! its session ([`Effects::ended_sessions`]).
//!
//! Agents cannot always reach this server: not while it does not lead (its
//! store's lease lapsed) nor, after a restart, before they notice and
//! reconnect. While they cannot ([`Input::AgentsReachable`] `(false)`) no
//! host is lost; from the moment they can again, each host gets
//! [`RECONNECT_SLACK_MS`] more before its silence counts. The shell says
//! "reachable" at start, when it leads again and when its store writes
//! again after an outage (sessions may have been ended meanwhile).
//!
//! A host held by a live session of another agent is not taken over by a
//! newcomer until the holder has been silent for
//! `CoreConfig::takeover_after_ms` ([`Holder`], checked in
//! `agent_registered`).
//!
//! [`Input::AgentsHeard`]: crate::Input::AgentsHeard
//! [`Input::AgentsReachable`]: crate::Input::AgentsReachable
//! [`Effects::ended_sessions`]: crate::Effects::ended_sessions

use std::sync::Arc;

use peloton_engine::Engine;

use crate::{Effects, Error, Lifecycle};

/// Agents of a restarted (or again leading) server need time to notice and
/// reconnect: their back-off reaches 5 s.
pub const RECONNECT_SLACK_MS: u64 = 10_000;
/// How often silent hosts are looked for.
pub const LIVENESS_CHECK_MS: u64 = 500;

/// The session that holds a host when another registers it: who, and when
/// it was last heard (ms; 0 if never since this server started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holder's agent id ("" from agents that send none).
    pub agent_id: Arc<str>,
    /// When it was last heard.
    pub last_heard_ms: u64,
}

/// What the core keeps to decide hosts' liveness.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// Since when agents can reach this server; `None` while they cannot.
    reachable_since: Option<u64>,
    /// When hosts were last looked at.
    last_check: u64,
}

impl Liveness {
    /// Reachable from `now` (a fresh core, or a recovered one).
    pub(crate) fn from(now: u64) -> Self {
        Liveness {
            reachable_since: Some(now),
            last_check: now,
        }
    }
}

impl Lifecycle {
    /// Whether agents can reach this server (see the module documentation).
    pub fn agents_reachable(&self) -> bool {
        self.liveness.reachable_since.is_some()
    }

    /// Whether hosts are due to be looked at: the shell then steps
    /// [`crate::Input::AgentsHeard`].
    pub fn liveness_due(&self, now: u64) -> bool {
        self.liveness_deadline().is_some_and(|t| t <= now)
    }

    /// When hosts are next looked at, if any is watched (apart from
    /// [`Lifecycle::next_deadline`]: looking takes the hub's last-heard
    /// times, which only the shell has).
    pub fn liveness_deadline(&self) -> Option<u64> {
        self.agent_hosts
            .values()
            .any(|h| !h.lost)
            .then_some(self.liveness.last_check + LIVENESS_CHECK_MS)
    }

    pub(crate) fn agents_reachable_now(&mut self, reachable: bool) {
        self.liveness.reachable_since = reachable.then_some(self.now);
    }

    /// Declares lost every watched host silent past the timeout: `heard`
    /// gives when each was last heard (0 or absent: not since this server
    /// started). While agents cannot reach this server nothing is lost.
    pub(crate) fn agents_heard(
        &mut self,
        engine: &mut Engine,
        heard: &[(Arc<str>, u64)],
        fx: &mut Effects,
    ) {
        let now = self.now;
        self.liveness.last_check = now;
        let Some(since) = self.liveness.reachable_since else {
            return;
        };
        let floor = since + RECONNECT_SLACK_MS;
        let after = self.config.host_lost_after_ms;
        let heard: rustc_hash::FxHashMap<&str, u64> =
            heard.iter().map(|(h, t)| (&**h, *t)).collect();
        let mut lost: Vec<(Arc<str>, u64)> = self
            .watched_agent_hosts()
            .filter_map(|name| {
                let seen = heard.get(&**name).copied().unwrap_or(0).max(floor);
                let silent = now.saturating_sub(seen);
                (silent > after).then(|| (name.clone(), silent))
            })
            .collect();
        lost.sort_unstable();
        for (host, _silent) in lost {
            self.host_lost(engine, &host, after, fx);
            fx.ended_sessions.push(host);
        }
    }

    /// Whether a registration may take a host another session holds: yes if
    /// it is the same agent (restarted on its work directory, its old
    /// connection not yet seen to close) or if the holder has been silent
    /// for the takeover time (its connection is presumed dead). Otherwise
    /// two agents claim one host name: the holder keeps it and the newcomer
    /// is refused, or each registration would mark the other's runs lost
    /// and launch them again.
    pub(crate) fn check_takeover(
        &self,
        host: &str,
        agent_id: &str,
        holder: Option<&Holder>,
    ) -> Result<(), Error> {
        let Some(holder) = holder else {
            return Ok(());
        };
        if !holder.agent_id.is_empty() && *holder.agent_id == *agent_id {
            return Ok(());
        }
        // Silence counts only from when agents could reach this server
        // again, as for lost hosts.
        let heard = match self.liveness.reachable_since {
            Some(since) => holder.last_heard_ms.max(since + RECONNECT_SLACK_MS),
            None => self.now,
        };
        let silent_ms = self.now.saturating_sub(heard);
        let after_ms = self.config.takeover_after_ms;
        if silent_ms > after_ms {
            return Ok(());
        }
        Err(Error::HostHeldBySession {
            host: host.to_string(),
            holder: holder.agent_id.to_string(),
            agent: agent_id.to_string(),
            silent_ms,
            after_ms,
        })
    }
}
