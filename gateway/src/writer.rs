//! The store's writer thread: it commits the loop's batch N while the
//! loop steps iteration N+1 (a pipelined commit), taking the store's
//! inserts and its sync off the loop thread.
//!
//! One batch is in flight at a time: the loop hands the next one over only
//! once the last one is written, so batches land in the order they were
//! made, and a batch that fails is retried by the loop before anything
//! after it is written. What waits for a batch (answers, launches, kills,
//! acks, events) is held by the loop until the writer says it is durable.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::store::{Store, StoreError, WriteBatch};

/// A batch back from the writer: written, or why not.
#[derive(Debug)]
pub struct Written {
    /// The batch (its lists' room serves a later one; a failed one is
    /// retried).
    pub batch: WriteBatch,
    /// Whether it is durable.
    pub result: Result<(), StoreError>,
    /// How long the commit took.
    pub took: Duration,
}

/// The writer thread and its two channels.
#[derive(Debug)]
pub struct Writer {
    to: Option<mpsc::SyncSender<WriteBatch>>,
    from: tokio::sync::mpsc::UnboundedReceiver<Written>,
    thread: Option<JoinHandle<()>>,
    busy: bool,
}

impl Writer {
    /// Starts the thread over `store`.
    pub fn start(store: Arc<dyn Store>) -> std::io::Result<Writer> {
        let (to, rx) = mpsc::sync_channel::<WriteBatch>(1);
        let (tx, from) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("peloton-writer".into())
            .spawn(move || {
                for batch in rx {
                    let start = Instant::now();
                    let result = store.commit(&batch);
                    let took = start.elapsed();
                    if tx
                        .send(Written {
                            batch,
                            result,
                            took,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            })?;
        Ok(Writer {
            to: Some(to),
            from,
            thread: Some(thread),
            busy: false,
        })
    }

    /// Hands `batch` to the thread. The last one must be back first.
    pub fn send(&mut self, batch: WriteBatch) {
        assert!(!self.busy, "one batch in flight at a time");
        self.to
            .as_ref()
            .expect("running")
            .send(batch)
            .expect("the store's writer thread is gone");
        self.busy = true;
    }

    /// The batch in flight once written (blocks); None when none is.
    pub fn wait(&mut self) -> Option<Written> {
        if !self.busy {
            return None;
        }
        let w = self
            .from
            .blocking_recv()
            .expect("the store's writer thread is gone");
        self.busy = false;
        Some(w)
    }

    /// The batch in flight if it is written already.
    pub fn try_take(&mut self) -> Option<Written> {
        if !self.busy {
            return None;
        }
        match self.from.try_recv() {
            Ok(w) => {
                self.busy = false;
                Some(w)
            }
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                panic!("the store's writer thread is gone")
            }
        }
    }

    /// Waits (async) for the batch in flight; pending for ever when none
    /// is (a `select!` arm beside the loop's commands).
    pub async fn written(&mut self) -> Written {
        if !self.busy {
            return std::future::pending().await;
        }
        let w = self
            .from
            .recv()
            .await
            .expect("the store's writer thread is gone");
        self.busy = false;
        w
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel ends the thread after the batch in flight.
        self.to = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
