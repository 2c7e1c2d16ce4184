//! For tests: one private CA and one server certificate (for localhost,
//! 127.0.0.1 and ::1) per test process, in a temporary directory that
//! lives as long as the process, so every test server can be started
//! securely without making keys each time.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{CertPair, Pki, ensure_local_ca};

/// The test CA and the server certificate's files.
#[derive(Debug)]
pub struct TestPki {
    /// The CA (it issues client certificates too).
    pub pki: Pki,
    /// The CA certificate's file.
    pub ca_file: PathBuf,
    /// The server certificate's file.
    pub server_cert: PathBuf,
    /// The server key's file.
    pub server_key: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestPki {
    /// A client certificate naming `host`, written as `dir/<host>.pem` and
    /// `dir/<host>.key`; returns the two paths.
    pub fn client_files(&self, host: &str, dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
        let pair: CertPair = self.pki.issue_client(host)?;
        let (cert, key) = (
            dir.join(format!("{host}.pem")),
            dir.join(format!("{host}.key")),
        );
        pair.write(&cert, &key)?;
        Ok((cert, key))
    }
}

/// This process's test CA and server certificate (made on first use).
///
/// # Panics
///
/// When the temporary directory or the keys cannot be made.
pub fn shared() -> &'static TestPki {
    static PKI: OnceLock<TestPki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory for the test CA");
        let pki = ensure_local_ca(dir.path()).expect("the test CA");
        let names = ["localhost", "127.0.0.1", "::1"].map(String::from);
        pki.ensure_server(&names)
            .expect("the test server certificate");
        TestPki {
            ca_file: dir.path().join("ca.pem"),
            server_cert: dir.path().join("server.pem"),
            server_key: dir.path().join("server.key"),
            pki,
            _dir: dir,
        }
    })
}
