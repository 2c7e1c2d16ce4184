//! Peloton's gRPC API: the `peloton.v1` protobuf package, generated at build
//! time. See `proto/peloton/v1/peloton.proto` for the documentation of
//! every message and field.

#![allow(missing_docs, clippy::all, clippy::pedantic, rust_2018_idioms)]
#![allow(missing_debug_implementations)]

/// `peloton.v1`.
pub mod v1 {
    tonic::include_proto!("peloton.v1");

    /// The encoded file descriptor set, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/peloton_descriptor.bin"));
}
