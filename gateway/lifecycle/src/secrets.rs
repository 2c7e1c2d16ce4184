//! Jobs' secrets: values kept apart from their specs and plans (which
//! never hold them), stored in their own table ([`StateRow::Secrets`]),
//! sent only with launches and shown in reads by name and size only. The
//! core keeps the values as opaque bytes.
//!
//! A job's set is replaced as a whole ([`Input::SetSecrets`](super::Input)),
//! right after the job is created or an update of it accepted; an empty
//! value keeps the job's current value of that name. The shell checks a
//! set with [`Lifecycle::resolve_secrets`] before it steps the job's input,
//! so a bad set refuses the job (or update) and changes nothing.

use std::sync::Arc;

use super::effects::{Effects, StateRow};
use super::model::JobKey;
use super::{Answer, Error, Lifecycle};

/// Largest sum of a job's secret values, bytes.
pub const MAX_SECRETS_TOTAL_BYTES: usize = 256 * 1024;

/// One secret of a job (its name validated by the shell).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Secret {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: Vec<u8>,
}

impl Lifecycle {
    /// A job's secrets, if it has any.
    pub fn secrets_of(&self, key: JobKey) -> Option<&Arc<[Secret]>> {
        self.secrets.get(&key)
    }

    /// A job's secrets as they would be kept: `new` with each empty value
    /// taken from the job's current set (`job`: none at creation), and the
    /// total within its limit.
    pub fn resolve_secrets(
        &self,
        job: Option<JobKey>,
        new: Vec<Secret>,
    ) -> Result<Vec<Secret>, Error> {
        let current = job.and_then(|k| self.secrets.get(&k));
        let current: &[Secret] = current.map_or(&[], |c| c);
        let mut out = Vec::with_capacity(new.len());
        let mut total = 0;
        for (i, mut s) in new.into_iter().enumerate() {
            if s.value.is_empty() {
                let Some(old) = current.iter().find(|c| c.name == s.name) else {
                    return Err(Error::invalid(
                        &format!("spec.secrets[{i}].value"),
                        format!(
                            "empty, and the job has no secret {:?} to keep (an empty value keeps the current one in an update)",
                            s.name
                        ),
                    ));
                };
                s.value = old.value.clone();
            }
            total += s.value.len();
            out.push(s);
        }
        if total > MAX_SECRETS_TOTAL_BYTES {
            return Err(Error::invalid(
                "spec.secrets",
                format!("{total} bytes in all; the limit is {MAX_SECRETS_TOTAL_BYTES}"),
            ));
        }
        Ok(out)
    }

    /// Replaces a job's secrets (none: it has none any more).
    pub(super) fn set_secrets(
        &mut self,
        job_id: &str,
        secrets: Vec<Secret>,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let k = self.job_key(job_id)?;
        let secrets = self.resolve_secrets(Some(k), secrets)?;
        let id = self.jobs[&k].id.clone();
        if secrets.is_empty() {
            if self.secrets.remove(&k).is_some() {
                fx.state_rows.push(StateRow::Secrets(id));
            }
        } else {
            self.secrets.insert(k, secrets.into());
            fx.state_rows.push(StateRow::Secrets(id));
        }
        Ok(Answer::Job(k))
    }

    /// A removed job's secrets go with it (and their row).
    pub(super) fn forget_secrets(&mut self, k: JobKey, id: &Arc<str>, fx: &mut Effects) {
        if self.secrets.remove(&k).is_some() {
            fx.state_rows.push(StateRow::Secrets(id.clone()));
        }
    }

    /// The stored secrets; rows of jobs that are gone are deleted.
    pub(super) fn recover_secrets(&mut self, stored: Vec<(String, Vec<Secret>)>, fx: &mut Effects) {
        for (id, secrets) in stored {
            match self.job_key(&id) {
                Ok(k) if !secrets.is_empty() => {
                    self.secrets.insert(k, secrets.into());
                }
                _ => fx.state_rows.push(StateRow::Secrets(id.as_str().into())),
            }
        }
    }

    /// Secrets belong to live jobs, and a set is never empty.
    pub(super) fn check_secret_invariants(&self) {
        for (k, s) in &self.secrets {
            assert!(self.jobs.contains_key(k), "secrets of a removed job {k:?}");
            assert!(!s.is_empty(), "an empty set of secrets is not kept");
        }
    }
}
