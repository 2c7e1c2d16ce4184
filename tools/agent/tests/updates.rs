//! Rolling updates and SLA-aware drains of services on a real cluster: a
//! real `pelotond` and real `peloton-agent`s on 127.0.0.1 running python3
//! HTTP servers whose health the agents check. Each instance writes its
//! version (`$VERSION`) into its sandbox and serves it, so `GET /version`
//! on its port says which spec answers.
//!
//! Checks, with TaskService.List sampled all along (every ~50 ms): an
//! update never has more than `batch_size` instances down (not RUNNING and
//! HEALTHY, or being stopped) and ends with every instance on the new
//! version; a spec whose health check never passes rolls back by itself;
//! pause, resume and abort on a real update; an update that survives a
//! SIGKILL of the server (running tasks adopted, no instance run twice at
//! once); a drain that never takes more than `max_unavailable_instances`
//! of a service down.
//!
//! Every wait polls with a generous deadline; nothing asserts how long
//! anything took.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pb::Health as H;
use pb::TaskState as T;
use pb::UpdateState as U;
use pb::health_check::Kind;
use pb::update_service_client::UpdateServiceClient;
use peloton_gateway::client::Authed;
use peloton_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

/// Writes `$VERSION` where the server serves it, then serves the sandbox.
const SERVE: &str = "printf %s \"$VERSION\" > version && \
     exec python3 -m http.server \"$PELOTON_PORT_HTTP\" --bind 127.0.0.1";

/// [`SERVE`], plus a record of when the run started and was last alive
/// (a loop in the run's process group, so it dies with the run; `alive` is
/// replaced by a rename, so a reader never sees it half-written).
const SERVE_AND_RECORD: &str = "date +%s%N > start; \
     (while true; do date +%s%N > alive.new && mv alive.new alive; sleep 0.1; done) & \
     printf %s \"$VERSION\" > version && \
     exec python3 -m http.server \"$PELOTON_PORT_HTTP\" --bind 127.0.0.1";

/// A service of `n` python HTTP servers answering `version` on
/// `GET /version`, which is also their health check (every 200 ms; 15
/// failures in a row, 3 s, allow python a slow start on a busy machine).
fn web(n: u32, version: &str) -> pb::JobSpec {
    let mut task = task_spec(SERVE);
    task.env.insert("VERSION".into(), version.into());
    task.ports = vec![pb::PortSpec {
        name: "http".into(),
    }];
    task.health_check = Some(pb::HealthCheck {
        kind: Some(Kind::Http(pb::HttpHealthCheck {
            port: "http".into(),
            path: "/version".into(),
        })),
        initial_delay_ms: 0,
        interval_ms: 200,
        timeout_ms: 2_000,
        max_consecutive_failures: 15,
    });
    task.restart = Some(pb::RestartPolicy {
        max_failures: 0,
        backoff_ms: 100,
        max_backoff_ms: 400,
    });
    task.kill_grace_period_ms = 2_000;
    pb::JobSpec {
        r#type: pb::JobType::Service as i32,
        ..job("web", n, task)
    }
}

fn task_of(spec: &mut pb::JobSpec) -> &mut pb::TaskSpec {
    spec.default_task.as_mut().expect("default task")
}

/// A healthy update: a batch at a time, with a few retries so that one
/// slow python start does not fail it.
fn rolling(batch_size: u32) -> pb::UpdateSpec {
    pb::UpdateSpec {
        batch_size,
        max_instance_retries: 2,
        ..Default::default()
    }
}

fn updates(cluster: &Cluster) -> UpdateServiceClient<Authed> {
    UpdateServiceClient::new(cluster.channel())
}

async fn create_update(
    updates: &UpdateServiceClient<Authed>,
    job_id: &str,
    spec: pb::JobSpec,
    how: pb::UpdateSpec,
) -> pb::Update {
    updates
        .clone()
        .create(pb::UpdateJobRequest {
            job_id: job_id.into(),
            version: 0,
            spec: Some(spec),
            update: Some(how),
        })
        .await
        .expect("create update")
        .into_inner()
        .update
        .expect("update")
}

/// The update, or None while the server does not answer.
async fn get_update(updates: &UpdateServiceClient<Authed>, id: &str) -> Option<pb::Update> {
    updates
        .clone()
        .get(pb::GetUpdateRequest { id: id.into() })
        .await
        .ok()
        .and_then(|r| r.into_inner().update)
}

async fn act(
    updates: &UpdateServiceClient<Authed>,
    id: &str,
    action: &str,
) -> Result<pb::Update, tonic::Status> {
    let mut u = updates.clone();
    let request = pb::UpdateActionRequest { id: id.into() };
    let answer = match action {
        "pause" => u.pause(request).await?,
        "resume" => u.resume(request).await?,
        "abort" => u.abort(request).await?,
        other => panic!("no action {other}"),
    };
    Ok(answer.into_inner().update.expect("update"))
}

fn status(u: &pb::Update) -> pb::UpdateStatus {
    u.status.clone().expect("update status")
}

/// Polls the update until `want`; any other end state fails the test.
async fn wait_update(updates: &UpdateServiceClient<Authed>, id: &str, want: U) -> pb::Update {
    eventually(&format!("update {id} {want:?}"), async || {
        let u = get_update(updates, id).await?;
        let state = status(&u).state();
        if state == want {
            return Some(u);
        }
        assert!(
            !matches!(state, U::Succeeded | U::Failed | U::RolledBack | U::Aborted),
            "update ended {state:?}, not {want:?}: {:?}",
            u.status
        );
        None
    })
    .await
}

/// Polls the update until `done` of its instances are done.
async fn wait_done(updates: &UpdateServiceClient<Authed>, id: &str, done: u32) -> pb::Update {
    eventually(
        &format!("{done} instances of update {id} done"),
        async || {
            let u = get_update(updates, id).await?;
            (status(&u).instances_done >= done).then_some(u)
        },
    )
    .await
}

/// Running its current run, healthy, and not being stopped.
fn available(t: &pb::Task) -> bool {
    !t.stopping
        && t.current
            .as_ref()
            .is_some_and(|r| r.state() == T::Running && r.health() == H::Healthy)
}

/// Running and not being stopped, whatever its health.
fn running(t: &pb::Task) -> bool {
    !t.stopping && t.current.as_ref().is_some_and(|r| r.state() == T::Running)
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

fn run_of(t: &pb::Task) -> &pb::TaskRun {
    t.current.as_ref().expect("a current run")
}

/// One line per instance, for assertion messages.
fn summary(tasks: &[pb::Task]) -> String {
    tasks
        .iter()
        .map(|t| {
            let run = t.current.clone().unwrap_or_default();
            format!(
                "\n  {} v{} run {} {:?} {:?} on {:?}{}",
                t.instance,
                t.config_version,
                run.run_id,
                run.state(),
                run.health(),
                run.host,
                if t.stopping { " stopping" } else { "" }
            )
        })
        .collect()
}

/// One line per run of a task, newest first, for assertion messages.
fn runs(t: &pb::Task) -> String {
    t.current
        .iter()
        .chain(&t.history)
        .map(|r| {
            format!(
                "\n  run {} {:?} {:?} on {:?} created {} started {} finished {}: {}",
                r.run_id,
                r.state(),
                r.health(),
                r.host,
                r.created_at_ms,
                r.started_at_ms,
                r.finished_at_ms,
                r.reason
            )
        })
        .collect()
}

/// The stderr of each failed run of `t`, read from its sandbox, for
/// assertion messages: why a run exited is in its own words there.
fn failed_stderr(cluster: &Cluster, job_id: &str, t: &pb::Task) -> String {
    let mut out = String::new();
    for r in t.history.iter().filter(|r| r.state() == T::Failed) {
        let prefix = format!("{job_id}-{}-{}-", t.instance, r.run_id);
        for (agent, name, path) in cluster.sandboxes() {
            if name.starts_with(&prefix) {
                let text = std::fs::read_to_string(path.join("stderr")).unwrap_or_default();
                out.push_str(&format!("\n  stderr of {agent}/{name}:\n{text}"));
            }
        }
    }
    out
}

/// Waits until all `n` instances of `id` run config version `version`,
/// RUNNING and HEALTHY, each with its port.
async fn wait_on_version(cluster: &Cluster, id: &str, n: usize, version: u64) -> Vec<pb::Task> {
    eventually(
        &format!("{n} instances of {id} healthy on version {version}"),
        async || {
            let tasks = cluster.tasks(id).await;
            let ready = tasks.len() == n
                && tasks
                    .iter()
                    .all(|t| available(t) && t.config_version == version && http_port(t) != 0);
            ready.then_some(tasks)
        },
    )
    .await
}

/// Status line and body of `GET path` on 127.0.0.1:`port`.
async fn http_get(port: u16, path: &str) -> Result<(String, String), String> {
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    Ok((status, body.to_string()))
}

/// Every instance answers `GET /version` on its port with the version its
/// task says it runs.
async fn check_answers(tasks: &[pb::Task]) {
    for t in tasks {
        let port = http_port(t);
        let answer = http_get(port, "/version").await;
        let want = t.config_version.to_string();
        assert!(
            answer
                .as_ref()
                .is_ok_and(|(status, body)| status.contains(" 200 ") && *body == want),
            "instance {} (config version {}) on port {port}: {answer:?}",
            t.instance,
            t.config_version
        );
    }
}

/// The most instances of a job seen down at once (not `up`) in
/// TaskService.List, sampled every ~10 ms from a task of its own until
/// dropped, and the tasks of that sample.
struct DownSampler {
    worst: Arc<Mutex<(usize, Vec<pb::Task>)>>,
    reader: tokio::task::JoinHandle<()>,
}

impl DownSampler {
    fn start(cluster: &Cluster, job_id: &str, n: usize, up: fn(&pb::Task) -> bool) -> DownSampler {
        let worst = Arc::new(Mutex::new((0, Vec::new())));
        let sink = worst.clone();
        let mut tasks = cluster.c.tasks.clone();
        let request = pb::ListTasksRequest {
            job_id: job_id.into(),
            ..Default::default()
        };
        let reader = tokio::spawn(async move {
            loop {
                // While the server is down there is nothing to sample.
                if let Ok(answer) = tasks.list(request.clone()).await {
                    let tasks = answer.into_inner().tasks;
                    let up = tasks.iter().filter(|t| up(t)).count();
                    let down = n.saturating_sub(up);
                    let mut worst = sink.lock().expect("lock");
                    if down > worst.0 {
                        *worst = (down, tasks);
                    }
                }
                // Often: a replaced instance is down only from its kill to
                // its new task's exec, tens of milliseconds.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        DownSampler { worst, reader }
    }

    /// Checks that at most `limit` instances were down at once, and that
    /// the sampler saw some down (it watched something move).
    fn check(self, limit: usize, what: &str) {
        let (worst, tasks) = self.worst.lock().expect("lock").clone();
        assert!(
            worst <= limit,
            "{what}: {worst} instances down at once (at most {limit}):{}",
            summary(&tasks)
        );
        assert!(worst >= 1, "{what}: the sampler never saw an instance down");
    }
}

impl Drop for DownSampler {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The task events of one job from the watch stream (replayed from the
/// first revision), collected from a task of its own until dropped.
struct TaskWatch {
    events: Arc<Mutex<Vec<pb::TaskEvent>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl TaskWatch {
    async fn start(cluster: &Cluster, job_id: &str) -> TaskWatch {
        let mut stream = cluster
            .c
            .watch
            .clone()
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
                let tasks = message.events.into_iter().filter_map(|e| match e.kind {
                    Some(pb::event::Kind::Task(t)) => Some(t),
                    _ => None,
                });
                sink.lock().expect("lock").extend(tasks);
            }
        });
        TaskWatch { events, reader }
    }

    fn task_events(&self) -> Vec<pb::TaskEvent> {
        self.events.lock().expect("lock").clone()
    }
}

impl Drop for TaskWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Launch ids of each instance's current run, by instance.
fn launches(tasks: &[pb::Task]) -> Vec<(u32, u64)> {
    tasks
        .iter()
        .map(|t| (t.instance, t.current.as_ref().map_or(0, |r| r.launch_id)))
        .collect()
}

fn config_versions(tasks: &[pb::Task]) -> Vec<u64> {
    tasks.iter().map(|t| t.config_version).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_keeps_at_most_a_batch_down_and_a_failing_one_rolls_back_by_itself() {
    let cluster = Cluster::start(2).await;
    let updates = updates(&cluster);
    let id = cluster.create(web(6, "1")).await;
    let v1 = wait_on_version(&cluster, &id, 6, 1).await;
    check_answers(&v1).await;

    // v1 -> v2, two at a time.
    let sampler = DownSampler::start(&cluster, &id, 6, available);
    let u2 = create_update(&updates, &id, web(6, "2"), rolling(2)).await;
    assert_eq!((u2.from_version, u2.to_version), (1, 2), "{u2:?}");
    let done = status(&wait_update(&updates, &u2.id, U::Succeeded).await);
    assert_eq!(
        (done.instances_done, done.instances_total),
        (6, 6),
        "{done:?}"
    );
    assert!(
        done.instances_in_progress.is_empty() && done.instances_failed.is_empty(),
        "{done:?}"
    );
    let v2 = wait_on_version(&cluster, &id, 6, 2).await;
    sampler.check(2, "update to v2");
    check_answers(&v2).await;
    // Every instance runs a new process.
    for (old, new) in launches(&v1).iter().zip(launches(&v2)) {
        assert_ne!(*old, new, "an instance was not replaced:{}", summary(&v2));
    }
    let job = cluster.job(&id).await.expect("job");
    let job_status = job.status.expect("status");
    assert_eq!(job_status.config_version, 2);
    assert_eq!(job_status.update_id, u2.id);

    // v3 serves nothing: its health check never passes, its first instance
    // fails, and the update rolls back to v2 by itself.
    let sampler = DownSampler::start(&cluster, &id, 6, available);
    let watch = TaskWatch::start(&cluster, &id).await;
    let mut v3 = web(6, "3");
    task_of(&mut v3).shell = "exec sleep 600".into();
    let u3 = create_update(
        &updates,
        &id,
        v3,
        pb::UpdateSpec {
            batch_size: 2,
            rollback_on_failure: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!((u3.from_version, u3.to_version), (2, 3), "{u3:?}");
    let back = status(&wait_update(&updates, &u3.id, U::RolledBack).await);
    assert!(back.reason.contains("failed"), "{back:?}");
    let tasks = wait_on_version(&cluster, &id, 6, 2).await;
    sampler.check(2, "update to v3 and its rollback");
    check_answers(&tasks).await;
    let job = cluster.job(&id).await.expect("job");
    assert_eq!(job.status.expect("status").config_version, 2);
    // A v3 run was found unhealthy and failed. (The run's record in the
    // task's history does not say so: the rollback killed it during its
    // back-off, and a kill is what a run's record keeps.)
    let events = watch.task_events();
    assert!(
        events.iter().any(|e| e.health() == H::Unhealthy
            && e.state() == T::Running
            && e.reason.contains("unhealthy")),
        "no UNHEALTHY event: {events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.state() == T::Failed && e.reason.contains("unhealthy")),
        "no run FAILED as unhealthy: {events:#?}"
    );
    let list = updates
        .clone()
        .list(pb::ListUpdatesRequest { job_id: id.clone() })
        .await
        .expect("list updates")
        .into_inner()
        .updates;
    let ids: Vec<&str> = list.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(ids, [u3.id.as_str(), u2.id.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_pauses_and_resumes_and_an_aborted_one_leaves_instances_as_they_are() {
    let cluster = Cluster::start(2).await;
    let updates = updates(&cluster);
    let id = cluster.create(web(6, "1")).await;
    let v1 = wait_on_version(&cluster, &id, 6, 1).await;
    let sampler = DownSampler::start(&cluster, &id, 6, available);

    // Created paused: nothing moves.
    let u = create_update(
        &updates,
        &id,
        web(6, "2"),
        pb::UpdateSpec {
            start_paused: true,
            ..rolling(1)
        },
    )
    .await;
    assert_eq!(status(&u).state(), U::Paused, "{u:?}");
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let tasks = cluster.tasks(&id).await;
        assert_eq!(launches(&tasks), launches(&v1), "{}", summary(&tasks));
        assert!(tasks.iter().all(|t| t.config_version == 1 && available(t)));
        let u = get_update(&updates, &u.id).await.expect("update");
        assert_eq!(status(&u).state(), U::Paused, "{u:?}");
    }

    // Resumed, then paused mid-way: the batch in flight finishes, no
    // instance moves to v2 after it.
    act(&updates, &u.id, "resume").await.expect("resume");
    wait_done(&updates, &u.id, 2).await;
    let paused = act(&updates, &u.id, "pause").await.expect("pause");
    let paused_status = status(&paused);
    assert_eq!(
        (paused_status.state(), paused_status.paused_from()),
        (U::Paused, U::RollingForward),
        "{paused_status:?}"
    );
    let at_pause = config_versions(&cluster.tasks(&id).await);
    let moved = at_pause.iter().filter(|&&v| v == 2).count();
    assert!((2..6).contains(&moved), "{at_pause:?}");
    let settled = eventually("every instance healthy while paused", async || {
        let tasks = cluster.tasks(&id).await;
        (tasks.len() == 6 && tasks.iter().all(available)).then_some(tasks)
    })
    .await;
    for _ in 0..10 {
        let tasks = cluster.tasks(&id).await;
        assert_eq!(config_versions(&tasks), at_pause, "{}", summary(&tasks));
        assert_eq!(launches(&tasks), launches(&settled), "{}", summary(&tasks));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_answers(&settled).await;
    act(&updates, &u.id, "resume").await.expect("resume");
    wait_update(&updates, &u.id, U::Succeeded).await;
    let v2 = wait_on_version(&cluster, &id, 6, 2).await;
    sampler.check(1, "the paused and resumed update");
    check_answers(&v2).await;

    // Another update, aborted mid-way: instances keep what they run.
    let u3 = create_update(&updates, &id, web(6, "3"), rolling(1)).await;
    wait_done(&updates, &u3.id, 2).await;
    let aborted = status(&act(&updates, &u3.id, "abort").await.expect("abort"));
    assert_eq!(aborted.state(), U::Aborted, "{aborted:?}");
    assert!(aborted.reason.contains("aborted"), "{aborted:?}");
    let at_abort = config_versions(&cluster.tasks(&id).await);
    assert!(
        at_abort.contains(&2) && at_abort.contains(&3),
        "{at_abort:?}"
    );
    let settled = eventually("every instance healthy after the abort", async || {
        let tasks = cluster.tasks(&id).await;
        (tasks.len() == 6 && tasks.iter().all(available)).then_some(tasks)
    })
    .await;
    for _ in 0..10 {
        let tasks = cluster.tasks(&id).await;
        assert_eq!(config_versions(&tasks), at_abort, "{}", summary(&tasks));
        assert_eq!(launches(&tasks), launches(&settled), "{}", summary(&tasks));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each answers with the version it runs: some 2, some 3.
    check_answers(&settled).await;
    let u3_now = get_update(&updates, &u3.id).await.expect("update");
    assert_eq!(status(&u3_now).state(), U::Aborted);
    let err = act(&updates, &u3.id, "pause").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
}

/// Start and last-alive times of every run of every instance of `job_id`,
/// as the runs recorded them in their sandboxes: (start, alive, sandbox).
fn run_intervals(cluster: &Cluster, job_id: &str) -> BTreeMap<u32, Vec<(u128, u128, String)>> {
    let mut out: BTreeMap<u32, Vec<(u128, u128, String)>> = BTreeMap::new();
    for (agent, name, path) in cluster.sandboxes() {
        let Some(rest) = name.strip_prefix(&format!("{job_id}-")) else {
            continue;
        };
        let instance: u32 = rest
            .split('-')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("instance in a sandbox name");
        let read = |f: &str| -> Option<u128> {
            std::fs::read_to_string(path.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (Some(start), Some(alive)) = (read("start"), read("alive")) else {
            continue; // never got to run its first lines
        };
        out.entry(instance)
            .or_default()
            .push((start, alive, format!("{agent}/{name}")));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_goes_on_after_a_server_sigkill_and_the_agents_keep_their_tasks() {
    let mut cluster = Cluster::start(2).await;
    let updates = updates(&cluster);
    let mut v1 = web(6, "1");
    task_of(&mut v1).shell = SERVE_AND_RECORD.into();
    let mut v2 = v1.clone();
    task_of(&mut v2).env.insert("VERSION".into(), "2".into());
    let id = cluster.create(v1).await;
    wait_on_version(&cluster, &id, 6, 1).await;

    // Counted by state only: a restarted server knows no health verdict
    // until the agents send theirs again (it shows HEALTH_NONE meanwhile).
    let sampler = DownSampler::start(&cluster, &id, 6, running);
    let u = create_update(&updates, &id, v2, rolling(1)).await;
    wait_done(&updates, &u.id, 2).await;
    let before = cluster.tasks(&id).await;
    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    cluster.start_server().await;
    let done = status(&wait_update(&updates, &u.id, U::Succeeded).await);
    assert_eq!(done.instances_done, 6, "{done:?}");
    let after = wait_on_version(&cluster, &id, 6, 2).await;
    sampler.check(1, "the update across the crash");
    check_answers(&after).await;

    // Instances done before the crash were adopted: same run, same process.
    for (b, a) in before.iter().zip(&after) {
        if b.config_version == 2 && available(b) {
            let (rb, ra) = (run_of(b), run_of(a));
            assert_eq!(
                (rb.run_id, rb.launch_id, &rb.host, http_port(b)),
                (ra.run_id, ra.launch_id, &ra.host, http_port(a)),
                "instance {} was not adopted:{}",
                a.instance,
                summary(&after)
            );
        }
    }
    // One run on v1 and one on v2, plus one per run that failed its health
    // check (a slow start on a busy machine): nothing else restarted.
    for t in &after {
        let slow_starts = t
            .history
            .iter()
            .filter(|r| r.state() == T::Failed && r.reason.starts_with("unhealthy"))
            .count();
        let expected = 2 + u32::try_from(slow_starts).expect("few runs");
        assert_eq!(
            run_of(t).run_id,
            expected,
            "instance {}:{}{}",
            t.instance,
            runs(t),
            failed_stderr(&cluster, &id, t)
        );
        let killed = t.history.iter().filter(|r| r.state() == T::Killed).count();
        assert_eq!(killed, 1, "instance {}:{}", t.instance, runs(t));
    }
    // The sandboxes' own records: runs of an instance never overlapped,
    // and only the current run of each instance has processes left.
    let runs = run_intervals(&cluster, &id);
    assert_eq!(runs.len(), 6, "{runs:?}");
    for (instance, mut rs) in runs {
        rs.sort();
        assert!(rs.len() >= 2, "instance {instance}: {rs:?}");
        for w in rs.windows(2) {
            assert!(
                w[0].1 < w[1].0,
                "instance {instance} ran twice at once: {w:?}"
            );
        }
    }
    let mut live = BTreeMap::<u32, Vec<String>>::new();
    for (_, name, path) in cluster.sandboxes() {
        let Some(rest) = name.strip_prefix(&format!("{id}-")) else {
            continue;
        };
        if !processes_with_env(&format!("PELOTON_SANDBOX={}", path.display())).is_empty() {
            let instance = rest.split('-').next().and_then(|i| i.parse().ok());
            live.entry(instance.expect("instance"))
                .or_default()
                .push(name);
        }
    }
    for (instance, sandboxes) in &live {
        assert_eq!(sandboxes.len(), 1, "instance {instance}: {sandboxes:?}");
        let run = run_of(&after[*instance as usize]).run_id;
        let current = format!("{id}-{instance}-{run}-");
        assert!(sandboxes[0].starts_with(&current), "{sandboxes:?}");
    }
    assert_eq!(
        live.len(),
        6,
        "an instance has no process left: {live:?}{}",
        summary(&cluster.tasks(&id).await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_takes_at_most_max_unavailable_instances_of_a_service_down() {
    // Every instance starts on a0, the only host; a1 comes afterwards.
    let mut cluster = Cluster::start(1).await;
    let mut spec = web(4, "1");
    spec.sla.as_mut().expect("sla").max_unavailable_instances = 1;
    let id = cluster.create(spec).await;
    let before = wait_on_version(&cluster, &id, 4, 1).await;
    assert!(
        before.iter().all(|t| run_of(t).host == "a0"),
        "{}",
        summary(&before)
    );
    cluster.start_agent("a1").await;
    cluster.wait_hosts_up(2).await;

    let sampler = DownSampler::start(&cluster, &id, 4, available);
    let mut hosts = cluster.c.hosts.clone();
    hosts
        .start_maintenance(pb::StartMaintenanceRequest {
            hosts: vec!["a0".into()],
        })
        .await
        .expect("drain");
    eventually("a0 down once empty", async || {
        let hosts = cluster.hosts().await;
        let a0 = hosts.iter().find(|h| h.name == "a0")?;
        (a0.state() == pb::HostState::Down && a0.tasks.is_empty()).then_some(())
    })
    .await;
    let after = wait_on_version(&cluster, &id, 4, 1).await;
    sampler.check(1, "the drain of a0");
    let sandboxes = format!("PELOTON_SANDBOX={}", cluster.work_dir("a0").display());
    let left = processes_with_env(&sandboxes);
    assert!(left.is_empty(), "processes left on a0: {left:?}");
    check_answers(&after).await;
    for t in &after {
        assert_eq!(run_of(t).host, "a1", "instance {}:{}", t.instance, runs(t));
        // Its last run on a0 was stopped by the drain.
        let drained = t
            .history
            .iter()
            .find(|r| r.host == "a0")
            .expect("a run on a0");
        assert_eq!(
            drained.state(),
            T::Preempted,
            "instance {}:{}",
            t.instance,
            runs(t)
        );
        assert!(
            drained.reason.contains("drained"),
            "instance {}:{}",
            t.instance,
            runs(t)
        );
    }
}
