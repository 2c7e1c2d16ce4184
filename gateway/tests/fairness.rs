//! Fair sharing between sibling pools, and preemption of a pool running
//! beyond its entitlement when a pool with a reservation claims it.

mod common;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;

/// A preemptible job: pools without a reservation admit only preemptible
/// tasks beyond their (zero) reservation.
fn preemptible(mut spec: pb::JobSpec, priority: u32) -> pb::JobSpec {
    spec.sla = Some(pb::Sla {
        priority,
        preemptible: true,
        ..Default::default()
    });
    spec
}

fn cpu(r: &Option<pb::Resources>) -> f64 {
    r.as_ref().map_or(0.0, |r| r.cpu)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sibling_pools_with_equal_share_split_the_cluster() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    let total = cluster_capacity(&mut c).await.cpu;
    assert!(total >= 64.0, "cluster of {total} cores");
    create_pool(&mut c, "/x", pool_spec(0.0, 0.0)).await;
    create_pool(&mut c, "/y", pool_spec(0.0, 0.0)).await;
    // Each asks for far more than half, one core per task.
    let n = total as u32 + 20;
    let x = create_job(&mut c, preemptible(job_spec("/x", n, 1.0, 600_000), 1)).await;
    let y = create_job(&mut c, preemptible(job_spec("/y", n, 1.0, 600_000), 1)).await;

    let half = total / 2.0;
    let task = 1.0;
    let mut cc = c.clone();
    let (px, py) = eventually(
        "both pools to settle at half the cluster",
        TIMEOUT,
        async || {
            let px = get_pool(&mut cc, "/x").await;
            let py = get_pool(&mut cc, "/y").await;
            let mut problems = Vec::new();
            for p in [&px, &py] {
                let st = p.status.as_ref().expect("status");
                let (alloc, ent) = (cpu(&st.allocation), cpu(&st.entitlement));
                if (alloc - half).abs() > task {
                    problems.push(format!("{} allocation {alloc} (half is {half})", p.path));
                }
                if (alloc - ent).abs() > task {
                    problems.push(format!(
                        "{} allocation {alloc} vs entitlement {ent}",
                        p.path
                    ));
                }
            }
            if problems.is_empty() {
                Ok((px, py))
            } else {
                Err(problems.join("; "))
            }
        },
    )
    .await;
    let (sx, sy) = (px.status.expect("status"), py.status.expect("status"));
    assert!(
        cpu(&sx.allocation) + cpu(&sy.allocation) <= total,
        "more allocated than the cluster has: {sx:?} {sy:?}"
    );
    // Entitlements split the whole cluster.
    assert!(
        (cpu(&sx.entitlement) + cpu(&sy.entitlement) - total).abs() <= task,
        "entitlements {} + {} should cover {total}",
        cpu(&sx.entitlement),
        cpu(&sy.entitlement)
    );
    // What the job counts say agrees with the pools. Admission counts a
    // task as soon as it is admitted; it reaches a host once the tasks
    // preempted for it have left (the next cycle), so this settles too.
    let (x_alloc, y_alloc) = (cpu(&sx.allocation), cpu(&sy.allocation));
    eventually(
        "the jobs' tasks on hosts to match their pools",
        TIMEOUT,
        async || {
            let jx = get_job(&mut c, &x.id).await.map_err(|e| format!("{e:?}"))?;
            let jy = get_job(&mut c, &y.id).await.map_err(|e| format!("{e:?}"))?;
            let mut problems = Vec::new();
            for (j, alloc) in [(&jx, x_alloc), (&jy, y_alloc)] {
                let running =
                    count_in(j, T::Running) + count_in(j, T::Launching) + count_in(j, T::Placed);
                if (f64::from(running) - alloc).abs() > task {
                    problems.push(format!(
                        "job {} has {running} tasks on hosts, its pool {alloc} cores",
                        j.id
                    ));
                }
            }
            if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            }
        },
    )
    .await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_reclaimed_by_preempting_batch() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    let total = cluster_capacity(&mut c).await;
    create_pool(&mut c, "/prod", pool_spec(total.cpu, total.memory_mb)).await;
    create_pool(&mut c, "/batch", pool_spec(0.0, 0.0)).await;

    // Batch fills the cluster with low-priority preemptible tasks.
    let n_batch = total.cpu as u32;
    let batch = create_job(
        &mut c,
        preemptible(job_spec("/batch", n_batch, 1.0, 600_000), 0),
    )
    .await;
    wait_job_where(&c, &batch.id, "batch to fill the cluster", |j| {
        count_in(j, T::Running) == n_batch
    })
    .await;
    for h in list_hosts(&mut c).await {
        assert_eq!(
            h.free.as_ref().expect("free").cpu,
            0.0,
            "host {} not full",
            h.name
        );
    }

    let mut watch = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: 0,
            job_id: batch.id.clone(),
        })
        .await
        .expect("watch")
        .into_inner();
    // Prod claims half of its reservation with a non-preemptible job.
    let n_prod = n_batch / 2;
    let mut spec = job_spec("/prod", n_prod, 1.0, 600_000);
    spec.sla = Some(pb::Sla {
        priority: 10,
        ..Default::default()
    });
    let prod = create_job(&mut c, spec).await;
    let events = collect_events(&mut watch, |e| {
        e.iter()
            .any(|e| matches!(&e.kind, Some(pb::event::Kind::Task(t)) if t.state() == T::Preempted))
    })
    .await;
    let preempted: Vec<u32> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::Task(t)) if t.state() == T::Preempted => Some(t.instance),
            _ => None,
        })
        .collect();
    let prod_now = wait_job_where(&c, &prod.id, "every prod task running", |j| {
        count_in(j, T::Running) == n_prod
    })
    .await;
    assert_eq!(job_state(&prod_now), J::Running);

    // The preempted run is in the task's history, and batch holds no more
    // than what prod left.
    let t = get_task(&mut c, &batch.id, preempted[0]).await;
    assert!(
        t.history
            .iter()
            .any(|r| r.state() == T::Preempted && r.reason.contains("preempt")),
        "history of preempted batch instance {}: {:#?}",
        preempted[0],
        t.history
    );
    assert_eq!(t.current.as_ref().expect("run").run_id, 2);
    let b = get_job(&mut c, &batch.id).await.expect("batch");
    assert!(
        count_in(&b, T::Running) <= n_batch - n_prod,
        "batch still runs {} tasks next to prod's {n_prod} on {n_batch} cores",
        count_in(&b, T::Running)
    );
    let prod_pool = get_pool(&mut c, "/prod").await;
    assert_eq!(
        cpu(&prod_pool.status.expect("status").allocation),
        f64::from(n_prod)
    );
    s.shutdown().await;
}
