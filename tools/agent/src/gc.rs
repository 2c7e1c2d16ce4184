//! Garbage collection of sandboxes.
//!
//! Only sandboxes whose `run.json` says the run ended *and* the server
//! acknowledged it are ever removed; a live or unacknowledged run, or an
//! unreadable record, is never touched. (A directory with no `run.json` at
//! all, left by an agent that died while creating it, goes once it is
//! older than the age limit: no process was ever started in it.) First those
//! older than the age limit go (age counts from the run's end), then, while
//! all sandboxes together use more than the disk limit, the oldest of the
//! rest. A sandbox is renamed to a `.trash-` name before it is deleted, so
//! a crash half-way leaves trash (removed by the next collection) rather
//! than a half-deleted sandbox. Collection reads only the disk, never the
//! supervisor's memory: acknowledged runs are no longer held there, so it
//! can run on its own thread without a lock. A sandbox's link to a
//! persistent volume is removed as a link: neither deletion nor the size
//! count follows it, so volumes are never collected (see `volumes`).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::record::{self, RUN_FILE};

const TRASH_PREFIX: &str = ".trash-";

/// What may be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    /// Acknowledged sandboxes older than this go.
    pub max_age_ms: u64,
    /// Above this, the oldest acknowledged sandboxes go too.
    pub max_disk_bytes: u64,
}

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcOutcome {
    pub removed: Vec<PathBuf>,
    pub bytes_freed: u64,
    /// Disk used by the sandboxes left.
    pub bytes_in_use: u64,
}

struct Candidate {
    dir: PathBuf,
    bytes: u64,
    ended_ms: u64,
}

/// Collects `sandboxes` (the `WORK_DIR/sandboxes` directory) at `now_ms`.
pub fn collect(sandboxes: &Path, policy: &GcPolicy, now_ms: u64) -> GcOutcome {
    let mut outcome = GcOutcome::default();
    let Ok(entries) = fs::read_dir(sandboxes) else {
        return outcome;
    };
    let mut removable = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_trash = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TRASH_PREFIX));
        if is_trash {
            let _ = fs::remove_dir_all(&dir);
            continue;
        }
        if !dir.is_dir() {
            continue;
        }
        let bytes = disk_usage(&dir);
        let ended = record::read_run(&dir)
            .ok()
            .filter(|run| run.acked && run.report.phase.is_final());
        match ended {
            Some(run) if now_ms.saturating_sub(run.report.time_ms) > policy.max_age_ms => {
                remove(&dir, bytes, &mut outcome);
            }
            Some(run) => {
                outcome.bytes_in_use += bytes;
                removable.push(Candidate {
                    dir,
                    bytes,
                    ended_ms: run.report.time_ms,
                });
            }
            None if !dir.join(RUN_FILE).exists() && older_than(&dir, now_ms, policy.max_age_ms) => {
                // A launch the agent died in before its first record: no
                // process was ever started there.
                remove(&dir, bytes, &mut outcome);
            }
            None => outcome.bytes_in_use += bytes,
        }
    }
    removable.sort_by_key(|c| c.ended_ms);
    for candidate in removable {
        if outcome.bytes_in_use <= policy.max_disk_bytes {
            break;
        }
        outcome.bytes_in_use -= candidate.bytes;
        remove(&candidate.dir, candidate.bytes, &mut outcome);
    }
    outcome
}

/// Last modified more than `max_age_ms` before `now_ms`.
fn older_than(dir: &Path, now_ms: u64, max_age_ms: u64) -> bool {
    let modified_ms = fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    modified_ms.is_some_and(|m| now_ms.saturating_sub(m) > max_age_ms)
}

fn remove(dir: &Path, bytes: u64, outcome: &mut GcOutcome) {
    let Some(name) = dir.file_name() else {
        return;
    };
    let mut trash_name = std::ffi::OsString::from(TRASH_PREFIX);
    trash_name.push(name);
    let trash = dir.with_file_name(trash_name);
    if let Err(e) = fs::rename(dir, &trash) {
        tracing::warn!(sandbox = %dir.display(), error = %e, "cannot remove sandbox");
        return;
    }
    if let Err(e) = fs::remove_dir_all(&trash) {
        tracing::warn!(sandbox = %trash.display(), error = %e, "cannot delete sandbox trash");
    }
    tracing::info!(sandbox = %dir.display(), bytes, "sandbox collected");
    outcome.removed.push(dir.to_path_buf());
    outcome.bytes_freed += bytes;
}

/// Bytes of disk (allocated blocks, not apparent sizes) under `dir`,
/// without following symbolic links.
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}
