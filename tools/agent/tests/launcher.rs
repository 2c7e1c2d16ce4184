//! The launcher (`peloton-agent launcher`), with real processes: the
//! per-agent process that starts every task and records its end. A task must be the
//! process its spec asks for (its own group leader, output files, working
//! directory, its own environment with the run's marker, nothing blocked,
//! no descriptor of the launcher's); what it leaves behind is killed before
//! its end is recorded; the launcher must outlive its agent and record the
//! ends of its tasks for the next one; and a launcher that is killed costs
//! only its running tasks' exit statuses (the runs end, FAILED) and is
//! replaced at the next launch.

mod supervised;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peloton_agent::SupervisorConfig;
use peloton_proto::v1;
use supervised::ProtoSupervisor;
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
    supervisor: ProtoSupervisor,
    latest: HashMap<(u32, u64), v1::RunReport>,
}

impl Harness {
    fn open(dir: &Path) -> Harness {
        Harness::with(config(dir))
    }

    fn with(config: SupervisorConfig) -> Harness {
        Harness {
            supervisor: ProtoSupervisor::open(config).expect("supervisor"),
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

/// Sends `pid` a signal with `kill` (`-KILL`, `-STOP`, …).
fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {name} {pid}");
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
    let rest = stat_fields(pid)?;
    Some((
        rest.get(1)?.parse().ok()?,
        rest.get(2)?.parse().ok()?,
        rest.first()?.chars().next()?,
    ))
}

/// The fields of /proc/PID/stat after the command name (field 3 first).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        text[text.rfind(')')? + 1..]
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

fn is_alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, _, state)| !matches!(state, 'Z' | 'X'))
}

/// A field's pid in the run's journal (the newest record with one):
/// "task" or "keeper" (the launcher, under its earlier name on disk).
fn recorded(sandbox: &Path, field: &str) -> u32 {
    let journal = std::fs::read(sandbox.join("run.json")).expect("journal");
    journal
        .split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .find_map(|v| v.get(field)?.get("pid")?.as_u64())
        .and_then(|pid| u32::try_from(pid).ok())
        .unwrap_or_else(|| panic!("no recorded {field}"))
}

/// A `/proc/PID/status` field.
fn status_field(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
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
fn tasks_are_started_by_one_launcher_as_group_leaders_with_nothing_of_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let keys = [key("job-s", 0), key("job-s", 1)];
    h.supervisor
        .launch(&[waits_for_go(&keys[0]), waits_for_go(&keys[1])]);
    for k in &keys {
        h.wait_for(k, P::Running);
    }
    let sandboxes: Vec<PathBuf> = keys.iter().map(|k| h.supervisor.sandbox_dir(k)).collect();
    let tasks: Vec<u32> = sandboxes.iter().map(|s| recorded(s, "task")).collect();
    let launcher = recorded(&sandboxes[0], "keeper");
    assert_eq!(recorded(&sandboxes[1], "keeper"), launcher);
    assert_eq!(cmdline(launcher)[1..], ["launcher"]);
    assert_eq!(stat(launcher).expect("launcher").0, std::process::id());
    assert_eq!(
        status_field(launcher, "Threads"),
        "1",
        "the launcher is single-threaded"
    );
    for (sandbox, &task) in sandboxes.iter().zip(&tasks) {
        let (ppid, pgid, _) = stat(task).expect("task alive");
        assert_eq!(ppid, launcher, "one launcher starts every task");
        assert_eq!(pgid, task, "the task leads its run's process group");
        // The launcher hears of the task as its exec replaces its memory
        // (the vfork is then done), before the kernel has set up the
        // arguments that /proc shows.
        wait_until("the task's exec completes", || cmdline(task).len() == 3);
        assert_eq!(cmdline(task)[..2], ["/bin/sh", "-c"]);
        assert_eq!(
            std::fs::read_link(format!("/proc/{task}/cwd")).expect("cwd"),
            *sandbox
        );
        // Its own environment (with the run's marker), nothing of the
        // agent's or the launcher's.
        let env = environ(task);
        assert!(
            env.contains(&format!("PELOTON_SANDBOX={}", sandbox.display())),
            "{env:?}"
        );
        assert!(!env.iter().any(|e| e.starts_with("CARGO")), "{env:?}");
        // Standard input /dev/null, output the run's files; no descriptor
        // of the launcher's (its socket, its signalfd).
        let fds = descriptors(task);
        assert_eq!(fds[0], (0, PathBuf::from("/dev/null")), "{fds:?}");
        assert_eq!(fds[1], (1, sandbox.join("stdout")), "{fds:?}");
        assert_eq!(fds[2], (2, sandbox.join("stderr")), "{fds:?}");
        assert!(
            fds.iter().all(|(_, to)| {
                let to = to.to_string_lossy();
                !to.starts_with("socket:") && !to.contains("signalfd")
            }),
            "{fds:?}"
        );
        // (Its signal state is checked in `signals.rs`: the shell here
        // blocks signals itself while it waits for its `sleep`.)
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
    // The launcher reaped its tasks.
    for &task in &tasks {
        wait_until("the task is reaped", || stat(task).is_none());
    }
}

#[test]
fn programs_start_as_execvp_starts_them_or_fail_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let program = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        path.display().to_string()
    };
    let command = |k: &v1::RunKey, command: String| v1::LaunchRun {
        key: Some(k.clone()),
        spec: Some(v1::TaskSpec {
            command,
            ..v1::TaskSpec::default()
        }),
        ..Default::default()
    };
    // Its interpreter is missing: only the exec itself can say so.
    let k = key("job-x", 0);
    let missing = program("missing-interpreter", "#!/no/such/interpreter\necho hi\n");
    h.supervisor.launch(&[command(&k, missing)]);
    let failed = h.wait_for(&k, P::Failed);
    assert_eq!(failed.exit_code, 127, "{failed:?}");
    assert!(
        failed.reason.contains("No such file or directory"),
        "{}",
        failed.reason
    );
    // Not found in PATH.
    let k = key("job-x", 1);
    h.supervisor
        .launch(&[command(&k, "no-such-program-here".to_owned())]);
    let failed = h.wait_for(&k, P::Failed);
    assert!(
        failed.reason.contains("No such file or directory"),
        "{}",
        failed.reason
    );
    // No `#!`: the shell runs it, as execvp would.
    let k = key("job-x", 2);
    let script = program("no-shebang", "echo from the shell; exit 4\n");
    h.supervisor.launch(&[command(&k, script)]);
    let failed = h.wait_for(&k, P::Failed);
    assert_eq!(failed.exit_code, 4, "{failed:?}");
    assert_eq!(
        std::fs::read_to_string(h.supervisor.sandbox_dir(&k).join("stdout")).expect("stdout"),
        "from the shell\n"
    );
}

#[test]
fn a_task_left_processes_are_killed_before_its_end_is_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let k = key("job-l", 0);
    // One in the task's group, one that left it; the task itself exits.
    h.supervisor.launch(&[v1::LaunchRun {
        key: Some(k.clone()),
        spec: Some(v1::TaskSpec {
            shell: "sleep 600 & setsid sh -c 'echo $$ > escaped; exec sleep 601' & \
                    while [ ! -s escaped ]; do sleep 0.01; done; exit 3"
                .to_owned(),
            ..v1::TaskSpec::default()
        }),
        ..Default::default()
    }]);
    let failed = h.wait_for(&k, P::Failed);
    assert_eq!(failed.exit_code, 3, "{failed:?}");
    let sandbox = h.supervisor.sandbox_dir(&k);
    let escaped: u32 = std::fs::read_to_string(sandbox.join("escaped"))
        .expect("the escape happened")
        .trim()
        .parse()
        .expect("a pid");
    assert!(
        !is_alive(escaped),
        "the process that left the group survived"
    );
    let marker = format!("PELOTON_SANDBOX={}", sandbox.display());
    let left: Vec<u32> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| is_alive(pid) && environ(pid).contains(&marker))
        .collect();
    assert_eq!(left, Vec::<u32>::new(), "the run left processes behind");
}

#[test]
fn the_launcher_outlives_its_agent_and_records_the_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key("job-e", 0);
    let (sandbox, task, launcher) = {
        let mut h = Harness::open(dir.path());
        h.supervisor.launch(&[waits_for_go(&k)]);
        h.wait_for(&k, P::Running);
        let sandbox = h.supervisor.sandbox_dir(&k);
        let task = recorded(&sandbox, "task");
        let launcher = recorded(&sandbox, "keeper");
        (sandbox, task, launcher)
    };
    // The agent is gone (its supervisor dropped, the launcher's socket
    // closed); the launcher and its task carry on.
    assert!(is_alive(launcher));
    assert!(is_alive(task));
    let mut h = Harness::open(dir.path());
    std::fs::write(sandbox.join("go"), "").expect("go");
    let done = h.wait_for(&k, P::Succeeded);
    assert_eq!(done.exit_code, 0);
    // It recorded the end, then left: it had no task and no agent.
    wait_until("the old launcher exits", || !is_alive(launcher));
    // New launches go to a new launcher.
    let second = key("job-e", 1);
    h.supervisor.launch(&[waits_for_go(&second)]);
    h.wait_for(&second, P::Running);
    let sandbox = h.supervisor.sandbox_dir(&second);
    assert_ne!(recorded(&sandbox, "keeper"), launcher);
    std::fs::write(sandbox.join("go"), "").expect("go");
    h.wait_for(&second, P::Succeeded);
}

#[test]
fn a_killed_launcher_costs_only_its_tasks_exit_statuses_and_is_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let first = key("job-d", 0);
    h.supervisor.launch(&[waits_for_go(&first)]);
    h.wait_for(&first, P::Running);
    let sandbox = h.supervisor.sandbox_dir(&first);
    let task = recorded(&sandbox, "task");
    let launcher = recorded(&sandbox, "keeper");
    signal(launcher, "-KILL");
    wait_until("the task is reparented", || {
        stat(task).is_some_and(|(ppid, _, _)| ppid != launcher)
    });
    // The task runs on, watched through /proc; its end is seen, but its
    // exit status died with the launcher.
    h.supervisor.poll();
    assert!(is_alive(task));
    std::fs::write(sandbox.join("go"), "").expect("go");
    let done = h.wait_for(&first, P::Failed);
    assert!(
        done.reason.contains("lost the run's exit status"),
        "{done:?}"
    );
    // The next launch starts another launcher.
    let second = key("job-d", 1);
    h.supervisor.launch(&[waits_for_go(&second)]);
    h.wait_for(&second, P::Running);
    let sandbox = h.supervisor.sandbox_dir(&second);
    let next = recorded(&sandbox, "keeper");
    assert_ne!(next, launcher);
    assert_eq!(cmdline(next)[1..], ["launcher"]);
    std::fs::write(sandbox.join("go"), "").expect("go");
    h.wait_for(&second, P::Succeeded);
}

/// The launcher's own protocol, spoken raw: a request without a plan makes
/// it read the plan from the run's journal; a request it cannot parse costs
/// only the agent's socket — the task started before carries on and its
/// end is still recorded.
#[test]
fn the_launcher_reads_a_plan_left_out_from_the_journal_and_survives_garbage() {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;

    let dir = tempfile::tempdir().expect("tempdir");
    let sandbox = dir.path().canonicalize().expect("canonical").join("run");
    std::fs::create_dir(&sandbox).expect("sandbox");
    let plan = serde_json::json!({"plan": {
        "program": "/bin/sh",
        "args": ["-c", "while [ ! -f go ]; do sleep 0.01; done; exit 7"],
        "env": [["PELOTON_SANDBOX", sandbox.display().to_string()]],
        "open_files": null,
        "cgroup": null,
    }});
    std::fs::write(sandbox.join("run.json"), format!("\n{plan}\n")).expect("journal");
    let (mut ours, theirs) = UnixStream::pair().expect("pair");
    let mut launcher = std::process::Command::new(env!("CARGO_BIN_EXE_peloton-agent"))
        .arg("launcher")
        .env_clear()
        .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("launcher");
    let path = sandbox.as_os_str().as_encoded_bytes();
    let mut request = Vec::new();
    request.extend_from_slice(&u32::try_from(path.len()).unwrap().to_le_bytes());
    request.extend_from_slice(path);
    request.extend_from_slice(&0u32.to_le_bytes());
    ours.write_all(&request).expect("request");
    let mut message = [0u8; 40];
    ours.read_exact(&mut message).expect("answer");
    assert_eq!(message[0..4], 1u32.to_le_bytes(), "spawned");
    let task = u32::from_le_bytes(message[4..8].try_into().unwrap());
    assert!(is_alive(task));
    // Garbage: a path longer than any the agent sends.
    ours.write_all(&u32::MAX.to_le_bytes()).expect("garbage");
    let mut rest = Vec::new();
    ours.read_to_end(&mut rest)
        .expect("the launcher closes its end");
    assert!(rest.is_empty(), "{rest:?}");
    assert!(is_alive(task));
    std::fs::write(sandbox.join("go"), "").expect("go");
    // The launcher records the end, then exits: no agent, no task.
    let status = launcher.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let journal = std::fs::read_to_string(sandbox.join("run.json")).expect("journal");
    let exit = journal
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|v| v.get("exit").cloned())
        .expect("an exit entry");
    assert_eq!(exit["exit_code"], 7, "{exit}");
    assert_eq!(exit["reason"], "exited with code 7");
}

/// A launcher that takes a batch of requests and does not answer (stopped
/// here; in life, an exec hanging on a dead mount): the agent fails those
/// runs after its answer timeout instead of starting them a second time,
/// and the launcher, once it goes on, sees the agent has hung up and starts
/// none of them either. The next launch gets a new launcher.
#[test]
fn a_request_the_launcher_never_answers_fails_its_run_and_is_never_started() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let first = key("job-h", 0);
    h.supervisor.launch(&[waits_for_go(&first)]);
    h.wait_for(&first, P::Running);
    let first_sandbox = h.supervisor.sandbox_dir(&first);
    let launcher = recorded(&first_sandbox, "keeper");
    signal(launcher, "-STOP");
    // A batch of two: both requests are delivered, neither is answered.
    let batch = [key("job-h", 1), key("job-h", 3)];
    h.supervisor
        .launch(&[waits_for_go(&batch[0]), waits_for_go(&batch[1])]);
    for k in &batch {
        let failed = h.wait_for(k, P::Failed);
        assert!(
            failed
                .reason
                .contains("the launcher did not start the task"),
            "{failed:?}"
        );
    }
    signal(launcher, "-CONT");
    // It records the first run's end once that ends, then exits; the
    // failed runs' tasks never existed.
    std::fs::write(first_sandbox.join("go"), "").expect("go");
    wait_until("the old launcher exits", || !is_alive(launcher));
    for k in &batch {
        let sandbox = h.supervisor.sandbox_dir(k);
        let marker = format!("PELOTON_SANDBOX={}", sandbox.display());
        let started: Vec<u32> = std::fs::read_dir("/proc")
            .expect("proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| is_alive(pid) && environ(pid).contains(&marker))
            .collect();
        assert_eq!(started, Vec::<u32>::new());
        assert!(!sandbox.join("stdout").exists(), "the task was started");
    }
    // The first run's end was still recorded, by the old launcher.
    let done = h.wait_for(&first, P::Succeeded);
    assert_eq!(done.exit_code, 0);
    // A new launcher for the next launch.
    let next = key("job-h", 2);
    h.supervisor.launch(&[waits_for_go(&next)]);
    h.wait_for(&next, P::Running);
    let next_sandbox = h.supervisor.sandbox_dir(&next);
    assert_ne!(recorded(&next_sandbox, "keeper"), launcher);
    std::fs::write(next_sandbox.join("go"), "").expect("go");
    h.wait_for(&next, P::Succeeded);
}

/// One launch call is one batch of requests to the launcher: every run in it
/// starts (in order, each its own task, all from the one launcher), a run
/// named twice in the batch starts once and keeps its sandbox, and a run
/// that fails before its request (no command) fails alone.
#[test]
fn a_launch_batch_starts_each_run_once_from_one_launcher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let keys: Vec<v1::RunKey> = (0..5).map(|i| key("job-b", i)).collect();
    let mut batch: Vec<v1::LaunchRun> = keys.iter().map(waits_for_go).collect();
    // The third run again, with another command: ignored.
    let mut again = waits_for_go(&keys[2]);
    again.spec.as_mut().expect("spec").shell = "echo twice".to_owned();
    batch.insert(3, again);
    let bad = key("job-b", 9);
    batch.insert(
        1,
        v1::LaunchRun {
            key: Some(bad.clone()),
            spec: Some(v1::TaskSpec::default()),
            ..Default::default()
        },
    );
    h.supervisor.launch(&batch);
    let failed = h.wait_for(&bad, P::Failed);
    assert!(
        failed.reason.contains("neither command nor shell"),
        "{failed:?}"
    );
    for k in &keys {
        h.wait_for(k, P::Running);
    }
    let sandboxes: Vec<PathBuf> = keys.iter().map(|k| h.supervisor.sandbox_dir(k)).collect();
    let tasks: Vec<u32> = sandboxes.iter().map(|s| recorded(s, "task")).collect();
    let launcher = recorded(&sandboxes[0], "keeper");
    for sandbox in &sandboxes {
        assert_eq!(recorded(sandbox, "keeper"), launcher);
    }
    let mut distinct = tasks.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), tasks.len(), "{tasks:?}");
    // Started in the batch's order (start times, in clock ticks, never
    // go down; pids may wrap around).
    let started: Vec<u64> = tasks
        .iter()
        .map(|&task| {
            stat_fields(task).expect("stat")[19]
                .parse()
                .expect("start time")
        })
        .collect();
    assert!(started.windows(2).all(|w| w[0] <= w[1]), "{started:?}");
    for (k, sandbox) in keys.iter().zip(&sandboxes) {
        std::fs::write(sandbox.join("go"), "").expect("go");
        h.wait_for(k, P::Succeeded);
        assert_eq!(
            std::fs::read_to_string(sandbox.join("stdout")).expect("stdout"),
            "bye\n",
            "{k:?} ran once, its first command"
        );
    }
}

/// A batch sent to a launcher that died (its socket closed, nothing of the
/// batch delivered) is started by a new launcher, and every run succeeds.
#[test]
fn a_batch_for_a_dead_launcher_is_started_by_a_new_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let first = key("job-g", 0);
    h.supervisor.launch(&[waits_for_go(&first)]);
    h.wait_for(&first, P::Running);
    let first_sandbox = h.supervisor.sandbox_dir(&first);
    let launcher = recorded(&first_sandbox, "keeper");
    signal(launcher, "-KILL");
    wait_until("the launcher is dead", || !is_alive(launcher));
    // No poll in between: the supervisor learns of it from the batch.
    let keys: Vec<v1::RunKey> = (1..4).map(|i| key("job-g", i)).collect();
    let batch: Vec<v1::LaunchRun> = keys.iter().map(waits_for_go).collect();
    h.supervisor.launch(&batch);
    let mut next = None;
    for k in &keys {
        h.wait_for(k, P::Running);
        let sandbox = h.supervisor.sandbox_dir(k);
        // One new launcher started the whole batch.
        let by = recorded(&sandbox, "keeper");
        assert_ne!(by, launcher);
        assert_eq!(*next.get_or_insert(by), by);
        assert_eq!(stat(recorded(&sandbox, "task")).expect("task").0, by);
        std::fs::write(sandbox.join("go"), "").expect("go");
        let done = h.wait_for(k, P::Succeeded);
        assert_eq!(done.exit_code, 0);
    }
    std::fs::write(first_sandbox.join("go"), "").expect("go");
    h.wait_for(&first, P::Failed);
}

/// `--max-runs` counts the runs of a batch taken in before it: of five
/// launched together on an agent that holds at most three, the first three
/// start and the last two fail with the reason.
#[test]
fn max_runs_counts_the_runs_of_one_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path());
    config.max_runs = 3;
    let mut h = Harness::with(config);
    let keys: Vec<v1::RunKey> = (0..5).map(|i| key("job-m", i)).collect();
    let batch: Vec<v1::LaunchRun> = keys.iter().map(waits_for_go).collect();
    h.supervisor.launch(&batch);
    for k in &keys[3..] {
        let failed = h.wait_for(k, P::Failed);
        assert!(failed.reason.contains("--max-runs"), "{failed:?}");
    }
    for k in &keys[..3] {
        h.wait_for(k, P::Running);
        let sandbox = h.supervisor.sandbox_dir(k);
        std::fs::write(sandbox.join("go"), "").expect("go");
        h.wait_for(k, P::Succeeded);
    }
}

/// A task that ends at once never ends before it started: its RUNNING
/// time is the launcher's clock when it started the task, not the agent's
/// when it took in the answer (which, for a batch of short tasks, came
/// after the launcher had already recorded some of their ends).
#[test]
fn a_short_task_is_reported_started_before_it_ended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let keys: Vec<v1::RunKey> = (0..64).map(|i| key("job-t", i)).collect();
    let batch: Vec<v1::LaunchRun> = keys
        .iter()
        .map(|k| v1::LaunchRun {
            key: Some(k.clone()),
            spec: Some(v1::TaskSpec {
                command: "/bin/true".to_owned(),
                ..v1::TaskSpec::default()
            }),
            ..Default::default()
        })
        .collect();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    h.supervisor.launch(&batch);
    for k in &keys {
        let done = h.wait_for(k, P::Succeeded);
        assert!(
            before <= done.started_ms && done.started_ms <= done.time_ms,
            "launched at {before}: {done:?}"
        );
    }
}
