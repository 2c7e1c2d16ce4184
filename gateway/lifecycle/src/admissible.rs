//! Work that can never be admitted in its pool is refused when it is
//! submitted (job creation, scale up, update), with why: queued, it would
//! sit at the head of its queue and block everything behind it. The rule is
//! the engine's (`never_admitted`: the admission rules at the largest
//! entitlement the pool could ever get); a task that no host of the cluster
//! could hold, even empty, is refused too (when the cluster has hosts).

use peloton_engine::admission::{Ceiling, NeverAdmitted, TaskFlags};
use peloton_engine::{Dim, Engine, PoolId, Resources};

use super::model::{JobKind, JobPlan, TaskTemplate};
use super::runs::engine_request;
use super::units::{amount, field};
use super::{Error, Lifecycle};

/// The flags every task of a plan is queued with.
fn flags(plan: &JobPlan, t: &TaskTemplate) -> TaskFlags {
    TaskFlags {
        preemptible: plan.preemptible,
        controller: t.controller,
        revocable: t.revocable,
    }
}

/// Why work summing to `total` can never be admitted in `pool`, in words
/// (the API's units), or `None`.
pub fn never_admitted_reason(
    engine: &Engine,
    pool: PoolId,
    flags: TaskFlags,
    total: &Resources,
) -> Option<String> {
    never(engine, pool, flags, total).map(|(_, why)| why)
}

/// The dimension over the ceiling, and why in words.
fn never(
    engine: &Engine,
    pool: PoolId,
    flags: TaskFlags,
    total: &Resources,
) -> Option<(Dim, String)> {
    let never = engine
        .resources()
        .never_admitted(pool, flags, total)
        .ok()
        .flatten()?;
    Some((never.dim, describe(engine, &never)))
}

/// "pool /a's reservation of cpu is 2 cores (non-preemptible work …)".
fn describe(engine: &Engine, n: &NeverAdmitted) -> String {
    let path = engine.resources().tree().path(n.pool);
    let hint = match n.ceiling {
        Ceiling::Reservation => {
            "non-preemptible work runs only within its pool's reservation: raise it, or make the job preemptible (sla.preemptible)"
        }
        Ceiling::Limit => "raise the limit, or ask for less",
        Ceiling::StaticReservation => {
            "a STATIC pool is entitled to exactly its reservation: raise it, or ask for less"
        }
        Ceiling::SlackLimit => {
            "revocable work may hold at most its pool's limit and slack_limit_pct of its parent's slack"
        }
    };
    format!(
        "pool {path}'s {} of {} is {} ({hint})",
        n.ceiling.describe(),
        n.dim,
        amount(n.dim, n.cap)
    )
}

impl Lifecycle {
    /// Refuses a plan whose tasks or gangs (of instances `0..count`) could
    /// never be admitted in `pool`, or whose tasks no host could hold.
    pub(super) fn check_admissible(
        &self,
        engine: &Engine,
        pool: PoolId,
        plan: &JobPlan,
        count: u32,
    ) -> Result<(), Error> {
        // A daemon's instances are all alike (and it may have none yet).
        let count = match (plan.kind, plan.app) {
            (JobKind::Daemon, _) => 1,
            // An application's executor (the default task) is checked
            // before any runs: a target must never ask for what can never
            // be admitted.
            (JobKind::Application, Some(app)) => count.max(app.first_executor() + 1),
            _ => count,
        };
        // Each distinct template in use, with the field it came from.
        let mut templates: Vec<(String, &TaskTemplate)> = Vec::new();
        if (plan.overrides.len() as u32) < count {
            templates.push(("spec.default_task".into(), &plan.default));
        }
        let mut overridden: Vec<_> = plan.overrides.iter().filter(|(i, _)| **i < count).collect();
        overridden.sort_unstable_by_key(|(i, _)| **i);
        for (i, t) in overridden {
            templates.push((format!("spec.overrides[instance {i}].spec"), t));
        }
        for (at, t) in &templates {
            let request = engine_request(t);
            if plan.gang <= 1
                && let Some((d, never)) = never(engine, pool, flags(plan, t), &request)
            {
                return Err(Error::invalid(
                    &format!("{at}.resources.{}", field(d)),
                    format!(
                        "each task needs {}{}, and could never be admitted: {never}",
                        amount(d, request[d]),
                        volume_note(t, d)
                    ),
                ));
            }
            if !engine.hosts().is_empty()
                && let Err(largest) = engine.hosts().any_capacity_holds(&request)
            {
                let d = Dim::ALL
                    .into_iter()
                    .find(|&d| request[d] > largest[d])
                    .unwrap_or(Dim::Cpu);
                let wanted: Vec<String> = Dim::ALL
                    .into_iter()
                    .filter(|&d| request[d] > 0)
                    .map(|d| format!("{d} {}", amount(d, request[d])))
                    .collect();
                let most: Vec<String> = Dim::ALL
                    .into_iter()
                    .filter(|&d| request[d] > 0)
                    .map(|d| format!("{d} {}", amount(d, largest[d])))
                    .collect();
                return Err(Error::invalid(
                    &format!("{at}.resources.{}", field(d)),
                    format!(
                        "no host of the cluster could ever hold a task of {}{} (the largest capacities are {})",
                        wanted.join(", "),
                        volume_note(t, d),
                        most.join(", ")
                    ),
                ));
            }
        }
        if plan.gang > 1 {
            // Gangs are queued from the waiting instances in order, so
            // instances 0..gang, gang..2·gang, … (with overrides, each).
            let gang = plan.gang;
            let starts: Box<dyn Iterator<Item = u32>> = if plan.overrides.is_empty() {
                Box::new(std::iter::once(0))
            } else {
                Box::new((0..count).step_by(gang as usize))
            };
            for start in starts {
                let members = start..(start + gang).min(count);
                let n = members.len();
                let mut total = Resources::ZERO;
                for i in members {
                    total = total.saturating_add(&engine_request(plan.template(i)));
                }
                let f = flags(plan, &plan.default);
                if let Some((d, never)) = never(engine, pool, f, &total) {
                    return Err(Error::invalid(
                        "spec.sla.min_running_instances",
                        format!(
                            "a gang of {n} tasks (instances {start}–{}) needs {} in all, and could never be admitted (or use smaller gangs): {never}",
                            start + n as u32 - 1,
                            amount(d, total[d]),
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn volume_note(t: &TaskTemplate, d: Dim) -> String {
    match &t.volume {
        Some(v) if d == Dim::Disk => format!(" (its volume's {} MiB included)", v.size_mb),
        _ => String::new(),
    }
}
