//! Health checks and port reporting with real processes and no server:
//! command, HTTP and TCP checks, the UNKNOWN → HEALTHY → UNHEALTHY →
//! HEALTHY verdicts, the initial delay, checks stopping with the run,
//! re-adopted runs checked again, and ports in every report.
//!
//! Tests wait for verdicts with generous timeouts and never assert how long
//! anything took (only that no check ran before its initial delay, a lower
//! bound the agent promises).

mod supervised;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peloton_agent::{PortRange, SupervisorConfig};
use peloton_proto::v1;
use supervised::ProtoSupervisor;
use v1::Health as H;
use v1::RunPhase as P;
use v1::health_check::Kind;

const TIMEOUT: Duration = Duration::from_secs(20);

fn key(job_id: &str, instance: u32) -> v1::RunKey {
    v1::RunKey {
        job_id: job_id.to_owned(),
        instance,
        run_id: 1,
        launch_id: 300 + u64::from(instance),
    }
}

fn shell(line: &str) -> v1::TaskSpec {
    v1::TaskSpec {
        shell: line.to_owned(),
        ..v1::TaskSpec::default()
    }
}

/// A check every 100 ms, a verdict after `max_failures` failures.
fn check(kind: Kind, max_failures: u32) -> v1::HealthCheck {
    v1::HealthCheck {
        kind: Some(kind),
        initial_delay_ms: 0,
        interval_ms: 100,
        timeout_ms: 5_000,
        max_consecutive_failures: max_failures,
    }
}

fn checked(line: &str, check: v1::HealthCheck) -> v1::TaskSpec {
    v1::TaskSpec {
        health_check: Some(check),
        ..shell(line)
    }
}

fn port(name: &str) -> v1::PortSpec {
    v1::PortSpec {
        name: name.to_owned(),
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

/// Ports of a range no other test file uses.
fn config_with_ports(dir: &Path, first: u16) -> SupervisorConfig {
    let mut c = config(dir);
    c.ports = Some(PortRange {
        first,
        last: first + 9,
    });
    c
}

/// A supervisor, every report it produced per run, and when each report
/// was taken.
struct Harness {
    supervisor: ProtoSupervisor,
    seen: HashMap<v1::RunKey, Vec<(u64, v1::RunReport)>>,
}

impl Harness {
    fn open(config: SupervisorConfig) -> Harness {
        Harness {
            supervisor: ProtoSupervisor::open(config).expect("supervisor opens"),
            seen: HashMap::new(),
        }
    }

    fn drain(&mut self) {
        let now = now_ms();
        for report in self.supervisor.take_reports(usize::MAX) {
            let key = report.key.clone().expect("reports name their run");
            self.seen.entry(key).or_default().push((now, report));
        }
    }

    /// The registration's run list, kept as reports too: it supersedes
    /// what was queued, as it would for a server.
    fn registered(&mut self) -> Vec<v1::RunReport> {
        self.drain();
        let now = now_ms();
        let runs = self.supervisor.registration_runs();
        for report in &runs {
            let key = report.key.clone().expect("reports name their run");
            self.seen
                .entry(key)
                .or_default()
                .push((now, report.clone()));
        }
        runs
    }

    fn reports(&mut self, key: &v1::RunKey) -> Vec<v1::RunReport> {
        self.drain();
        self.seen
            .get(key)
            .map(|seen| seen.iter().map(|(_, r)| r.clone()).collect())
            .unwrap_or_default()
    }

    /// Polls until the run's latest report satisfies `want`.
    fn wait_until(
        &mut self,
        key: &v1::RunKey,
        what: &str,
        want: impl Fn(&v1::RunReport) -> bool,
    ) -> v1::RunReport {
        let start = Instant::now();
        loop {
            self.supervisor.poll();
            if let Some(report) = self.reports(key).last()
                && want(report)
            {
                return report.clone();
            }
            if start.elapsed() > TIMEOUT {
                let reports = self.reports(key);
                // The verdict of now (the detail may be newer than the
                // last report's).
                let now: Vec<_> = self
                    .registered()
                    .into_iter()
                    .filter(|r| r.key.as_ref() == Some(key))
                    .collect();
                panic!("run {key:?} never got {what}; reports: {reports:#?}; now: {now:#?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for(&mut self, key: &v1::RunKey, phase: P) -> v1::RunReport {
        self.wait_until(key, &format!("{phase:?}"), |r| r.phase() == phase)
    }

    /// Waits for a RUNNING report with `health`.
    fn wait_for_health(&mut self, key: &v1::RunKey, health: H) -> v1::RunReport {
        self.wait_until(key, &format!("RUNNING and {health:?}"), |r| {
            r.phase() == P::Running && r.health() == health
        })
    }

    fn kill(&mut self, key: &v1::RunKey) {
        self.supervisor.kill(&[v1::KillRun {
            key: Some(key.clone()),
            grace_ms: 1_000,
            delay_ms: 0,
            ..Default::default()
        }]);
        self.wait_for(key, P::Killed);
    }

    fn sandbox(&self, key: &v1::RunKey) -> PathBuf {
        self.supervisor.sandbox_dir(key)
    }
}

impl Drop for Harness {
    /// A failed test kills its runs, so that servers it started do not
    /// hold their ports into the next run of the tests. (A harness dropped
    /// on purpose leaves them running, as an agent's restart does.)
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let kills: Vec<v1::KillRun> = self
            .seen
            .keys()
            .map(|key| v1::KillRun {
                key: Some(key.clone()),
                grace_ms: 0,
                delay_ms: 0,
                ..Default::default()
            })
            .collect();
        self.supervisor.kill(&kills);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            self.supervisor.poll();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .try_into()
        .expect("fits")
}

/// Lines of a file the checks append to (0 if it does not exist yet).
fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[test]
fn a_passing_command_check_makes_the_run_healthy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("hc-pass", 0);
    // The check runs in the sandbox with the task's environment.
    let mut spec = checked(
        "sleep 600",
        check(
            Kind::Command(
                "[ \"$(pwd)\" = \"$PELOTON_SANDBOX\" ] && [ \"$MY_VAR\" = yes ] && \
                 [ \"$PELOTON_JOB_ID\" = hc-pass ]"
                    .to_owned(),
            ),
            3,
        ),
    );
    spec.env.insert("MY_VAR".to_owned(), "yes".to_owned());
    h.supervisor.launch(&[launch(&k, spec)]);
    h.drain();
    let healthy = h.wait_for_health(&k, H::Healthy);
    assert!(healthy.health_detail.is_empty(), "{healthy:?}");
    assert!(healthy.started_ms > 0);
    // Before the first pass it was never anything but UNKNOWN.
    let reports = h.reports(&k);
    let first_healthy = reports
        .iter()
        .position(|r| r.health() == H::Healthy)
        .expect("a healthy report");
    assert!(
        reports[..first_healthy]
            .iter()
            .all(|r| r.health() == H::Unknown),
        "{reports:#?}"
    );
    // The registration's run list carries the health too.
    let registered = h.registered();
    assert_eq!(registered.len(), 1);
    assert_eq!(registered[0].health(), H::Healthy);
    h.kill(&k);
}

#[test]
fn failures_in_a_row_make_the_run_unhealthy_with_detail_and_one_pass_heals_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("hc-fail", 0);
    // Each check counts itself in `checks`, passes once `ok` exists.
    let line =
        "echo x >> checks; [ -f ok ] && exit 0; echo \"not ready ($(wc -l < checks))\"; exit 1";
    h.supervisor.launch(&[launch(
        &k,
        checked("sleep 600", check(Kind::Command(line.to_owned()), 3)),
    )]);
    let unhealthy = h.wait_for_health(&k, H::Unhealthy);
    let sandbox = h.sandbox(&k);
    // Not before the third failure in a row.
    assert!(lines_in(&sandbox.join("checks")) >= 3);
    assert!(
        unhealthy
            .health_detail
            .starts_with("exited with code 1: not ready ("),
        "{unhealthy:?}"
    );
    let reports = h.reports(&k);
    assert!(
        !reports.iter().any(|r| r.health() == H::Healthy),
        "{reports:#?}"
    );

    std::fs::write(sandbox.join("ok"), "").expect("touch ok");
    let healed = h.wait_for_health(&k, H::Healthy);
    assert!(healed.health_detail.is_empty(), "{healed:?}");
    h.kill(&k);
}

#[test]
fn a_command_check_that_hangs_is_killed_at_its_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("hc-hang", 0);
    let mut hang = check(
        Kind::Command("echo started; sleep 600 & sleep 600".to_owned()),
        1,
    );
    hang.timeout_ms = 200;
    h.supervisor
        .launch(&[launch(&k, checked("sleep 600", hang))]);
    let unhealthy = h.wait_for_health(&k, H::Unhealthy);
    assert_eq!(unhealthy.health_detail, "timed out after 200 ms: started");
    h.kill(&k);
    // The check's whole group went at its timeout; the run's kill swept
    // the rest: nothing of the sandbox is left.
    let sandbox = h.sandbox(&k).display().to_string();
    let marker = format!("PELOTON_SANDBOX={sandbox}");
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rfind(')')
            .is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'));
        if !zombie && environ.split(|&b| b == 0).any(|e| e == marker.as_bytes()) {
            left.push(entry.file_name());
        }
    }
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn an_http_check_against_a_real_server_becomes_healthy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config_with_ports(dir.path(), 47400));
    let served = key("hc-http", 0);
    let missing = key("hc-http", 1);
    let redirected = key("hc-http", 2);
    let server =
        "mkdir -p sub && exec python3 -m http.server \"$PELOTON_PORT_HTTP\" --bind 127.0.0.1";
    let http = |path: &str| {
        check(
            Kind::Http(v1::HttpHealthCheck {
                port: "http".to_owned(),
                path: path.to_owned(),
            }),
            2,
        )
    };
    let mut spec = checked(server, http(""));
    spec.ports = vec![port("http")];
    let mut not_found = checked(server, http("/no-such-page"));
    not_found.ports = vec![port("http")];
    // The server answers `/sub` (a directory) with a 301 to `/sub/`.
    let mut redirect = checked(server, http("/sub"));
    redirect.ports = vec![port("http")];
    h.supervisor.launch(&[
        launch(&served, spec),
        launch(&missing, not_found),
        launch(&redirected, redirect),
    ]);
    let healthy = h.wait_for_health(&served, H::Healthy);
    let assigned = healthy.ports.get("http").copied().expect("the http port");
    assert!((47400..=47409).contains(&assigned), "{healthy:?}");
    // A 404 is a failed check like any other. The first failures may be
    // refused connections (the server starting); only a change of health
    // is reported at once, so the newest detail is read from the
    // registration list, which carries every run's verdict of now.
    h.wait_for_health(&missing, H::Unhealthy);
    let start = Instant::now();
    loop {
        let registered = h.registered();
        let now = registered
            .iter()
            .find(|r| r.key.as_ref() == Some(&missing))
            .expect("registered");
        assert_eq!(now.health(), H::Unhealthy, "{now:?}");
        if now.health_detail.contains("/no-such-page: HTTP 404") {
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "no 404 detail: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    h.wait_for_health(&redirected, H::Healthy);
    for k in [&served, &missing, &redirected] {
        h.kill(k);
    }
}

#[test]
fn tcp_checks_fail_on_a_port_nothing_listens_on_or_a_port_the_task_lacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config_with_ports(dir.path(), 47410));
    let silent = key("hc-tcp", 0);
    let unnamed = key("hc-tcp", 1);
    let mut spec = checked("sleep 600", check(Kind::TcpPort("svc".to_owned()), 2));
    spec.ports = vec![port("svc")];
    let mut other = checked("sleep 600", check(Kind::TcpPort("admin".to_owned()), 2));
    other.ports = vec![port("svc")];
    h.supervisor
        .launch(&[launch(&silent, spec), launch(&unnamed, other)]);
    let unhealthy = h.wait_for_health(&silent, H::Unhealthy);
    let assigned = unhealthy.ports.get("svc").copied().expect("the svc port");
    assert!(
        unhealthy
            .health_detail
            .starts_with(&format!("cannot connect to 127.0.0.1:{assigned}: ")),
        "{unhealthy:?}"
    );
    let unhealthy = h.wait_for_health(&unnamed, H::Unhealthy);
    assert_eq!(
        unhealthy.health_detail,
        "the task has no port named \"admin\" (its ports: [\"svc\"])"
    );
    h.kill(&silent);
    h.kill(&unnamed);
}

#[test]
fn no_check_runs_before_the_initial_delay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("hc-delay", 0);
    const DELAY_MS: u64 = 2_000;
    let mut delayed = check(Kind::Command("date +%s%3N >> checks".to_owned()), 3);
    delayed.initial_delay_ms = DELAY_MS;
    h.supervisor
        .launch(&[launch(&k, checked("sleep 600", delayed))]);
    let running = h.wait_for(&k, P::Running);
    assert_eq!(running.health(), H::Unknown);
    let checks = h.sandbox(&k).join("checks");
    // Well inside the delay: no check yet, no verdict yet.
    while now_ms() < running.started_ms + DELAY_MS / 2 {
        h.supervisor.poll();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!checks.exists());
    assert!(
        h.reports(&k).iter().all(|r| r.health() == H::Unknown),
        "{:#?}",
        h.reports(&k)
    );
    h.wait_for_health(&k, H::Healthy);
    let first: u64 = std::fs::read_to_string(&checks)
        .expect("checks ran")
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a time in ms");
    assert!(
        first >= running.started_ms + DELAY_MS,
        "the first check ran at {first}, before {} + {DELAY_MS}",
        running.started_ms
    );
    h.kill(&k);
}

#[test]
fn a_change_of_health_wakes_the_session_and_is_reported_without_a_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let woken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = woken.clone();
    h.supervisor
        .set_report_waker(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    let k = key("hc-wake", 0);
    h.supervisor.launch(&[launch(
        &k,
        checked("sleep 600", check(Kind::Command("true".to_owned()), 3)),
    )]);
    // The poll that sees RUNNING starts the checker; no poll after it.
    h.wait_for(&k, P::Running);
    let start = Instant::now();
    while !woken.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(start.elapsed() < TIMEOUT, "the waker was never called");
        std::thread::sleep(Duration::from_millis(20));
    }
    let taken = h.supervisor.take_reports(usize::MAX);
    assert_eq!(taken.len(), 1, "{taken:#?}");
    assert_eq!(
        (taken[0].phase(), taken[0].health()),
        (P::Running, H::Healthy)
    );
    h.kill(&k);
}

#[test]
fn a_task_without_a_check_reports_health_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("hc-none", 0);
    h.supervisor.launch(&[launch(&k, shell("sleep 600"))]);
    h.drain();
    h.wait_for(&k, P::Running);
    let registered = h.registered();
    assert_eq!(registered[0].health(), H::None);
    h.kill(&k);
    let reports = h.reports(&k);
    assert!(
        reports
            .iter()
            .all(|r| r.health() == H::None && r.health_detail.is_empty()),
        "{reports:#?}"
    );
}

#[test]
fn checks_stop_when_the_run_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config(dir.path()));
    let k = key("hc-stop", 0);
    h.supervisor.launch(&[launch(
        &k,
        checked(
            "sleep 600",
            check(Kind::Command("echo x >> checks".to_owned()), 3),
        ),
    )]);
    h.wait_for_health(&k, H::Healthy);
    h.kill(&k);
    let checks = h.sandbox(&k).join("checks");
    // A check already running when the kill came may still finish.
    std::thread::sleep(Duration::from_millis(300));
    let after_kill = lines_in(&checks);
    // Several intervals later, nothing more.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(lines_in(&checks), after_kill);
    // And no health report after the final one.
    h.supervisor.poll();
    let reports = h.reports(&k);
    assert_eq!(reports.last().map(v1::RunReport::phase), Some(P::Killed));
}

#[test]
fn a_readopted_run_is_checked_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = key("hc-adopt", 0);
    let line = "[ -f ok ]";
    {
        let mut first = Harness::open(config(dir.path()));
        first.supervisor.launch(&[launch(
            &k,
            checked("sleep 600", check(Kind::Command(line.to_owned()), 2)),
        )]);
        first.wait_for_health(&k, H::Unhealthy);
    }
    // The agent restarted; its checks stopped with it, the task did not.
    let mut second = Harness::open(config(dir.path()));
    let registered = second.registered();
    assert_eq!(registered[0].phase(), P::Running);
    std::fs::write(second.sandbox(&k).join("ok"), "").expect("touch ok");
    second.wait_for_health(&k, H::Healthy);
    second.kill(&k);
}

#[test]
fn ports_appear_in_every_report_from_starting_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(config_with_ports(dir.path(), 47420));
    let k = key("hc-ports", 0);
    let mut spec = shell("echo $PELOTON_PORT_HTTP $PELOTON_PORT_ADMIN");
    spec.ports = vec![port("http"), port("admin")];
    h.supervisor.launch(&[launch(&k, spec)]);
    // Taken before any poll: later phases would replace it in the outbox
    // (the launch returns once the task has executed: RUNNING).
    h.drain();
    h.wait_for(&k, P::Succeeded);
    let reports = h.reports(&k);
    assert_eq!(reports[0].phase(), P::Running);
    let out = std::fs::read_to_string(h.sandbox(&k).join("stdout")).expect("stdout");
    let given: Vec<u32> = out
        .split_whitespace()
        .map(|p| p.parse().expect("a port"))
        .collect();
    let expected: HashMap<String, u32> = [
        ("http".to_owned(), given[0]),
        ("admin".to_owned(), given[1]),
    ]
    .into();
    for report in &reports {
        assert_eq!(report.ports, expected, "{report:?}");
    }
}
