//! The resource pool tree: configuration, structure and validation.
//!
//! Pools live in an arena of slots addressed by [`PoolId`] (a dense `u32`
//! slot plus a generation, so a handle to a deleted pool is detected even
//! after its slot is reused). The tree only holds configuration; runtime
//! state (queues, allocation, entitlement) lives in columns of the
//! [`crate::ResourceManager`] indexed by the same slot.
//!
//! Every mutation validates first and writes second, so a rejected change
//! leaves the tree exactly as it was.

use std::collections::HashMap;
use std::fmt;

use crate::resources::{Dim, MAX_AMOUNT, N_DIMS, Resources};

/// Largest share (weight) a pool may have in one dimension.
pub const MAX_SHARE: f64 = 1_000_000.0;
/// Longest pool name (one path segment), in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Deepest pool below the root (`/a/b/c` has depth 3).
pub const MAX_DEPTH: usize = 16;
/// Default bound on the number of pools, the root included.
pub const DEFAULT_MAX_POOLS: usize = 10_000;
/// Largest bound on the number of pools a tree may be configured with.
pub const MAX_POOLS_LIMIT: usize = 1_000_000;
/// Smallest share (weight) a pool may have in one dimension. Keeping shares
/// within nine orders of magnitude of each other keeps water-filling's
/// floating-point level accurate.
pub const MIN_SHARE: f64 = 0.001;

static NEXT_TREE_IDENTITY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_tree_identity() -> u64 {
    NEXT_TREE_IDENTITY.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

const NO_PARENT: u32 = u32::MAX;

/// Handle of a pool: its dense slot index and the slot's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    idx: u32,
    generation: u32,
}

impl PoolId {
    /// Dense slot index, usable to index per-pool columns.
    pub fn idx(self) -> usize {
        self.idx as usize
    }

    /// Generation of the slot when this handle was issued.
    pub fn generation(self) -> u32 {
        self.generation
    }
}

/// How a pool takes part in sharing, per dimension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// May borrow idle capacity beyond its reservation (up to its limit) and
    /// lend its own idle reservation to others.
    #[default]
    Elastic,
    /// Entitled to exactly its reservation, whatever its demand.
    Static,
}

/// Configuration of one resource dimension of a pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DimConfig {
    /// Guaranteed amount, in the dimension's unit.
    pub reservation: u64,
    /// Maximum amount, in the dimension's unit.
    pub limit: u64,
    /// Weight for dividing capacity beyond reservations (> 0).
    pub share: f64,
    /// Elastic or static.
    pub kind: PoolKind,
}

impl Default for DimConfig {
    fn default() -> Self {
        DimConfig {
            reservation: 0,
            limit: MAX_AMOUNT,
            share: 1.0,
            kind: PoolKind::Elastic,
        }
    }
}

/// Full configuration of a pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolConfig {
    /// Per-dimension reservation, limit, share and kind, in [`Dim`] order.
    pub dims: [DimConfig; N_DIMS],
    /// Largest share, in percent of the pool's entitlement, that controller
    /// tasks (such as Spark drivers) may hold: 0–100.
    pub controller_limit_pct: f64,
    /// Largest share, in percent of the slack available to the pool's
    /// parent, that the pool's revocable tasks may hold: 0–100.
    pub slack_limit_pct: f64,
    /// Its queues admit in strict order: a blocked head gets no start
    /// reservation, nothing is backfilled behind it, and a gang that fits
    /// the entitlement but not the hosts is admitted and waits in
    /// placement (see [`crate::backfill`]). Off by default: the engine's
    /// [`crate::backfill::BackfillConfig`] applies.
    pub strict_order: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            dims: [DimConfig::default(); N_DIMS],
            controller_limit_pct: 100.0,
            slack_limit_pct: 100.0,
            strict_order: false,
        }
    }
}

impl PoolConfig {
    /// Sets the reservation of every dimension.
    pub fn with_reservation(mut self, reservation: Resources) -> Self {
        for d in Dim::ALL {
            self.dims[d.idx()].reservation = reservation[d];
        }
        self
    }

    /// Sets the limit of every dimension.
    pub fn with_limit(mut self, limit: Resources) -> Self {
        for d in Dim::ALL {
            self.dims[d.idx()].limit = limit[d];
        }
        self
    }

    /// Sets the share of every dimension.
    pub fn with_share(mut self, share: f64) -> Self {
        for dim in &mut self.dims {
            dim.share = share;
        }
        self
    }

    /// Sets the share of each dimension (in [`Dim`] order), so that a pool
    /// may weigh, say, cpu more than memory.
    pub fn with_shares(mut self, shares: [f64; N_DIMS]) -> Self {
        for (dim, share) in self.dims.iter_mut().zip(shares) {
            dim.share = share;
        }
        self
    }

    /// Sets the kind of every dimension.
    pub fn with_kind(mut self, kind: PoolKind) -> Self {
        for dim in &mut self.dims {
            dim.kind = kind;
        }
        self
    }

    /// Sets the controller limit, in percent of entitlement.
    pub fn with_controller_limit_pct(mut self, pct: f64) -> Self {
        self.controller_limit_pct = pct;
        self
    }

    /// Sets the slack limit, in percent of the parent's slack entitlement.
    pub fn with_slack_limit_pct(mut self, pct: f64) -> Self {
        self.slack_limit_pct = pct;
        self
    }

    /// Reservations of all dimensions.
    pub fn reservation(&self) -> Resources {
        Resources(std::array::from_fn(|i| self.dims[i].reservation))
    }

    /// Limits of all dimensions.
    pub fn limit(&self) -> Resources {
        Resources(std::array::from_fn(|i| self.dims[i].limit))
    }
}

/// Why a pool operation was refused. Every variant names the pool; the
/// configuration variant also names the field (`reservation.cpu`, `share.gpu`,
/// `controller_limit_pct`, …).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// The path is not of the form `/` or `/name/name…`.
    #[error("invalid pool path {path:?}: {problem}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A pool with this path exists already.
    #[error("pool {path} already exists")]
    AlreadyExists {
        /// The path.
        path: String,
    },
    /// No pool has this path (or the handle is stale).
    #[error("pool {path} not found")]
    NotFound {
        /// The path, or a description of the stale handle.
        path: String,
    },
    /// The parent of the pool to create does not exist.
    #[error("cannot create pool {path}: parent pool {parent} not found")]
    ParentNotFound {
        /// The pool to create.
        path: String,
        /// Its missing parent.
        parent: String,
    },
    /// The configured bound on the number of pools is reached.
    #[error("cannot create pool {path}: the limit of {limit} pools is reached")]
    TooManyPools {
        /// The pool to create.
        path: String,
        /// The configured bound.
        limit: usize,
    },
    /// A field of the configuration is out of bounds or inconsistent with
    /// the pool's parent or children.
    #[error("pool {path}: {field}: {problem}")]
    InvalidConfig {
        /// The pool.
        path: String,
        /// The offending field, e.g. `reservation.cpu`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Only pools without children may be deleted.
    #[error("cannot delete pool {path}: it has {n_children} child pool(s)")]
    HasChildren {
        /// The pool.
        path: String,
        /// How many children it has.
        n_children: usize,
    },
    /// The pool holds queued or running tasks.
    #[error("pool {path} holds {n_tasks} task(s): {action}")]
    HasTasks {
        /// The pool.
        path: String,
        /// Queued plus allocated tasks.
        n_tasks: u64,
        /// What could not be done because of them.
        action: &'static str,
    },
    /// The root pool is permanent.
    #[error("the root pool / cannot be deleted")]
    RootNotDeletable,
    /// Tasks can only be queued in leaf pools.
    #[error("pool {path} has child pools: tasks may only be submitted to leaf pools")]
    NotLeaf {
        /// The pool.
        path: String,
    },
}

/// Bounds of a pool tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolTreeLimits {
    /// Largest number of pools, the root included.
    pub max_pools: usize,
}

impl Default for PoolTreeLimits {
    fn default() -> Self {
        PoolTreeLimits {
            max_pools: DEFAULT_MAX_POOLS,
        }
    }
}

/// The tree of resource pools.
#[derive(Debug)]
pub struct PoolTree {
    /// Unique per tree object (a clone gets a new one), so caches keyed by
    /// (identity, version) never confuse two trees.
    identity: u64,
    limits: PoolTreeLimits,
    // Columns indexed by slot.
    generation: Vec<u32>,
    live: Vec<bool>,
    parent: Vec<u32>,
    children: Vec<Vec<u32>>,
    path: Vec<Box<str>>,
    config: Vec<PoolConfig>,
    free_slots: Vec<u32>,
    by_path: HashMap<Box<str>, u32>,
    n_live: usize,
    /// Bumped by every structural or configuration change; consumers that
    /// cache a derived view (the entitlement plan) compare it.
    version: u64,
}

impl PoolTree {
    /// A tree holding only the root pool `/` with the default configuration
    /// (no reservation guarantees beyond capacity, unlimited limit).
    ///
    /// Panics if `limits.max_pools` is 0 or above [`MAX_POOLS_LIMIT`] (a
    /// configuration error the caller validates first).
    pub fn new(limits: PoolTreeLimits) -> Self {
        assert!(
            (1..=MAX_POOLS_LIMIT).contains(&limits.max_pools),
            "max_pools must be between 1 and {MAX_POOLS_LIMIT}"
        );
        let root_config = PoolConfig::default()
            .with_reservation(Resources::MAX)
            .with_limit(Resources::MAX);
        let mut tree = PoolTree {
            identity: next_tree_identity(),
            limits,
            generation: vec![0],
            live: vec![true],
            parent: vec![NO_PARENT],
            children: vec![Vec::new()],
            path: vec!["/".into()],
            config: vec![root_config],
            free_slots: Vec::new(),
            by_path: HashMap::new(),
            n_live: 1,
            version: 0,
        };
        tree.by_path.insert("/".into(), 0);
        tree
    }

    /// The tree's bounds.
    pub fn limits(&self) -> PoolTreeLimits {
        self.limits
    }

    /// The root pool `/`.
    pub fn root(&self) -> PoolId {
        PoolId {
            idx: 0,
            generation: self.generation[0],
        }
    }

    /// Number of live pools, the root included.
    pub fn len(&self) -> usize {
        self.n_live
    }

    /// Always false: the root exists.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Number of slots (live or free); per-pool columns have this length.
    pub fn n_slots(&self) -> usize {
        self.live.len()
    }

    /// Changes with every successful mutation.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Unique to this tree object; with [`PoolTree::version`] it identifies
    /// the tree's exact content.
    pub fn identity(&self) -> u64 {
        self.identity
    }

    /// The pool with this path.
    pub fn lookup(&self, path: &str) -> Option<PoolId> {
        self.by_path.get(path).map(|&idx| self.id_of(idx))
    }

    /// The pool with this path, or `NotFound`.
    pub fn resolve(&self, path: &str) -> Result<PoolId, PoolError> {
        self.lookup(path).ok_or_else(|| PoolError::NotFound {
            path: path.to_owned(),
        })
    }

    /// The live pool in `slot`, if any.
    pub fn lookup_slot(&self, slot: usize) -> Option<PoolId> {
        (slot < self.live.len() && self.live[slot]).then(|| self.id_of(slot as u32))
    }

    /// True if `id` names a live pool.
    pub fn contains(&self, id: PoolId) -> bool {
        let i = id.idx();
        i < self.live.len() && self.live[i] && self.generation[i] == id.generation
    }

    /// `Ok(())` if `id` names a live pool, `NotFound` otherwise.
    pub fn check(&self, id: PoolId) -> Result<(), PoolError> {
        if self.contains(id) {
            Ok(())
        } else {
            Err(PoolError::NotFound {
                path: format!("<stale pool handle {}#{}>", id.idx, id.generation),
            })
        }
    }

    /// Path of a live pool. Panics on a stale handle.
    pub fn path(&self, id: PoolId) -> &str {
        self.assert_live(id);
        &self.path[id.idx()]
    }

    /// Configuration of a live pool. Panics on a stale handle.
    pub fn config(&self, id: PoolId) -> &PoolConfig {
        self.assert_live(id);
        &self.config[id.idx()]
    }

    /// Parent of a live pool (`None` for the root).
    pub fn parent(&self, id: PoolId) -> Option<PoolId> {
        self.assert_live(id);
        let p = self.parent[id.idx()];
        (p != NO_PARENT).then(|| self.id_of(p))
    }

    /// Children of a live pool, in creation order.
    pub fn children(&self, id: PoolId) -> impl ExactSizeIterator<Item = PoolId> + '_ {
        self.assert_live(id);
        self.children[id.idx()].iter().map(|&c| self.id_of(c))
    }

    /// True if the pool has no children (tasks may be queued only in leaves).
    pub fn is_leaf(&self, id: PoolId) -> bool {
        self.assert_live(id);
        self.children[id.idx()].is_empty()
    }

    /// All live pools, sorted by path.
    pub fn list(&self) -> Vec<PoolId> {
        let mut ids: Vec<PoolId> = (0..self.live.len() as u32)
            .filter(|&i| self.live[i as usize])
            .map(|i| self.id_of(i))
            .collect();
        ids.sort_by(|a, b| self.path[a.idx()].cmp(&self.path[b.idx()]));
        ids
    }

    /// Live pools in breadth-first order from the root: every parent comes
    /// before its children, and each pool's children are contiguous and in
    /// creation order.
    pub fn breadth_first(&self) -> Vec<PoolId> {
        let mut order = Vec::with_capacity(self.n_live);
        order.push(self.root());
        let mut head = 0;
        while head < order.len() {
            let idx = order[head].idx();
            order.extend(self.children[idx].iter().map(|&c| self.id_of(c)));
            head += 1;
        }
        order
    }

    /// Creates the pool at `path` under its existing parent.
    ///
    /// Fails without changing anything if the path is malformed or taken, the
    /// parent is missing, the pool bound is reached, or the configuration is
    /// out of bounds or does not fit the parent (limit above the parent's, or
    /// the siblings' reservations would exceed the parent's).
    pub fn create(&mut self, path: &str, config: PoolConfig) -> Result<PoolId, PoolError> {
        let (parent_path, _name) = split_path(path)?;
        let Some(parent_path) = parent_path else {
            return Err(PoolError::AlreadyExists {
                path: path.to_owned(),
            });
        };
        if self.by_path.contains_key(path) {
            return Err(PoolError::AlreadyExists {
                path: path.to_owned(),
            });
        }
        let parent = self
            .lookup(parent_path)
            .ok_or_else(|| PoolError::ParentNotFound {
                path: path.to_owned(),
                parent: parent_path.to_owned(),
            })?;
        if self.n_live >= self.limits.max_pools {
            return Err(PoolError::TooManyPools {
                path: path.to_owned(),
                limit: self.limits.max_pools,
            });
        }
        validate_own_fields(path, &config)?;
        self.validate_against_parent(path, parent.idx, None, &config)?;

        let idx = match self.free_slots.pop() {
            Some(idx) => {
                let i = idx as usize;
                self.generation[i] = self.generation[i].wrapping_add(1);
                self.live[i] = true;
                self.parent[i] = parent.idx;
                self.children[i].clear();
                self.path[i] = path.into();
                self.config[i] = config;
                idx
            }
            None => {
                let idx = u32::try_from(self.live.len()).expect("pool slots fit in u32");
                self.generation.push(0);
                self.live.push(true);
                self.parent.push(parent.idx);
                self.children.push(Vec::new());
                self.path.push(path.into());
                self.config.push(config);
                idx
            }
        };
        self.children[parent.idx()].push(idx);
        self.by_path.insert(path.into(), idx);
        self.n_live += 1;
        self.version += 1;
        Ok(self.id_of(idx))
    }

    /// Replaces the configuration of a live pool.
    ///
    /// The new configuration must be within bounds, fit the parent (as for
    /// [`PoolTree::create`]) and still cover the children: a reservation at
    /// least the sum of theirs and a limit at least each of theirs.
    pub fn update(&mut self, id: PoolId, config: PoolConfig) -> Result<(), PoolError> {
        self.check(id)?;
        let i = id.idx();
        let path = self.path[i].to_string();
        validate_own_fields(&path, &config)?;
        if self.parent[i] != NO_PARENT {
            self.validate_against_parent(&path, self.parent[i], Some(id.idx), &config)?;
        }
        self.validate_against_children(&path, i, &config)?;
        self.config[i] = config;
        self.version += 1;
        Ok(())
    }

    /// Deletes a live pool without children. The caller (the resource
    /// manager) checks first that it holds no tasks.
    pub fn delete(&mut self, id: PoolId) -> Result<(), PoolError> {
        self.check(id)?;
        let i = id.idx();
        if self.parent[i] == NO_PARENT {
            return Err(PoolError::RootNotDeletable);
        }
        if !self.children[i].is_empty() {
            return Err(PoolError::HasChildren {
                path: self.path[i].to_string(),
                n_children: self.children[i].len(),
            });
        }
        let parent = self.parent[i] as usize;
        let siblings = &mut self.children[parent];
        let pos = siblings
            .iter()
            .position(|&c| c == id.idx)
            .expect("child listed in its parent");
        siblings.remove(pos);
        self.by_path.remove(&self.path[i]);
        self.live[i] = false;
        self.parent[i] = NO_PARENT;
        self.path[i] = "".into();
        self.free_slots.push(id.idx);
        self.n_live -= 1;
        self.version += 1;
        Ok(())
    }

    fn validate_against_parent(
        &self,
        path: &str,
        parent: u32,
        replacing: Option<u32>,
        config: &PoolConfig,
    ) -> Result<(), PoolError> {
        let parent = parent as usize;
        let parent_config = &self.config[parent];
        for d in Dim::ALL {
            let own = &config.dims[d.idx()];
            let theirs = &parent_config.dims[d.idx()];
            if own.limit > theirs.limit {
                return Err(invalid(
                    path,
                    format!("limit.{d}"),
                    format!(
                        "{} exceeds the limit {} of parent pool {}",
                        own.limit, theirs.limit, self.path[parent]
                    ),
                ));
            }
            let siblings: u64 = self.children[parent]
                .iter()
                .filter(|&&c| Some(c) != replacing)
                .map(|&c| self.config[c as usize].dims[d.idx()].reservation)
                .sum();
            if siblings + own.reservation > theirs.reservation {
                return Err(invalid(
                    path,
                    format!("reservation.{d}"),
                    format!(
                        "{} plus the sibling pools' {} exceeds the reservation {} of parent pool {}",
                        own.reservation, siblings, theirs.reservation, self.path[parent]
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_against_children(
        &self,
        path: &str,
        idx: usize,
        config: &PoolConfig,
    ) -> Result<(), PoolError> {
        for d in Dim::ALL {
            let own = &config.dims[d.idx()];
            let mut reserved = 0u64;
            for &c in &self.children[idx] {
                let child = &self.config[c as usize].dims[d.idx()];
                reserved += child.reservation;
                if child.limit > own.limit {
                    return Err(invalid(
                        path,
                        format!("limit.{d}"),
                        format!(
                            "{} is below the limit {} of child pool {}",
                            own.limit, child.limit, self.path[c as usize]
                        ),
                    ));
                }
            }
            if reserved > own.reservation {
                return Err(invalid(
                    path,
                    format!("reservation.{d}"),
                    format!(
                        "{} is below the {} reserved by its child pools",
                        own.reservation, reserved
                    ),
                ));
            }
        }
        Ok(())
    }

    fn id_of(&self, idx: u32) -> PoolId {
        PoolId {
            idx,
            generation: self.generation[idx as usize],
        }
    }

    fn assert_live(&self, id: PoolId) {
        assert!(self.contains(id), "stale pool handle {id:?}");
    }

    /// Panics if any structural or configuration invariant is broken. Tests
    /// and fuzz targets call it after every operation.
    pub fn check_invariants(&self) {
        let n = self.live.len();
        for column_len in [
            self.generation.len(),
            self.parent.len(),
            self.children.len(),
            self.path.len(),
            self.config.len(),
        ] {
            assert_eq!(column_len, n, "pool columns have equal length");
        }
        assert!(self.live[0] && self.parent[0] == NO_PARENT && &*self.path[0] == "/");
        let live_count = self.live.iter().filter(|&&l| l).count();
        assert_eq!(live_count, self.n_live);
        assert!(self.n_live <= self.limits.max_pools.max(1));
        assert_eq!(self.by_path.len(), self.n_live);
        assert_eq!(self.free_slots.len(), n - self.n_live);
        for &f in &self.free_slots {
            assert!(!self.live[f as usize], "free slot {f} is live");
        }
        // Every live pool is reachable from the root exactly once.
        assert_eq!(
            self.breadth_first().len(),
            self.n_live,
            "tree is connected and acyclic"
        );
        for i in 0..n {
            if !self.live[i] {
                continue;
            }
            assert_eq!(self.by_path.get(&self.path[i]).copied(), Some(i as u32));
            let config = &self.config[i];
            validate_own_fields(&self.path[i], config).expect("stored config is valid");
            self.validate_against_children(&self.path[i], i, config)
                .expect("stored config covers its children");
            let p = self.parent[i];
            if p != NO_PARENT {
                assert!(self.live[p as usize], "parent of {} is live", self.path[i]);
                assert!(self.children[p as usize].contains(&(i as u32)));
                let (parent_path, _) = split_path(&self.path[i]).expect("stored path is valid");
                assert_eq!(parent_path, Some(&*self.path[p as usize]));
            }
            let mut names: Vec<&str> = self.children[i]
                .iter()
                .map(|&c| {
                    assert_eq!(self.parent[c as usize], i as u32);
                    &*self.path[c as usize]
                })
                .collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(
                names.len(),
                self.children[i].len(),
                "sibling names are unique"
            );
        }
    }
}

fn invalid(path: &str, field: String, problem: String) -> PoolError {
    PoolError::InvalidConfig {
        path: path.to_owned(),
        field,
        problem,
    }
}

/// Checks the fields of a configuration that do not depend on other pools.
fn validate_own_fields(path: &str, config: &PoolConfig) -> Result<(), PoolError> {
    for d in Dim::ALL {
        let c = &config.dims[d.idx()];
        if c.reservation > MAX_AMOUNT {
            return Err(invalid(
                path,
                format!("reservation.{d}"),
                format!("{} exceeds the maximum {MAX_AMOUNT}", c.reservation),
            ));
        }
        if c.limit > MAX_AMOUNT {
            return Err(invalid(
                path,
                format!("limit.{d}"),
                format!("{} exceeds the maximum {MAX_AMOUNT}", c.limit),
            ));
        }
        if c.reservation > c.limit {
            return Err(invalid(
                path,
                format!("reservation.{d}"),
                format!("{} exceeds the pool's limit {}", c.reservation, c.limit),
            ));
        }
        if !(c.share.is_finite() && (MIN_SHARE..=MAX_SHARE).contains(&c.share)) {
            return Err(invalid(
                path,
                format!("share.{d}"),
                format!("{} is not in [{MIN_SHARE}, {MAX_SHARE}]", c.share),
            ));
        }
    }
    for (field, pct) in [
        ("controller_limit_pct", config.controller_limit_pct),
        ("slack_limit_pct", config.slack_limit_pct),
    ] {
        if !(pct.is_finite() && (0.0..=100.0).contains(&pct)) {
            return Err(invalid(
                path,
                field.to_owned(),
                format!("{pct} is not in [0, 100]"),
            ));
        }
    }
    Ok(())
}

/// Splits a valid path into its parent path (`None` for the root) and its
/// last segment.
pub fn split_path(path: &str) -> Result<(Option<&str>, &str), PoolError> {
    let bad = |problem: &str| PoolError::InvalidPath {
        path: path.to_owned(),
        problem: problem.to_owned(),
    };
    if path == "/" {
        return Ok((None, ""));
    }
    if !path.starts_with('/') {
        return Err(bad("must start with '/'"));
    }
    if path.ends_with('/') {
        return Err(bad("must not end with '/'"));
    }
    let mut depth = 0;
    for segment in path[1..].split('/') {
        depth += 1;
        if segment.is_empty() {
            return Err(bad("has an empty segment ('//')"));
        }
        if segment.len() > MAX_NAME_LEN {
            return Err(bad(&format!(
                "segment {segment:?} is longer than {MAX_NAME_LEN} bytes"
            )));
        }
        if segment == "." || segment == ".." {
            return Err(bad("segments '.' and '..' are not allowed"));
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(bad(&format!(
                "character {c:?} is not allowed (use letters, digits, '_', '-', '.')"
            )));
        }
    }
    if depth > MAX_DEPTH {
        return Err(bad(&format!("is deeper than {MAX_DEPTH} levels")));
    }
    let cut = path.rfind('/').expect("path starts with '/'");
    let parent = if cut == 0 { "/" } else { &path[..cut] };
    Ok((Some(parent), &path[cut + 1..]))
}

impl Clone for PoolTree {
    fn clone(&self) -> Self {
        PoolTree {
            identity: next_tree_identity(),
            limits: self.limits,
            generation: self.generation.clone(),
            live: self.live.clone(),
            parent: self.parent.clone(),
            children: self.children.clone(),
            path: self.path.clone(),
            config: self.config.clone(),
            free_slots: self.free_slots.clone(),
            by_path: self.by_path.clone(),
            n_live: self.n_live,
            version: self.version,
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolKind::Elastic => "elastic",
            PoolKind::Static => "static",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpu: u64) -> Resources {
        Resources::new(cpu, cpu, cpu, cpu)
    }

    #[test]
    fn paths_are_validated() {
        assert_eq!(split_path("/").unwrap(), (None, ""));
        assert_eq!(split_path("/infra").unwrap(), (Some("/"), "infra"));
        assert_eq!(
            split_path("/infra/batch").unwrap(),
            (Some("/infra"), "batch")
        );
        for bad in [
            "",
            "infra",
            "/infra/",
            "//a",
            "/a//b",
            "/a b",
            "/a/..",
            &format!("/{}", "x".repeat(65)),
        ] {
            assert!(
                matches!(split_path(bad), Err(PoolError::InvalidPath { .. })),
                "{bad:?}"
            );
        }
        let deep = "/a".repeat(MAX_DEPTH + 1);
        assert!(split_path(&deep).is_err());
        assert!(split_path(&"/a".repeat(MAX_DEPTH)).is_ok());
    }

    #[test]
    fn create_update_delete_round_trip() {
        let mut tree = PoolTree::new(PoolTreeLimits::default());
        let infra = tree
            .create(
                "/infra",
                PoolConfig::default()
                    .with_reservation(res(100))
                    .with_limit(res(200)),
            )
            .unwrap();
        let batch = tree
            .create(
                "/infra/batch",
                PoolConfig::default()
                    .with_reservation(res(60))
                    .with_limit(res(150)),
            )
            .unwrap();
        tree.check_invariants();
        assert_eq!(tree.lookup("/infra/batch"), Some(batch));
        assert_eq!(tree.parent(batch), Some(infra));
        assert!(tree.is_leaf(batch) && !tree.is_leaf(infra));
        assert_eq!(tree.path(batch), "/infra/batch");

        // Deleting a pool with children is refused.
        assert!(matches!(
            tree.delete(infra),
            Err(PoolError::HasChildren { n_children: 1, .. })
        ));
        tree.delete(batch).unwrap();
        tree.check_invariants();
        assert!(!tree.contains(batch));
        // The slot is reused under a new generation; the old handle stays stale.
        let again = tree
            .create("/infra/again", PoolConfig::default().with_limit(res(200)))
            .unwrap();
        assert_eq!(again.idx(), batch.idx());
        assert_ne!(again, batch);
        assert!(tree.check(batch).is_err());
        assert!(matches!(
            tree.delete(tree.root()),
            Err(PoolError::RootNotDeletable)
        ));
    }

    #[test]
    fn rejected_changes_leave_the_tree_unchanged() {
        let mut tree = PoolTree::new(PoolTreeLimits { max_pools: 4 });
        let a = tree
            .create(
                "/a",
                PoolConfig::default()
                    .with_reservation(res(100))
                    .with_limit(res(200)),
            )
            .unwrap();
        tree.create(
            "/a/x",
            PoolConfig::default()
                .with_reservation(res(70))
                .with_limit(res(200)),
        )
        .unwrap();
        let before = format!("{tree:?}");
        let version = tree.version();
        let errors = [
            tree.create(
                "/a/y",
                PoolConfig::default()
                    .with_reservation(res(31))
                    .with_limit(res(50)),
            )
            .unwrap_err(),
            tree.create("/a/y", PoolConfig::default().with_limit(res(201)))
                .unwrap_err(),
            tree.create("/a/x", PoolConfig::default()).unwrap_err(),
            tree.create("/b/c", PoolConfig::default()).unwrap_err(),
            tree.create(
                "/a/y",
                PoolConfig::default().with_limit(res(9)).with_share(0.0),
            )
            .unwrap_err(),
            tree.create(
                "/a/y",
                PoolConfig::default()
                    .with_limit(res(9))
                    .with_controller_limit_pct(101.0),
            )
            .unwrap_err(),
            tree.update(
                a,
                PoolConfig::default()
                    .with_reservation(res(69))
                    .with_limit(res(200)),
            )
            .unwrap_err(),
            tree.update(
                a,
                PoolConfig::default()
                    .with_reservation(res(100))
                    .with_limit(res(199)),
            )
            .unwrap_err(),
            tree.update(
                a,
                PoolConfig::default()
                    .with_reservation(res(300))
                    .with_limit(res(200)),
            )
            .unwrap_err(),
        ];
        assert_eq!(format!("{tree:?}"), before);
        assert_eq!(tree.version(), version);
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        expect_test::expect![[r#"
            [
                "pool /a/y: reservation.cpu: 31 plus the sibling pools' 70 exceeds the reservation 100 of parent pool /a",
                "pool /a/y: limit.cpu: 201 exceeds the limit 200 of parent pool /a",
                "pool /a/x already exists",
                "cannot create pool /b/c: parent pool /b not found",
                "pool /a/y: share.cpu: 0 is not in [0.001, 1000000]",
                "pool /a/y: controller_limit_pct: 101 is not in [0, 100]",
                "pool /a: reservation.cpu: 69 is below the 70 reserved by its child pools",
                "pool /a: limit.cpu: 199 is below the limit 200 of child pool /a/x",
                "pool /a: reservation.cpu: 300 exceeds the pool's limit 200",
            ]
        "#]]
        .assert_debug_eq(&messages);
        tree.create("/a/y", PoolConfig::default().with_limit(res(200)))
            .unwrap();
        assert!(matches!(
            tree.create("/a/z", PoolConfig::default().with_limit(res(200))),
            Err(PoolError::TooManyPools { limit: 4, .. })
        ));
        tree.check_invariants();
    }
}
