//! The run supervisor with real processes and no server: launch, output,
//! exit statuses, kills of whole process trees, re-adoption by a second
//! supervisor on the same work directory, acknowledgements, garbage
//! collection, ports. The launcher is this package's own binary.
//!
//! Tests wait for phases with generous timeouts and never assert how long
//! anything took.

mod supervised;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peloton_agent::{GcPolicy, Isolation, PortRange, SupervisorConfig};
use peloton_proto::v1;
use supervised::ProtoSupervisor;
use v1::RunPhase as P;

const TIMEOUT: Duration = Duration::from_secs(30);
const HOUR_MS: u64 = 3_600_000;

fn key(job_id: &str, instance: u32) -> v1::RunKey {
    v1::RunKey {
        job_id: job_id.to_owned(),
        instance,
        run_id: 1,
        launch_id: 100 + u64::from(instance),
    }
}

fn shell(line: &str) -> v1::TaskSpec {
    v1::TaskSpec {
        shell: line.to_owned(),
        ..v1::TaskSpec::default()
    }
}

fn launch(key: &v1::RunKey, spec: v1::TaskSpec) -> v1::LaunchRun {
    v1::LaunchRun {
        key: Some(key.clone()),
        spec: Some(spec),
        ..Default::default()
    }
}

fn config(dir: &Path) -> SupervisorConfig {
    SupervisorConfig::new(dir, env!("CARGO_BIN_EXE_peloton-agent"))
}

/// A supervisor and every report it produced, per run.
struct Harness {
    supervisor: ProtoSupervisor,
    seen: HashMap<(String, u32, u32, u64), Vec<v1::RunReport>>,
}

fn id(key: &v1::RunKey) -> (String, u32, u32, u64) {
    (key.job_id.clone(), key.instance, key.run_id, key.launch_id)
}

impl Harness {
    fn open(config: SupervisorConfig) -> Harness {
        Harness {
            supervisor: ProtoSupervisor::open(config).expect("supervisor opens"),
            seen: HashMap::new(),
        }
    }

    fn drain(&mut self) {
        for report in self.supervisor.take_reports(usize::MAX) {
            let key = report.key.clone().expect("reports name their run");
            self.seen.entry(id(&key)).or_default().push(report);
        }
    }

    fn reports(&mut self, key: &v1::RunKey) -> Vec<v1::RunReport> {
        self.drain();
        self.seen.get(&id(key)).cloned().unwrap_or_default()
    }

    fn latest(&mut self, key: &v1::RunKey) -> Option<v1::RunReport> {
        self.reports(key).last().cloned()
    }

    /// Polls until the run's latest report has `phase`.
    fn wait_for(&mut self, key: &v1::RunKey, phase: P) -> v1::RunReport {
        let start = Instant::now();
        loop {
            self.supervisor.poll();
            if let Some(report) = self.latest(key)
                && report.phase() == phase
            {
                return report;
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "run {key:?} did not reach {phase:?}; reports: {:?}",
                self.reports(key)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls until the run has ended, however it ended.
    fn wait_for_final(&mut self, key: &v1::RunKey) -> v1::RunReport {
        let start = Instant::now();
        loop {
            self.supervisor.poll();
            if let Some(report) = self.latest(key)
                && matches!(report.phase(), P::Succeeded | P::Failed | P::Killed)
            {
                return report;
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "run {key:?} did not end; reports: {:?}",
                self.reports(key)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sandbox(&self, key: &v1::RunKey) -> PathBuf {
        self.supervisor.sandbox_dir(key)
    }
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < TIMEOUT, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Live (not zombie) pids whose environment marks them as the sandbox's.
fn processes_of(sandbox: &Path) -> Vec<u32> {
    let marker = format!("PELOTON_SANDBOX={}", sandbox.display()).into_bytes();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|e| e == marker.as_slice()) && is_alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// Exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        !matches!(state, Some("Z" | "X"))
    })
}

/// Live processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir)
            && is_alive(pid)
        {
            found.push(pid);
        }
    }
    found
}

fn phases(reports: &[v1::RunReport]) -> Vec<P> {
    reports.iter().map(v1::RunReport::phase).collect()
}

/// Reports come in lifecycle order (the outbox may skip a phase that was
/// superseded before it was taken, never reorder).
fn assert_in_order(reports: &[v1::RunReport]) {
    let order = |p: P| match p {
        P::Unknown => 0,
        P::Starting => 1,
        P::Running => 2,
        P::Succeeded | P::Failed | P::Killed => 3,
    };
    let seen = phases(reports);
    assert!(
        seen.windows(2).all(|w| order(w[0]) < order(w[1])),
        "out of order: {seen:?}"
    );
}

#[test]
fn shell_task_succeeds_with_its_output_and_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-a", 0);
    let mut spec = shell(
        "echo hello; echo \"$PELOTON_JOB_ID|$PELOTON_INSTANCE_ID|$PELOTON_RUN_ID|$PELOTON_TASK_ID\"; \
         echo \"$PELOTON_SANDBOX|$(pwd)|$MY_VAR\"; echo \"$PELOTON_AGENT_BIN\"; echo oops >&2",
    );
    spec.env.insert("MY_VAR".to_owned(), "my value".to_owned());
    h.supervisor.launch(&[launch(&k, spec)]);
    // Taken before any poll: later phases would replace it in the outbox.
    // The launcher answers once the task has executed, so a launch that
    // returns has a RUNNING run.
    h.drain();
    let done = h.wait_for(&k, P::Succeeded);
    assert_eq!(done.exit_code, 0);
    assert_eq!(done.signal, 0);
    assert!(done.time_ms > 0);
    let reports = h.reports(&k);
    assert_eq!(reports[0].phase(), P::Running);
    assert!(reports[0].started_ms > 0);
    assert_in_order(&reports);

    let sandbox = h.sandbox(&k);
    let stdout = std::fs::read_to_string(sandbox.join("stdout")).expect("stdout");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "hello");
    assert_eq!(lines[1], "job-a|0|1|job-a-0-1");
    let s = sandbox.display();
    assert_eq!(lines[2], format!("{s}|{s}|my value"));
    // The agent's binary, for `$PELOTON_AGENT_BIN mpirun`.
    assert_eq!(lines[3], env!("CARGO_BIN_EXE_peloton-agent"));
    assert_eq!(
        std::fs::read_to_string(sandbox.join("stderr")).expect("stderr"),
        "oops\n"
    );

    // Logs through the supervisor: a window, then the end.
    let read = |offset: u64, max_bytes: u32| {
        h.supervisor.read_log(&v1::ReadLog {
            request_id: 7,
            key: Some(k.clone()),
            stderr: false,
            offset,
            max_bytes,
            ..Default::default()
        })
    };
    let window = read(1, 4);
    assert_eq!((window.request_id, window.offset), (7, 1));
    assert_eq!(window.data, b"ello");
    assert!(!window.eof);
    assert!(window.error.is_empty());
    let rest = read(6, 0);
    assert_eq!(rest.data, &stdout.as_bytes()[6..]);
    assert!(rest.eof, "an ended run's last chunk is eof");
    let unknown = h.supervisor.read_log(&v1::ReadLog {
        request_id: 8,
        key: Some(key("job-a", 9)),
        ..v1::ReadLog::default()
    });
    assert!(!unknown.error.is_empty());
}

#[test]
fn tasks_start_with_no_blocked_or_ignored_signals() {
    // The launcher blocks SIGCHLD and the agent's runtime ignores SIGPIPE;
    // none of it may reach the task. `grep` is executed
    // directly (no shell in between, whose own masking would blur this).
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-m", 0);
    h.supervisor.launch(&[launch(
        &k,
        v1::TaskSpec {
            command: "grep".to_owned(),
            args: vec![
                "-E".to_owned(),
                "^Sig(Blk|Ign)".to_owned(),
                "/proc/self/status".to_owned(),
            ],
            ..v1::TaskSpec::default()
        },
    )]);
    h.wait_for(&k, P::Succeeded);
    let out = std::fs::read_to_string(h.sandbox(&k).join("stdout")).expect("stdout");
    let mask = |name: &str| {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {out:?}"));
        u64::from_str_radix(line.trim(), 16).expect("hex mask")
    };
    assert_eq!(mask("SigBlk:"), 0, "{out}");
    // Only the standard signals: glibc's posix_spawn leaves its two
    // internal real-time signals (32, 33) ignored, and a task's libc
    // installs its own handlers for them.
    assert_eq!(mask("SigIgn:") & 0x7fff_ffff, 0, "{out}");
}

#[test]
fn non_zero_exit_and_bad_commands_fail_with_reasons() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let exit3 = key("job-b", 0);
    let missing = key("job-b", 1);
    let empty = key("job-b", 2);
    let bad_job = v1::RunKey {
        job_id: "../escape".to_owned(),
        ..key("x", 3)
    };
    h.supervisor.launch(&[
        launch(&exit3, shell("echo bye; exit 3")),
        launch(
            &missing,
            v1::TaskSpec {
                command: "/no/such".to_owned(),
                args: vec!["x".to_owned()],
                ..v1::TaskSpec::default()
            },
        ),
        launch(&empty, v1::TaskSpec::default()),
        launch(&bad_job, shell("true")),
    ]);
    let failed = h.wait_for(&exit3, P::Failed);
    assert_eq!(failed.exit_code, 3);
    assert_eq!(failed.reason, "exited with code 3");

    let failed = h.wait_for(&missing, P::Failed);
    assert_eq!(failed.exit_code, 127);
    assert_eq!(
        failed.reason,
        "cannot start \"/no/such\": No such file or directory (os error 2)"
    );
    // Refused before anything ran: never reported RUNNING.
    assert!(!phases(&h.reports(&missing)).contains(&P::Running));

    let failed = h.wait_for(&empty, P::Failed);
    assert_eq!(
        failed.reason,
        "the task spec sets neither command nor shell"
    );
    let failed = h.wait_for(&bad_job, P::Failed);
    assert!(failed.reason.contains("file name"), "{}", failed.reason);
    assert!(!dir.path().join("escape-3-1-103").exists());
}

#[test]
fn kill_removes_the_whole_tree_even_setsid_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-c", 0);
    h.supervisor.launch(&[launch(
        &k,
        shell("sleep 600 & sleep 600 & setsid sleep 600 & wait"),
    )]);
    h.wait_for(&k, P::Running);
    let sandbox = h.sandbox(&k);
    let mut pids = Vec::new();
    // The shell and its three sleeps.
    wait_until("the task's four processes", || {
        pids = processes_of(&sandbox);
        pids.len() >= 4
    });
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 5_000,
        delay_ms: 0,
        ..Default::default()
    }]);
    let killed = h.wait_for(&k, P::Killed);
    assert!(
        killed.reason.starts_with("killed on request"),
        "{}",
        killed.reason
    );
    // The shell took the SIGTERM (no need to wait for the grace period);
    // the launcher then killed what it left behind.
    assert_eq!(killed.signal, 15, "{killed:?}");
    for pid in &pids {
        assert!(!is_alive(*pid), "pid {pid} survived the kill");
    }
    assert_eq!(processes_of(&sandbox), Vec::<u32>::new());
    assert_eq!(processes_in(&sandbox), Vec::<u32>::new());

    // Killing it again re-reports the final phase.
    h.drain();
    h.seen.clear();
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 0,
        delay_ms: 0,
        ..Default::default()
    }]);
    assert_eq!(phases(&h.reports(&k)), vec![P::Killed]);
}

#[test]
fn kill_escalates_to_sigkill_when_sigterm_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-d", 0);
    // Ignored signals are inherited: every process here ignores SIGTERM.
    h.supervisor.launch(&[launch(
        &k,
        shell("trap '' TERM; sleep 600 & setsid sleep 600 & wait"),
    )]);
    h.wait_for(&k, P::Running);
    let sandbox = h.sandbox(&k);
    let mut pids = Vec::new();
    wait_until("the task's three processes", || {
        pids = processes_of(&sandbox);
        pids.len() >= 3
    });
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 300,
        delay_ms: 0,
        ..Default::default()
    }]);
    let killed = h.wait_for(&k, P::Killed);
    assert_eq!(killed.signal, 9, "{killed:?}");
    for pid in &pids {
        assert!(!is_alive(*pid), "pid {pid} survived the kill");
    }
    assert_eq!(processes_in(&sandbox), Vec::<u32>::new());
}

/// A kill with a deregistration delay: the task gets SIGTERM only once the
/// delay has passed (it writes down when, by the clock the agent reports
/// with), and its end is reported at its real end, after that. A second
/// kill with a longer delay does not put the signal off.
#[test]
fn a_kill_with_a_delay_signals_the_task_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-delay", 0);
    h.supervisor.launch(&[launch(
        &k,
        shell("trap 'date +%s%3N > term; exit 0' TERM; touch ready; while :; do sleep 0.02; done"),
    )]);
    h.wait_for(&k, P::Running);
    let sandbox = h.sandbox(&k);
    wait_until("the trap set", || sandbox.join("ready").exists());
    let delay_ms = 1_500;
    let killed_ms = peloton_now_ms();
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 30_000,
        delay_ms,
        ..Default::default()
    }]);
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 30_000,
        delay_ms: 600_000,
        ..Default::default()
    }]);
    let ended = h.wait_for(&k, P::Killed);
    let term_ms: u64 = std::fs::read_to_string(sandbox.join("term"))
        .expect("the task got SIGTERM")
        .trim()
        .parse()
        .expect("ms");
    assert!(
        term_ms >= killed_ms + delay_ms,
        "SIGTERM {} ms after the kill, before its delay of {delay_ms} ms",
        term_ms - killed_ms
    );
    assert!(
        ended.time_ms >= term_ms,
        "reported ended at {}, before its SIGTERM at {term_ms}",
        ended.time_ms
    );
    assert_eq!(ended.exit_code, 0, "{ended:?}");
}

#[test]
fn kill_of_an_unknown_run_is_reported_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-e", 4);
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 1000,
        delay_ms: 0,
        ..Default::default()
    }]);
    let report = h.latest(&k).expect("reported");
    assert_eq!(report.phase(), P::Killed);
    assert_eq!(report.reason, "not running on this host");
}

#[test]
fn a_second_supervisor_readopts_live_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let waits = key("job-f", 0);
    let killed_later = key("job-f", 1);
    let sandbox;
    {
        let mut first = Harness::open(config(dir.path()));
        first.supervisor.launch(&[
            launch(
                &waits,
                shell("while [ ! -f go ]; do sleep 0.05; done; echo bye"),
            ),
            launch(&killed_later, shell("sleep 600")),
        ]);
        first.wait_for(&waits, P::Running);
        first.wait_for(&killed_later, P::Running);
        sandbox = first.sandbox(&waits);
        // A second agent cannot take the same work directory meanwhile.
        assert!(ProtoSupervisor::open(config(dir.path())).is_err());
    }
    // The first supervisor is gone (as if the agent restarted); the tasks
    // are not.
    let mut second = Harness::open(config(dir.path()));
    let registered = second.supervisor.registration_runs();
    let phase_of = |k: &v1::RunKey| {
        registered
            .iter()
            .find(|r| r.key.as_ref() == Some(k))
            .map(v1::RunReport::phase)
    };
    assert_eq!(phase_of(&waits), Some(P::Running));
    assert_eq!(phase_of(&killed_later), Some(P::Running));

    std::fs::write(sandbox.join("go"), "").expect("touch go");
    let done = second.wait_for(&waits, P::Succeeded);
    assert_eq!(done.exit_code, 0);
    assert_eq!(
        std::fs::read_to_string(sandbox.join("stdout")).expect("stdout"),
        "bye\n"
    );

    let other = second.sandbox(&killed_later);
    second.supervisor.kill(&[v1::KillRun {
        key: Some(killed_later.clone()),
        grace_ms: 200,
        delay_ms: 0,
        ..Default::default()
    }]);
    second.wait_for(&killed_later, P::Killed);
    assert_eq!(processes_of(&other), Vec::<u32>::new());
}

#[test]
fn a_run_whose_launcher_vanished_is_failed_when_its_task_ends_and_cleaned_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-g", 0);
    h.supervisor
        .launch(&[launch(&k, shell("sleep 600 & sleep 601; exit 0"))]);
    h.wait_for(&k, P::Running);
    let sandbox = h.sandbox(&k);
    let run = run_record(&sandbox);
    // The launcher, under its earlier name on disk.
    let launcher = run["keeper"]["pid"].as_u64().expect("launcher pid");
    let task = run["task"]["pid"].as_u64().expect("task pid");
    // SIGKILL to the launcher alone: nobody can record the task's exit.
    let kill = |pid: u64| {
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    };
    kill(launcher);
    // The task runs on, and so does its run.
    for _ in 0..10 {
        h.supervisor.poll();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(h.reports(&k).last().map(|r| r.phase()), Some(P::Running));
    kill(task);
    let failed = h.wait_for(&k, P::Failed);
    assert_eq!(failed.reason, "agent lost the run's exit status");
    wait_until("the orphaned sleep is killed", || {
        processes_of(&sandbox).is_empty()
    });
}

#[test]
fn acknowledged_runs_are_never_reported_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let acked = key("job-h", 0);
    let unacked = key("job-h", 1);
    {
        let mut h = Harness::open(config(dir.path()));
        h.supervisor.launch(&[
            launch(&acked, shell("true")),
            launch(&unacked, shell("exit 1")),
        ]);
        h.wait_for(&acked, P::Succeeded);
        h.wait_for(&unacked, P::Failed);
        h.supervisor.ack(std::slice::from_ref(&acked));
        assert_eq!(h.supervisor.run_count(), 1);
        // Launching it again is a no-op (the sandbox exists).
        h.seen.clear();
        h.supervisor.launch(&[launch(&acked, shell("true"))]);
        h.supervisor.poll();
        assert_eq!(h.reports(&acked), Vec::new());
        // Its log is still readable until collected.
        let chunk = h.supervisor.read_log(&v1::ReadLog {
            request_id: 1,
            key: Some(acked.clone()),
            ..v1::ReadLog::default()
        });
        assert!(chunk.error.is_empty(), "{}", chunk.error);
        assert!(chunk.eof);
    }
    let mut h = Harness::open(config(dir.path()));
    let registered = h.supervisor.registration_runs();
    let keys: Vec<_> = registered.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(keys, vec![unacked]);
    assert_eq!(registered[0].phase(), P::Failed);
    assert_eq!(registered[0].exit_code, 1);
    // A kill for the acknowledged run stays silent too.
    h.supervisor.kill(&[v1::KillRun {
        key: Some(acked.clone()),
        grace_ms: 0,
        delay_ms: 0,
        ..Default::default()
    }]);
    h.supervisor.poll();
    assert_eq!(h.reports(&acked), Vec::new());
}

/// The journals of this process open under `dir` (kept open between a
/// run's appends, at most 256 at once).
fn open_journals_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.starts_with(dir) && target.ends_with("run.json"))
        .count()
}

#[test]
fn journals_held_open_are_bounded_and_closed_by_the_acknowledgement() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = std::fs::canonicalize(dir.path()).expect("canonical");
    let mut config = config(&work);
    config.max_runs = 300;
    let keys: Vec<_> = (0..300).map(|i| key("job-fd", i)).collect();
    {
        let mut h = Harness::open(config.clone());
        let sleep = v1::TaskSpec {
            command: "sleep".to_owned(),
            args: vec!["60".to_owned()],
            ..v1::TaskSpec::default()
        };
        let launches: Vec<_> = keys.iter().map(|k| launch(k, sleep.clone())).collect();
        h.supervisor.launch(&launches);
        for k in &keys {
            h.wait_for(k, P::Running);
        }
        let open = open_journals_under(&work);
        assert!((1..=256).contains(&open), "{open} journals open");
        let kills: Vec<_> = keys
            .iter()
            .map(|k| v1::KillRun {
                key: Some(k.clone()),
                grace_ms: 5_000,
                delay_ms: 0,
                ..Default::default()
            })
            .collect();
        h.supervisor.kill(&kills);
        for k in &keys {
            h.wait_for(k, P::Killed);
        }
        h.supervisor.ack(&keys);
        assert_eq!(h.supervisor.run_count(), 0);
        assert_eq!(open_journals_under(&work), 0);
    }
    // Every acknowledgement is on disk, whether its journal was held open
    // or opened for the append.
    let mut h = Harness::open(config);
    assert_eq!(h.supervisor.registration_runs(), Vec::new());
}

#[test]
fn gc_removes_only_old_acknowledged_sandboxes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let old = key("job-i", 0);
    let unacked = key("job-i", 1);
    let live = key("job-i", 2);
    let recent = key("job-i", 3);
    h.supervisor.launch(&[
        launch(&old, shell("echo old")),
        launch(&unacked, shell("true")),
        launch(&live, shell("sleep 600")),
    ]);
    h.wait_for(&old, P::Succeeded);
    h.wait_for(&unacked, P::Succeeded);
    h.wait_for(&live, P::Running);
    h.supervisor.ack(std::slice::from_ref(&old));
    // What an agent that died mid-launch leaves: a sandbox with no record.
    let stray = h.supervisor.sandboxes_dir().join("stray-0-1-1");
    std::fs::create_dir(&stray).expect("stray sandbox");
    let now = peloton_now_ms();
    let by_age = GcPolicy {
        max_age_ms: HOUR_MS,
        max_disk_bytes: u64::MAX,
    };
    let outcome = h.supervisor.collect_garbage(&by_age, now);
    assert!(outcome.removed.is_empty(), "{outcome:?}");
    let mut outcome = h.supervisor.collect_garbage(&by_age, now + 2 * HOUR_MS);
    outcome.removed.sort();
    let mut expected = vec![h.sandbox(&old), stray];
    expected.sort();
    assert_eq!(outcome.removed, expected);
    assert!(!h.sandbox(&old).exists());
    for kept in [&unacked, &live] {
        assert!(h.sandbox(kept).join("run.json").exists());
    }

    // Over the disk limit, acknowledged sandboxes go (oldest first), and
    // still only those.
    h.supervisor
        .launch(&[launch(&recent, shell("echo recent"))]);
    h.wait_for(&recent, P::Succeeded);
    h.supervisor.ack(std::slice::from_ref(&recent));
    let by_disk = GcPolicy {
        max_age_ms: u64::MAX,
        max_disk_bytes: 0,
    };
    let outcome = h.supervisor.collect_garbage(&by_disk, now);
    assert_eq!(outcome.removed, vec![h.sandbox(&recent)]);
    for kept in [&unacked, &live] {
        assert!(h.sandbox(kept).join("run.json").exists());
    }
    h.supervisor.kill(&[v1::KillRun {
        key: Some(live.clone()),
        grace_ms: 0,
        delay_ms: 0,
        ..Default::default()
    }]);
    h.wait_for(&live, P::Killed);
}

fn peloton_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .try_into()
        .expect("fits")
}

#[test]
fn ports_are_distinct_in_range_and_exposed_to_tasks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let range = PortRange {
        first: 47210,
        last: 47229,
    };
    let mut c = config(dir.path());
    c.ports = Some(range);
    let mut h = Harness::open(c);
    assert_eq!(h.supervisor.port_count(), 20);
    let port = |name: &str| v1::PortSpec {
        name: name.to_owned(),
    };
    let keys: Vec<_> = (0..3).map(|i| key("job-j", i)).collect();
    let runs: Vec<_> = keys
        .iter()
        .map(|k| {
            let mut spec = shell("echo $PELOTON_PORT_HTTP $PELOTON_PORT_ADMIN_X");
            spec.ports = vec![port("http"), port("admin-x")];
            launch(k, spec)
        })
        .collect();
    let greedy = key("job-j", 9);
    let mut too_many = shell("true");
    too_many.ports = (0..21).map(|i| port(&format!("p{i}"))).collect();
    h.supervisor.launch(&runs);
    h.supervisor.launch(&[launch(&greedy, too_many)]);
    let mut all = Vec::new();
    for k in &keys {
        h.wait_for(k, P::Succeeded);
        let out = std::fs::read_to_string(h.sandbox(k).join("stdout")).expect("stdout");
        let ports: Vec<u16> = out
            .split_whitespace()
            .map(|p| p.parse().expect("a port number"))
            .collect();
        assert_eq!(ports.len(), 2, "{out:?}");
        all.extend(ports);
    }
    assert!(
        all.iter().all(|p| (range.first..=range.last).contains(p)),
        "{all:?}"
    );
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), all.len(), "{all:?}");
    let failed = h.wait_for(&greedy, P::Failed);
    assert!(failed.reason.contains("port"), "{}", failed.reason);
}

/// RLIMIT_NOFILE is set on the task; its memory request limits what it
/// holds, never its address space (under 2 MiB of address space a shell
/// cannot even map libc: "failed to map segment", exit 127).
#[test]
fn rlimits_apply_to_the_task_only_and_memory_is_not_address_space() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(dir.path());
    c.open_files = 1000;
    let mut h = Harness::open(c);
    let k = key("job-k", 0);
    let mut spec = shell("ulimit -v; ulimit -n");
    spec.resources = Some(v1::Resources {
        cpu: 0.5,
        memory_mb: 2.0,
        ..v1::Resources::default()
    });
    h.supervisor.launch(&[launch(&k, spec)]);
    let ended = h.wait_for_final(&k);
    let out = std::fs::read_to_string(h.sandbox(&k).join("stdout")).expect("stdout");
    assert_eq!(
        (ended.phase(), ended.exit_code),
        (P::Succeeded, 0),
        "{ended:?} {out:?}"
    );
    // What this test process has: the task inherits the agent's own.
    let inherited = std::process::Command::new("/bin/sh")
        .args(["-c", "ulimit -v"])
        .output()
        .expect("sh");
    let inherited = String::from_utf8_lossy(&inherited.stdout).into_owned();
    assert_eq!(out, format!("{inherited}1000\n"));
}

/// Without a cgroup the agent holds a task to its memory request by what
/// its processes hold: above it they are killed (FAILED, "memory limit
/// exceeded"); a request below 32 MiB is raised to 32 MiB, so a task that
/// holds 8 MiB under `memory_mb: 2` runs to its end.
#[test]
fn without_a_cgroup_memory_is_watched_with_a_floor_of_32_mib() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let hold = |mib: u32, memory_mb: f64| {
        let mut spec = shell(&format!(
            "exec perl -e '$x = \"a\" x ({mib} * 1024 * 1024); print \"holding\\n\"; sleep 2'"
        ));
        spec.resources = Some(v1::Resources {
            memory_mb,
            ..v1::Resources::default()
        });
        spec
    };
    let hog = key("job-mem", 0);
    let small = key("job-mem", 1);
    h.supervisor
        .launch(&[launch(&hog, hold(200, 64.0)), launch(&small, hold(8, 2.0))]);
    let ended = h.wait_for_final(&hog);
    assert_eq!(ended.phase(), P::Failed, "{ended:?}");
    assert!(ended.reason.contains("memory limit exceeded"), "{ended:?}");
    let ended = h.wait_for_final(&small);
    let out = std::fs::read_to_string(h.sandbox(&small).join("stdout")).expect("stdout");
    assert_eq!(
        (ended.phase(), out.as_str()),
        (P::Succeeded, "holding\n"),
        "{ended:?}"
    );
}

#[test]
fn the_detected_isolation_runs_tasks() {
    // cgroup v2 where this machine has it (then under a test parent), the
    // rlimit fallback elsewhere; either way a task runs and is reported.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(dir.path());
    let (isolation, _why) = Isolation::detect(Path::new("/sys/fs/cgroup/peloton-agent-test"));
    c.isolation = isolation;
    let mut h = Harness::open(c);
    let k = key("job-l", 0);
    let mut spec = shell("echo isolated");
    spec.resources = Some(v1::Resources {
        cpu: 0.5,
        memory_mb: 64.0,
        ..v1::Resources::default()
    });
    h.supervisor.launch(&[launch(&k, spec)]);
    h.wait_for(&k, P::Succeeded);
    let k2 = key("job-l", 1);
    h.supervisor
        .launch(&[launch(&k2, shell("sleep 600 & setsid sleep 600 & wait"))]);
    h.wait_for(&k2, P::Running);
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k2.clone()),
        grace_ms: 100,
        delay_ms: 0,
        ..Default::default()
    }]);
    h.wait_for(&k2, P::Killed);
    assert_eq!(processes_of(&h.sandbox(&k2)), Vec::<u32>::new());
}

/// A launch creates its directory, its output files and its journal, and
/// nothing else: the agent's record generations, the task plan and the
/// launcher's `exit` entry are all lines of `run.json`.
#[test]
fn a_run_is_its_journal_and_its_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-files", 0);
    h.supervisor
        .launch(&[launch(&k, shell("echo out; echo err >&2; exit 3"))]);
    let failed = h.wait_for(&k, P::Failed);
    assert_eq!(
        (failed.exit_code, failed.reason.as_str()),
        (3, "exited with code 3")
    );
    assert!(failed.started_ms > 0);
    h.supervisor.ack(std::slice::from_ref(&k));
    let sandbox = h.sandbox(&k);
    let mut names: Vec<String> = std::fs::read_dir(&sandbox)
        .expect("sandbox")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // The output, and when it was written (for `logs --since`, timestamps).
    assert_eq!(
        names,
        [
            "run.json",
            "stderr",
            "stderr.times",
            "stdout",
            "stdout.times"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.join("stdout")).unwrap(),
        "out\n"
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.join("stderr")).unwrap(),
        "err\n"
    );
    let journal = std::fs::read(sandbox.join("run.json")).expect("journal");
    let entries: Vec<serde_json::Value> = journal
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).expect("whole entries only"))
        .collect();
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| {
            ["plan", "started", "exit"]
                .into_iter()
                .find(|kind| e.get(*kind).is_some())
                .unwrap_or("run")
        })
        .collect();
    // Plan and first record in one write; then the task's and launcher's
    // identities with RUNNING (written by the agent once the task has
    // executed) and the launcher's exit entry, which race each other (the
    // task exits at once); the end; the acknowledgement.
    let agent_first = ["plan", "run", "run", "exit", "run", "run"];
    let launcher_first = ["plan", "run", "exit", "run", "run", "run"];
    assert!(
        kinds == agent_first || kinds == launcher_first,
        "journal entries in an unexpected order: {kinds:?}"
    );
    let running = entries
        .iter()
        .find(|e| e.get("task").is_some())
        .expect("a record naming the task");
    assert!(running["task"]["pid"].as_u64().unwrap_or(0) > 0);
    assert!(running["keeper"]["pid"].as_u64().unwrap_or(0) > 0);
    let exit = entries
        .iter()
        .find_map(|e| e.get("exit"))
        .expect("an exit entry");
    assert_eq!(exit["exit_code"], 3);
    let record = run_record(&sandbox);
    assert_eq!(record["generation"], 4);
    assert_eq!(record["acked"], true);
    assert_eq!(record["journal"], true);
}

/// The agent's record of a run: the newest whole generation in its
/// journal (`run.json`: JSON lines, appended to; the launcher's entry is
/// `{"exit": ...}`).
fn run_record(sandbox: &std::path::Path) -> serde_json::Value {
    std::fs::read(sandbox.join("run.json"))
        .expect("a journal")
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter(|v| v.get("generation").is_some())
        .max_by_key(|v| v["generation"].as_u64().unwrap_or(0))
        .expect("a run record")
}

/// A run's secrets are gone from its sandbox once it has ended: launched
/// by this supervisor, or taken over by another one after a restart (which
/// cannot know whether the run had secrets, so it always looks).
#[test]
fn secrets_are_removed_when_the_run_ends_even_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let with_secret = |key: &v1::RunKey, line: &str| v1::LaunchRun {
        secrets: vec![v1::Secret {
            name: "token".to_owned(),
            value: b"s3cret".to_vec(),
            size: 0,
        }],
        ..launch(key, shell(line))
    };
    let quick = key("job-s", 0);
    let waits = key("job-s", 1);
    let secret_of = |h: &Harness, k: &v1::RunKey| h.sandbox(k).join(".peloton-secrets/token");
    {
        let mut first = Harness::open(config(dir.path()));
        first.supervisor.launch(&[
            with_secret(&quick, "cat \"$PELOTON_SECRETS/token\""),
            with_secret(&waits, "while [ ! -f go ]; do sleep 0.05; done"),
        ]);
        first.wait_for(&quick, P::Succeeded);
        assert_eq!(
            std::fs::read_to_string(first.sandbox(&quick).join("stdout")).expect("stdout"),
            "s3cret"
        );
        assert!(!secret_of(&first, &quick).exists(), "removed at the end");
        first.wait_for(&waits, P::Running);
        assert!(secret_of(&first, &waits).exists(), "there while it runs");
    }
    let mut second = Harness::open(config(dir.path()));
    std::fs::write(second.sandbox(&waits).join("go"), "").expect("touch go");
    second.wait_for(&waits, P::Succeeded);
    assert!(
        !secret_of(&second, &waits).exists(),
        "removed by the supervisor that took the run over"
    );
}

/// A kill's deadlines are kept in the time the supervisor is given, never
/// read from the clock behind its back: a task that ignores SIGTERM is
/// still running however long after the kill the clock really is, as long
/// as the polls say its grace has not passed, and is SIGKILLed by the
/// first poll that says it has.
#[test]
fn kill_deadlines_follow_the_time_the_supervisor_is_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("job-clock", 0);
    h.supervisor.launch(&[launch(
        &k,
        shell("trap '' TERM; touch ready; exec sleep 600"),
    )]);
    h.wait_for(&k, P::Running);
    let ready = h.sandbox(&k).join("ready");
    wait_until("the task ignores SIGTERM", || ready.exists());
    let kill_ms = peloton_agent::now_ms();
    let grace_ms = 60_000;
    h.supervisor.kill_at(
        &[v1::KillRun {
            key: Some(k.clone()),
            grace_ms,
            delay_ms: 0,
            ..Default::default()
        }],
        kill_ms,
    );
    // Past the SIGTERM by the real clock, and a moment short of the
    // deadline by the given one: it runs on.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        h.supervisor.poll_at(kill_ms + grace_ms - 1);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(h.latest(&k).map(|r| r.phase()), Some(P::Running));
    // The deadline, by the given clock: SIGKILL, and the run ends KILLED.
    let start = Instant::now();
    let killed = loop {
        h.supervisor.poll_at(kill_ms + grace_ms);
        if let Some(report) = h.latest(&k)
            && report.phase() == P::Killed
        {
            break report;
        }
        assert!(start.elapsed() < TIMEOUT, "not killed: {:?}", h.reports(&k));
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(killed.signal, 9, "{killed:?}");
}
