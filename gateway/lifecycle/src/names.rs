//! Job names: optional, and distinct among a pool's unfinished jobs.
//!
//! A job with a name is the only job of its pool with that name that has
//! not ended, so the name names one live job (`peloton job get nightly`)
//! the way its id does. Ended jobs keep their names as history, and a name
//! is free again once its job has ended: a batch job submitted every day
//! under one name is refused only while the last one still runs. Creating a
//! job under a held name is refused (ALREADY_EXISTS), and so is restarting
//! (or scaling up) an ended job while another unfinished job holds its
//! name; an update cannot rename a job. An empty name is no name: the job
//! is known by its id alone.
//!
//! The index holds every job with a name, ended or not, by (pool, name):
//! it changes only when jobs are created, recovered or removed, not on
//! every change of state.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{Error, JobKey, Lifecycle};

/// Jobs with names, by pool path and name, ended ones too.
#[derive(Debug, Default)]
pub(crate) struct JobNames {
    by_pool: FxHashMap<Arc<str>, FxHashMap<Arc<str>, Vec<JobKey>>>,
}

impl JobNames {
    pub(crate) fn insert(&mut self, pool: &Arc<str>, name: &Arc<str>, k: JobKey) {
        if name.is_empty() {
            return;
        }
        self.by_pool
            .entry(pool.clone())
            .or_default()
            .entry(name.clone())
            .or_default()
            .push(k);
    }

    pub(crate) fn remove(&mut self, pool: &str, name: &str, k: JobKey) {
        let Some(names) = self.by_pool.get_mut(pool) else {
            return;
        };
        if let Some(keys) = names.get_mut(name) {
            keys.retain(|&x| x != k);
            if keys.is_empty() {
                names.remove(name);
            }
        }
        if names.is_empty() {
            self.by_pool.remove(pool);
        }
    }

    fn get(&self, pool: &str, name: &str) -> &[JobKey] {
        self.by_pool
            .get(pool)
            .and_then(|names| names.get(name))
            .map_or(&[], Vec::as_slice)
    }

    fn len(&self) -> usize {
        self.by_pool
            .values()
            .flat_map(|names| names.values())
            .map(Vec::len)
            .sum()
    }
}

impl Lifecycle {
    /// The unfinished job other than `except` named `name` in `pool`, if
    /// any (none for an empty name).
    pub(crate) fn name_holder(
        &self,
        pool: &str,
        name: &str,
        except: Option<JobKey>,
    ) -> Option<JobKey> {
        if name.is_empty() {
            return None;
        }
        self.names
            .get(pool, name)
            .iter()
            .copied()
            .find(|&k| Some(k) != except && !self.jobs[&k].state.is_terminal())
    }

    /// Refuses a new job named as an unfinished job of its pool is.
    pub(crate) fn check_name_free(&self, pool: &str, name: &str) -> Result<(), Error> {
        match self.name_holder(pool, name, None) {
            None => Ok(()),
            Some(k) => {
                let other = &self.jobs[&k];
                Err(Error::AlreadyExists(format!(
                    "spec.name: job {} in pool {pool} is named {name:?} and is {}: a pool's \
                     unfinished jobs have distinct names (wait for it, kill it, or choose \
                     another name)",
                    other.id,
                    other.state.name()
                )))
            }
        }
    }

    /// Refuses to bring ended job `k` back (restart, scale) while another
    /// unfinished job of its pool holds its name.
    pub(crate) fn check_name_kept(&self, k: JobKey) -> Result<(), Error> {
        let job = &self.jobs[&k];
        if !job.state.is_terminal() {
            return Ok(());
        }
        match self.name_holder(&job.plan.pool, &job.plan.name, Some(k)) {
            None => Ok(()),
            Some(x) => {
                let other = &self.jobs[&x];
                Err(Error::Precondition(format!(
                    "job {} is named {:?} as job {} of pool {} is, which is {}: a pool's \
                     unfinished jobs have distinct names, so this one starts again once that one \
                     has ended",
                    job.id,
                    &*job.plan.name,
                    other.id,
                    job.plan.pool,
                    other.state.name()
                )))
            }
        }
    }

    /// `name` if no unfinished job of `pool` holds it, else `name-2`,
    /// `name-3`, … the first one free: for jobs whose name is a label the
    /// user did not choose for Peloton (a Spark application's name).
    pub fn free_job_name(&self, pool: &str, name: &str) -> Arc<str> {
        std::iter::once(name.to_string())
            .chain((2u64..).map(|n| format!("{name}-{n}")))
            .find(|candidate| self.name_holder(pool, candidate, None).is_none())
            .expect("some suffix is free")
            .into()
    }

    /// The name index holds exactly the jobs with names.
    pub(crate) fn check_names(&self) {
        let mut n = 0usize;
        for (&k, job) in &self.jobs {
            if job.plan.name.is_empty() {
                continue;
            }
            n += 1;
            assert!(
                self.names.get(&job.plan.pool, &job.plan.name).contains(&k),
                "job {} is indexed by its name {:?}",
                job.id,
                job.plan.name
            );
        }
        assert_eq!(
            self.names.len(),
            n,
            "the name index holds the named jobs only"
        );
    }
}
