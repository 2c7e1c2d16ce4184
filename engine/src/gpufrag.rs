//! The `gpu_frag` placement score: capacity-aware fragmentation descent.
//!
//! It builds on Fragmentation Gradient Descent (Weng et al., "Beware of
//! Fragmentation", USENIX ATC '23). FGD measures a host's fragmentation
//! against a *workload mix* — the request types expected and how often each
//! comes — as the free GPU capacity each type could not use there, weighted
//! by the type's share. A task goes where the fragmentation grows least.
//!
//! FGD asks only whether a type fits at all: a host with eight free GPUs and
//! cpu for one more task looks unfragmented to a one-GPU type. Here a type's
//! fragment on a host is the free GPU capacity left over after as many
//! copies of the type as fit there — counted by GPUs (per device for shared
//! GPUs), cpu *and* memory. So a cpu-heavy task is steered away from a host
//! whose GPUs would be stranded by its cpu, and shared-GPU leftovers are
//! valued by how many tasks of the mix they can still take. FGD's own
//! measure is kept beside it (weight [`FGD_WEIGHT`]): it is what protects
//! whole hosts for large multi-GPU requests, since any use of a whole host
//! makes it useless to them.
//!
//! Two more departures from FGD's weighting. A type's fragment is counted
//! in its own requests rather than in GPUs (its share is divided by its
//! size), so a whole host stranded for an eight-GPU type is one request
//! lost, not eight GPUs that outweigh every small type's leftovers. And a
//! type that names GPU models (a constraint) counts the free GPUs of the
//! hosts it may *not* use as stranded in proportion to its share ÷ the
//! share of the cluster's GPUs it may use: FGD weighs every type by its
//! share alone, so a model that a third of the GPU pods ask for but a
//! seventh of the GPUs have is no better protected than any other, and
//! unconstrained tasks fill its hosts; here taking a GPU on a host that
//! scarce types cannot use lowers the measure by what those types demand
//! per GPU they may use, so other tasks go there first.
//!
//! A host's measure depends only on its own free resources and on which
//! types its attributes allow, so it is memoised by that state: a cluster
//! has many hosts in the same few states.
//!
//! The mix is either given ([`GpuMix::from_counts`], as a replay of a known
//! workload does) or learned from the tasks placement sees ([`MixLearner`]).

use std::sync::Mutex;

use roaring::RoaringBitmap;
use rustc_hash::FxHashMap;

use crate::host::{HostArena, MAX_GPU_DEVICES, MILLI_GPUS_PER_DEVICE};
use crate::resources::{Dim, Resources};

/// Most request types a mix keeps.
pub const MAX_MIX_TYPES: usize = 64;
/// A mix keeps the most frequent types until they cover this share of the
/// tasks (as FGD's "typical pods" do).
pub const MIX_COVERAGE: f64 = 0.95;
/// Weight of FGD's fits-at-all measure beside the capacity-aware one.
pub const FGD_WEIGHT: f64 = 10.0;
/// How much scarcer hosts weigh for the types allowed on them (see
/// [`FragModel::set_eligible`]).
pub const SCARCITY_EXPONENT: f64 = 1.0;
/// The least share of GPUs a type is taken to be allowed on.
const MIN_ELIGIBLE_SHARE: f64 = 0.01;

/// Most task arrivals remembered by the learner.
const MAX_SEEN: usize = 1 << 20;
/// Most memoised host states before the memo is cleared.
const MAX_MEMO: usize = 1 << 20;
/// A learned mix halves its counts past this many observations, so it
/// follows a changing workload.
const LEARN_HALF_LIFE: f64 = 20_000.0;

/// One request type of a mix: what it asks for and where it may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MixKey {
    /// The request (gpu in milli-GPUs).
    pub request: Resources,
    /// The type's constraint (id in the placer's constraint table).
    pub constraint: u32,
}

/// The workload mix: request types and their shares (summing to 1).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuMix {
    types: Vec<(MixKey, f64)>,
}

impl GpuMix {
    /// A mix from counts per type: the most frequent types covering
    /// [`MIX_COVERAGE`] of the count (at most [`MAX_MIX_TYPES`]), their
    /// shares normalised. Ties are ordered by key, so the mix does not depend
    /// on the order of `counts`.
    pub fn from_counts(counts: impl IntoIterator<Item = (MixKey, f64)>) -> GpuMix {
        let mut all: Vec<(MixKey, f64)> = counts
            .into_iter()
            .filter(|(_, c)| c.is_finite() && *c > 0.0)
            .collect();
        all.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(a.0.request.0.cmp(&b.0.request.0))
                .then(a.0.constraint.cmp(&b.0.constraint))
        });
        let total: f64 = all.iter().map(|t| t.1).sum();
        let mut kept = Vec::new();
        let mut covered = 0.0;
        for t in all {
            if covered >= MIX_COVERAGE * total || kept.len() == MAX_MIX_TYPES {
                break;
            }
            covered += t.1;
            kept.push(t);
        }
        for t in &mut kept {
            t.1 /= covered;
        }
        GpuMix { types: kept }
    }

    /// The types and their shares, most frequent first.
    pub fn types(&self) -> &[(MixKey, f64)] {
        &self.types
    }

    /// True if the mix has no types (the score then falls back to `pack`).
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

/// Counts the request types of the tasks placement sees (each once, placed
/// or not), with a half-life, to learn the mix when none is given.
#[derive(Clone, Debug, Default)]
pub struct MixLearner {
    counts: FxHashMap<MixKey, f64>,
    total: f64,
    /// Observations since the mix was last built.
    pub(crate) since_built: u64,
    /// Arrival numbers of the tasks counted (cleared past a bound, so a
    /// task retried after that may count twice).
    seen: rustc_hash::FxHashSet<u64>,
}

impl MixLearner {
    /// True the first time a task's arrival number is seen.
    pub(crate) fn first_sight(&mut self, arrival: u64) -> bool {
        if self.seen.len() >= MAX_SEEN {
            self.seen.clear();
        }
        self.seen.insert(arrival)
    }

    /// Counts one task of this type.
    pub fn observe(&mut self, key: MixKey) {
        *self.counts.entry(key).or_insert(0.0) += 1.0;
        self.total += 1.0;
        self.since_built += 1;
        if self.total > 2.0 * LEARN_HALF_LIFE || self.counts.len() > 64 * MAX_MIX_TYPES {
            self.counts.retain(|_, c| {
                *c /= 2.0;
                *c >= 0.5
            });
            self.total = self.counts.values().sum();
        }
    }

    /// Whether the mix should be rebuilt: after a tenth more observations
    /// while it is young (so early placements see an early mix), then every
    /// 1,000.
    pub(crate) fn due(&self) -> bool {
        self.since_built as f64 >= (self.total / 10.0).clamp(16.0, 1000.0)
    }

    /// The mix learned so far.
    pub fn mix(&self) -> GpuMix {
        GpuMix::from_counts(self.counts.iter().map(|(k, &c)| (*k, c)))
    }
}

#[derive(Clone, Copy, Debug)]
struct FragType {
    cpu: u64,
    memory: u64,
    /// GPU per device: the share of one device, or a whole one.
    per_device: u64,
    /// Devices: 1 for a share, else whole devices.
    devices: usize,
    /// GPU milli in all.
    gpu: u64,
    weight: f64,
}

type StateKey = (u64, u64, u64, [u16; MAX_GPU_DEVICES]);

/// The mix compiled for scoring, with the memo of host states.
#[derive(Debug, Default)]
pub(crate) struct FragModel {
    mix: GpuMix,
    types: Vec<FragType>,
    /// Per type, the hosts it may use (`None`: every host).
    eligible: Vec<Option<RoaringBitmap>>,
    /// Per type, the weight of the free GPUs it cannot use on a host it is
    /// not allowed on (see [`FragModel::set_eligible`]).
    barred: Vec<f64>,
    memo: Mutex<FxHashMap<StateKey, f64>>,
}

impl FragModel {
    /// Compiles `mix` (the memo is kept if the mix is unchanged).
    pub(crate) fn set_mix(&mut self, mix: &GpuMix) {
        if *mix == self.mix && !self.types.is_empty() {
            return;
        }
        self.mix = mix.clone();
        self.types = mix
            .types
            .iter()
            .map(|(key, weight)| {
                let gpu = key.request[Dim::Gpu];
                let (per_device, devices) = if gpu == 0 {
                    (0, 0)
                } else if gpu < MILLI_GPUS_PER_DEVICE {
                    (gpu, 1)
                } else {
                    (
                        MILLI_GPUS_PER_DEVICE,
                        (gpu / MILLI_GPUS_PER_DEVICE) as usize,
                    )
                };
                FragType {
                    cpu: key.request[Dim::Cpu],
                    memory: key.request[Dim::Memory],
                    per_device,
                    devices,
                    gpu,
                    weight: *weight,
                }
            })
            .collect();
        // A GPU type's fragment counts in its own requests, not in GPUs:
        // its share is divided by its size (in GPUs), then the GPU types'
        // shares are scaled back to their sum.
        let gpu_share = |types: &[FragType]| {
            types
                .iter()
                .filter(|t| t.gpu > 0)
                .map(|t| t.weight)
                .sum::<f64>()
        };
        let before = gpu_share(&self.types);
        for t in self.types.iter_mut().filter(|t| t.gpu > 0) {
            t.weight /= t.gpu as f64 / MILLI_GPUS_PER_DEVICE as f64;
        }
        let after = gpu_share(&self.types);
        if after > 0.0 {
            for t in self.types.iter_mut().filter(|t| t.gpu > 0) {
                t.weight *= before / after;
            }
        }
        self.barred.clear();
        self.memo.get_mut().expect("not poisoned").clear();
    }

    pub(crate) fn mix(&self) -> &GpuMix {
        &self.mix
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Sets which hosts each type may use, from its constraint (`None`:
    /// all). Called once per batch. A type allowed on a share `e` of the
    /// live hosts' GPUs weighs its barred hosts' free GPUs by its share
    /// ÷ `e`^[`SCARCITY_EXPONENT`]: the scarcer its hosts, the more each of
    /// their GPUs is worth to it, so other types are steered off them.
    /// Returns true if those weights changed (the memo is then cleared and
    /// the caller must rescore every host); else the memo stays valid,
    /// since it is keyed by which types a host allows.
    pub(crate) fn set_eligible(
        &mut self,
        hosts: &HostArena,
        mut eligible: impl FnMut(u32) -> Option<RoaringBitmap>,
    ) -> bool {
        self.eligible = self
            .mix
            .types
            .iter()
            .map(|(key, _)| eligible(key.constraint))
            .collect();
        let capacity = hosts.capacity_column(Dim::Gpu);
        let live = hosts.live_hosts();
        let total: u64 = live.iter().map(|s| capacity[s as usize]).sum();
        let barred: Vec<f64> = self
            .eligible
            .iter()
            .zip(&self.types)
            .map(|(e, t)| {
                let share = match e {
                    None => 1.0,
                    Some(b) if total > 0 => {
                        let mine: u64 = b
                            .iter()
                            .filter(|&s| live.contains(s))
                            .map(|s| capacity[s as usize])
                            .sum();
                        (mine as f64 / total as f64).max(MIN_ELIGIBLE_SHARE)
                    }
                    Some(_) => 1.0,
                };
                t.weight * (1.0 + FGD_WEIGHT) * share.powf(-SCARCITY_EXPONENT)
            })
            .collect();
        if barred == self.barred {
            return false;
        }
        self.barred = barred;
        self.memo.get_mut().expect("not poisoned").clear();
        true
    }

    fn mask(&self, slot: u32) -> u64 {
        let mut mask = 0u64;
        for (i, e) in self.eligible.iter().enumerate() {
            if e.as_ref().is_none_or(|b| b.contains(slot)) {
                mask |= 1 << i;
            }
        }
        mask
    }

    /// The fragmentation measure of a host state (`devices` sorted).
    fn frag(&self, mask: u64, cpu: u64, memory: u64, devices: &[u16]) -> f64 {
        let mut key_devices = [0u16; MAX_GPU_DEVICES];
        key_devices[..devices.len()].copy_from_slice(devices);
        let key = (mask, cpu, memory, key_devices);
        if let Some(&v) = self.memo.lock().expect("not poisoned").get(&key) {
            return v;
        }
        let total: u64 = devices.iter().map(|&f| u64::from(f)).sum();
        let mut sum = 0.0;
        for (i, t) in self.types.iter().enumerate() {
            if t.gpu == 0 {
                sum += t.weight * (1.0 + FGD_WEIGHT) * total as f64;
                continue;
            }
            if mask & (1 << i) == 0 {
                sum += self
                    .barred
                    .get(i)
                    .copied()
                    .unwrap_or(t.weight * (1.0 + FGD_WEIGHT))
                    * total as f64;
                continue;
            }
            // How many copies fit, by GPUs, cpu and memory.
            let by_gpu = if t.devices == 1 && t.per_device < MILLI_GPUS_PER_DEVICE {
                devices
                    .iter()
                    .map(|&f| u64::from(f) / t.per_device)
                    .sum::<u64>()
            } else {
                devices
                    .iter()
                    .filter(|&&f| u64::from(f) == MILLI_GPUS_PER_DEVICE)
                    .count() as u64
                    / t.devices as u64
            };
            let by_cpu = cpu.checked_div(t.cpu).unwrap_or(u64::MAX);
            let by_memory = memory.checked_div(t.memory).unwrap_or(u64::MAX);
            let copies = by_gpu.min(by_cpu).min(by_memory);
            let capacity_aware = total.saturating_sub(copies * t.gpu) as f64;
            // FGD: all free GPU if the type does not fit at all, else the
            // devices with less free than it needs per device.
            let fgd = if by_gpu == 0 || by_cpu == 0 {
                total as f64
            } else {
                devices
                    .iter()
                    .filter(|&&f| u64::from(f) < t.per_device)
                    .map(|&f| f64::from(f))
                    .sum()
            };
            sum += t.weight * (capacity_aware + FGD_WEIGHT * fgd);
        }
        let mut memo = self.memo.lock().expect("not poisoned");
        if memo.len() >= MAX_MEMO {
            memo.clear();
        }
        memo.insert(key, sum);
        sum
    }

    /// How much placing `request` on the host in `slot` grows its
    /// fragmentation (in GPUs; may be negative), and for a shared-GPU
    /// request the free capacity of the device to use. The host must fit.
    pub(crate) fn delta(
        &self,
        hosts: &HostArena,
        slot: usize,
        request: &Resources,
    ) -> (f64, Option<u16>) {
        let cpu = hosts.free_column(Dim::Cpu)[slot];
        let memory = hosts.free_column(Dim::Memory)[slot];
        let free = hosts.gpu_free(slot);
        let n = free.len();
        let mut sorted = [0u16; MAX_GPU_DEVICES];
        sorted[..n].copy_from_slice(free);
        sorted[..n].sort_unstable();
        let mask = self.mask(slot as u32);
        let before = self.frag(mask, cpu, memory, &sorted[..n]);
        let (cpu, memory) = (
            cpu.saturating_sub(request[Dim::Cpu]),
            memory.saturating_sub(request[Dim::Memory]),
        );
        let gpu = request[Dim::Gpu];
        if gpu == 0 || gpu >= MILLI_GPUS_PER_DEVICE {
            let mut after = sorted;
            let mut want = gpu / MILLI_GPUS_PER_DEVICE;
            for f in after[..n].iter_mut().rev() {
                if want > 0 && u64::from(*f) == MILLI_GPUS_PER_DEVICE {
                    *f = 0;
                    want -= 1;
                }
            }
            after[..n].sort_unstable();
            let delta = self.frag(mask, cpu, memory, &after[..n]) - before;
            return (delta / MILLI_GPUS_PER_DEVICE as f64, None);
        }
        // A share: try each distinct device capacity that fits, least free
        // first (so ties go to the tightest device).
        let mut best: Option<(f64, u16)> = None;
        for i in 0..n {
            let f = sorted[i];
            if u64::from(f) < gpu || (i > 0 && sorted[i - 1] == f) {
                continue;
            }
            let mut after = sorted;
            after[i] = f - gpu as u16;
            after[..n].sort_unstable();
            let delta = self.frag(mask, cpu, memory, &after[..n]) - before;
            if best.is_none_or(|(b, _)| delta < b) {
                best = Some((delta, f));
            }
        }
        let (delta, device) = best.unwrap_or((0.0, 0));
        (delta / MILLI_GPUS_PER_DEVICE as f64, Some(device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cpu: u64, gpu: u64) -> MixKey {
        MixKey {
            request: Resources::new(cpu, 1, 0, gpu),
            constraint: 0,
        }
    }

    #[test]
    fn mix_keeps_the_frequent_types_and_normalises() {
        let mix = GpuMix::from_counts([(key(1, 500), 90.0), (key(2, 1000), 8.0), (key(3, 0), 2.0)]);
        // 90 + 8 = 98 % ≥ 95 %: the last type is dropped.
        assert_eq!(mix.types().len(), 2);
        assert!((mix.types()[0].1 - 90.0 / 98.0).abs() < 1e-12);
        let same =
            GpuMix::from_counts([(key(2, 1000), 8.0), (key(3, 0), 2.0), (key(1, 500), 90.0)]);
        assert_eq!(mix, same);
    }

    #[test]
    fn learner_follows_the_workload() {
        let mut learner = MixLearner::default();
        for _ in 0..1000 {
            learner.observe(key(1, 500));
        }
        for _ in 0..100_000 {
            learner.observe(key(2, 1000));
        }
        let mix = learner.mix();
        assert_eq!(mix.types().len(), 1, "{mix:?}");
        assert_eq!(mix.types()[0].0, key(2, 1000));
    }
}
