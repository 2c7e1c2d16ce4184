//! Measured usage: what runs use, beside what the engine allocates them.
//!
//! Agents report every live run's cumulative CPU time and its memory now
//! ([`UsageReport`], one per host, every few seconds). The core keeps, per
//! *current* run on its host: the CPU rate between its last two readings
//! (CPU µs over the agent's ms between them is millicores), its memory, a
//! decayed peak of it, and its disk; per host the sums of its runs. Reads
//! show them next to allocations, and later uses (slack for revocable
//! tasks, a QoS controller, accounting) build on [`Usage`].
//!
//! Usage is soft state: nothing here is stored, no report writes a row,
//! marks a job dirty or makes an event. After a restart it is empty until
//! the agents report again. It is bounded by what runs: a report replaces
//! its host's runs (an agent lists every live run), runs of other launches,
//! ended runs and unknown jobs are ignored, and a run is forgotten when it
//! leaves its host (`forget_run`, from `transition`).

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::{AgentRunKey, HostSlot, JobKey, LaunchId};

/// The decayed peak falls halfway back to the memory now every this long
/// (three default report intervals: a peak stays visible for about a
/// minute).
pub const PEAK_HALF_LIFE_MS: u64 = 30_000;

/// What an agent measured of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunUsage {
    /// Which run.
    pub key: AgentRunKey,
    /// CPU time used since it started, µs (cumulative).
    pub cpu_usec: u64,
    /// Memory held now, bytes.
    pub memory_bytes: u64,
    /// Bytes in its sandbox (0: not measured).
    pub disk_bytes: u64,
}

/// One host's usage report: every live run it has, measured at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageReport {
    /// The host.
    pub host: Arc<str>,
    /// When it was measured, by the agent's clock (ms): rates are taken
    /// over the agent's time between readings, not over delivery delays.
    pub time_ms: u64,
    /// Its runs.
    pub runs: Vec<RunUsage>,
}

/// Smoothed usage of a run, a host or a job, as reads show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Cores in use, in millicores (the engine's CPU unit): CPU time
    /// between the last two readings over the time between them; after
    /// the first reading, its CPU time over the time since the run started
    /// (0 if that is unknown).
    pub cpu_millis: u64,
    /// Memory now, bytes.
    pub memory_bytes: u64,
    /// Memory's decayed peak, bytes (see [`decayed_peak`]).
    pub memory_peak_bytes: u64,
    /// Disk, bytes (0: not measured).
    pub disk_bytes: u64,
    /// When the latest report it comes from was received (the core's
    /// time, ms).
    pub reported_at: u64,
}

impl Usage {
    /// Sums; the later report time.
    pub fn add(&mut self, other: &Usage) {
        self.cpu_millis = self.cpu_millis.saturating_add(other.cpu_millis);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
        self.memory_peak_bytes = self
            .memory_peak_bytes
            .saturating_add(other.memory_peak_bytes);
        self.disk_bytes = self.disk_bytes.saturating_add(other.disk_bytes);
        self.reported_at = self.reported_at.max(other.reported_at);
    }
}

/// A peak that rises with `memory` at once and otherwise falls halfway
/// back towards it every [`PEAK_HALF_LIFE_MS`], over `elapsed_ms` since
/// `peak` was last worked out.
pub fn decayed_peak(peak: u64, memory: u64, elapsed_ms: u64) -> u64 {
    if memory >= peak {
        return memory;
    }
    let halvings = elapsed_ms as f64 / PEAK_HALF_LIFE_MS as f64;
    let above = (peak - memory) as f64 * (-halvings).exp2();
    memory.saturating_add(above as u64)
}

/// Millicores used between two cumulative readings: CPU µs over ms. A
/// reading that went back (a process left the tree with its time) or no
/// time between them gives none.
pub fn cpu_millis(cpu_usec_before: u64, cpu_usec_now: u64, elapsed_ms: u64) -> Option<u64> {
    if elapsed_ms == 0 {
        return None;
    }
    Some(cpu_usec_now.saturating_sub(cpu_usec_before) / elapsed_ms)
}

/// One run's last reading and what it gave.
#[derive(Clone, Debug)]
struct RunState {
    launch: LaunchId,
    /// The cumulative CPU time and agent time of the last reading.
    cpu_usec: u64,
    time_ms: u64,
    usage: Usage,
}

/// One host's runs and their sums.
#[derive(Clone, Debug, Default)]
struct HostState {
    /// The host's name when it reported (a slot taken by another host
    /// shows nothing until that one reports).
    name: Arc<str>,
    runs: FxHashMap<(JobKey, u32), RunState>,
    total: Usage,
    /// The agent time of the last report (for the host's own peak).
    time_ms: u64,
}

impl HostState {
    fn sum(&mut self) {
        let peak = self.total.memory_peak_bytes;
        let mut total = Usage::default();
        for run in self.runs.values() {
            total.add(&run.usage);
        }
        // The host's peak is its memory's own decayed peak, not the sum
        // of its runs' (their peaks need not coincide).
        total.memory_peak_bytes = peak;
        self.total = total;
    }
}

/// Usage of current runs by host (see the module's documentation).
#[derive(Clone, Debug, Default)]
pub(crate) struct UsageTable {
    hosts: FxHashMap<HostSlot, HostState>,
}

/// A run of a report that the core knows as current.
pub(crate) struct Current {
    pub(crate) run: (JobKey, u32),
    pub(crate) launch: LaunchId,
    /// When the run started, by its host's clock (0: unknown).
    pub(crate) started_ms: u64,
    pub(crate) usage: RunUsage,
}

impl UsageTable {
    /// Applies a host's report, its runs already checked to be current
    /// there; received at `now`.
    pub(crate) fn apply(
        &mut self,
        slot: HostSlot,
        name: &Arc<str>,
        time_ms: u64,
        runs: Vec<Current>,
        now: u64,
    ) {
        let host = self.hosts.entry(slot).or_default();
        if host.name != *name {
            *host = HostState {
                name: name.clone(),
                ..HostState::default()
            };
        }
        let elapsed_host = time_ms.saturating_sub(host.time_ms);
        let mut before = std::mem::take(&mut host.runs);
        for current in runs {
            let u = &current.usage;
            let previous = before
                .remove(&current.run)
                .filter(|p| p.launch == current.launch && p.time_ms <= time_ms);
            let usage = match previous {
                Some(p) => {
                    let elapsed = time_ms - p.time_ms;
                    Usage {
                        cpu_millis: cpu_millis(p.cpu_usec, u.cpu_usec, elapsed)
                            .unwrap_or(p.usage.cpu_millis),
                        memory_bytes: u.memory_bytes,
                        memory_peak_bytes: decayed_peak(
                            p.usage.memory_peak_bytes,
                            u.memory_bytes,
                            elapsed,
                        ),
                        disk_bytes: u.disk_bytes,
                        reported_at: now,
                    }
                }
                None => Usage {
                    // The average since it started: its host's clock both.
                    cpu_millis: match current.started_ms {
                        0 => None,
                        started => cpu_millis(0, u.cpu_usec, time_ms.saturating_sub(started)),
                    }
                    .unwrap_or(0),
                    memory_bytes: u.memory_bytes,
                    memory_peak_bytes: u.memory_bytes,
                    disk_bytes: u.disk_bytes,
                    reported_at: now,
                },
            };
            host.runs.insert(
                current.run,
                RunState {
                    launch: current.launch,
                    cpu_usec: u.cpu_usec,
                    time_ms,
                    usage,
                },
            );
        }
        host.sum();
        host.total.memory_peak_bytes = decayed_peak(
            host.total.memory_peak_bytes,
            host.total.memory_bytes,
            elapsed_host,
        );
        host.total.reported_at = now;
        host.time_ms = time_ms;
    }

    /// The run left its host: its usage no longer counts there.
    /// Returns what it used, if it was measured.
    pub(crate) fn forget_run(&mut self, slot: HostSlot, run: (JobKey, u32)) -> Option<Usage> {
        let host = self.hosts.get_mut(&slot)?;
        let gone = host.runs.remove(&run)?;
        host.sum();
        Some(gone.usage)
    }

    /// A run's usage, if `launch` on `slot` is what was reported.
    pub(crate) fn run(
        &self,
        slot: HostSlot,
        run: (JobKey, u32),
        launch: LaunchId,
    ) -> Option<Usage> {
        let r = self.hosts.get(&slot)?.runs.get(&run)?;
        (r.launch == launch).then_some(r.usage)
    }

    /// A run's cumulative CPU µs, memory peak bytes and the (agent's)
    /// time of its last reading, if `launch` on `slot` is what was reported
    /// (for its account when it ends).
    pub(crate) fn run_totals(
        &self,
        slot: HostSlot,
        run: (JobKey, u32),
        launch: LaunchId,
    ) -> Option<(u64, u64, u64)> {
        let r = self.hosts.get(&slot)?.runs.get(&run)?;
        (r.launch == launch).then_some((r.cpu_usec, r.usage.memory_peak_bytes, r.time_ms))
    }

    /// A host's sums, if `name` has reported on `slot`.
    pub(crate) fn host(&self, slot: HostSlot, name: &str) -> Option<Usage> {
        let host = self.hosts.get(&slot)?;
        (*host.name == *name).then_some(host.total)
    }

    /// Every run kept, by host: (slot, run, launch).
    fn entries(&self) -> impl Iterator<Item = (HostSlot, (JobKey, u32), LaunchId)> + '_ {
        self.hosts
            .iter()
            .flat_map(|(&slot, h)| h.runs.iter().map(move |(&run, r)| (slot, run, r.launch)))
    }

    /// Every run kept and its usage.
    fn usages(&self) -> impl Iterator<Item = ((JobKey, u32), &Usage)> + '_ {
        self.hosts
            .values()
            .flat_map(|h| h.runs.iter().map(|(&run, r)| (run, &r.usage)))
    }
}

impl crate::Lifecycle {
    /// Applies a host's usage report: its current runs' readings are kept,
    /// the rest ignored (see the module's documentation).
    pub(super) fn apply_usage(&mut self, engine: &peloton_engine::Engine, report: UsageReport) {
        let Some(id) = engine.hosts().lookup(&report.host) else {
            return;
        };
        let slot = HostSlot(id.idx() as u32);
        // A report's runs come grouped by job: the job's key is looked up
        // once per job, not once per run.
        let mut last: Option<(Arc<str>, JobKey)> = None;
        let runs: Vec<Current> = report
            .runs
            .into_iter()
            .filter_map(|usage| {
                let k = match &last {
                    Some((id, k))
                        if Arc::ptr_eq(id, &usage.key.job_id) || **id == *usage.key.job_id =>
                    {
                        *k
                    }
                    _ => {
                        let k = *self.by_id.get(&*usage.key.job_id)?;
                        last = Some((usage.key.job_id.clone(), k));
                        k
                    }
                };
                let i = usage.key.instance;
                let t = self.jobs.get(&k)?.tasks.get(i as usize)?;
                let launch = LaunchId(usage.key.launch);
                let current = t.launch == launch && t.state.on_host() && t.host == Some(slot);
                current.then_some(Current {
                    run: (k, i),
                    launch,
                    started_ms: t.started_at,
                    usage,
                })
            })
            .collect();
        self.usage
            .apply(slot, &report.host, report.time_ms, runs, self.now);
        self.overcommit_reported(slot);
    }

    /// Usage is kept only for current runs, on their hosts (so it is
    /// bounded by what runs), and each host's sums are its runs'.
    pub(super) fn check_usage(&self) {
        for (slot, (k, i), launch) in self.usage.entries() {
            let t = self.jobs.get(&k).and_then(|j| j.tasks.get(i as usize));
            assert!(
                t.is_some_and(|t| t.launch == launch && t.state.on_host() && t.host == Some(slot)),
                "usage kept for {k:?}/{i} launch {launch:?} on {slot:?}, not a current run there"
            );
        }
        for host in self.usage.hosts.values() {
            let mut sum = Usage::default();
            for r in host.runs.values() {
                sum.add(&r.usage);
            }
            assert_eq!(
                (sum.cpu_millis, sum.memory_bytes, sum.disk_bytes),
                (
                    host.total.cpu_millis,
                    host.total.memory_bytes,
                    host.total.disk_bytes
                ),
                "{}'s usage is the sum of its runs'",
                host.name
            );
        }
    }

    /// What instance `i` of job `k`'s current run uses, once its host
    /// reported it.
    pub fn run_usage(&self, k: JobKey, i: u32) -> Option<Usage> {
        let t = self.jobs.get(&k)?.tasks.get(i as usize)?;
        if !t.state.on_host() {
            return None;
        }
        self.usage.run(t.host?, (k, i), t.launch)
    }

    /// What a host's current runs use, once it reported.
    pub fn host_usage(&self, slot: HostSlot) -> Option<Usage> {
        let name = self.host_names.get(slot.idx())?;
        self.usage.host(slot, name)
    }

    /// What the current runs of each pool's jobs use (the pools the jobs
    /// are in, not their parents), for the pools with any reported: one
    /// pass over the runs with usage.
    pub fn usage_by_pool(&self) -> FxHashMap<peloton_engine::PoolId, Usage> {
        let mut out: FxHashMap<peloton_engine::PoolId, Usage> = FxHashMap::default();
        // Only current runs are kept (`check_usage`). A host's runs come
        // grouped by job more often than not: its pool is looked up once
        // per run of another job.
        let mut last: Option<(JobKey, peloton_engine::PoolId)> = None;
        for ((k, _), usage) in self.usage.usages() {
            let pool = match last {
                Some((lk, pool)) if lk == k => pool,
                _ => match self.jobs.get(&k) {
                    Some(job) => {
                        last = Some((k, job.pool));
                        job.pool
                    }
                    None => continue,
                },
            };
            out.entry(pool).or_default().add(usage);
        }
        out
    }

    /// What a job's current runs use (their sums), if any was reported.
    pub fn job_usage(&self, k: JobKey) -> Option<Usage> {
        let job = self.jobs.get(&k)?;
        let mut total: Option<Usage> = None;
        for i in 0..job.tasks.len() as u32 {
            if let Some(u) = self.run_usage(k, i) {
                total.get_or_insert_with(Usage::default).add(&u);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_rises_at_once_and_halves_its_excess_every_half_life() {
        assert_eq!(decayed_peak(100, 300, 0), 300);
        assert_eq!(decayed_peak(300, 100, 0), 300);
        assert_eq!(decayed_peak(300, 100, PEAK_HALF_LIFE_MS), 200);
        assert_eq!(decayed_peak(300, 100, 2 * PEAK_HALF_LIFE_MS), 150);
        // Never below the memory now.
        assert_eq!(decayed_peak(300, 100, 1000 * PEAK_HALF_LIFE_MS), 100);
    }

    #[test]
    fn cpu_rate_is_usec_over_ms() {
        // One core for 10 s.
        assert_eq!(cpu_millis(0, 10_000_000, 10_000), Some(1000));
        // A quarter core.
        assert_eq!(cpu_millis(1_000_000, 3_500_000, 10_000), Some(250));
        // Time that went back counts as none used.
        assert_eq!(cpu_millis(5_000_000, 4_000_000, 10_000), Some(0));
        assert_eq!(cpu_millis(0, 1, 0), None);
    }
}
