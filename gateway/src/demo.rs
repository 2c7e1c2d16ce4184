//! The quick-start demo: a pool and a hello-world job submitted through the
//! real gRPC API, with every state change printed as it streams in.

use std::time::Duration;

use pb::job_service_client::JobServiceClient;
use pb::resource_pool_service_client::ResourcePoolServiceClient;
use pb::watch_service_client::WatchServiceClient;
use peloton_proto::v1 as pb;

/// Runs the demo against `addr`; returns the job's final state.
pub async fn run(addr: std::net::SocketAddr) -> anyhow::Result<pb::JobState> {
    let url = format!("http://{addr}");
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect()
        .await?;
    let mut pools = ResourcePoolServiceClient::new(channel.clone());
    let mut jobs = JobServiceClient::new(channel.clone());
    let mut watch = WatchServiceClient::new(channel);
    let pool = pb::CreatePoolRequest {
        path: "/quickstart".into(),
        spec: Some(pb::PoolSpec {
            reservation: Some(pb::Resources {
                cpu: 4.0,
                memory_mb: 4096.0,
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    match pools.create(pool).await {
        Ok(_) => println!("demo: created pool /quickstart (reservation 4 cores, 4 GiB)"),
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            println!("demo: pool /quickstart exists");
        }
        Err(s) => return Err(s.into()),
    }
    let mut stream = watch.watch(pb::WatchRequest::default()).await?.into_inner();
    let spec = pb::JobSpec {
        name: "hello-world".into(),
        owner: "demo".into(),
        pool: "/quickstart".into(),
        instance_count: 4,
        default_task: Some(pb::TaskSpec {
            command: "/bin/echo".into(),
            args: vec!["hello, world".into()],
            resources: Some(pb::Resources {
                cpu: 0.5,
                memory_mb: 128.0,
                ..Default::default()
            }),
            sim: Some(pb::SimSpec {
                duration_ms: 1500,
                exit_code: 0,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let job = jobs
        .create(pb::CreateJobRequest { spec: Some(spec) })
        .await?
        .into_inner()
        .job
        .unwrap_or_default();
    println!(
        "demo: submitted job {} (4 instances of `/bin/echo hello, world`)",
        job.id
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message()).await;
        let Ok(Ok(Some(batch))) = next else {
            anyhow::bail!("demo: the job did not finish within 60 s");
        };
        for e in batch.events {
            match e.kind {
                Some(pb::event::Kind::Task(t)) if t.job_id == job.id => {
                    let host = if t.host.is_empty() {
                        String::new()
                    } else {
                        format!(" on {}", t.host)
                    };
                    println!(
                        "demo: [rev {:>5}] task {} run {}: {}{host}",
                        e.revision,
                        t.instance,
                        t.run_id,
                        pb::TaskState::try_from(t.state)
                            .unwrap_or_default()
                            .as_str_name()
                    );
                }
                Some(pb::event::Kind::Job(j)) if j.job_id == job.id => {
                    let state = pb::JobState::try_from(j.state).unwrap_or_default();
                    println!("demo: [rev {:>5}] job: {}", e.revision, state.as_str_name());
                    if matches!(
                        state,
                        pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Killed
                    ) {
                        return Ok(state);
                    }
                }
                _ => {}
            }
        }
    }
}
