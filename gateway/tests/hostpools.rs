//! Host pools over a real socket with simulated hosts: a partition of the
//! hosts that jobs name (a job without a host pool runs in "default"),
//! moves, deletes refused while hosts or live jobs use a pool, recovery
//! after a restart, and clear errors for bad names and unknown pools.

mod common;

use std::collections::BTreeSet;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;
use tonic::Code;

async fn create_host_pool(c: &mut Clients, name: &str) -> Result<pb::HostPool, tonic::Status> {
    Ok(c.host_pools
        .create(pb::CreateHostPoolRequest { name: name.into() })
        .await?
        .into_inner()
        .pool
        .expect("pool"))
}

async fn delete_host_pool(c: &mut Clients, name: &str) -> Result<(), tonic::Status> {
    c.host_pools
        .delete(pb::DeleteHostPoolRequest { name: name.into() })
        .await?;
    Ok(())
}

async fn move_hosts(c: &mut Clients, hosts: &[&str], to: &str) -> Result<(), tonic::Status> {
    move_hosts_forced(c, hosts, to, false).await
}

async fn move_hosts_forced(
    c: &mut Clients,
    hosts: &[&str],
    to: &str,
    force: bool,
) -> Result<(), tonic::Status> {
    c.host_pools
        .move_hosts(pb::MoveHostsRequest {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            to: to.into(),
            force,
        })
        .await?;
    Ok(())
}

/// Host pools by name, with their hosts.
async fn host_pools(c: &mut Clients) -> Vec<(String, Vec<String>)> {
    c.host_pools
        .list(pb::ListHostPoolsRequest::default())
        .await
        .expect("list host pools")
        .into_inner()
        .pools
        .into_iter()
        .map(|p| (p.name, p.hosts))
        .collect()
}

/// Hosts of the job's running tasks, once all `n` run.
async fn running_hosts(c: &Clients, id: &str, n: u32) -> BTreeSet<String> {
    wait_job_where(c, id, &format!("{n} tasks of {id} running"), |j| {
        count_in(j, T::Running) == n
    })
    .await;
    let mut c = c.clone();
    list_tasks(&mut c, id)
        .await
        .into_iter()
        .map(|t| t.current.expect("run").host)
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_only_in_its_host_pool_and_others_in_default() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let all: Vec<String> = list_hosts(&mut c)
        .await
        .into_iter()
        .map(|h| h.name)
        .collect();
    assert_eq!(all.len(), 4);
    assert_eq!(host_pools(&mut c).await, [("default".into(), all.clone())]);

    let created = create_host_pool(&mut c, "team-a").await.expect("create");
    assert_eq!(created.name, "team-a");
    assert!(created.hosts.is_empty());
    move_hosts(&mut c, &[&all[0], &all[1]], "team-a")
        .await
        .expect("move");
    assert_eq!(
        host_pools(&mut c).await,
        [
            ("default".into(), vec![all[2].clone(), all[3].clone()]),
            ("team-a".into(), vec![all[0].clone(), all[1].clone()]),
        ]
    );
    for h in list_hosts(&mut c).await {
        let want = if h.name == all[0] || h.name == all[1] {
            "team-a"
        } else {
            "default"
        };
        assert_eq!(h.host_pool, want, "{}", h.name);
        // Shown as host_pool, not as an attribute.
        assert!(
            h.attributes.keys().all(|k| !k.contains("host_pool")),
            "{:?}",
            h.attributes
        );
        assert!(h.attributes.contains_key("zone"), "{:?}", h.attributes);
    }

    // Eight tasks: more than one host of the pool takes, so they spread
    // over the pool's two hosts, and none leaves it.
    let mut spec = job_spec("/a", 8, 1.0, 3_600_000);
    spec.host_pool = "team-a".into();
    let in_pool = create_job(&mut c, spec).await;
    assert_eq!(in_pool.spec.as_ref().expect("spec").host_pool, "team-a");
    let hosts = running_hosts(&c, &in_pool.id, 8).await;
    assert!(
        hosts.is_subset(&set(&[&all[0], &all[1]])),
        "team-a job on {hosts:?}"
    );

    // A job without a host pool runs in "default": the other two hosts.
    let other = create_job(&mut c, job_spec("/a", 8, 1.0, 3_600_000)).await;
    let hosts = running_hosts(&c, &other.id, 8).await;
    assert!(
        hosts.is_subset(&set(&[&all[2], &all[3]])),
        "default job on {hosts:?}"
    );

    // A user constraint is ANDed with the host pool.
    let mut spec = job_spec("/a", 1, 0.5, 3_600_000);
    spec.host_pool = "team-a".into();
    task_of(&mut spec).constraint = format!("host == {}", all[2]);
    let impossible = create_job(&mut c, spec).await;
    let t = eventually(
        "the constrained task to be not placed",
        TIMEOUT,
        async || {
            let t = get_task(&mut c.clone(), &impossible.id, 0).await;
            if t.pending_reason.starts_with("not placed") {
                Ok(t)
            } else {
                Err(format!("{t:?}"))
            }
        },
    )
    .await;
    assert_eq!(task_state(&t), T::Placing, "{t:?}");

    // Refused while it has hosts.
    assert_status(
        delete_host_pool(&mut c, "team-a").await,
        Code::FailedPrecondition,
        "still has 2 host(s)",
    );
    // Moving hosts that run the pool's tasks away is refused, naming how
    // many run where; nothing moves.
    let before = host_pools(&mut c).await;
    assert_status(
        move_hosts(&mut c, &[&all[0], &all[1]], "default").await,
        Code::FailedPrecondition,
        "8 task(s) of jobs outside host pool \"default\" run on these hosts",
    );
    assert_eq!(host_pools(&mut c).await, before);
    let hosts = running_hosts(&c, &in_pool.id, 8).await;
    assert!(hosts.is_subset(&set(&[&all[0], &all[1]])), "{hosts:?}");
    // With force they stop and wait for hosts of their own pool.
    move_hosts_forced(&mut c, &[&all[0], &all[1]], "default", true)
        .await
        .expect("move back");
    let t = eventually("team-a's tasks to wait", TIMEOUT, async || {
        let tasks = list_tasks(&mut c.clone(), &in_pool.id).await;
        if tasks.iter().all(|t| {
            t.current
                .as_ref()
                .is_some_and(|r| r.host.is_empty() && r.run_id == 2)
        }) {
            Ok(tasks)
        } else {
            Err(format!("{tasks:?}"))
        }
    })
    .await;
    assert_eq!(t.len(), 8);
    // Refused while a live job names it (either of the two).
    let e = delete_host_pool(&mut c, "team-a").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&in_pool.id) || e.message().contains(&impossible.id),
        "{}",
        e.message()
    );
    for id in [&in_pool.id, &impossible.id] {
        c.jobs
            .kill(pb::KillJobRequest {
                id: id.clone(),
                version: 0,
            })
            .await
            .expect("kill");
        wait_job(&c, id, J::Killed).await;
    }
    delete_host_pool(&mut c, "team-a").await.expect("delete");
    assert_eq!(host_pools(&mut c).await, [("default".into(), all.clone())]);
    // A killed job may still name a deleted pool; a new one may not.
    let mut spec = job_spec("/a", 1, 0.5, 100);
    spec.host_pool = "team-a".into();
    assert_status(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await,
        Code::InvalidArgument,
        "spec.host_pool",
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_pools_survive_a_restart() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    create_host_pool(&mut c, "gpu").await.expect("create");
    create_host_pool(&mut c, "empty").await.expect("create");
    let all: Vec<String> = list_hosts(&mut c)
        .await
        .into_iter()
        .map(|h| h.name)
        .collect();
    move_hosts(&mut c, &[&all[3]], "gpu").await.expect("move");
    let before = host_pools(&mut c).await;

    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_eq!(host_pools(&mut c).await, before);
    assert_eq!(
        before,
        [
            ("default".into(), all[..3].to_vec()),
            ("empty".into(), vec![]),
            ("gpu".into(), vec![all[3].clone()]),
        ]
    );
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts[3].host_pool, "gpu");
    assert_eq!(hosts[0].host_pool, "default");
    // The engine knows it too: a job of the pool runs there.
    create_reserved_pool(&mut c, "/a").await;
    let mut spec = job_spec("/a", 3, 1.0, 3_600_000);
    spec.host_pool = "gpu".into();
    let job = create_job(&mut c, spec).await;
    assert_eq!(running_hosts(&c, &job.id, 3).await, set(&[&all[3]]));
    delete_host_pool(&mut c, "empty").await.expect("delete");
    let s = s.restart().await;
    let mut c = s.clients.clone();
    let names: Vec<String> = host_pools(&mut c).await.into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["default", "gpu"]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_unknown_host_pools_are_refused_clearly() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    for bad in ["", "has space", "a/b", &"x".repeat(65)] {
        assert_status(
            create_host_pool(&mut c, bad).await,
            Code::InvalidArgument,
            "name: ",
        );
    }
    assert_status(
        create_host_pool(&mut c, "default").await,
        Code::AlreadyExists,
        "\"default\" already exists",
    );
    create_host_pool(&mut c, "ok.pool_1-x")
        .await
        .expect("create");
    assert_status(
        create_host_pool(&mut c, "ok.pool_1-x").await,
        Code::AlreadyExists,
        "already exists",
    );
    assert_status(
        delete_host_pool(&mut c, "default").await,
        Code::FailedPrecondition,
        "cannot be deleted",
    );
    assert_status(
        delete_host_pool(&mut c, "nope").await,
        Code::NotFound,
        "\"nope\" not found",
    );
    assert_status(
        move_hosts(&mut c, &["sim-00000"], "nope").await,
        Code::NotFound,
        "\"nope\" not found",
    );
    assert_status(
        move_hosts(&mut c, &["sim-00000"], "bad name").await,
        Code::InvalidArgument,
        "to: ",
    );
    assert_status(
        move_hosts(&mut c, &[], "ok.pool_1-x").await,
        Code::InvalidArgument,
        "hosts: ",
    );
    // All or nothing: one unknown host moves none.
    assert_status(
        move_hosts(&mut c, &["sim-00000", "no-such-host"], "ok.pool_1-x").await,
        Code::NotFound,
        "no-such-host",
    );
    assert!(
        list_hosts(&mut c)
            .await
            .iter()
            .all(|h| h.host_pool == "default")
    );
    for (pool, code, needle) in [
        (
            "nope",
            Code::InvalidArgument,
            "spec.host_pool: host pool \"nope\" does not exist",
        ),
        ("a b", Code::InvalidArgument, "spec.host_pool: "),
    ] {
        let mut spec = job_spec("/a", 1, 0.5, 100);
        spec.host_pool = pool.into();
        assert_status(
            c.jobs
                .create(pb::CreateJobRequest { spec: Some(spec) })
                .await,
            code,
            needle,
        );
    }
    // An empty pool's job waits with a reason that names the constraint.
    let mut spec = job_spec("/a", 1, 0.5, 100);
    spec.host_pool = "ok.pool_1-x".into();
    let job = create_job(&mut c, spec).await;
    let t = eventually("the task to be not placed", TIMEOUT, async || {
        let t = get_task(&mut c.clone(), &job.id, 0).await;
        if t.pending_reason.starts_with("not placed") {
            Ok(t)
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await;
    assert!(
        t.pending_reason.contains("constraint"),
        "{}",
        t.pending_reason
    );
    // Once a host joins the pool, it runs there.
    move_hosts(&mut c, &["sim-00001"], "ok.pool_1-x")
        .await
        .expect("move");
    let done = wait_job(&c, &job.id, J::Succeeded).await;
    assert_eq!(count_in(&done, T::Succeeded), 1);
    let t = get_task(&mut c, &job.id, 0).await;
    assert_eq!(t.current.expect("run").host, "sim-00001");
    s.shutdown().await;
}
