//! The agent's end of one launcher process: starts it, sends it batches of
//! requests and takes in its answers and its news of ended tasks (see
//! `protocol`). Blocking, with deadlines: a launcher that does not answer
//! within [`ANSWER_TIMEOUT`] is given up.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::protocol::{self, Ended, MAX_REQUEST_BYTES, Message, Started};
use crate::proc::ProcessIdentity;
use crate::record::TaskPlan;

/// How long the agent waits for the launcher to take more of a batch of
/// requests, and for each answer after the one before: far more than a
/// start takes; a launcher that does not answer is replaced.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dropped [`Connection`] gets to exit before it is killed.
const EXIT_PATIENCE: Duration = Duration::from_secs(2);

/// Why [`Connection::start_tasks`] started no task for a run.
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    /// The launcher could not start this run's task and recorded nothing
    /// (its output files, a clone): the run fails with this.
    #[error("the launcher could not start the task: {0}")]
    Refused(io::Error),
    /// The launcher is gone or broken, and never got the request: start the
    /// run another way.
    #[error("the launcher is gone: {0}")]
    Gone(io::Error),
    /// The launcher is gone or broken after it got (some of) the request: it
    /// may have started the task, so the run must not be started again.
    #[error("the launcher did not answer: {0}")]
    Lost(io::Error),
}

/// The agent's handle on its launcher (see the module documentation).
#[derive(Debug)]
pub(super) struct Connection {
    /// Non-blocking; the launcher's standard input.
    socket: UnixStream,
    /// `None` once handed back by [`Connection::close`].
    process: Option<Child>,
    identity: ProcessIdentity,
    /// Bytes received and not yet a whole message.
    inbox: Vec<u8>,
    /// Tasks the launcher said have ended, not yet taken.
    exited: Vec<Ended>,
    /// Tasks started and not yet reported ended.
    live: usize,
}

impl Connection {
    /// Starts `exe launcher`, in a process group of its own (a terminal's
    /// Ctrl-C is for the agent, which stops in order) and with nothing of
    /// the agent's environment (which may hold its token).
    pub(super) fn start(exe: &Path) -> io::Result<Connection> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let process = Command::new(exe)
            .arg("launcher")
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
        Ok(Connection {
            socket: ours,
            process: Some(process),
            identity,
            inbox: Vec::with_capacity(64 * Message::BYTES),
            exited: Vec::new(),
            live: 0,
        })
    }

    /// The launcher's identity (recorded with each run it starts).
    pub(super) fn identity(&self) -> ProcessIdentity {
        self.identity
    }

    /// Starts the tasks of runs, each given by its sandbox (an absolute
    /// path whose journal holds the task plan) and, to save the launcher
    /// reading it back, its plan. One result a run, in order: the task's
    /// identity once it has executed, as the leader of its own process
    /// group, or `None` if it could not start (the journal's `exit` entry
    /// says why). The requests go in one write and the launcher answers them
    /// together: a round trip, two context switches, for the batch rather
    /// than for each run. A request the launcher never got is `Gone`; one it
    /// got (even in part) and did not answer is `Lost`.
    pub(super) fn start_tasks(
        &mut self,
        runs: &[(&Path, Option<&TaskPlan>)],
    ) -> Vec<Result<Option<Started>, RequestError>> {
        let mut results: Vec<Option<Result<Option<Started>, RequestError>>> =
            Vec::with_capacity(runs.len());
        // Where each request sent starts in `batch`, and its index.
        let mut sent: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        let mut batch = Vec::new();
        for (index, (sandbox, plan)) in runs.iter().enumerate() {
            if sandbox.as_os_str().len() >= MAX_REQUEST_BYTES {
                results.push(Some(Err(RequestError::Refused(
                    io::Error::from_raw_os_error(Errno::ENAMETOOLONG as i32),
                ))));
                continue;
            }
            results.push(None);
            sent.push((batch.len(), index));
            protocol::push_request(&mut batch, sandbox, *plan);
        }
        let answered = if sent.is_empty() {
            Ok(())
        } else {
            match self.send(&batch) {
                // The launcher had every byte of the batch.
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
            // launcher, else gone.
            for &(start, index) in &sent {
                if results[index].is_some() {
                    continue;
                }
                let copy = io::Error::new(e.kind(), e.to_string());
                results[index] = Some(if start < delivered {
                    Err(RequestError::Lost(copy))
                } else {
                    Err(RequestError::Gone(copy))
                });
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every request has a result"))
            .collect()
    }

    /// Takes the launcher's answers to the requests `sent` (in order), each
    /// within [`ANSWER_TIMEOUT`] of the one before; or, without `wait`, only
    /// those already received (for a batch whose sending failed: the
    /// launcher may have answered its first requests meanwhile).
    fn answers(
        &mut self,
        sent: &[(usize, usize)],
        results: &mut [Option<Result<Option<Started>, RequestError>>],
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
                        "the launcher did not answer",
                    ));
                }
                wait_readable(&self.socket, left)?;
            };
            results[index] = Some(self.result_of(answer));
        }
        Ok(())
    }

    /// What an answer says of its request.
    fn result_of(&mut self, answer: Message) -> Result<Option<Started>, RequestError> {
        match answer {
            Message::Started(started) => {
                self.live += 1;
                Ok(Some(started))
            }
            Message::StartFailed => Ok(None),
            Message::Refused(errno) => {
                Err(RequestError::Refused(io::Error::from_raw_os_error(errno)))
            }
            Message::Exited(_) => unreachable!("receive keeps exits"),
        }
    }

    /// Reads what the launcher has sent (without waiting) and returns the
    /// tasks whose ends it has recorded since the last call. An error means
    /// the launcher is gone or broken (the tasks it had not reported are
    /// still alive, or unknown: watch them another way).
    pub(super) fn take_exited(&mut self) -> io::Result<Vec<Ended>> {
        if let Some(message) = self.receive()? {
            // Nothing was asked, so nothing is answered.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the launcher sent an answer to no request: {message:?}"),
            ));
        }
        self.live = self.live.saturating_sub(self.exited.len());
        Ok(std::mem::take(&mut self.exited))
    }

    /// Closes the agent's end (the launcher goes on until its tasks have
    /// ended) and hands back the process, to be reaped when it exits.
    pub(super) fn close(mut self) -> Option<Child> {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        self.process.take()
    }

    /// Sends a batch of requests whole, taking in what the launcher sends
    /// meanwhile (a launcher blocked writing its news would otherwise never
    /// read the requests). The error says how many bytes went.
    fn send(&mut self, mut bytes: &[u8]) -> Result<(), (io::Error, usize)> {
        let total = bytes.len();
        let delivered = |left: &[u8]| total - left.len();
        // The launcher takes a batch as it starts its tasks: it has
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
                            "the launcher did not take the request",
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
    /// the way are kept for [`Connection::take_exited`]. Never waits.
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
                            "the launcher sent an unknown message",
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

impl Drop for Connection {
    /// Closes the socket. A launcher with no task left then exits, and is
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
