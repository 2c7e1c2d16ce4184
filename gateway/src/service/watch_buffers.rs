//! The watches' bounded buffers: one per watch (`per_watch` bytes), all
//! together within `WatchMemory`'s limit, the slowest closed to make room.
//! A leaf: the watch service (`service::watch`) fills and drains them.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;
use tonic::Status;

use crate::metrics::Metrics;

/// Most events in one streamed message.
pub(crate) const MAX_EVENTS_PER_MESSAGE: usize = 1024;

/// A streamed message ends once its events reach this many bytes (as
/// [`charge`] counts them, at least their encoded size: 1 MiB; an event is
/// small: its strings are bounded, an agent's text to
/// `convert::MAX_AGENT_TEXT_BYTES`), well within a client's 4 MiB, or half
/// a watch's buffer if that is less.
pub(crate) const MAX_BYTES_PER_MESSAGE: usize = 1 << 20;

/// What every watch's buffer holds together, at most, by default
/// (`watch_memory_mb`).
pub const DEFAULT_WATCH_MEMORY_BYTES: usize = 64 << 20;

/// What one watch's buffer holds, at most, by default (`watch_buffer_kb`;
/// about 6,000 events). A watch whose buffer is full stops taking events
/// into memory and catches up from the store once its client reads again.
pub const DEFAULT_WATCH_BUFFER_BYTES: usize = 1 << 20;

/// A watch whose buffer is full and whose client took nothing while this
/// many commits brought it events is ended with RESOURCE_EXHAUSTED: its
/// client does not read (a client that reads, however bursty the events,
/// takes something between commits).
pub const MAX_WATCH_STALLED_COMMITS: u32 = 64;

/// A watch more than this many of its events behind the newest commit is
/// ended with RESOURCE_EXHAUSTED: its client reads more slowly than events
/// come and could never catch up.
pub const MAX_WATCH_LAG_EVENTS: usize = 1_000_000;

/// What a buffered event costs in memory, about: its struct and its
/// encoded size (which counts its strings' bytes).
pub(crate) fn charge(e: &pb::Event) -> usize {
    std::mem::size_of::<pb::Event>() + e.encoded_len()
}

/// `n` bytes as messages show them: whole KiB, or MiB when exact.
pub(crate) fn shown_bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n.div_ceil(1024))
    }
}

/// The memory of every watch's buffer together: each buffer holds at most
/// `per_watch` bytes, all of them at most `limit`. A watch that needs room
/// while its own buffer is empty (its client has taken everything) closes
/// the slowest watch with RESOURCE_EXHAUSTED until the room is there: the
/// one whose client has left a message untaken the longest (not the one
/// holding the most: a reader's buffer may hold a large message for a
/// moment). One whose buffer holds something waits for its client instead,
/// as with a full buffer. So the total never exceeds `limit`, and readers
/// are served while watches nobody reads are closed.
#[derive(Debug)]
pub struct WatchMemory {
    pub(crate) limit: usize,
    pub(crate) per_watch: usize,
    pub(crate) holders: std::sync::Mutex<Holders>,
    pub(crate) metrics: Option<Arc<Metrics>>,
}

/// The open watches and what each holds.
#[derive(Debug, Default)]
pub(crate) struct Holders {
    /// Bytes reserved by every buffer together (at least what they hold:
    /// reserved before a message is queued, released after it is taken).
    pub(crate) used: usize,
    pub(crate) next_id: u64,
    pub(crate) watches: std::collections::HashMap<u64, Holder>,
}

#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) queue: std::sync::Weak<WatchQueue>,
    pub(crate) bytes: usize,
    /// Since when the first message of its buffer waits for its client:
    /// queued then into an empty buffer, or the one before it was taken
    /// then (None: empty).
    pub(crate) waits_since: Option<std::time::Instant>,
}

impl WatchMemory {
    /// At most `limit` bytes for every watch together, `per_watch` for
    /// one (the configuration checks `per_watch <= limit`).
    pub fn new(limit: usize, per_watch: usize, metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(WatchMemory {
            limit,
            per_watch: per_watch.min(limit),
            holders: std::sync::Mutex::default(),
            metrics,
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Holders> {
        self.holders.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes every watch holds together.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    /// Where a message of a watch ends: [`MAX_BYTES_PER_MESSAGE`], or half
    /// a buffer (so that a message always fits one).
    pub(crate) fn message_bytes(&self) -> usize {
        MAX_BYTES_PER_MESSAGE.min(self.per_watch / 2)
    }

    pub(crate) fn register(&self, queue: &Arc<WatchQueue>) -> u64 {
        let mut h = self.lock();
        let id = h.next_id;
        h.next_id += 1;
        h.watches.insert(
            id,
            Holder {
                queue: Arc::downgrade(queue),
                bytes: 0,
                waits_since: None,
            },
        );
        id
    }

    /// Forgets a watch whose buffer was emptied.
    pub(crate) fn unregister(&self, id: u64) {
        self.lock().watches.remove(&id);
    }

    pub(crate) fn show(&self, h: &Holders) {
        if let Some(m) = &self.metrics {
            m.watch_buffered_bytes.set(h.used as i64);
        }
    }

    /// Takes `n` bytes if they fit; otherwise, when `evict`, names the
    /// watch (other than `id`) whose client has left a message untaken the
    /// longest, to be closed.
    pub(crate) fn reserve(&self, id: u64, n: usize, evict: bool) -> Reserved {
        let mut h = self.lock();
        if h.used + n <= self.limit {
            h.used += n;
            self.show(&h);
            return Reserved::Done;
        }
        if !evict {
            return Reserved::Short;
        }
        let victim = h
            .watches
            .iter()
            .filter(|(other, w)| **other != id && w.bytes > 0)
            .min_by_key(|(other, w)| (w.waits_since, **other))
            .and_then(|(_, w)| w.queue.upgrade());
        match victim {
            Some(q) => Reserved::Evict(q),
            None => Reserved::Short,
        }
    }

    /// Gives back `n` reserved bytes that were not queued.
    pub(crate) fn unreserve(&self, n: usize) {
        let mut h = self.lock();
        h.used -= n;
        self.show(&h);
    }

    /// `n` reserved bytes are queued in watch `id`'s buffer, which was
    /// `empty` before (called under its buffer's lock, so what a holder
    /// shows is what its buffer holds).
    pub(crate) fn hold(&self, id: u64, n: usize, empty: bool) {
        if let Some(w) = self.lock().watches.get_mut(&id) {
            w.bytes += n;
            if empty {
                w.waits_since = Some(std::time::Instant::now());
            }
        }
    }

    /// `n` bytes left watch `id`'s buffer, which holds `more` after them
    /// (called under its lock).
    pub(crate) fn release(&self, id: u64, n: usize, more: bool) {
        let mut h = self.lock();
        h.used -= n;
        if let Some(w) = h.watches.get_mut(&id) {
            w.bytes -= n;
            w.waits_since = more.then(std::time::Instant::now);
        }
        self.show(&h);
    }

    /// How long watch `id`'s client has left its first message untaken.
    pub(crate) fn waiting(&self, id: u64) -> std::time::Duration {
        self.lock()
            .watches
            .get(&id)
            .and_then(|w| w.waits_since)
            .map_or(std::time::Duration::ZERO, |t| t.elapsed())
    }
}

/// How a reservation went.
pub(crate) enum Reserved {
    Done,
    /// No room, and none to make.
    Short,
    /// No room: close this watch to make some.
    Evict(Arc<WatchQueue>),
}

/// What a watch's pump has queued and its client has not taken yet.
#[derive(Debug, Default)]
pub(crate) struct Buffer {
    /// Messages and their bytes ([`charge`]), or the status that ends the
    /// stream.
    pub(crate) items: std::collections::VecDeque<(Result<pb::WatchResponse, Status>, usize)>,
    /// Events in `items`.
    pub(crate) events: usize,
    /// Their bytes ([`charge`]).
    pub(crate) bytes: usize,
    /// Messages the client has taken.
    pub(crate) taken: u64,
    /// The first revision the client's stream has not taken: one past the
    /// last event it took (the watch's first revision before that). What
    /// the stream took is on its way to the client, ahead of any status
    /// (tonic sends a stream's error as trailers after the data it took,
    /// and h2 sends a stream's frames in order), so a watch ended from
    /// here tells its client to watch again from this revision: it never
    /// skips what was not delivered (and repeats nothing, but for events
    /// a job filter or a partial viewer hid).
    pub(crate) resume: u64,
    /// Nothing more will come after `items`.
    pub(crate) done: bool,
    /// The client's end was dropped.
    pub(crate) client_gone: bool,
}

/// The bounded buffer between a watch's pump (which reads the store and
/// the live events) and its client's stream.
#[derive(Debug)]
pub(crate) struct WatchQueue {
    pub(crate) buffer: std::sync::Mutex<Buffer>,
    /// The client took something, left, or the watch was ended.
    pub(crate) wake_pump: tokio::sync::Notify,
    /// Something to take, or the end.
    pub(crate) wake_client: tokio::sync::Notify,
    pub(crate) memory: Arc<WatchMemory>,
    /// This watch in `memory`.
    pub(crate) id: std::sync::OnceLock<u64>,
    pub(crate) metrics: Option<Arc<Metrics>>,
}

/// How a push went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Sent,
    /// The buffer is full, or the watches' memory is and this buffer holds
    /// something: nothing was queued.
    Full,
    /// The client left, or the watch was ended.
    Closed,
}

impl WatchQueue {
    /// A watch's buffer, its first revision `from`.
    pub(crate) fn new(
        memory: Arc<WatchMemory>,
        from: u64,
        metrics: Option<Arc<Metrics>>,
    ) -> Arc<Self> {
        if let Some(m) = &metrics {
            m.watch_streams.inc();
        }
        let q = Arc::new(WatchQueue {
            buffer: std::sync::Mutex::new(Buffer {
                resume: from,
                ..Buffer::default()
            }),
            wake_pump: tokio::sync::Notify::new(),
            wake_client: tokio::sync::Notify::new(),
            memory: memory.clone(),
            id: std::sync::OnceLock::new(),
            metrics,
        });
        let _ = q.id.set(memory.register(&q));
        q
    }

    pub(crate) fn id(&self) -> u64 {
        self.id.get().copied().unwrap_or(u64::MAX)
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count(&self, delta: i64) {
        if let Some(m) = &self.metrics {
            m.watch_buffered_events.inc_by(delta);
        }
    }

    /// Queues a message of `bytes` (its events' [`charge`]) if there is
    /// room: in its buffer (always, into an empty one) and in the watches'
    /// memory, closing the watches that hold the most if this buffer is
    /// empty.
    pub(crate) fn push(&self, message: pb::WatchResponse, bytes: usize) -> Pushed {
        let n = message.events.len();
        let empty = {
            let b = self.lock();
            if b.client_gone || b.done {
                return Pushed::Closed;
            }
            if !b.items.is_empty() && b.bytes + bytes > self.memory.per_watch {
                return Pushed::Full;
            }
            b.items.is_empty()
        };
        loop {
            match self.memory.reserve(self.id(), bytes, empty) {
                Reserved::Done => break,
                Reserved::Short if !empty => return Pushed::Full,
                // Nothing else holds memory, and this watch needs more than
                // there is (a message is at most half a buffer: only with
                // the limits set below one event).
                Reserved::Short => {
                    self.abandon(&format!(
                        "one message of {} is more than the watches' memory ({})",
                        shown_bytes(bytes),
                        shown_bytes(self.memory.limit)
                    ));
                    return Pushed::Closed;
                }
                // Each eviction frees what that watch held (more than
                // nothing), so this ends.
                Reserved::Evict(q) => q.abandon(&format!(
                    "the watches' buffers hold at most {} together and its client left a message untaken longest ({} ms; {} buffered)",
                    shown_bytes(self.memory.limit),
                    self.memory.waiting(q.id()).as_millis(),
                    shown_bytes(q.lock().bytes)
                )),
            }
        }
        let mut b = self.lock();
        if b.client_gone || b.done {
            drop(b);
            self.memory.unreserve(bytes);
            return Pushed::Closed;
        }
        b.items.push_back((Ok(message), bytes));
        b.events += n;
        b.bytes += bytes;
        self.memory.hold(self.id(), bytes, b.items.len() == 1);
        drop(b);
        self.count(n as i64);
        self.wake_client.notify_one();
        Pushed::Sent
    }

    /// Messages the client has taken so far.
    pub(crate) fn taken(&self) -> u64 {
        self.lock().taken
    }

    /// Ends the stream with RESOURCE_EXHAUSTED saying `why` and where to
    /// watch again from (the first revision its stream did not take),
    /// dropping what is buffered (also after a status that was to end it:
    /// the client meets that one again when it watches again). Does nothing
    /// once the client has left.
    pub(crate) fn abandon(&self, why: &str) {
        let mut b = self.lock();
        if b.client_gone {
            return;
        }
        let dropped = std::mem::take(&mut b.items);
        let n = std::mem::take(&mut b.events);
        let bytes = std::mem::take(&mut b.bytes);
        self.memory.release(self.id(), bytes, false);
        let error = Status::resource_exhausted(format!(
            "watch ended: {why}; watch again from revision {}",
            b.resume
        ));
        b.items.push_back((Err(crate::status::contract(error)), 0));
        b.done = true;
        drop(b);
        drop(dropped);
        self.count(-(n as i64));
        self.wake_client.notify_one();
        self.wake_pump.notify_one();
    }

    /// Ends the stream after what is buffered, then `error` if given.
    pub(crate) fn finish(&self, error: Option<Status>) {
        let mut b = self.lock();
        if !b.done {
            if let Some(e) = error {
                b.items.push_back((Err(crate::status::contract(e)), 0));
            }
            b.done = true;
        }
        drop(b);
        self.wake_client.notify_one();
    }

    /// Resolves when the client took something or left, or the watch was
    /// ended (callers check which).
    pub(crate) async fn client_moved(&self) {
        self.wake_pump.notified().await;
    }

    /// The client left, or the watch was ended: the pump stops.
    pub(crate) fn closed(&self) -> bool {
        let b = self.lock();
        b.client_gone || b.done
    }

    /// The client's next message; `None` at the end.
    pub(crate) async fn take(&self) -> Option<Result<pb::WatchResponse, Status>> {
        loop {
            let more = self.wake_client.notified();
            {
                let mut b = self.lock();
                if let Some((item, bytes)) = b.items.pop_front() {
                    let n = match &item {
                        Ok(m) => {
                            if let Some(last) = m.events.last() {
                                b.resume = last.revision + 1;
                            }
                            m.events.len()
                        }
                        Err(_) => 0,
                    };
                    b.events -= n;
                    b.bytes -= bytes;
                    b.taken += 1;
                    self.memory.release(self.id(), bytes, b.bytes > 0);
                    drop(b);
                    self.count(-(n as i64));
                    self.wake_pump.notify_one();
                    return Some(item);
                }
                if b.done {
                    return None;
                }
            }
            more.await;
        }
    }
}

/// The client's end of a watch: dropping it tells the pump and frees what
/// is buffered at once.
#[derive(Debug)]
pub(crate) struct ClientEnd(pub(crate) Arc<WatchQueue>);

impl Drop for ClientEnd {
    fn drop(&mut self) {
        let q = &self.0;
        let mut b = q.lock();
        b.client_gone = true;
        let dropped = std::mem::take(&mut b.items);
        let n = std::mem::take(&mut b.events);
        let bytes = std::mem::take(&mut b.bytes);
        q.memory.release(q.id(), bytes, false);
        q.memory.unregister(q.id());
        drop(b);
        drop(dropped);
        q.count(-(n as i64));
        if let Some(m) = &q.metrics {
            m.watch_streams.dec();
        }
        q.wake_pump.notify_one();
    }
}

/// How filling a watch's buffer went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Filled {
    /// Everything asked for is queued.
    All,
    /// The buffer is full; `next` is the first revision not queued.
    Full,
    /// The client left, or the watch was ended.
    Closed,
}
