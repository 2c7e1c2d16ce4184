//! `peloton cluster snapshot DIR`: hosts, pools and tasks as Arrow IPC
//! files, enough to replay the cluster's queue (`peloton-bench whatif`).
//!
//! Read through the public API (hosts paged by name, pools and jobs by page
//! token, each job's tasks by instance), so it needs no access beyond a
//! client's and works against any server version that has these calls. The
//! snapshot is not atomic: a task may change between the host and task
//! pages. Every file's schema carries the client's clock when the snapshot
//! began (`peloton.snapshot.taken_at_ms`), the "now" of a replay.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow_array::builder::{
    BooleanBuilder, Float64Builder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
use peloton_proto::v1::host_service_client::HostServiceClient;
use peloton_proto::v1::job_service_client::JobServiceClient;
use peloton_proto::v1::resource_pool_service_client::ResourcePoolServiceClient;
use peloton_proto::v1::task_service_client::TaskServiceClient;
use peloton_proto::v1::{
    HostState, JobType, ListPoolsRequest, ListTasksRequest, PoolKind, QueryJobsRequest, Resources,
    TaskState,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::channel::LeaderChannel;
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
    let taken_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let channel = ctx.connect().await?;
    let (hosts, n_hosts) = read_hosts(
        &mut HostServiceClient::new(channel.clone())
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES),
    )
    .await?;
    let (pools, n_pools) = read_pools(
        &mut ResourcePoolServiceClient::new(channel.clone())
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
    let pools_file = dir.join("pools.arrow");
    let tasks_file = dir.join("tasks.arrow");
    write_ipc(&hosts_file, &stamped(hosts, taken_at_ms)?)?;
    write_ipc(&pools_file, &stamped(pools, taken_at_ms)?)?;
    write_ipc(&tasks_file, &stamped(tasks, taken_at_ms)?)?;
    match ctx.output {
        OutputFormat::Table => println!(
            "wrote {n_hosts} hosts to {}, {n_pools} pools to {} and {n_tasks} tasks of \
             {n_jobs} jobs to {}",
            hosts_file.display(),
            pools_file.display(),
            tasks_file.display()
        ),
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "hosts": n_hosts,
            "pools": n_pools,
            "jobs": n_jobs,
            "tasks": n_tasks,
            "taken_at_ms": taken_at_ms,
            "hosts_file": hosts_file,
            "pools_file": pools_file,
            "tasks_file": tasks_file,
        }))?,
    }
    Ok(Outcome::Success)
}

/// The schema metadata key of the snapshot's time (ms since the epoch, the
/// client's clock when it began reading).
pub const TAKEN_AT_KEY: &str = "peloton.snapshot.taken_at_ms";

/// The batch with the snapshot's time in its schema's metadata.
fn stamped(batch: RecordBatch, taken_at_ms: u64) -> Result<RecordBatch> {
    let schema = batch.schema().as_ref().clone().with_metadata(
        [(TAKEN_AT_KEY.to_owned(), taken_at_ms.to_string())]
            .into_iter()
            .collect::<std::collections::HashMap<String, String>>(),
    );
    Ok(batch.with_schema(Arc::new(schema))?)
}

/// Writes a batch as an Arrow IPC file, through a temporary file renamed
/// into place, so a reader never sees half a file.
pub(super) fn write_ipc(path: &Path, batch: &RecordBatch) -> Result<()> {
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

    fn finish(mut self, prefix: &str, columns: &mut Vec<(String, ArrayRef, bool)>) {
        for (b, name) in self
            .0
            .iter_mut()
            .zip(["cpu", "memory_mb", "disk_mb", "gpu"])
        {
            columns.push((format!("{prefix}{name}"), Arc::new(b.finish()), false));
        }
    }
}

/// A batch of named columns (name, values, nullable); the schema follows
/// from the arrays.
fn batch(columns: Vec<(String, ArrayRef, bool)>) -> Result<RecordBatch> {
    Ok(RecordBatch::try_from_iter_with_nullable(columns)?)
}

async fn read_hosts(client: &mut HostServiceClient<LeaderChannel>) -> Result<(RecordBatch, usize)> {
    let hosts = super::host::list_all(client).await?;
    let mut state = StringBuilder::new();
    let mut capacity = ResourceColumns::default();
    let mut free = ResourceColumns::default();
    for host in &hosts {
        state.append_value(name_of::<HostState>(host.state));
        capacity.push(host.capacity.as_ref());
        free.push(host.free.as_ref());
    }
    let column = |name: &str, values: ArrayRef| (name.to_owned(), values, false);
    let mut columns = vec![
        column(
            "name",
            Arc::new(StringArray::from_iter_values(hosts.iter().map(|h| &h.name))),
        ),
        column("state", Arc::new(state.finish())),
        column(
            "host_pool",
            Arc::new(StringArray::from_iter_values(
                hosts.iter().map(|h| &h.host_pool),
            )),
        ),
        column(
            "connected",
            Arc::new(BooleanArray::from_iter(
                hosts.iter().map(|h| Some(h.connected)),
            )),
        ),
        column(
            "tasks",
            Arc::new(UInt64Array::from_iter_values(
                hosts.iter().map(|h| h.tasks_total),
            )),
        ),
        column(
            "last_seen_ms",
            Arc::new(UInt64Array::from_iter_values(
                hosts.iter().map(|h| h.last_seen_ms),
            )),
        ),
    ];
    capacity.finish("capacity_", &mut columns);
    free.finish("free_", &mut columns);
    Ok((batch(columns)?, hosts.len()))
}

/// Every resource pool, in path order (parents before children): its spec
/// as the API gives it (resources in the API's units; a limit of 0 is no
/// limit, a share of 0 is 1, a per-dimension share of 0 is `share`) and its
/// status when read.
async fn read_pools(
    client: &mut ResourcePoolServiceClient<LeaderChannel>,
) -> Result<(RecordBatch, usize)> {
    let mut pools = Vec::new();
    let mut token = String::new();
    for _ in 0..MAX_PAGES {
        let page = client
            .list(ListPoolsRequest {
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        pools.extend(page.pools);
        if page.next_page_token.is_empty() || page.next_page_token == token {
            break;
        }
        token = page.next_page_token;
    }
    pools.sort_by(|a, b| a.path.cmp(&b.path));
    let mut parent = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut share = Float64Builder::new();
    let mut controller_limit = Float64Builder::new();
    let mut slack_limit = Float64Builder::new();
    let mut strict_order = BooleanBuilder::new();
    let mut pending = UInt64Builder::new();
    let mut running = UInt64Builder::new();
    let mut shares = ResourceColumns::default();
    let mut reservation = ResourceColumns::default();
    let mut limit = ResourceColumns::default();
    let mut entitlement = ResourceColumns::default();
    let mut allocation = ResourceColumns::default();
    let mut demand = ResourceColumns::default();
    for pool in &pools {
        let spec = pool.spec.unwrap_or_default();
        let status = pool.status.unwrap_or_default();
        match pool.path.rsplit_once('/') {
            Some(("", "")) | None => parent.append_null(),
            Some(("", _)) => parent.append_value("/"),
            Some((p, _)) => parent.append_value(p),
        }
        kind.append_value(name_of::<PoolKind>(spec.kind));
        share.append_value(spec.share);
        controller_limit.append_value(spec.controller_limit_pct);
        slack_limit.append_value(spec.slack_limit_pct);
        strict_order.append_value(spec.strict_order);
        pending.append_value(status.pending_tasks);
        running.append_value(status.running_tasks);
        shares.push(spec.shares.as_ref());
        reservation.push(spec.reservation.as_ref());
        limit.push(spec.limit.as_ref());
        entitlement.push(status.entitlement.as_ref());
        allocation.push(status.allocation.as_ref());
        demand.push(status.demand.as_ref());
    }
    let column = |name: &str, values: ArrayRef, nullable: bool| (name.to_owned(), values, nullable);
    let mut columns = vec![
        column(
            "path",
            Arc::new(StringArray::from_iter_values(pools.iter().map(|p| &p.path))),
            false,
        ),
        column("parent", Arc::new(parent.finish()), true),
        column("kind", Arc::new(kind.finish()), false),
        column("share", Arc::new(share.finish()), false),
        column(
            "controller_limit_pct",
            Arc::new(controller_limit.finish()),
            false,
        ),
        column("slack_limit_pct", Arc::new(slack_limit.finish()), false),
        column("strict_order", Arc::new(strict_order.finish()), false),
        column("pending_tasks", Arc::new(pending.finish()), false),
        column("running_tasks", Arc::new(running.finish()), false),
    ];
    shares.finish("shares_", &mut columns);
    reservation.finish("reservation_", &mut columns);
    limit.finish("limit_", &mut columns);
    entitlement.finish("entitlement_", &mut columns);
    allocation.finish("allocation_", &mut columns);
    demand.finish("demand_", &mut columns);
    Ok((batch(columns)?, pools.len()))
}

async fn read_tasks(
    jobs: &mut JobServiceClient<LeaderChannel>,
    tasks: &mut TaskServiceClient<LeaderChannel>,
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
    let mut created_at = UInt64Builder::new();
    let mut job_type = StringBuilder::new();
    let mut job_created_at = UInt64Builder::new();
    let mut priority = UInt32Builder::new();
    let mut preemptible = BooleanBuilder::new();
    let mut revocable = BooleanBuilder::new();
    let mut controller = BooleanBuilder::new();
    let mut gang_size = UInt32Builder::new();
    let mut max_running = UInt32Builder::new();
    let mut max_running_time = UInt64Builder::new();
    let mut runtime = UInt64Builder::new();
    let mut runtime_source = StringBuilder::new();
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
            let sla = spec.sla.unwrap_or_default();
            let default_task = spec.default_task.clone().unwrap_or_default();
            let resources = default_task.resources;
            let job_created_at_ms = job.status.as_ref().map_or(0, |s| s.created_at_ms);
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
                    created_at.append_option((run.created_at_ms > 0).then_some(run.created_at_ms));
                    job_type.append_value(name_of::<JobType>(spec.r#type));
                    job_created_at
                        .append_option((job_created_at_ms > 0).then_some(job_created_at_ms));
                    priority.append_value(sla.priority);
                    preemptible.append_value(sla.preemptible);
                    revocable.append_value(default_task.revocable);
                    controller.append_value(default_task.controller);
                    // 0 and 1 both mean "no gang": one column, ≥ 1.
                    gang_size.append_value(sla.min_running_instances.max(1));
                    // 0: no limit.
                    max_running.append_value(sla.max_running_instances);
                    max_running_time.append_option(
                        (sla.max_running_time_ms > 0).then_some(sla.max_running_time_ms),
                    );
                    // The server's estimate (declared, learned or the time
                    // limit); null when unknown.
                    runtime.append_option(
                        (task.expected_runtime_ms > 0).then_some(task.expected_runtime_ms),
                    );
                    if task.expected_runtime_source.is_empty() {
                        runtime_source.append_null();
                    } else {
                        runtime_source.append_value(&task.expected_runtime_source);
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
    let column = |name: &str, values: ArrayRef, nullable: bool| (name.to_owned(), values, nullable);
    let mut columns = vec![
        column("job_id", Arc::new(job_id.finish()), false),
        column("job_name", Arc::new(job_name.finish()), false),
        column("pool", Arc::new(pool.finish()), false),
        column("instance", Arc::new(instance.finish()), false),
        column("state", Arc::new(state.finish()), false),
        column("host", Arc::new(host.finish()), true),
        column("run_id", Arc::new(run_id.finish()), false),
        column("placed_at_ms", Arc::new(placed_at.finish()), true),
        column("started_at_ms", Arc::new(started_at.finish()), true),
        column("pending_reason", Arc::new(pending.finish()), true),
        column("created_at_ms", Arc::new(created_at.finish()), true),
        column("job_type", Arc::new(job_type.finish()), false),
        column("job_created_at_ms", Arc::new(job_created_at.finish()), true),
        column("priority", Arc::new(priority.finish()), false),
        column("preemptible", Arc::new(preemptible.finish()), false),
        column("revocable", Arc::new(revocable.finish()), false),
        column("controller", Arc::new(controller.finish()), false),
        column("gang_size", Arc::new(gang_size.finish()), false),
        column(
            "max_running_instances",
            Arc::new(max_running.finish()),
            false,
        ),
        column(
            "max_running_time_ms",
            Arc::new(max_running_time.finish()),
            true,
        ),
        column("expected_runtime_ms", Arc::new(runtime.finish()), true),
        column(
            "expected_runtime_source",
            Arc::new(runtime_source.finish()),
            true,
        ),
    ];
    request.finish("request_", &mut columns);
    Ok((batch(columns)?, n_jobs, n_tasks))
}
