//! Overcommit on slack: revocable tasks run on what non-revocable tasks are
//! allocated but do not use, and give it back as soon as they need it.
//!
//! After a host's usage report (or when a run leaves it), the core
//! estimates what its non-revocable tasks use — per task, the CPU rate and
//! the larger of memory now and its decayed peak (`usage.rs`); a task not
//! measured yet counts as using all it asked for — and lends the rest, less
//! a safety margin (`OvercommitConfig`, a share of what they are
//! allocated), to revocable tasks: `Engine::set_reclaimable`. The engine
//! adds what hosts lend to the cluster's slack (revocable admission) and
//! places revocable tasks against it (`HostArena::lend`).
//!
//! The QoS controller: when a host's revocable tasks hold more of what it
//! lends than it now lends (its non-revocable tasks' use rose into the
//! room: memory first, then CPU), revocable tasks there are preempted —
//! lowest priority first, youngest first among equals (a run not started
//! yet before any that started) — until what they
//! borrowed fits again, before any non-revocable task is harmed. Runs
//! already stopping, revocable or not, count as given back: their
//! allocations return when their hosts confirm, repaying loans first. Preempted work waits in its queue
//! again, saying why.

use peloton_engine::resources::Dim;
use peloton_engine::{Engine, Resources};

use crate::model::{HostSlot, JobKey, TaskState as S};
use crate::usage::Usage;
use crate::{Effects, Lifecycle};

/// How much of what non-revocable tasks do not use is lent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OvercommitConfig {
    /// Lend anything at all.
    pub enabled: bool,
    /// Kept back from lending: this percentage of the CPU non-revocable
    /// tasks on the host are allocated.
    pub cpu_margin_pct: u8,
    /// Likewise for memory.
    pub memory_margin_pct: u8,
}

impl Default for OvercommitConfig {
    fn default() -> Self {
        OvercommitConfig {
            enabled: true,
            cpu_margin_pct: 10,
            memory_margin_pct: 20,
        }
    }
}

/// What a run asked for and does not use (CPU by its rate; memory by the
/// larger of now and its decayed peak).
fn unused(request: &Resources, used: &Usage) -> Resources {
    let memory_mib = used
        .memory_bytes
        .max(used.memory_peak_bytes)
        .div_ceil(1 << 20);
    Resources::new(
        request[Dim::Cpu].saturating_sub(used.cpu_millis),
        request[Dim::Memory].saturating_sub(memory_mib),
        0,
        0,
    )
}

/// A revocable run on a host, as the QoS controller weighs it.
struct Borrower {
    priority: u32,
    youth: Youth,
    run: (JobKey, u32),
    request: Resources,
}

/// How young a run on a host is, greater being younger: one not started
/// yet (launching) is younger than any that started, then the later start
/// (its host's clock: every run compared is on that host), then the later
/// placement.
type Youth = (bool, u64, u64);

fn youth(t: &crate::model::Task) -> Youth {
    (t.started_at == 0, t.started_at, t.placed_at)
}

/// What the core keeps between a change and the end of its step.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// Hosts that reported usage or that a measured run left: what they
    /// lend is worked out again.
    reported: rustc_hash::FxHashSet<HostSlot>,
}

impl Lifecycle {
    /// A host reported usage, or a measured run left it: what it lends is
    /// worked out again at the end of the step.
    pub(crate) fn overcommit_reported(&mut self, slot: HostSlot) {
        if self.config.overcommit.enabled {
            self.overcommit.reported.insert(slot);
        }
    }

    /// What each changed host lends, and the evictions that return what
    /// was borrowed beyond it.
    pub(crate) fn sync_overcommit(&mut self, engine: &mut Engine, fx: &mut Effects) {
        if self.overcommit.reported.is_empty() {
            return;
        }
        let mut hosts: Vec<HostSlot> = self.overcommit.reported.drain().collect();
        hosts.sort_unstable();
        for slot in hosts {
            let Some(id) = engine.hosts().lookup_slot(slot.idx()) else {
                continue;
            };
            let lends = self.lendable(engine, slot);
            engine
                .set_reclaimable(id, lends)
                .expect("a live host's slot");
            self.take_back(engine, slot, lends, fx);
        }
    }

    /// What the non-revocable tasks on `slot` are allocated and do not
    /// use, less the margin: CPU and memory only.
    fn lendable(&self, engine: &Engine, slot: HostSlot) -> Resources {
        let mut allocated = Resources::ZERO;
        let mut unused = Resources::ZERO;
        for h in engine.tasks().on_host(slot.0) {
            let Ok(spec) = engine.tasks().spec(h) else {
                continue;
            };
            if spec.flags & peloton_engine::task::flags::REVOCABLE != 0 {
                continue;
            }
            allocated.add_assign(&spec.request);
            let Some((k, i)) = self.instance_of(engine, h) else {
                // A run stopping: it holds what it was allocated.
                continue;
            };
            if let Some(u) = self.run_usage(k, i) {
                unused.add_assign(&self::unused(&spec.request, &u));
            }
        }
        let c = &self.config.overcommit;
        let margin = |d: Dim, pct: u8| allocated[d] * u64::from(pct) / 100;
        Resources::new(
            unused[Dim::Cpu].saturating_sub(margin(Dim::Cpu, c.cpu_margin_pct)),
            unused[Dim::Memory].saturating_sub(margin(Dim::Memory, c.memory_margin_pct)),
            0,
            0,
        )
    }

    /// Preempts revocable runs on `slot` until what they borrowed is
    /// within what the host lends (memory first, then CPU).
    fn take_back(
        &mut self,
        engine: &mut Engine,
        slot: HostSlot,
        lends: Resources,
        fx: &mut Effects,
    ) {
        let borrowed = engine.hosts().borrowed(slot.idx());
        let mut over = borrowed.saturating_sub(&lends);
        if over[Dim::Cpu] == 0 && over[Dim::Memory] == 0 {
            return;
        }
        let mut borrowers = Vec::new();
        for h in engine.tasks().on_host(slot.0) {
            let Ok(spec) = engine.tasks().spec(h) else {
                continue;
            };
            let revocable = spec.flags & peloton_engine::task::flags::REVOCABLE != 0;
            match self.instance_of(engine, h) {
                // Stopping already, revocable or not: what it holds comes
                // back when its host confirms, repaying the loan first.
                // (A stopping non-revocable run no longer lends what it
                // did not use, but its use did not rise either.)
                None => over = over.saturating_sub(&spec.request),
                Some(_) if !revocable => {}
                Some(run) => borrowers.push(Borrower {
                    priority: spec.priority,
                    youth: youth(&self.jobs[&run.0].tasks[run.1 as usize]),
                    run,
                    request: spec.request,
                }),
            }
        }
        // Lowest priority first; the youngest first among equals.
        borrowers.sort_by_key(|b| (b.priority, std::cmp::Reverse(b.youth), b.run));
        let host = self.host_names[slot.idx()].clone();
        for dim in [Dim::Memory, Dim::Cpu] {
            for b in &borrowers {
                if over[dim] == 0 {
                    break;
                }
                if b.request[dim] == 0 || !self.is_current_on(b.run, slot) {
                    continue;
                }
                let reason = format!(
                    "preempted: revocable, and host {host}'s non-revocable tasks need the {} \
                     it ran on",
                    if dim == Dim::Memory { "memory" } else { "CPU" }
                );
                let (k, i) = b.run;
                if self.end_run(engine, k, i, S::Preempted, &reason, fx) {
                    self.job_mut(k).tasks[i as usize].gave_way = true;
                    self.restart_after_loss(engine, k, i, fx);
                    over = over.saturating_sub(&b.request);
                }
            }
        }
    }

    fn is_current_on(&self, (k, i): (JobKey, u32), slot: HostSlot) -> bool {
        self.jobs
            .get(&k)
            .and_then(|j| j.tasks.get(i as usize))
            .is_some_and(|t| t.state.on_host() && t.host == Some(slot))
    }
}
