//! Plans: where and when a job would start if it were submitted now,
//! changing nothing (`nomad job plan`, with times).
//!
//! A plan passes the checks a new job passes ([`Lifecycle::check_new_job`]:
//! its pools, that it could ever be admitted, what its kind allows; a
//! refusal names the field and the limit that binds), then queues the
//! job's instances in a fork of the engine as the core would queue them
//! (gangs whole, at most its running limit), and forecasts the fork
//! ([`peloton_engine::forecast`]): the same admission and placement the
//! live loop would run, with the running work ending at its estimates.
//! The forecast preempts as the live loop would
//! ([`ForecastConfig::preempt`]: victims over their pool's entitlement,
//! lower-priority tasks evicted in their own pool, queued again), from the
//! state the runs already stopping leave (they end first: the live loop
//! chooses no victims while preemptions are unconfirmed), and the plan
//! lists what the job would preempt, when and why: the evictions made for
//! its own tasks, and the victims over their pool's entitlement chosen
//! until its last instance starts (its demand is what changes the
//! entitlements then; work already queued may share in that), each with
//! the running members of its gang, stopped with it. At most
//! [`MAX_PLANNED_VICTIMS`] are listed, with their number. What it does
//! not foresee: work submitted later, hosts that come or go, the time a
//! kill takes (a victim's room is free in the step that chose it).

use std::sync::Arc;

use peloton_engine::Engine;
use peloton_engine::forecast::{ForecastConfig, Preemption, Stopped};
use peloton_engine::preemption::PreemptReason;

use crate::runs::new_task_of;
use crate::runtime::Estimate;
use crate::{Error, ForecastRequest, JobKey, JobKind, JobPlan, Lifecycle};

/// Where and when one instance of a planned job would start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedInstance {
    /// The instance.
    pub instance: u32,
    /// When it would start; none if not within the forecast's bounds or
    /// held back by the job's running limit.
    pub start_ms: Option<u64>,
    /// The earliest it might.
    pub earliest_ms: Option<u64>,
    /// The host it would get.
    pub host: Option<Arc<str>>,
    /// Its place in its pool's queue (0: not admitted within the bounds).
    pub position: u32,
    /// Why it has no start, if it has none.
    pub why_not: Option<std::borrow::Cow<'static, str>>,
}

/// A running task a plan would preempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedVictim {
    /// Its job.
    pub job: Arc<str>,
    /// Its instance.
    pub instance: u32,
    /// Its job's pool.
    pub pool: String,
    /// The host it runs on.
    pub host: Arc<str>,
    /// Its priority.
    pub priority: u32,
    /// When it would be preempted.
    pub at_ms: u64,
    /// Why, as the live loop would say it.
    pub reason: String,
    /// Stopped with its gang: another member was chosen (the reason says
    /// which, and why).
    pub gang_mate: bool,
}

/// A job's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobPlanAnswer {
    /// When it was made.
    pub made_at: u64,
    /// Its instances, in order.
    pub instances: Vec<PlannedInstance>,
    /// How long its tasks are expected to run, and why (none: forever or
    /// unknown).
    pub estimate: Option<Estimate>,
    /// Why the forecast stopped.
    pub stopped: Stopped,
    /// The tasks of other jobs the job would preempt, in the order chosen
    /// (see the module's text), at most [`MAX_PLANNED_VICTIMS`].
    pub victims: Vec<PlannedVictim>,
    /// How many in all.
    pub victims_total: usize,
}

/// Victims a plan lists at most (its answer stays far below a message's
/// bound); `victims_total` says how many in all.
pub const MAX_PLANNED_VICTIMS: usize = 1_000;

/// Why an instance has no start.
const BEYOND: &str =
    "not within the forecast: it waits for work with no runtime estimate, or beyond its horizon";
const LIMITED: &str = "held back by the job's running limit (sla.max_running_instances)";
const QUEUE_FULL: &str =
    "its pool's queue (or the server's) is full now: it would be queued once there is room";

impl Lifecycle {
    /// Where and when a job of `plan` would start if submitted now; the
    /// engine and the core are left as they are. Refused as creating the
    /// job would be; daemon and application jobs are not planned.
    pub fn plan_job(
        &self,
        engine: &Engine,
        plan: &JobPlan,
        config: &ForecastConfig,
    ) -> Result<JobPlanAnswer, Error> {
        if matches!(plan.kind, JobKind::Daemon | JobKind::Application) {
            return Err(Error::invalid(
                "spec.type",
                "only batch and service jobs are planned (a daemon runs one instance per matching host; an application's executors follow its driver)",
            ));
        }
        let pool = self.check_new_job(engine, plan)?;
        // A job that would wait for others starts after they end: not
        // foreseen here (the forecast does not know when a job ends as
        // asked), so it is said instead.
        self.check_after("", plan)?;
        if let Some(why) = self.plan_waits(plan) {
            return Ok(JobPlanAnswer {
                made_at: self.now,
                instances: (0..plan.instance_count)
                    .map(|x| PlannedInstance {
                        instance: x,
                        start_ms: None,
                        earliest_ms: None,
                        host: None,
                        position: 0,
                        why_not: Some(why.clone().into()),
                    })
                    .collect(),
                estimate: self.plan_runtime_estimate(plan, 0),
                stopped: Stopped::NoMoreEnds,
                victims: Vec::new(),
                victims_total: 0,
            });
        }
        // The key the job would get: no live job has it.
        let k = JobKey(self.next_key);
        let n = plan.instance_count;
        // As `fill` queues them: gangs of the gang size (the last may be
        // smaller), while the running limit has room; what the engine
        // refuses now (a full queue) waits.
        let room = match plan.max_running {
            0 => u32::MAX,
            m => m,
        };
        let mut sim = engine.fork();
        // Runs already told to stop end first: the live loop waits for
        // them before it chooses victims again.
        for held in self.held.values() {
            if let Some(h) = held.handle {
                let _ = sim.finish(h);
            }
        }
        let gang = plan.gang.max(1);
        let mut handles = Vec::with_capacity(n.min(room) as usize);
        let mut why_rest = LIMITED;
        let mut i = 0;
        while i < n {
            let size = gang.min(n - i);
            if i + size > room {
                break;
            }
            let tasks: Vec<_> = (i..i + size)
                .map(|x| {
                    let runtime_ms = self.plan_runtime_estimate(plan, x).map_or(0, |e| e.ms);
                    new_task_of(engine, plan, plan.template(x), pool, k, x, None, runtime_ms)
                })
                .collect();
            match sim.submit(&tasks) {
                Ok(got) => handles.extend(got),
                Err(_) => {
                    why_rest = QUEUE_FULL;
                    break;
                }
            }
            i += size;
        }
        let mut estimates = self.job_estimates();
        let estimate = self.plan_runtime_estimate(plan, 0);
        if let Some(e) = estimate {
            estimates.insert(k.0, e.ms);
        }
        let f = ForecastRequest {
            sim,
            now_ms: self.now,
            estimates,
            config: ForecastConfig {
                preempt: true,
                ..*config
            },
        }
        .run();
        // The job's doing: evictions for its tasks, and victims over their
        // entitlement until its last instance starts.
        let ours: rustc_hash::FxHashSet<_> = handles.iter().copied().collect();
        let last_start = handles
            .iter()
            .filter_map(|&h| f.get(h).and_then(|t| t.start))
            .map(|s| s.at_ms)
            .max()
            .unwrap_or(self.now);
        // A mate's victim is the last one chosen with that handle before it
        // (listed in the same step; a handle may come back after its task
        // was queued again).
        let mut chosen_by: rustc_hash::FxHashMap<_, &Preemption> = Default::default();
        let mut victims: Vec<PlannedVictim> = Vec::new();
        for v in &f.victims {
            if v.mate_of.is_none() {
                chosen_by.insert(v.task, v);
            }
            let ours_to_list = v.job != k.0
                && match v.for_task {
                    Some(t) => ours.contains(&t),
                    None => v.at_ms <= last_start,
                };
            if !ours_to_list {
                continue;
            }
            let chosen = v.mate_of.and_then(|m| chosen_by.get(&m).copied());
            victims.extend(self.planned_victim(engine, v, chosen));
        }
        let victims_total = victims.len();
        victims.truncate(MAX_PLANNED_VICTIMS);
        let instances = (0..n)
            .map(|x| {
                let Some(t) = handles.get(x as usize).and_then(|&h| f.get(h)) else {
                    return PlannedInstance {
                        instance: x,
                        start_ms: None,
                        earliest_ms: None,
                        host: None,
                        position: 0,
                        why_not: Some(why_rest.into()),
                    };
                };
                PlannedInstance {
                    instance: x,
                    start_ms: t.start.map(|s| s.at_ms),
                    earliest_ms: t.start.map(|s| s.earliest_ms),
                    host: t
                        .start
                        .and_then(|s| self.host_names.get(s.host as usize).cloned()),
                    position: t.position,
                    why_not: t.start.is_none().then_some(BEYOND.into()),
                }
            })
            .collect();
        Ok(JobPlanAnswer {
            made_at: self.now,
            instances,
            estimate,
            stopped: f.stopped,
            victims,
            victims_total,
        })
    }

    /// A forecast's victim as a plan shows it (none if its job is gone);
    /// for a gang mate stopped with it, `chosen` is the member chosen.
    fn planned_victim(
        &self,
        engine: &Engine,
        v: &Preemption,
        chosen: Option<&Preemption>,
    ) -> Option<PlannedVictim> {
        let job = self.jobs.get(&JobKey(v.job))?;
        let host = self.host_names.get(v.host as usize)?.clone();
        let tree = engine.resources().tree();
        let pool = tree
            .lookup_slot(v.pool as usize)
            .map(|p| tree.path(p).to_string())
            .unwrap_or_default();
        // A mate's reason is its chosen member's, on that member's host.
        let why = chosen.unwrap_or(v);
        let reason = match why.reason {
            PreemptReason::HigherPriority { .. } => {
                let on = self.host_names.get(why.host as usize)?;
                format!("preempted: a higher-priority task of its pool needs room on host {on}")
            }
            r => format!("preempted: {r}"),
        };
        let reason = match chosen {
            Some(c) => format!(
                "gang member {} preempted: the gang starts again as one",
                c.instance
            ),
            None => reason,
        };
        Some(PlannedVictim {
            job: job.id.clone(),
            instance: v.instance,
            pool,
            host,
            priority: v.priority,
            at_ms: v.at_ms,
            reason,
            gang_mate: v.mate_of.is_some(),
        })
    }
}
