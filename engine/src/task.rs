//! The task arena: every task the engine knows, as columns indexed by a
//! dense `u32` slot with a generation (a stale [`TaskHandle`] is detected).
//! About 100 bytes per task, so 10,000,000 tasks fit in about 1 GB.

use std::fmt;

use crate::host::GpuGrant;
use crate::resources::Resources;

/// Default bound on the number of tasks.
pub const DEFAULT_MAX_TASKS: usize = 10_000_000;
/// Marks "no host" in the host column.
pub const NO_HOST: u32 = u32::MAX;
/// Marks "no gang" in the gang column.
pub const NO_GANG: u32 = u32::MAX;

/// Handle of a task: dense slot and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskHandle {
    idx: u32,
    generation: u32,
}

impl TaskHandle {
    /// Dense slot index.
    pub fn idx(self) -> usize {
        self.idx as usize
    }

    /// The handle as one number (slot in the low half), e.g. for
    /// [`crate::TaskId`] in admission.
    pub fn to_u64(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.idx)
    }

    /// The inverse of [`TaskHandle::to_u64`].
    pub fn from_u64(value: u64) -> Self {
        TaskHandle {
            idx: value as u32,
            generation: (value >> 32) as u32,
        }
    }
}

/// Where a task is in the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Waiting for admission.
    #[default]
    Pending,
    /// Admitted, waiting for a host.
    Admitted,
    /// Holding resources on a host.
    Placed,
}

/// How placement picks among the hosts a task fits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// Best fit: fewest hosts, least stranded capacity.
    #[default]
    Pack,
    /// Least allocated host first.
    Spread,
    /// Lowest host slot that fits.
    FirstFit,
    /// GPU packing by capacity-aware fragmentation descent
    /// ([`crate::gpufrag`]): the host whose fragmentation against the
    /// workload mix grows least.
    GpuFrag,
}

impl Strategy {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Pack => "pack",
            Strategy::Spread => "spread",
            Strategy::FirstFit => "first_fit",
            Strategy::GpuFrag => "gpu_frag",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bit flags of a task.
pub mod flags {
    /// May be preempted.
    pub const PREEMPTIBLE: u8 = 1;
    /// Runs on slack.
    pub const REVOCABLE: u8 = 2;
    /// A controller task.
    pub const CONTROLLER: u8 = 4;
    /// May run on GPU hosts without requesting GPUs (the pool allows it).
    pub const MAY_USE_GPU_HOSTS: u8 = 8;
    /// A daemon: pinned to its host, it may evict preemptible non-daemon
    /// tasks of any pool there to fit, and is never evicted for another
    /// pinned task.
    pub const DAEMON: u8 = 16;
}

/// What a new task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    /// The caller's job number.
    pub job: u32,
    /// Instance within the job.
    pub instance: u32,
    /// Pool slot.
    pub pool: u32,
    /// Priority (higher first).
    pub priority: u32,
    /// Resources requested.
    pub request: Resources,
    /// Dynamic ports requested.
    pub ports: u16,
    /// [`flags`] bits.
    pub flags: u8,
    /// Gang number, or [`NO_GANG`].
    pub gang: u32,
    /// Interned constraint number (0 = none).
    pub constraint: u32,
    /// Placement strategy.
    pub strategy: Strategy,
    /// At most this many tasks with this task's `limit_key` on one host
    /// (0 = no limit): anti-affinity and spreading.
    pub max_per_host: u16,
    /// What `max_per_host` counts: the job number, or a task label's number
    /// when the limit is per label. The caller chooses.
    pub limit_key: u32,
    /// The only host slot the task may be placed on ([`NO_HOST`]: any).
    pub desired_host: u32,
    /// How long it is expected to run once placed, in ms (0: unknown):
    /// what backfill and reservations plan with.
    pub runtime_ms: u64,
}

impl Default for TaskSpec {
    fn default() -> Self {
        TaskSpec {
            job: 0,
            instance: 0,
            pool: 0,
            priority: 0,
            request: Resources::ZERO,
            ports: 0,
            flags: 0,
            gang: NO_GANG,
            constraint: 0,
            strategy: Strategy::default(),
            max_per_host: 0,
            limit_key: 0,
            desired_host: NO_HOST,
            runtime_ms: 0,
        }
    }
}

/// A placed task, as preemption sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacedView {
    /// The task.
    pub task: TaskHandle,
    /// Pool slot.
    pub pool: u32,
    /// Priority.
    pub priority: u32,
    /// [`flags`] bits.
    pub flags: u8,
    /// Request.
    pub request: Resources,
    /// Ports.
    pub ports: u16,
    /// Host slot.
    pub host: u32,
    /// GPU devices held.
    pub gpu: GpuGrant,
    /// When it was placed.
    pub start_ms: u64,
    /// When it last reported a checkpoint (0: never).
    pub checkpoint_ms: u64,
    /// Expected runtime in ms (0: unknown).
    pub runtime_ms: u64,
    /// Arrival number (breaks ties of start time).
    pub arrival: u64,
}

impl PlacedView {
    /// When it is expected to end (`u64::MAX`: unknown), never before
    /// `now_ms` (a task past its estimate may end at any moment).
    pub fn expected_end(&self, now_ms: u64) -> u64 {
        expected_end(self.start_ms, self.runtime_ms, now_ms)
    }

    /// Up to when its work is saved: its last checkpoint, else its start.
    /// Preempting it at `now` loses `now - saved_ms()` of work.
    pub fn saved_ms(&self) -> u64 {
        self.start_ms.max(self.checkpoint_ms)
    }
}

/// When a task placed at `start_ms` with an expected runtime of
/// `runtime_ms` (0: unknown, `u64::MAX` returned) is expected to end,
/// never before `now_ms`.
pub fn expected_end(start_ms: u64, runtime_ms: u64, now_ms: u64) -> u64 {
    if runtime_ms == 0 {
        return u64::MAX;
    }
    start_ms.saturating_add(runtime_ms).max(now_ms)
}

/// Why the arena refused a task.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The bound on tasks is reached.
    #[error("the limit of {limit} tasks is reached")]
    TooManyTasks {
        /// The bound.
        limit: usize,
    },
    /// A stale or unknown handle.
    #[error("no such task")]
    NotFound,
    /// The change needs the task on a host, or off one.
    #[error("task is {state:?}: {action}")]
    WrongState {
        /// Its state.
        state: TaskState,
        /// What could not be done.
        action: &'static str,
    },
}

/// All tasks, as columns.
#[derive(Clone, Debug, Default)]
pub struct TaskArena {
    max_tasks: usize,
    generation: Vec<u32>,
    live: Vec<bool>,
    job: Vec<u32>,
    instance: Vec<u32>,
    pool: Vec<u32>,
    priority: Vec<u32>,
    request: Vec<Resources>,
    ports: Vec<u16>,
    max_per_host: Vec<u16>,
    limit_key: Vec<u32>,
    desired_host: Vec<u32>,
    flags: Vec<u8>,
    strategy: Vec<Strategy>,
    state: Vec<TaskState>,
    gang: Vec<u32>,
    constraint: Vec<u32>,
    host: Vec<u32>,
    gpu: Vec<GpuGrant>,
    arrival: Vec<u64>,
    start_ms: Vec<u64>,
    /// When a placed task last reported a checkpoint (0: never).
    checkpoint_ms: Vec<u64>,
    /// Expected runtime in ms (0: unknown).
    runtime_ms: Vec<u64>,
    /// Position of a placed task in its host's list (`on_host`).
    host_pos: Vec<u32>,
    /// Placed tasks by host slot: a host's tasks without a scan of all.
    on_host: Vec<Vec<u32>>,
    /// Position of a placed task in its pool's list (`in_pool`).
    pool_pos: Vec<u32>,
    /// Placed tasks by pool slot: a pool's preemption candidates without a
    /// scan of all.
    in_pool: Vec<Vec<u32>>,
    free_slots: Vec<u32>,
    next_arrival: u64,
    n_live: usize,
}

impl TaskArena {
    /// An empty arena holding at most `max_tasks` tasks.
    pub fn new(max_tasks: usize) -> Self {
        assert!(max_tasks <= u32::MAX as usize, "task slots fit in u32");
        TaskArena {
            max_tasks,
            next_arrival: 1,
            ..Default::default()
        }
    }

    /// Live tasks.
    pub fn len(&self) -> usize {
        self.n_live
    }

    /// True when no task is live.
    pub fn is_empty(&self) -> bool {
        self.n_live == 0
    }

    /// Most live tasks the arena holds.
    pub fn limit(&self) -> usize {
        self.max_tasks
    }

    /// Slots (live or free).
    pub fn n_slots(&self) -> usize {
        self.live.len()
    }

    /// Reserves room for `additional` more tasks in every column.
    pub fn reserve(&mut self, additional: usize) {
        macro_rules! reserve_all {
            ($($c:ident),*) => { $( self.$c.reserve(additional); )* };
        }
        reserve_all!(
            generation,
            live,
            job,
            instance,
            pool,
            priority,
            request,
            ports,
            max_per_host,
            limit_key,
            desired_host,
            flags,
            strategy,
            state,
            gang,
            constraint,
            host,
            gpu,
            arrival,
            start_ms,
            checkpoint_ms,
            runtime_ms,
            host_pos,
            pool_pos
        );
    }

    /// Adds a task in state `Pending`; its arrival number orders it among
    /// equal priorities.
    pub fn add(&mut self, spec: &TaskSpec) -> Result<TaskHandle, TaskError> {
        if self.n_live >= self.max_tasks {
            return Err(TaskError::TooManyTasks {
                limit: self.max_tasks,
            });
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                let i = slot as usize;
                self.generation[i] = self.generation[i].wrapping_add(1);
                self.live[i] = true;
                self.job[i] = spec.job;
                self.instance[i] = spec.instance;
                self.pool[i] = spec.pool;
                self.priority[i] = spec.priority;
                self.request[i] = spec.request;
                self.ports[i] = spec.ports;
                self.max_per_host[i] = spec.max_per_host;
                self.limit_key[i] = spec.limit_key;
                self.desired_host[i] = spec.desired_host;
                self.flags[i] = spec.flags;
                self.strategy[i] = spec.strategy;
                self.state[i] = TaskState::Pending;
                self.gang[i] = spec.gang;
                self.constraint[i] = spec.constraint;
                self.host[i] = NO_HOST;
                self.gpu[i] = GpuGrant::default();
                self.arrival[i] = arrival;
                self.start_ms[i] = 0;
                self.checkpoint_ms[i] = 0;
                self.runtime_ms[i] = spec.runtime_ms;
                self.host_pos[i] = u32::MAX;
                self.pool_pos[i] = u32::MAX;
                slot
            }
            None => {
                let slot = u32::try_from(self.live.len()).expect("task slots fit in u32");
                self.generation.push(0);
                self.live.push(true);
                self.job.push(spec.job);
                self.instance.push(spec.instance);
                self.pool.push(spec.pool);
                self.priority.push(spec.priority);
                self.request.push(spec.request);
                self.ports.push(spec.ports);
                self.max_per_host.push(spec.max_per_host);
                self.limit_key.push(spec.limit_key);
                self.desired_host.push(spec.desired_host);
                self.flags.push(spec.flags);
                self.strategy.push(spec.strategy);
                self.state.push(TaskState::Pending);
                self.gang.push(spec.gang);
                self.constraint.push(spec.constraint);
                self.host.push(NO_HOST);
                self.gpu.push(GpuGrant::default());
                self.arrival.push(arrival);
                self.start_ms.push(0);
                self.checkpoint_ms.push(0);
                self.runtime_ms.push(spec.runtime_ms);
                self.host_pos.push(u32::MAX);
                self.pool_pos.push(u32::MAX);
                slot
            }
        };
        self.n_live += 1;
        Ok(TaskHandle {
            idx: slot,
            generation: self.generation[slot as usize],
        })
    }

    /// `Ok` if `handle` names a live task, `NotFound` otherwise.
    fn check(&self, handle: TaskHandle) -> Result<(), TaskError> {
        if self.contains(handle) {
            Ok(())
        } else {
            Err(TaskError::NotFound)
        }
    }

    /// True if `handle` names a live task.
    pub fn contains(&self, handle: TaskHandle) -> bool {
        let i = handle.idx();
        i < self.live.len() && self.live[i] && self.generation[i] == handle.generation
    }

    /// Removes a task that is not on a host (take it off first, so its
    /// resources are released); its slot is reused under a new generation.
    pub fn remove(&mut self, handle: TaskHandle) -> Result<(), TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        if self.state[i] == TaskState::Placed {
            return Err(TaskError::WrongState {
                state: TaskState::Placed,
                action: "unplace it before removing it",
            });
        }
        self.live[i] = false;
        self.host[i] = NO_HOST;
        self.free_slots.push(handle.idx);
        self.n_live -= 1;
        Ok(())
    }

    /// The spec a live task was added with.
    pub fn spec(&self, handle: TaskHandle) -> Result<TaskSpec, TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        Ok(TaskSpec {
            job: self.job[i],
            instance: self.instance[i],
            pool: self.pool[i],
            priority: self.priority[i],
            request: self.request[i],
            ports: self.ports[i],
            flags: self.flags[i],
            gang: self.gang[i],
            constraint: self.constraint[i],
            strategy: self.strategy[i],
            max_per_host: self.max_per_host[i],
            limit_key: self.limit_key[i],
            desired_host: self.desired_host[i],
            runtime_ms: self.runtime_ms[i],
        })
    }

    /// What releasing a live task's resources needs: its request, ports,
    /// per-host limit and what the limit counts (four columns, where
    /// [`TaskArena::spec`] reads thirteen).
    pub fn release_view(
        &self,
        handle: TaskHandle,
    ) -> Result<(Resources, u16, u16, u32), TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        Ok((
            self.request[i],
            self.ports[i],
            self.max_per_host[i],
            self.limit_key[i],
        ))
    }

    /// Moves placed tasks between their own slots so that `order`'s tasks
    /// take those slots in ascending order (its first the lowest); returns
    /// their new handles, in `order`'s order. Only `order`'s slots change
    /// hands: every other task keeps its handle, and a moved task keeps all
    /// it has (generation included) and its place in its host's and pool's
    /// lists. A forecast's fork orders its running tasks by end this way,
    /// so that ending them walks the columns forward instead of at random
    /// slots. Refused, changing nothing, unless every task of `order` is
    /// live and placed and none is named twice.
    pub fn renumber_placed(&mut self, order: &[TaskHandle]) -> Result<Vec<TaskHandle>, TaskError> {
        let mut slots: Vec<u32> = Vec::with_capacity(order.len());
        for &t in order {
            if self.state(t)? != TaskState::Placed {
                return Err(TaskError::WrongState {
                    state: self.state[t.idx()],
                    action: "only placed tasks are renumbered",
                });
            }
            slots.push(t.idx);
        }
        let mut targets = slots.clone();
        targets.sort_unstable();
        if targets.windows(2).any(|w| w[0] == w[1]) {
            return Err(TaskError::WrongState {
                state: TaskState::Placed,
                action: "a task is named twice",
            });
        }
        macro_rules! move_all {
            ($($c:ident),*) => { $(
                let moved: Vec<_> = slots.iter().map(|&o| self.$c[o as usize].clone()).collect();
                for (&n, v) in targets.iter().zip(moved) {
                    self.$c[n as usize] = v;
                }
            )* };
        }
        move_all!(
            generation,
            job,
            instance,
            pool,
            priority,
            request,
            ports,
            max_per_host,
            limit_key,
            desired_host,
            flags,
            strategy,
            gang,
            constraint,
            host,
            gpu,
            arrival,
            start_ms,
            checkpoint_ms,
            runtime_ms,
            host_pos,
            pool_pos
        );
        // `live` and `state` are the same (live, placed) at every slot moved.
        for &n in &targets {
            let i = n as usize;
            self.on_host[self.host[i] as usize][self.host_pos[i] as usize] = n;
            self.in_pool[self.pool[i] as usize][self.pool_pos[i] as usize] = n;
        }
        Ok(targets
            .iter()
            .map(|&n| TaskHandle {
                idx: n,
                generation: self.generation[n as usize],
            })
            .collect())
    }

    /// Reads what ending `handle` will read and write (its columns, its
    /// place in its host's and pool's lists, the task those lists would
    /// move into its place), changing nothing; returns a value made from
    /// them, for the caller to keep the reads. Run over a batch of ends
    /// first, the reads are independent and overlap in memory, and ending
    /// each finds them in cache (one at a time, each end waited for its
    /// misses in turn).
    pub fn warm_for_end(&self, handle: TaskHandle) -> u64 {
        let i = handle.idx();
        if !self.contains(handle) {
            return 0;
        }
        let mut x = u64::from(self.pool[i])
            ^ u64::from(self.flags[i])
            ^ self.request[i].0[0]
            ^ u64::from(self.ports[i])
            ^ u64::from(self.max_per_host[i])
            ^ u64::from(self.limit_key[i])
            ^ u64::from(self.priority[i])
            ^ u64::from(self.gpu[i].devices)
            ^ self.start_ms[i]
            ^ self.checkpoint_ms[i]
            ^ self.runtime_ms[i]
            ^ self.arrival[i]
            ^ self.state[i] as u64;
        let host = self.host[i];
        if host != NO_HOST {
            if let Some(list) = self.on_host.get(host as usize)
                && let Some(&last) = list.last()
            {
                x ^= u64::from(self.host_pos[last as usize]);
                // The task's own place in the list: the swap writes there.
                x ^= u64::from(list.get(self.host_pos[i] as usize).copied().unwrap_or(0));
            }
            x ^= u64::from(self.host_pos[i]);
        }
        if let Some(list) = self.in_pool.get(self.pool[i] as usize)
            && let Some(&last) = list.last()
        {
            x ^= u64::from(self.pool_pos[last as usize]);
            x ^= u64::from(list.get(self.pool_pos[i] as usize).copied().unwrap_or(0));
        }
        x ^ u64::from(self.pool_pos[i])
    }

    /// A live task's pool slot, flags and request.
    pub fn pool_flags_request(
        &self,
        handle: TaskHandle,
    ) -> Result<(u32, u8, Resources), TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        Ok((self.pool[i], self.flags[i], self.request[i]))
    }

    /// The flags of a live task ([`flags`]).
    pub fn flags(&self, handle: TaskHandle) -> Result<u8, TaskError> {
        self.check(handle)?;
        Ok(self.flags[handle.idx()])
    }

    /// State of a live task.
    pub fn state(&self, handle: TaskHandle) -> Result<TaskState, TaskError> {
        self.check(handle)?;
        Ok(self.state[handle.idx()])
    }

    /// Moves a live task between `Pending` and `Admitted`. Placing and
    /// unplacing go through [`TaskArena::set_placed`] and
    /// [`TaskArena::set_unplaced`] (the placer's), so a host reservation is
    /// never created or dropped by a bare state change.
    pub fn set_state(&mut self, handle: TaskHandle, state: TaskState) -> Result<(), TaskError> {
        self.check(handle)?;
        let current = self.state[handle.idx()];
        if current == TaskState::Placed || state == TaskState::Placed {
            return Err(TaskError::WrongState {
                state: current,
                action: "use set_placed / set_unplaced",
            });
        }
        self.state[handle.idx()] = state;
        Ok(())
    }

    /// Records a placement: host slot, GPU devices, start time.
    pub fn set_placed(
        &mut self,
        handle: TaskHandle,
        host: u32,
        gpu: GpuGrant,
        start_ms: u64,
    ) -> Result<(), TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        if self.state[i] == TaskState::Placed {
            return Err(TaskError::WrongState {
                state: TaskState::Placed,
                action: "already on a host",
            });
        }
        self.state[i] = TaskState::Placed;
        self.host[i] = host;
        self.gpu[i] = gpu;
        self.start_ms[i] = start_ms;
        self.checkpoint_ms[i] = 0;
        let h = host as usize;
        if self.on_host.len() <= h {
            self.on_host.resize_with(h + 1, Vec::new);
        }
        self.host_pos[i] = self.on_host[h].len() as u32;
        self.on_host[h].push(i as u32);
        let p = self.pool[i] as usize;
        if self.in_pool.len() <= p {
            self.in_pool.resize_with(p + 1, Vec::new);
        }
        self.pool_pos[i] = self.in_pool[p].len() as u32;
        self.in_pool[p].push(i as u32);
        Ok(())
    }

    /// Takes task slot `i` out of its host's list (O(1): swap-remove).
    fn leave_host(&mut self, i: usize) {
        let list = &mut self.on_host[self.host[i] as usize];
        let pos = self.host_pos[i] as usize;
        debug_assert_eq!(list[pos], i as u32);
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            self.host_pos[moved as usize] = pos as u32;
        }
        self.host_pos[i] = u32::MAX;
        let list = &mut self.in_pool[self.pool[i] as usize];
        let pos = self.pool_pos[i] as usize;
        debug_assert_eq!(list[pos], i as u32);
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            self.pool_pos[moved as usize] = pos as u32;
        }
        self.pool_pos[i] = u32::MAX;
    }

    /// The placed tasks of pool slot `pool`, as preemption sees them, in no
    /// particular order.
    pub fn placed_in_pool(&self, pool: u32) -> impl Iterator<Item = PlacedView> + '_ {
        self.in_pool
            .get(pool as usize)
            .map_or(&[][..], |l| l.as_slice())
            .iter()
            .map(|&i| self.view(i as usize))
    }

    /// The tasks placed on host `slot`, as preemption sees them, in no
    /// particular order.
    pub fn placed_on_host(&self, slot: u32) -> impl Iterator<Item = PlacedView> + '_ {
        self.on_host
            .get(slot as usize)
            .map_or(&[][..], |l| l.as_slice())
            .iter()
            .map(|&i| self.view(i as usize))
    }

    fn view(&self, i: usize) -> PlacedView {
        PlacedView {
            task: TaskHandle {
                idx: i as u32,
                generation: self.generation[i],
            },
            pool: self.pool[i],
            priority: self.priority[i],
            flags: self.flags[i],
            request: self.request[i],
            ports: self.ports[i],
            host: self.host[i],
            gpu: self.gpu[i],
            start_ms: self.start_ms[i],
            checkpoint_ms: self.checkpoint_ms[i],
            runtime_ms: self.runtime_ms[i],
            arrival: self.arrival[i],
        }
    }

    /// The tasks placed on host `slot`, in no particular order.
    pub fn on_host(&self, slot: u32) -> impl Iterator<Item = TaskHandle> + '_ {
        self.on_host
            .get(slot as usize)
            .map_or(&[][..], |l| l.as_slice())
            .iter()
            .map(|&i| TaskHandle {
                idx: i,
                generation: self.generation[i as usize],
            })
    }

    /// The caller's (job, instance) numbers of a live task.
    pub fn owner(&self, handle: TaskHandle) -> Result<(u32, u32), TaskError> {
        self.check(handle)?;
        Ok((self.job[handle.idx()], self.instance[handle.idx()]))
    }

    /// Takes a placed task off its host record; it goes back to `state`
    /// (`Admitted`, or what it was before a rolled-back placement).
    pub fn set_unplaced(&mut self, handle: TaskHandle, state: TaskState) -> Result<(), TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        if self.state[i] != TaskState::Placed || state == TaskState::Placed {
            return Err(TaskError::WrongState {
                state: self.state[i],
                action: "not on a host",
            });
        }
        self.leave_host(i);
        self.state[i] = state;
        self.host[i] = NO_HOST;
        self.gpu[i] = GpuGrant::default();
        Ok(())
    }

    /// GPU devices a live task holds.
    pub fn gpu(&self, handle: TaskHandle) -> Result<GpuGrant, TaskError> {
        self.check(handle)?;
        Ok(self.gpu[handle.idx()])
    }

    /// Every placed task: handle, host slot, request.
    pub fn placed(&self) -> impl Iterator<Item = (TaskHandle, u32, Resources)> + '_ {
        (0..self.live.len())
            .filter(|&i| self.live[i] && self.host[i] != NO_HOST)
            .map(|i| {
                (
                    TaskHandle {
                        idx: i as u32,
                        generation: self.generation[i],
                    },
                    self.host[i],
                    self.request[i],
                )
            })
    }

    /// Every live task and where it is, in slot order.
    pub fn all(&self) -> impl Iterator<Item = (TaskHandle, TaskState)> + '_ {
        (0..self.live.len()).filter(|&i| self.live[i]).map(|i| {
            (
                TaskHandle {
                    idx: i as u32,
                    generation: self.generation[i],
                },
                self.state[i],
            )
        })
    }

    /// When a live task was placed (0 if it is not).
    pub fn start_ms(&self, handle: TaskHandle) -> Result<u64, TaskError> {
        self.check(handle)?;
        Ok(self.start_ms[handle.idx()])
    }

    /// Records that a placed task saved its work at `at_ms` (its last
    /// checkpoint): preemption prefers, among equals, the victims that lose
    /// least. An older time than the one recorded changes nothing.
    pub fn set_checkpoint(&mut self, handle: TaskHandle, at_ms: u64) -> Result<(), TaskError> {
        self.check(handle)?;
        let i = handle.idx();
        if self.state[i] != TaskState::Placed {
            return Err(TaskError::WrongState {
                state: self.state[i],
                action: "only a placed task checkpoints",
            });
        }
        self.checkpoint_ms[i] = self.checkpoint_ms[i].max(at_ms);
        Ok(())
    }

    /// A live task as preemption sees it (host [`NO_HOST`] if not placed).
    pub fn placed_view(&self, handle: TaskHandle) -> Result<PlacedView, TaskError> {
        self.check(handle)?;
        Ok(self.view(handle.idx()))
    }

    /// Every placed task with what preemption needs to rank it.
    pub fn placed_views(&self) -> impl Iterator<Item = PlacedView> + '_ {
        (0..self.live.len())
            .filter(|&i| self.live[i] && self.host[i] != NO_HOST)
            .map(|i| self.view(i))
    }

    /// Host slot of a live task, if placed.
    pub fn host(&self, handle: TaskHandle) -> Result<Option<u32>, TaskError> {
        self.check(handle)?;
        let h = self.host[handle.idx()];
        Ok((h != NO_HOST).then_some(h))
    }

    /// Expected runtime of a live task in ms (0: unknown).
    pub fn runtime_ms(&self, handle: TaskHandle) -> Result<u64, TaskError> {
        self.check(handle)?;
        Ok(self.runtime_ms[handle.idx()])
    }

    /// Arrival number of a live task.
    pub fn arrival(&self, handle: TaskHandle) -> Result<u64, TaskError> {
        self.check(handle)?;
        Ok(self.arrival[handle.idx()])
    }

    /// Bytes the columns use per slot (capacity, not length).
    pub fn bytes_per_slot() -> usize {
        use std::mem::size_of;
        size_of::<[u32; 8]>() // generation, job, instance, pool, priority, gang, constraint, limit_key
            + size_of::<u32>() * 2 // host, desired_host
            + size_of::<bool>()
            + size_of::<Resources>()
            + size_of::<u16>() * 2
            + size_of::<u8>()
            + size_of::<Strategy>()
            + size_of::<TaskState>()
            + size_of::<GpuGrant>()
            + size_of::<u64>() * 4 // arrival, start_ms, checkpoint_ms, runtime_ms
            + size_of::<u32>() * 2 // host_pos, pool_pos
    }

    /// Panics unless the columns agree.
    pub fn check_invariants(&self) {
        let n = self.live.len();
        for len in [
            self.generation.len(),
            self.job.len(),
            self.instance.len(),
            self.pool.len(),
            self.priority.len(),
            self.request.len(),
            self.ports.len(),
            self.max_per_host.len(),
            self.limit_key.len(),
            self.flags.len(),
            self.strategy.len(),
            self.state.len(),
            self.gang.len(),
            self.constraint.len(),
            self.host.len(),
            self.gpu.len(),
            self.arrival.len(),
            self.start_ms.len(),
            self.checkpoint_ms.len(),
            self.runtime_ms.len(),
            self.host_pos.len(),
            self.pool_pos.len(),
        ] {
            assert_eq!(len, n, "task columns have equal length");
        }
        assert_eq!(self.live.iter().filter(|&&l| l).count(), self.n_live);
        assert_eq!(self.free_slots.len() + self.n_live, n);
        for i in 0..n {
            if self.live[i] {
                assert_eq!(
                    self.state[i] == TaskState::Placed,
                    self.host[i] != NO_HOST,
                    "placed iff on a host"
                );
                assert!(self.arrival[i] < self.next_arrival);
                if self.host[i] != NO_HOST {
                    let list = &self.on_host[self.host[i] as usize];
                    assert_eq!(
                        list[self.host_pos[i] as usize], i as u32,
                        "a placed task is in its host's list"
                    );
                    let list = &self.in_pool[self.pool[i] as usize];
                    assert_eq!(
                        list[self.pool_pos[i] as usize], i as u32,
                        "a placed task is in its pool's list"
                    );
                }
            } else {
                assert_eq!(self.host[i], NO_HOST);
            }
        }
        let listed: usize = self.on_host.iter().map(Vec::len).sum();
        let placed = (0..n)
            .filter(|&i| self.live[i] && self.host[i] != NO_HOST)
            .count();
        assert_eq!(listed, placed, "host lists hold exactly the placed tasks");
        let listed: usize = self.in_pool.iter().map(Vec::len).sum();
        assert_eq!(listed, placed, "pool lists hold exactly the placed tasks");
    }
}
