//! The only place that encodes store rows: the core's row keys and events
//! become rows of a [`WriteBatch`] (every row but events in its own
//! versioned message, [`crate::store_codec`], encoded from the core's and
//! the engine's state); and, at start, the store's rows become the core's
//! [`Recovered`] input.

use std::collections::BTreeMap;
use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::convert::{self, Limits};
use crate::lifecycle::{
    Event, EventKind, Lifecycle, Recovered, RecoveredHost, RecoveredJob, RecoveredVolume, RowKey,
    TaskRow,
};
use crate::metrics::Metrics;
use crate::store::{Snapshot, WriteBatch};
use crate::store_codec;

use crate::reads;

/// The stored secrets by job id (the core drops those of jobs that are
/// gone, and their rows).
pub(crate) fn recovered_secrets(
    snap: &Snapshot,
) -> anyhow::Result<Vec<(String, Vec<crate::lifecycle::Secret>)>> {
    snap.secrets
        .iter()
        .map(|(id, bytes)| {
            let secrets = store_codec::decode_secrets(id, bytes).map_err(anyhow::Error::msg)?;
            Ok((id.clone(), secrets))
        })
        .collect()
}

/// Events as the API's messages.
pub(crate) fn events_to_pb(events: &[Event]) -> Vec<pb::Event> {
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

/// First bytes of a compact event row (see [`encode_events`]). A protobuf
/// `WatchResponse` never starts with a 0 byte (field number 0 does not
/// exist), so rows written before the compact form are told apart.
const COMPACT_EVENTS: [u8; 2] = [0, 1];
const KIND_TASK: u8 = 1;
const KIND_JOB: u8 = 2;

/// One commit's events as a stored row: (first revision, bytes).
///
/// The row is compact rather than a `WatchResponse`: a commit can carry a
/// million events, nearly all naming one of a few job ids and hosts, and
/// writing them out as protobuf (≈ 77 bytes each, 36 of them the job id)
/// made the row the largest part of a commit's bytes and time. Here each
/// distinct string is written once per row and events name it by index;
/// numbers are varints, revision and time as deltas, states as the API's
/// enum numbers. About 12 bytes per event; [`decode_event_row`] turns it
/// back into exactly what `events_to_pb` gives (tested).
///
/// Layout: `00 01`, first revision, string count, strings (length, bytes;
/// string 0 is ""), event count, then per event: revision delta, time
/// delta (zigzag), kind (1 task, 2 job) and its fields in `TaskEvent` /
/// `JobEvent` order, strings as indices.
pub(crate) fn encode_events(events: &[Event]) -> (u64, Vec<u8>) {
    let first = events[0].revision;
    let mut strings = Strings {
        list: vec![""],
        ..Strings::default()
    };
    let mut body = Vec::with_capacity(events.len() * 12);
    let (mut revision, mut time) = (first, 0u64);
    for e in events {
        varint(&mut body, e.revision.wrapping_sub(revision));
        revision = e.revision;
        varint(&mut body, zigzag(e.time_ms.wrapping_sub(time) as i64));
        time = e.time_ms;
        match &e.kind {
            EventKind::Task {
                job,
                instance,
                run,
                state,
                host,
                reason,
                health,
            } => {
                body.push(KIND_TASK);
                varint(&mut body, strings.shared(job, JOB));
                varint(&mut body, u64::from(*instance));
                varint(&mut body, u64::from(*run));
                varint(&mut body, convert::task_state_to_pb(*state) as u64);
                varint(&mut body, strings.shared(host, HOST));
                varint(&mut body, strings.text(reason));
                varint(&mut body, convert::health_to_pb(*health) as u64);
            }
            EventKind::Job {
                job,
                state,
                deleted,
                reason,
            } => {
                body.push(KIND_JOB);
                varint(&mut body, strings.shared(job, JOB));
                varint(&mut body, convert::job_state_to_pb(*state) as u64);
                varint(&mut body, u64::from(*deleted));
                varint(&mut body, strings.text(reason));
            }
        }
    }
    let table: usize = strings.list.iter().map(|s| 10 + s.len()).sum();
    let mut out = Vec::with_capacity(2 + 30 + table + body.len());
    out.extend_from_slice(&COMPACT_EVENTS);
    varint(&mut out, first);
    varint(&mut out, strings.list.len() as u64);
    for s in &strings.list {
        varint(&mut out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    varint(&mut out, events.len() as u64);
    out.extend_from_slice(&body);
    (first, out)
}

/// A stored event row as the API's message: the compact form
/// [`encode_events`] writes, or a `WatchResponse` (rows written before it).
/// A row that is neither is an error naming what is wrong.
pub(crate) fn decode_event_row(row: &[u8]) -> Result<pb::WatchResponse, String> {
    let Some(mut r) = row.strip_prefix(&COMPACT_EVENTS[..]) else {
        return pb::WatchResponse::decode(row).map_err(|e| format!("event row: {e}"));
    };
    let r = &mut r;
    let mut revision = read_varint(r)?;
    let n_strings = read_varint(r)? as usize;
    if n_strings == 0 || n_strings > r.len() {
        return Err(format!(
            "event row: {n_strings} strings in {} bytes",
            r.len()
        ));
    }
    let mut strings = Vec::with_capacity(n_strings);
    for _ in 0..n_strings {
        let len = read_varint(r)? as usize;
        if len > r.len() {
            return Err("event row: a string runs past the row".into());
        }
        let (s, rest) = r.split_at(len);
        strings.push(std::str::from_utf8(s).map_err(|e| format!("event row: {e}"))?);
        *r = rest;
    }
    let string = |i: u64| -> Result<String, String> {
        strings
            .get(i as usize)
            .map(|s| s.to_string())
            .ok_or_else(|| format!("event row: string {i} of {n_strings}"))
    };
    let n_events = read_varint(r)? as usize;
    // Every event takes at least 7 bytes (a job event: two deltas, kind
    // and four fields): a count beyond that is corrupt.
    if n_events > r.len() / 7 + 1 {
        return Err(format!("event row: {n_events} events in {} bytes", r.len()));
    }
    let mut events = Vec::with_capacity(n_events);
    let mut time = 0u64;
    for _ in 0..n_events {
        revision = revision.wrapping_add(read_varint(r)?);
        time = time.wrapping_add(unzigzag(read_varint(r)?) as u64);
        let (&kind, rest) = r.split_first().ok_or("event row: an event is cut short")?;
        *r = rest;
        let kind = match kind {
            KIND_TASK => pb::event::Kind::Task(pb::TaskEvent {
                job_id: string(read_varint(r)?)?,
                instance: read_u32(r)?,
                run_id: read_u32(r)?,
                state: read_u32(r)? as i32,
                host: string(read_varint(r)?)?,
                reason: string(read_varint(r)?)?,
                health: read_u32(r)? as i32,
            }),
            KIND_JOB => pb::event::Kind::Job(pb::JobEvent {
                job_id: string(read_varint(r)?)?,
                state: read_u32(r)? as i32,
                deleted: read_varint(r)? != 0,
                reason: string(read_varint(r)?)?,
            }),
            other => return Err(format!("event row: unknown event kind {other}")),
        };
        events.push(pb::Event {
            revision,
            time_ms: time,
            kind: Some(kind),
        });
    }
    if !r.is_empty() {
        return Err(format!("event row: {} bytes after the last event", r.len()));
    }
    Ok(pb::WatchResponse { events })
}

/// A row's string table while it is written: shared strings (job ids,
/// hosts) are found by address first, so the common case hashes a pointer;
/// other text by content. Index 0 is "".
#[derive(Default)]
struct Strings<'a> {
    list: Vec<&'a str>,
    by_addr: FxHashMap<(usize, usize), u64>,
    by_text: FxHashMap<&'a str, u64>,
    /// The last string each field named: runs of events of one job (or
    /// host) skip the map.
    last: [((usize, usize), u64); 2],
}

/// Fields [`Strings::shared`] remembers the last string of.
const JOB: usize = 0;
const HOST: usize = 1;

impl<'a> Strings<'a> {
    fn shared(&mut self, s: &'a Arc<str>, field: usize) -> u64 {
        if s.is_empty() {
            return 0;
        }
        let addr = (s.as_ptr() as usize, s.len());
        let (last, i) = self.last[field];
        if last == addr && i != 0 {
            return i;
        }
        let i = match self.by_addr.get(&addr) {
            Some(&i) => i,
            None => {
                let i = self.text(s);
                self.by_addr.insert(addr, i);
                i
            }
        };
        self.last[field] = (addr, i);
        i
    }

    fn text(&mut self, s: &'a str) -> u64 {
        if s.is_empty() {
            return 0;
        }
        let next = self.list.len() as u64;
        let i = *self.by_text.entry(s).or_insert(next);
        if i == next {
            self.list.push(s);
        }
        i
    }
}

fn varint(out: &mut Vec<u8>, v: u64) {
    prost::encoding::encode_varint(v, out);
}

fn read_varint(r: &mut &[u8]) -> Result<u64, String> {
    prost::encoding::decode_varint(r).map_err(|e| format!("event row: {e}"))
}

fn read_u32(r: &mut &[u8]) -> Result<u32, String> {
    let v = read_varint(r)?;
    u32::try_from(v).map_err(|_| format!("event row: {v} is out of range"))
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Encodes the rows the core listed into `batch` (each job row once).
pub(crate) fn rows(
    core: &Lifecycle,
    engine: &peloton_engine::Engine,
    rows: Vec<RowKey>,
    batch: &mut WriteBatch,
    metrics: &Metrics,
) {
    let mut jobs_done = FxHashSet::default();
    for row in rows {
        match row {
            RowKey::Job(k) => {
                if !jobs_done.insert(k) {
                    continue;
                }
                let Some(job) = core.job(k) else { continue };
                let id = job.id.to_string();
                batch.jobs.push((id, Some(store_codec::encode_job(job))));
            }
            RowKey::JobDeleted(_, id) => {
                batch.jobs.push((id.to_string(), None));
                batch.delete_tasks_of.push(id.to_string());
            }
            RowKey::Task(k, i) => {
                let Some(row) = core.task_row(k, i) else {
                    continue;
                };
                let id = core.job(k).expect("row exists").id.clone();
                batch
                    .tasks
                    .push(((id, i), Some(store_codec::encode_task(&row))));
            }
            RowKey::TaskDeleted(id, i) => batch.tasks.push(((id, i), None)),
            RowKey::Pool(path) => {
                let tree = engine.resources().tree();
                if let Ok(id) = tree.resolve(&path) {
                    let row = store_codec::encode_pool(tree.config(id), core.pool_version(&path));
                    batch.pools.push((path, Some(row)));
                }
            }
            RowKey::PoolDeleted(path) => {
                metrics.forget_pool(&path);
                batch.pools.push((path, None));
            }
            RowKey::Config(k, v) => {
                let Some(job) = core.job(k) else { continue };
                let spec = reads::job_spec(job.plan_of(v));
                batch
                    .configs
                    .push(((job.id.clone(), v), Some(store_codec::encode_config(&spec))));
            }
            RowKey::ConfigDeleted(id, v) => batch.configs.push(((id, v), None)),
            RowKey::Update(id) => {
                if let Some(u) = core.update(&id) {
                    let job = core.job(u.job).map(|j| &*j.id).unwrap_or_default();
                    let row = store_codec::encode_update(u, job);
                    batch.updates.push((id.to_string(), Some(row)));
                }
            }
            RowKey::UpdateDeleted(id) => batch.updates.push((id.to_string(), None)),
            RowKey::Volume(k, i) => {
                if let Some(v) = core.volume_of(k, i) {
                    let job = core.job(v.job).map(|j| &*j.id).unwrap_or_default();
                    let row = store_codec::encode_volume(v, job, core.host_name(v.host));
                    batch.volumes.push((v.id.to_string(), Some(row)));
                }
            }
            RowKey::VolumeDeleted(id) => batch.volumes.push((id.to_string(), None)),
            RowKey::Host(slot) => {
                let hosts = engine.hosts();
                if let Some(id) = hosts.lookup_slot(slot.idx()) {
                    let spec = hosts.spec(id).expect("a live host has a spec");
                    let agent = core.agent_host(slot);
                    let row = store_codec::encode_host(
                        &spec,
                        core.in_maintenance(slot),
                        agent.map_or("", |a| a.isolation.as_str()),
                        agent.map_or("", |a| &*a.agent_id),
                    );
                    batch.hosts.push((spec.name, Some(row)));
                }
            }
        }
    }
}

/// A recovered job's config version whose spec only its job row held (an
/// older store's row), to be written to the configs table before the row
/// is rewritten without it: the job's id and the version.
pub(crate) type SpecInJobRow = (String, u64);

/// The store's rows as the core's recovery input (the plans hold their
/// specs), and the specs still in job rows.
pub(crate) fn recovered(
    snap: &Snapshot,
    agent_mode: bool,
) -> anyhow::Result<(Recovered, Vec<SpecInJobRow>)> {
    let mut rec = Recovered::default();
    for (path, bytes) in &snap.pools {
        let (config, version) =
            store_codec::decode_pool(path, bytes).map_err(anyhow::Error::msg)?;
        rec.pools.push((path.clone(), config, version));
    }
    rec.hosts = recovered_hosts(snap, agent_mode)?;
    rec.volumes = recovered_volumes(snap)?;
    let mut tasks_by_job: FxHashMap<&str, Vec<(u32, TaskRow)>> = FxHashMap::default();
    for ((job, instance), bytes) in &snap.tasks {
        let row = store_codec::decode_task(bytes)
            .map_err(|e| anyhow::anyhow!("job {job} instance {instance}: {e}"))?;
        tasks_by_job
            .entry(job.as_str())
            .or_default()
            .push((*instance, row));
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
    let mut configs_by_job: FxHashMap<&str, BTreeMap<u64, pb::JobSpec>> = FxHashMap::default();
    for ((job, version), bytes) in &snap.configs {
        configs_by_job.entry(job.as_str()).or_default().insert(
            *version,
            store_codec::decode_config(bytes)
                .map_err(|e| anyhow::anyhow!("job {job} config {version}: {e}"))?,
        );
    }
    let mut updates_by_job: FxHashMap<String, Vec<crate::lifecycle::Update>> = FxHashMap::default();
    for (id, bytes) in &snap.updates {
        let (job, u) = store_codec::decode_update(id, bytes).map_err(anyhow::Error::msg)?;
        updates_by_job.entry(job).or_default().push(u);
    }
    let mut in_rows = Vec::new();
    for (id, bytes) in &snap.jobs {
        let (row, spec_in_row) = store_codec::decode_job(id, bytes).map_err(anyhow::Error::msg)?;
        let config = row.config;
        let mut versions = configs_by_job.remove(id.as_str()).unwrap_or_default();
        // The spec is in the configs table; rows written before it moved
        // there carry it themselves (and it wins, as it did then).
        let from_row = spec_in_row.is_some().then_some(config);
        if let Some(spec) = spec_in_row {
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
            row,
            plan,
            old_configs,
            updates,
            tasks: tasks_by_job.remove(id.as_str()).unwrap_or_default(),
        });
        if let Some(v) = from_row {
            in_rows.push((id.clone(), v));
        }
    }
    Ok((rec, in_rows))
}

/// The stored hosts (agent hosts with their specs).
fn recovered_hosts(snap: &Snapshot, agent_mode: bool) -> anyhow::Result<Vec<RecoveredHost>> {
    snap.hosts
        .iter()
        .map(|(name, bytes)| {
            store_codec::decode_host(name, bytes, agent_mode).map_err(anyhow::Error::msg)
        })
        .collect()
}

/// The stored volumes.
fn recovered_volumes(snap: &Snapshot) -> anyhow::Result<Vec<RecoveredVolume>> {
    snap.volumes
        .iter()
        .map(|(id, bytes)| store_codec::decode_volume(id, bytes).map_err(anyhow::Error::msg))
        .collect()
}

/// The stored tokens and audit entries. A token whose grants are no
/// longer valid is left out (and logged): it could never authenticate.
pub(crate) fn recovered_access(
    snap: &Snapshot,
) -> anyhow::Result<(
    Vec<crate::lifecycle::Token>,
    Vec<crate::lifecycle::AuditEntry>,
)> {
    let mut tokens = Vec::with_capacity(snap.tokens.len());
    for (name, bytes) in &snap.tokens {
        match store_codec::decode_token(name, bytes).map_err(anyhow::Error::msg)? {
            Ok(t) => tokens.push(t),
            Err(e) => {
                tracing::error!(token = %name, error = %e, "a stored token's grants are not valid: it is refused");
            }
        }
    }
    let audit = snap
        .audit
        .iter()
        .map(|(key, bytes)| store_codec::decode_audit(key, bytes).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    Ok((tokens, audit))
}

/// The stored usage ledger.
pub(crate) fn recovered_usage(
    snap: &Snapshot,
) -> anyhow::Result<Vec<crate::lifecycle::UsageRecord>> {
    snap.usage
        .iter()
        .map(|(key, bytes)| store_codec::decode_usage(key, bytes).map_err(anyhow::Error::msg))
        .collect()
}

/// Encodes the rows of the tables beside the jobs (host pools, access,
/// secrets) that the core marked into `batch`, from the core's state:
/// what is no longer there is deleted.
pub(crate) fn state_rows(
    core: &Lifecycle,
    rows: &mut Vec<crate::lifecycle::StateRow>,
    batch: &mut WriteBatch,
) {
    use crate::lifecycle::StateRow;
    for row in rows.drain(..) {
        match row {
            StateRow::HostPool(name) => {
                let exists = core.host_pools().exists(&name);
                batch.host_pools.push((name.to_string(), exists));
            }
            StateRow::Token(name) => {
                let row = core.access().token(&name).map(store_codec::encode_token);
                batch.tokens.push((name.to_string(), row));
            }
            StateRow::Audit(seq) => {
                let row = core
                    .access()
                    .audit_entry(seq)
                    .map(store_codec::encode_audit);
                batch.audit.push((crate::store::audit_key(seq), row));
            }
            StateRow::Usage(seq) => {
                let row = core.ledger().record(seq).map(store_codec::encode_usage);
                batch.usage.push((crate::store::audit_key(seq), row));
            }
            StateRow::Secrets(id) => {
                let row = core
                    .job_key(&id)
                    .ok()
                    .and_then(|k| core.secrets_of(k))
                    .map(|s| store_codec::encode_secrets(s));
                batch.secrets.push((id.to_string(), row));
            }
            StateRow::HostPoolMember(host) => {
                let pools = core.host_pools();
                let pool = pools
                    .is_member(&host)
                    .then(|| pools.pool_of(&host).to_string());
                batch.host_pool_members.push((host.to_string(), pool));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{Health, JobState, TaskState};

    /// A compact event row decodes to exactly the API's events, for every
    /// kind, state, health and size of field (empty, one-byte and
    /// multi-byte lengths, zero and large numbers, revisions and times that
    /// go backwards); a row written as a `WatchResponse` (before the
    /// compact form) still decodes; a cut or damaged row is an error, never
    /// a panic.
    #[test]
    fn event_rows_decode_to_the_api_events() {
        let task_states = TaskState::ALL;
        let healths = [
            Health::None,
            Health::Unknown,
            Health::Healthy,
            Health::Unhealthy,
        ];
        let job_states = [
            JobState::Initialized,
            JobState::Pending,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Killing,
            JobState::Killed,
        ];
        let strings = ["", "a", &"j".repeat(127), &"ü".repeat(300)];
        let numbers = [0u64, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX];
        let mut events = Vec::new();
        let mut n = 0usize;
        for (si, s) in strings.iter().enumerate() {
            for (ni, &v) in numbers.iter().enumerate() {
                n += 1;
                let state = task_states[n % task_states.len()];
                events.push(Event {
                    revision: v,
                    time_ms: numbers[(ni + 1) % numbers.len()],
                    kind: EventKind::Task {
                        job: Arc::from(*s),
                        instance: v as u32,
                        run: (v >> 1) as u32,
                        state,
                        host: Arc::from(strings[(si + 1) % strings.len()]),
                        reason: strings[(si + 2) % strings.len()].into(),
                        health: healths[n % healths.len()],
                    },
                });
                events.push(Event {
                    revision: v ^ 1,
                    time_ms: v,
                    kind: EventKind::Job {
                        job: Arc::from(*s),
                        state: job_states[n % job_states.len()],
                        deleted: n.is_multiple_of(2),
                        reason: strings[(si + 3) % strings.len()].into(),
                    },
                });
            }
        }
        for s in task_states {
            events.push(Event {
                revision: 5,
                time_ms: 6,
                kind: EventKind::Task {
                    job: "j".into(),
                    instance: 0,
                    run: 1,
                    state: s,
                    host: "".into(),
                    reason: "".into(),
                    health: Health::None,
                },
            });
        }
        let (first, bytes) = encode_events(&events);
        assert_eq!(first, events[0].revision);
        let want = pb::WatchResponse {
            events: events_to_pb(&events),
        };
        assert_eq!(decode_event_row(&bytes).unwrap(), want);
        // Each distinct string once: far smaller than protobuf.
        assert!(
            bytes.len() < want.encoded_len() / 2,
            "{} bytes",
            bytes.len()
        );
        // Rows of older servers.
        assert_eq!(decode_event_row(&want.encode_to_vec()).unwrap(), want);
        // No strings at all.
        let bare = [Event {
            revision: 9,
            time_ms: 0,
            kind: EventKind::Job {
                job: "".into(),
                state: JobState::Running,
                deleted: false,
                reason: "".into(),
            },
        }];
        assert_eq!(
            decode_event_row(&encode_events(&bare).1).unwrap().events,
            events_to_pb(&bare)
        );
        for cut in 2..bytes.len() {
            assert!(decode_event_row(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes;
        bad.push(0);
        assert!(
            decode_event_row(&bad)
                .unwrap_err()
                .contains("after the last event")
        );
    }
}
