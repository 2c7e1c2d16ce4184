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
        })
        .await
        .expect("delete leaf");
    c.pools
        .delete(pb::DeletePoolRequest {
            path: "/a".into(),
            version: 3,
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
