//! Invalid job specs are refused with the right code and a message naming
//! the field, and leave no trace: no job, no event, before and after a
//! restart on the same data directory.

mod common;

use std::time::Duration;

use common::*;
use peloton_proto::v1 as pb;
use tonic::Code;

/// (what, spec, expected code, field the message must name).
fn invalid_specs() -> Vec<(&'static str, pb::JobSpec, Code, &'static str)> {
    let good = || job_spec("/a", 4, 1.0, 100);
    let mut out = Vec::new();

    let mut s = good();
    s.instance_count = 0;
    out.push((
        "zero instances",
        s,
        Code::InvalidArgument,
        "spec.instance_count",
    ));

    let mut s = good();
    s.instance_count = 100_001;
    out.push((
        "too many instances",
        s,
        Code::InvalidArgument,
        "spec.instance_count",
    ));

    let mut s = good();
    task_of(&mut s).resources = Some(res(-1.0, 256.0));
    out.push((
        "negative cpu",
        s,
        Code::InvalidArgument,
        "spec.default_task.resources.cpu",
    ));

    let mut s = good();
    task_of(&mut s).resources = Some(res(0.0, 0.0));
    out.push((
        "zero resources",
        s,
        Code::InvalidArgument,
        "spec.default_task.resources",
    ));

    let mut s = good();
    task_of(&mut s).resources = None;
    out.push((
        "missing resources",
        s,
        Code::InvalidArgument,
        "spec.default_task.resources",
    ));

    let mut s = good();
    task_of(&mut s).constraint = "zone == ".into();
    out.push((
        "bad constraint",
        s,
        Code::InvalidArgument,
        "spec.default_task.constraint",
    ));

    let mut s = good();
    task_of(&mut s).constraint = "zone in {z1, ".into();
    out.push((
        "unclosed set",
        s,
        Code::InvalidArgument,
        "spec.default_task.constraint",
    ));

    let mut s = good();
    task_of(&mut s).command.clear();
    out.push((
        "missing command",
        s,
        Code::InvalidArgument,
        "spec.default_task.command",
    ));

    let mut s = good();
    s.default_task = None;
    out.push((
        "missing task",
        s,
        Code::InvalidArgument,
        "spec.default_task",
    ));

    let mut s = good();
    s.pool = "/nope".into();
    out.push(("unknown pool", s, Code::NotFound, "spec.pool"));

    let mut s = good();
    s.pool = "/parent".into();
    out.push(("inner pool", s, Code::InvalidArgument, "spec.pool"));

    let mut s = good();
    s.pool.clear();
    out.push(("no pool", s, Code::InvalidArgument, "spec.pool"));

    let mut s = good();
    s.r#type = pb::JobType::Stateful as i32;
    out.push((
        "stateful job without a volume",
        s,
        Code::InvalidArgument,
        "spec.default_task.volume",
    ));

    let mut s = good();
    s.default_task.as_mut().unwrap().volume = Some(pb::VolumeSpec {
        size_mb: 100,
        path: "/etc".into(),
    });
    out.push((
        "absolute volume path",
        s,
        Code::InvalidArgument,
        "spec.default_task.volume.path",
    ));

    let mut s = good();
    s.r#type = pb::JobType::Daemon as i32;
    s.default_task.as_mut().unwrap().volume = Some(pb::VolumeSpec {
        size_mb: 100,
        path: String::new(),
    });
    out.push((
        "daemon with a volume",
        s,
        Code::InvalidArgument,
        "spec.default_task.volume",
    ));

    let mut s = good();
    s.default_task.as_mut().unwrap().health_check = Some(pb::HealthCheck {
        kind: Some(pb::health_check::Kind::TcpPort("admin".into())),
        ..Default::default()
    });
    out.push((
        "health check on a port the task does not ask for",
        s,
        Code::InvalidArgument,
        "spec.default_task.health_check.tcp_port",
    ));

    let mut s = good();
    s.r#type = pb::JobType::Daemon as i32;
    s.sla = Some(pb::Sla {
        min_running_instances: 2,
        ..Default::default()
    });
    out.push((
        "daemon job in gangs",
        s,
        Code::InvalidArgument,
        "spec.sla.min_running_instances",
    ));

    let mut s = good();
    s.r#type = 42;
    out.push(("unknown type", s, Code::InvalidArgument, "spec.type"));

    let mut s = good();
    s.sla = Some(pb::Sla {
        min_running_instances: 5,
        ..Default::default()
    });
    out.push((
        "gang larger than the job",
        s,
        Code::InvalidArgument,
        "spec.sla.min_running_instances",
    ));

    // A name is optional, but a cron job's ticks' jobs are named after it.
    let mut s = good();
    s.name.clear();
    s.schedule = Some(pb::CronSchedule {
        cron: "@hourly".into(),
        ..Default::default()
    });
    out.push((
        "a cron job without a name",
        s,
        Code::InvalidArgument,
        "spec.name",
    ));

    let mut s = good();
    task_of(&mut s).revocable = true;
    out.push((
        "revocable, not preemptible",
        s,
        Code::InvalidArgument,
        "spec.sla.preemptible",
    ));

    let mut s = good();
    s.overrides.push(pb::InstanceOverride {
        instance: 4,
        spec: s.default_task.clone(),
    });
    out.push((
        "override past the end",
        s,
        Code::InvalidArgument,
        "spec.overrides[0].instance",
    ));
    let mut s = good();
    s.rendezvous = Some(pb::RendezvousSpec {
        framework: "pytorch".into(),
        port: String::new(),
    });
    out.push((
        "a rendezvous without a gang",
        s,
        Code::InvalidArgument,
        "spec.rendezvous",
    ));

    let mut s = good();
    s.sla = Some(pb::Sla {
        min_running_instances: 2,
        ..Default::default()
    });
    s.rendezvous = Some(pb::RendezvousSpec {
        framework: "jax".into(),
        port: String::new(),
    });
    out.push((
        "an unknown rendezvous framework",
        s,
        Code::InvalidArgument,
        "spec.rendezvous.framework",
    ));

    out
}

async fn assert_no_jobs(c: &mut Clients) {
    let q = c
        .jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner();
    assert!(q.jobs.is_empty(), "refused specs left jobs: {:#?}", q.jobs);
    assert!(q.next_page_token.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_jobs_are_refused_and_leave_no_trace() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_reserved_pool(&mut c, "/a").await;
    create_pool(&mut c, "/parent", pool_spec(0.0, 0.0)).await;
    create_pool(&mut c, "/parent/child", pool_spec(0.0, 0.0)).await;

    for (what, spec, code, field) in invalid_specs() {
        let r = c
            .jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await;
        match r {
            Ok(j) => panic!("{what}: accepted: {:?}", j.into_inner()),
            Err(e) => {
                assert_eq!(e.code(), code, "{what}: {}", e.message());
                assert!(
                    e.message().contains(field),
                    "{what}: message does not name {field}: {}",
                    e.message()
                );
            }
        }
    }
    assert_status(
        c.jobs.create(pb::CreateJobRequest { spec: None }).await,
        Code::InvalidArgument,
        "spec",
    );
    assert_no_jobs(&mut c).await;

    // Nothing to replay: a watch from revision 1 stays silent. (The store
    // is replayed at once on subscribe, so a short window suffices.)
    let mut stream = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: 1,
            job_id: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
    assert!(first.is_err(), "refused jobs left events: {first:?}");
    drop(stream);

    let s = s.restart().await;
    let mut c = s.clients.clone();
    assert_no_jobs(&mut c).await;
    // The first event ever is the one of the first valid job: revision 1.
    let mut stream = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: 1,
            job_id: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let job = create_job(&mut c, job_spec("/a", 1, 1.0, 10)).await;
    let events = collect_events(&mut stream, |e| !e.is_empty()).await;
    assert_eq!(
        events[0].revision, 1,
        "events before the first valid job: {events:#?}"
    );
    let job_of = |e: &pb::Event| match &e.kind {
        Some(pb::event::Kind::Job(j)) => j.job_id.clone(),
        Some(pb::event::Kind::Task(t)) => t.job_id.clone(),
        None => String::new(),
    };
    assert!(
        events.iter().all(|e| job_of(e) == job.id),
        "events of other jobs: {events:#?}"
    );
    s.shutdown().await;
}
