//! Log reads: where a run's output is, resolved under the supervisor, and
//! the read itself, done without it.
//!
//! When output was written: the task writes its files itself (they are its
//! stdout and stderr), so the agent cannot stamp lines as they come.
//! Instead it samples each live run's output sizes (about every second,
//! and once more when the run ends) and appends `(size, time)` to
//! `stdout.times` / `stderr.times` whenever a file grew: the bytes before
//! `size` had been written by `time`. Reads turn that into marks for the
//! bytes they return, and `since` into a start offset. A times file holds
//! at most [`MAX_TIME_MARKS`] entries; a full one keeps every other entry
//! (coarser, still true: a later mark is a later "written by").

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::record::{self, RUN_FILE, STDERR_FILE, STDOUT_FILE};
use crate::run::{LogChunk, LogRequest};

/// Most bytes in one `LogChunk`.
pub const MAX_LOG_CHUNK_BYTES: usize = 1 << 20;
/// Most lines a tail read goes back.
pub const MAX_TAIL_LINES: u32 = 100_000;
/// Most entries of one output's times file (16 bytes each: 1 MiB).
pub const MAX_TIME_MARKS: usize = 1 << 16;
/// Most marks in one chunk (a chunk with more keeps every n-th).
pub const MAX_CHUNK_MARKS: usize = 4096;
/// How often live runs' output sizes are sampled.
pub const OUTPUT_SAMPLE_INTERVAL_MS: u64 = 1000;
/// Bytes of one times-file entry: offset and time, little-endian u64s.
const MARK_BYTES: usize = 16;

/// The times file of an output file (`stdout` → `stdout.times`).
fn times_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".times");
    output.with_file_name(name)
}

/// Samples the sizes of the run's outputs in `dir`: an output longer than
/// `sizes` says gets a mark at `now_ms`. Errors are ignored (the marks are
/// a help for reading; the output itself is the task's).
pub(super) fn sample_output(dir: &Path, sizes: &mut [u64; 2], now_ms: u64) {
    for (slot, name) in [STDOUT_FILE, STDERR_FILE].into_iter().enumerate() {
        let path = dir.join(name);
        let Ok(len) = std::fs::metadata(&path).map(|m| m.len()) else {
            continue;
        };
        if len <= sizes[slot] {
            continue;
        }
        if append_mark(&times_path(&path), len, now_ms).is_ok() {
            sizes[slot] = len;
        }
    }
}

fn append_mark(path: &Path, offset: u64, time_ms: u64) -> io::Result<()> {
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len as usize >= MAX_TIME_MARKS * MARK_BYTES {
        // Full: keep every other entry (the last always), then append.
        let mut marks = read_marks(path)?;
        let last = marks.pop();
        let mut kept: Vec<(u64, u64)> = marks.into_iter().skip(1).step_by(2).collect();
        kept.extend(last);
        let mut bytes = Vec::with_capacity((kept.len() + 1) * MARK_BYTES);
        for (o, t) in kept {
            bytes.extend_from_slice(&o.to_le_bytes());
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        let tmp = path.with_extension("times.tmp");
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, path)?;
    }
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    let mut entry = [0u8; MARK_BYTES];
    entry[..8].copy_from_slice(&offset.to_le_bytes());
    entry[8..].copy_from_slice(&time_ms.to_le_bytes());
    file.write_all(&entry)
}

/// A times file's entries (none if it does not exist; a torn last entry
/// is dropped).
fn read_marks(path: &Path) -> io::Result<Vec<(u64, u64)>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let le = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    Ok(bytes
        .chunks_exact(MARK_BYTES)
        .map(|e| (le(&e[..8]), le(&e[8..])))
        .collect())
}

/// Where the output written at or after `since_ms` starts: after the last
/// mark older than it (its bytes were all written before).
fn since_offset(marks: &[(u64, u64)], since_ms: u64) -> u64 {
    marks
        .iter()
        .take_while(|&&(_, t)| t < since_ms)
        .last()
        .map_or(0, |&(o, _)| o)
}

/// Where the last `lines` lines of `file` (`len` bytes) start: after the
/// `lines`-th newline from the end, a final newline not counted (reads
/// backwards a block at a time).
fn tail_offset(file: &mut File, len: u64, lines: u32) -> io::Result<u64> {
    const BLOCK: u64 = 64 * 1024;
    let mut end = len;
    let mut newlines = 0u32;
    let mut buf = vec![0u8; BLOCK as usize];
    let mut first = true;
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        for k in (0..n).rev() {
            if buf[k] != b'\n' {
                first = false;
                continue;
            }
            if first {
                // The newline that ends the last line.
                first = false;
                continue;
            }
            newlines += 1;
            if newlines == lines {
                return Ok(start + k as u64 + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

/// The marks for the bytes `[start, end)`: those inside, the first past
/// them, else (the output grew since the last sample) `(end, now)`; at
/// most [`MAX_CHUNK_MARKS`].
fn chunk_marks(marks: &[(u64, u64)], start: u64, end: u64, now_ms: u64) -> Vec<(u64, u64)> {
    if end <= start {
        return Vec::new();
    }
    let mut out: Vec<(u64, u64)> = marks
        .iter()
        .copied()
        .filter(|&(o, _)| o > start && o < end)
        .collect();
    match marks.iter().find(|&&(o, _)| o >= end) {
        Some(&(_, t)) => out.push((end, t)),
        None => out.push((end, now_ms)),
    }
    if out.len() > MAX_CHUNK_MARKS {
        let step = out.len().div_ceil(MAX_CHUNK_MARKS);
        let last = *out.last().expect("not empty");
        out = out.into_iter().skip(step - 1).step_by(step).collect();
        if out.last() != Some(&last) {
            out.push(last);
        }
    }
    out
}

/// Where a log read goes, resolved under the supervisor and read without
/// it (see [`Supervisor::log_source`]).
#[derive(Debug, Clone)]
pub struct LogSource {
    pub(super) result: Result<(PathBuf, PathBuf), String>,
    /// Known when the run is held; else read from its `run.json`.
    pub(super) ended: Option<bool>,
}

impl LogSource {
    /// Reads up to `max_bytes` (0 or more than 1 MiB: 1 MiB) from
    /// `offset`, or later: from the start of the last `tail_lines` lines,
    /// or of what was written since `since_ms`; with `times`, with marks.
    /// Blocking file I/O: call it off the async runtime.
    pub fn read(&self, request: &LogRequest) -> LogChunk {
        let mut chunk = LogChunk {
            request_id: request.request_id,
            offset: request.offset,
            ..LogChunk::default()
        };
        let max_bytes = request.max_bytes;
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
        let marks = if request.times || request.since_ms > 0 {
            match read_marks(&times_path(file)) {
                Ok(m) => m,
                Err(e) => {
                    chunk.error = format!("cannot read the output's times: {e}");
                    return chunk;
                }
            }
        } else {
            Vec::new()
        };
        let tail = request.tail_lines.min(MAX_TAIL_LINES);
        match read_range(file, request.offset, max, |file, len| {
            let mut start = request.offset;
            if request.since_ms > 0 {
                start = start.max(since_offset(&marks, request.since_ms));
            }
            if tail > 0 {
                start = start.max(tail_offset(file, len, tail)?);
            }
            Ok(start)
        }) {
            // The output files are created with the task: a run that
            // failed before it has none, and nothing to show.
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir.join(RUN_FILE).exists() => {
                chunk.eof = ended;
            }
            Ok((data, start, len)) => {
                let end = start.saturating_add(data.len() as u64);
                chunk.eof = ended && end >= len;
                chunk.offset = start;
                if request.times {
                    chunk.marks = chunk_marks(&marks, start, end, crate::clock::now_ms());
                }
                chunk.data = data;
            }
            Err(e) => chunk.error = format!("cannot read {}: {e}", file.display()),
        }
        chunk
    }
}

/// Up to `max` bytes of `path` from the offset `start` chooses (given the
/// open file and its length), that offset, and the file's length.
fn read_range(
    path: &Path,
    offset: u64,
    max: usize,
    start: impl FnOnce(&mut File, u64) -> io::Result<u64>,
) -> io::Result<(Vec<u8>, u64, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let offset = start(&mut file, len)?.max(offset);
    if offset >= len {
        return Ok((Vec::new(), offset, len));
    }
    file.seek(SeekFrom::Start(offset))?;
    let want = usize::try_from(len - offset).map_or(max, |rest| rest.min(max));
    let mut data = Vec::with_capacity(want);
    file.take(want as u64).read_to_end(&mut data)?;
    Ok((data, offset, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_finds_the_start_of_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        for (text, lines, want) in [
            ("a\nb\nc\n", 2, 2),
            ("a\nb\nc", 2, 2),
            ("a\nb\nc\n", 5, 0),
            ("a\nb\nc\n", 1, 4),
            ("", 3, 0),
        ] {
            std::fs::write(&path, text).unwrap();
            let mut f = File::open(&path).unwrap();
            let got = tail_offset(&mut f, text.len() as u64, lines).unwrap();
            assert_eq!(got, want, "{text:?} tail {lines}");
        }
    }

    #[test]
    fn marks_cover_a_chunk_and_since_starts_after_older_output() {
        let marks = [(10, 1000), (25, 2000), (40, 3000)];
        assert_eq!(since_offset(&marks, 2500), 25);
        assert_eq!(since_offset(&marks, 500), 0);
        assert_eq!(since_offset(&marks, 9000), 40);
        assert_eq!(
            chunk_marks(&marks, 5, 30, 9),
            vec![(10, 1000), (25, 2000), (30, 3000)]
        );
        assert_eq!(chunk_marks(&marks, 40, 50, 7777), vec![(50, 7777)]);
        assert!(chunk_marks(&marks, 5, 5, 1).is_empty());
    }

    #[test]
    fn a_full_times_file_keeps_every_other_entry_and_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.times");
        for i in 0..MAX_TIME_MARKS as u64 + 1 {
            append_mark(&path, i + 1, i).unwrap();
        }
        let marks = read_marks(&path).unwrap();
        assert!(marks.len() <= MAX_TIME_MARKS / 2 + 2, "{}", marks.len());
        assert_eq!(
            marks.last(),
            Some(&(MAX_TIME_MARKS as u64 + 1, MAX_TIME_MARKS as u64))
        );
        assert!(
            marks
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
    }
}
