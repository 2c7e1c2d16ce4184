//! The launcher's protocol, on a Unix stream socket that is the launcher
//! process's standard input.
//!
//! The agent sends requests: `u32` length + sandbox path, `u32` length +
//! the task plan as JSON (little-endian; an empty plan is read from the
//! run's journal). The launcher answers each request in order with a
//! [`Message`] (the answers to the requests of one read go in one write, or
//! sooner once one has waited [`ANSWER_HOLD`]: the agent sends a launch
//! batch's requests together), and sends `Exited` messages, with the exit
//! status, whenever a task's end has been recorded. Every message is 40
//! bytes.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proc::ProcessIdentity;
use crate::record::{ExitRecord, TaskPlan};

/// Once an answer has been held back this long, to go with the next ones,
/// the launcher sends what it holds before it starts another task.
pub(super) const ANSWER_HOLD: Duration = Duration::from_millis(2);
/// Longest sandbox path a request may name (`PATH_MAX`).
pub(super) const MAX_REQUEST_BYTES: usize = 4096;
/// Longest task plan a request may carry (a longer one is read from the
/// run's journal instead).
pub(super) const MAX_PLAN_BYTES: usize = 1 << 20;

/// Appends the request to start the task of the run in `sandbox` (its
/// path shorter than [`MAX_REQUEST_BYTES`]) to `batch`, with its plan when
/// it fits in [`MAX_PLAN_BYTES`] (the plan saves the launcher reading it
/// back from the journal, where the agent has just written it).
pub(super) fn push_request(batch: &mut Vec<u8>, sandbox: &Path, plan: Option<&TaskPlan>) {
    let path = sandbox.as_os_str().as_bytes();
    debug_assert!(path.len() < MAX_REQUEST_BYTES);
    let plan = plan
        .and_then(|plan| serde_json::to_vec(plan).ok())
        .filter(|bytes| bytes.len() <= MAX_PLAN_BYTES)
        .unwrap_or_default();
    let length = |len: usize| u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes();
    batch.extend_from_slice(&length(path.len()));
    batch.extend_from_slice(path);
    batch.extend_from_slice(&length(plan.len()));
    batch.extend_from_slice(&plan);
}

/// The first whole request in `inbox`, taken out of it: its sandbox and
/// its plan (`None`: read it from the journal; also for one that does not
/// parse). `None` while the request is not whole; an error for bytes that
/// are not the protocol.
pub(super) fn take_request(inbox: &mut Vec<u8>) -> io::Result<Option<(PathBuf, Option<TaskPlan>)>> {
    let length = |bytes: &[u8], at: usize| -> io::Result<Option<usize>> {
        let Some(word) = bytes.get(at..at + 4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > MAX_PLAN_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request too long",
            ));
        }
        Ok(Some(len))
    };
    let Some(path_len) = length(inbox, 0)? else {
        return Ok(None);
    };
    if path_len > MAX_REQUEST_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "path too long"));
    }
    let Some(plan_len) = length(inbox, 4 + path_len)? else {
        return Ok(None);
    };
    let end = 8 + path_len + plan_len;
    if inbox.len() < end {
        return Ok(None);
    }
    let sandbox = PathBuf::from(OsStr::from_bytes(&inbox[4..4 + path_len]));
    let plan = match plan_len {
        // Not sent: it is in the journal.
        0 => None,
        _ => serde_json::from_slice::<TaskPlan>(&inbox[8 + path_len..end]).ok(),
    };
    inbox.drain(..end);
    Ok(Some((sandbox, plan)))
}

/// How a task ended, as its `exit` entry says (the launcher sends it with
/// the news, so the agent need not read the journal back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    pub(crate) task: ProcessIdentity,
    /// 128 + signal for a signal.
    pub(crate) exit_code: i32,
    pub(crate) signal: i32,
    pub(crate) oom_killed: bool,
    pub(crate) time_ms: u64,
}

impl Ended {
    /// The `exit` entry the launcher wrote for it.
    pub(crate) fn exit_record(&self) -> ExitRecord {
        ExitRecord::of(self.exit_code, self.signal, self.oom_killed, self.time_ms)
    }
}

/// A task the launcher started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    pub(crate) task: ProcessIdentity,
    /// The launcher's wall clock (ms) just after the task executed: the
    /// clock its `exit` entry is stamped with, so a run is never seen to
    /// end before it started (the agent takes the answer in later, after
    /// the rest of its batch, when a short task may have ended already).
    pub(crate) time_ms: u64,
}

/// A message from the launcher to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Message {
    /// The answer to a request: the task's identity and start.
    Started(Started),
    /// The answer to a request: nothing started or recorded (an errno).
    Refused(i32),
    /// The answer to a request: the task could not start, and the run's
    /// journal says why.
    StartFailed,
    /// A task's end has been recorded (it was reaped, and nothing of its
    /// run is left).
    Exited(Ended),
}

impl Message {
    pub(super) const BYTES: usize = 40;

    pub(super) fn encode(self) -> [u8; Self::BYTES] {
        let none = ProcessIdentity {
            pid: 0,
            start_ticks: 0,
        };
        let (kind, identity, time_ms, ended) = match self {
            Message::Started(started) => (1u32, started.task, started.time_ms, None),
            Message::Refused(errno) => (
                2,
                ProcessIdentity {
                    pid: 0,
                    start_ticks: u64::from(errno.unsigned_abs()),
                },
                0,
                None,
            ),
            Message::Exited(ended) => (3, ended.task, ended.time_ms, Some(ended)),
            Message::StartFailed => (4, none, 0, None),
        };
        let mut bytes = [0; Self::BYTES];
        bytes[0..4].copy_from_slice(&kind.to_le_bytes());
        bytes[4..8].copy_from_slice(&identity.pid.to_le_bytes());
        bytes[8..16].copy_from_slice(&identity.start_ticks.to_le_bytes());
        if let Some(ended) = ended {
            bytes[16..20].copy_from_slice(&ended.exit_code.to_le_bytes());
            bytes[20..24].copy_from_slice(&ended.signal.to_le_bytes());
            bytes[24..28].copy_from_slice(&u32::from(ended.oom_killed).to_le_bytes());
        }
        bytes[28..36].copy_from_slice(&time_ms.to_le_bytes());
        bytes
    }

    pub(super) fn decode(bytes: &[u8; Self::BYTES]) -> Option<Message> {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let long = |at: usize| {
            let mut value = [0; 8];
            value.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(value)
        };
        let identity = ProcessIdentity {
            pid: word(4),
            start_ticks: long(8),
        };
        match word(0) {
            1 => Some(Message::Started(Started {
                task: identity,
                time_ms: long(28),
            })),
            2 => Some(Message::Refused(i32::try_from(long(8)).ok()?)),
            3 => Some(Message::Exited(Ended {
                task: identity,
                exit_code: word(16).cast_signed(),
                signal: word(20).cast_signed(),
                oom_killed: word(24) != 0,
                time_ms: long(28),
            })),
            4 => Some(Message::StartFailed),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::*;

    #[test]
    fn messages_round_trip() {
        let identity = ProcessIdentity {
            pid: 4_194_304,
            start_ticks: u64::MAX - 3,
        };
        for message in [
            Message::Started(Started {
                task: identity,
                time_ms: u64::MAX - 5,
            }),
            Message::Refused(Errno::ENOENT as i32),
            Message::StartFailed,
            Message::Exited(Ended {
                task: identity,
                exit_code: 137,
                signal: 9,
                oom_killed: true,
                time_ms: u64::MAX - 7,
            }),
            Message::Exited(Ended {
                task: identity,
                exit_code: -1,
                signal: 0,
                oom_killed: false,
                time_ms: 1,
            }),
        ] {
            assert_eq!(Message::decode(&message.encode()), Some(message));
        }
        assert_eq!(Message::decode(&[0; Message::BYTES]), None);
    }

    /// Requests go through whole, in order, with or without their plan;
    /// half a request waits for the rest; bytes that are not the protocol
    /// are an error.
    #[test]
    fn requests_round_trip() {
        let plan = TaskPlan {
            program: "/bin/true".to_owned(),
            args: vec!["a".to_owned()],
            env: vec![("K".to_owned(), "v".to_owned())],
            open_files: Some(1024),
            cgroup: None,
        };
        let mut batch = Vec::new();
        push_request(&mut batch, Path::new("/w/sandboxes/a"), Some(&plan));
        push_request(&mut batch, Path::new("/w/sandboxes/b"), None);
        let mut inbox = batch[..batch.len() - 1].to_vec();
        let (first, with_plan) = take_request(&mut inbox).expect("valid").expect("whole");
        assert_eq!(first, Path::new("/w/sandboxes/a"));
        assert_eq!(with_plan.map(|p| p.args), Some(plan.args));
        assert!(
            take_request(&mut inbox).expect("valid").is_none(),
            "half a request"
        );
        inbox.push(*batch.last().expect("bytes"));
        let (second, none) = take_request(&mut inbox).expect("valid").expect("whole");
        assert_eq!(
            (second.as_path(), none.is_none()),
            (Path::new("/w/sandboxes/b"), true)
        );
        assert!(inbox.is_empty());
        let mut garbage = u32::MAX.to_le_bytes().to_vec();
        assert!(take_request(&mut garbage).is_err());
    }
}
