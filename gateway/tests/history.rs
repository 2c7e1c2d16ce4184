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
        let row = pb::Job::decode(snap.jobs[0].1.as_slice()).expect("a job row");
        assert_eq!(row.spec, None, "the job row carries no spec");
        assert_eq!(row.status.expect("status").state(), J::Running);
        let ((_, version), bytes) = &snap.configs[0];
        assert_eq!(*version, 1);
        let spec = pb::JobSpec::decode(bytes.as_slice()).expect("a config row");
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
        let mut row = pb::Job::decode(bytes.as_slice()).expect("a job row");
        row.spec = Some(spec);
        let batch = WriteBatch {
            jobs: vec![(id.clone(), Some(row.encode_to_vec()))],
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
    stop(s).await;
    {
        // Its spec moved to the configs table; the row lost it.
        let snap = open_store(dir.path()).load().expect("load");
        let row = pb::Job::decode(snap.jobs[0].1.as_slice()).expect("a job row");
        assert_eq!(row.spec, None);
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
