//! Compiles `proto/peloton/v1/*.proto` with protox (a pure-Rust protobuf
//! compiler, so no system `protoc` is needed) and generates prost messages
//! and tonic clients and servers. The file descriptor set is kept for gRPC
//! reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/peloton/v1/peloton.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("peloton_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
