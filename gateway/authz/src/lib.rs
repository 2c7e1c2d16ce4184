//! Who may do what.
//!
//! A caller (a token) holds [`Grant`]s: a [`Role`] on a pool subtree. Every
//! call needs one [`Permission`], on a pool (jobs and pools) or on the
//! cluster (hosts, tokens, the audit log), and [`Principal::allows`] is the
//! one place that decides. The rules, as Kubernetes RBAC and Nomad ACL
//! users expect them:
//!
//! | role | may |
//! |---|---|
//! | viewer | read the jobs, tasks and pools of its subtree; list hosts |
//! | submitter | viewer's, and create, scale, kill, restart, update and delete the subtree's jobs |
//! | pool admin | submitter's, and create, change and delete pools *below* its pool (its own pool's share is its parent's business) |
//! | cluster admin | everything: hosts, maintenance, host pools, tokens, the audit log; granted on `/` only |
//!
//! A grant on `/a` covers `/a` and every pool under it (`/a/b`), never a
//! sibling that shares a prefix (`/ab`). No grant, no access: the default
//! is deny.

use std::fmt;

#[cfg(any(test, feature = "testkit"))]
pub mod fuzzing;

/// A role, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads its subtree.
    Viewer,
    /// Runs jobs in its subtree.
    Submitter,
    /// Configures the pools below its pool.
    PoolAdmin,
    /// Everything (granted on `/` only).
    ClusterAdmin,
}

impl Role {
    /// Every role, least first.
    pub const ALL: [Role; 4] = [
        Role::Viewer,
        Role::Submitter,
        Role::PoolAdmin,
        Role::ClusterAdmin,
    ];

    /// Its name in messages, the CLI and configuration.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Submitter => "submitter",
            Role::PoolAdmin => "pool-admin",
            Role::ClusterAdmin => "cluster-admin",
        }
    }

    /// The role named `name` (as [`Role::name`] writes it; `_` for `-`
    /// and any case accepted).
    pub fn parse(name: &str) -> Option<Role> {
        let n = name.trim().to_ascii_lowercase().replace('_', "-");
        Role::ALL.into_iter().find(|r| r.name() == n)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Read jobs, their tasks, updates, volumes, logs and events (on the
    /// job's pool).
    JobsRead,
    /// Create, scale, kill, restart, update or delete jobs and tasks (on
    /// the job's pool).
    JobsWrite,
    /// Read a pool and its queue.
    PoolsRead,
    /// Create, change or delete a pool (on that pool).
    PoolsWrite,
    /// List hosts and host pools (cluster).
    HostsRead,
    /// Drain hosts, bring them up, manage host pools (cluster).
    HostsWrite,
    /// Create, list and revoke tokens (cluster).
    TokensAdmin,
    /// Read the audit log (cluster).
    AuditRead,
}

impl Permission {
    /// Every permission.
    pub const ALL: [Permission; 8] = [
        Permission::JobsRead,
        Permission::JobsWrite,
        Permission::PoolsRead,
        Permission::PoolsWrite,
        Permission::HostsRead,
        Permission::HostsWrite,
        Permission::TokensAdmin,
        Permission::AuditRead,
    ];

    /// Its name in refusals ("jobs.write").
    pub fn name(self) -> &'static str {
        match self {
            Permission::JobsRead => "jobs.read",
            Permission::JobsWrite => "jobs.write",
            Permission::PoolsRead => "pools.read",
            Permission::PoolsWrite => "pools.write",
            Permission::HostsRead => "hosts.read",
            Permission::HostsWrite => "hosts.write",
            Permission::TokensAdmin => "tokens.admin",
            Permission::AuditRead => "audit.read",
        }
    }

    /// Whether it is about a pool (else about the cluster).
    pub fn on_pool(self) -> bool {
        matches!(
            self,
            Permission::JobsRead
                | Permission::JobsWrite
                | Permission::PoolsRead
                | Permission::PoolsWrite
        )
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A role on a pool subtree.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    role: Role,
    pool: String,
}

/// Why a grant is not valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadGrant(pub String);

impl fmt::Display for BadGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadGrant {}

/// Longest pool path in a grant (the API's own limit on pool paths).
pub const MAX_POOL_PATH_BYTES: usize = 1024;

impl Grant {
    /// `role` on the subtree at `pool`: an absolute path ("/", "/a/b"),
    /// without a trailing '/', empty or "." or ".." segments. A cluster
    /// admin is granted on "/" only.
    pub fn new(role: Role, pool: &str) -> Result<Grant, BadGrant> {
        check_path(pool)?;
        if role == Role::ClusterAdmin && pool != "/" {
            return Err(BadGrant(format!(
                "cluster-admin is granted on / only, not on {pool}"
            )));
        }
        Ok(Grant {
            role,
            pool: pool.to_owned(),
        })
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The subtree's pool.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// Whether this grant alone allows `permission` (on `pool` for a pool
    /// permission; `pool` is ignored for a cluster one).
    pub fn allows(&self, permission: Permission, pool: &str) -> bool {
        if self.role == Role::ClusterAdmin {
            return true;
        }
        match permission {
            Permission::JobsRead | Permission::PoolsRead => covers(&self.pool, pool),
            Permission::JobsWrite => self.role >= Role::Submitter && covers(&self.pool, pool),
            Permission::PoolsWrite => {
                self.role >= Role::PoolAdmin && covers(&self.pool, pool) && pool != self.pool
            }
            // Hosts are shared by every team: any grant lets one see them
            // (why a task does not fit is about hosts).
            Permission::HostsRead => true,
            Permission::HostsWrite | Permission::TokensAdmin | Permission::AuditRead => false,
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.role, self.pool)
    }
}

fn check_path(pool: &str) -> Result<(), BadGrant> {
    if pool.len() > MAX_POOL_PATH_BYTES {
        return Err(BadGrant(format!(
            "pool path of {} bytes; the limit is {MAX_POOL_PATH_BYTES}",
            pool.len()
        )));
    }
    if !pool.starts_with('/') {
        return Err(BadGrant(format!(
            "pool {pool:?} must be an absolute path (\"/\" or \"/a/b\")"
        )));
    }
    if pool == "/" {
        return Ok(());
    }
    if pool[1..]
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(BadGrant(format!(
            "pool {pool:?} has an empty, \".\" or \"..\" segment (or a trailing '/')"
        )));
    }
    Ok(())
}

/// Whether the subtree at `root` holds `pool` (itself included).
pub fn covers(root: &str, pool: &str) -> bool {
    root == "/"
        || pool == root
        || (pool.len() > root.len()
            && pool.starts_with(root)
            && pool.as_bytes()[root.len()] == b'/')
}

/// A caller: a name (for refusals and the audit log) and its grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    name: String,
    grants: Vec<Grant>,
}

/// A refused call: who, the permission it lacked and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The caller's name.
    pub who: String,
    /// The permission it lacked.
    pub permission: Permission,
    /// The pool it was needed on (none: the cluster).
    pub pool: Option<String>,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pool {
            Some(p) => write!(
                f,
                "{} lacks permission {} on pool {p}",
                self.who, self.permission
            ),
            None => write!(
                f,
                "{} lacks permission {} (cluster-wide)",
                self.who, self.permission
            ),
        }
    }
}

impl std::error::Error for Denied {}

impl Principal {
    /// A caller named `name` holding `grants`.
    pub fn new(name: impl Into<String>, grants: Vec<Grant>) -> Principal {
        Principal {
            name: name.into(),
            grants,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its grants.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Whether some grant allows `permission` (on `pool` for a pool
    /// permission).
    pub fn allows(&self, permission: Permission, pool: &str) -> bool {
        self.grants.iter().any(|g| g.allows(permission, pool))
    }

    /// [`Principal::allows`], or why not.
    pub fn check(&self, permission: Permission, pool: &str) -> Result<(), Denied> {
        if self.allows(permission, pool) {
            return Ok(());
        }
        Err(Denied {
            who: self.name.clone(),
            permission,
            pool: permission.on_pool().then(|| pool.to_owned()),
        })
    }

    /// A cluster permission, or why not.
    pub fn check_cluster(&self, permission: Permission) -> Result<(), Denied> {
        self.check(permission, "/")
    }

    /// Whether it may read everything (a viewer of `/` or more): reads
    /// need no filtering.
    pub fn sees_everything(&self) -> bool {
        self.allows(Permission::JobsRead, "/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(grants: &[(Role, &str)]) -> Principal {
        Principal::new(
            "t",
            grants
                .iter()
                .map(|(r, pool)| Grant::new(*r, pool).unwrap())
                .collect(),
        )
    }

    #[test]
    fn subtrees_hold_their_pool_and_below_never_a_sibling_sharing_a_prefix() {
        assert!(covers("/", "/"));
        assert!(covers("/", "/a/b"));
        assert!(covers("/a", "/a"));
        assert!(covers("/a", "/a/b"));
        assert!(!covers("/a", "/ab"));
        assert!(!covers("/a", "/"));
        assert!(!covers("/a/b", "/a"));
    }

    #[test]
    fn each_role_allows_what_its_row_says() {
        let viewer = p(&[(Role::Viewer, "/a")]);
        assert!(viewer.allows(Permission::JobsRead, "/a/x"));
        assert!(viewer.allows(Permission::PoolsRead, "/a"));
        assert!(viewer.allows(Permission::HostsRead, "/"));
        assert!(!viewer.allows(Permission::JobsWrite, "/a"));
        assert!(!viewer.allows(Permission::JobsRead, "/b"));

        let submitter = p(&[(Role::Submitter, "/a")]);
        assert!(submitter.allows(Permission::JobsWrite, "/a/x"));
        assert!(!submitter.allows(Permission::JobsWrite, "/b"));
        assert!(!submitter.allows(Permission::PoolsWrite, "/a/x"));
        assert!(!submitter.allows(Permission::HostsWrite, "/"));

        let admin = p(&[(Role::PoolAdmin, "/a")]);
        assert!(admin.allows(Permission::PoolsWrite, "/a/x"));
        assert!(
            !admin.allows(Permission::PoolsWrite, "/a"),
            "its own pool is its parent's"
        );
        assert!(admin.allows(Permission::JobsWrite, "/a"));
        assert!(!admin.allows(Permission::TokensAdmin, "/"));

        let root = p(&[(Role::ClusterAdmin, "/")]);
        for perm in Permission::ALL {
            assert!(root.allows(perm, "/x"));
        }
        assert!(root.sees_everything());
        assert!(!submitter.sees_everything());

        let nobody = p(&[]);
        for perm in Permission::ALL {
            assert!(!nobody.allows(perm, "/"));
        }
    }

    #[test]
    fn refusals_name_the_permission_and_the_pool() {
        let e = p(&[(Role::Submitter, "/a")])
            .check(Permission::JobsWrite, "/b")
            .unwrap_err();
        assert_eq!(e.to_string(), "t lacks permission jobs.write on pool /b");
        let e = p(&[(Role::Submitter, "/a")])
            .check_cluster(Permission::HostsWrite)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t lacks permission hosts.write (cluster-wide)"
        );
    }

    #[test]
    fn bad_grants_are_refused_with_the_reason() {
        assert!(Grant::new(Role::ClusterAdmin, "/a").is_err());
        for bad in ["", "a", "/a/", "//", "/a//b", "/./a", "/a/.."] {
            assert!(Grant::new(Role::Viewer, bad).is_err(), "{bad:?}");
        }
        assert_eq!(Role::parse("Pool_Admin"), Some(Role::PoolAdmin));
        assert_eq!(Role::parse("root"), None);
    }

    /// The rules restated over path segments, without string prefixes.
    fn model(grants: &[(Role, Vec<String>)], perm: Permission, pool: &[String]) -> bool {
        grants.iter().any(|(role, at)| {
            let under = pool.len() >= at.len() && pool[..at.len()] == at[..];
            match (role, perm) {
                (Role::ClusterAdmin, _) => true,
                (_, Permission::HostsRead) => true,
                (_, Permission::JobsRead | Permission::PoolsRead) => under,
                (Role::Submitter | Role::PoolAdmin, Permission::JobsWrite) => under,
                (Role::PoolAdmin, Permission::PoolsWrite) => under && pool.len() > at.len(),
                _ => false,
            }
        })
    }

    fn path(segs: &[String]) -> String {
        format!("/{}", segs.join("/"))
    }

    fn segs() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(prop::sample::select(vec!["a", "ab", "b", "a.b"]), 0..4)
            .prop_map(|v| v.into_iter().map(String::from).collect())
    }

    proptest! {
        #[test]
        fn the_check_agrees_with_the_model(
            grants in prop::collection::vec((0usize..4, segs()), 0..4),
            perm in 0usize..8,
            pool in segs(),
        ) {
            let grants: Vec<(Role, Vec<String>)> = grants
                .into_iter()
                .map(|(r, s)| {
                    let role = Role::ALL[r];
                    (role, if role == Role::ClusterAdmin { vec![] } else { s })
                })
                .collect();
            let principal = Principal::new(
                "t",
                grants.iter().map(|(r, s)| Grant::new(*r, &path(s)).unwrap()).collect(),
            );
            let perm = Permission::ALL[perm];
            prop_assert_eq!(
                principal.allows(perm, &path(&pool)),
                model(&grants, perm, &pool)
            );
        }
    }
}
