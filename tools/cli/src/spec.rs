//! The YAML files the CLI reads: job specs and resource pools, as serde
//! structs that reject unknown fields, converted to the API's messages.
//! Files in Peloton's own format (told apart by their keys) are read into
//! the same structs by [`crate::peloton_yaml`]; `peloton convert` writes
//! those structs back out as YAML of this format.
//!
//! Only the shape of a file is checked here; what the values mean (an
//! instance count of 0, a bad constraint) is the server's to judge, so there
//! is one source of truth for validation.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

use peloton_proto::v1::{
    HealthCheck, HttpHealthCheck, InstanceOverride, JobSpec, JobType, PlacementStrategy, PoolKind,
    PoolSpec, PortSpec, Resources, RestartPolicy, SimSpec, Sla, TaskSpec, health_check,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::peloton_yaml::{self, Format, Note, PelotonError};

/// A spec file that cannot be read or does not have the expected shape.
#[derive(Debug)]
pub struct SpecError {
    /// The file (or other origin) the text came from.
    pub origin: String,
    pub kind: SpecErrorKind,
}

#[derive(Debug)]
pub enum SpecErrorKind {
    Read(std::io::Error),
    /// serde's message names the field and the line and column.
    Yaml(serde_norway::Error),
    /// A Peloton-format file: the field's YAML path and the problem.
    Peloton(PelotonError),
    /// The file does not go with the rest of the command line.
    Usage(String),
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SpecErrorKind::Read(err) => write!(f, "cannot read {}: {err}", self.origin),
            SpecErrorKind::Yaml(err) => write!(f, "{}: {err}", self.origin),
            SpecErrorKind::Peloton(err) => write!(f, "{}: {err}", self.origin),
            SpecErrorKind::Usage(problem) => write!(f, "{}: {problem}", self.origin),
        }
    }
}

impl std::error::Error for SpecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            SpecErrorKind::Read(err) => Some(err),
            SpecErrorKind::Yaml(err) => Some(err),
            SpecErrorKind::Peloton(err) => Some(err),
            SpecErrorKind::Usage(_) => None,
        }
    }
}

fn peloton_error(err: PelotonError, origin: &str) -> SpecError {
    SpecError {
        origin: origin.to_owned(),
        kind: SpecErrorKind::Peloton(err),
    }
}

// ---------------------------------------------------------------- jobs

/// A job spec file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// The job's name, optional: it names the job in place of its id (`peloton job get NAME`,
    /// or `POOL/NAME` when several pools have one). Unique among a pool's unfinished jobs: a job
    /// is refused (ALREADY_EXISTS) while another of its pool that has not ended holds the name,
    /// and the name is free again once that one has ended (ended jobs keep theirs: a name held
    /// by several ended jobs alone is refused where an id is wanted; `job query --name` lists
    /// them). An update cannot rename a job. A cron job needs one. At most 1 KiB, without '/'.
    #[serde(default, skip_serializing_if = "is_default")]
    pub name: String,
    /// Who the job is for. A secure server records the caller's token instead; the CLI fills in
    /// `$USER` when empty.
    #[serde(default, skip_serializing_if = "is_default")]
    pub owner: String,
    /// Labels (`job query --label k=v`). At most 1024; keys at most 256 bytes, values 64 KiB.
    #[serde(default, skip_serializing_if = "is_default")]
    pub labels: BTreeMap<String, String>,
    /// What kind of job: its instances run once (batch) or are kept running (service, stateful), or
    /// one runs on every matching host (daemon).
    #[serde(default, rename = "type")]
    pub job_type: JobTypeName,
    /// The resource pool (a leaf, e.g. `/batch/research`) whose entitlement the job runs in. `job
    /// create RESPOOL FILE` and `run --pool` replace it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub pool: String,
    /// How many instances (tasks) the job has. Default 1; daemons ignore it.
    #[serde(default = "one")]
    pub instances: u32,
    /// How hosts are chosen for the job's tasks.
    #[serde(default, skip_serializing_if = "is_default")]
    pub placement: PlacementName,
    /// Priority, preemption, gangs and limits.
    #[serde(default, skip_serializing_if = "is_default")]
    pub sla: SlaFile,
    /// The task every instance runs (unless an override replaces it).
    pub task: TaskFile,
    /// Instances that run another task than `task` (each replaces it whole, not merged).
    #[serde(default, skip_serializing_if = "is_default")]
    pub overrides: Vec<OverrideFile>,
    /// Jobs whose task has a volume: what happens when its host is down.
    #[serde(default, skip_serializing_if = "is_default")]
    pub stateful: Option<StatefulFile>,
    /// The host pool the job runs in (empty: "default").
    #[serde(default, skip_serializing_if = "is_default")]
    pub host_pool: String,
    /// Gang jobs: the framework aliases each member gets besides the
    /// `PELOTON_GANG_*` environment.
    #[serde(default, skip_serializing_if = "is_default")]
    pub rendezvous: Option<RendezvousFile>,
    /// Jobs this job waits for (Slurm's afterok, afterany, afternotok).
    #[serde(default, skip_serializing_if = "is_default")]
    pub after: AfterFile,
    /// A cron job (batch jobs only): the job runs no task itself; each tick of the schedule creates
    /// a job of this spec (the schedule left out), id `<cron job's id>-<tick in minutes since the
    /// epoch>`. A tick missed while the server was down fires on its return if at most 5 minutes
    /// late, and only the latest of several. `job kill` stops the schedule (and its ticks' running
    /// jobs); `job restart` resumes it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub schedule: Option<ScheduleFile>,
}

/// When a cron job ticks and what a tick does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    /// Five fields, minute hour day-of-month month day-of-week (`*/15 * * * 1-5`), or `@yearly`,
    /// `@monthly`, `@weekly`, `@daily`, `@hourly`. Ticks are at least a minute apart.
    pub cron: String,
    /// The IANA time zone the expression is read in, e.g. `Europe/Berlin` (empty: UTC). A time
    /// that happens twice when clocks go back fires once; one skipped when they go forward fires
    /// right after the gap.
    #[serde(default, skip_serializing_if = "is_default")]
    pub time_zone: String,
    /// What a tick does while a job of an earlier tick has not ended.
    #[serde(default, skip_serializing_if = "is_default")]
    pub overlap: OverlapName,
    /// Ended ticks' jobs kept that succeeded (default 3, at most 100); older ones are deleted at
    /// each tick.
    #[serde(default, skip_serializing_if = "is_default")]
    pub keep_succeeded: Option<u32>,
    /// Ended ticks' jobs kept that failed or were killed (default 1, at most 100).
    #[serde(default, skip_serializing_if = "is_default")]
    pub keep_failed: Option<u32>,
}

/// What a cron job's tick does while an earlier tick's job runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OverlapName {
    /// Start the new job anyway (at most 16 of a cron job's ticks' jobs run at once).
    #[default]
    Allow,
    /// Skip the tick.
    Forbid,
    /// Kill the earlier ticks' jobs, then start the new one.
    Replace,
}

/// Jobs a job waits for, by how each must end: ids or unique starts of
/// them. None of its instances is queued until each is met.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AfterFile {
    /// Each must succeed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub succeeded: Vec<String>,
    /// Each must end, in any way.
    #[serde(default, skip_serializing_if = "is_default")]
    pub finished: Vec<String>,
    /// Each must fail or be killed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub failed: Vec<String>,
}

/// `rendezvous: {framework: pytorch|tensorflow|mpi, port: NAME}` (checked
/// by the server).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RendezvousFile {
    /// `pytorch` (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
    /// `tensorflow` (TF_CONFIG) or `mpi` (PELOTON_MPI_HOSTFILE); empty: none.
    #[serde(default, skip_serializing_if = "is_default")]
    pub framework: String,
    /// The leader's rendezvous port (default: the task's first port).
    #[serde(default, skip_serializing_if = "is_default")]
    pub port: String,
}

/// Jobs whose task has a volume: what happens when its host is down.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatefulFile {
    /// How long the volume's host may be down before `on_host_down`
    /// applies (0: the server's default, 10 minutes).
    #[serde(default, skip_serializing_if = "is_default")]
    pub host_down_timeout_ms: u64,
    /// What happens once the volume's host has been down for `host_down_timeout_ms`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_host_down: VolumeLossName,
}

/// What happens to an instance whose volume's host stays down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeLossName {
    /// Keep waiting for the host.
    #[default]
    Wait,
    /// Give the volume up and start fresh elsewhere.
    Relocate,
}

/// A persistent volume of the task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeFile {
    /// Size in MiB, charged to the host's disk while the volume exists.
    pub size_mb: u64,
    /// Inside the sandbox (default "data").
    #[serde(default, skip_serializing_if = "is_default")]
    pub path: String,
}

fn one() -> u32 {
    1
}

/// Left out of the YAML the CLI writes (`peloton convert`): the field's
/// default, which the parser fills in again.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The kind of job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobTypeName {
    /// Instances run to completion, retried on failure.
    #[default]
    Batch,
    /// Instances are kept running; rolling updates.
    Service,
    /// A service whose instances keep their volumes and hosts.
    Stateful,
    /// One instance on every matching host, drained last.
    Daemon,
    /// A Spark-style application in cluster mode: one instance, its driver.
    Application,
}

/// How hosts are chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlacementName {
    /// Fill the fullest hosts first (fewest hosts in use).
    #[default]
    Pack,
    /// Emptiest hosts first.
    Spread,
    /// The first host that fits, in host order.
    FirstFit,
    /// GPU tasks where they fragment the cluster's GPUs least.
    GpuFrag,
}

/// Priority, preemption, gangs and limits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlaFile {
    /// Higher goes first in its pool's queue and may preempt lower-priority preemptible work of its
    /// pool.
    #[serde(default, skip_serializing_if = "is_default")]
    pub priority: u32,
    /// May be preempted: by work of pools that are owed their entitlement, or by higher-priority
    /// work of its own pool.
    #[serde(default, skip_serializing_if = "is_default")]
    pub preemptible: bool,
    /// At most this many instances queued or running at once; the next as those end (0: no limit).
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_running_instances: u32,
    /// Instances are admitted and placed in groups of this many.
    #[serde(default, skip_serializing_if = "is_default")]
    pub gang_size: u32,
    /// Elastic gangs: the job (one gang: `instances` equals `gang_size`) starts once this many
    /// members fit together, grows toward `gang_size` as room frees, and when members are
    /// preempted, lost or fail goes on with the rest while at least this many run (below it the
    /// gang starts again as one). Members learn each new membership from their `rendezvous.json`
    /// (a new `generation`). Batch jobs only; 0: not elastic.
    #[serde(default, skip_serializing_if = "is_default")]
    pub elastic_min: u32,
    /// A run longer than this is killed (0: no limit).
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_running_time_ms: u64,
    /// Services: a host drain stops at most this many instances at a time.
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_unavailable_instances: u32,
}

/// What an instance runs and needs.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskFile {
    /// The program to run (with `args`); either this or `shell`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub command: String,
    /// The command's arguments.
    #[serde(default, skip_serializing_if = "is_default")]
    pub args: Vec<String>,
    /// A shell line (`/bin/sh -c`), instead of `command` and `args`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub shell: String,
    /// Environment variables, besides the `PELOTON_*` ones the agent sets.
    #[serde(default, skip_serializing_if = "is_default")]
    pub env: BTreeMap<String, String>,
    /// What one instance needs; the engine places it only where this is free.
    #[serde(default, skip_serializing_if = "is_default")]
    pub resources: ResourcesFile,
    /// Port names; each is exposed to the task as `PELOTON_PORT_<NAME>`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub ports: Vec<String>,
    /// Which hosts may run it, e.g. `zone == "z1" and not (rack in {r1, r2})`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub constraint: String,
    /// What happens when a run fails.
    #[serde(default, skip_serializing_if = "is_default")]
    pub restart: RestartFile,
    /// Runs on what other tasks are allocated but do not use, and is the first to go when they need
    /// it. The same for every instance.
    #[serde(default, skip_serializing_if = "is_default")]
    pub revocable: bool,
    /// A controller task (a driver, such as Spark's), held to its pool's controller limit. On
    /// instance 0's override alone (a batch job, not a gang): the job ends as instance 0 does.
    #[serde(default, skip_serializing_if = "is_default")]
    pub controller: bool,
    /// From the stop signal to SIGKILL (0 means 10000 ms).
    #[serde(default, skip_serializing_if = "is_default")]
    pub kill_grace_period_ms: u64,
    /// Deregistration delay: a run told to stop is shown stopping at once
    /// and signalled this long after (at most 600000).
    #[serde(default, skip_serializing_if = "is_default")]
    pub shutdown_delay_ms: u64,
    /// Preemption notice: a preempted run gets SIGTERM (and the reason in
    /// `$PELOTON_PREEMPTED`) at once, and its stop signal this long after
    /// (at most 600000).
    #[serde(default, skip_serializing_if = "is_default")]
    pub preemption_notice_ms: u64,
    /// How long a run is expected to last (start of running to end; at
    /// most 365 days): start-time forecasts use it. Not a limit (that is
    /// `sla.max_running_time_ms`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub expected_runtime_ms: u64,
    /// At most this many instances of the job on one host (0: no limit).
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_instances_per_host: u32,
    /// On simulated hosts (`pelotond --sim-hosts`): how long a run "runs" and how it exits. Agents
    /// ignore it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub sim: SimFile,
    /// Run by the agent while the task runs; an unhealthy task is restarted.
    #[serde(default, skip_serializing_if = "is_default")]
    pub health_check: Option<HealthCheckFile>,
    /// A persistent volume; the instance is pinned to its host.
    #[serde(default, skip_serializing_if = "is_default")]
    pub volume: Option<VolumeFile>,
    /// Signal asking the task to stop before SIGKILL (default SIGTERM;
    /// e.g. SIGPWR, SIGINT).
    #[serde(default, skip_serializing_if = "is_default")]
    pub stop_signal: String,
    /// `resident`: the same as the default now (memory is always limited
    /// by what the task holds, not its address space); kept for the files
    /// that name it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub memory_limit: MemoryLimitName,
}

/// What the memory limit counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryLimitName {
    /// The cgroup's memory (page cache included).
    #[default]
    Default,
    /// Resident memory only.
    Resident,
}

/// A health check: exactly one of `command`, `http` or `tcp_port`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    /// A shell line run in the sandbox with the task's environment: healthy when it exits 0.
    #[serde(default, skip_serializing_if = "is_default")]
    pub command: Option<String>,
    /// Healthy when an HTTP GET of the named port's path answers 2xx.
    #[serde(default, skip_serializing_if = "is_default")]
    pub http: Option<HttpCheckFile>,
    /// Healthy when a TCP connection to this named port succeeds.
    #[serde(default, skip_serializing_if = "is_default")]
    pub tcp_port: Option<String>,
    /// No check before this long after the task started.
    #[serde(default, skip_serializing_if = "is_default")]
    pub initial_delay_ms: u64,
    /// Between checks (0 means 10000 ms).
    #[serde(default, skip_serializing_if = "is_default")]
    pub interval_ms: u64,
    /// A check that takes longer has failed (0 means 5000 ms).
    #[serde(default, skip_serializing_if = "is_default")]
    pub timeout_ms: u64,
    /// Unhealthy after this many failed checks in a row (0 means 3).
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_consecutive_failures: u32,
}

/// An HTTP health check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpCheckFile {
    /// The named port (one of the task's `ports`).
    pub port: String,
    /// The path (default `/`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub path: String,
}

impl HealthCheckFile {
    /// The check; more than one kind is left for the server to refuse
    /// (by sending none: it names the field).
    pub fn into_proto(self) -> HealthCheck {
        let kinds = usize::from(self.command.is_some())
            + usize::from(self.http.is_some())
            + usize::from(self.tcp_port.is_some());
        let kind = if kinds != 1 {
            None
        } else if let Some(c) = self.command {
            Some(health_check::Kind::Command(c))
        } else if let Some(h) = self.http {
            Some(health_check::Kind::Http(HttpHealthCheck {
                port: h.port,
                path: h.path,
            }))
        } else {
            self.tcp_port.map(health_check::Kind::TcpPort)
        };
        HealthCheck {
            kind,
            initial_delay_ms: self.initial_delay_ms,
            interval_ms: self.interval_ms,
            timeout_ms: self.timeout_ms,
            max_consecutive_failures: self.max_consecutive_failures,
        }
    }
}

/// Resources in API units: cpu cores, memory and disk MiB, GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesFile {
    /// Cores (fractions allowed).
    #[serde(default, skip_serializing_if = "is_default")]
    pub cpu: f64,
    /// Memory, MiB.
    #[serde(default, skip_serializing_if = "is_default")]
    pub memory_mb: f64,
    /// Disk, MiB.
    #[serde(default, skip_serializing_if = "is_default")]
    pub disk_mb: f64,
    /// GPUs: whole devices, or a fraction of one (a share of a device).
    #[serde(default, skip_serializing_if = "is_default")]
    pub gpu: f64,
}

/// What happens when a run fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartFile {
    /// Failed runs tolerated before the task is failed for good.
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_failures: u32,
    /// First back-off, doubled after each failure (0 means 1000 ms).
    #[serde(default, skip_serializing_if = "is_default")]
    pub backoff_ms: u64,
    /// Cap of the back-off (0 means 60000 ms).
    #[serde(default, skip_serializing_if = "is_default")]
    pub max_backoff_ms: u64,
}

/// A simulated run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SimFile {
    /// How long a simulated run lasts.
    #[serde(default, skip_serializing_if = "is_default")]
    pub duration_ms: u64,
    /// Its exit code (0: succeeded).
    #[serde(default, skip_serializing_if = "is_default")]
    pub exit_code: i32,
}

/// Another task for one instance.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideFile {
    /// The instance it applies to.
    pub instance: u32,
    /// Replaces the default task for this instance (it is not merged).
    pub task: TaskFile,
}

impl JobFile {
    pub fn into_proto(self) -> JobSpec {
        let job_type = match self.job_type {
            JobTypeName::Batch => JobType::Batch,
            JobTypeName::Service => JobType::Service,
            JobTypeName::Stateful => JobType::Stateful,
            JobTypeName::Daemon => JobType::Daemon,
            JobTypeName::Application => JobType::Application,
        };
        let placement = match self.placement {
            PlacementName::Pack => PlacementStrategy::Pack,
            PlacementName::Spread => PlacementStrategy::Spread,
            PlacementName::FirstFit => PlacementStrategy::FirstFit,
            PlacementName::GpuFrag => PlacementStrategy::GpuFrag,
        };
        JobSpec {
            name: self.name,
            owner: self.owner,
            labels: to_hash_map(self.labels),
            r#type: job_type.into(),
            pool: self.pool,
            instance_count: self.instances,
            default_task: Some(self.task.into_proto()),
            overrides: self
                .overrides
                .into_iter()
                .map(|o| InstanceOverride {
                    instance: o.instance,
                    spec: Some(o.task.into_proto()),
                })
                .collect(),
            sla: Some(Sla {
                priority: self.sla.priority,
                preemptible: self.sla.preemptible,
                max_running_instances: self.sla.max_running_instances,
                min_running_instances: self.sla.gang_size,
                elastic_min_instances: self.sla.elastic_min,
                max_running_time_ms: self.sla.max_running_time_ms,
                max_unavailable_instances: self.sla.max_unavailable_instances,
            }),
            placement: placement.into(),
            stateful: self.stateful.map(|s| peloton_proto::v1::StatefulPolicy {
                host_down_timeout_ms: s.host_down_timeout_ms,
                on_host_down: match s.on_host_down {
                    VolumeLossName::Wait => peloton_proto::v1::VolumeLossPolicy::Wait,
                    VolumeLossName::Relocate => peloton_proto::v1::VolumeLossPolicy::Relocate,
                }
                .into(),
            }),
            host_pool: self.host_pool,
            rendezvous: self.rendezvous.map(|r| peloton_proto::v1::RendezvousSpec {
                framework: r.framework,
                port: r.port,
            }),
            after: (self.after != AfterFile::default()).then_some(
                peloton_proto::v1::JobDependencies {
                    succeeded: self.after.succeeded,
                    finished: self.after.finished,
                    failed: self.after.failed,
                },
            ),
            schedule: self.schedule.map(|s| peloton_proto::v1::CronSchedule {
                cron: s.cron,
                time_zone: s.time_zone,
                overlap: match s.overlap {
                    OverlapName::Allow => peloton_proto::v1::CronOverlap::Allow,
                    OverlapName::Forbid => peloton_proto::v1::CronOverlap::Forbid,
                    OverlapName::Replace => peloton_proto::v1::CronOverlap::Replace,
                }
                .into(),
                keep_succeeded: s.keep_succeeded,
                keep_failed: s.keep_failed,
            }),
            ..Default::default()
        }
    }
}

impl JobFile {
    /// The spec file of a job's spec as the server returns it (`job get -o
    /// yaml`): [`JobFile::into_proto`] of it gives `spec` back, except
    /// what a spec file does not hold (secrets, given with `--secret`;
    /// an application's, which its driver registers).
    pub fn from_proto(spec: &JobSpec) -> JobFile {
        let sla = spec.sla.unwrap_or_default();
        JobFile {
            name: spec.name.clone(),
            owner: spec.owner.clone(),
            labels: spec.labels.clone().into_iter().collect(),
            job_type: match spec.r#type() {
                JobType::Service => JobTypeName::Service,
                JobType::Stateful => JobTypeName::Stateful,
                JobType::Daemon => JobTypeName::Daemon,
                JobType::Application => JobTypeName::Application,
                _ => JobTypeName::Batch,
            },
            pool: spec.pool.clone(),
            instances: spec.instance_count,
            placement: match spec.placement() {
                PlacementStrategy::Spread => PlacementName::Spread,
                PlacementStrategy::FirstFit => PlacementName::FirstFit,
                PlacementStrategy::GpuFrag => PlacementName::GpuFrag,
                _ => PlacementName::Pack,
            },
            sla: SlaFile {
                priority: sla.priority,
                preemptible: sla.preemptible,
                max_running_instances: sla.max_running_instances,
                gang_size: sla.min_running_instances,
                elastic_min: sla.elastic_min_instances,
                max_running_time_ms: sla.max_running_time_ms,
                max_unavailable_instances: sla.max_unavailable_instances,
            },
            task: TaskFile::from_proto(&spec.default_task.clone().unwrap_or_default()),
            overrides: spec
                .overrides
                .iter()
                .map(|o| OverrideFile {
                    instance: o.instance,
                    task: TaskFile::from_proto(&o.spec.clone().unwrap_or_default()),
                })
                .collect(),
            stateful: spec.stateful.as_ref().map(|s| StatefulFile {
                host_down_timeout_ms: s.host_down_timeout_ms,
                on_host_down: match s.on_host_down() {
                    peloton_proto::v1::VolumeLossPolicy::Relocate => VolumeLossName::Relocate,
                    _ => VolumeLossName::Wait,
                },
            }),
            host_pool: spec.host_pool.clone(),
            rendezvous: spec.rendezvous.as_ref().map(|r| RendezvousFile {
                framework: r.framework.clone(),
                port: r.port.clone(),
            }),
            after: spec
                .after
                .as_ref()
                .map(|a| AfterFile {
                    succeeded: a.succeeded.clone(),
                    finished: a.finished.clone(),
                    failed: a.failed.clone(),
                })
                .unwrap_or_default(),
            schedule: spec.schedule.as_ref().map(|s| ScheduleFile {
                cron: s.cron.clone(),
                time_zone: s.time_zone.clone(),
                overlap: match s.overlap() {
                    peloton_proto::v1::CronOverlap::Forbid => OverlapName::Forbid,
                    peloton_proto::v1::CronOverlap::Replace => OverlapName::Replace,
                    peloton_proto::v1::CronOverlap::Allow => OverlapName::Allow,
                },
                keep_succeeded: s.keep_succeeded,
                keep_failed: s.keep_failed,
            }),
        }
    }
}

impl TaskFile {
    /// The spec file's task of `task` (see [`JobFile::from_proto`]).
    pub fn from_proto(task: &TaskSpec) -> TaskFile {
        let r = task.resources.unwrap_or_default();
        let restart = task.restart.unwrap_or_default();
        let sim = task.sim.unwrap_or_default();
        TaskFile {
            command: task.command.clone(),
            args: task.args.clone(),
            shell: task.shell.clone(),
            env: task.env.clone().into_iter().collect(),
            resources: ResourcesFile {
                cpu: r.cpu,
                memory_mb: r.memory_mb,
                disk_mb: r.disk_mb,
                gpu: r.gpu,
            },
            ports: task.ports.iter().map(|p| p.name.clone()).collect(),
            constraint: task.constraint.clone(),
            restart: RestartFile {
                max_failures: restart.max_failures,
                backoff_ms: restart.backoff_ms,
                max_backoff_ms: restart.max_backoff_ms,
            },
            revocable: task.revocable,
            controller: task.controller,
            kill_grace_period_ms: task.kill_grace_period_ms,
            shutdown_delay_ms: task.shutdown_delay_ms,
            preemption_notice_ms: task.preemption_notice_ms,
            expected_runtime_ms: task.expected_runtime_ms,
            max_instances_per_host: task.max_instances_per_host,
            sim: SimFile {
                duration_ms: sim.duration_ms,
                exit_code: sim.exit_code,
            },
            health_check: task.health_check.as_ref().map(|h| HealthCheckFile {
                command: match &h.kind {
                    Some(health_check::Kind::Command(c)) => Some(c.clone()),
                    _ => None,
                },
                http: match &h.kind {
                    Some(health_check::Kind::Http(x)) => Some(HttpCheckFile {
                        port: x.port.clone(),
                        path: x.path.clone(),
                    }),
                    _ => None,
                },
                tcp_port: match &h.kind {
                    Some(health_check::Kind::TcpPort(p)) => Some(p.clone()),
                    _ => None,
                },
                initial_delay_ms: h.initial_delay_ms,
                interval_ms: h.interval_ms,
                timeout_ms: h.timeout_ms,
                max_consecutive_failures: h.max_consecutive_failures,
            }),
            volume: task.volume.as_ref().map(|v| VolumeFile {
                size_mb: v.size_mb,
                path: v.path.clone(),
            }),
            stop_signal: task.stop_signal.clone(),
            memory_limit: match task.memory_limit() {
                peloton_proto::v1::MemoryLimit::Resident => MemoryLimitName::Resident,
                _ => MemoryLimitName::Default,
            },
        }
    }

    pub fn into_proto(self) -> TaskSpec {
        TaskSpec {
            command: self.command,
            args: self.args,
            shell: self.shell,
            env: to_hash_map(self.env),
            resources: Some(self.resources.into_proto()),
            ports: self
                .ports
                .into_iter()
                .map(|name| PortSpec { name })
                .collect(),
            constraint: self.constraint,
            restart: Some(RestartPolicy {
                max_failures: self.restart.max_failures,
                backoff_ms: self.restart.backoff_ms,
                max_backoff_ms: self.restart.max_backoff_ms,
            }),
            revocable: self.revocable,
            controller: self.controller,
            kill_grace_period_ms: self.kill_grace_period_ms,
            shutdown_delay_ms: self.shutdown_delay_ms,
            preemption_notice_ms: self.preemption_notice_ms,
            expected_runtime_ms: self.expected_runtime_ms,
            sim: Some(SimSpec {
                duration_ms: self.sim.duration_ms,
                exit_code: self.sim.exit_code,
            }),
            max_instances_per_host: self.max_instances_per_host,
            health_check: self.health_check.map(HealthCheckFile::into_proto),
            volume: self.volume.map(|v| peloton_proto::v1::VolumeSpec {
                size_mb: v.size_mb,
                path: v.path,
            }),
            stop_signal: self.stop_signal,
            memory_limit: match self.memory_limit {
                MemoryLimitName::Default => peloton_proto::v1::MemoryLimit::Default,
                MemoryLimitName::Resident => peloton_proto::v1::MemoryLimit::Resident,
            } as i32,
        }
    }
}

impl ResourcesFile {
    pub fn into_proto(self) -> Resources {
        Resources {
            cpu: self.cpu,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
            gpu: self.gpu,
        }
    }
}

fn to_hash_map(map: BTreeMap<String, String>) -> HashMap<String, String> {
    map.into_iter().collect()
}

/// A spec file as read: in the native structs whatever its format, with
/// the notes of a Peloton-format file (fields kept as labels or ignored).
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    pub value: T,
    pub format: Format,
    pub notes: Vec<Note>,
}

/// Parses a job file, native or Peloton's (detected from its keys);
/// `origin` names the text's source in errors.
pub fn parse_job_file(text: &str, origin: &str) -> Result<Loaded<JobFile>, SpecError> {
    let (value, twice) = lenient_yaml(text, origin)?;
    match peloton_yaml::job_format(&value).map_err(|e| peloton_error(e, origin))? {
        // Parsed again from the text, so errors keep serde's line numbers.
        Format::Native => Ok(Loaded {
            value: native(text, origin, &twice)?,
            format: Format::Native,
            notes: Vec::new(),
        }),
        Format::Peloton => {
            let (value, notes) = peloton_yaml::job(&value).map_err(|e| peloton_error(e, origin))?;
            Ok(Loaded {
                value,
                format: Format::Peloton,
                notes: with_twice(&twice, notes),
            })
        }
    }
}

/// A file's YAML, read as Peloton's loader reads it (a key given twice is
/// taken from its last occurrence), and the paths of keys given twice.
fn lenient_yaml(text: &str, origin: &str) -> Result<(serde_norway::Value, Vec<String>), SpecError> {
    peloton_yaml::load(text).map_err(|err| SpecError {
        origin: origin.to_owned(),
        kind: SpecErrorKind::Yaml(err),
    })
}

/// A native file: a key given twice is refused.
fn native<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    twice: &[String],
) -> Result<T, SpecError> {
    if !twice.is_empty() {
        // YAML's own error, with its line.
        from_yaml::<serde_norway::Value>(text, origin)?;
    }
    from_yaml(text, origin)
}

/// The notes of a Peloton-format file, keys given twice first.
fn with_twice(twice: &[String], notes: Vec<Note>) -> Vec<Note> {
    let mut all = peloton_yaml::twice_notes(twice);
    all.extend(notes);
    all
}

/// Parses a job spec (either format) into the API's message.
/// The spec file's name of a field the server names by its API path
/// (`spec.default_task.resources.cpu` → `task.resources.cpu`), so that a
/// field has one name in files, `-o json`/`-o yaml` and errors. A path
/// outside the spec comes back as it is.
pub fn file_path_of(api_path: &str) -> String {
    let Some(rest) = api_path.strip_prefix("spec.") else {
        return api_path.to_owned();
    };
    let mut out = String::with_capacity(rest.len());
    let segments = rest.split('.');
    let mut first = true;
    let mut in_task = false;
    for segment in segments {
        let (name, index) = match segment.find('[') {
            Some(at) => segment.split_at(at),
            None => (segment, ""),
        };
        let renamed = match name {
            "default_task" if first => {
                in_task = true;
                "task"
            }
            "instance_count" if first => "instances",
            "min_running_instances" if out == "sla" => "gang_size",
            "spec" if out.starts_with("overrides[") && !out.contains('.') => {
                in_task = true;
                "task"
            }
            // A port is named by its name alone in a file.
            "name"
                if in_task
                    && out.ends_with(']')
                    && out
                        .rsplit('.')
                        .next()
                        .is_some_and(|s| s.starts_with("ports[")) =>
            {
                break;
            }
            other => other,
        };
        if !first {
            out.push('.');
        }
        out.push_str(renamed);
        out.push_str(index);
        first = false;
    }
    out
}

/// A server's refusal of a spec the CLI sent, its field path in the spec
/// file's names ([`file_path_of`]); any other status as it is.
pub fn in_file_terms(status: tonic::Status) -> tonic::Status {
    let message = status.message();
    let Some((path, why)) = message.split_once(": ") else {
        return status;
    };
    if !path.starts_with("spec.") || path.contains(' ') {
        return status;
    }
    let message = format!("{}: {why}", file_path_of(path));
    tonic::Status::new(status.code(), message)
}

pub fn parse_job_spec(text: &str, origin: &str) -> Result<JobSpec, SpecError> {
    Ok(parse_job_file(text, origin)?.value.into_proto())
}

/// Reads and parses a job file (either format).
pub fn load_job_file(path: &Path) -> Result<Loaded<JobFile>, SpecError> {
    parse_job_file(&read(path)?, &path.display().to_string())
}

/// Reads and parses a job spec file (either format).
pub fn load_job_spec(path: &Path) -> Result<JobSpec, SpecError> {
    Ok(load_job_file(path)?.value.into_proto())
}

// ---------------------------------------------------------------- pools

/// One pool of a pool file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// Absolute path, e.g. `/batch/research`.
    pub path: String,
    #[serde(default, skip_serializing_if = "is_default")]
    pub reservation: ResourcesFile,
    /// A dimension left at 0 has no limit.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limit: ResourcesFile,
    /// Weight for capacity beyond reservations (0: 1), in every dimension
    /// `shares` leaves at 0.
    #[serde(default, skip_serializing_if = "is_default")]
    pub share: f64,
    /// Per-dimension weights, e.g. `{cpu: 3, memory_mb: 1}`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub shares: Option<ResourcesFile>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub kind: PoolKindName,
    #[serde(default, skip_serializing_if = "is_default")]
    pub controller_limit_pct: f64,
    #[serde(default, skip_serializing_if = "is_default")]
    pub slack_limit_pct: f64,
    /// No start reservations and no backfill: the queues wait behind their
    /// heads.
    #[serde(default, skip_serializing_if = "is_default")]
    pub strict_order: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKindName {
    #[default]
    Elastic,
    Static,
}

/// A pool tree: `pools: [...]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PoolTreeFile {
    pools: Vec<PoolFile>,
}

/// A pool to create or update: its path and its spec.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolEntry {
    pub path: String,
    pub spec: PoolSpec,
}

impl PoolFile {
    pub fn into_entry(self) -> PoolEntry {
        let kind = match self.kind {
            PoolKindName::Elastic => PoolKind::Elastic,
            PoolKindName::Static => PoolKind::Static,
        };
        PoolEntry {
            path: self.path,
            spec: PoolSpec {
                reservation: Some(self.reservation.into_proto()),
                limit: Some(self.limit.into_proto()),
                share: self.share,
                shares: self.shares.map(ResourcesFile::into_proto),
                kind: kind.into(),
                controller_limit_pct: self.controller_limit_pct,
                slack_limit_pct: self.slack_limit_pct,
                strict_order: self.strict_order,
            },
        }
    }
}

/// Parses a pool file: one pool, a tree under `pools:`, or one pool in
/// Peloton's format (detected from its keys). A tree comes back parents
/// first (a stable sort by depth, so the file's order is kept among pools of
/// one depth), the order in which they can be created. `path` (the command
/// line's pool path) names the pool of a one-pool file; a tree refuses it.
pub fn parse_pool_file(
    text: &str,
    origin: &str,
    path: Option<&str>,
) -> Result<Loaded<Vec<PoolFile>>, SpecError> {
    // Peek at the top-level keys first, then parse the text again with the
    // right struct, so errors keep serde's field names and line numbers.
    let (peek, twice) = lenient_yaml(text, origin)?;
    let format = peloton_yaml::pool_format(&peek).map_err(|e| peloton_error(e, origin))?;
    if format == Format::Peloton {
        let (pool, notes) =
            peloton_yaml::pool(&peek, path).map_err(|e| peloton_error(e, origin))?;
        return Ok(Loaded {
            value: vec![pool],
            format,
            notes: with_twice(&twice, notes),
        });
    }
    native::<serde_norway::Value>(text, origin, &twice)?;
    let is_tree = peek.as_mapping().is_some_and(|m| m.contains_key("pools"));
    let mut pools: Vec<PoolFile> = if is_tree {
        if let Some(path) = path {
            return Err(SpecError {
                origin: origin.to_owned(),
                kind: SpecErrorKind::Usage(format!(
                    "the pool path {path} names one pool, but this file is a tree \
                     (`pools:`) whose pools name their own paths"
                )),
            });
        }
        let tree: PoolTreeFile = from_yaml(text, origin)?;
        tree.pools
    } else {
        let mut pool: PoolFile = from_yaml(text, origin)?;
        if let Some(path) = path {
            pool.path = path.to_owned();
        }
        vec![pool]
    };
    pools.sort_by_key(|pool| path_depth(&pool.path));
    Ok(Loaded {
        value: pools,
        format,
        notes: Vec::new(),
    })
}

/// Parses a pool file (either format) into pools to create or update.
pub fn parse_pools(text: &str, origin: &str) -> Result<Vec<PoolEntry>, SpecError> {
    Ok(parse_pool_file(text, origin, None)?
        .value
        .into_iter()
        .map(PoolFile::into_entry)
        .collect())
}

/// Reads and parses a pool file (either format).
pub fn load_pool_file(
    path: &Path,
    pool_path: Option<&str>,
) -> Result<Loaded<Vec<PoolFile>>, SpecError> {
    parse_pool_file(&read(path)?, &path.display().to_string(), pool_path)
}

/// Reads and parses a pool file.
pub fn load_pools(path: &Path) -> Result<Vec<PoolEntry>, SpecError> {
    parse_pools(&read(path)?, &path.display().to_string())
}

fn path_depth(path: &str) -> usize {
    path.split('/').filter(|part| !part.is_empty()).count()
}

// ---------------------------------------------------------------- conversion

/// `peloton convert`: the native YAML of a Peloton-format job or pool
/// file, headed by comments (its origin and notes). `pool` (the command
/// line's pool path) is the job's pool, or the pool's own path.
pub fn convert(text: &str, origin: &str, pool: Option<&str>) -> Result<String, SpecError> {
    let (value, twice) = lenient_yaml(text, origin)?;
    let rendered = match peloton_yaml::kind(&value).map_err(|e| peloton_error(e, origin))? {
        peloton_yaml::Kind::Job => {
            let (mut job, notes) =
                peloton_yaml::job(&value).map_err(|e| peloton_error(e, origin))?;
            if let Some(pool) = pool {
                job.pool = pool.to_owned();
            }
            peloton_yaml::render(&job, "A job", origin, &with_twice(&twice, notes))
        }
        peloton_yaml::Kind::Pool => {
            let (pool, notes) =
                peloton_yaml::pool(&value, pool).map_err(|e| peloton_error(e, origin))?;
            peloton_yaml::render(&pool, "A resource pool", origin, &with_twice(&twice, notes))
        }
    };
    rendered.map_err(|err| SpecError {
        origin: origin.to_owned(),
        kind: SpecErrorKind::Yaml(err),
    })
}

/// Reads a Peloton-format file and converts it (see [`convert`]).
pub fn convert_file(path: &Path, pool: Option<&str>) -> Result<String, SpecError> {
    convert(&read(path)?, &path.display().to_string(), pool)
}

// ---------------------------------------------------------------- helpers

fn from_yaml<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> Result<T, SpecError> {
    serde_norway::from_str(text).map_err(|err| SpecError {
        origin: origin.to_owned(),
        kind: SpecErrorKind::Yaml(err),
    })
}

/// Secrets from files: (name, file) → the API's secrets.
pub fn load_secrets(
    files: &[(String, std::path::PathBuf)],
) -> Result<Vec<peloton_proto::v1::Secret>, SpecError> {
    files
        .iter()
        .map(|(name, path)| {
            let value = std::fs::read(path).map_err(|err| SpecError {
                origin: format!("secret {name} ({})", path.display()),
                kind: SpecErrorKind::Read(err),
            })?;
            Ok(peloton_proto::v1::Secret {
                name: name.clone(),
                value,
                size: 0,
            })
        })
        .collect()
}

/// Most bytes a spec read from stdin may have.
pub const MAX_STDIN_SPEC_BYTES: u64 = 16 << 20;

/// A file's text; `-` is stdin (at most [`MAX_STDIN_SPEC_BYTES`]).
fn read(path: &Path) -> Result<String, SpecError> {
    if path == Path::new("-") {
        return read_stdin(std::io::stdin().lock());
    }
    std::fs::read_to_string(path).map_err(|err| SpecError {
        origin: path.display().to_string(),
        kind: SpecErrorKind::Read(err),
    })
}

/// A spec from `input` (stdin), refused past [`MAX_STDIN_SPEC_BYTES`].
fn read_stdin(input: impl std::io::Read) -> Result<String, SpecError> {
    use std::io::Read as _;
    let mut text = String::new();
    let origin = "stdin".to_string();
    input
        .take(MAX_STDIN_SPEC_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|err| SpecError {
            origin: origin.clone(),
            kind: SpecErrorKind::Read(err),
        })?;
    if text.len() as u64 > MAX_STDIN_SPEC_BYTES {
        return Err(SpecError {
            origin,
            kind: SpecErrorKind::Read(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("longer than {MAX_STDIN_SPEC_BYTES} bytes"),
            )),
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_paths_read_as_the_files_names() {
        for (api, file) in [
            ("spec.default_task.resources.cpu", "task.resources.cpu"),
            ("spec.instance_count", "instances"),
            ("spec.sla.min_running_instances", "sla.gang_size"),
            ("spec.sla.priority", "sla.priority"),
            ("spec.overrides[2].spec.env", "overrides[2].task.env"),
            ("spec.overrides[2].instance", "overrides[2].instance"),
            ("spec.default_task.ports[1].name", "task.ports[1]"),
            (
                "spec.default_task.health_check.http.port",
                "task.health_check.http.port",
            ),
            ("spec.host_pool", "host_pool"),
            ("instance_count", "instance_count"),
        ] {
            assert_eq!(file_path_of(api), file, "{api}");
        }
        let s = in_file_terms(tonic::Status::invalid_argument(
            "spec.default_task.resources.cpu: must not be negative (got -1)",
        ));
        assert_eq!(
            s.message(),
            "task.resources.cpu: must not be negative (got -1)"
        );
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        let other = in_file_terms(tonic::Status::not_found("pool /x not found: spec.pool"));
        assert_eq!(other.message(), "pool /x not found: spec.pool");
    }

    /// Every example and the full spec: file → API message → file →
    /// message gives the same message (what `job get -o yaml` prints is
    /// what `job create` takes back).
    #[test]
    fn a_spec_file_from_a_job_spec_gives_the_same_spec() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut texts = vec![("FULL_JOB".to_string(), FULL_JOB.to_string())];
        for entry in std::fs::read_dir(&dir).expect("examples") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if path.extension().is_some_and(|e| e == "yaml") && text.contains("task:") {
                texts.push((path.display().to_string(), text));
            }
        }
        assert!(texts.len() > 5, "{texts:?}");
        for (origin, text) in texts {
            let spec = parse_job_file(&text, &origin)
                .expect("parses")
                .value
                .into_proto();
            let file = JobFile::from_proto(&spec);
            let yaml = serde_norway::to_string(&file).expect("YAML");
            let again = parse_job_file(&yaml, "again")
                .unwrap_or_else(|e| panic!("{origin}: {e}\n{yaml}"))
                .value
                .into_proto();
            assert_eq!(again, spec, "{origin}:\n{yaml}");
        }
    }

    #[test]
    fn stdin_is_read_up_to_its_bound() {
        assert_eq!(read_stdin(&b"name: x"[..]).unwrap(), "name: x");
        let big = vec![b'a'; MAX_STDIN_SPEC_BYTES as usize + 1];
        let e = read_stdin(&big[..]).unwrap_err();
        assert_eq!(e.origin, "stdin");
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    const FULL_JOB: &str = r#"
name: hello
owner: alice
labels: {team: infra}
type: service
pool: /demo
instances: 4
placement: first_fit
sla:
  priority: 10
  preemptible: true
  max_running_instances: 2
  gang_size: 4
  max_running_time_ms: 5000
task:
  command: /bin/echo
  args: [hello]
  env: {GREETING: hi}
  resources: {cpu: 0.5, memory_mb: 128, disk_mb: 10, gpu: 1}
  ports: [http]
  constraint: 'zone == "z1"'
  restart: {max_failures: 3, backoff_ms: 1000, max_backoff_ms: 60000}
  revocable: true
  controller: true
  kill_grace_period_ms: 10000
  shutdown_delay_ms: 5000
  preemption_notice_ms: 30000
  expected_runtime_ms: 90000
  max_instances_per_host: 1
  sim: {duration_ms: 2000, exit_code: 7}
overrides:
  - instance: 0
    task:
      shell: "echo first"
      resources: {cpu: 1}
"#;

    fn job(text: &str) -> JobSpec {
        parse_job_spec(text, "test.yaml").unwrap_or_else(|err| panic!("{err}"))
    }

    fn job_error(text: &str) -> String {
        match parse_job_spec(text, "bad.yaml") {
            Ok(spec) => panic!("parsed: {spec:?}"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn full_job_spec_converts_every_field() {
        let spec = job(FULL_JOB);
        assert_eq!(spec.name, "hello");
        assert_eq!(spec.owner, "alice");
        assert_eq!(spec.labels.get("team").map(String::as_str), Some("infra"));
        assert_eq!(spec.r#type(), JobType::Service);
        assert_eq!(spec.pool, "/demo");
        assert_eq!(spec.instance_count, 4);
        assert_eq!(spec.placement(), PlacementStrategy::FirstFit);
        let sla = spec.sla.unwrap_or_default();
        assert_eq!(
            sla,
            Sla {
                priority: 10,
                preemptible: true,
                max_running_instances: 2,
                min_running_instances: 4,
                max_running_time_ms: 5000,
                max_unavailable_instances: 0,
                elastic_min_instances: 0,
            }
        );
        let task = spec.default_task.unwrap_or_default();
        assert_eq!(task.command, "/bin/echo");
        assert_eq!(task.args, ["hello"]);
        assert_eq!(task.env.get("GREETING").map(String::as_str), Some("hi"));
        assert_eq!(
            task.resources,
            Some(Resources {
                cpu: 0.5,
                memory_mb: 128.0,
                disk_mb: 10.0,
                gpu: 1.0
            })
        );
        assert_eq!(
            task.ports,
            [PortSpec {
                name: "http".into()
            }]
        );
        assert_eq!(task.constraint, r#"zone == "z1""#);
        assert_eq!(
            task.restart,
            Some(RestartPolicy {
                max_failures: 3,
                backoff_ms: 1000,
                max_backoff_ms: 60000
            })
        );
        assert!(task.revocable && task.controller);
        assert_eq!(task.kill_grace_period_ms, 10000);
        assert_eq!(task.shutdown_delay_ms, 5000);
        assert_eq!(task.preemption_notice_ms, 30000);
        assert_eq!(task.expected_runtime_ms, 90000);
        assert_eq!(task.max_instances_per_host, 1);
        assert_eq!(
            task.sim,
            Some(SimSpec {
                duration_ms: 2000,
                exit_code: 7
            })
        );
        assert_eq!(spec.overrides.len(), 1);
        let first = &spec.overrides[0];
        assert_eq!(first.instance, 0);
        let first_task = first.spec.clone().unwrap_or_default();
        assert_eq!(first_task.shell, "echo first");
        assert_eq!(first_task.command, "");
        assert_eq!(first_task.resources.map(|r| r.cpu), Some(1.0));
    }

    #[test]
    fn minimal_job_spec_takes_defaults() {
        let spec = job("name: tiny\ntask: {shell: 'true'}\n");
        assert_eq!(spec.instance_count, 1);
        assert_eq!(spec.r#type(), JobType::Batch);
        assert_eq!(spec.placement(), PlacementStrategy::Pack);
        assert_eq!(spec.sla.map(|s| s.min_running_instances), Some(0));
        assert!(spec.overrides.is_empty());
    }

    #[test]
    fn an_application_driver_with_its_stop_signal_and_resident_memory() {
        let spec = job(
            "name: d\ntype: application\ntask:\n  shell: python3 driver.py\n  controller: true\n  stop_signal: SIGPWR\n  memory_limit: resident\n",
        );
        assert_eq!(spec.r#type(), JobType::Application);
        let task = spec.default_task.unwrap_or_default();
        assert!(task.controller);
        assert_eq!(task.stop_signal, "SIGPWR");
        assert_eq!(
            task.memory_limit,
            peloton_proto::v1::MemoryLimit::Resident as i32
        );
        let defaults = job("name: t\ntask: {shell: 'true'}\n")
            .default_task
            .unwrap_or_default();
        assert_eq!(
            (defaults.stop_signal.as_str(), defaults.memory_limit),
            ("", 0)
        );
    }

    #[test]
    fn rendezvous_is_read() {
        let spec = job(
            "name: t\ninstances: 2\nsla: {gang_size: 2}\nrendezvous: {framework: pytorch, port: master}\ntask: {shell: 'true', ports: [master]}\n",
        );
        assert_eq!(
            spec.rendezvous,
            Some(peloton_proto::v1::RendezvousSpec {
                framework: "pytorch".into(),
                port: "master".into(),
            })
        );
    }

    #[test]
    fn after_is_read() {
        assert_eq!(job("name: t\ntask: {shell: 'true'}\n").after, None);
        let spec =
            job("name: t\nafter: {succeeded: [a1], failed: [b2, c3]}\ntask: {shell: 'true'}\n");
        let after = spec.after.expect("after");
        assert_eq!(
            (after.succeeded, after.finished, after.failed),
            (
                vec!["a1".to_string()],
                vec![],
                vec!["b2".into(), "c3".into()]
            )
        );
    }

    #[test]
    fn host_pool_is_read() {
        assert_eq!(job("name: t\ntask: {shell: 'true'}\n").host_pool, "");
        let spec = job("name: t\nhost_pool: gpu-a\ntask: {shell: 'true'}\n");
        assert_eq!(spec.host_pool, "gpu-a");
    }

    #[test]
    fn scalar_label_and_env_values_read_as_strings() {
        let spec = job("name: x\nlabels: {version: 2, canary: true}\ntask:\n  env: {PORT: 8080}\n");
        assert_eq!(spec.labels.get("version").map(String::as_str), Some("2"));
        assert_eq!(spec.labels.get("canary").map(String::as_str), Some("true"));
        let env = spec.default_task.unwrap_or_default().env;
        assert_eq!(env.get("PORT").map(String::as_str), Some("8080"));
    }

    #[test]
    fn unknown_field_is_named_with_its_line() {
        let err = job_error("name: x\ntask:\n  comand: /bin/true\n");
        assert!(err.starts_with("bad.yaml: "), "{err}");
        assert!(err.contains("unknown field `comand`"), "{err}");
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn unknown_top_level_field_is_named() {
        let err = job_error("name: x\ninstance: 3\ntask: {}\n");
        assert!(err.contains("unknown field `instance`"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn bad_enum_value_lists_the_accepted_ones() {
        let err = job_error("name: x\ntype: cron\ntask: {}\n");
        assert!(err.contains("unknown variant `cron`"), "{err}");
        assert!(err.contains("daemon"), "{err}");
    }

    #[test]
    fn wrong_type_and_missing_field_are_reported() {
        let err = job_error("name: x\ninstances: many\ntask: {}\n");
        assert!(err.contains("instances"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        let err = job_error("name: x\n");
        assert!(err.contains("missing field `task`"), "{err}");
        let err = job_error("name: x\ntask: {}\ninstances: -1\n");
        assert!(err.contains("instances"), "{err}");
    }

    #[test]
    fn malformed_yaml_is_reported_with_its_line() {
        let err = job_error("name: x\ntask: {command: [\n");
        assert!(err.starts_with("bad.yaml: "), "{err}");
        assert!(err.contains("line"), "{err}");
    }

    #[test]
    fn single_pool_file() {
        let pools = parse_pools(
            "path: /batch\nreservation: {cpu: 8, memory_mb: 16384}\nlimit: {cpu: 16}\n\
             share: 2\nkind: static\ncontroller_limit_pct: 20\nslack_limit_pct: 50\n\
             strict_order: true\n",
            "pool.yaml",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(pools.len(), 1);
        let pool = &pools[0];
        assert_eq!(pool.path, "/batch");
        assert_eq!(pool.spec.kind(), PoolKind::Static);
        assert_eq!(pool.spec.share, 2.0);
        assert_eq!(pool.spec.controller_limit_pct, 20.0);
        assert_eq!(pool.spec.slack_limit_pct, 50.0);
        assert!(pool.spec.strict_order);
        let reservation = pool.spec.reservation.unwrap_or_default();
        assert_eq!((reservation.cpu, reservation.memory_mb), (8.0, 16384.0));
        assert_eq!(pool.spec.limit.map(|l| l.cpu), Some(16.0));
    }

    #[test]
    fn per_dimension_shares_are_read() {
        let pools = parse_pools(
            "path: /a\nshare: 2\nshares: {cpu: 3, memory_mb: 0.5}\n",
            "p.yaml",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(pools[0].spec.share, 2.0);
        assert_eq!(
            pools[0].spec.shares,
            Some(Resources {
                cpu: 3.0,
                memory_mb: 0.5,
                ..Default::default()
            })
        );
        let pools = parse_pools("path: /a\n", "p.yaml").unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(pools[0].spec.shares, None);
    }

    #[test]
    fn a_pool_path_argument_names_a_one_pool_file() {
        let loaded = parse_pool_file("path: /a\nshare: 2\n", "p.yaml", Some("/b/c"))
            .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(loaded.value[0].path, "/b/c");
        assert_eq!(loaded.format, Format::Native);
        let err = parse_pool_file("pools: [{path: /a}]\n", "p.yaml", Some("/b")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("p.yaml: the pool path /b names one pool"),
            "{err}"
        );
        let loaded = parse_pool_file("name: c\nresources: []\n", "p.yaml", Some("/b/c"))
            .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(
            (loaded.value[0].path.as_str(), loaded.format),
            ("/b/c", Format::Peloton)
        );
        assert_eq!(loaded.notes.len(), 4, "{:?}", loaded.notes);
    }

    #[test]
    fn peloton_errors_name_the_file_and_the_field() {
        let err = job_error(
            "name: x\ninstanceCount: 1\ndefaultConfig:\n  container: {docker: {image: debian}}\n",
        );
        assert!(
            err.starts_with("bad.yaml: defaultConfig.container: container images"),
            "{err}"
        );
    }

    /// As Peloton's loader, a key given twice in a Peloton file is taken
    /// from its last occurrence (said in a note); the native format refuses
    /// it, as before.
    #[test]
    fn a_key_given_twice_is_taken_last_in_peloton_files_only() {
        let text = "changeLog: null\nname: x\ninstanceCount: 1\ndefaultConfig:\n  command: {value: 'true'}\n  \
                    resource: {cpuLimit: 1, cpuLimit: 2}\nchangeLog: {version: 1}\n";
        let loaded = parse_job_file(text, "twice.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.value.task.resources.cpu, 2.0);
        let notes: Vec<String> = loaded.notes.iter().map(Note::to_string).collect();
        assert_eq!(
            notes[..2],
            [
                "defaultConfig.resource.cpuLimit: given twice: the last one is taken, as Peloton's loader takes it",
                "changeLog: given twice: the last one is taken, as Peloton's loader takes it",
            ]
        );
        let converted = convert(text, "twice.yaml", Some("/p")).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            converted.contains("#   changeLog: given twice"),
            "{converted}"
        );
        for native in [
            "name: x\ntask: {shell: 'true'}\nname: y\n",
            "name: x\ntask: {shell: 'true'}\nlabels: {a: b, a: c}\n",
        ] {
            let err = parse_job_file(native, "native.yaml")
                .unwrap_err()
                .to_string();
            assert!(err.contains("duplicate entry"), "{err}");
        }
        let err = parse_pool_file("path: /a\nshare: 1\nshare: 2\n", "pool.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate entry"), "{err}");
        let pool = parse_pool_file(
            "name: p\nresources: [{kind: cpu, limit: 1, limit: 3}]\n",
            "pool.yaml",
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pool.value[0].limit.cpu, 3.0);
    }

    fn peloton_examples() -> Vec<std::path::PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/peloton");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("examples/peloton/ exists")
            .map(|e| e.expect("readable directory").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        files
    }

    /// Conversion round trip: the native YAML that `peloton convert` prints
    /// parses (natively) into the same request as the Peloton file.
    #[test]
    fn converted_files_give_the_same_requests() {
        let mut seen = Vec::new();
        let inline = [
            ("inline-job.yaml", FULL_PELOTON_JOB.to_owned()),
            (
                "inline-pool.yaml",
                "name: p\nresources: [{kind: cpu, reservation: 1, limit: 2, share: 2}, {kind: gpu, limit: 0}]\n\
                 controllerLimit: {maxPercent: 0}\n"
                    .to_owned(),
            ),
        ];
        let files = peloton_examples()
            .into_iter()
            .map(|p| (p.display().to_string(), read(&p).expect("readable")))
            .chain(inline.into_iter().map(|(n, t)| (n.to_owned(), t)));
        for (origin, text) in files {
            let value: serde_norway::Value = serde_norway::from_str(&text).expect("yaml");
            let kind = peloton_yaml::kind(&value).expect("a Peloton file");
            // A job's pool, or none for a pool (its path is then its name).
            let pool = (kind == peloton_yaml::Kind::Job).then_some("/demo/x");
            let native = convert(&text, &origin, pool).unwrap_or_else(|e| panic!("{e}"));
            assert!(native.starts_with("# "), "{native}");
            match kind {
                peloton_yaml::Kind::Job => {
                    let mut direct = parse_job_spec(&text, &origin).expect("parses");
                    direct.pool = "/demo/x".into();
                    let loaded = parse_job_file(&native, "converted.yaml")
                        .unwrap_or_else(|e| panic!("{e}\n{native}"));
                    assert_eq!(loaded.format, Format::Native, "{native}");
                    assert!(loaded.notes.is_empty());
                    assert_eq!(loaded.value.into_proto(), direct, "{origin}:\n{native}");
                }
                peloton_yaml::Kind::Pool => {
                    let direct: Vec<PoolEntry> = parse_pool_file(&text, &origin, None)
                        .expect("parses")
                        .value
                        .into_iter()
                        .map(PoolFile::into_entry)
                        .collect();
                    let back = parse_pools(&native, "converted.yaml")
                        .unwrap_or_else(|e| panic!("{e}\n{native}"));
                    assert_eq!(back, direct, "{origin}:\n{native}");
                }
            }
            seen.push(origin);
        }
        assert!(seen.len() >= 5, "{seen:?}");
        let err = convert("name: x\ntask: {shell: 'true'}\n", "ours.yaml", None).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("ours.yaml: not in Peloton's format"),
            "{err}"
        );
    }

    /// Every example in Peloton's format parses as what its name says.
    #[test]
    fn peloton_examples_parse() {
        let files = peloton_examples();
        assert!(files.len() >= 3, "{files:?}");
        for path in files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with("respool") {
                let loaded =
                    load_pool_file(&path, Some("/peloton")).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(loaded.format, Format::Peloton, "{name}");
            } else {
                let loaded = load_job_file(&path).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(loaded.format, Format::Peloton, "{name}");
                assert!(loaded.value.instances >= 1, "{name}");
            }
        }
    }

    const FULL_PELOTON_JOB: &str = r#"
name: every-field
type: 1
owningTeam: t
ldapGroups: [a, b]
description: d
labels: [{key: k, value: v}]
instanceCount: 3
respoolID: {value: /prod}
sla: {priority: 3, preemptible: true, maximumRunningInstances: 2, minimumRunningInstances: 1,
      maxRunningTime: 60, maximumUnavailableInstances: 1}
defaultConfig:
  labels: [{key: app, value: web}]
  resource: {cpuLimit: 0.25, memLimitMb: 64, diskLimitMb: 5, gpuLimit: 0}
  command:
    value: 'serve $PORT'
    environment: {variables: [{name: A, value: b}]}
  ports: [{name: http, envName: PORT}]
  healthCheck: {type: COMMAND, commandCheck: {command: 'test -n "$PORT"'}, intervalSecs: 2}
  constraint: {type: 2, andConstraint: {constraints: [
    {type: 1, labelConstraint: {kind: 2, condition: 2, requirement: 1, label: {key: zone, value: z1}}},
    {type: 1, labelConstraint: {kind: 1, condition: 2, requirement: 0, label: {key: app, value: web}}}]}}
  restartPolicy: {maxFailures: 3}
  killGracePeriodSeconds: 4
instanceConfig:
  2:
    command: {shell: false, value: /bin/echo, arguments: [echo, "two words"]}
"#;

    #[test]
    fn pool_tree_comes_back_parents_first() {
        let pools = parse_pools(
            "pools:\n  - path: /a/b\n  - path: /c\n  - path: /a\n  - path: /a/b/c\n  - path: /d\n",
            "tree.yaml",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let paths: Vec<&str> = pools.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["/c", "/a", "/d", "/a/b", "/a/b/c"]);
        assert_eq!(pools[0].spec.kind(), PoolKind::Elastic);
    }

    #[test]
    fn bad_pool_files_name_the_problem() {
        let err = parse_pools("path: /a\nreservation: {cpus: 2}\n", "p.yaml").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("unknown field `cpus`") && err.contains("line 2"),
            "{err}"
        );

        let err = parse_pools("pools:\n  - path: /a\n    sharez: 2\n", "p.yaml").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("unknown field `sharez`") && err.contains("line 3"),
            "{err}"
        );
        let err = parse_pools("pools:\n  - path: /a\n    shares: 2\n", "p.yaml").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("pools[0].shares: invalid type") && err.contains("line 3"),
            "{err}"
        );
        let err = parse_pools("path: /a\nshares: {cpu: 1, mem: 2}\n", "p.yaml").unwrap_err();
        assert!(err.to_string().contains("unknown field `mem`"), "{err}");

        let err = parse_pools("pools:\n  - path: /a\npath: /b\n", "p.yaml").unwrap_err();
        assert!(err.to_string().contains("unknown field `path`"), "{err}");

        let err = parse_pools("reservation: {cpu: 1}\n", "p.yaml").unwrap_err();
        assert!(err.to_string().contains("missing field `path`"), "{err}");
    }

    #[test]
    fn missing_file_is_named() {
        let err = load_job_spec(Path::new("/nonexistent/job.yaml")).unwrap_err();
        let err = err.to_string();
        assert!(
            err.starts_with("cannot read /nonexistent/job.yaml: "),
            "{err}"
        );
    }

    /// Every example under `examples/` parses and converts.
    #[test]
    fn examples_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
            let path = entry.expect("readable directory").path();
            if path.extension().is_none_or(|ext| ext != "yaml") {
                continue;
            }
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            if name.starts_with("pools") {
                let pools = load_pools(&path).unwrap_or_else(|err| panic!("{err}"));
                assert!(!pools.is_empty(), "{name}");
            } else {
                let spec = load_job_spec(&path).unwrap_or_else(|err| panic!("{err}"));
                assert!(spec.instance_count >= 1, "{name}");
            }
            seen.push(name);
        }
        seen.sort();
        for expected in ["constrained.yaml", "gang.yaml", "hello.yaml", "pools.yaml"] {
            assert!(
                seen.iter().any(|n| n == expected),
                "{expected} missing: {seen:?}"
            );
        }
    }
}
