//! `WatchService`: every committed event from a revision on, replayed from
//! the store while a watch is behind and live once it has caught up, through
//! a bounded buffer per watch.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use pb::watch_service_server::WatchService;
use peloton_proto::v1 as pb;
use tokio::sync::{broadcast, oneshot};
use tonic::{Request, Response, Status};

use super::watch_buffers::*;
use super::{Api, gone};
use crate::access;
use crate::command::{Command, HostCommand};
use crate::convert;
use crate::store::Store;
use peloton_authz::Permission;

pub(super) type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

/// Where a watch is: the next revision its client needs, its filter, its
/// buffer.
struct Watcher {
    next: u64,
    job: String,
    out: Arc<WatchQueue>,
}

impl Watcher {
    fn keeps(&self, e: &pb::Event) -> bool {
        e.revision >= self.next
            && (self.job.is_empty()
                || match &e.kind {
                    Some(pb::event::Kind::Job(j)) => j.job_id == self.job,
                    Some(pb::event::Kind::Task(t)) => t.job_id == self.job,
                    None => false,
                })
    }

    /// Queues the events it keeps (in revision order), in messages of at
    /// most [`MAX_EVENTS_PER_MESSAGE`] and about
    /// [`WatchMemory::message_bytes`], and moves past them; stops at a full buffer with `next` at the first
    /// event not queued. Returns the outcome and how many events were
    /// queued.
    fn send(&mut self, events: impl Iterator<Item = pb::Event>) -> (Filled, usize) {
        let mut chunk: Vec<pb::Event> = Vec::new();
        let mut chunk_bytes = 0;
        let mut queued = 0;
        let mut last = None;
        let message_bytes = self.out.memory.message_bytes();
        for e in events {
            last = Some(e.revision);
            if self.keeps(&e) {
                // More than the event, its field tag and its length.
                chunk_bytes += charge(&e);
                chunk.push(e);
                if chunk.len() == MAX_EVENTS_PER_MESSAGE || chunk_bytes >= message_bytes {
                    match self.flush(&mut chunk, std::mem::take(&mut chunk_bytes)) {
                        Ok(n) => queued += n,
                        Err(stop) => return (stop, queued),
                    }
                }
            }
        }
        if !chunk.is_empty() {
            match self.flush(&mut chunk, chunk_bytes) {
                Ok(n) => queued += n,
                Err(stop) => return (stop, queued),
            }
        }
        if let Some(l) = last {
            self.next = self.next.max(l + 1);
        }
        (Filled::All, queued)
    }

    /// Queues one message of events (`bytes` of them, [`charge`]); on a
    /// full buffer `next` goes back to its first event (what was skipped
    /// before it is skipped again).
    fn flush(&mut self, chunk: &mut Vec<pb::Event>, bytes: usize) -> Result<usize, Filled> {
        let first = chunk.first().map_or(self.next, |e| e.revision);
        let n = chunk.len();
        let message = pb::WatchResponse {
            events: std::mem::take(chunk),
        };
        match self.out.push(message, bytes) {
            Pushed::Sent => Ok(n),
            Pushed::Full => {
                self.next = first;
                Err(Filled::Full)
            }
            Pushed::Closed => Err(Filled::Closed),
        }
    }

    /// Queues stored events from `next` up to `upto` (inclusive; None: to
    /// the end of the store), a few rows at a time, until the buffer is
    /// full. Err when the start is no longer stored.
    async fn fill(
        &mut self,
        store: &Arc<dyn Store>,
        upto: Option<u64>,
    ) -> Result<(Filled, usize), Status> {
        let mut queued = 0;
        loop {
            if upto.is_some_and(|u| self.next > u) {
                return Ok((Filled::All, queued));
            }
            let s = store.clone();
            let from = self.next;
            let rows = tokio::task::spawn_blocking(move || s.events_from(from, 4))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| Status::internal(e.to_string()))?;
            // Nothing stored from `next` on, though it is committed: the
            // retention trimmed it (never wait for it silently).
            if rows.is_empty() && upto.is_some_and(|u| self.next <= u) {
                return Err(Status::out_of_range(format!(
                    "revision {} is no longer kept: list the current state and watch from there",
                    self.next
                )));
            }
            let before = self.next;
            for (n, row) in rows.into_iter().enumerate() {
                let batch = crate::persist::decode_event_row(&row).map_err(Status::internal)?;
                // Rows are contiguous, so the first row of every fetch
                // starts at or before `next` unless the retention trimmed
                // it meanwhile: never skip events silently.
                if let Some(first) = batch.events.first()
                    && n == 0
                    && first.revision > self.next
                {
                    return Err(Status::out_of_range(format!(
                        "revision {} is no longer kept; the oldest is {}: list the current state and watch from there",
                        self.next, first.revision
                    )));
                }
                let events = batch
                    .events
                    .into_iter()
                    .filter(|e| upto.is_none_or(|u| e.revision <= u));
                let (filled, n) = self.send(events);
                queued += n;
                if filled != Filled::All {
                    return Ok((filled, queued));
                }
            }
            if self.next == before {
                return Ok((Filled::All, queued));
            }
        }
    }
}

/// Streams events with revision ≥ `next` into the watch's buffer: from the
/// store while it is behind, live once it has caught up. The buffer is
/// bounded ([`WatchMemory`]); while it is full, live events are not kept (they are in the store: the watch catches up from there
/// once its client reads) and only counted, and a watch whose client stops
/// reading ([`MAX_WATCH_STALLED_COMMITS`]) or falls hopelessly behind
/// ([`MAX_WATCH_LAG_EVENTS`]) is ended with RESOURCE_EXHAUSTED, its buffer
/// freed. The pump always drains the live channel, so a slow watch never
/// holds the other watches' events in memory.
/// Whether a watch that is behind with a full buffer is still read.
struct Stall {
    /// Commits that brought events while the buffer was full and the
    /// client took nothing.
    stalled: u32,
    /// What the client had taken at the last look.
    taken: u64,
}

impl Stall {
    /// After a commit brought events the buffer had no room for (`lag`
    /// kept, the client having taken `taken` so far): why the watch is
    /// given up, if it is.
    fn behind(&mut self, taken: u64, lag: usize) -> Option<String> {
        if taken == self.taken {
            self.stalled += 1;
        } else {
            (self.stalled, self.taken) = (0, taken);
        }
        if self.stalled >= MAX_WATCH_STALLED_COMMITS {
            Some(format!(
                "its client read nothing while {} commits brought it events",
                self.stalled
            ))
        } else if lag > MAX_WATCH_LAG_EVENTS {
            Some(format!(
                "its client is more than {MAX_WATCH_LAG_EVENTS} events behind"
            ))
        } else {
            None
        }
    }
}

async fn pump(
    store: Arc<dyn Store>,
    next: u64,
    committed: u64,
    job: String,
    mut live: broadcast::Receiver<crate::command::EventBatch>,
    out: Arc<WatchQueue>,
) {
    let mut w = Watcher { next, job, out };
    // The newest revision known to be committed (None: unknown, after the
    // live channel lagged: read the store to its end).
    let mut head = Some(committed);
    // Events this watch keeps that came live and are not queued yet.
    let mut lag: usize = 0;
    // Events before this revision are history the client asked for, not
    // lag.
    let live_from = committed + 1;
    let mut stall = Stall {
        stalled: 0,
        taken: w.out.taken(),
    };
    loop {
        if head.is_none_or(|h| w.next <= h) {
            let from = w.next;
            match w.fill(&store, head).await {
                Ok((filled, queued)) => {
                    if from >= live_from || w.next > live_from {
                        lag = lag.saturating_sub(queued);
                    }
                    match filled {
                        Filled::All => {
                            head = Some(head.unwrap_or(w.next.saturating_sub(1)));
                            if w.next > head.unwrap_or_default() {
                                lag = 0;
                            }
                        }
                        Filled::Full => {}
                        Filled::Closed => return,
                    }
                }
                Err(e) => return w.out.finish(Some(e)),
            }
        }
        let batch = tokio::select! {
            r = live.recv() => r,
            () = w.out.client_moved() => {
                if w.out.closed() {
                    return;
                }
                continue;
            }
        };
        match batch {
            Ok(batch) => {
                let Some(last) = batch.last().map(|e| e.revision) else {
                    continue;
                };
                let caught_up = head.is_some_and(|h| w.next > h);
                head = head.map(|h| h.max(last));
                if caught_up {
                    // Clone only what this watcher keeps.
                    let kept: Vec<pb::Event> =
                        batch.iter().filter(|e| w.keeps(e)).cloned().collect();
                    let n = kept.len();
                    match w.send(kept.into_iter()) {
                        (Filled::All, _) => {
                            w.next = w.next.max(last + 1);
                            continue;
                        }
                        (Filled::Full, queued) => lag += n - queued,
                        (Filled::Closed, _) => return,
                    }
                } else {
                    let n = batch.iter().filter(|e| w.keeps(e)).count();
                    if n == 0 {
                        continue;
                    }
                    lag += n;
                }
                if let Some(why) = stall.behind(w.out.taken(), lag) {
                    return w.out.abandon(&format!(
                        "{why} ({} buffered at most)",
                        shown_bytes(w.out.memory.per_watch)
                    ));
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => head = None,
            Err(broadcast::error::RecvError::Closed) => return w.out.finish(Some(gone())),
        }
    }
}

impl Api {
    /// Refuses, as the call's status (before the stream starts, so HTTP
    /// clients get it as theirs too), a watch from a revision older than
    /// the oldest kept. The pump checks again as it reads: the retention
    /// may trim events meanwhile.
    async fn check_kept(&self, from: u64, committed: u64) -> Result<(), Status> {
        let store = self.store.clone();
        let rows = tokio::task::spawn_blocking(move || store.events_from(from, 1))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(e.to_string()))?;
        // No row at all: everything up to the committed revision was
        // trimmed (the caller asks only for committed revisions).
        let oldest = match rows.first() {
            Some(row) => crate::persist::decode_event_row(row)
                .map_err(Status::internal)?
                .events
                .first()
                .map_or(from, |e| e.revision),
            None => committed + 1,
        };
        if oldest > from {
            return Err(Status::out_of_range(format!(
                "from_revision: {from} is no longer kept; the oldest kept is {oldest}: list the current state and watch from there"
            )));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl WatchService for Api {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        mut request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = access::caller(&request)?;
        let mut viewer = Self::viewer(&request)?;
        if !request.get_ref().job_id.is_empty() {
            self.on_job(&mut request, Permission::JobsRead, "job_id", |r| {
                &mut r.job_id
            })?;
            viewer = None;
        }
        let r = request.into_inner();
        convert::id("job_id", &r.job_id)?;
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Hosts(HostCommand::Watch { reply }))
            .await
            .map_err(|_| gone())?;
        let (committed, live) = answer.await.map_err(|_| gone())?;
        if r.from_revision > committed + 1 {
            return Err(Status::out_of_range(format!(
                "from_revision: {} is ahead of the current revision {committed}; watch from {} at most (0: from now)",
                r.from_revision,
                committed + 1
            )));
        }
        let next = if r.from_revision == 0 {
            committed + 1
        } else {
            r.from_revision
        };
        if next <= committed {
            self.check_kept(next, committed).await?;
        }
        let queue = WatchQueue::new(self.watch_memory.clone(), next, self.metrics.clone());
        tokio::spawn(pump(
            self.store.clone(),
            next,
            committed,
            r.job_id,
            live,
            queue.clone(),
        ));
        // A lapsed leader's events stop: its watchers are told so and go
        // to the leader (from the revision they last saw).
        let role = self.role.clone();
        let leading = role.as_ref().map(|r| r.watch_leading());
        let stream = futures::stream::unfold(
            (Some(ClientEnd(queue)), leading),
            move |(end, mut leading)| {
                let role = role.clone();
                async move {
                    let end = end?;
                    let lapsed = async {
                        match leading.as_mut() {
                            Some(l) => {
                                let _ = l.wait_for(|leading| !leading).await;
                            }
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        item = end.0.take() => Some((item?, (Some(end), leading))),
                        () = lapsed => {
                            let why = role
                                .as_ref()
                                .and_then(|r| r.refusal())
                                .map_or_else(|| "not the leader".to_owned(), |r| r.0);
                            Some((Err(Status::unavailable(why)), (None, leading)))
                        }
                    }
                }
            },
        );
        let stream = access::until_revoked(stream, caller);
        let Some(viewer) = viewer else {
            return Ok(Response::new(Box::pin(stream)));
        };
        // A caller that sees part of the cluster gets its jobs' events
        // only (revisions then have gaps; messages left empty are dropped).
        let access = self.access.clone();
        let stream = futures::StreamExt::filter_map(stream, move |item| {
            let out = match item {
                Ok(mut m) => {
                    m.events.retain(|e| {
                        let job = match &e.kind {
                            Some(pb::event::Kind::Job(j)) => &j.job_id,
                            Some(pb::event::Kind::Task(t)) => &t.job_id,
                            None => return false,
                        };
                        access.sees_job(&viewer, job)
                    });
                    (!m.events.is_empty()).then_some(Ok(m))
                }
                Err(e) => Some(Err(e)),
            };
            std::future::ready(out)
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(revision: u64) -> pb::Event {
        pb::Event {
            revision,
            time_ms: 1_700_000_000_000,
            kind: Some(pb::event::Kind::Task(pb::TaskEvent {
                job_id: "0f8e1c2a-5b7d-4e3f-9a61-2c4b8d0e6f13".into(),
                instance: 7,
                run_id: 1,
                state: pb::TaskState::Running as i32,
                host: "sim-00012".into(),
                ..Default::default()
            })),
        }
    }

    /// Ten events from `from`, and their bytes.
    fn message(from: u64) -> (pb::WatchResponse, usize) {
        let events: Vec<pb::Event> = (from..from + 10).map(event).collect();
        let bytes = events.iter().map(charge).sum();
        (pb::WatchResponse { events }, bytes)
    }

    fn push(q: &WatchQueue, from: u64) -> Pushed {
        let (m, bytes) = message(from);
        q.push(m, bytes)
    }

    fn take(q: &WatchQueue) -> Result<pb::WatchResponse, Status> {
        futures::executor::block_on(q.take()).expect("not the end")
    }

    /// What the buffers hold, as the memory and the queues count it.
    fn held(memory: &WatchMemory, queues: &[&WatchQueue]) -> usize {
        let total: usize = queues.iter().map(|q| q.lock().bytes).sum();
        assert_eq!(memory.used(), total);
        assert!(total <= memory.limit, "{total} > {}", memory.limit);
        total
    }

    #[test]
    fn a_typical_event_is_charged_under_200_bytes() {
        // What the docs' "about 6,000 events" in a 1 MiB buffer rests on.
        let c = charge(&event(123_456_789));
        assert!((150..=200).contains(&c), "{c} bytes");
    }

    #[test]
    fn buffers_stay_within_their_share_and_the_memory_closing_the_slowest() {
        let b = message(1).1;
        let memory = WatchMemory::new(3 * b, 2 * b, None);
        let x = WatchQueue::new(memory.clone(), 1, None);
        let y = WatchQueue::new(memory.clone(), 1, None);
        let z = WatchQueue::new(memory.clone(), 1, None);
        let all = [&*x, &*y, &*z];
        // y's client leaves a message waiting; x's buffer fills: a buffer
        // holds two messages at most.
        assert_eq!(push(&y, 1), Pushed::Sent);
        assert_eq!(push(&x, 1), Pushed::Sent);
        assert_eq!(push(&x, 11), Pushed::Sent);
        assert_eq!(push(&x, 21), Pushed::Full);
        assert_eq!(held(&memory, &all), 3 * b);
        // The memory is full: y, holding something, waits for its client.
        assert_eq!(push(&y, 11), Pushed::Full);
        // z, holding nothing, closes the watch whose client left a message
        // untaken longest: y, though x holds more.
        assert_eq!(push(&z, 1), Pushed::Sent);
        assert_eq!(held(&memory, &all), 3 * b);
        let end = take(&y).expect_err("y was ended");
        assert_eq!(end.code(), tonic::Code::ResourceExhausted);
        assert!(
            end.message().contains("left a message untaken longest")
                && end.message().ends_with("watch again from revision 1"),
            "{}",
            end.message()
        );
        assert_eq!(push(&y, 11), Pushed::Closed);
        // x's client takes: room for one message, which z, holding
        // something, takes; x waits.
        assert_eq!(take(&x).expect("a message").events[0].revision, 1);
        assert_eq!(push(&z, 11), Pushed::Sent);
        assert_eq!(push(&x, 21), Pushed::Full);
        assert_eq!(held(&memory, &all), 3 * b);
        // A client that leaves frees its buffer at once.
        drop(ClientEnd(x.clone()));
        assert_eq!(held(&memory, &all), 2 * b);
        assert_eq!(push(&x, 21), Pushed::Closed);
    }

    #[test]
    fn an_ended_watch_resumes_at_the_first_revision_its_stream_did_not_take() {
        let memory = WatchMemory::new(1 << 20, 1 << 16, None);
        let q = WatchQueue::new(memory.clone(), 100, None);
        assert_eq!(push(&q, 100), Pushed::Sent);
        assert_eq!(push(&q, 110), Pushed::Sent);
        assert_eq!(take(&q).expect("a message").events[9].revision, 109);
        q.abandon("its client read nothing");
        let end = take(&q).expect_err("ended");
        assert_eq!(
            end.message(),
            "watch ended: its client read nothing; watch again from revision 110"
        );
        assert_eq!(memory.used(), 0);
        assert!(futures::executor::block_on(q.take()).is_none());
    }
}
