//! The host arena: every host's capacity, free resources, GPU devices,
//! ports, state and attributes, as columns indexed by a dense `u32` slot,
//! with roaring-bitmap indexes over attributes, states and GPU hosts that are
//! kept exactly in sync with the columns.
//!
//! Slots of removed hosts are reused under a new generation, so a stale
//! [`HostId`] is detected. Add, update and remove are O(1) amortised plus the
//! host's attributes.

use std::collections::HashMap;
use std::fmt;

use roaring::RoaringBitmap;

use crate::intern::{Interner, Sym};
use crate::resources::{Dim, MAX_AMOUNT, N_DIMS, Resources};

/// Most GPU devices one host may have.
pub const MAX_GPU_DEVICES: usize = 16;
/// Milli-GPUs of one whole device.
pub const MILLI_GPUS_PER_DEVICE: u64 = 1000;
/// Most attributes one host may have.
pub const MAX_ATTRIBUTES: usize = 64;
/// Longest attribute key or value, in bytes.
pub const MAX_ATTRIBUTE_LEN: usize = 128;
/// Longest host name, in bytes.
pub const MAX_HOST_NAME_LEN: usize = 253;
/// Default bound on the number of hosts.
pub const DEFAULT_MAX_HOSTS: usize = 200_000;
/// The attribute key that makes a host exclusive: it only takes tasks whose
/// constraint names this key.
pub const EXCLUSIVE_KEY: &str = "exclusive";

/// Handle of a host: its dense slot and the slot's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId {
    idx: u32,
    generation: u32,
}

impl HostId {
    /// Dense slot index, usable to index host columns and bitmaps.
    pub fn idx(self) -> usize {
        self.idx as usize
    }
}

/// Whether a host takes new work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HostState {
    /// Takes new tasks.
    #[default]
    Up,
    /// In maintenance: keeps its tasks for now, takes no new ones.
    Draining,
    /// Out of service.
    Down,
}

impl HostState {
    /// All states, in index order.
    pub const ALL: [HostState; 3] = [HostState::Up, HostState::Draining, HostState::Down];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            HostState::Up => "up",
            HostState::Draining => "draining",
            HostState::Down => "down",
        }
    }
}

impl fmt::Display for HostState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a host offers, as registered or updated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSpec {
    /// Unique name (e.g. the host name).
    pub name: String,
    /// Resources; the gpu dimension must be `gpu_devices × 1000`.
    pub capacity: Resources,
    /// Number of GPU devices (0–16).
    pub gpu_devices: u8,
    /// Dynamic ports the host can hand out.
    pub ports: u32,
    /// `key=value` attributes (unique keys).
    pub attributes: Vec<(String, String)>,
}

/// Why a host operation was refused. Every variant names the host.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// A field of the spec is invalid.
    #[error("host {host}: {field}: {problem}")]
    Invalid {
        /// The host.
        host: String,
        /// The offending field.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// A host of that name exists.
    #[error("host {host} already exists")]
    AlreadyExists {
        /// The host.
        host: String,
    },
    /// No such host (or a stale handle).
    #[error("host {host} not found")]
    NotFound {
        /// The host.
        host: String,
    },
    /// The host bound is reached.
    #[error("cannot add host {host}: the limit of {limit} hosts is reached")]
    TooManyHosts {
        /// The host.
        host: String,
        /// The bound.
        limit: usize,
    },
    /// The change would leave allocated resources without capacity.
    #[error("host {host}: {problem}")]
    InUse {
        /// The host.
        host: String,
        /// What is in use.
        problem: String,
    },
}

/// Which GPU devices of a host a task holds: a set of devices and the
/// milli-GPUs taken from each (a fractional request uses one device; a
/// whole-GPU request takes whole devices).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuGrant {
    /// Bit `i` set: device `i` is used.
    pub devices: u16,
    /// Milli-GPUs taken from each used device.
    pub milli_per_device: u16,
}

/// Why a request does not fit a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misfit {
    /// Not enough of a dimension free.
    Insufficient(Dim),
    /// Enough GPU in total, but not on one device (fractional) or not as
    /// whole free devices.
    GpuFragmented,
    /// Not enough free ports.
    Ports,
    /// The GPU request is not a valid shape (above one GPU but not whole
    /// GPUs, or more devices than a host can have); see
    /// [`validate_gpu_request`].
    InvalidGpuRequest,
}

/// A task's GPU request in milli-GPUs, validated: up to one GPU (shared on
/// one device) or a whole number of GPUs (whole devices).
pub fn validate_gpu_request(milli: u64) -> Result<(), String> {
    if gpu_request_ok(milli) {
        Ok(())
    } else if milli <= MILLI_GPUS_PER_DEVICE || milli.is_multiple_of(MILLI_GPUS_PER_DEVICE) {
        Err(format!(
            "{milli} milli-GPUs exceed the {MAX_GPU_DEVICES} devices a host can have"
        ))
    } else {
        Err(format!(
            "{milli} milli-GPUs: a request above one GPU must be a whole number of GPUs (a multiple of 1000)"
        ))
    }
}

/// Whether [`validate_gpu_request`] accepts `milli`, without wording why
/// not (the placer checks every task of a batch with it).
#[inline]
pub fn gpu_request_ok(milli: u64) -> bool {
    (milli <= MILLI_GPUS_PER_DEVICE || milli.is_multiple_of(MILLI_GPUS_PER_DEVICE))
        && milli <= MAX_GPU_DEVICES as u64 * MILLI_GPUS_PER_DEVICE
}

/// Bounds of a host arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// Largest number of live hosts.
    pub max_hosts: usize,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_hosts: DEFAULT_MAX_HOSTS,
        }
    }
}

/// All hosts, as columns, with their indexes.
#[derive(Debug, Default)]
pub struct HostArena {
    limits: HostLimits,
    interner: Interner,
    exclusive_key: Option<Sym>,
    // Columns indexed by slot.
    name: Vec<Box<str>>,
    generation: Vec<u32>,
    live: Vec<bool>,
    capacity: [Vec<u64>; N_DIMS],
    free: [Vec<u64>; N_DIMS],
    /// Held for no task (volumes, instances restarting on the host); out
    /// of `free`. Never GPUs.
    reserved: Vec<Resources>,
    /// What the host's non-revocable tasks are allocated but do not use
    /// (by its owner's usage estimate, less a safety margin): room
    /// revocable tasks may borrow. Never GPUs.
    reclaimable: Vec<Resources>,
    /// What revocable tasks hold beyond the host's unallocated resources,
    /// borrowed from `reclaimable`. Per dimension, `free` and `borrowed`
    /// are never both non-zero: `free - borrowed` is capacity less all
    /// allocations and reservations.
    borrowed: Vec<Resources>,
    /// Sum of `reclaimable` over live hosts.
    total_reclaimable: Resources,
    /// Sum of the capacity of up hosts (kept with `by_state`).
    up_capacity: Resources,
    gpu_devices: Vec<u8>,
    gpu_free: Vec<[u16; MAX_GPU_DEVICES]>,
    ports_total: Vec<u32>,
    ports_free: Vec<u32>,
    state: Vec<HostState>,
    attributes: Vec<Box<[(Sym, Sym)]>>,
    free_slots: Vec<u32>,
    by_name: HashMap<Box<str>, u32>,
    n_live: usize,
    // Indexes, always equal to what the columns say.
    by_value: HashMap<(Sym, Sym), RoaringBitmap>,
    by_key: HashMap<Sym, RoaringBitmap>,
    by_state: [RoaringBitmap; 3],
    gpu_hosts: RoaringBitmap,
    live_hosts: RoaringBitmap,
    /// Which arena this is (0: made by `default`), so that a placer keeping
    /// state between batches knows the hosts it saw.
    id: u64,
    /// Slots changed since the last [`HostArena::take_changes`] (free
    /// resources, devices, ports, state, attributes, liveness), each once;
    /// at most one entry per slot.
    changed: Vec<u32>,
    changed_bits: Vec<u64>,
    /// The devices the next allocation on a slot takes, if they fit its
    /// request (see [`HostArena::pin_gpu_grant`]).
    gpu_pin: Option<(usize, GpuGrant)>,
}

/// A new arena identity (never 0).
fn next_arena_id() -> u64 {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl HostArena {
    /// An empty arena.
    pub fn new(limits: HostLimits) -> Self {
        assert!(
            limits.max_hosts <= u32::MAX as usize,
            "max_hosts fits in u32"
        );
        HostArena {
            limits,
            id: next_arena_id(),
            ..Default::default()
        }
    }

    /// A copy to simulate on (see [`crate::Engine::fork`]), with an
    /// identity of its own: a placer that kept state for this arena does
    /// not take the copy for it.
    pub fn fork(&self) -> HostArena {
        HostArena {
            limits: self.limits,
            interner: self.interner.clone(),
            exclusive_key: self.exclusive_key,
            name: self.name.clone(),
            generation: self.generation.clone(),
            live: self.live.clone(),
            capacity: self.capacity.clone(),
            free: self.free.clone(),
            reserved: self.reserved.clone(),
            reclaimable: self.reclaimable.clone(),
            borrowed: self.borrowed.clone(),
            total_reclaimable: self.total_reclaimable,
            up_capacity: self.up_capacity,
            gpu_devices: self.gpu_devices.clone(),
            gpu_free: self.gpu_free.clone(),
            ports_total: self.ports_total.clone(),
            ports_free: self.ports_free.clone(),
            state: self.state.clone(),
            attributes: self.attributes.clone(),
            free_slots: self.free_slots.clone(),
            by_name: self.by_name.clone(),
            n_live: self.n_live,
            by_value: self.by_value.clone(),
            by_key: self.by_key.clone(),
            by_state: self.by_state.clone(),
            gpu_hosts: self.gpu_hosts.clone(),
            live_hosts: self.live_hosts.clone(),
            id: next_arena_id(),
            changed: self.changed.clone(),
            changed_bits: self.changed_bits.clone(),
            gpu_pin: None,
        }
    }

    /// This arena's identity (unique per [`HostArena::new`]; 0 for one made
    /// by `default`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Notes that the host in `slot` changed (see [`HostArena::take_changes`]).
    #[inline]
    fn mark(&mut self, slot: usize) {
        let (w, b) = (slot / 64, slot % 64);
        if self.changed_bits.len() <= w {
            self.changed_bits.resize(w + 1, 0);
        }
        if self.changed_bits[w] >> b & 1 == 0 {
            self.changed_bits[w] |= 1 << b;
            self.changed.push(slot as u32);
        }
    }

    /// Hands each slot changed since the last call to `each` (in the order
    /// of their first change, each once) and forgets them: what a placer
    /// keeping scored hosts between batches must look at again. There is one
    /// consumer: the placer that places on this arena (the engine's). Two
    /// placers taking changes from one arena would each miss what the
    /// other took.
    pub fn take_changes(&mut self, mut each: impl FnMut(u32)) {
        for &slot in &self.changed {
            let (w, b) = (slot as usize / 64, slot % 64);
            self.changed_bits[w] &= !(1 << b);
            each(slot);
        }
        self.changed.clear();
    }

    /// Number of live hosts.
    pub fn len(&self) -> usize {
        self.n_live
    }

    /// True when no host is registered.
    pub fn is_empty(&self) -> bool {
        self.n_live == 0
    }

    /// Number of slots; host columns have this length.
    pub fn n_slots(&self) -> usize {
        self.live.len()
    }

    /// The attribute interner (constraints intern their keys and values here).
    pub fn interner(&self) -> &Interner {
        &self.interner
    }

    /// Mutable interner, for compiling constraints.
    pub fn interner_mut(&mut self) -> &mut Interner {
        &mut self.interner
    }

    /// The host with this name.
    pub fn lookup(&self, name: &str) -> Option<HostId> {
        self.by_name.get(name).map(|&i| self.id_of(i))
    }

    /// The live host in `slot`.
    pub fn lookup_slot(&self, slot: usize) -> Option<HostId> {
        (slot < self.live.len() && self.live[slot]).then(|| self.id_of(slot as u32))
    }

    /// True if `id` names a live host.
    pub fn contains(&self, id: HostId) -> bool {
        let i = id.idx();
        i < self.live.len() && self.live[i] && self.generation[i] == id.generation
    }

    fn check(&self, id: HostId) -> Result<usize, HostError> {
        if self.contains(id) {
            Ok(id.idx())
        } else {
            Err(HostError::NotFound {
                host: format!("<stale host handle {}#{}>", id.idx, id.generation),
            })
        }
    }

    /// Name of a live host.
    pub fn name(&self, id: HostId) -> &str {
        assert!(self.contains(id), "stale host handle {id:?}");
        &self.name[id.idx()]
    }

    /// State of a live host.
    /// Whether the slot holds a live host that is up (a column read, for
    /// scans over every slot).
    #[inline]
    pub fn is_up_slot(&self, slot: usize) -> bool {
        self.live[slot] && self.state[slot] == HostState::Up
    }

    pub fn state(&self, id: HostId) -> HostState {
        assert!(self.contains(id), "stale host handle {id:?}");
        self.state[id.idx()]
    }

    /// Capacity of the host in `slot`.
    pub fn capacity(&self, slot: usize) -> Resources {
        Resources(std::array::from_fn(|d| self.capacity[d][slot]))
    }

    /// Whether some live host's capacity (whatever is in use now) holds
    /// `request` in every dimension: `Err` with the largest capacity of
    /// each dimension when none does (also when there are no hosts).
    pub fn any_capacity_holds(&self, request: &Resources) -> Result<(), Resources> {
        let mut largest = Resources::ZERO;
        for slot in &self.live_hosts {
            let capacity = self.capacity(slot as usize);
            if request.fits_in(&capacity) {
                return Ok(());
            }
            largest = largest.max(&capacity);
        }
        Err(largest)
    }

    /// What the tasks placed on the host in `slot` hold: its capacity less
    /// what is free and what is reserved for no task.
    pub fn held(&self, slot: usize) -> Resources {
        self.capacity(slot)
            .saturating_add(&self.borrowed[slot])
            .saturating_sub(&self.free(slot))
            .saturating_sub(&self.reserved[slot])
    }

    /// What the host in `slot` lends revocable tasks (see
    /// [`HostArena::set_reclaimable`]).
    pub fn reclaimable(&self, slot: usize) -> Resources {
        self.reclaimable[slot]
    }

    /// What revocable tasks on the host in `slot` hold beyond its
    /// unallocated resources.
    pub fn borrowed(&self, slot: usize) -> Resources {
        self.borrowed[slot]
    }

    /// Sum of what live hosts lend revocable tasks.
    pub fn total_reclaimable(&self) -> Resources {
        self.total_reclaimable
    }

    /// Sets what the host in `slot` lends revocable tasks: what its
    /// non-revocable tasks are allocated but do not use. GPUs are never
    /// lent (the GPU part is ignored). What revocable tasks borrowed stays
    /// borrowed even if it is now more than this (the caller evicts them).
    pub fn set_reclaimable(&mut self, slot: usize, mut amount: Resources) {
        amount.0[Dim::Gpu.idx()] = 0;
        self.total_reclaimable = self
            .total_reclaimable
            .saturating_sub(&self.reclaimable[slot])
            .saturating_add(&amount);
        self.reclaimable[slot] = amount;
    }

    /// Lends every up host's unborrowed reclaimable resources to its free
    /// ones, for a placement pass of revocable tasks only; returns what was
    /// lent, to give to [`HostArena::settle`] right after the pass.
    pub fn lend(&mut self) -> Vec<(u32, Resources)> {
        let mut lent = Vec::new();
        let up: Vec<u32> = self.by_state[HostState::Up as usize]
            .iter()
            .filter(|&slot| !self.reclaimable[slot as usize].is_zero())
            .collect();
        for slot in up {
            let i = slot as usize;
            let mut x = self.reclaimable[i].saturating_sub(&self.borrowed[i]);
            for d in 0..N_DIMS {
                x.0[d] = x.0[d].min(self.capacity[d][i] - self.free[d][i]);
            }
            if x.is_zero() {
                continue;
            }
            for d in 0..N_DIMS {
                self.free[d][i] += x.0[d];
            }
            self.mark(i);
            lent.push((slot, x));
        }
        lent
    }

    /// Takes back what [`HostArena::lend`] lent: what the pass placed beyond
    /// the unallocated resources stays borrowed.
    pub fn settle(&mut self, lent: Vec<(u32, Resources)>) {
        for (slot, x) in lent {
            let i = slot as usize;
            for d in 0..N_DIMS {
                let free = self.free[d][i];
                if free >= x.0[d] {
                    self.free[d][i] = free - x.0[d];
                } else {
                    self.free[d][i] = 0;
                    self.borrowed[i].0[d] += x.0[d] - free;
                }
            }
            self.mark(i);
        }
    }

    /// Gives `amount` back to the host in `slot`: what was borrowed is
    /// repaid first, the rest is free again.
    fn give_back(&mut self, slot: usize, d: usize, amount: u64) {
        let repaid = amount.min(self.borrowed[slot].0[d]);
        self.borrowed[slot].0[d] -= repaid;
        self.free[d][slot] += amount - repaid;
    }

    /// Free resources of the host in `slot`.
    pub fn free(&self, slot: usize) -> Resources {
        Resources(std::array::from_fn(|d| self.free[d][slot]))
    }

    /// Free column of one dimension, indexed by slot.
    pub fn free_column(&self, dim: Dim) -> &[u64] {
        &self.free[dim.idx()]
    }

    /// Capacity column of one dimension, indexed by slot.
    pub fn capacity_column(&self, dim: Dim) -> &[u64] {
        &self.capacity[dim.idx()]
    }

    /// Free milli-GPUs of each device of the host in `slot`.
    pub fn gpu_free(&self, slot: usize) -> &[u16] {
        &self.gpu_free[slot][..usize::from(self.gpu_devices[slot])]
    }

    /// Free dynamic ports of the host in `slot`.
    pub fn ports_free(&self, slot: usize) -> u32 {
        self.ports_free[slot]
    }

    /// Free dynamic ports column, indexed by slot.
    pub fn ports_free_column(&self) -> &[u32] {
        &self.ports_free
    }

    /// Attributes of the host in `slot`.
    pub fn attributes(&self, slot: usize) -> &[(Sym, Sym)] {
        &self.attributes[slot]
    }

    /// The spec of a live host as it is now (what [`HostArena::update`]
    /// takes, so a caller can change one part of it).
    pub fn spec(&self, id: HostId) -> Result<HostSpec, HostError> {
        let i = self.check(id)?;
        let interner = &self.interner;
        Ok(HostSpec {
            name: self.name[i].to_string(),
            capacity: self.capacity(i),
            gpu_devices: self.gpu_devices[i],
            ports: self.ports_total[i],
            attributes: self.attributes[i]
                .iter()
                .map(|(k, v)| {
                    (
                        interner.resolve(*k).to_string(),
                        interner.resolve(*v).to_string(),
                    )
                })
                .collect(),
        })
    }

    /// Hosts with attribute `key` = `value`.
    pub fn with_value(&self, key: Sym, value: Sym) -> Option<&RoaringBitmap> {
        self.by_value.get(&(key, value))
    }

    /// Hosts with attribute `key`, whatever its value.
    pub fn with_key(&self, key: Sym) -> Option<&RoaringBitmap> {
        self.by_key.get(&key)
    }

    /// Hosts in a state.
    pub fn in_state(&self, state: HostState) -> &RoaringBitmap {
        &self.by_state[state as usize]
    }

    /// Hosts with at least one GPU device.
    pub fn gpu_hosts(&self) -> &RoaringBitmap {
        &self.gpu_hosts
    }

    /// The summed capacity of up hosts.
    pub fn up_capacity(&self) -> Resources {
        self.up_capacity
    }

    /// All live hosts.
    pub fn live_hosts(&self) -> &RoaringBitmap {
        &self.live_hosts
    }

    /// Hosts with the `exclusive` attribute.
    pub fn exclusive_hosts(&self) -> Option<&RoaringBitmap> {
        self.exclusive_key.and_then(|k| self.by_key.get(&k))
    }

    /// Registers a host. Validates everything first; on error nothing changes.
    pub fn add(&mut self, spec: &HostSpec) -> Result<HostId, HostError> {
        validate_spec(spec)?;
        if self.by_name.contains_key(spec.name.as_str()) {
            return Err(HostError::AlreadyExists {
                host: spec.name.clone(),
            });
        }
        if self.n_live >= self.limits.max_hosts {
            return Err(HostError::TooManyHosts {
                host: spec.name.clone(),
                limit: self.limits.max_hosts,
            });
        }
        let attributes = self.intern_attributes(spec);
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                let i = slot as usize;
                self.generation[i] = self.generation[i].wrapping_add(1);
                self.live[i] = true;
                self.name[i] = spec.name.as_str().into();
                slot
            }
            None => {
                let slot = u32::try_from(self.live.len()).expect("host slots fit in u32");
                self.generation.push(0);
                self.live.push(true);
                self.name.push(spec.name.as_str().into());
                for d in 0..N_DIMS {
                    self.capacity[d].push(0);
                    self.free[d].push(0);
                }
                self.reserved.push(Resources::ZERO);
                self.reclaimable.push(Resources::ZERO);
                self.borrowed.push(Resources::ZERO);
                self.gpu_devices.push(0);
                self.gpu_free.push([0; MAX_GPU_DEVICES]);
                self.ports_total.push(0);
                self.ports_free.push(0);
                self.state.push(HostState::Up);
                self.attributes.push(Box::new([]));
                slot
            }
        };
        let i = slot as usize;
        for d in 0..N_DIMS {
            self.capacity[d][i] = spec.capacity.0[d];
            self.free[d][i] = spec.capacity.0[d];
        }
        self.reserved[i] = Resources::ZERO;
        self.reclaimable[i] = Resources::ZERO;
        self.borrowed[i] = Resources::ZERO;
        self.gpu_devices[i] = spec.gpu_devices;
        let mut devices = [0u16; MAX_GPU_DEVICES];
        devices[..usize::from(spec.gpu_devices)].fill(MILLI_GPUS_PER_DEVICE as u16);
        self.gpu_free[i] = devices;
        self.ports_total[i] = spec.ports;
        self.ports_free[i] = spec.ports;
        self.state[i] = HostState::Up;
        self.attributes[i] = attributes;
        self.by_name.insert(spec.name.as_str().into(), slot);
        self.n_live += 1;
        self.index_insert(i);
        self.mark(i);
        Ok(self.id_of(slot))
    }

    /// Replaces a host's capacity, devices, ports and attributes (its name
    /// stays). Refused, changing nothing, if what is allocated on the host
    /// would no longer fit.
    pub fn update(&mut self, id: HostId, spec: &HostSpec) -> Result<(), HostError> {
        let i = self.check(id)?;
        validate_spec(spec)?;
        let host = self.name[i].to_string();
        if spec.name != host {
            return Err(HostError::Invalid {
                host,
                field: "name".into(),
                problem: format!(
                    "cannot rename a host to {:?}: remove it and add it again",
                    spec.name
                ),
            });
        }
        let allocated = self.capacity(i).saturating_sub(&self.free(i));
        if let Some(d) = allocated.first_exceeding(&spec.capacity) {
            return Err(HostError::InUse {
                host,
                problem: format!(
                    "{} {d} is allocated, more than the new capacity {}",
                    allocated[d], spec.capacity[d]
                ),
            });
        }
        let gpu_in_use = allocated[Dim::Gpu] > 0;
        if gpu_in_use && spec.gpu_devices != self.gpu_devices[i] {
            return Err(HostError::InUse {
                host,
                problem: "GPU devices cannot change while GPUs are allocated".into(),
            });
        }
        let ports_in_use = self.ports_total[i] - self.ports_free[i];
        if ports_in_use > spec.ports {
            return Err(HostError::InUse {
                host,
                problem: format!(
                    "{ports_in_use} ports are in use, more than the new {}",
                    spec.ports
                ),
            });
        }
        let attributes = self.intern_attributes(spec);
        self.index_remove(i);
        for d in 0..N_DIMS {
            self.capacity[d][i] = spec.capacity.0[d];
            // What revocable tasks borrowed is repaid from new room first.
            let room = spec.capacity.0[d] - allocated.0[d];
            let repaid = room.min(self.borrowed[i].0[d]);
            self.borrowed[i].0[d] -= repaid;
            self.free[d][i] = room - repaid;
        }
        if spec.gpu_devices != self.gpu_devices[i] {
            let mut devices = [0u16; MAX_GPU_DEVICES];
            devices[..usize::from(spec.gpu_devices)].fill(MILLI_GPUS_PER_DEVICE as u16);
            self.gpu_free[i] = devices;
            self.gpu_devices[i] = spec.gpu_devices;
        }
        self.ports_total[i] = spec.ports;
        self.ports_free[i] = spec.ports - ports_in_use;
        self.attributes[i] = attributes;
        self.index_insert(i);
        self.mark(i);
        Ok(())
    }

    /// Sets a host's state.
    pub fn set_state(&mut self, id: HostId, state: HostState) -> Result<(), HostError> {
        let i = self.check(id)?;
        if state != HostState::Up {
            // A host taking no new work lends nothing (what was borrowed
            // stays borrowed until released).
            self.set_reclaimable(i, Resources::ZERO);
        }
        if self.state[i] == HostState::Up {
            self.up_capacity = self.up_capacity.saturating_sub(&self.capacity(i));
        }
        if state == HostState::Up {
            self.up_capacity = self.up_capacity.saturating_add(&self.capacity(i));
        }
        self.by_state[self.state[i] as usize].remove(i as u32);
        self.state[i] = state;
        self.by_state[state as usize].insert(i as u32);
        self.mark(i);
        Ok(())
    }

    /// Removes a host that holds nothing.
    pub fn remove(&mut self, id: HostId) -> Result<(), HostError> {
        let i = self.check(id)?;
        let allocated = self.capacity(i).saturating_sub(&self.free(i));
        if !allocated.is_zero() || self.ports_free[i] != self.ports_total[i] {
            return Err(HostError::InUse {
                host: self.name[i].to_string(),
                problem: format!("{allocated} is still allocated; move or end its tasks first"),
            });
        }
        self.index_remove(i);
        self.by_name.remove(&self.name[i]);
        self.live[i] = false;
        self.mark(i);
        self.name[i] = "".into();
        self.attributes[i] = Box::new([]);
        for d in 0..N_DIMS {
            self.capacity[d][i] = 0;
            self.free[d][i] = 0;
        }
        self.reserved[i] = Resources::ZERO;
        self.total_reclaimable = self.total_reclaimable.saturating_sub(&self.reclaimable[i]);
        self.reclaimable[i] = Resources::ZERO;
        self.borrowed[i] = Resources::ZERO;
        self.gpu_devices[i] = 0;
        self.gpu_free[i] = [0; MAX_GPU_DEVICES];
        self.ports_total[i] = 0;
        self.ports_free[i] = 0;
        self.free_slots.push(i as u32);
        self.n_live -= 1;
        Ok(())
    }

    /// Whether `request` (and `ports`) fits the free resources of the host in
    /// `slot`, GPU devices included; the first reason if not.
    pub fn fits(&self, slot: usize, request: &Resources, ports: u32) -> Result<(), Misfit> {
        if validate_gpu_request(request[Dim::Gpu]).is_err() {
            return Err(Misfit::InvalidGpuRequest);
        }
        for d in Dim::ALL {
            if request[d] > self.free[d.idx()][slot] {
                return Err(Misfit::Insufficient(d));
            }
        }
        if self.ports_free[slot] < ports {
            return Err(Misfit::Ports);
        }
        if request[Dim::Gpu] > 0
            && gpu_choice(
                &self.gpu_free[slot],
                self.gpu_devices[slot],
                request[Dim::Gpu],
            )
            .is_none()
        {
            return Err(Misfit::GpuFragmented);
        }
        Ok(())
    }

    /// Whether `request` would fit the host in `slot` if the given tasks'
    /// resources (their summed request, ports and GPU grants) were freed
    /// first: the check preemption uses before choosing victims. What is
    /// freed repays the host's loans to revocable tasks before it is free.
    pub fn fits_after_freeing(
        &self,
        slot: usize,
        request: &Resources,
        ports: u32,
        freed: &Resources,
        freed_ports: u32,
        freed_grants: &[GpuGrant],
    ) -> bool {
        if validate_gpu_request(request[Dim::Gpu]).is_err() {
            return false;
        }
        for d in Dim::ALL {
            // What is freed repays what revocable tasks borrowed first
            // (`give_back`).
            let back = freed[d].saturating_sub(self.borrowed[slot][d]);
            if request[d] > self.free[d.idx()][slot] + back {
                return false;
            }
        }
        if self.ports_free[slot] + freed_ports < ports {
            return false;
        }
        if request[Dim::Gpu] == 0 {
            return true;
        }
        let mut devices = self.gpu_free[slot];
        for grant in freed_grants {
            for (i, device) in devices.iter_mut().enumerate() {
                if grant.devices & (1 << i) != 0 {
                    *device += grant.milli_per_device;
                }
            }
        }
        gpu_choice(&devices, self.gpu_devices[slot], request[Dim::Gpu]).is_some()
    }

    /// The next allocation on `slot` takes exactly `grant`'s devices if they
    /// have room for its request and the grant has its shape (a task
    /// adopted on a host keeps the devices its process was started with),
    /// else chooses as usual. One pin at a time; the allocation on `slot`
    /// or [`HostArena::clear_gpu_pin`] ends it.
    pub fn pin_gpu_grant(&mut self, slot: usize, grant: GpuGrant) {
        self.gpu_pin = Some((slot, grant));
    }

    /// Drops a pin [`HostArena::pin_gpu_grant`] left unused.
    pub fn clear_gpu_pin(&mut self) {
        self.gpu_pin = None;
    }

    /// Takes `request` and `ports` from the host in `slot`, choosing GPU
    /// devices: a fractional request goes to the device with the least free
    /// capacity that still fits it (partly used devices fill up before whole
    /// ones are broken); whole-GPU requests take the lowest whole free devices.
    pub fn allocate(
        &mut self,
        slot: usize,
        request: &Resources,
        ports: u32,
    ) -> Result<GpuGrant, Misfit> {
        self.allocate_on(slot, request, ports, None)
    }

    /// [`HostArena::allocate`], a fractional GPU request going to the
    /// lowest device with exactly `device_free` free milli-GPUs when there is
    /// one that fits (else the usual choice).
    pub fn allocate_on(
        &mut self,
        slot: usize,
        request: &Resources,
        ports: u32,
        device_free: Option<u16>,
    ) -> Result<GpuGrant, Misfit> {
        self.fits(slot, request, ports)?;
        let milli = request[Dim::Gpu];
        let n = usize::from(self.gpu_devices[slot]);
        let pinned = if self.gpu_pin.is_some_and(|(s, _)| s == slot) {
            self.gpu_pin
                .take()
                .map(|(_, g)| g)
                .filter(|&g| grant_fits(&self.gpu_free[slot], self.gpu_devices[slot], g, milli))
        } else {
            None
        };
        let chosen = device_free
            .filter(|&f| milli > 0 && milli < MILLI_GPUS_PER_DEVICE && u64::from(f) >= milli)
            .and_then(|f| self.gpu_free[slot][..n].iter().position(|&d| d == f));
        let grant = if let Some(g) = pinned {
            g
        } else if let Some(i) = chosen {
            GpuGrant {
                devices: 1 << i,
                milli_per_device: milli as u16,
            }
        } else if milli > 0 {
            gpu_choice(&self.gpu_free[slot], self.gpu_devices[slot], milli)
                .expect("fits() checked the devices")
        } else {
            GpuGrant::default()
        };
        for i in 0..MAX_GPU_DEVICES {
            if grant.devices & (1 << i) != 0 {
                self.gpu_free[slot][i] -= grant.milli_per_device;
            }
        }
        for d in 0..N_DIMS {
            self.free[d][slot] -= request.0[d];
        }
        self.ports_free[slot] -= ports;
        self.mark(slot);
        Ok(grant)
    }

    /// Resources held on the host in `slot` for no task (see
    /// [`HostArena::reserve`]).
    pub fn reserved(&self, slot: usize) -> Resources {
        self.reserved[slot]
    }

    /// Takes `amount` (cpu, memory, disk; never GPUs) out of the free
    /// resources of the host in `slot` without a task: a volume's disk, or
    /// an instance's resources while it restarts there. Refused, changing
    /// nothing, if it does not fit.
    pub fn reserve(&mut self, slot: usize, amount: &Resources) -> Result<(), Misfit> {
        if amount[Dim::Gpu] > 0 {
            return Err(Misfit::InvalidGpuRequest);
        }
        if let Some(d) = Dim::ALL
            .into_iter()
            .find(|&d| amount[d] > self.free[d.idx()][slot])
        {
            return Err(Misfit::Insufficient(d));
        }
        for d in 0..N_DIMS {
            self.free[d][slot] -= amount.0[d];
        }
        self.reserved[slot].add_assign(amount);
        self.mark(slot);
        Ok(())
    }

    /// Puts back a reservation just taken off with
    /// [`HostArena::unreserve`] (its exact inverse: what that repaid of a
    /// loan is borrowed again). Cannot fail.
    pub fn reserve_back(&mut self, slot: usize, amount: &Resources) {
        for d in 0..N_DIMS {
            let free = self.free[d][slot];
            if free >= amount.0[d] {
                self.free[d][slot] = free - amount.0[d];
            } else {
                self.free[d][slot] = 0;
                self.borrowed[slot].0[d] += amount.0[d] - free;
            }
        }
        self.reserved[slot].add_assign(amount);
        self.mark(slot);
    }

    /// Hands a reservation to the task it was held for, about to be placed
    /// on the host in `slot`: `amount` moves from reserved to free as it
    /// is, repaying no loan (what revocable tasks borrowed was lent from
    /// other tasks' unused allocations, not from this reservation; they
    /// keep it, and the QoS controller evicts them if usage needs it back).
    /// Until the task takes it, `free` and `borrowed` may both be non-zero;
    /// the caller allocates the task and reserves what it did not take, or
    /// puts the whole amount back with [`HostArena::reserve`], which then
    /// cannot fail. Panics if it was not reserved.
    pub fn hand_over(&mut self, slot: usize, amount: &Resources) {
        assert!(
            amount.first_exceeding(&self.reserved[slot]).is_none(),
            "handing over more than is reserved"
        );
        self.reserved[slot] = self.reserved[slot].saturating_sub(amount);
        for d in 0..N_DIMS {
            self.free[d][slot] += amount.0[d];
        }
        self.mark(slot);
    }

    /// Returns what [`HostArena::reserve`] took. Panics if it was not
    /// reserved (a broken invariant of the caller's accounting).
    pub fn unreserve(&mut self, slot: usize, amount: &Resources) {
        assert!(
            amount.first_exceeding(&self.reserved[slot]).is_none(),
            "unreserving more than is reserved"
        );
        self.reserved[slot] = self.reserved[slot].saturating_sub(amount);
        for d in 0..N_DIMS {
            self.give_back(slot, d, amount.0[d]);
        }
        self.mark(slot);
    }

    /// Returns what [`HostArena::allocate`] took. Panics if it was not taken
    /// (a broken invariant of the caller's accounting).
    pub fn release(&mut self, slot: usize, request: &Resources, ports: u32, grant: GpuGrant) {
        for d in 0..N_DIMS {
            self.give_back(slot, d, request.0[d]);
            assert!(
                self.free[d][slot] <= self.capacity[d][slot],
                "release beyond capacity"
            );
        }
        self.ports_free[slot] += ports;
        assert!(
            self.ports_free[slot] <= self.ports_total[slot],
            "ports released twice"
        );
        let mut returned = 0u64;
        for i in 0..MAX_GPU_DEVICES {
            if grant.devices & (1 << i) != 0 {
                self.gpu_free[slot][i] += grant.milli_per_device;
                assert!(u64::from(self.gpu_free[slot][i]) <= MILLI_GPUS_PER_DEVICE);
                returned += u64::from(grant.milli_per_device);
            }
        }
        assert_eq!(returned, request[Dim::Gpu], "the grant matches the request");
        self.mark(slot);
    }

    fn intern_attributes(&mut self, spec: &HostSpec) -> Box<[(Sym, Sym)]> {
        let mut attributes: Vec<(Sym, Sym)> = spec
            .attributes
            .iter()
            .map(|(k, v)| (self.interner.intern(k), self.interner.intern(v)))
            .collect();
        attributes.sort_unstable();
        if self.exclusive_key.is_none() {
            self.exclusive_key = self.interner.get(EXCLUSIVE_KEY);
        }
        attributes.into_boxed_slice()
    }

    fn index_insert(&mut self, i: usize) {
        let slot = i as u32;
        for &(k, v) in self.attributes[i].iter() {
            self.by_value.entry((k, v)).or_default().insert(slot);
            self.by_key.entry(k).or_default().insert(slot);
        }
        self.by_state[self.state[i] as usize].insert(slot);
        if self.state[i] == HostState::Up {
            self.up_capacity = self.up_capacity.saturating_add(&self.capacity(i));
        }
        if self.gpu_devices[i] > 0 {
            self.gpu_hosts.insert(slot);
        }
        self.live_hosts.insert(slot);
    }

    fn index_remove(&mut self, i: usize) {
        let slot = i as u32;
        for &(k, v) in self.attributes[i].iter() {
            if let Some(b) = self.by_value.get_mut(&(k, v)) {
                b.remove(slot);
                if b.is_empty() {
                    self.by_value.remove(&(k, v));
                }
            }
            if let Some(b) = self.by_key.get_mut(&k) {
                b.remove(slot);
                if b.is_empty() {
                    self.by_key.remove(&k);
                }
            }
        }
        if self.by_state[self.state[i] as usize].remove(slot) && self.state[i] == HostState::Up {
            self.up_capacity = self.up_capacity.saturating_sub(&self.capacity(i));
        }
        self.gpu_hosts.remove(slot);
        self.live_hosts.remove(slot);
    }

    fn id_of(&self, slot: u32) -> HostId {
        HostId {
            idx: slot,
            generation: self.generation[slot as usize],
        }
    }

    /// Panics unless every index equals what the columns say, and every
    /// column is within its bounds.
    pub fn check_invariants(&self) {
        let n = self.live.len();
        let mut by_value: HashMap<(Sym, Sym), RoaringBitmap> = HashMap::new();
        let mut by_key: HashMap<Sym, RoaringBitmap> = HashMap::new();
        let mut by_state: [RoaringBitmap; 3] = Default::default();
        let mut gpu = RoaringBitmap::new();
        let mut live = RoaringBitmap::new();
        let mut up_capacity = Resources::ZERO;
        let mut n_live = 0;
        for i in 0..n {
            if !self.live[i] {
                continue;
            }
            n_live += 1;
            let slot = i as u32;
            assert_eq!(self.by_name.get(&self.name[i]), Some(&slot), "name index");
            for &(k, v) in self.attributes[i].iter() {
                by_value.entry((k, v)).or_default().insert(slot);
                by_key.entry(k).or_default().insert(slot);
            }
            by_state[self.state[i] as usize].insert(slot);
            if self.state[i] == HostState::Up {
                up_capacity = up_capacity.saturating_add(&self.capacity(i));
            }
            if self.gpu_devices[i] > 0 {
                gpu.insert(slot);
            }
            live.insert(slot);
            for d in 0..N_DIMS {
                assert!(
                    self.free[d][i] <= self.capacity[d][i],
                    "free within capacity"
                );
                assert!(
                    self.free[d][i] == 0 || self.borrowed[i].0[d] == 0,
                    "free or borrowed, not both"
                );
            }
            assert_eq!(self.borrowed[i][Dim::Gpu], 0, "GPUs are never borrowed");
            assert!(usize::from(self.gpu_devices[i]) <= MAX_GPU_DEVICES);
            let devices = &self.gpu_free[i];
            let mut gpu_free = 0u64;
            for (j, &f) in devices.iter().enumerate() {
                assert!(u64::from(f) <= MILLI_GPUS_PER_DEVICE);
                if j >= usize::from(self.gpu_devices[i]) {
                    assert_eq!(f, 0, "no capacity on absent devices");
                }
                gpu_free += u64::from(f);
            }
            assert_eq!(
                gpu_free,
                self.free[Dim::Gpu.idx()][i],
                "gpu free is the devices' sum"
            );
            assert_eq!(
                self.capacity[Dim::Gpu.idx()][i],
                u64::from(self.gpu_devices[i]) * MILLI_GPUS_PER_DEVICE
            );
            assert!(self.ports_free[i] <= self.ports_total[i]);
        }
        assert_eq!(n_live, self.n_live);
        assert_eq!(up_capacity, self.up_capacity, "summed capacity of up hosts");
        let mut reclaimable = Resources::ZERO;
        for i in 0..n {
            if self.live[i] {
                reclaimable.add_assign(&self.reclaimable[i]);
            }
        }
        assert_eq!(reclaimable, self.total_reclaimable, "total reclaimable");
        assert_eq!(self.by_name.len(), n_live);
        assert_eq!(self.free_slots.len(), n - n_live);
        assert_eq!(
            by_value, self.by_value,
            "attribute value index agrees with the columns"
        );
        assert_eq!(
            by_key, self.by_key,
            "attribute key index agrees with the columns"
        );
        assert_eq!(
            by_state, self.by_state,
            "state index agrees with the columns"
        );
        assert_eq!(gpu, self.gpu_hosts, "GPU index agrees with the columns");
        assert_eq!(live, self.live_hosts);
    }
}

/// Whether `grant` is a shape for a request of `milli` (one device with
/// `milli` of it below one GPU, else `milli / 1000` whole devices) on
/// devices of these that have that much free.
fn grant_fits(free: &[u16; MAX_GPU_DEVICES], n_devices: u8, grant: GpuGrant, milli: u64) -> bool {
    let n = grant.devices.count_ones();
    let shape = if milli < MILLI_GPUS_PER_DEVICE {
        n == 1 && u64::from(grant.milli_per_device) == milli
    } else {
        u64::from(n) * MILLI_GPUS_PER_DEVICE == milli
            && u64::from(grant.milli_per_device) == MILLI_GPUS_PER_DEVICE
    };
    milli > 0
        && shape
        && (0..MAX_GPU_DEVICES).all(|i| {
            grant.devices & (1 << i) == 0
                || (i < usize::from(n_devices) && free[i] >= grant.milli_per_device)
        })
}

/// Where a GPU request of `milli` goes on these devices, if anywhere.
fn gpu_choice(free: &[u16; MAX_GPU_DEVICES], n_devices: u8, milli: u64) -> Option<GpuGrant> {
    let n = usize::from(n_devices);
    if milli < MILLI_GPUS_PER_DEVICE {
        // Best fit: the least free device that still fits; partly used
        // devices are preferred to whole ones by construction.
        let mut best: Option<usize> = None;
        for (i, &f) in free[..n].iter().enumerate() {
            if u64::from(f) >= milli && best.is_none_or(|b| f < free[b]) {
                best = Some(i);
            }
        }
        best.map(|i| GpuGrant {
            devices: 1 << i,
            milli_per_device: milli as u16,
        })
    } else {
        let want = (milli / MILLI_GPUS_PER_DEVICE) as usize;
        let mut mask = 0u16;
        let mut got = 0;
        for (i, &f) in free[..n].iter().enumerate() {
            if got < want && u64::from(f) == MILLI_GPUS_PER_DEVICE {
                mask |= 1 << i;
                got += 1;
            }
        }
        (got == want).then_some(GpuGrant {
            devices: mask,
            milli_per_device: MILLI_GPUS_PER_DEVICE as u16,
        })
    }
}

fn validate_spec(spec: &HostSpec) -> Result<(), HostError> {
    let invalid = |field: &str, problem: String| HostError::Invalid {
        host: spec.name.clone(),
        field: field.to_owned(),
        problem,
    };
    if spec.name.is_empty() || spec.name.len() > MAX_HOST_NAME_LEN {
        return Err(invalid(
            "name",
            format!("must be 1 to {MAX_HOST_NAME_LEN} bytes"),
        ));
    }
    if spec
        .name
        .chars()
        .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(invalid(
            "name",
            "must not contain whitespace or control characters".into(),
        ));
    }
    for d in Dim::ALL {
        if spec.capacity[d] > MAX_AMOUNT {
            return Err(invalid(
                &format!("capacity.{d}"),
                format!("{} exceeds the maximum {MAX_AMOUNT}", spec.capacity[d]),
            ));
        }
    }
    if usize::from(spec.gpu_devices) > MAX_GPU_DEVICES {
        return Err(invalid(
            "gpu_devices",
            format!("{} exceeds {MAX_GPU_DEVICES}", spec.gpu_devices),
        ));
    }
    let gpu = u64::from(spec.gpu_devices) * MILLI_GPUS_PER_DEVICE;
    if spec.capacity[Dim::Gpu] != gpu {
        return Err(invalid(
            "capacity.gpu",
            format!(
                "{} milli-GPUs, but {} devices make {gpu}",
                spec.capacity[Dim::Gpu],
                spec.gpu_devices
            ),
        ));
    }
    if spec.attributes.len() > MAX_ATTRIBUTES {
        return Err(invalid(
            "attributes",
            format!(
                "{} attributes exceed the limit of {MAX_ATTRIBUTES}",
                spec.attributes.len()
            ),
        ));
    }
    let mut keys: Vec<&str> = Vec::with_capacity(spec.attributes.len());
    for (k, v) in &spec.attributes {
        validate_attribute_word(k)
            .map_err(|p| invalid(&format!("attributes.{k}"), format!("key {p}")))?;
        validate_attribute_word(v)
            .map_err(|p| invalid(&format!("attributes.{k}"), format!("value {p}")))?;
        keys.push(k);
    }
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(invalid(
            &format!("attributes.{}", w[0]),
            "appears more than once".into(),
        ));
    }
    Ok(())
}

/// Attribute keys and values: 1–128 bytes of letters, digits and `_ . - / :`.
pub fn validate_attribute_word(word: &str) -> Result<(), String> {
    if word.is_empty() || word.len() > MAX_ATTRIBUTE_LEN {
        return Err(format!("{word:?} must be 1 to {MAX_ATTRIBUTE_LEN} bytes"));
    }
    if let Some(c) = word.chars().find(|&c| !is_word_char(c)) {
        return Err(format!(
            "{word:?} has {c:?}; use letters, digits and _ . - / :"
        ));
    }
    Ok(())
}

pub(crate) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':')
}
