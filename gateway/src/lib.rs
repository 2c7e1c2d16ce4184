//! Peloton's service around the engine: the gRPC API, the scheduling loop
//! that owns the engine, durable storage, job and task lifecycle, and the
//! host manager's backends. See ARCHITECTURE.md for the map.

pub mod agents;
pub mod backend;
pub mod config;
pub mod convert;
pub mod demo;
pub mod lifecycle;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod status;
pub mod store;
