//! Per-dimension shares (`PoolSpec.shares`) through the real server: they
//! are validated, read back, kept across a restart, and split the spare
//! capacity of each dimension by that dimension's weights.

mod common;

use common::*;
use peloton_proto::v1 as pb;
use tonic::Code;

fn crossed(cpu: f64, memory_mb: f64) -> pb::PoolSpec {
    pb::PoolSpec {
        shares: Some(pb::Resources {
            cpu,
            memory_mb,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A preemptible job of `n` long tasks of 1 core and 4 GiB: pools without a
/// reservation admit only preemptible work.
fn hungry(pool: &str, n: u32) -> pb::JobSpec {
    let mut spec = job_spec(pool, n, 1.0, 600_000);
    task_of(&mut spec).resources = Some(res(1.0, 4096.0));
    spec.sla = Some(pb::Sla {
        preemptible: true,
        ..Default::default()
    });
    spec
}

fn entitlement(p: &pb::Pool) -> pb::Resources {
    p.status
        .as_ref()
        .and_then(|s| s.entitlement)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_dimension_shares_split_each_dimension_and_survive_a_restart() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    let total = cluster_capacity(&mut c).await;

    let a = create_pool(&mut c, "/a", crossed(3.0, 1.0)).await;
    let read = a.spec.expect("spec");
    assert_eq!(read.share, 3.0, "share reads as the cpu weight");
    let want = Some(pb::Resources {
        cpu: 3.0,
        memory_mb: 1.0,
        disk_mb: 1.0,
        gpu: 1.0,
    });
    assert_eq!(read.shares, want, "unset dimensions take share (0 means 1)");
    create_pool(&mut c, "/b", crossed(1.0, 3.0)).await;
    // A pool with one share reads back without per-dimension shares.
    let plain = create_pool(&mut c, "/plain", pool_spec(0.0, 0.0)).await;
    assert_eq!(plain.spec.expect("spec").shares, None);

    // Refusals name the field and change nothing.
    let before = list_pools(&mut c).await.len();
    for (spec, field) in [
        (crossed(-1.0, 1.0), "spec.shares.cpu: must be positive"),
        (
            crossed(1.0, f64::NAN),
            "spec.shares.memory_mb: must be a finite number",
        ),
    ] {
        let r = c
            .pools
            .create(pb::CreatePoolRequest {
                path: "/bad".into(),
                spec: Some(spec),
            })
            .await;
        assert_status(r, Code::InvalidArgument, field);
        let r = c
            .pools
            .update(pb::UpdatePoolRequest {
                path: "/a".into(),
                spec: Some(spec),
                version: 0,
            })
            .await;
        assert_status(r, Code::InvalidArgument, field);
    }
    assert_eq!(list_pools(&mut c).await.len(), before);
    assert_eq!(
        get_pool(&mut c, "/a").await.spec.expect("spec").shares,
        want
    );

    // Both pools want far more than the cluster in cpu and memory: the cpu
    // splits 3:1 and the memory 1:3.
    let n = total.cpu as u32 + 20;
    create_job(&mut c, hungry("/a", n)).await;
    create_job(&mut c, hungry("/b", n)).await;
    let mut cc = c.clone();
    eventually(
        "entitlements split 3:1 in cpu and 1:3 in memory",
        TIMEOUT,
        async || {
            let (a, b) = (
                entitlement(&get_pool(&mut cc, "/a").await),
                entitlement(&get_pool(&mut cc, "/b").await),
            );
            let close = |got: f64, want: f64, unit: f64| (got - want).abs() <= unit;
            if close(a.cpu, total.cpu * 0.75, 0.01)
                && close(b.cpu, total.cpu * 0.25, 0.01)
                && close(a.memory_mb, total.memory_mb * 0.25, 1.0)
                && close(b.memory_mb, total.memory_mb * 0.75, 1.0)
            {
                Ok(())
            } else {
                Err(format!("/a {a:?}, /b {b:?} of {total:?}"))
            }
        },
    )
    .await;

    // Stored with the pool: the same after a restart.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_eq!(
        get_pool(&mut c, "/a").await.spec.expect("spec").shares,
        want
    );
    let listed = list_pools(&mut c).await;
    let b = listed.iter().find(|p| p.path == "/b").expect("/b listed");
    assert_eq!(
        b.spec.expect("spec").shares,
        Some(pb::Resources {
            cpu: 1.0,
            memory_mb: 3.0,
            disk_mb: 1.0,
            gpu: 1.0,
        })
    );
    s.shutdown().await;
}
