//! `peloton cluster snapshot DIR`: hosts and tasks as Arrow IPC files.
//!
//! Read through the public API (hosts paged by name, jobs by page token,
//! each job's tasks by instance), so it needs no access beyond a client's
//! and works against any server version that has these calls. The snapshot
//! is not atomic: a task may change between the host and task pages.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow_array::builder::{
    BooleanBuilder, Float64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use peloton_proto::v1::host_service_client::HostServiceClient;
use peloton_proto::v1::job_service_client::JobServiceClient;
use peloton_proto::v1::task_service_client::TaskServiceClient;
use peloton_proto::v1::{
    HostState, ListHostsRequest, ListTasksRequest, QueryJobsRequest, Resources, TaskState,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::cli::ClusterCommand;
use crate::names::name_of;
use crate::output::{OutputFormat, print_json};

/// Most pages read for one list, so a server that never ends a listing
/// cannot keep the client forever.
const MAX_PAGES: usize = 1_000_000;

pub(super) async fn run(ctx: &Ctx, command: ClusterCommand) -> Result<Outcome> {
    match command {
        ClusterCommand::Snapshot { dir } => snapshot(ctx, &dir).await,
    }
}

async fn snapshot(ctx: &Ctx, dir: &Path) -> Result<Outcome> {
    if dir.exists() && !dir.is_dir() {
        bail!("{}: not a directory", dir.display());
    }
    let channel = ctx.connect().await?;
    let (hosts, n_hosts) = read_hosts(
        &mut HostServiceClient::new(channel.clone())
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES),
    )
    .await?;
    let (tasks, n_jobs, n_tasks) = read_tasks(
        &mut JobServiceClient::new(channel.clone())
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES),
        &mut TaskServiceClient::new(channel).max_decoding_message_size(crate::MAX_MESSAGE_BYTES),
    )
    .await?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let hosts_file = dir.join("hosts.arrow");
    let tasks_file = dir.join("tasks.arrow");
    write_ipc(&hosts_file, &hosts)?;
    write_ipc(&tasks_file, &tasks)?;
    match ctx.output {
        OutputFormat::Table => println!(
            "wrote {n_hosts} hosts to {} and {n_tasks} tasks of {n_jobs} jobs to {}",
            hosts_file.display(),
            tasks_file.display()
        ),
        OutputFormat::Json => print_json(&json!({
            "hosts": n_hosts,
            "jobs": n_jobs,
            "tasks": n_tasks,
            "hosts_file": hosts_file,
            "tasks_file": tasks_file,
        }))?,
    }
    Ok(Outcome::Success)
}

/// Writes a batch as an Arrow IPC file, through a temporary file renamed
/// into place, so a reader never sees half a file.
fn write_ipc(path: &Path, batch: &RecordBatch) -> Result<()> {
    let tmp = path.with_extension("arrow.tmp");
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut writer = arrow_ipc::writer::FileWriter::try_new(file, &batch.schema())
        .with_context(|| format!("writing {}", tmp.display()))?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Four resource columns (`{prefix}cpu`, `…memory_mb`, `…disk_mb`, `…gpu`).
#[derive(Default)]
struct ResourceColumns([Float64Builder; 4]);

impl ResourceColumns {
    fn push(&mut self, r: Option<&Resources>) {
        let r = r.copied().unwrap_or_default();
        for (b, v) in self
            .0
            .iter_mut()
            .zip([r.cpu, r.memory_mb, r.disk_mb, r.gpu])
        {
            b.append_value(v);
        }
    }

    fn finish(mut self, prefix: &str, fields: &mut Vec<Field>, columns: &mut Vec<ArrayRef>) {
        for (b, name) in self
            .0
            .iter_mut()
            .zip(["cpu", "memory_mb", "disk_mb", "gpu"])
        {
            fields.push(Field::new(
                format!("{prefix}{name}"),
                DataType::Float64,
                false,
            ));
            columns.push(Arc::new(b.finish()));
        }
    }
}

async fn read_hosts(
    client: &mut HostServiceClient<tonic::transport::Channel>,
) -> Result<(RecordBatch, usize)> {
    let mut name = StringBuilder::new();
    let mut state = StringBuilder::new();
    let mut pool = StringBuilder::new();
    let mut connected = BooleanBuilder::new();
    let mut tasks = UInt64Builder::new();
    let mut last_seen = UInt64Builder::new();
    let mut capacity = ResourceColumns::default();
    let mut free = ResourceColumns::default();
    let mut after = String::new();
    let mut n = 0;
    for _ in 0..MAX_PAGES {
        let page = client
            .list(ListHostsRequest {
                after: after.clone(),
                limit: 0,
            })
            .await?
            .into_inner();
        for host in &page.hosts {
            name.append_value(&host.name);
            state.append_value(name_of::<HostState>(host.state));
            pool.append_value(&host.host_pool);
            connected.append_value(host.connected);
            tasks.append_value(host.tasks_total);
            last_seen.append_value(host.last_seen_ms);
            capacity.push(host.capacity.as_ref());
            free.push(host.free.as_ref());
            n += 1;
        }
        if page.next_after.is_empty() || page.next_after <= after {
            break;
        }
        after = page.next_after;
    }
    let mut fields = vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("host_pool", DataType::Utf8, false),
        Field::new("connected", DataType::Boolean, false),
        Field::new("tasks", DataType::UInt64, false),
        Field::new("last_seen_ms", DataType::UInt64, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(name.finish()),
        Arc::new(state.finish()),
        Arc::new(pool.finish()),
        Arc::new(connected.finish()),
        Arc::new(tasks.finish()),
        Arc::new(last_seen.finish()),
    ];
    capacity.finish("capacity_", &mut fields, &mut columns);
    free.finish("free_", &mut fields, &mut columns);
    Ok((
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?,
        n,
    ))
}

async fn read_tasks(
    jobs: &mut JobServiceClient<tonic::transport::Channel>,
    tasks: &mut TaskServiceClient<tonic::transport::Channel>,
) -> Result<(RecordBatch, usize, usize)> {
    let mut job_id = StringBuilder::new();
    let mut job_name = StringBuilder::new();
    let mut pool = StringBuilder::new();
    let mut instance = UInt32Builder::new();
    let mut state = StringBuilder::new();
    let mut host = StringBuilder::new();
    let mut run_id = UInt32Builder::new();
    let mut placed_at = UInt64Builder::new();
    let mut started_at = UInt64Builder::new();
    let mut pending = StringBuilder::new();
    let mut request = ResourceColumns::default();
    let (mut n_jobs, mut n_tasks) = (0, 0);
    let mut token = String::new();
    for _ in 0..MAX_PAGES {
        let page = jobs
            .query(QueryJobsRequest {
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        for job in &page.jobs {
            n_jobs += 1;
            let spec = job.spec.clone().unwrap_or_default();
            let resources = spec.default_task.as_ref().and_then(|t| t.resources);
            let mut from = 0;
            for _ in 0..MAX_PAGES {
                let listed = match tasks
                    .list(ListTasksRequest {
                        job_id: job.id.clone(),
                        states: vec![],
                        from_instance: from,
                        limit: 0,
                    })
                    .await
                {
                    Ok(listed) => listed.into_inner(),
                    // Deleted since the job page was read.
                    Err(status) if status.code() == tonic::Code::NotFound => break,
                    Err(status) => return Err(status.into()),
                };
                for task in &listed.tasks {
                    let run = task.current.clone().unwrap_or_default();
                    job_id.append_value(&job.id);
                    job_name.append_value(&spec.name);
                    pool.append_value(&spec.pool);
                    instance.append_value(task.instance);
                    state.append_value(name_of::<TaskState>(run.state));
                    if run.host.is_empty() {
                        host.append_null();
                    } else {
                        host.append_value(&run.host);
                    }
                    run_id.append_value(run.run_id);
                    placed_at.append_option((run.placed_at_ms > 0).then_some(run.placed_at_ms));
                    started_at.append_option((run.started_at_ms > 0).then_some(run.started_at_ms));
                    if task.pending_reason.is_empty() {
                        pending.append_null();
                    } else {
                        pending.append_value(&task.pending_reason);
                    }
                    // The job's task request (per-instance overrides of
                    // resources are not applied).
                    request.push(resources.as_ref());
                    n_tasks += 1;
                }
                if listed.next_instance == 0 || listed.next_instance <= from {
                    break;
                }
                from = listed.next_instance;
            }
        }
        if page.next_page_token.is_empty() || page.next_page_token == token {
            break;
        }
        token = page.next_page_token;
    }
    let mut fields = vec![
        Field::new("job_id", DataType::Utf8, false),
        Field::new("job_name", DataType::Utf8, false),
        Field::new("pool", DataType::Utf8, false),
        Field::new("instance", DataType::UInt32, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("host", DataType::Utf8, true),
        Field::new("run_id", DataType::UInt32, false),
        Field::new("placed_at_ms", DataType::UInt64, true),
        Field::new("started_at_ms", DataType::UInt64, true),
        Field::new("pending_reason", DataType::Utf8, true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(job_id.finish()),
        Arc::new(job_name.finish()),
        Arc::new(pool.finish()),
        Arc::new(instance.finish()),
        Arc::new(state.finish()),
        Arc::new(host.finish()),
        Arc::new(run_id.finish()),
        Arc::new(placed_at.finish()),
        Arc::new(started_at.finish()),
        Arc::new(pending.finish()),
    ];
    request.finish("request_", &mut fields, &mut columns);
    Ok((
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?,
        n_jobs,
        n_tasks,
    ))
}
