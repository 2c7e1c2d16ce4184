//! rustls configurations, always on the ring provider passed explicitly.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::pki::CertPair;

/// The ALPN protocols the server offers, preferred first: HTTP/2 for gRPC,
/// HTTP/1.1 for clients that speak only it (curl --http1.1, Python's urllib3).
const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server's rustls configuration: the certificate chain `cert_pem`
/// (leaf first) with its key `key_pem`, ALPN `h2` then `http/1.1`, TLS 1.2
/// and 1.3.
///
/// With `client_ca_pem`, a client certificate is asked for and, when one is
/// presented, must chain to that CA or the handshake fails; a client may
/// also present none (API clients), so whether a peer has a certificate is
/// for the caller to check. Without it, no certificate is asked for.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&str>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let chain = certs_from_pem(cert_pem, "the server certificate")?;
    let key = key_from_pem(key_pem, "the server key")?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("the ring provider's protocol versions")?;
    let builder = match client_ca_pem {
        Some(ca_pem) => {
            let roots = root_store(ca_pem, "the client CA")?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .context("the client CA: building a certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("the server certificate and key do not make a usable pair")?;
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A client's rustls configuration that trusts only the CA `ca_pem`,
/// offers ALPN `h2`, and presents `identity` as its client certificate when
/// given.
pub fn client_config(ca_pem: &str, identity: Option<&CertPair>) -> anyhow::Result<ClientConfig> {
    let roots = root_store(ca_pem, "the CA certificate")?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the ring provider's protocol versions")?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(pair) => builder
            .with_client_auth_cert(
                certs_from_pem(&pair.cert_pem, "the client certificate")?,
                key_from_pem(&pair.key_pem, "the client key")?,
            )
            .context("the client certificate and key do not make a usable pair")?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Reads a certificate (chain) and its key from PEM files, checking that
/// `cert` holds at least one certificate and `key` a private key.
pub fn load_pem_files(cert: &Path, key: &Path) -> anyhow::Result<CertPair> {
    let cert_pem =
        std::fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
    let key_pem =
        std::fs::read_to_string(key).with_context(|| format!("reading {}", key.display()))?;
    certs_from_pem(&cert_pem, &cert.display().to_string())?;
    key_from_pem(&key_pem, &key.display().to_string())?;
    Ok(CertPair { cert_pem, key_pem })
}

/// Every certificate in `pem`, in order; `what` names the source in errors.
fn certs_from_pem(pem: &str, what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{what}: bad PEM: {e}"))?;
    if certs.is_empty() {
        bail!("{what}: no CERTIFICATE block in the PEM");
    }
    Ok(certs)
}

/// The first certificate in `pem`, DER; `what` names the source in errors.
pub(crate) fn first_cert_der(pem: &str, what: &str) -> anyhow::Result<CertificateDer<'static>> {
    let mut certs = certs_from_pem(pem, what)?;
    Ok(certs.swap_remove(0))
}

fn key_from_pem(pem: &str, what: &str) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| anyhow!("{what}: no private key in the PEM: {e}"))
}

fn root_store(ca_pem: &str, what: &str) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs_from_pem(ca_pem, what)? {
        roots
            .add(cert)
            .with_context(|| format!("{what}: not a usable trust anchor"))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ensure_local_ca;

    #[test]
    fn server_config_offers_h2_then_http11() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let server = pki.issue_server(&["localhost".to_owned()]).unwrap();
        for client_ca in [None, Some(pki.ca_cert_pem.as_str())] {
            let config = server_config(&server.cert_pem, &server.key_pem, client_ca).unwrap();
            assert_eq!(
                config.alpn_protocols,
                [b"h2".to_vec(), b"http/1.1".to_vec()]
            );
        }
    }

    #[test]
    fn mismatched_or_missing_pem_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let a = pki.issue_server(&["localhost".to_owned()]).unwrap();
        let b = pki.issue_server(&["localhost".to_owned()]).unwrap();
        let error = format!(
            "{:#}",
            server_config(&a.cert_pem, &b.key_pem, None).unwrap_err()
        );
        assert!(error.contains("do not make a usable pair"), "{error}");
        let error = format!("{:#}", server_config("", &a.key_pem, None).unwrap_err());
        assert!(
            error.contains("the server certificate: no CERTIFICATE"),
            "{error}"
        );
        let error = format!(
            "{:#}",
            server_config(&a.cert_pem, &a.cert_pem, None).unwrap_err()
        );
        assert!(error.contains("the server key"), "{error}");

        let cert = tmp.path().join("x.pem");
        let key = tmp.path().join("x.key");
        let error = format!("{:#}", load_pem_files(&cert, &key).unwrap_err());
        assert!(error.contains("x.pem"), "{error}");
        a.write(&cert, &key).unwrap();
        std::fs::write(&key, "garbage").unwrap();
        let error = format!("{:#}", load_pem_files(&cert, &key).unwrap_err());
        assert!(error.contains("x.key: no private key"), "{error}");
    }
}
