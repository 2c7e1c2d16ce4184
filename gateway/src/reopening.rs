//! A store that closes itself after a failed commit and opens again on the
//! next use, so that the service outlives a full disk.
//!
//! redb refuses every operation after an I/O error (`PreviousIo`) until the
//! database is opened again, and opening it repairs what the failed commit
//! left. So a commit that fails drops the store; the next commit (the loop
//! retries with a back-off) or watch replay opens it again, which fails as
//! long as the disk is full and succeeds once space returns. What was
//! committed before stays committed: the failed transaction never became
//! the database's state, and the loop keeps the failed batch and commits it
//! whole on a later try.

use std::sync::RwLock;

use crate::store::{Snapshot, Store, StoreError, WriteBatch};

/// Opens the inner store.
pub type Opener = Box<dyn Fn() -> Result<Box<dyn Store>, StoreError> + Send + Sync>;

/// See the module documentation.
pub struct ReopeningStore {
    open: Opener,
    /// `None` after a failed commit, until an open succeeds.
    current: RwLock<Option<Box<dyn Store>>>,
}

impl std::fmt::Debug for ReopeningStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.current.read().map(|c| c.is_some()).unwrap_or(false);
        f.debug_struct("ReopeningStore")
            .field("open", &open)
            .finish_non_exhaustive()
    }
}

impl ReopeningStore {
    /// Opens the store now (an error here is the caller's: nothing to
    /// serve from).
    pub fn open(open: Opener) -> Result<Self, StoreError> {
        let first = open()?;
        Ok(ReopeningStore {
            open,
            current: RwLock::new(Some(first)),
        })
    }

    /// Runs `f` on the open store, opening it first if a failed commit
    /// closed it.
    fn with<T>(&self, f: impl Fn(&dyn Store) -> Result<T, StoreError>) -> Result<T, StoreError> {
        {
            let current = self.current.read().unwrap_or_else(|e| e.into_inner());
            if let Some(store) = current.as_deref() {
                return f(store);
            }
        }
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.is_none() {
            *current = Some((self.open)()?);
            tracing::info!("store opened again");
        }
        f(current.as_deref().expect("just opened"))
    }

    /// Closes the store (after a failed commit): the next use opens it.
    fn close(&self) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = None;
    }
}

impl Store for ReopeningStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.with(|s| s.load())
    }

    fn commit(&self, batch: &WriteBatch) -> Result<(), StoreError> {
        let r = self.with(|s| s.commit(batch));
        if r.is_err() {
            // A failed open leaves it closed already; a failed commit may
            // have poisoned the database (redb: `PreviousIo`).
            self.close();
        }
        r
    }

    fn events_from(&self, from: u64, max_rows: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        self.with(|s| s.events_from(from, max_rows))
    }
}
