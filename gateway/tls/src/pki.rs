//! The private CA and the certificates it issues, kept as PEM files in one
//! directory (`ca.pem`, `ca.key`, `server.pem`, `server.key`).

use std::fmt;
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::config::{first_cert_der, load_pem_files};
use crate::names::cert_names;

/// The subject common name of the CA [`ensure_local_ca`] creates.
pub const CA_COMMON_NAME: &str = "Peloton local CA";

/// About ten years: the local CA outlives any deployment that forgets it.
const CA_VALIDITY_DAYS: i64 = 3653;
/// Server and client certificates; [`Pki::ensure_server`] renews its own.
const LEAF_VALIDITY_DAYS: i64 = 730;
/// [`Pki::ensure_server`] reissues a stored certificate this close to expiry.
const RENEW_BEFORE_DAYS: i64 = 30;
/// Certificates start this long before now, for peers whose clocks lag.
pub(crate) const CLOCK_SKEW_HOURS: i64 = 1;

const KEY_FILE_MODE: u32 = 0o600;
const CERT_FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o700;

/// A private certificate authority loaded from (or created in) `dir`.
///
/// `Debug` prints no key material.
pub struct Pki {
    /// The CA certificate, PEM: what clients and the server trust.
    pub ca_cert_pem: String,
    /// The CA's private key, PEM (PKCS#8); never leaves this crate.
    ca_key_pem: String,
    /// The directory holding `ca.pem`, `ca.key` and `server.*`.
    pub dir: PathBuf,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .field(
                "ca_cert_pem",
                &format_args!("<{} bytes>", self.ca_cert_pem.len()),
            )
            .finish_non_exhaustive()
    }
}

/// A certificate and its private key, both PEM.
///
/// `Debug` prints no key material.
#[derive(Clone, PartialEq, Eq)]
pub struct CertPair {
    /// The certificate chain, PEM, leaf first.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
}

impl fmt::Debug for CertPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertPair")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl CertPair {
    /// Writes the certificate to `cert` (mode 0644) and the key to `key`
    /// (mode 0600), each atomically (a temporary file in the same directory,
    /// then a rename), the key first.
    pub fn write(&self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        write_atomic(key, self.key_pem.as_bytes(), KEY_FILE_MODE)?;
        write_atomic(cert, self.cert_pem.as_bytes(), CERT_FILE_MODE)
    }
}

/// Loads the CA from `dir/ca.pem` and `dir/ca.key`, or, when neither
/// exists, creates it: a self-signed ECDSA P-256 CA named
/// [`CA_COMMON_NAME`], valid for about ten years, that may sign only leaf
/// certificates. `dir` is created (mode 0700) if missing.
///
/// One file present without the other is an error naming the missing one
/// (a half-written CA is never silently replaced). Two processes creating
/// the same CA at once are not coordinated: the last rename wins.
pub fn ensure_local_ca(dir: &Path) -> anyhow::Result<Pki> {
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    match (exists(&cert_path)?, exists(&key_path)?) {
        (true, true) => load_ca(dir, &cert_path, &key_path),
        (false, false) => create_ca(dir, &cert_path, &key_path),
        (true, false) => Err(half_present(&key_path, &cert_path)),
        (false, true) => Err(half_present(&cert_path, &key_path)),
    }
}

impl Pki {
    /// Loads a CA from its certificate and key files (PEM), for example a
    /// client CA an operator made, so the server can sign user
    /// certificates with it. The key must be the certificate's.
    pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Pki> {
        let dir = cert_path.parent().unwrap_or(Path::new(".")).to_owned();
        load_ca(&dir, cert_path, key_path)
    }

    /// The CA key, PEM (for signing inside this crate).
    pub(crate) fn ca_key_pem(&self) -> &str {
        &self.ca_key_pem
    }

    /// Issues a server certificate signed by the CA, for `names`: each is a
    /// SAN, an IP address when it parses as one (`127.0.0.1`, `::1`, no
    /// brackets) and a DNS name otherwise. The caller chooses the names,
    /// `localhost` and the loopback addresses included. The first name is
    /// also the subject CN. Extended key usage: serverAuth and clientAuth.
    pub fn issue_server(&self, names: &[String]) -> anyhow::Result<CertPair> {
        let Some(first) = names.first() else {
            bail!("a server certificate needs at least one name");
        };
        self.issue(
            first,
            names,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// Issues a client certificate signed by the CA whose subject CN is
    /// `name` and whose one SAN is `name` (a DNS name such as `local-1` or
    /// `host-a.example`, or an IP address). Extended key usage: clientAuth.
    pub fn issue_client(&self, name: &str) -> anyhow::Result<CertPair> {
        self.issue(
            name,
            &[name.to_owned()],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )
    }

    /// The server's certificate: `dir/server.pem` and `dir/server.key` when
    /// both exist and the certificate is signed by this CA, names every one
    /// of `names` and is not within 30 days of expiry; otherwise a new one
    /// from [`Pki::issue_server`], written there (key mode 0600). One file
    /// without the other is an error naming the missing one.
    pub fn ensure_server(&self, names: &[String]) -> anyhow::Result<CertPair> {
        let cert_path = self.dir.join("server.pem");
        let key_path = self.dir.join("server.key");
        match (exists(&cert_path)?, exists(&key_path)?) {
            (true, true) => {
                let stored = load_pem_files(&cert_path, &key_path)?;
                match self.why_reissue(&stored, names, &cert_path)? {
                    None => return Ok(stored),
                    Some(reason) => {
                        tracing::info!(path = %cert_path.display(), %reason, "reissuing the server certificate");
                    }
                }
            }
            (false, false) => {}
            (true, false) => return Err(half_present(&key_path, &cert_path)),
            (false, true) => return Err(half_present(&cert_path, &key_path)),
        }
        let pair = self.issue_server(names)?;
        pair.write(&cert_path, &key_path)?;
        Ok(pair)
    }

    fn issue(
        &self,
        common_name: &str,
        names: &[String],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> anyhow::Result<CertPair> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).context("the CA key")?;
        let issuer =
            Issuer::from_ca_cert_pem(&self.ca_cert_pem, ca_key).context("the CA certificate")?;

        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_only(common_name);
        params.subject_alt_names = names
            .iter()
            .map(|name| san(name))
            .collect::<anyhow::Result<_>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, LEAF_VALIDITY_DAYS);

        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generating a key")?;
        let cert = params
            .signed_by(&key, &issuer)
            .with_context(|| format!("signing a certificate for {common_name:?}"))?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Why a stored server certificate must be replaced, or `None` if it may
    /// be kept.
    fn why_reissue(
        &self,
        stored: &CertPair,
        names: &[String],
        cert_path: &Path,
    ) -> anyhow::Result<Option<String>> {
        let where_ = cert_path.display();
        let der = first_cert_der(&stored.cert_pem, &where_.to_string())?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| anyhow!("{where_}: not an X.509 certificate: {e}"))?;
        let ca_der = first_cert_der(&self.ca_cert_pem, "the CA certificate")?;
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der)
            .map_err(|e| anyhow!("the CA certificate: not an X.509 certificate: {e}"))?;
        if cert.verify_signature(Some(ca.public_key())).is_err() {
            return Ok(Some("not signed by this CA".to_owned()));
        }
        let renew_at = OffsetDateTime::now_utc() + Duration::days(RENEW_BEFORE_DAYS);
        if cert.validity().not_after.to_datetime() < renew_at {
            return Ok(Some(format!("expires {}", cert.validity().not_after)));
        }
        let held = cert_names(&der).with_context(|| format!("{where_}: reading its names"))?;
        for name in names {
            let wanted = canonical_name(name);
            if !held.iter().any(|h| h.eq_ignore_ascii_case(&wanted)) {
                return Ok(Some(format!("does not name {name:?}")));
            }
        }
        Ok(None)
    }
}

fn create_ca(dir: &Path, cert_path: &Path, key_path: &Path) -> anyhow::Result<Pki> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;

    let mut params = CertificateParams::default();
    params.distinguished_name = common_name_only(CA_COMMON_NAME);
    // Path length 0: the CA signs leaves only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_VALIDITY_DAYS);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("generating the CA key")?;
    let cert = params
        .self_signed(&key)
        .context("self-signing the CA certificate")?;

    let pki = Pki {
        ca_cert_pem: cert.pem(),
        ca_key_pem: key.serialize_pem(),
        dir: dir.to_owned(),
    };
    // Key first: a crash between the two leaves a key without a certificate,
    // which the next start reports instead of trusting a CA it cannot use.
    write_atomic(key_path, pki.ca_key_pem.as_bytes(), KEY_FILE_MODE)?;
    write_atomic(cert_path, pki.ca_cert_pem.as_bytes(), CERT_FILE_MODE)?;
    tracing::info!(path = %cert_path.display(), "created a local CA");
    Ok(pki)
}

fn load_ca(dir: &Path, cert_path: &Path, key_path: &Path) -> anyhow::Result<Pki> {
    let ca_cert_pem = read(cert_path)?;
    let ca_key_pem = read(key_path)?;
    let key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|e| anyhow!("{}: not a private key: {e}", key_path.display()))?;
    let der = first_cert_der(&ca_cert_pem, &cert_path.display().to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| anyhow!("{}: not an X.509 certificate: {e}", cert_path.display()))?;
    if !cert.is_ca() {
        bail!(
            "{}: not a CA certificate (no CA basic constraint)",
            cert_path.display()
        );
    }
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        bail!(
            "{} is not the key of {}",
            key_path.display(),
            cert_path.display()
        );
    }
    Ok(Pki {
        ca_cert_pem,
        ca_key_pem,
        dir: dir.to_owned(),
    })
}

pub(crate) fn common_name_only(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(CLOCK_SKEW_HOURS);
    params.not_after = now + Duration::days(days);
}

/// `name` as a SAN: an IP address when it parses as one, else a DNS name
/// that must be a plain host name (letters, digits, `-`, dot-separated
/// labels of 1 to 63 characters, at most 253 in all).
pub(crate) fn san(name: &str) -> anyhow::Result<SanType> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let valid_label = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() > 253 || !name.split('.').all(valid_label) {
        bail!("{name:?} is neither an IP address nor a valid DNS host name");
    }
    let dns = name
        .to_owned()
        .try_into()
        .map_err(|e| anyhow!("{name:?}: {e}"))?;
    Ok(SanType::DnsName(dns))
}

/// How [`cert_names`] spells `name`: IP addresses in their canonical form.
fn canonical_name(name: &str) -> String {
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_owned(),
    }
}

fn exists(path: &Path) -> anyhow::Result<bool> {
    path.try_exists()
        .with_context(|| format!("checking {}", path.display()))
}

fn read(path: &Path) -> anyhow::Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn half_present(missing: &Path, present: &Path) -> anyhow::Error {
    anyhow!(
        "{} is missing but {} exists: restore it, or remove both to make new ones",
        missing.display(),
        present.display()
    )
}

/// Writes `contents` to `path` with `mode`: a temporary file beside it,
/// synced, then renamed over `path`, so readers see the old file or the new
/// one, never a part.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file path", path.display()))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // The mode applies only when the file is created: a leftover
        // temporary file from a crash keeps its own unless set again.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    // Make the rename itself durable; a failure here loses nothing written.
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Err(e) = File::open(parent).and_then(|d| d.sync_all()) {
        tracing::debug!(dir = %parent.display(), error = %e, "could not sync directory");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn ensure_local_ca_creates_then_reloads_the_same_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pki");
        let first = ensure_local_ca(&dir).unwrap();
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(mode(&dir.join("ca.key")), KEY_FILE_MODE);
        assert_eq!(mode(&dir.join("ca.pem")), CERT_FILE_MODE);
        let second = ensure_local_ca(&dir).unwrap();
        assert_eq!(first.ca_cert_pem, second.ca_cert_pem);
        assert_eq!(first.ca_key_pem, second.ca_key_pem);
        assert_eq!(second.dir, dir);
        let der = first_cert_der(&first.ca_cert_pem, "ca").unwrap();
        assert_eq!(cert_names(&der).unwrap(), vec![CA_COMMON_NAME.to_owned()]);
        // No temporary files left behind.
        let mut files: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        files.sort();
        assert_eq!(files, ["ca.key", "ca.pem"]);
    }

    #[test]
    fn debug_prints_no_key() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        assert!(!format!("{pki:?}").contains("PRIVATE KEY"));
        let pair = pki.issue_client("local-1").unwrap();
        assert!(!format!("{pair:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn a_half_present_ca_is_an_error_naming_the_missing_file() {
        let tmp = tempfile::tempdir().unwrap();
        ensure_local_ca(tmp.path()).unwrap();
        fs::remove_file(tmp.path().join("ca.key")).unwrap();
        let error = format!("{:#}", ensure_local_ca(tmp.path()).unwrap_err());
        assert!(error.contains("ca.key is missing"), "{error}");

        let tmp = tempfile::tempdir().unwrap();
        ensure_local_ca(tmp.path()).unwrap();
        fs::remove_file(tmp.path().join("ca.pem")).unwrap();
        let error = format!("{:#}", ensure_local_ca(tmp.path()).unwrap_err());
        assert!(error.contains("ca.pem is missing"), "{error}");
    }

    #[test]
    fn a_ca_key_that_is_not_the_certificates_is_an_error() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        ensure_local_ca(a.path()).unwrap();
        ensure_local_ca(b.path()).unwrap();
        fs::copy(b.path().join("ca.key"), a.path().join("ca.key")).unwrap();
        let error = format!("{:#}", ensure_local_ca(a.path()).unwrap_err());
        assert!(error.contains("is not the key of"), "{error}");
    }

    #[test]
    fn issued_certificates_carry_their_names() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let names: Vec<String> = ["localhost", "127.0.0.1", "::1", "host-a.example"]
            .map(String::from)
            .to_vec();
        let server = pki.issue_server(&names).unwrap();
        let der = first_cert_der(&server.cert_pem, "server").unwrap();
        assert_eq!(
            cert_names(&der).unwrap(),
            ["localhost", "127.0.0.1", "::1", "host-a.example"]
        );

        let client = pki.issue_client("local-1").unwrap();
        let der = first_cert_der(&client.cert_pem, "client").unwrap();
        assert_eq!(cert_names(&der).unwrap(), ["local-1"]);
    }

    #[test]
    fn invalid_names_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        for bad in ["", "a b", "-x", "x..y", "héllo", "[::1]"] {
            assert!(pki.issue_client(bad).is_err(), "{bad:?}");
        }
        assert!(pki.issue_server(&[]).is_err());
    }

    #[test]
    fn ensure_server_keeps_a_good_certificate_and_replaces_others() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let first = pki.ensure_server(&names).unwrap();
        assert_eq!(mode(&tmp.path().join("server.key")), KEY_FILE_MODE);
        assert_eq!(pki.ensure_server(&names).unwrap(), first);
        // A subset of the names is still covered.
        assert_eq!(pki.ensure_server(&names[..1]).unwrap(), first);

        // A new name needs a new certificate.
        let more = vec!["localhost".to_owned(), "host-b".to_owned()];
        let second = pki.ensure_server(&more).unwrap();
        assert_ne!(second, first);
        assert_eq!(
            load_pem_files(
                &tmp.path().join("server.pem"),
                &tmp.path().join("server.key")
            )
            .unwrap(),
            second
        );

        // A certificate from another CA is replaced.
        let other = tempfile::tempdir().unwrap();
        let foreign = ensure_local_ca(other.path())
            .unwrap()
            .issue_server(&more)
            .unwrap();
        foreign
            .write(
                &tmp.path().join("server.pem"),
                &tmp.path().join("server.key"),
            )
            .unwrap();
        let third = pki.ensure_server(&more).unwrap();
        assert_ne!(third, foreign);

        fs::remove_file(tmp.path().join("server.key")).unwrap();
        let error = format!("{:#}", pki.ensure_server(&more).unwrap_err());
        assert!(error.contains("server.key is missing"), "{error}");
    }
}
