//! Persistent volumes: directories under `WORK_DIR/volumes/<id>/`, outside
//! every sandbox, so that they outlive runs, agent restarts and sandbox
//! garbage collection.
//!
//! A run with a volume sees it through a symbolic link in its sandbox,
//! `SANDBOX/<path>` -> `WORK_DIR/volumes/<id>` (`TaskSpec.volume.path`,
//! default `data`), and its absolute in-sandbox path in `PELOTON_VOLUME`.
//! Deleting a sandbox (`fs::remove_dir_all`, as garbage collection does)
//! removes the link, never what it points to; the sizes gc counts do not
//! follow links either.
//!
//! Size: `VolumeMount.size_mb` is *not* enforced. A volume is a plain
//! directory on the work directory's file system, with no quota (that would
//! need a file system per volume, or project quotas, which the agent does
//! not set up); the size is only what the server charges to the host's
//! disk. A task may write more than it asked for.
//!
//! Deletion (`DeleteVolumes`) renames the volume to a `.trash-` name under
//! the supervisor's lock (fast, and a later launch of the same id starts
//! afresh), then removes the trash without the lock; trash left by a crash
//! is removed by the next garbage collection.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::record::{
    EXIT_FILE, HEALTH_OUTPUT_FILE, NOTES_FILE, RUN_FILE, RUN_FILE_B, START_ERROR_FILE,
    STARTED_FILE, STDERR_FILE, STDOUT_FILE, TASK_FILE,
};
use crate::secrets::SECRETS_DIR;

pub(crate) const VOLUMES_DIR: &str = "volumes";
/// Where a volume appears in the sandbox when its spec names no path.
pub(crate) const DEFAULT_MOUNT_PATH: &str = "data";
const MAX_ID_LEN: usize = 200;
const TRASH_PREFIX: &str = ".trash-";
/// The agent's own files in a sandbox: a volume's link must not take their
/// place (it would redirect the agent's writes into the volume).
const RESERVED: [&str; 11] = [
    RUN_FILE,
    RUN_FILE_B,
    TASK_FILE,
    STARTED_FILE,
    EXIT_FILE,
    START_ERROR_FILE,
    STDOUT_FILE,
    STDERR_FILE,
    NOTES_FILE,
    HEALTH_OUTPUT_FILE,
    SECRETS_DIR,
];

/// A volume id becomes a directory name: `[A-Za-z0-9._-]`, 1 to 200
/// characters, not starting with '.'.
pub(crate) fn validate_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!(
            "volume id {id:?} must have 1 to {MAX_ID_LEN} characters"
        ));
    }
    if id.starts_with('.')
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "volume id {id:?} is not usable as a directory name \
             (letters, digits, '-', '_', '.', not starting with '.')"
        ));
    }
    Ok(())
}

/// Where the volume appears inside the sandbox: `path` (empty: `data`),
/// relative, without `..`, and not one of the agent's own files; returned
/// normalized (no `.`, no repeated or trailing '/').
pub(crate) fn mount_path(path: &str) -> Result<PathBuf, String> {
    let path = if path.is_empty() {
        DEFAULT_MOUNT_PATH
    } else {
        path
    };
    let bad = |why: &str| Err(format!("volume path {path:?} {why}"));
    if path.contains('\0') {
        return bad("contains a NUL byte");
    }
    let relative = Path::new(path);
    if relative.is_absolute() {
        return bad("must be relative to the sandbox, not absolute");
    }
    let mut normal = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => normal.push(name),
            Component::ParentDir => return bad("must not contain '..'"),
            // Harmless (and `components` drops most of them anyway).
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return bad("must be relative to the sandbox, not absolute");
            }
        }
    }
    let first = normal.components().next().map(|c| c.as_os_str());
    if first.is_none() {
        return bad("names no directory");
    }
    if let Some(first) = first.and_then(|f| f.to_str())
        && (RESERVED.contains(&first) || first.ends_with(".tmp"))
    {
        return bad("is taken by a file of the agent in the sandbox");
    }
    Ok(normal)
}

/// Creates `volumes/<id>` if missing (an existing one is reused, with its
/// data); returns its path. `id` must be valid.
pub(crate) fn ensure(volumes: &Path, id: &str) -> io::Result<PathBuf> {
    let dir = volumes.join(id);
    match fs::create_dir(&dir) {
        Ok(()) => {
            tracing::info!(volume = id, "volume created");
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Not followed: the volume must be a directory of its own.
            if !fs::symlink_metadata(&dir)?.is_dir() {
                return Err(io::Error::other(format!(
                    "{} exists and is not a directory",
                    dir.display()
                )));
            }
        }
        Err(e) => return Err(e),
    }
    Ok(dir)
}

/// Links `sandbox/<path>` to `volume` (creating the link's parent
/// directories in the sandbox); returns the link's path.
pub(crate) fn link(sandbox: &Path, path: &Path, volume: &Path) -> io::Result<PathBuf> {
    let at = sandbox.join(path);
    if let Some(parent) = at.parent() {
        fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink(volume, &at)?;
    Ok(at)
}

/// The ids of the volumes on disk, sorted.
pub(crate) fn list(volumes: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(volumes) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|id| validate_id(id).is_ok())
        .collect();
    ids.sort();
    ids
}

/// Moves `volumes/<id>` to a trash name (fast); [`VolumeDeletion::finish`]
/// removes it. Returns the trash's path, `None` if there was no such
/// volume. `now_ms` (the wall clock, ms) names the trash: `.trash-<id>.<ms>`,
/// with a count after it if that name is taken.
pub(crate) fn to_trash(volumes: &Path, id: &str, now_ms: u64) -> io::Result<Option<PathBuf>> {
    let dir = volumes.join(id);
    if fs::symlink_metadata(&dir).is_err() {
        return Ok(None);
    }
    // Unique, so that trash left by an earlier failed deletion of the same
    // id does not block this one.
    let trash = (0..MAX_TRASH_NAME_TRIES)
        .map(|attempt| volumes.join(trash_name(id, now_ms, attempt)))
        .find(|trash| fs::symlink_metadata(trash).is_err())
        .ok_or_else(|| io::Error::other(format!("{MAX_TRASH_NAME_TRIES} trash names taken")))?;
    fs::rename(&dir, &trash)?;
    Ok(Some(trash))
}

/// Names tried for one volume's trash, at most.
const MAX_TRASH_NAME_TRIES: u32 = 1000;

/// The trash name of volume `id` deleted at `now_ms`, on the `attempt`-th
/// try (0 first).
fn trash_name(id: &str, now_ms: u64, attempt: u32) -> String {
    match attempt {
        0 => format!("{TRASH_PREFIX}{id}.{now_ms}"),
        n => format!("{TRASH_PREFIX}{id}.{now_ms}.{n}"),
    }
}

/// Removes trash left by deletions that did not finish (blocking).
pub(crate) fn remove_trash(volumes: &Path) {
    let Ok(entries) = fs::read_dir(volumes) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TRASH_PREFIX))
        {
            remove_dir(&entry.path());
        }
    }
}

fn remove_dir(dir: &Path) {
    // NotFound: a collection and a deletion's `finish` raced; one is enough.
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot delete volume trash");
    }
}

/// Volumes taken off the disk's list by [`crate::Supervisor::delete_volumes`],
/// whose data is removed by [`VolumeDeletion::finish`] (blocking, and
/// possibly slow: call it off the async runtime and without the
/// supervisor's lock).
#[derive(Debug, Default)]
#[must_use = "the volumes' data stays on disk until finish() (or the next garbage collection)"]
pub struct VolumeDeletion {
    trash: Vec<PathBuf>,
}

impl VolumeDeletion {
    pub(crate) fn push(&mut self, trash: PathBuf) {
        self.trash.push(trash);
    }

    /// Nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.trash.is_empty()
    }

    /// Removes the volumes' data.
    pub fn finish(self) {
        for trash in self.trash {
            remove_dir(&trash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for good in ["v", "vol-1", "a.b_c-D9", &"x".repeat(200)] {
            assert!(validate_id(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "a b",
            "a\0b",
            "é",
            &"x".repeat(201),
        ] {
            assert!(validate_id(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn mount_paths() {
        assert_eq!(mount_path("").unwrap(), PathBuf::from("data"));
        assert_eq!(mount_path("a/b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(mount_path("a//b/").unwrap(), PathBuf::from("a/b"));
        assert_eq!(mount_path("./a/./b").unwrap(), PathBuf::from("a/b"));
        for bad in [
            "/abs",
            "..",
            "../x",
            "a/../../b",
            ".",
            "a\0b",
            "stdout",
            "run.json/x",
            "task.json.tmp",
            ".peloton-secrets",
        ] {
            assert!(mount_path(bad).is_err(), "{bad:?} must be refused");
        }
    }

    /// What garbage collection relies on: removing a sandbox removes the
    /// link to a volume, not the volume's files.
    #[test]
    fn removing_a_sandbox_keeps_the_linked_volume() {
        let root = tempfile::tempdir().unwrap();
        let volume = ensure(root.path(), "v").unwrap();
        fs::write(volume.join("keep"), "data").unwrap();
        fs::create_dir(volume.join("sub")).unwrap();
        fs::write(volume.join("sub/keep"), "data").unwrap();
        let sandbox = root.path().join("sandbox");
        fs::create_dir(&sandbox).unwrap();
        let at = link(&sandbox, Path::new("deep/data"), &volume).unwrap();
        assert_eq!(fs::read_to_string(at.join("sub/keep")).unwrap(), "data");
        fs::remove_dir_all(&sandbox).unwrap();
        assert!(!sandbox.exists());
        assert_eq!(fs::read_to_string(volume.join("keep")).unwrap(), "data");
        assert_eq!(fs::read_to_string(volume.join("sub/keep")).unwrap(), "data");
    }

    const NOW_MS: u64 = 1000;

    #[test]
    fn listing_and_deleting() {
        let root = tempfile::tempdir().unwrap();
        ensure(root.path(), "b").unwrap();
        ensure(root.path(), "a").unwrap();
        ensure(root.path(), "a").unwrap();
        fs::write(root.path().join("a/f"), "x").unwrap();
        fs::write(root.path().join("not-a-dir"), "x").unwrap();
        assert_eq!(list(root.path()), ["a", "b"]);
        let trash = to_trash(root.path(), "a", NOW_MS)
            .unwrap()
            .expect("a existed");
        assert_eq!(trash, root.path().join(".trash-a.1000"));
        assert_eq!(list(root.path()), ["b"]);
        assert!(to_trash(root.path(), "gone", NOW_MS).unwrap().is_none());
        // Deleted again at the same time, its first trash still there: a
        // name of its own.
        ensure(root.path(), "a").unwrap();
        fs::write(root.path().join("a/g"), "y").unwrap();
        let again = to_trash(root.path(), "a", NOW_MS)
            .unwrap()
            .expect("a existed");
        assert_eq!(again, root.path().join(".trash-a.1000.1"));
        assert_eq!(fs::read_to_string(trash.join("f")).unwrap(), "x");
        assert_eq!(fs::read_to_string(again.join("g")).unwrap(), "y");
        remove_trash(root.path());
        assert!(!again.exists());
        let mut deletion = VolumeDeletion::default();
        deletion.push(trash.clone());
        deletion.finish();
        assert!(!trash.exists());
        // Left-over trash goes with the next collection.
        let trash = to_trash(root.path(), "b", NOW_MS)
            .unwrap()
            .expect("b existed");
        remove_trash(root.path());
        assert!(!trash.exists());
        assert!(list(root.path()).is_empty());
    }
}
