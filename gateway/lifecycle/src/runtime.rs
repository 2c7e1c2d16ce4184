//! Runtime estimates: how long a task's run is expected to last, and where
//! that figure comes from (the forecast's input; Slurm's time limit and
//! LSF's runtime estimate are the anchors).
//!
//! In order ([`Lifecycle::runtime_estimate`]):
//! 1. **declared**: the task's `expected_runtime_ms` (its spec, per
//!    instance like every task field);
//! 2. **learned**: from earlier runs that succeeded of the same owner's
//!    same command, once [`MIN_LEARNED_SAMPLES`] were seen;
//! 3. the job's **max running time** (a run is stopped then);
//! 4. none: unknown, and always for services and daemons (they run until
//!    stopped).
//!
//! A declared or learned figure above the job's max running time is cut to
//! it: no run lasts longer.
//!
//! The learner ([`RuntimeEstimator`]) is keyed by [`runtime_key`]: the
//! job's owner and the task's command key (the shell's stable hash of its
//! command, arguments or shell line: the core never sees them). Per key it
//! keeps the wall times (start of running to end) of the last
//! [`RUNTIME_WINDOW`] succeeded runs in a ring and their 90th percentile
//! (nearest rank): a high quantile, so that a forecast is rarely early, and
//! a window, so that old runs stop counting — the decay is by count, not
//! by time, which suits jobs that run seldom as well as often. Failed,
//! killed, preempted and lost runs say nothing of how long the work takes
//! and are not counted. At most [`MAX_RUNTIME_KEYS`] keys are kept; the
//! least recently updated goes first.
//!
//! It learns from the usage ledger's records (`accounting`) as they are
//! appended, and is rebuilt from the stored ledger at recovery: what it
//! knows after a restart is what the ledger's bounded records say (the
//! newest `max_usage_records`, within `usage_retention_ms`).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::Lifecycle;
use super::accounting::UsageRecord;
use super::model::{JobKey, TaskState};

/// Keys (owner, command) the learner keeps at most; the least recently
/// updated goes first. 10,000 keys take about 3 MB.
pub const MAX_RUNTIME_KEYS: usize = 10_000;

/// Succeeded runs per key whose wall times make the quantile.
pub const RUNTIME_WINDOW: usize = 32;

/// Runs a key must have learned from before its estimate is used.
pub const MIN_LEARNED_SAMPLES: u32 = 3;

/// The quantile of the window a learned estimate is, in percent.
pub const RUNTIME_QUANTILE_PCT: usize = 90;

/// Where an estimate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EstimateSource {
    /// The task's `expected_runtime_ms`.
    Declared,
    /// Earlier succeeded runs of the same owner's same command.
    Learned {
        /// Runs learned from (all of them; the quantile is over the last
        /// [`RUNTIME_WINDOW`]).
        samples: u32,
    },
    /// The job's run time limit.
    MaxRunningTime,
}

impl EstimateSource {
    /// In words, as reads show it: "declared", "learned from N runs",
    /// "max running time".
    pub fn describe(self) -> String {
        match self {
            EstimateSource::Declared => "declared".into(),
            EstimateSource::Learned { samples } => format!("learned from {samples} runs"),
            EstimateSource::MaxRunningTime => "max running time".into(),
        }
    }
}

/// How long a run of a task is expected to last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Wall time, ms, from the start of running to the end.
    pub ms: u64,
    /// Where the figure comes from.
    pub source: EstimateSource,
}

/// FNV-1a, 64 bits: stable across builds and versions (keys are stored in
/// usage records), unlike the standard library's hasher.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(mut self, bytes: &[u8]) -> Self {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }

    /// A part, length first (so that ("ab", "c") and ("a", "bc") differ).
    fn part(self, part: &[u8]) -> Self {
        self.bytes(&(part.len() as u64).to_le_bytes()).bytes(part)
    }

    /// Never 0 (0 means "no key").
    fn finish(self) -> u64 {
        self.0.max(1)
    }
}

/// The key of a task's command: a stable hash of its parts (the command
/// and its arguments, or its shell line), never 0. The shell computes it
/// (`TaskTemplate::command_key`); the core only compares it.
pub fn command_key<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    parts
        .into_iter()
        .fold(Fnv::new(), |h, p| h.part(p.as_bytes()))
        .finish()
}

/// The learner's key of an owner's command (`command_key` 0: none).
pub fn runtime_key(owner: &str, command_key: u64) -> Option<u64> {
    (command_key != 0).then(|| {
        Fnv::new()
            .part(owner.as_bytes())
            .bytes(&command_key.to_le_bytes())
            .finish()
    })
}

/// What the learner keeps of one key.
#[derive(Clone, Debug)]
struct Learned {
    /// The last wall times, ms (the first `min(samples, window)` slots).
    ring: [u64; RUNTIME_WINDOW],
    /// Where the next one goes.
    next: u8,
    /// Runs learned from (saturating).
    samples: u32,
    /// The window's quantile, kept up to date (reads are many, learning
    /// is once per run).
    quantile_ms: u64,
    /// When it was last updated (the learner's counter).
    updated: u64,
}

impl Learned {
    fn window(&self) -> &[u64] {
        let n = (self.samples as usize).min(RUNTIME_WINDOW);
        &self.ring[..n]
    }
}

/// The [`RUNTIME_QUANTILE_PCT`] quantile (nearest rank) of `values` (1 to
/// [`RUNTIME_WINDOW`] of them).
fn quantile(values: &[u64]) -> u64 {
    let mut copy = [0u64; RUNTIME_WINDOW];
    let sorted = &mut copy[..values.len()];
    sorted.copy_from_slice(values);
    sorted.sort_unstable();
    let rank = (sorted.len() * RUNTIME_QUANTILE_PCT).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// Learned run times by (owner, command): see the module's text.
#[derive(Clone, Debug)]
pub struct RuntimeEstimator {
    keys: FxHashMap<u64, Learned>,
    /// Keys by when they were last updated: the oldest is evicted first.
    by_update: BTreeMap<u64, u64>,
    /// Counts updates (never reused).
    clock: u64,
    /// At most this many keys.
    max_keys: usize,
}

impl Default for RuntimeEstimator {
    fn default() -> Self {
        RuntimeEstimator::with_max_keys(MAX_RUNTIME_KEYS)
    }
}

impl RuntimeEstimator {
    /// An empty learner keeping at most `max_keys` keys (at least 1).
    pub fn with_max_keys(max_keys: usize) -> Self {
        RuntimeEstimator {
            keys: FxHashMap::default(),
            by_update: BTreeMap::new(),
            clock: 0,
            max_keys: max_keys.max(1),
        }
    }

    /// Learns that a run of `key` lasted `wall_ms`.
    pub fn learn(&mut self, key: u64, wall_ms: u64) {
        self.clock += 1;
        let clock = self.clock;
        let bound = self.max_keys;
        let entry = match self.keys.get_mut(&key) {
            Some(e) => {
                self.by_update.remove(&e.updated);
                e
            }
            None => {
                if self.keys.len() >= bound
                    && let Some((_, oldest)) = self.by_update.pop_first()
                {
                    self.keys.remove(&oldest);
                }
                self.keys.entry(key).or_insert(Learned {
                    ring: [0; RUNTIME_WINDOW],
                    next: 0,
                    samples: 0,
                    quantile_ms: 0,
                    updated: 0,
                })
            }
        };
        entry.ring[entry.next as usize] = wall_ms;
        entry.next = ((entry.next as usize + 1) % RUNTIME_WINDOW) as u8;
        entry.samples = entry.samples.saturating_add(1);
        entry.updated = clock;
        entry.quantile_ms = quantile(entry.window());
        self.by_update.insert(clock, key);
    }

    /// Learns from a usage record: a run that succeeded after it started,
    /// of a command with a key.
    pub fn learn_record(&mut self, r: &UsageRecord) {
        if r.state != TaskState::Succeeded || r.started_ms == 0 {
            return;
        }
        if let Some(key) = runtime_key(&r.owner, r.command_key) {
            self.learn(key, r.wall_ms());
        }
    }

    /// The learned estimate of `key`: its quantile and the runs learned
    /// from (whatever their number).
    pub fn get(&self, key: u64) -> Option<(u64, u32)> {
        self.keys.get(&key).map(|e| (e.quantile_ms, e.samples))
    }

    /// Keys kept.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Bounded, and the update order indexes exactly the keys.
    pub(super) fn check_invariants(&self) {
        assert!(self.keys.len() <= self.max_keys, "runtime keys are bounded");
        assert_eq!(
            self.keys.len(),
            self.by_update.len(),
            "every runtime key is in the update order once"
        );
    }
}

impl Lifecycle {
    /// How long a run of instance `i` of job `k` is expected to last, and
    /// why: declared, else learned (from at least
    /// [`MIN_LEARNED_SAMPLES`] runs), else the job's max running time,
    /// each cut to that limit; `None` if unknown, for an unknown job or
    /// instance, and for services and daemons (they run until stopped).
    pub fn runtime_estimate(&self, k: JobKey, i: u32) -> Option<Estimate> {
        let job = self.jobs.get(&k)?;
        if job.plan.kind.keeps_running() {
            return None;
        }
        let config = job.tasks.get(i as usize)?.config;
        self.plan_runtime_estimate(job.plan_of(config), i)
    }

    /// [`Lifecycle::runtime_estimate`] of instance `i` of a job of `plan`
    /// (one not created yet, for a plan: [`Lifecycle::plan_job`]).
    pub fn plan_runtime_estimate(&self, plan: &crate::JobPlan, i: u32) -> Option<Estimate> {
        if plan.kind.keeps_running() {
            return None;
        }
        let t = plan.template(i);
        let limit_ms = match plan.max_running_time_ms {
            0 => u64::MAX,
            ms => ms,
        };
        let estimate = |ms: u64, source| Estimate {
            ms: ms.min(limit_ms),
            source,
        };
        if t.expected_runtime_ms > 0 {
            return Some(estimate(t.expected_runtime_ms, EstimateSource::Declared));
        }
        if let Some((ms, samples)) =
            runtime_key(&plan.owner, t.command_key).and_then(|key| self.runtimes.get(key))
            && samples >= MIN_LEARNED_SAMPLES
        {
            return Some(estimate(ms, EstimateSource::Learned { samples }));
        }
        (plan.max_running_time_ms > 0)
            .then(|| estimate(plan.max_running_time_ms, EstimateSource::MaxRunningTime))
    }

    /// The learned run times.
    pub fn runtimes(&self) -> &RuntimeEstimator {
        &self.runtimes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quantile_is_the_90th_percentile_of_the_last_32_runs() {
        let mut e = RuntimeEstimator::default();
        e.learn(7, 100);
        assert_eq!(e.get(7), Some((100, 1)));
        e.learn(7, 300);
        e.learn(7, 200);
        // Nearest rank: ceil(0.9 × 3) = 3rd of 3.
        assert_eq!(e.get(7), Some((300, 3)));
        for ms in 1..=10 {
            e.learn(8, ms * 10);
        }
        assert_eq!(e.get(8), Some((90, 10)));
        // 40 more runs of 1 ms: the first ten have left the window.
        for _ in 0..40 {
            e.learn(8, 1);
        }
        assert_eq!(e.get(8), Some((1, 50)));
    }

    #[test]
    fn keys_are_bounded_and_the_least_recently_updated_goes_first() {
        let mut e = RuntimeEstimator::with_max_keys(3);
        e.learn(1, 10);
        e.learn(2, 20);
        e.learn(3, 30);
        // 1 is updated again: 2 is now the least recently updated.
        e.learn(1, 11);
        e.learn(4, 40);
        e.check_invariants();
        assert_eq!(e.len(), 3);
        assert_eq!(e.get(2), None);
        assert_eq!(e.get(1), Some((11, 2)));
        assert!(e.get(3).is_some() && e.get(4).is_some());
        e.learn(5, 50);
        assert_eq!(e.get(3), None, "then 3");
        e.check_invariants();
        // The default bound.
        let mut e = RuntimeEstimator::default();
        for key in 0..(MAX_RUNTIME_KEYS as u64 + 5) {
            e.learn(key, 1);
        }
        e.check_invariants();
        assert_eq!(e.len(), MAX_RUNTIME_KEYS);
        assert_eq!(e.get(4), None);
        assert_eq!(e.get(5), Some((1, 1)));
    }

    #[test]
    fn keys_are_stable_and_tell_parts_and_owners_apart() {
        // Stored in usage records: a change of hash would forget every
        // learned estimate at an upgrade.
        assert_eq!(command_key(["/bin/sleep", "10"]), 0x05cb_060b_ad3a_9a86);
        assert_ne!(command_key(["ab", "c"]), command_key(["a", "bc"]));
        let k = command_key(["train.py"]);
        assert_ne!(runtime_key("ana", k), runtime_key("bo", k));
        assert_eq!(runtime_key("ana", 0), None);
    }
}
