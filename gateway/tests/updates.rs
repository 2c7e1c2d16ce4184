//! Rolling updates of services over a real socket with simulated hosts: at
//! most `batch_size` instances down because of the update, a failing spec
//! that rolls back by itself, pause / resume / abort, refusals, and an
//! update that resumes after a restart of the server.

mod common;

use common::*;
use pb::TaskState as T;
use peloton_proto::v1 as pb;
use tonic::Code;

/// A service of `n` instances that "run" for an hour.
fn service(pool: &str, n: u32) -> pb::JobSpec {
    let mut spec = job_spec(pool, n, 0.5, 3_600_000);
    spec.r#type = pb::JobType::Service as i32;
    spec.name = "web".into();
    task_of(&mut spec).restart = Some(pb::RestartPolicy {
        max_failures: 0,
        backoff_ms: 20,
        max_backoff_ms: 100,
    });
    spec
}

/// The same service at a new version (an environment variable differs).
fn version(mut spec: pb::JobSpec, v: &str) -> pb::JobSpec {
    task_of(&mut spec).env.insert("VERSION".into(), v.into());
    spec
}

async fn update(
    c: &mut Clients,
    job: &str,
    spec: pb::JobSpec,
    u: pb::UpdateSpec,
) -> Result<pb::Update, tonic::Status> {
    // An update keeps the job's name (an unknown job: as given).
    let mut spec = spec;
    if let Ok(j) = get_job(c, job).await {
        spec.name = j.spec.expect("spec").name;
    }
    Ok(c.updates
        .create(pb::UpdateJobRequest {
            job_id: job.into(),
            version: 0,
            spec: Some(spec),
            update: Some(u),
        })
        .await?
        .into_inner()
        .update
        .expect("update"))
}

async fn get_update(c: &mut Clients, id: &str) -> pb::Update {
    c.updates
        .get(pb::GetUpdateRequest { id: id.into() })
        .await
        .expect("get update")
        .into_inner()
        .update
        .expect("update")
}

fn update_state(u: &pb::Update) -> pb::UpdateState {
    u.status
        .as_ref()
        .map_or(pb::UpdateState::Unknown, |s| s.state())
}

/// Polls the update until it is in `want` (every other state seen on the
/// way is returned too).
async fn wait_update(c: &Clients, id: &str, want: pb::UpdateState) -> pb::Update {
    let mut c = c.clone();
    eventually(
        &format!("update {id} to be {}", want.as_str_name()),
        TIMEOUT,
        async || {
            let u = get_update(&mut c, id).await;
            if update_state(&u) == want {
                Ok(u)
            } else {
                Err(format!("{:?}", u.status))
            }
        },
    )
    .await
}

async fn wait_running(c: &Clients, id: &str, n: u32) {
    wait_job_where(c, id, &format!("{n} instances running"), |j| {
        count_in(j, T::Running) == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_keeps_at_most_a_batch_down_and_a_failing_one_rolls_back() {
    let mut s = TestServer::start(4).await;
    create_reserved_pool(&mut s.clients, "/web").await;
    let v1 = service("/web", 8);
    let job = create_job(&mut s.clients, v1.clone()).await;
    wait_running(&s.clients, &job.id, 8).await;

    // v1 -> v2, two at a time, sampled all along.
    let u = update(
        &mut s.clients,
        &job.id,
        version(v1.clone(), "2"),
        pb::UpdateSpec {
            batch_size: 2,
            ..Default::default()
        },
    )
    .await
    .expect("update to v2");
    assert_eq!((u.from_version, u.to_version), (1, 2));
    let mut c = s.clients.clone();
    let mut most_down = 0;
    let done = eventually("the update to v2 to succeed", TIMEOUT, async || {
        let tasks = list_tasks(&mut c, &job.id).await;
        let down = tasks.iter().filter(|t| task_state(t) != T::Running).count();
        most_down = most_down.max(down);
        let u = get_update(&mut c, &u.id).await;
        if update_state(&u) == pb::UpdateState::Succeeded {
            Ok(tasks)
        } else {
            Err(format!("{:?}", u.status))
        }
    })
    .await;
    assert!(most_down <= 2, "{most_down} instances were down at once");
    assert!(done.iter().all(|t| t.config_version == 2), "{done:?}");
    let j = get_job(&mut s.clients, &job.id).await.expect("job");
    let status = j.status.clone().expect("status");
    assert_eq!(status.config_version, 2);
    assert_eq!(status.update_id, u.id);
    let env = &j
        .spec
        .as_ref()
        .expect("spec")
        .default_task
        .as_ref()
        .expect("task")
        .env;
    assert_eq!(env.get("VERSION").map(String::as_str), Some("2"));
    wait_running(&s.clients, &job.id, 8).await;

    // v3 exits at once: its first instance fails, and the update rolls back
    // to v2 by itself.
    let mut v3 = version(v1.clone(), "3");
    task_of(&mut v3).sim = Some(pb::SimSpec {
        duration_ms: 0,
        exit_code: 1,
    });
    let u3 = update(
        &mut s.clients,
        &job.id,
        v3,
        pb::UpdateSpec {
            batch_size: 2,
            rollback_on_failure: true,
            ..Default::default()
        },
    )
    .await
    .expect("update to v3");
    let back = wait_update(&s.clients, &u3.id, pb::UpdateState::RolledBack).await;
    let status = back.status.expect("status");
    assert!(
        status.reason.contains("failed on the new spec"),
        "{status:?}"
    );
    wait_running(&s.clients, &job.id, 8).await;
    let tasks = list_tasks(&mut s.clients, &job.id).await;
    assert!(tasks.iter().all(|t| t.config_version == 2), "{tasks:?}");
    let j = get_job(&mut s.clients, &job.id).await.expect("job");
    assert_eq!(j.status.expect("status").config_version, 2);

    // The job's updates, newest first.
    let list = s
        .clients
        .updates
        .list(pb::ListUpdatesRequest {
            job_id: job.id.clone(),
        })
        .await
        .expect("list")
        .into_inner()
        .updates;
    let ids: Vec<&str> = list.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(ids, [u3.id.as_str(), u.id.as_str()]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_pauses_resumes_aborts_and_resumes_after_a_restart() {
    let mut s = TestServer::start(4).await;
    create_reserved_pool(&mut s.clients, "/web").await;
    let v1 = service("/web", 6);
    let job = create_job(&mut s.clients, v1.clone()).await;
    wait_running(&s.clients, &job.id, 6).await;

    let u = update(
        &mut s.clients,
        &job.id,
        version(v1.clone(), "2"),
        pb::UpdateSpec {
            batch_size: 1,
            start_paused: true,
            ..Default::default()
        },
    )
    .await
    .expect("update");
    assert_eq!(update_state(&u), pb::UpdateState::Paused);
    let action = pb::UpdateActionRequest { id: u.id.clone() };
    // Nothing moves while paused.
    let tasks = list_tasks(&mut s.clients, &job.id).await;
    assert!(tasks.iter().all(|t| t.config_version == 1));
    // Resuming what is not paused is refused and changes nothing.
    s.clients
        .updates
        .resume(action.clone())
        .await
        .expect("resume");
    let err = s.clients.updates.resume(action.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // Restart the server mid-update: it goes on where it was.
    let mut c = s.clients.clone();
    eventually("an instance on v2", TIMEOUT, async || {
        let tasks = list_tasks(&mut c, &job.id).await;
        if tasks.iter().any(|t| t.config_version == 2) {
            Ok(())
        } else {
            Err("none yet".to_string())
        }
    })
    .await;
    let mut s = s.restart().await;
    let done = wait_update(&s.clients, &u.id, pb::UpdateState::Succeeded).await;
    assert_eq!(done.status.expect("status").instances_done, 6);

    // Abort: instances keep what they run; a second update then moves them.
    let u2 = update(
        &mut s.clients,
        &job.id,
        version(v1.clone(), "3"),
        pb::UpdateSpec {
            batch_size: 1,
            start_paused: true,
            ..Default::default()
        },
    )
    .await
    .expect("update 2");
    let aborted = s
        .clients
        .updates
        .abort(pb::UpdateActionRequest { id: u2.id.clone() })
        .await
        .expect("abort")
        .into_inner()
        .update
        .expect("update");
    assert_eq!(update_state(&aborted), pb::UpdateState::Aborted);
    let err = s
        .clients
        .updates
        .pause(pb::UpdateActionRequest { id: u2.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_updates_record_stays_as_it_ended_also_after_a_restart() {
    let mut s = TestServer::start(2).await;
    create_reserved_pool(&mut s.clients, "/web").await;
    let v1 = service("/web", 3);
    let job = create_job(&mut s.clients, v1.clone()).await;
    wait_running(&s.clients, &job.id, 3).await;
    let all = |batch_size| pb::UpdateSpec {
        batch_size,
        ..Default::default()
    };

    // u1 succeeds: 3/3 on v2.
    let u1 = update(&mut s.clients, &job.id, version(v1.clone(), "2"), all(3))
        .await
        .expect("u1");
    let u1 = wait_update(&s.clients, &u1.id, pb::UpdateState::Succeeded).await;
    let st = u1.status.clone().expect("status");
    assert_eq!((st.instances_done, st.instances_total), (3, 3), "{st:?}");

    // u2's spec exits at once: its first instance fails and it rolls back,
    // listing the instance its reason counts.
    let mut v3 = version(v1.clone(), "3");
    task_of(&mut v3).sim = Some(pb::SimSpec {
        duration_ms: 0,
        exit_code: 1,
    });
    let u2 = update(
        &mut s.clients,
        &job.id,
        v3,
        pb::UpdateSpec {
            batch_size: 1,
            rollback_on_failure: true,
            ..Default::default()
        },
    )
    .await
    .expect("u2");
    let u2 = wait_update(&s.clients, &u2.id, pb::UpdateState::RolledBack).await;
    let st = u2.status.clone().expect("status");
    assert_eq!(st.instances_failed, [0], "{st:?}");
    assert!(
        st.reason
            .starts_with("1 instance(s) failed on the new spec"),
        "{st:?}"
    );
    assert!(st.instances_failed_rolling_back.is_empty(), "{st:?}");
    wait_running(&s.clients, &job.id, 3).await;

    // u3 moves every instance on to v4: u1 and u2 read as they ended.
    let u3 = update(&mut s.clients, &job.id, version(v1.clone(), "4"), all(3))
        .await
        .expect("u3");
    wait_update(&s.clients, &u3.id, pb::UpdateState::Succeeded).await;
    for ended in [&u1, &u2] {
        assert_eq!(&get_update(&mut s.clients, &ended.id).await, ended);
    }
    let s = s.restart().await;
    let mut c = s.clients.clone();
    for ended in [&u1, &u2] {
        assert_eq!(
            &get_update(&mut c, &ended.id).await,
            ended,
            "after a restart"
        );
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_updates_are_refused_and_change_nothing() {
    let mut s = TestServer::start(2).await;
    create_reserved_pool(&mut s.clients, "/web").await;
    let v1 = service("/web", 2);
    let job = create_job(&mut s.clients, v1.clone()).await;
    let batch = create_job(&mut s.clients, job_spec("/web", 1, 0.5, 3_600_000)).await;

    let err = update(&mut s.clients, "nope", v1.clone(), Default::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = update(
        &mut s.clients,
        &batch.id,
        job_spec("/web", 1, 0.5, 1),
        Default::default(),
    )
    .await
    .unwrap_err();
    // A batch job's update is an edit of what `job edit` changes: another
    // difference is refused, naming the field.
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("a batch job's update may change only"),
        "{err:?}"
    );
    let mut moved = v1.clone();
    moved.pool = "/".into();
    let err = update(&mut s.clients, &job.id, moved, Default::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("spec.pool:"), "{err:?}");
    let mut bad = v1.clone();
    task_of(&mut bad).resources = Some(res(-1.0, 1.0));
    let err = update(&mut s.clients, &job.id, bad, Default::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = s
        .clients
        .updates
        .create(pb::UpdateJobRequest {
            job_id: job.id.clone(),
            version: 99,
            spec: Some(v1.clone()),
            update: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = s
        .clients
        .updates
        .get(pb::GetUpdateRequest { id: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // Nothing changed.
    let j = get_job(&mut s.clients, &job.id).await.expect("job");
    let status = j.status.expect("status");
    assert_eq!(status.config_version, 1);
    assert!(status.update_id.is_empty());
    s.shutdown().await;
}

/// Update rows written by servers before the stored-row codec (the API's
/// `Update` message, as a read shows it) still recover as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_rows_written_as_the_apis_messages_still_recover() {
    use peloton_gateway::store::WriteBatch;
    use peloton_gateway::store_codec::ROW_V1;
    use prost::Message;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut s = TestServer::start_in(dir.path(), 2).await;
    create_reserved_pool(&mut s.clients, "/web").await;
    let v1 = service("/web", 2);
    let job = create_job(&mut s.clients, v1.clone()).await;
    wait_running(&s.clients, &job.id, 2).await;
    let spec = pb::UpdateSpec {
        batch_size: 2,
        ..Default::default()
    };
    let done = update(&mut s.clients, &job.id, version(v1.clone(), "2"), spec)
        .await
        .expect("update");
    let done = wait_update(&s.clients, &done.id, pb::UpdateState::Succeeded).await;
    let paused = pb::UpdateSpec {
        start_paused: true,
        ..spec
    };
    let paused = update(&mut s.clients, &job.id, version(v1, "3"), paused)
        .await
        .expect("a paused update");
    let paused = wait_update(&s.clients, &paused.id, pb::UpdateState::Paused).await;
    s.shutdown().await;
    {
        let store = open_store(dir.path());
        let snap = store.load().expect("load");
        assert_eq!(snap.updates.len(), 2);
        assert!(snap.updates.iter().all(|(_, row)| row[..2] == ROW_V1));
        let updates = [&done, &paused]
            .iter()
            .map(|u| (u.id.clone(), Some(u.encode_to_vec())))
            .collect();
        store
            .commit(&WriteBatch {
                updates,
                revision: snap.revision,
                ..WriteBatch::default()
            })
            .expect("commit");
    }
    let mut s = TestServer::start_in(dir.path(), 2).await;
    assert_eq!(get_update(&mut s.clients, &done.id).await, done);
    assert_eq!(get_update(&mut s.clients, &paused.id).await, paused);
    s.shutdown().await;
}
