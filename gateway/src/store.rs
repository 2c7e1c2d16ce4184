//! Durable storage behind the [`Store`] trait, and its default embedded
//! implementation on redb.
//!
//! The scheduling loop is the only writer. It applies a batch of commands to
//! its in-memory state, collects every row they change in a [`WriteBatch`],
//! and commits the batch in one transaction before it answers any of them:
//! under load many requests share one commit (group commit), and an answer
//! means the write is durable. Values are rows of the stored-row codec
//! (`store_codec`: messages of their own behind a version prefix, apart
//! from the API's), and the store as a whole has a schema version
//! ([`SCHEMA_VERSION`], in `meta`): a server refuses a store written by a
//! newer one rather than failing on some row it cannot read.
//!
//! Tables:
//! - `pools`: path → `StoredPool` (configuration and version);
//! - `jobs`: job id → `StoredJob` (status and versions, without its spec:
//!   the row is rewritten at every change of the job's state, the spec
//!   never);
//! - `tasks`: (job id, instance) → `StoredTask` (current run, failure
//!   count, history). An instance without a row has not started its first
//!   run;
//! - `hosts`: host name → `StoredHost` (an agent host's registration, the
//!   maintenance an operator set);
//! - `configs`: (job id, config version) → the `JobSpec` as sent: the job's
//!   current spec and those some instance still runs or an update may roll
//!   back to (rows written before the spec left the job row also carry it
//!   there);
//! - `updates`: update id → `StoredUpdate` (spec, state, progress);
//! - `volumes`: volume id → `StoredVolume` (job, instance, host, size);
//! - `events`: first revision of a commit → that commit's events (a compact
//!   row, `persist::encode_events`), trimmed to a bounded retention;
//! - `host_pools`: host pool name → empty value (the pools that exist
//!   besides "default", which always exists);
//! - `host_pool_members`: host name → host pool name, for hosts outside
//!   "default" (a host without a row is in "default");
//! - `secrets`: job id → the job's secrets (`StoredSecrets`), kept apart
//!   from the job and config rows, which never hold them;
//! - `tokens`: token name → `StoredToken` (grants, certificates and the
//!   SHA-256 digest of its secret; never the secret);
//! - `audit`: sequence number (20 decimal digits, so text order is number
//!   order) → `StoredAuditEntry`, trimmed to the last 100,000;
//! - `usage`: sequence number (as `audit`) → `StoredUsageRecord`, the
//!   ledger of ended runs, trimmed to the core's bound;
//! - `meta`: the schema version and counters (the last revision). Its key
//!   and value types never change, so any server can read the version.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

const POOLS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("pools");
const JOBS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("jobs");
const TASKS: TableDefinition<'_, (&str, u32), &[u8]> = TableDefinition::new("tasks");
const HOSTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("hosts");
const CONFIGS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("configs");
const UPDATES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("updates");
const VOLUMES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("volumes");
const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const HOST_POOLS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("host_pools");
const HOST_POOL_MEMBERS: TableDefinition<'_, &str, &str> =
    TableDefinition::new("host_pool_members");
const SECRETS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("secrets");
const TOKENS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("tokens");
const AUDIT: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("audit");
const USAGE: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("usage");

const META_REVISION: &str = "revision";
const META_SCHEMA_VERSION: &str = "schema_version";

/// The schema version of the embedded store this binary writes, and the
/// newest it reads:
/// 1. rows as the API's messages (job, task and config rows later in the
///    stored-row codec); the version was not recorded;
/// 2. every row in the stored-row codec (`store_codec`), the version
///    recorded in `meta`.
///
/// A store of an older version is upgraded as it is opened (every version
/// so far reads the rows of the ones before: recording the version is
/// the upgrade); one of a newer version is refused.
pub const SCHEMA_VERSION: u64 = 2;

/// The refusal of a store whose schema is newer than this binary reads.
pub fn newer_schema(found: u64, known: u64) -> StoreError {
    StoreError(format!(
        "store schema version {found} was written by a newer pelotond; this binary reads up \
         to {known}: run a pelotond at least as new as the one that wrote it"
    ))
}

/// A storage failure. A failed commit is not fatal: the loop keeps the
/// batch, refuses writes and tries it again until it lands (see
/// `scheduler.rs` and `reopening.rs`).
#[derive(Debug, thiserror::Error)]
#[error("store: {0}")]
pub struct StoreError(String);

impl StoreError {
    fn from<E: std::fmt::Display>(e: E) -> Self {
        StoreError(e.to_string())
    }

    /// An error with this message.
    pub fn msg(message: impl Into<String>) -> Self {
        StoreError(message.into())
    }
}

/// Key of the audit row of sequence number `seq`: 20 decimal digits, so
/// that key order (byte order, in both stores) is number order.
pub fn audit_key(seq: u64) -> String {
    format!("{seq:020}")
}

/// Key of a config row: (job id, config version).
pub type ConfigKey = (Arc<str>, u64);

/// Key of a task row: (job id, instance).
pub type TaskKey = (Arc<str>, u32);

/// Most task (and job) rows whose room [`WriteBatch::clear`] keeps.
const KEPT_BATCH_ROWS: usize = 1 << 18;

/// Rows changed by one group of commands; `None` deletes.
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Pool rows.
    pub pools: Vec<(String, Option<Vec<u8>>)>,
    /// Job rows.
    pub jobs: Vec<(String, Option<Vec<u8>>)>,
    /// Task rows.
    pub tasks: Vec<(TaskKey, Option<Vec<u8>>)>,
    /// Jobs whose task and config rows all go.
    pub delete_tasks_of: Vec<String>,
    /// Job specs by (job id, config version).
    pub configs: Vec<(ConfigKey, Option<Vec<u8>>)>,
    /// Update rows.
    pub updates: Vec<(String, Option<Vec<u8>>)>,
    /// Volume rows.
    pub volumes: Vec<(String, Option<Vec<u8>>)>,
    /// Host rows.
    pub hosts: Vec<(String, Option<Vec<u8>>)>,
    /// Host pools (besides "default"): name → exists.
    pub host_pools: Vec<(String, bool)>,
    /// Host pool membership: host → pool (`None`: back in "default").
    pub host_pool_members: Vec<(String, Option<String>)>,
    /// Secrets rows by job id (`None` deletes).
    pub secrets: Vec<(String, Option<Vec<u8>>)>,
    /// Token rows by name (`None` deletes).
    pub tokens: Vec<(String, Option<Vec<u8>>)>,
    /// Audit rows by [`audit_key`] (`None` deletes).
    pub audit: Vec<(String, Option<Vec<u8>>)>,
    /// Usage rows by [`audit_key`] of their sequence numbers (`None`
    /// deletes).
    pub usage: Vec<(String, Option<Vec<u8>>)>,
    /// This commit's events: (first revision, encoded `WatchResponse`).
    pub events: Option<(u64, Vec<u8>)>,
    /// The last revision after this commit.
    pub revision: u64,
    /// Drop event rows that start before this revision.
    pub trim_events_before: Option<u64>,
}

impl WriteBatch {
    /// Empties the batch, keeping its lists' room for the next one (the
    /// loop fills one per iteration, hundreds of thousands of rows at a
    /// time under load: growing them afresh each time cost reallocations
    /// and page faults).
    pub fn clear(&mut self) {
        self.pools.clear();
        self.jobs.clear();
        self.tasks.clear();
        // Bounded: one huge commit (a restart's) does not pin its room.
        self.jobs.shrink_to(KEPT_BATCH_ROWS);
        self.tasks.shrink_to(KEPT_BATCH_ROWS);
        self.delete_tasks_of.clear();
        self.configs.clear();
        self.updates.clear();
        self.volumes.clear();
        self.hosts.clear();
        self.host_pools.clear();
        self.host_pool_members.clear();
        self.secrets.clear();
        self.tokens.clear();
        self.audit.clear();
        self.usage.clear();
        self.events = None;
        self.revision = 0;
        self.trim_events_before = None;
    }

    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
            && self.jobs.is_empty()
            && self.tasks.is_empty()
            && self.delete_tasks_of.is_empty()
            && self.configs.is_empty()
            && self.updates.is_empty()
            && self.volumes.is_empty()
            && self.hosts.is_empty()
            && self.host_pools.is_empty()
            && self.host_pool_members.is_empty()
            && self.secrets.is_empty()
            && self.tokens.is_empty()
            && self.audit.is_empty()
            && self.usage.is_empty()
            && self.events.is_none()
            && self.trim_events_before.is_none()
    }
}

/// Everything stored, read once at start.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Pool rows in path order.
    pub pools: Vec<(String, Vec<u8>)>,
    /// Job rows in id order.
    pub jobs: Vec<(String, Vec<u8>)>,
    /// Task rows in (job id, instance) order.
    pub tasks: Vec<((String, u32), Vec<u8>)>,
    /// Host rows.
    pub hosts: Vec<(String, Vec<u8>)>,
    /// Config rows in (job id, version) order.
    pub configs: Vec<((String, u64), Vec<u8>)>,
    /// Update rows.
    pub updates: Vec<(String, Vec<u8>)>,
    /// Volume rows.
    pub volumes: Vec<(String, Vec<u8>)>,
    /// Host pools besides "default", in name order.
    pub host_pools: Vec<String>,
    /// Host pool membership (host, pool) of hosts outside "default".
    pub host_pool_members: Vec<(String, String)>,
    /// Secrets rows by job id.
    pub secrets: Vec<(String, Vec<u8>)>,
    /// Token rows by name.
    pub tokens: Vec<(String, Vec<u8>)>,
    /// Audit rows in sequence order.
    pub audit: Vec<(String, Vec<u8>)>,
    /// Usage rows in sequence order.
    pub usage: Vec<(String, Vec<u8>)>,
    /// The last revision.
    pub revision: u64,
}

/// Durable state of the service.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Reads everything (at start).
    fn load(&self) -> Result<Snapshot, StoreError>;
    /// Writes the batch atomically and durably.
    fn commit(&self, batch: &WriteBatch) -> Result<(), StoreError>;
    /// Event rows whose first revision is in `[from_row, ∞)`, plus the row
    /// holding `from` if it starts earlier; at most `max_rows`.
    fn events_from(&self, from: u64, max_rows: usize) -> Result<Vec<Vec<u8>>, StoreError>;
}

/// The embedded default store: one redb file in the data directory.
#[derive(Debug)]
pub struct RedbStore {
    db: Database,
}

impl RedbStore {
    /// Opens (or creates) `dir/peloton.redb` with redb's default 1 GiB
    /// page cache.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, 1 << 30)
    }

    /// Opens (or creates) `dir/peloton.redb` with a page cache of
    /// `cache_bytes`. The loop reads the store only at start (and watch
    /// replays read event rows), so a small cache costs little.
    ///
    /// A new store, or one of an older schema, gets this binary's
    /// [`SCHEMA_VERSION`]; one written by a newer binary is refused and
    /// left as it was.
    pub fn open_with_cache(dir: &Path, cache_bytes: usize) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError(format!("cannot create data dir {}: {e}", dir.display())))?;
        let path = dir.join("peloton.redb");
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|e| StoreError(format!("cannot open {}: {e}", path.display())))?;
        let txn = db.begin_write().map_err(StoreError::from)?;
        {
            let fresh = txn
                .list_tables()
                .map_err(StoreError::from)?
                .next()
                .is_none();
            let mut meta = txn.open_table(META).map_err(StoreError::from)?;
            let found = meta
                .get(META_SCHEMA_VERSION)
                .map_err(StoreError::from)?
                .map(|v| v.value());
            match found {
                Some(v) if v > SCHEMA_VERSION => {
                    drop(meta);
                    txn.abort().map_err(StoreError::from)?;
                    return Err(newer_schema(v, SCHEMA_VERSION));
                }
                Some(SCHEMA_VERSION) => {}
                _ => {
                    meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                        .map_err(StoreError::from)?;
                    if !fresh {
                        tracing::info!(
                            from = found.unwrap_or(1),
                            to = SCHEMA_VERSION,
                            path = %path.display(),
                            "store schema upgraded"
                        );
                    }
                }
            }
        }
        {
            txn.open_table(POOLS).map_err(StoreError::from)?;
            txn.open_table(JOBS).map_err(StoreError::from)?;
            txn.open_table(TASKS).map_err(StoreError::from)?;
            txn.open_table(HOSTS).map_err(StoreError::from)?;
            txn.open_table(CONFIGS).map_err(StoreError::from)?;
            txn.open_table(UPDATES).map_err(StoreError::from)?;
            txn.open_table(VOLUMES).map_err(StoreError::from)?;
            txn.open_table(EVENTS).map_err(StoreError::from)?;
            txn.open_table(HOST_POOLS).map_err(StoreError::from)?;
            txn.open_table(HOST_POOL_MEMBERS)
                .map_err(StoreError::from)?;
            txn.open_table(SECRETS).map_err(StoreError::from)?;
            txn.open_table(TOKENS).map_err(StoreError::from)?;
            txn.open_table(AUDIT).map_err(StoreError::from)?;
            txn.open_table(USAGE).map_err(StoreError::from)?;
        }
        txn.commit().map_err(StoreError::from)?;
        Ok(RedbStore { db })
    }
}

fn read_all(
    txn: &redb::ReadTransaction,
    def: TableDefinition<'_, &str, &[u8]>,
) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let table = txn.open_table(def).map_err(StoreError::from)?;
    let mut out = Vec::new();
    for row in table.iter().map_err(StoreError::from)? {
        let (k, v) = row.map_err(StoreError::from)?;
        out.push((k.value().to_string(), v.value().to_vec()));
    }
    Ok(out)
}

/// Writes (`Some`) or deletes (`None`) rows of a table keyed by string.
fn write_rows(
    txn: &redb::WriteTransaction,
    def: TableDefinition<'_, &str, &[u8]>,
    rows: &[(String, Option<Vec<u8>>)],
) -> Result<(), StoreError> {
    let mut table = txn.open_table(def).map_err(StoreError::from)?;
    for (k, v) in rows {
        match v {
            Some(v) => table.insert(k.as_str(), v.as_slice()).map(drop),
            None => table.remove(k.as_str()).map(drop),
        }
        .map_err(StoreError::from)?;
    }
    Ok(())
}

/// Task and config rows: a deleted job's go first, then the batch's, task
/// rows in key order (stable: the last write of a key still wins), so the
/// B-tree is walked once rather than jumped around in.
fn write_tasks_and_configs(
    txn: &redb::WriteTransaction,
    batch: &WriteBatch,
) -> Result<(), StoreError> {
    let mut tasks = txn.open_table(TASKS).map_err(StoreError::from)?;
    for job in &batch.delete_tasks_of {
        tasks
            .retain_in((job.as_str(), 0)..=(job.as_str(), u32::MAX), |_, _| false)
            .map_err(StoreError::from)?;
    }
    let mut order: Vec<&(TaskKey, Option<Vec<u8>>)> = batch.tasks.iter().collect();
    order.sort_by(|a, b| (&*a.0.0, a.0.1).cmp(&(&*b.0.0, b.0.1)));
    for ((job, instance), v) in order {
        match v {
            Some(v) => tasks.insert((&**job, *instance), v.as_slice()).map(drop),
            None => tasks.remove((&**job, *instance)).map(drop),
        }
        .map_err(StoreError::from)?;
    }
    let mut configs = txn.open_table(CONFIGS).map_err(StoreError::from)?;
    for job in &batch.delete_tasks_of {
        configs
            .retain_in((job.as_str(), 0)..=(job.as_str(), u64::MAX), |_, _| false)
            .map_err(StoreError::from)?;
    }
    for ((job, version), v) in &batch.configs {
        match v {
            Some(v) => configs.insert((&**job, *version), v.as_slice()).map(drop),
            None => configs.remove((&**job, *version)).map(drop),
        }
        .map_err(StoreError::from)?;
    }
    Ok(())
}

/// Host pools (a name's presence) and their members (host → pool).
fn write_host_pools(txn: &redb::WriteTransaction, batch: &WriteBatch) -> Result<(), StoreError> {
    let mut host_pools = txn.open_table(HOST_POOLS).map_err(StoreError::from)?;
    for (k, exists) in &batch.host_pools {
        if *exists {
            host_pools.insert(k.as_str(), &[][..]).map(drop)
        } else {
            host_pools.remove(k.as_str()).map(drop)
        }
        .map_err(StoreError::from)?;
    }
    let mut members = txn
        .open_table(HOST_POOL_MEMBERS)
        .map_err(StoreError::from)?;
    for (k, v) in &batch.host_pool_members {
        match v {
            Some(v) => members.insert(k.as_str(), v.as_str()).map(drop),
            None => members.remove(k.as_str()).map(drop),
        }
        .map_err(StoreError::from)?;
    }
    Ok(())
}

impl Store for RedbStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let txn = self.db.begin_read().map_err(StoreError::from)?;
        let mut snap = Snapshot {
            pools: read_all(&txn, POOLS)?,
            jobs: read_all(&txn, JOBS)?,
            hosts: read_all(&txn, HOSTS)?,
            updates: read_all(&txn, UPDATES)?,
            volumes: read_all(&txn, VOLUMES)?,
            host_pools: read_all(&txn, HOST_POOLS)?
                .into_iter()
                .map(|(k, _)| k)
                .collect(),
            secrets: read_all(&txn, SECRETS)?,
            tokens: read_all(&txn, TOKENS)?,
            audit: read_all(&txn, AUDIT)?,
            usage: read_all(&txn, USAGE)?,
            ..Snapshot::default()
        };
        let members = txn
            .open_table(HOST_POOL_MEMBERS)
            .map_err(StoreError::from)?;
        for row in members.iter().map_err(StoreError::from)? {
            let (k, v) = row.map_err(StoreError::from)?;
            snap.host_pool_members
                .push((k.value().to_string(), v.value().to_string()));
        }
        let configs = txn.open_table(CONFIGS).map_err(StoreError::from)?;
        for row in configs.iter().map_err(StoreError::from)? {
            let (k, v) = row.map_err(StoreError::from)?;
            let (job, version) = k.value();
            snap.configs
                .push(((job.to_string(), version), v.value().to_vec()));
        }
        let tasks = txn.open_table(TASKS).map_err(StoreError::from)?;
        for row in tasks.iter().map_err(StoreError::from)? {
            let (k, v) = row.map_err(StoreError::from)?;
            let (job, instance) = k.value();
            snap.tasks
                .push(((job.to_string(), instance), v.value().to_vec()));
        }
        let meta = txn.open_table(META).map_err(StoreError::from)?;
        snap.revision = meta
            .get(META_REVISION)
            .map_err(StoreError::from)?
            .map_or(0, |v| v.value());
        Ok(snap)
    }

    fn commit(&self, batch: &WriteBatch) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(StoreError::from)?;
        txn.set_durability(Durability::Immediate)
            .map_err(StoreError::from)?;
        for (def, rows) in [
            (POOLS, &batch.pools),
            (JOBS, &batch.jobs),
            (UPDATES, &batch.updates),
            (VOLUMES, &batch.volumes),
            (HOSTS, &batch.hosts),
            (SECRETS, &batch.secrets),
            (TOKENS, &batch.tokens),
            (AUDIT, &batch.audit),
            (USAGE, &batch.usage),
        ] {
            write_rows(&txn, def, rows)?;
        }
        write_tasks_and_configs(&txn, batch)?;
        write_host_pools(&txn, batch)?;
        {
            let mut events = txn.open_table(EVENTS).map_err(StoreError::from)?;
            if let Some((first, bytes)) = &batch.events {
                events
                    .insert(*first, bytes.as_slice())
                    .map_err(StoreError::from)?;
            }
            if let Some(before) = batch.trim_events_before {
                events
                    .retain_in(..before, |_, _| false)
                    .map_err(StoreError::from)?;
            }
            let mut meta = txn.open_table(META).map_err(StoreError::from)?;
            meta.insert(META_REVISION, batch.revision)
                .map_err(StoreError::from)?;
        }
        txn.commit().map_err(StoreError::from)
    }

    fn events_from(&self, from: u64, max_rows: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read().map_err(StoreError::from)?;
        let events = txn.open_table(EVENTS).map_err(StoreError::from)?;
        let start = events
            .range(..=from)
            .map_err(StoreError::from)?
            .next_back()
            .transpose()
            .map_err(StoreError::from)?
            .map_or(from, |(k, _)| k.value());
        let mut out = Vec::new();
        for row in events.range(start..).map_err(StoreError::from)? {
            let (_, v) = row.map_err(StoreError::from)?;
            out.push(v.value().to_vec());
            if out.len() >= max_rows {
                break;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::TableHandle;

    /// The raw database of a store in `dir` (no store open on it).
    fn raw(dir: &Path) -> Database {
        Database::create(dir.join("peloton.redb")).expect("open the file")
    }

    /// The schema version recorded, and the tables there are.
    fn recorded(dir: &Path) -> (Option<u64>, Vec<String>) {
        let db = raw(dir);
        let txn = db.begin_read().unwrap();
        let mut tables: Vec<String> = txn
            .list_tables()
            .unwrap()
            .map(|t| t.name().to_string())
            .collect();
        tables.sort();
        let version = txn
            .open_table(META)
            .ok()
            .and_then(|m| m.get(META_SCHEMA_VERSION).unwrap().map(|v| v.value()));
        (version, tables)
    }

    #[test]
    fn a_new_store_records_the_schema_version_it_is_written_in() {
        let dir = tempfile::tempdir().unwrap();
        drop(RedbStore::open_with_cache(dir.path(), 1 << 20).expect("create"));
        assert_eq!(recorded(dir.path()).0, Some(SCHEMA_VERSION));
        // And opens again as it is.
        drop(RedbStore::open_with_cache(dir.path(), 1 << 20).expect("reopen"));
        assert_eq!(recorded(dir.path()).0, Some(SCHEMA_VERSION));
    }

    /// A store written before the version was recorded (version 1): its
    /// rows load and it is upgraded (the version recorded).
    #[test]
    fn a_store_without_a_schema_version_is_upgraded_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = raw(dir.path());
            let txn = db.begin_write().unwrap();
            txn.open_table(JOBS)
                .unwrap()
                .insert("j", &b"old row"[..])
                .unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(META_REVISION, 7)
                .unwrap();
            txn.commit().unwrap();
        }
        assert_eq!(recorded(dir.path()).0, None);
        let store = RedbStore::open_with_cache(dir.path(), 1 << 20).expect("upgrade");
        let snap = store.load().expect("load");
        assert_eq!(snap.jobs, [("j".to_string(), b"old row".to_vec())]);
        assert_eq!(snap.revision, 7);
        drop(store);
        assert_eq!(recorded(dir.path()).0, Some(SCHEMA_VERSION));
    }

    /// A binary rolled back onto a store a newer one wrote refuses it,
    /// naming both versions, and changes nothing (no table created, the
    /// version kept).
    #[test]
    fn a_store_of_a_newer_schema_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let newer = SCHEMA_VERSION + 1;
        {
            let db = raw(dir.path());
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(META_SCHEMA_VERSION, newer)
                .unwrap();
            txn.commit().unwrap();
        }
        let before = recorded(dir.path());
        assert_eq!(before, (Some(newer), vec!["meta".to_string()]));
        let err = RedbStore::open_with_cache(dir.path(), 1 << 20).expect_err("a newer schema");
        assert_eq!(
            err.to_string(),
            format!(
                "store: store schema version {newer} was written by a newer pelotond; this \
                 binary reads up to {SCHEMA_VERSION}: run a pelotond at least as new as the one \
                 that wrote it"
            )
        );
        assert_eq!(recorded(dir.path()), before);
    }
}
