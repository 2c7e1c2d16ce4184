//! The task's child: what runs between the launcher's clone and the task's
//! exec, and what the launcher prepares for it.
//!
//! The child shares the launcher's memory (`CLONE_VM | CLONE_VFORK`, as
//! `posix_spawn` does: no page table is copied) and only makes system
//! calls until it executes the task: a process group of its own, /dev/null
//! and the run's `stdout`/`stderr`, the sandbox as working directory, the
//! run's cgroup, RLIMIT_NOFILE, every signal the launcher does not leave at
//! its default action set back to it (ignored signals survive exec) and
//! none blocked. The program is looked up first, as `execvp` would, so the
//! common start failures ("No such file or directory") are recorded
//! without a child; a failure in the child comes back as a stage and an
//! errno ([`ChildFailure`]) and the child exits [`EXIT_CANNOT_START`].

use std::fs;
use std::io;
use std::os::fd::RawFd;
use std::os::raw::c_char;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::libc;

use crate::record::{DEFAULT_PATH, EXIT_CANNOT_START, TaskPlan};

/// "No limit" in [`ChildPlan`].
pub(super) const NO_LIMIT: u64 = u64::MAX;

/// Everything the task's child needs, prepared by the launcher: the child
/// shares the launcher's memory until it executes the task, and may not
/// allocate or take a lock (the launcher is suspended meanwhile, at any
/// point of its own code).
pub(super) struct ChildPlan {
    pub(super) program: *const c_char,
    pub(super) argv: *const *const c_char,
    /// `/bin/sh` and `/bin/sh PROGRAM ARGS…`, for a program without `#!`.
    pub(super) shell: *const c_char,
    pub(super) shell_argv: *const *const c_char,
    pub(super) envp: *const *const c_char,
    pub(super) dir: *const c_char,
    pub(super) stdin: RawFd,
    pub(super) stdout: RawFd,
    pub(super) stderr: RawFd,
    /// Null: no cgroup.
    pub(super) cgroup_procs: *const c_char,
    pub(super) open_files: u64,
    /// The signals to set back to their default action.
    pub(super) signals: *const i32,
    pub(super) signal_count: usize,
    /// Set by a child that could not execute the task ([`ChildFailure`]).
    pub(super) failure: AtomicU64,
}

/// Why the task's child did not get to execute the task: a stage and an
/// errno, packed into [`ChildPlan::failure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChildFailure {
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

    pub(super) fn decode(code: u64) -> ChildFailure {
        let errno = i32::try_from(code & 0xffff_ffff).unwrap_or(0);
        let detail = i32::try_from((code >> 32) & 0xffff).unwrap_or(0);
        match code >> 48 {
            2 => ChildFailure::Cgroup(errno),
            3 => ChildFailure::Signal(detail, errno),
            4 => ChildFailure::Exec(errno),
            _ => ChildFailure::Setup(errno),
        }
    }

    pub(super) fn reason(self, plan: &TaskPlan, program: &Path) -> String {
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
pub(super) fn spawn_child(plan: &ChildPlan, stack: &mut [u8]) -> io::Result<i32> {
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
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` that `spawn_child` passed, alive and
    // unchanged while this runs; its pointers are NUL-terminated strings
    // and null-terminated arrays of them, kept alive by the launcher.
    #[allow(unsafe_code)]
    unsafe {
        let plan = &*arg.cast::<ChildPlan>();
        let fail = |failure: ChildFailure| -> ! {
            plan.failure.store(failure.encode(), Ordering::Release);
            libc::_exit(EXIT_CANNOT_START)
        };
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // Ignored signals survive exec, and the launcher's own dispositions
        // must not apply here: each one that is not the default goes back
        // to it first (the others are the default already).
        let signals = std::slice::from_raw_parts(plan.signals, plan.signal_count);
        if let Err(signal) = reset_signals(signals.iter().copied()) {
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

/// The file `execvp` would execute for `program`: relative names are
/// looked up in `PATH` of the task's environment, paths with a `/` are
/// taken against the sandbox.
pub(super) fn find_program(
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

/// Signals 1..=64 but SIGKILL and SIGSTOP, whose action cannot change.
fn changeable_signals() -> impl Iterator<Item = i32> {
    (1..=SIGNAL_COUNT).filter(|&n| n != libc::SIGKILL && n != libc::SIGSTOP)
}

/// The signals whose action in this process is not the default (ignored,
/// or handled by this process's code), in the order of their numbers: what
/// [`reset_signals`] must reset in a child for all to be at their default,
/// as long as this process sets no action after asking.
pub(super) fn non_default_signals() -> Vec<i32> {
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
/// the kernel refused (see the module documentation). Allocation-free
/// and async-signal-safe: only system calls.
pub(super) fn reset_signals(signals: impl IntoIterator<Item = i32>) -> Result<(), i32> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The launcher's list of signals to reset is what the kernel shows as
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

    #[test]
    fn program_lookup_messages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
        assert!(find_program("sh", &env, dir.path()).is_ok());
        assert!(find_program("/bin/sh", &[], dir.path()).is_ok());
        let missing = find_program("/no/such", &env, dir.path()).expect_err("missing");
        assert_eq!(
            missing.to_string(),
            "No such file or directory (os error 2)"
        );
        fs::write(dir.path().join("data"), "x").expect("write");
        let not_exec = find_program("./data", &env, dir.path()).expect_err("not executable");
        assert_eq!(not_exec.raw_os_error(), Some(Errno::EACCES as i32));
    }
}
