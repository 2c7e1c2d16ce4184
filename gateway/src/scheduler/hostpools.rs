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
use crate::paging::{self, MAX_PAGE_BYTES, PageKind};
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

    /// A page of pools with their hosts (the members, and the live hosts of
    /// the engine that are in "default"), both in name order, from the
    /// request's page token, up to its page size (pools) and
    /// [`MAX_PAGE_BYTES`]: a page may end inside a pool, which then
    /// continues on the next page. The token's position is "P" (after pool
    /// P) or "P/H" (after host H of pool P; pool names have no '/').
    pub(super) fn list(
        &self,
        engine: &Engine,
        r: &pb::ListHostPoolsRequest,
    ) -> Result<pb::ListHostPoolsResponse, Status> {
        let after = paging::page_token_key("page_token", PageKind::HostPools, &r.page_token)?;
        let (after_pool, after_host) = match after.split_once('/') {
            Some((pool, host)) => (pool, Some(host)),
            None => (after, None),
        };
        // Pools and hosts not yet listed.
        let pool_wanted = |p: &str| {
            after.is_empty() || p > after_pool || (p == after_pool && after_host.is_some())
        };
        let host_wanted = |p: &str, h: &str| {
            pool_wanted(p) && (p != after_pool || after_host.is_none_or(|a| h > a))
        };
        let mut by_pool: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for n in std::iter::once(DEFAULT_HOST_POOL).chain(self.names.iter().map(String::as_str)) {
            if pool_wanted(n) {
                by_pool.insert(n, Vec::new());
            }
        }
        for (h, p) in &self.members {
            if host_wanted(p, h) {
                by_pool.entry(p).or_default().push(h);
            }
        }
        let hosts = engine.hosts();
        if let Some(default) = by_pool.get_mut(DEFAULT_HOST_POOL) {
            for slot in hosts.live_hosts().iter() {
                let id = hosts.lookup_slot(slot as usize).expect("live");
                let name = hosts.name(id);
                if !self.members.contains_key(name) && host_wanted(DEFAULT_HOST_POOL, name) {
                    default.push(name);
                }
            }
        }
        let page = paging::page_size(r.page_size, u32::MAX, u32::MAX);
        // Encoded bytes: a pool's field tag, length and name (6 bytes of
        // framing at most), and each host's tag, length (a name is at most
        // 256 bytes: 2 bytes) and name.
        let pool_bytes = |name: &str| name.len() + 8;
        let host_bytes = |name: &str| name.len() + 3;
        let mut out = pb::ListHostPoolsResponse::default();
        let mut bytes = 0;
        // Where the page ends, as a token's position.
        let mut position = String::new();
        let mut full = false;
        'pools: for (name, mut members) in by_pool {
            if name == after_pool && after_host.is_some() && members.is_empty() {
                continue; // the rest of a pool whose last hosts ended the previous page
            }
            members.sort_unstable();
            let first = pool_bytes(name) + members.first().map_or(0, |h| host_bytes(h));
            if out.pools.len() == page || (!out.pools.is_empty() && bytes + first > MAX_PAGE_BYTES)
            {
                full = true;
                break;
            }
            bytes += pool_bytes(name);
            let mut pool = pb::HostPool {
                name: name.to_string(),
                hosts: Vec::new(),
            };
            for h in members {
                let cost = host_bytes(h);
                if bytes + cost > MAX_PAGE_BYTES && !pool.hosts.is_empty() {
                    position = format!("{name}/{}", pool.hosts.last().expect("not empty"));
                    out.pools.push(pool);
                    full = true;
                    break 'pools;
                }
                bytes += cost;
                pool.hosts.push(h.to_string());
            }
            position = name.to_string();
            out.pools.push(pool);
        }
        if full {
            out.next_page_token = paging::page_token(PageKind::HostPools, &position);
        }
        Ok(out)
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
