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

/// An in-process server with `/metrics`, as `config` changes it, and its
/// clients.
async fn start_with_metrics(
    dir: &std::path::Path,
    change: impl FnOnce(&mut peloton_gateway::config::Config),
) -> (
    peloton_gateway::server::Server,
    std::net::SocketAddr,
    Clients,
) {
    let mut config = config(dir, 4);
    config.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    change(&mut config);
    let server = within("start", peloton_gateway::server::start(&config))
        .await
        .expect("server");
    let metrics = server.metrics_addr.expect("metrics");
    let c = Clients::connect(server.addr).await;
    (server, metrics, c)
}

/// A watch on a connection of its own with HTTP/2's default 64 KiB windows
/// and no adaptive window (as grpcio's with `bdp_probe=0`): once its client
/// stops reading, the server can send it only about that much more.
async fn small_window_watch(
    addr: std::net::SocketAddr,
    from_revision: u64,
) -> tonic::Streaming<pb::WatchResponse> {
    let channel = tls_endpoint(addr)
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .http2_adaptive_window(false)
        .connect()
        .await
        .expect("connect");
    pb::watch_service_client::WatchServiceClient::new(with_token(channel, ADMIN_TOKEN))
        .watch(pb::WatchRequest {
            from_revision,
            job_id: String::new(),
        })
        .await
        .expect("watch")
        .into_inner()
}

/// Reads a watch until it ends with an error or brings `until` (a
/// revision): what it got, and the error if it ended.
async fn drain(
    stream: &mut tonic::Streaming<pb::WatchResponse>,
    until: u64,
) -> (Vec<pb::Event>, Option<tonic::Status>) {
    let mut events: Vec<pb::Event> = Vec::new();
    within("a watch to be drained", async {
        loop {
            if events.last().is_some_and(|e| e.revision >= until) {
                return (events, None);
            }
            match stream.message().await {
                Ok(Some(m)) => events.extend(m.events),
                Ok(None) => panic!(
                    "the watch ended without an error after {} events",
                    events.len()
                ),
                Err(e) => return (events, Some(e)),
            }
        }
    })
    .await
}

/// The revision a watch ended with RESOURCE_EXHAUSTED says to watch again
/// from.
fn resume_from(status: &tonic::Status) -> u64 {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let message = status.message();
    message
        .split("watch again from revision ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no revision to watch again from in: {message}"))
}

/// Fails unless `events` are one revision after another.
fn assert_gap_free(events: &[pb::Event], what: &str) {
    for w in events.windows(2) {
        assert_eq!(
            w[1].revision,
            w[0].revision + 1,
            "{what}: revision {} then {}",
            w[0].revision,
            w[1].revision
        );
    }
}

/// A batch job of `instances` tiny tasks that end at once.
fn tiny_job(instances: u32) -> pb::JobSpec {
    let mut spec = job_spec("/w", instances, 0.01, 0);
    task_of(&mut spec).resources = Some(res(0.01, 1.0));
    spec
}

/// The newest revision, as a fresh watch from the start sees it once
/// every job in `jobs` has succeeded.
async fn head_after(c: &mut Clients, jobs: &[String]) -> u64 {
    for id in jobs {
        wait_job(c, id, J::Succeeded).await;
    }
    let mut all = watch(c, 1, "").await;
    let events = collect_events(&mut all, |e| {
        jobs.iter().all(|id| has_job_state(e, id, J::Succeeded))
    })
    .await;
    events.last().expect("events").revision
}

/// A watch whose client reads one message, then nothing while tens of
/// thousands of events come, is cut off with RESOURCE_EXHAUSTED; told where
/// to watch again from, it must lose nothing: the point is the first
/// revision its stream did not take from its buffer (what was taken is
/// sent before the status), never one past what it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watch_cut_off_resumes_from_what_its_client_got_without_a_gap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, metrics, mut c) = start_with_metrics(dir.path(), |_| {}).await;
    create_reserved_pool(&mut c, "/w").await;
    let mut slow = small_window_watch(server.addr, 0).await;
    let mut jobs = vec![create_job(&mut c, tiny_job(1)).await.id];
    let mut got = within("the first message", slow.message())
        .await
        .expect("a message")
        .expect("not the end")
        .events;
    // About 30,000 events it does not read, then commits that bring it
    // more while it reads nothing (64 of them end it; more on a busy
    // machine, where some come together), until it is cut off: nothing is
    // buffered for it any more.
    jobs.push(create_job(&mut c, tiny_job(5000)).await.id);
    for _ in 0..70 {
        jobs.push(create_job(&mut c, tiny_job(1)).await.id);
    }
    eventually(
        "the slow watch to be cut off (nothing buffered for it)",
        TIMEOUT,
        async || match common::metric(metrics, "peloton_watch_buffered_events").await? {
            0 => Ok(()),
            n => {
                jobs.push(create_job(&mut c, tiny_job(1)).await.id);
                Err(format!("{n} events buffered"))
            }
        },
    )
    .await;
    let head = head_after(&mut c, &jobs).await;

    // Its client reads at last: what was on its way, then the status.
    let (rest, end) = drain(&mut slow, head).await;
    got.extend(rest);
    assert_gap_free(&got, "the slow watch");
    let end = end.expect("the slow watch was cut off");
    let resume = resume_from(&end);
    let last = got.last().expect("events").revision;
    assert!(
        resume <= last + 1,
        "told to watch again from revision {resume}, but it got only up to {last}: \
         a client that follows the instruction loses {} events ({end:?})",
        resume - last - 1
    );

    // Watching again from there, the union is every revision up to the
    // head (a revision seen twice is the same event).
    let mut again = watch(&mut c, resume, "").await;
    let (more, end) = drain(&mut again, head).await;
    assert!(end.is_none(), "{end:?}");
    let mut union: BTreeMap<u64, pb::Event> = BTreeMap::new();
    for e in got.into_iter().chain(more) {
        if let Some(seen) = union.get(&e.revision) {
            assert_eq!(
                seen, &e,
                "revision {} delivered twice, differently",
                e.revision
            );
        }
        union.insert(e.revision, e);
    }
    let union: Vec<pb::Event> = union.into_values().collect();
    assert_gap_free(&union, "what the slow client got, then its resumed watch");
    assert_eq!(union.last().expect("events").revision, head);
    drop((slow, again));
    within("graceful shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

/// Does `work` while polling the watches' buffered bytes, failing if they
/// ever exceed `limit`: its output and the most bytes seen.
async fn bytes_within<T>(
    metrics: std::net::SocketAddr,
    limit: i64,
    work: impl std::future::Future<Output = T>,
) -> (T, i64) {
    let mut work = std::pin::pin!(work);
    let mut most = 0;
    loop {
        let bytes = common::metric(metrics, "peloton_watch_buffered_bytes")
            .await
            .expect("the gauge");
        assert!(
            bytes <= limit,
            "the watches' buffers hold {bytes} bytes; the limit is {limit}"
        );
        most = most.max(bytes);
        tokio::select! {
            out = &mut work => return (out, most),
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Many watches nobody reads cannot make the watches' buffers hold more
/// than the server's watch memory together: the slowest are ended (told
/// where to watch again from, without a gap), and a watch that reads is
/// served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watches_stay_within_the_watch_memory_while_a_reader_is_served() {
    const LIMIT: i64 = 1 << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, metrics, mut c) = start_with_metrics(dir.path(), |config| {
        config.watch_memory_mb = 1;
        config.watch_buffer_kb = 256;
    })
    .await;
    create_reserved_pool(&mut c, "/w").await;
    let mut slow = Vec::new();
    for _ in 0..12 {
        slow.push(small_window_watch(server.addr, 0).await);
    }
    let mut jobs = vec![create_job(&mut c, tiny_job(1)).await.id];
    // Each slow watch reads one message, then nothing.
    let mut got = Vec::new();
    for s in &mut slow {
        let m = within("a first message", s.message())
            .await
            .expect("a message")
            .expect("not the end");
        got.push(m.events);
    }
    let first = got[0][0].revision;
    // About 18,000 events: more than the slow watches' buffers (256 KiB
    // each, 3 MiB in all) and their connections can take.
    jobs.push(create_job(&mut c, tiny_job(3000)).await.id);
    let (head, most) = bytes_within(metrics, LIMIT, head_after(&mut c, &jobs)).await;
    assert!(most > LIMIT / 2, "the buffers held {most} bytes at most");

    // A watch that reads, replaying all of it meanwhile.
    let mut reader = watch(&mut c, first, "").await;
    let (events, _) = bytes_within(
        metrics,
        LIMIT,
        collect_events(&mut reader, |e| {
            e.last().is_some_and(|e| e.revision >= head)
        }),
    )
    .await;
    assert_gap_free(&events, "the reading watch");
    assert_eq!(events[0].revision, first);

    // The slow watches drained: the ones ended resume without a gap.
    let mut ended = Vec::new();
    for (mut s, mut events) in slow.into_iter().zip(got) {
        let (rest, end) = drain(&mut s, head).await;
        events.extend(rest);
        assert_gap_free(&events, "a slow watch");
        if let Some(end) = end {
            let resume = resume_from(&end);
            let last = events.last().expect("events").revision;
            assert!(
                resume <= last + 1,
                "told to watch again from {resume} after {last}: {end:?}"
            );
            ended.push(end.message().to_owned());
        }
    }
    assert!(
        ended
            .iter()
            .any(|m| m.contains("hold at most 1 MiB together")),
        "no slow watch was ended for the watches' memory: {ended:#?}"
    );
    drop(reader);
    eventually("every buffer freed", TIMEOUT, async || {
        match (
            common::metric(metrics, "peloton_watch_streams").await?,
            common::metric(metrics, "peloton_watch_buffered_bytes").await?,
        ) {
            (0, 0) => Ok(()),
            other => Err(format!("(streams, bytes) = {other:?}")),
        }
    })
    .await;
    within("graceful shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

/// A watch's buffer is freed as soon as its client goes, not at the next
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_watch_frees_its_buffer_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, metrics, mut c) = start_with_metrics(dir.path(), |_| {}).await;
    create_reserved_pool(&mut c, "/w").await;
    // About 18,000 stored events, then no more commits.
    let job = create_job(&mut c, tiny_job(3000)).await.id;
    let head = head_after(&mut c, std::slice::from_ref(&job)).await;
    // A replay from the first revision that nobody reads fills its buffer.
    let slow = small_window_watch(server.addr, 1).await;
    eventually(
        "the unread watch's buffer to fill",
        TIMEOUT,
        async || match common::metric(metrics, "peloton_watch_buffered_events").await? {
            n if n > 1000 => Ok(()),
            n => Err(format!("{n} events buffered")),
        },
    )
    .await;
    drop(slow);
    eventually(
        "the closed watch's buffer to be freed",
        TIMEOUT,
        async || {
            let now = (
                common::metric(metrics, "peloton_watch_streams").await?,
                common::metric(metrics, "peloton_watch_buffered_events").await?,
                common::metric(metrics, "peloton_watch_buffered_bytes").await?,
            );
            if now == (0, 0, 0) {
                Ok(())
            } else {
                Err(format!("(streams, events, bytes) = {now:?}"))
            }
        },
    )
    .await;
    // No commit came meanwhile: the current revision is still the head.
    let after = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: head + 2,
            job_id: String::new(),
        })
        .await
        .map(drop);
    assert_status(
        after,
        tonic::Code::OutOfRange,
        &format!("current revision {head}"),
    );
    within("graceful shutdown", server.shutdown())
        .await
        .expect("shutdown");
}
