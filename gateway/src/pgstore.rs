//! The [`Store`] on PostgreSQL, for a service whose state lives in a
//! database the operator already runs and backs up, shared by a leader and
//! its standbys (see `leader.rs`).
//!
//! The tables mirror the embedded store's (`store.rs`), one per redb table,
//! named `peloton_*`, keys as columns (text in byte order: `COLLATE "C"`)
//! and values as the same rows (`store_codec`). The service creates and migrates
//! its schema itself: `peloton_migrations` records the versions applied,
//! each applied once in its own transaction under an advisory lock (two
//! servers starting together do not race), and a server refuses a database
//! migrated by a newer one.
//!
//! Semantics are the embedded store's: a batch is one transaction (group
//! commit) and an answer waits for its commit, which PostgreSQL makes
//! durable (`synchronous_commit` as the server is configured; its default
//! is on). With a fencing epoch ([`PgStore::open_fenced`]) every commit
//! first takes a share lock on the lease row and checks the epoch: a
//! server that has lost the lease cannot write, and one that takes the
//! lease waits for any commit in flight before it reads the state.
//!
//! Connections: one for the loop (load and commits), one for watch replays
//! (`events_from`); a broken connection fails the call and the service's
//! `ReopeningStore` opens the store again on the next try, which is how a
//! restarted database is waited for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use postgres::{Client, NoTls, Statement, Transaction};

use crate::store::{Snapshot, Store, StoreError, WriteBatch};

/// Rows per statement of a large batch (bounds one message's size).
const CHUNK: usize = 10_000;

/// Advisory lock key serialising migrations ("peloton" in ASCII).
const MIGRATION_LOCK: i64 = 0x0070_656c_6f74_6f6e;

/// The schema, by version: each applied once, in order.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        r#"
CREATE TABLE peloton_pools (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_jobs (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_tasks (
    job text COLLATE "C" NOT NULL,
    instance bigint NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (job, instance)
);
CREATE TABLE peloton_hosts (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_configs (
    job text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (job, version)
);
CREATE TABLE peloton_updates (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_volumes (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_secrets (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_host_pools (key text COLLATE "C" PRIMARY KEY);
CREATE TABLE peloton_host_pool_members (
    key text COLLATE "C" PRIMARY KEY,
    pool text COLLATE "C" NOT NULL
);
-- One row per commit that had events: its first revision, the epoch of
-- the leader that wrote it (0: no fencing) and the encoded WatchResponse.
CREATE TABLE peloton_events (
    first bigint PRIMARY KEY,
    epoch bigint NOT NULL,
    value bytea NOT NULL
);
-- A commit's events are one large value: stored out of line without
-- compression (compressing megabytes per commit cost the database more CPU
-- than writing them).
ALTER TABLE peloton_events ALTER COLUMN value SET STORAGE EXTERNAL;
CREATE TABLE peloton_meta (key text COLLATE "C" PRIMARY KEY, value bigint NOT NULL);
-- The leader: one row, changed only when the lead changes hands. `epoch`
-- grows by one at every change and fences writes (every commit holds a
-- share lock on this row while it checks the epoch).
CREATE TABLE peloton_leader (
    id integer PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    holder text NOT NULL,
    address text NOT NULL
);
INSERT INTO peloton_leader VALUES (1, 0, '', '');
-- The lease: its epoch and expiry on the database's clock, renewed apart
-- from the fenced row so that renewals never wait behind commits.
CREATE TABLE peloton_lease (
    id integer PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
INSERT INTO peloton_lease VALUES (1, 0, 'epoch');
-- Settings every server of the database shares (the agents' token).
CREATE TABLE peloton_settings (key text COLLATE "C" PRIMARY KEY, value text NOT NULL);
"#,
    ),
    (
        2,
        r#"
CREATE TABLE peloton_tokens (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE peloton_audit (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
"#,
    ),
    (
        3,
        // Job, task and config rows are written in the stored-row codec
        // (`store_codec`: a version prefix and messages of their own). No
        // table changes; the version tells an older pelotond, which could
        // not read them, to refuse the database rather than fail on a row.
        "SELECT 1;",
    ),
    (
        4,
        // Every other row (pools, updates, volumes, hosts, tokens, audit
        // entries, secrets) is written in the stored-row codec too: an
        // older pelotond could not read them either.
        "SELECT 1;",
    ),
    (
        5,
        r#"
CREATE TABLE peloton_usage (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
"#,
    ),
];

/// Tables keyed by one text column, as (name, store field).
const KV_TABLES: [&str; 10] = [
    "peloton_pools",
    "peloton_jobs",
    "peloton_hosts",
    "peloton_updates",
    "peloton_volumes",
    "peloton_secrets",
    "peloton_tokens",
    "peloton_audit",
    "peloton_usage",
    "peloton_host_pools",
];
/// Index in [`KV_TABLES`] of the host pools' table (keys only).
const HOST_POOLS_KV: usize = 9;

/// Connects with the timeouts a store needs: a dead or partitioned
/// database fails calls within seconds instead of hanging the loop.
pub fn connect(url: &str) -> Result<Client, StoreError> {
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e| StoreError::msg(format!("store URL {}: {e}", redact(url))))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(15));
    // The database's side of the connection notices a vanished client as
    // soon, so the locks of a dead server's session do not outlive it.
    let server_side = "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 \
                       -c tcp_keepalives_count=3 -c tcp_user_timeout=15000";
    let options = match config.get_options() {
        Some(o) if !o.is_empty() => format!("{o} {server_side}"),
        _ => server_side.to_owned(),
    };
    config.options(&options);
    config
        .connect(NoTls)
        .map_err(|e| StoreError::msg(format!("cannot connect to {}: {e}", redact(url))))
}

/// `url` without its password (in the user info or a `password=`
/// parameter), for messages.
pub fn redact(url: &str) -> String {
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    };
    match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| {
                    if kv.to_ascii_lowercase().starts_with("password=") {
                        "password=***".to_owned()
                    } else {
                        kv.to_owned()
                    }
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => url,
    }
}

fn pg_err(what: &str) -> impl Fn(postgres::Error) -> StoreError + '_ {
    move |e| {
        // The server's own message (a constraint, a full disk) says more
        // than "db error".
        let detail = e
            .as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or_else(|| e.to_string());
        StoreError::msg(format!("{what}: {detail}"))
    }
}

/// Creates or migrates the schema. Errors when the database was migrated
/// by a newer server.
pub fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction().map_err(pg_err("migrate"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(pg_err("migration lock"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS peloton_migrations (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .map_err(pg_err("migrations table"))?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM peloton_migrations",
            &[],
        )
        .map_err(pg_err("schema version"))?
        .get(0);
    let newest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > newest {
        // (The transaction ends unapplied: nothing changes.)
        return Err(crate::store::newer_schema(
            u64::try_from(current).unwrap_or_default(),
            u64::try_from(newest).unwrap_or_default(),
        ));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql)
            .map_err(pg_err(&format!("migration {version}")))?;
        tx.execute(
            "INSERT INTO peloton_migrations (version) VALUES ($1)",
            &[version],
        )
        .map_err(pg_err("record migration"))?;
        tracing::info!(version, "store schema migrated");
    }
    tx.commit().map_err(pg_err("migrate"))
}

/// The agents' token all servers of the database share: created once
/// (random) by the first server that needs it.
pub fn shared_agent_token(url: &str) -> Result<String, StoreError> {
    let mut c = connect(url)?;
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    c.execute(
        "INSERT INTO peloton_settings (key, value) VALUES ('agent_token', $1) ON CONFLICT DO NOTHING",
        &[&fresh],
    )
    .map_err(pg_err("agent token"))?;
    let row = c
        .query_one(
            "SELECT value FROM peloton_settings WHERE key = 'agent_token'",
            &[],
        )
        .map_err(pg_err("agent token"))?;
    Ok(row.get(0))
}

/// Prepared statements of the loop's connection.
struct Prepared {
    kv_put: Vec<Statement>,
    kv_del: Vec<Statement>,
    task_put: Statement,
    task_copy: Statement,
    jobs_with_tasks: Statement,
    task_del: Statement,
    tasks_of_del: Statement,
    config_put: Statement,
    config_del: Statement,
    configs_of_del: Statement,
    member_put: Statement,
    member_del: Statement,
    event_put: Statement,
    events_trim: Statement,
    revision_put: Statement,
    fence: Statement,
}

impl Prepared {
    fn new(client: &mut Client) -> Result<Self, StoreError> {
        let mut prepare = |sql: &str| client.prepare(sql).map_err(pg_err("prepare"));
        let mut kv_put = Vec::new();
        let mut kv_del = Vec::new();
        for table in KV_TABLES {
            kv_put.push(if table == "peloton_host_pools" {
                prepare(&format!(
                    "INSERT INTO {table} (key) SELECT * FROM unnest($1::text[]) ON CONFLICT DO NOTHING"
                ))?
            } else {
                prepare(&format!(
                    "INSERT INTO {table} (key, value) SELECT * FROM unnest($1::text[], $2::bytea[]) \
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                ))?
            });
            kv_del.push(prepare(&format!(
                "DELETE FROM {table} WHERE key = ANY($1::text[])"
            ))?);
        }
        Ok(Prepared {
            kv_put,
            kv_del,
            task_put: prepare(
                "INSERT INTO peloton_tasks (job, instance, value) \
                 SELECT * FROM unnest($1::text[], $2::int8[], $3::bytea[]) \
                 ON CONFLICT (job, instance) DO UPDATE SET value = EXCLUDED.value",
            )?,
            task_copy: prepare(COPY_TASKS)?,
            jobs_with_tasks: prepare(
                "SELECT j FROM unnest($1::text[]) AS j \
                 WHERE EXISTS (SELECT 1 FROM peloton_tasks t WHERE t.job = j)",
            )?,
            task_del: prepare(
                "DELETE FROM peloton_tasks t USING unnest($1::text[], $2::int8[]) AS d(job, instance) \
                 WHERE t.job = d.job AND t.instance = d.instance",
            )?,
            tasks_of_del: prepare("DELETE FROM peloton_tasks WHERE job = ANY($1::text[])")?,
            config_put: prepare(
                "INSERT INTO peloton_configs (job, version, value) \
                 SELECT * FROM unnest($1::text[], $2::int8[], $3::bytea[]) \
                 ON CONFLICT (job, version) DO UPDATE SET value = EXCLUDED.value",
            )?,
            config_del: prepare(
                "DELETE FROM peloton_configs c USING unnest($1::text[], $2::int8[]) AS d(job, version) \
                 WHERE c.job = d.job AND c.version = d.version",
            )?,
            configs_of_del: prepare("DELETE FROM peloton_configs WHERE job = ANY($1::text[])")?,
            member_put: prepare(
                "INSERT INTO peloton_host_pool_members (key, pool) \
                 SELECT * FROM unnest($1::text[], $2::text[]) \
                 ON CONFLICT (key) DO UPDATE SET pool = EXCLUDED.pool",
            )?,
            member_del: prepare(
                "DELETE FROM peloton_host_pool_members WHERE key = ANY($1::text[])",
            )?,
            event_put: prepare(
                "INSERT INTO peloton_events (first, epoch, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (first) DO UPDATE SET epoch = EXCLUDED.epoch, value = EXCLUDED.value",
            )?,
            events_trim: prepare("DELETE FROM peloton_events WHERE first < $1")?,
            revision_put: prepare(
                "INSERT INTO peloton_meta (key, value) VALUES ('revision', $1) \
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            )?,
            fence: prepare("SELECT epoch FROM peloton_leader WHERE id = 1 FOR SHARE")?,
        })
    }
}

/// A commit refused because another server holds the lease now. The
/// caller must stop acting as the leader (see `leader::deposed`).
#[derive(Debug, thiserror::Error)]
#[error("fenced: this server's epoch {ours} was superseded by epoch {current}")]
pub struct Fenced {
    /// The epoch this server led under.
    pub ours: i64,
    /// The lease's epoch now.
    pub current: i64,
}

/// What a fenced commit does: by default nothing but fail (tests); the
/// service stops the process (`leader::deposed`).
pub type OnFenced = Box<dyn Fn(&Fenced) + Send + Sync>;

/// A connection that may be dropped anywhere: the blocking client's drop
/// runs a runtime of its own, which panics on an async thread (the store
/// is shared with async handlers and may go last on one), so it is dropped
/// on a thread of its own.
struct Conn(Option<Client>);

impl std::ops::Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.0.as_ref().expect("open until dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        self.0.as_mut().expect("open until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                let _ = std::thread::Builder::new()
                    .name("peloton-pg-close".into())
                    .spawn(move || drop(client));
            } else {
                drop(client);
            }
        }
    }
}

/// See the module documentation.
pub struct PgStore {
    url: String,
    writer: Mutex<(Conn, Prepared)>,
    reader: Mutex<Conn>,
    /// The epoch every commit must still hold the lease under.
    epoch: Option<i64>,
    on_fenced: Option<OnFenced>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &redact(&self.url))
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Opens the store at `url` (creating or migrating its schema), with
    /// unfenced commits: for one server alone on the database.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_inner(url, None, None)
    }

    /// Opens the store for the leader of `epoch`: a commit made after
    /// another server took the lease fails (and calls `on_fenced`). A
    /// commit transaction left idle for `stuck_after` (this process frozen
    /// or cut off in the middle of one) is ended by the database, so that
    /// its share lock on the lease row does not hold a takeover up.
    pub fn open_fenced(
        url: &str,
        epoch: i64,
        stuck_after: Duration,
        on_fenced: OnFenced,
    ) -> Result<Self, StoreError> {
        Self::open_inner(url, Some((epoch, stuck_after)), Some(on_fenced))
    }

    fn open_inner(
        url: &str,
        fence: Option<(i64, Duration)>,
        on_fenced: Option<OnFenced>,
    ) -> Result<Self, StoreError> {
        let epoch = fence.map(|f| f.0);
        let mut writer = connect(url)?;
        migrate(&mut writer)?;
        if let Some((_, stuck_after)) = fence {
            writer
                .batch_execute(&format!(
                    "SET idle_in_transaction_session_timeout = {}",
                    stuck_after.as_millis().max(1)
                ))
                .map_err(pg_err("session settings"))?;
        }
        let prepared = Prepared::new(&mut writer)?;
        let reader = connect(url)?;
        Ok(PgStore {
            url: url.to_owned(),
            writer: Mutex::new((Conn(Some(writer)), prepared)),
            reader: Mutex::new(Conn(Some(reader))),
            epoch,
            on_fenced,
        })
    }
}

/// The last write of each key wins; `(puts, deletes)` in first-seen order.
fn last_wins<'a, K: std::hash::Hash + Eq + Clone, V: ?Sized>(
    rows: impl Iterator<Item = (K, Option<&'a V>)>,
) -> (Vec<(K, &'a V)>, Vec<K>) {
    let mut order: Vec<K> = Vec::new();
    let mut last: HashMap<K, Option<&'a V>> = HashMap::new();
    for (k, v) in rows {
        if last.insert(k.clone(), v).is_none() {
            order.push(k);
        }
    }
    let (mut puts, mut dels) = (Vec::new(), Vec::new());
    for k in order {
        match last[&k] {
            Some(v) => puts.push((k, v)),
            None => dels.push(k),
        }
    }
    (puts, dels)
}

/// Host pools (existence only) and their members.
fn write_host_pools(
    tx: &mut Transaction<'_>,
    p: &Prepared,
    batch: &WriteBatch,
) -> Result<(), StoreError> {
    let (puts, dels) = last_wins(
        batch
            .host_pools
            .iter()
            .map(|(k, exists)| (k.as_str(), exists.then_some(&()))),
    );
    if !puts.is_empty() {
        let keys: Vec<&str> = puts.iter().map(|r| r.0).collect();
        tx.execute(&p.kv_put[HOST_POOLS_KV], &[&keys])
            .map_err(pg_err("write host pools"))?;
    }
    if !dels.is_empty() {
        tx.execute(&p.kv_del[HOST_POOLS_KV], &[&dels])
            .map_err(pg_err("delete host pools"))?;
    }
    let (puts, dels) = last_wins(
        batch
            .host_pool_members
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref())),
    );
    if !puts.is_empty() {
        let keys: Vec<&str> = puts.iter().map(|r| r.0).collect();
        let pools: Vec<&str> = puts.iter().map(|r| r.1).collect();
        tx.execute(&p.member_put, &[&keys, &pools])
            .map_err(pg_err("write host pool members"))?;
    }
    if !dels.is_empty() {
        tx.execute(&p.member_del, &[&dels])
            .map_err(pg_err("delete host pool members"))?;
    }
    Ok(())
}

/// A row of a text-keyed table (`None` deletes).
type KvRow = (String, Option<Vec<u8>>);

fn put_kv(
    tx: &mut Transaction<'_>,
    put: &Statement,
    del: &Statement,
    rows: &[KvRow],
) -> Result<(), StoreError> {
    let (puts, dels) = last_wins(rows.iter().map(|(k, v)| (k.as_str(), v.as_deref())));
    for chunk in puts.chunks(CHUNK) {
        let keys: Vec<&str> = chunk.iter().map(|r| r.0).collect();
        let values: Vec<&[u8]> = chunk.iter().map(|r| r.1).collect();
        tx.execute(put, &[&keys, &values])
            .map_err(pg_err("write rows"))?;
    }
    for chunk in dels.chunks(CHUNK) {
        tx.execute(del, &[&chunk]).map_err(pg_err("delete rows"))?;
    }
    Ok(())
}

fn put_pairs<'a>(
    tx: &mut Transaction<'_>,
    put: &Statement,
    del: &Statement,
    rows: impl Iterator<Item = ((&'a str, i64), Option<&'a [u8]>)>,
) -> Result<(), StoreError> {
    let (puts, dels) = last_wins(rows);
    write_pairs(tx, put, &puts)?;
    delete_pairs(tx, del, &dels)
}

/// Writes `((job, number), value)` rows with `statement`, a chunk at a time.
fn write_pairs(
    tx: &mut Transaction<'_>,
    statement: &Statement,
    rows: &[((&str, i64), &[u8])],
) -> Result<(), StoreError> {
    for chunk in rows.chunks(CHUNK) {
        let jobs: Vec<&str> = chunk.iter().map(|r| r.0.0).collect();
        let numbers: Vec<i64> = chunk.iter().map(|r| r.0.1).collect();
        let values: Vec<&[u8]> = chunk.iter().map(|r| r.1).collect();
        tx.execute(statement, &[&jobs, &numbers, &values])
            .map_err(pg_err("write rows"))?;
    }
    Ok(())
}

/// Deletes `(job, number)` rows with `statement`, a chunk at a time.
fn delete_pairs(
    tx: &mut Transaction<'_>,
    statement: &Statement,
    keys: &[(&str, i64)],
) -> Result<(), StoreError> {
    for chunk in keys.chunks(CHUNK) {
        let jobs: Vec<&str> = chunk.iter().map(|r| r.0).collect();
        let numbers: Vec<i64> = chunk.iter().map(|r| r.1).collect();
        tx.execute(statement, &[&jobs, &numbers])
            .map_err(pg_err("delete rows"))?;
    }
    Ok(())
}

/// The statement that streams new task rows in (see [`copy_pairs`]).
pub const COPY_TASKS: &str = "COPY peloton_tasks (job, instance, value) FROM STDIN (FORMAT binary)";

/// Bytes of COPY data encoded before they are sent: bounds the buffer,
/// whatever the batch's size.
const COPY_FLUSH_BYTES: usize = 1 << 20;

/// Inserts `((job, number), value)` rows with `copy` (a `COPY table (text,
/// int8, bytea columns) FROM STDIN (FORMAT binary)`) in the transaction:
/// one stream for all the rows, encoded here in PostgreSQL's binary copy
/// format a megabyte at a time. For new rows it costs the database less
/// than an `INSERT … SELECT FROM unnest(…)` (no array parameters to take
/// apart, no executor per row), and the writer less than encoding arrays.
/// A key already stored fails the copy, as it would fail the insert, and
/// so does any error here, or fewer rows written than given: the
/// transaction is then to be rolled back. Returns the rows written. Public so that the bench's PostgreSQL bound
/// writes its rows exactly as the store does. While the stream is open
/// the session is not idle in its transaction, so the database's idle
/// timeout (which ends a frozen leader's commit) does not apply; a standby
/// that takes the expired lease ends such a commit itself
/// (`leader::end_fenced_commits`).
pub fn copy_pairs<T: ?Sized + postgres::ToStatement>(
    tx: &mut Transaction<'_>,
    copy: &T,
    rows: &[((&str, i64), &[u8])],
) -> Result<u64, StoreError> {
    use std::io::Write;
    let failed = |e: std::io::Error| StoreError::msg(format!("copy rows: {e}"));
    let mut writer = tx.copy_in(copy).map_err(pg_err("copy rows"))?;
    let mut buf: Vec<u8> = Vec::with_capacity(COPY_FLUSH_BYTES + 4096);
    // Header: signature, flags (no OIDs), no extension area.
    buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    buf.extend_from_slice(&0i32.to_be_bytes());
    buf.extend_from_slice(&0i32.to_be_bytes());
    for ((job, number), value) in rows {
        let (Ok(job_len), Ok(value_len)) = (i32::try_from(job.len()), i32::try_from(value.len()))
        else {
            // Dropping the unfinished writer aborts the copy.
            return Err(StoreError::msg(format!(
                "copy rows: a row of job {job:?} is over 2 GiB"
            )));
        };
        buf.extend_from_slice(&3i16.to_be_bytes());
        buf.extend_from_slice(&job_len.to_be_bytes());
        buf.extend_from_slice(job.as_bytes());
        buf.extend_from_slice(&8i32.to_be_bytes());
        buf.extend_from_slice(&number.to_be_bytes());
        buf.extend_from_slice(&value_len.to_be_bytes());
        buf.extend_from_slice(value);
        if buf.len() >= COPY_FLUSH_BYTES {
            writer.write_all(&buf).map_err(failed)?;
            writer.flush().map_err(failed)?;
            buf.clear();
        }
    }
    // Trailer: a field count of -1.
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    writer.write_all(&buf).map_err(failed)?;
    let written = writer.finish().map_err(pg_err("copy rows"))?;
    if written != rows.len() as u64 {
        return Err(StoreError::msg(format!(
            "copy rows: {written} of {} rows written",
            rows.len()
        )));
    }
    Ok(written)
}

/// Task rows: as [`put_pairs`], except that the rows of jobs with no task
/// row stored yet (created in this batch, or all their rows deleted above)
/// are plain inserts, streamed with [`copy_pairs`]. An upsert costs the
/// database about twice an insert (it looks for a conflict in the index,
/// then inserts speculatively), and most task rows are written first when
/// their job is created. The lookup runs in the commit's transaction, and
/// only the leader writes (its epoch is checked first), so no row of such
/// a job can appear in between. One case remains: a commit retried on a
/// new connection while the last try still runs on a dead one. If that
/// try then commits rows of a job this one found without rows, the copy
/// fails on their keys; the commit fails and is retried as any failed
/// commit is, and the next try, seeing the rows, upserts them.
fn put_tasks<'a>(
    tx: &mut Transaction<'_>,
    p: &Prepared,
    rows: impl Iterator<Item = ((&'a str, i64), Option<&'a [u8]>)>,
) -> Result<(), StoreError> {
    let (puts, dels) = last_wins(rows);
    let mut jobs: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for ((job, _), _) in &puts {
        if seen.insert(*job) {
            jobs.push(job);
        }
    }
    let mut stored = std::collections::HashSet::new();
    for chunk in jobs.chunks(CHUNK) {
        for row in tx
            .query(&p.jobs_with_tasks, &[&chunk])
            .map_err(pg_err("look up jobs"))?
        {
            stored.insert(row.get::<_, String>(0));
        }
    }
    let (upserts, inserts): (Vec<_>, Vec<_>) = puts
        .into_iter()
        .partition(|((job, _), _)| stored.contains(*job));
    if !inserts.is_empty() {
        copy_pairs(tx, &p.task_copy, &inserts)?;
    }
    write_pairs(tx, &p.task_put, &upserts)?;
    delete_pairs(tx, &p.task_del, &dels)
}

impl PgStore {
    /// Refuses the commit when another server took the lease (its epoch
    /// is newer than ours).
    fn check_fence(&self, tx: &mut Transaction<'_>, p: &Prepared) -> Result<(), StoreError> {
        if let Some(ours) = self.epoch {
            let current: i64 = tx.query_one(&p.fence, &[]).map_err(pg_err("fence"))?.get(0);
            if current != ours {
                let fenced = Fenced { ours, current };
                if let Some(f) = &self.on_fenced {
                    f(&fenced);
                }
                return Err(StoreError::msg(fenced.to_string()));
            }
        }
        Ok(())
    }

    fn commit_in(
        &self,
        tx: &mut Transaction<'_>,
        p: &Prepared,
        batch: &WriteBatch,
    ) -> Result<(), StoreError> {
        self.check_fence(tx, p)?;
        let kv: [&[KvRow]; HOST_POOLS_KV] = [
            &batch.pools,
            &batch.jobs,
            &batch.hosts,
            &batch.updates,
            &batch.volumes,
            &batch.secrets,
            &batch.tokens,
            &batch.audit,
            &batch.usage,
        ];
        for (i, rows) in kv.into_iter().enumerate() {
            put_kv(tx, &p.kv_put[i], &p.kv_del[i], rows)?;
        }
        write_host_pools(tx, p, batch)?;
        // A job's rows all go before this batch's rows of the job land.
        if !batch.delete_tasks_of.is_empty() {
            let jobs: Vec<&str> = batch.delete_tasks_of.iter().map(String::as_str).collect();
            tx.execute(&p.tasks_of_del, &[&jobs])
                .map_err(pg_err("delete tasks"))?;
            tx.execute(&p.configs_of_del, &[&jobs])
                .map_err(pg_err("delete configs"))?;
        }
        put_tasks(
            tx,
            p,
            batch
                .tasks
                .iter()
                .map(|((job, i), v)| ((&**job, i64::from(*i)), v.as_deref())),
        )?;
        put_pairs(
            tx,
            &p.config_put,
            &p.config_del,
            batch
                .configs
                .iter()
                .map(|((job, v), row)| ((&**job, *v as i64), row.as_deref())),
        )?;
        if let Some((first, bytes)) = &batch.events {
            tx.execute(
                &p.event_put,
                &[
                    &(*first as i64),
                    &self.epoch.unwrap_or(0),
                    &bytes.as_slice(),
                ],
            )
            .map_err(pg_err("write events"))?;
        }
        if let Some(before) = batch.trim_events_before {
            tx.execute(&p.events_trim, &[&(before as i64)])
                .map_err(pg_err("trim events"))?;
        }
        tx.execute(&p.revision_put, &[&(batch.revision as i64)])
            .map_err(pg_err("write revision"))?;
        Ok(())
    }
}

fn read_kv(client: &mut Client, table: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let rows = client
        .query(&format!("SELECT key, value FROM {table} ORDER BY key"), &[])
        .map_err(pg_err("load"))?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
}

impl Store for PgStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let client: &mut Client = &mut guard.0;
        // One snapshot of the whole database.
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .map_err(pg_err("load"))?;
        let result = (|| {
            let mut snap = Snapshot {
                pools: read_kv(client, "peloton_pools")?,
                jobs: read_kv(client, "peloton_jobs")?,
                hosts: read_kv(client, "peloton_hosts")?,
                updates: read_kv(client, "peloton_updates")?,
                volumes: read_kv(client, "peloton_volumes")?,
                secrets: read_kv(client, "peloton_secrets")?,
                tokens: read_kv(client, "peloton_tokens")?,
                audit: read_kv(client, "peloton_audit")?,
                usage: read_kv(client, "peloton_usage")?,
                ..Snapshot::default()
            };
            for r in client
                .query("SELECT key FROM peloton_host_pools ORDER BY key", &[])
                .map_err(pg_err("load"))?
            {
                snap.host_pools.push(r.get(0));
            }
            for r in client
                .query(
                    "SELECT key, pool FROM peloton_host_pool_members ORDER BY key",
                    &[],
                )
                .map_err(pg_err("load"))?
            {
                snap.host_pool_members.push((r.get(0), r.get(1)));
            }
            for r in client
                .query(
                    "SELECT job, version, value FROM peloton_configs ORDER BY job, version",
                    &[],
                )
                .map_err(pg_err("load"))?
            {
                let version: i64 = r.get(1);
                snap.configs.push(((r.get(0), version as u64), r.get(2)));
            }
            let rows = client
                .query(
                    "SELECT job, instance, value FROM peloton_tasks ORDER BY job, instance",
                    &[],
                )
                .map_err(pg_err("load"))?;
            snap.tasks.reserve(rows.len());
            for r in rows {
                let instance: i64 = r.get(1);
                snap.tasks.push(((r.get(0), instance as u32), r.get(2)));
            }
            snap.revision = client
                .query_opt("SELECT value FROM peloton_meta WHERE key = 'revision'", &[])
                .map_err(pg_err("load"))?
                .map_or(0, |r| r.get::<_, i64>(0) as u64);
            Ok(snap)
        })();
        // Read only: ending it cannot lose anything.
        let _ = client.batch_execute("COMMIT");
        result
    }

    fn commit(&self, batch: &WriteBatch) -> Result<(), StoreError> {
        let mut guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let (client, prepared) = &mut *guard;
        let mut tx = client.transaction().map_err(pg_err("begin"))?;
        self.commit_in(&mut tx, prepared, batch)?;
        tx.commit().map_err(pg_err("commit"))
    }

    fn events_from(&self, from: u64, max_rows: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut client = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let rows = client
            .query(
                "SELECT value FROM peloton_events \
                 WHERE first >= COALESCE((SELECT max(first) FROM peloton_events WHERE first <= $1), $1) \
                 ORDER BY first LIMIT $2",
                &[&(from as i64), &(max_rows as i64)],
            )
            .map_err(pg_err("read events"))?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }
}
