//! Peloton's scheduling core.
//!
//! This crate decides; it never does. It holds resource pools, computes their
//! fair entitlement, and admits queued work, as plain synchronous functions
//! over columnar state. It knows nothing of protobuf, async runtimes, files or
//! sockets: the gateway converts API types into these and feeds batches in
//! from one loop thread. Pools and (later) hosts and tasks are addressed by
//! dense `u32` slot indices with generations; per-pool data is kept in
//! columns, one per resource dimension, so each computation is a loop over
//! columns. Every result is deterministic: the same input gives the same
//! output on any number of threads.

pub mod admission;
pub mod backfill;
pub mod constraint;
pub mod engine;
pub mod entitlement;
pub mod forecast;
pub mod gpufrag;
pub mod host;
pub mod intern;
pub mod manager;
pub mod placement;
pub mod pool;
pub mod preemption;
pub mod resources;
pub mod scan;
pub mod task;
pub mod testkit;

pub use admission::{
    AdmissionError, AdmissionLimits, AdmissionResult, Admitted, Allocation, BlockKind, Blocked,
    Ceiling, MAX_QUEUE_READ, NeverAdmitted, PendingId, PendingTask, QueuedEntry, TaskClass,
    TaskFlags, TaskId,
};
pub use engine::{CycleReport, Engine, EngineConfig, EngineError, NewTask};
pub use entitlement::{
    DimEntitlement, EntitlementCalculator, EntitlementInput, Entitlements, WaterFillStats,
};
pub use forecast::{Forecast, ForecastConfig, Preemption, Start, Stopped, TaskForecast};
pub use manager::{PoolUsage, ResourceManager, ResourceManagerConfig};
pub use pool::{DimConfig, PoolConfig, PoolError, PoolId, PoolKind, PoolTree, PoolTreeLimits};
pub use resources::{Dim, MAX_AMOUNT, N_DIMS, Resources};
