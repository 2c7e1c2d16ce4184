//! Conversions between the API (`peloton.v1`) and the engine, with the
//! validation of everything a user sends. Every error names the field and
//! the problem; validation happens before anything changes.

use std::sync::Arc;

use peloton_engine::constraint::Constraint;
use peloton_engine::intern::Interner;
use peloton_engine::task::Strategy;
use peloton_engine::{Dim, DimConfig, MAX_AMOUNT, PoolConfig, PoolKind, Resources};
use peloton_proto::v1 as pb;
use prost::Message;
use rustc_hash::FxHashMap;
use tonic::Status;

/// Bounds on what one request may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Instances of one job.
    pub max_instances_per_job: u32,
    /// Dynamic ports of one task.
    pub max_ports: usize,
    /// Arguments, environment entries and labels of one spec.
    pub max_list_len: usize,
    /// Bytes of any one string.
    pub max_string_len: usize,
    /// Per-instance overrides of one job.
    pub max_overrides: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_instances_per_job: 100_000,
            max_ports: 64,
            max_list_len: 1024,
            max_string_len: 64 * 1024,
            max_overrides: 10_000,
        }
    }
}

/// An InvalidArgument status naming the field (its message bounded like
/// every status the server sends, `crate::status::contract`).
pub fn invalid(field: &str, problem: impl std::fmt::Display) -> Status {
    crate::status::contract(Status::invalid_argument(format!("{field}: {problem}")))
}

/// Longest id (of a job, an update, a volume), host name, label or
/// environment key: 256 bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest job name or owner: 1 KiB.
pub const MAX_NAME_BYTES: usize = 1024;
/// Longest pool path: 16 levels of names of 64 bytes.
pub const MAX_POOL_PATH_BYTES: usize =
    peloton_engine::pool::MAX_DEPTH * (peloton_engine::pool::MAX_NAME_LEN + 1);
/// Characters of a user's string that a message quotes.
const SHOWN_CHARS: usize = 64;

/// A user's string as messages quote it: in quotes, its first 64
/// characters, then "…" if it is longer.
pub fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}…", &value[..end]),
    }
}

/// Refuses a string longer than `max` bytes: the field, the limit and the
/// string's first characters.
pub fn bounded(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(invalid(
            field,
            format!(
                "{} bytes is longer than the limit of {max} (it starts {})",
                value.len(),
                shown(value)
            ),
        ));
    }
    Ok(())
}

/// Most bytes of an agent's free text that reaches the API (a run's
/// reason, a health check's detail, a host's isolation): 1 KiB. Events
/// and reads carry it, so it is bounded where it comes in.
pub const MAX_AGENT_TEXT_BYTES: usize = 1024;

/// An agent's free text cut to [`MAX_AGENT_TEXT_BYTES`] at a character
/// boundary, with "…" where it was cut.
pub fn agent_text(text: String) -> String {
    match crate::status::truncate(&text, MAX_AGENT_TEXT_BYTES) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(cut) => cut,
    }
}

/// Refuses an id longer than [`MAX_ID_BYTES`].
pub fn id(field: &str, value: &str) -> Result<(), Status> {
    bounded(field, value, MAX_ID_BYTES)
}

/// Refuses a new job's name that could not name it in place of its id:
/// one with a `/` (`POOL/NAME` names a job of that pool) or a control
/// character. (Its length and emptiness are [`job_plan`]'s checks; names
/// kept before this rule are left as they are.)
pub fn job_name(field: &str, value: &str) -> Result<(), Status> {
    if value.contains('/') {
        return Err(invalid(
            field,
            format!("{value:?} has a '/': a job is named NAME or POOL/NAME in place of its id"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "has a control character"));
    }
    Ok(())
}

/// Refuses a pool path longer than [`MAX_POOL_PATH_BYTES`].
pub fn pool_path(field: &str, value: &str) -> Result<(), Status> {
    bounded(field, value, MAX_POOL_PATH_BYTES)
}

use crate::lifecycle::{
    AfterCondition, AppPlan, Dependency, Health, JobKind, JobState, LaunchId, RunRecord, TaskState,
    VolumePolicy,
};
pub use crate::lifecycle::{JobPlan, RestartPolicy, TaskTemplate};

fn amount(field: &str, value: f64, scale: f64) -> Result<u64, Status> {
    if !value.is_finite() {
        return Err(invalid(field, "must be a finite number"));
    }
    if value < 0.0 {
        return Err(invalid(
            field,
            format!("must not be negative (got {value})"),
        ));
    }
    let units = (value * scale).ceil();
    if units > MAX_AMOUNT as f64 {
        return Err(invalid(field, format!("{value} is too large")));
    }
    Ok(units as u64)
}

/// API resources to engine units (millicores, MiB, MiB, milli-GPUs).
pub fn resources(field: &str, r: Option<&pb::Resources>) -> Result<Resources, Status> {
    let Some(r) = r else {
        return Ok(Resources::ZERO);
    };
    let mut out = Resources::ZERO;
    out[Dim::Cpu] = amount(&format!("{field}.cpu"), r.cpu, 1000.0)?;
    out[Dim::Memory] = amount(&format!("{field}.memory_mb"), r.memory_mb, 1.0)?;
    out[Dim::Disk] = amount(&format!("{field}.disk_mb"), r.disk_mb, 1.0)?;
    out[Dim::Gpu] = amount(&format!("{field}.gpu"), r.gpu, 1000.0)?;
    Ok(out)
}

/// Engine units to API resources.
pub fn resources_to_pb(r: Resources) -> pb::Resources {
    pb::Resources {
        cpu: r[Dim::Cpu] as f64 / 1000.0,
        memory_mb: r[Dim::Memory] as f64,
        disk_mb: r[Dim::Disk] as f64,
        gpu: r[Dim::Gpu] as f64 / 1000.0,
    }
}

/// The indices of a run's GPU devices, ascending (`gpu_devices` of the
/// launch and of `TaskRun`).
pub fn gpu_device_indices(g: peloton_engine::host::GpuGrant) -> Vec<u32> {
    (0..16).filter(|i| g.devices & (1 << i) != 0).collect()
}

/// A run's share of its one GPU device in milli-GPUs; 0 for whole devices
/// or none (`gpu_share_milli`).
pub fn gpu_share_milli(g: peloton_engine::host::GpuGrant) -> u32 {
    if g.devices != 0 && u64::from(g.milli_per_device) < peloton_engine::host::MILLI_GPUS_PER_DEVICE
    {
        u32::from(g.milli_per_device)
    } else {
        0
    }
}

/// Measured usage in the API's units (cores, MiB).
pub fn usage_to_pb(u: &crate::lifecycle::usage::Usage) -> pb::ResourceUsage {
    const MIB: f64 = (1u64 << 20) as f64;
    pb::ResourceUsage {
        cpu: u.cpu_millis as f64 / 1000.0,
        memory_mb: u.memory_bytes as f64 / MIB,
        memory_peak_mb: u.memory_peak_bytes as f64 / MIB,
        disk_mb: u.disk_bytes as f64 / MIB,
        reported_at_ms: u.reported_at,
    }
}

fn limit_to_pb(r: Resources) -> pb::Resources {
    let mut out = resources_to_pb(r);
    for (d, v) in [
        (Dim::Cpu, &mut out.cpu),
        (Dim::Memory, &mut out.memory_mb),
        (Dim::Disk, &mut out.disk_mb),
        (Dim::Gpu, &mut out.gpu),
    ] {
        if r[d] >= MAX_AMOUNT {
            *v = 0.0;
        }
    }
    out
}

fn percent(field: &str, value: f64) -> Result<f64, Status> {
    if !value.is_finite() || !(0.0..=100.0).contains(&value) {
        return Err(invalid(field, format!("must be 0–100 (got {value})")));
    }
    Ok(if value == 0.0 { 100.0 } else { value })
}

/// A share (weight) as the engine takes it: finite, in
/// [`peloton_engine::pool::MIN_SHARE`, `MAX_SHARE`].
fn share_weight(field: &str, value: f64) -> Result<f64, Status> {
    use peloton_engine::pool::{MAX_SHARE, MIN_SHARE};
    if !value.is_finite() {
        return Err(invalid(field, "must be a finite number"));
    }
    if value <= 0.0 {
        return Err(invalid(field, format!("must be positive (got {value})")));
    }
    if !(MIN_SHARE..=MAX_SHARE).contains(&value) {
        return Err(invalid(
            field,
            format!("must be between {MIN_SHARE} and {MAX_SHARE} (got {value})"),
        ));
    }
    Ok(value)
}

/// A pool spec to the engine's configuration.
pub fn pool_config(spec: Option<&pb::PoolSpec>) -> Result<PoolConfig, Status> {
    let default = pb::PoolSpec::default();
    let spec = spec.unwrap_or(&default);
    let reservation = resources("spec.reservation", spec.reservation.as_ref())?;
    let mut limit = resources("spec.limit", spec.limit.as_ref())?;
    for d in Dim::ALL {
        if limit[d] == 0 {
            limit[d] = MAX_AMOUNT;
        }
    }
    let share = if spec.share == 0.0 {
        1.0
    } else {
        share_weight("spec.share", spec.share)?
    };
    let shares = spec.shares.unwrap_or_default();
    let mut share_of = [share; 4];
    for (d, field, value) in [
        (Dim::Cpu, "spec.shares.cpu", shares.cpu),
        (Dim::Memory, "spec.shares.memory_mb", shares.memory_mb),
        (Dim::Disk, "spec.shares.disk_mb", shares.disk_mb),
        (Dim::Gpu, "spec.shares.gpu", shares.gpu),
    ] {
        if value != 0.0 {
            share_of[d.idx()] = share_weight(field, value)?;
        }
    }
    let kind = match pb::PoolKind::try_from(spec.kind) {
        Ok(pb::PoolKind::Elastic) => PoolKind::Elastic,
        Ok(pb::PoolKind::Static) => PoolKind::Static,
        Err(_) => return Err(invalid("spec.kind", format!("unknown kind {}", spec.kind))),
    };
    let mut config = PoolConfig {
        dims: [DimConfig::default(); 4],
        controller_limit_pct: percent("spec.controller_limit_pct", spec.controller_limit_pct)?,
        slack_limit_pct: percent("spec.slack_limit_pct", spec.slack_limit_pct)?,
        strict_order: spec.strict_order,
    };
    for d in Dim::ALL {
        config.dims[d.idx()] = DimConfig {
            reservation: reservation[d],
            limit: limit[d],
            share: share_of[d.idx()],
            kind,
        };
    }
    Ok(config)
}

/// The engine's configuration of a pool back to the API.
pub fn pool_spec_to_pb(config: &PoolConfig) -> pb::PoolSpec {
    pb::PoolSpec {
        // The root's reservation is "everything": shown as unset, like an
        // unset limit.
        reservation: Some(limit_to_pb(config.reservation())),
        limit: Some(limit_to_pb(config.limit())),
        share: config.dims[0].share,
        kind: match config.dims[0].kind {
            PoolKind::Elastic => pb::PoolKind::Elastic,
            PoolKind::Static => pb::PoolKind::Static,
        } as i32,
        controller_limit_pct: config.controller_limit_pct,
        slack_limit_pct: config.slack_limit_pct,
        strict_order: config.strict_order,
        // Per dimension only where they differ, so that a pool created with
        // one `share` reads back as it was sent.
        shares: config
            .dims
            .iter()
            .any(|d| d.share != config.dims[0].share)
            .then(|| pb::Resources {
                cpu: config.dims[Dim::Cpu.idx()].share,
                memory_mb: config.dims[Dim::Memory.idx()].share,
                disk_mb: config.dims[Dim::Disk.idx()].share,
                gpu: config.dims[Dim::Gpu.idx()].share,
            }),
    }
}

fn string(field: &str, value: &str, limits: &Limits) -> Result<(), Status> {
    bounded(field, value, limits.max_string_len)
}

fn list(field: &str, len: usize, limits: &Limits) -> Result<(), Status> {
    if len > limits.max_list_len {
        return Err(invalid(
            field,
            format!("{len} entries; the limit is {}", limits.max_list_len),
        ));
    }
    Ok(())
}

/// Signals a task may ask to be stopped with (before SIGKILL).
pub const STOP_SIGNALS: [&str; 7] = [
    "SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGPWR",
];

/// Validates a task spec (`field` is its path in the request).
pub fn task_template(
    field: &str,
    spec: Option<&pb::TaskSpec>,
    limits: &Limits,
) -> Result<TaskTemplate, Status> {
    let Some(spec) = spec else {
        return Err(invalid(field, "missing"));
    };
    check_command(field, spec, limits)?;
    let request = resources(&format!("{field}.resources"), spec.resources.as_ref())?;
    if request[Dim::Cpu] == 0 && request[Dim::Memory] == 0 {
        return Err(invalid(
            &format!("{field}.resources"),
            "must request some cpu or memory (both are zero or missing)",
        ));
    }
    peloton_engine::host::validate_gpu_request(request[Dim::Gpu])
        .map_err(|p| invalid(&format!("{field}.resources.gpu"), p))?;
    let names = port_names(field, spec, limits)?;
    string(&format!("{field}.constraint"), &spec.constraint, limits)?;
    if !spec.constraint.is_empty() {
        Constraint::parse(&spec.constraint, &mut Interner::new())
            .map_err(|e| invalid(&format!("{field}.constraint"), e))?;
    }
    let max_per_host = u16::try_from(spec.max_instances_per_host).map_err(|_| {
        invalid(
            &format!("{field}.max_instances_per_host"),
            format!("at most {}", u16::MAX),
        )
    })?;
    let restart = restart_policy(field, spec)?;
    if let Some(check) = &spec.health_check {
        health_check(&format!("{field}.health_check"), check, &names, limits)?;
    }
    if spec.expected_runtime_ms > MAX_EXPECTED_RUNTIME_MS {
        return Err(invalid(
            &format!("{field}.expected_runtime_ms"),
            format!(
                "{} is above the limit of {MAX_EXPECTED_RUNTIME_MS} (365 days)",
                spec.expected_runtime_ms
            ),
        ));
    }
    let sim = spec.sim.unwrap_or_default();
    Ok(TaskTemplate {
        request,
        ports: spec.ports.len() as u16,
        port_names: spec.ports.iter().map(|p| p.name.as_str().into()).collect(),
        constraint: spec.constraint.clone(),
        revocable: spec.revocable,
        controller: spec.controller,
        max_per_host,
        restart,
        kill_grace_ms: if spec.kill_grace_period_ms == 0 {
            10_000
        } else {
            spec.kill_grace_period_ms
        },
        shutdown_delay_ms: spec.shutdown_delay_ms,
        preemption_notice_ms: spec.preemption_notice_ms,
        health_check: spec.health_check.is_some(),
        volume: spec
            .volume
            .as_ref()
            .map(|v| volume(&format!("{field}.volume"), v))
            .transpose()?,
        expected_runtime_ms: spec.expected_runtime_ms,
        command_key: task_command_key(spec),
        sim_duration_ms: sim.duration_ms,
        sim_exit_code: sim.exit_code,
        spec: spec.encode_to_vec().into(),
    })
}

/// The key runs of a task's command are learned by (its command and
/// arguments, or its shell line; see `lifecycle::runtime`).
fn task_command_key(spec: &pb::TaskSpec) -> u64 {
    if spec.shell.is_empty() {
        crate::lifecycle::command_key(
            std::iter::once(spec.command.as_str()).chain(spec.args.iter().map(String::as_str)),
        )
    } else {
        // After an empty part, which no command is: a shell line is never
        // mistaken for a command of the same text.
        crate::lifecycle::command_key(["", spec.shell.as_str()])
    }
}

/// A task's command or shell, stop signal, memory limit kind, shutdown
/// delay, arguments and environment.
fn check_command(field: &str, spec: &pb::TaskSpec, limits: &Limits) -> Result<(), Status> {
    if spec.command.is_empty() && spec.shell.is_empty() {
        return Err(invalid(
            &format!("{field}.command"),
            "set command (with args) or shell",
        ));
    }
    if !spec.command.is_empty() && !spec.shell.is_empty() {
        return Err(invalid(
            &format!("{field}.shell"),
            "set either command or shell, not both",
        ));
    }
    string(&format!("{field}.command"), &spec.command, limits)?;
    string(&format!("{field}.shell"), &spec.shell, limits)?;
    if !spec.stop_signal.is_empty() && !STOP_SIGNALS.contains(&spec.stop_signal.as_str()) {
        return Err(invalid(
            &format!("{field}.stop_signal"),
            format!(
                "{} is not one of {}",
                shown(&spec.stop_signal),
                STOP_SIGNALS.join(", ")
            ),
        ));
    }
    if pb::MemoryLimit::try_from(spec.memory_limit).is_err() {
        return Err(invalid(
            &format!("{field}.memory_limit"),
            format!("unknown kind {}", spec.memory_limit),
        ));
    }
    if spec.shutdown_delay_ms > MAX_SHUTDOWN_DELAY_MS {
        return Err(invalid(
            &format!("{field}.shutdown_delay_ms"),
            format!(
                "{} is above the limit of {MAX_SHUTDOWN_DELAY_MS} (10 minutes)",
                spec.shutdown_delay_ms
            ),
        ));
    }
    if spec.preemption_notice_ms > MAX_PREEMPTION_NOTICE_MS {
        return Err(invalid(
            &format!("{field}.preemption_notice_ms"),
            format!(
                "{} is above the limit of {MAX_PREEMPTION_NOTICE_MS} (10 minutes)",
                spec.preemption_notice_ms
            ),
        ));
    }
    list(&format!("{field}.args"), spec.args.len(), limits)?;
    for (i, a) in spec.args.iter().enumerate() {
        string(&format!("{field}.args[{i}]"), a, limits)?;
    }
    list(&format!("{field}.env"), spec.env.len(), limits)?;
    for (k, v) in &spec.env {
        bounded(&format!("{field}.env (a name)"), k, MAX_ID_BYTES)?;
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid(
                &format!("{field}.env"),
                format!("bad variable name {}", shown(k)),
            ));
        }
        string(&format!("{field}.env.{k}"), v, limits)?;
    }
    Ok(())
}

/// A task's named ports (bounded, unique ignoring case), by their
/// upper-cased names.
fn port_names(
    field: &str,
    spec: &pb::TaskSpec,
    limits: &Limits,
) -> Result<std::collections::HashSet<String>, Status> {
    if spec.ports.len() > limits.max_ports {
        return Err(invalid(
            &format!("{field}.ports"),
            format!(
                "{} ports; the limit is {}",
                spec.ports.len(),
                limits.max_ports
            ),
        ));
    }
    let mut names = std::collections::HashSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let ok = !p.name.is_empty()
            && p.name.len() <= 64
            && p.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(invalid(
                &format!("{field}.ports[{i}].name"),
                format!("{} must be 1–64 letters, digits or '_'", shown(&p.name)),
            ));
        }
        if !names.insert(p.name.to_ascii_uppercase()) {
            return Err(invalid(
                &format!("{field}.ports[{i}].name"),
                format!("duplicate port {:?}", p.name),
            ));
        }
    }
    Ok(names)
}

/// A task's restart policy, its back-offs defaulted (1 s doubling to 60 s).
fn restart_policy(field: &str, spec: &pb::TaskSpec) -> Result<RestartPolicy, Status> {
    let restart = spec.restart.unwrap_or_default();
    let backoff_ms = if restart.backoff_ms == 0 {
        1000
    } else {
        restart.backoff_ms
    };
    let max_backoff_ms = if restart.max_backoff_ms == 0 {
        60_000
    } else {
        restart.max_backoff_ms
    };
    if max_backoff_ms < backoff_ms {
        return Err(invalid(
            &format!("{field}.restart.max_backoff_ms"),
            format!("{max_backoff_ms} is less than backoff_ms {backoff_ms}"),
        ));
    }
    Ok(RestartPolicy {
        max_failures: restart.max_failures,
        backoff_ms,
        max_backoff_ms,
    })
}

/// Checks that an instance's override (`field`) keeps the default task's
/// queue: revocability and the controller flag are the job's, except that a
/// batch job's instance 0 may be its controller task (as in Peloton: a
/// driver whose end is the job's; the lifecycle stops the other instances
/// then).
fn override_classes(
    field: &str,
    kind: JobKind,
    instance: u32,
    t: &TaskTemplate,
    default: &TaskTemplate,
) -> Result<(), Status> {
    if t.revocable != default.revocable {
        return Err(invalid(
            &format!("{field}.revocable"),
            format!(
                "{} where the default task's is {}: revocability is the job's",
                t.revocable, default.revocable
            ),
        ));
    }
    if t.controller == default.controller {
        return Ok(());
    }
    let controller_task = kind == JobKind::Batch && instance == 0 && t.controller;
    if controller_task {
        return Ok(());
    }
    let why = if default.controller {
        "the default task is a controller task, and so is every instance"
    } else if instance == 0 {
        "only a batch job's instance 0 may be a controller task apart from its default task"
    } else {
        "only instance 0 may be a controller task (a batch job's, as in Peloton)"
    };
    Err(invalid(&format!("{field}.controller"), why))
}

/// Longest deregistration delay (`TaskSpec.shutdown_delay_ms`): 10 minutes.
pub const MAX_SHUTDOWN_DELAY_MS: u64 = 600_000;

/// Longest preemption notice (`TaskSpec.preemption_notice_ms`): 10
/// minutes, as the deregistration delay (a victim holds what it was
/// preempted for at most this long plus its grace).
pub const MAX_PREEMPTION_NOTICE_MS: u64 = 600_000;

/// Longest declared run time (`TaskSpec.expected_runtime_ms`): 365 days.
pub const MAX_EXPECTED_RUNTIME_MS: u64 = 365 * 24 * 3600 * 1000;

/// Volumes in one list answer.
pub const MAX_LISTED_VOLUMES: usize = 10_000;

/// Largest volume: 16 TiB.
pub const MAX_VOLUME_MB: u64 = 16 << 20;

/// Files of a sandbox that the agent owns: a volume may not hide one.
const SANDBOX_FILES: [&str; 11] = [
    "stdout",
    "stderr",
    "run.json",
    "run.json.b",
    "task.json",
    "started",
    "exit.json",
    "wrapper.log",
    "health-check.out",
    ".peloton-secrets",
    ".peloton",
];

/// Validates a task's volume.
fn volume(field: &str, v: &pb::VolumeSpec) -> Result<crate::lifecycle::VolumeTemplate, Status> {
    if v.size_mb == 0 || v.size_mb > MAX_VOLUME_MB {
        return Err(invalid(
            &format!("{field}.size_mb"),
            format!("{} is not between 1 and {MAX_VOLUME_MB} MiB", v.size_mb),
        ));
    }
    let path = if v.path.is_empty() {
        "data"
    } else {
        v.path.as_str()
    };
    let bad = |problem: &str| {
        invalid(
            &format!("{field}.path"),
            format!("{} {problem}", shown(path)),
        )
    };
    if path.len() > 256 {
        return Err(bad("is longer than 256 bytes"));
    }
    if path.starts_with('/') {
        return Err(bad("must be relative to the sandbox"));
    }
    let mut parts = path.split('/');
    if parts.clone().any(|p| p.is_empty() || p == "." || p == "..") {
        return Err(bad(
            "must be a plain relative path (no empty, . or .. parts)",
        ));
    }
    if parts.any(|p| p.contains('\0')) {
        return Err(bad("contains a NUL byte"));
    }
    let first = path.split('/').next().unwrap_or_default();
    if SANDBOX_FILES.contains(&first) || first.ends_with(".tmp") {
        return Err(bad("would hide a file of the sandbox the agent owns"));
    }
    Ok(crate::lifecycle::VolumeTemplate {
        size_mb: v.size_mb,
        path: path.into(),
    })
}

/// Validates a health check against the task's port names (upper-cased).
fn health_check(
    field: &str,
    check: &pb::HealthCheck,
    ports: &std::collections::HashSet<String>,
    limits: &Limits,
) -> Result<(), Status> {
    let port = |f: &str, name: &str| {
        if ports.contains(&name.to_ascii_uppercase()) {
            Ok(())
        } else {
            Err(invalid(
                &format!("{field}.{f}"),
                format!("{} is not one of the task's ports", shown(name)),
            ))
        }
    };
    match &check.kind {
        None => return Err(invalid(field, "set one of command, http or tcp_port")),
        Some(pb::health_check::Kind::Command(c)) => {
            if c.trim().is_empty() {
                return Err(invalid(&format!("{field}.command"), "must not be empty"));
            }
            string(&format!("{field}.command"), c, limits)?;
        }
        Some(pb::health_check::Kind::Http(h)) => {
            port("http.port", &h.port)?;
            string(&format!("{field}.http.path"), &h.path, limits)?;
            if !h.path.is_empty() && !h.path.starts_with('/') {
                return Err(invalid(
                    &format!("{field}.http.path"),
                    format!("{} must start with '/'", shown(&h.path)),
                ));
            }
        }
        Some(pb::health_check::Kind::TcpPort(p)) => port("tcp_port", p)?,
    }
    const DAY_MS: u64 = 86_400_000;
    for (f, v) in [
        ("initial_delay_ms", check.initial_delay_ms),
        ("interval_ms", check.interval_ms),
        ("timeout_ms", check.timeout_ms),
    ] {
        if v > DAY_MS {
            return Err(invalid(
                &format!("{field}.{f}"),
                format!("{v} is more than a day"),
            ));
        }
    }
    if check.max_consecutive_failures > 1000 {
        return Err(invalid(
            &format!("{field}.max_consecutive_failures"),
            "at most 1000",
        ));
    }
    Ok(())
}

/// The host attribute that holds a host's host pool (set by the core;
/// agents may not set it; hidden from `Host.attributes` in reads), and
/// the host pool that always exists and takes every host not moved
/// elsewhere (and jobs that name none).
pub use crate::lifecycle::{DEFAULT_HOST_POOL, HOST_POOL_ATTRIBUTE};

/// Validates a host pool name: 1–64 of `[A-Za-z0-9._-]`.
pub fn host_pool_name(field: &str, name: &str) -> Result<(), Status> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !ok {
        return Err(invalid(
            field,
            format!(
                "{} must be 1–64 letters, digits, '.', '_' or '-'",
                shown(name)
            ),
        ));
    }
    Ok(())
}

/// The host pool a job spec names ("default" when none).
pub fn job_host_pool(spec: &pb::JobSpec) -> &str {
    if spec.host_pool.is_empty() {
        DEFAULT_HOST_POOL
    } else {
        &spec.host_pool
    }
}

/// A task's constraint with its job's host pool ANDed in.
fn with_host_pool(constraint: &str, host_pool: &str) -> String {
    let pool = format!("{HOST_POOL_ATTRIBUTE} == \"{host_pool}\"");
    if constraint.is_empty() {
        pool
    } else {
        format!("({constraint}) and {pool}")
    }
}

/// Most secrets of one job.
pub const MAX_SECRETS: usize = 32;
/// Largest value of one secret, bytes.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;
/// Largest sum of a job's secret values, bytes (checked by the core).
pub use crate::lifecycle::MAX_SECRETS_TOTAL_BYTES;

/// Validates secret names, count and sizes (values left empty, and the
/// total, are checked by the core, which knows the job's current ones:
/// `Lifecycle::resolve_secrets`).
fn check_secrets(secrets: &[pb::Secret]) -> Result<(), Status> {
    if secrets.len() > MAX_SECRETS {
        return Err(invalid(
            "spec.secrets",
            format!("{} secrets; the limit is {MAX_SECRETS}", secrets.len()),
        ));
    }
    let mut names = std::collections::HashSet::new();
    for (i, s) in secrets.iter().enumerate() {
        let field = format!("spec.secrets[{i}].name");
        let ok = !s.name.is_empty()
            && s.name.len() <= 64
            && !s.name.starts_with('.')
            && s.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(invalid(
                &field,
                format!(
                    "{} must be 1–64 letters, digits, '.', '_' or '-', not starting with '.'",
                    shown(&s.name)
                ),
            ));
        }
        if !names.insert(s.name.as_str()) {
            return Err(invalid(&field, format!("duplicate secret {:?}", s.name)));
        }
        if s.value.len() > MAX_SECRET_BYTES {
            return Err(invalid(
                &format!("spec.secrets[{i}].value"),
                format!(
                    "{} bytes is more than the limit of {MAX_SECRET_BYTES}",
                    s.value.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Validates labels (of a spec, or a query's filter): at most
/// `max_list_len`, keys non-empty and at most [`MAX_ID_BYTES`], values at
/// most `max_string_len`.
pub fn labels(
    field: &str,
    labels: &std::collections::HashMap<String, String>,
    limits: &Limits,
) -> Result<(), Status> {
    list(field, labels.len(), limits)?;
    for (k, v) in labels {
        if k.is_empty() {
            return Err(invalid(field, "empty label key"));
        }
        bounded(&format!("{field} (a key)"), k, MAX_ID_BYTES)?;
        string(&format!("{field}.{k}"), v, limits)?;
    }
    Ok(())
}

/// Validates a job spec. The pool's and the host pool's existence are
/// checked by the loop; so are secrets with empty values.
pub fn job_plan(spec: &pb::JobSpec, limits: &Limits) -> Result<JobPlan, Status> {
    let kind = job_kind(spec)?;
    check_job_head(spec, limits)?;
    let daemon = kind == JobKind::Daemon;
    let application = kind == JobKind::Application;
    let app = if application {
        Some(app_plan(spec, limits)?)
    } else {
        if spec.application.is_some() {
            return Err(invalid(
                "spec.application",
                "only application jobs (type APPLICATION) have one",
            ));
        }
        None
    };
    if spec.instance_count == 0 && !daemon && !application {
        return Err(invalid("spec.instance_count", "must be at least 1"));
    }
    if spec.instance_count > limits.max_instances_per_job {
        return Err(invalid(
            "spec.instance_count",
            format!(
                "{} is more than the limit of {} instances per job",
                spec.instance_count, limits.max_instances_per_job
            ),
        ));
    }
    if !spec.host_pool.is_empty() {
        host_pool_name("spec.host_pool", &spec.host_pool)?;
    }
    check_secrets(&spec.secrets)?;
    let host_pool = job_host_pool(spec);
    let mut default = task_template("spec.default_task", spec.default_task.as_ref(), limits)?;
    default.constraint = with_host_pool(&default.constraint, host_pool);
    if spec.r#type == pb::JobType::Stateful as i32 && default.volume.is_none() {
        return Err(invalid(
            "spec.default_task.volume",
            "a stateful job's task must have a volume",
        ));
    }
    if daemon {
        check_daemon(spec, &default)?;
    }
    let overrides = override_templates(spec, kind, app.as_ref(), &default, host_pool, limits)?;
    let (sla, gang) = check_sla(spec, kind, &default, &overrides)?;
    let strategy = placement_strategy(spec)?;
    let rendezvous = rendezvous_ask(spec, gang, &default)?;
    let stateful = spec.stateful.unwrap_or_default();
    if pb::VolumeLossPolicy::try_from(stateful.on_host_down).is_err() {
        return Err(invalid(
            "spec.stateful.on_host_down",
            format!("unknown policy {}", stateful.on_host_down),
        ));
    }
    Ok(JobPlan {
        kind,
        name: spec.name.as_str().into(),
        owner: spec.owner.as_str().into(),
        pool: spec.pool.as_str().into(),
        host_pool: host_pool.into(),
        instance_count: spec.instance_count,
        default: Arc::new(default),
        overrides,
        priority: sla.priority,
        preemptible: sla.preemptible,
        max_running: sla.max_running_instances,
        gang,
        elastic_min: sla.elastic_min_instances,
        max_running_time_ms: sla.max_running_time_ms,
        max_unavailable: sla.max_unavailable_instances.max(1),
        strategy,
        volume_policy: VolumePolicy {
            host_down_timeout_ms: if stateful.host_down_timeout_ms == 0 {
                crate::lifecycle::DEFAULT_HOST_DOWN_TIMEOUT_MS
            } else {
                stateful.host_down_timeout_ms
            },
            relocate: stateful.on_host_down == pb::VolumeLossPolicy::Relocate as i32,
        },
        app,
        rendezvous,
        after: job_after(spec)?,
        schedule: job_schedule(spec, kind)?,
        spec: encoded_spec(spec),
    })
}

/// A job's kind from its type.
fn job_kind(spec: &pb::JobSpec) -> Result<JobKind, Status> {
    Ok(match pb::JobType::try_from(spec.r#type) {
        Ok(pb::JobType::Batch) => JobKind::Batch,
        // A stateful job is a service whose instances own volumes.
        Ok(pb::JobType::Service | pb::JobType::Stateful) => JobKind::Service,
        Ok(pb::JobType::Daemon) => JobKind::Daemon,
        Ok(pb::JobType::Application) => JobKind::Application,
        Err(_) => {
            return Err(invalid(
                "spec.type",
                format!("unknown type {}", spec.r#type),
            ));
        }
    })
}

/// A job's name, owner, labels and pool.
fn check_job_head(spec: &pb::JobSpec, limits: &Limits) -> Result<(), Status> {
    // A name is optional (none: the job is known by its id), but a cron
    // job's ticks' jobs are named after it.
    if spec.name.is_empty() && spec.schedule.is_some() {
        return Err(invalid(
            "spec.name",
            "a cron job needs a name: its ticks' jobs are named after it",
        ));
    }
    bounded("spec.name", &spec.name, MAX_NAME_BYTES)?;
    bounded("spec.owner", &spec.owner, MAX_NAME_BYTES)?;
    labels("spec.labels", &spec.labels, limits)?;
    if spec.pool.is_empty() {
        return Err(invalid("spec.pool", "must name a pool, e.g. /batch"));
    }
    pool_path("spec.pool", &spec.pool)?;
    Ok(())
}

/// The jobs a spec waits for (`spec.after`), in the spec's order: at most
/// [`crate::lifecycle::MAX_DEPENDENCIES`], each a non-empty id. Whether
/// they exist is the core's check.
fn job_after(spec: &pb::JobSpec) -> Result<Arc<[Dependency]>, Status> {
    let Some(after) = &spec.after else {
        return Ok(Arc::from([]));
    };
    let lists = [
        (AfterCondition::Succeeded, &after.succeeded),
        (AfterCondition::Finished, &after.finished),
        (AfterCondition::Failed, &after.failed),
    ];
    let n: usize = lists.iter().map(|(_, l)| l.len()).sum();
    let max = crate::lifecycle::MAX_DEPENDENCIES;
    if n > max {
        return Err(invalid(
            "spec.after",
            format!("{n} dependencies; a job has at most {max}"),
        ));
    }
    let mut deps = Vec::with_capacity(n);
    for (condition, list) in lists {
        for (i, job) in list.iter().enumerate() {
            let field = format!("spec.after.{}[{i}]", condition.name());
            if job.is_empty() {
                return Err(invalid(&field, "must name a job"));
            }
            id(&field, job)?;
            deps.push(Dependency {
                job: job.as_str().into(),
                condition,
            });
        }
    }
    Ok(deps.into())
}

/// A cron job's schedule (`spec.schedule`), with the spec of its ticks'
/// jobs (the schedule left out). Whether another cron job fits is the
/// core's check.
fn job_schedule(
    spec: &pb::JobSpec,
    kind: JobKind,
) -> Result<Option<Arc<crate::lifecycle::Schedule>>, Status> {
    let Some(s) = &spec.schedule else {
        return Ok(None);
    };
    if kind != JobKind::Batch || spec.r#type != pb::JobType::Batch as i32 {
        return Err(invalid("spec.schedule", "only batch jobs have a schedule"));
    }
    if spec
        .after
        .as_ref()
        .is_some_and(|a| !(a.succeeded.is_empty() && a.finished.is_empty() && a.failed.is_empty()))
    {
        return Err(invalid(
            "spec.schedule",
            "a cron job cannot wait for other jobs (spec.after)",
        ));
    }
    let overlap = match pb::CronOverlap::try_from(s.overlap) {
        Ok(pb::CronOverlap::Allow) => crate::lifecycle::Overlap::Allow,
        Ok(pb::CronOverlap::Forbid) => crate::lifecycle::Overlap::Forbid,
        Ok(pb::CronOverlap::Replace) => crate::lifecycle::Overlap::Replace,
        Err(_) => {
            return Err(invalid(
                "spec.schedule.overlap",
                format!("unknown policy {}", s.overlap),
            ));
        }
    };
    let tick_spec = encoded_spec(&pb::JobSpec {
        schedule: None,
        ..spec.clone()
    });
    crate::lifecycle::Schedule::new(
        &s.cron,
        &s.time_zone,
        overlap,
        s.keep_succeeded,
        s.keep_failed,
        tick_spec,
    )
    .map(|s| Some(Arc::new(s)))
    .map_err(|(field, why)| invalid(&format!("spec.schedule.{field}"), why))
}

/// A cron job's ticks as the API shows them.
pub fn cron_status_to_pb(
    state: &crate::lifecycle::CronState,
    next_tick: Option<u64>,
) -> pb::CronStatus {
    pb::CronStatus {
        next_tick_ms: next_tick.unwrap_or(0),
        last_tick_ms: state.last_tick,
        ticks: state
            .ticks
            .iter()
            .rev()
            .map(|t| pb::CronTick {
                tick_ms: t.at,
                job_id: t.job.to_string(),
            })
            .collect(),
        last_skip: state.last_skip.to_string(),
        suspended: state.suspended,
    }
}

/// Jobs a job waits for as the API shows them.
pub fn dependencies_to_pb(deps: &[Dependency]) -> pb::JobDependencies {
    let mut out = pb::JobDependencies::default();
    for d in deps {
        let list = match d.condition {
            AfterCondition::Succeeded => &mut out.succeeded,
            AfterCondition::Finished => &mut out.finished,
            AfterCondition::Failed => &mut out.failed,
        };
        list.push(d.job.to_string());
    }
    out
}

/// What a daemon job (one instance per host) may not have.
fn check_daemon(spec: &pb::JobSpec, default: &TaskTemplate) -> Result<(), Status> {
    if default.volume.is_some() {
        return Err(invalid(
            "spec.default_task.volume",
            "daemon jobs cannot have volumes",
        ));
    }
    if !spec.overrides.is_empty() {
        return Err(invalid(
            "spec.overrides",
            "a daemon job's instances are all alike (one per host)",
        ));
    }
    if spec.sla.is_some_and(|s| s.min_running_instances > 1) {
        return Err(invalid(
            "spec.sla.min_running_instances",
            "a daemon job cannot run in gangs",
        ));
    }
    Ok(())
}

/// Each overridden instance's template, the host pool ANDed into its
/// constraint (overrides resolved once, here).
fn override_templates(
    spec: &pb::JobSpec,
    kind: JobKind,
    app: Option<&AppPlan>,
    default: &TaskTemplate,
    host_pool: &str,
    limits: &Limits,
) -> Result<FxHashMap<u32, Arc<TaskTemplate>>, Status> {
    if spec.overrides.len() > limits.max_overrides {
        return Err(invalid(
            "spec.overrides",
            format!(
                "{} overrides; the limit is {}",
                spec.overrides.len(),
                limits.max_overrides
            ),
        ));
    }
    let mut overrides = FxHashMap::default();
    for (i, o) in spec.overrides.iter().enumerate() {
        if o.instance >= spec.instance_count {
            return Err(invalid(
                &format!("spec.overrides[{i}].instance"),
                format!(
                    "{} is not below instance_count {}",
                    o.instance, spec.instance_count
                ),
            ));
        }
        let mut t = task_template(
            &format!("spec.overrides[{i}].spec"),
            o.spec.as_ref(),
            limits,
        )?;
        t.constraint = with_host_pool(&t.constraint, host_pool);
        // An application's driver (instance 0) differs from its executors.
        let driver = app.is_some_and(|a| a.driver_in_job) && o.instance == 0;
        if !driver {
            override_classes(
                &format!("spec.overrides[{i}].spec"),
                kind,
                o.instance,
                &t,
                default,
            )?;
        }
        if overrides.insert(o.instance, Arc::new(t)).is_some() {
            return Err(invalid(
                &format!("spec.overrides[{i}].instance"),
                format!("instance {} is overridden twice", o.instance),
            ));
        }
    }
    Ok(overrides)
}

/// A job's SLA: its gang, running caps and preemptibility, checked
/// against its kind and templates.
/// The frameworks `JobSpec.rendezvous.framework` may name.
pub const RENDEZVOUS_FRAMEWORKS: [&str; 3] = ["pytorch", "tensorflow", "mpi"];

/// `spec.rendezvous` checked: only a gang's, a known framework (any case;
/// kept lower-case), and a port the default task declares (pytorch and
/// tensorflow need one: the leader's rendezvous port).
fn rendezvous_ask(
    spec: &pb::JobSpec,
    gang: u32,
    default: &TaskTemplate,
) -> Result<Option<Arc<crate::lifecycle::rendezvous::RendezvousAsk>>, Status> {
    let Some(r) = &spec.rendezvous else {
        return Ok(None);
    };
    if gang <= 1 {
        return Err(invalid(
            "spec.rendezvous",
            "only a gang job (sla.min_running_instances above 1) has a rendezvous",
        ));
    }
    let framework = r.framework.to_ascii_lowercase();
    if !framework.is_empty() && !RENDEZVOUS_FRAMEWORKS.contains(&framework.as_str()) {
        return Err(invalid(
            "spec.rendezvous.framework",
            format!(
                "{} is not one of {}",
                shown(&r.framework),
                RENDEZVOUS_FRAMEWORKS.join(", ")
            ),
        ));
    }
    if !r.port.is_empty() && !default.port_names.iter().any(|n| **n == *r.port) {
        return Err(invalid(
            "spec.rendezvous.port",
            format!(
                "{} is not a port of spec.default_task.ports",
                shown(&r.port)
            ),
        ));
    }
    if r.port.is_empty()
        && default.port_names.is_empty()
        && matches!(&*framework, "pytorch" | "tensorflow")
    {
        return Err(invalid(
            "spec.rendezvous.port",
            format!(
                "the {framework} framework needs a port for its leader: declare one in spec.default_task.ports"
            ),
        ));
    }
    Ok(Some(Arc::new(
        crate::lifecycle::rendezvous::RendezvousAsk {
            framework: framework.into(),
            port: r.port.as_str().into(),
        },
    )))
}

fn check_sla(
    spec: &pb::JobSpec,
    kind: JobKind,
    default: &TaskTemplate,
    overrides: &FxHashMap<u32, Arc<TaskTemplate>>,
) -> Result<(pb::Sla, u32), Status> {
    let daemon = kind == JobKind::Daemon;
    let application = kind == JobKind::Application;
    let sla = spec.sla.unwrap_or_default();
    let gang = sla.min_running_instances.max(1);
    if gang > 1
        && kind == JobKind::Batch
        && !default.controller
        && let Some(i) = spec
            .overrides
            .iter()
            .position(|o| overrides.get(&o.instance).is_some_and(|t| t.controller))
    {
        return Err(invalid(
            &format!("spec.overrides[{i}].spec.controller"),
            format!(
                "a gang job (spec.sla.min_running_instances {gang}) cannot have a controller task: \
                 a gang is queued as one entry of one class"
            ),
        ));
    }
    if gang > spec.instance_count && !daemon && !application {
        return Err(invalid(
            "spec.sla.min_running_instances",
            format!(
                "gang size {gang} is more than instance_count {}",
                spec.instance_count
            ),
        ));
    }
    let max_gang = peloton_engine::admission::DEFAULT_MAX_GANG_SIZE as u32;
    if gang > max_gang {
        return Err(invalid(
            "spec.sla.min_running_instances",
            format!("gang size {gang} is more than the limit of {max_gang}"),
        ));
    }
    if sla.max_running_instances != 0 && sla.max_running_instances < gang {
        return Err(invalid(
            "spec.sla.max_running_instances",
            format!(
                "{} is less than the gang size {gang}",
                sla.max_running_instances
            ),
        ));
    }
    if sla.elastic_min_instances > 0 {
        let field = "spec.sla.elastic_min_instances";
        if gang <= 1 {
            return Err(invalid(
                field,
                "only a gang job (spec.sla.min_running_instances above 1) can be elastic",
            ));
        }
        if kind != JobKind::Batch {
            return Err(invalid(field, "elastic gangs are batch jobs"));
        }
        if sla.elastic_min_instances >= gang {
            return Err(invalid(
                field,
                format!(
                    "{} is not below the gang size {gang} (the most members it grows to)",
                    sla.elastic_min_instances
                ),
            ));
        }
        if spec
            .rendezvous
            .as_ref()
            .is_some_and(|r| r.framework.eq_ignore_ascii_case("mpi"))
        {
            return Err(invalid(
                "spec.rendezvous.framework",
                "an elastic gang cannot use the mpi framework: an MPI world's size is fixed \
                 when mpiexec starts",
            ));
        }
        if spec.instance_count != gang {
            return Err(invalid(
                field,
                format!(
                    "an elastic gang is the whole job: instance_count {} must equal the gang \
                     size {gang}",
                    spec.instance_count
                ),
            ));
        }
    }
    if default.revocable && !sla.preemptible {
        return Err(invalid(
            "spec.sla.preemptible",
            "revocable tasks must be preemptible",
        ));
    }
    Ok((sla, gang))
}

/// A job's placement strategy.
fn placement_strategy(spec: &pb::JobSpec) -> Result<Strategy, Status> {
    Ok(match pb::PlacementStrategy::try_from(spec.placement) {
        Ok(pb::PlacementStrategy::Pack) => Strategy::Pack,
        Ok(pb::PlacementStrategy::Spread) => Strategy::Spread,
        Ok(pb::PlacementStrategy::FirstFit) => Strategy::FirstFit,
        Ok(pb::PlacementStrategy::GpuFrag) => Strategy::GpuFrag,
        Err(_) => {
            return Err(invalid(
                "spec.placement",
                format!("unknown strategy {}", spec.placement),
            ));
        }
    })
}

/// A job spec as the core keeps it: encoded, without its secrets (which
/// are kept apart and never shown).
/// `plan` owned by `owner`: its owner and the owner in its spec as sent
/// (what reads show) replaced.
pub fn with_owner(mut plan: JobPlan, owner: Arc<str>) -> JobPlan {
    if plan.owner == owner {
        return plan;
    }
    let mut spec = pb::JobSpec::decode(&*plan.spec).expect("a plan's spec was encoded here");
    spec.owner = owner.to_string();
    plan.spec = encoded_spec(&spec);
    plan.owner = owner;
    plan
}

fn encoded_spec(spec: &pb::JobSpec) -> Arc<[u8]> {
    if spec.secrets.is_empty() {
        spec.encode_to_vec().into()
    } else {
        pb::JobSpec {
            secrets: Vec::new(),
            ..spec.clone()
        }
        .encode_to_vec()
        .into()
    }
}

/// Executors of an application when it names no bound.
pub const DEFAULT_MAX_EXECUTORS: u32 = 1000;

/// An application job's plan. A job created through `JobService.Create`
/// is a cluster-mode job: its one instance is the driver, and it is
/// registered once the driver gave its URL (and executor).
fn app_plan(spec: &pb::JobSpec, limits: &Limits) -> Result<AppPlan, Status> {
    let a = spec.application.clone().unwrap_or_default();
    bounded("spec.application.driver_url", &a.driver_url, MAX_NAME_BYTES)?;
    if a.max_executors > limits.max_instances_per_job {
        return Err(invalid(
            "spec.application.max_executors",
            format!(
                "{} is more than the limit of {} instances per job",
                a.max_executors, limits.max_instances_per_job
            ),
        ));
    }
    let max_executors = if a.max_executors == 0 {
        DEFAULT_MAX_EXECUTORS.min(limits.max_instances_per_job)
    } else {
        a.max_executors
    };
    let registered = !a.driver_url.is_empty();
    if a.driver_in_job && !registered && spec.instance_count != 1 {
        return Err(invalid(
            "spec.instance_count",
            "an application job starts with one instance, its driver; its executors follow the target the driver sets",
        ));
    }
    if !a.driver_in_job && !registered {
        return Err(invalid(
            "spec.application.driver_url",
            "an application without a driver task is made by ApplicationService.Register",
        ));
    }
    Ok(AppPlan {
        max_executors,
        driver_in_job: a.driver_in_job,
        registered,
    })
}

/// A task state from the API's number (unknown numbers: initialized).
pub fn task_state_from_pb(state: i32) -> TaskState {
    TaskState::ALL
        .into_iter()
        .find(|s| *s as i32 == state)
        .unwrap_or_default()
}

/// A task state as the API's enum.
pub fn task_state_to_pb(state: TaskState) -> pb::TaskState {
    pb::TaskState::try_from(state as i32).expect("same numbering")
}

/// A job state from the API's number.
pub fn job_state_from_pb(state: pb::JobState) -> JobState {
    match state {
        pb::JobState::Unknown | pb::JobState::Initialized => JobState::Initialized,
        pb::JobState::Pending => JobState::Pending,
        pb::JobState::Running => JobState::Running,
        pb::JobState::Succeeded => JobState::Succeeded,
        pb::JobState::Failed => JobState::Failed,
        pb::JobState::Killing => JobState::Killing,
        pb::JobState::Killed => JobState::Killed,
    }
}

/// A job state as the API's enum.
pub fn job_state_to_pb(state: JobState) -> pb::JobState {
    pb::JobState::try_from(state as i32).expect("same numbering")
}

/// A health verdict from the API's.
pub fn health_from_pb(health: pb::Health) -> Health {
    match health {
        pb::Health::None => Health::None,
        pb::Health::Unknown => Health::Unknown,
        pb::Health::Healthy => Health::Healthy,
        pb::Health::Unhealthy => Health::Unhealthy,
    }
}

/// A health verdict as the API's enum.
pub fn health_to_pb(health: Health) -> pb::Health {
    pb::Health::try_from(health as i32).expect("same numbering")
}

/// A run record as the API's `TaskRun`.
pub fn run_to_pb(r: &RunRecord) -> pb::TaskRun {
    pb::TaskRun {
        run_id: r.run,
        state: task_state_to_pb(r.state) as i32,
        host: r.host.to_string(),
        created_at_ms: r.created_at,
        placed_at_ms: r.placed_at,
        started_at_ms: r.started_at,
        finished_at_ms: r.finished_at,
        exit_code: r.exit_code,
        reason: r.reason.as_deref().unwrap_or_default().to_string(),
        launch_id: r.launch.0,
        health: 0,
        ports: Default::default(),
        used: None,
        gpu_devices: Vec::new(),
        gpu_share_milli: 0,
        last_checkpoint_ms: r.checkpoint_at,
        lost_work_ms: r.lost_work,
    }
}

/// A stored `TaskRun` as a run record.
pub fn run_from_pb(r: &pb::TaskRun) -> RunRecord {
    RunRecord {
        run: r.run_id,
        state: task_state_from_pb(r.state),
        host: r.host.as_str().into(),
        created_at: r.created_at_ms,
        placed_at: r.placed_at_ms,
        started_at: r.started_at_ms,
        finished_at: r.finished_at_ms,
        exit_code: r.exit_code,
        reason: (!r.reason.is_empty()).then(|| r.reason.as_str().into()),
        launch: LaunchId(r.launch_id),
        checkpoint_at: r.last_checkpoint_ms,
        lost_work: r.lost_work_ms,
    }
}

/// A job spec of type APPLICATION sent to `JobService.Create` is a
/// cluster-mode application: its one instance is the driver, which
/// registers the application (driver URL, executor) from inside the job.
pub fn cluster_mode_spec(mut spec: pb::JobSpec) -> Result<pb::JobSpec, Status> {
    if spec.r#type != pb::JobType::Application as i32 {
        return Ok(spec);
    }
    if !spec.default_task.as_ref().is_some_and(|t| t.controller) {
        return Err(invalid(
            "spec.default_task.controller",
            "an application job's task is its driver, and must be a controller task (so the pool's controller limit keeps drivers from starving their executors)",
        ));
    }
    let app = spec.application.get_or_insert_with(Default::default);
    if !app.driver_url.is_empty() {
        return Err(invalid(
            "spec.application.driver_url",
            "is set by the driver when it registers (ApplicationService.Register with job_id)",
        ));
    }
    app.driver_in_job = true;
    Ok(spec)
}

/// An agent's registration as an engine host (without its host pool
/// attribute, which the caller adds).
pub fn host_spec(
    name: &str,
    resources: Option<&pb::Resources>,
    attributes: &std::collections::HashMap<String, String>,
    ports: u32,
) -> Result<peloton_engine::host::HostSpec, Status> {
    let capacity = self::resources("register.resources", resources)?;
    let gpus = resources.map_or(0.0, |r| r.gpu);
    if gpus.fract() != 0.0 || !(0.0..=16.0).contains(&gpus) {
        return Err(invalid(
            "register.resources.gpu",
            format!("must be a whole number of devices, 0–16 (got {gpus})"),
        ));
    }
    let mut attrs: Vec<(String, String)> = attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !attributes.contains_key("host") {
        attrs.push(("host".into(), name.to_string()));
    }
    attrs.sort_unstable();
    Ok(peloton_engine::host::HostSpec {
        name: name.to_string(),
        capacity,
        gpu_devices: gpus as u8,
        ports,
        attributes: attrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_text_is_cut_to_1_kib_at_a_character_boundary() {
        assert_eq!(
            agent_text("exited with code 3".into()),
            "exited with code 3"
        );
        let exact = "x".repeat(MAX_AGENT_TEXT_BYTES);
        assert_eq!(agent_text(exact.clone()), exact);
        // Three-byte characters: no boundary falls on the limit.
        let long = "€".repeat(1_000_000);
        let cut = agent_text(long);
        assert!(cut.len() <= MAX_AGENT_TEXT_BYTES, "{} bytes", cut.len());
        assert!(cut.len() > MAX_AGENT_TEXT_BYTES - 8, "{} bytes", cut.len());
        assert!(cut.ends_with("€…"), "{cut}");
        assert!(cut.trim_end_matches('…').chars().all(|c| c == '€'));
    }

    fn good_job() -> pb::JobSpec {
        pb::JobSpec {
            name: "hello".into(),
            pool: "/batch".into(),
            instance_count: 3,
            default_task: Some(pb::TaskSpec {
                command: "/bin/true".into(),
                resources: Some(pb::Resources {
                    cpu: 0.5,
                    memory_mb: 64.0,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn error_of(spec: &pb::JobSpec) -> (tonic::Code, String) {
        let e = job_plan(spec, &Limits::default()).unwrap_err();
        (e.code(), e.message().to_string())
    }

    /// `spec.rendezvous`: only a gang's, a known framework (kept
    /// lower-case), a port the task declares; each refusal names its field.
    /// A schedule is checked field by field; the ticks' spec is the cron
    /// job's without its schedule.
    #[test]
    fn a_schedule_is_checked_naming_its_field() {
        let mut s = good_job();
        let schedule = |cron: &str, tz: &str, overlap: i32| {
            Some(pb::CronSchedule {
                cron: cron.into(),
                time_zone: tz.into(),
                overlap,
                ..Default::default()
            })
        };
        s.schedule = schedule("*/5 * * *", "", 0);
        let (code, message) = error_of(&s);
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(message.starts_with("spec.schedule.cron: "), "{message}");
        s.schedule = schedule("@daily", "Europe/Nowhere", 0);
        assert!(error_of(&s).1.starts_with("spec.schedule.time_zone: "));
        s.schedule = schedule("@daily", "", 7);
        assert_eq!(error_of(&s).1, "spec.schedule.overlap: unknown policy 7");
        s.schedule = schedule("@daily", "Asia/Tokyo", pb::CronOverlap::Forbid as i32);
        let plan = job_plan(&s, &Limits::default()).unwrap();
        let schedule = plan.schedule.expect("a cron job");
        assert_eq!(schedule.overlap, crate::lifecycle::Overlap::Forbid);
        let tick = pb::JobSpec::decode(&schedule.job_spec[..]).unwrap();
        assert_eq!(tick.schedule, None);
        assert_eq!(tick.name, s.name);
        s.r#type = pb::JobType::Service as i32;
        assert_eq!(
            error_of(&s).1,
            "spec.schedule: only batch jobs have a schedule"
        );
    }

    #[test]
    fn a_rendezvous_is_checked() {
        let mut s = good_job();
        let rendezvous = |framework: &str, port: &str| {
            Some(pb::RendezvousSpec {
                framework: framework.into(),
                port: port.into(),
            })
        };
        s.rendezvous = rendezvous("pytorch", "");
        assert_eq!(
            error_of(&s),
            (
                tonic::Code::InvalidArgument,
                "spec.rendezvous: only a gang job (sla.min_running_instances above 1) has a \
                 rendezvous"
                    .into()
            )
        );
        s.sla = Some(pb::Sla {
            min_running_instances: 3,
            ..Default::default()
        });
        assert_eq!(
            error_of(&s).1,
            "spec.rendezvous.port: the pytorch framework needs a port for its leader: declare \
             one in spec.default_task.ports"
        );
        s.default_task.as_mut().unwrap().ports = vec![pb::PortSpec {
            name: "master".into(),
        }];
        s.rendezvous = rendezvous("horovod", "");
        assert_eq!(
            error_of(&s).1,
            "spec.rendezvous.framework: \"horovod\" is not one of pytorch, tensorflow, mpi"
        );
        s.rendezvous = rendezvous("pytorch", "other");
        assert_eq!(
            error_of(&s).1,
            "spec.rendezvous.port: \"other\" is not a port of spec.default_task.ports"
        );
        s.rendezvous = rendezvous("PyTorch", "master");
        let plan = job_plan(&s, &Limits::default()).unwrap();
        let ask = plan.rendezvous.expect("asked");
        assert_eq!((&*ask.framework, &*ask.port), ("pytorch", "master"));
        assert_eq!(&*plan.default.port_names, &["master".into()]);
        s.rendezvous = rendezvous("mpi", "");
        s.default_task.as_mut().unwrap().ports.clear();
        assert!(job_plan(&s, &Limits::default()).is_ok());
    }

    #[test]
    fn the_host_pool_is_anded_into_every_constraint() {
        let mut s = good_job();
        let plan = job_plan(&s, &Limits::default()).unwrap();
        assert_eq!(plan.default.constraint, "peloton.host_pool == \"default\"");
        s.host_pool = "gpu.a-1".into();
        s.default_task.as_mut().unwrap().constraint = "zone == a or zone == b".into();
        s.overrides.push(pb::InstanceOverride {
            instance: 1,
            spec: s.default_task.clone(),
        });
        s.overrides[0].spec.as_mut().unwrap().constraint = String::new();
        let plan = job_plan(&s, &Limits::default()).unwrap();
        let want = "(zone == a or zone == b) and peloton.host_pool == \"gpu.a-1\"";
        assert_eq!(plan.default.constraint, want);
        assert_eq!(
            plan.overrides[&1].constraint,
            "peloton.host_pool == \"gpu.a-1\""
        );
        // What the engine compiles: the pool binds to the whole user
        // constraint, not to its last term.
        let mut i = Interner::new();
        let shown = Constraint::parse(want, &mut i)
            .unwrap()
            .display(&i)
            .to_string();
        assert_eq!(
            shown,
            "((zone==a || zone==b) && peloton.host_pool==gpu.a-1)"
        );
        s.host_pool = "a b".into();
        assert!(error_of(&s).1.starts_with("spec.host_pool: "));
    }

    #[test]
    fn a_good_job_converts_to_engine_units() {
        let plan = job_plan(&good_job(), &Limits::default()).unwrap();
        assert_eq!(plan.default.request[Dim::Cpu], 500);
        assert_eq!(plan.default.request[Dim::Memory], 64);
        assert_eq!(plan.gang, 1);
        assert_eq!(plan.default.restart.backoff(1), 1000);
        assert_eq!(plan.default.restart.backoff(3), 4000);
        assert_eq!(plan.default.restart.backoff(30), 60_000);
    }

    #[test]
    fn a_batch_jobs_instance_0_alone_may_be_its_controller_task() {
        let with_override = |kind: pb::JobType, instance: u32, controller: bool| {
            let mut s = good_job();
            s.r#type = kind as i32;
            let mut t = s.default_task.clone().unwrap();
            t.controller = controller;
            s.overrides.push(pb::InstanceOverride {
                instance,
                spec: Some(t),
            });
            s
        };
        let plan = job_plan(
            &with_override(pb::JobType::Batch, 0, true),
            &Limits::default(),
        )
        .unwrap();
        assert!(plan.overrides[&0].controller && !plan.default.controller);
        assert!(plan.has_controller_instance());
        assert_eq!(
            error_of(&with_override(pb::JobType::Batch, 1, true)).1,
            "spec.overrides[0].spec.controller: only instance 0 may be a controller task (a batch job's, as in Peloton)"
        );
        assert_eq!(
            error_of(&with_override(pb::JobType::Service, 0, true)).1,
            "spec.overrides[0].spec.controller: only a batch job's instance 0 may be a controller task apart from its default task"
        );
        // A controller default makes every instance one.
        let mut s = with_override(pb::JobType::Batch, 0, false);
        s.default_task.as_mut().unwrap().controller = true;
        assert_eq!(
            error_of(&s).1,
            "spec.overrides[0].spec.controller: the default task is a controller task, and so is every instance"
        );
        // A gang is one queue entry: it cannot hold a controller task.
        let mut s = with_override(pb::JobType::Batch, 0, true);
        s.sla = Some(pb::Sla {
            min_running_instances: 3,
            ..Default::default()
        });
        assert_eq!(
            error_of(&s).1,
            "spec.overrides[0].spec.controller: a gang job (spec.sla.min_running_instances 3) cannot have a controller task: a gang is queued as one entry of one class"
        );
        // Revocability stays the job's.
        let mut s = with_override(pb::JobType::Batch, 2, false);
        s.overrides[0].spec.as_mut().unwrap().revocable = true;
        assert_eq!(
            error_of(&s).1,
            "spec.overrides[0].spec.revocable: true where the default task's is false: revocability is the job's"
        );
    }

    #[test]
    fn an_expected_runtime_is_carried_per_instance_up_to_365_days() {
        let mut s = good_job();
        s.default_task.as_mut().unwrap().expected_runtime_ms = MAX_EXPECTED_RUNTIME_MS;
        let mut t = s.default_task.clone().unwrap();
        t.expected_runtime_ms = 5000;
        t.args = vec!["x".into()];
        s.overrides.push(pb::InstanceOverride {
            instance: 1,
            spec: Some(t),
        });
        let plan = job_plan(&s, &Limits::default()).unwrap();
        assert_eq!(
            plan.template(0).expected_runtime_ms,
            MAX_EXPECTED_RUNTIME_MS
        );
        assert_eq!(plan.template(1).expected_runtime_ms, 5000);
        // Runs are learned by command and arguments.
        assert_ne!(plan.template(0).command_key, plan.template(1).command_key);
        assert_eq!(plan.template(0).command_key, plan.template(2).command_key);
        s.overrides[0].spec.as_mut().unwrap().expected_runtime_ms = MAX_EXPECTED_RUNTIME_MS + 1;
        assert_eq!(
            error_of(&s),
            (
                tonic::Code::InvalidArgument,
                "spec.overrides[0].spec.expected_runtime_ms: 31536000001 is above the limit \
                 of 31536000000 (365 days)"
                    .into()
            )
        );
    }

    #[test]
    fn bad_jobs_name_the_field() {
        let mut s = good_job();
        s.instance_count = 0;
        assert_eq!(
            error_of(&s),
            (
                tonic::Code::InvalidArgument,
                "spec.instance_count: must be at least 1".into()
            )
        );
        let mut s = good_job();
        s.instance_count = 100_001;
        assert!(
            error_of(&s)
                .1
                .starts_with("spec.instance_count: 100001 is more")
        );
        let mut s = good_job();
        s.default_task
            .as_mut()
            .unwrap()
            .resources
            .as_mut()
            .unwrap()
            .cpu = -1.0;
        assert_eq!(
            error_of(&s).1,
            "spec.default_task.resources.cpu: must not be negative (got -1)"
        );
        let mut s = good_job();
        s.default_task.as_mut().unwrap().resources = None;
        assert!(
            error_of(&s)
                .1
                .starts_with("spec.default_task.resources: must request")
        );
        let mut s = good_job();
        s.default_task.as_mut().unwrap().constraint = "zone ==".into();
        assert!(error_of(&s).1.starts_with("spec.default_task.constraint: "));
        let mut s = good_job();
        s.default_task.as_mut().unwrap().shutdown_delay_ms = MAX_SHUTDOWN_DELAY_MS;
        assert_eq!(
            job_plan(&s, &Limits::default())
                .unwrap()
                .default
                .shutdown_delay_ms,
            MAX_SHUTDOWN_DELAY_MS
        );
        s.default_task.as_mut().unwrap().shutdown_delay_ms = MAX_SHUTDOWN_DELAY_MS + 1;
        assert_eq!(
            error_of(&s).1,
            "spec.default_task.shutdown_delay_ms: 600001 is above the limit of 600000 (10 minutes)"
        );
        let mut s = good_job();
        s.default_task.as_mut().unwrap().preemption_notice_ms = MAX_PREEMPTION_NOTICE_MS;
        assert_eq!(
            job_plan(&s, &Limits::default())
                .unwrap()
                .default
                .preemption_notice_ms,
            MAX_PREEMPTION_NOTICE_MS
        );
        s.default_task.as_mut().unwrap().preemption_notice_ms = MAX_PREEMPTION_NOTICE_MS + 1;
        assert_eq!(
            error_of(&s).1,
            "spec.default_task.preemption_notice_ms: 600001 is above the limit of 600000 (10 minutes)"
        );
        let mut s = good_job();
        s.r#type = pb::JobType::Stateful as i32;
        assert_eq!(
            error_of(&s).1,
            "spec.default_task.volume: a stateful job's task must have a volume"
        );
        s.default_task.as_mut().unwrap().volume = Some(pb::VolumeSpec {
            size_mb: 10,
            path: "../etc".into(),
        });
        assert!(
            error_of(&s)
                .1
                .starts_with("spec.default_task.volume.path: \"../etc\"")
        );
        s.default_task.as_mut().unwrap().volume = Some(pb::VolumeSpec {
            size_mb: 10,
            path: "stdout".into(),
        });
        assert!(error_of(&s).1.contains("would hide a file"));
        s.default_task.as_mut().unwrap().volume = Some(pb::VolumeSpec {
            size_mb: 0,
            path: String::new(),
        });
        assert!(
            error_of(&s)
                .1
                .starts_with("spec.default_task.volume.size_mb: 0")
        );
        s.default_task.as_mut().unwrap().volume = Some(pb::VolumeSpec {
            size_mb: 10,
            path: String::new(),
        });
        assert_eq!(
            job_plan(&s, &Limits::default())
                .unwrap()
                .default
                .volume
                .clone()
                .unwrap()
                .path
                .as_ref(),
            "data"
        );
        let mut s = good_job();
        s.r#type = pb::JobType::Daemon as i32;
        s.instance_count = 0;
        assert_eq!(
            job_plan(&s, &Limits::default()).unwrap().kind,
            JobKind::Daemon
        );
        let mut s = good_job();
        s.r#type = pb::JobType::Service as i32;
        assert!(job_plan(&s, &Limits::default()).is_ok());
        let mut s = good_job();
        s.default_task.as_mut().unwrap().health_check = Some(pb::HealthCheck {
            kind: Some(pb::health_check::Kind::Http(pb::HttpHealthCheck {
                port: "http".into(),
                path: "/".into(),
            })),
            ..Default::default()
        });
        assert_eq!(
            error_of(&s).1,
            "spec.default_task.health_check.http.port: \"http\" is not one of the task's ports"
        );
        s.default_task.as_mut().unwrap().ports = vec![pb::PortSpec {
            name: "http".into(),
        }];
        assert!(
            job_plan(&s, &Limits::default())
                .unwrap()
                .default
                .health_check
        );
        s.default_task.as_mut().unwrap().health_check = Some(pb::HealthCheck::default());
        assert_eq!(
            error_of(&s).1,
            "spec.default_task.health_check: set one of command, http or tcp_port"
        );
        let mut s = good_job();
        s.sla = Some(pb::Sla {
            min_running_instances: 4,
            ..Default::default()
        });
        assert!(error_of(&s).1.starts_with("spec.sla.min_running_instances"));
        let mut s = good_job();
        s.overrides.push(pb::InstanceOverride {
            instance: 3,
            spec: s.default_task.clone(),
        });
        assert!(error_of(&s).1.starts_with("spec.overrides[0].instance"));
        let mut s = good_job();
        s.pool.clear();
        assert!(error_of(&s).1.starts_with("spec.pool"));
    }

    #[test]
    fn pool_specs_round_trip_and_unset_limits_mean_none() {
        let spec = pb::PoolSpec {
            reservation: Some(pb::Resources {
                cpu: 4.0,
                memory_mb: 1024.0,
                ..Default::default()
            }),
            limit: Some(pb::Resources {
                cpu: 8.0,
                ..Default::default()
            }),
            share: 2.0,
            strict_order: true,
            ..Default::default()
        };
        let config = pool_config(Some(&spec)).unwrap();
        assert_eq!(config.limit()[Dim::Memory], MAX_AMOUNT);
        assert!(config.strict_order);
        let back = pool_spec_to_pb(&config);
        assert_eq!(back.reservation, spec.reservation);
        assert_eq!(back.limit, spec.limit);
        assert_eq!(back.share, 2.0);
        assert!(back.strict_order);
        let bad = pb::PoolSpec {
            share: -1.0,
            ..Default::default()
        };
        assert_eq!(
            pool_config(Some(&bad)).unwrap_err().message(),
            "spec.share: must be positive (got -1)"
        );
    }

    #[test]
    fn per_dimension_shares_fill_in_from_share_and_read_back_where_they_differ() {
        let spec = pb::PoolSpec {
            share: 2.0,
            shares: Some(pb::Resources {
                cpu: 3.0,
                memory_mb: 0.5,
                ..Default::default()
            }),
            ..Default::default()
        };
        let config = pool_config(Some(&spec)).unwrap();
        let shares: Vec<f64> = config.dims.iter().map(|d| d.share).collect();
        assert_eq!(shares, [3.0, 0.5, 2.0, 2.0], "unset dimensions use share");
        let back = pool_spec_to_pb(&config);
        assert_eq!(back.share, 3.0, "share reads as the cpu weight");
        assert_eq!(
            back.shares,
            Some(pb::Resources {
                cpu: 3.0,
                memory_mb: 0.5,
                disk_mb: 2.0,
                gpu: 2.0
            })
        );
        assert_eq!(pool_config(Some(&back)).unwrap(), config, "round trip");

        // Equal weights everywhere read back as one share.
        let same = pb::PoolSpec {
            shares: Some(pb::Resources {
                cpu: 4.0,
                memory_mb: 4.0,
                disk_mb: 4.0,
                gpu: 4.0,
            }),
            ..Default::default()
        };
        let back = pool_spec_to_pb(&pool_config(Some(&same)).unwrap());
        assert_eq!((back.share, back.shares), (4.0, None));

        for (shares, message) in [
            (
                pb::Resources {
                    memory_mb: -1.0,
                    ..Default::default()
                },
                "spec.shares.memory_mb: must be positive (got -1)",
            ),
            (
                pb::Resources {
                    gpu: f64::NAN,
                    ..Default::default()
                },
                "spec.shares.gpu: must be a finite number",
            ),
            (
                pb::Resources {
                    cpu: f64::INFINITY,
                    ..Default::default()
                },
                "spec.shares.cpu: must be a finite number",
            ),
            (
                pb::Resources {
                    disk_mb: 1e9,
                    ..Default::default()
                },
                "spec.shares.disk_mb: must be between 0.001 and 1000000 (got 1000000000)",
            ),
        ] {
            let bad = pb::PoolSpec {
                shares: Some(shares),
                ..Default::default()
            };
            assert_eq!(pool_config(Some(&bad)).unwrap_err().message(), message);
        }
    }
}
