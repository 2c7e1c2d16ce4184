//! WatchService: every transition of every task, in order, with strictly
//! increasing revisions; replay from a revision; the job filter; and the
//! server's shutdown with watches open.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;

async fn watch(
    c: &mut Clients,
    from_revision: u64,
    job_id: &str,
) -> tonic::Streaming<pb::WatchResponse> {
    c.watch
        .watch(pb::WatchRequest {
            from_revision,
            job_id: job_id.into(),
        })
        .await
        .expect("watch")
        .into_inner()
}

fn job_of(e: &pb::Event) -> &str {
    match &e.kind {
        Some(pb::event::Kind::Job(j)) => &j.job_id,
        Some(pb::event::Kind::Task(t)) => &t.job_id,
        None => "",
    }
}

/// True once `events` hold the job event of `job_id` reaching `state`.
fn has_job_state(events: &[pb::Event], job_id: &str, state: J) -> bool {
    events.iter().any(|e| {
        matches!(&e.kind, Some(pb::event::Kind::Job(j)) if j.job_id == job_id && j.state() == state)
    })
}

fn job_states(events: &[pb::Event], job_id: &str) -> Vec<J> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(pb::event::Kind::Job(j)) if j.job_id == job_id => Some(j.state()),
            _ => None,
        })
        .collect()
}

fn task_states<'a>(events: &'a [pb::Event], job_id: &str) -> BTreeMap<u32, Vec<&'a pb::TaskEvent>> {
    let mut out: BTreeMap<u32, Vec<&'a pb::TaskEvent>> = BTreeMap::new();
    for e in events {
        if let Some(pb::event::Kind::Task(t)) = &e.kind
            && t.job_id == job_id
        {
            out.entry(t.instance).or_default().push(t);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_every_transition_in_order_and_replays_exactly() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    let mut live = watch(&mut c, 0, "").await;
    let job = create_job(&mut c, job_spec("/a", 4, 1.0, 50)).await;
    let events = collect_events(&mut live, |e| has_job_state(e, &job.id, J::Succeeded)).await;

    for w in events.windows(2) {
        assert_eq!(
            w[1].revision,
            w[0].revision + 1,
            "revisions not strictly increasing and gap-free: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
    assert!(events.iter().all(|e| job_of(e) == job.id), "{events:#?}");
    assert!(events.iter().all(|e| e.time_ms > 0));

    let per_task = task_states(&events, &job.id);
    assert_eq!(per_task.len(), 4, "instances seen: {:?}", per_task.keys());
    for (i, evs) in &per_task {
        let mut states: Vec<T> = evs.iter().map(|t| t.state()).collect();
        states.retain(|s| *s != T::Placing);
        assert_eq!(
            states,
            vec![
                T::Pending,
                T::Ready,
                T::Placed,
                T::Launching,
                T::Running,
                T::Succeeded
            ],
            "instance {i}: {evs:#?}"
        );
        assert!(evs.iter().all(|t| t.run_id == 1), "instance {i}: {evs:#?}");
        let host = &evs.last().expect("events").host;
        assert!(!host.is_empty(), "instance {i} ended without a host");
        for t in evs.iter().filter(|t| {
            matches!(
                t.state(),
                T::Placed | T::Launching | T::Running | T::Succeeded
            )
        }) {
            assert_eq!(
                &t.host, host,
                "instance {i} changed host within one run: {evs:#?}"
            );
        }
        // PLACING, if present, is between READY and PLACED.
        let all: Vec<T> = evs.iter().map(|t| t.state()).collect();
        if let Some(p) = all.iter().position(|s| *s == T::Placing) {
            assert!(
                all[p - 1] == T::Ready || all[p - 1] == T::Placing,
                "{all:?}"
            );
        }
    }
    assert_eq!(
        job_states(&events, &job.id),
        vec![J::Pending, J::Running, J::Succeeded],
        "{events:#?}"
    );

    // A second watch from the first revision replays exactly these events.
    let first = events[0].revision;
    let mut replay = watch(&mut c, first, "").await;
    let replayed = collect_events(&mut replay, |e| e.len() >= events.len()).await;
    assert_eq!(replayed, events, "replay differs from what was seen live");
    // And after a restart, from the store alone.
    drop(live);
    drop(replay);
    let s = s.restart().await;
    let mut c = s.clients.clone();
    let mut replay = watch(&mut c, first, "").await;
    let replayed = collect_events(&mut replay, |e| e.len() >= events.len()).await;
    assert_eq!(
        replayed[..events.len()],
        events[..],
        "replay after a restart differs"
    );
    drop(replay);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_filter_sees_only_that_job() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    // Two jobs running together; the filter names the second.
    let mut all = watch(&mut c, 0, "").await;
    let a = create_job(&mut c, job_spec("/a", 3, 1.0, 100)).await;
    let b = create_job(&mut c, job_spec("/a", 3, 1.0, 100)).await;
    // The filter from the first revision of the unfiltered stream, so that
    // b's creation is included.
    let everything = collect_events(&mut all, |e| {
        has_job_state(e, &a.id, J::Succeeded) && has_job_state(e, &b.id, J::Succeeded)
    })
    .await;
    let first = everything[0].revision;
    let mut only_b = watch(&mut c, first, &b.id).await;
    let seen = collect_events(&mut only_b, |e| has_job_state(e, &b.id, J::Succeeded)).await;
    assert!(
        seen.iter().all(|e| job_of(e) == b.id),
        "filtered watch saw another job: {seen:#?}"
    );
    let expected: Vec<pb::Event> = everything
        .iter()
        .filter(|e| job_of(e) == b.id)
        .cloned()
        .collect();
    assert_eq!(
        seen, expected,
        "filtered watch differs from the unfiltered one restricted to b"
    );
    assert!(
        everything.iter().any(|e| job_of(e) == a.id),
        "the unfiltered watch should see a too"
    );

    // Live: a filter on a running job while another job makes events.
    let b2 = create_job(&mut c, job_spec("/a", 2, 1.0, 400)).await;
    let mut live_b2 = watch(&mut c, 0, &b2.id).await;
    c.jobs
        .restart(pb::RestartJobRequest {
            id: a.id.clone(),
            version: 0,
        })
        .await
        .expect("restart a");
    let seen = collect_events(&mut live_b2, |e| has_job_state(e, &b2.id, J::Succeeded)).await;
    assert!(
        seen.iter().all(|e| job_of(e) == b2.id),
        "live filtered watch saw another job: {seen:#?}"
    );
    wait_job_where(&c, &a.id, "a done again", |j| {
        job_state(j) == J::Succeeded && count_in(j, T::Succeeded) == 3
    })
    .await;
    drop(live_b2);
    drop(all);
    s.shutdown().await;
}

/// Graceful shutdown must finish while a client still watches: the watch
/// should end (with UNAVAILABLE) rather than keep the server alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_completes_with_a_watch_open() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    let mut stream = watch(&mut c, 0, "").await;
    let server = s.server.expect("running");
    let done = tokio::time::timeout(Duration::from_secs(10), server.shutdown()).await;
    assert!(
        done.is_ok(),
        "Server::shutdown did not finish within 10 s while a watch was open"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert!(
        matches!(end, Ok(Err(_)) | Ok(Ok(None))),
        "the watch did not end with the server: {end:?}"
    );
}

/// After `Server::shutdown` returns, the data directory can be opened again
/// at once (a closed watch must not keep the store open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_right_after_shutdown_finds_the_store_free() {
    let dir = tempfile::tempdir().expect("temp dir");
    for round in 0..5 {
        let server = peloton_gateway::server::start(&config(dir.path(), 1))
            .await
            .unwrap_or_else(|e| panic!("round {round}: start right after shutdown: {e:#}"));
        let mut c = Clients::connect(server.addr).await;
        let stream = watch(&mut c, 0, "").await;
        drop(stream);
        drop(c);
        within("graceful shutdown", server.shutdown())
            .await
            .expect("shutdown");
    }
}
