//! Host pools: a partition of the hosts into named pools.
//!
//! Every host is in exactly one host pool; [`DEFAULT_HOST_POOL`] always
//! exists and holds every host not moved elsewhere (hosts that join
//! included). The engine knows host pools only as the host attribute
//! [`HOST_POOL_ATTRIBUTE`], which the core sets on every host as it
//! registers, is recovered or is moved (nothing else may set it), and a
//! job's host pool (`JobPlan::host_pool`) is ANDed into its tasks'
//! constraints by the shell's validation. Stored ([`StateRow`]): the pools
//! besides "default", and the hosts outside "default" (so a host keeps its
//! pool across restarts, also while it is away).

use std::collections::{BTreeMap, BTreeSet};

use peloton_engine::Engine;
use peloton_engine::host::HostSpec;

use super::effects::{Effects, StateRow};
use super::model::{HostSlot, JobKey, JobKind, TaskState};
use super::{Answer, Error, Lifecycle};

/// The host attribute that holds a host's host pool.
pub const HOST_POOL_ATTRIBUTE: &str = "peloton.host_pool";

/// The host pool every host is in unless moved.
pub const DEFAULT_HOST_POOL: &str = "default";

/// Most host pools (besides "default").
pub const MAX_HOST_POOLS: usize = 10_000;

/// The host pools and their members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPools {
    /// Pools besides "default".
    names: BTreeSet<String>,
    /// Hosts outside "default", with their pool (hosts that are away
    /// included).
    members: BTreeMap<String, String>,
}

impl HostPools {
    /// Whether a host pool exists.
    pub fn exists(&self, name: &str) -> bool {
        name == DEFAULT_HOST_POOL || self.names.contains(name)
    }

    /// A host's pool.
    pub fn pool_of(&self, host: &str) -> &str {
        self.members
            .get(host)
            .map_or(DEFAULT_HOST_POOL, String::as_str)
    }

    /// The pools besides "default", by name.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.names.iter().map(String::as_str)
    }

    /// Hosts outside "default" with their pool, by host name.
    pub fn members(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.members.iter().map(|(h, p)| (h.as_str(), p.as_str()))
    }

    /// Whether a host is outside "default".
    pub fn is_member(&self, host: &str) -> bool {
        self.members.contains_key(host)
    }

    /// Sets a host spec's host pool attribute (replacing any).
    pub fn tag(&self, spec: &mut HostSpec) {
        let pool = self.pool_of(&spec.name).to_string();
        spec.attributes.retain(|(k, _)| k != HOST_POOL_ATTRIBUTE);
        spec.attributes
            .push((HOST_POOL_ATTRIBUTE.to_string(), pool));
        spec.attributes.sort_unstable();
    }
}

/// An agent may not name its own host pool: the server sets it.
pub fn check_registration_attributes(attributes: &[(String, String)]) -> Result<(), Error> {
    if attributes.iter().any(|(k, _)| k == HOST_POOL_ATTRIBUTE) {
        return Err(Error::invalid(
            &format!("register.attributes.{HOST_POOL_ATTRIBUTE}"),
            "is set by the server from the host's host pool; an agent may not set it",
        ));
    }
    Ok(())
}

/// The value of a host's host pool attribute, if it has one.
pub fn host_pool_attribute(spec: &HostSpec) -> Option<&str> {
    spec.attributes
        .iter()
        .find(|(k, _)| k == HOST_POOL_ATTRIBUTE)
        .map(|(_, v)| v.as_str())
}

impl Lifecycle {
    /// The host pools.
    pub fn host_pools(&self) -> &HostPools {
        &self.host_pools
    }

    /// Whether `host_pool` exists, as a job's spec names it.
    pub(super) fn check_job_host_pool(&self, host_pool: &str) -> Result<(), Error> {
        if !self.host_pools.exists(host_pool) {
            return Err(Error::invalid(
                "spec.host_pool",
                format!(
                    "host pool {host_pool:?} does not exist (create it with `peloton hostpool create`)"
                ),
            ));
        }
        Ok(())
    }

    /// Creates a host pool (its name validated by the shell).
    pub(super) fn create_host_pool(
        &mut self,
        name: &str,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        if self.host_pools.exists(name) {
            return Err(Error::AlreadyExists(format!(
                "host pool {name:?} already exists"
            )));
        }
        if self.host_pools.names.len() >= MAX_HOST_POOLS {
            return Err(Error::Exhausted(format!(
                "at most {MAX_HOST_POOLS} host pools"
            )));
        }
        self.host_pools.names.insert(name.to_string());
        fx.state_rows.push(StateRow::HostPool(name.into()));
        Ok(Answer::Done)
    }

    /// Deletes a host pool: not "default", without hosts, and named by no
    /// job that is not terminal (by any config version it keeps).
    pub(super) fn delete_host_pool(
        &mut self,
        name: &str,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        if name == DEFAULT_HOST_POOL {
            return Err(Error::Precondition(
                "host pool \"default\" cannot be deleted".into(),
            ));
        }
        if !self.host_pools.names.contains(name) {
            return Err(Error::HostPoolNotFound(name.to_string()));
        }
        let hosts: Vec<&str> = self
            .host_pools
            .members()
            .filter(|(_, p)| *p == name)
            .map(|(h, _)| h)
            .collect();
        if !hosts.is_empty() {
            let shown = hosts.iter().take(5).copied().collect::<Vec<_>>().join(", ");
            return Err(Error::Precondition(format!(
                "host pool {name:?} still has {} host(s) ({shown}{}); move them to another host pool first",
                hosts.len(),
                if hosts.len() > 5 { ", …" } else { "" }
            )));
        }
        let named_by = self.jobs_by_id("").find(|(_, j)| {
            !j.state.is_terminal()
                && (&*j.plan.host_pool == name
                    || j.old_configs.values().any(|p| &*p.host_pool == name))
        });
        if let Some((_, job)) = named_by {
            return Err(Error::Precondition(format!(
                "host pool {name:?} is named by job {} which is not terminal",
                job.id
            )));
        }
        self.host_pools.names.remove(name);
        fx.state_rows.push(StateRow::HostPool(name.into()));
        Ok(Answer::Done)
    }

    /// Moves live hosts into the host pool `to` (all exist, or nothing
    /// changes); from the next cycle on they take tasks of `to`'s jobs
    /// only. Runs there of jobs of other host pools would be left on hosts
    /// their jobs may not use: the move is refused, naming how many run
    /// where, unless `force`, which preempts them (they start again in
    /// their own host pools; a daemon's instance there retires).
    pub(super) fn move_hosts(
        &mut self,
        engine: &mut Engine,
        hosts: &[String],
        to: &str,
        force: bool,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        if !self.host_pools.exists(to) {
            return Err(Error::HostPoolNotFound(to.to_string()));
        }
        let mut outside: Vec<(HostSlot, Vec<(JobKey, u32)>)> = Vec::new();
        for h in hosts {
            let id = engine
                .hosts()
                .lookup(h)
                .ok_or_else(|| Error::HostNotFound(h.clone()))?;
            let slot = HostSlot(id.idx() as u32);
            let mut on_it = self.instances_on(engine, slot);
            on_it.extend(self.orphans.get(&slot).into_iter().flatten().copied());
            on_it.retain(|(k, _)| &*self.jobs[k].plan.host_pool != to);
            on_it.sort_unstable();
            on_it.dedup();
            if !on_it.is_empty() && !outside.iter().any(|(s, _)| *s == slot) {
                outside.push((slot, on_it));
            }
        }
        if !outside.is_empty() && !force {
            let n: usize = outside.iter().map(|(_, v)| v.len()).sum();
            let shown = outside
                .iter()
                .take(5)
                .map(|(s, v)| format!("{} ({})", self.host_names[s.idx()], v.len()))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::Precondition(format!(
                "{n} task(s) of jobs outside host pool {to:?} run on these hosts: {shown}{}; \
                 a move with force stops those tasks (they start again in their own host \
                 pools), or drain the hosts first",
                if outside.len() > 5 { ", …" } else { "" }
            )));
        }
        self.set_attribute(engine, hosts, HOST_POOL_ATTRIBUTE, to)?;
        for h in hosts {
            if to == DEFAULT_HOST_POOL {
                self.host_pools.members.remove(h);
            } else {
                self.host_pools.members.insert(h.clone(), to.to_string());
            }
            fx.state_rows
                .push(StateRow::HostPoolMember(h.as_str().into()));
        }
        for (slot, on_it) in outside {
            let reason = format!(
                "host {} moved to host pool {to}",
                self.host_names[slot.idx()]
            );
            for (k, i) in on_it {
                if self.jobs[&k].plan.kind == JobKind::Daemon {
                    self.retire_daemon_instance(engine, k, i, &reason, fx);
                } else if self.end_run(engine, k, i, TaskState::Preempted, &reason, fx) {
                    self.restart_after_loss(engine, k, i, fx);
                }
            }
        }
        Ok(Answer::Done)
    }

    /// Sets every live host's host pool attribute from the pools (at
    /// recovery: the simulated hosts, which are not stored).
    pub(super) fn tag_all_hosts(&self, engine: &mut Engine) {
        let slots: Vec<u32> = engine.hosts().live_hosts().iter().collect();
        for slot in slots {
            let id = engine
                .hosts()
                .lookup_slot(slot as usize)
                .expect("live host");
            let mut spec = engine.hosts().spec(id).expect("live host");
            if host_pool_attribute(&spec) == Some(self.host_pools.pool_of(&spec.name)) {
                continue;
            }
            self.host_pools.tag(&mut spec);
            engine
                .hosts_mut()
                .update(id, &spec)
                .expect("same capacity, a valid attribute: cannot be refused");
        }
    }

    /// The host pools as stored (names and members); members of a pool
    /// that is not stored go back to "default" (and their rows go).
    pub(super) fn recover_host_pools(
        &mut self,
        names: Vec<String>,
        members: Vec<(String, String)>,
        fx: &mut Effects,
    ) {
        self.host_pools.names = names
            .into_iter()
            .filter(|n| n != DEFAULT_HOST_POOL)
            .collect();
        for (host, pool) in members {
            if self.host_pools.names.contains(&pool) {
                self.host_pools.members.insert(host, pool);
            } else {
                fx.state_rows.push(StateRow::HostPoolMember(host.into()));
            }
        }
    }

    /// Host pools' invariants: "default" is implicit, every member is in
    /// a pool that exists, and every live host of the engine carries its
    /// pool as its attribute.
    pub(super) fn check_host_pool_invariants(&self, engine: &Engine) {
        let pools = &self.host_pools;
        assert!(
            !pools.names.contains(DEFAULT_HOST_POOL),
            "\"default\" is not stored as a pool"
        );
        for (h, p) in &pools.members {
            assert!(
                pools.names.contains(p),
                "host {h} is in host pool {p}, which does not exist"
            );
        }
        assert!(
            pools.names.len() <= MAX_HOST_POOLS,
            "host pools are bounded"
        );
        for slot in engine.hosts().live_hosts().iter() {
            let id = engine.hosts().lookup_slot(slot as usize).expect("live");
            let spec = engine.hosts().spec(id).expect("live");
            assert_eq!(
                host_pool_attribute(&spec),
                Some(pools.pool_of(&spec.name)),
                "host {} carries its host pool",
                spec.name
            );
        }
    }
}
