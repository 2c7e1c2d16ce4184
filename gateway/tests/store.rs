//! One suite, two backends: the `Store` contract (rows, deletes, ordering,
//! event replay, trimming, durability across a reopen) checked on the
//! embedded redb store and on PostgreSQL (a real server from the system's
//! packages, started by the test). PostgreSQL's fencing and migrations are
//! checked at the end.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use peloton_gateway::pgstore::{COPY_TASKS, PgStore, copy_pairs};
use peloton_gateway::store::{RedbStore, Store, WriteBatch, audit_key};

/// A backend: opens the same store again on every call.
struct Backend {
    name: &'static str,
    open: Box<dyn Fn() -> Box<dyn Store>>,
    _dir: Option<tempfile::TempDir>,
}

fn backends(test: &str) -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_path_buf();
    let url = common::database_for(&std::path::PathBuf::from(format!("store-suite/{test}")));
    vec![
        Backend {
            name: "redb",
            open: Box::new(move || Box::new(RedbStore::open(&path).expect("open redb"))),
            _dir: Some(dir),
        },
        Backend {
            name: "postgres",
            open: Box::new(move || Box::new(PgStore::open(&url).expect("open postgres"))),
            _dir: None,
        },
    ]
}

fn row(text: &str) -> Option<Vec<u8>> {
    Some(text.as_bytes().to_vec())
}

fn strings(rows: &[(String, Vec<u8>)]) -> Vec<(String, String)> {
    rows.iter()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

#[test]
fn an_empty_store_loads_empty() {
    for b in backends("empty") {
        let snap = (b.open)().load().expect("load");
        assert_eq!(snap.revision, 0, "{}", b.name);
        assert!(snap.jobs.is_empty() && snap.tasks.is_empty(), "{}", b.name);
        assert!(
            (b.open)().events_from(0, 10).expect("events").is_empty(),
            "{}",
            b.name
        );
    }
}

#[test]
fn rows_of_every_table_come_back_in_key_order_after_a_reopen() {
    for b in backends("every-table") {
        let store = (b.open)();
        let batch = WriteBatch {
            pools: vec![("/b".into(), row("pb")), ("/a".into(), row("pa"))],
            jobs: vec![("j2".into(), row("job2")), ("j1".into(), row("job1"))],
            tasks: vec![
                ((Arc::from("j1"), 10), row("t10")),
                ((Arc::from("j1"), 2), row("t2")),
                ((Arc::from("j0"), 4_000_000_000), row("big")),
            ],
            configs: vec![
                ((Arc::from("j1"), 2), row("c2")),
                ((Arc::from("j1"), 1), row("c1")),
            ],
            updates: vec![("u1".into(), row("up"))],
            volumes: vec![("v1".into(), row("vol"))],
            hosts: vec![("h1".into(), row("host"))],
            host_pools: vec![("gpu".into(), true), ("arm".into(), true)],
            host_pool_members: vec![("h1".into(), Some("gpu".into()))],
            secrets: vec![("j1".into(), row("s"))],
            usage: vec![
                (audit_key(10), row("u10")),
                (audit_key(9), row("u9")),
                (audit_key(11), None),
            ],
            events: Some((1, b"ev1".to_vec())),
            revision: 3,
            ..WriteBatch::default()
        };
        store.commit(&batch).expect("commit");
        drop(store);
        let snap = (b.open)().load().expect("load");
        let n = b.name;
        assert_eq!(
            strings(&snap.pools),
            [("/a".into(), "pa".into()), ("/b".into(), "pb".into())],
            "{n}"
        );
        assert_eq!(
            strings(&snap.jobs),
            [("j1".into(), "job1".into()), ("j2".into(), "job2".into())],
            "{n}"
        );
        let tasks: Vec<_> = snap
            .tasks
            .iter()
            .map(|((j, i), v)| (j.as_str(), *i, v.as_slice()))
            .collect();
        assert_eq!(
            tasks,
            [
                ("j0", 4_000_000_000, &b"big"[..]),
                ("j1", 2, b"t2"),
                ("j1", 10, b"t10")
            ],
            "{n}"
        );
        let configs: Vec<_> = snap
            .configs
            .iter()
            .map(|((j, v), c)| (j.as_str(), *v, c.as_slice()))
            .collect();
        assert_eq!(configs, [("j1", 1, &b"c1"[..]), ("j1", 2, b"c2")], "{n}");
        assert_eq!(strings(&snap.updates), [("u1".into(), "up".into())], "{n}");
        assert_eq!(strings(&snap.volumes), [("v1".into(), "vol".into())], "{n}");
        assert_eq!(strings(&snap.hosts), [("h1".into(), "host".into())], "{n}");
        assert_eq!(snap.host_pools, ["arm", "gpu"], "{n}");
        assert_eq!(
            snap.host_pool_members,
            [("h1".to_string(), "gpu".to_string())],
            "{n}"
        );
        assert_eq!(strings(&snap.secrets), [("j1".into(), "s".into())], "{n}");
        // Usage records in sequence order (9 before 10).
        assert_eq!(
            strings(&snap.usage),
            [(audit_key(9), "u9".into()), (audit_key(10), "u10".into())],
            "{n}"
        );
        assert_eq!(snap.revision, 3, "{n}");
    }
}

#[test]
fn the_last_write_of_a_key_in_a_batch_wins_and_deletes_delete() {
    for b in backends("last-wins") {
        let store = (b.open)();
        store
            .commit(&WriteBatch {
                jobs: vec![("a".into(), row("1")), ("b".into(), row("1"))],
                tasks: vec![((Arc::from("a"), 0), row("1"))],
                host_pools: vec![("p".into(), true)],
                host_pool_members: vec![("h".into(), Some("p".into()))],
                revision: 1,
                ..WriteBatch::default()
            })
            .expect("first");
        store
            .commit(&WriteBatch {
                jobs: vec![
                    ("a".into(), None),
                    ("a".into(), row("2")),
                    ("b".into(), row("2")),
                    ("b".into(), None),
                    ("c".into(), row("x")),
                    ("c".into(), row("y")),
                ],
                tasks: vec![
                    ((Arc::from("a"), 0), row("2")),
                    ((Arc::from("a"), 0), None),
                    ((Arc::from("a"), 1), None),
                    ((Arc::from("a"), 1), row("n")),
                ],
                host_pools: vec![("p".into(), false)],
                host_pool_members: vec![("h".into(), None)],
                revision: 2,
                ..WriteBatch::default()
            })
            .expect("second");
        drop(store);
        let snap = (b.open)().load().expect("load");
        let n = b.name;
        assert_eq!(
            strings(&snap.jobs),
            [("a".into(), "2".into()), ("c".into(), "y".into())],
            "{n}"
        );
        assert_eq!(snap.tasks, [(("a".to_string(), 1), b"n".to_vec())], "{n}");
        assert!(snap.host_pools.is_empty(), "{n}");
        assert!(snap.host_pool_members.is_empty(), "{n}");
    }
}

#[test]
fn deleting_a_jobs_tasks_keeps_this_batchs_rows_of_it() {
    for b in backends("delete-tasks-of") {
        let store = (b.open)();
        store
            .commit(&WriteBatch {
                tasks: (0..5)
                    .map(|i| ((Arc::from("gone"), i), row("old")))
                    .chain([((Arc::from("kept"), 0), row("k"))])
                    .collect(),
                configs: vec![((Arc::from("gone"), 1), row("c"))],
                revision: 1,
                ..WriteBatch::default()
            })
            .expect("first");
        store
            .commit(&WriteBatch {
                delete_tasks_of: vec!["gone".into()],
                tasks: vec![((Arc::from("gone"), 7), row("new"))],
                revision: 2,
                ..WriteBatch::default()
            })
            .expect("second");
        drop(store);
        let snap = (b.open)().load().expect("load");
        let tasks: Vec<_> = snap
            .tasks
            .iter()
            .map(|((j, i), _)| (j.as_str(), *i))
            .collect();
        assert_eq!(tasks, [("gone", 7), ("kept", 0)], "{}", b.name);
        assert!(snap.configs.is_empty(), "{}", b.name);
    }
}

#[test]
fn event_rows_replay_from_the_row_holding_a_revision_and_trim() {
    for b in backends("events") {
        let store = (b.open)();
        for first in [1u64, 5, 9, 12] {
            store
                .commit(&WriteBatch {
                    events: Some((first, format!("e{first}").into_bytes())),
                    revision: first + 2,
                    ..WriteBatch::default()
                })
                .expect("commit");
        }
        let text = |rows: Vec<Vec<u8>>| -> Vec<String> {
            rows.into_iter()
                .map(|r| String::from_utf8(r).expect("utf8"))
                .collect()
        };
        let n = b.name;
        assert_eq!(
            text(store.events_from(6, 10).expect("from 6")),
            ["e5", "e9", "e12"],
            "{n}"
        );
        assert_eq!(
            text(store.events_from(9, 2).expect("from 9")),
            ["e9", "e12"],
            "{n}"
        );
        assert_eq!(
            text(store.events_from(0, 2).expect("from 0")),
            ["e1", "e5"],
            "{n}"
        );
        assert!(store.events_from(100, 2).expect("past").len() <= 1, "{n}");
        store
            .commit(&WriteBatch {
                trim_events_before: Some(9),
                revision: 14,
                ..WriteBatch::default()
            })
            .expect("trim");
        drop(store);
        assert_eq!(
            text((b.open)().events_from(0, 10).expect("after trim")),
            ["e9", "e12"],
            "{n}"
        );
    }
}

/// Task rows of jobs with rows stored (rewritten or new instances) and of
/// jobs without (new, or emptied row by row earlier) in one batch: each
/// lands as written (PostgreSQL inserts the second kind without an upsert).
#[test]
fn task_rows_of_stored_and_unstored_jobs_land_together() {
    for b in backends("stored-and-new") {
        let store = (b.open)();
        let task = |job: &str, i: u32, v: &str| ((Arc::from(job), i), row(v));
        store
            .commit(&WriteBatch {
                tasks: vec![
                    task("old", 0, "a"),
                    task("old", 1, "a"),
                    task("emptied", 0, "x"),
                ],
                revision: 1,
                ..WriteBatch::default()
            })
            .expect("first");
        store
            .commit(&WriteBatch {
                tasks: vec![((Arc::from("emptied"), 0), None)],
                revision: 2,
                ..WriteBatch::default()
            })
            .expect("second");
        store
            .commit(&WriteBatch {
                tasks: vec![
                    task("new", 1, "n"),
                    task("old", 0, "b"),
                    task("emptied", 0, "again"),
                    task("old", 2, "b"),
                    task("new", 0, "n"),
                    task("emptied", 1, "again"),
                ],
                revision: 3,
                ..WriteBatch::default()
            })
            .expect("third");
        drop(store);
        let snap = (b.open)().load().expect("load");
        let tasks: Vec<_> = snap
            .tasks
            .iter()
            .map(|((j, i), v)| (j.as_str(), *i, String::from_utf8_lossy(v).into_owned()))
            .collect();
        let want = [
            ("emptied", 0, "again"),
            ("emptied", 1, "again"),
            ("new", 0, "n"),
            ("new", 1, "n"),
            ("old", 0, "b"),
            ("old", 1, "a"),
            ("old", 2, "b"),
        ];
        let want: Vec<_> = want.iter().map(|&(j, i, v)| (j, i, v.to_owned())).collect();
        assert_eq!(tasks, want, "{}", b.name);
    }
}

#[test]
fn a_batch_larger_than_a_statement_lands_whole() {
    for b in backends("large") {
        let store = (b.open)();
        // Several statements' worth of rows and several megabytes (new
        // rows go to PostgreSQL as one COPY stream, sent a megabyte at a
        // time): each row's own value, so that a row lost, doubled or
        // cut at a boundary shows.
        let value = |i: u32| format!("r{i:06}-{}", "v".repeat(usize::try_from(i % 300).unwrap()));
        let tasks: Vec<_> = (0..25_000u32)
            .map(|i| {
                (
                    (Arc::from(format!("job-{}", i % 7).as_str()), i),
                    row(&value(i)),
                )
            })
            .collect();
        let bytes: usize = tasks.iter().map(|t| t.1.as_ref().map_or(0, Vec::len)).sum();
        assert!(bytes > 3 << 20, "{bytes} bytes");
        store
            .commit(&WriteBatch {
                tasks,
                revision: 1,
                ..WriteBatch::default()
            })
            .expect("commit");
        drop(store);
        let loaded = (b.open)().load().expect("load").tasks;
        assert_eq!(loaded.len(), 25_000, "{}", b.name);
        for ((job, i), v) in &loaded {
            assert_eq!(job, &format!("job-{}", i % 7), "{}", b.name);
            assert_eq!(v, value(*i).as_bytes(), "{} row {job}/{i}", b.name);
        }
    }
}

/// The store's COPY of new task rows: a key PostgreSQL refuses (one already
/// stored, the case of a commit retried while its last try landed) fails
/// it with the database's reason, whether it comes last or first with
/// megabytes still to send; nothing of it stays once the transaction rolls
/// back, and the connection takes the next copy.
#[test]
fn a_refused_copy_fails_with_the_reason_and_leaves_nothing() {
    let url = common::database_for(std::path::Path::new("store-suite/refused-copy"));
    drop(PgStore::open(&url).expect("create the schema"));
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let count = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT count(*) FROM peloton_tasks", &[])
            .expect("count")
            .get(0)
    };
    let value = vec![7u8; 200];
    let last: Vec<((&str, i64), &[u8])> = vec![(("j", 1), b"new"), (("j", 0), b"again")];
    let first: Vec<((&str, i64), &[u8])> = std::iter::once((("j", 0), &b"again"[..]))
        .chain((1..20_000).map(|i| (("j", i), value.as_slice())))
        .collect();
    for rows in [&last, &first] {
        let mut tx = c.transaction().expect("begin");
        tx.execute(
            "INSERT INTO peloton_tasks VALUES ('j', 0, 'stored'::bytea)",
            &[],
        )
        .expect("a stored row");
        let err = copy_pairs(&mut tx, COPY_TASKS, rows).expect_err("a key already stored");
        assert!(
            err.to_string().contains("copy rows") && err.to_string().contains("duplicate key"),
            "{err}"
        );
        drop(tx);
        assert_eq!(count(&mut c), 0, "rolled back");
    }
    let mut tx = c.transaction().expect("begin");
    assert_eq!(
        copy_pairs(&mut tx, COPY_TASKS, &first).expect("copy"),
        20_000
    );
    tx.commit().expect("commit");
    assert_eq!(count(&mut c), 20_000);
}

/// Sets the lease row's epoch as another server taking the lease would.
fn take_lease(url: &str, epoch: i64) {
    let mut c = postgres::Client::connect(url, postgres::NoTls).expect("connect");
    c.execute(
        "UPDATE peloton_leader SET epoch = $1, holder = 'other', address = 'http://other:1' \
         WHERE id = 1",
        &[&epoch],
    )
    .expect("take the lease");
    c.execute(
        "UPDATE peloton_lease SET epoch = $1, expires_at = now() + interval '1 minute' WHERE id = 1",
        &[&epoch],
    )
    .expect("take the lease");
}

#[test]
fn a_fenced_commit_after_another_server_took_the_lease_is_refused_and_not_applied() {
    let url = common::database_for(std::path::Path::new("store-suite/fencing"));
    drop(PgStore::open(&url).expect("create the schema"));
    take_lease(&url, 7);
    let fenced = Arc::new(AtomicUsize::new(0));
    let seen = fenced.clone();
    let store = PgStore::open_fenced(
        &url,
        7,
        std::time::Duration::from_secs(5),
        Box::new(move |f| {
            assert_eq!((f.ours, f.current), (7, 8));
            seen.fetch_add(1, Ordering::Relaxed);
        }),
    )
    .expect("open");
    store
        .commit(&WriteBatch {
            jobs: vec![("before".into(), row("1"))],
            events: Some((1, b"e".to_vec())),
            revision: 1,
            ..WriteBatch::default()
        })
        .expect("the leader of epoch 7 writes");
    take_lease(&url, 8);
    let err = store
        .commit(&WriteBatch {
            jobs: vec![("after".into(), row("1"))],
            revision: 2,
            ..WriteBatch::default()
        })
        .expect_err("a deposed leader's commit");
    assert!(err.to_string().contains("fenced"), "{err}");
    assert_eq!(fenced.load(Ordering::Relaxed), 1);
    let snap = PgStore::open(&url).expect("open").load().expect("load");
    assert_eq!(strings(&snap.jobs), [("before".into(), "1".into())]);
    assert_eq!(snap.revision, 1);
    // The event row records the epoch that wrote it.
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let epochs: Vec<i64> = c
        .query("SELECT epoch FROM peloton_events", &[])
        .expect("events")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(epochs, [7]);
}

#[test]
fn the_schema_is_migrated_once_and_a_newer_schema_is_refused() {
    let url = common::database_for(std::path::Path::new("store-suite/migrations"));
    let first = PgStore::open(&url).expect("first open creates the schema");
    first
        .commit(&WriteBatch {
            jobs: vec![("j".into(), row("1"))],
            revision: 1,
            ..WriteBatch::default()
        })
        .expect("commit");
    // Opening again (a restart, a standby) keeps the data.
    let again = PgStore::open(&url).expect("second open");
    assert_eq!(again.load().expect("load").jobs.len(), 1);
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    let versions: Vec<i32> = c
        .query(
            "SELECT version FROM peloton_migrations ORDER BY version",
            &[],
        )
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [1, 2, 3, 4, 5]);
    c.execute("INSERT INTO peloton_migrations (version) VALUES (99)", &[])
        .expect("a newer server's migration");
    let err = PgStore::open(&url).expect_err("a newer schema");
    assert!(
        err.to_string().contains(
            "store schema version 99 was written by a newer pelotond; this binary reads up to 5"
        ),
        "{err}"
    );
    // Refused, it changed nothing: no migration recorded, the rows kept.
    let after: Vec<i32> = c
        .query(
            "SELECT version FROM peloton_migrations ORDER BY version",
            &[],
        )
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(after, [1, 2, 3, 4, 5, 99]);
    let jobs: i64 = c
        .query_one("SELECT count(*) FROM peloton_jobs", &[])
        .expect("count")
        .get(0);
    assert_eq!(jobs, 1);
}

#[test]
fn a_bad_url_or_an_unreachable_database_is_a_clear_error() {
    let err = PgStore::open("postgres://nobody:secret@127.0.0.1:1/db").expect_err("unreachable");
    let text = err.to_string();
    assert!(text.contains("cannot connect"), "{text}");
    assert!(
        !text.contains("secret"),
        "the password is not shown: {text}"
    );
    let err = PgStore::open("postgres://nobody@127.0.0.1:1/db?password=hunter2")
        .expect_err("unreachable");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let err = PgStore::open("postgres://x@h/d?bogus=1").expect_err("bad option");
    assert!(err.to_string().contains("store URL"), "{err}");
}
