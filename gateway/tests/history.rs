//! A bounded history: a finished job past its retention is removed (a last
//! job event says why), reads of it answer NOT_FOUND, it stays gone after a
//! restart, and a live job is never removed. The store's job rows carry no
//! spec (the configs table does), and rows written with one still recover.

mod common;

use std::path::Path;

use common::*;
use pb::JobState as J;
use peloton_gateway::config::Config;
use peloton_gateway::server;
use peloton_gateway::store::WriteBatch;
use peloton_gateway::store_codec;
use peloton_proto::v1 as pb;
use prost::Message;

fn retention_config(dir: &Path) -> Config {
    Config {
        job_retention_s: 1,
        max_finished_jobs: 100,
        ..config(dir, 2)
    }
}

async fn start(config: &Config) -> (server::Server, Clients) {
    let s = within("the server to start", server::start(config))
        .await
        .unwrap_or_else(|e| panic!("server does not start: {e:#}"));
    let c = Clients::connect(s.addr).await;
    (s, c)
}

async fn stop(s: server::Server) {
    within("graceful shutdown", s.shutdown())
        .await
        .expect("graceful shutdown");
}

fn not_found(r: Result<pb::Job, tonic::Status>) -> Result<(), String> {
    match r {
        Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_past_its_retention_is_gone_also_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = retention_config(dir.path());
    let (s, mut c) = start(&config).await;
    create_reserved_pool(&mut c, "/a").await;
    let mut events = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: 0,
            job_id: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let mut spec = job_spec("/a", 2, 0.5, 20);
    spec.name = "short".into();
    let short = create_job(&mut c, spec).await;
    let mut spec = job_spec("/a", 1, 0.5, 3_600_000);
    spec.name = "long".into();
    let long = create_job(&mut c, spec).await;
    wait_job(&c, &short.id, J::Succeeded).await;
    wait_job(&c, &long.id, J::Running).await;

    // Removed about a second after it finished, with a last event.
    let mut cc = c.clone();
    eventually("the finished job to be gone", TIMEOUT, async || {
        not_found(get_job(&mut cc, &short.id).await)
    })
    .await;
    let seen = collect_events(&mut events, |es| {
        es.iter().any(|e| {
            matches!(&e.kind, Some(pb::event::Kind::Job(j)) if j.job_id == short.id && j.deleted)
        })
    })
    .await;
    let last = seen.last().expect("an event");
    let Some(pb::event::Kind::Job(j)) = &last.kind else {
        panic!("the last event is the job's: {last:?}")
    };
    assert_eq!((j.reason.as_str(), j.state()), ("retention", J::Succeeded));
    let tasks = c
        .tasks
        .list(pb::ListTasksRequest {
            job_id: short.id.clone(),
            ..Default::default()
        })
        .await;
    assert_eq!(tasks.map(|_| ()).unwrap_err().code(), tonic::Code::NotFound);
    // A live job is never removed, however old.
    let job = get_job(&mut c, &long.id).await.expect("the live job stays");
    assert_eq!(job_state(&job), J::Running);
    stop(s).await;

    // The store: no row of the removed job; the live job's row has no spec,
    // its config row has it.
    {
        let store = open_store(dir.path());
        let snap = store.load().expect("load");
        let ids: Vec<&str> = snap.jobs.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, [long.id.as_str()]);
        assert!(snap.tasks.iter().all(|((j, _), _)| *j != short.id));
        assert!(snap.configs.iter().all(|((j, _), _)| *j != short.id));
        let (id, bytes) = &snap.jobs[0];
        let (row, spec) = store_codec::decode_job(id, bytes).expect("a job row");
        assert_eq!(spec, None, "the job row carries no spec");
        assert_eq!(row.state, peloton_gateway::lifecycle::JobState::Running);
        let ((_, version), bytes) = &snap.configs[0];
        assert_eq!(*version, 1);
        let spec = store_codec::decode_config(bytes).expect("a config row");
        assert_eq!(spec.name, "long");
    }

    // Recovery: still gone; the live job's spec comes from its config row.
    let (s, mut c) = start(&config).await;
    not_found(get_job(&mut c, &short.id).await).expect("gone after a restart");
    let job = get_job(&mut c, &long.id).await.expect("the live job");
    assert_eq!(job.spec.expect("spec").name, "long");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_beyond_the_count_go_oldest_first() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = Config {
        job_retention_s: 3600,
        max_finished_jobs: 2,
        ..config(dir.path(), 2)
    };
    let (s, mut c) = start(&config).await;
    create_reserved_pool(&mut c, "/a").await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let job = create_job(&mut c, job_spec("/a", 1, 0.5, 1)).await;
        wait_job(&c, &job.id, J::Succeeded).await;
        ids.push(job.id);
    }
    let mut cc = c.clone();
    eventually(
        "the two oldest finished jobs to be gone",
        TIMEOUT,
        async || {
            not_found(get_job(&mut cc, &ids[0]).await)?;
            not_found(get_job(&mut cc, &ids[1]).await)
        },
    )
    .await;
    for id in &ids[2..] {
        get_job(&mut c, id).await.expect("the newest two stay");
    }
    stop(s).await;
}

/// A task row as servers before the store codec wrote it: the API's
/// `Task` message.
fn old_task_row(bytes: &[u8]) -> Vec<u8> {
    let row = store_codec::decode_task(bytes).expect("a task row");
    let run = |r: &peloton_gateway::lifecycle::RunRecord| peloton_gateway::convert::run_to_pb(r);
    pb::Task {
        current: Some(run(&row.current)),
        failure_count: row.failures,
        history: row.history.iter().map(run).collect(),
        stopping: row.stopping.is_some(),
        restart_when_stopped: row.restart_when_stopped,
        config_version: row.config,
        stopping_launch_id: row.stopping.as_ref().map_or(0, |s| s.0.0),
        stopping_host: row
            .stopping
            .as_ref()
            .map(|s| s.1.to_string())
            .unwrap_or_default(),
        pinned_host: row.daemon_host.as_deref().unwrap_or_default().into(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A store written by servers before the store codec (job and task rows
/// the API's `Job` and `Task` messages, the spec in the job row, no config
/// row) recovers, and is rewritten in the codec's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_rows_written_with_their_spec_still_recover() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config(dir.path(), 2);
    let (s, mut c) = start(&config).await;
    create_reserved_pool(&mut c, "/a").await;
    let mut spec = job_spec("/a", 1, 0.5, 3_600_000);
    spec.name = "old-format".into();
    let job = create_job(&mut c, spec.clone()).await;
    wait_job(&c, &job.id, J::Running).await;
    stop(s).await;
    {
        // As stores written before the spec left the job row: the spec in
        // the row, no config row.
        let store = open_store(dir.path());
        let snap = store.load().expect("load");
        let (id, bytes) = &snap.jobs[0];
        let (row, _) = store_codec::decode_job(id, bytes).expect("a job row");
        let old = pb::Job {
            id: id.clone(),
            spec: Some(spec),
            status: Some(pb::JobStatus {
                state: J::Running as i32,
                created_at_ms: row.created_at,
                config_version: row.config,
                ..Default::default()
            }),
            version: row.version,
        };
        assert!(!snap.tasks.is_empty());
        let batch = WriteBatch {
            jobs: vec![(id.clone(), Some(old.encode_to_vec()))],
            tasks: snap
                .tasks
                .iter()
                .map(|((job, i), bytes)| ((job.as_str().into(), *i), Some(old_task_row(bytes))))
                .collect(),
            configs: vec![((id.as_str().into(), 1), None)],
            revision: snap.revision,
            ..WriteBatch::default()
        };
        store.commit(&batch).expect("commit");
        assert!(store.load().expect("load").configs.is_empty());
    }
    let (s, mut c) = start(&config).await;
    let got = get_job(&mut c, &job.id).await.expect("the job recovers");
    assert_eq!(got.spec.expect("spec").name, "old-format");
    // Its task too, from its old row: the simulated run did not survive
    // the restart, so the instance runs again as run 2, with run 1 (from
    // the old row) in its history.
    let tasks = list_tasks(&mut c, &job.id).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].current.as_ref().expect("run").run_id, 2);
    let runs: Vec<u32> = tasks[0].history.iter().map(|r| r.run_id).collect();
    assert_eq!(runs, [1], "{:?}", tasks[0]);
    stop(s).await;
    {
        // Its spec moved to the configs table; the row lost it and is the
        // codec's now.
        let snap = open_store(dir.path()).load().expect("load");
        let (id, bytes) = &snap.jobs[0];
        assert_eq!(bytes[..2], store_codec::ROW_V1);
        let (_, spec) = store_codec::decode_job(id, bytes).expect("a job row");
        assert_eq!(spec, None);
        assert_eq!(snap.configs.len(), 1);
    }
    // And it recovers from there.
    let (s, mut c) = start(&config).await;
    let got = get_job(&mut c, &job.id)
        .await
        .expect("the job recovers again");
    assert_eq!(got.spec.expect("spec").name, "old-format");
    stop(s).await;
}
