//! Secrets of a run: one file per secret in `SANDBOX/.peloton-secrets/`
//! (the directory mode 0700, the files created with mode 0600 — never
//! wider, not even for a moment), written before the task starts; the
//! directory's absolute path is the task's `PELOTON_SECRETS`.
//!
//! Their values are written nowhere else: not in the task plan (only the
//! directory's path is in the environment), not in `run.json`, not in a
//! log. The directory is removed when the run's end is observed, so
//! secrets do not linger in the sandbox until garbage collection.

use std::collections::HashSet;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::run::Secret;

pub(crate) const SECRETS_DIR: &str = ".peloton-secrets";
const MAX_NAME_LEN: usize = 64;

/// Checks every name before anything is written: `[A-Za-z0-9._-]`, 1 to 64
/// characters, not starting with '.', no name twice.
pub(crate) fn validate(secrets: &[Secret]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for secret in secrets {
        let name = &secret.name;
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || name.starts_with('.')
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(format!(
                "secret name {name:?} is not usable as a file name \
                 (1 to {MAX_NAME_LEN} letters, digits, '-', '_', '.', not starting with '.')"
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("secret name {name:?} is given twice"));
        }
    }
    Ok(())
}

/// `sandbox/.peloton-secrets`.
pub(crate) fn dir(sandbox: &Path) -> PathBuf {
    sandbox.join(SECRETS_DIR)
}

/// Writes `secrets` (validated) into `sandbox/.peloton-secrets/`; no
/// secrets, no directory.
pub(crate) fn write(sandbox: &Path, secrets: &[Secret]) -> io::Result<()> {
    if secrets.is_empty() {
        return Ok(());
    }
    let dir = dir(sandbox);
    DirBuilder::new().mode(0o700).create(&dir)?;
    for secret in secrets {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(&secret.name))?;
        file.write_all(&secret.value)?;
    }
    Ok(())
}

/// Removes the sandbox's secrets, if any (blocking, small).
pub(crate) fn remove(sandbox: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir(sandbox)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn secret(name: &str, value: &[u8]) -> Secret {
        Secret {
            name: name.to_owned(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn names() {
        assert!(validate(&[secret("db-password", b""), secret("a.b_C9", b"")]).is_ok());
        for bad in ["", ".env", "a/b", "..", "a b", "é", &"x".repeat(65)] {
            assert!(
                validate(&[secret(bad, b"")]).is_err(),
                "{bad:?} must be refused"
            );
        }
        assert!(validate(&[secret(&"x".repeat(64), b"")]).is_ok());
        assert!(validate(&[secret("a", b"1"), secret("a", b"2")]).is_err());
    }

    #[test]
    fn written_private_and_removed() {
        let sandbox = tempfile::tempdir().unwrap();
        write(sandbox.path(), &[secret("k", b"\x00v\xff")]).unwrap();
        let dir = dir(sandbox.path());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("k")), 0o600);
        assert_eq!(fs::read(dir.join("k")).unwrap(), b"\x00v\xff");
        remove(sandbox.path()).unwrap();
        assert!(!dir.exists());
        remove(sandbox.path()).unwrap();
    }
}
