//! Host pools as the API reads them: a page of pools with their hosts.
//! The pools and their members are the core's (`lifecycle::HostPools`):
//! created, deleted, moved to and tagged on the engine's hosts only by
//! its inputs.

use std::collections::BTreeMap;

use peloton_engine::Engine;
use peloton_proto::v1 as pb;

use crate::convert::DEFAULT_HOST_POOL;
use crate::lifecycle::HostPools;
use crate::paging::{self, MAX_PAGE_BYTES, PageKind};

/// A page of pools with their hosts (the members, and the live hosts of
/// the engine that are in "default"), both in name order, from the
/// request's page token, up to its page size (pools) and
/// [`MAX_PAGE_BYTES`]: a page may end inside a pool, which then
/// continues on the next page. The token's position is "P" (after pool
/// P) or "P/H" (after host H of pool P; pool names have no '/').
pub(crate) fn list(
    pools: &HostPools,
    engine: &Engine,
    r: &pb::ListHostPoolsRequest,
) -> pb::ListHostPoolsResponse {
    // The handler refused a token this server did not give.
    let after = paging::page_token_key("page_token", PageKind::HostPools, &r.page_token)
        .unwrap_or_default();
    let (after_pool, after_host) = match after.split_once('/') {
        Some((pool, host)) => (pool, Some(host)),
        None => (after, None),
    };
    // Pools and hosts not yet listed.
    let pool_wanted =
        |p: &str| after.is_empty() || p > after_pool || (p == after_pool && after_host.is_some());
    let host_wanted =
        |p: &str, h: &str| pool_wanted(p) && (p != after_pool || after_host.is_none_or(|a| h > a));
    let mut by_pool: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for n in std::iter::once(DEFAULT_HOST_POOL).chain(pools.names()) {
        if pool_wanted(n) {
            by_pool.insert(n, Vec::new());
        }
    }
    for (h, p) in pools.members() {
        if host_wanted(p, h) {
            by_pool.entry(p).or_default().push(h);
        }
    }
    let hosts = engine.hosts();
    if let Some(default) = by_pool.get_mut(DEFAULT_HOST_POOL) {
        for slot in hosts.live_hosts().iter() {
            let id = hosts.lookup_slot(slot as usize).expect("live");
            let name = hosts.name(id);
            if !pools.is_member(name) && host_wanted(DEFAULT_HOST_POOL, name) {
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
        if out.pools.len() == page || (!out.pools.is_empty() && bytes + first > MAX_PAGE_BYTES) {
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
    out
}
