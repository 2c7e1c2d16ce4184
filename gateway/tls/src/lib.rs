//! Peloton's one place for TLS: a private certificate authority and the
//! certificates it issues ([`ensure_local_ca`], [`Pki`]), the server's
//! rustls configuration and acceptor ([`server_config`], [`tls_incoming`]),
//! the names a peer's certificate vouches for ([`cert_names`],
//! [`cert_allows_host`]) and client configurations ([`client_config`]).
//!
//! Nothing else in the tree builds a rustls config or makes a key. Keys and
//! certificates come from rcgen (no hand-made crypto) and are kept as PEM
//! files, keys with mode 0600, each written to a temporary file and renamed
//! so a crash never leaves half a key behind.
//!
//! Key design decision: rustls runs on the ring provider only, passed
//! explicitly to every config builder, never installed as the process
//! default (a default depends on which features some other crate turned on,
//! and aws-lc-rs would need cmake and nasm). The versions are the ones tonic
//! 0.14's `tls-ring` feature uses, so [`tls_incoming`]'s streams are the
//! `tokio_rustls::server::TlsStream` that tonic's `Connected` accepts and
//! client certificates reach `tonic::Request::peer_certs`.
//!
//! Client certificates are optional on the server: agents present one
//! naming their host, API clients may present a user certificate
//! ([`user_csr`], [`Pki::sign_user_csr`]) or none. Authorisation is the
//! caller's decision, with [`cert_allows_host`].

mod config;
mod incoming;
mod names;
mod pki;
#[cfg(feature = "testkit")]
pub mod testkit;
mod user;

pub use config::{client_config, load_pem_files, server_config};
pub use incoming::{HANDSHAKE_TIMEOUT, MAX_CONCURRENT_HANDSHAKES, tls_incoming};
pub use names::{cert_allows_host, cert_names};
pub use pki::{CA_COMMON_NAME, CertPair, Pki, ensure_local_ca};
pub use user::{
    DEFAULT_USER_CERT_DAYS, MAX_CSR_PEM_BYTES, MAX_USER_CERT_DAYS, SignError, USER_PREFIX,
    UserCert, UserCsr, agent_csr, is_user_cert, user_csr,
};

/// The rustls this crate builds on, so callers name the same types.
pub use rustls;
/// The tokio-rustls this crate builds on (the type of [`tls_incoming`]'s streams).
pub use tokio_rustls;
