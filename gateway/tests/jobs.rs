//! JobService and TaskService over a real socket with simulated hosts: the
//! job and task lifecycle, restarts after failures, constraints, gangs,
//! kill, scale, restart, delete and run-time limits.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;
use tonic::Code;

async fn kill_job(c: &mut Clients, id: &str) -> pb::Job {
    c.jobs
        .kill(pb::KillJobRequest {
            id: id.into(),
            version: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("kill {id}: {e:?}"))
        .into_inner()
        .job
        .expect("job")
}

/// Host name of each task of `job_id` according to HostService.List.
async fn hosts_of_job(c: &mut Clients, job_id: &str) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for h in list_hosts(c).await {
        for t in &h.tasks {
            if t.job_id == job_id {
                out.entry(h.name.clone()).or_default().push(t.instance);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_placed_runs_and_succeeds() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let hosts = list_hosts(&mut c).await;
    let names: BTreeSet<String> = hosts.iter().map(|h| h.name.clone()).collect();

    let created = create_job(&mut c, job_spec("/a", 5, 1.0, 100)).await;
    assert_eq!(created.version, 1);
    assert!(!created.id.is_empty());
    let done = wait_job(&c, &created.id, J::Succeeded).await;
    assert_eq!(count_in(&done, T::Succeeded), 5);
    let status = done.status.expect("status");
    assert!(status.created_at_ms > 0);
    assert!(status.completed_at_ms >= status.created_at_ms);

    for i in 0..5 {
        let t = get_task(&mut c, &created.id, i).await;
        assert_eq!(t.job_id, created.id);
        assert_eq!(t.instance, i);
        let run = t.current.expect("current run");
        assert_eq!(run.state(), T::Succeeded, "instance {i}: {run:?}");
        assert_eq!(run.run_id, 1, "instance {i}");
        assert_eq!(run.exit_code, 0, "instance {i}");
        assert!(
            names.contains(&run.host),
            "instance {i} on unknown host {:?}",
            run.host
        );
        assert!(run.created_at_ms > 0, "instance {i}: {run:?}");
        assert!(
            run.created_at_ms <= run.placed_at_ms,
            "instance {i}: {run:?}"
        );
        assert!(
            run.placed_at_ms <= run.started_at_ms,
            "instance {i}: {run:?}"
        );
        assert!(
            run.finished_at_ms >= run.started_at_ms + 100,
            "instance {i} ran less than its 100 ms: {run:?}"
        );
        assert_eq!(t.failure_count, 0);
        assert!(t.history.is_empty(), "instance {i}: {:?}", t.history);
    }
    // Every host has its resources back and holds no task.
    let after = list_hosts(&mut c).await;
    for h in &after {
        assert_eq!(h.free, h.capacity, "host {} still holds resources", h.name);
        assert!(
            h.tasks.is_empty(),
            "host {} still lists {:?}",
            h.name,
            h.tasks
        );
    }
    let pool = get_pool(&mut c, "/a").await;
    let st = pool.status.expect("status");
    assert_eq!(st.allocation.expect("allocation").cpu, 0.0);
    assert_eq!(st.running_tasks, 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_task_is_retried_then_fails_the_job() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let mut spec = job_spec("/a", 1, 1.0, 20);
    let t = task_of(&mut spec);
    t.sim.as_mut().expect("sim").exit_code = 3;
    t.restart = Some(pb::RestartPolicy {
        max_failures: 2,
        backoff_ms: 10,
        max_backoff_ms: 0,
    });
    let job = create_job(&mut c, spec).await;
    let done = wait_job(&c, &job.id, J::Failed).await;
    assert_eq!(count_in(&done, T::Failed), 1);

    let t = get_task(&mut c, &job.id, 0).await;
    assert_eq!(t.failure_count, 3, "{t:?}");
    let run = t.current.clone().expect("current");
    assert_eq!(run.state(), T::Failed);
    assert_eq!(run.exit_code, 3);
    assert_eq!(run.run_id, 3);
    assert!(run.reason.contains("code 3"), "reason: {:?}", run.reason);
    assert_eq!(t.history.len(), 2, "history: {:#?}", t.history);
    // Newest first.
    let ids: Vec<u32> = t.history.iter().map(|r| r.run_id).collect();
    assert_eq!(ids, vec![2, 1]);
    for r in &t.history {
        assert_eq!(r.exit_code, 3, "{r:?}");
        assert!(!r.host.is_empty(), "{r:?}");
        assert!(r.finished_at_ms >= r.started_at_ms + 20, "{r:?}");
    }
    s.shutdown().await;
}

/// An ended run in the history should say how it ended (FAILED, with its
/// exit code), not the BACKOFF wait that followed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_how_each_failed_run_ended() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let mut spec = job_spec("/a", 1, 1.0, 10);
    let t = task_of(&mut spec);
    t.sim.as_mut().expect("sim").exit_code = 3;
    t.restart = Some(pb::RestartPolicy {
        max_failures: 1,
        backoff_ms: 10,
        max_backoff_ms: 0,
    });
    let job = create_job(&mut c, spec).await;
    wait_job(&c, &job.id, J::Failed).await;
    let t = get_task(&mut c, &job.id, 0).await;
    assert_eq!(t.history.len(), 1);
    assert_eq!(
        t.history[0].state(),
        T::Failed,
        "the earlier run is recorded as {:?}: {:?}",
        t.history[0].state(),
        t.history[0]
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_and_max_instances_per_host_are_respected() {
    // 8 hosts: zone z2 is sim-00001 and sim-00005.
    let s = TestServer::start(8).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let hosts = list_hosts(&mut c).await;
    let zone: BTreeMap<String, String> = hosts
        .iter()
        .map(|h| (h.name.clone(), h.attributes["zone"].clone()))
        .collect();
    let z2: Vec<&String> = zone
        .iter()
        .filter(|(_, z)| *z == "z2")
        .map(|(n, _)| n)
        .collect();
    assert_eq!(z2.len(), 2, "zones: {zone:?}");

    // Three instances, two z2 hosts, one per host: two run, one waits.
    let mut spec = job_spec("/a", 3, 1.0, 1000);
    let t = task_of(&mut spec);
    t.constraint = "zone == \"z2\"".into();
    t.max_instances_per_host = 1;
    let job = create_job(&mut c, spec).await;
    wait_job_where(&c, &job.id, "two instances running", |j| {
        count_in(j, T::Running) == 2
    })
    .await;
    let on = hosts_of_job(&mut c, &job.id).await;
    assert_eq!(on.len(), 2, "hosts of the job: {on:?}");
    for (host, instances) in &on {
        assert_eq!(zone[host], "z2", "{host} is not in z2: {on:?}");
        assert_eq!(instances.len(), 1, "{host} has two instances: {on:?}");
    }
    let tasks = list_tasks(&mut c, &job.id).await;
    let waiting: Vec<&pb::Task> = tasks
        .iter()
        .filter(|t| !matches!(task_state(t), T::Running | T::Succeeded))
        .collect();
    assert_eq!(waiting.len(), 1, "{tasks:#?}");
    let w = get_task(&mut c, &job.id, waiting[0].instance).await;
    assert!(
        w.current.as_ref().expect("run").host.is_empty(),
        "waiting task has a host: {w:?}"
    );

    let done = wait_job(&c, &job.id, J::Succeeded).await;
    assert_eq!(count_in(&done, T::Succeeded), 3);
    for t in list_tasks(&mut c, &job.id).await {
        let host = t.current.expect("run").host;
        assert_eq!(
            zone.get(&host).map(String::as_str),
            Some("z2"),
            "instance {} on {host:?}",
            t.instance
        );
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_waits_for_room_for_all_and_then_runs_together() {
    // One host of 16 cores.
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let blocker = create_job(&mut c, job_spec("/a", 1, 4.0, 600_000)).await;
    wait_job(&c, &blocker.id, J::Running).await;

    // Four of 4 cores: only three fit next to the blocker.
    let mut spec = job_spec("/a", 4, 4.0, 600_000);
    spec.sla = Some(pb::Sla {
        min_running_instances: 4,
        ..Default::default()
    });
    let gang = create_job(&mut c, spec).await;
    let mut cc = c.clone();
    let gang_id = gang.id.clone();
    let reason = eventually("the gang to have a pending reason", TIMEOUT, async || {
        let t = get_task(&mut cc, &gang_id, 0).await;
        if t.pending_reason.is_empty() || t.pending_reason.contains("next cycle decides") {
            Err(format!("{t:?}"))
        } else {
            Ok(t.pending_reason)
        }
    })
    .await;
    // Several cycles later nothing of the gang runs or holds a host.
    for _ in 0..10 {
        let j = get_job(&mut c, &gang.id).await.expect("gang");
        assert_eq!(job_state(&j), J::Pending, "{j:?}");
        for t in list_tasks(&mut c, &gang.id).await {
            let run = t.current.expect("run");
            assert!(
                !matches!(run.state(), T::Placed | T::Launching | T::Running),
                "gang member {} is {:?} with only room for 3 (reason was {reason:?})",
                t.instance,
                run.state()
            );
            assert!(
                run.host.is_empty(),
                "gang member {} on {}",
                t.instance,
                run.host
            );
        }
        assert!(hosts_of_job(&mut c, &gang.id).await.is_empty());
        for i in 0..4 {
            let t = get_task(&mut c, &gang.id, i).await;
            assert!(
                !t.pending_reason.is_empty(),
                "instance {i} has no pending reason: {t:?}"
            );
        }
        tokio::time::sleep(POLL).await;
    }

    kill_job(&mut c, &blocker.id).await;
    wait_job(&c, &blocker.id, J::Killed).await;
    wait_job_where(&c, &gang.id, "all four gang members running", |j| {
        count_in(j, T::Running) == 4
    })
    .await;
    let on = hosts_of_job(&mut c, &gang.id).await;
    assert_eq!(on.values().map(Vec::len).sum::<usize>(), 4, "{on:?}");
    kill_job(&mut c, &gang.id).await;
    wait_job(&c, &gang.id, J::Killed).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_every_task_and_frees_the_hosts() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    // More than fit (2 hosts of 16 cores): some run, some wait.
    let job = create_job(&mut c, job_spec("/a", 40, 1.0, 600_000)).await;
    wait_job(&c, &job.id, J::Running).await;
    let killed = kill_job(&mut c, &job.id).await;
    assert!(
        matches!(job_state(&killed), J::Killing | J::Killed),
        "{killed:?}"
    );
    let done = wait_job(&c, &job.id, J::Killed).await;
    assert_eq!(count_in(&done, T::Killed), 40, "{done:?}");
    for h in list_hosts(&mut c).await {
        assert_eq!(h.free, h.capacity, "host {} still holds resources", h.name);
    }
    // Killing again is harmless.
    let again = kill_job(&mut c, &job.id).await;
    assert_eq!(job_state(&again), J::Killed);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_and_down() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 2, 1.0, 600_000)).await;
    wait_job_where(&c, &job.id, "2 running", |j| count_in(j, T::Running) == 2).await;

    let up = c
        .jobs
        .scale(pb::ScaleJobRequest {
            id: job.id.clone(),
            instance_count: 5,
            version: 1,
        })
        .await
        .expect("scale up")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(up.spec.as_ref().expect("spec").instance_count, 5);
    assert_eq!(up.version, 2);
    wait_job_where(&c, &job.id, "5 running", |j| count_in(j, T::Running) == 5).await;
    assert_eq!(list_tasks(&mut c, &job.id).await.len(), 5);

    // Stale version, zero instances: refused, nothing changes.
    assert_status(
        c.jobs
            .scale(pb::ScaleJobRequest {
                id: job.id.clone(),
                instance_count: 1,
                version: 1,
            })
            .await,
        Code::FailedPrecondition,
        "version",
    );
    assert_status(
        c.jobs
            .scale(pb::ScaleJobRequest {
                id: job.id.clone(),
                instance_count: 0,
                version: 0,
            })
            .await,
        Code::InvalidArgument,
        "instance_count",
    );
    let j = get_job(&mut c, &job.id).await.expect("job");
    assert_eq!(j.version, 2);
    assert_eq!(j.spec.expect("spec").instance_count, 5);

    let down = c
        .jobs
        .scale(pb::ScaleJobRequest {
            id: job.id.clone(),
            instance_count: 1,
            version: 2,
        })
        .await
        .expect("scale down")
        .into_inner()
        .job
        .expect("job");
    assert_eq!(down.spec.as_ref().expect("spec").instance_count, 1);
    let tasks = list_tasks(&mut c, &job.id).await;
    assert_eq!(tasks.len(), 1, "{tasks:#?}");
    assert_eq!(tasks[0].instance, 0);
    assert_eq!(task_state(&tasks[0]), T::Running);
    let j = wait_job_where(&c, &job.id, "1 running", |j| count_in(j, T::Running) == 1).await;
    let total: u32 = j
        .status
        .expect("status")
        .task_counts
        .iter()
        .map(|c| c.count)
        .sum();
    assert_eq!(total, 1, "task counts after scale down");
    assert_status(
        c.tasks
            .get(pb::GetTaskRequest {
                job_id: job.id.clone(),
                instance: 3,
            })
            .await,
        Code::NotFound,
        "instance 3",
    );
    let on = hosts_of_job(&mut c, &job.id).await;
    assert_eq!(on.values().map(Vec::len).sum::<usize>(), 1, "{on:?}");
    let pool = get_pool(&mut c, "/a").await;
    assert_eq!(
        pool.status.expect("status").allocation.expect("alloc").cpu,
        1.0
    );
    kill_job(&mut c, &job.id).await;
    wait_job(&c, &job.id, J::Killed).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_runs_every_task_again() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 3, 1.0, 50)).await;
    wait_job(&c, &job.id, J::Succeeded).await;
    let r = c
        .jobs
        .restart(pb::RestartJobRequest {
            id: job.id.clone(),
            version: 0,
        })
        .await
        .expect("restart")
        .into_inner()
        .job
        .expect("job");
    assert!(
        !matches!(job_state(&r), J::Succeeded | J::Failed | J::Killed),
        "restarted job is still terminal: {r:?}"
    );
    wait_job_where(
        &c,
        &job.id,
        "every task on its second run and succeeded",
        |j| job_state(j) == J::Succeeded,
    )
    .await;
    for t in list_tasks(&mut c, &job.id).await {
        let run = t.current.clone().expect("run");
        assert_eq!(run.run_id, 2, "instance {}: {t:?}", t.instance);
        assert_eq!(run.state(), T::Succeeded);
        assert_eq!(t.history.len(), 1, "{t:?}");
        assert_eq!(t.history[0].run_id, 1);
        assert_eq!(t.history[0].state(), T::Succeeded);
    }

    // A killed job can be restarted too.
    let long = create_job(&mut c, job_spec("/a", 2, 1.0, 600_000)).await;
    wait_job(&c, &long.id, J::Running).await;
    kill_job(&mut c, &long.id).await;
    wait_job(&c, &long.id, J::Killed).await;
    c.jobs
        .restart(pb::RestartJobRequest {
            id: long.id.clone(),
            version: 0,
        })
        .await
        .expect("restart a killed job");
    wait_job_where(&c, &long.id, "both running again", |j| {
        count_in(j, T::Running) == 2 && job_state(j) == J::Running
    })
    .await;
    kill_job(&mut c, &long.id).await;
    wait_job(&c, &long.id, J::Killed).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_only_when_terminal() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 2, 1.0, 600_000)).await;
    wait_job(&c, &job.id, J::Running).await;
    assert_status(
        c.jobs
            .delete(pb::DeleteJobRequest {
                id: job.id.clone(),
                version: 0,
            })
            .await,
        Code::FailedPrecondition,
        &job.id,
    );
    get_job(&mut c, &job.id).await.expect("still there");
    kill_job(&mut c, &job.id).await;
    let killed = wait_job(&c, &job.id, J::Killed).await;
    assert_status(
        c.jobs
            .delete(pb::DeleteJobRequest {
                id: job.id.clone(),
                version: killed.version + 5,
            })
            .await,
        Code::FailedPrecondition,
        "version",
    );
    c.jobs
        .delete(pb::DeleteJobRequest {
            id: job.id.clone(),
            version: killed.version,
        })
        .await
        .expect("delete a killed job");
    assert_status(get_job(&mut c, &job.id).await, Code::NotFound, &job.id);
    assert_status(
        c.tasks
            .list(pb::ListTasksRequest {
                job_id: job.id.clone(),
                ..Default::default()
            })
            .await,
        Code::NotFound,
        &job.id,
    );
    assert_status(
        c.jobs
            .delete(pb::DeleteJobRequest {
                id: job.id.clone(),
                version: 0,
            })
            .await,
        Code::NotFound,
        &job.id,
    );
    let q = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert!(q.jobs.is_empty(), "{q:?}");
    // And it stays deleted across a restart.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_status(get_job(&mut c, &job.id).await, Code::NotFound, &job.id);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_running_time_kills_a_long_task() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let mut spec = job_spec("/a", 1, 1.0, 600_000);
    spec.sla = Some(pb::Sla {
        max_running_time_ms: 200,
        ..Default::default()
    });
    let job = create_job(&mut c, spec).await;
    wait_job(&c, &job.id, J::Failed).await;
    let t = get_task(&mut c, &job.id, 0).await;
    let run = t.current.expect("run");
    assert_eq!(run.state(), T::Failed);
    assert!(
        run.reason.contains("max_running_time_ms"),
        "reason: {:?}",
        run.reason
    );
    assert!(run.finished_at_ms >= run.started_at_ms + 200, "{run:?}");
    assert!(
        run.finished_at_ms < run.started_at_ms + 600_000,
        "not killed early: {run:?}"
    );
    for h in list_hosts(&mut c).await {
        assert_eq!(h.free, h.capacity, "host {} still holds resources", h.name);
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplaced_task_carries_the_placers_per_check_host_counts() {
    // Three hosts of 16 cores in zones z1, z2, z3. Two tasks of 10 cores
    // that only z1 may take: one runs there, the other finds no host — two
    // hosts fail the constraint, z1 has too little cpu left.
    let s = TestServer::start(3).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/place", pool_spec(24.0, 4096.0)).await;
    let mut spec = job_spec("/place", 2, 10.0, 600_000);
    task_of(&mut spec).constraint = "zone == \"z1\"".into();
    let job = create_job(&mut c, spec).await;
    let mut cc = c.clone();
    let id = job.id.clone();
    let (placed, unplaced) = eventually("one placed, one with checks", TIMEOUT, async || {
        let a = get_task(&mut cc, &id, 0).await;
        let b = get_task(&mut cc, &id, 1).await;
        let (placed, unplaced) = if a.pending_checks.is_empty() {
            (a, b)
        } else {
            (b, a)
        };
        if unplaced.pending_checks.is_empty() || placed.current.as_ref().unwrap().host.is_empty() {
            return Err(format!("{placed:?} {unplaced:?}"));
        }
        Ok((placed, unplaced))
    })
    .await;
    assert!(matches!(task_state(&unplaced), T::Ready | T::Placing));
    assert_eq!(unplaced.pending_hosts, 3, "{unplaced:?}");
    assert_eq!(unplaced.pending_gang_size, 0);
    let checks: Vec<(pb::PlacementCheck, &str, u32, &str)> = unplaced
        .pending_checks
        .iter()
        .map(|k| {
            (
                k.check(),
                k.dimension.as_str(),
                k.hosts,
                k.description.as_str(),
            )
        })
        .collect();
    assert_eq!(
        checks,
        [
            (
                pb::PlacementCheck::Constraint,
                "",
                2,
                // (The server adds the host pool to a job's constraint.)
                "constraint (zone==z1 && peloton.host_pool==default) not met"
            ),
            (
                pb::PlacementCheck::Insufficient,
                "cpu",
                1,
                "insufficient cpu"
            ),
        ],
        "{unplaced:?}"
    );
    // The sentence says the same.
    assert!(
        unplaced.pending_reason.contains("0/3 hosts: 2 constraint"),
        "{}",
        unplaced.pending_reason
    );
    assert!(
        unplaced.pending_reason.contains("1 insufficient cpu"),
        "{}",
        unplaced.pending_reason
    );
    // A placed task has none, and lists carry none.
    assert!(placed.pending_checks.is_empty() && placed.pending_hosts == 0);
    for t in list_tasks(&mut c, &job.id).await {
        assert!(t.pending_checks.is_empty() && t.pending_hosts == 0, "{t:?}");
    }
    s.shutdown().await;
}

/// A batch job whose instance 0 is its controller task (Peloton's): when it
/// ends, the other instances, still running, are stopped, and the job ends
/// as the controller did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_task_ends_its_job_as_it_ends_and_stops_the_others() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    // Workers that would run ten minutes; a controller of 200 ms that ends
    // with `exit_code`.
    let with_controller = |exit_code: i32| {
        let mut spec = job_spec("/a", 3, 1.0, 600_000);
        let mut controller = spec.default_task.clone().expect("default task");
        controller.controller = true;
        controller.sim = Some(pb::SimSpec {
            duration_ms: 200,
            exit_code,
        });
        spec.overrides.push(pb::InstanceOverride {
            instance: 0,
            spec: Some(controller),
        });
        spec
    };
    for (exit_code, job_state, controller_state) in
        [(0, J::Succeeded, T::Succeeded), (3, J::Failed, T::Failed)]
    {
        let job = create_job(&mut c, with_controller(exit_code)).await;
        let done = wait_job(&c, &job.id, job_state).await;
        assert_eq!(count_in(&done, T::Killed), 2, "{done:?}");
        let run = get_task(&mut c, &job.id, 0).await.current.expect("run");
        assert_eq!(run.state(), controller_state, "{run:?}");
        for i in 1..3 {
            let run = get_task(&mut c, &job.id, i).await.current.expect("run");
            assert_eq!(run.state(), T::Killed, "instance {i}: {run:?}");
            assert!(
                run.reason.contains("controller task (instance 0)"),
                "instance {i}: {run:?}"
            );
        }
    }
    // Only instance 0 may be one.
    let mut spec = with_controller(0);
    spec.overrides[0].instance = 1;
    assert_status(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await,
        Code::InvalidArgument,
        "spec.overrides[0].spec.controller: only instance 0 may be a controller task",
    );
    for h in list_hosts(&mut c).await {
        assert_eq!(h.free, h.capacity, "host {} still holds resources", h.name);
    }
    s.shutdown().await;
}

/// Simulated hosts report synthetic usage (a share of each run's request)
/// every 10 s, as agents do: tasks, their job and their hosts show it, at
/// most what was requested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_hosts_report_what_their_runs_use() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 2, 1.0, 600_000)).await;
    // Two reports give a CPU rate: within two intervals and a bit.
    let used = eventually("the tasks' usage", Duration::from_secs(40), async || {
        let mut c = s.clients.clone();
        let mut out = Vec::new();
        for i in 0..2 {
            let t = get_task(&mut c, &job.id, i).await;
            let u = t
                .current
                .and_then(|r| r.used)
                .ok_or(format!("no usage of {i} yet"))?;
            if u.cpu == 0.0 {
                return Err(format!("no rate for {i} yet: {u:?}"));
            }
            out.push(u);
        }
        Ok(out)
    })
    .await;
    for u in &used {
        assert!(u.cpu > 0.0 && u.cpu <= 1.0, "{u:?}");
        assert!(u.memory_mb > 0.0 && u.memory_mb <= 256.0, "{u:?}");
    }
    let total: f64 = used.iter().map(|u| u.memory_mb).sum();
    let job_used = get_job(&mut c, &job.id)
        .await
        .expect("job")
        .status
        .and_then(|s| s.used)
        .expect("the job's usage");
    assert_eq!(job_used.memory_mb, total, "{job_used:?}");
    let hosts_memory: f64 = list_hosts(&mut c)
        .await
        .iter()
        .filter_map(|h| h.used.map(|u| u.memory_mb))
        .sum();
    assert_eq!(hosts_memory, total);
    // A pool's use is its subtree's: /a's and the root's; pool rows carry
    // none (measured usage is never stored), lists and gets do.
    for path in ["/a", "/"] {
        let pool = c
            .pools
            .get(pb::GetPoolRequest { path: path.into() })
            .await
            .expect("pool")
            .into_inner()
            .pool
            .expect("pool");
        let used = pool.status.and_then(|s| s.used).expect("the pool's usage");
        assert_eq!(used.memory_mb, total, "{path}: {used:?}");
    }
    let listed = c
        .pools
        .list(pb::ListPoolsRequest::default())
        .await
        .expect("pools")
        .into_inner()
        .pools;
    let used: Vec<(String, Option<f64>)> = listed
        .iter()
        .map(|p| {
            (
                p.path.clone(),
                p.status.and_then(|s| s.used).map(|u| u.memory_mb),
            )
        })
        .collect();
    assert!(
        used.iter()
            .all(|(path, u)| *u == Some(total) || (path != "/" && path != "/a")),
        "{used:?}"
    );
    assert!(used.iter().any(|(path, _)| path == "/a"), "{used:?}");
}

/// A waiting task is told when and where it would start: the running
/// job's tasks end at their running-time limit, the waiting one starts
/// when the first of them frees its host, and `JobService.Get` says the
/// same for the job. A started task has no forecast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_task_is_told_when_and_where_it_would_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = peloton_gateway::config::Config {
        forecast_interval_ms: 100,
        ..config(dir.path(), 1)
    };
    let server = peloton_gateway::server::start(&config)
        .await
        .expect("starts");
    let mut c = Clients::connect(server.addr).await;
    create_reserved_pool(&mut c, "/f").await;
    let cores = cluster_capacity(&mut c).await.cpu as u32;
    // Fills the one host; each runs at most 10 minutes (and would run 20).
    let mut full = job_spec("/f", cores, 1.0, 1_200_000);
    full.sla = Some(pb::Sla {
        max_running_time_ms: 600_000,
        ..Default::default()
    });
    let full = create_job(&mut c, full).await;
    wait_job(&c, &full.id, J::Running).await;
    let first_end = list_tasks(&mut c, &full.id)
        .await
        .iter()
        .map(|t| t.current.as_ref().expect("run").placed_at_ms + 600_000)
        .min()
        .expect("tasks");
    let waiting = create_job(&mut c, job_spec("/f", 1, 1.0, 1_000)).await;
    let f = eventually(
        "a forecast of the waiting task",
        Duration::from_secs(20),
        async || {
            get_task(&mut c, &waiting.id, 0)
                .await
                .forecast
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await;
    assert_eq!(f.start_ms, first_end, "{f:?}");
    assert_eq!(f.queue_position, 1, "{f:?}");
    assert_eq!(f.host, list_hosts(&mut c).await[0].name);
    assert!(f.made_at_ms > 0 && f.made_at_ms < f.start_ms, "{f:?}");
    let job = get_job(&mut c, &waiting.id).await.expect("job");
    let jf = job
        .status
        .and_then(|s| s.forecast)
        .expect("the job's forecast");
    assert_eq!(
        (
            jf.start_ms,
            jf.earliest_ms,
            jf.queue_position,
            jf.host.as_str()
        ),
        (f.start_ms, f.earliest_ms, 1, ""),
        "{jf:?}"
    );
    // Queries carry it too; the running job's tasks have none.
    let queried = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    let q = queried
        .jobs
        .iter()
        .find(|j| j.id == waiting.id)
        .expect("listed");
    let qf = q
        .status
        .as_ref()
        .and_then(|s| s.forecast.clone())
        .expect("forecast");
    assert_eq!(
        (qf.start_ms, qf.earliest_ms, qf.queue_position),
        (jf.start_ms, jf.earliest_ms, jf.queue_position)
    );
    assert!(get_task(&mut c, &full.id, 0).await.forecast.is_none());
    within("graceful shutdown", server.shutdown())
        .await
        .expect("graceful shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_read_shows_its_runtime_estimate_declared_or_learned_across_a_restart() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let estimate = |t: &pb::Task| (t.expected_runtime_ms, t.expected_runtime_source.clone());

    // Declared, per instance; the job's spec reads back with it.
    let mut spec = job_spec("/a", 2, 0.5, 60_000);
    task_of(&mut spec).expected_runtime_ms = 90_000;
    let mut first = task_of(&mut spec).clone();
    first.expected_runtime_ms = 30_000;
    spec.overrides.push(pb::InstanceOverride {
        instance: 0,
        spec: Some(first),
    });
    let declared = create_job(&mut c, spec).await;
    let read = get_job(&mut c, &declared.id).await.expect("job");
    let read_spec = read.spec.expect("spec");
    assert_eq!(
        read_spec.default_task.expect("task").expected_runtime_ms,
        90_000
    );
    assert_eq!(
        read_spec.overrides[0]
            .spec
            .as_ref()
            .expect("override")
            .expected_runtime_ms,
        30_000
    );
    let t = get_task(&mut c, &declared.id, 0).await;
    assert_eq!(estimate(&t), (30_000, "declared".into()));
    let t = get_task(&mut c, &declared.id, 1).await;
    assert_eq!(estimate(&t), (90_000, "declared".into()));

    // Learned from three succeeded runs of the same owner's command.
    let mut waiting = job_spec("/a", 1, 0.5, 600_000);
    task_of(&mut waiting).command = "/bin/work".into();
    let waiting = create_job(&mut c, waiting).await;
    assert_eq!(
        estimate(&get_task(&mut c, &waiting.id, 0).await),
        (0, String::new())
    );
    let mut runs = job_spec("/a", 3, 0.5, 100);
    task_of(&mut runs).command = "/bin/work".into();
    let runs = create_job(&mut c, runs).await;
    wait_job(&c, &runs.id, J::Succeeded).await;
    let (ms, source) = estimate(&get_task(&mut c, &waiting.id, 0).await);
    assert_eq!(source, "learned from 3 runs");
    assert!((100..60_000).contains(&ms), "{ms} ms");

    // The store's usage records carry the command's key: learned again.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_eq!(
        estimate(&get_task(&mut c, &waiting.id, 0).await),
        (ms, "learned from 3 runs".into())
    );
    s.shutdown().await;
}

/// `JobService.Plan` says where and when a job would start, changing
/// nothing; the same spec then submitted on the unchanged cluster starts
/// there and then (give or take the launch's milliseconds). A spec that
/// would be refused is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_says_where_and_when_and_changes_nothing() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/p").await;
    let cores = cluster_capacity(&mut c).await.cpu as u32;
    // Fills both hosts for 4 s, and says so.
    let mut full = job_spec("/p", cores, 1.0, 4_000);
    task_of(&mut full).expected_runtime_ms = 4_000;
    let full = create_job(&mut c, full).await;
    wait_job(&c, &full.id, J::Running).await;
    let placed = list_tasks(&mut c, &full.id)
        .await
        .iter()
        .map(|t| t.current.as_ref().expect("run").placed_at_ms)
        .max()
        .expect("tasks");
    // A gang taking both hosts whole.
    let mut gang = job_spec("/p", 2, f64::from(cores / 2), 1_000);
    gang.sla = Some(pb::Sla {
        min_running_instances: 2,
        ..Default::default()
    });
    let pool_before = get_pool(&mut c, "/p").await;
    let plan = c
        .jobs
        .plan(pb::PlanJobRequest {
            spec: Some(gang.clone()),
        })
        .await
        .expect("planned")
        .into_inner();
    assert_eq!(plan.forecast_stopped, "all started", "{plan:?}");
    assert_eq!(plan.start_ms, placed + 4_000, "{plan:?}");
    let mut planned: Vec<String> = plan.instances.iter().map(|x| x.host.clone()).collect();
    planned.sort();
    let mut hosts: Vec<String> = list_hosts(&mut c)
        .await
        .into_iter()
        .map(|h| h.name)
        .collect();
    hosts.sort();
    assert_eq!(planned, hosts, "{plan:?}");
    // Nothing changed.
    let jobs = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert_eq!(jobs.jobs.len(), 1);
    assert_eq!(get_pool(&mut c, "/p").await.status, pool_before.status);
    // Refused as Create would refuse it, naming the field.
    let mut huge = gang.clone();
    task_of(&mut huge).resources = Some(res(f64::from(cores) * 4.0, 256.0));
    let refused = c
        .jobs
        .plan(pb::PlanJobRequest { spec: Some(huge) })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("resources"), "{refused:?}");
    // Submitted now, it starts as planned.
    let job = create_job(&mut c, gang).await;
    wait_job(&c, &job.id, J::Running).await;
    let tasks = list_tasks(&mut c, &job.id).await;
    let mut got: Vec<String> = tasks
        .iter()
        .map(|t| t.current.as_ref().expect("run").host.clone())
        .collect();
    got.sort();
    assert_eq!(got, planned);
    for t in &tasks {
        let at = t.current.as_ref().expect("run").placed_at_ms;
        assert!(
            at + 100 >= plan.start_ms && at <= plan.start_ms + 1_500,
            "placed at {at}, planned for {}",
            plan.start_ms
        );
    }
    s.shutdown().await;
}

/// A plan for a job of a pool claiming its reservation on a cluster full
/// of another pool's preemptible work says whom it would preempt (job,
/// instance, pool, host, priority, when), changing nothing; the same spec
/// then submitted on the unchanged cluster preempts those very tasks and
/// starts at once. On the empty cluster, the same plan preempts none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_says_whom_the_job_would_preempt_and_it_then_does() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    let total = cluster_capacity(&mut c).await;
    create_pool(&mut c, "/prod", pool_spec(total.cpu, total.memory_mb)).await;
    create_pool(&mut c, "/batch", pool_spec(0.0, 0.0)).await;
    let n_batch = total.cpu as u32;
    let n_prod = n_batch / 2;
    let mut prod = job_spec("/prod", n_prod, 1.0, 600_000);
    prod.sla = Some(pb::Sla {
        priority: 10,
        ..Default::default()
    });
    let plan_of = |c: &Clients, spec: &pb::JobSpec| {
        let mut c = c.clone();
        let spec = spec.clone();
        async move {
            c.jobs
                .plan(pb::PlanJobRequest { spec: Some(spec) })
                .await
                .expect("planned")
                .into_inner()
        }
    };
    // On the empty cluster it needs no room: it preempts none.
    let plan = plan_of(&c, &prod).await;
    assert!(plan.victims.is_empty(), "{plan:#?}");
    assert_eq!(plan.start_ms, plan.made_at_ms, "{plan:#?}");

    let mut batch = job_spec("/batch", n_batch, 1.0, 600_000);
    batch.sla = Some(pb::Sla {
        priority: 1,
        preemptible: true,
        ..Default::default()
    });
    task_of(&mut batch).expected_runtime_ms = 600_000;
    let batch = create_job(&mut c, batch).await;
    wait_job_where(&c, &batch.id, "batch to fill the cluster", |j| {
        count_in(j, T::Running) == n_batch
    })
    .await;
    let hosts_of_batch: BTreeMap<u32, String> = list_tasks(&mut c, &batch.id)
        .await
        .iter()
        .map(|t| (t.instance, t.current.as_ref().expect("run").host.clone()))
        .collect();

    let plan = plan_of(&c, &prod).await;
    assert_eq!(plan.victims.len(), n_prod as usize, "{plan:#?}");
    for v in &plan.victims {
        assert_eq!(
            (v.job_id.as_str(), v.pool.as_str(), v.priority, v.at_ms),
            (batch.id.as_str(), "/batch", 1, plan.made_at_ms),
            "{v:?}"
        );
        assert_eq!(v.host, hosts_of_batch[&v.instance], "{v:?}");
        assert!(v.reason.contains("over its entitlement"), "{v:?}");
    }
    assert_eq!(plan.start_ms, plan.made_at_ms, "{plan:#?}");
    // Nothing changed.
    let b = get_job(&mut c, &batch.id).await.expect("batch");
    assert_eq!(count_in(&b, T::Running), n_batch);
    let jobs = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert_eq!(jobs.jobs.len(), 1);

    // Submitted now, it preempts those tasks.
    let mut watch = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: 0,
            job_id: batch.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    let prod = create_job(&mut c, prod).await;
    let events = collect_events(&mut watch, |e| {
        e.iter()
            .filter(
                |e| matches!(&e.kind, Some(pb::event::Kind::Task(t)) if t.state() == T::Preempted),
            )
            .count()
            >= n_prod as usize
    })
    .await;
    let preempted: BTreeSet<u32> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::Task(t)) if t.state() == T::Preempted => Some(t.instance),
            _ => None,
        })
        .collect();
    let planned: BTreeSet<u32> = plan.victims.iter().map(|v| v.instance).collect();
    assert_eq!(preempted, planned);
    wait_job_where(&c, &prod.id, "every prod task running", |j| {
        count_in(j, T::Running) == n_prod
    })
    .await;
    s.shutdown().await;
}

/// Reservations with backfill, seen from outside: a gang of two whole
/// hosts waits for one that is busy; its hosts are held for it (host
/// list, the gang's pending reason), a short job submitted after it runs
/// first on the free host, a long one waits behind it, and the gang starts
/// when the busy host frees up.
#[tokio::test]
async fn a_waiting_gang_holds_its_hosts_and_short_work_runs_before_it() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/r").await;
    let per_host = cluster_capacity(&mut c).await.cpu / 2.0;
    // One host busy for 4 s, and it says so.
    let mut busy = job_spec("/r", 1, per_host, 4_000);
    task_of(&mut busy).expected_runtime_ms = 4_000;
    let busy = create_job(&mut c, busy).await;
    wait_job(&c, &busy.id, J::Running).await;
    // The gang needs both hosts whole.
    let mut gang = job_spec("/r", 2, per_host, 1_000);
    gang.sla = Some(pb::Sla {
        min_running_instances: 2,
        ..Default::default()
    });
    task_of(&mut gang).expected_runtime_ms = 1_000;
    let gang = create_job(&mut c, gang).await;
    // Behind it: a job that ends well before the busy host frees up, and
    // one that would run past that (it waits).
    let mut short = job_spec("/r", 1, 1.0, 300);
    task_of(&mut short).expected_runtime_ms = 1_000;
    let short = create_job(&mut c, short).await;
    let mut long = job_spec("/r", 1, 1.0, 1_000);
    task_of(&mut long).expected_runtime_ms = 60_000;
    let long = create_job(&mut c, long).await;
    wait_job(&c, &short.id, J::Succeeded).await;
    let held = list_hosts(&mut c).await;
    assert!(
        held.iter().all(|h| h.reserved_for.iter().any(|r| r
            .head
            .as_ref()
            .is_some_and(|t| t.job_id == gang.id)
            && r.tasks == 2)),
        "{held:?}"
    );
    let reason = get_task(&mut c, &gang.id, 0).await.pending_reason;
    assert!(reason.contains("host(s) are reserved for it"), "{reason}");
    assert_eq!(
        task_state(&get_task(&mut c, &long.id, 0).await),
        pb::TaskState::Pending
    );
    // The busy host frees up: the gang starts, then the long job.
    wait_job(&c, &gang.id, J::Succeeded).await;
    wait_job(&c, &long.id, J::Running).await;
    s.shutdown().await;
}

/// With `backfill_reservations: 0` queues keep strict order: nothing is
/// reserved, and a short job waits behind a gang that cannot start yet
/// (with reservations it would run first: see the test above).
#[tokio::test]
async fn without_reservations_the_queue_keeps_strict_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = peloton_gateway::config::Config {
        backfill_reservations: 0,
        ..config(dir.path(), 2)
    };
    let server = peloton_gateway::server::start(&config)
        .await
        .expect("starts");
    let mut c = Clients::connect(server.addr).await;
    create_reserved_pool(&mut c, "/s").await;
    let per_host = cluster_capacity(&mut c).await.cpu / 2.0;
    let mut busy = job_spec("/s", 1, per_host, 3_000);
    task_of(&mut busy).expected_runtime_ms = 3_000;
    let busy = create_job(&mut c, busy).await;
    wait_job(&c, &busy.id, J::Running).await;
    let mut gang = job_spec("/s", 2, per_host, 500);
    gang.sla = Some(pb::Sla {
        min_running_instances: 2,
        ..Default::default()
    });
    let gang = create_job(&mut c, gang).await;
    let mut short = job_spec("/s", 1, 1.0, 300);
    task_of(&mut short).expected_runtime_ms = 1_000;
    let short = create_job(&mut c, short).await;
    // A cycle passes with the short job queued and not admitted.
    let reason = eventually(
        "the short job waiting behind the gang",
        Duration::from_secs(20),
        async || {
            let t = get_task(&mut c, &short.id, 0).await;
            if t.pending_reason.contains("waits behind the head") {
                Ok(t.pending_reason)
            } else {
                Err(format!("{:?}: {}", task_state(&t), t.pending_reason))
            }
        },
    )
    .await;
    assert!(reason.contains("not admitted yet"), "{reason}");
    assert!(
        list_hosts(&mut c)
            .await
            .iter()
            .all(|h| h.reserved_for.is_empty())
    );
    let gang_reason = get_task(&mut c, &gang.id, 0).await.pending_reason;
    assert!(!gang_reason.contains("reserved"), "{gang_reason}");
    wait_job(&c, &gang.id, J::Succeeded).await;
    wait_job(&c, &short.id, J::Succeeded).await;
    within("graceful shutdown", server.shutdown())
        .await
        .expect("shuts down");
}

/// The shortest start of `id` that no other id of `ids` shares.
fn unique_prefix<'a>(id: &'a str, ids: &[String]) -> &'a str {
    (1..=id.len())
        .map(|n| &id[..n])
        .find(|p| ids.iter().filter(|o| o.starts_with(p)).count() == 1)
        .expect("ids differ")
}

/// A unique start of a job's id names the job in every call that takes a
/// job id (as git and docker take them): reads, task calls and actions.
/// A start that several ids share is refused, naming the field, the jobs
/// and that more is needed; one that no id has is NOT_FOUND, as any
/// unknown id; the full id still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_start_of_a_job_id_names_the_job() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    // 17 jobs: two of them share a first character.
    let mut ids = Vec::new();
    for _ in 0..17 {
        ids.push(create_job(&mut c, job_spec("/a", 1, 0.1, 600_000)).await.id);
    }
    for id in &ids {
        let p = unique_prefix(id, &ids);
        assert!(p.len() < id.len(), "{id}");
        let job = get_job(&mut c, p)
            .await
            .unwrap_or_else(|e| panic!("get {p}: {e:?}"));
        assert_eq!(&job.id, id);
        assert_eq!(get_job(&mut c, id).await.expect("full id").id, *id);
    }
    let first = &ids[0];
    let p = unique_prefix(first, &ids).to_string();
    // Task calls and actions take it too.
    let tasks = list_tasks(&mut c, &p).await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].job_id, *first);
    assert_eq!(get_task(&mut c, &p, 0).await.job_id, *first);
    let killed = kill_job(&mut c, &p).await;
    assert_eq!(killed.id, *first);
    wait_job(&c, first, J::Killed).await;
    // The accounts of its ended runs, asked by the same start.
    let usage = c
        .jobs
        .list_usage(pb::ListUsageRequest {
            job_id: p.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("usage of {p}: {e:?}"))
        .into_inner();
    assert!(
        usage.records.iter().all(|r| r.job_id == *first),
        "{usage:?}"
    );

    // A shared start is refused, naming the field and what matched.
    let shared = ids
        .iter()
        .map(|id| &id[..1])
        .find(|p| ids.iter().filter(|o| o.starts_with(p)).count() > 1)
        .expect("17 ids, 16 first characters");
    let e = get_job(&mut c, shared).await.expect_err("ambiguous");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("id: "), "{e:?}");
    assert!(e.message().contains("give more of it"), "{e:?}");
    let matching: Vec<&String> = ids.iter().filter(|o| o.starts_with(shared)).collect();
    assert!(
        matching.iter().any(|id| e.message().contains(id.as_str())),
        "{e:?}"
    );
    let e = c
        .tasks
        .list(pb::ListTasksRequest {
            job_id: shared.into(),
            ..Default::default()
        })
        .await
        .expect_err("ambiguous");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("job_id: "), "{e:?}");
    // Nothing changed: every job but the killed one still runs.
    for id in &ids[1..] {
        assert_ne!(
            job_state(&get_job(&mut c, id).await.expect("job")),
            J::Killed
        );
    }

    // No id starts so: not found, as an unknown id.
    let none = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f",
    ]
    .into_iter()
    .flat_map(|a| ["0", "f"].map(move |b| format!("{a}{b}")))
    .find(|p| !ids.iter().any(|id| id.starts_with(p.as_str())))
    .expect("17 ids cannot start 32 ways");
    let e = get_job(&mut c, &none).await.expect_err("no such job");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    s.shutdown().await;
}

/// A job's name names it in place of its id (NAME, or POOL/NAME) in every
/// call that takes a job id: of several jobs of that name, the one that
/// has not ended; several unfinished ones, or several ended ones and none
/// unfinished, are refused naming the field and each candidate. A name
/// ended jobs carry is free for a new job. Names name jobs after a restart
/// of the server (they are the stored spec's); a name with a '/' is
/// refused, naming spec.name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_named_by_its_name_in_place_of_its_id() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    for pool in ["/a", "/b"] {
        create_pool(&mut c, pool, pool_spec(2.0, 2048.0)).await;
    }
    let named = |pool: &str, name: &str, duration_ms: u64| {
        let mut spec = job_spec(pool, 1, 0.1, duration_ms);
        spec.name = name.into();
        spec
    };
    let train_a = create_job(&mut c, named("/a", "train", 600_000)).await;
    let train_b = create_job(&mut c, named("/b", "train", 600_000)).await;
    let eval = create_job(&mut c, named("/a", "eval", 100)).await;

    // One job of that name: the name names it, also once it has ended.
    assert_eq!(get_job(&mut c, "eval").await.expect("eval").id, eval.id);
    wait_job(&c, "eval", J::Succeeded).await;
    assert_eq!(get_job(&mut c, "eval").await.expect("eval").id, eval.id);

    // Two unfinished jobs of that name in two pools: refused, naming both
    // and the way out; POOL/NAME names each.
    let e = get_job(&mut c, "train").await.expect_err("ambiguous");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .starts_with("id: 2 unfinished jobs are named \"train\""),
        "{e:?}"
    );
    for id in [&train_a.id, &train_b.id] {
        assert!(e.message().contains(id.as_str()), "{e:?}");
    }
    assert!(e.message().contains("POOL/NAME"), "{e:?}");
    assert_eq!(get_job(&mut c, "/a/train").await.expect("a").id, train_a.id);
    assert_eq!(get_job(&mut c, "/b/train").await.expect("b").id, train_b.id);
    assert_eq!(get_task(&mut c, "/b/train", 0).await.job_id, train_b.id);
    let tasks = list_tasks(&mut c, "/a/train").await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].job_id, train_a.id);
    // A name no job has, and a pool that has no job of it: not found.
    assert_status(get_job(&mut c, "nothing").await, Code::NotFound, "nothing");
    assert_status(get_job(&mut c, "/b/eval").await, Code::NotFound, "/b/eval");

    // Killed by its name; then the other train is the only unfinished one.
    assert_eq!(kill_job(&mut c, "/a/train").await.id, train_a.id);
    wait_job(&c, &train_a.id, J::Killed).await;
    assert_eq!(get_job(&mut c, "train").await.expect("b").id, train_b.id);
    // The ended job's name is free: a new train in /a, and /a/train names
    // it (the unfinished one), not the killed one.
    let again = create_job(&mut c, named("/a", "train", 600_000)).await;
    assert_eq!(
        get_job(&mut c, "/a/train").await.expect("again").id,
        again.id
    );

    // Two ended jobs of one name and none unfinished: refused.
    let eval2 = create_job(&mut c, named("/a", "eval", 100)).await;
    wait_job(&c, &eval2.id, J::Succeeded).await;
    let e = get_job(&mut c, "eval").await.expect_err("two ended");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("2 ended jobs are named"), "{e:?}");
    assert!(
        e.message().contains(eval.id.as_str()) && e.message().contains(eval2.id.as_str()),
        "{e:?}"
    );

    // After a restart the names still name the jobs.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_eq!(
        get_job(&mut c, "/a/train").await.expect("again").id,
        again.id
    );
    assert_eq!(get_job(&mut c, "/b/train").await.expect("b").id, train_b.id);
    assert_status(
        get_job(&mut c, "train").await,
        Code::InvalidArgument,
        "2 unfinished jobs",
    );

    // A name that could not name the job is refused, and creates nothing.
    let before = list_tasks(&mut c, &train_b.id).await.len();
    let r = c
        .jobs
        .create(pb::CreateJobRequest {
            spec: Some(named("/a", "x/y", 100)),
        })
        .await;
    assert_status(r, Code::InvalidArgument, "spec.name");
    assert_eq!(list_tasks(&mut c, &train_b.id).await.len(), before);
    assert_status(get_job(&mut c, "x/y").await, Code::NotFound, "x/y");

    // A job named like the start of another job's id: that start names
    // neither (a kill must not pick one); the full id still names it.
    let start = &train_b.id[..6];
    let hexy = create_job(&mut c, named("/a", start, 600_000)).await;
    let e = get_job(&mut c, start)
        .await
        .expect_err("a start and a name");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains(train_b.id.as_str())
            && e.message().contains(hexy.id.as_str())
            && e.message().contains("give the id"),
        "{e:?}"
    );
    assert_eq!(
        get_job(&mut c, &train_b.id).await.expect("b").id,
        train_b.id
    );
    assert_eq!(get_job(&mut c, &hexy.id).await.expect("hexy").id, hexy.id);
    s.shutdown().await;
}

/// On an insecure server (`--insecure`: plaintext, no tokens) jobs are
/// named by a unique start of their id and by their name too, through the
/// JSON mirror as through gRPC: the index of jobs is kept on every server,
/// not only where tokens are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insecure_server_names_jobs_by_id_starts_and_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = common::within(
        "the server to start",
        peloton_gateway::server::start(&common::insecure_config(dir.path(), 2)),
    )
    .await
    .unwrap_or_else(|e| panic!("server does not start: {e:#}"));
    let base = format!("http://{}", server.addr);
    let answers = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(common::TIMEOUT))
            .build()
            .into();
        let call = |post: Option<serde_json::Value>, path: &str| -> (u16, serde_json::Value) {
            let url = format!("{base}{path}");
            let mut resp = match post {
                Some(body) => agent
                    .post(&url)
                    .header("content-type", "application/json")
                    .send(body.to_string()),
                None => agent.get(&url).call(),
            }
            .unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().expect("body");
            (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
        };
        let (status, _) = call(
            Some(serde_json::json!({"path": "/a", "spec": {"reservation": {"cpu": 1, "memoryMb": 1024}}})),
            "/v1/pools",
        );
        assert_eq!(status, 200, "create the pool");
        let (status, created) = call(
            Some(serde_json::json!({"spec": {
                "name": "report", "owner": "t", "type": "JOB_TYPE_BATCH", "pool": "/a",
                "instanceCount": 1,
                "defaultTask": {"command": "/bin/true", "resources": {"cpu": 0.1, "memoryMb": 32},
                                "sim": {"durationMs": 600000}},
            }})),
            "/v1/jobs",
        );
        assert_eq!(status, 200, "create the job: {created}");
        let id = created["job"]["id"].as_str().expect("id").to_string();
        let by_name = call(None, "/v1/jobs/report");
        let by_start = call(None, &format!("/v1/jobs/{}", &id[..8]));
        let unknown = call(None, "/v1/jobs/nothing");
        (id, by_name, by_start, unknown)
    })
    .await
    .expect("the HTTP calls");
    let (id, (s1, by_name), (s2, by_start), (s3, _)) = answers;
    assert_eq!(
        (s1, by_name["job"]["id"].as_str()),
        (200, Some(id.as_str())),
        "{by_name}"
    );
    assert_eq!(
        (s2, by_start["job"]["id"].as_str()),
        (200, Some(id.as_str())),
        "{by_start}"
    );
    assert_eq!(s3, 404);
    common::within("graceful shutdown", server.shutdown())
        .await
        .expect("graceful shutdown");
}

/// Jobs wait for the jobs they depend on (`spec.after`, Slurm's afterok,
/// afternotok): B waits for A to succeed, C for A to fail. While A runs
/// (also across a restart of the server) B and C are pending, queue
/// nothing and say what they wait for; once A succeeds B runs, and C, whose
/// dependency can never be met, is killed with a reason naming it. A
/// dependency is named by a unique start of its id (the full id is
/// stored); one naming no job is NOT_FOUND, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_for_the_jobs_it_depends_on_also_across_a_restart() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let a = create_job(&mut c, job_spec("/a", 1, 1.0, 4000)).await;
    wait_job(&c, &a.id, J::Running).await;
    let after = |succeeded: &[&str], failed: &[&str]| {
        let mut spec = job_spec("/a", 2, 1.0, 100);
        spec.after = Some(pb::JobDependencies {
            succeeded: succeeded.iter().map(|s| s.to_string()).collect(),
            failed: failed.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        spec
    };
    let b = create_job(&mut c, after(&[&a.id[..8]], &[])).await;
    let cc = create_job(&mut c, after(&[], &[&a.id])).await;
    let unknown = c
        .jobs
        .create(pb::CreateJobRequest {
            spec: Some(after(&[&a.id], &["no-such-job"])),
        })
        .await;
    assert_status(unknown, Code::NotFound, "spec.after.failed[0]");

    let waits = |job: &pb::Job| {
        job.status
            .as_ref()
            .and_then(|s| s.waiting_for.clone())
            .unwrap_or_default()
    };
    let s = s.restart().await;
    let mut c = s.clients.clone();
    let b_now = get_job(&mut c, &b.id).await.expect("b");
    assert_eq!(job_state(&b_now), J::Pending, "{b_now:?}");
    assert_eq!(count_in(&b_now, T::Initialized), 2, "{b_now:?}");
    assert_eq!(waits(&b_now).succeeded, vec![a.id.clone()], "{b_now:?}");
    assert_eq!(
        b_now.spec.as_ref().and_then(|s| s.after.clone()),
        Some(pb::JobDependencies {
            succeeded: vec![a.id.clone()],
            ..Default::default()
        }),
        "the full id is stored"
    );
    let c_now = get_job(&mut c, &cc.id).await.expect("c");
    assert_eq!(waits(&c_now).failed, vec![a.id.clone()], "{c_now:?}");

    wait_job(&c, &a.id, J::Succeeded).await;
    let b_done = wait_job(&c, &b.id, J::Succeeded).await;
    assert_eq!(waits(&b_done), pb::JobDependencies::default());
    wait_job(&c, &cc.id, J::Killed).await;
    let run = get_task(&mut c, &cc.id, 0).await.current.expect("run");
    assert_eq!(
        run.reason,
        format!("dependency {} succeeded: afternotok cannot be met", a.id)
    );
    s.shutdown().await;
}
