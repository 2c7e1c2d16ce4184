//! Host pools: a partition of the hosts into named pools, kept by the shell.
//!
//! Every host is in exactly one host pool; "default" always exists and
//! holds every host not moved elsewhere (hosts that join included). The
//! engine knows host pools only as the host attribute
//! [`HOST_POOL_ATTRIBUTE`], which the shell sets on every host, and a job's
//! host pool is ANDed into its tasks' constraints (`convert::job_plan`).
//! Stored: the pools besides "default", and the hosts outside "default"
//! (so a host keeps its pool across restarts, also while it is away).

use std::collections::{BTreeMap, BTreeSet};

use peloton_engine::Engine;
use peloton_engine::host::HostSpec;
use peloton_proto::v1 as pb;
use tonic::Status;

use crate::convert::{DEFAULT_HOST_POOL, HOST_POOL_ATTRIBUTE};
use crate::store::{Snapshot, WriteBatch};

/// Most host pools (besides "default").
pub(super) const MAX_HOST_POOLS: usize = 10_000;

/// The host pools and their members.
#[derive(Debug, Default)]
pub(super) struct HostPools {
    /// Pools besides "default".
    names: BTreeSet<String>,
    /// Hosts outside "default", with their pool.
    members: BTreeMap<String, String>,
}

impl HostPools {
    /// As stored.
    pub(super) fn recover(snap: &Snapshot) -> Self {
        HostPools {
            names: snap.host_pools.iter().cloned().collect(),
            members: snap.host_pool_members.iter().cloned().collect(),
        }
    }

    /// Whether a host pool exists.
    pub(super) fn exists(&self, name: &str) -> bool {
        name == DEFAULT_HOST_POOL || self.names.contains(name)
    }

    /// A host's pool.
    pub(super) fn pool_of(&self, host: &str) -> &str {
        self.members
            .get(host)
            .map_or(DEFAULT_HOST_POOL, String::as_str)
    }

    /// Creates a pool.
    pub(super) fn create(&mut self, name: &str, batch: &mut WriteBatch) -> Result<(), Status> {
        if self.exists(name) {
            return Err(Status::already_exists(format!(
                "host pool {name:?} already exists"
            )));
        }
        if self.names.len() >= MAX_HOST_POOLS {
            return Err(Status::resource_exhausted(format!(
                "at most {MAX_HOST_POOLS} host pools"
            )));
        }
        self.names.insert(name.to_string());
        batch.host_pools.push((name.to_string(), true));
        Ok(())
    }

    /// Checks what a delete needs that only the pools know: it exists, is
    /// not "default", and has no hosts.
    pub(super) fn check_delete(&self, name: &str) -> Result<(), Status> {
        if name == DEFAULT_HOST_POOL {
            return Err(Status::failed_precondition(
                "host pool \"default\" cannot be deleted",
            ));
        }
        if !self.names.contains(name) {
            return Err(Status::not_found(format!("host pool {name:?} not found")));
        }
        let hosts: Vec<&str> = self
            .members
            .iter()
            .filter(|(_, p)| *p == name)
            .map(|(h, _)| h.as_str())
            .collect();
        if !hosts.is_empty() {
            let shown = hosts.iter().take(5).copied().collect::<Vec<_>>().join(", ");
            return Err(Status::failed_precondition(format!(
                "host pool {name:?} still has {} host(s) ({shown}{}); move them to another host pool first",
                hosts.len(),
                if hosts.len() > 5 { ", …" } else { "" }
            )));
        }
        Ok(())
    }

    /// Deletes a pool that [`HostPools::check_delete`] accepted.
    pub(super) fn delete(&mut self, name: &str, batch: &mut WriteBatch) {
        self.names.remove(name);
        batch.host_pools.push((name.to_string(), false));
    }

    /// Records that `hosts` are now in `to`.
    pub(super) fn moved(&mut self, hosts: &[String], to: &str, batch: &mut WriteBatch) {
        for h in hosts {
            if to == DEFAULT_HOST_POOL {
                self.members.remove(h);
                batch.host_pool_members.push((h.clone(), None));
            } else {
                self.members.insert(h.clone(), to.to_string());
                batch
                    .host_pool_members
                    .push((h.clone(), Some(to.to_string())));
            }
        }
    }

    /// Every pool with its hosts: the members, and the live hosts of the
    /// engine that are in "default".
    pub(super) fn list(&self, engine: &Engine) -> Vec<pb::HostPool> {
        let mut by_pool: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        by_pool.insert(DEFAULT_HOST_POOL, Vec::new());
        for n in &self.names {
            by_pool.insert(n, Vec::new());
        }
        for (h, p) in &self.members {
            by_pool.entry(p).or_default().push(h.clone());
        }
        let hosts = engine.hosts();
        for slot in hosts.live_hosts().iter() {
            let id = hosts.lookup_slot(slot as usize).expect("live");
            let name = hosts.name(id);
            if !self.members.contains_key(name) {
                by_pool
                    .get_mut(DEFAULT_HOST_POOL)
                    .expect("inserted")
                    .push(name.to_string());
            }
        }
        by_pool
            .into_iter()
            .map(|(name, mut hosts)| {
                hosts.sort_unstable();
                pb::HostPool {
                    name: name.to_string(),
                    hosts,
                }
            })
            .collect()
    }

    /// Sets a host spec's host pool attribute (replacing any).
    pub(super) fn tag(&self, spec: &mut HostSpec) {
        let pool = self.pool_of(&spec.name).to_string();
        spec.attributes.retain(|(k, _)| k != HOST_POOL_ATTRIBUTE);
        spec.attributes
            .push((HOST_POOL_ATTRIBUTE.to_string(), pool));
        spec.attributes.sort_unstable();
    }

    /// Tags every host of the engine (the simulated hosts, at start).
    pub(super) fn tag_all(&self, engine: &mut Engine) -> anyhow::Result<()> {
        let slots: Vec<u32> = engine.hosts().live_hosts().iter().collect();
        for slot in slots {
            let id = engine
                .hosts()
                .lookup_slot(slot as usize)
                .expect("live host");
            let mut spec = engine.hosts().spec(id)?;
            self.tag(&mut spec);
            engine.hosts_mut().update(id, &spec)?;
        }
        Ok(())
    }
}
