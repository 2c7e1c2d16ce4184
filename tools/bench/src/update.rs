//! `peloton-bench update`: a rolling update of a large service through the
//! gRPC API, on a started `pelotond` with simulated hosts.
//!
//! Creates a service of `instances` (0.1 cpu, 64 MiB, simulated runs of an
//! hour), waits until every instance runs, then updates it to a new spec
//! (one environment variable differs) `batch_size` instances at a time and
//! polls the update until it succeeds. Reports:
//! - `update_s`: from the update's creation to its success;
//! - `loop_cpu_ms_per_instance`: the scheduling loop thread's CPU time
//!   (user + system, /proc) during the update, per instance updated;
//! - `server_cpu_ms_per_instance`: the same for the whole server process
//!   (gRPC handlers and the polling included; over TLS with tokens and the
//!   audit log, unless `--insecure`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pb::job_service_client::JobServiceClient;
use pb::update_service_client::UpdateServiceClient;
use peloton_proto::v1 as pb;
use serde_json::{Value, json};

use crate::launch::{cpu_s, thread_cpu_s};

/// Options of one run.
#[derive(Debug, Clone)]
pub struct UpdateOptions {
    /// Simulated hosts.
    pub hosts: u32,
    /// Instances of the service.
    pub instances: u32,
    /// Instances updated at once.
    pub batch_size: u32,
    /// Start the server with `--insecure` (plaintext, no tokens).
    pub insecure: bool,
}

fn service(pool: &str, instances: u32, version: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: "bench-service".into(),
        owner: "peloton-bench".into(),
        r#type: pb::JobType::Service as i32,
        pool: pool.into(),
        instance_count: instances,
        default_task: Some(pb::TaskSpec {
            command: "/bin/true".into(),
            env: [("VERSION".to_string(), version.to_string())].into(),
            resources: Some(pb::Resources {
                cpu: 0.1,
                memory_mb: 64.0,
                ..Default::default()
            }),
            sim: Some(pb::SimSpec {
                duration_ms: 3_600_000,
                exit_code: 0,
            }),
            ..Default::default()
        }),
        // Preemptible: the pool has no reservation, and only preemptible
        // work is admitted beyond a reservation.
        sla: Some(pb::Sla {
            preemptible: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn running(
    jobs: &mut JobServiceClient<peloton_gateway::client::Authed>,
    id: &str,
) -> Result<u32> {
    let job = jobs
        .get(pb::GetJobRequest { id: id.into() })
        .await?
        .into_inner()
        .job
        .context("no job")?;
    Ok(job
        .status
        .map(|s| {
            s.task_counts
                .iter()
                .filter(|c| c.state() == pb::TaskState::Running)
                .map(|c| c.count)
                .sum()
        })
        .unwrap_or(0))
}

/// Runs the benchmark.
pub async fn run(o: UpdateOptions) -> Result<Value> {
    let (spawned, target) = crate::e2e::spawn_server(o.hosts, o.insecure)?;
    let pid = spawned.child.id();
    let channel = target.connect().await?;
    let mut jobs = JobServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20);
    let mut updates = UpdateServiceClient::new(channel.clone());
    crate::e2e::create_pool(&channel, "/bench").await?;
    let job = jobs
        .create(pb::CreateJobRequest {
            spec: Some(service("/bench", o.instances, "1")),
        })
        .await?
        .into_inner()
        .job
        .context("no job")?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while running(&mut jobs, &job.id).await? < o.instances {
        if Instant::now() > deadline {
            bail!(
                "the service did not reach {} running instances",
                o.instances
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (loop0, cpu0) = (thread_cpu_s(pid, "peloton-loop"), cpu_s(pid));
    let start = Instant::now();
    let update = updates
        .create(pb::UpdateJobRequest {
            job_id: job.id.clone(),
            version: 0,
            spec: Some(service("/bench", o.instances, "2")),
            update: Some(pb::UpdateSpec {
                batch_size: o.batch_size,
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .update
        .context("no update")?;
    let state = loop {
        let u = updates
            .get(pb::GetUpdateRequest {
                id: update.id.clone(),
            })
            .await?
            .into_inner()
            .update
            .context("no update")?;
        let state = u.status.as_ref().map(|s| s.state()).unwrap_or_default();
        if matches!(
            state,
            pb::UpdateState::Succeeded
                | pb::UpdateState::Failed
                | pb::UpdateState::RolledBack
                | pb::UpdateState::Aborted
        ) {
            break state;
        }
        if Instant::now() > deadline {
            bail!("the update did not end in time: {:?}", u.status);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let update_s = start.elapsed().as_secs_f64();
    let loop_cpu = thread_cpu_s(pid, "peloton-loop") - loop0;
    let server_cpu = cpu_s(pid) - cpu0;
    if state != pb::UpdateState::Succeeded {
        bail!("the update ended {}", state.as_str_name());
    }
    drop(spawned);
    let n = f64::from(o.instances.max(1));
    Ok(json!({
        "benchmark": "update",
        "hosts": o.hosts,
        "instances": o.instances,
        "batch_size": o.batch_size,
        "update_s": (update_s * 1000.0).round() / 1000.0,
        "loop_cpu_ms_per_instance": (loop_cpu * 1000.0 / n * 1000.0).round() / 1000.0,
        "server_cpu_ms_per_instance": (server_cpu * 1000.0 / n * 1000.0).round() / 1000.0,
    }))
}
