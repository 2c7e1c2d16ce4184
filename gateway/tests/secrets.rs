//! Job secrets over a real socket with simulated hosts: reads show names
//! and sizes only, the store keeps values in the secrets table and nowhere
//! else, limits are refused naming the field, an update replaces or keeps
//! them, they survive a restart and go with their job.

mod common;

use std::path::Path;

use common::*;
use pb::JobState as J;
use peloton_proto::v1 as pb;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use tonic::Code;

const TOKEN: &[u8] = b"TOKEN-5f1d0c9e-delegation";
const KEYTAB: &[u8] = b"KEYTAB-a9b8c7d6e5f4-binary\x00\x01\x02";
const NEW: &[u8] = b"NEWSECRET-77aa55cc";
const GONE: &[u8] = b"BATCHSECRET-0x1234abcd";

fn secret(name: &str, value: &[u8]) -> pb::Secret {
    pb::Secret {
        name: name.into(),
        value: value.to_vec(),
        size: 0,
    }
}

/// (name, size) of each secret, checking that no value is shown.
fn shown(spec: Option<&pb::JobSpec>) -> Vec<(String, u32)> {
    spec.expect("spec")
        .secrets
        .iter()
        .map(|s| {
            assert!(s.value.is_empty(), "a read shows the value of {}", s.name);
            (s.name.clone(), s.size)
        })
        .collect()
}

fn service(pool: &str) -> pb::JobSpec {
    let mut spec = job_spec(pool, 2, 0.5, 3_600_000);
    spec.r#type = pb::JobType::Service as i32;
    spec
}

async fn create(c: &mut Clients, spec: pb::JobSpec) -> Result<pb::Job, tonic::Status> {
    Ok(c.jobs
        .create(pb::CreateJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job
        .expect("job"))
}

async fn update(c: &mut Clients, id: &str, spec: pb::JobSpec) -> Result<pb::Job, tonic::Status> {
    // An update keeps the job's name.
    let spec = pb::JobSpec {
        name: get_job(c, id).await?.spec.expect("spec").name,
        ..spec
    };
    Ok(c.updates
        .create(pb::UpdateJobRequest {
            job_id: id.into(),
            version: 0,
            spec: Some(spec),
            update: Some(pb::UpdateSpec {
                batch_size: 2,
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .job
        .expect("job"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every value (bytes and text columns) of every table of the PostgreSQL
/// store, by table name without its `peloton_` prefix.
fn pg_store_values(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let url = database_for(dir);
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        let columns = c
            .query(
                "SELECT table_name::text, column_name::text, data_type::text \
                 FROM information_schema.columns \
                 WHERE table_name LIKE 'peloton\\_%' AND data_type IN ('bytea', 'text')",
                &[],
            )
            .expect("columns");
        let mut out = Vec::new();
        for col in columns {
            let (table, column, kind): (String, String, String) =
                (col.get(0), col.get(1), col.get(2));
            let name: &'static str = Box::leak(
                table
                    .trim_start_matches("peloton_")
                    .to_string()
                    .into_boxed_str(),
            );
            for row in c
                .query(&format!("SELECT {column} FROM {table}"), &[])
                .expect("rows")
            {
                let value = if kind == "bytea" {
                    row.get::<_, Vec<u8>>(0)
                } else {
                    row.get::<_, String>(0).into_bytes()
                };
                // Keys are compared as values too: a secret in a key
                // would be as visible.
                if column == "value" || kind == "bytea" {
                    out.push((name, value));
                } else {
                    out.push(("keys", value));
                }
            }
        }
        out
    })
    .join()
    .expect("read the database")
}

/// Every value of every table of the store, by table name (the store must
/// be closed).
fn store_values(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    if on_postgres() {
        return pg_store_values(dir);
    }
    let db = redb::Database::open(dir.join("peloton.redb")).expect("open the store");
    let txn = db.begin_read().expect("read");
    let mut out = Vec::new();
    for name in [
        "pools",
        "jobs",
        "hosts",
        "updates",
        "host_pools",
        "secrets",
        "volumes",
        "tokens",
        "audit",
        "usage",
    ] {
        let t = txn
            .open_table(TableDefinition::<&str, &[u8]>::new(name))
            .expect("table");
        for row in t.iter().expect("iter") {
            let (_, v) = row.expect("row");
            out.push((name, v.value().to_vec()));
        }
    }
    let t = txn
        .open_table(TableDefinition::<(&str, u64), &[u8]>::new("configs"))
        .expect("configs");
    for row in t.iter().expect("iter") {
        out.push(("configs", row.expect("row").1.value().to_vec()));
    }
    let t = txn
        .open_table(TableDefinition::<(&str, u32), &[u8]>::new("tasks"))
        .expect("tasks");
    for row in t.iter().expect("iter") {
        out.push(("tasks", row.expect("row").1.value().to_vec()));
    }
    let t = txn
        .open_table(TableDefinition::<u64, &[u8]>::new("events"))
        .expect("events");
    for row in t.iter().expect("iter") {
        out.push(("events", row.expect("row").1.value().to_vec()));
    }
    let t = txn
        .open_table(TableDefinition::<&str, &str>::new("host_pool_members"))
        .expect("members");
    for row in t.iter().expect("iter") {
        out.push((
            "host_pool_members",
            row.expect("row").1.value().as_bytes().to_vec(),
        ));
    }
    // Every table of the store was read.
    let mut tables: Vec<String> = txn
        .list_tables()
        .expect("tables")
        .map(|t| t.name().to_string())
        .collect();
    tables.sort();
    assert_eq!(
        tables,
        [
            "audit",
            "configs",
            "events",
            "host_pool_members",
            "host_pools",
            "hosts",
            "jobs",
            "meta",
            "pools",
            "secrets",
            "tasks",
            "tokens",
            "updates",
            "usage",
            "volumes"
        ]
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted_stored_apart_updated_and_deleted_with_their_job() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = TestServer::start_in(dir.path(), 4).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;

    let mut spec = service("/a");
    spec.secrets = vec![secret("token", TOKEN), secret("app.keytab", KEYTAB)];
    let job = create(&mut c, spec.clone()).await.expect("create");
    let want = vec![
        ("token".to_string(), TOKEN.len() as u32),
        ("app.keytab".to_string(), KEYTAB.len() as u32),
    ];
    assert_eq!(shown(job.spec.as_ref()), want);
    let got = get_job(&mut c, &job.id).await.expect("get");
    assert_eq!(shown(got.spec.as_ref()), want);
    let q = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert_eq!(q.jobs.len(), 1);
    assert_eq!(shown(q.jobs[0].spec.as_ref()), want);
    wait_job(&c, &job.id, J::Running).await;

    // An update: "token" kept (empty value), "app.keytab" dropped, "new"
    // added.
    let mut next = spec.clone();
    task_of(&mut next).env.insert("V".into(), "2".into());
    next.secrets = vec![secret("token", b""), secret("new", NEW)];
    let updated = update(&mut c, &job.id, next.clone()).await.expect("update");
    let want = vec![
        ("token".to_string(), TOKEN.len() as u32),
        ("new".to_string(), NEW.len() as u32),
    ];
    assert_eq!(shown(updated.spec.as_ref()), want);
    assert_eq!(
        shown(get_job(&mut c, &job.id).await.expect("get").spec.as_ref()),
        want
    );
    // Keeping a secret the job does not have.
    let mut bad = next.clone();
    bad.secrets = vec![secret("new", b""), secret("app.keytab", b"")];
    assert_status(
        update(&mut c, &job.id, bad).await,
        Code::InvalidArgument,
        "spec.secrets[1].value: empty, and the job has no secret \"app.keytab\"",
    );

    // A batch job with a secret, deleted once done.
    let mut batch = job_spec("/a", 1, 0.5, 10);
    batch.secrets = vec![secret("gone", GONE)];
    let done = create(&mut c, batch).await.expect("create");
    wait_job(&c, &done.id, J::Succeeded).await;
    c.jobs
        .delete(pb::DeleteJobRequest {
            id: done.id.clone(),
            version: 0,
        })
        .await
        .expect("delete");

    // Recovered.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_eq!(
        shown(get_job(&mut c, &job.id).await.expect("get").spec.as_ref()),
        want
    );
    s.shutdown().await;

    let values = store_values(dir.path());
    let secrets: Vec<&Vec<u8>> = values
        .iter()
        .filter(|(t, _)| *t == "secrets")
        .map(|(_, v)| v)
        .collect();
    // One row: the service's (the batch job's went with it), holding its
    // current values only.
    assert_eq!(secrets.len(), 1, "secrets rows: {secrets:?}");
    assert!(contains(secrets[0], TOKEN) && contains(secrets[0], NEW));
    assert!(!contains(secrets[0], KEYTAB));
    for (table, v) in &values {
        if *table == "secrets" {
            continue;
        }
        for value in [TOKEN, KEYTAB, NEW, GONE] {
            assert!(
                !contains(v, value),
                "table {table} holds the secret {:?}",
                String::from_utf8_lossy(value)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_limits_are_refused_naming_the_field() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let kib = |n: usize| vec![b'x'; n * 1024];
    let cases: Vec<(Vec<pb::Secret>, &str)> = vec![
        (
            (0..33).map(|i| secret(&format!("s{i}"), b"v")).collect(),
            "spec.secrets: 33 secrets; the limit is 32",
        ),
        (
            vec![secret("ok", b"v"), secret(".hidden", b"v")],
            "spec.secrets[1].name: \".hidden\"",
        ),
        (vec![secret("a/b", b"v")], "spec.secrets[0].name: "),
        (vec![secret("", b"v")], "spec.secrets[0].name: "),
        (
            vec![secret(&"n".repeat(65), b"v")],
            "spec.secrets[0].name: ",
        ),
        (
            vec![secret("a", b"v"), secret("b", b"v"), secret("a", b"w")],
            "spec.secrets[2].name: duplicate secret \"a\"",
        ),
        (
            vec![secret("big", &kib(65))],
            "spec.secrets[0].value: 66560 bytes is more than the limit of 65536",
        ),
        (
            (0..5).map(|i| secret(&format!("s{i}"), &kib(64))).collect(),
            "spec.secrets: 327680 bytes in all; the limit is 262144",
        ),
        (
            vec![secret("empty", b"")],
            "spec.secrets[0].value: empty, and the job has no secret \"empty\"",
        ),
    ];
    for (secrets, needle) in cases {
        let mut spec = job_spec("/a", 1, 0.5, 10);
        spec.secrets = secrets;
        assert_status(create(&mut c, spec).await, Code::InvalidArgument, needle);
    }
    // At the limits: accepted.
    let mut spec = job_spec("/a", 1, 0.5, 10);
    spec.secrets = (0..4).map(|i| secret(&format!("s{i}"), &kib(64))).collect();
    let job = create(&mut c, spec).await.expect("at the limits");
    assert_eq!(job.spec.expect("spec").secrets.len(), 4);
    let mut spec = job_spec("/a", 1, 0.5, 10);
    spec.secrets = (0..32)
        .map(|i| secret(&format!("s-{i}.x_"), b"v"))
        .collect();
    create(&mut c, spec).await.expect("32 secrets");
    s.shutdown().await;
}
