//! API responses built from the core's and the engine's state (on the loop
//! thread, answered after the commit).

use std::sync::Arc;

use peloton_engine::admission::{BlockKind, TaskClass, TaskFlags};
use peloton_engine::host::{HostArena, HostState};
use peloton_engine::placement::{self, Check};
use peloton_engine::{Dim, Engine, PoolId, Resources};
use peloton_proto::v1 as pb;
use prost::Message;

use crate::convert;
use crate::lifecycle::units::amount;
use crate::lifecycle::{
    Error, HostSlot, Job, JobKey, JobPlan, Lifecycle, Task, TaskState as S, Update, UpdateState,
};
use crate::metrics::{Metrics, PoolDimLabels, PoolLabels};
use crate::paging::{self, PageBytes};
use crate::refused::Refused;

pub(crate) fn pool_to_pb(engine: &Engine, core: &Lifecycle, id: PoolId) -> pb::Pool {
    let rm = engine.resources();
    let tree = rm.tree();
    let path = tree.path(id).to_string();
    // A parent pool holds what its subtree holds (tasks live in leaves),
    // as its demand and entitlement cover its subtree.
    let usage = rm.subtree_usage(id).expect("live pool");
    let ent = rm.entitlements();
    let slot = id.idx();
    let alloc = usage
        .allocation
        .total
        .saturating_add(&usage.allocation.revocable);
    pb::Pool {
        spec: Some(convert::pool_spec_to_pb(tree.config(id))),
        status: Some(pb::PoolStatus {
            entitlement: Some(convert::resources_to_pb(ent.entitlement(slot))),
            allocation: Some(convert::resources_to_pb(alloc)),
            demand: Some(convert::resources_to_pb(ent.demand(slot))),
            pending_tasks: usage.n_queued,
            running_tasks: usage.allocation.n_tasks,
            // Measured usage is soft state: reads add it (`with_pool_usage`).
            used: None,
        }),
        version: core.pool_version(&path),
        children: tree
            .children(id)
            .map(|c| tree.path(c).to_string())
            .collect(),
        path,
    }
}

/// What each pool's subtree uses (a run's usage counts in its pool and
/// every pool above it), for the pools with any reported.
pub(crate) fn pool_usage(
    engine: &Engine,
    core: &Lifecycle,
) -> rustc_hash::FxHashMap<PoolId, crate::lifecycle::usage::Usage> {
    let tree = engine.resources().tree();
    let mut out: rustc_hash::FxHashMap<PoolId, crate::lifecycle::usage::Usage> = Default::default();
    for (leaf, usage) in core.usage_by_pool() {
        let mut pool = Some(leaf);
        while let Some(id) = pool {
            out.entry(id).or_default().add(&usage);
            pool = tree.parent(id);
        }
    }
    out
}

/// `pool` with what its subtree uses (`PoolStatus.used`; reads only: the
/// stored pool row never carries it).
pub(crate) fn with_pool_usage(
    mut pool: pb::Pool,
    used: Option<&crate::lifecycle::usage::Usage>,
) -> pb::Pool {
    if let Some(status) = pool.status.as_mut() {
        status.used = used.map(convert::usage_to_pb);
    }
    pool
}

/// Pools in path order after the request's page token, up to its page size
/// (0: no count limit) and [`paging::MAX_PAGE_BYTES`].
pub(crate) fn list_pools(
    engine: &Engine,
    core: &Lifecycle,
    r: &pb::ListPoolsRequest,
    viewer: Option<&peloton_authz::Principal>,
) -> pb::ListPoolsResponse {
    // The handler refused a token this server did not give.
    let after = paging::page_token_key("page_token", paging::PageKind::Pools, &r.page_token)
        .unwrap_or_default();
    let page = paging::page_size(r.page_size, u32::MAX, u32::MAX);
    let tree = engine.resources().tree();
    let mut ids = tree.list();
    ids.retain(|&id| {
        tree.path(id) > after
            && viewer.is_none_or(|v| v.allows(peloton_authz::Permission::PoolsRead, tree.path(id)))
    });
    ids.sort_by(|a, b| tree.path(*a).cmp(tree.path(*b)));
    let mut out = pb::ListPoolsResponse::default();
    let mut bytes = PageBytes::default();
    let used = pool_usage(engine, core);
    for id in ids {
        let pool = with_pool_usage(pool_to_pb(engine, core, id), used.get(&id));
        if out.pools.len() == page || !bytes.admits(out.pools.len(), &pool) {
            out.next_page_token =
                paging::page_token(paging::PageKind::Pools, id_before(&out.pools));
            break;
        }
        out.pools.push(pool);
    }
    out
}

/// The path of the last pool of a page.
fn id_before(pools: &[pb::Pool]) -> &str {
    pools.last().map_or("", |p| p.path.as_str())
}

pub(crate) fn pool_metrics(engine: &Engine, core: &Lifecycle, metrics: &Metrics) {
    let used = pool_usage(engine, core);
    let rm = engine.resources();
    let tree = rm.tree();
    let mut ids = tree.list();
    ids.sort_by(|a, b| tree.path(*a).cmp(tree.path(*b)));
    let ent = rm.entitlements();
    for id in ids.into_iter().take(metrics.max_pools) {
        let path = tree.path(id).to_string();
        let slot = id.idx();
        let usage = rm.subtree_usage(id).expect("listed pool");
        metrics
            .pending_tasks
            .get_or_create(&PoolLabels { pool: path.clone() })
            .set(usage.n_queued as i64);
        let alloc = usage
            .allocation
            .total
            .saturating_add(&usage.allocation.revocable);
        for d in Dim::ALL {
            let labels = PoolDimLabels {
                pool: path.clone(),
                dim: d.name().to_string(),
            };
            let e = ent.entitlement(slot)[d].min(i64::MAX as u64) as i64;
            metrics.entitlement.get_or_create(&labels).set(e);
            metrics
                .allocation
                .get_or_create(&labels)
                .set(alloc[d] as i64);
            metrics
                .demand
                .get_or_create(&labels)
                .set(ent.demand(slot)[d].min(i64::MAX as u64) as i64);
            // In the engine's units; GPUs are not measured.
            let u = used.get(&id).copied().unwrap_or_default();
            let measured = match d {
                Dim::Cpu => Some(u.cpu_millis),
                Dim::Memory => Some(u.memory_bytes >> 20),
                Dim::Disk => Some(u.disk_bytes >> 20),
                Dim::Gpu => None,
            };
            if let Some(v) = measured {
                metrics
                    .used
                    .get_or_create(&labels)
                    .set(v.min(i64::MAX as u64) as i64);
            }
        }
    }
    metrics
        .hosts_up
        .set(engine.hosts().in_state(HostState::Up).len() as i64);
}

/// A job as the API shows it: with the spec of its current config version
/// and its secrets, redacted (names and sizes).
pub(crate) fn job_to_pb(core: &Lifecycle, k: JobKey) -> pb::Job {
    let job = core.job(k).expect("live job");
    let mut spec = job_spec(&job.plan);
    if let Some(secrets) = core.secrets_of(k) {
        spec.secrets = crate::codec::redacted(secrets);
    }
    pb::Job {
        spec: Some(spec),
        ..job_without_spec(job)
    }
}

/// `job` with what its current runs use (`JobStatus.used`; a sum over its
/// instances, so for a single job's read only) and its start forecast.
pub(crate) fn with_usage(core: &Lifecycle, k: JobKey, mut job: pb::Job) -> pb::Job {
    if let Some(status) = job.status.as_mut() {
        status.used = core.job_usage(k).map(|u| convert::usage_to_pb(&u));
        status.forecast = job_forecast(core, k);
        status.waiting_for = waiting_for(core, k);
        status.cron = cron_status(core, k);
    }
    job
}

/// A cron job's ticks (`JobStatus.cron`), for cron jobs.
pub(crate) fn cron_status(core: &Lifecycle, k: JobKey) -> Option<pb::CronStatus> {
    let state = core.job(k)?.cron.as_ref()?;
    Some(convert::cron_status_to_pb(state, core.cron_next_tick(k)))
}

/// The jobs a job still waits for (`JobStatus.waiting_for`), if any.
pub(crate) fn waiting_for(core: &Lifecycle, k: JobKey) -> Option<pb::JobDependencies> {
    let deps = core.waiting_for(k);
    (!deps.is_empty()).then(|| convert::dependencies_to_pb(&deps))
}

/// A plan's answer as the API shows it.
pub(crate) fn plan_to_pb(a: &crate::lifecycle::JobPlanAnswer) -> pb::PlanJobResponse {
    use peloton_engine::Stopped;
    let instances: Vec<pb::PlannedInstance> = a
        .instances
        .iter()
        .map(|x| pb::PlannedInstance {
            instance: x.instance,
            start_ms: x.start_ms.unwrap_or(0),
            earliest_ms: x.earliest_ms.unwrap_or(0),
            host: x.host.as_deref().unwrap_or("").to_string(),
            queue_position: x.position,
            why_not: x.why_not.clone().unwrap_or_default().into_owned(),
        })
        .collect();
    let start_ms = if instances.iter().any(|x| x.start_ms == 0) {
        0
    } else {
        instances.iter().map(|x| x.start_ms).max().unwrap_or(0)
    };
    pb::PlanJobResponse {
        instances,
        made_at_ms: a.made_at,
        expected_runtime_ms: a.estimate.map_or(0, |e| e.ms),
        expected_runtime_source: a.estimate.map(|e| e.source.describe()).unwrap_or_default(),
        start_ms,
        forecast_stopped: match a.stopped {
            Stopped::AllStarted => "all started",
            Stopped::NoMoreEnds => "no more ends",
            Stopped::Horizon => "horizon",
            Stopped::Steps => "steps",
        }
        .to_string(),
        victims: a
            .victims
            .iter()
            .map(|v| pb::PlannedVictim {
                job_id: v.job.to_string(),
                instance: v.instance,
                pool: v.pool.clone(),
                host: v.host.to_string(),
                priority: v.priority,
                at_ms: v.at_ms,
                reason: v.reason.clone(),
                gang_mate: v.gang_mate,
            })
            .collect(),
        victims_total: u32::try_from(a.victims_total).unwrap_or(u32::MAX),
    }
}

/// A waiting instance's start forecast (`Task.forecast`).
fn task_forecast(
    engine: &Engine,
    core: &Lifecycle,
    k: JobKey,
    i: u32,
) -> Option<pb::StartForecast> {
    let f = core.forecast_of(engine, k, i)?;
    Some(pb::StartForecast {
        start_ms: f.start_ms.unwrap_or(0),
        earliest_ms: f.earliest_ms.unwrap_or(0),
        host: f.host.as_deref().unwrap_or("").to_string(),
        queue_position: f.position,
        made_at_ms: core.forecast_made().0,
    })
}

/// A job's start forecast (`JobStatus.forecast`): when its last waiting
/// instance would start (0 if any would not within the bounds), the
/// earliest its first might, the best queue position among them.
fn job_forecast(core: &Lifecycle, k: JobKey) -> Option<pb::StartForecast> {
    let f = core.job_forecast(k)?;
    Some(pb::StartForecast {
        start_ms: f.start_ms.unwrap_or(0),
        earliest_ms: f.earliest_ms.unwrap_or(0),
        host: String::new(),
        queue_position: f.position,
        made_at_ms: core.forecast_made().0,
    })
}

/// A config version's spec as the API shows it: as its user sent it (the
/// core keeps it encoded), with what the core changed since without a new
/// version: the instance count (scaled; a daemon's follows the hosts it
/// matches, an application's its executors) and so the overrides of
/// instances scaled away.
pub(crate) fn job_spec(plan: &JobPlan) -> pb::JobSpec {
    let mut spec =
        pb::JobSpec::decode(&*plan.spec).expect("a plan's spec was encoded by convert::job_plan");
    spec.instance_count = plan.instance_count;
    // A cron tick's job is named after its tick by the core (its spec is
    // the cron job's): the plan's name is the truth.
    if spec.name != *plan.name {
        spec.name = plan.name.to_string();
    }
    spec.overrides
        .retain(|o| plan.overrides.contains_key(&o.instance));
    // An edit of a batch job (`JobService.Edit`) changes these in a new
    // config version's plan, not its encoded spec: the plan's are the
    // truth. Set only where they differ, so an unedited spec reads exactly
    // as it was sent.
    if plan.kind != crate::lifecycle::JobKind::Batch {
        return spec;
    }
    let had_sla = spec.sla.is_some();
    let sla = spec.sla.get_or_insert_with(Default::default);
    let edited = (
        sla.priority,
        sla.max_running_instances,
        sla.max_running_time_ms,
    ) != (plan.priority, plan.max_running, plan.max_running_time_ms);
    if edited {
        sla.priority = plan.priority;
        sla.max_running_instances = plan.max_running;
        sla.max_running_time_ms = plan.max_running_time_ms;
    } else if !had_sla {
        spec.sla = None;
    }
    let set_failures = |t: &mut Option<pb::TaskSpec>, want: u32| {
        if let Some(t) = t {
            let have = t.restart.as_ref().map_or(0, |r| r.max_failures);
            if have != want {
                t.restart.get_or_insert_with(Default::default).max_failures = want;
            }
        }
    };
    set_failures(&mut spec.default_task, plan.default.restart.max_failures);
    for o in &mut spec.overrides {
        if let Some(t) = plan.overrides.get(&o.instance) {
            set_failures(&mut o.spec, t.restart.max_failures);
        }
    }
    spec
}

/// The fields of an encoded `JobSpec` that queries filter on: decoding it
/// skips the others (the tasks) unread.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct JobSpecHead {
    /// `JobSpec.name`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `JobSpec.owner`.
    #[prost(string, tag = "2")]
    pub owner: String,
    /// `JobSpec.labels`.
    #[prost(map = "string, string", tag = "3")]
    pub labels: std::collections::HashMap<String, String>,
}

impl JobSpecHead {
    /// The head of a plan's spec.
    pub(crate) fn of(plan: &JobPlan) -> Self {
        let mut head = JobSpecHead::decode(&*plan.spec)
            .expect("a plan's spec was encoded by convert::job_plan");
        if head.name != *plan.name {
            head.name = plan.name.to_string(); // a cron tick's job: see `job_spec`
        }
        head
    }
}

/// A job as the API shows it, without its spec.
pub(crate) fn job_without_spec(job: &Job) -> pb::Job {
    pb::Job {
        id: job.id.to_string(),
        spec: None,
        status: Some(pb::JobStatus {
            state: convert::job_state_to_pb(job.state) as i32,
            created_at_ms: job.created_at,
            completed_at_ms: job.completed_at,
            task_counts: job
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(s, c)| pb::StateCount {
                    state: s as i32,
                    count: *c,
                })
                .collect(),
            kill_requested: job.kill_requested,
            config_version: job.config,
            update_id: job
                .latest_update()
                .map(|u| u.to_string())
                .unwrap_or_default(),
            application: job.plan.app.map(|a| pb::ApplicationStatus {
                target: job.app.target,
                generation: job.app.generation,
                registered: a.registered,
                unregistered: job.app.closed,
            }),
            used: None,
            forecast: None,
            waiting_for: None,
            cron: None,
        }),
        version: job.version,
    }
}

/// An update as the API shows it.
pub(crate) fn update_to_pb(core: &Lifecycle, u: &Update) -> pb::Update {
    let state =
        |s: UpdateState| pb::UpdateState::try_from(s as i32).expect("same numbering") as i32;
    let counts = core.update_counts(u);
    pb::Update {
        id: u.id.to_string(),
        job_id: core
            .job(u.job)
            .map(|j| j.id.to_string())
            .unwrap_or_default(),
        spec: Some(pb::UpdateSpec {
            batch_size: u.spec.batch_size,
            max_instance_retries: u.spec.max_instance_retries,
            max_failed_instances: u.spec.max_failed_instances,
            rollback_on_failure: u.spec.rollback_on_failure,
            start_paused: u.spec.start_paused,
        }),
        from_version: u.from,
        to_version: u.to,
        status: Some(pb::UpdateStatus {
            state: state(u.state),
            paused_from: u.paused_from.map_or(0, state),
            instances_total: counts.total,
            instances_done: counts.done,
            instances_in_progress: u.in_progress.iter().copied().collect(),
            instances_failed: u.failed.iter().copied().collect(),
            created_at_ms: u.created_at,
            completed_at_ms: u.completed_at,
            reason: u.reason.as_deref().unwrap_or_default().to_string(),
            instances_failed_rolling_back: u.failed_back.iter().copied().collect(),
        }),
    }
}

pub(crate) fn query_jobs(
    core: &Lifecycle,
    r: &pb::QueryJobsRequest,
    viewer: Option<&peloton_authz::Principal>,
) -> pb::QueryJobsResponse {
    let page = paging::page_size(r.page_size, 100, 1000);
    let after = paging::page_token_key("page_token", paging::PageKind::Jobs, &r.page_token)
        .unwrap_or_default();
    let mut out = pb::QueryJobsResponse::default();
    let mut bytes = PageBytes::default();
    for (k, job) in core.jobs_by_id(after) {
        let pool = &*job.plan.pool;
        let state = convert::job_state_to_pb(job.state) as i32;
        if (!r.pool.is_empty() && pool != r.pool)
            || viewer.is_some_and(|v| !v.allows(peloton_authz::Permission::JobsRead, pool))
            || (!r.states.is_empty() && !r.states.contains(&state))
        {
            continue;
        }
        let s = JobSpecHead::of(&job.plan);
        if (!r.name.is_empty() && !s.name.contains(&r.name))
            || (!r.owner.is_empty() && s.owner != r.owner)
            || r.labels.iter().any(|(k, v)| s.labels.get(k) != Some(v))
        {
            continue;
        }
        let full = out.jobs.len() == page;
        let j = (!full).then(|| {
            let mut j = job_to_pb(core, k);
            if let Some(status) = j.status.as_mut() {
                status.forecast = job_forecast(core, k);
                status.waiting_for = waiting_for(core, k);
                status.cron = cron_status(core, k);
            }
            j
        });
        match j {
            Some(j) if bytes.admits(out.jobs.len(), &j) => out.jobs.push(j),
            _ => {
                let last = out.jobs.last().map_or("", |j| j.id.as_str());
                out.next_page_token = paging::page_token(paging::PageKind::Jobs, last);
                break;
            }
        }
    }
    out
}

/// A usage record as the API shows it.
pub(crate) fn usage_record_to_pb(r: &crate::lifecycle::UsageRecord) -> pb::UsageRecord {
    pb::UsageRecord {
        seq: r.seq,
        job_id: r.job_id.to_string(),
        job_name: r.job_name.to_string(),
        pool: r.pool.to_string(),
        owner: r.owner.to_string(),
        instance: r.instance,
        run: r.run,
        host: r.host.to_string(),
        started_at_ms: r.started_ms,
        finished_at_ms: r.finished_ms,
        wall_ms: r.wall_ms(),
        state: convert::task_state_to_pb(r.state) as i32,
        exit_code: r.exit_code,
        cpu_requested_core_seconds: r.cpu_requested_core_s(),
        memory_requested_mib_seconds: r.memory_requested_mib_s(),
        disk_requested_mib_seconds: r.disk_requested_mib_s(),
        gpu_requested_seconds: r.gpu_requested_s(),
        cpu_used_core_seconds: r.cpu_used_core_s(),
        memory_peak_bytes: r.memory_peak_bytes,
        used_until_ms: r.used_until_ms,
    }
}

/// Adds a record to a group's sums.
fn add_usage(sum: &mut pb::UsageSum, r: &pb::UsageRecord) {
    sum.runs += 1;
    sum.wall_ms = sum.wall_ms.saturating_add(r.wall_ms);
    sum.cpu_requested_core_seconds += r.cpu_requested_core_seconds;
    sum.memory_requested_mib_seconds += r.memory_requested_mib_seconds;
    sum.disk_requested_mib_seconds += r.disk_requested_mib_seconds;
    sum.gpu_requested_seconds += r.gpu_requested_seconds;
    sum.cpu_used_core_seconds += r.cpu_used_core_seconds;
    sum.memory_peak_bytes = sum.memory_peak_bytes.max(r.memory_peak_bytes);
}

/// The usage ledger, filtered (the request checked by the service): its
/// records oldest first from the page token's sequence number, or its sums
/// by group from the token's key. A job id that names neither a record
/// nor a live job is not found.
pub(crate) fn list_usage(
    core: &Lifecycle,
    r: &pb::ListUsageRequest,
    viewer: Option<&peloton_authz::Principal>,
) -> Result<pb::ListUsageResponse, crate::lifecycle::Error> {
    let page = paging::page_size(r.page_size, 1000, 10_000);
    let after = paging::page_token_key("page_token", paging::PageKind::Usage, &r.page_token)
        .unwrap_or_default();
    let group_by = pb::UsageGroupBy::try_from(r.group_by).unwrap_or_default();
    let matches = |u: &crate::lifecycle::UsageRecord| {
        (r.pool.is_empty() || *u.pool == *r.pool)
            && (r.owner.is_empty() || *u.owner == *r.owner)
            && (r.job_id.is_empty() || *u.job_id == *r.job_id)
            && u.finished_ms >= r.since_ms
            && (r.until_ms == 0 || u.finished_ms < r.until_ms)
            && viewer.is_none_or(|v| v.allows(peloton_authz::Permission::JobsRead, &u.pool))
    };
    if !r.job_id.is_empty()
        && core.job_key(&r.job_id).is_err()
        && !core.ledger().records().any(|u| *u.job_id == *r.job_id)
    {
        return Err(crate::lifecycle::Error::JobNotFound(r.job_id.clone()));
    }
    let mut out = pb::ListUsageResponse::default();
    let mut bytes = PageBytes::default();
    if group_by == pb::UsageGroupBy::None {
        let after: u64 = after.parse().unwrap_or(0);
        for u in core.ledger().records_after(after).filter(|u| matches(u)) {
            let rec = usage_record_to_pb(u);
            if out.records.len() == page || !bytes.admits(out.records.len(), &rec) {
                let last = out.records.last().map_or(after, |r| r.seq);
                out.next_page_token =
                    paging::page_token(paging::PageKind::Usage, &last.to_string());
                break;
            }
            out.records.push(rec);
        }
        return Ok(out);
    }
    let mut sums: std::collections::BTreeMap<&str, pb::UsageSum> = Default::default();
    for u in core.ledger().records().filter(|u| matches(u)) {
        let key: &str = match group_by {
            pb::UsageGroupBy::Owner => &u.owner,
            pb::UsageGroupBy::Job => &u.job_id,
            _ => &u.pool,
        };
        if !after.is_empty() && key <= after {
            continue;
        }
        add_usage(
            sums.entry(key).or_insert_with(|| pb::UsageSum {
                key: key.to_string(),
                ..pb::UsageSum::default()
            }),
            &usage_record_to_pb(u),
        );
    }
    for (_, sum) in sums {
        if out.sums.len() == page || !bytes.admits(out.sums.len(), &sum) {
            let last = out.sums.last().map_or(after, |s| s.key.as_str());
            out.next_page_token = paging::page_token(paging::PageKind::Usage, last);
            break;
        }
        out.sums.push(sum);
    }
    Ok(out)
}

fn task_to_pb(engine: &Engine, core: &Lifecycle, k: JobKey, job: &Job, i: u32) -> pb::Task {
    let t = &job.tasks[i as usize];
    let mut current = convert::run_to_pb(&core.run_record(t));
    current.health = convert::health_to_pb(t.health) as i32;
    current.used = core.run_usage(k, i).map(|u| convert::usage_to_pb(&u));
    current.ports = t
        .ports
        .iter()
        .flatten()
        .map(|(n, p)| (n.to_string(), *p))
        .collect();
    current.gpu_devices = convert::gpu_device_indices(t.gpu);
    current.gpu_share_milli = convert::gpu_share_milli(t.gpu);
    let held = core.held(k, i);
    let estimate = core.runtime_estimate(k, i);
    pb::Task {
        job_id: job.id.to_string(),
        instance: i,
        current: Some(current),
        failure_count: t.failures,
        pending_reason: String::new(),
        history: t
            .history
            .iter()
            .flat_map(|h| h.iter())
            .map(convert::run_to_pb)
            .collect(),
        stopping: held.is_some(),
        restart_when_stopped: held.is_some_and(|h| h.restart),
        config_version: t.config,
        stopping_launch_id: held.map_or(0, |h| h.launch.0),
        stopping_host: held
            .and_then(|h| h.host)
            .map(|s| core.host_name(s).to_string())
            .unwrap_or_default(),
        volume_id: core
            .volume_of(k, i)
            .map(|v| v.id.to_string())
            .unwrap_or_default(),
        pinned_host: core
            .pin_of(k, i)
            .map(|s| core.host_name(s).to_string())
            .unwrap_or_default(),
        // Set by `get_task` (as the pending reason).
        pending_checks: Vec::new(),
        pending_hosts: 0,
        pending_gang_size: 0,
        // Set by `get_task`.
        usage: Vec::new(),
        expected_runtime_ms: estimate.map_or(0, |e| e.ms),
        expected_runtime_source: estimate.map(|e| e.source.describe()).unwrap_or_default(),
        forecast: task_forecast(engine, core, k, i),
        // Batch only: the job's current plan's (what `back_off` counts
        // against), not the instance's config's.
        max_failures: if job.plan.kind.keeps_running() {
            0
        } else {
            job.plan.template(i).restart.max_failures
        },
    }
}

/// A volume as the API shows it.
pub(crate) fn volume_to_pb(core: &Lifecycle, v: &crate::lifecycle::Volume) -> pb::Volume {
    pb::Volume {
        id: v.id.to_string(),
        job_id: core
            .job(v.job)
            .map(|j| j.id.to_string())
            .unwrap_or_default(),
        instance: v.instance,
        host: core.host_name(v.host).to_string(),
        size_mb: v.size_mb,
        path: v.path.to_string(),
        in_use: core.volume_in_use(v),
        created_at_ms: v.created_at,
    }
}

/// Volumes in id order after the request's page token, filtered by job id
/// and host, up to its page size and [`paging::MAX_PAGE_BYTES`].
pub(crate) fn list_volumes(
    core: &Lifecycle,
    r: &pb::ListVolumesRequest,
) -> Result<pb::ListVolumesResponse, Error> {
    // The handler refused a token this server did not give.
    let after = paging::page_token_key("page_token", paging::PageKind::Volumes, &r.page_token)
        .unwrap_or_default();
    if !r.job_id.is_empty() {
        core.job_key(&r.job_id)?;
    }
    let max = convert::MAX_LISTED_VOLUMES as u32;
    let page = paging::page_size(r.page_size, max, max);
    let mut volumes: Vec<&crate::lifecycle::Volume> = core
        .volumes()
        .filter(|v| {
            *v.id > *after
                && (r.job_id.is_empty() || core.job(v.job).is_some_and(|j| *j.id == *r.job_id))
                && (r.host.is_empty() || **core.host_name(v.host) == *r.host)
        })
        .collect();
    volumes.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    let mut out = pb::ListVolumesResponse::default();
    let mut bytes = PageBytes::default();
    for v in volumes {
        let volume = volume_to_pb(core, v);
        if out.volumes.len() == page || !bytes.admits(out.volumes.len(), &volume) {
            let last = out.volumes.last().map_or("", |v| v.id.as_str());
            out.next_page_token = paging::page_token(paging::PageKind::Volumes, last);
            break;
        }
        out.volumes.push(volume);
    }
    Ok(out)
}

pub(crate) fn list_tasks(
    engine: &Engine,
    core: &Lifecycle,
    r: &pb::ListTasksRequest,
) -> Result<pb::ListTasksResponse, Refused> {
    let k = core.job_key(&r.job_id)?;
    let job = core.job(k).expect("live");
    let limit = paging::page_size(r.limit, 1000, 10_000);
    let n = job.tasks.len() as u32;
    if r.from_instance >= n && !(n == 0 && r.from_instance == 0) {
        return Err(Refused::OutOfRange(format!(
            "from_instance: {} is past the job's last instance ({})",
            r.from_instance,
            if n == 0 {
                "it has none".to_string()
            } else {
                format!("it has {n}, 0–{}", n - 1)
            }
        )));
    }
    let mut out = pb::ListTasksResponse::default();
    let mut bytes = PageBytes::default();
    for i in r.from_instance..n {
        let t = &job.tasks[i as usize];
        if !r.states.is_empty()
            && !r
                .states
                .contains(&(convert::task_state_to_pb(t.state) as i32))
        {
            continue;
        }
        if out.tasks.len() == limit {
            out.next_instance = i;
            break;
        }
        let task = task_to_pb(engine, core, k, job, i);
        if !bytes.admits(out.tasks.len(), &task) {
            out.next_instance = i;
            break;
        }
        out.tasks.push(task);
    }
    Ok(out)
}

pub(crate) fn get_task(
    engine: &Engine,
    core: &Lifecycle,
    job_id: &str,
    instance: u32,
) -> Result<pb::Task, Error> {
    let k = core.job_key(job_id)?;
    let job = core.job(k).expect("live");
    let Some(t) = job.tasks.get(instance as usize) else {
        return Err(Error::NoInstance {
            job: job_id.to_string(),
            instance,
            count: job.tasks.len() as u32,
        });
    };
    let mut task = task_to_pb(engine, core, k, job, instance);
    // One pass over the ledger, newest first (bounded by its bound).
    task.usage = core
        .ledger()
        .records()
        .rev()
        .filter(|r| *r.job_id == *job_id && r.instance == instance)
        .take(core.config().max_history + 1)
        .map(usage_record_to_pb)
        .collect();
    task.pending_reason = pending_reason(engine, job, instance, t);
    if let Some(r) = placement_reason(engine, t) {
        task.pending_hosts = r.n_hosts;
        task.pending_gang_size = r.gang_size;
        task.pending_checks = pending_checks(engine, r);
    }
    Ok(task)
}

/// Why the last placement found no host for a task admitted but not
/// placed; `None` for any other task.
fn placement_reason<'e>(engine: &'e Engine, t: &Task) -> Option<&'e placement::Reason> {
    if !matches!(t.state, S::Ready | S::Placing) {
        return None;
    }
    let h = t.handle?;
    let report = &engine.report().placement;
    let u = report.unplaced.iter().find(|u| u.task == h)?;
    Some(report.reason_of(u))
}

/// The placer's per-check host counts (`Task.pending_checks`), in the
/// reason's order (most common first), each with the words
/// `Reason::describe` uses for it.
fn pending_checks(engine: &Engine, r: &placement::Reason) -> Vec<pb::PendingCheck> {
    use pb::PlacementCheck as P;
    r.counts
        .iter()
        .map(|&(check, hosts)| {
            let (kind, dimension, description) = match check {
                Check::HostNotUp => (P::HostNotUp, "", "not up".to_owned()),
                Check::Constraint => (
                    P::Constraint,
                    "",
                    engine.constraints().get(r.constraint).map_or_else(
                        || "constraint not met".to_owned(),
                        |c| {
                            format!(
                                "constraint {} not met",
                                c.display(engine.hosts().interner())
                            )
                        },
                    ),
                ),
                Check::Exclusive => (P::Exclusive, "", "exclusive to other work".to_owned()),
                Check::GpuHostReserved => (
                    P::GpuHostReserved,
                    "",
                    "GPU hosts kept for GPU tasks".to_owned(),
                ),
                Check::PerHostLimit => (
                    P::PerHostLimit,
                    "",
                    "per-host instance limit reached".to_owned(),
                ),
                Check::Insufficient(d) => (P::Insufficient, d.name(), format!("insufficient {d}")),
                Check::GpuFragmented => {
                    (P::GpuFragmented, "", "GPU free but fragmented".to_owned())
                }
                Check::Ports => (P::Ports, "", "insufficient ports".to_owned()),
                Check::Pinned => (
                    P::Pinned,
                    "",
                    "not the host the task is pinned to".to_owned(),
                ),
                Check::Reserved => (
                    P::Reserved,
                    "",
                    "held for a waiting gang's reservation".to_owned(),
                ),
            };
            pb::PendingCheck {
                check: kind as i32,
                dimension: dimension.to_owned(),
                hosts,
                description,
            }
        })
        .collect()
}

/// Default `ListQueueRequest.limit` (the largest is `MAX_QUEUE_READ`).
const QUEUE_READ_DEFAULT: u32 = 20;

/// The first entries of a pool's queues in admission order
/// (`ResourcePoolService.ListQueue`; the limit is checked by the service).
pub(crate) fn list_queue(
    engine: &Engine,
    core: &Lifecycle,
    path: &str,
    limit: u32,
) -> Result<pb::ListQueueResponse, Error> {
    let rm = engine.resources();
    let id = rm.tree().resolve(path).map_err(Error::Pool)?;
    let limit = if limit == 0 {
        QUEUE_READ_DEFAULT
    } else {
        limit
    };
    let entries = rm.queue_order(id, limit as usize).map_err(Error::Pool)?;
    let mut out = pb::ListQueueResponse {
        entries: Vec::with_capacity(entries.len()),
        queued_tasks: rm.usage(id).map_or(0, |u| u.n_queued),
    };
    for e in entries {
        let h = peloton_engine::task::TaskHandle::from_u64(e.head.0);
        // Every queued entry is a live instance's; a miss would be a bug,
        // not worth failing the read for.
        let Some((k, i)) = core.instance_of(engine, h) else {
            debug_assert!(false, "queued task {h:?} has no instance");
            continue;
        };
        out.entries.push(pb::QueueEntry {
            task: Some(pb::TaskRef {
                job_id: core.job(k).expect("live").id.to_string(),
                instance: i,
            }),
            tasks: e.n_tasks,
            task_class: e.class.name().to_owned(),
            priority: e.priority,
            request: Some(convert::resources_to_pb(e.total)),
        });
    }
    Ok(out)
}

pub(crate) fn pending_reason(engine: &Engine, job: &Job, instance: u32, t: &Task) -> String {
    let report = engine.report();
    match t.state {
        S::Initialized => {
            if let Some(r) = &t.reason {
                r.to_string()
            } else if job.plan.max_running != 0 && job.active >= job.plan.max_running {
                format!(
                    "waiting: the job already has max_running_instances {} tasks queued or running",
                    job.plan.max_running
                )
            } else {
                format!(
                    "waiting to be queued with its gang of {} (instances are queued gang by gang)",
                    job.plan.gang
                )
            }
        }
        S::Pending => admission_reason(engine, job, instance, t),
        S::Ready | S::Placing => t
            .handle
            .and_then(|h| report.placement.unplaced.iter().find(|u| u.task == h))
            .map_or_else(
                || "admitted; waiting for placement".to_string(),
                |u| {
                    format!(
                        "not placed: it needs {}; {}",
                        needs(&task_request(engine, t)),
                        report
                            .placement
                            .reason_of(u)
                            .describe(engine.hosts(), engine.constraints())
                    )
                },
            ),
        S::Backoff => format!(
            "restarting after failure {} ({})",
            t.failures,
            t.reason.as_deref().unwrap_or("")
        ),
        _ => String::new(),
    }
}

/// A request in the API's units: "cpu 1 core, memory 256 MiB".
fn needs(r: &Resources) -> String {
    let parts: Vec<String> = Dim::ALL
        .into_iter()
        .filter(|&d| r[d] > 0)
        .map(|d| format!("{d} {}", amount(d, r[d])))
        .collect();
    parts.join(", ")
}

/// What the engine holds for a task's current run (its request, with its
/// volume's disk).
fn task_request(engine: &Engine, t: &Task) -> Resources {
    t.handle
        .and_then(|h| engine.tasks().spec(h).ok())
        .map_or(Resources::ZERO, |s| s.request)
}

/// Why a queued task is not admitted: about this task (or its gang), in
/// the API's units — can it ever be, is it at the head of its queue or
/// behind others, and the rule that holds its queue.
fn admission_reason(engine: &Engine, job: &Job, instance: u32, t: &Task) -> String {
    let tmpl = job.plan.template(instance);
    let flags = TaskFlags {
        preemptible: job.plan.preemptible,
        controller: tmpl.controller,
        revocable: tmpl.revocable,
    };
    // Its queue entry: its gang, or itself.
    let members: Vec<&Task> = match t.gang {
        Some(g) => job
            .tasks
            .iter()
            .filter(|m| m.gang == Some(g) && m.state == S::Pending)
            .collect(),
        None => vec![t],
    };
    let mut total = Resources::ZERO;
    for m in &members {
        total = total.saturating_add(&task_request(engine, m));
    }
    let it = if members.len() > 1 {
        format!("its gang of {} needs {}", members.len(), needs(&total))
    } else {
        format!("it needs {}", needs(&total))
    };
    if let Some(why) = crate::lifecycle::never_admitted_reason(engine, job.pool, flags, &total) {
        return format!(
            "can never be admitted as its pool is now ({it}): {why}; change the pool, or kill the job"
        );
    }
    let Ok(class) = TaskClass::of(flags) else {
        return "queued for admission; the next cycle decides".into();
    };
    let Some(b) = engine
        .report()
        .admission
        .blocked
        .iter()
        .find(|b| b.pool == job.pool && b.class == class)
    else {
        return "queued for admission; the next cycle decides".into();
    };
    let d = b.dim;
    let rule = match b.kind {
        BlockKind::Entitlement => "entitlement",
        BlockKind::Reservation => "reservation (for non-preemptible work)",
        BlockKind::ControllerLimit => "controller limit",
        BlockKind::SlackEntitlement => "slack entitlement (for revocable work)",
        BlockKind::SlackLimit => "slack limit",
        BlockKind::Hosts => "hosts",
    };
    let path = engine.resources().tree().path(b.pool);
    let pool = if b.kind == BlockKind::Hosts {
        format!(
            "only {} of its {} tasks fit the free hosts now, so it waits in pool {path}'s queue rather than hold the pool's share",
            b.allocated, b.cap
        )
    } else {
        format!(
            "pool {path}'s {rule} in {d} is {}, with {} in use",
            amount(d, b.cap),
            amount(d, b.allocated)
        )
    };
    let at_head = members
        .iter()
        .any(|m| m.handle.is_some_and(|h| h.to_u64() == b.head.0));
    if at_head {
        let reserved = engine
            .report()
            .start_reservations
            .iter()
            .find(|r| r.head == b.head && !r.hosts.is_empty())
            .map(|r| {
                let names: Vec<&str> = r
                    .hosts
                    .iter()
                    .take(8)
                    .filter_map(|&h| engine.hosts().lookup_slot(h as usize))
                    .map(|h| engine.hosts().name(h))
                    .collect();
                let more = if r.hosts.len() > names.len() { ", …" } else { "" };
                format!(
                    "; {} host(s) are reserved for it from when they free up ({}{more}): until then, work queued after it goes there only if it is expected to end first",
                    r.hosts.len(),
                    names.join(", ")
                )
            })
            .unwrap_or_default();
        format!("not admitted yet: {it}, and {pool}{reserved}")
    } else {
        format!(
            "not admitted yet: it waits behind the head of its pool's {class} queue ({} task(s) waiting), which needs {} of {d}; {pool}; {it}",
            b.n_waiting,
            amount(d, b.request)
        )
    }
}

fn host_state_to_pb(hosts: &HostArena, slot: HostSlot) -> pb::HostState {
    let id = hosts.lookup_slot(slot.idx()).expect("live");
    match hosts.state(id) {
        HostState::Up => pb::HostState::Up,
        HostState::Draining => pb::HostState::Draining,
        HostState::Down => pb::HostState::Down,
    }
}

/// Most task references one listed host carries (`Host.tasks`; the count
/// is `Host.tasks_total`): about 50 KiB, so that a host is a small item of
/// a page whatever runs on it.
pub const MAX_HOST_TASK_REFS: usize = 1000;

/// Job id, then instance.
fn task_ref_order(a: &pb::TaskRef, b: &pb::TaskRef) -> std::cmp::Ordering {
    (a.job_id.as_str(), a.instance).cmp(&(b.job_id.as_str(), b.instance))
}

pub(crate) fn list_hosts(
    engine: &Engine,
    core: &Lifecycle,
    hub: Option<&crate::agent_hub::AgentHub>,
    r: &pb::ListHostsRequest,
) -> pb::ListHostsResponse {
    let limit = paging::page_size(r.limit, 1000, 10_000);
    let hosts = engine.hosts();
    let mut names: Vec<(&str, u32)> = hosts
        .live_hosts()
        .iter()
        .map(|slot| {
            let id = hosts.lookup_slot(slot as usize).expect("live");
            (hosts.name(id), slot)
        })
        .filter(|(name, _)| r.after.is_empty() || *name > r.after.as_str())
        .collect();
    names.sort_unstable();
    let mut more = names.len() > limit;
    names.truncate(limit);
    let mut volumes_mb: rustc_hash::FxHashMap<u32, u64> = Default::default();
    for v in core.volumes() {
        *volumes_mb.entry(v.host.0).or_default() += v.size_mb;
    }
    let reserved_for = host_reservations(engine, core);
    let mut out = pb::ListHostsResponse::default();
    let mut bytes = PageBytes::default();
    for &(name, slot) in &names {
        let slot = HostSlot(slot);
        let agent = core.agent_host(slot);
        let mut tasks: Vec<pb::TaskRef> = core
            .instances_on(engine, slot)
            .into_iter()
            .map(|(k, i)| pb::TaskRef {
                job_id: core.job(k).expect("live").id.to_string(),
                instance: i,
            })
            .collect();
        let tasks_total = tasks.len() as u64;
        if tasks.len() > MAX_HOST_TASK_REFS {
            tasks.select_nth_unstable_by(MAX_HOST_TASK_REFS, task_ref_order);
            tasks.truncate(MAX_HOST_TASK_REFS);
        }
        tasks.sort_unstable_by(task_ref_order);
        let host = pb::Host {
            name: name.to_string(),
            capacity: Some(convert::resources_to_pb(hosts.capacity(slot.idx()))),
            free: Some(convert::resources_to_pb(hosts.free(slot.idx()))),
            state: host_state_to_pb(hosts, slot) as i32,
            attributes: host_attributes(hosts, slot.0),
            host_pool: host_pool_of(hosts, slot.0),
            tasks,
            tasks_total,
            connected: agent.is_some_and(|h| h.connected),
            last_seen_ms: hub.and_then(|hub| hub.last_seen(name)).unwrap_or(0),
            isolation: match agent {
                Some(h) => h.isolation.clone(),
                None => "simulated".into(),
            },
            volumes_disk_mb: volumes_mb.get(&slot.0).copied().unwrap_or(0),
            agent_id: agent.map(|h| h.agent_id.to_string()).unwrap_or_default(),
            address: agent.map(|h| h.address.to_string()).unwrap_or_default(),
            used: core.host_usage(slot).map(|u| convert::usage_to_pb(&u)),
            reserved_for: reserved_for.get(&slot.0).cloned().unwrap_or_default(),
        };
        // A page also ends before its encoded size passes MAX_PAGE_BYTES
        // (hosts with many tasks are large).
        if !bytes.admits(out.hosts.len(), &host) {
            more = true;
            break;
        }
        out.hosts.push(host);
    }
    if more {
        out.next_after = out.hosts.last().map(|h| h.name.clone()).unwrap_or_default();
    }
    out
}

/// The last cycle's start reservations (reservations with backfill), by
/// host slot.
fn host_reservations(
    engine: &Engine,
    core: &Lifecycle,
) -> rustc_hash::FxHashMap<u32, Vec<pb::HostReservation>> {
    let mut by_host: rustc_hash::FxHashMap<u32, Vec<pb::HostReservation>> = Default::default();
    for r in &engine.report().start_reservations {
        let head = peloton_engine::task::TaskHandle::from_u64(r.head.0);
        let Ok((job, instance)) = engine.tasks().owner(head) else {
            continue;
        };
        let Some(job) = core.job(JobKey(job)) else {
            continue;
        };
        let reservation = pb::HostReservation {
            head: Some(pb::TaskRef {
                job_id: job.id.to_string(),
                instance,
            }),
            tasks: r.n_tasks,
            from_ms: r.at_ms,
            pool: engine.resources().tree().path(r.pool).to_string(),
        };
        for &slot in &r.hosts {
            by_host.entry(slot).or_default().push(reservation.clone());
        }
    }
    by_host
}

/// A host's attributes as shown: without its host pool (shown as
/// `Host.host_pool`).
pub(crate) fn host_attributes(
    hosts: &HostArena,
    slot: u32,
) -> std::collections::HashMap<String, String> {
    let interner = hosts.interner();
    hosts
        .attributes(slot as usize)
        .iter()
        .filter(|(k, _)| interner.resolve(*k) != convert::HOST_POOL_ATTRIBUTE)
        .map(|(k, v)| {
            (
                interner.resolve(*k).to_string(),
                interner.resolve(*v).to_string(),
            )
        })
        .collect()
}

/// A host's host pool (from its attribute).
fn host_pool_of(hosts: &HostArena, slot: u32) -> String {
    let interner = hosts.interner();
    hosts
        .attributes(slot as usize)
        .iter()
        .find(|(k, _)| interner.resolve(*k) == convert::HOST_POOL_ATTRIBUTE)
        .map(|(_, v)| interner.resolve(*v).to_string())
        .unwrap_or_else(|| convert::DEFAULT_HOST_POOL.to_string())
}

/// Where a run's logs are: its key and its host.
pub(crate) fn log_target(
    core: &Lifecycle,
    job_id: &str,
    instance: u32,
    run_id: u32,
) -> Result<(pb::RunKey, Arc<str>), Error> {
    let k = core.job_key(job_id)?;
    let job = core.job(k).expect("live");
    let Some(t) = job.tasks.get(instance as usize) else {
        return Err(Error::NotFound(format!(
            "job {job_id} has no instance {instance}"
        )));
    };
    let current = core.run_record(t);
    let history = t.history.as_deref().map_or(&[][..], |h| h.as_slice());
    let run = std::iter::once(&current)
        .chain(history.iter())
        .find(|r| r.launch.0 != 0 && (run_id == 0 || r.run == run_id) && !r.host.is_empty())
        .cloned()
        .ok_or_else(|| {
            Error::NotFound(if run_id == 0 {
                format!("{job_id}/{instance} has not been launched yet")
            } else {
                format!("{job_id}/{instance} has no launched run {run_id}")
            })
        })?;
    let key = pb::RunKey {
        job_id: job_id.to_string(),
        instance,
        run_id: run.run,
        launch_id: run.launch.0,
    };
    Ok((key, run.host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{Limits, job_plan};

    fn task(command: &str) -> pb::TaskSpec {
        pb::TaskSpec {
            command: command.into(),
            resources: Some(pb::Resources {
                cpu: 0.5,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A spec reads back as sent, without its secrets; what the core
    /// changes without a new version (a scale: the count, the overrides of
    /// instances gone) is derived from the plan, and each instance's task
    /// is its template's.
    #[test]
    fn a_spec_reads_back_as_sent_with_the_count_and_overrides_of_the_plan() {
        let override_of = |instance, command| pb::InstanceOverride {
            instance,
            spec: Some(task(command)),
        };
        let sent = pb::JobSpec {
            name: "j".into(),
            pool: "/a".into(),
            instance_count: 4,
            default_task: Some(task("/bin/default")),
            overrides: vec![override_of(3, "/bin/three"), override_of(0, "/bin/zero")],
            secrets: vec![pb::Secret {
                name: "s".into(),
                value: b"v".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut plan = job_plan(&sent, &Limits::default()).expect("valid");
        let as_sent = pb::JobSpec {
            secrets: Vec::new(),
            ..sent
        };
        assert_eq!(job_spec(&plan), as_sent);
        let spec_of = |plan: &JobPlan, i| pb::TaskSpec::decode(&*plan.template(i).spec).unwrap();
        assert_eq!(spec_of(&plan, 0), task("/bin/zero"));
        assert_eq!(spec_of(&plan, 1), task("/bin/default"));
        assert_eq!(spec_of(&plan, 3), task("/bin/three"));
        // Scaled down to 2, as the core does it.
        plan.instance_count = 2;
        plan.overrides.retain(|&i, _| i < 2);
        let read = job_spec(&plan);
        assert_eq!(read.instance_count, 2);
        assert_eq!(read.overrides, vec![override_of(0, "/bin/zero")]);
        assert_eq!(&*plan.host_pool, convert::DEFAULT_HOST_POOL);
    }
}
