//! The per-run supervisor process ("wrapper"): `peloton-agent exec`.
//!
//! Used only while the agent has no keeper (see `spawner`: the keeper
//! starts tasks and records their ends for all runs, without a process per
//! run); the keeper shares this module's start-failure and exit records,
//! program lookup and signal reset.
//!
//! The agent never waits for a task itself: it starts the wrapper (its own
//! binary in this mode) as the leader of a new process group, and the
//! wrapper starts and waits for the task. So a task outlives an agent
//! restart, and its exit status is never lost: the wrapper appends it to
//! the run's journal (`record`) whether or not an agent is there to read
//! it. The wrapper is a child subreaper, so every process the task leaves
//! behind is reparented to it and killed once the task has exited. It
//! blocks the stop signals for itself — a kill's SIGTERM to the group
//! reaches the task, not the process that records how the task ended.
//!
//! The wrapper's standard output and error are the task's `stdout` and
//! `stderr` files (opened by the agent), which the task inherits; the
//! wrapper's own notes go to `wrapper.log`, created only when there is one.
//!
//! Limits (rlimits, joining the run's cgroup) and the signal state of the
//! task are set in the forked child just before it executes the task
//! ([`prepare_child`]); setting them in the wrapper itself would constrain
//! the wrapper too (and its cgroup would take it with the task in an OOM
//! kill or a `cgroup.kill`). A signal mask is inherited across fork and exec,
//! so the child empties it, and sets every signal back to its default
//! action (an ignored signal, e.g. SIGHUP under `nohup`, would otherwise
//! survive exec); a test checks `SigBlk` and `SigIgn` of a task. Whether
//! the program exists is checked by the wrapper first, so the common start
//! failures ("No such file or directory") are reported without the task
//! ever having run; an `exec` that fails anyway comes back from the spawn.
//!
//! Plain single-threaded code (no async runtime): signal masks are per
//! thread, and they must hold for the whole process; and the child of a
//! fork of a single-threaded process may allocate and take locks before it
//! executes the task (no other thread can have held them at the fork).
//! This used to be a second process, a trampoline (the agent binary again,
//! executed between fork and the task's exec): one fork and exec of this
//! binary per launch, gone.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::libc;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, geteuid};

use crate::isolation;
use crate::proc;
use crate::record::{self, ExitRecord, StartedRecord, TaskPlan, WRAPPER_LOG_FILE};

/// The exit code of a task that could not be started (as in shells).
pub(crate) const EXIT_CANNOT_START: i32 = 127;
/// Rounds of "find leftover processes, SIGKILL them" after the task exits.
const CLEANUP_ROUNDS: u32 = 500;
const CLEANUP_PAUSE: Duration = Duration::from_millis(10);
/// `PATH` for a task whose environment has none.
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `peloton-agent exec --sandbox DIR`: runs the task of the sandbox, waits
/// for it, cleans up after it and appends its `exit` entry to the journal.
/// Returns the wrapper's own exit code (0 once the entry is written).
pub fn run_wrapper(sandbox: &Path) -> i32 {
    let mut journal = match record::open_journal(sandbox) {
        Ok(journal) => journal,
        Err(e) => {
            note(sandbox, &format!("cannot open the run's journal: {e}"));
            return 1;
        }
    };
    let exit = supervise(sandbox, &mut journal);
    match record::append_exit(&mut journal, &exit) {
        Ok(()) => 0,
        Err(e) => {
            note(sandbox, &format!("cannot record the exit: {e}"));
            1
        }
    }
}

pub(crate) fn start_failure(sandbox: &Path, reason: String) -> ExitRecord {
    note(sandbox, &reason);
    ExitRecord {
        exit_code: EXIT_CANNOT_START,
        signal: 0,
        oom_killed: false,
        start_failed: true,
        time_ms: record::now_ms(),
        reason,
    }
}

/// Every signal a task may be stopped with (`stop_signal`; SIGHUP comes
/// with a closing terminal too): the wrapper blocks them, since it must
/// outlive the task to record its exit, and one that arrives before the
/// task exists ends the run at once.
const STOP_SIGNALS: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGPWR,
];

fn supervise(sandbox: &Path, journal: &mut File) -> ExitRecord {
    let plan: TaskPlan = match record::read_plan(sandbox) {
        Ok(plan) => plan,
        Err(e) => return start_failure(sandbox, format!("cannot read the task plan: {e}")),
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        note(
            sandbox,
            &format!(
                "cannot become a child subreaper ({e}); \
                 orphaned task processes are found by their environment only"
            ),
        );
    }
    let mut blocked = SigSet::empty();
    for signal in STOP_SIGNALS {
        blocked.add(signal);
    }
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None) {
        note(sandbox, &format!("cannot block termination signals: {e}"));
    }
    // A kill that arrived before the task exists would otherwise sit
    // pending (blocked) and never reach it.
    let pending = proc::shared_pending_signals();
    for signal in STOP_SIGNALS.into_iter().filter(|&s| s != Signal::SIGHUP) {
        let number = signal as i32;
        if pending & (1u64 << (number - 1)) != 0 {
            return ExitRecord {
                exit_code: 128 + number,
                signal: number,
                oom_killed: false,
                start_failed: false,
                time_ms: record::now_ms(),
                reason: format!("stopped by signal {number} before the task started"),
            };
        }
    }
    if let Err(e) = check_program(&plan.program, &plan.env, sandbox) {
        return start_failure(sandbox, format!("cannot start {:?}: {e}", plan.program));
    }
    let mut command = Command::new(&plan.program);
    command
        .args(&plan.args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(sandbox)
        // The agent gave the wrapper /dev/null and the run's output files.
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let child_plan = ChildPlan::new(&plan, sandbox);
    // SAFETY: the closure runs in the child between fork and exec. This
    // process is single-threaded (no runtime, no thread is ever started),
    // so the child's memory and locks are in a consistent state and it may
    // allocate.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || child_plan.apply());
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let reason = match ChildFailure::decode(&e) {
                Some(failure) => failure.reason(&plan),
                None => format!("cannot start {:?}: {e}", plan.program),
            };
            return start_failure(sandbox, reason);
        }
    };
    let task_pid = child.id();
    // The child is waited for with waitpid(-1) below, which also reaps the
    // orphans this subreaper inherits; std's handle is not used again.
    drop(child);
    let started = StartedRecord {
        pid: task_pid,
        time_ms: record::now_ms(),
    };
    if let Err(e) = record::append_started(journal, &started) {
        note(sandbox, &format!("cannot record the start: {e}"));
    }
    let (exit_code, signal) = wait_for(task_pid, sandbox);
    let time_ms = record::now_ms();
    let marker = plan
        .env
        .iter()
        .find(|(k, _)| k == "PELOTON_SANDBOX")
        .map(|(k, v)| format!("{k}={v}").into_bytes());
    kill_leftovers(plan.cgroup.as_deref(), marker.as_deref(), sandbox);
    let oom_killed = plan
        .cgroup
        .as_deref()
        .is_some_and(isolation::cgroup_oom_killed);
    if let Some(cgroup) = &plan.cgroup
        && let Err(e) = isolation::remove_cgroup(cgroup)
    {
        note(sandbox, &format!("cannot remove {}: {e}", cgroup.display()));
    }
    let mut exit = exit_record(exit_code, signal, oom_killed);
    exit.time_ms = time_ms;
    exit
}

/// The `exit` entry of a task that ended with (exit code, signal) — code
/// 128 + signal for a signal, -1 if its status was lost — now.
pub(crate) fn exit_record(exit_code: i32, signal: i32, oom_killed: bool) -> ExitRecord {
    let reason = match (signal, oom_killed) {
        (0, false) if exit_code >= 0 => format!("exited with code {exit_code}"),
        (0, true) if exit_code >= 0 => {
            format!("exited with code {exit_code} (a process of the task ran out of memory)")
        }
        (0, _) => "the wrapper lost the task's exit status".to_owned(),
        (signal, false) => format!("killed by signal {signal}"),
        (signal, true) => format!("killed by signal {signal} (out of memory)"),
    };
    ExitRecord {
        exit_code,
        signal,
        oom_killed,
        start_failed: false,
        time_ms: record::now_ms(),
        reason,
    }
}

/// What the child sets up before it executes the task, prepared by the
/// wrapper.
struct ChildPlan {
    cgroup: Option<PathBuf>,
    open_files: Option<u64>,
    /// `wrapper.log`, for notes about limits that could not be set (the
    /// child's stderr is the task's, not the place for them).
    log: PathBuf,
}

impl ChildPlan {
    fn new(plan: &TaskPlan, sandbox: &Path) -> ChildPlan {
        let open_files = plan.open_files.map(|open_files| {
            match getrlimit(Resource::RLIMIT_NOFILE) {
                // Only root may raise a hard limit.
                Ok((_, hard)) if !geteuid().is_root() => open_files.min(hard),
                _ => open_files,
            }
        });
        ChildPlan {
            cgroup: plan.cgroup.clone(),
            open_files,
            log: sandbox.join(WRAPPER_LOG_FILE),
        }
    }

    /// In the child: joins the cgroup, sets the rlimits, resets every
    /// signal's disposition and the mask. A failure that must stop the
    /// start comes back to the wrapper's spawn as a [`ChildFailure`] code.
    fn apply(&self) -> io::Result<()> {
        if let Some(cgroup) = &self.cgroup
            && let Err(e) = isolation::join_cgroup(cgroup)
        {
            return Err(ChildFailure::Cgroup(e.raw_os_error().unwrap_or(0)).encode());
        }
        if let Some(limit) = self.open_files
            && let Err(e) = set_open_files(limit)
        {
            child_note(
                &self.log,
                &format!("cannot set RLIMIT_NOFILE to {limit}: {e}"),
            );
        }
        // Ignored signals survive exec: an agent started under `nohup`, or
        // by a script that ignores SIGINT, would pass them on to every
        // task. The task starts with every disposition at its default.
        if let Err(signal) = reset_signal_dispositions() {
            return Err(ChildFailure::Signal(signal, Errno::last_raw()).encode());
        }
        // The wrapper's blocked stop signals were inherited; the task must
        // start with nothing blocked. Signals pending for the wrapper are
        // not inherited; one sent to the group since the fork is delivered
        // here and ends the child, as it should.
        if let Err(e) = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None) {
            child_note(&self.log, &format!("cannot clear the signal mask: {e}"));
        }
        Ok(())
    }
}

/// Sets RLIMIT_NOFILE to `limit`, or to the hard limit where `limit` is
/// above it and cannot be raised (root without CAP_SYS_RESOURCE, as in
/// most containers: the agent logs that once, at start). Silent then: a
/// note is a file, and that would be one more per run.
fn set_open_files(limit: u64) -> nix::Result<()> {
    match setrlimit(Resource::RLIMIT_NOFILE, limit, limit) {
        Err(Errno::EPERM) => {
            let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
            let limit = limit.min(hard);
            setrlimit(Resource::RLIMIT_NOFILE, limit, limit)
        }
        other => other,
    }
}

/// Why the child could not get to the task's `exec`, carried to the
/// wrapper as the error code of its spawn (std passes the child's error
/// code, any `i32`, through its exec-failure pipe): above every errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildFailure {
    /// Joining the cgroup failed with this errno.
    Cgroup(i32),
    /// Resetting this signal's disposition failed with this errno.
    Signal(i32, i32),
}

impl ChildFailure {
    const CGROUP: i32 = 1 << 24;
    const SIGNAL: i32 = 2 << 24;
    const ERRNO_MASK: i32 = 0xfff;

    fn encode(self) -> io::Error {
        let code = match self {
            ChildFailure::Cgroup(errno) => Self::CGROUP | (errno & Self::ERRNO_MASK),
            ChildFailure::Signal(signal, errno) => {
                Self::SIGNAL | ((signal & 0xff) << 12) | (errno & Self::ERRNO_MASK)
            }
        };
        io::Error::from_raw_os_error(code)
    }

    fn decode(error: &io::Error) -> Option<ChildFailure> {
        let code = error.raw_os_error()?;
        let errno = code & Self::ERRNO_MASK;
        match code & !0xff_ffff {
            Self::CGROUP => Some(ChildFailure::Cgroup(errno)),
            Self::SIGNAL => Some(ChildFailure::Signal((code >> 12) & 0xff, errno)),
            _ => None,
        }
    }

    fn reason(self, plan: &TaskPlan) -> String {
        match self {
            ChildFailure::Cgroup(errno) => format!(
                "cannot join the cgroup {}: {}",
                plan.cgroup.as_deref().unwrap_or(Path::new("")).display(),
                io::Error::from_raw_os_error(errno)
            ),
            ChildFailure::Signal(signal, errno) => format!(
                "cannot reset signal {signal} to its default action: {}",
                Errno::from_raw(errno)
            ),
        }
    }
}

/// Waits for the task, reaping inherited orphans on the way. Returns (exit
/// code, signal), with code 128 + signal for a signal, (-1, 0) if the task
/// cannot be waited for (it never is not: it is our child).
fn wait_for(task_pid: u32, sandbox: &Path) -> (i32, i32) {
    let task = Pid::from_raw(i32::try_from(task_pid).unwrap_or(i32::MAX));
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == task => return (code, 0),
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == task => {
                let number = signal as i32;
                return (128 + number, number);
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                note(sandbox, &format!("waiting for the task: {e}"));
                return (-1, 0);
            }
        }
    }
}

/// Reaps every exited child without blocking.
fn reap_exited() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// SIGKILLs what the task left behind until nothing is left: its cgroup,
/// this subreaper's descendants, and any process carrying the run's
/// environment marker.
fn kill_leftovers(cgroup: Option<&Path>, marker: Option<&[u8]>, sandbox: &Path) {
    let me = std::process::id();
    for _ in 0..CLEANUP_ROUNDS {
        reap_exited();
        // As a subreaper this process inherits every orphaned descendant:
        // no child left means no descendant left, and the (costly) scan of
        // /proc is only needed when something stayed behind.
        if cgroup.is_none()
            && waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG))
                == Err(nix::errno::Errno::ECHILD)
        {
            return;
        }
        let mut snapshot = proc::ProcSnapshot::take();
        let mut victims = snapshot.descendants(me);
        if let Some(marker) = marker {
            victims.extend(snapshot.marked(marker));
        }
        let in_cgroup = cgroup.map(isolation::cgroup_pids).unwrap_or_default();
        if victims.is_empty() && in_cgroup.is_empty() {
            return;
        }
        if let Some(cgroup) = cgroup {
            isolation::kill_cgroup(cgroup);
        }
        proc::kill_all(&victims);
        std::thread::sleep(CLEANUP_PAUSE);
    }
    note(
        sandbox,
        "task processes were still appearing after cleanup; giving up",
    );
    reap_exited();
}

/// Finds the program as `execvp` would (relative names against `PATH` of
/// the task's environment, paths with a `/` against the sandbox), so that
/// the usual start failures get the usual message.
fn check_program(program: &str, env: &[(String, String)], cwd: &Path) -> io::Result<()> {
    find_program(program, env, cwd).map(drop)
}

/// The file `execvp` would execute for `program`: relative names are
/// looked up in `PATH` of the task's environment, paths with a `/` are
/// taken against the sandbox.
pub(crate) fn find_program(
    program: &str,
    env: &[(String, String)],
    cwd: &Path,
) -> io::Result<PathBuf> {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![cwd.join(program)]
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
        path.split(':')
            .map(|dir| {
                // Relative entries (`.`, `bin`) are the task's, in its
                // working directory; an absolute one replaces `cwd`.
                cwd.join(dir).join(program)
            })
            .collect()
    };
    let mut not_executable = false;
    for candidate in candidates {
        if let Ok(meta) = fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
            not_executable = true;
        }
    }
    let errno = if not_executable {
        Errno::EACCES
    } else {
        Errno::ENOENT
    };
    Err(io::Error::from_raw_os_error(errno as i32))
}

/// The number of the kernel's signals (`_NSIG`): 1..=64 on Linux.
const SIGNAL_COUNT: i32 = 64;

/// Sets every signal 1..=64 (standard and real-time; SIGKILL and SIGSTOP
/// cannot change) back to its default action, or returns the first signal
/// the kernel refused. Handlers are reset by exec anyway; "ignore" is not.
/// The raw `rt_sigaction` system call, because the C library's `signal`
/// and `sigaction` refuse 32 and 33, which it keeps for itself, and an
/// ignored 32 or 33 would still reach the task. Allocation-free; the
/// caller has checked that the process has one thread
/// ([`check_single_threaded`]).
pub(crate) fn reset_signal_dispositions() -> Result<(), i32> {
    reset_signals(changeable_signals())
}

/// Signals 1..=64 but SIGKILL and SIGSTOP, whose action cannot change.
fn changeable_signals() -> impl Iterator<Item = i32> {
    (1..=SIGNAL_COUNT).filter(|&n| n != libc::SIGKILL && n != libc::SIGSTOP)
}

/// The signals whose action in this process is not the default (ignored,
/// or handled by this process's code), in the order of their numbers: what
/// [`reset_signals`] must reset in a child for all to be at their default,
/// as long as this process sets no action after asking.
pub(crate) fn non_default_signals() -> Vec<i32> {
    changeable_signals()
        .filter(|&number| {
            let mut old = [0u64; 4];
            // SAFETY: asks only (no new action); `old` has room for the
            // largest kernel sigaction (see `reset_signals`); 8 is the
            // kernel's sigset size.
            #[allow(unsafe_code)]
            let result = unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    libc::c_long::from(number),
                    std::ptr::null::<u64>(),
                    old.as_mut_ptr(),
                    8 as libc::c_long,
                )
            };
            // The handler is the first word; SIG_DFL is 0. A signal the
            // kernel will not tell about (none on Linux) counts as set.
            result != 0 || old[0] != 0
        })
        .collect()
}

/// Sets each of `signals` back to its default action, or returns the first
/// the kernel refused (see [`reset_signal_dispositions`]). Allocation-free
/// and async-signal-safe: only system calls.
pub(crate) fn reset_signals(signals: impl IntoIterator<Item = i32>) -> Result<(), i32> {
    // The kernel's `struct sigaction` starts with the handler; SIG_DFL is
    // 0 and no flag, restorer or mask is wanted, so all zeros is the
    // default action whatever the architecture's layout. Four words cover
    // the largest layout (handler, flags, restorer, 64-bit mask).
    let default_action = [0u64; 4];
    const _: () = assert!(libc::SIG_DFL == 0);
    // The kernel's sigset: 64 bits.
    let sigset_bytes: libc::c_long = 8;
    for number in signals {
        // SAFETY: `default_action` is a valid, zeroed kernel sigaction
        // (SIG_DFL: no code of ours runs in a signal context), read by the
        // kernel only; the old action is not asked for (null); 8 is the
        // kernel's sigset size for 64 signals. The process (a fork's
        // child) is single-threaded and about to exec, so no other code
        // relies on a disposition set earlier, the C library's own signals
        // included.
        #[allow(unsafe_code)]
        let result = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                libc::c_long::from(number),
                default_action.as_ptr(),
                std::ptr::null_mut::<u64>(),
                sigset_bytes,
            )
        };
        if result != 0 {
            return Err(number);
        }
    }
    Ok(())
}

/// A line in the sandbox's `wrapper.log`, created by the first one (the
/// wrapper's stderr is the task's, which is not the place for the agent's
/// notes).
pub(crate) fn note(sandbox: &Path, line: &str) {
    child_note(&sandbox.join(WRAPPER_LOG_FILE), &format!("exec: {line}"));
}

fn child_note(log: &Path, line: &str) {
    use std::io::Write as _;
    if let Ok(mut log) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(log, "peloton-agent {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keeper's list of signals to reset is what the kernel shows as
    /// ignored or caught for this process (`SigIgn`, `SigCgt`: what Rust's
    /// runtime set up, SIGPIPE ignored and SIGSEGV handled, plus whatever
    /// this process inherited ignored, as under `nohup`).
    #[test]
    fn non_default_signals_are_those_ignored_or_handled() {
        let set = || {
            let status = std::fs::read_to_string("/proc/self/status").expect("status");
            ["SigIgn:", "SigCgt:"]
                .iter()
                .map(|name| {
                    let line = status
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .expect("mask line");
                    u64::from_str_radix(line.trim(), 16).expect("hex mask")
                })
                .fold(0, |a, b| a | b)
        };
        // Other tests of this process may install a handler meanwhile.
        let before = set();
        let signals = non_default_signals();
        let after = set();
        let listed = signals.iter().fold(0u64, |mask, &n| mask | 1 << (n - 1));
        assert_eq!(
            listed & before,
            before,
            "{signals:?} misses some of {before:#x}"
        );
        assert_eq!(listed & !after, 0, "{signals:?} names more than {after:#x}");
        assert!(signals.contains(&libc::SIGPIPE), "{signals:?}");
        assert!(signals.contains(&libc::SIGSEGV), "{signals:?}");
        assert!(!signals.contains(&libc::SIGKILL) && !signals.contains(&libc::SIGSTOP));
        assert!(signals.is_sorted(), "{signals:?}");
    }

    /// A failure in the forked child reaches the wrapper's spawn whole:
    /// std carries the child's error code, whatever it is, to the parent.
    #[test]
    fn child_failures_come_back_through_the_spawn() {
        let plan = TaskPlan {
            program: "/bin/true".to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            open_files: None,
            cgroup: Some(PathBuf::from("/sys/fs/cgroup/peloton/x")),
        };
        for failure in [
            ChildFailure::Cgroup(Errno::EACCES as i32),
            ChildFailure::Signal(33, Errno::EINVAL as i32),
        ] {
            let mut command = Command::new("/bin/true");
            // SAFETY: the closure only builds an error value.
            #[allow(unsafe_code)]
            unsafe {
                command.pre_exec(move || Err(failure.encode()));
            }
            let error = command.spawn().expect_err("the child fails");
            assert_eq!(ChildFailure::decode(&error), Some(failure));
        }
        assert_eq!(
            ChildFailure::Cgroup(Errno::EACCES as i32).reason(&plan),
            "cannot join the cgroup /sys/fs/cgroup/peloton/x: Permission denied (os error 13)"
        );
        assert_eq!(
            ChildFailure::Signal(33, Errno::EINVAL as i32).reason(&plan),
            "cannot reset signal 33 to its default action: EINVAL: Invalid argument"
        );
        // Plain errors of the exec are not mistaken for them.
        let missing = io::Error::from_raw_os_error(Errno::ENOENT as i32);
        assert_eq!(ChildFailure::decode(&missing), None);
    }

    #[test]
    fn program_lookup_messages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
        assert!(check_program("sh", &env, dir.path()).is_ok());
        assert!(check_program("/bin/sh", &[], dir.path()).is_ok());
        let missing = check_program("/no/such", &env, dir.path()).expect_err("missing");
        assert_eq!(
            missing.to_string(),
            "No such file or directory (os error 2)"
        );
        fs::write(dir.path().join("data"), "x").expect("write");
        let not_exec = check_program("./data", &env, dir.path()).expect_err("not executable");
        assert_eq!(not_exec.raw_os_error(), Some(Errno::EACCES as i32));
    }
}
