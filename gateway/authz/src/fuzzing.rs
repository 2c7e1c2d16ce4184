//! The authorization check against a model, driven by bytes: the body of the
//! `authz_check` fuzz target, and of `tests/fuzz_corpus.rs`, which replays
//! the committed corpus and pseudo-random inputs on stable Rust.
//!
//! Compiled for tests, and for other crates with the `testkit` feature.
//!
//! # Input
//!
//! Read byte by byte; past the end every byte reads as 0.
//!
//! - A header `h`: `h % 5` grants; `h & 0x08`: one more grant whose pool is
//!   raw bytes (lossy UTF-8); `h & 0x10`: a check of the pool path length
//!   limit.
//! - Each grant: a role byte `r` (`Role::ALL[r % 4]`); a cluster admin
//!   without `r & 0x80` is on `/`, any other grant is on a path of segments:
//!   a depth byte (`% 4`), then a byte a segment (see below).
//! - The raw grant: a role byte, a length byte (`len * 5` bytes follow).
//! - The length check: one byte.
//! - Then requests until the input ends (at most [`MAX_REQUESTS`]): a byte
//!   `q` (permission `Permission::ALL[q % 8]`, depth `(q >> 3) % 5`), then a
//!   byte a segment.
//!
//! A segment byte `s` below `0xF0` is [`SEGMENTS`]`[s % 4]`; from `0xF0` on,
//! the next `s & 0x0F` bytes, lossily UTF-8 (so empty, ".", "..", and
//! segments holding '/' all occur).
//!
//! # Checks
//!
//! A grant is made exactly when the model says its pool is valid (and
//! [`Grant::new`] never panics); for every request, each grant's
//! [`Grant::allows`], [`Principal::allows`] and [`covers`] equal the model,
//! which works on path segments, not string prefixes; [`Principal::check`]
//! fails exactly when `allows` is false, with a [`Denied`] naming the caller,
//! the permission (also in its message) and the pool of a pool permission.

use crate::{Grant, MAX_POOL_PATH_BYTES, Permission, Principal, Role, covers};

/// The segments pools are built from: "a" and "ab" share a prefix as
/// strings but are siblings; "a.b" holds a dot.
pub const SEGMENTS: [&str; 4] = ["a", "ab", "a.b", "b"];

/// Most requests read from one input.
pub const MAX_REQUESTS: usize = 64;

/// The caller's name in the checks.
const WHO: &str = "fuzz";

/// What one input exercised (the replay test checks the corpus reaches
/// every role and every permission, allowed and refused).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Grants made, by role (`Role::ALL` order).
    pub granted: [usize; 4],
    /// Grants [`Grant::new`] refused.
    pub refused: usize,
    /// Requests allowed, by permission (`Permission::ALL` order).
    pub allowed: [usize; 8],
    /// Requests refused, by permission.
    pub denied: [usize; 8],
}

impl Stats {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Stats) {
        for (a, b) in self.granted.iter_mut().zip(other.granted) {
            *a += b;
        }
        self.refused += other.refused;
        for (a, b) in self.allowed.iter_mut().zip(other.allowed) {
            *a += b;
        }
        for (a, b) in self.denied.iter_mut().zip(other.denied) {
            *a += b;
        }
    }
}

struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let start = self.pos.min(self.data.len());
        let end = self.pos.saturating_add(n).min(self.data.len());
        self.pos = self.pos.saturating_add(n);
        &self.data[start..end]
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// A path of `depth` segments read from `bytes`.
fn read_path(bytes: &mut Bytes<'_>, depth: usize) -> String {
    let mut path = String::new();
    for _ in 0..depth {
        let s = bytes.next();
        path.push('/');
        if s >= 0xF0 {
            path.push_str(&String::from_utf8_lossy(bytes.take(usize::from(s & 0x0F))));
        } else {
            path.push_str(SEGMENTS[usize::from(s % 4)]);
        }
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

// The model: written without the crate's code (no `covers`, no role
// order), over segments.

/// A path's segments, if it is a valid pool path.
fn model_segments(path: &str) -> Option<Vec<&str>> {
    if path.len() > MAX_POOL_PATH_BYTES {
        return None;
    }
    let rest = path.strip_prefix('/')?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let valid = segments
        .iter()
        .all(|s| !s.is_empty() && *s != "." && *s != "..");
    valid.then_some(segments)
}

/// A request's segments (requests are absolute paths; they are not
/// checked for validity, so empty or dot segments are kept as they are).
fn request_segments(path: &str) -> Vec<&str> {
    match path.strip_prefix('/') {
        Some("") => Vec::new(),
        Some(rest) => rest.split('/').collect(),
        None => unreachable!("requests are absolute: {path:?}"),
    }
}

fn model_valid(role: Role, path: &str) -> bool {
    match model_segments(path) {
        None => false,
        Some(segments) => role != Role::ClusterAdmin || segments.is_empty(),
    }
}

fn rank(role: Role) -> u8 {
    match role {
        Role::Viewer => 1,
        Role::Submitter => 2,
        Role::PoolAdmin => 3,
        Role::ClusterAdmin => 4,
    }
}

fn model_under(root: &[&str], pool: &[&str]) -> bool {
    root.len() <= pool.len() && root.iter().zip(pool).all(|(a, b)| a == b)
}

fn model_grant(role: Role, root: &[&str], permission: Permission, pool: &[&str]) -> bool {
    if role == Role::ClusterAdmin {
        return true;
    }
    let under = model_under(root, pool);
    match permission {
        Permission::HostsRead => true,
        Permission::JobsRead | Permission::PoolsRead => under,
        Permission::JobsWrite => under && rank(role) >= rank(Role::Submitter),
        Permission::PoolsWrite => {
            under && pool.len() > root.len() && rank(role) >= rank(Role::PoolAdmin)
        }
        Permission::HostsWrite | Permission::TokensAdmin | Permission::AuditRead => false,
    }
}

fn model_allows(grants: &[(Role, Vec<&str>)], permission: Permission, pool: &[&str]) -> bool {
    grants
        .iter()
        .any(|(role, root)| model_grant(*role, root, permission, pool))
}

/// Tries `role` on `path`: the grant if the model says it is valid, and
/// panics if [`Grant::new`] disagrees.
fn try_grant(role: Role, path: &str, stats: &mut Stats) -> Option<Grant> {
    let made = Grant::new(role, path);
    let expected = model_valid(role, path);
    assert_eq!(
        made.is_ok(),
        expected,
        "Grant::new({role}, {path:?}) = {made:?}"
    );
    match made {
        Ok(grant) => {
            assert_eq!(grant.role(), role);
            assert_eq!(grant.pool(), path);
            assert_eq!(grant.to_string(), format!("{role} on {path}"));
            stats.granted[Role::ALL.iter().position(|r| *r == role).unwrap()] += 1;
            Some(grant)
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            stats.refused += 1;
            None
        }
    }
}

/// Decodes `data` into grants and requests and checks every request
/// against the model (see the module's documentation); panics on a
/// disagreement.
pub fn run(data: &[u8]) -> Stats {
    let mut stats = Stats::default();
    let mut bytes = Bytes { data, pos: 0 };
    let header = bytes.next();

    let mut grants = Vec::new();
    for _ in 0..header % 5 {
        let r = bytes.next();
        let role = Role::ALL[usize::from(r % 4)];
        let path = if role == Role::ClusterAdmin && r & 0x80 == 0 {
            "/".to_owned()
        } else {
            let depth = usize::from(bytes.next() % 4);
            read_path(&mut bytes, depth)
        };
        grants.extend(try_grant(role, &path, &mut stats));
    }
    if header & 0x08 != 0 {
        let role = Role::ALL[usize::from(bytes.next() % 4)];
        let len = usize::from(bytes.next()) * 5;
        let raw = String::from_utf8_lossy(bytes.take(len)).into_owned();
        // Any string: a role's name or not, a path or not.
        let _ = Role::parse(&raw);
        grants.extend(try_grant(role, &raw, &mut stats));
    }
    if header & 0x10 != 0 {
        // Around the length limit: 1001 to 1048 bytes.
        let n = MAX_POOL_PATH_BYTES - 24 + usize::from(bytes.next() % 48);
        let path = format!("/{}", "a".repeat(n));
        let made = Grant::new(Role::Viewer, &path);
        assert_eq!(
            made.is_ok(),
            path.len() <= MAX_POOL_PATH_BYTES,
            "a pool path of {} bytes",
            path.len()
        );
    }

    for role in Role::ALL {
        assert_eq!(Role::parse(role.name()), Some(role));
    }

    let model: Vec<(Role, Vec<&str>)> = grants
        .iter()
        .map(|g| {
            let segments = model_segments(g.pool()).expect("a grant's pool is valid");
            (g.role(), segments)
        })
        .collect();
    let principal = Principal::new(WHO, grants.clone());
    assert_eq!(principal.name(), WHO);
    assert_eq!(principal.grants(), &grants[..]);
    assert_eq!(
        principal.sees_everything(),
        model_allows(&model, Permission::JobsRead, &[])
    );
    for permission in Permission::ALL {
        if !permission.on_pool() {
            assert_eq!(
                principal.check_cluster(permission).is_ok(),
                model_allows(&model, permission, &[]),
                "{permission} on the cluster"
            );
        }
    }

    let mut requests = 0;
    while !bytes.done() && requests < MAX_REQUESTS {
        requests += 1;
        let q = bytes.next();
        let permission_index = usize::from(q % 8);
        let permission = Permission::ALL[permission_index];
        let pool = read_path(&mut bytes, usize::from((q >> 3) % 5));
        let pool_segments = request_segments(&pool);

        for (grant, (role, root)) in grants.iter().zip(&model) {
            assert_eq!(
                covers(grant.pool(), &pool),
                model_under(root, &pool_segments),
                "covers({:?}, {pool:?})",
                grant.pool()
            );
            assert_eq!(
                grant.allows(permission, &pool),
                model_grant(*role, root, permission, &pool_segments),
                "{grant} allows {permission} on {pool:?}"
            );
        }

        let allowed = principal.allows(permission, &pool);
        assert_eq!(
            allowed,
            model_allows(&model, permission, &pool_segments),
            "{grants:?} allow {permission} on {pool:?}"
        );
        match principal.check(permission, &pool) {
            Ok(()) => assert!(allowed, "check allowed what allows refuses"),
            Err(denied) => {
                assert!(!allowed, "check refused what allows allows: {denied}");
                assert_eq!(denied.who, WHO);
                assert_eq!(denied.permission, permission);
                assert_eq!(denied.pool, permission.on_pool().then(|| pool.clone()));
                let message = denied.to_string();
                assert!(
                    message.contains(permission.name()),
                    "{message:?} names {permission}"
                );
            }
        }
        if allowed {
            stats.allowed[permission_index] += 1;
        } else {
            stats.denied[permission_index] += 1;
        }
    }
    stats
}
