//! The launcher process itself (`peloton-agent launcher`): single-threaded,
//! no async runtime, no thread. It serves the agent's requests on the
//! socket that is its standard input (see `protocol`), starts each task
//! (see `child`), is a child subreaper (tasks and every process they leave
//! behind are its children), and when a task exits SIGKILLs its process
//! group (while the unreaped task still holds the group's id), then what
//! is left of the run outside the group (its cgroup; processes carrying
//! the run's `PELOTON_SANDBOX` marker, looked for only when the launcher has
//! children that are not tasks; at most 5 s), and only then appends the
//! run's `exit` entry to its journal and tells the agent. It outlives the
//! agent: once the agent's end of the socket closes it goes on recording
//! the ends of its tasks and exits after the last one.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{Resource, getrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, geteuid, getppid};

use super::child::{self, ChildFailure, ChildPlan, NO_LIMIT};
use super::protocol::{self, ANSWER_HOLD, Ended, MAX_REQUEST_BYTES, Message, Started};
use crate::clock;
use crate::isolation;
use crate::proc::{self, ProcSnapshot, ProcessIdentity};
use crate::record::{self, ExitRecord, STDERR_FILE, STDOUT_FILE, TaskPlan};

/// `peloton-agent launcher` (internal: only the agent starts it): serves
/// the agent on the socket that is its standard input, and keeps every task
/// it started until the task has ended and its end is recorded — after the
/// agent has closed the socket too. Returns the process's exit code.
pub fn run_launcher() -> i32 {
    match serve() {
        Ok(()) => 0,
        Err(e) => {
            // Not `eprintln!`: it panics when the agent's stderr is gone.
            let _ = writeln!(io::stderr(), "peloton-agent launcher: {e}");
            1
        }
    }
}

/// Bytes of stack the task's child runs on until it executes the task
/// (it calls a few system calls and nothing else).
const CHILD_STACK_BYTES: usize = 64 * 1024;
/// How often a run whose processes are not all gone is looked at again.
const CLEANUP_PAUSE: Duration = Duration::from_millis(10);
/// How long the launcher goes on finding and SIGKILLing what is left of a run
/// before it records the run's end anyway.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(5);

/// A task the launcher started and has not yet reaped.
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

/// The launcher's state.
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
    /// the start (the launcher sets none after): a task's child resets these
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
    // closes the agent's connection (the launcher may outlive it).
    // SAFETY: descriptor 0 is replaced atomically; nothing holds an owned
    // handle on it (standard input is only used by number).
    #[allow(unsafe_code)]
    if unsafe { nix::libc::dup2(devnull.as_raw_fd(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // Every task the launcher starts, and every process such a task leaves
    // behind, is the launcher's to reap: orphans come here, not to init.
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
        non_default_signals: child::non_default_signals(),
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
                        "peloton-agent launcher: {e}; closing the agent's socket"
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
        while let Some((sandbox, plan)) = protocol::take_request(&mut self.inbox)? {
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
            // The clock the run's `exit` entry will be stamped with, read
            // once a request (the start is a clone away).
            let now_ms = clock::now_ms();
            let answer = match self.start_task(&sandbox, plan, now_ms) {
                Ok(Some(started)) => Message::Started(started),
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
    /// `now_ms` (the wall clock, ms) is the time of the start, or of its
    /// failure.
    fn start_task(
        &mut self,
        sandbox: &Path,
        plan: Option<TaskPlan>,
        now_ms: u64,
    ) -> io::Result<Option<Started>> {
        let (plan, program) = match plan_and_program(sandbox, plan) {
            Ok(found) => found,
            Err(reason) => {
                self.record_start_failure(sandbox, reason, now_ms)?;
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
        let exec = ExecStrings::new(&plan, &program, sandbox)?;
        let open_files = plan.open_files.map(|limit| {
            self.open_files_ceiling
                .map_or(limit, |hard| limit.min(hard))
        });
        let child = ChildPlan {
            program: exec.program.as_ptr(),
            argv: exec.argv.as_ptr(),
            shell: SHELL.as_ptr(),
            shell_argv: exec.shell_argv.as_ptr(),
            envp: exec.envp.as_ptr(),
            dir: exec.dir.as_ptr(),
            stdin: self.devnull.as_raw_fd(),
            stdout: stdout.as_raw_fd(),
            stderr: stderr.as_raw_fd(),
            cgroup_procs: exec
                .cgroup_procs
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr()),
            open_files: open_files.unwrap_or(NO_LIMIT),
            signals: self.non_default_signals.as_ptr(),
            signal_count: self.non_default_signals.len(),
            failure: AtomicU64::new(0),
        };
        let before = proc::boottime_ns();
        let pid = child::spawn_child(&child, &mut self.stack)?;
        let after = proc::boottime_ns();
        let failure = child.failure.load(Ordering::Acquire);
        if failure != 0 {
            // It exited without executing the task: reap it here.
            let _ = waitpid(Pid::from_raw(pid), None);
            let reason = ChildFailure::decode(failure).reason(&plan, &program);
            self.record_start_failure(sandbox, reason, now_ms)?;
            return Ok(None);
        }
        // The child made itself its group's leader before it executed the
        // task, and this thread resumed only after that (CLONE_VFORK): the
        // group exists before the agent hears of the task (and may signal
        // it). A second `setpgid` from here would fail (EACCES) anyway.
        let pid = u32::try_from(pid).unwrap_or(0);
        let identity = task_identity(pid, before, after);
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
            time_ms: now_ms,
        }))
    }

    fn record_start_failure(
        &mut self,
        sandbox: &Path,
        reason: String,
        now_ms: u64,
    ) -> io::Result<()> {
        record::note(sandbox, &reason);
        let exit = ExitRecord::start_failure(reason, now_ms);
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
        // What the ends recorded in this pass are stamped with.
        let now_ms = clock::now_ms();
        for mut cleanup in std::mem::take(&mut self.cleanups) {
            if now < cleanup.next {
                self.cleanups.push(cleanup);
                continue;
            }
            cleanup.next = now + CLEANUP_PAUSE;
            let done = self.is_clean(&mut cleanup, &mut orphans, &mut snapshot)
                || now >= cleanup.deadline && {
                    record::note(
                        &cleanup.task.sandbox,
                        "task processes were still appearing after cleanup; giving up",
                    );
                    true
                };
            if done {
                let ended = self.record_end(&cleanup, now_ms);
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
        // to the launcher, where the search below finds it). A probe only,
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

    /// Whether the launcher has children that are not its tasks: what tasks
    /// left outside their process groups. Read from the kernel's list of
    /// the launcher's children where it has one; else every pid in `/proc` is
    /// asked with a `waitid` that fails with ECHILD for anyone but the
    /// launcher's own children (no file read per process).
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
    fn record_end(&self, cleanup: &Cleanup, now_ms: u64) -> Ended {
        let task = &cleanup.task;
        let oom_killed = task
            .cgroup
            .as_deref()
            .is_some_and(isolation::cgroup_oom_killed);
        if let Some(cgroup) = &task.cgroup
            && let Err(e) = isolation::remove_cgroup(cgroup)
        {
            record::note(
                &task.sandbox,
                &format!("cannot remove {}: {e}", cgroup.display()),
            );
        }
        let exit = ExitRecord::of(cleanup.exit_code, cleanup.signal, oom_killed, now_ms);
        let written = record::open_journal(&task.sandbox)
            .and_then(|mut journal| record::append_exit(&mut journal, &exit));
        if let Err(e) = written {
            record::note(&task.sandbox, &format!("cannot record the exit: {e}"));
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

fn timeout(duration: Duration) -> PollTimeout {
    PollTimeout::try_from(duration).unwrap_or(PollTimeout::MAX)
}

/// The shell that runs a file the kernel cannot execute (no `#!`), as
/// `execvp` does: `/bin/sh FILE ARGS…`.
const SHELL: &std::ffi::CStr = c"/bin/sh";

/// The run's task plan (sent with the request, or read from its journal)
/// and the program it executes, or why the task cannot start.
fn plan_and_program(sandbox: &Path, plan: Option<TaskPlan>) -> Result<(TaskPlan, PathBuf), String> {
    let plan = plan
        .map_or_else(|| record::read_plan(sandbox), Ok)
        .map_err(|e| format!("cannot read the task plan: {e}"))?;
    let program = child::find_program(&plan.program, &plan.env, sandbox)
        .map_err(|e| format!("cannot start {:?}: {e}", plan.program))?;
    Ok((plan, program))
}

/// A task's command, environment, directory and cgroup as the C strings
/// its child executes with, and the null-terminated arrays of pointers
/// into them (valid while this lives: they point into the strings' own
/// buffers, which do not move with it).
struct ExecStrings {
    program: CString,
    dir: CString,
    /// `CGROUP/cgroup.procs`, that the child writes itself into.
    cgroup_procs: Option<CString>,
    argv: Vec<*const nix::libc::c_char>,
    /// `/bin/sh PROGRAM ARGS…`, for a program without `#!`.
    shell_argv: Vec<*const nix::libc::c_char>,
    envp: Vec<*const nix::libc::c_char>,
    /// Held for `argv`, `shell_argv` and `envp`.
    _args: Vec<CString>,
    _env: Vec<CString>,
}

impl ExecStrings {
    fn new(plan: &TaskPlan, program: &Path, sandbox: &Path) -> io::Result<ExecStrings> {
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
        let argv = args_c
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let shell_argv = [SHELL.as_ptr(), program_c.as_ptr()]
            .into_iter()
            .chain(args_c.iter().skip(1).map(|a| a.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp = env_c
            .iter()
            .map(|e| e.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let cgroup_procs = plan
            .cgroup
            .as_ref()
            .map(|c| cstring(c.join("cgroup.procs").as_os_str().as_bytes()))
            .transpose()?;
        Ok(ExecStrings {
            dir: cstring(sandbox.as_os_str().as_bytes())?,
            program: program_c,
            cgroup_procs,
            argv,
            shell_argv,
            envp,
            _args: args_c,
            _env: env_c,
        })
    }
}

/// The identity of the task `pid` cloned between the boot-clock readings
/// `before` and `after`: from them when they tell its start; else from
/// /proc (not reaped yet: at worst a zombie, whose stat is readable).
fn task_identity(pid: u32, before: u64, after: u64) -> ProcessIdentity {
    match proc::start_ticks_between(before, after) {
        Some(start_ticks) => ProcessIdentity { pid, start_ticks },
        None => ProcessIdentity::of(pid).unwrap_or(ProcessIdentity {
            pid,
            start_ticks: 0,
        }),
    }
}
