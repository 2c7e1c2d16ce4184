//! The only place that encodes store rows: the core's row keys and events
//! become protobuf rows of a [`WriteBatch`]; and, at start, the store's
//! rows become the core's [`Recovered`] input.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::convert::{self, Limits};
use crate::lifecycle::{
    AppState, Event, EventKind, JobKey, JobKind, JobRow, LaunchId, Lifecycle, Recovered,
    RecoveredHost, RecoveredJob, RecoveredVolume, RowKey, TaskRow,
};
use crate::metrics::Metrics;
use crate::store::{Snapshot, WriteBatch};

use super::reads;

/// A job's secrets as stored in the `secrets` table (apart from its spec
/// rows).
#[derive(Clone, PartialEq, prost::Message)]
struct StoredSecrets {
    #[prost(message, repeated, tag = "1")]
    secrets: Vec<pb::Secret>,
}

/// A job's secrets as their stored row.
pub(super) fn encode_secrets(secrets: &[pb::Secret]) -> Vec<u8> {
    StoredSecrets {
        secrets: secrets.to_vec(),
    }
    .encode_to_vec()
}

/// The stored secrets of the recovered jobs; rows of jobs that are gone
/// are deleted in `batch`.
pub(super) fn recovered_secrets(
    snap: &Snapshot,
    core: &Lifecycle,
    batch: &mut WriteBatch,
) -> anyhow::Result<super::Secrets> {
    let mut out = super::Secrets::default();
    for (id, bytes) in &snap.secrets {
        let Some(job) = core.job_key(id).ok().and_then(|k| core.job(k)) else {
            batch.secrets.push((id.clone(), None));
            continue;
        };
        let stored = StoredSecrets::decode(bytes.as_slice())
            .map_err(|e| anyhow::anyhow!("stored secrets of job {id}: {e}"))?;
        out.insert(job.id.clone(), stored.secrets.into());
    }
    Ok(out)
}

/// Events as the API's messages.
pub(super) fn events_to_pb(events: &[Event]) -> Vec<pb::Event> {
    events
        .iter()
        .map(|e| pb::Event {
            revision: e.revision,
            time_ms: e.time_ms,
            kind: Some(match &e.kind {
                EventKind::Task {
                    job,
                    instance,
                    run,
                    state,
                    host,
                    reason,
                    health,
                } => pb::event::Kind::Task(pb::TaskEvent {
                    job_id: job.to_string(),
                    instance: *instance,
                    run_id: *run,
                    state: convert::task_state_to_pb(*state) as i32,
                    host: host.to_string(),
                    reason: reason.to_string(),
                    health: convert::health_to_pb(*health) as i32,
                }),
                EventKind::Job {
                    job,
                    state,
                    deleted,
                    reason,
                } => pb::event::Kind::Job(pb::JobEvent {
                    job_id: job.to_string(),
                    state: convert::job_state_to_pb(*state) as i32,
                    deleted: *deleted,
                    reason: reason.to_string(),
                }),
            }),
        })
        .collect()
}

/// One commit's events as a stored `WatchResponse` (its events as field 1,
/// encoded in place): (first revision, bytes).
pub(super) fn encode_events(events: &[pb::Event]) -> (u64, Vec<u8>) {
    let first = events[0].revision;
    let len: usize = events
        .iter()
        .map(|e| prost::encoding::message::encoded_len(1, e))
        .sum();
    let mut bytes = Vec::with_capacity(len);
    for e in events {
        prost::encoding::message::encode(1, e, &mut bytes);
    }
    (first, bytes)
}

/// A task row as stored.
pub(super) fn task_row_to_pb(row: &TaskRow) -> pb::Task {
    pb::Task {
        current: Some(convert::run_to_pb(&row.current)),
        failure_count: row.failures,
        history: row.history.iter().map(convert::run_to_pb).collect(),
        stopping: row.stopping.is_some(),
        restart_when_stopped: row.restart_when_stopped,
        config_version: row.config,
        stopping_launch_id: row.stopping.as_ref().map_or(0, |s| s.0.0),
        stopping_host: row
            .stopping
            .as_ref()
            .map(|s| s.1.to_string())
            .unwrap_or_default(),
        pinned_host: row
            .daemon_host
            .as_deref()
            .map(str::to_string)
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// A job's row: its status and versions, without its spec (the specs are
/// in the configs table, one row per config version, written once: a job
/// row is rewritten at every change of the job's state, and a large spec
/// must not be rewritten with it). No task counts either: recovery counts
/// the tasks.
pub(super) fn job_row_to_pb(core: &Lifecycle, k: JobKey) -> pb::Job {
    let mut row = reads::job_to_pb(core, k, None, None);
    if let Some(status) = row.status.as_mut() {
        status.task_counts.clear();
    }
    row
}

/// Encodes the rows the core marked into `batch` (each job row once).
pub(super) fn rows(
    core: &mut Lifecycle,
    engine: &peloton_engine::Engine,
    specs: &mut FxHashMap<JobKey, super::Specs>,
    secrets: &mut super::Secrets,
    rows: &mut Vec<RowKey>,
    batch: &mut WriteBatch,
    metrics: &Metrics,
) {
    let mut jobs_done = FxHashSet::default();
    for row in rows.drain(..) {
        match row {
            RowKey::Job(k) => {
                if !jobs_done.insert(k) {
                    continue;
                }
                let Some(job) = core.job(k) else { continue };
                let id = job.id.to_string();
                batch
                    .jobs
                    .push((id, Some(job_row_to_pb(core, k).encode_to_vec())));
            }
            RowKey::JobDeleted(k, id) => {
                // Everything the shell keeps of the job goes with it.
                specs.remove(&k);
                batch.jobs.push((id.to_string(), None));
                batch.delete_tasks_of.push(id.to_string());
                // However the job went (deleted, or by retention), its
                // secrets go with it.
                secrets.remove(&id);
                batch.secrets.push((id.to_string(), None));
            }
            RowKey::Task(k, i) => {
                let Some(row) = core.take_task_row(k, i) else {
                    continue;
                };
                let id = core.job(k).expect("row exists").id.clone();
                batch
                    .tasks
                    .push(((id, i), Some(task_row_to_pb(&row).encode_to_vec())));
            }
            RowKey::TaskDeleted(id, i) => batch.tasks.push(((id, i), None)),
            RowKey::Pool(path) => {
                if let Ok(id) = engine.resources().tree().resolve(&path) {
                    let pool = reads::pool_to_pb(engine, core, id);
                    batch.pools.push((path, Some(pool.encode_to_vec())));
                }
            }
            RowKey::PoolDeleted(path) => {
                metrics.forget_pool(&path);
                batch.pools.push((path, None));
            }
            RowKey::Config(k, v) => {
                let Some(job) = core.job(k) else { continue };
                if let Some(spec) = specs.get_mut(&k).and_then(|s| s.get_mut(&v)) {
                    if job.plan.kind == JobKind::Application && v == job.config {
                        // Its executors are its instances: the count grows.
                        spec.instance_count = job.plan.instance_count;
                    }
                    batch
                        .configs
                        .push(((job.id.clone(), v), Some(spec.encode_to_vec())));
                }
            }
            RowKey::ConfigDeleted(id, v) => {
                if let Ok(k) = core.job_key(&id)
                    && let Some(versions) = specs.get_mut(&k)
                {
                    versions.remove(&v);
                }
                batch.configs.push(((id, v), None));
            }
            RowKey::Update(id) => {
                if let Some(u) = core.update(&id) {
                    let row = reads::update_to_pb(core, u).encode_to_vec();
                    batch.updates.push((id.to_string(), Some(row)));
                }
            }
            RowKey::UpdateDeleted(id) => batch.updates.push((id.to_string(), None)),
            RowKey::Volume(k, i) => {
                if let Some(v) = core.volume_of(k, i) {
                    let row = reads::volume_to_pb(core, v).encode_to_vec();
                    batch.volumes.push((v.id.to_string(), Some(row)));
                }
            }
            RowKey::VolumeDeleted(id) => batch.volumes.push((id.to_string(), None)),
            RowKey::Host(slot) => {
                if let Some(host) = reads::host_row(engine, core, slot) {
                    batch
                        .hosts
                        .push((host.name.clone(), Some(host.encode_to_vec())));
                }
            }
        }
    }
}

/// A recovered job's specs: its id, its specs by config version, and the
/// version whose spec only its job row held (an older store's row), to be
/// written to the configs table before the row is rewritten without it.
pub(super) type RecoveredSpecs = (String, super::Specs, Option<u64>);

/// The store's rows as the core's recovery input, and the jobs' specs by
/// id.
pub(super) fn recovered(
    snap: &Snapshot,
    agent_mode: bool,
    host_pools: &super::hostpools::HostPools,
) -> anyhow::Result<(Recovered, Vec<RecoveredSpecs>)> {
    let mut rec = Recovered::default();
    for (path, bytes) in &snap.pools {
        let pool = pb::Pool::decode(bytes.as_slice())?;
        let config = convert::pool_config(pool.spec.as_ref())
            .map_err(|e| anyhow::anyhow!("stored pool {path}: {}", e.message()))?;
        rec.pools.push((path.clone(), config, pool.version));
    }
    for (name, bytes) in &snap.hosts {
        let host = pb::Host::decode(bytes.as_slice())?;
        let spec = if agent_mode {
            let mut spec =
                reads::host_spec(&host.name, host.capacity.as_ref(), &host.attributes, 1000)
                    .map_err(|e| anyhow::anyhow!("stored host {name}: {}", e.message()))?;
            // Its stored host pool (the attribute is not in the row).
            host_pools.tag(&mut spec);
            Some(spec)
        } else {
            None
        };
        rec.hosts.push(RecoveredHost {
            name: name.clone(),
            spec,
            maintenance: host.state() != pb::HostState::Up,
            isolation: host.isolation,
        });
    }
    let mut tasks_by_job: FxHashMap<&str, Vec<(u32, TaskRow)>> = FxHashMap::default();
    for ((job, instance), bytes) in &snap.tasks {
        let row = pb::Task::decode(bytes.as_slice())?;
        tasks_by_job.entry(job.as_str()).or_default().push((
            *instance,
            TaskRow {
                current: convert::run_from_pb(&row.current.clone().unwrap_or_default()),
                failures: row.failure_count,
                history: row.history.iter().map(convert::run_from_pb).collect(),
                // Rows written before the stopping run was stored apart
                // describe it as the current run.
                stopping: row.stopping.then(|| {
                    let cur = row.current.clone().unwrap_or_default();
                    if row.stopping_launch_id != 0 {
                        (
                            LaunchId(row.stopping_launch_id),
                            row.stopping_host.as_str().into(),
                        )
                    } else {
                        (LaunchId(cur.launch_id), cur.host.as_str().into())
                    }
                }),
                restart_when_stopped: row.restart_when_stopped,
                config: row.config_version,
                daemon_host: (!row.pinned_host.is_empty()).then(|| row.pinned_host.as_str().into()),
            },
        ));
    }
    for (id, bytes) in &snap.volumes {
        let v = pb::Volume::decode(bytes.as_slice())?;
        rec.volumes.push(RecoveredVolume {
            id: id.clone(),
            job_id: v.job_id,
            instance: v.instance,
            host: v.host,
            size_mb: v.size_mb,
            path: v.path,
            created_at: v.created_at_ms,
        });
    }
    // Stored jobs were valid when accepted; limits configured lower since
    // must not make them unreadable.
    let lenient = Limits {
        max_instances_per_job: u32::MAX,
        max_ports: usize::MAX,
        max_list_len: usize::MAX,
        max_string_len: usize::MAX,
        max_overrides: usize::MAX,
    };
    let mut configs_by_job: FxHashMap<&str, super::Specs> = FxHashMap::default();
    for ((job, version), bytes) in &snap.configs {
        configs_by_job
            .entry(job.as_str())
            .or_default()
            .insert(*version, pb::JobSpec::decode(bytes.as_slice())?);
    }
    let mut updates_by_job: FxHashMap<String, Vec<crate::lifecycle::Update>> = FxHashMap::default();
    for (_, bytes) in &snap.updates {
        let u = pb::Update::decode(bytes.as_slice())?;
        updates_by_job
            .entry(u.job_id.clone())
            .or_default()
            .push(reads::update_from_pb(&u));
    }
    let mut specs = Vec::new();
    for (id, bytes) in &snap.jobs {
        let job = pb::Job::decode(bytes.as_slice())?;
        let status = job.status.clone().unwrap_or_default();
        // Stores written before config versions existed hold version 0.
        let config = status.config_version.max(1);
        let mut versions = configs_by_job.remove(id.as_str()).unwrap_or_default();
        // The spec is in the configs table; rows written before it moved
        // there carry it themselves (and it wins, as it did then).
        let from_row = job.spec.is_some().then_some(config);
        if let Some(spec) = job.spec {
            versions.insert(config, spec);
        }
        let spec = versions.get(&config).ok_or_else(|| {
            anyhow::anyhow!("stored job {id}: no spec of its config version {config}")
        })?;
        let plan = convert::job_plan(spec, &lenient)
            .map_err(|e| anyhow::anyhow!("stored job {id}: {}", e.message()))?;
        let mut old_configs = Vec::new();
        for (v, s) in &versions {
            if *v != config {
                let p = convert::job_plan(s, &lenient)
                    .map_err(|e| anyhow::anyhow!("stored job {id} config {v}: {}", e.message()))?;
                old_configs.push((*v, p));
            }
        }
        let mut updates = updates_by_job.remove(id.as_str()).unwrap_or_default();
        updates.sort_by_key(|u| u.created_at);
        rec.jobs.push(RecoveredJob {
            row: JobRow {
                id: Arc::from(id.as_str()),
                version: job.version,
                state: convert::job_state_from_pb(status.state()),
                created_at: status.created_at_ms,
                completed_at: status.completed_at_ms,
                kill_requested: status.kill_requested,
                config,
                update: (!status.update_id.is_empty()).then(|| status.update_id.as_str().into()),
                app: status
                    .application
                    .map(|a| AppState {
                        target: a.target,
                        generation: a.generation,
                        closed: a.unregistered,
                        failures: 0,
                    })
                    .unwrap_or_default(),
            },
            plan,
            old_configs,
            updates,
            tasks: tasks_by_job.remove(id.as_str()).unwrap_or_default(),
        });
        specs.push((id.clone(), versions, from_row));
    }
    Ok((rec, specs))
}
