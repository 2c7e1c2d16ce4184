//! Instances pinned to a host: stateful instances (to the host of their
//! volume) and daemons (one instance per matching host). The engine takes
//! the pin as a placement input (`NewTask::desired_host`) and holds the
//! instance's resources on its host between runs (`Engine::set_reservation`);
//! this module decides pins, volumes and reservations.
//!
//! Reservation of a pinned instance on its host, recomputed at the end of
//! every step for the instances whose state changed:
//! - a run of the instance holds the host (placed, launching, running, or
//!   stopping there): nothing (the run's task holds it all, volume
//!   included) — but for a run recovered after a restart and not yet
//!   reported by its agent, which has no engine task: its whole request;
//! - otherwise: the volume's disk, plus the instance's whole request while
//!   it is going to run again (waiting, queued, backing off) — so its next
//!   run finds its place free — unless its last run was preempted to make
//!   room for other work (`Task::gave_way`).

use std::sync::Arc;

use peloton_engine::host::HostState;
use peloton_engine::{Dim, Engine, Resources};

use super::effects::{Effects, RowKey};
use super::model::{HostSlot, JobKey, JobKind, TaskState as S, Volume};
use super::{Answer, Error, Lifecycle};

/// Default time a volume's host may be down before a relocating job gives
/// the volume up.
pub const DEFAULT_HOST_DOWN_TIMEOUT_MS: u64 = 600_000;

impl Lifecycle {
    /// The host instance `i` of job `k` is pinned to: its volume's, or its
    /// daemon host.
    pub fn pin_of(&self, k: JobKey, i: u32) -> Option<HostSlot> {
        if let Some(v) = self.volumes.get(&(k, i)) {
            return Some(v.host);
        }
        self.jobs
            .get(&k)
            .and_then(|j| j.tasks.get(i as usize))
            .and_then(|t| t.daemon_host)
    }

    /// A volume by instance.
    pub fn volume_of(&self, k: JobKey, i: u32) -> Option<&Volume> {
        self.volumes.get(&(k, i))
    }

    /// A volume by id.
    pub fn volume(&self, id: &str) -> Option<&Volume> {
        self.volume_ids.get(id).and_then(|ki| self.volumes.get(ki))
    }

    /// Every volume, by job and instance.
    pub fn volumes(&self) -> impl Iterator<Item = &Volume> + '_ {
        self.volumes.values()
    }

    /// Whether a run of the instance holds its volume's host now.
    pub fn volume_in_use(&self, v: &Volume) -> bool {
        let held_there = self
            .held
            .get(&(v.job, v.instance))
            .is_some_and(|h| h.host == Some(v.host));
        let running_there = self
            .jobs
            .get(&v.job)
            .and_then(|j| j.tasks.get(v.instance as usize))
            .is_some_and(|t| (t.state.on_host() || t.orphan) && t.host == Some(v.host));
        held_there || running_there
    }

    /// Marks an instance whose reservation may change.
    pub(super) fn pin_changed(&mut self, k: JobKey, i: u32) {
        if self.volumes.is_empty() && self.daemon_jobs.is_empty() {
            return; // the common case, on every transition
        }
        if self.volumes.contains_key(&(k, i))
            || self
                .jobs
                .get(&k)
                .is_some_and(|j| j.plan.kind == JobKind::Daemon)
        {
            self.pin_dirty.insert((k, i));
        }
    }

    /// A run of an instance whose task has a volume was placed on `host`:
    /// the volume is created there if the instance has none. Returns the
    /// volume to launch with.
    pub(super) fn volume_at_placement(
        &mut self,
        k: JobKey,
        i: u32,
        host: HostSlot,
        fx: &mut Effects,
    ) -> Option<(Arc<str>, u64)> {
        let job = &self.jobs[&k];
        let tmpl = job.template(i).volume.clone()?;
        if let Some(v) = self.volumes.get(&(k, i)) {
            debug_assert_eq!(v.host, host, "a pinned run goes to its volume");
            return Some((v.id.clone(), v.size_mb));
        }
        let launch = job.tasks[i as usize].launch;
        let id: Arc<str> = format!("{}-{i}-{}", job.id, launch.0).into();
        self.volumes.insert(
            (k, i),
            Volume {
                id: id.clone(),
                job: k,
                instance: i,
                host,
                size_mb: tmpl.size_mb,
                path: tmpl.path.clone(),
                created_at: self.now,
            },
        );
        self.volume_ids.insert(id.clone(), (k, i));
        fx.rows.push(RowKey::Volume(k, i));
        self.pin_dirty.insert((k, i));
        Some((id, tmpl.size_mb))
    }

    /// Drops a volume from the books (its reservation, its row) and asks
    /// its host to remove it.
    pub(super) fn drop_volume(&mut self, engine: &mut Engine, k: JobKey, i: u32, fx: &mut Effects) {
        let Some(v) = self.volumes.remove(&(k, i)) else {
            return;
        };
        self.volume_ids.remove(&v.id);
        engine.clear_reservation(k.0, i);
        fx.rows.push(RowKey::VolumeDeleted(v.id.clone()));
        fx.volume_deletes
            .push((self.host_names[v.host.idx()].clone(), v.id));
        self.pin_dirty.insert((k, i));
    }

    /// Every volume of a job goes (the job is deleted).
    pub(super) fn drop_volumes_of(&mut self, engine: &mut Engine, k: JobKey, fx: &mut Effects) {
        let keys: Vec<(JobKey, u32)> = self
            .volumes
            .range((k, 0)..=(k, u32::MAX))
            .map(|(&ki, _)| ki)
            .collect();
        for (k, i) in keys {
            self.drop_volume(engine, k, i, fx);
        }
    }

    /// Deletes a volume on request: refused while a run of its instance
    /// holds the host. The instance's next run starts fresh, anywhere; one
    /// queued for the volume's host is queued again without the pin.
    pub(super) fn delete_volume(
        &mut self,
        engine: &mut Engine,
        id: &str,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let Some(&(k, i)) = self.volume_ids.get(id) else {
            return Err(Error::VolumeNotFound(id.to_string()));
        };
        let v = &self.volumes[&(k, i)];
        if self.volume_in_use(v) {
            return Err(Error::Precondition(format!(
                "volume {id} is in use: a run of {}/{i} holds host {}; stop it first",
                self.jobs[&k].id,
                self.host_names[v.host.idx()]
            )));
        }
        self.drop_volume(engine, k, i, fx);
        self.unpin_queued(engine, k, i, "its volume was deleted", fx);
        self.needs_cycle = true;
        Ok(Answer::Done)
    }

    /// An instance that lost its pin and is queued in the engine for its old
    /// host goes back to waiting, to be queued again anywhere.
    fn unpin_queued(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        reason: &str,
        fx: &mut Effects,
    ) {
        let Some(job) = self.jobs.get(&k) else {
            return;
        };
        let Some(t) = job.tasks.get(i as usize) else {
            return;
        };
        if matches!(t.state, S::Pending | S::Ready | S::Placing) {
            // Withdrawn from the engine (a queued one waits again; an
            // admitted one ends and starts a new run).
            if self.end_run(engine, k, i, S::Preempted, reason, fx) {
                self.new_run(k, i, fx);
            }
        }
    }

    /// Brings the engine's reservations of the pinned instances that
    /// changed in this step up to date. One that does not fit (its room
    /// taken meanwhile) holds what it can and is tried again after the
    /// next step.
    pub(super) fn sync_reservations(&mut self, engine: &mut Engine) {
        if self.pin_dirty.is_empty() {
            return;
        }
        let mut dirty: Vec<(JobKey, u32)> = self.pin_dirty.drain().collect();
        dirty.sort_unstable();
        dirty.retain(|&(k, i)| !self.sync_reservation(engine, k, i));
        // Room freed later in the pass (a reservation given up) is theirs.
        dirty.retain(|&(k, i)| !self.sync_reservation(engine, k, i));
        self.pin_dirty.extend(dirty);
    }

    /// Sets the engine's reservation of one pinned instance; false if what
    /// it wants does not fit (it then holds at least its volume's disk).
    fn sync_reservation(&mut self, engine: &mut Engine, k: JobKey, i: u32) -> bool {
        let want = self.wanted_reservation(k, i);
        let have = engine.reservation(k.0, i);
        let Some((slot, amount)) = want else {
            if have.is_some() {
                engine.clear_reservation(k.0, i);
                self.needs_cycle = true;
            }
            return true;
        };
        if have == Some((slot.0, amount)) {
            return true;
        }
        let Some(id) = engine.hosts().lookup_slot(slot.idx()) else {
            engine.clear_reservation(k.0, i);
            return true;
        };
        let fits = engine.set_reservation(k.0, i, id, amount).is_ok();
        if !fits {
            // Taken meanwhile (e.g. while the instance was unpinned): hold
            // at least the volume's disk.
            let volume = self
                .volumes
                .get(&(k, i))
                .filter(|v| v.host == slot)
                .map_or(Resources::ZERO, |v| Resources::new(0, 0, v.size_mb, 0));
            if engine.set_reservation(k.0, i, id, volume).is_err() {
                engine.clear_reservation(k.0, i);
            }
        }
        if engine.reservation(k.0, i) != have {
            self.needs_cycle = true;
        }
        fits
    }

    /// What should be held for an instance, and where.
    fn wanted_reservation(&self, k: JobKey, i: u32) -> Option<(HostSlot, Resources)> {
        let slot = self.pin_of(k, i)?;
        let job = self.jobs.get(&k)?;
        let volume = self
            .volumes
            .get(&(k, i))
            .filter(|v| v.host == slot)
            .map_or(0, |v| v.size_mb);
        // A run there holds it with its engine task (its request and the
        // volume's disk). One recovered after a restart and not reported
        // yet (an orphan, or a held run without an engine task) holds
        // nothing in the engine: its place is reserved until its agent
        // reports it (adoption takes the reservation).
        let held_there = self.held.get(&(k, i)).filter(|h| h.host == Some(slot));
        if held_there.is_some_and(|h| h.handle.is_some()) {
            return None;
        }
        let Some(t) = job.tasks.get(i as usize) else {
            // Scaled away: its volume stays until it is deleted.
            return (volume > 0).then(|| (slot, Resources::new(0, 0, volume, 0)));
        };
        let current_there = t.state.on_host() && t.host == Some(slot);
        if current_there && t.handle.is_some() {
            return None;
        }
        let unseen = (current_there && t.orphan) || held_there.is_some();
        let mut amount = Resources::new(0, 0, volume, 0);
        let coming_back = !job.kill_requested
            && !t.gave_way
            && matches!(
                t.state,
                S::Initialized
                    | S::Pending
                    | S::Ready
                    | S::Placing
                    | S::Backoff
                    | S::Lost
                    | S::Preempted
            );
        if coming_back || unseen {
            let mut request = job.template(i).request;
            request.0[Dim::Gpu.idx()] = 0;
            // With the volume's disk: exactly what its next task asks for.
            amount.add_assign(&request);
        }
        (!amount.is_zero()).then_some((slot, amount))
    }

    /// Hosts holding volumes: track since when they are down, and give up
    /// the volumes of relocating jobs whose host has been down too long.
    pub(super) fn check_volume_hosts(&mut self, engine: &mut Engine, fx: &mut Effects) {
        self.volume_deadline = None;
        if self.volumes.is_empty() {
            self.down_since.clear();
            return;
        }
        let mut give_up = Vec::new();
        let mut seen = rustc_hash::FxHashSet::default();
        for v in self.volumes.values() {
            let up = engine
                .hosts()
                .lookup_slot(v.host.idx())
                .is_some_and(|id| engine.hosts().state(id) == HostState::Up);
            if up {
                continue;
            }
            seen.insert(v.host);
            let since = *self.down_since.get(&v.host).unwrap_or(&self.now);
            let Some(job) = self.jobs.get(&v.job) else {
                continue;
            };
            let policy = job.plan.volume_policy;
            if policy.relocate
                && self.now.saturating_sub(since) >= policy.host_down_timeout_ms
                && !self.volume_in_use(v)
            {
                give_up.push((v.job, v.instance, since));
            }
        }
        let now = self.now;
        self.down_since.retain(|h, _| seen.contains(h));
        for h in seen {
            self.down_since.entry(h).or_insert(now);
        }
        self.volume_deadline = self.next_volume_deadline();
        for (k, i, since) in give_up {
            let v = &self.volumes[&(k, i)];
            let reason = format!(
                "volume {} given up: host {} down for {} s; starting fresh elsewhere",
                v.id,
                self.host_names[v.host.idx()],
                self.now.saturating_sub(since) / 1000
            );
            self.drop_volume(engine, k, i, fx);
            let queued = self.jobs[&k]
                .tasks
                .get(i as usize)
                .map(|t| matches!(t.state, S::Pending | S::Ready | S::Placing));
            match queued {
                // Its events say why.
                Some(true) => self.unpin_queued(engine, k, i, &reason, fx),
                Some(false) => self.task_event(k, i, &reason, fx),
                None => {}
            }
            self.needs_cycle = true;
        }
    }

    /// When the next volume of a relocating job may be given up (a scan:
    /// the shell reads the value kept by `check_volume_hosts`).
    fn next_volume_deadline(&self) -> Option<u64> {
        self.volumes
            .values()
            .filter_map(|v| {
                let since = self.down_since.get(&v.host)?;
                let policy = self.jobs.get(&v.job)?.plan.volume_policy;
                policy
                    .relocate
                    .then(|| since.saturating_add(policy.host_down_timeout_ms))
            })
            .min()
    }

    /// The volumes an agent lists that the core does not know on that host
    /// are removed (deleted or given up while it was away).
    pub(super) fn reconcile_volumes(
        &mut self,
        slot: HostSlot,
        listed: &[String],
        fx: &mut Effects,
    ) {
        for id in listed {
            let known = self
                .volume_ids
                .get(id.as_str())
                .and_then(|ki| self.volumes.get(ki))
                .is_some_and(|v| v.host == slot);
            if !known {
                fx.volume_deletes
                    .push((self.host_names[slot.idx()].clone(), Arc::from(id.as_str())));
            }
        }
    }

    // ------------------------------------------------------------ daemons

    /// Hosts a daemon job should have an instance on: up hosts its task
    /// may use (constraint, host rules). A draining host keeps its daemon
    /// until the rest of its work is gone (`drain` retires it last); so
    /// does an agent host whose agent is away but not lost yet (an agent
    /// restart must not replace its daemons); a host lost or down for
    /// maintenance loses it. A host where a run of the job is still
    /// stopping gets no new instance until it is gone.
    fn daemon_hosts(&self, engine: &mut Engine, k: JobKey) -> roaring::RoaringBitmap {
        let job = &self.jobs[&k];
        let t = &job.plan.default;
        let Ok(mut hosts) = engine.hosts_matching(&t.constraint, t.request) else {
            return roaring::RoaringBitmap::new();
        };
        let up = engine.hosts().in_state(HostState::Up);
        let draining = engine.hosts().in_state(HostState::Draining);
        let with_daemon: roaring::RoaringBitmap = job
            .tasks
            .iter()
            .filter_map(|t| t.daemon_host)
            .map(|h| h.0)
            .collect();
        let away: roaring::RoaringBitmap = self
            .agent_hosts
            .iter()
            .filter(|(s, a)| !a.connected && !a.lost && !self.maintenance.contains(s))
            .map(|(s, _)| s.0)
            .collect();
        hosts &= &(up | &((draining | &away) & &with_daemon));
        for (&(hk, _), h) in &self.held {
            if hk == k
                && let Some(s) = h.host
                && !with_daemon.contains(s.0)
            {
                hosts.remove(s.0);
            }
        }
        hosts
    }

    /// Gives each daemon job one instance per host it should be on, and
    /// retires the instances of hosts it should no longer be on.
    pub(super) fn reconcile_daemons(&mut self, engine: &mut Engine, fx: &mut Effects) {
        let keys: Vec<JobKey> = self.daemon_jobs.iter().copied().collect();
        for k in keys {
            self.reconcile_daemon(engine, k, fx);
        }
    }

    pub(super) fn reconcile_daemon(&mut self, engine: &mut Engine, k: JobKey, fx: &mut Effects) {
        let Some(job) = self.jobs.get(&k) else {
            return;
        };
        if job.kill_requested {
            return;
        }
        let wanted = self.daemon_hosts(engine, k);
        let job = &self.jobs[&k];
        let mut have = roaring::RoaringBitmap::new();
        let mut leaving = Vec::new();
        for (i, t) in job.tasks.iter().enumerate() {
            if let Some(h) = t.daemon_host {
                if wanted.contains(h.0) {
                    have.insert(h.0);
                } else {
                    leaving.push(i as u32);
                }
            }
        }
        for i in leaving {
            let h = self.jobs[&k].tasks[i as usize].daemon_host.expect("bound");
            let reason = format!(
                "host {} no longer matches the daemon job",
                self.host_names[h.idx()]
            );
            self.retire_daemon_instance(engine, k, i, &reason, fx);
        }
        let joining = &wanted - &have;
        if joining.is_empty() {
            return;
        }
        let now = self.now;
        // Retired instances (no host, their last run gone) are reused first,
        // lowest first; found in one pass, not one per joining host.
        let mut retired = self.jobs[&k]
            .tasks
            .iter()
            .enumerate()
            .filter(|&(i, t)| {
                t.daemon_host.is_none()
                    && t.state.is_terminal()
                    && !self.held.contains_key(&(k, i as u32))
            })
            .map(|(i, _)| i)
            .collect::<Vec<usize>>()
            .into_iter();
        for slot in joining.iter() {
            let free = retired.next();
            if self.jobs[&k].tasks.len() as u32 >= self.config.max_instances_per_job
                && free.is_none()
            {
                break;
            }
            let i = match free {
                Some(i) => {
                    let i = i as u32;
                    let config = self.jobs[&k].config;
                    let t = &mut self.job_mut(k).tasks[i as usize];
                    t.daemon_host = Some(HostSlot(slot));
                    t.config = config;
                    t.failures = 0;
                    self.new_run(k, i, fx);
                    i
                }
                None => {
                    let job = self.job_mut(k);
                    let i = job.tasks.len() as u32;
                    let mut t = super::model::Task::new(now);
                    t.config = job.config;
                    t.daemon_host = Some(HostSlot(slot));
                    job.tasks.push(t);
                    job.counts[S::Initialized as usize] += 1;
                    job.waiting.push_back(i);
                    fx.counters.tasks_accepted += 1;
                    self.need_fill.insert(k);
                    i
                }
            };
            self.mark_dirty(k, i, fx);
            self.pin_dirty.insert((k, i));
            self.dirty_jobs.insert(k);
        }
        self.sync_daemon_count(k);
    }

    /// A daemon instance whose host it should not be on any more stops and
    /// is retired (free for the next host that joins).
    pub(super) fn retire_daemon_instance(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        i: u32,
        reason: &str,
        fx: &mut Effects,
    ) {
        let state = self.jobs[&k].tasks[i as usize].state;
        if !state.is_terminal() {
            self.end_run(engine, k, i, S::Killed, reason, fx);
        }
        if let Some(h) = self.held.get_mut(&(k, i)) {
            h.restart = false;
        }
        let job = self.job_mut(k);
        if let Some(at) = job.waiting.iter().position(|&w| w == i) {
            job.waiting.remove(at);
        }
        job.tasks[i as usize].daemon_host = None;
        self.mark_dirty(k, i, fx);
        self.pin_dirty.insert((k, i));
        self.dirty_jobs.insert(k);
        self.sync_daemon_count(k);
    }

    /// A daemon job's instance count is the number of hosts it is on.
    pub(super) fn sync_daemon_count(&mut self, k: JobKey) {
        let job = self.job_mut(k);
        job.plan.instance_count =
            job.tasks.iter().filter(|t| t.daemon_host.is_some()).count() as u32;
    }
}
