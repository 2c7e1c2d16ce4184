//! Accounting: a ledger of ended runs, what they asked for and what they
//! used (Slurm's `sacct` is the anchor).
//!
//! When a run leaves its host (succeeded, failed, killed, preempted or
//! lost: `transition`), the core appends one [`UsageRecord`]: who and
//! where, its wall time, its exit and final state, the resources it
//! requested and, from its host's last usage report, the CPU time it used
//! and its memory's peak. A run that never reached a host used nothing and
//! gets no record.
//!
//! The ledger is bounded like the audit log (see `access`): by count
//! ([`CoreConfig::max_usage_records`](super::CoreConfig)) and by age
//! ([`CoreConfig::usage_retention_ms`](super::CoreConfig)), the oldest
//! going first. Records have increasing sequence numbers that are never
//! reused; they are persisted as [`StateRow::Usage`] rows and recovered
//! through [`Recovered::usage`](super::Recovered).
//!
//! The runtime learner (`runtime`) learns from each record as it is
//! appended (those of succeeded runs, by their `command_key`), and again
//! from the recovered records at a restart.

use std::collections::VecDeque;
use std::sync::Arc;

use peloton_engine::Resources;
use peloton_engine::resources::Dim;

use super::effects::{Effects, StateRow};
use super::model::{JobKey, TaskState};
use super::{HostSlot, Lifecycle};

/// Usage records kept by default: see
/// [`CoreConfig::max_usage_records`](super::CoreConfig::max_usage_records).
pub const MAX_USAGE_RECORDS: usize = 200_000;

/// How long usage records are kept by default (90 days).
pub const USAGE_RETENTION_MS: u64 = 90 * 24 * 3600 * 1000;

/// One ended run's account.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageRecord {
    /// Increasing, never reused (set by the core).
    pub seq: u64,
    /// When it was recorded (the core's time, ms).
    pub recorded_ms: u64,
    /// The job's id.
    pub job_id: Arc<str>,
    /// The job's name.
    pub job_name: Arc<str>,
    /// The job's pool.
    pub pool: Arc<str>,
    /// The job's owner.
    pub owner: Arc<str>,
    /// The instance.
    pub instance: u32,
    /// The run.
    pub run: u32,
    /// Its host.
    pub host: Arc<str>,
    /// When its process started (0: never).
    pub started_ms: u64,
    /// When it ended.
    pub finished_ms: u64,
    /// How it ended: Succeeded, Failed, Killed, Preempted or Lost.
    pub state: TaskState,
    /// Its exit code.
    pub exit_code: i32,
    /// What it asked for, in engine units (millicores, MiB, MiB,
    /// milli-GPUs).
    pub request: Resources,
    /// CPU time it used, µs, by its host's last report (0: none).
    pub cpu_used_usec: u64,
    /// Its memory's decayed peak by its host's last report, bytes (0:
    /// none).
    pub memory_peak_bytes: u64,
    /// When that last report measured it, by its host's clock (0: never):
    /// the used figures cover the run up to then, up to one report
    /// interval before its end.
    pub used_until_ms: u64,
    /// The key of its task's command (`TaskTemplate::command_key`) for
    /// runs of jobs that run to completion; 0 for services' and daemons'
    /// (they have no run time to learn) and in records stored before
    /// keys were. What the runtime learner learns by (`runtime`).
    pub command_key: u64,
}

impl UsageRecord {
    /// Wall time: from its start to its end (0 if it never started).
    pub fn wall_ms(&self) -> u64 {
        if self.started_ms == 0 {
            return 0;
        }
        self.finished_ms.saturating_sub(self.started_ms)
    }

    /// Requested resource-milliseconds of a dimension: its request (engine
    /// units) × wall ms.
    pub fn requested_unit_ms(&self, dim: Dim) -> u128 {
        u128::from(self.request.0[dim.idx()]) * u128::from(self.wall_ms())
    }

    /// Requested CPU, core-seconds.
    pub fn cpu_requested_core_s(&self) -> f64 {
        self.requested_unit_ms(Dim::Cpu) as f64 / 1e6
    }

    /// Used CPU, core-seconds.
    pub fn cpu_used_core_s(&self) -> f64 {
        self.cpu_used_usec as f64 / 1e6
    }

    /// Requested memory, MiB-seconds.
    pub fn memory_requested_mib_s(&self) -> f64 {
        self.requested_unit_ms(Dim::Memory) as f64 / 1e3
    }

    /// Requested disk, MiB-seconds.
    pub fn disk_requested_mib_s(&self) -> f64 {
        self.requested_unit_ms(Dim::Disk) as f64 / 1e3
    }

    /// Requested GPUs, GPU-seconds.
    pub fn gpu_requested_s(&self) -> f64 {
        self.requested_unit_ms(Dim::Gpu) as f64 / 1e6
    }
}

/// The ledger: records oldest first, by sequence number.
#[derive(Clone, Debug)]
pub struct Ledger {
    records: VecDeque<UsageRecord>,
    next_seq: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            records: VecDeque::new(),
            next_seq: 1,
        }
    }
}

impl Ledger {
    /// Every record, oldest first.
    pub fn records(&self) -> impl DoubleEndedIterator<Item = &UsageRecord> + '_ {
        self.records.iter()
    }

    /// Records after sequence number `after` (exclusive), oldest first.
    pub fn records_after(&self, after: u64) -> impl Iterator<Item = &UsageRecord> + '_ {
        let from = self.records.partition_point(|r| r.seq <= after);
        self.records.range(from..)
    }

    /// A record by sequence number.
    pub fn record(&self, seq: u64) -> Option<&UsageRecord> {
        let i = self.records.binary_search_by_key(&seq, |r| r.seq).ok()?;
        self.records.get(i)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl Lifecycle {
    /// The usage ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Appends the account of instance `i` of job `k`'s current run, which
    /// leaves `slot` in `to` now (called by `transition` before its usage
    /// is forgotten).
    pub(super) fn account_run(
        &mut self,
        k: JobKey,
        i: u32,
        slot: HostSlot,
        to: TaskState,
        fx: &mut Effects,
    ) {
        let job = &self.jobs[&k];
        let t = &job.tasks[i as usize];
        let (cpu_used_usec, memory_peak_bytes, used_until_ms) = self
            .usage
            .run_totals(slot, (k, i), t.launch)
            .unwrap_or((0, 0, 0));
        let finished_ms = match t.finished_at {
            0 => self.now,
            at => at,
        }
        .max(t.started_at);
        let template = job.template(i);
        let record = UsageRecord {
            seq: self.ledger.next_seq,
            recorded_ms: self.now,
            job_id: job.id.clone(),
            job_name: job.plan.name.clone(),
            pool: job.plan.pool.clone(),
            owner: job.plan.owner.clone(),
            instance: i,
            run: t.run,
            host: self.host_names[slot.idx()].clone(),
            started_ms: t.started_at,
            finished_ms,
            state: to,
            exit_code: t.exit_code,
            request: super::runs::engine_request(template),
            cpu_used_usec,
            memory_peak_bytes,
            used_until_ms,
            command_key: if job.plan.kind.keeps_running() {
                0
            } else {
                template.command_key
            },
        };
        self.runtimes.learn_record(&record);
        self.ledger.next_seq += 1;
        fx.state_rows.push(StateRow::Usage(record.seq));
        self.ledger.records.push_back(record);
        self.prune_ledger(fx);
    }

    /// Drops the records beyond the count and past the age.
    pub(super) fn prune_ledger(&mut self, fx: &mut Effects) {
        let max = self.config.max_usage_records;
        let oldest_kept = self.now.saturating_sub(self.config.usage_retention_ms);
        let l = &mut self.ledger;
        while l
            .records
            .front()
            .is_some_and(|r| l.records.len() > max || r.recorded_ms < oldest_kept)
        {
            let old = l.records.pop_front().expect("not empty");
            fx.state_rows.push(StateRow::Usage(old.seq));
        }
    }

    /// When the oldest record is past its age (a [`Input::Tick`](super::Input)
    /// then drops it).
    pub(super) fn ledger_deadline(&self) -> Option<u64> {
        self.ledger
            .records
            .front()
            .map(|r| r.recorded_ms.saturating_add(self.config.usage_retention_ms))
    }

    /// Usage records as stored (those beyond the bounds go, and their
    /// rows); the runtime learner learns again from those kept, oldest
    /// first, as it did when they were appended.
    pub(super) fn recover_ledger(&mut self, mut records: Vec<UsageRecord>, fx: &mut Effects) {
        records.sort_unstable_by_key(|r| r.seq);
        records.dedup_by_key(|r| r.seq);
        self.ledger.next_seq = records.last().map_or(1, |r| r.seq + 1).max(1);
        self.ledger.records = records.into();
        self.prune_ledger(fx);
        for r in &self.ledger.records {
            self.runtimes.learn_record(r);
        }
    }

    /// The ledger's invariants: bounded, in sequence order below the next
    /// number; and the runtime learner's (bounded).
    pub(super) fn check_ledger_invariants(&self) {
        self.runtimes.check_invariants();
        let l = &self.ledger;
        assert!(
            l.records.len() <= self.config.max_usage_records,
            "the usage ledger is bounded"
        );
        // (Appends keep the order; the newest pair is checked every step.)
        let n = l.records.len();
        if n >= 2 {
            assert!(
                l.records[n - 2].seq < l.records[n - 1].seq,
                "the usage ledger is in sequence order"
            );
        }
        assert!(
            l.next_seq >= 1 && l.records.back().is_none_or(|r| r.seq < l.next_seq),
            "usage sequence numbers start at 1 and are never reused"
        );
    }
}
