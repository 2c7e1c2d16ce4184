//! Compiles `proto/peloton/v1/*.proto` with protox (a pure-Rust protobuf
//! compiler, so no system `protoc` is needed) and generates prost messages
//! and tonic clients and servers. The encoded file descriptor set is kept,
//! with its custom options (the `google.api.http` bindings the JSON/HTTP
//! mirror reads), for gRPC reflection and for the mirror.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/peloton/v1/peloton.proto",
        "proto/google/api/annotations.proto",
        "proto/google/api/http.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_file("proto/peloton/v1/peloton.proto")?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // `encode_file_descriptor_set` keeps extension options, which the
    // prost-types form would drop.
    std::fs::write(
        out.join("peloton_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
