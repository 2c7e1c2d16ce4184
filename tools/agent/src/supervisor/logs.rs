//! Log reads: where a run's output is, resolved under the supervisor, and
//! the read itself, done without it.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::record::{self, RUN_FILE};
use crate::run::LogChunk;

/// Most bytes in one `LogChunk`.
pub const MAX_LOG_CHUNK_BYTES: usize = 1 << 20;

/// Where a log read goes, resolved under the supervisor and read without
/// it (see [`Supervisor::log_source`]).
#[derive(Debug, Clone)]
pub struct LogSource {
    pub(super) result: Result<(PathBuf, PathBuf), String>,
    /// Known when the run is held; else read from its `run.json`.
    pub(super) ended: Option<bool>,
}

impl LogSource {
    /// Reads up to `max_bytes` (0 or more than 1 MiB: 1 MiB) from `offset`.
    /// Blocking file I/O: call it off the async runtime.
    pub fn read(&self, request_id: u64, offset: u64, max_bytes: u32) -> LogChunk {
        let mut chunk = LogChunk {
            request_id,
            offset,
            ..LogChunk::default()
        };
        let (dir, file) = match &self.result {
            Ok(paths) => paths,
            Err(error) => {
                chunk.error.clone_from(error);
                return chunk;
            }
        };
        // Decided before reading: once a run has ended its files no longer
        // grow, so "ended, and this reaches the end" is then final.
        let ended = match self.ended {
            Some(ended) => ended,
            None => match record::read_run(dir) {
                Ok(run) => run.acked || run.report.phase.is_final(),
                Err(e) => {
                    chunk.error = format!("no sandbox for this run: {e}");
                    return chunk;
                }
            },
        };
        let max = match usize::try_from(max_bytes) {
            Ok(0) | Err(_) => MAX_LOG_CHUNK_BYTES,
            Ok(n) => n.min(MAX_LOG_CHUNK_BYTES),
        };
        match read_range(file, offset, max) {
            // The output files are created with the task: a run that
            // failed before it has none, and nothing to show.
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir.join(RUN_FILE).exists() => {
                chunk.eof = ended;
            }
            Ok((data, len)) => {
                chunk.eof = ended && offset.saturating_add(data.len() as u64) >= len;
                chunk.data = data;
            }
            Err(e) => chunk.error = format!("cannot read {}: {e}", file.display()),
        }
        chunk
    }
}

/// Up to `max` bytes of `path` from `offset`, and the file's length.
fn read_range(path: &Path, offset: u64, max: usize) -> io::Result<(Vec<u8>, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    if offset >= len {
        return Ok((Vec::new(), len));
    }
    file.seek(SeekFrom::Start(offset))?;
    let want = usize::try_from(len - offset).map_or(max, |rest| rest.min(max));
    let mut data = Vec::with_capacity(want);
    file.take(want as u64).read_to_end(&mut data)?;
    Ok((data, len))
}
