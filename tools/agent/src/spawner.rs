//! The keeper: one small process per agent that starts every task and
//! records how each one ended.
//!
//! A per-run wrapper process (forked for each run, which then forked the
//! task and waited for it) cost as much CPU again as a short task itself:
//! two forks that copy page tables, the copy-on-write faults after them,
//! and two process exits. The agent cannot start tasks itself and keep
//! their exits safe: if it dies its children's exit statuses are gone, and
//! it is multi-threaded. So it executes its binary once, as `peloton-agent
//! spawner`, a single-threaded process (no runtime, no thread) that:
//! - starts each task like `posix_spawn` does — a child that shares the
//!   keeper's memory (`CLONE_VM | CLONE_VFORK`: no page table copied) and
//!   only makes system calls until it executes the task: a process group
//!   of its own, /dev/null and the run's `stdout`/`stderr`, the sandbox as
//!   working directory, the run's cgroup, RLIMIT_NOFILE, every signal at
//!   its default action and none blocked;
//! - is a child subreaper: tasks and every process they leave behind are
//!   its children;
//! - when a task exits, SIGKILLs its process group (while the unreaped task
//!   still holds the group's id), then what is left of the run outside the
//!   group (its cgroup; processes carrying the run's `PELOTON_SANDBOX`
//!   marker, looked for only when the keeper has children that are not
//!   tasks; at most 5 s), and only then appends the run's `exit` entry to
//!   its journal and tells the agent, with the exit status;
//! - outlives the agent: when the agent's end of the socket closes (it
//!   stopped, or died), the keeper goes on recording the ends of its tasks
//!   and exits after the last one. A restarted agent watches those runs
//!   through `/proc` (the task's and the keeper's identities are in the
//!   run's record) and reads their ends from the journals; new launches go
//!   to a new keeper.
//!
//! What this costs in safety: a task's exit status lives in its keeper
//! until it is recorded. A keeper killed outright (SIGKILL, the OOM killer)
//! loses the statuses of the tasks it had running; they carry on, and are
//! reported FAILED ("lost the run's exit status") when they end. A wrapper
//! had the same weakness, for one run. The agent starts a wrapper per run
//! (`peloton-agent exec`, see `wrapper`) only when no keeper can start.
//!
//! The protocol, on a Unix stream socket that is the keeper's standard
//! input: the agent sends `u32` length + sandbox path, `u32` length + the
//! task plan as JSON (little-endian; an empty plan is read from the run's
//! journal); the keeper answers each request in order with a [`Message`]
//! (the answers to the requests of one read go in one write, or sooner
//! once one has waited [`ANSWER_HOLD`]: the agent sends a launch batch's
//! requests together), and sends `Exited` messages,
//! with the exit status, whenever a task's end has been recorded. Every
//! message is 40 bytes.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{Resource, getrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, geteuid, getppid};

use crate::isolation;
use crate::proc::{self, ProcSnapshot, ProcessIdentity};
use crate::record::{self, STDERR_FILE, STDOUT_FILE, TaskPlan};
use crate::wrapper;

/// How long the agent waits for the keeper to take more of a batch of
/// requests, and for each answer after the one before: far more than a
/// start takes; a keeper that does not answer is replaced.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Once an answer has been held back this long, to go with the next ones,
/// the keeper sends what it holds before it starts another task.
const ANSWER_HOLD: Duration = Duration::from_millis(2);
/// How long a dropped [`Spawner`] gets to exit before it is killed.
const EXIT_PATIENCE: Duration = Duration::from_secs(2);
/// Longest sandbox path a request may name (`PATH_MAX`).
const MAX_REQUEST_BYTES: usize = 4096;
/// Longest task plan a request may carry (a longer one is read from the
/// run's journal instead).
const MAX_PLAN_BYTES: usize = 1 << 20;

/// How a task ended, as its `exit` entry says (the keeper sends it with
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
    /// The `exit` entry the keeper wrote for it.
    pub(crate) fn exit_record(&self) -> record::ExitRecord {
        let mut exit = wrapper::exit_record(self.exit_code, self.signal, self.oom_killed);
        exit.time_ms = self.time_ms;
        exit
    }
}

/// A task the keeper started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    pub(crate) task: ProcessIdentity,
    /// The keeper's wall clock (ms) just after the task executed: the
    /// clock its `exit` entry is stamped with, so a run is never seen to
    /// end before it started (the agent takes the answer in later, after
    /// the rest of its batch, when a short task may have ended already).
    pub(crate) time_ms: u64,
}

/// A message from the keeper to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    /// The answer to a request: the task's identity and start.
    Spawned(Started),
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
    const BYTES: usize = 40;

    fn encode(self) -> [u8; Self::BYTES] {
        let none = ProcessIdentity {
            pid: 0,
            start_ticks: 0,
        };
        let (kind, identity, time_ms, ended) = match self {
            Message::Spawned(started) => (1u32, started.task, started.time_ms, None),
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

    fn decode(bytes: &[u8; Self::BYTES]) -> Option<Message> {
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
            1 => Some(Message::Spawned(Started {
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

/// Why [`Spawner::spawn_many`] started no task for a run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    /// The keeper could not start this run's task and recorded nothing
    /// (its output files, a clone): the run fails with this.
    #[error("the keeper could not start the task: {0}")]
    Refused(io::Error),
    /// The keeper is gone or broken, and never got the request: start the
    /// run another way.
    #[error("the keeper is gone: {0}")]
    Gone(io::Error),
    /// The keeper is gone or broken after it got (some of) the request: it
    /// may have started the task, so the run must not be started again.
    #[error("the keeper did not answer: {0}")]
    Lost(io::Error),
}

/// The agent's handle on its keeper (see the module documentation).
#[derive(Debug)]
pub(crate) struct Spawner {
    /// Non-blocking; the keeper's standard input.
    socket: UnixStream,
    /// `None` once handed back by [`Spawner::close`].
    process: Option<Child>,
    identity: ProcessIdentity,
    /// Bytes received and not yet a whole message.
    inbox: Vec<u8>,
    /// Tasks the keeper said have ended, not yet taken.
    exited: Vec<Ended>,
    /// Tasks started and not yet reported ended.
    live: usize,
}

impl Spawner {
    /// Starts `exe spawner`, in a process group of its own (a terminal's
    /// Ctrl-C is for the agent, which stops in order) and with nothing of
    /// the agent's environment (which may hold its token).
    pub(crate) fn start(exe: &Path) -> io::Result<Spawner> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let process = Command::new(exe)
            .arg("spawner")
            .env_clear()
            .process_group(0)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        // Not waited for yet: its stat is readable.
        let identity = ProcessIdentity::of(process.id()).unwrap_or(ProcessIdentity {
            pid: process.id(),
            start_ticks: 0,
        });
        Ok(Spawner {
            socket: ours,
            process: Some(process),
            identity,
            inbox: Vec::with_capacity(64 * Message::BYTES),
            exited: Vec::new(),
            live: 0,
        })
    }

    /// The keeper's identity (recorded with each run it starts).
    pub(crate) fn identity(&self) -> ProcessIdentity {
        self.identity
    }

    /// Starts the tasks of runs, each given by its sandbox (an absolute
    /// path whose journal holds the task plan) and, to save the keeper
    /// reading it back, its plan. One result a run, in order: the task's
    /// identity once it has executed, as the leader of its own process
    /// group, or `None` if it could not start (the journal's `exit` entry
    /// says why). The requests go in one write and the keeper answers them
    /// together: a round trip, two context switches, for the batch rather
    /// than for each run. A request the keeper never got is `Gone`; one it
    /// got (even in part) and did not answer is `Lost`.
    pub(crate) fn spawn_many(
        &mut self,
        runs: &[(&Path, Option<&TaskPlan>)],
    ) -> Vec<Result<Option<Started>, SpawnError>> {
        let mut results: Vec<Option<Result<Option<Started>, SpawnError>>> =
            Vec::with_capacity(runs.len());
        // Where each request sent starts in `batch`, and its index.
        let mut sent: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        let mut batch = Vec::new();
        let length = |len: usize| u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes();
        for (index, (sandbox, plan)) in runs.iter().enumerate() {
            let path = sandbox.as_os_str().as_bytes();
            if path.len() >= MAX_REQUEST_BYTES {
                results.push(Some(Err(SpawnError::Refused(
                    io::Error::from_raw_os_error(Errno::ENAMETOOLONG as i32),
                ))));
                continue;
            }
            results.push(None);
            sent.push((batch.len(), index));
            // The plan saves the keeper reading it back from the journal
            // (where the agent has just written it); too long, it is left
            // out.
            let plan = plan
                .and_then(|plan| serde_json::to_vec(plan).ok())
                .filter(|bytes| bytes.len() <= MAX_PLAN_BYTES)
                .unwrap_or_default();
            batch.extend_from_slice(&length(path.len()));
            batch.extend_from_slice(path);
            batch.extend_from_slice(&length(plan.len()));
            batch.extend_from_slice(&plan);
        }
        let answered = if sent.is_empty() {
            Ok(())
        } else {
            match self.send(&batch) {
                // The keeper had every byte of the batch.
                Ok(()) => self
                    .answers(&sent, &mut results, true)
                    .map_err(|e| (e, batch.len())),
                Err(failed) => {
                    let _ = self.answers(&sent, &mut results, false);
                    Err(failed)
                }
            }
        };
        if let Err((e, delivered)) = answered {
            // Every request not answered: lost if any of it reached the
            // keeper, else gone.
            for &(start, index) in &sent {
                if results[index].is_some() {
                    continue;
                }
                let copy = io::Error::new(e.kind(), e.to_string());
                results[index] = Some(if start < delivered {
                    Err(SpawnError::Lost(copy))
                } else {
                    Err(SpawnError::Gone(copy))
                });
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every request has a result"))
            .collect()
    }

    /// Takes the keeper's answers to the requests `sent` (in order), each
    /// within [`ANSWER_TIMEOUT`] of the one before; or, without `wait`, only
    /// those already received (for a batch whose sending failed: the
    /// keeper may have answered its first requests meanwhile).
    fn answers(
        &mut self,
        sent: &[(usize, usize)],
        results: &mut [Option<Result<Option<Started>, SpawnError>>],
        wait: bool,
    ) -> io::Result<()> {
        for &(_, index) in sent {
            let deadline = Instant::now() + ANSWER_TIMEOUT;
            let answer = loop {
                if let Some(message) = self.receive()? {
                    break message;
                }
                if !wait {
                    return Ok(());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the keeper did not answer",
                    ));
                }
                wait_readable(&self.socket, left)?;
            };
            results[index] = Some(self.result_of(answer));
        }
        Ok(())
    }

    /// What an answer says of its request.
    fn result_of(&mut self, answer: Message) -> Result<Option<Started>, SpawnError> {
        match answer {
            Message::Spawned(started) => {
                self.live += 1;
                Ok(Some(started))
            }
            Message::StartFailed => Ok(None),
            Message::Refused(errno) => {
                Err(SpawnError::Refused(io::Error::from_raw_os_error(errno)))
            }
            Message::Exited(_) => unreachable!("receive keeps exits"),
        }
    }

    /// Reads what the keeper has sent (without waiting) and returns the
    /// tasks whose ends it has recorded since the last call. An error means
    /// the keeper is gone or broken (the tasks it had not reported are
    /// still alive, or unknown: watch them another way).
    pub(crate) fn take_exited(&mut self) -> io::Result<Vec<Ended>> {
        if let Some(message) = self.receive()? {
            // Nothing was asked, so nothing is answered.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the keeper sent an answer to no request: {message:?}"),
            ));
        }
        self.live = self.live.saturating_sub(self.exited.len());
        Ok(std::mem::take(&mut self.exited))
    }

    /// Closes the agent's end (the keeper goes on until its tasks have
    /// ended) and hands back the process, to be reaped when it exits.
    pub(crate) fn close(mut self) -> Option<Child> {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        self.process.take()
    }

    /// Sends a batch of requests whole, taking in what the keeper sends
    /// meanwhile (a keeper blocked writing its news would otherwise never
    /// read the requests). The error says how many bytes went.
    fn send(&mut self, mut bytes: &[u8]) -> Result<(), (io::Error, usize)> {
        let total = bytes.len();
        let delivered = |left: &[u8]| total - left.len();
        // The keeper takes a batch as it starts its tasks: it has
        // `ANSWER_TIMEOUT` from each write that went to take more.
        let mut deadline = Instant::now() + ANSWER_TIMEOUT;
        while !bytes.is_empty() {
            match self.socket.write(bytes) {
                Ok(0) => return Err((io::ErrorKind::WriteZero.into(), delivered(bytes))),
                Ok(n) => {
                    bytes = &bytes[n..];
                    deadline = Instant::now() + ANSWER_TIMEOUT;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let e = io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the keeper did not take the request",
                        );
                        return Err((e, delivered(bytes)));
                    }
                    let readable = {
                        let mut fds = [PollFd::new(
                            self.socket.as_fd(),
                            PollFlags::POLLOUT | PollFlags::POLLIN,
                        )];
                        match poll(&mut fds, timeout(left)) {
                            Ok(_) | Err(Errno::EINTR) => {}
                            Err(e) => return Err((e.into(), delivered(bytes))),
                        }
                        fds[0]
                            .revents()
                            .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
                    };
                    if readable {
                        self.pull().map_err(|e| (e, delivered(bytes)))?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err((e, delivered(bytes))),
            }
        }
        Ok(())
    }

    /// Reads what is there into the inbox, without waiting.
    fn pull(&mut self) -> io::Result<()> {
        let mut buffer = [0u8; 64 * Message::BYTES];
        loop {
            match self.socket.read(&mut buffer) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.inbox.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next answer received, if one is there; `Exited` messages on
    /// the way are kept for [`Spawner::take_exited`]. Never waits.
    fn receive(&mut self) -> io::Result<Option<Message>> {
        loop {
            while self.inbox.len() >= Message::BYTES {
                let mut bytes = [0; Message::BYTES];
                bytes.copy_from_slice(&self.inbox[..Message::BYTES]);
                self.inbox.drain(..Message::BYTES);
                match Message::decode(&bytes) {
                    Some(Message::Exited(ended)) => self.exited.push(ended),
                    Some(answer) => return Ok(Some(answer)),
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "the spawner sent an unknown message",
                        ));
                    }
                }
            }
            let before = self.inbox.len();
            self.pull()?;
            if self.inbox.len() == before {
                return Ok(None);
            }
        }
    }
}

impl Drop for Spawner {
    /// Closes the socket. A keeper with no task left then exits, and is
    /// given a moment to (so that an agent that stops leaves no process
    /// behind); one with tasks carries on without the agent.
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        let Some(process) = &mut self.process else {
            return;
        };
        if self.live > 0 {
            return;
        }
        let deadline = Instant::now() + EXIT_PATIENCE;
        while Instant::now() < deadline {
            match process.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Ok(Some(_)) | Err(_) => return,
            }
        }
    }
}

fn timeout(duration: Duration) -> PollTimeout {
    PollTimeout::try_from(duration).unwrap_or(PollTimeout::MAX)
}

fn wait_readable(socket: &UnixStream, within: Duration) -> io::Result<()> {
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, timeout(within)) {
        Ok(_) | Err(Errno::EINTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `peloton-agent spawner` (internal: only the agent starts it): serves
/// the agent on the socket that is its standard input, and keeps every task
/// it started until the task has ended and its end is recorded — after the
/// agent has closed the socket too. Returns the process's exit code.
pub fn run_spawner() -> i32 {
    match serve() {
        Ok(()) => 0,
        Err(e) => {
            // Not `eprintln!`: it panics when the agent's stderr is gone.
            let _ = writeln!(io::stderr(), "peloton-agent spawner: {e}");
            1
        }
    }
}

/// Bytes of stack the task's child runs on until it executes the task
/// (it calls a few system calls and nothing else).
const CHILD_STACK_BYTES: usize = 64 * 1024;
/// How often a run whose processes are not all gone is looked at again.
const CLEANUP_PAUSE: Duration = Duration::from_millis(10);
/// How long the keeper goes on finding and SIGKILLing what is left of a run
/// before it records the run's end anyway.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(5);

/// A task the keeper started and has not yet reaped.
struct Task {
    identity: ProcessIdentity,
    sandbox: PathBuf,
    cgroup: Option<PathBuf>,
}

/// A reaped task whose run may still have processes; its end is recorded
/// once they are gone.
struct Cleanup {
    task: Task,
    exit_code: i32,
    signal: i32,
    /// Its end is recorded by then even if something of it is left.
    deadline: Instant,
    /// When it is looked at next.
    next: Instant,
    /// The task's process group was seen empty (it cannot fill again, and
    /// its id may be another group's from then on).
    group_gone: bool,
}

/// The keeper's state.
struct Serving {
    /// `None` once the agent has closed its end.
    socket: Option<UnixStream>,
    /// SIGCHLD, blocked and read from here, so one `poll` waits for both.
    child_exits: SignalFd,
    devnull: File,
    /// Tasks not yet reaped, by pid.
    tasks: HashMap<u32, Task>,
    cleanups: Vec<Cleanup>,
    agent: Pid,
    me: u32,
    inbox: Vec<u8>,
    stack: Vec<u8>,
    /// `/proc/self/task/<pid>/children`, where the kernel has it.
    children_file: Option<PathBuf>,
    /// The signals whose action here is not the default, asked once at
    /// the start (the keeper sets none after): a task's child resets these
    /// only, instead of all 64 (about 20 µs a task on a VM).
    non_default_signals: Vec<i32>,
    /// The highest RLIMIT_NOFILE a task may get: this process's hard
    /// limit, unless it runs as root (which may raise it). Asked once (a
    /// hard limit lowered later from outside, with `prlimit`, makes the
    /// child fall back to it: see `child_main`).
    open_files_ceiling: Option<u64>,
}

fn serve() -> io::Result<()> {
    let agent = getppid();
    let socket = UnixStream::from(io::stdin().as_fd().try_clone_to_owned()?);
    let devnull = File::open("/dev/null")?;
    // The socket's only handle is `socket` from now on, so that dropping it
    // closes the agent's connection (the keeper may outlive it).
    // SAFETY: descriptor 0 is replaced atomically; nothing holds an owned
    // handle on it (standard input is only used by number).
    #[allow(unsafe_code)]
    if unsafe { nix::libc::dup2(devnull.as_raw_fd(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // Every task the keeper starts, and every process such a task leaves
    // behind, is the keeper's to reap: orphans come here, not to init.
    nix::sys::prctl::set_child_subreaper(true)?;
    let mut sigchld = SigSet::empty();
    sigchld.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&sigchld), None)?;
    let child_exits =
        SignalFd::with_flags(&sigchld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
    let me = std::process::id();
    let children_file = PathBuf::from(format!("/proc/self/task/{me}/children"));
    let mut serving = Serving {
        socket: Some(socket),
        child_exits,
        devnull,
        tasks: HashMap::new(),
        cleanups: Vec::new(),
        agent,
        me,
        inbox: Vec::with_capacity(MAX_REQUEST_BYTES + 4),
        stack: vec![0; CHILD_STACK_BYTES],
        children_file: children_file.exists().then_some(children_file),
        non_default_signals: wrapper::non_default_signals(),
        open_files_ceiling: match getrlimit(Resource::RLIMIT_NOFILE) {
            Ok((_, hard)) if !geteuid().is_root() => Some(hard),
            _ => None,
        },
    };
    loop {
        if serving.socket.is_none() && serving.tasks.is_empty() && serving.cleanups.is_empty() {
            return Ok(());
        }
        let wait = if serving.cleanups.is_empty() {
            PollTimeout::NONE
        } else {
            timeout(CLEANUP_PAUSE)
        };
        let (requests, exits) = {
            let mut fds = vec![PollFd::new(serving.child_exits.as_fd(), PollFlags::POLLIN)];
            if let Some(socket) = &serving.socket {
                fds.push(PollFd::new(socket.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, wait) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            (fds.get(1).is_some_and(ready), ready(&fds[0]))
        };
        if exits {
            serving.reap();
        }
        serving.clean_up();
        if requests {
            match serving.read_requests() {
                Ok(true) => {}
                // The agent closed its end (it stopped, or died): the
                // tasks carry on, and their ends are still recorded.
                Ok(false) => serving.socket = None,
                Err(e) => {
                    // Not the agent's protocol: drop it, keep the tasks.
                    let _ = writeln!(
                        io::stderr(),
                        "peloton-agent spawner: {e}; closing the agent's socket"
                    );
                    serving.socket = None;
                }
            }
        }
    }
}

impl Serving {
    /// Reads and serves whole requests. False at the end of the stream.
    fn read_requests(&mut self) -> io::Result<bool> {
        let Some(socket) = &mut self.socket else {
            return Ok(false);
        };
        let mut buffer = [0u8; 8192];
        let n = match socket.read(&mut buffer) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(e),
        };
        self.inbox.extend_from_slice(&buffer[..n]);
        let mut held = Vec::new();
        let served = self.serve_requests(&mut held);
        // What was started is answered, even when a later request is not
        // the agent's protocol.
        let told = held.is_empty() || self.tell(&held);
        served.map(|open| open && told)
    }

    /// Serves the whole requests in the inbox, adding their answers to
    /// `held`. The answers go together (the agent sends its launches in
    /// batches and waits for all their answers): in one write at the end
    /// of the read (by the caller), or before the next start once the
    /// oldest has waited [`ANSWER_HOLD`] (so an answer waits at most that
    /// and one start — which may hang, on an exec from a dead mount).
    fn serve_requests(&mut self, held: &mut Vec<u8>) -> io::Result<bool> {
        let mut held_since: Option<Instant> = None;
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
        while let Some(path_len) = length(&self.inbox, 0)? {
            if path_len > MAX_REQUEST_BYTES {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "path too long"));
            }
            let Some(plan_len) = length(&self.inbox, 4 + path_len)? else {
                break;
            };
            let end = 8 + path_len + plan_len;
            if self.inbox.len() < end {
                break;
            }
            let sandbox = PathBuf::from(OsStr::from_bytes(&self.inbox[4..4 + path_len]));
            let plan = match plan_len {
                // Not sent: it is in the journal.
                0 => None,
                _ => serde_json::from_slice::<TaskPlan>(&self.inbox[8 + path_len..end]).ok(),
            };
            self.inbox.drain(..end);
            if self.agent_hung_up() {
                // The agent closed its end after sending this: it gave up
                // waiting (and failed the run) or died. Started now, the
                // task would run with no one to report it.
                self.inbox.clear();
                return Ok(false);
            }
            if held_since.is_some_and(|since| since.elapsed() >= ANSWER_HOLD) {
                if !self.tell(held) {
                    return Ok(false);
                }
                held.clear();
                held_since = None;
            }
            let answer = match self.start_task(&sandbox, plan) {
                Ok(Some(started)) => Message::Spawned(started),
                Ok(None) => Message::StartFailed,
                Err(e) => Message::Refused(e.raw_os_error().unwrap_or(Errno::EIO as i32)),
            };
            held.extend_from_slice(&answer.encode());
            held_since.get_or_insert_with(Instant::now);
        }
        Ok(true)
    }

    /// Whether the agent has shut its end of the socket (what it sent
    /// before may still be unread).
    fn agent_hung_up(&self) -> bool {
        let Some(socket) = &self.socket else {
            return true;
        };
        use nix::libc;
        let mut fd = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for a descriptor this process owns;
        // no waiting.
        #[allow(unsafe_code)]
        let ready = unsafe { libc::poll(&mut fd, 1, 0) };
        ready > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
    }

    /// Sends bytes to the agent; false if it is gone.
    fn tell(&mut self, bytes: &[u8]) -> bool {
        let Some(socket) = &mut self.socket else {
            return false;
        };
        if socket.write_all(bytes).is_err() {
            self.socket = None;
            return false;
        }
        true
    }

    /// Starts the task of the run in `sandbox`: its own process group,
    /// /dev/null and the run's output files, the sandbox as its working
    /// directory, its cgroup and limits, every signal at its default and
    /// none blocked. `Ok(None)`: it could not start, and the journal says
    /// why (an `exit` entry). An error: nothing was started or recorded.
    fn start_task(
        &mut self,
        sandbox: &Path,
        plan: Option<TaskPlan>,
    ) -> io::Result<Option<Started>> {
        let plan = match plan.map_or_else(|| record::read_plan(sandbox), Ok) {
            Ok(plan) => plan,
            Err(e) => {
                let reason = format!("cannot read the task plan: {e}");
                self.record_start_failure(sandbox, reason)?;
                return Ok(None);
            }
        };
        let program = match wrapper::find_program(&plan.program, &plan.env, sandbox) {
            Ok(path) => path,
            Err(e) => {
                let reason = format!("cannot start {:?}: {e}", plan.program);
                self.record_start_failure(sandbox, reason)?;
                return Ok(None);
            }
        };
        let output = |name| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(sandbox.join(name))
        };
        let stdout = output(STDOUT_FILE)?;
        let stderr = output(STDERR_FILE)?;
        let cstring = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(Errno::EINVAL as i32))
        };
        let program_c = cstring(program.as_os_str().as_bytes())?;
        let args_c = std::iter::once(plan.program.as_bytes())
            .chain(plan.args.iter().map(|a| a.as_bytes()))
            .map(cstring)
            .collect::<io::Result<Vec<CString>>>()?;
        let env_c = plan
            .env
            .iter()
            .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
            .collect::<io::Result<Vec<CString>>>()?;
        let argv: Vec<*const nix::libc::c_char> = args_c
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        // A file the kernel cannot execute (no `#!`) is run by the shell,
        // as `execvp` does: `/bin/sh FILE ARGS…`.
        let shell = c"/bin/sh";
        let shell_argv: Vec<*const nix::libc::c_char> = [shell.as_ptr(), program_c.as_ptr()]
            .into_iter()
            .chain(args_c.iter().skip(1).map(|a| a.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp: Vec<*const nix::libc::c_char> = env_c
            .iter()
            .map(|e| e.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let dir_c = cstring(sandbox.as_os_str().as_bytes())?;
        let cgroup_procs = plan
            .cgroup
            .as_ref()
            .map(|c| cstring(c.join("cgroup.procs").as_os_str().as_bytes()))
            .transpose()?;
        let open_files = plan.open_files.map(|limit| {
            self.open_files_ceiling
                .map_or(limit, |hard| limit.min(hard))
        });
        let child = ChildPlan {
            program: program_c.as_ptr(),
            argv: argv.as_ptr(),
            shell: shell.as_ptr(),
            shell_argv: shell_argv.as_ptr(),
            envp: envp.as_ptr(),
            dir: dir_c.as_ptr(),
            stdin: self.devnull.as_raw_fd(),
            stdout: stdout.as_raw_fd(),
            stderr: stderr.as_raw_fd(),
            cgroup_procs: cgroup_procs
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr()),
            open_files: open_files.unwrap_or(NO_LIMIT),
            signals: self.non_default_signals.as_ptr(),
            signal_count: self.non_default_signals.len(),
            failure: AtomicU64::new(0),
        };
        let before = proc::boottime_ns();
        let pid = spawn_child(&child, &mut self.stack)?;
        let after = proc::boottime_ns();
        // The clock the run's `exit` entry will be stamped with.
        let started_ms = record::now_ms();
        let failure = child.failure.load(Ordering::Acquire);
        if failure != 0 {
            // It exited without executing the task: reap it here.
            let _ = waitpid(Pid::from_raw(pid), None);
            let reason = ChildFailure::decode(failure).reason(&plan, &program);
            self.record_start_failure(sandbox, reason)?;
            return Ok(None);
        }
        // The child made itself its group's leader before it executed the
        // task, and this thread resumed only after that (CLONE_VFORK): the
        // group exists before the agent hears of the task (and may signal
        // it). A second `setpgid` from here would fail (EACCES) anyway.
        let pid = u32::try_from(pid).unwrap_or(0);
        // From the clock around the clone when it tells; else from /proc
        // (not reaped yet: at worst a zombie, whose stat is readable).
        let identity = match proc::start_ticks_between(before, after) {
            Some(start_ticks) => ProcessIdentity { pid, start_ticks },
            None => ProcessIdentity::of(pid).unwrap_or(ProcessIdentity {
                pid,
                start_ticks: 0,
            }),
        };
        self.tasks.insert(
            pid,
            Task {
                identity,
                sandbox: sandbox.to_path_buf(),
                cgroup: plan.cgroup,
            },
        );
        Ok(Some(Started {
            task: identity,
            time_ms: started_ms,
        }))
    }

    fn record_start_failure(&mut self, sandbox: &Path, reason: String) -> io::Result<()> {
        let exit = wrapper::start_failure(sandbox, reason);
        let mut journal = record::open_journal(sandbox)?;
        record::append_exit(&mut journal, &exit)
    }

    /// Reaps every exited child. A task is reaped only after a SIGKILL to
    /// its process group, sent while the unreaped task still holds the
    /// group's id (so the id cannot be anyone else's yet); its run is then
    /// cleaned up after before its end is recorded.
    fn reap(&mut self) {
        while let Ok(Some(_)) = self.child_exits.read_signal() {}
        let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        loop {
            let (pid, exit_code, signal) = match waitid(Id::All, peek) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, code, 0),
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    let number = signal as i32;
                    (pid, 128 + number, number)
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(other) => {
                    // Not asked for (stops are not reported); reap whatever
                    // it is so that the loop moves on.
                    if let Some(pid) = other.pid() {
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                    }
                    continue;
                }
            };
            let number = u32::try_from(pid.as_raw()).unwrap_or(0);
            if let Some(task) = self.tasks.remove(&number) {
                let _ = killpg(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                let now = Instant::now();
                self.cleanups.push(Cleanup {
                    task,
                    exit_code,
                    signal,
                    deadline: now + CLEANUP_PATIENCE,
                    next: now,
                    group_gone: false,
                });
            } else {
                // An orphan some task left behind, reparented here.
                let _ = waitpid(pid, None);
            }
        }
    }

    /// Looks at every run being cleaned up after: once nothing of it is
    /// left, records its end and tells the agent.
    fn clean_up(&mut self) {
        if self.cleanups.is_empty() {
            return;
        }
        let mut news = Vec::new();
        let mut snapshot: Option<ProcSnapshot> = None;
        // Asked once a pass, for however many runs end in it.
        let mut orphans: Option<bool> = None;
        let now = Instant::now();
        for mut cleanup in std::mem::take(&mut self.cleanups) {
            if now < cleanup.next {
                self.cleanups.push(cleanup);
                continue;
            }
            cleanup.next = now + CLEANUP_PAUSE;
            let done = self.is_clean(&mut cleanup, &mut orphans, &mut snapshot)
                || now >= cleanup.deadline && {
                    wrapper::note(
                        &cleanup.task.sandbox,
                        "task processes were still appearing after cleanup; giving up",
                    );
                    true
                };
            if done {
                let ended = self.record_end(&cleanup);
                news.extend_from_slice(&Message::Exited(ended).encode());
            } else {
                self.cleanups.push(cleanup);
            }
        }
        if !news.is_empty() && self.tell(&news) {
            // The session polls on SIGCHLD; these are, after all, the
            // agent's grandchildren.
            let _ = kill(self.agent, Signal::SIGCHLD);
        }
    }

    /// True if nothing of the run is left; else SIGKILLs what is.
    fn is_clean(
        &self,
        cleanup: &mut Cleanup,
        orphans: &mut Option<bool>,
        snapshot: &mut Option<ProcSnapshot>,
    ) -> bool {
        let task = &cleanup.task;
        let mut clean = true;
        if let Some(cgroup) = &task.cgroup
            && !isolation::cgroup_pids(cgroup).is_empty()
        {
            isolation::kill_cgroup(cgroup);
            clean = false;
        }
        // The group was SIGKILLed as the task was reaped; its members are
        // gone once reaped here (a member's exit reparents what it forked
        // to the keeper, where the search below finds it). A probe only,
        // until it first finds the group empty: after that the id may be
        // another group's.
        if !cleanup.group_gone {
            let group = Pid::from_raw(i32::try_from(task.identity.pid).unwrap_or(i32::MAX));
            if killpg(group, None).is_ok() {
                clean = false;
            } else {
                cleanup.group_gone = true;
            }
        }
        if *orphans.get_or_insert_with(|| self.orphans()) {
            let snapshot = snapshot.get_or_insert_with(ProcSnapshot::take);
            let marker = proc::sandbox_marker(&task.sandbox);
            let mut victims = snapshot.marked(&marker);
            let below: Vec<u32> = victims
                .iter()
                .flat_map(|&pid| snapshot.descendants(pid))
                .collect();
            victims.extend(below);
            if !victims.is_empty() {
                proc::kill_all(&victims);
                clean = false;
            }
        }
        clean
    }

    /// Whether the keeper has children that are not its tasks: what tasks
    /// left outside their process groups. Read from the kernel's list of
    /// the keeper's children where it has one; else every pid in `/proc` is
    /// asked with a `waitid` that fails with ECHILD for anyone but the
    /// keeper's own children (no file read per process).
    fn orphans(&self) -> bool {
        let is_orphan =
            |pid: u32| pid != self.me && !self.tasks.contains_key(&pid) && is_child(pid);
        if let Some(file) = &self.children_file {
            // Read to its end: the list is one record per child, and a
            // read returns only the records that fit (the newest orphans
            // are at its end).
            return fs::read_to_string(file).map_or(true, |text| {
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                    .any(is_orphan)
            });
        }
        let Ok(entries) = fs::read_dir("/proc") else {
            return true;
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .any(is_orphan)
    }

    /// Appends the run's `exit` entry (after removing its cgroup).
    fn record_end(&self, cleanup: &Cleanup) -> Ended {
        let task = &cleanup.task;
        let oom_killed = task
            .cgroup
            .as_deref()
            .is_some_and(isolation::cgroup_oom_killed);
        if let Some(cgroup) = &task.cgroup
            && let Err(e) = isolation::remove_cgroup(cgroup)
        {
            wrapper::note(
                &task.sandbox,
                &format!("cannot remove {}: {e}", cgroup.display()),
            );
        }
        let exit = wrapper::exit_record(cleanup.exit_code, cleanup.signal, oom_killed);
        let written = record::open_journal(&task.sandbox)
            .and_then(|mut journal| record::append_exit(&mut journal, &exit));
        if let Err(e) = written {
            wrapper::note(&task.sandbox, &format!("cannot record the exit: {e}"));
        }
        Ended {
            task: task.identity,
            exit_code: exit.exit_code,
            signal: exit.signal,
            oom_killed: exit.oom_killed,
            time_ms: exit.time_ms,
        }
    }
}

/// Whether `pid` is a child of this process (alive or a zombie).
fn is_child(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(
        waitid(Id::Pid(Pid::from_raw(raw)), flags),
        Err(Errno::ECHILD)
    )
}

/// "No limit" in [`ChildPlan`].
const NO_LIMIT: u64 = u64::MAX;

/// Everything the task's child needs, prepared by the keeper: the child
/// shares the keeper's memory until it executes the task, and may not
/// allocate or take a lock (the keeper is suspended meanwhile, at any
/// point of its own code).
struct ChildPlan {
    program: *const nix::libc::c_char,
    argv: *const *const nix::libc::c_char,
    /// `/bin/sh` and `/bin/sh PROGRAM ARGS…`, for a program without `#!`.
    shell: *const nix::libc::c_char,
    shell_argv: *const *const nix::libc::c_char,
    envp: *const *const nix::libc::c_char,
    dir: *const nix::libc::c_char,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// Null: no cgroup.
    cgroup_procs: *const nix::libc::c_char,
    open_files: u64,
    /// The signals to set back to their default action.
    signals: *const i32,
    signal_count: usize,
    /// Set by a child that could not execute the task ([`ChildFailure`]).
    failure: AtomicU64,
}

/// Why the task's child did not get to execute the task: a stage and an
/// errno, packed into [`ChildPlan::failure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildFailure {
    /// Its descriptors or working directory.
    Setup(i32),
    Cgroup(i32),
    /// Resetting this signal's disposition.
    Signal(i32, i32),
    Exec(i32),
}

impl ChildFailure {
    fn encode(self) -> u64 {
        let (stage, detail, errno) = match self {
            ChildFailure::Setup(errno) => (1u64, 0, errno),
            ChildFailure::Cgroup(errno) => (2, 0, errno),
            ChildFailure::Signal(signal, errno) => (3, signal, errno),
            ChildFailure::Exec(errno) => (4, 0, errno),
        };
        (stage << 48)
            | (u64::from(detail.unsigned_abs() & 0xffff) << 32)
            | u64::from(errno.unsigned_abs())
    }

    fn decode(code: u64) -> ChildFailure {
        let errno = i32::try_from(code & 0xffff_ffff).unwrap_or(0);
        let detail = i32::try_from((code >> 32) & 0xffff).unwrap_or(0);
        match code >> 48 {
            2 => ChildFailure::Cgroup(errno),
            3 => ChildFailure::Signal(detail, errno),
            4 => ChildFailure::Exec(errno),
            _ => ChildFailure::Setup(errno),
        }
    }

    fn reason(self, plan: &TaskPlan, program: &Path) -> String {
        let error = |errno| io::Error::from_raw_os_error(errno);
        match self {
            ChildFailure::Setup(errno) => format!(
                "cannot give the task its output files and working directory: {}",
                error(errno)
            ),
            ChildFailure::Cgroup(errno) => format!(
                "cannot join the cgroup {}: {}",
                plan.cgroup.as_deref().unwrap_or(Path::new("")).display(),
                error(errno)
            ),
            ChildFailure::Signal(signal, errno) => format!(
                "cannot reset signal {signal} to its default action: {}",
                Errno::from_raw(errno)
            ),
            ChildFailure::Exec(errno) => format!(
                "cannot start {:?} ({}): {}",
                plan.program,
                program.display(),
                error(errno)
            ),
        }
    }
}

/// Starts the task's child on `stack`, sharing this process's memory, and
/// returns once the child has executed the task or given up (then
/// `plan.failure` says why): what `posix_spawn` does, with the cgroup and
/// the limits it cannot set. No page table is copied, which is most of what
/// a fork costs.
fn spawn_child(plan: &ChildPlan, stack: &mut [u8]) -> io::Result<i32> {
    use nix::libc;
    // The stack grows down from its 16-byte aligned top.
    let top = stack.as_mut_ptr_range().end as usize & !15;
    // SAFETY: `child_main` gets a pointer to `plan`, which outlives the
    // child's use of it: with CLONE_VFORK this thread is suspended until
    // the child has executed the task or exited. The child runs on its own
    // stack (`stack`, unused by anyone else meanwhile), only makes system
    // calls (no allocation, no lock: this process is single-threaded and
    // suspended, but its heap may be mid-update), and has its own copy of
    // the signal handlers (no CLONE_SIGHAND), which it resets first.
    #[allow(unsafe_code)]
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(plan).cast_mut().cast(),
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// The task's child, between the clone and the task's exec (see
/// [`spawn_child`]).
extern "C" fn child_main(arg: *mut nix::libc::c_void) -> nix::libc::c_int {
    use nix::libc;
    // SAFETY: `arg` is the `ChildPlan` that `spawn_child` passed, alive and
    // unchanged while this runs; its pointers are NUL-terminated strings
    // and null-terminated arrays of them, kept alive by the keeper.
    #[allow(unsafe_code)]
    unsafe {
        let plan = &*arg.cast::<ChildPlan>();
        let fail = |failure: ChildFailure| -> ! {
            plan.failure.store(failure.encode(), Ordering::Release);
            libc::_exit(wrapper::EXIT_CANNOT_START)
        };
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // Ignored signals survive exec, and the keeper's own dispositions
        // must not apply here: each one that is not the default goes back
        // to it first (the others are the default already).
        let signals = std::slice::from_raw_parts(plan.signals, plan.signal_count);
        if let Err(signal) = wrapper::reset_signals(signals.iter().copied()) {
            fail(ChildFailure::Signal(signal, errno()));
        }
        libc::setpgid(0, 0);
        for (from, to) in [(plan.stdin, 0), (plan.stdout, 1), (plan.stderr, 2)] {
            if libc::dup2(from, to) < 0 {
                fail(ChildFailure::Setup(errno()));
            }
        }
        if libc::chdir(plan.dir) != 0 {
            fail(ChildFailure::Setup(errno()));
        }
        if !plan.cgroup_procs.is_null() {
            // "0" is the writing process.
            let fd = libc::open(plan.cgroup_procs, libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, c"0".as_ptr().cast(), 1) != 1 {
                fail(ChildFailure::Cgroup(errno()));
            }
            libc::close(fd);
        }
        if plan.open_files != NO_LIMIT {
            let mut limit = libc::rlimit {
                rlim_cur: plan.open_files,
                rlim_max: plan.open_files,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0
                && libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
            {
                // Above the hard limit, without the right to raise it (root
                // without CAP_SYS_RESOURCE, as in most containers).
                limit.rlim_cur = limit.rlim_max.min(plan.open_files);
                limit.rlim_max = limit.rlim_cur;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(plan.program, plan.argv, plan.envp);
        let error = errno();
        if error == libc::ENOEXEC {
            libc::execve(plan.shell, plan.shell_argv, plan.envp);
        }
        fail(ChildFailure::Exec(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let identity = ProcessIdentity {
            pid: 4_194_304,
            start_ticks: u64::MAX - 3,
        };
        for message in [
            Message::Spawned(Started {
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

    #[test]
    fn child_failures_round_trip() {
        for failure in [
            ChildFailure::Setup(Errno::EBADF as i32),
            ChildFailure::Cgroup(Errno::EACCES as i32),
            ChildFailure::Signal(33, Errno::EINVAL as i32),
            ChildFailure::Exec(Errno::ENOEXEC as i32),
        ] {
            assert_ne!(failure.encode(), 0, "zero means no failure");
            assert_eq!(ChildFailure::decode(failure.encode()), failure);
        }
    }
}
