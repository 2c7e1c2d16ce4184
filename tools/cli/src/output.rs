//! Rendering API messages for people (aligned tables, human units) and for
//! programs (JSON).
//!
//! JSON is built by hand because prost messages do not derive `Serialize`.
//! Field names are the proto's; enum values use the CLI's lower-case names
//! (`running`), the same words the flags accept; an unset message renders as
//! its default value, so every object has the same shape; map fields come out
//! with sorted keys.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use peloton_proto::v1::{
    Event, Host, HostState, Job, JobSpec, JobState, JobStatus, Pool, PoolKind, PoolSpec,
    PoolStatus, ResourceUsage, Resources, StartForecast, StateCount, Task, TaskRun, TaskSpec,
    TaskState, event,
};
use serde_json::{Value, json};

use crate::names::{ProtoEnum, name_of};

/// How results are printed (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputArg {
    /// Aligned columns for people.
    Table,
    /// JSON (one line per event for `watch`).
    Json,
    /// YAML: the JSON's fields; for `job get`, the job's spec file, which
    /// `job create` and `job update` take back.
    Yaml,
    /// The table with more columns (`job query`/`get`, `task list`/`get`,
    /// `host list`, `respool list`/`get`; elsewhere the table).
    Wide,
    /// One `KIND/ID` a line for pipes (`job/ID`, `task/JOB/INSTANCE`,
    /// `host/NAME`, `respool/PATH` without the path's leading `/`), for the
    /// same commands. A job is taken as `job/ID` wherever its id is.
    Name,
}

impl OutputArg {
    /// The format commands print in (wide and name are tables) and how a
    /// table looks.
    pub fn split(self) -> (OutputFormat, View) {
        match self {
            OutputArg::Table => (OutputFormat::Table, View::Plain),
            OutputArg::Json => (OutputFormat::Json, View::Plain),
            OutputArg::Yaml => (OutputFormat::Yaml, View::Plain),
            OutputArg::Wide => (OutputFormat::Table, View::Wide),
            OutputArg::Name => (OutputFormat::Table, View::Name),
        }
    }
}

/// How results are printed: `-o` but for how a table looks ([`View`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Aligned columns (`-o table`, `-o wide`, `-o name`).
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// How a list or get command shows its table (`-o wide`, `-o name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum View {
    /// The usual columns.
    #[default]
    Plain,
    /// More columns.
    Wide,
    /// `KIND/ID` lines.
    Name,
}

/// Whether [`print_json`] writes YAML (`-o yaml`), set once at start.
static STRUCTURED_AS_YAML: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes [`print_json`] write YAML (`-o yaml`) or JSON.
pub fn set_output(format: OutputFormat) {
    STRUCTURED_AS_YAML.store(
        format == OutputFormat::Yaml,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Writes `-o name`'s lines (`KIND/ID`), one a line; nothing for none.
pub fn print_names(names: impl IntoIterator<Item = String>) -> io::Result<()> {
    let names: Vec<String> = names.into_iter().collect();
    if names.is_empty() {
        return Ok(());
    }
    print_out(&names.join("\n"))
}

/// Writes `text` to stdout; a closed pipe comes back as an error for the
/// caller to end quietly on.
pub fn print_out(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        stdout.write_all(b"\n")?;
    }
    stdout.flush()
}

/// Pretty-printed JSON for one response (YAML with `-o yaml`).
pub fn print_json(value: &Value) -> io::Result<()> {
    let text = if STRUCTURED_AS_YAML.load(std::sync::atomic::Ordering::Relaxed) {
        serde_norway::to_string(value).map_err(io::Error::other)?
    } else {
        serde_json::to_string_pretty(value).map_err(io::Error::other)?
    };
    print_out(&text)
}

// ---------------------------------------------------------------- tables

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table with a header row; columns are as wide as their widest cell and
/// separated by two spaces.
#[derive(Debug)]
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it must have one cell per column.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.columns.len(), "one cell per column");
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let header: Vec<String> = self.columns.iter().map(|(h, _)| (*h).to_owned()).collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                match self.columns[i].1 {
                    Align::Left => {
                        line.push_str(cell);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `KEY: value` lines with the values aligned, for one entity.
pub fn render_fields(fields: &[(&str, String)]) -> String {
    let width = fields.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in fields {
        let key = format!("{key}:");
        out.push_str(format!("{key:<width$}  {value}").trim_end());
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------- units

/// A number with at most three decimals and no trailing zeros: `2`, `0.5`.
pub fn fmt_number(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

/// MiB in the largest unit that keeps the number readable: `512 MiB`, `16 GiB`.
pub fn fmt_mib(mib: f64) -> String {
    if mib.abs() >= 1024.0 * 1024.0 {
        format!("{} TiB", fmt_number(mib / (1024.0 * 1024.0)))
    } else if mib.abs() >= 1024.0 {
        format!("{} GiB", fmt_number(mib / 1024.0))
    } else {
        format!("{} MiB", fmt_number(mib))
    }
}

/// Resources on one line, zero dimensions left out: `2 cpu, 4 GiB mem, 1 gpu`;
/// `-` when every dimension is zero (for a limit: no limit).
pub fn fmt_resources(r: Option<&Resources>) -> String {
    let r = r.copied().unwrap_or_default();
    let mut parts = Vec::new();
    if r.cpu != 0.0 {
        parts.push(format!("{} cpu", fmt_number(r.cpu)));
    }
    if r.memory_mb != 0.0 {
        parts.push(format!("{} mem", fmt_mib(r.memory_mb)));
    }
    if r.disk_mb != 0.0 {
        parts.push(format!("{} disk", fmt_mib(r.disk_mb)));
    }
    if r.gpu != 0.0 {
        parts.push(format!("{} gpu", fmt_number(r.gpu)));
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// Measured usage on one line: `1.02 cpu, 210 MiB mem (peak 250 MiB)`;
/// `-` when none was reported.
pub fn fmt_usage(u: Option<&ResourceUsage>) -> String {
    let Some(u) = u else {
        return "-".to_owned();
    };
    let mut text = format!(
        "{} cpu, {} mem",
        fmt_number((u.cpu * 100.0).round() / 100.0),
        fmt_mib(u.memory_mb.round())
    );
    if u.memory_peak_mb.round() > u.memory_mb.round() {
        text.push_str(&format!(" (peak {})", fmt_mib(u.memory_peak_mb.round())));
    }
    if u.disk_mb > 0.0 {
        text.push_str(&format!(", {} disk", fmt_mib(u.disk_mb.round())));
    }
    text
}

/// Milliseconds since the Unix epoch as UTC `YYYY-MM-DD HH:MM:SS`; `-` for 0.
pub fn fmt_time_ms(ms: u64) -> String {
    if ms == 0 {
        return "-".to_owned();
    }
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's `civil_from_days` for days since 1970-01-01 (no time
/// zone database needed for UTC).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// `k=v` pairs sorted by key, comma separated; `-` when empty.
pub fn fmt_map(map: &HashMap<String, String>) -> String {
    if map.is_empty() {
        return "-".to_owned();
    }
    let sorted: BTreeMap<_, _> = map.iter().collect();
    let pairs: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// Task counts by state as `running 3, pending 1`, in state order; `-` when none.
pub fn fmt_task_counts(counts: &[StateCount]) -> String {
    let mut counts: Vec<&StateCount> = counts.iter().filter(|c| c.count > 0).collect();
    counts.sort_by_key(|c| c.state);
    if counts.is_empty() {
        return "-".to_owned();
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|c| format!("{} {}", name_of::<TaskState>(c.state), c.count))
        .collect();
    parts.join(", ")
}

/// `-` for an empty string, so table cells are never blank.
pub fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

// ---------------------------------------------------------------- JSON

fn enum_json<E: ProtoEnum>(raw: i32) -> Value {
    Value::String(name_of::<E>(raw))
}

fn map_json(map: &HashMap<String, String>) -> Value {
    let sorted: serde_json::Map<String, Value> = map
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    Value::Object(sorted)
}

/// Measured usage (`null` when none was reported).
/// A start forecast as JSON (null when there is none).
pub fn forecast_json(f: Option<&StartForecast>) -> Value {
    match f {
        None => Value::Null,
        Some(f) => json!({
            "start_ms": f.start_ms,
            "earliest_ms": f.earliest_ms,
            "host": f.host,
            "queue_position": f.queue_position,
            "made_at_ms": f.made_at_ms,
        }),
    }
}

/// A start forecast in words: `~TIME on HOST, queue position N` (with the
/// earliest when it differs), or why there is no time.
pub fn fmt_forecast(f: Option<&StartForecast>) -> String {
    let Some(f) = f else {
        return "-".to_owned();
    };
    let mut out = if f.start_ms == 0 {
        "not foreseen (waits for work with no runtime estimate, or over 7 days)".to_owned()
    } else {
        format!("~{}", fmt_time_ms(f.start_ms))
    };
    if f.earliest_ms != 0 && f.earliest_ms != f.start_ms {
        out.push_str(&format!(" (earliest {})", fmt_time_ms(f.earliest_ms)));
    }
    if !f.host.is_empty() {
        out.push_str(&format!(" on {}", f.host));
    }
    if f.queue_position > 0 {
        out.push_str(&format!(", queue position {}", f.queue_position));
    }
    out
}

pub fn usage_json(u: Option<&ResourceUsage>) -> Value {
    match u {
        None => Value::Null,
        Some(u) => json!({
            "cpu": u.cpu,
            "memory_mb": u.memory_mb,
            "memory_peak_mb": u.memory_peak_mb,
            "disk_mb": u.disk_mb,
            "reported_at_ms": u.reported_at_ms,
        }),
    }
}

pub fn resources_json(r: Option<&Resources>) -> Value {
    let r = r.copied().unwrap_or_default();
    json!({"cpu": r.cpu, "memory_mb": r.memory_mb, "disk_mb": r.disk_mb, "gpu": r.gpu})
}

pub fn pool_spec_json(spec: Option<&PoolSpec>) -> Value {
    let spec = spec.copied().unwrap_or_default();
    json!({
        "reservation": resources_json(spec.reservation.as_ref()),
        "limit": resources_json(spec.limit.as_ref()),
        "share": spec.share,
        "shares": spec.shares.as_ref().map(|s| resources_json(Some(s))),
        "kind": enum_json::<PoolKind>(spec.kind),
        "controller_limit_pct": spec.controller_limit_pct,
        "slack_limit_pct": spec.slack_limit_pct,
        "strict_order": spec.strict_order,
    })
}

pub fn pool_status_json(status: Option<&PoolStatus>) -> Value {
    let status = status.copied().unwrap_or_default();
    json!({
        "entitlement": resources_json(status.entitlement.as_ref()),
        "allocation": resources_json(status.allocation.as_ref()),
        "demand": resources_json(status.demand.as_ref()),
        "pending_tasks": status.pending_tasks,
        "running_tasks": status.running_tasks,
        "used": usage_json(status.used.as_ref()),
    })
}

pub fn pool_json(pool: &Pool) -> Value {
    json!({
        "path": pool.path,
        "spec": pool_spec_json(pool.spec.as_ref()),
        "status": pool_status_json(pool.status.as_ref()),
        "version": pool.version,
        "children": pool.children,
    })
}

pub fn task_spec_json(spec: Option<&TaskSpec>) -> Value {
    let spec = spec.cloned().unwrap_or_default();
    let restart = spec.restart.unwrap_or_default();
    let sim = spec.sim.unwrap_or_default();
    json!({
        "command": spec.command,
        "args": spec.args,
        "shell": spec.shell,
        "env": map_json(&spec.env),
        "resources": resources_json(spec.resources.as_ref()),
        "ports": spec.ports.iter().map(|p| json!({"name": p.name})).collect::<Vec<_>>(),
        "constraint": spec.constraint,
        "restart": {
            "max_failures": restart.max_failures,
            "backoff_ms": restart.backoff_ms,
            "max_backoff_ms": restart.max_backoff_ms,
        },
        "revocable": spec.revocable,
        "controller": spec.controller,
        "kill_grace_period_ms": spec.kill_grace_period_ms,
        "shutdown_delay_ms": spec.shutdown_delay_ms,
        "preemption_notice_ms": spec.preemption_notice_ms,
        "expected_runtime_ms": spec.expected_runtime_ms,
        "sim": {"duration_ms": sim.duration_ms, "exit_code": sim.exit_code},
        "max_instances_per_host": spec.max_instances_per_host,
        "health_check": spec.health_check.as_ref().map(health_check_json),
        "volume": spec.volume.as_ref().map(|v| json!({
            "size_mb": v.size_mb,
            "path": v.path,
        })),
    })
}

fn health_check_json(h: &peloton_proto::v1::HealthCheck) -> Value {
    use peloton_proto::v1::health_check::Kind;
    let kind = match &h.kind {
        Some(Kind::Command(c)) => json!({"command": c}),
        Some(Kind::Http(http)) => json!({"http": {"port": http.port, "path": http.path}}),
        Some(Kind::TcpPort(p)) => json!({"tcp_port": p}),
        None => json!({}),
    };
    let mut v = kind;
    v["initial_delay_ms"] = json!(h.initial_delay_ms);
    v["interval_ms"] = json!(h.interval_ms);
    v["timeout_ms"] = json!(h.timeout_ms);
    v["max_consecutive_failures"] = json!(h.max_consecutive_failures);
    v
}

/// A job's spec as JSON: its spec file ([`crate::spec::JobFile`], what
/// `job get -o yaml` prints and `job create` reads), so that every field
/// has the one name of the file; fields at their defaults are left out, as
/// in the file. Secrets are not in a file: [`job_json`] lists them beside.
pub fn job_spec_json(spec: Option<&JobSpec>) -> Value {
    let file = crate::spec::JobFile::from_proto(&spec.cloned().unwrap_or_default());
    serde_json::to_value(file).expect("a spec file is JSON")
}

/// A cron job's schedule in words: `*/5 * * * * (Europe/Berlin), overlap
/// forbid, keep 3 succeeded, 1 failed`.
pub fn fmt_schedule(s: &peloton_proto::v1::CronSchedule) -> String {
    let tz = if s.time_zone.is_empty() {
        "UTC"
    } else {
        &s.time_zone
    };
    format!(
        "{} ({tz}), overlap {}, keep {} succeeded, {} failed",
        s.cron,
        crate::names::name_of::<peloton_proto::v1::CronOverlap>(s.overlap),
        s.keep_succeeded.unwrap_or(3),
        s.keep_failed.unwrap_or(1)
    )
}

/// Jobs a job waits for, by how each must end, as JSON.
pub fn dependencies_json(d: &peloton_proto::v1::JobDependencies) -> Value {
    json!({
        "succeeded": d.succeeded,
        "finished": d.finished,
        "failed": d.failed,
    })
}

/// Jobs a job waits for in words: `succeeded: A, B; failed: C` ("-" for
/// none).
pub fn fmt_dependencies(d: Option<&peloton_proto::v1::JobDependencies>) -> String {
    let Some(d) = d else {
        return "-".to_owned();
    };
    let parts: Vec<String> = [
        ("succeeded", &d.succeeded),
        ("finished", &d.finished),
        ("failed", &d.failed),
    ]
    .into_iter()
    .filter(|(_, jobs)| !jobs.is_empty())
    .map(|(how, jobs)| format!("{how}: {}", jobs.join(", ")))
    .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join("; ")
    }
}

pub fn job_status_json(status: Option<&JobStatus>) -> Value {
    let status = status.cloned().unwrap_or_default();
    json!({
        "state": enum_json::<JobState>(status.state),
        "created_at_ms": status.created_at_ms,
        "completed_at_ms": status.completed_at_ms,
        "task_counts": status.task_counts.iter().map(|c| json!({
            "state": enum_json::<TaskState>(c.state),
            "count": c.count,
        })).collect::<Vec<_>>(),
        "kill_requested": status.kill_requested,
        "config_version": status.config_version,
        "update_id": status.update_id,
        "used": usage_json(status.used.as_ref()),
        "forecast": forecast_json(status.forecast.as_ref()),
        "waiting_for": status.waiting_for.as_ref().map(dependencies_json),
        "cron": status.cron.as_ref().map(|c| json!({
            "next_tick_ms": c.next_tick_ms,
            "last_tick_ms": c.last_tick_ms,
            "ticks": c.ticks.iter().map(|t| json!({
                "tick_ms": t.tick_ms,
                "job_id": t.job_id,
            })).collect::<Vec<_>>(),
            "last_skip": c.last_skip,
            "suspended": c.suspended,
        })),
    })
}

pub fn job_json(job: &Job) -> Value {
    let secrets = job.spec.as_ref().map_or(&[][..], |s| &s.secrets[..]);
    json!({
        "id": job.id,
        "spec": job_spec_json(job.spec.as_ref()),
        // Names and sizes only: values are never readable.
        "secrets": secrets.iter().map(|s| json!({
            "name": s.name,
            "size": s.size,
        })).collect::<Vec<_>>(),
        "status": job_status_json(job.status.as_ref()),
        "version": job.version,
    })
}

pub fn task_run_json(run: Option<&TaskRun>) -> Value {
    let run = run.cloned().unwrap_or_default();
    json!({
        "run_id": run.run_id,
        "state": enum_json::<TaskState>(run.state),
        "host": run.host,
        "created_at_ms": run.created_at_ms,
        "placed_at_ms": run.placed_at_ms,
        "started_at_ms": run.started_at_ms,
        "finished_at_ms": run.finished_at_ms,
        "exit_code": run.exit_code,
        "reason": run.reason,
        "launch_id": run.launch_id,
        "health": enum_json::<peloton_proto::v1::Health>(run.health),
        "ports": run.ports.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<String, Value>>(),
        "used": usage_json(run.used.as_ref()),
        "gpu_devices": run.gpu_devices,
        "gpu_share_milli": run.gpu_share_milli,
        "last_checkpoint_ms": run.last_checkpoint_ms,
        "lost_work_ms": run.lost_work_ms,
    })
}

pub fn task_json(task: &Task) -> Value {
    json!({
        "job_id": task.job_id,
        "instance": task.instance,
        "current": task_run_json(task.current.as_ref()),
        "failure_count": task.failure_count,
        "max_failures": task.max_failures,
        "pending_reason": task.pending_reason,
        "history": task.history.iter().map(|r| task_run_json(Some(r))).collect::<Vec<_>>(),
        "stopping": task.stopping,
        "restart_when_stopped": task.restart_when_stopped,
        "config_version": task.config_version,
        "volume_id": task.volume_id,
        "pinned_host": task.pinned_host,
        "expected_runtime_ms": task.expected_runtime_ms,
        "expected_runtime_source": task.expected_runtime_source,
        "forecast": forecast_json(task.forecast.as_ref()),
    })
}

pub fn host_json(host: &Host) -> Value {
    json!({
        "name": host.name,
        "capacity": resources_json(host.capacity.as_ref()),
        "free": resources_json(host.free.as_ref()),
        "state": enum_json::<HostState>(host.state),
        "attributes": map_json(&host.attributes),
        "tasks": host.tasks.iter().map(|t| json!({
            "job_id": t.job_id,
            "instance": t.instance,
        })).collect::<Vec<_>>(),
        "tasks_total": host.tasks_total,
        "connected": host.connected,
        "last_seen_ms": host.last_seen_ms,
        "isolation": host.isolation,
        "address": host.address,
        "host_pool": host.host_pool,
        "volumes_disk_mb": host.volumes_disk_mb,
        "used": usage_json(host.used.as_ref()),
        "reserved_for": host.reserved_for.iter().map(|r| {
            let head = r.head.clone().unwrap_or_default();
            json!({
                "job_id": head.job_id,
                "instance": head.instance,
                "tasks": r.tasks,
                "from_ms": r.from_ms,
                "pool": r.pool,
            })
        }).collect::<Vec<_>>(),
    })
}

pub fn event_json(event: &Event) -> Value {
    let mut object = json!({"revision": event.revision, "time_ms": event.time_ms});
    let (key, kind) = match &event.kind {
        Some(event::Kind::Job(job)) => (
            "job",
            json!({
                "job_id": job.job_id,
                "state": enum_json::<JobState>(job.state),
                "deleted": job.deleted,
                "reason": job.reason,
            }),
        ),
        Some(event::Kind::Task(task)) => (
            "task",
            json!({
                "job_id": task.job_id,
                "instance": task.instance,
                "run_id": task.run_id,
                "state": enum_json::<TaskState>(task.state),
                "host": task.host,
                "reason": task.reason,
                "health": enum_json::<peloton_proto::v1::Health>(task.health),
            }),
        ),
        None => return object,
    };
    object[key] = kind;
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut table = Table::new(&[
            ("NAME", Align::Left),
            ("CPU", Align::Right),
            ("X", Align::Left),
        ]);
        table.row(vec!["a".into(), "0.5".into(), "-".into()]);
        table.row(vec!["longer".into(), "16".into(), "".into()]);
        assert_eq!(
            table.render(),
            "NAME    CPU  X\n\
             a       0.5  -\n\
             longer   16\n"
        );
    }

    #[test]
    fn usage_is_one_line_with_a_peak_only_above_the_memory_now() {
        assert_eq!(fmt_usage(None), "-");
        let mut u = ResourceUsage {
            cpu: 1.0234,
            memory_mb: 204.4,
            memory_peak_mb: 204.2,
            ..Default::default()
        };
        assert_eq!(fmt_usage(Some(&u)), "1.02 cpu, 204 MiB mem");
        u.memory_peak_mb = 2048.0;
        u.disk_mb = 10.0;
        assert_eq!(
            fmt_usage(Some(&u)),
            "1.02 cpu, 204 MiB mem (peak 2 GiB), 10 MiB disk"
        );
        assert_eq!(usage_json(None), Value::Null);
        assert_eq!(usage_json(Some(&u))["memory_peak_mb"], 2048.0);
    }

    #[test]
    fn units_are_human() {
        assert_eq!(fmt_number(2.0), "2");
        assert_eq!(fmt_number(0.125), "0.125");
        assert_eq!(fmt_number(0.0), "0");
        assert_eq!(fmt_mib(512.0), "512 MiB");
        assert_eq!(fmt_mib(16384.0), "16 GiB");
        assert_eq!(fmt_mib(1536.0), "1.5 GiB");
        let r = Resources {
            cpu: 0.5,
            memory_mb: 128.0,
            disk_mb: 0.0,
            gpu: 1.0,
        };
        assert_eq!(fmt_resources(Some(&r)), "0.5 cpu, 128 MiB mem, 1 gpu");
        assert_eq!(fmt_resources(None), "-");
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(fmt_time_ms(0), "-");
        assert_eq!(fmt_time_ms(1), "1970-01-01 00:00:00");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(fmt_time_ms(1_709_210_096_000), "2024-02-29 12:34:56");
    }

    #[test]
    fn json_uses_proto_field_names_and_cli_enum_names() {
        let task = Task {
            job_id: "j1".into(),
            instance: 3,
            current: Some(TaskRun {
                run_id: 2,
                state: TaskState::Running.into(),
                host: "h1".into(),
                ..TaskRun::default()
            }),
            failure_count: 1,
            pending_reason: String::new(),
            history: vec![],
            ..Task::default()
        };
        let value = task_json(&task);
        assert_eq!(value["current"]["state"], "running");
        assert_eq!(value["current"]["run_id"], 2);
        assert_eq!(value["failure_count"], 1);
        assert_eq!(value["history"], json!([]));

        let event = Event {
            revision: 7,
            time_ms: 1,
            kind: Some(event::Kind::Task(peloton_proto::v1::TaskEvent {
                job_id: "j1".into(),
                instance: 0,
                run_id: 1,
                state: TaskState::Succeeded.into(),
                host: "h1".into(),
                reason: String::new(),
                health: 0,
            })),
        };
        let value = event_json(&event);
        assert_eq!(value["revision"], 7);
        assert_eq!(value["task"]["state"], "succeeded");
        assert!(value.get("job").is_none());
    }

    #[test]
    fn task_counts_are_in_state_order() {
        let counts = [
            StateCount {
                state: TaskState::Succeeded.into(),
                count: 2,
            },
            StateCount {
                state: TaskState::Running.into(),
                count: 1,
            },
            StateCount {
                state: TaskState::Pending.into(),
                count: 0,
            },
        ];
        assert_eq!(fmt_task_counts(&counts), "running 1, succeeded 2");
    }
}
