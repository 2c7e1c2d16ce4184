//! The application API (`ApplicationService`) through the real server on
//! simulated hosts: registration, targets with generations, kills, the
//! executor event stream, pending executors and their reasons, preemption
//! reported as not the application's fault, cluster mode, restarts, and
//! refusals that name the field.

mod common;

use common::*;
use pb::ExecutorExitCause as Cause;
use pb::executor_event::Kind;
use peloton_proto::v1 as pb;
use tonic::Code;

/// An executor of `cpu` cores that "runs" until it is stopped.
fn executor(cpu: f64) -> pb::TaskSpec {
    pb::TaskSpec {
        shell: "exec java -cp jars/* Executor --executor-id $PELOTON_INSTANCE_ID".into(),
        resources: Some(res(cpu, 256.0)),
        sim: Some(pb::SimSpec {
            duration_ms: 3_600_000,
            exit_code: 0,
        }),
        stop_signal: "SIGPWR".into(),
        memory_limit: pb::MemoryLimit::Resident as i32,
        ..Default::default()
    }
}

fn register_request(pool: &str, cpu: f64) -> pb::RegisterAppRequest {
    pb::RegisterAppRequest {
        name: "pi".into(),
        owner: "tests".into(),
        pool: pool.into(),
        driver_url: "spark://CoarseGrainedScheduler@127.0.0.1:7078".into(),
        executor: Some(executor(cpu)),
        max_executors: 200,
        ..Default::default()
    }
}

async fn register(c: &mut Clients, r: pb::RegisterAppRequest) -> pb::Application {
    c.apps
        .register(r)
        .await
        .expect("register")
        .into_inner()
        .app
        .expect("app")
}

async fn get_app(c: &mut Clients, id: &str) -> pb::Application {
    c.apps
        .get(pb::GetAppRequest { app_id: id.into() })
        .await
        .expect("get app")
        .into_inner()
        .app
        .expect("app")
}

async fn set_target(
    c: &mut Clients,
    id: &str,
    generation: u64,
    total: u32,
) -> pb::SetExecutorTargetResponse {
    c.apps
        .set_executor_target(pb::SetExecutorTargetRequest {
            app_id: id.into(),
            generation,
            total,
        })
        .await
        .expect("target")
        .into_inner()
}

async fn wait_app(
    c: &mut Clients,
    id: &str,
    what: &str,
    ok: impl Fn(&pb::Application) -> bool,
) -> pb::Application {
    let mut c = c.clone();
    eventually(what, TIMEOUT, async || {
        let app = get_app(&mut c, id).await;
        if ok(&app) {
            Ok(app)
        } else {
            Err(format!("{app:#?}"))
        }
    })
    .await
}

/// The application's executor events, from now.
async fn watch(c: &mut Clients, id: &str) -> tonic::Streaming<pb::WatchExecutorsResponse> {
    c.apps
        .watch_executors(pb::WatchExecutorsRequest {
            app_id: id.into(),
            from_revision: 0,
        })
        .await
        .expect("watch")
        .into_inner()
}

/// Executor events until `done` holds for those collected.
async fn collect(
    stream: &mut tonic::Streaming<pb::WatchExecutorsResponse>,
    got: &mut Vec<pb::ExecutorEvent>,
    done: impl Fn(&[pb::ExecutorEvent]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !done(got) {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => panic!("timed out collecting executor events; got {got:#?}"),
            Ok(Err(e)) => panic!("executor stream failed: {e:?}"),
            Ok(Ok(None)) => panic!("executor stream ended; got {got:#?}"),
            Ok(Ok(Some(r))) => got.extend(r.events),
        }
    }
}

fn launched(events: &[pb::ExecutorEvent]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| matches!(e.kind, Some(Kind::Launched(_))))
        .map(|e| e.executor_id.as_str())
        .collect()
}

fn exits(events: &[pb::ExecutorEvent]) -> Vec<(&str, &pb::ExecutorExited)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Exited(x)) => Some((e.executor_id.as_str(), x)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_follow_the_target_and_the_stream_tells_their_story() {
    let s = TestServer::start(4).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/spark", pool_spec(0.0, 0.0)).await;
    let app = register(&mut c, register_request("/spark", 1.0)).await;
    assert_eq!((app.target, app.generation, app.running), (0, 0, 0));
    assert!(app.registered && !app.driver_in_job);
    assert_eq!(app.name, "pi");
    let job = get_job(&mut c, &app.id).await.expect("its job");
    assert_eq!(
        job.spec.as_ref().expect("spec").r#type,
        pb::JobType::Application as i32
    );

    let mut stream = watch(&mut c, &app.id).await;
    let mut events = Vec::new();

    // Up to 3: three executors launch, with ids 0, 1, 2.
    let t = set_target(&mut c, &app.id, 1, 3).await;
    assert_eq!((t.applied, t.target, t.generation), (true, 3, 1));
    collect(&mut stream, &mut events, |e| launched(e).len() == 3).await;
    let mut ids = launched(&events);
    ids.sort_unstable();
    assert_eq!(ids, ["0", "1", "2"]);
    let a = wait_app(&mut c, &app.id, "3 running", |a| a.running == 3).await;
    assert!(a.executors.iter().all(|e| !e.host.is_empty()), "{a:#?}");

    // A stale generation is dropped; a retry of the current one is applied.
    let t = set_target(&mut c, &app.id, 0, 0).await;
    assert_eq!((t.applied, t.target, t.generation), (false, 3, 1));
    let t = set_target(&mut c, &app.id, 1, 3).await;
    assert!(t.applied);

    // Down to 1: nobody running is stopped; the driver kills two.
    assert!(set_target(&mut c, &app.id, 2, 1).await.applied);
    let a = get_app(&mut c, &app.id).await;
    assert_eq!(a.running, 3, "a lower target stops no running executor");
    let k = c
        .apps
        .kill_executors(pb::KillExecutorsRequest {
            app_id: app.id.clone(),
            executor_ids: vec!["0".into(), "2".into(), "99".into(), "x".into()],
        })
        .await
        .expect("kill")
        .into_inner();
    assert_eq!(k.killed, ["0", "2"]);
    assert_eq!(k.unknown, ["99", "x"]);
    collect(&mut stream, &mut events, |e| exits(e).len() == 2).await;
    for (_, x) in exits(&events) {
        assert_eq!(x.cause(), Cause::Killed, "{x:?}");
        assert!(!x.caused_by_app);
    }
    let a = wait_app(&mut c, &app.id, "1 running, 2 exited", |a| {
        a.running == 1 && a.exited == 2
    })
    .await;
    assert_eq!(a.executors.len(), 1);

    // Above what the cluster holds: never refused; the rest waits, saying
    // why, and is told on the stream.
    let total = cluster_capacity(&mut c).await.cpu as u32;
    let t = set_target(&mut c, &app.id, 3, total + 3).await;
    assert!(t.applied);
    let a = wait_app(&mut c, &app.id, "the cluster full, 3 waiting", |a| {
        a.running == total && a.pending == 3
    })
    .await;
    for e in a.executors.iter().filter(|e| e.host.is_empty()) {
        assert!(!e.pending_reason.is_empty(), "{e:?}");
    }
    collect(&mut stream, &mut events, |e| {
        e.iter().any(|e| {
            matches!(&e.kind, Some(Kind::Pending(p)) if p.reason.contains("needs") || p.reason.contains("not placed") || p.reason.contains("not admitted"))
        })
    })
    .await;
    // Reasons told as they change are not history: revision 0.
    for e in &events {
        if let Some(Kind::Pending(p)) = &e.kind
            && p.reason.contains("needs")
        {
            assert_eq!(e.revision, 0, "{e:?}");
        }
    }
    // Back down: the waiting ones go, newest first; running ones stay.
    assert!(set_target(&mut c, &app.id, 4, total).await.applied);
    let a = wait_app(&mut c, &app.id, "no executor waiting", |a| a.pending == 0).await;
    assert_eq!(a.running, total);

    // The target survives a restart of the server.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    let a = wait_app(&mut c, &app.id, "running again after a restart", |a| {
        a.running == total
    })
    .await;
    assert_eq!((a.target, a.generation), (total, 4));
    let t = set_target(&mut c, &app.id, 3, 1).await;
    assert!(!t.applied, "generations count on across restarts");

    // Unregistered: executors stop, the job succeeds, targets are refused.
    let a = c
        .apps
        .unregister(pb::UnregisterAppRequest {
            app_id: app.id.clone(),
        })
        .await
        .expect("unregister")
        .into_inner()
        .app
        .expect("app");
    assert!(a.unregistered);
    wait_job(&c, &app.id, pb::JobState::Succeeded).await;
    let r = c
        .apps
        .set_executor_target(pb::SetExecutorTargetRequest {
            app_id: app.id.clone(),
            generation: 9,
            total: 1,
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "has ended");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_executor_is_not_the_applications_fault_and_is_replaced() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    let total = cluster_capacity(&mut c).await;
    create_pool(&mut c, "/prod", pool_spec(total.cpu, total.memory_mb)).await;
    create_pool(&mut c, "/spark", pool_spec(0.0, 0.0)).await;
    let n = total.cpu as u32;
    let app = register(&mut c, register_request("/spark", 1.0)).await;
    let mut stream = watch(&mut c, &app.id).await;
    let mut events = Vec::new();
    set_target(&mut c, &app.id, 1, n).await;
    collect(&mut stream, &mut events, |e| {
        launched(e).len() == n as usize
    })
    .await;

    // Production claims half of its reservation: executors are preempted.
    let mut spec = job_spec("/prod", n / 2, 1.0, 600_000);
    spec.sla = Some(pb::Sla {
        priority: 10,
        ..Default::default()
    });
    let prod = create_job(&mut c, spec).await;
    collect(&mut stream, &mut events, |e| !exits(e).is_empty()).await;
    let (id, x) = exits(&events)[0];
    assert_eq!(x.cause(), Cause::Preempted, "{x:?}");
    assert!(
        !x.caused_by_app,
        "preemption is not the application's fault"
    );
    let id = id.to_string();
    wait_job_where(&c, &prod.id, "prod running", |j| {
        count_in(j, pb::TaskState::Running) == n / 2
    })
    .await;
    // The target still asks for n: replacements wait (new ids), pending
    // with a reason, never refused.
    let a = wait_app(&mut c, &app.id, "replacements waiting", |a| {
        a.running + a.pending == n && a.pending > 0
    })
    .await;
    assert!(a.executors.iter().all(|e| e.id != id), "{a:#?}");
    assert!(
        a.executors
            .iter()
            .filter(|e| e.host.is_empty())
            .all(|e| !e.pending_reason.is_empty()),
        "{a:#?}"
    );
    // A preempted executor's end is told once, with nothing after it.
    collect(&mut stream, &mut events, |e| {
        e.iter()
            .any(|e| e.executor_id != id && matches!(e.kind, Some(Kind::Pending(_))))
    })
    .await;
    let after: Vec<_> = events.iter().filter(|e| e.executor_id == id).collect();
    assert_eq!(
        after.len(),
        3,
        "launched, pending first, exited: {after:#?}"
    );
    // Production leaves: the replacements run.
    c.jobs
        .kill(pb::KillJobRequest {
            id: prod.id.clone(),
            version: 0,
        })
        .await
        .expect("kill prod");
    wait_app(&mut c, &app.id, "all running again", |a| a.running == n).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_the_driver_is_a_controller_task_of_the_job() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    // Drivers may hold 1% of the pool: the first runs anyway (else a lone
    // driver would wait forever), the next waits.
    create_pool(
        &mut c,
        "/spark",
        pb::PoolSpec {
            controller_limit_pct: 1.0,
            ..Default::default()
        },
    )
    .await;
    let mut spec = job_spec("/spark", 1, 0.5, 3_600_000);
    spec.r#type = pb::JobType::Application as i32;
    spec.sla = Some(pb::Sla {
        preemptible: true,
        ..Default::default()
    });
    task_of(&mut spec).controller = true;
    // More than the driver: refused.
    let mut two = spec.clone();
    two.instance_count = 2;
    assert_status(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(two) })
            .await,
        Code::InvalidArgument,
        "spec.instance_count",
    );
    let job = create_job(&mut c, spec.clone()).await;
    wait_job_where(&c, &job.id, "the driver running", |j| {
        count_in(j, pb::TaskState::Running) == 1
    })
    .await;
    let a = get_app(&mut c, &job.id).await;
    assert!(a.driver_in_job && !a.registered, "{a:#?}");
    // (Another name: a pool's unfinished jobs have distinct names.)
    let second = create_job(&mut c, job_spec_named(&spec, "second-driver")).await;
    let waiting = eventually("the second driver waiting", TIMEOUT, async || {
        let t = get_task(&mut c.clone(), &second.id, 0).await;
        if t.pending_reason.contains("controller limit") {
            Ok(t)
        } else {
            Err(format!("{t:#?}"))
        }
    })
    .await;
    assert_eq!(task_state(&waiting), pb::TaskState::Pending);
    c.jobs
        .kill(pb::KillJobRequest {
            id: second.id.clone(),
            version: 0,
        })
        .await
        .expect("kill the second driver");

    // The driver registers from inside its job.
    let mut r = register_request("", 1.0);
    r.job_id = job.id.clone();
    let a = register(&mut c, r).await;
    assert!(a.registered);
    set_target(&mut c, &job.id, 1, 2).await;
    let a = wait_app(&mut c, &job.id, "2 executors", |a| a.running == 2).await;
    let mut ids: Vec<&str> = a.executors.iter().map(|e| e.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["1", "2"], "instance 0 is the driver");
    // Its stored spec keeps the driver as instance 0's task.
    let spec = get_job(&mut c, &job.id)
        .await
        .expect("job")
        .spec
        .expect("spec");
    let driver = spec
        .overrides
        .iter()
        .find(|o| o.instance == 0)
        .expect("driver");
    assert!(driver.spec.as_ref().expect("spec").controller);
    assert_eq!(spec.default_task.expect("executor").stop_signal, "SIGPWR");
    // The driver is not an executor.
    let k = c
        .apps
        .kill_executors(pb::KillExecutorsRequest {
            app_id: job.id.clone(),
            executor_ids: vec!["0".into()],
        })
        .await
        .expect("kill")
        .into_inner();
    assert_eq!(k.unknown, ["0"]);
    // Kept across a restart; the driver's end ends the application.
    let s = s.restart().await;
    let mut c = s.clients.clone();
    wait_app(&mut c, &job.id, "2 executors after a restart", |a| {
        a.running == 2 && a.registered
    })
    .await;
    c.tasks
        .kill(pb::KillTaskRequest {
            job_id: job.id.clone(),
            instances: vec![0],
            job_version: 0,
        })
        .await
        .expect("kill the driver");
    let j = wait_job(&c, &job.id, pb::JobState::Killed).await;
    assert_eq!(count_in(&j, pb::TaskState::Running), 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_field_and_change_nothing() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/spark", pool_spec(0.0, 0.0)).await;
    let cases: Vec<(pb::RegisterAppRequest, Code, &str)> = vec![
        (
            pb::RegisterAppRequest {
                driver_url: String::new(),
                ..register_request("/spark", 1.0)
            },
            Code::InvalidArgument,
            "driver_url",
        ),
        (
            pb::RegisterAppRequest {
                executor: None,
                ..register_request("/spark", 1.0)
            },
            Code::InvalidArgument,
            "executor",
        ),
        (register_request("", 1.0), Code::InvalidArgument, "pool"),
        (
            // Bigger than any host: never admitted, so refused now.
            register_request("/spark", 1000.0),
            Code::InvalidArgument,
            "executor.resources.cpu",
        ),
        (
            pb::RegisterAppRequest {
                executor: Some(pb::TaskSpec {
                    stop_signal: "SIGSTOP".into(),
                    ..executor(1.0)
                }),
                ..register_request("/spark", 1.0)
            },
            Code::InvalidArgument,
            "executor.stop_signal",
        ),
        (register_request("/nope", 1.0), Code::NotFound, "/nope"),
        (
            pb::RegisterAppRequest {
                job_id: "no-such-job".into(),
                ..register_request("", 1.0)
            },
            Code::NotFound,
            "no-such-job",
        ),
    ];
    for (r, code, needle) in cases {
        assert_status(c.apps.register(r).await, code, needle);
    }
    let mut q = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert!(q.jobs.is_empty(), "nothing was created: {:?}", q.jobs.pop());

    // A cluster-mode driver must be a controller task.
    let mut driver = job_spec("/spark", 1, 0.5, 600_000);
    driver.r#type = pb::JobType::Application as i32;
    driver.sla = Some(pb::Sla {
        preemptible: true,
        ..Default::default()
    });
    assert_status(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(driver) })
            .await,
        Code::InvalidArgument,
        "spec.default_task.controller",
    );
    let r = c
        .apps
        .get(pb::GetAppRequest {
            app_id: "nope".into(),
        })
        .await;
    assert_status(r, Code::NotFound, "nope");
    // A job that is not an application.
    let mut spec = job_spec("/spark", 1, 0.1, 600_000);
    spec.sla = Some(pb::Sla {
        preemptible: true,
        ..Default::default()
    });
    let batch = create_job(&mut c, spec).await;
    let r = c
        .apps
        .set_executor_target(pb::SetExecutorTargetRequest {
            app_id: batch.id.clone(),
            generation: 1,
            total: 1,
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "not an application");
    let app = register(&mut c, register_request("/spark", 0.1)).await;
    let r = c
        .apps
        .kill_executors(pb::KillExecutorsRequest {
            app_id: app.id.clone(),
            executor_ids: vec!["1".into(); 10_001],
        })
        .await;
    assert_status(r, Code::InvalidArgument, "executor_ids");
    // Application jobs are not scaled or restarted by hand.
    let r = c
        .jobs
        .scale(pb::ScaleJobRequest {
            id: app.id.clone(),
            instance_count: 3,
            version: 0,
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "application");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_that_fail_say_their_code_and_stop_being_replaced() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/spark", pool_spec(0.0, 0.0)).await;
    let mut r = register_request("/spark", 1.0);
    // Each executor "runs" 20 ms and exits 3 (say, it cannot reach its
    // driver).
    r.executor.as_mut().expect("executor").sim = Some(pb::SimSpec {
        duration_ms: 20,
        exit_code: 3,
    });
    let app = register(&mut c, r).await;
    let mut stream = watch(&mut c, &app.id).await;
    let mut events = Vec::new();
    set_target(&mut c, &app.id, 1, 1).await;
    collect(&mut stream, &mut events, |e| !exits(e).is_empty()).await;
    let (_, x) = exits(&events)[0];
    assert_eq!(
        (x.cause(), x.exit_code, x.caused_by_app),
        (Cause::Failed, 3, true),
        "{x:?}"
    );
    // Replaced until 3 failed in a row (twice the target, at least 3); then
    // none starts, and the application says why.
    let a = wait_app(&mut c, &app.id, "replacements stopped", |a| {
        !a.stalled.is_empty() && a.running + a.pending == 0
    })
    .await;
    assert_eq!(a.exited, 3, "{a:#?}");
    assert!(a.stalled.contains("failed in a row"), "{}", a.stalled);
    // A new target tries again.
    set_target(&mut c, &app.id, 2, 1).await;
    wait_app(&mut c, &app.id, "a new try", |a| a.exited > 3).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_not_heard_from_for_its_lease_loses_its_application() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = common::config(dir.path(), 2);
    config.app_lease_ms = 2500;
    let server = within(
        "the server to start",
        peloton_gateway::server::start(&config),
    )
    .await
    .expect("server starts");
    let mut c = Clients::connect(server.addr).await;
    create_pool(&mut c, "/spark", pool_spec(0.0, 0.0)).await;
    // One driver follows its executors (the stream keeps it heard from);
    // the other goes silent after its target.
    let kept = register(&mut c, register_request("/spark", 1.0)).await;
    let mut stream = watch(&mut c, &kept.id).await;
    set_target(&mut c, &kept.id, 1, 1).await;
    let silent = register(&mut c, register_request("/spark", 1.0)).await;
    set_target(&mut c, &silent.id, 1, 1).await;
    let started = std::time::Instant::now();
    let j = wait_job(&c, &silent.id, pb::JobState::Succeeded).await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(2000),
        "unregistered before its lease ran out"
    );
    assert_eq!(count_in(&j, pb::TaskState::Killed), 1, "{j:#?}");
    let t = get_task(&mut c, &silent.id, 0).await;
    assert!(
        t.current.expect("run").reason.contains("not heard from"),
        "the executor says why"
    );
    // The followed one lives on, well past the lease.
    tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
    let a = get_app(&mut c, &kept.id).await;
    assert!(!a.unregistered && a.running == 1, "{a:#?}");
    let mut got = Vec::new();
    collect(&mut stream, &mut got, |e| !launched(e).is_empty()).await;
    drop(stream);
    within("graceful shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

/// `spec` under another name.
fn job_spec_named(spec: &pb::JobSpec, name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        ..spec.clone()
    }
}
