//! Elastic gangs: a gang job (one gang of `plan.gang` members at most)
//! that starts once `plan.elastic_min` members can be placed together,
//! grows toward `plan.gang` as room frees, and shrinks instead of
//! restarting whole when a member is preempted, lost or fails while at
//! least `elastic_min` others still run.
//!
//! - **Start.** Its first `elastic_min` waiting instances are queued as one
//!   engine gang (all or nothing). Until they are placed nothing else of the
//!   job is queued, so no member ever runs without the gang.
//! - **Growth.** Once they are placed (`Elastic::formed`), every other
//!   waiting instance is queued alone, under the job's running limit; each
//!   joins when the engine places it.
//! - **Shrink.** A member whose run ends (preempted, lost, failed with
//!   retries left) leaves; if at least `elastic_min` members still run, the
//!   others keep running and the instance waits to join again. Below
//!   `elastic_min` the gang starts again as one, as a fixed gang does.
//! - **Membership.** The members are the instances of the current gang
//!   number on a host, ranked by instance. Every change (members joining in
//!   one cycle, members leaving in one step) is a new generation, above
//!   every earlier one: the core's revision at that moment (it only grows,
//!   also across restarts). Joining members get it with their launch; at
//!   the end of the step every other member is sent it
//!   (`Effects::rendezvous_updates`). Invariant: every member was told the
//!   current generation.

use super::{Effects, JobKey, Lifecycle};

/// Where an elastic gang stands for queueing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ElasticQueue {
    /// No member holds an engine task: queue its first members as one
    /// gang of this many.
    Start(u32),
    /// Its first members are queued, not placed yet: queue nothing more.
    Wait,
    /// Formed: queue every waiting instance alone.
    Grow,
}

impl Lifecycle {
    /// How job `k` (an elastic gang) queues its waiting instances now.
    pub(super) fn elastic_queue(&self, k: JobKey) -> ElasticQueue {
        let job = &self.jobs[&k];
        let current = Some(job.next_gang);
        let in_engine = job
            .tasks
            .iter()
            .any(|t| t.gang == current && t.state.in_engine());
        if !in_engine {
            return ElasticQueue::Start(job.plan.elastic_min);
        }
        if job.elastic.as_ref().is_some_and(|e| e.finishing) {
            return ElasticQueue::Wait;
        }
        if job.elastic.as_ref().is_some_and(|e| e.formed) {
            ElasticQueue::Grow
        } else {
            ElasticQueue::Wait
        }
    }

    /// Job `k`'s elastic gang: its first members were queued as a new
    /// gang (not formed until they are placed).
    pub(super) fn elastic_started(&mut self, k: JobKey) {
        if let Some(e) = self.job_mut(k).elastic.as_deref_mut() {
            e.formed = false;
            e.finishing = false;
            e.told.clear();
        }
    }

    /// The members of job `k`'s current gang (on a host), by instance.
    pub(super) fn elastic_members(&self, k: JobKey) -> Vec<u32> {
        let job = &self.jobs[&k];
        let current = Some(job.next_gang);
        job.instances_where(|t| t.gang == current && t.state.on_host())
    }

    /// Job `k`'s membership changed: a new generation, told to its members
    /// at the end of the step (the ones launched meanwhile get it with
    /// their launch).
    pub(super) fn elastic_changed(&mut self, k: JobKey, placed: bool) {
        let revision = self.revision;
        let Some(e) = self.job_mut(k).elastic.as_deref_mut() else {
            return;
        };
        e.generation = (e.generation + 1).max(revision);
        if placed && !e.formed {
            // Formed: its other waiting instances may be queued now.
            e.formed = true;
            self.need_fill.insert(k);
        }
        self.elastic_changed.insert(k);
    }

    /// Whether instance `i` of job `k` (whose run just ended, not for
    /// good) leaves its elastic gang instead of restarting it: the job is
    /// an elastic gang and at least `elastic_min` members still run. The
    /// membership change is recorded.
    pub(super) fn elastic_shrinks(&mut self, k: JobKey, i: u32) -> bool {
        let job = &self.jobs[&k];
        if job.plan.elastic_min == 0 || job.kill_requested {
            return false;
        }
        if job.tasks[i as usize].gang != Some(job.next_gang) {
            return false;
        }
        let others = self
            .elastic_members(k)
            .into_iter()
            .filter(|&m| m != i)
            .count() as u32;
        if others < job.plan.elastic_min {
            return false;
        }
        if let Some(e) = self.job_mut(k).elastic.as_deref_mut() {
            e.told.remove(&i);
        }
        self.elastic_changed(k, false);
        true
    }

    /// Settles the elastic gangs whose members left a host in this step
    /// (however they left: preempted, lost, failed, succeeded, killed or
    /// restarted on request): a member that succeeded finishes the gang
    /// (nothing more joins; instances that never joined, or wait to join
    /// again, end killed); fewer than `elastic_min` members left starts
    /// the gang again as one; else the rest go on, told their new
    /// membership at the end of the step.
    pub(super) fn settle_elastic(&mut self, engine: &mut peloton_engine::Engine, fx: &mut Effects) {
        while !self.elastic_left.is_empty() {
            let mut left = std::mem::take(&mut self.elastic_left);
            left.sort_unstable_by_key(|&(k, i, _)| (k, i));
            let mut keys: Vec<JobKey> = left.iter().map(|&(k, _, _)| k).collect();
            keys.dedup();
            for k in keys {
                let Some(job) = self.jobs.get(&k) else {
                    continue;
                };
                let killed = job.kill_requested;
                let mine = left.iter().filter(|&&(kk, _, _)| kk == k);
                let succeeded = mine
                    .clone()
                    .find(|&&(_, _, to)| to == super::TaskState::Succeeded)
                    .map(|&(_, i, _)| i);
                let departed = mine.map(|&(_, i, _)| i).next().expect("one at least");
                if let Some(winner) = succeeded.filter(|_| !killed) {
                    if let Some(e) = self.job_mut(k).elastic.as_deref_mut() {
                        e.finishing = true;
                    }
                    let reason = format!(
                        "the elastic gang finished (member {winner} succeeded) before it joined"
                    );
                    let rest = self.jobs[&k]
                        .instances_where(|t| !t.state.is_terminal() && !t.state.on_host());
                    for i in rest {
                        self.end_run(engine, k, i, super::TaskState::Killed, &reason, fx);
                    }
                }
                let members = self.elastic_members(k);
                let job = &self.jobs[&k];
                if succeeded.is_none()
                    && !killed
                    && !members.is_empty()
                    && (members.len() as u32) < job.plan.elastic_min
                {
                    // Below its minimum: it starts again as one.
                    self.stop_gang(engine, k, departed, true, fx);
                    continue;
                }
                let stale = job
                    .elastic
                    .as_ref()
                    .is_some_and(|e| e.told.keys().any(|i| members.binary_search(i).is_err()));
                if members.is_empty() {
                    // No member left to tell.
                    if let Some(e) = self.job_mut(k).elastic.as_deref_mut() {
                        e.told.clear();
                    }
                } else if stale {
                    self.elastic_changed(k, false);
                }
            }
        }
    }

    /// Tells the members of every elastic gang whose membership changed in
    /// this step the new membership (those that know it already, from
    /// their launch, are skipped).
    pub(super) fn announce_memberships(&mut self, fx: &mut Effects) {
        if self.elastic_changed.is_empty() {
            return;
        }
        let mut changed: Vec<JobKey> = self.elastic_changed.drain().collect();
        changed.sort_unstable();
        for k in changed {
            let Some(job) = self.jobs.get(&k) else {
                continue;
            };
            let Some(generation) = job.elastic.as_ref().map(|e| e.generation) else {
                continue;
            };
            let members = self.elastic_members(k);
            let mut last = None;
            let mut told = Vec::new();
            for &i in &members {
                let job = &self.jobs[&k];
                let t = &job.tasks[i as usize];
                if job
                    .elastic
                    .as_ref()
                    .is_some_and(|e| e.told.get(&i) == Some(&generation))
                {
                    continue;
                }
                let Some(host) = t.host else {
                    continue;
                };
                let Some(rendezvous) = self.rendezvous_of(k, i, &mut last) else {
                    continue;
                };
                fx.rendezvous_updates.push(super::RendezvousUpdate {
                    run: super::RunRef {
                        job: k,
                        instance: i,
                        run: t.run,
                        launch: t.launch,
                    },
                    host: self.host_names[host.idx()].clone(),
                    job_id: job.id.clone(),
                    rendezvous,
                });
                told.push(i);
            }
            if let Some(e) = self.job_mut(k).elastic.as_deref_mut() {
                e.told.retain(|i, _| members.binary_search(i).is_ok());
                for i in told {
                    e.told.insert(i, generation);
                }
            }
        }
    }

    /// The members of elastic gangs on host `slot` are told their gang's
    /// membership again at the end of the step (their agent registered:
    /// it may have missed an update).
    pub(super) fn retell_members_on(
        &mut self,
        engine: &peloton_engine::Engine,
        slot: super::HostSlot,
    ) {
        for (k, i) in self.instances_on(engine, slot) {
            let job = self.job_mut(k);
            let on_host = job.tasks[i as usize].state.on_host();
            if let Some(e) = job.elastic.as_deref_mut()
                && on_host
            {
                e.told.remove(&i);
                self.elastic_changed.insert(k);
            }
        }
    }

    /// Invariants of elastic gangs: at most `gang` members, all of the
    /// current gang, and each was told the current generation.
    pub(super) fn check_elastic(&self) {
        for (&k, job) in &self.jobs {
            let Some(e) = job.elastic.as_deref() else {
                assert_eq!(job.plan.elastic_min, 0, "job {}: elastic state", job.id);
                continue;
            };
            let members = self.elastic_members(k);
            assert!(
                members.len() as u32 <= job.plan.gang,
                "job {}: {} members of an elastic gang of at most {}",
                job.id,
                members.len(),
                job.plan.gang
            );
            assert_eq!(
                e.told.len(),
                members.len(),
                "job {}: members told {:?}, members {members:?}",
                job.id,
                e.told
            );
            for &i in &members {
                assert_eq!(
                    e.told.get(&i),
                    Some(&e.generation),
                    "job {}: member {i} was not told generation {}",
                    job.id,
                    e.generation
                );
            }
            let stray = job.instances_where(|t| {
                t.state.on_host() && t.gang.is_some() && t.gang != Some(job.next_gang)
            });
            assert!(
                stray.is_empty(),
                "job {}: instances {stray:?} run in an earlier gang",
                job.id
            );
            if !members.is_empty() {
                assert!(e.formed, "job {}: members of a gang not formed", job.id);
            }
        }
    }
}
