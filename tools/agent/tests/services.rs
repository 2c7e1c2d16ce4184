//! SERVICE jobs and health checks on a real cluster: a real `pelotond` and
//! real `peloton-agent`s on 127.0.0.1 running real processes (HTTP servers
//! in python3, shell loops). Checks that instances are kept running (any
//! exit starts a new run), that health verdicts from the agents reach
//! TaskService and the watch stream, that an unhealthy run is killed and
//! replaced, and that killing a service ends it for good and closes its
//! ports.
//!
//! Every wait polls with a generous deadline; nothing asserts how long
//! anything took.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pb::Health as H;
use pb::JobState as J;
use pb::TaskState as T;
use pb::health_check::Kind;
use peloton_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every event of one job, collected from the watch stream (replayed from
/// the first revision, so nothing before the watch started is missed).
struct JobWatch {
    events: Arc<Mutex<Vec<pb::Event>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl JobWatch {
    async fn start(cluster: &Cluster, job_id: &str) -> JobWatch {
        let mut watch = cluster.c.watch.clone();
        let mut stream = watch
            .watch(pb::WatchRequest {
                from_revision: 1,
                job_id: job_id.into(),
            })
            .await
            .expect("watch")
            .into_inner();
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(message)) = stream.message().await {
                sink.lock().expect("lock").extend(message.events);
            }
        });
        JobWatch { events, reader }
    }

    fn task_events(&self) -> Vec<pb::TaskEvent> {
        let events = self.events.lock().expect("lock");
        events
            .iter()
            .filter_map(|e| match &e.kind {
                Some(pb::event::Kind::Task(t)) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    fn job_states(&self) -> Vec<J> {
        let events = self.events.lock().expect("lock");
        events
            .iter()
            .filter_map(|e| match &e.kind {
                Some(pb::event::Kind::Job(j)) => Some(j.state()),
                _ => None,
            })
            .collect()
    }
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn service(name: &str, n: u32, task: pb::TaskSpec) -> pb::JobSpec {
    pb::JobSpec {
        r#type: pb::JobType::Service as i32,
        ..job(name, n, task)
    }
}

/// Short back-offs, so that restarts come quickly.
fn quick_restarts() -> Option<pb::RestartPolicy> {
    Some(pb::RestartPolicy {
        max_failures: 0,
        backoff_ms: 100,
        max_backoff_ms: 400,
    })
}

/// A python HTTP server on the task's port `http`; the checker allows it a
/// slow start (many failures in a row before a verdict).
fn http_server(check: Kind) -> pb::TaskSpec {
    pb::TaskSpec {
        ports: vec![pb::PortSpec {
            name: "http".into(),
        }],
        health_check: Some(pb::HealthCheck {
            kind: Some(check),
            initial_delay_ms: 0,
            interval_ms: 200,
            timeout_ms: 2_000,
            max_consecutive_failures: 50,
        }),
        restart: quick_restarts(),
        kill_grace_period_ms: 2_000,
        ..task_spec("exec python3 -m http.server \"$PELOTON_PORT_HTTP\" --bind 127.0.0.1")
    }
}

fn http_check() -> Kind {
    Kind::Http(pb::HttpHealthCheck {
        port: "http".into(),
        path: "/".into(),
    })
}

/// The status line of `GET /` on 127.0.0.1:`port`, or why there is none.
async fn http_get(port: u16) -> Result<String, String> {
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// The port named `http` of a task's current run (0 if none).
fn http_port(t: &pb::Task) -> u16 {
    let port = t
        .current
        .as_ref()
        .and_then(|r| r.ports.get("http").copied())
        .unwrap_or(0);
    u16::try_from(port).expect("a port fits in u16")
}

/// Waits until TaskService.List shows all `n` instances of `id` RUNNING,
/// HEALTHY and with a port `http`.
async fn wait_healthy(cluster: &Cluster, id: &str, n: usize) -> Vec<pb::Task> {
    eventually(
        &format!("{n} tasks of {id} running and healthy"),
        async || {
            let tasks = cluster.tasks(id).await;
            let ready = tasks.len() == n
                && tasks.iter().all(|t| {
                    t.current.as_ref().is_some_and(|r| {
                        r.state() == T::Running && r.health() == H::Healthy && http_port(t) != 0
                    })
                });
            ready.then_some(tasks)
        },
    )
    .await
}

/// Kills job `id`, waits for KILLED and checks that none of its processes
/// is left.
async fn kill_and_check_gone(cluster: &Cluster, id: &str) {
    cluster.kill_job(id).await;
    cluster.wait_job(id, J::Killed).await;
    let left = processes_with_env(&format!("PELOTON_JOB_ID={id}"));
    assert!(left.is_empty(), "processes of {id} survived: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_of_http_servers_becomes_healthy_and_answers_on_its_ports() {
    let cluster = Cluster::start(2).await;
    let id = cluster
        .create(service("web", 3, http_server(http_check())))
        .await;
    let watch = JobWatch::start(&cluster, &id).await;
    let tasks = wait_healthy(&cluster, &id, 3).await;
    cluster.wait_job(&id, J::Running).await;
    let mut ports = Vec::new();
    for t in &tasks {
        let run = t.current.as_ref().expect("run");
        assert_eq!(run.run_id, 1, "no restart on the way to healthy: {t:?}");
        assert!(run.host == "a0" || run.host == "a1", "{run:?}");
        let port = http_port(t);
        let status = http_get(port).await;
        assert!(
            status.as_ref().is_ok_and(|s| s.contains(" 200 ")),
            "instance {} on port {port}: {status:?}",
            t.instance
        );
        ports.push(port);
    }
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "one port per instance: {tasks:?}");
    // Each instance's health verdict is in the watch stream too.
    eventually("HEALTHY task events of every instance", async || {
        let events = watch.task_events();
        (0..3)
            .all(|i| {
                events
                    .iter()
                    .any(|e| e.instance == i && e.state() == T::Running && e.health() == H::Healthy)
            })
            .then_some(())
    })
    .await;
    let events = watch.task_events();
    assert!(
        !events.iter().any(|e| e.health() == H::Unhealthy),
        "{events:#?}"
    );
    kill_and_check_gone(&cluster, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_instance_that_exits_starts_again_and_the_job_never_ends() {
    let cluster = Cluster::start(1).await;
    let mut spec = task_spec("sleep 1; exit 0");
    spec.restart = quick_restarts();
    spec.kill_grace_period_ms = 500;
    let mut failing = spec.clone();
    failing.shell = "sleep 1; exit 3".into();
    let mut job_spec = service("exiting", 2, spec);
    job_spec.overrides = vec![pb::InstanceOverride {
        instance: 1,
        spec: Some(failing),
    }];
    let id = cluster.create(job_spec).await;
    let watch = JobWatch::start(&cluster, &id).await;
    let tasks = eventually("both instances on their third run", async || {
        let job = cluster.job(&id).await?;
        let state = job.status.as_ref()?.state();
        assert!(
            !matches!(state, J::Succeeded | J::Failed | J::Killed),
            "a service job ended: {job:#?}"
        );
        let tasks = cluster.tasks(&id).await;
        let third = tasks.len() == 2
            && tasks
                .iter()
                .all(|t| t.current.as_ref().is_some_and(|r| r.run_id >= 3));
        third.then_some(tasks)
    })
    .await;
    for t in &tasks {
        let want = if t.instance == 0 { 0 } else { 3 };
        assert!(t.history.len() >= 2, "{t:#?}");
        for run in &t.history {
            assert_eq!(run.exit_code, want, "instance {}: {run:?}", t.instance);
            assert!(
                run.reason.contains(&format!("exited with code {want}")),
                "instance {}: {run:?}",
                t.instance
            );
            assert!(run.started_at_ms > 0 && run.finished_at_ms >= run.started_at_ms);
        }
        // Runs are numbered without gaps, newest first in the history.
        let ids: Vec<u32> = t.history.iter().map(|r| r.run_id).collect();
        let current = t.current.as_ref().expect("run").run_id;
        let expected: Vec<u32> = (1..current).rev().collect();
        assert_eq!(ids, expected, "instance {}", t.instance);
    }
    // The job is RUNNING whenever one of its instances runs, and never ends.
    cluster.wait_job(&id, J::Running).await;
    let states = watch.job_states();
    assert!(states.contains(&J::Running), "{states:?}");
    assert!(
        !states
            .iter()
            .any(|s| matches!(s, J::Succeeded | J::Failed | J::Killed)),
        "a service job ended: {states:?}"
    );
    kill_and_check_gone(&cluster, &id).await;
    // A kill is the end: no new run after it.
    let tasks = cluster.tasks(&id).await;
    for t in &tasks {
        assert_eq!(t.current.as_ref().expect("run").state(), T::Killed, "{t:?}");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        cluster.tasks(&id).await,
        tasks,
        "a killed service restarted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_job_stays_running_while_its_instance_restarts() {
    let cluster = Cluster::start(1).await;
    let mut spec = task_spec("sleep 0.5; exit 0");
    spec.restart = quick_restarts();
    let id = cluster.create(service("restarting", 1, spec)).await;
    let watch = JobWatch::start(&cluster, &id).await;
    eventually("instance 0 on its third run", async || {
        let run = cluster.task(&id, 0).await?.current?;
        (run.run_id >= 3 && run.state() == T::Running).then_some(())
    })
    .await;
    let states = watch.job_states();
    let first_running = states
        .iter()
        .position(|s| *s == J::Running)
        .unwrap_or_else(|| panic!("never RUNNING: {states:?}"));
    assert!(
        states[first_running..].iter().all(|s| *s == J::Running),
        "the job left RUNNING while its instance restarted: {states:?}"
    );
    kill_and_check_gone(&cluster, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_run_is_killed_and_the_next_run_is_healthy() {
    let cluster = Cluster::start(1).await;
    // The first run finds no marker: it leaves one and stays unhealthy (no
    // `healthy` file in its sandbox). Later runs see the marker and are
    // healthy. The marker lives outside the per-run sandboxes.
    let marker = cluster.dir.path().join("first-run-was-here");
    let mut spec = task_spec(
        "if [ -e \"$MARKER\" ]; then touch healthy; else touch \"$MARKER\"; fi; exec sleep 600",
    );
    spec.env
        .insert("MARKER".into(), marker.to_string_lossy().into_owned());
    spec.health_check = Some(pb::HealthCheck {
        kind: Some(Kind::Command("test -f healthy".into())),
        initial_delay_ms: 0,
        interval_ms: 200,
        timeout_ms: 2_000,
        max_consecutive_failures: 3,
    });
    spec.restart = quick_restarts();
    spec.kill_grace_period_ms = 1_000;
    let id = cluster.create(service("flaky", 1, spec)).await;
    let watch = JobWatch::start(&cluster, &id).await;
    let t = eventually("a later run running and healthy", async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        (run.run_id >= 2 && run.state() == T::Running && run.health() == H::Healthy).then_some(t)
    })
    .await;
    assert!(marker.exists());
    let current = t.current.as_ref().expect("run");
    assert_eq!(
        current.run_id, 2,
        "one unhealthy run, then a healthy one: {t:#?}"
    );
    let first = t.history.iter().find(|r| r.run_id == 1).expect("run 1");
    assert_eq!(first.state(), T::Failed, "{first:?}");
    assert!(first.reason.contains("unhealthy"), "{first:?}");
    assert!(first.finished_at_ms >= first.started_at_ms, "{first:?}");
    assert_eq!(first.host, current.host, "one host: {t:#?}");
    // The first run's process tree is gone (its sandbox's only process
    // would be `sleep 600`); the new run's is alive.
    let sandboxes = cluster.sandboxes();
    let run_dir = |run: u32| {
        sandboxes
            .iter()
            .find(|(_, name, _)| name.starts_with(&format!("{id}-0-{run}-")))
            .map(|(_, _, path)| path.clone())
            .unwrap_or_else(|| panic!("no sandbox of run {run}: {sandboxes:?}"))
    };
    let in_sandbox =
        |run: u32| processes_with_env(&format!("PELOTON_SANDBOX={}", run_dir(run).display()));
    assert!(
        in_sandbox(1).is_empty(),
        "run 1 survived: {:?}",
        in_sandbox(1)
    );
    assert!(!in_sandbox(2).is_empty(), "run 2 is not running");
    // The watch stream saw run 1 turn UNHEALTHY and run 2 turn HEALTHY.
    eventually("run 2's HEALTHY event", async || {
        let events = watch.task_events();
        events
            .iter()
            .any(|e| e.run_id == 2 && e.health() == H::Healthy)
            .then_some(())
    })
    .await;
    let events = watch.task_events();
    let unhealthy = events
        .iter()
        .find(|e| e.run_id == 1 && e.health() == H::Unhealthy)
        .unwrap_or_else(|| panic!("no UNHEALTHY event of run 1: {events:#?}"));
    assert!(unhealthy.reason.contains("unhealthy"), "{unhealthy:?}");
    assert!(
        !events
            .iter()
            .any(|e| e.run_id == 2 && e.health() == H::Unhealthy),
        "{events:#?}"
    );
    kill_and_check_gone(&cluster, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_service_kills_every_instance_and_closes_its_ports() {
    let cluster = Cluster::start(2).await;
    let id = cluster
        .create(service(
            "doomed",
            2,
            http_server(Kind::TcpPort("http".into())),
        ))
        .await;
    let tasks = wait_healthy(&cluster, &id, 2).await;
    let ports: Vec<u16> = tasks.iter().map(http_port).collect();
    for &port in &ports {
        let status = http_get(port).await;
        assert!(
            status.as_ref().is_ok_and(|s| s.contains(" 200 ")),
            "port {port}: {status:?}"
        );
    }
    kill_and_check_gone(&cluster, &id).await;
    let tasks = cluster.tasks(&id).await;
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        let run = t.current.as_ref().expect("run");
        assert_eq!((run.run_id, run.state()), (1, T::Killed), "{t:?}");
        assert!(!t.stopping, "{t:?}");
    }
    // KILLED means the agents confirmed the ends: nothing listens any more.
    for &port in &ports {
        let status = http_get(port).await;
        assert!(status.is_err(), "port {port} still answers: {status:?}");
    }
    let job = cluster.job(&id).await.expect("job");
    assert_eq!(job.status.expect("status").state(), J::Killed);
}

/// A deregistration delay on a real cluster: killed, the instance is shown
/// stopping at once (KILLED in the books, `stopping`, a "deregistration
/// delay" event) while its server still answers; its agent sends SIGTERM
/// only after the delay, and the run's `finished_at_ms` is when it really
/// ended, not when it was told to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_delay_shows_the_instance_stopping_before_its_port_closes() {
    let cluster = Cluster::start(1).await;
    let delay_ms = 5_000;
    let mut task = http_server(Kind::TcpPort("http".into()));
    task.shutdown_delay_ms = delay_ms;
    let id = cluster.create(service("draining", 1, task)).await;
    let watch = JobWatch::start(&cluster, &id).await;
    let tasks = wait_healthy(&cluster, &id, 1).await;
    let port = http_port(&tasks[0]);
    let killed_ms = epoch_ms();
    cluster.kill_job(&id).await;
    let t = cluster.task(&id, 0).await.expect("task");
    let run = t.current.as_ref().expect("run");
    assert_eq!(run.state(), T::Killed, "{t:?}");
    assert!(t.stopping, "shown stopping at once: {t:?}");
    // Clients that have not caught up yet are still served.
    let status = http_get(port).await;
    assert!(
        status.as_ref().is_ok_and(|s| s.contains(" 200 ")),
        "closed before its delay: {status:?}"
    );
    cluster.wait_job(&id, J::Killed).await;
    assert!(http_get(port).await.is_err(), "port {port} still answers");
    let t = cluster.task(&id, 0).await.expect("task");
    let run = t.current.as_ref().expect("run");
    assert!(!t.stopping, "{t:?}");
    assert!(
        run.finished_at_ms >= killed_ms + delay_ms,
        "finished {} ms after the kill, within its delay: {t:?}",
        run.finished_at_ms.saturating_sub(killed_ms)
    );
    let events = watch.task_events();
    assert!(
        events
            .iter()
            .any(|e| e.reason == format!("stopping: deregistration delay {delay_ms} ms")),
        "{events:#?}"
    );
}

/// Milliseconds since the epoch, the clock servers and agents date with.
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .try_into()
        .expect("fits")
}
