//! ResourcePoolService over a real socket: the pool lifecycle, and every
//! refusal with its code, a message naming the field, and no change.

mod common;

use common::*;
use peloton_proto::v1 as pb;
use tonic::Code;

/// Pools without their status (allocation and entitlement move with the
/// cycle; what a refused request must not change is the rest).
async fn pools_without_status(c: &mut Clients) -> Vec<pb::Pool> {
    let mut pools = list_pools(c).await;
    for p in &mut pools {
        p.status = None;
    }
    pools
}

fn create(path: &str, spec: pb::PoolSpec) -> pb::CreatePoolRequest {
    pb::CreatePoolRequest {
        path: path.into(),
        spec: Some(spec),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_lifecycle_create_get_list_update_delete() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();

    let a = create_pool(&mut c, "/a", pool_spec(4.0, 1024.0)).await;
    assert_eq!(a.path, "/a");
    assert_eq!(a.version, 1);
    let spec = a.spec.expect("spec");
    assert_eq!(spec.reservation, Some(res(4.0, 1024.0)));
    assert_eq!(spec.share, 1.0, "share 0 means 1");
    let b = create_pool(&mut c, "/a/b", pool_spec(1.0, 0.0)).await;
    assert_eq!(b.path, "/a/b");

    let got = get_pool(&mut c, "/a").await;
    assert_eq!(got.children, vec!["/a/b".to_string()]);
    assert_eq!(got.spec, a.spec);
    let paths: Vec<String> = list_pools(&mut c)
        .await
        .into_iter()
        .map(|p| p.path)
        .collect();
    assert_eq!(paths, vec!["/", "/a", "/a/b"]);

    let mut new_spec = pool_spec(8.0, 2048.0);
    new_spec.share = 2.0;
    let updated = c
        .pools
        .update(pb::UpdatePoolRequest {
            path: "/a".into(),
            spec: Some(new_spec),
            version: 1,
        })
        .await
        .expect("update with the current version")
        .into_inner()
        .pool
        .expect("pool");
    assert_eq!(updated.version, 2);
    let got = get_pool(&mut c, "/a").await;
    assert_eq!(got.version, 2);
    let got_spec = got.spec.expect("spec");
    assert_eq!(got_spec.reservation, Some(res(8.0, 2048.0)));
    assert_eq!(
        got_spec.limit,
        Some(res(0.0, 0.0)),
        "an unset limit reads back as 0"
    );
    assert_eq!(got_spec.share, 2.0);

    // Version 0 means "whatever is current".
    let updated = c
        .pools
        .update(pb::UpdatePoolRequest {
            path: "/a".into(),
            spec: Some(new_spec),
            version: 0,
        })
        .await
        .expect("update with version 0")
        .into_inner()
        .pool
        .expect("pool");
    assert_eq!(updated.version, 3);

    c.pools
        .delete(pb::DeletePoolRequest {
            path: "/a/b".into(),
            version: 1,
            force: false,
        })
        .await
        .expect("delete leaf");
    c.pools
        .delete(pb::DeletePoolRequest {
            path: "/a".into(),
            version: 3,
            force: false,
        })
        .await
        .expect("delete /a");
    assert_status(
        c.pools.get(pb::GetPoolRequest { path: "/a".into() }).await,
        Code::NotFound,
        "/a",
    );
    let paths: Vec<String> = list_pools(&mut c)
        .await
        .into_iter()
        .map(|p| p.path)
        .collect();
    assert_eq!(paths, vec!["/"]);

    // A deleted path can be created again, from version 1.
    let again = create_pool(&mut c, "/a", pool_spec(0.0, 0.0)).await;
    assert_eq!(again.version, 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pool_requests_name_the_problem_and_change_nothing() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(2.0, 512.0)).await;
    create_pool(&mut c, "/a/b", pool_spec(1.0, 0.0)).await;
    create_pool(&mut c, "/leaf", pool_spec(0.0, 0.0)).await;
    // A job that never finishes (no host matches), so /leaf has an
    // unfinished job (preemptible: /leaf reserves nothing, and
    // non-preemptible work there could never be admitted).
    let mut spec = job_spec("/leaf", 1, 1.0, 60_000);
    task_of(&mut spec).constraint = "zone == \"nowhere\"".into();
    spec.sla = Some(pb::Sla {
        preemptible: true,
        ..Default::default()
    });
    let job = create_job(&mut c, spec).await;
    let before = pools_without_status(&mut c).await;

    // Negative reservation.
    let mut neg = pool_spec(0.0, 0.0);
    neg.reservation = Some(res(-1.0, 0.0));
    assert_status(
        c.pools.create(create("/neg", neg)).await,
        Code::InvalidArgument,
        "spec.reservation.cpu",
    );
    assert_status(
        c.pools
            .update(pb::UpdatePoolRequest {
                path: "/a".into(),
                spec: Some(neg),
                version: 0,
            })
            .await,
        Code::InvalidArgument,
        "spec.reservation.cpu",
    );
    // Bad share.
    let mut bad_share = pool_spec(0.0, 0.0);
    bad_share.share = -2.0;
    assert_status(
        c.pools.create(create("/share", bad_share)).await,
        Code::InvalidArgument,
        "spec.share",
    );
    // Empty path.
    assert_status(
        c.pools.create(create("", pool_spec(0.0, 0.0))).await,
        Code::InvalidArgument,
        "path",
    );
    // Missing parent.
    assert_status(
        c.pools
            .create(create("/missing/child", pool_spec(0.0, 0.0)))
            .await,
        Code::NotFound,
        "/missing",
    );
    // Duplicate.
    assert_status(
        c.pools.create(create("/a", pool_spec(0.0, 0.0))).await,
        Code::AlreadyExists,
        "/a",
    );
    // Stale version on update and on delete.
    assert_status(
        c.pools
            .update(pb::UpdatePoolRequest {
                path: "/a".into(),
                spec: Some(pool_spec(3.0, 0.0)),
                version: 7,
            })
            .await,
        Code::FailedPrecondition,
        "version",
    );
    assert_status(
        c.pools
            .delete(pb::DeletePoolRequest {
                path: "/a/b".into(),
                version: 9,
                force: false,
            })
            .await,
        Code::FailedPrecondition,
        "version",
    );
    // Update and delete of a pool that does not exist.
    assert_status(
        c.pools
            .update(pb::UpdatePoolRequest {
                path: "/nope".into(),
                spec: Some(pool_spec(0.0, 0.0)),
                version: 0,
            })
            .await,
        Code::NotFound,
        "/nope",
    );
    assert_status(
        c.pools
            .delete(pb::DeletePoolRequest {
                path: "/nope".into(),
                version: 0,
                force: false,
            })
            .await,
        Code::NotFound,
        "/nope",
    );
    // Delete of a pool with an unfinished job.
    assert_status(
        c.pools
            .delete(pb::DeletePoolRequest {
                path: "/leaf".into(),
                version: 0,
                force: false,
            })
            .await,
        Code::FailedPrecondition,
        &job.id,
    );
    let after = pools_without_status(&mut c).await;
    assert_eq!(before, after, "a refused request changed the pools");
    s.shutdown().await;
}

/// Kept apart from the test above so that its expected code is visible on
/// its own: deleting a pool that has children is a precondition failure
/// (the request is well-formed; the pool's state forbids it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_pool_with_children_is_a_failed_precondition() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(0.0, 0.0)).await;
    create_pool(&mut c, "/a/b", pool_spec(0.0, 0.0)).await;
    let before = pools_without_status(&mut c).await;
    let r = c
        .pools
        .delete(pb::DeletePoolRequest {
            path: "/a".into(),
            version: 0,
            force: false,
        })
        .await;
    let after = pools_without_status(&mut c).await;
    assert_eq!(before, after, "a refused delete changed the pools");
    assert_status(r, Code::FailedPrecondition, "child");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_survive_a_restart_with_their_versions() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(2.0, 512.0)).await;
    create_pool(&mut c, "/a/b", pool_spec(1.0, 0.0)).await;
    c.pools
        .update(pb::UpdatePoolRequest {
            path: "/a".into(),
            spec: Some(pool_spec(3.0, 512.0)),
            version: 1,
        })
        .await
        .expect("update");
    let before = pools_without_status(&mut c).await;
    let s = s.restart().await;
    let mut c = s.clients.clone();
    let after = pools_without_status(&mut c).await;
    assert_eq!(before, after);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_pool_holds_what_its_children_hold() {
    // Tasks queue and run in leaf pools: /a's allocation, running and
    // pending tasks are those of /a/b and /a/c together, the root's those of
    // every pool, as the demand is (list and get read the same figures).
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(4.0, 1024.0)).await;
    create_pool(&mut c, "/a/b", pool_spec(2.0, 512.0)).await;
    create_pool(&mut c, "/a/c", pool_spec(2.0, 256.0)).await;
    let b = create_job(&mut c, job_spec("/a/b", 2, 1.0, 600_000)).await;
    let cc = create_job(&mut c, job_spec("/a/c", 1, 2.0, 600_000)).await;
    wait_job(&c, &b.id, pb::JobState::Running).await;
    wait_job(&c, &cc.id, pb::JobState::Running).await;
    // /a/c's reservation is taken: one more task waits in its queue.
    create_job(&mut c, job_spec("/a/c", 1, 1.0, 600_000)).await;
    // A pool's status figures, as `respool list` shows them.
    let figures = |p: &pb::Pool| {
        let st = p.status.expect("status");
        let alloc = st.allocation.expect("allocation");
        format!(
            "{} cpu={} mem={} running={} pending={}",
            p.path, alloc.cpu, alloc.memory_mb, st.running_tasks, st.pending_tasks
        )
    };
    let mut cl = c.clone();
    let pools = eventually("every task allocated", TIMEOUT, async || {
        let pools = list_pools(&mut cl).await;
        let leaf = pools.iter().find(|p| p.path == "/a/c").expect("/a/c");
        if leaf
            .status
            .is_some_and(|st| st.running_tasks == 1 && st.pending_tasks == 1)
        {
            Ok(pools)
        } else {
            Err(format!("{pools:?}"))
        }
    })
    .await;
    let listed: Vec<String> = pools.iter().map(figures).collect();
    assert_eq!(
        listed,
        [
            "/ cpu=4 mem=768 running=3 pending=1",
            "/a cpu=4 mem=768 running=3 pending=1",
            "/a/b cpu=2 mem=512 running=2 pending=0",
            "/a/c cpu=2 mem=256 running=1 pending=1",
        ]
    );
    assert_eq!(
        figures(&get_pool(&mut c, "/a").await),
        "/a cpu=4 mem=768 running=3 pending=1"
    );
    s.shutdown().await;
}

fn queue(path: &str, limit: u32) -> pb::ListQueueRequest {
    pb::ListQueueRequest {
        path: path.into(),
        limit,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_queue_is_listed_in_admission_order_priority_then_arrival() {
    // One host of 16 cores, all reserved by /q and taken by a blocker: the
    // jobs after it wait in /q's (non-preemptible) queue.
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/q", pool_spec(16.0, 4096.0)).await;
    let blocker = create_job(&mut c, job_spec("/q", 1, 16.0, 600_000)).await;
    wait_job(&c, &blocker.id, pb::JobState::Running).await;
    let with_priority = |instances, priority| {
        let mut spec = job_spec("/q", instances, 1.0, 600_000);
        spec.sla = Some(pb::Sla {
            priority,
            ..Default::default()
        });
        spec
    };
    // Created low, high, low: admitted high first, then the lows by arrival.
    let low = create_job(&mut c, with_priority(2, 1)).await;
    let high = create_job(&mut c, with_priority(2, 5)).await;
    let later = create_job(&mut c, with_priority(1, 1)).await;
    let mut cc = c.clone();
    let entries = eventually("five queued tasks", TIMEOUT, async || {
        let r = cc
            .pools
            .list_queue(queue("/q", 0))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        if r.entries.len() == 5 && r.queued_tasks == 5 {
            Ok(r.entries)
        } else {
            Err(format!("{r:?}"))
        }
    })
    .await;
    let order: Vec<(String, u32, u32)> = entries
        .iter()
        .map(|e| {
            let t = e.task.as_ref().expect("task");
            (t.job_id.clone(), t.instance, e.priority)
        })
        .collect();
    assert_eq!(
        order,
        [
            (high.id.clone(), 0, 5),
            (high.id.clone(), 1, 5),
            (low.id.clone(), 0, 1),
            (low.id.clone(), 1, 1),
            (later.id.clone(), 0, 1),
        ]
    );
    for e in &entries {
        assert_eq!(e.tasks, 1);
        assert_eq!(e.task_class, "non_preemptible");
        assert_eq!(e.request.as_ref().expect("request").cpu, 1.0);
    }
    // A limit reads the front of it; the root (a parent) queues nothing.
    let front = c
        .pools
        .list_queue(queue("/q", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(front.entries, entries[..2]);
    assert_eq!(front.queued_tasks, 5);
    let root = c
        .pools
        .list_queue(queue("/", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(
        root.entries.is_empty() && root.queued_tasks == 0,
        "{root:?}"
    );
    // Refusals name the field.
    assert_status(
        c.pools.list_queue(queue("/q", 101)).await,
        Code::InvalidArgument,
        "limit",
    );
    assert_status(
        c.pools.list_queue(queue("", 0)).await,
        Code::InvalidArgument,
        "path",
    );
    assert_status(
        c.pools.list_queue(queue("/nope", 0)).await,
        Code::NotFound,
        "/nope",
    );
    // Once the blocker goes, the high-priority job runs first.
    c.jobs
        .kill(pb::KillJobRequest {
            id: blocker.id.clone(),
            ..Default::default()
        })
        .await
        .expect("kill");
    wait_job(&c, &high.id, pb::JobState::Running).await;
    s.shutdown().await;
}

/// Pool rows written by servers before the stored-row codec (the API's
/// `Pool` message, as a read shows it) still recover, with their versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_rows_written_as_the_apis_messages_still_recover() {
    use peloton_gateway::store::WriteBatch;
    use peloton_gateway::store_codec::ROW_V1;
    use prost::Message;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = TestServer::start_in(dir.path(), 2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(2.0, 512.0)).await;
    let mut static_pool = pool_spec(1.0, 0.0);
    static_pool.kind = pb::PoolKind::Static as i32;
    static_pool.share = 3.0;
    create_pool(&mut c, "/a/b", static_pool).await;
    c.pools
        .update(pb::UpdatePoolRequest {
            path: "/a".into(),
            spec: Some(pool_spec(3.0, 512.0)),
            version: 1,
        })
        .await
        .expect("update");
    let before = pools_without_status(&mut c).await;
    s.shutdown().await;
    {
        let store = open_store(dir.path());
        let snap = store.load().expect("load");
        let stored: Vec<&str> = snap.pools.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(stored, ["/a", "/a/b"]);
        assert!(snap.pools.iter().all(|(_, row)| row[..2] == ROW_V1));
        let pools = before
            .iter()
            .filter(|p| stored.contains(&p.path.as_str()))
            .map(|p| (p.path.clone(), Some(p.encode_to_vec())))
            .collect();
        store
            .commit(&WriteBatch {
                pools,
                revision: snap.revision,
                ..WriteBatch::default()
            })
            .expect("commit");
    }
    let s = TestServer::start_in(dir.path(), 2).await;
    let mut c = s.clients.clone();
    assert_eq!(pools_without_status(&mut c).await, before);
    s.shutdown().await;
}
