//! Resource dimensions and fixed-size resource vectors.
//!
//! Every per-dimension computation in the engine is a loop over
//! [`N_DIMS`] columns, so the set of dimensions is a small closed enum
//! rather than a map keyed by name.

use std::fmt;
use std::ops::{Index, IndexMut};

/// Number of resource dimensions the engine tracks.
pub const N_DIMS: usize = 4;

/// Upper bound of any single resource amount (reservation, limit, capacity,
/// demand, request): 2^50 units, i.e. about 10^12 cores or an exbibyte of
/// memory. Keeping amounts far below `u64::MAX` means sums over 10,000 pools
/// and millions of tasks cannot overflow and `f64` represents them exactly.
pub const MAX_AMOUNT: u64 = 1 << 50;

/// One resource dimension. The unit of each is fixed so that all amounts are
/// integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// CPU in millicores (1000 = one core).
    Cpu = 0,
    /// Memory in MiB.
    Memory = 1,
    /// Disk in MiB.
    Disk = 2,
    /// GPU in milli-GPUs (1000 = one whole GPU).
    Gpu = 3,
}

impl Dim {
    /// All dimensions in column order.
    pub const ALL: [Dim; N_DIMS] = [Dim::Cpu, Dim::Memory, Dim::Disk, Dim::Gpu];

    /// Lower-case name used in errors, reasons and configuration keys.
    pub fn name(self) -> &'static str {
        match self {
            Dim::Cpu => "cpu",
            Dim::Memory => "memory",
            Dim::Disk => "disk",
            Dim::Gpu => "gpu",
        }
    }

    /// Unit of the dimension's integer amounts.
    pub fn unit(self) -> &'static str {
        match self {
            Dim::Cpu => "millicores",
            Dim::Memory | Dim::Disk => "MiB",
            Dim::Gpu => "milli-GPUs",
        }
    }

    /// Column index of the dimension.
    pub fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An amount of every resource dimension, in the units of [`Dim`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources(pub [u64; N_DIMS]);

impl Resources {
    /// Nothing of anything.
    pub const ZERO: Resources = Resources([0; N_DIMS]);

    /// [`MAX_AMOUNT`] of every dimension; the default limit of a pool.
    pub const MAX: Resources = Resources([MAX_AMOUNT; N_DIMS]);

    /// Builds a vector from per-dimension amounts.
    pub const fn new(cpu_millis: u64, memory_mib: u64, disk_mib: u64, gpu_millis: u64) -> Self {
        Resources([cpu_millis, memory_mib, disk_mib, gpu_millis])
    }

    /// True when every dimension is zero.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&v| v == 0)
    }

    /// Component-wise `self <= other`.
    pub fn fits_in(&self, other: &Resources) -> bool {
        // No short-circuit: four compares the compiler turns into one vector op.
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(true, |ok, (a, b)| ok & (a <= b))
    }

    /// The first dimension in which `self > other`, if any.
    pub fn first_exceeding(&self, other: &Resources) -> Option<Dim> {
        Dim::ALL.into_iter().find(|d| self[*d] > other[*d])
    }

    /// Component-wise saturating addition.
    pub fn saturating_add(&self, other: &Resources) -> Resources {
        Resources(std::array::from_fn(|i| {
            self.0[i].saturating_add(other.0[i])
        }))
    }

    /// Component-wise saturating subtraction.
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        Resources(std::array::from_fn(|i| {
            self.0[i].saturating_sub(other.0[i])
        }))
    }

    /// Component-wise minimum.
    pub fn min(&self, other: &Resources) -> Resources {
        Resources(std::array::from_fn(|i| self.0[i].min(other.0[i])))
    }

    /// Component-wise maximum.
    pub fn max(&self, other: &Resources) -> Resources {
        Resources(std::array::from_fn(|i| self.0[i].max(other.0[i])))
    }

    /// Adds `other` in place; amounts stay below 2^64 because every input is
    /// bounded by [`MAX_AMOUNT`] and counts are bounded by the engine limits.
    pub fn add_assign(&mut self, other: &Resources) {
        for i in 0..N_DIMS {
            self.0[i] += other.0[i];
        }
    }

    /// Subtracts `other` in place. Panics (a broken invariant) if any
    /// dimension would go negative.
    pub fn sub_assign(&mut self, other: &Resources) {
        for i in 0..N_DIMS {
            self.0[i] = self.0[i]
                .checked_sub(other.0[i])
                .expect("resource accounting went negative");
        }
    }

    /// Each dimension multiplied by `percent / 100`, rounded down; `percent`
    /// is clamped to 0–100 (NaN counts as 0).
    pub fn percent(&self, percent: f64) -> Resources {
        let percent = if percent.is_nan() {
            0.0
        } else {
            percent.clamp(0.0, 100.0)
        };
        Resources(std::array::from_fn(|i| percent_of(self.0[i], percent)))
    }
}

/// `amount * percent / 100` rounded down; exact for amounts below 2^50.
pub(crate) fn percent_of(amount: u64, percent: f64) -> u64 {
    debug_assert!((0.0..=100.0).contains(&percent));
    if percent >= 100.0 {
        return amount;
    }
    // Through i64: exact below 2^50 and a single conversion instruction;
    // truncation is floor for non-negative values.
    ((amount as i64 as f64) * percent / 100.0) as i64 as u64
}

impl Index<Dim> for Resources {
    type Output = u64;
    fn index(&self, dim: Dim) -> &u64 {
        &self.0[dim.idx()]
    }
}

impl IndexMut<Dim> for Resources {
    fn index_mut(&mut self, dim: Dim) -> &mut u64 {
        &mut self.0[dim.idx()]
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu={} memory={} disk={} gpu={}",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_and_first_exceeding_agree() {
        let small = Resources::new(1, 2, 3, 4);
        let big = Resources::new(1, 5, 3, 4);
        assert!(small.fits_in(&big));
        assert!(!big.fits_in(&small));
        assert_eq!(big.first_exceeding(&small), Some(Dim::Memory));
        assert_eq!(small.first_exceeding(&big), None);
    }

    #[test]
    fn percent_rounds_down_and_keeps_full_amounts() {
        assert_eq!(percent_of(999, 50.0), 499);
        assert_eq!(percent_of(MAX_AMOUNT, 100.0), MAX_AMOUNT);
        assert_eq!(percent_of(1000, 0.0), 0);
    }
}
