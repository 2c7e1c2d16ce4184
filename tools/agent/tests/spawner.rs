//! The spawner, with real processes: the per-agent process that forks each
//! run's wrapper without an exec. A forked wrapper must be the process an
//! executed one was (group leader, output files, working directory, the
//! run's marker in its environment, no descriptor of the spawner's), the
//! spawner must end with its supervisor while the wrappers carry on, and a
//! spawner that dies must cost no run: its wrappers are watched through
//! /proc and the next launch starts another spawner.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peloton_agent::{Supervisor, SupervisorConfig};
use peloton_proto::v1;
use v1::RunPhase as P;

const TIMEOUT: Duration = Duration::from_secs(30);

fn key(job_id: &str, instance: u32) -> v1::RunKey {
    v1::RunKey {
        job_id: job_id.to_owned(),
        instance,
        run_id: 1,
        launch_id: 7 + u64::from(instance),
    }
}

/// Waits for a `go` file in its sandbox (at most about a minute: a test
/// that failed leaves nothing running for long), then prints `bye`.
fn waits_for_go(key: &v1::RunKey) -> v1::LaunchRun {
    v1::LaunchRun {
        key: Some(key.clone()),
        spec: Some(v1::TaskSpec {
            shell: "i=0; while [ ! -f go ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done; \
                    echo bye"
                .to_owned(),
            ..v1::TaskSpec::default()
        }),
        ..Default::default()
    }
}

fn config(dir: &Path) -> SupervisorConfig {
    SupervisorConfig::new(dir, env!("CARGO_BIN_EXE_peloton-agent"))
}

/// A supervisor and the latest report of each of its runs.
struct Harness {
    supervisor: Supervisor,
    latest: HashMap<(u32, u64), v1::RunReport>,
}

impl Harness {
    fn open(dir: &Path) -> Harness {
        Harness {
            supervisor: Supervisor::open(config(dir)).expect("supervisor"),
            latest: HashMap::new(),
        }
    }

    /// Polls until the run's latest report has `phase`.
    fn wait_for(&mut self, key: &v1::RunKey, phase: P) -> v1::RunReport {
        let start = Instant::now();
        let id = (key.instance, key.launch_id);
        loop {
            self.supervisor.poll();
            for report in self.supervisor.take_reports(usize::MAX) {
                let k = report.key.clone().expect("keyed");
                self.latest.insert((k.instance, k.launch_id), report);
            }
            if let Some(report) = self.latest.get(&id)
                && report.phase() == phase
            {
                return report.clone();
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "{key:?} did not reach {phase:?}: {:?}",
                self.latest.get(&id)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < TIMEOUT, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// (ppid, pgid, state) of a process, from /proc/PID/stat.
fn stat(pid: u32) -> Option<(u32, u32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some((
        rest.get(1)?.parse().ok()?,
        rest.get(2)?.parse().ok()?,
        rest.first()?.chars().next()?,
    ))
}

fn is_alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, _, state)| !matches!(state, 'Z' | 'X'))
}

/// The wrapper's pid, from the run's journal (the newest record with one).
fn wrapper_of(sandbox: &Path) -> u32 {
    let journal = std::fs::read(sandbox.join("run.json")).expect("journal");
    journal
        .split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .find_map(|v| v.get("wrapper")?.get("pid")?.as_u64())
        .and_then(|pid| u32::try_from(pid).ok())
        .expect("a recorded wrapper")
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn environ(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Where the process's descriptors point (`socket:[…]` for sockets).
fn descriptors(pid: u32) -> Vec<(u32, PathBuf)> {
    let mut fds: Vec<(u32, PathBuf)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            Some((fd, std::fs::read_link(e.path()).ok()?))
        })
        .collect();
    fds.sort();
    fds
}

#[test]
fn wrappers_are_forked_by_one_spawner_as_the_processes_an_exec_made() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let keys = [key("job-s", 0), key("job-s", 1)];
    h.supervisor
        .launch(&[waits_for_go(&keys[0]), waits_for_go(&keys[1])]);
    for k in &keys {
        h.wait_for(k, P::Running);
    }
    let sandboxes: Vec<PathBuf> = keys.iter().map(|k| h.supervisor.sandbox_dir(k)).collect();
    let wrappers: Vec<u32> = sandboxes.iter().map(|s| wrapper_of(s)).collect();
    let spawner = stat(wrappers[0]).expect("wrapper alive").0;
    assert_eq!(cmdline(spawner)[1..], ["spawner"]);
    assert_eq!(stat(spawner).expect("spawner").0, std::process::id());
    for (sandbox, &wrapper) in sandboxes.iter().zip(&wrappers) {
        let (ppid, pgid, _) = stat(wrapper).expect("wrapper alive");
        assert_eq!(ppid, spawner, "one spawner forks every wrapper");
        assert_eq!(pgid, wrapper, "the wrapper leads its run's process group");
        assert_eq!(
            std::fs::read_link(format!("/proc/{wrapper}/cwd")).expect("cwd"),
            *sandbox
        );
        // The marker a restarted agent finds the wrapper by, and nothing
        // of the agent's environment.
        assert_eq!(
            environ(wrapper),
            [format!("PELOTON_SANDBOX={}", sandbox.display())]
        );
        // Standard input /dev/null, output the run's files; no socket of
        // the spawner (the agent would not see the spawner's end).
        let fds = descriptors(wrapper);
        assert_eq!(fds[0], (0, PathBuf::from("/dev/null")), "{fds:?}");
        assert_eq!(fds[1], (1, sandbox.join("stdout")), "{fds:?}");
        assert_eq!(fds[2], (2, sandbox.join("stderr")), "{fds:?}");
        assert!(
            fds.iter()
                .all(|(_, to)| !to.to_string_lossy().starts_with("socket:")),
            "{fds:?}"
        );
    }
    for (k, sandbox) in keys.iter().zip(&sandboxes) {
        std::fs::write(sandbox.join("go"), "").expect("go");
        let done = h.wait_for(k, P::Succeeded);
        assert_eq!(done.exit_code, 0);
        assert_eq!(
            std::fs::read_to_string(sandbox.join("stdout")).expect("stdout"),
            "bye\n"
        );
    }
    // The spawner reaped its wrappers.
    for &wrapper in &wrappers {
        wait_until("the wrapper is reaped", || stat(wrapper).is_none());
    }
}

#[test]
fn a_dead_spawner_costs_no_run_and_is_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let first = key("job-d", 0);
    h.supervisor.launch(&[waits_for_go(&first)]);
    h.wait_for(&first, P::Running);
    let sandbox = h.supervisor.sandbox_dir(&first);
    let wrapper = wrapper_of(&sandbox);
    let spawner = stat(wrapper).expect("wrapper").0;
    let status = std::process::Command::new("kill")
        .args(["-KILL", &spawner.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    wait_until("the wrapper is reparented", || {
        stat(wrapper).is_some_and(|(ppid, _, _)| ppid != spawner)
    });
    // Watched through /proc now: its end is still seen.
    h.supervisor.poll();
    std::fs::write(sandbox.join("go"), "").expect("go");
    let done = h.wait_for(&first, P::Succeeded);
    assert_eq!(done.exit_code, 0);
    // The next launch starts another spawner.
    let second = key("job-d", 1);
    h.supervisor.launch(&[waits_for_go(&second)]);
    h.wait_for(&second, P::Running);
    let sandbox = h.supervisor.sandbox_dir(&second);
    let next = stat(wrapper_of(&sandbox)).expect("wrapper").0;
    assert_ne!(next, spawner);
    assert_eq!(cmdline(next)[1..], ["spawner"]);
    std::fs::write(sandbox.join("go"), "").expect("go");
    h.wait_for(&second, P::Succeeded);
}

#[test]
fn the_spawner_ends_with_its_supervisor_and_the_wrappers_carry_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key("job-e", 0);
    let (sandbox, wrapper, spawner) = {
        let mut h = Harness::open(dir.path());
        h.supervisor.launch(&[waits_for_go(&k)]);
        h.wait_for(&k, P::Running);
        let sandbox = h.supervisor.sandbox_dir(&k);
        let wrapper = wrapper_of(&sandbox);
        (sandbox, wrapper, stat(wrapper).expect("wrapper").0)
    };
    // Dropping the supervisor closed the spawner's socket: it has exited
    // (and was reaped); the wrapper has not.
    assert!(!is_alive(spawner));
    assert!(is_alive(wrapper));
    let mut h = Harness::open(dir.path());
    std::fs::write(sandbox.join("go"), "").expect("go");
    let done = h.wait_for(&k, P::Succeeded);
    assert_eq!(done.exit_code, 0);
}
