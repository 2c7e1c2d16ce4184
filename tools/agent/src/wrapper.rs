//! The per-run supervisor process ("wrapper") and the trampoline it starts
//! the task through: `peloton-agent exec` and `peloton-agent exec-task`.
//!
//! The agent never waits for a task itself: it starts the wrapper (its own
//! binary in this mode) as the leader of a new process group, and the
//! wrapper starts and waits for the task. So a task outlives an agent
//! restart, and its exit status is never lost: the wrapper writes it to
//! `exit.json` whether or not an agent is there to read it. The wrapper is a
//! child subreaper, so every process the task leaves behind is reparented to
//! it and killed once the task has exited. It blocks SIGTERM, SIGINT and
//! SIGHUP for itself — a kill's SIGTERM to the group reaches the task, not
//! the process that records how the task ended. A signal mask is inherited
//! across fork and exec, and std's `Command` does *not* reset it (a test
//! showed tasks starting with SIGTERM blocked), so the trampoline below
//! empties the mask just before it executes the task, and sets every signal
//! back to its default action (an ignored signal, e.g. SIGHUP under `nohup`,
//! would otherwise survive exec); a test checks `SigBlk` and `SigIgn` of a
//! task.
//!
//! Limits (rlimits, joining the run's cgroup) are applied by a trampoline,
//! the agent binary once more in `exec-task` mode, which then `exec`s the
//! task in place (same pid, same process group). Setting them in the
//! wrapper before spawning would constrain the wrapper too: a memory
//! request below the wrapper's own address space would make the spawn, or
//! the wrapper's later bookkeeping, fail. Whether the program exists is
//! checked by the wrapper first, so the common start failures ("No such
//! file or directory") are reported without the task ever having run; the
//! rest come back from the trampoline in `start-error`.
//!
//! Both modes are plain single-threaded code (no async runtime): signal
//! masks are per thread, and they must hold for the whole process.

use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, geteuid};

use crate::isolation;
use crate::proc;
use crate::record::{
    self, EXIT_FILE, ExitRecord, START_ERROR_FILE, STARTED_FILE, STDERR_FILE, STDOUT_FILE,
    StartedRecord, TASK_FILE, TaskPlan, WRAPPER_LOG_FILE,
};

/// The exit code of a task that could not be started (as in shells).
pub(crate) const EXIT_CANNOT_START: i32 = 127;
/// Rounds of "find leftover processes, SIGKILL them" after the task exits.
const CLEANUP_ROUNDS: u32 = 500;
const CLEANUP_PAUSE: Duration = Duration::from_millis(10);
/// `PATH` for a task whose environment has none.
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `peloton-agent exec --sandbox DIR`: runs the task of the sandbox, waits
/// for it, cleans up after it and writes `exit.json`. Returns the wrapper's
/// own exit code (0 once `exit.json` is written).
pub fn run_wrapper(sandbox: &Path) -> i32 {
    let exit = supervise(sandbox);
    match record::write_json_atomic(&sandbox.join(EXIT_FILE), &exit) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("peloton-agent exec: cannot write {EXIT_FILE}: {e}");
            1
        }
    }
}

fn start_failure(reason: String) -> ExitRecord {
    eprintln!("peloton-agent exec: {reason}");
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

fn supervise(sandbox: &Path) -> ExitRecord {
    let plan: TaskPlan = match record::read_json(&sandbox.join(TASK_FILE)) {
        Ok(plan) => plan,
        Err(e) => return start_failure(format!("cannot read the task plan {TASK_FILE}: {e}")),
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!(
            "peloton-agent exec: cannot become a child subreaper ({e}); \
             orphaned task processes are found by their environment only"
        );
    }
    let mut blocked = SigSet::empty();
    for signal in STOP_SIGNALS {
        blocked.add(signal);
    }
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None) {
        eprintln!("peloton-agent exec: cannot block termination signals: {e}");
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
        return start_failure(format!("cannot start {:?}: {e}", plan.program));
    }
    let open = |name: &str| -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(sandbox.join(name))
    };
    let (stdout, stderr) = match (open(STDOUT_FILE), open(STDERR_FILE)) {
        (Ok(stdout), Ok(stderr)) => (stdout, stderr),
        (Err(e), _) | (_, Err(e)) => {
            return start_failure(format!("cannot open the sandbox's output files: {e}"));
        }
    };
    // `/proc/self/exe` is this very binary even if the file on disk was
    // replaced by an upgrade since the wrapper started.
    let spawned = Command::new("/proc/self/exe")
        .arg("exec-task")
        .arg("--sandbox")
        .arg(sandbox)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(sandbox)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) => return start_failure(format!("cannot start {:?}: {e}", plan.program)),
    };
    let task_pid = child.id();
    // The child is waited for with waitpid(-1) below, which also reaps the
    // orphans this subreaper inherits; std's handle is not used again.
    drop(child);
    let started = StartedRecord {
        pid: task_pid,
        time_ms: record::now_ms(),
    };
    if let Err(e) = record::write_json_atomic(&sandbox.join(STARTED_FILE), &started) {
        eprintln!("peloton-agent exec: cannot write {STARTED_FILE}: {e}");
    }
    let (exit_code, signal) = wait_for(task_pid);
    let time_ms = record::now_ms();
    let marker = plan
        .env
        .iter()
        .find(|(k, _)| k == "PELOTON_SANDBOX")
        .map(|(k, v)| format!("{k}={v}").into_bytes());
    kill_leftovers(plan.cgroup.as_deref(), marker.as_deref());
    let oom_killed = plan
        .cgroup
        .as_deref()
        .is_some_and(isolation::cgroup_oom_killed);
    if let Some(cgroup) = &plan.cgroup
        && let Err(e) = isolation::remove_cgroup(cgroup)
    {
        eprintln!(
            "peloton-agent exec: cannot remove {}: {e}",
            cgroup.display()
        );
    }
    let start_error = fs::read_to_string(sandbox.join(START_ERROR_FILE)).ok();
    if let (EXIT_CANNOT_START, Some(reason)) = (exit_code, start_error) {
        return ExitRecord {
            time_ms,
            ..start_failure(reason)
        };
    }
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
        time_ms,
        reason,
    }
}

/// Waits for the task, reaping inherited orphans on the way. Returns (exit
/// code, signal), with code 128 + signal for a signal, (-1, 0) if the task
/// cannot be waited for (it never is not: it is our child).
fn wait_for(task_pid: u32) -> (i32, i32) {
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
                eprintln!("peloton-agent exec: waiting for the task: {e}");
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
fn kill_leftovers(cgroup: Option<&Path>, marker: Option<&[u8]>) {
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
    eprintln!("peloton-agent exec: task processes were still appearing after cleanup; giving up");
    reap_exited();
}

/// Finds the program as `execvp` would (relative names against `PATH` of
/// the task's environment, paths with a `/` against the sandbox), so that
/// the usual start failures get the usual message.
fn check_program(program: &str, env: &[(String, String)], cwd: &Path) -> io::Result<()> {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![cwd.join(program)]
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
        path.split(':')
            .map(|dir| {
                if dir.is_empty() {
                    cwd.join(program)
                } else {
                    Path::new(dir).join(program)
                }
            })
            .collect()
    };
    let mut not_executable = false;
    for candidate in candidates {
        if let Ok(meta) = fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(());
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

/// `peloton-agent exec-task --sandbox DIR`: joins the run's cgroup, sets the
/// rlimits and executes the task in place. Returns only if that fails, with
/// the exit code to use (the reason is in `start-error`).
pub fn run_trampoline(sandbox: &Path) -> i32 {
    let error_path = sandbox.join(START_ERROR_FILE);
    let plan: TaskPlan = match record::read_json(&sandbox.join(TASK_FILE)) {
        Ok(plan) => plan,
        Err(e) => {
            let _ = fs::write(&error_path, format!("cannot read the task plan: {e}"));
            return EXIT_CANNOT_START;
        }
    };
    if let Some(cgroup) = &plan.cgroup
        && let Err(e) = isolation::join_cgroup(cgroup)
    {
        let _ = fs::write(
            &error_path,
            format!("cannot join the cgroup {}: {e}", cgroup.display()),
        );
        return EXIT_CANNOT_START;
    }
    let root = geteuid().is_root();
    if let Some(open_files) = plan.open_files {
        let limit = match getrlimit(Resource::RLIMIT_NOFILE) {
            // Only root may raise a hard limit.
            Ok((_, hard)) if !root => open_files.min(hard),
            _ => open_files,
        };
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, limit, limit) {
            note(
                sandbox,
                &format!("cannot set RLIMIT_NOFILE to {limit}: {e}"),
            );
        }
    }
    // Resetting signal dispositions (below) is sound only in a process of
    // one thread: checked here, while reading /proc may still allocate.
    if let Err(e) = check_single_threaded() {
        let _ = fs::write(&error_path, e);
        return EXIT_CANNOT_START;
    }
    // Everything that needs memory is prepared before the address-space
    // limit, which may be below what this process already uses.
    let mut command = Command::new(&plan.program);
    command.args(&plan.args);
    let mut message = String::with_capacity(4096);
    if let Some(bytes) = plan.address_space_bytes
        && let Err(e) = setrlimit(Resource::RLIMIT_AS, bytes, bytes)
    {
        note(sandbox, &format!("cannot set RLIMIT_AS to {bytes}: {e}"));
    }
    // Ignored signals survive exec: an agent started under `nohup`, or by
    // a script that ignores SIGINT, would pass them on to every task. The
    // task starts with every disposition at its default.
    if let Err(signal) = reset_signal_dispositions() {
        let _ = write!(
            message,
            "cannot reset signal {signal} to its default action: {}",
            Errno::last()
        );
        let _ = fs::write(&error_path, message.as_bytes());
        return EXIT_CANNOT_START;
    }
    // The wrapper's blocked SIGTERM, SIGINT and SIGHUP were inherited;
    // the task must start with nothing blocked. A SIGTERM that arrived
    // meanwhile is delivered here and ends the trampoline, as it should.
    if let Err(e) = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None) {
        note(sandbox, &format!("cannot clear the signal mask: {e}"));
    }
    let error = command.exec();
    let _ = write!(message, "cannot start {:?}: {error}", plan.program);
    let _ = fs::write(&error_path, message.as_bytes());
    EXIT_CANNOT_START
}

/// The number of the kernel's signals (`_NSIG`): 1..=64 on Linux.
const SIGNAL_COUNT: i32 = 64;

/// Refuses to go on in a process of more than one thread: the reset below
/// also sets the C library's own real-time signals (32 and 33: thread
/// cancellation, set*id across threads) to their default action, which
/// would end the process if another thread used them.
fn check_single_threaded() -> Result<(), String> {
    let threads = fs::read_dir("/proc/self/task")
        .map_err(|e| format!("cannot count this process's threads in /proc/self/task: {e}"))?
        .count();
    if threads == 1 {
        Ok(())
    } else {
        Err(format!(
            "the task trampoline must be single-threaded to reset signal dispositions (found {threads} threads)"
        ))
    }
}

/// Sets every signal 1..=64 (standard and real-time; SIGKILL and SIGSTOP
/// cannot change) back to its default action, or returns the first signal
/// the kernel refused. Handlers are reset by exec anyway; "ignore" is not.
/// The raw `rt_sigaction` system call, because the C library's `signal`
/// and `sigaction` refuse 32 and 33, which it keeps for itself, and an
/// ignored 32 or 33 would still reach the task. Allocation-free (it runs
/// under the task's address-space limit); the caller has checked that the
/// process has one thread ([`check_single_threaded`]).
fn reset_signal_dispositions() -> Result<(), i32> {
    use nix::libc;
    // The kernel's `struct sigaction` starts with the handler; SIG_DFL is
    // 0 and no flag, restorer or mask is wanted, so all zeros is the
    // default action whatever the architecture's layout. Four words cover
    // the largest layout (handler, flags, restorer, 64-bit mask).
    let default_action = [0u64; 4];
    const _: () = assert!(libc::SIG_DFL == 0);
    // The kernel's sigset: 64 bits.
    let sigset_bytes: libc::c_long = 8;
    for number in 1..=SIGNAL_COUNT {
        if number == libc::SIGKILL || number == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `default_action` is a valid, zeroed kernel sigaction
        // (SIG_DFL: no code of ours runs in a signal context), read by the
        // kernel only; the old action is not asked for (null); 8 is the
        // kernel's sigset size for 64 signals. The process is
        // single-threaded and about to exec, so no other code relies on a
        // disposition set earlier, the C library's own signals included.
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

/// A line in the sandbox's `wrapper.log` (the trampoline's stderr is the
/// task's, which is not the place for the agent's notes).
fn note(sandbox: &Path, line: &str) {
    use std::io::Write as _;
    if let Ok(mut log) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(sandbox.join(WRAPPER_LOG_FILE))
    {
        let _ = writeln!(log, "peloton-agent exec-task: {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
