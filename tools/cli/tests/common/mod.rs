//! Shared by the suites that run the `peloton` binary against servers in
//! this process: every server is secure, as servers are by default (TLS
//! with the test CA and server certificate of `peloton_tls::testkit`, the
//! admin token [`ADMIN_TOKEN`]), and every CLI run trusts that CA and sends
//! that token (`PELOTON_CA_FILE`, `PELOTON_TOKEN`), with none of the
//! developer's own settings. tests/secure.rs covers the other ways to give
//! the CA and the token, and the one insecure (`http://`) server.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use peloton_cli::channel::Security;
use peloton_gateway::config::Config;
use tokio::process::Command;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// The bootstrap admin token of every test server.
pub const ADMIN_TOKEN: &str = "pel_cli_suites_admin_token_0123";

/// Every variable the CLI reads, cleared for each run.
const CLI_VARS: &[&str] = &[
    "PELOTON_SERVER",
    "PELOTON_CA_FILE",
    "PELOTON_CONFIG",
    "PELOTON_TOKEN",
    "PELOTON_TOKEN_FILE",
];

/// The default configuration with the tests' certificates and admin token.
pub fn secure_config() -> Config {
    let pki = peloton_tls::testkit::shared();
    Config {
        secure: true,
        tls_cert: Some(pki.server_cert.clone()),
        tls_key: Some(pki.server_key.clone()),
        tls_client_ca: Some(pki.ca_file.clone()),
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        ..Config::default()
    }
}

/// The test CA's certificate file.
pub fn ca_file() -> &'static Path {
    &peloton_tls::testkit::shared().ca_file
}

/// A server's URL.
pub fn url(addr: SocketAddr) -> String {
    format!("https://{addr}")
}

/// The CLI with none of the developer's settings: no `PELOTON_*` variable,
/// no default config file (`XDG_CONFIG_HOME` names a directory that does
/// not exist, in the test CA's).
pub fn bare_cli() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peloton"));
    for var in CLI_VARS {
        cmd.env_remove(var);
    }
    let no_config: PathBuf = ca_file()
        .parent()
        .expect("the test CA's directory")
        .join("no-config");
    cmd.env("XDG_CONFIG_HOME", no_config);
    cmd
}

/// The CLI trusting the test CA and sending the admin token (addresses
/// without a scheme are `https://`).
pub fn cli() -> Command {
    let mut cmd = bare_cli();
    cmd.env("PELOTON_CA_FILE", ca_file())
        .env("PELOTON_TOKEN", ADMIN_TOKEN);
    cmd
}

/// The CA certificate, for a client in the test.
pub fn ca_certificate() -> Certificate {
    Certificate::from_pem(std::fs::read(ca_file()).expect("the test CA's certificate"))
}

/// What [`cli`] gives the CLI, for a [`peloton_cli::channel::LeaderChannel`]
/// in the test.
pub fn security() -> Security {
    Security {
        ca: Some((ca_certificate(), ca_file().display().to_string())),
        identity: None,
        authorization: None,
    }
    .with_token(ADMIN_TOKEN)
    .expect("an ASCII token")
}

/// An endpoint for `url` (`https://`) trusting the test CA.
pub fn endpoint(url: &str) -> Endpoint {
    Endpoint::from_shared(url.to_owned())
        .expect("uri")
        .tls_config(ClientTlsConfig::new().ca_certificate(ca_certificate()))
        .expect("TLS config")
}

/// `message` with the admin token, for a client in the test.
pub fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}")
            .parse()
            .expect("an ASCII token"),
    );
    request
}
