//! Peloton's service around the engine: the gRPC API, the scheduling loop
//! that owns the engine, durable storage, job and task lifecycle, and the
//! host manager's backends. See ARCHITECTURE.md for the map.

pub mod access;
pub mod agent_backend;
pub mod agent_hub;
pub mod agents;
pub mod audit;
pub mod backend;
pub mod client;
pub mod clock;
pub mod codec;
pub mod command;
pub mod config;
pub mod console;
pub mod convert;
pub mod demo;
pub mod edit;
pub mod forecaster;
/// The lifecycle core (its own crate: it cannot reach tonic, prost, tokio or
/// redb even by accident).
pub use peloton_lifecycle as lifecycle;
pub mod hostpools;
pub mod http;
pub mod leader;
pub mod local_pg;
pub mod metrics;
pub mod paging;
pub mod persist;
pub mod pgstore;
pub mod reads;
pub mod refused;
pub mod reopening;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod status;
pub mod store;
pub mod store_codec;
pub mod writer;
