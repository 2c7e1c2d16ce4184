//! The spawner: one small process per agent that forks each run's wrapper,
//! without executing anything.
//!
//! Executing the agent's binary once per run, as the wrapper, cost about
//! 0.84 ms of CPU (the loader maps and relocates a large binary and probes
//! the CPU), a third of what launching a short task cost in all. The agent
//! cannot fork a wrapper and run the wrapper's code in the child itself: it
//! is multi-threaded, and the child of a multi-threaded process may not
//! allocate or take a lock before it executes something. So the agent
//! executes its binary once, as `peloton-agent spawner`, a process that
//! never starts a thread; it forks a wrapper per request, and the child
//! runs [`run_wrapper`] as an executed wrapper would. The child is made the
//! same process an executed wrapper was: the leader of a new process group,
//! /dev/null as its standard input and the run's `stdout` and `stderr`
//! (opened by the spawner) as its output, the sandbox as its working
//! directory, its signal mask empty, and `PELOTON_SANDBOX=<sandbox>` in
//! its `/proc/PID/environ` — the marker by which a restarted agent finds a
//! wrapper whose pid it never recorded. A forked process keeps its parent's
//! environment block, so the agent starts the spawner with that variable
//! padded to `MARKER_CAPACITY` bytes, and each child writes its sandbox
//! over the padding in place (as `setproctitle` does with the arguments).
//!
//! The spawner is the wrappers' parent: it reaps them, tells the agent
//! which ones have exited (pid and start time: a reused pid is never taken
//! for the old process) and sends the agent SIGCHLD, which the session
//! already polls on. Nothing about a run is known only to the spawner: the
//! agent records the wrapper's identity in the run's journal, so if the
//! spawner dies its wrappers are watched through `/proc` (as re-adopted
//! ones are) and the next launch starts a new spawner. The spawner exits
//! when the agent's end of its socket closes (the agent stopped or died);
//! its wrappers carry on, reparented, exactly as when an agent dies.
//!
//! The protocol, on a Unix stream socket that is the spawner's standard
//! input: the agent sends `u32` length + sandbox path (little-endian); the
//! spawner answers each request in order with a [`Message`], and sends
//! `Exited` messages whenever wrappers end. Every message is 16 bytes.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getppid, setpgid};

use crate::proc::ProcessIdentity;
use crate::record::{STDERR_FILE, STDOUT_FILE};
use crate::wrapper::run_wrapper;

/// The environment variable that marks a run's processes (see `proc`).
const MARKER_VAR: &str = "PELOTON_SANDBOX";
/// Bytes of the marker's value in the spawner's environment: the longest
/// sandbox path a wrapper can be marked with (a path's limit, `PATH_MAX`).
const MARKER_CAPACITY: usize = 4096;
/// The padding byte of the spawner's marker (a value no sandbox has).
const MARKER_PADDING: u8 = b'#';
/// How long the agent waits for the spawner to answer a request: far more
/// than a fork takes; a spawner that does not answer is replaced.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dropped [`Spawner`] gets to exit before it is killed.
const EXIT_PATIENCE: Duration = Duration::from_secs(2);
/// Longest request accepted (a sandbox path).
const MAX_REQUEST_BYTES: usize = MARKER_CAPACITY;

/// A message from the spawner to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    /// The answer to a request: the wrapper's identity.
    Spawned(ProcessIdentity),
    /// The answer to a request: no wrapper (an errno).
    Refused(i32),
    /// A wrapper has exited (and been reaped).
    Exited(ProcessIdentity),
}

impl Message {
    const BYTES: usize = 16;

    fn encode(self) -> [u8; Self::BYTES] {
        let (kind, pid, value) = match self {
            Message::Spawned(id) => (1u32, id.pid, id.start_ticks),
            Message::Refused(errno) => (2, 0, u64::from(errno.unsigned_abs())),
            Message::Exited(id) => (3, id.pid, id.start_ticks),
        };
        let mut bytes = [0; Self::BYTES];
        bytes[0..4].copy_from_slice(&kind.to_le_bytes());
        bytes[4..8].copy_from_slice(&pid.to_le_bytes());
        bytes[8..16].copy_from_slice(&value.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8; Self::BYTES]) -> Option<Message> {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut value = [0; 8];
        value.copy_from_slice(&bytes[8..16]);
        let value = u64::from_le_bytes(value);
        let identity = ProcessIdentity {
            pid: word(4),
            start_ticks: value,
        };
        match word(0) {
            1 => Some(Message::Spawned(identity)),
            2 => Some(Message::Refused(i32::try_from(value).ok()?)),
            3 => Some(Message::Exited(identity)),
            _ => None,
        }
    }
}

/// Why [`Spawner::spawn`] started no wrapper.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    /// The spawner could not start this run's wrapper (its output files,
    /// a fork): the run fails with this.
    #[error("the spawner could not start the wrapper: {0}")]
    Refused(io::Error),
    /// The spawner is gone or broken: start the wrapper another way.
    #[error("the spawner is gone: {0}")]
    Gone(io::Error),
}

/// The agent's handle on its spawner (see the module documentation).
#[derive(Debug)]
pub(crate) struct Spawner {
    /// Non-blocking; the spawner's standard input.
    socket: UnixStream,
    process: Child,
    /// Bytes received and not yet a whole message.
    inbox: Vec<u8>,
    /// Wrappers the spawner said have exited, not yet taken.
    exited: Vec<ProcessIdentity>,
}

impl Spawner {
    /// Starts `exe spawner`, in a process group of its own (a terminal's
    /// Ctrl-C is for the agent, which stops in order) and with nothing of
    /// the agent's environment (which may hold its token) but the marker's
    /// padding.
    pub(crate) fn start(exe: &Path) -> io::Result<Spawner> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let padding =
            String::from_utf8(vec![MARKER_PADDING; MARKER_CAPACITY]).map_err(io::Error::other)?;
        let process = Command::new(exe)
            .arg("spawner")
            .env_clear()
            .env(MARKER_VAR, padding)
            .process_group(0)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        Ok(Spawner {
            socket: ours,
            process,
            inbox: Vec::with_capacity(64 * Message::BYTES),
            exited: Vec::new(),
        })
    }

    /// The spawner's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Forks the wrapper of the run in `sandbox` (an absolute path, whose
    /// `stdout` and `stderr` the spawner opens for appending). Returns the
    /// wrapper's identity once it exists, as the leader of its own process
    /// group.
    pub(crate) fn spawn(&mut self, sandbox: &Path) -> Result<ProcessIdentity, SpawnError> {
        let path = sandbox.as_os_str().as_bytes();
        if path.len() >= MARKER_CAPACITY {
            return Err(SpawnError::Refused(io::Error::from_raw_os_error(
                Errno::ENAMETOOLONG as i32,
            )));
        }
        let mut request = Vec::with_capacity(4 + path.len());
        request.extend_from_slice(&u32::try_from(path.len()).unwrap_or(u32::MAX).to_le_bytes());
        request.extend_from_slice(path);
        self.send(&request).map_err(SpawnError::Gone)?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            match self.receive().map_err(SpawnError::Gone)? {
                Some(Message::Spawned(identity)) => return Ok(identity),
                Some(Message::Refused(errno)) => {
                    return Err(SpawnError::Refused(io::Error::from_raw_os_error(errno)));
                }
                Some(Message::Exited(_)) => unreachable!("receive keeps exits"),
                None => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SpawnError::Gone(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the spawner did not answer",
                )));
            }
            wait_readable(&self.socket, left).map_err(SpawnError::Gone)?;
        }
    }

    /// Reads what the spawner has sent (without waiting) and returns the
    /// wrappers it has reaped since the last call. An error means the
    /// spawner is gone (the wrappers it had not reported are still alive,
    /// or unknown: watch them another way).
    pub(crate) fn take_exited(&mut self) -> io::Result<Vec<ProcessIdentity>> {
        if let Some(message) = self.receive()? {
            // Nothing was asked, so nothing is answered.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the spawner sent an answer to no request: {message:?}"),
            ));
        }
        Ok(std::mem::take(&mut self.exited))
    }

    fn send(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match self.socket.write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLOUT)];
                    poll(&mut fds, timeout(ANSWER_TIMEOUT))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
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
                    Some(Message::Exited(identity)) => self.exited.push(identity),
                    Some(answer) => return Ok(Some(answer)),
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "the spawner sent an unknown message",
                        ));
                    }
                }
            }
            let mut buffer = [0u8; 64 * Message::BYTES];
            match self.socket.read(&mut buffer) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.inbox.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Spawner {
    /// Closes the socket, which ends the spawner (not its wrappers), and
    /// reaps it.
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        let deadline = Instant::now() + EXIT_PATIENCE;
        while Instant::now() < deadline {
            match self.process.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Ok(Some(_)) | Err(_) => return,
            }
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
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
/// the agent on the socket that is its standard input until the agent
/// closes it. Returns the process's exit code.
pub fn run_spawner() -> i32 {
    match serve() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("peloton-agent spawner: {e}");
            1
        }
    }
}

/// The spawner's state.
struct Serving {
    socket: UnixStream,
    /// SIGCHLD, blocked and read from here, so one `poll` waits for both.
    child_exits: SignalFd,
    devnull: File,
    marker: MarkerSlot,
    /// Wrappers not yet reaped, by pid.
    wrappers: HashMap<u32, ProcessIdentity>,
    agent: Pid,
    inbox: Vec<u8>,
}

fn serve() -> io::Result<()> {
    let agent = getppid();
    let socket = UnixStream::from(io::stdin().as_fd().try_clone_to_owned()?);
    let marker = MarkerSlot::find().ok_or_else(|| {
        io::Error::other(format!(
            "started without the {MARKER_VAR} padding (only the agent starts the spawner)"
        ))
    })?;
    let mut sigchld = SigSet::empty();
    sigchld.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&sigchld), None)?;
    let child_exits =
        SignalFd::with_flags(&sigchld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
    let mut serving = Serving {
        socket,
        child_exits,
        devnull: File::open("/dev/null")?,
        marker,
        wrappers: HashMap::new(),
        agent,
        inbox: Vec::with_capacity(MAX_REQUEST_BYTES + 4),
    };
    loop {
        let (requests, exits) = {
            let mut fds = [
                PollFd::new(serving.socket.as_fd(), PollFlags::POLLIN),
                PollFd::new(serving.child_exits.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if exits {
            serving.reap()?;
        }
        if requests && !serving.read_requests()? {
            // The agent closed its end: it stopped, or died.
            return Ok(());
        }
    }
}

impl Serving {
    /// Reads and serves whole requests. False at the end of the stream.
    fn read_requests(&mut self) -> io::Result<bool> {
        let mut buffer = [0u8; 8192];
        let n = match self.socket.read(&mut buffer) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e),
        };
        self.inbox.extend_from_slice(&buffer[..n]);
        while self.inbox.len() >= 4 {
            let len =
                u32::from_le_bytes([self.inbox[0], self.inbox[1], self.inbox[2], self.inbox[3]]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > MAX_REQUEST_BYTES {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "request too long",
                ));
            }
            if self.inbox.len() < 4 + len {
                break;
            }
            let sandbox = PathBuf::from(OsStr::from_bytes(&self.inbox[4..4 + len]));
            self.inbox.drain(..4 + len);
            let answer = match self.fork_wrapper(&sandbox) {
                Ok(identity) => Message::Spawned(identity),
                Err(e) => Message::Refused(e.raw_os_error().unwrap_or(Errno::EIO as i32)),
            };
            self.socket.write_all(&answer.encode())?;
        }
        Ok(true)
    }

    /// Reaps every exited wrapper, tells the agent, and wakes it.
    fn reap(&mut self) -> io::Result<()> {
        while let Ok(Some(_)) = self.child_exits.read_signal() {}
        let mut news = Vec::new();
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) => {
                    let pid = u32::try_from(pid.as_raw()).unwrap_or(0);
                    if let Some(identity) = self.wrappers.remove(&pid) {
                        news.extend_from_slice(&Message::Exited(identity).encode());
                    }
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if !news.is_empty() {
            self.socket.write_all(&news)?;
            // The session polls on SIGCHLD; these are, after all, the
            // agent's grandchildren.
            let _ = kill(self.agent, Signal::SIGCHLD);
        }
        Ok(())
    }

    fn fork_wrapper(&mut self, sandbox: &Path) -> io::Result<ProcessIdentity> {
        let output = |name| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(sandbox.join(name))
        };
        let stdout = output(STDOUT_FILE)?;
        let stderr = output(STDERR_FILE)?;
        // SAFETY: this process never starts a thread (it is `peloton-agent
        // spawner`: no runtime, no logging, no thread), so the child may
        // allocate and run any code; it never returns into the spawner's
        // loop (it exits, also on a panic).
        #[allow(unsafe_code)]
        let forked = unsafe { fork() }?;
        match forked {
            ForkResult::Child => {
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.become_wrapper(sandbox, &stdout, &stderr)
                }))
                .unwrap_or(1);
                std::process::exit(code);
            }
            ForkResult::Parent { child } => {
                // Also in the child: whichever runs first, the group exists
                // before the agent hears of the wrapper (and may signal it).
                let _ = setpgid(child, child);
                let pid = u32::try_from(child.as_raw()).unwrap_or(0);
                // Not reaped yet: at worst a zombie, whose stat is readable.
                let identity = ProcessIdentity::of(pid).unwrap_or(ProcessIdentity {
                    pid,
                    start_ticks: 0,
                });
                self.wrappers.insert(pid, identity);
                Ok(identity)
            }
        }
    }

    /// In the forked child: becomes the run's wrapper (see the module
    /// documentation) and runs it. Returns its exit code.
    fn become_wrapper(&mut self, sandbox: &Path, stdout: &File, stderr: &File) -> i32 {
        let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
        self.marker.write(sandbox.as_os_str().as_bytes());
        let redirected = [
            (self.devnull.as_raw_fd(), 0),
            (stdout.as_raw_fd(), 1),
            (stderr.as_raw_fd(), 2),
        ]
        .into_iter()
        .try_for_each(|(from, to)| dup2_raw(from, to));
        if let Err(e) = redirected.and_then(|()| std::env::set_current_dir(sandbox)) {
            // The agent hears of it as a wrapper that vanished without an
            // exit entry (FAILED, "lost the run's exit status").
            eprintln!(
                "peloton-agent spawner: cannot prepare the wrapper of {}: {e}",
                sandbox.display()
            );
            return 1;
        }
        // The socket (now only a copy of fd 0's old self, replaced above),
        // the signalfd and the spawner's other descriptors close on the
        // task's exec; the wrapper itself must not hold the socket, or the
        // agent would not see the spawner's end.
        close_raw(self.socket.as_raw_fd());
        close_raw(self.child_exits.as_fd().as_raw_fd());
        self.wrappers.clear();
        run_wrapper(sandbox)
    }
}

fn dup2_raw(from: i32, to: i32) -> io::Result<()> {
    // SAFETY: plain descriptor numbers; `to` (0, 1, 2) is replaced
    // atomically, and nothing in this process holds an owned handle on
    // it (the standard streams are used by number).
    #[allow(unsafe_code)]
    let result = unsafe { nix::libc::dup2(from, to) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn close_raw(fd: i32) {
    // SAFETY: in the forked child, just before it becomes the wrapper:
    // the owner of `fd` (the spawner's state) is never used or dropped
    // again in this process (it exits without returning to it).
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::close(fd);
    }
}

/// The value of `PELOTON_SANDBOX` in this process's environment block:
/// the bytes `/proc/PID/environ` shows, overwritten in place.
struct MarkerSlot {
    value: *mut u8,
    capacity: usize,
}

impl MarkerSlot {
    fn find() -> Option<MarkerSlot> {
        let name = c"PELOTON_SANDBOX";
        debug_assert_eq!(name.to_bytes(), MARKER_VAR.as_bytes());
        // SAFETY: `getenv` with a NUL-terminated name; this process is
        // single-threaded and never changes its environment.
        #[allow(unsafe_code)]
        let value = unsafe { nix::libc::getenv(name.as_ptr()) };
        if value.is_null() {
            return None;
        }
        // SAFETY: `getenv` returned a NUL-terminated string.
        #[allow(unsafe_code)]
        let bytes = unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes();
        if bytes.len() < MARKER_CAPACITY - 1 || bytes.iter().any(|&b| b != MARKER_PADDING) {
            return None;
        }
        Some(MarkerSlot {
            value: value.cast(),
            capacity: bytes.len(),
        })
    }

    /// Writes `path` over the value, NUL-padded (so the entry reads as
    /// `PELOTON_SANDBOX=<path>`). Paths that do not fit were refused by
    /// the agent.
    fn write(&mut self, path: &[u8]) {
        assert!(path.len() < self.capacity, "the agent checks the length");
        // SAFETY: `value` points to `capacity` writable bytes of this
        // process's environment block (the initial stack, found by
        // `find`), which nothing else refers to or changes: the process is
        // single-threaded and never reads its environment again.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(path.as_ptr(), self.value, path.len());
            std::ptr::write_bytes(self.value.add(path.len()), 0, self.capacity - path.len());
        }
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
            Message::Spawned(identity),
            Message::Refused(Errno::ENOENT as i32),
            Message::Exited(identity),
        ] {
            assert_eq!(Message::decode(&message.encode()), Some(message));
        }
        assert_eq!(Message::decode(&[0; Message::BYTES]), None);
    }
}
