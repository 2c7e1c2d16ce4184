//! The quick-start demo: a pool and a hello-world job submitted through the
//! real gRPC API, with every state change printed as it streams in, and
//! (on real agents) each task's output read back through the API.

use std::time::Duration;

use pb::job_service_client::JobServiceClient;
use pb::resource_pool_service_client::ResourcePoolServiceClient;
use pb::task_service_client::TaskServiceClient;
use pb::watch_service_client::WatchServiceClient;
use peloton_proto::v1 as pb;

/// Runs the demo against `addr`; returns the job's final state. `real`:
/// the hosts are agents (the tasks run for real and their output is shown).
pub async fn run(
    config: &crate::config::Config,
    addr: std::net::SocketAddr,
    real: bool,
) -> anyhow::Result<pb::JobState> {
    let channel = crate::client::connect_local(config, addr).await?;
    let mut pools = ResourcePoolServiceClient::new(channel.clone());
    let mut jobs = JobServiceClient::new(channel.clone());
    let mut watch = WatchServiceClient::new(channel.clone());
    let channel_for_hosts = channel.clone();
    let mut tasks = TaskServiceClient::new(channel);
    if real {
        wait_for_hosts(channel_for_hosts.clone()).await?;
    }
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
        // Spread: on a local cluster, the four land on different agents.
        placement: pb::PlacementStrategy::Spread as i32,
        owner: "demo".into(),
        pool: "/quickstart".into(),
        instance_count: 4,
        default_task: Some(pb::TaskSpec {
            shell: if real { HELLO.into() } else { String::new() },
            command: if real {
                String::new()
            } else {
                "/bin/echo".into()
            },
            args: if real {
                Vec::new()
            } else {
                vec!["hello, world".into()]
            },
            // Small: local agents share this machine's cores (a tenth of
            // a core each fits even a one-core machine split three ways).
            resources: Some(pb::Resources {
                cpu: 0.1,
                memory_mb: 64.0,
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
    let job = match jobs
        .create(pb::CreateJobRequest {
            spec: Some(spec.clone()),
        })
        .await
    {
        Ok(r) => r,
        // An earlier demo's job has not ended (its server stopped while it
        // ran): names are unique among a pool's unfinished jobs, so this
        // one goes without a name.
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            println!("demo: {}; submitting this one without a name", s.message());
            let spec = pb::JobSpec {
                name: String::new(),
                ..spec
            };
            jobs.create(pb::CreateJobRequest { spec: Some(spec) })
                .await?
        }
        Err(s) => return Err(s.into()),
    }
    .into_inner()
    .job
    .unwrap_or_default();
    println!(
        "demo: submitted job {} (4 instances of `{}`)",
        job.id,
        if real {
            HELLO
        } else {
            "/bin/echo hello, world"
        }
    );
    let state = follow(&mut stream, &job.id).await?;
    if real {
        for instance in 0..4 {
            let out = read_log(&mut tasks, &job.id, instance).await?;
            for line in out.lines() {
                println!("demo: [task {instance} stdout] {line}");
            }
        }
    }
    Ok(state)
}

const HELLO: &str = "echo \"hello, world from $PELOTON_TASK_ID\"; sleep 1";

/// Waits until at least one host is up (agents register right after the
/// server starts).
async fn wait_for_hosts(channel: crate::client::Authed) -> anyhow::Result<()> {
    let mut hosts = pb::host_service_client::HostServiceClient::new(channel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = hosts
            .list(pb::ListHostsRequest::default())
            .await?
            .into_inner();
        let up = list
            .hosts
            .iter()
            .filter(|h| h.state() == pb::HostState::Up)
            .count();
        if up > 0 {
            println!("demo: {up} host(s) up");
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "demo: no host registered within 30 s (start agents, e.g. --local-agents 3)"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A task's whole stdout, through `TaskService.Logs`.
pub async fn read_log(
    tasks: &mut TaskServiceClient<crate::client::Authed>,
    job_id: &str,
    instance: u32,
) -> anyhow::Result<String> {
    let mut stream = tasks
        .logs(pb::TaskLogsRequest {
            job_id: job_id.to_string(),
            instance,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend_from_slice(&chunk.data);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

async fn follow(
    stream: &mut tonic::Streaming<pb::WatchResponse>,
    job_id: &str,
) -> anyhow::Result<pb::JobState> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message()).await;
        let Ok(Ok(Some(batch))) = next else {
            anyhow::bail!("demo: the job did not finish within 60 s");
        };
        for e in batch.events {
            match e.kind {
                Some(pb::event::Kind::Task(t)) if t.job_id == job_id => {
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
                Some(pb::event::Kind::Job(j)) if j.job_id == job_id => {
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
