//! The `peloton` command-line client: reads YAML specs, calls the Peloton
//! gRPC API and prints tables for people or JSON for programs.
//!
//! It holds no scheduling logic and validates only the shape of its input
//! files; what values mean is the server's to judge. Given several servers
//! (one leading), it finds the leader by itself ([`servers`], [`channel`]);
//! to a secure server it speaks TLS and sends a bearer token ([`settings`]). The binary
//! (`src/main.rs`) is a thin shell around [`cmd::run`]; everything else lives
//! here so it can be unit-tested without a server.

pub mod channel;
pub mod cli;
pub mod cmd;
pub mod error;
pub mod explain;
pub mod names;
pub mod output;
pub mod peloton_yaml;
pub mod servers;
pub mod settings;
pub mod spec;

/// Largest answer the CLI accepts (a host list of a large cluster, a job
/// with many instances).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
