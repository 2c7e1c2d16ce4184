//! Lifecycle corners found in review: running limits, scale down and up
//! while runs are live, what survives a restart, and pools deleted under
//! finished jobs.

mod common;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;
use tonic::Code;

async fn scale(c: &mut Clients, id: &str, count: u32) -> Result<pb::Job, tonic::Status> {
    Ok(c.jobs
        .scale(pb::ScaleJobRequest {
            id: id.into(),
            instance_count: count,
            version: 0,
        })
        .await?
        .into_inner()
        .job
        .expect("job"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_running_instances_bounds_concurrency_and_the_job_finishes() {
    let mut s = TestServer::start(2).await;
    create_reserved_pool(&mut s.clients, "/a").await;
    let mut spec = job_spec("/a", 10, 1.0, 30);
    spec.sla = Some(pb::Sla {
        max_running_instances: 2,
        ..Default::default()
    });
    let job = create_job(&mut s.clients, spec).await;
    let mut c = s.clients.clone();
    let mut most = 0;
    let done = eventually("the job to succeed", TIMEOUT, async || {
        let j = get_job(&mut c, &job.id)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let busy = [
            T::Pending,
            T::Ready,
            T::Placing,
            T::Placed,
            T::Launching,
            T::Running,
        ]
        .into_iter()
        .map(|st| count_in(&j, st))
        .sum::<u32>();
        most = most.max(busy);
        if job_state(&j) == J::Succeeded {
            Ok(j)
        } else {
            Err(format!("{:?}", j.status))
        }
    })
    .await;
    assert_eq!(count_in(&done, T::Succeeded), 10);
    assert!(most <= 2, "{most} instances were queued or running at once");
    assert!(most >= 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_scaled_away_and_back_runs_its_full_time() {
    let mut s = TestServer::start(2).await;
    create_reserved_pool(&mut s.clients, "/a").await;
    let job = create_job(&mut s.clients, job_spec("/a", 4, 0.5, 800)).await;
    wait_job_where(&s.clients, &job.id, "4 running", |j| {
        count_in(j, T::Running) == 4
    })
    .await;
    scale(&mut s.clients, &job.id, 2).await.unwrap();
    scale(&mut s.clients, &job.id, 4).await.unwrap();
    let done = wait_job(&s.clients, &job.id, J::Succeeded).await;
    assert_eq!(count_in(&done, T::Succeeded), 4);
    // The re-added instances ran their own 800 ms, not the rest of the
    // killed runs' time.
    for i in 2..4 {
        let t = get_task(&mut s.clients, &job.id, i).await;
        let run = t.current.unwrap();
        assert_eq!(run.state(), T::Succeeded);
        assert!(
            run.finished_at_ms >= run.started_at_ms + 800,
            "instance {i} ran {} ms",
            run.finished_at_ms - run.started_at_ms
        );
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaled_jobs_with_overrides_hosts_and_partial_kills_survive_restarts() {
    let mut s = TestServer::start(2).await;
    create_reserved_pool(&mut s.clients, "/a").await;
    let mut spec = job_spec("/a", 6, 0.5, 10);
    spec.overrides.push(pb::InstanceOverride {
        instance: 5,
        spec: spec.default_task.clone(),
    });
    let job = create_job(&mut s.clients, spec).await;
    wait_job(&s.clients, &job.id, J::Succeeded).await;
    scale(&mut s.clients, &job.id, 3).await.unwrap();
    // A second job whose tasks are all killed one by one (not as a job).
    let other = create_job(&mut s.clients, job_spec("/a", 2, 0.5, 60_000)).await;
    wait_job_where(&s.clients, &other.id, "2 running", |j| {
        count_in(j, T::Running) == 2
    })
    .await;
    s.clients
        .tasks
        .kill(pb::KillTaskRequest {
            job_id: other.id.clone(),
            instances: vec![0, 1],
            job_version: 0,
        })
        .await
        .unwrap();
    wait_job(&s.clients, &other.id, J::Killed).await;
    let before = get_task(&mut s.clients, &job.id, 0).await;
    let host = before.current.as_ref().unwrap().host.clone();
    assert!(host.starts_with("sim-"));

    let mut s = s.restart().await;
    let after = get_task(&mut s.clients, &job.id, 0).await;
    assert_eq!(after.current.as_ref().unwrap().host, host, "host kept");
    let j = get_job(&mut s.clients, &job.id).await.unwrap();
    assert_eq!(j.spec.as_ref().unwrap().instance_count, 3);
    assert!(j.spec.as_ref().unwrap().overrides.is_empty());
    // Killed task by task, not as a job: its tasks may be restarted.
    s.clients
        .tasks
        .restart(pb::RestartTaskRequest {
            job_id: other.id.clone(),
            instances: vec![0],
            job_version: 0,
        })
        .await
        .expect("restart of a task killed on its own");
    wait_job_where(&s.clients, &other.id, "instance 0 running again", |j| {
        count_in(j, T::Running) == 1
    })
    .await;
    s.shutdown().await;
}

/// A pool holding an ended job is not deleted from under it (the job
/// could not be restarted or scaled again): refused, naming the count,
/// and nothing changes; with force the job goes with the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pool_with_ended_jobs_needs_force_and_deletes_them() {
    let mut s = TestServer::start(1).await;
    create_reserved_pool(&mut s.clients, "/gone").await;
    let job = create_job(&mut s.clients, job_spec("/gone", 1, 0.5, 10)).await;
    wait_job(&s.clients, &job.id, J::Succeeded).await;
    let delete = |force: bool| pb::DeletePoolRequest {
        path: "/gone".into(),
        version: 0,
        force,
    };
    let e = s.clients.pools.delete(delete(false)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("pool /gone holds 1 ended job(s)"),
        "{e:?}"
    );
    // Nothing changed: the job still scales.
    scale(&mut s.clients, &job.id, 2).await.expect("scale");
    wait_job(&s.clients, &job.id, J::Succeeded).await;
    s.clients.pools.delete(delete(true)).await.expect("forced");
    let e = get_job(&mut s.clients, &job.id).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_actions_check_and_bump_the_job_version() {
    let mut s = TestServer::start(1).await;
    create_reserved_pool(&mut s.clients, "/a").await;
    let job = create_job(&mut s.clients, job_spec("/a", 2, 0.5, 60_000)).await;
    assert_eq!(job.version, 1);
    wait_job_where(&s.clients, &job.id, "2 running", |j| {
        count_in(j, T::Running) == 2
    })
    .await;
    let e = s
        .clients
        .tasks
        .kill(pb::KillTaskRequest {
            job_id: job.id.clone(),
            instances: vec![0],
            job_version: 7,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let j = get_job(&mut s.clients, &job.id).await.unwrap();
    assert_eq!(
        (j.version, count_in(&j, T::Running)),
        (1, 2),
        "nothing changed"
    );
    s.clients
        .tasks
        .kill(pb::KillTaskRequest {
            job_id: job.id.clone(),
            instances: vec![0],
            job_version: 1,
        })
        .await
        .unwrap();
    let j = get_job(&mut s.clients, &job.id).await.unwrap();
    assert_eq!((j.version, count_in(&j, T::Killed)), (2, 1));
    s.shutdown().await;
}
