//! `peloton job usage JOB` and `peloton usage`: the accounts of ended runs
//! (the server's usage ledger, `JobService.ListUsage`), one line per run
//! as Slurm's `sacct`, or summed by owner, job or pool.

use std::sync::Arc;

use anyhow::Result;
use arrow_array::{
    ArrayRef, Float64Array, Int32Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use peloton_proto::v1::job_service_client::JobServiceClient;
use peloton_proto::v1::{ListUsageRequest, TaskState, UsageGroupBy, UsageRecord, UsageSum};
use serde_json::{Value, json};

use super::{Ctx, Outcome};
use crate::cli::{UsageArgs, UsageBy};
use crate::names::name_of;
use crate::output::{
    Align, OutputFormat, Table, fmt_mib, fmt_number, fmt_time_ms, or_dash, print_json, print_out,
};

/// Most pages read for one command (each up to the server's page size).
const MAX_PAGES: usize = 1000;

/// Every page of a usage read.
async fn list_all(
    ctx: &Ctx,
    mut request: ListUsageRequest,
) -> Result<(Vec<UsageRecord>, Vec<UsageSum>)> {
    let mut client = JobServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
    let (mut records, mut sums) = (Vec::new(), Vec::new());
    for _ in 0..MAX_PAGES {
        let page = client.list_usage(request.clone()).await?.into_inner();
        records.extend(page.records);
        sums.extend(page.sums);
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    Ok((records, sums))
}

/// `peloton job usage JOB`.
pub async fn job_usage(
    ctx: &Ctx,
    id: String,
    since: Option<u64>,
    until: Option<u64>,
) -> Result<Outcome> {
    let request = ListUsageRequest {
        job_id: id,
        since_ms: since.unwrap_or(0),
        until_ms: until.unwrap_or(0),
        ..ListUsageRequest::default()
    };
    let (records, _) = list_all(ctx, request).await?;
    match ctx.output {
        OutputFormat::Table => print_out(&record_table(&records))?,
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "runs": records.iter().map(record_json).collect::<Vec<_>>(),
        }))?,
    }
    Ok(Outcome::Success)
}

/// `peloton usage`.
pub async fn usage(ctx: &Ctx, args: UsageArgs) -> Result<Outcome> {
    let group_by = match args.by {
        UsageBy::Owner => UsageGroupBy::Owner,
        UsageBy::Job => UsageGroupBy::Job,
        UsageBy::Pool => UsageGroupBy::Pool,
    };
    let mut request = ListUsageRequest {
        pool: args.pool.unwrap_or_default(),
        owner: args.owner.unwrap_or_default(),
        since_ms: args.since.unwrap_or(0),
        until_ms: args.until.unwrap_or(0),
        group_by: group_by as i32,
        ..ListUsageRequest::default()
    };
    if let Some(path) = args.arrow {
        request.group_by = UsageGroupBy::None as i32;
        let (records, _) = list_all(ctx, request).await?;
        super::cluster::write_ipc(&path, &records_batch(&records)?)?;
        match ctx.output {
            OutputFormat::Table => println!("wrote {} runs to {}", records.len(), path.display()),
            OutputFormat::Json | OutputFormat::Yaml => {
                print_json(&json!({"runs": records.len(), "file": path}))?;
            }
        }
        return Ok(Outcome::Success);
    }
    let (_, sums) = list_all(ctx, request).await?;
    let by = match args.by {
        UsageBy::Owner => "OWNER",
        UsageBy::Job => "JOB",
        UsageBy::Pool => "POOL",
    };
    match ctx.output {
        OutputFormat::Table => print_out(&sum_table(by, &sums))?,
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "by": by.to_lowercase(),
            "sums": sums.iter().map(sum_json).collect::<Vec<_>>(),
        }))?,
    }
    Ok(Outcome::Success)
}

/// Wall time as `[D-]HH:MM:SS` (Slurm's elapsed).
pub(super) fn fmt_elapsed(ms: u64) -> String {
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

fn state_name(state: i32) -> String {
    name_of::<TaskState>(state)
}

pub(super) fn record_table(records: &[UsageRecord]) -> String {
    let mut t = Table::new(&[
        ("INSTANCE", Align::Right),
        ("RUN", Align::Right),
        ("START", Align::Left),
        ("ELAPSED", Align::Right),
        ("STATE", Align::Left),
        ("EXIT", Align::Right),
        ("HOST", Align::Left),
        ("CPU REQ (core-s)", Align::Right),
        ("CPU USED (core-s)", Align::Right),
        ("PEAK MEM", Align::Right),
    ]);
    for r in records {
        t.row(vec![
            r.instance.to_string(),
            r.run.to_string(),
            fmt_time_ms(r.started_at_ms),
            fmt_elapsed(r.wall_ms),
            state_name(r.state),
            r.exit_code.to_string(),
            r.host.clone(),
            fmt_number(r.cpu_requested_core_seconds),
            fmt_number(r.cpu_used_core_seconds),
            fmt_mib(r.memory_peak_bytes as f64 / 1_048_576.0),
        ]);
    }
    t.render()
}

pub(super) fn record_json(r: &UsageRecord) -> Value {
    json!({
        "seq": r.seq,
        "job_id": r.job_id,
        "job_name": r.job_name,
        "pool": r.pool,
        "owner": r.owner,
        "instance": r.instance,
        "run": r.run,
        "host": r.host,
        "started_at_ms": r.started_at_ms,
        "finished_at_ms": r.finished_at_ms,
        "wall_ms": r.wall_ms,
        "state": state_name(r.state),
        "exit_code": r.exit_code,
        "cpu_requested_core_seconds": r.cpu_requested_core_seconds,
        "memory_requested_mib_seconds": r.memory_requested_mib_seconds,
        "disk_requested_mib_seconds": r.disk_requested_mib_seconds,
        "gpu_requested_seconds": r.gpu_requested_seconds,
        "cpu_used_core_seconds": r.cpu_used_core_seconds,
        "memory_peak_bytes": r.memory_peak_bytes,
        "used_until_ms": r.used_until_ms,
    })
}

fn sum_table(by: &'static str, sums: &[UsageSum]) -> String {
    let mut t = Table::new(&[
        (by, Align::Left),
        ("RUNS", Align::Right),
        ("ELAPSED", Align::Right),
        ("CPU REQ (core-s)", Align::Right),
        ("CPU USED (core-s)", Align::Right),
        ("MEM REQ (MiB-s)", Align::Right),
        ("GPU REQ (s)", Align::Right),
        ("PEAK MEM", Align::Right),
    ]);
    for s in sums {
        t.row(vec![
            or_dash(&s.key),
            s.runs.to_string(),
            fmt_elapsed(s.wall_ms),
            fmt_number(s.cpu_requested_core_seconds),
            fmt_number(s.cpu_used_core_seconds),
            fmt_number(s.memory_requested_mib_seconds),
            fmt_number(s.gpu_requested_seconds),
            fmt_mib(s.memory_peak_bytes as f64 / 1_048_576.0),
        ]);
    }
    t.render()
}

fn sum_json(s: &UsageSum) -> Value {
    json!({
        "key": s.key,
        "runs": s.runs,
        "wall_ms": s.wall_ms,
        "cpu_requested_core_seconds": s.cpu_requested_core_seconds,
        "memory_requested_mib_seconds": s.memory_requested_mib_seconds,
        "disk_requested_mib_seconds": s.disk_requested_mib_seconds,
        "gpu_requested_seconds": s.gpu_requested_seconds,
        "cpu_used_core_seconds": s.cpu_used_core_seconds,
        "memory_peak_bytes": s.memory_peak_bytes,
    })
}

/// The records as one Arrow batch, a column per field (the JSON's names).
fn records_batch(records: &[UsageRecord]) -> Result<RecordBatch> {
    let text = |f: fn(&UsageRecord) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(records.iter().map(f)))
    };
    let u64s = |f: fn(&UsageRecord) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(records.iter().map(f)))
    };
    let u32s = |f: fn(&UsageRecord) -> u32| -> ArrayRef {
        Arc::new(UInt32Array::from_iter_values(records.iter().map(f)))
    };
    let f64s = |f: fn(&UsageRecord) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(records.iter().map(f)))
    };
    let states: Vec<String> = records.iter().map(|r| state_name(r.state)).collect();
    Ok(RecordBatch::try_from_iter([
        ("seq", u64s(|r| r.seq)),
        ("job_id", text(|r| &r.job_id)),
        ("job_name", text(|r| &r.job_name)),
        ("pool", text(|r| &r.pool)),
        ("owner", text(|r| &r.owner)),
        ("instance", u32s(|r| r.instance)),
        ("run", u32s(|r| r.run)),
        ("host", text(|r| &r.host)),
        ("started_at_ms", u64s(|r| r.started_at_ms)),
        ("finished_at_ms", u64s(|r| r.finished_at_ms)),
        ("wall_ms", u64s(|r| r.wall_ms)),
        (
            "state",
            Arc::new(StringArray::from_iter_values(&states)) as ArrayRef,
        ),
        (
            "exit_code",
            Arc::new(Int32Array::from_iter_values(
                records.iter().map(|r| r.exit_code),
            )),
        ),
        (
            "cpu_requested_core_seconds",
            f64s(|r| r.cpu_requested_core_seconds),
        ),
        (
            "memory_requested_mib_seconds",
            f64s(|r| r.memory_requested_mib_seconds),
        ),
        (
            "disk_requested_mib_seconds",
            f64s(|r| r.disk_requested_mib_seconds),
        ),
        ("gpu_requested_seconds", f64s(|r| r.gpu_requested_seconds)),
        ("cpu_used_core_seconds", f64s(|r| r.cpu_used_core_seconds)),
        ("memory_peak_bytes", u64s(|r| r.memory_peak_bytes)),
        ("used_until_ms", u64s(|r| r.used_until_ms)),
    ])?)
}
