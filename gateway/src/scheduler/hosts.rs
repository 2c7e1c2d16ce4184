//! The loop's host manager: stopping runs and waiting for their hosts to
//! confirm, agents registering and reporting, hosts lost and found, drains,
//! and where a run's logs are.
//!
//! Reconciliation is the heart of it. When an agent registers it lists the
//! runs it has; the loop compares that list with its own view of the host:
//! - a run that is the instance's current run stays (adopted into the engine
//!   if the service restarted meanwhile) and its reported phase is applied;
//! - a run being stopped is confirmed gone if it ended, or told again to stop;
//! - any other live run was replaced (or its job is gone) and is killed;
//! - runs the loop placed there that the agent does not list are lost and
//!   start again.

use std::sync::Arc;

use peloton_engine::host::{HostSpec, HostState};
use peloton_proto::v1 as pb;
use prost::Message;
use rustc_hash::FxHashSet;
use tonic::Status;

use super::{AgentHost, Held, NO_HOST, S, Scheduler, on_host};
use crate::agents::{Outbox, Registration};
use crate::backend::{Kill, RunRef, RunStatus};
use crate::convert;

/// Extra time agents get to reconnect after the server starts.
const RECONNECT_SLACK_MS: u64 = 10_000;

/// How often hosts are checked for missed heartbeats.
const LOST_CHECK_INTERVAL_MS: u64 = 500;

impl Scheduler {
    /// Tells the run's host to stop the instance's current run, and holds
    /// its resources (and the instance) until the host confirms.
    pub(super) fn stop_on_host(&mut self, k: u32, i: u32, preempted: bool) {
        let job = self.jobs.get_mut(&k).expect("live job");
        let grace_ms = job.plan.template(i).kill_grace_ms;
        let job_id = job.id.clone();
        let t = &mut job.tasks[i as usize];
        let handle = t.handle.take();
        let run = RunRef {
            job: k,
            instance: i,
            run: t.run,
            seq: t.seq,
        };
        let host = t.host;
        job.held += 1;
        if let Some(h) = handle {
            self.owners[h.idx()] = None;
        }
        if let Some(list) = self.orphans.get_mut(&host) {
            list.retain(|&x| x != (k, i));
        }
        if preempted {
            self.n_held_preempted += 1;
        }
        let held = Held {
            seq: run.seq,
            handle,
            host,
            restart: false,
            preempted,
        };
        self.mark_dirty(k, i);
        if let Some(old) = self.held.insert((k, i), held) {
            // Only an instance scaled away and added back while its old run
            // was still stopping gets here: forget the old one's hold.
            tracing::warn!(job = %job_id, instance = i, "an earlier run of the instance is still stopping");
            self.finish_held(k, old);
        }
        if host != NO_HOST {
            self.kills.push(Kill {
                run,
                host: self.host_names[host as usize].clone(),
                job_id,
                grace_ms,
            });
        }
    }

    /// Gives a held run's resources back.
    fn finish_held(&mut self, k: u32, h: Held) {
        if h.preempted {
            self.n_held_preempted -= 1;
        }
        if let Some(handle) = h.handle {
            if let Err(e) = self.engine.finish(handle) {
                tracing::error!(error = %e, "held task out of sync with the engine");
            }
            self.needs_cycle = true;
        }
        if let Some(job) = self.jobs.get_mut(&k) {
            job.held -= 1;
            if h.handle.is_some() {
                job.active -= 1;
            }
            // Room under max_running_instances, or an instance that waited
            // for this run to be gone.
            if !job.waiting.is_empty() {
                self.need_fill.insert(k);
            }
            self.dirty_jobs.insert(k);
        }
    }

    /// The task's row is written at the next commit.
    pub(super) fn mark_dirty(&mut self, k: u32, i: u32) {
        if let Some(t) = self
            .jobs
            .get_mut(&k)
            .and_then(|j| j.tasks.get_mut(i as usize))
            && !t.dirty
        {
            t.dirty = true;
            self.dirty_tasks.push((k, i));
        }
    }

    /// The host confirmed that the held run of (k, i) is gone: its
    /// resources are free, and the instance starts again if that was
    /// wanted meanwhile.
    pub(super) fn confirm_end(&mut self, k: u32, i: u32) {
        let Some(h) = self.held.remove(&(k, i)) else {
            return;
        };
        let (host, restart) = (h.host, h.restart);
        self.finish_held(k, h);
        self.mark_dirty(k, i);
        if let Some(job) = self.jobs.get(&k)
            && let Some(t) = job.tasks.get(i as usize)
            // Lost and preempted runs always start again (or end killed).
            && (restart || matches!(t.state, S::Preempted | S::Lost))
        {
            let state = t.state;
            if job.kill_requested {
                match state {
                    S::Preempted | S::Lost => {
                        self.transition(k, i, S::Initialized, None);
                        self.transition(k, i, S::Killed, Some("job killed"));
                    }
                    S::Backoff => self.transition(k, i, S::Killed, Some("job killed")),
                    _ => {}
                }
            } else if matches!(
                state,
                S::Preempted | S::Lost | S::Killed | S::Succeeded | S::Failed | S::Backoff
            ) {
                self.new_run(k, i);
            }
        }
        self.check_drained(host);
    }

    /// A draining host with nothing left on it goes down.
    pub(super) fn check_drained(&mut self, slot: u32) {
        if slot == NO_HOST || !self.maintenance.contains(&slot) {
            return;
        }
        let Some(id) = self.engine.hosts().lookup_slot(slot as usize) else {
            return;
        };
        if self.engine.hosts().state(id) != HostState::Draining {
            return;
        }
        let busy = self.held.values().any(|h| h.host == slot)
            || !self.instances_on(slot).is_empty()
            || self.orphans.get(&slot).is_some_and(|o| !o.is_empty());
        if busy {
            return;
        }
        self.engine
            .hosts_mut()
            .set_state(id, HostState::Down)
            .expect("live host");
        self.host_row(slot);
        tracing::info!(host = %self.host_names[slot as usize], "drained");
    }

    /// Instances whose current run holds the host in `slot` in the engine
    /// (not held runs, not orphans).
    pub(super) fn instances_on(&self, slot: u32) -> Vec<(u32, u32)> {
        self.engine
            .tasks()
            .placed_views()
            .filter(|v| v.host == slot)
            .filter_map(|v| self.owners.get(v.task.idx()).copied().flatten())
            .collect()
    }

    /// Stores the host's row: its registration and its maintenance state.
    pub(super) fn host_row(&mut self, slot: u32) {
        let hosts = self.engine.hosts();
        let Some(id) = hosts.lookup_slot(slot as usize) else {
            return;
        };
        let state = if self.maintenance.contains(&slot) {
            match hosts.state(id) {
                HostState::Draining => pb::HostState::Draining,
                _ => pb::HostState::Down,
            }
        } else {
            pb::HostState::Up
        };
        let row = pb::Host {
            name: hosts.name(id).to_string(),
            capacity: Some(convert::resources_to_pb(hosts.capacity(slot as usize))),
            state: state as i32,
            attributes: host_attributes(hosts, slot),
            isolation: self
                .agent_hosts
                .get(&slot)
                .map(|a| a.isolation.clone())
                .unwrap_or_default(),
            ..Default::default()
        };
        self.batch
            .hosts
            .push((row.name.clone(), Some(row.encode_to_vec())));
    }

    /// Adds a stored agent host at recovery: down until its agent registers.
    pub(super) fn recover_agent_host(&mut self, row: &pb::Host) -> anyhow::Result<()> {
        let spec = host_spec(&row.name, row.capacity.as_ref(), &row.attributes, 1000)
            .map_err(|e| anyhow::anyhow!("stored host {}: {}", row.name, e.message()))?;
        let id = self
            .engine
            .hosts_mut()
            .add(&spec)
            .map_err(|e| anyhow::anyhow!("stored host {}: {e}", row.name))?;
        self.engine.hosts_mut().set_state(id, HostState::Down)?;
        let slot = id.idx() as u32;
        self.set_host_name(slot, &row.name);
        if row.state() != pb::HostState::Up {
            self.maintenance.insert(slot);
        }
        self.agent_hosts.insert(
            slot,
            AgentHost {
                lost: false,
                isolation: row.isolation.clone(),
                connected: false,
            },
        );
        Ok(())
    }

    fn set_host_name(&mut self, slot: u32, name: &str) {
        let slot = slot as usize;
        if self.host_names.len() <= slot {
            self.host_names.resize(slot + 1, Arc::from(""));
        }
        self.host_names[slot] = Arc::from(name);
    }

    /// An agent registered: the host is (again) up with what it offers, the
    /// session receives launches from now on, and its runs are reconciled.
    pub(super) fn agent_registered(&mut self, reg: Registration) -> Result<(), Status> {
        let Some(_) = self.backend.agents() else {
            return Err(Status::failed_precondition(
                "this server runs simulated hosts and accepts no agents",
            ));
        };
        let r = reg.register;
        let spec = host_spec(&r.host, r.resources.as_ref(), &r.attributes, r.ports)?;
        let slot = match self.engine.hosts().lookup(&r.host) {
            Some(id) => {
                let slot = id.idx() as u32;
                if let Err(e) = self.engine.hosts_mut().update(id, &spec) {
                    // Runs placed there hold more than it now offers: keep
                    // the old capacity until they end.
                    tracing::warn!(host = %r.host, error = %e, "host's new resources not applied");
                }
                slot
            }
            None => {
                let id = self
                    .engine
                    .hosts_mut()
                    .add(&spec)
                    .map_err(|e| Status::invalid_argument(format!("register: {e}")))?;
                let slot = id.idx() as u32;
                self.set_host_name(slot, &r.host);
                slot
            }
        };
        let id = self
            .engine
            .hosts()
            .lookup_slot(slot as usize)
            .expect("live");
        let state = if self.maintenance.contains(&slot) {
            if self.engine.hosts().state(id) == HostState::Up {
                HostState::Draining
            } else {
                self.engine.hosts().state(id)
            }
        } else {
            HostState::Up
        };
        self.engine
            .hosts_mut()
            .set_state(id, state)
            .expect("live host");
        self.agent_hosts.insert(
            slot,
            AgentHost {
                lost: false,
                isolation: r.isolation.clone(),
                connected: true,
            },
        );
        let host: Arc<str> = self.host_names[slot as usize].clone();
        let outbox = reg.session.tx.clone();
        self.backend
            .agents()
            .expect("checked")
            .attach(host.clone(), reg.session);
        self.host_row(slot);

        let mut acks = Vec::new();
        let mut reported = FxHashSet::default();
        for report in r.runs {
            if let Some(key) = &report.key {
                reported.insert(key.launch_id);
            }
            self.agent_report(slot, &host, report, &mut acks);
        }
        // What the agent does not have: runs never launched there (the
        // launch was lost with the old session) or lost with the agent.
        let reason = format!("host {host}: its agent does not have the run");
        for (k, i) in self.orphans.remove(&slot).unwrap_or_default() {
            self.lose_run(k, i, slot, &reason);
        }
        let placed: Vec<(u32, u32)> = self.instances_on(slot);
        for (k, i) in placed {
            let seq = self.jobs[&k].tasks[i as usize].seq;
            if !reported.contains(&seq) {
                self.lose_run(k, i, slot, &reason);
            }
        }
        let gone: Vec<(u32, u32)> = self
            .held
            .iter()
            .filter(|(_, h)| h.host == slot && !reported.contains(&h.seq))
            .map(|(&ki, _)| ki)
            .collect();
        for (k, i) in gone {
            self.confirm_end(k, i);
        }
        self.check_drained(slot);
        self.ack(outbox, acks);
        self.needs_cycle = true;
        Ok(())
    }

    /// Reports from an agent's session.
    pub(super) fn agent_reports(&mut self, host: &Arc<str>, reports: Vec<pb::RunReport>) {
        let Some(id) = self.engine.hosts().lookup(host) else {
            return;
        };
        let slot = id.idx() as u32;
        let mut acks = Vec::new();
        for r in reports {
            self.agent_report(slot, host, r, &mut acks);
        }
        let outbox = self
            .backend
            .agents()
            .and_then(|a| a.session(host).map(|s| s.tx.clone()));
        if let Some(outbox) = outbox {
            self.ack(outbox, acks);
        }
    }

    /// After the commit, tells the agent which final reports are recorded.
    fn ack(&mut self, outbox: Outbox, keys: Vec<pb::RunKey>) {
        if keys.is_empty() {
            return;
        }
        self.deferred.push(Box::new(move || {
            for chunk in keys.chunks(crate::agents::MAX_RUNS_PER_MESSAGE) {
                let msg = pb::ServerMessage {
                    kind: Some(pb::server_message::Kind::Ack(pb::AckRuns {
                        keys: chunk.to_vec(),
                    })),
                };
                // A full or closed outbox: the agent reports again later.
                if outbox.try_send(Ok(msg)).is_err() {
                    break;
                }
            }
        }));
    }

    fn agent_report(
        &mut self,
        slot: u32,
        host: &Arc<str>,
        report: pb::RunReport,
        acks: &mut Vec<pb::RunKey>,
    ) {
        let phase = report.phase();
        let Some(key) = report.key else {
            return;
        };
        let ended = matches!(
            phase,
            pb::RunPhase::Succeeded | pb::RunPhase::Failed | pb::RunPhase::Killed
        );
        if ended {
            acks.push(key.clone());
        }
        let i = key.instance;
        let job_key = self.by_id.get(key.job_id.as_str()).copied();
        let run = RunRef {
            job: job_key.unwrap_or(u32::MAX),
            instance: i,
            run: key.run_id,
            seq: key.launch_id,
        };
        let kill = |s: &mut Self| {
            s.kills.push(Kill {
                run,
                host: host.clone(),
                job_id: Arc::from(key.job_id.as_str()),
                grace_ms: 10_000,
            });
        };
        let Some(k) = job_key else {
            if !ended {
                kill(self);
            }
            return;
        };
        if self
            .held
            .get(&(k, i))
            .is_some_and(|h| h.seq == key.launch_id && h.host == slot)
        {
            if ended {
                self.confirm_end(k, i);
            } else {
                kill(self);
            }
            return;
        }
        let job = &self.jobs[&k];
        let current = job
            .tasks
            .get(i as usize)
            .is_some_and(|t| t.seq == key.launch_id && on_host(t.state) && t.host == slot);
        if !current {
            if !ended {
                // Replaced by a newer run, or its instance is gone.
                kill(self);
            }
            return;
        }
        if job.tasks[i as usize].handle.is_none() && !ended {
            // Recovered after a restart and still running: the engine
            // takes it over. (An ended one just has its end applied.)
            if let Err(e) = self.adopt(k, i, slot) {
                tracing::warn!(host = %host, job = %key.job_id, instance = i, error = %e, "cannot adopt a run; stopping it");
                self.stop_on_host(k, i, false);
                self.transition(
                    k,
                    i,
                    S::Lost,
                    Some(&format!("cannot take the run over: {e}")),
                );
                self.new_run(k, i);
                return;
            }
        }
        // A run that ended before its RUNNING report went out still ran.
        if report.started_ms > 0 && phase != pb::RunPhase::Running {
            self.apply_update(crate::backend::TaskUpdate {
                run,
                status: RunStatus::Running,
                time_ms: report.started_ms,
            });
        }
        let status = match phase {
            pb::RunPhase::Unknown | pb::RunPhase::Starting => None,
            pb::RunPhase::Running => Some(RunStatus::Running),
            pb::RunPhase::Succeeded => Some(RunStatus::Exited(0)),
            pb::RunPhase::Failed => Some(RunStatus::Failed(
                report.exit_code,
                if report.reason.is_empty() {
                    format!("exited with code {}", report.exit_code)
                } else {
                    report.reason
                },
            )),
            pb::RunPhase::Killed => Some(RunStatus::Killed),
        };
        if let Some(status) = status {
            self.apply_update(crate::backend::TaskUpdate {
                run,
                status,
                time_ms: report.time_ms,
            });
        }
        // Decisions taken while the run was out of sight.
        let job = &self.jobs[&k];
        if on_host(job.tasks[i as usize].state) {
            if job.kill_requested {
                self.end_run(k, i, S::Killed, "job killed");
            } else if self.maintenance.contains(&slot) {
                let reason = format!("host {host} drained for maintenance");
                if self.end_run(k, i, S::Preempted, &reason) {
                    self.new_run(k, i);
                }
            }
        }
    }

    /// Takes a recovered run into the engine on the host it runs on.
    fn adopt(&mut self, k: u32, i: u32, slot: u32) -> Result<(), String> {
        let task = super::new_task(&self.jobs[&k], k, i);
        let host = self
            .engine
            .hosts()
            .lookup_slot(slot as usize)
            .ok_or("host is gone")?;
        let h = self
            .engine
            .adopt(&task, host, self.now)
            .map_err(|e| e.to_string())?;
        let job = self.jobs.get_mut(&k).expect("live job");
        job.tasks[i as usize].handle = Some(h);
        job.active += 1;
        let t = &job.tasks[i as usize];
        let limit = job.plan.max_running_time_ms;
        if limit > 0 && t.state == S::Running && t.started_at > 0 {
            // The run-time limit holds across the restart.
            self.timers.push(std::cmp::Reverse((
                t.started_at.saturating_add(limit),
                super::TimerKind::Deadline,
                RunRef {
                    job: k,
                    instance: i,
                    run: t.run,
                    seq: t.seq,
                },
            )));
        }
        if self.owners.len() <= h.idx() {
            self.owners.resize(h.idx() + 1, None);
        }
        self.owners[h.idx()] = Some((k, i));
        if let Some(list) = self.orphans.get_mut(&slot) {
            list.retain(|&x| x != (k, i));
        }
        Ok(())
    }

    /// The run of (k, i) on `slot` is gone with its host: lost, and the
    /// instance starts again.
    fn lose_run(&mut self, k: u32, i: u32, slot: u32, reason: &str) {
        let Some(t) = self
            .jobs
            .get_mut(&k)
            .and_then(|j| j.tasks.get_mut(i as usize))
        else {
            return;
        };
        if !on_host(t.state) || t.host != slot {
            return;
        }
        t.finished_at = self.now;
        self.release(k, i);
        self.transition(k, i, S::Lost, Some(reason));
        if self.jobs[&k].kill_requested {
            self.transition(k, i, S::Initialized, None);
            self.transition(k, i, S::Killed, Some("job killed"));
        } else {
            self.new_run(k, i);
        }
    }

    /// An agent's session ended: launches to it stop; its runs are kept
    /// until the host is declared lost.
    pub(super) fn agent_gone(&mut self, host: &str, session: u64) {
        if let Some(a) = self.backend.agents()
            && a.detach(host, session)
            && let Some(id) = self.engine.hosts().lookup(host)
            && let Some(h) = self.agent_hosts.get_mut(&(id.idx() as u32))
        {
            h.connected = false;
            // No new work for a host nobody would launch it on; its runs
            // stay until it returns or is declared lost.
            if self.engine.hosts().state(id) == HostState::Up {
                self.engine
                    .hosts_mut()
                    .set_state(id, HostState::Down)
                    .expect("live host");
            }
        }
    }

    /// Declares lost the agent hosts not heard from in time.
    pub(super) fn check_lost_hosts(&mut self) {
        let Some(hub) = self.hub.clone() else {
            return;
        };
        if self.now < self.last_lost_check + LOST_CHECK_INTERVAL_MS {
            return;
        }
        self.last_lost_check = self.now;
        let after = self.config.host_lost_after.as_millis() as u64;
        let mut lost: Vec<u32> = self
            .agent_hosts
            .iter()
            .filter(|(_, h)| !h.lost)
            .filter(|(slot, _)| {
                let name = &self.host_names[**slot as usize];
                // Agents of a restarted server need time to notice and
                // reconnect (their back-off reaches 5 s).
                let seen = hub
                    .last_seen(name)
                    .unwrap_or(self.started_at + RECONNECT_SLACK_MS)
                    .max(self.started_at + RECONNECT_SLACK_MS);
                self.now.saturating_sub(seen) > after
            })
            .map(|(&slot, _)| slot)
            .collect();
        lost.sort_unstable();
        for slot in lost {
            self.host_lost(slot, after);
        }
    }

    fn host_lost(&mut self, slot: u32, after_ms: u64) {
        let host = self.host_names[slot as usize].clone();
        tracing::warn!(%host, "host lost: no heartbeat for {after_ms} ms");
        if let Some(h) = self.agent_hosts.get_mut(&slot) {
            h.lost = true;
            h.connected = false;
        }
        if let Some(a) = self.backend.agents()
            && let Some(s) = a.session(&host).map(|s| s.id)
        {
            a.detach(&host, s);
        }
        let id = self
            .engine
            .hosts()
            .lookup_slot(slot as usize)
            .expect("live");
        self.engine
            .hosts_mut()
            .set_state(id, HostState::Down)
            .expect("live host");
        let reason = format!("host {host} lost: no heartbeat for {after_ms} ms");
        let placed: Vec<(u32, u32)> = self.instances_on(slot);
        for (k, i) in placed {
            self.lose_run(k, i, slot, &reason);
        }
        for (k, i) in self.orphans.remove(&slot).unwrap_or_default() {
            self.lose_run(k, i, slot, &reason);
        }
        let held: Vec<(u32, u32)> = self
            .held
            .iter()
            .filter(|(_, h)| h.host == slot)
            .map(|(&ki, _)| ki)
            .collect();
        for (k, i) in held {
            self.confirm_end(k, i);
        }
        if self.maintenance.contains(&slot) {
            self.host_row(slot);
        }
        self.needs_cycle = true;
    }

    /// Where a run's logs are.
    pub(super) fn log_target(
        &mut self,
        job_id: &str,
        instance: u32,
        run_id: u32,
    ) -> Result<(pb::RunKey, Outbox), Status> {
        let k = self.job_key(job_id)?;
        let job = &self.jobs[&k];
        let Some(t) = job.tasks.get(instance as usize) else {
            return Err(Status::not_found(format!(
                "job {job_id} has no instance {instance}"
            )));
        };
        let current = super::task_run(t, &self.host_names);
        let history = t.history.as_deref().map_or(&[][..], |h| h.as_slice());
        let run = std::iter::once(&current)
            .chain(history.iter())
            .find(|r| r.launch_id != 0 && (run_id == 0 || r.run_id == run_id) && !r.host.is_empty())
            .cloned()
            .ok_or_else(|| {
                Status::not_found(if run_id == 0 {
                    format!("{job_id}/{instance} has not been launched yet")
                } else {
                    format!("{job_id}/{instance} has no launched run {run_id}")
                })
            })?;
        let key = pb::RunKey {
            job_id: job_id.to_string(),
            instance,
            run_id: run.run_id,
            launch_id: run.launch_id,
        };
        let Some(agents) = self.backend.agents() else {
            return Err(Status::failed_precondition(
                "runs on simulated hosts have no logs",
            ));
        };
        let Some(session) = agents.session(&run.host) else {
            return Err(Status::unavailable(format!(
                "the agent of host {} is not connected",
                run.host
            )));
        };
        Ok((key, session.tx.clone()))
    }
}

/// A host's attributes as strings.
pub(super) fn host_attributes(
    hosts: &peloton_engine::host::HostArena,
    slot: u32,
) -> std::collections::HashMap<String, String> {
    let interner = hosts.interner();
    hosts
        .attributes(slot as usize)
        .iter()
        .map(|(k, v)| {
            (
                interner.resolve(*k).to_string(),
                interner.resolve(*v).to_string(),
            )
        })
        .collect()
}

/// An agent's registration (or a stored host row) as an engine host.
pub(super) fn host_spec(
    name: &str,
    resources: Option<&pb::Resources>,
    attributes: &std::collections::HashMap<String, String>,
    ports: u32,
) -> Result<HostSpec, Status> {
    let capacity = convert::resources("register.resources", resources)?;
    let gpus = resources.map_or(0.0, |r| r.gpu);
    if gpus.fract() != 0.0 || !(0.0..=16.0).contains(&gpus) {
        return Err(convert::invalid(
            "register.resources.gpu",
            format!("must be a whole number of devices, 0–16 (got {gpus})"),
        ));
    }
    let mut attrs: Vec<(String, String)> = attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !attributes.contains_key("host") {
        attrs.push(("host".into(), name.to_string()));
    }
    attrs.sort_unstable();
    Ok(HostSpec {
        name: name.to_string(),
        capacity,
        gpu_devices: gpus as u8,
        ports,
        attributes: attrs,
    })
}
