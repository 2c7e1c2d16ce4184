//! Client-mode applications' leases: a driver outside the cluster is
//! unregistered once it has not been heard from for
//! [`CoreConfig::app_lease_ms`](super::CoreConfig::app_lease_ms) (a driver
//! killed outright). Any call about the application renews its lease
//! ([`Input::AppHeard`](super::Input::AppHeard)); a registration starts
//! one, and so does a restart of the server for every recovered one. A
//! cluster-mode driver is a task of its job: its end ends the application,
//! and it holds no lease.

use peloton_engine::Engine;

use super::model::{Job, JobKey, JobKind};
use super::{Effects, Lifecycle};

/// An application whose driver holds a lease: client mode, registered,
/// not ended.
pub fn leased(job: &Job) -> bool {
    job.plan.kind == JobKind::Application
        && job.plan.app.is_some_and(|a| !a.driver_in_job)
        && !job.app.closed
        && !job.kill_requested
}

impl Lifecycle {
    /// The driver of `key` was heard from now (nothing if it holds no
    /// lease).
    pub(super) fn app_heard(&mut self, key: JobKey) {
        if self.jobs.get(&key).is_some_and(leased) {
            self.app_seen.insert(key, self.now);
        }
    }

    /// When a driver was last heard from (none: it holds no lease).
    pub fn app_last_heard(&self, key: JobKey) -> Option<u64> {
        self.app_seen.get(&key).copied()
    }

    /// When the first lease lapses, if any holds one.
    pub(super) fn lease_deadline(&self) -> Option<u64> {
        self.app_seen
            .values()
            .min()
            .map(|&seen| seen.saturating_add(self.config.app_lease_ms + 1))
    }

    /// Unregisters the applications whose leases lapsed by now.
    pub(super) fn expire_leases(&mut self, engine: &mut Engine, fx: &mut Effects) {
        let lease = self.config.app_lease_ms;
        let now = self.now;
        let mut lapsed: Vec<(std::sync::Arc<str>, JobKey)> = self
            .app_seen
            .iter()
            .filter(|&(_, &seen)| now.saturating_sub(seen) > lease)
            .map(|(&k, _)| (self.jobs[&k].id.clone(), k))
            .collect();
        lapsed.sort_unstable();
        for (id, k) in lapsed {
            self.app_seen.remove(&k);
            if self.app_unregister(engine, &id, true, fx).is_ok() {
                fx.lapsed_apps.push(id);
            }
        }
    }

    /// Leases of jobs that hold none any more go (at the end of a step).
    pub(super) fn forget_leases(&mut self) {
        let jobs = &self.jobs;
        self.app_seen.retain(|k, _| jobs.get(k).is_some_and(leased));
    }

    /// Every lease belongs to a live client-mode application that holds
    /// one.
    pub(super) fn check_lease_invariants(&self) {
        for k in self.app_seen.keys() {
            let job = self
                .jobs
                .get(k)
                .unwrap_or_else(|| panic!("a lease of a deleted job {k:?}"));
            assert!(leased(job), "{}: a lease of a job that holds none", job.id);
        }
    }
}
