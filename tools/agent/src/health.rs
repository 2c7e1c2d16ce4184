//! Health checks of live runs: a command in the sandbox, an HTTP GET or a
//! TCP connect on one of the run's ports, repeated while the run is
//! RUNNING.
//!
//! Each checked run has one checker thread (so at most one check of a run
//! is in flight, and the number of checker threads is bounded by the
//! supervisor's `max_runs`). Checks block — a shell line may take its whole
//! timeout — so they never run under the supervisor's lock: the thread
//! keeps its verdict in a cell the supervisor reads when it builds a report,
//! and on a change of health it names the run in a [`HealthInbox`] and
//! calls the inbox's waker, so the session sends a RUNNING report at once
//! instead of at the next poll. The agent only reports a verdict; killing
//! an unhealthy task is the server's decision.
//!
//! The verdict itself ([`HealthTracker`]) is plain counting, tested without
//! threads or processes. The verdict is not recorded on disk: a restarted
//! agent starts again from HEALTH_UNKNOWN and checks at once if the
//! initial delay (counted from the task's start) has passed.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

use crate::record::{self, HEALTH_OUTPUT_FILE};
use crate::run::{AssignedPort, CheckKind, Health, HealthCheckPlan, RunId};

/// The check's output or error kept for `health_detail`, at most.
const MAX_DETAIL_BYTES: usize = 1024;
/// Checker threads sleep almost all the time and hold little: a check's
/// buffers live on the heap.
const CHECKER_STACK_BYTES: usize = 512 << 10;
/// How often a running command check is looked at, at most (it starts at
/// 1 ms and doubles, so a quick check is seen quickly).
const COMMAND_POLL_MAX: Duration = Duration::from_millis(50);

/// A run's health as reported: `health_detail` is set only when unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) health: Health,
    pub(crate) detail: String,
}

impl Verdict {
    /// A run without a check.
    pub(crate) fn none() -> Verdict {
        Verdict {
            health: Health::None,
            detail: String::new(),
        }
    }

    pub(crate) fn unknown() -> Verdict {
        Verdict {
            health: Health::Unknown,
            detail: String::new(),
        }
    }
}

/// Turns check outcomes into a verdict: UNKNOWN until the first pass,
/// HEALTHY after any pass, UNHEALTHY after `max_consecutive_failures`
/// failures in a row (whether or not a check ever passed).
#[derive(Debug, Clone)]
pub(crate) struct HealthTracker {
    health: Health,
    consecutive_failures: u32,
    max_consecutive_failures: u32,
    last_failure: String,
}

impl HealthTracker {
    pub(crate) fn new(max_consecutive_failures: u32) -> HealthTracker {
        assert!(max_consecutive_failures > 0, "defaults are applied first");
        HealthTracker {
            health: Health::Unknown,
            consecutive_failures: 0,
            max_consecutive_failures,
            last_failure: String::new(),
        }
    }

    /// Takes one check's outcome; true when the health changed.
    pub(crate) fn record(&mut self, outcome: Result<(), String>) -> bool {
        let before = self.health;
        match outcome {
            Ok(()) => {
                self.consecutive_failures = 0;
                self.last_failure.clear();
                self.health = Health::Healthy;
            }
            Err(detail) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.last_failure = detail;
                if self.consecutive_failures >= self.max_consecutive_failures {
                    self.health = Health::Unhealthy;
                }
            }
        }
        debug_assert!(
            self.health != Health::Unhealthy
                || self.consecutive_failures >= self.max_consecutive_failures
        );
        self.health != before
    }

    pub(crate) fn verdict(&self) -> Verdict {
        Verdict {
            health: self.health,
            detail: if self.health == Health::Unhealthy {
                self.last_failure.clone()
            } else {
                String::new()
            },
        }
    }
}

type Waker = Arc<dyn Fn() + Send + Sync>;

/// Runs whose health changed since the supervisor last looked, and who to
/// wake about it. Bounded by the number of runs (a set).
#[derive(Default)]
pub(crate) struct HealthInbox {
    changed: Mutex<BTreeSet<RunId>>,
    waker: Mutex<Option<Waker>>,
}

impl fmt::Debug for HealthInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthInbox")
            .field("changed", &lock(&self.changed).len())
            .finish_non_exhaustive()
    }
}

impl HealthInbox {
    pub(crate) fn set_waker(&self, waker: Waker) {
        *lock(&self.waker) = Some(waker);
    }

    fn post(&self, key: &RunId) {
        lock(&self.changed).insert(key.clone());
        let waker = lock(&self.waker).clone();
        if let Some(wake) = waker {
            wake();
        }
    }

    /// The runs whose health changed, emptying the inbox.
    pub(crate) fn take(&self) -> BTreeSet<RunId> {
        std::mem::take(&mut *lock(&self.changed))
    }
}

/// Poisoning would mean a checker panicked mid-update of a plain value;
/// the value is still whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a checker thread and its handle share.
#[derive(Debug)]
struct CheckerCell {
    verdict: Mutex<Verdict>,
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl CheckerCell {
    fn is_stopped(&self) -> bool {
        *lock(&self.stopped)
    }

    /// Sleeps `how_long` unless stopped first; true when stopped.
    fn sleep(&self, how_long: Duration) -> bool {
        let deadline = Instant::now() + how_long;
        let mut stopped = lock(&self.stopped);
        loop {
            if *stopped {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            stopped = self
                .wake
                .wait_timeout(stopped, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The run a checker looks at.
#[derive(Debug, Clone)]
pub(crate) struct CheckTarget {
    pub(crate) key: RunId,
    pub(crate) dir: PathBuf,
    pub(crate) ports: Vec<AssignedPort>,
    /// When the task started (ms since the epoch): the initial delay counts
    /// from here, also for a re-adopted run.
    pub(crate) started_ms: u64,
}

/// The handle of a run's checker thread. Stopping (or dropping) it ends
/// the thread after the check in flight, if any (a command check is killed
/// at once); the last verdict stays readable.
#[derive(Debug)]
pub(crate) struct HealthChecker {
    cell: Arc<CheckerCell>,
}

impl HealthChecker {
    /// Starts checking `target` at `now_ms` (the wall clock, ms): the first
    /// check goes once its initial delay, counted from the task's start,
    /// has passed.
    pub(crate) fn start(
        plan: HealthCheckPlan,
        target: CheckTarget,
        inbox: Arc<HealthInbox>,
        now_ms: u64,
    ) -> io::Result<HealthChecker> {
        let first_check_in = first_check_delay(&plan, target.started_ms, now_ms);
        let cell = Arc::new(CheckerCell {
            verdict: Mutex::new(Verdict::unknown()),
            stopped: Mutex::new(false),
            wake: Condvar::new(),
        });
        let shared = cell.clone();
        thread::Builder::new()
            .name(format!("health-{}", target.key.sandbox_name()))
            .stack_size(CHECKER_STACK_BYTES)
            .spawn(move || check_loop(&plan, &target, first_check_in, &shared, &inbox))?;
        Ok(HealthChecker { cell })
    }

    pub(crate) fn verdict(&self) -> Verdict {
        lock(&self.cell.verdict).clone()
    }

    pub(crate) fn stop(&self) {
        *lock(&self.cell.stopped) = true;
        self.cell.wake.notify_all();
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long after `now_ms` the first check of a task started at
/// `started_ms` goes. Wall-clock, because the start time is: a re-adopted
/// run whose delay has passed is checked at once.
fn first_check_delay(plan: &HealthCheckPlan, started_ms: u64, now_ms: u64) -> Duration {
    let first_ms = started_ms.saturating_add(plan.initial_delay_ms);
    Duration::from_millis(first_ms.saturating_sub(now_ms))
}

fn check_loop(
    plan: &HealthCheckPlan,
    target: &CheckTarget,
    first_check_in: Duration,
    cell: &CheckerCell,
    inbox: &HealthInbox,
) {
    if !first_check_in.is_zero() && cell.sleep(first_check_in) {
        return;
    }
    let interval = Duration::from_millis(plan.interval_ms);
    let timeout = Duration::from_millis(plan.timeout_ms);
    // The task's environment is read once: it never changes.
    let mut env: Option<Result<Vec<(String, String)>, String>> = None;
    let mut tracker = HealthTracker::new(plan.max_consecutive_failures);
    loop {
        let began = Instant::now();
        let outcome = match &plan.kind {
            CheckKind::Command { line } => {
                let env = env.get_or_insert_with(|| task_env(&target.dir));
                match env {
                    Ok(env) => command_check(line, &target.dir, env, timeout, cell),
                    Err(e) => Err(e.clone()),
                }
            }
            CheckKind::Http { port, path } => {
                port_of(target, port).and_then(|port| http_check(port, path, timeout))
            }
            CheckKind::Tcp { port } => {
                port_of(target, port).and_then(|port| tcp_check(port, timeout))
            }
        };
        // A check cut short by the stop says nothing about the task.
        if cell.is_stopped() {
            return;
        }
        if let Err(detail) = &outcome {
            tracing::debug!(run = %target.key.sandbox_name(), %detail, "health check failed");
        }
        let changed = tracker.record(outcome);
        *lock(&cell.verdict) = tracker.verdict();
        if changed {
            tracing::info!(
                run = %target.key.sandbox_name(),
                health = ?tracker.verdict().health,
                "health changed"
            );
            inbox.post(&target.key);
        }
        let next = began + interval;
        if cell.sleep(next.saturating_duration_since(Instant::now())) {
            return;
        }
    }
}

fn task_env(dir: &Path) -> Result<Vec<(String, String)>, String> {
    record::read_plan(dir)
        .map(|plan| plan.env)
        .map_err(|e| format!("cannot read the task's environment from its plan: {e}"))
}

fn port_of(target: &CheckTarget, name: &str) -> Result<u16, String> {
    target
        .ports
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.port)
        .ok_or_else(|| {
            let names: Vec<&str> = target.ports.iter().map(|p| p.name.as_str()).collect();
            format!("the task has no port named {name:?} (its ports: {names:?})")
        })
}

fn tcp_check(port: u16, timeout: Duration) -> Result<(), String> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&address, timeout)
        .map(drop)
        .map_err(|e| format!("cannot connect to {address}: {e}"))
}

fn http_check(port: u16, path: &str, timeout: Duration) -> Result<(), String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        // 4xx and 5xx are answers to judge, not transport errors.
        .http_status_as_error(false)
        // A 3xx is healthy as it is; following it could leave the task.
        .max_redirects(0)
        // Checks go to the task on this host, never through a proxy from
        // the agent's environment, and each on a fresh connection.
        .proxy(None)
        .max_idle_connections(0)
        .user_agent("peloton-agent health check")
        .build()
        .into();
    let mut response = agent
        .get(&url)
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = response.status().as_u16();
    if (200..400).contains(&status) {
        return Ok(());
    }
    let mut body = Vec::new();
    // The body only serves the detail; an error reading it changes nothing.
    let _ = response
        .body_mut()
        .as_reader()
        .take(MAX_DETAIL_BYTES as u64)
        .read_to_end(&mut body);
    Err(with_output(format!("GET {url}: HTTP {status}"), &body))
}

/// Runs the shell line with its output in `HEALTH_OUTPUT_FILE`, killing its
/// process group at the timeout (or when the checker is stopped) and after
/// it exits (whatever it left running in the background).
fn command_check(
    line: &str,
    dir: &Path,
    env: &[(String, String)],
    timeout: Duration,
    cell: &CheckerCell,
) -> Result<(), String> {
    let output_path = dir.join(HEALTH_OUTPUT_FILE);
    let output = File::create(&output_path)
        .and_then(|out| Ok((out.try_clone()?, out)))
        .map_err(|e| format!("cannot create {}: {e}", output_path.display()))?;
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(line)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(output.0)
        .stderr(output.1)
        .spawn()
        .map_err(|e| format!("cannot start the health check: {e}"))?;
    let deadline = Instant::now() + timeout;
    let exited = wait_until_exited(&child, deadline, cell);
    // The child is not reaped yet, so its pid (the group's id) cannot have
    // been reused: the group signalled is the check's.
    let _ = killpg(pid_of(&child), Signal::SIGKILL);
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for the health check: {e}"))?;
    let output = read_tail(&output_path);
    match exited {
        Err(e) => Err(format!("cannot wait for the health check: {e}")),
        Ok(false) => Err(with_output(
            format!("timed out after {} ms", timeout.as_millis()),
            &output,
        )),
        Ok(true) if status.success() => Ok(()),
        Ok(true) => {
            let how = match (
                status.code(),
                std::os::unix::process::ExitStatusExt::signal(&status),
            ) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(signal)) => format!("killed by signal {signal}"),
                (None, None) => format!("ended with {status}"),
            };
            Err(with_output(how, &output))
        }
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

/// Waits, without reaping, until the child has exited (true), the
/// deadline has passed or the checker was stopped (false).
fn wait_until_exited(child: &Child, deadline: Instant, cell: &CheckerCell) -> nix::Result<bool> {
    let mut pause = Duration::from_millis(1);
    loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid_of(child)), flags) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {}
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        if cell.sleep(pause.min(deadline - now)) {
            return Ok(false);
        }
        pause = (pause * 2).min(COMMAND_POLL_MAX);
    }
}

/// The last `MAX_DETAIL_BYTES` of a check's output (empty if unreadable).
fn read_tail(path: &Path) -> Vec<u8> {
    let read = || -> io::Result<Vec<u8>> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX_DETAIL_BYTES as u64)))?;
        let mut tail = Vec::new();
        file.take(MAX_DETAIL_BYTES as u64).read_to_end(&mut tail)?;
        Ok(tail)
    };
    read().unwrap_or_default()
}

/// `what: output`, the output trimmed and made valid UTF-8.
fn with_output(what: String, output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let text = text.trim();
    if text.is_empty() {
        what
    } else {
        format!("{what}: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_check_waits_out_the_initial_delay_from_the_task_s_start() {
        let plan = HealthCheckPlan {
            kind: CheckKind::Tcp {
                port: "http".to_owned(),
            },
            initial_delay_ms: 5_000,
            interval_ms: 1_000,
            timeout_ms: 1_000,
            max_consecutive_failures: 3,
        };
        let started_ms = 1_000_000;
        let delay = |now_ms| first_check_delay(&plan, started_ms, now_ms).as_millis();
        assert_eq!(delay(started_ms), 5_000, "just started");
        assert_eq!(delay(started_ms + 3_000), 2_000, "started a while ago");
        // A re-adopted run whose delay has passed: at once.
        assert_eq!(delay(started_ms + 5_000), 0);
        assert_eq!(delay(started_ms + 60_000), 0);
        // A clock stepped back behind the start: the whole delay, no more.
        assert_eq!(delay(started_ms - 10_000), 15_000);
    }

    fn failed(detail: &str) -> Result<(), String> {
        Err(detail.to_owned())
    }

    #[test]
    fn unknown_until_a_pass_unhealthy_after_the_limit_healed_by_one_pass() {
        let mut t = HealthTracker::new(3);
        assert_eq!(t.verdict(), Verdict::unknown());
        assert!(!t.record(failed("a")));
        assert!(!t.record(failed("b")));
        assert_eq!(t.verdict().health, Health::Unknown);
        assert!(t.record(failed("c")), "the third failure in a row decides");
        assert_eq!(
            t.verdict(),
            Verdict {
                health: Health::Unhealthy,
                detail: "c".to_owned()
            }
        );
        // Still unhealthy: no change to report, but the newest detail.
        assert!(!t.record(failed("d")));
        assert_eq!(t.verdict().detail, "d");
        assert!(t.record(Ok(())));
        assert_eq!(
            t.verdict(),
            Verdict {
                health: Health::Healthy,
                detail: String::new()
            }
        );
        // A pass resets the count: two failures do not make it unhealthy.
        assert!(!t.record(failed("e")));
        assert!(!t.record(failed("f")));
        assert!(!t.record(Ok(())));
        assert!(!t.record(failed("g")));
        assert!(!t.record(failed("h")));
        assert_eq!(t.verdict().health, Health::Healthy);
        assert!(t.record(failed("i")));
        assert_eq!(t.verdict().health, Health::Unhealthy);
    }

    #[test]
    fn one_failure_is_enough_when_the_limit_is_one() {
        let mut t = HealthTracker::new(1);
        assert!(t.record(failed("down")));
        assert_eq!(t.verdict().health, Health::Unhealthy);
    }

    #[test]
    fn details_carry_trimmed_output() {
        assert_eq!(with_output("x".to_owned(), b"  \n"), "x");
        assert_eq!(
            with_output("exited with code 1".to_owned(), b"not ready\n"),
            "exited with code 1: not ready"
        );
        assert_eq!(with_output("x".to_owned(), b"\xff"), "x: \u{fffd}");
    }
}
