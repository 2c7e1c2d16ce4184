//! The stored rows: their own messages, versioned, apart from the API's
//! read messages (a change to what the API shows does not change what the
//! store holds, nor the other way round). Each row is encoded from the
//! core's (and the engine's) own types and decoded into what recovery
//! needs: jobs, tasks, pools, updates, volumes, hosts, tokens (with their
//! certificates), audit entries and secrets. A job config's row is the
//! job's spec as its user sent it. (Host pools and their members are names
//! only; event rows have their compact form, `persist::encode_events`.)
//!
//! A row of this codec starts with [`ROW_V1`]: a 0 byte, which no protobuf
//! message starts with (field number 0 does not exist), then the version.
//! Rows written before (the API's `Job`, `Task`, `JobSpec`, `Pool`,
//! `Update`, `Volume`, `Host` and `AuditEntry` messages, and tokens and
//! secrets wrapping the API's `Token` and `Secret`) still decode. What a
//! store as a whole holds is versioned apart (`store::SCHEMA_VERSION`, the
//! PostgreSQL migrations), so that an older server refuses a store a newer
//! one wrote rather than failing on some row.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;

use peloton_authz::{Grant, Role};
use peloton_engine::host::{GpuGrant, HostSpec};
use peloton_engine::{Dim, DimConfig, N_DIMS, PoolConfig, PoolKind, Resources};

use crate::convert;
use crate::lifecycle::{
    AppState, AuditEntry, Certificate, CronState, CronTick, Digest32, HOST_POOL_ATTRIBUTE, Job,
    JobKey, JobRow, LaunchId, RecoveredHost, RecoveredVolume, RunRecord, Secret, TaskRow, Token,
    Update, UpdateCounts, UpdateSpec, UpdateState, UsageRecord, Volume,
};

/// First bytes of a row of this codec, version 1.
pub const ROW_V1: [u8; 2] = [0, 1];

/// A job's stored row: its status and versions (its specs are config rows;
/// recovery counts its tasks).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredJob {
    /// Bumped by every change a user makes.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// The job's state (the API's numbering).
    #[prost(int32, tag = "2")]
    pub state: i32,
    /// Created.
    #[prost(uint64, tag = "3")]
    pub created_at_ms: u64,
    /// Completed (0: not).
    #[prost(uint64, tag = "4")]
    pub completed_at_ms: u64,
    /// Killed as a whole.
    #[prost(bool, tag = "5")]
    pub kill_requested: bool,
    /// Version of the current config.
    #[prost(uint64, tag = "6")]
    pub config: u64,
    /// The latest update ("" for none).
    #[prost(string, tag = "7")]
    pub update_id: String,
    /// Application jobs: the driver's target.
    #[prost(message, optional, tag = "8")]
    pub app: Option<StoredApp>,
    /// It waits for the jobs it depends on (false in rows written before
    /// dependencies: those jobs have none).
    #[prost(bool, tag = "9")]
    pub waits_for_jobs: bool,
    /// Cron jobs: their ticks (absent in rows written before cron jobs,
    /// and for other jobs).
    #[prost(message, optional, tag = "10")]
    pub cron: Option<StoredCron>,
}

/// A cron job's stored ticks.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredCron {
    /// The last tick looked at (fired, skipped or missed).
    #[prost(uint64, tag = "1")]
    pub last_tick_ms: u64,
    /// Its ticks' jobs kept, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub ticks: Vec<StoredTick>,
    /// Why the latest tick that started no job did not.
    #[prost(string, tag = "3")]
    pub last_skip: String,
    /// Suspended (false in rows written before suspension).
    #[prost(bool, tag = "4")]
    pub suspended: bool,
}

/// One tick's job.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredTick {
    /// The tick's time.
    #[prost(uint64, tag = "1")]
    pub at_ms: u64,
    /// The job it created.
    #[prost(string, tag = "2")]
    pub job_id: String,
}

/// An application's stored target.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct StoredApp {
    /// Executors wanted.
    #[prost(uint32, tag = "1")]
    pub target: u32,
    /// Generation of the target.
    #[prost(uint64, tag = "2")]
    pub generation: u64,
    /// Unregistered.
    #[prost(bool, tag = "3")]
    pub closed: bool,
}

/// One run, stored.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredRun {
    /// Run id.
    #[prost(uint32, tag = "1")]
    pub run: u32,
    /// Its state (the API's numbering).
    #[prost(int32, tag = "2")]
    pub state: i32,
    /// Its host ("" if never placed).
    #[prost(string, tag = "3")]
    pub host: String,
    /// Created.
    #[prost(uint64, tag = "4")]
    pub created_at_ms: u64,
    /// Placed.
    #[prost(uint64, tag = "5")]
    pub placed_at_ms: u64,
    /// Started.
    #[prost(uint64, tag = "6")]
    pub started_at_ms: u64,
    /// Ended.
    #[prost(uint64, tag = "7")]
    pub finished_at_ms: u64,
    /// Exit code.
    #[prost(int32, tag = "8")]
    pub exit_code: i32,
    /// Why it is where it is.
    #[prost(string, tag = "9")]
    pub reason: String,
    /// Its launch.
    #[prost(uint64, tag = "10")]
    pub launch: u64,
    /// Its last checkpoint (0: never).
    #[prost(uint64, tag = "11")]
    pub checkpoint_at_ms: u64,
    /// Preempted: the work it lost.
    #[prost(uint64, tag = "12")]
    pub lost_work_ms: u64,
}

/// A run told to stop whose end its host has not confirmed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredStopping {
    /// Its launch.
    #[prost(uint64, tag = "1")]
    pub launch: u64,
    /// Its host.
    #[prost(string, tag = "2")]
    pub host: String,
}

/// An instance's stored row.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredTask {
    /// The current run.
    #[prost(message, optional, tag = "1")]
    pub current: Option<StoredRun>,
    /// Failed runs in a row.
    #[prost(uint32, tag = "2")]
    pub failures: u32,
    /// Earlier runs, newest first.
    #[prost(message, repeated, tag = "3")]
    pub history: Vec<StoredRun>,
    /// A run of the instance told to stop.
    #[prost(message, optional, tag = "4")]
    pub stopping: Option<StoredStopping>,
    /// Start a new run once the host confirms.
    #[prost(bool, tag = "5")]
    pub restart_when_stopped: bool,
    /// Config version of the instance.
    #[prost(uint64, tag = "6")]
    pub config: u64,
    /// A daemon's instance: its host ("" for none).
    #[prost(string, tag = "7")]
    pub daemon_host: String,
    /// The current run's GPU devices on its host: bit `i` for device `i`
    /// (0: none).
    #[prost(uint32, tag = "8")]
    pub gpu_devices: u32,
    /// Milli-GPUs it holds of each of those devices.
    #[prost(uint32, tag = "9")]
    pub gpu_milli_per_device: u32,
    /// Ports the server chose for the current run (gang members), by
    /// name; absent: none chosen.
    #[prost(btree_map = "string, uint32", tag = "10")]
    pub ports: std::collections::BTreeMap<String, u32>,
    /// The gang the current run was queued with (0: none).
    #[prost(uint32, tag = "11")]
    pub gang: u32,
}

/// `message` after the version bytes.
fn versioned(message: &impl Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(ROW_V1.len() + message.encoded_len());
    out.extend_from_slice(&ROW_V1);
    message
        .encode(&mut out)
        .expect("a Vec grows to fit the message");
    out
}

/// The message of a row of this codec, or `None` for a row written before
/// it (the API's message).
fn body(row: &[u8]) -> Result<Option<&[u8]>, String> {
    match row {
        [0, 1, rest @ ..] => Ok(Some(rest)),
        [0, v, ..] => Err(format!("row version {v} is unknown to this server")),
        _ => Ok(None),
    }
}

/// A job's row.
pub fn encode_job(job: &Job) -> Vec<u8> {
    versioned(&StoredJob {
        version: job.version,
        state: convert::job_state_to_pb(job.state) as i32,
        created_at_ms: job.created_at,
        completed_at_ms: job.completed_at,
        kill_requested: job.kill_requested,
        config: job.config,
        update_id: job
            .latest_update()
            .map(|u| u.to_string())
            .unwrap_or_default(),
        app: job.plan.app.map(|_| StoredApp {
            target: job.app.target,
            generation: job.app.generation,
            closed: job.app.closed,
        }),
        waits_for_jobs: job.waits_for_jobs,
        cron: job.cron.as_ref().map(|c| StoredCron {
            last_tick_ms: c.last_tick,
            ticks: c
                .ticks
                .iter()
                .map(|t| StoredTick {
                    at_ms: t.at,
                    job_id: t.job.to_string(),
                })
                .collect(),
            last_skip: c.last_skip.to_string(),
            suspended: c.suspended,
        }),
    })
}

/// A job's row as the core's recovery input, with the spec an old row
/// carried itself (rows written before specs moved to config rows).
pub fn decode_job(id: &str, row: &[u8]) -> Result<(JobRow, Option<pb::JobSpec>), String> {
    let problem = |e: prost::DecodeError| format!("stored job {id}: {e}");
    let (stored, spec) = match body(row)? {
        Some(body) => (StoredJob::decode(body).map_err(problem)?, None),
        None => {
            let old = pb::Job::decode(row).map_err(problem)?;
            let status = old.status.unwrap_or_default();
            let stored = StoredJob {
                version: old.version,
                state: status.state,
                created_at_ms: status.created_at_ms,
                completed_at_ms: status.completed_at_ms,
                kill_requested: status.kill_requested,
                config: status.config_version,
                update_id: status.update_id,
                app: status.application.map(|a| StoredApp {
                    target: a.target,
                    generation: a.generation,
                    closed: a.unregistered,
                }),
                waits_for_jobs: false,
                cron: None,
            };
            (stored, old.spec)
        }
    };
    let state = pb::JobState::try_from(stored.state).unwrap_or_default();
    let row = JobRow {
        id: Arc::from(id),
        version: stored.version,
        state: convert::job_state_from_pb(state),
        created_at: stored.created_at_ms,
        completed_at: stored.completed_at_ms,
        kill_requested: stored.kill_requested,
        // Stores written before config versions existed hold version 0.
        config: stored.config.max(1),
        update: (!stored.update_id.is_empty()).then(|| stored.update_id.as_str().into()),
        app: stored
            .app
            .map(|a| AppState {
                target: a.target,
                generation: a.generation,
                closed: a.closed,
                failures: 0,
            })
            .unwrap_or_default(),
        waits_for_jobs: stored.waits_for_jobs,
        cron: stored.cron.map(|c| CronState {
            last_tick: c.last_tick_ms,
            ticks: c
                .ticks
                .into_iter()
                .map(|t| CronTick {
                    at: t.at_ms,
                    job: t.job_id.into(),
                })
                .collect(),
            last_skip: c.last_skip.into(),
            suspended: c.suspended,
        }),
    };
    Ok((row, spec))
}

fn run_to_stored(r: &RunRecord) -> StoredRun {
    StoredRun {
        run: r.run,
        state: r.state as i32,
        host: r.host.to_string(),
        created_at_ms: r.created_at,
        placed_at_ms: r.placed_at,
        started_at_ms: r.started_at,
        finished_at_ms: r.finished_at,
        exit_code: r.exit_code,
        reason: r.reason.as_deref().unwrap_or_default().to_string(),
        launch: r.launch.0,
        checkpoint_at_ms: r.checkpoint_at,
        lost_work_ms: r.lost_work,
    }
}

fn run_from_stored(r: &StoredRun) -> RunRecord {
    RunRecord {
        run: r.run,
        state: convert::task_state_from_pb(r.state),
        host: r.host.as_str().into(),
        created_at: r.created_at_ms,
        placed_at: r.placed_at_ms,
        started_at: r.started_at_ms,
        finished_at: r.finished_at_ms,
        exit_code: r.exit_code,
        reason: (!r.reason.is_empty()).then(|| r.reason.as_str().into()),
        launch: LaunchId(r.launch),
        checkpoint_at: r.checkpoint_at_ms,
        lost_work: r.lost_work_ms,
    }
}

/// An instance's row.
pub fn encode_task(row: &TaskRow) -> Vec<u8> {
    versioned(&StoredTask {
        current: Some(run_to_stored(&row.current)),
        failures: row.failures,
        history: row.history.iter().map(run_to_stored).collect(),
        stopping: row.stopping.as_ref().map(|(launch, host)| StoredStopping {
            launch: launch.0,
            host: host.to_string(),
        }),
        restart_when_stopped: row.restart_when_stopped,
        config: row.config,
        daemon_host: row.daemon_host.as_deref().unwrap_or_default().to_string(),
        gpu_devices: u32::from(row.gpu.devices),
        gpu_milli_per_device: u32::from(row.gpu.milli_per_device),
        ports: row
            .ports
            .iter()
            .flatten()
            .map(|(name, port)| (name.to_string(), *port))
            .collect(),
        gang: row.gang.unwrap_or(0),
    })
}

/// An instance's row as the core's recovery input.
pub fn decode_task(row: &[u8]) -> Result<TaskRow, String> {
    let problem = |e: prost::DecodeError| format!("stored task: {e}");
    if let Some(body) = body(row)? {
        let t = StoredTask::decode(body).map_err(problem)?;
        return Ok(TaskRow {
            current: run_from_stored(&t.current.unwrap_or_default()),
            failures: t.failures,
            history: t.history.iter().map(run_from_stored).collect(),
            stopping: t
                .stopping
                .map(|s| (LaunchId(s.launch), s.host.as_str().into())),
            restart_when_stopped: t.restart_when_stopped,
            config: t.config,
            daemon_host: (!t.daemon_host.is_empty()).then(|| t.daemon_host.as_str().into()),
            gpu: GpuGrant {
                devices: u16::try_from(t.gpu_devices)
                    .map_err(|_| format!("stored task: GPU devices {:#x}", t.gpu_devices))?,
                milli_per_device: u16::try_from(t.gpu_milli_per_device).map_err(|_| {
                    format!(
                        "stored task: {} milli-GPUs per device",
                        t.gpu_milli_per_device
                    )
                })?,
            },
            ports: (!t.ports.is_empty()).then(|| {
                t.ports
                    .iter()
                    .map(|(name, port)| (name.as_str().into(), *port))
                    .collect()
            }),
            gang: (t.gang != 0).then_some(t.gang),
        });
    }
    let old = pb::Task::decode(row).map_err(problem)?;
    let current = old.current.clone().unwrap_or_default();
    Ok(TaskRow {
        current: convert::run_from_pb(&current),
        failures: old.failure_count,
        history: old.history.iter().map(convert::run_from_pb).collect(),
        // Rows written before the stopping run was stored apart describe
        // it as the current run.
        stopping: old.stopping.then(|| {
            if old.stopping_launch_id != 0 {
                (
                    LaunchId(old.stopping_launch_id),
                    old.stopping_host.as_str().into(),
                )
            } else {
                (LaunchId(current.launch_id), current.host.as_str().into())
            }
        }),
        restart_when_stopped: old.restart_when_stopped,
        config: old.config_version,
        daemon_host: (!old.pinned_host.is_empty()).then(|| old.pinned_host.as_str().into()),
        // Rows of the API's message predate GPU devices, chosen ports and
        // gang numbers.
        gpu: GpuGrant::default(),
        ports: None,
        gang: None,
    })
}

/// A config version's row: the job's spec of that version.
pub fn encode_config(spec: &pb::JobSpec) -> Vec<u8> {
    versioned(spec)
}

/// A config row's spec.
pub fn decode_config(row: &[u8]) -> Result<pb::JobSpec, String> {
    let body = body(row)?.unwrap_or(row);
    pb::JobSpec::decode(body).map_err(|e| format!("stored job config: {e}"))
}

/// A pool's stored row: its configuration, per dimension in the engine's
/// units, and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredPool {
    /// Per dimension, in [`Dim`] order.
    #[prost(message, repeated, tag = "1")]
    pub dims: Vec<StoredPoolDim>,
    /// Share of the entitlement controller tasks may hold, in percent.
    #[prost(double, tag = "2")]
    pub controller_limit_pct: f64,
    /// Share of the parent's slack revocable tasks may hold, in percent.
    #[prost(double, tag = "3")]
    pub slack_limit_pct: f64,
    /// Bumped by every change a user makes.
    #[prost(uint64, tag = "4")]
    pub version: u64,
    /// Its queues admit in strict order (no reservations, no backfill).
    #[prost(bool, tag = "5")]
    pub strict_order: bool,
}

/// One dimension of a stored pool.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct StoredPoolDim {
    /// Guaranteed amount, in the dimension's unit.
    #[prost(uint64, tag = "1")]
    pub reservation: u64,
    /// Most, in the dimension's unit.
    #[prost(uint64, tag = "2")]
    pub limit: u64,
    /// Weight beyond reservations.
    #[prost(double, tag = "3")]
    pub share: f64,
    /// 0 elastic, 1 static.
    #[prost(uint32, tag = "4")]
    pub kind: u32,
}

/// A pool's row.
pub fn encode_pool(config: &PoolConfig, version: u64) -> Vec<u8> {
    versioned(&StoredPool {
        dims: config
            .dims
            .iter()
            .map(|d| StoredPoolDim {
                reservation: d.reservation,
                limit: d.limit,
                share: d.share,
                kind: match d.kind {
                    PoolKind::Elastic => 0,
                    PoolKind::Static => 1,
                },
            })
            .collect(),
        controller_limit_pct: config.controller_limit_pct,
        slack_limit_pct: config.slack_limit_pct,
        version,
        strict_order: config.strict_order,
    })
}

/// A pool's row as the core's recovery input: its configuration (which
/// the engine checks again as it creates the pool) and version.
pub fn decode_pool(path: &str, row: &[u8]) -> Result<(PoolConfig, u64), String> {
    let problem = |e: String| format!("stored pool {path}: {e}");
    let Some(body) = body(row).map_err(problem)? else {
        let old = pb::Pool::decode(row).map_err(|e| problem(e.to_string()))?;
        let config = convert::pool_config(old.spec.as_ref())
            .map_err(|e| problem(e.message().to_string()))?;
        return Ok((config, old.version));
    };
    let stored = StoredPool::decode(body).map_err(|e| problem(e.to_string()))?;
    if stored.dims.len() != Dim::ALL.len() {
        return Err(problem(format!(
            "{} dimensions; a pool has {}",
            stored.dims.len(),
            Dim::ALL.len()
        )));
    }
    let mut dims = [DimConfig::default(); N_DIMS];
    for (dim, d) in dims.iter_mut().zip(&stored.dims) {
        *dim = DimConfig {
            reservation: d.reservation,
            limit: d.limit,
            share: d.share,
            kind: match d.kind {
                0 => PoolKind::Elastic,
                1 => PoolKind::Static,
                other => return Err(problem(format!("pool kind {other} is unknown"))),
            },
        };
    }
    let config = PoolConfig {
        dims,
        controller_limit_pct: stored.controller_limit_pct,
        slack_limit_pct: stored.slack_limit_pct,
        strict_order: stored.strict_order,
    };
    Ok((config, stored.version))
}

/// An update's stored row (its id is the row's key).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredUpdate {
    /// Its job's id.
    #[prost(string, tag = "1")]
    pub job_id: String,
    /// Instances moved at once.
    #[prost(uint32, tag = "2")]
    pub batch_size: u32,
    /// Failed runs of an instance before it counts as failed.
    #[prost(uint32, tag = "3")]
    pub max_instance_retries: u32,
    /// Failed instances before the update fails.
    #[prost(uint32, tag = "4")]
    pub max_failed_instances: u32,
    /// A failed update rolls back.
    #[prost(bool, tag = "5")]
    pub rollback_on_failure: bool,
    /// Created paused.
    #[prost(bool, tag = "6")]
    pub start_paused: bool,
    /// Config version it started from.
    #[prost(uint64, tag = "7")]
    pub from: u64,
    /// Config version it rolls to.
    #[prost(uint64, tag = "8")]
    pub to: u64,
    /// Where it is (the core's numbering, [`UpdateState`]).
    #[prost(uint32, tag = "9")]
    pub state: u32,
    /// While paused, the state it resumes to (0: none).
    #[prost(uint32, tag = "10")]
    pub paused_from: u32,
    /// Instances being moved.
    #[prost(uint32, repeated, tag = "11")]
    pub in_progress: Vec<u32>,
    /// Instances that failed on the new spec.
    #[prost(uint32, repeated, tag = "12")]
    pub failed: Vec<u32>,
    /// Instances that failed on the old spec while rolling back.
    #[prost(uint32, repeated, tag = "13")]
    pub failed_back: Vec<u32>,
    /// Its counts when it ended (none while it runs).
    #[prost(message, optional, tag = "14")]
    pub final_counts: Option<StoredUpdateCounts>,
    /// Created.
    #[prost(uint64, tag = "15")]
    pub created_at_ms: u64,
    /// Ended (0: not).
    #[prost(uint64, tag = "16")]
    pub completed_at_ms: u64,
    /// Why it failed, was aborted or rolled back ("" for none).
    #[prost(string, tag = "17")]
    pub reason: String,
}

/// An ended update's counts.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct StoredUpdateCounts {
    /// Instances on its goal.
    #[prost(uint32, tag = "1")]
    pub done: u32,
    /// Instances in all.
    #[prost(uint32, tag = "2")]
    pub total: u32,
}

/// Every update state, for decoding its number.
const UPDATE_STATES: [UpdateState; 8] = [
    UpdateState::Initialized,
    UpdateState::RollingForward,
    UpdateState::Succeeded,
    UpdateState::Failed,
    UpdateState::RollingBackward,
    UpdateState::RolledBack,
    UpdateState::Paused,
    UpdateState::Aborted,
];

fn update_state(raw: u32) -> Option<UpdateState> {
    UPDATE_STATES.into_iter().find(|s| *s as u32 == raw)
}

/// An update's row (`job_id`: its job's).
pub fn encode_update(u: &Update, job_id: &str) -> Vec<u8> {
    versioned(&StoredUpdate {
        job_id: job_id.to_string(),
        batch_size: u.spec.batch_size,
        max_instance_retries: u.spec.max_instance_retries,
        max_failed_instances: u.spec.max_failed_instances,
        rollback_on_failure: u.spec.rollback_on_failure,
        start_paused: u.spec.start_paused,
        from: u.from,
        to: u.to,
        state: u.state as u32,
        paused_from: u.paused_from.map_or(0, |s| s as u32),
        in_progress: u.in_progress.iter().copied().collect(),
        failed: u.failed.iter().copied().collect(),
        failed_back: u.failed_back.iter().copied().collect(),
        final_counts: u.final_counts.map(|c| StoredUpdateCounts {
            done: c.done,
            total: c.total,
        }),
        created_at_ms: u.created_at,
        completed_at_ms: u.completed_at,
        reason: u.reason.as_deref().unwrap_or_default().to_string(),
    })
}

/// An update's row as the core's recovery input: its job's id and the
/// update (its job key is set by recovery).
pub fn decode_update(id: &str, row: &[u8]) -> Result<(String, Update), String> {
    let problem = |e: String| format!("stored update {id}: {e}");
    let Some(body) = body(row).map_err(problem)? else {
        let old = pb::Update::decode(row).map_err(|e| problem(e.to_string()))?;
        return Ok((old.job_id.clone(), update_from_pb(id, &old)));
    };
    let u = StoredUpdate::decode(body).map_err(|e| problem(e.to_string()))?;
    let state = update_state(u.state)
        .ok_or_else(|| problem(format!("update state {} is unknown", u.state)))?;
    let paused_from = match u.paused_from {
        0 => None,
        raw => Some(
            update_state(raw)
                .ok_or_else(|| problem(format!("paused-from state {raw} is unknown")))?,
        ),
    };
    let update = Update {
        id: id.into(),
        job: JobKey(u32::MAX), // set by recovery
        spec: UpdateSpec {
            batch_size: u.batch_size.max(1),
            max_instance_retries: u.max_instance_retries,
            max_failed_instances: u.max_failed_instances,
            rollback_on_failure: u.rollback_on_failure,
            start_paused: u.start_paused,
        },
        from: u.from,
        to: u.to,
        state,
        paused_from,
        // Instances already on the goal are skipped again: the cursor need
        // not be stored.
        cursor: 0,
        in_progress: u.in_progress.into_iter().collect(),
        failed: u.failed.into_iter().collect(),
        failed_back: u.failed_back.into_iter().collect(),
        final_counts: u.final_counts.map(|c| UpdateCounts {
            done: c.done,
            total: c.total,
        }),
        created_at: u.created_at_ms,
        completed_at: u.completed_at_ms,
        reason: (!u.reason.is_empty()).then(|| u.reason.into()),
    };
    Ok((u.job_id, update))
}

/// An update from a row written before this codec (the API's message).
fn update_from_pb(id: &str, u: &pb::Update) -> Update {
    let state_of = |raw: i32| u32::try_from(raw).ok().and_then(update_state);
    let spec = u.spec.unwrap_or_default();
    let status = u.status.clone().unwrap_or_default();
    let state = state_of(status.state).unwrap_or(UpdateState::Aborted);
    // An ended update's row was last written when it ended: its counts are
    // the ones it ended with. A row without them (no instances counted) has
    // them derived again.
    let final_counts =
        (state.is_terminal() && status.instances_total > 0).then_some(UpdateCounts {
            done: status.instances_done,
            total: status.instances_total,
        });
    Update {
        id: id.into(),
        job: JobKey(u32::MAX), // set by recovery
        spec: UpdateSpec {
            batch_size: spec.batch_size.max(1),
            max_instance_retries: spec.max_instance_retries,
            max_failed_instances: spec.max_failed_instances,
            rollback_on_failure: spec.rollback_on_failure,
            start_paused: spec.start_paused,
        },
        from: u.from_version,
        to: u.to_version,
        state,
        paused_from: state_of(status.paused_from),
        cursor: 0,
        in_progress: status.instances_in_progress.iter().copied().collect(),
        failed: status.instances_failed.iter().copied().collect(),
        failed_back: status
            .instances_failed_rolling_back
            .iter()
            .copied()
            .collect(),
        final_counts,
        created_at: status.created_at_ms,
        completed_at: status.completed_at_ms,
        reason: (!status.reason.is_empty()).then(|| status.reason.as_str().into()),
    }
}

/// A volume's stored row (its id is the row's key).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredVolume {
    /// Its job's id.
    #[prost(string, tag = "1")]
    pub job_id: String,
    /// Its instance.
    #[prost(uint32, tag = "2")]
    pub instance: u32,
    /// Its host's name.
    #[prost(string, tag = "3")]
    pub host: String,
    /// Size in MiB.
    #[prost(uint64, tag = "4")]
    pub size_mb: u64,
    /// Where it appears in the sandbox.
    #[prost(string, tag = "5")]
    pub path: String,
    /// Created.
    #[prost(uint64, tag = "6")]
    pub created_at_ms: u64,
}

/// A volume's row (`job_id`, `host`: its job's id and its host's name).
pub fn encode_volume(v: &Volume, job_id: &str, host: &str) -> Vec<u8> {
    versioned(&StoredVolume {
        job_id: job_id.to_string(),
        instance: v.instance,
        host: host.to_string(),
        size_mb: v.size_mb,
        path: v.path.to_string(),
        created_at_ms: v.created_at,
    })
}

/// A volume's row as the core's recovery input.
pub fn decode_volume(id: &str, row: &[u8]) -> Result<RecoveredVolume, String> {
    let problem = |e: String| format!("stored volume {id}: {e}");
    let v = match body(row).map_err(problem)? {
        Some(body) => StoredVolume::decode(body).map_err(|e| problem(e.to_string()))?,
        None => {
            let old = pb::Volume::decode(row).map_err(|e| problem(e.to_string()))?;
            StoredVolume {
                job_id: old.job_id,
                instance: old.instance,
                host: old.host,
                size_mb: old.size_mb,
                path: old.path,
                created_at_ms: old.created_at_ms,
            }
        }
    };
    Ok(RecoveredVolume {
        id: id.to_string(),
        job_id: v.job_id,
        instance: v.instance,
        host: v.host,
        size_mb: v.size_mb,
        path: v.path,
        created_at: v.created_at_ms,
    })
}

/// A host's stored row: its registration (the engine's host spec, without
/// its host pool, which has its own table), the maintenance an operator
/// set, and its agent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredHost {
    /// Capacity per dimension, in [`Dim`] order and the engine's units.
    #[prost(uint64, repeated, tag = "1")]
    pub capacity: Vec<u64>,
    /// GPU devices.
    #[prost(uint32, tag = "2")]
    pub gpu_devices: u32,
    /// Dynamic ports it hands out.
    #[prost(uint32, tag = "3")]
    pub ports: u32,
    /// Attributes, in key order.
    #[prost(message, repeated, tag = "4")]
    pub attributes: Vec<StoredAttribute>,
    /// In maintenance (draining or down for it).
    #[prost(bool, tag = "5")]
    pub maintenance: bool,
    /// How its agent isolates tasks.
    #[prost(string, tag = "6")]
    pub isolation: String,
    /// The agent it is bound to ("" for none).
    #[prost(string, tag = "7")]
    pub agent_id: String,
}

/// A host attribute.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredAttribute {
    /// Its key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// Ports of a host recovered from a row written before this codec (which
/// did not hold them) until its agent registers again.
const OLD_ROW_HOST_PORTS: u32 = 1000;

/// A host's row: `spec` as the engine holds it (its host pool attribute is
/// left out), whether it is in maintenance, and its agent's isolation and
/// id ("" for a simulated host).
pub fn encode_host(spec: &HostSpec, maintenance: bool, isolation: &str, agent_id: &str) -> Vec<u8> {
    let mut attributes: Vec<StoredAttribute> = spec
        .attributes
        .iter()
        .filter(|(k, _)| k != HOST_POOL_ATTRIBUTE)
        .map(|(k, v)| StoredAttribute {
            key: k.clone(),
            value: v.clone(),
        })
        .collect();
    attributes.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    versioned(&StoredHost {
        capacity: spec.capacity.0.to_vec(),
        gpu_devices: u32::from(spec.gpu_devices),
        ports: spec.ports,
        attributes,
        maintenance,
        isolation: isolation.to_string(),
        agent_id: agent_id.to_string(),
    })
}

/// A host's row as the core's recovery input; its spec (which the engine
/// checks again as it adds the host) only for an agent host (`agent_mode`:
/// simulated hosts are configured, not stored).
pub fn decode_host(name: &str, row: &[u8], agent_mode: bool) -> Result<RecoveredHost, String> {
    let problem = |e: String| format!("stored host {name}: {e}");
    let Some(body) = body(row).map_err(problem)? else {
        let old = pb::Host::decode(row).map_err(|e| problem(e.to_string()))?;
        let spec = if agent_mode {
            Some(
                convert::host_spec(
                    &old.name,
                    old.capacity.as_ref(),
                    &old.attributes,
                    OLD_ROW_HOST_PORTS,
                )
                .map_err(|e| problem(e.message().to_string()))?,
            )
        } else {
            None
        };
        return Ok(RecoveredHost {
            name: name.to_string(),
            spec,
            maintenance: old.state() != pb::HostState::Up,
            isolation: old.isolation,
            agent_id: old.agent_id.as_str().into(),
        });
    };
    let h = StoredHost::decode(body).map_err(|e| problem(e.to_string()))?;
    let spec = if agent_mode {
        let capacity: [u64; N_DIMS] = h.capacity.as_slice().try_into().map_err(|_| {
            problem(format!(
                "{} capacity dimensions; a host has {N_DIMS}",
                h.capacity.len()
            ))
        })?;
        let gpu_devices = u8::try_from(h.gpu_devices)
            .map_err(|_| problem(format!("{} GPU devices", h.gpu_devices)))?;
        Some(HostSpec {
            name: name.to_string(),
            capacity: Resources(capacity),
            gpu_devices,
            ports: h.ports,
            attributes: h.attributes.into_iter().map(|a| (a.key, a.value)).collect(),
        })
    } else {
        None
    };
    Ok(RecoveredHost {
        name: name.to_string(),
        spec,
        maintenance: h.maintenance,
        isolation: h.isolation,
        agent_id: h.agent_id.as_str().into(),
    })
}

/// A token's stored row: never its secret, only the secret's digest.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredToken {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// What it may do.
    #[prost(message, repeated, tag = "2")]
    pub grants: Vec<StoredGrant>,
    /// Created.
    #[prost(uint64, tag = "3")]
    pub created_at_ms: u64,
    /// The token that created it.
    #[prost(string, tag = "4")]
    pub created_by: String,
    /// SHA-256 of its secret (32 bytes).
    #[prost(bytes = "vec", tag = "5")]
    pub digest: Vec<u8>,
    /// Client certificates that act as it.
    #[prost(message, repeated, tag = "6")]
    pub certificates: Vec<StoredCertificate>,
}

/// A stored grant: a role on a pool subtree.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredGrant {
    /// 1 viewer, 2 submitter, 3 pool admin, 4 cluster admin.
    #[prost(uint32, tag = "1")]
    pub role: u32,
    /// The subtree's pool.
    #[prost(string, tag = "2")]
    pub pool: String,
}

/// A stored client certificate.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredCertificate {
    /// SHA-256 of its DER (32 bytes).
    #[prost(bytes = "vec", tag = "1")]
    pub fingerprint: Vec<u8>,
    /// Recorded.
    #[prost(uint64, tag = "2")]
    pub issued_at_ms: u64,
    /// Expires.
    #[prost(uint64, tag = "3")]
    pub not_after_ms: u64,
}

/// A token row written before this codec: the API's message and the
/// digest.
#[derive(Clone, PartialEq, prost::Message)]
struct OldStoredToken {
    #[prost(message, optional, tag = "1")]
    token: Option<pb::Token>,
    #[prost(bytes = "vec", tag = "2")]
    digest: Vec<u8>,
}

/// A role's stored number.
fn role_number(role: Role) -> u32 {
    match role {
        Role::Viewer => 1,
        Role::Submitter => 2,
        Role::PoolAdmin => 3,
        Role::ClusterAdmin => 4,
    }
}

/// The role of a stored number.
fn role_of(number: u32) -> Option<Role> {
    Role::ALL.into_iter().find(|r| role_number(*r) == number)
}

/// A token's row.
pub fn encode_token(t: &Token) -> Vec<u8> {
    versioned(&StoredToken {
        name: t.name.clone(),
        grants: t
            .grants
            .iter()
            .map(|g| StoredGrant {
                role: role_number(g.role()),
                pool: g.pool().to_string(),
            })
            .collect(),
        created_at_ms: t.created_at_ms,
        created_by: t.created_by.clone(),
        digest: t.digest.to_vec(),
        certificates: t
            .certificates
            .iter()
            .map(|c| StoredCertificate {
                fingerprint: c.fingerprint.to_vec(),
                issued_at_ms: c.issued_at_ms,
                not_after_ms: c.not_after_ms,
            })
            .collect(),
    })
}

/// A 32-byte digest of a stored row.
fn digest32(what: &str, bytes: &[u8]) -> Result<Digest32, String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} is {} bytes, not 32", bytes.len()))
}

/// A token's row as the core's: `Err` for a row that does not decode;
/// `Ok(Err)` for a token whose grants are no longer valid (it could never
/// authenticate: the caller leaves it out).
pub fn decode_token(name: &str, row: &[u8]) -> Result<Result<Token, String>, String> {
    let problem = |e: String| format!("stored token {name}: {e}");
    let Some(body) = body(row).map_err(problem)? else {
        let old = OldStoredToken::decode(row).map_err(|e| problem(e.to_string()))?;
        let digest = digest32("its digest", &old.digest).map_err(problem)?;
        return Ok(
            crate::codec::token_from_pb(old.token.unwrap_or_default(), digest)
                .map_err(|e| e.message().to_string()),
        );
    };
    let t = StoredToken::decode(body).map_err(|e| problem(e.to_string()))?;
    let digest = digest32("its digest", &t.digest).map_err(problem)?;
    let certificates = t
        .certificates
        .iter()
        .map(|c| {
            Ok(Certificate {
                fingerprint: digest32("a certificate's fingerprint", &c.fingerprint)
                    .map_err(problem)?,
                issued_at_ms: c.issued_at_ms,
                not_after_ms: c.not_after_ms,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let grants = t
        .grants
        .iter()
        .map(|g| {
            let role = role_of(g.role).ok_or_else(|| format!("role {} is unknown", g.role))?;
            Grant::new(role, &g.pool).map_err(|e| e.0)
        })
        .collect::<Result<Vec<_>, String>>();
    Ok(grants.map(|grants| Token {
        name: t.name,
        grants,
        created_at_ms: t.created_at_ms,
        created_by: t.created_by,
        digest,
        certificates,
    }))
}

/// An audit entry's stored row.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredAuditEntry {
    /// Its sequence number.
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// When.
    #[prost(uint64, tag = "2")]
    pub time_ms: u64,
    /// The token's name.
    #[prost(string, tag = "3")]
    pub principal: String,
    /// The call.
    #[prost(string, tag = "4")]
    pub method: String,
    /// What it named.
    #[prost(string, tag = "5")]
    pub target: String,
    /// Its outcome's gRPC code.
    #[prost(int32, tag = "6")]
    pub code: i32,
    /// The error message of a refused call.
    #[prost(string, tag = "7")]
    pub message: String,
}

/// An audit entry's row.
pub fn encode_audit(e: &AuditEntry) -> Vec<u8> {
    versioned(&StoredAuditEntry {
        seq: e.seq,
        time_ms: e.time_ms,
        principal: e.principal.clone(),
        method: e.method.clone(),
        target: e.target.clone(),
        code: e.code,
        message: e.message.clone(),
    })
}

/// An audit entry's row as the core's.
pub fn decode_audit(key: &str, row: &[u8]) -> Result<AuditEntry, String> {
    let problem = |e: String| format!("audit entry {key}: {e}");
    let Some(body) = body(row).map_err(problem)? else {
        let old = pb::AuditEntry::decode(row).map_err(|e| problem(e.to_string()))?;
        return Ok(crate::codec::audit_from_pb(old));
    };
    let e = StoredAuditEntry::decode(body).map_err(|e| problem(e.to_string()))?;
    Ok(AuditEntry {
        seq: e.seq,
        time_ms: e.time_ms,
        principal: e.principal,
        method: e.method,
        target: e.target,
        code: e.code,
        message: e.message,
    })
}

/// A usage record's stored row (`lifecycle::UsageRecord`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredUsageRecord {
    /// Its sequence number.
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// When it was recorded.
    #[prost(uint64, tag = "2")]
    pub recorded_ms: u64,
    /// The job's id.
    #[prost(string, tag = "3")]
    pub job_id: String,
    /// The job's name.
    #[prost(string, tag = "4")]
    pub job_name: String,
    /// The job's pool.
    #[prost(string, tag = "5")]
    pub pool: String,
    /// The job's owner.
    #[prost(string, tag = "6")]
    pub owner: String,
    /// The instance.
    #[prost(uint32, tag = "7")]
    pub instance: u32,
    /// The run.
    #[prost(uint32, tag = "8")]
    pub run: u32,
    /// Its host.
    #[prost(string, tag = "9")]
    pub host: String,
    /// When it started (0: never).
    #[prost(uint64, tag = "10")]
    pub started_ms: u64,
    /// When it ended.
    #[prost(uint64, tag = "11")]
    pub finished_ms: u64,
    /// How it ended (the API's `TaskState` number).
    #[prost(int32, tag = "12")]
    pub state: i32,
    /// Its exit code.
    #[prost(int32, tag = "13")]
    pub exit_code: i32,
    /// What it asked for, in engine units, by dimension.
    #[prost(uint64, repeated, tag = "14")]
    pub request: Vec<u64>,
    /// CPU time used, µs.
    #[prost(uint64, tag = "15")]
    pub cpu_used_usec: u64,
    /// Memory's peak, bytes.
    #[prost(uint64, tag = "16")]
    pub memory_peak_bytes: u64,
    /// When they were measured (the host's clock; 0: never).
    #[prost(uint64, tag = "17")]
    pub used_until_ms: u64,
    /// The key of its task's command, what the runtime learner learns by
    /// (0: none; rows written before it decode as none).
    #[prost(uint64, tag = "18")]
    pub command_key: u64,
}

/// A usage record's row.
pub fn encode_usage(r: &UsageRecord) -> Vec<u8> {
    versioned(&StoredUsageRecord {
        seq: r.seq,
        recorded_ms: r.recorded_ms,
        job_id: r.job_id.to_string(),
        job_name: r.job_name.to_string(),
        pool: r.pool.to_string(),
        owner: r.owner.to_string(),
        instance: r.instance,
        run: r.run,
        host: r.host.to_string(),
        started_ms: r.started_ms,
        finished_ms: r.finished_ms,
        state: r.state as i32,
        exit_code: r.exit_code,
        request: r.request.0.to_vec(),
        cpu_used_usec: r.cpu_used_usec,
        memory_peak_bytes: r.memory_peak_bytes,
        used_until_ms: r.used_until_ms,
        command_key: r.command_key,
    })
}

/// A usage record's row as the core's.
pub fn decode_usage(key: &str, row: &[u8]) -> Result<UsageRecord, String> {
    let problem = |e: String| format!("usage record {key}: {e}");
    let body = body(row)
        .map_err(problem)?
        .ok_or_else(|| problem("no row version".into()))?;
    let r = StoredUsageRecord::decode(body).map_err(|e| problem(e.to_string()))?;
    let mut request = Resources::default();
    for (to, from) in request.0.iter_mut().zip(&r.request) {
        *to = *from;
    }
    Ok(UsageRecord {
        seq: r.seq,
        recorded_ms: r.recorded_ms,
        job_id: r.job_id.into(),
        job_name: r.job_name.into(),
        pool: r.pool.into(),
        owner: r.owner.into(),
        instance: r.instance,
        run: r.run,
        host: r.host.into(),
        started_ms: r.started_ms,
        finished_ms: r.finished_ms,
        state: convert::task_state_from_pb(r.state),
        exit_code: r.exit_code,
        request,
        cpu_used_usec: r.cpu_used_usec,
        memory_peak_bytes: r.memory_peak_bytes,
        used_until_ms: r.used_until_ms,
        command_key: r.command_key,
    })
}

/// A job's secrets, stored apart from its job and config rows.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredSecrets {
    /// Its secrets, values included.
    #[prost(message, repeated, tag = "1")]
    pub secrets: Vec<StoredSecret>,
}

/// One stored secret.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredSecret {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its value.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// A secrets row written before this codec: the API's messages.
#[derive(Clone, PartialEq, prost::Message)]
struct OldStoredSecrets {
    #[prost(message, repeated, tag = "1")]
    secrets: Vec<pb::Secret>,
}

/// A job's secrets' row.
pub fn encode_secrets(secrets: &[Secret]) -> Vec<u8> {
    versioned(&StoredSecrets {
        secrets: secrets
            .iter()
            .map(|s| StoredSecret {
                name: s.name.clone(),
                value: s.value.clone(),
            })
            .collect(),
    })
}

/// A job's secrets' row as the core's.
pub fn decode_secrets(job_id: &str, row: &[u8]) -> Result<Vec<Secret>, String> {
    let problem = |e: String| format!("stored secrets of job {job_id}: {e}");
    let Some(body) = body(row).map_err(problem)? else {
        let old = OldStoredSecrets::decode(row).map_err(|e| problem(e.to_string()))?;
        return Ok(crate::codec::from_pb(old.secrets));
    };
    let stored = StoredSecrets::decode(body).map_err(|e| problem(e.to_string()))?;
    Ok(stored
        .secrets
        .into_iter()
        .map(|s| Secret {
            name: s.name,
            value: s.value,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{JobState, TaskState};

    fn run(run: u32, state: TaskState, host: &str, reason: Option<&str>) -> RunRecord {
        RunRecord {
            run,
            state,
            host: host.into(),
            created_at: 10,
            placed_at: 11,
            started_at: 12,
            finished_at: 13,
            exit_code: -3,
            reason: reason.map(Into::into),
            launch: LaunchId(99),
            checkpoint_at: 12_345,
            lost_work: 678,
        }
    }

    #[test]
    fn task_rows_round_trip_and_start_with_their_version() {
        let rows = [
            TaskRow::default(),
            TaskRow {
                current: run(3, TaskState::Running, "h1", None),
                failures: 2,
                history: vec![
                    run(2, TaskState::Failed, "h2", Some("exit 3")),
                    run(1, TaskState::Lost, "", Some("host lost")),
                ],
                stopping: Some((LaunchId(7), "h2".into())),
                restart_when_stopped: true,
                config: 4,
                daemon_host: Some("h1".into()),
                gpu: GpuGrant {
                    devices: 0b1010,
                    milli_per_device: 1000,
                },
                ports: Some(Box::new([("data".into(), 31098), ("master".into(), 31099)])),
                gang: Some(3),
            },
        ];
        for row in rows {
            let bytes = encode_task(&row);
            assert_eq!(bytes[..2], ROW_V1);
            assert_eq!(decode_task(&bytes).unwrap(), row);
        }
    }

    /// Rows written before this codec were the API's messages: they still
    /// decode, to the same rows.
    #[test]
    fn rows_written_as_the_apis_messages_still_decode() {
        let old_task = pb::Task {
            current: Some(convert::run_to_pb(&run(2, TaskState::Killed, "h", None))),
            failure_count: 1,
            history: vec![convert::run_to_pb(&run(
                1,
                TaskState::Failed,
                "g",
                Some("x"),
            ))],
            stopping: true,
            restart_when_stopped: true,
            config_version: 3,
            pinned_host: "p".into(),
            ..Default::default()
        };
        let task = decode_task(&old_task.encode_to_vec()).unwrap();
        assert_eq!(task.current, run(2, TaskState::Killed, "h", None));
        assert_eq!(
            task.history,
            vec![run(1, TaskState::Failed, "g", Some("x"))]
        );
        // Without a stopping launch of its own, the current run's.
        assert_eq!(task.stopping, Some((LaunchId(99), "h".into())));
        assert_eq!((task.failures, task.config), (1, 3));
        assert!(task.restart_when_stopped);
        assert_eq!(task.daemon_host.as_deref(), Some("p"));

        let spec = pb::JobSpec {
            name: "old".into(),
            pool: "/a".into(),
            instance_count: 2,
            ..Default::default()
        };
        let old_job = pb::Job {
            id: "j".into(),
            spec: Some(spec.clone()),
            status: Some(pb::JobStatus {
                state: pb::JobState::Running as i32,
                created_at_ms: 5,
                completed_at_ms: 0,
                kill_requested: true,
                config_version: 0,
                update_id: "u".into(),
                application: Some(pb::ApplicationStatus {
                    target: 4,
                    generation: 6,
                    registered: true,
                    unregistered: false,
                }),
                ..Default::default()
            }),
            version: 8,
        };
        let (row, in_row) = decode_job("j", &old_job.encode_to_vec()).unwrap();
        assert_eq!(in_row, Some(spec.clone()));
        assert_eq!(
            (row.version, row.state, row.created_at, row.kill_requested),
            (8, JobState::Running, 5, true)
        );
        // Version 0 (before config versions) is the first.
        assert_eq!(row.config, 1);
        assert_eq!(row.update.as_deref(), Some("u"));
        assert_eq!((row.app.target, row.app.generation), (4, 6));

        assert_eq!(decode_config(&spec.encode_to_vec()).unwrap(), spec);
        let new = encode_config(&spec);
        assert_eq!(new[..2], ROW_V1);
        assert_eq!(decode_config(&new).unwrap(), spec);
    }

    /// A cron job's ticks (and whether it is suspended) are stored with
    /// its row, and a row written before cron jobs has none.
    #[test]
    fn a_cron_jobs_ticks_round_trip() {
        let cron = CronState {
            last_tick: 120_000,
            ticks: [CronTick {
                at: 60_000,
                job: "j-1".into(),
            }]
            .into(),
            last_skip: "tick skipped".into(),
            suspended: true,
        };
        let row = versioned(&StoredJob {
            version: 1,
            state: pb::JobState::Running as i32,
            config: 1,
            cron: Some(StoredCron {
                last_tick_ms: 120_000,
                ticks: vec![StoredTick {
                    at_ms: 60_000,
                    job_id: "j-1".into(),
                }],
                last_skip: "tick skipped".into(),
                suspended: true,
            }),
            ..Default::default()
        });
        let (decoded, _) = decode_job("j", &row).unwrap();
        assert_eq!(decoded.cron, Some(cron));
        let plain = versioned(&StoredJob {
            version: 1,
            ..Default::default()
        });
        assert_eq!(decode_job("j", &plain).unwrap().0.cron, None);
    }

    #[test]
    fn a_row_of_an_unknown_version_is_an_error_naming_it() {
        let err = decode_task(&[0, 9, 1, 2]).unwrap_err();
        assert!(err.contains("row version 9"), "{err}");
        assert!(decode_job("j", &[0, 2]).unwrap_err().contains("version 2"));
    }

    fn pool_config() -> PoolConfig {
        let mut config = PoolConfig {
            controller_limit_pct: 40.0,
            slack_limit_pct: 25.5,
            strict_order: true,
            ..PoolConfig::default()
        };
        config.dims[Dim::Cpu.idx()] = DimConfig {
            reservation: 4000,
            limit: 8000,
            share: 2.5,
            kind: PoolKind::Static,
        };
        config.dims[Dim::Gpu.idx()].share = 0.5;
        config
    }

    fn update() -> Update {
        Update {
            id: "u1".into(),
            job: JobKey(u32::MAX),
            spec: UpdateSpec {
                batch_size: 3,
                max_instance_retries: 2,
                max_failed_instances: 1,
                rollback_on_failure: true,
                start_paused: true,
            },
            from: 2,
            to: 3,
            state: UpdateState::Paused,
            paused_from: Some(UpdateState::RollingBackward),
            cursor: 0,
            in_progress: [4, 5].into(),
            failed: [1].into(),
            failed_back: [2, 9].into(),
            final_counts: None,
            created_at: 100,
            completed_at: 0,
            reason: Some("too many failed".into()),
        }
    }

    fn host_spec() -> HostSpec {
        HostSpec {
            name: "h1".into(),
            capacity: Resources::new(16_000, 65_536, 100_000, 2000),
            gpu_devices: 2,
            ports: 20_000,
            attributes: vec![
                ("host".into(), "h1".into()),
                (HOST_POOL_ATTRIBUTE.into(), "gpu".into()),
                ("zone".into(), "a".into()),
            ],
        }
    }

    fn token() -> Token {
        Token {
            name: "alice".into(),
            grants: vec![
                Grant::new(Role::Submitter, "/a/b").unwrap(),
                Grant::new(Role::Viewer, "/").unwrap(),
                Grant::new(Role::PoolAdmin, "/a").unwrap(),
                Grant::new(Role::ClusterAdmin, "/").unwrap(),
            ],
            created_at_ms: 5,
            created_by: "root".into(),
            digest: [7; 32],
            certificates: vec![Certificate {
                fingerprint: [9; 32],
                issued_at_ms: 6,
                not_after_ms: 600,
            }],
        }
    }

    fn audit_entry() -> AuditEntry {
        AuditEntry {
            seq: 12,
            time_ms: 34,
            principal: "alice".into(),
            method: "CreateJob".into(),
            target: "j1".into(),
            code: 7,
            message: "denied".into(),
        }
    }

    fn secrets() -> Vec<Secret> {
        vec![
            Secret {
                name: "db".into(),
                value: b"hunter2".to_vec(),
            },
            Secret {
                name: "empty".into(),
                value: Vec::new(),
            },
        ]
    }

    /// Every kind of row: what the core (and the engine) held comes back
    /// from its row, which starts with the codec's version.
    #[test]
    fn rows_of_every_kind_round_trip_and_start_with_their_version() {
        let config = pool_config();
        let row = encode_pool(&config, 5);
        assert_eq!(row[..2], ROW_V1);
        assert_eq!(decode_pool("/a", &row).unwrap(), (config, 5));
        let root = PoolConfig::default().with_reservation(Resources::MAX);
        assert_eq!(decode_pool("/", &encode_pool(&root, 0)).unwrap(), (root, 0));

        let running = update();
        let ended = Update {
            state: UpdateState::RolledBack,
            paused_from: None,
            final_counts: Some(UpdateCounts { done: 3, total: 7 }),
            completed_at: 200,
            reason: None,
            ..update()
        };
        for u in [running, ended] {
            let row = encode_update(&u, "j1");
            assert_eq!(row[..2], ROW_V1);
            assert_eq!(decode_update("u1", &row).unwrap(), ("j1".to_string(), u));
        }

        let volume = Volume {
            id: "j1-0-3".into(),
            job: JobKey(0),
            instance: 4,
            host: crate::lifecycle::HostSlot(0),
            size_mb: 512,
            path: "data".into(),
            created_at: 77,
        };
        let row = encode_volume(&volume, "j1", "h1");
        assert_eq!(row[..2], ROW_V1);
        let v = decode_volume("j1-0-3", &row).unwrap();
        assert_eq!(
            (
                &*v.id,
                &*v.job_id,
                v.instance,
                &*v.host,
                v.size_mb,
                &*v.path,
                v.created_at
            ),
            ("j1-0-3", "j1", 4, "h1", 512, "data", 77)
        );

        let spec = host_spec();
        let row = encode_host(&spec, true, "cgroups", "agent-7");
        assert_eq!(row[..2], ROW_V1);
        let h = decode_host("h1", &row, true).unwrap();
        // Without its host pool: that has a table of its own.
        let mut want = spec;
        want.attributes.retain(|(k, _)| k != HOST_POOL_ATTRIBUTE);
        assert_eq!(h.spec, Some(want));
        assert_eq!(
            (&*h.name, h.maintenance, &*h.isolation, &*h.agent_id),
            ("h1", true, "cgroups", "agent-7")
        );
        // Simulated hosts are configured: only their maintenance is read.
        let h = decode_host("h1", &encode_host(&host_spec(), false, "", ""), false).unwrap();
        assert_eq!((h.spec, h.maintenance), (None, false));

        let t = token();
        let row = encode_token(&t);
        assert_eq!(row[..2], ROW_V1);
        assert_eq!(decode_token("alice", &row).unwrap(), Ok(t));

        let e = audit_entry();
        let row = encode_audit(&e);
        assert_eq!(row[..2], ROW_V1);
        assert_eq!(decode_audit("12", &row).unwrap(), e);

        let u = UsageRecord {
            seq: 7,
            recorded_ms: 1_700_000_000_123,
            job_id: "j1".into(),
            job_name: "nightly".into(),
            pool: "/a/b".into(),
            owner: "ana".into(),
            instance: 3,
            run: 2,
            host: "h1".into(),
            started_ms: 1_700_000_000_000,
            finished_ms: 1_700_000_000_100,
            state: crate::lifecycle::TaskState::Preempted,
            exit_code: 137,
            request: Resources([1500, 2048, 10, 1000]),
            cpu_used_usec: 99_000,
            memory_peak_bytes: 1 << 30,
            used_until_ms: 1_700_000_000_090,
            command_key: 0x05cb_060b_ad3a_9a86,
        };
        let row = encode_usage(&u);
        assert_eq!(row[..2], ROW_V1);
        assert_eq!(decode_usage("7", &row).unwrap(), u);
        assert!(
            decode_usage("7", &row[2..]).is_err(),
            "no version: an error"
        );

        for s in [secrets(), Vec::new()] {
            let row = encode_secrets(&s);
            assert_eq!(row[..2], ROW_V1);
            assert_eq!(decode_secrets("j1", &row).unwrap(), s);
        }
    }

    /// Rows of every other kind written before this codec (the API's
    /// messages, or wrappers around them) still decode, to what the core
    /// held.
    #[test]
    fn rows_of_every_kind_written_before_the_codec_still_decode() {
        // (The API's message has one kind for the whole pool.)
        let mut config = pool_config();
        for d in &mut config.dims {
            d.kind = PoolKind::Static;
        }
        let old_pool = pb::Pool {
            path: "/a".into(),
            spec: Some(convert::pool_spec_to_pb(&config)),
            version: 4,
            ..Default::default()
        };
        assert_eq!(
            decode_pool("/a", &old_pool.encode_to_vec()).unwrap(),
            (config, 4)
        );

        let u = update();
        let old_update = pb::Update {
            id: "u1".into(),
            job_id: "j1".into(),
            spec: Some(pb::UpdateSpec {
                batch_size: 3,
                max_instance_retries: 2,
                max_failed_instances: 1,
                rollback_on_failure: true,
                start_paused: true,
            }),
            from_version: 2,
            to_version: 3,
            status: Some(pb::UpdateStatus {
                state: pb::UpdateState::Paused as i32,
                paused_from: pb::UpdateState::RollingBackward as i32,
                instances_total: 7,
                instances_done: 3,
                instances_in_progress: vec![4, 5],
                instances_failed: vec![1],
                created_at_ms: 100,
                completed_at_ms: 0,
                reason: "too many failed".into(),
                instances_failed_rolling_back: vec![2, 9],
            }),
        };
        assert_eq!(
            decode_update("u1", &old_update.encode_to_vec()).unwrap(),
            ("j1".to_string(), u)
        );
        // An ended update's counts were the ones it ended with.
        let mut ended = old_update;
        ended.status.as_mut().unwrap().state = pb::UpdateState::Succeeded as i32;
        let (_, ended) = decode_update("u1", &ended.encode_to_vec()).unwrap();
        assert_eq!(
            (ended.state, ended.final_counts),
            (
                UpdateState::Succeeded,
                Some(UpdateCounts { done: 3, total: 7 })
            )
        );

        let old_volume = pb::Volume {
            id: "j1-0-3".into(),
            job_id: "j1".into(),
            instance: 4,
            host: "h1".into(),
            size_mb: 512,
            path: "data".into(),
            in_use: true,
            created_at_ms: 77,
        };
        let v = decode_volume("j1-0-3", &old_volume.encode_to_vec()).unwrap();
        assert_eq!(
            (
                &*v.job_id,
                v.instance,
                &*v.host,
                v.size_mb,
                &*v.path,
                v.created_at
            ),
            ("j1", 4, "h1", 512, "data", 77)
        );

        let old_host = pb::Host {
            name: "h1".into(),
            capacity: Some(convert::resources_to_pb(host_spec().capacity)),
            state: pb::HostState::Draining as i32,
            attributes: [("zone".to_string(), "a".to_string())].into(),
            isolation: "cgroups".into(),
            agent_id: "agent-7".into(),
            ..Default::default()
        };
        let h = decode_host("h1", &old_host.encode_to_vec(), true).unwrap();
        assert_eq!(
            h.spec,
            Some(HostSpec {
                name: "h1".into(),
                capacity: host_spec().capacity,
                gpu_devices: 2,
                ports: OLD_ROW_HOST_PORTS,
                attributes: vec![("host".into(), "h1".into()), ("zone".into(), "a".into())],
            })
        );
        assert_eq!(
            (h.maintenance, &*h.isolation, &*h.agent_id),
            (true, "cgroups", "agent-7")
        );

        let t = token();
        let old_token = OldStoredToken {
            token: Some(crate::codec::token_to_pb(&t)),
            digest: t.digest.to_vec(),
        };
        assert_eq!(
            decode_token("alice", &old_token.encode_to_vec()).unwrap(),
            Ok(t)
        );

        let e = audit_entry();
        let old_audit = crate::codec::audit_to_pb(&e);
        assert_eq!(decode_audit("12", &old_audit.encode_to_vec()).unwrap(), e);

        let old_secrets = OldStoredSecrets {
            secrets: crate::codec::to_pb(&secrets()),
        };
        assert_eq!(
            decode_secrets("j1", &old_secrets.encode_to_vec()).unwrap(),
            secrets()
        );
    }

    /// A token whose grants are no longer valid is refused (it could never
    /// authenticate); a row that does not decode is an error naming it.
    #[test]
    fn a_token_row_with_a_bad_grant_is_refused_and_a_broken_one_is_an_error() {
        let mut row = StoredToken::decode(&encode_token(&token())[2..]).unwrap();
        row.grants[0].pool = "a/b".into();
        let refused = decode_token("alice", &versioned(&row))
            .unwrap()
            .unwrap_err();
        assert!(refused.contains("absolute path"), "{refused}");
        row.grants[0] = StoredGrant {
            role: 9,
            pool: "/".into(),
        };
        let refused = decode_token("alice", &versioned(&row))
            .unwrap()
            .unwrap_err();
        assert!(refused.contains("role 9"), "{refused}");
        row.digest = vec![1; 31];
        let err = decode_token("alice", &versioned(&row)).unwrap_err();
        assert_eq!(err, "stored token alice: its digest is 31 bytes, not 32");
    }

    #[test]
    fn rows_of_every_kind_name_an_unknown_version_and_what_they_are() {
        let row = [0, 7, 1];
        let errors = [
            decode_pool("/a", &row).unwrap_err(),
            decode_update("u1", &row).unwrap_err(),
            decode_volume("v1", &row).unwrap_err(),
            decode_host("h1", &row, true).unwrap_err(),
            decode_token("alice", &row).unwrap_err(),
            decode_audit("12", &row).unwrap_err(),
            decode_secrets("j1", &row).unwrap_err(),
        ];
        let named = [
            "stored pool /a",
            "stored update u1",
            "stored volume v1",
            "stored host h1",
            "stored token alice",
            "audit entry 12",
            "stored secrets of job j1",
        ];
        for (err, name) in errors.iter().zip(named) {
            assert_eq!(
                *err,
                format!("{name}: row version 7 is unknown to this server")
            );
        }
    }
}
