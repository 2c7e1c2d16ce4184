//! Preemption in a forecast's fork ([`super::ForecastConfig::preempt`]):
//! the victims of a cycle are acted on as the live loop acts on them
//! (`gateway/lifecycle`'s cycle), only at once — a kill the live loop
//! waits for a host to confirm ends here in the step that chose it.
//!
//! - Inter-pool victims (the cycle's report) end; only if there were none
//!   and tasks found no host do admitted tasks evict lower-priority
//!   preemptible tasks of their own pool ([`Engine::eviction_plans`]).
//! - A victim's gang ends with it (its other members are not chosen but
//!   preempted with it, as the live loop does; the running ones are
//!   listed after the victims, each with the victim it goes with), and
//!   every ended task is queued again in its pool with
//!   the spec it had, each gang as one entry, in (job, instance) order: a
//!   preempted run starts again, as the live loop's restart does.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::admission::TaskFlags;
use crate::engine::{Engine, NewTask};
use crate::preemption::{PreemptReason, Victim};
use crate::task::{NO_GANG, NO_HOST, TaskHandle, TaskSpec, TaskState, flags};

/// A task a forecast preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preemption {
    /// When: the time of the step whose cycle chose it.
    pub at_ms: u64,
    /// The task: the live engine's own handle if it was running when the
    /// forecast began (else one of the fork's, gone after the forecast).
    pub task: TaskHandle,
    /// Its job number and instance.
    pub job: u32,
    /// Its instance.
    pub instance: u32,
    /// Its pool slot.
    pub pool: u32,
    /// The host slot it ran on.
    pub host: u32,
    /// Its priority.
    pub priority: u32,
    /// Why it was chosen.
    pub reason: PreemptReason,
    /// For an eviction within its pool: the admitted task it makes room
    /// for (a handle of the fork's, or of the live engine's for a task
    /// that waited when the forecast began). None for a victim over its
    /// pool's entitlement. A gang mate has its victim's.
    pub for_task: Option<TaskHandle>,
    /// For a running member of a victim's gang, stopped with it (it was
    /// not chosen itself): the victim. None for a victim.
    pub mate_of: Option<TaskHandle>,
}

/// Acts on the victims of the cycle `sim` just ran at `at_ms` (see the
/// module's text): records them in `out`, ends them (and the rest of
/// their gangs) and queues them again. The handles of the ended tasks go
/// to `gone` (their estimated ends are stale). Returns how many victims
/// there were.
pub(super) fn act_on_victims(
    sim: &mut Engine,
    at_ms: u64,
    out: &mut Vec<Preemption>,
    gone: &mut FxHashSet<TaskHandle>,
) -> usize {
    let mut victims: Vec<(Victim, Option<TaskHandle>)> =
        sim.report().victims.iter().map(|&v| (v, None)).collect();
    if victims.is_empty() && !sim.report().placement.unplaced.is_empty() {
        let mut plans = Vec::new();
        sim.eviction_plans(&mut plans);
        victims.extend(
            plans
                .into_iter()
                .flat_map(|(for_task, _, v)| v.into_iter().map(move |v| (v, Some(for_task)))),
        );
    }
    let mut ending: Vec<TaskHandle> = Vec::new();
    let mut seen: FxHashSet<TaskHandle> = FxHashSet::default();
    // Each gang with a victim: its first victim, and what that was for.
    let mut gangs: FxHashMap<u32, (usize, Option<TaskHandle>)> = FxHashMap::default();
    for &(ref v, for_task) in &victims {
        let tasks = sim.tasks();
        if tasks.state(v.task) != Ok(TaskState::Placed) || !seen.insert(v.task) {
            continue;
        }
        let spec = tasks.spec(v.task).expect("placed is live");
        let host = tasks.placed_view(v.task).expect("placed is live").host;
        out.push(Preemption {
            at_ms,
            task: v.task,
            job: spec.job,
            instance: spec.instance,
            pool: spec.pool,
            host,
            priority: spec.priority,
            reason: v.reason,
            for_task,
            mate_of: None,
        });
        ending.push(v.task);
        if spec.gang != NO_GANG {
            gangs.entry(spec.gang).or_insert((out.len() - 1, for_task));
        }
    }
    if ending.is_empty() {
        return 0;
    }
    let n_victims = ending.len();
    if !gangs.is_empty() {
        // Gangs have no index by id: one scan, only in steps that preempt
        // a gang member.
        let tasks = sim.tasks();
        let mates: Vec<(TaskHandle, TaskState)> = tasks
            .all()
            .filter(|&(h, state)| {
                state != TaskState::Pending
                    && !seen.contains(&h)
                    && tasks.spec(h).is_ok_and(|s| gangs.contains_key(&s.gang))
            })
            .collect();
        let mut stopped = Vec::new();
        for &(h, state) in &mates {
            ending.push(h);
            if state != TaskState::Placed {
                continue;
            }
            let spec = tasks.spec(h).expect("a mate is live");
            let (victim, for_task) = gangs[&spec.gang];
            let victim = out[victim];
            stopped.push(Preemption {
                at_ms,
                task: h,
                job: spec.job,
                instance: spec.instance,
                pool: spec.pool,
                host: tasks.placed_view(h).expect("placed is live").host,
                priority: spec.priority,
                reason: victim.reason,
                for_task,
                mate_of: Some(victim.task),
            });
        }
        stopped.sort_by_key(|p| (p.job, p.instance));
        out.extend(stopped);
    }
    // Queued again as they were queued: one entry per gang (a single task
    // is its own), in (job, instance) order.
    let mut again: FxHashMap<(u32, u32), Vec<NewTask>> = FxHashMap::default();
    for &h in &ending {
        let spec = sim.tasks().spec(h).expect("ending is live");
        let task = new_task_of(sim, &spec);
        let key = match spec.gang {
            NO_GANG => (u32::MAX, h.idx() as u32),
            g => (spec.job, g),
        };
        again.entry(key).or_default().push(task);
        sim.finish(h).expect("a victim ends once");
        gone.insert(h);
    }
    let mut again: Vec<Vec<NewTask>> = again.into_values().collect();
    for g in &mut again {
        g.sort_by_key(|t| t.instance);
    }
    again.sort_by_key(|g| (g[0].job, g[0].instance));
    for g in &again {
        // A full queue refuses it: the live loop would queue it once there
        // is room, the forecast does not.
        let _ = sim.submit(g);
    }
    n_victims
}

/// The task to queue again for `spec`, as it was submitted.
fn new_task_of(sim: &Engine, spec: &TaskSpec) -> NewTask {
    NewTask {
        job: spec.job,
        instance: spec.instance,
        pool: sim
            .resources()
            .tree()
            .lookup_slot(spec.pool as usize)
            .expect("a task's pool is live"),
        priority: spec.priority,
        request: spec.request,
        ports: spec.ports,
        flags: TaskFlags {
            preemptible: spec.flags & flags::PREEMPTIBLE != 0,
            controller: spec.flags & flags::CONTROLLER != 0,
            revocable: spec.flags & flags::REVOCABLE != 0,
        },
        constraint: sim
            .constraints()
            .text(spec.constraint)
            .unwrap_or_default()
            .to_owned(),
        strategy: spec.strategy,
        max_per_host: spec.max_per_host,
        limit_key: spec.limit_key,
        desired_host: match spec.desired_host {
            NO_HOST => None,
            slot => sim.hosts().lookup_slot(slot as usize),
        },
        daemon: spec.flags & flags::DAEMON != 0,
        runtime_ms: spec.runtime_ms,
    }
}
