//! Secrets on a real cluster (`pelotond` and `peloton-agent` processes on
//! loopback, a real task): a job's secret reaches its task's sandbox as a
//! file of mode 0600 (`$PELOTON_SECRETS/<name>`), is absent from every read
//! and from the store's spec rows, follows a job update, and goes with the
//! job.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use pb::JobState as J;
use peloton_proto::v1 as pb;

const VALUE: &[u8] = b"delegation-token-4f1c9e";

/// The task prints its secret's mode and its value (as the only lines of
/// its stdout), then sleeps.
const TASK: &str =
    r#"stat -c %a "$PELOTON_SECRETS/token"; cat "$PELOTON_SECRETS/token"; echo; exec sleep 600"#;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            out.extend(files_containing(&path, needle));
        } else if meta.is_file()
            && let Ok(bytes) = std::fs::read(&path)
            && contains(&bytes, needle)
        {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_only_its_tasks_sandbox() {
    let mut cluster = Cluster::start(2).await;
    let mut spec = job("with-secret", 1, task_spec(TASK));
    spec.r#type = pb::JobType::Service as i32;
    spec.secrets = vec![pb::Secret {
        name: "token".into(),
        value: VALUE.to_vec(),
        size: 0,
    }];
    let id = cluster.create(spec.clone()).await;
    cluster.wait_running(&id, 1).await;

    // The task read it from a private file.
    let out = eventually("the task's output", async || {
        let out = cluster.logs(&id, 0, false).await;
        (out.lines().count() >= 2).then_some(out)
    })
    .await;
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("600"), "{out}");
    assert_eq!(lines.next().map(str::as_bytes), Some(VALUE), "{out}");
    let task = cluster.task(&id, 0).await.expect("task");
    let host = task.current.as_ref().expect("run").host.clone();
    let with_value = files_containing(&cluster.work_dir(&host), VALUE);
    // The secret file, and the task's own stdout (it printed the value).
    for f in &with_value {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name == "token" || name == "stdout",
            "the value leaked into {f:?}"
        );
        if name == "token" {
            let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{f:?}");
        }
    }
    assert!(
        with_value
            .iter()
            .any(|f| f.ends_with(".peloton-secrets/token")),
        "{with_value:?}"
    );
    let other = if host == "a0" { "a1" } else { "a0" };
    assert!(
        files_containing(&cluster.work_dir(other), VALUE).is_empty(),
        "the other agent never gets it"
    );

    // No read shows it.
    let job = cluster.job(&id).await.expect("job");
    let shown = format!("{job:?}");
    assert!(!shown.contains("delegation-token"), "{shown}");
    let secrets = &job.spec.as_ref().unwrap().secrets;
    assert_eq!(secrets.len(), 1);
    assert_eq!(secrets[0].name, "token");
    assert_eq!(secrets[0].size as usize, VALUE.len());
    assert!(secrets[0].value.is_empty());

    // An update (keeping the secret by naming it without a value) restarts
    // the instance, which still finds it.
    let mut next = spec.clone();
    next.default_task
        .as_mut()
        .unwrap()
        .env
        .insert("V".into(), "2".into());
    next.secrets = vec![pb::Secret {
        name: "token".into(),
        value: Vec::new(),
        size: 0,
    }];
    let mut updates = pb::update_service_client::UpdateServiceClient::new(cluster.channel());
    updates
        .create(pb::UpdateJobRequest {
            job_id: id.clone(),
            spec: Some(next),
            ..Default::default()
        })
        .await
        .expect("update");
    eventually("the updated run reads the secret", async || {
        let t = cluster.task(&id, 0).await?;
        if t.config_version != 2 || t.current.as_ref()?.state() != pb::TaskState::Running {
            return None;
        }
        let out = cluster.logs(&id, 0, false).await;
        contains(out.as_bytes(), VALUE).then_some(())
    })
    .await;

    // The store's spec rows never held it (the server is stopped to read
    // its store).
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
    if let Some(mut server) = cluster.server.take() {
        let _ = server.kill().await;
        let _ = server.wait().await;
    }
    let store = cluster.dir.path().join("server").join("peloton.redb");
    let db = redb::Database::open(&store).expect("open the store");
    let txn = db.begin_read().expect("read");
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};
    let _ = &txn;
    for name in ["jobs", "updates"] {
        let t = txn
            .open_table(TableDefinition::<&str, &[u8]>::new(name))
            .expect("table");
        for row in t.iter().expect("iter") {
            let (_, v) = row.expect("row");
            assert!(
                !contains(v.value(), VALUE),
                "the value is in the {name} table"
            );
        }
    }
    let t = txn
        .open_table(TableDefinition::<(&str, u64), &[u8]>::new("configs"))
        .expect("configs");
    for row in t.iter().expect("iter") {
        let (_, v) = row.expect("row");
        assert!(!contains(v.value(), VALUE), "the value is in a config row");
    }
    let t = txn
        .open_table(TableDefinition::<&str, &[u8]>::new("secrets"))
        .expect("secrets");
    let mut found = false;
    for row in t.iter().expect("iter") {
        found |= contains(row.expect("row").1.value(), VALUE);
    }
    assert!(found, "the secrets table holds it");
}
