//! Client certificates for API users: the request a client makes
//! ([`user_csr`]) and the certificate the server's CA signs for it
//! ([`Pki::sign_user_csr`]).
//!
//! A user certificate names one thing, `CN=user:<name>`, and may be used
//! for client authentication only. The server does not trust the name: it
//! accepts a certificate for API calls only when its fingerprint is
//! recorded with a token (the name is for people reading it). Agents'
//! certificates name hosts; a certificate naming a `user:` is never taken
//! for an agent's ([`is_user_cert`]).

use anyhow::{Context, anyhow};
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use time::{Duration, OffsetDateTime};

use crate::names::cert_names;
use crate::pki::{CLOCK_SKEW_HOURS, Pki, common_name_only};

/// What a user certificate's common name starts with.
pub const USER_PREFIX: &str = "user:";
/// Days a user certificate is valid when the request does not say.
pub const DEFAULT_USER_CERT_DAYS: u32 = 90;
/// Most days a user certificate may be valid.
pub const MAX_USER_CERT_DAYS: u32 = 365;
/// Longest certificate request read.
pub const MAX_CSR_PEM_BYTES: usize = 16 * 1024;

/// A new key pair and a certificate request for `CN=user:<name>`, both PEM.
#[derive(Clone)]
pub struct UserCsr {
    /// The private key (PKCS#8): stays with the client.
    pub key_pem: String,
    /// The request to send to the server.
    pub csr_pem: String,
}

impl std::fmt::Debug for UserCsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserCsr")
            .field("csr_pem", &self.csr_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Makes an ECDSA P-256 key and a certificate request for `name`'s user
/// certificate.
pub fn user_csr(name: &str) -> anyhow::Result<UserCsr> {
    csr_for(&format!("{USER_PREFIX}{name}"))
}

/// Makes an ECDSA P-256 key and a certificate request for an agent's
/// certificate naming `host` ([`Pki::sign_agent_csr`]).
pub fn agent_csr(host: &str) -> anyhow::Result<UserCsr> {
    csr_for(host)
}

fn csr_for(common_name: &str) -> anyhow::Result<UserCsr> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generating a key")?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name_only(common_name);
    let csr = params
        .serialize_request(&key)
        .context("making the certificate request")?;
    Ok(UserCsr {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem().context("encoding the certificate request")?,
    })
}

/// A user certificate the CA signed.
#[derive(Clone, Debug)]
pub struct UserCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The certificate, DER (what a TLS peer presents; its digest is the
    /// fingerprint).
    pub der: Vec<u8>,
    /// When it stops being valid, in seconds since the epoch.
    pub not_after_unix_s: i64,
}

impl Pki {
    /// Signs a user certificate for `name` with the public key of
    /// `csr_pem` (whose self-signature must verify), valid for `days`
    /// (1 to [`MAX_USER_CERT_DAYS`]). Nothing else of the request is used:
    /// the subject is `CN=user:<name>`, there are no alternative names, and
    /// the only extended key usage is clientAuth. The error says what is
    /// wrong with the request.
    pub fn sign_user_csr(
        &self,
        name: &str,
        csr_pem: &str,
        days: u32,
    ) -> Result<UserCert, SignError> {
        self.sign_csr(&format!("{USER_PREFIX}{name}"), None, csr_pem, days)
    }

    /// Signs an agent's certificate for `host` with the public key of
    /// `csr_pem`, as [`Pki::sign_user_csr`] does a user's: the subject is
    /// `CN=<host>` and its one alternative name is `host` (what the server
    /// checks an agent's registration against), clientAuth only. `host`
    /// must not name a user.
    pub fn sign_agent_csr(
        &self,
        host: &str,
        csr_pem: &str,
        days: u32,
    ) -> Result<UserCert, SignError> {
        if host.starts_with(USER_PREFIX) {
            return Err(SignError::Request(format!(
                "host {host:?}: a name starting {USER_PREFIX:?} is a user's"
            )));
        }
        let san = crate::pki::san(host)
            .map_err(|e| SignError::Request(format!("host {host:?}: {e:#}")))?;
        self.sign_csr(host, Some(san), csr_pem, days)
    }

    fn sign_csr(
        &self,
        common_name: &str,
        san: Option<rcgen::SanType>,
        csr_pem: &str,
        days: u32,
    ) -> Result<UserCert, SignError> {
        let bad = |why: String| SignError::Request(why);
        if !(1..=MAX_USER_CERT_DAYS).contains(&days) {
            return Err(bad(format!(
                "{days} days: must be 1 to {MAX_USER_CERT_DAYS}"
            )));
        }
        if csr_pem.len() > MAX_CSR_PEM_BYTES {
            return Err(bad(format!(
                "{} bytes: a certificate request is at most {MAX_CSR_PEM_BYTES}",
                csr_pem.len()
            )));
        }
        let request = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
            bad(format!(
                "not a valid PEM certificate request (PKCS#10): {e}"
            ))
        })?;
        let requested_key = requested_key_der(csr_pem).map_err(|e| bad(format!("{e:#}")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_only(common_name);
        params.subject_alt_names = san.into_iter().collect();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial().map_err(SignError::Ca)?);
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(CLOCK_SKEW_HOURS);
        params.not_after = now + Duration::days(i64::from(days));
        let not_after_unix_s = params.not_after.unix_timestamp();
        let signing = CertificateSigningRequestParams {
            params,
            public_key: request.public_key,
        };
        let ca = || -> anyhow::Result<_> {
            let ca_key = KeyPair::from_pem(self.ca_key_pem()).context("the CA key")?;
            Issuer::from_ca_cert_pem(&self.ca_cert_pem, ca_key).context("the CA certificate")
        };
        let issuer = ca().map_err(|e| SignError::Ca(format!("{e:#}")))?;
        let cert = signing
            .signed_by(&issuer)
            .map_err(|e| bad(format!("cannot sign a certificate for its key: {e}")))?;
        // The library rebuilds the key from the request's signature
        // algorithm; a key of another kind than that algorithm's (a P-256 key
        // signed with SHA-384, say) would come out as another key.
        let (_, issued) = x509_parser::parse_x509_certificate(cert.der())
            .map_err(|e| SignError::Ca(format!("the signed certificate does not parse: {e}")))?;
        if issued.public_key().raw != requested_key.as_slice() {
            return Err(bad(
                "its key does not match its signature algorithm (use ECDSA P-256 with SHA-256, \
                 P-384 with SHA-384, Ed25519 or RSA)"
                    .to_owned(),
            ));
        }
        Ok(UserCert {
            cert_pem: cert.pem(),
            der: cert.der().to_vec(),
            not_after_unix_s,
        })
    }
}

/// Why a user certificate was not signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignError {
    /// The request (or the validity asked) is at fault: the words say how.
    Request(String),
    /// The CA could not sign (its key or certificate): the server's fault.
    Ca(String),
}

impl std::fmt::Display for SignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignError::Request(why) | SignError::Ca(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for SignError {}

/// The subject public key info (DER) of a PEM certificate request.
fn requested_key_der(csr_pem: &str) -> anyhow::Result<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
        .map_err(|e| anyhow!("not PEM: {e}"))?;
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| anyhow!("not a certificate request: {e}"))?;
    Ok(csr.certification_request_info.subject_pki.raw.to_vec())
}

/// 16 random bytes, positive (RFC 5280 wants unique positive serials of at
/// most 20 bytes).
fn random_serial() -> Result<rcgen::SerialNumber, String> {
    let mut bytes = [0u8; 16];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| "no randomness for a serial number".to_owned())?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(rcgen::SerialNumber::from_slice(&bytes))
}

/// Whether a DER certificate names a user (`user:…`): such a certificate
/// never identifies an agent. An unreadable certificate is not a user's.
pub fn is_user_cert(der: &[u8]) -> bool {
    cert_names(der).is_ok_and(|names| names.iter().any(|n| n.starts_with(USER_PREFIX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ensure_local_ca;

    #[test]
    fn signs_only_the_public_key_of_a_request() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        // A request asking for more (another name, a host's SAN) gets a
        // user certificate and nothing else.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(vec!["local-1".to_owned()]).unwrap();
        params.distinguished_name = common_name_only("local-1");
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();
        let cert = pki.sign_user_csr("alice", &csr, 30).unwrap();
        assert_eq!(cert_names(&cert.der).unwrap(), ["user:alice"]);
        assert!(is_user_cert(&cert.der));
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert.der).unwrap();
        assert!(!parsed.is_ca());
        assert_eq!(
            parsed.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw()
        );
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        let days = (cert.not_after_unix_s - OffsetDateTime::now_utc().unix_timestamp()) / 86_400;
        assert!((29..=30).contains(&days), "{days}");
    }

    #[test]
    fn an_agent_certificate_names_its_host_only() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let csr = agent_csr("other-name").unwrap();
        let cert = pki
            .sign_agent_csr("host-7.example", &csr.csr_pem, 30)
            .unwrap();
        assert_eq!(cert_names(&cert.der).unwrap(), ["host-7.example"]);
        assert!(!is_user_cert(&cert.der));
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert.der).unwrap();
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        let e = pki
            .sign_agent_csr("user:alice", &csr.csr_pem, 30)
            .unwrap_err();
        assert!(e.to_string().contains("user"), "{e}");
    }

    #[test]
    fn user_csr_round_trips_and_bad_requests_say_why() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let csr = user_csr("bob").unwrap();
        let cert = pki.sign_user_csr("bob", &csr.csr_pem, 1).unwrap();
        assert_eq!(cert_names(&cert.der).unwrap(), ["user:bob"]);
        let e = pki.sign_user_csr("bob", "junk", 1).unwrap_err();
        assert!(matches!(e, SignError::Request(_)), "{e:?}");
        assert!(e.to_string().contains("certificate request"), "{e}");
        // Two certificates for one request: two serial numbers.
        let again = pki.sign_user_csr("bob", &csr.csr_pem, 1).unwrap();
        let serial = |der: &[u8]| {
            x509_parser::parse_x509_certificate(der)
                .unwrap()
                .1
                .raw_serial()
                .to_vec()
        };
        assert_ne!(serial(&cert.der), serial(&again.der));
        let e = pki.sign_user_csr("bob", &csr.csr_pem, 0).unwrap_err();
        assert!(e.to_string().contains("1 to 365"), "{e}");
        let e = pki
            .sign_user_csr("bob", &csr.csr_pem, MAX_USER_CERT_DAYS + 1)
            .unwrap_err();
        assert!(e.to_string().contains("1 to 365"), "{e}");
        // A request whose signature does not verify (its key is not the
        // requester's) is refused.
        let mut tampered = csr.csr_pem.into_bytes();
        let mid = tampered.len() / 2;
        tampered[mid] = if tampered[mid] == b'A' { b'B' } else { b'A' };
        assert!(
            pki.sign_user_csr("bob", std::str::from_utf8(&tampered).unwrap(), 1)
                .is_err()
        );
        // An agent's certificate is not a user's.
        let host = pki.issue_client("local-1").unwrap();
        let der = crate::config::first_cert_der(&host.cert_pem, "host").unwrap();
        assert!(!is_user_cert(&der));
    }
}
