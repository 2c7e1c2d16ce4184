//! Random operations on a [`Sim`], checked against a small model of what
//! each job must reach: the model-based test of the core.
//!
//! A [`Scenario`] is a few hosts and a list of [`Op`]s: pools, jobs,
//! cycles, time, run ends and health verdicts on the agents, kills and
//! their confirmations, job and task actions, drains, agents that stall
//! (launches stay LAUNCHING), disconnect, die or are cut off and come back,
//! crashes of the server (recovery from the store model, agents
//! registering again with their runs), and rolling updates of services
//! (a new cpu request or one instance more or less, random batch size,
//! retries, failures tolerated, rollback on failure, created paused) with
//! pause, resume, abort and rollback; and pinned instances: stateful jobs
//! (a volume per instance, waiting for its host or relocating after a
//! few seconds down), daemon jobs (on every host, or on a zone's), volume
//! deletions, hosts changing zone and hosts joining (hosts have a zone
//! and some disk). [`Driver::apply`] runs one operation and then checks
//! what must hold after every step:
//! - the core's and the engine's invariants;
//! - no instance has two live runs on the agents (but for runs of a host
//!   cut off and declared lost);
//! - a job's instances with a live run are at most its `max_running` (the
//!   largest it had since an edit: runs on hosts outlive a lowered cap);
//! - a connected agent runs exactly the core's current runs on its host
//!   (RUNNING ones started), but for runs it was told to stop;
//! - only a job's latest update is in progress, and the instances an
//!   update has down being moved (in its batch, not running healthy on its
//!   goal spec) are at most its batch size, or the batch it took over from
//!   the update it replaced;
//! - volume ids are unique, one per instance at most, of live jobs, stored
//!   as the core has them; a run of an instance with a volume is on its
//!   volume's host (core and agents, but for a cut-off host's runs), a
//!   launch goes there naming the volume (checked by [`Sim`] for every
//!   launch), a placed run of a task with a volume has it there; a volume
//!   goes only when deleted (refused exactly while a run of its instance
//!   holds its host), with its job, or given up by a relocating job after
//!   its host was seen down for the job's timeout, and its host is told;
//! - the engine's reservations are only for pinned instances, on their
//!   pin host, at most what their next task asks for;
//! - a daemon job has at most one instance per host, retired instances
//!   ended, at most one run going per host on the agents (but runs told
//!   to stop or held); after a cycle its instances are bound only to
//!   matching hosts that are up, draining or whose agent is away, its runs
//!   are on their bound hosts, and every up matching host not in
//!   maintenance has one (but while a run of the job stops there).
//!
//! [`Driver::quiesce`] then brings every host back, adds room, confirms
//! every kill, lets time pass beyond every back-off, runs cycles and lets
//! every batch run exit 0, until nothing changes; and [`Driver::check_final`]
//! checks liveness: every batch job created reaches a terminal state
//! (SUCCEEDED if nothing failed, killed or shrank it), every service not
//! killed runs its instances (but those killed by request; up to its
//! running limit, a gang at a time), every killed job ends KILLED, no run
//! is left held, and the agents run exactly the running instances; the
//! quiesce phase resumes paused updates and reports running checked
//! instances healthy, and then every update ended (but one whose batch
//! waits for room under its job's running limit), and a job's latest
//! update that succeeded (rolled back) left the job and every instance on
//! its new (old) config. Pinned instances run too, unless their host has
//! no room for them (free, plus what is reserved for them, plus for a
//! daemon the preemptible work it may evict): a daemon has exactly one
//! instance on every host it matches, running unless killed there by
//! request; agents keep only volumes the core knows on them.
//!
//! Three bugs of updates this found are fixed, with regression tests in
//! `sim::tests` ([`Driver::forgive_known_bugs`] stays off: it tolerated an
//! update restarting an instance killed by request while they were open).
//!
//! Bugs of the core this found have regression tests in `sim::tests`;
//! those found with pinned instances are fixtures in `tests.rs`.
//!
//! The same scenarios come from proptest strategies (`sim::tests`) and from
//! raw bytes ([`Scenario::decode`], the `lifecycle_ops` fuzz target), and
//! [`Scenario::encode`] writes seed inputs for the fuzz corpus.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use peloton_engine::{PoolConfig, Resources};

use super::{Sim, plan};
use crate::{
    Answer, Error, Health, HostSlot, Input, JobAction, JobEdit, JobKey, JobKind, JobPlan, JobState,
    RunPhase, TaskState, UpdateAction, UpdateRequest, UpdateSpec, UpdateState,
};

/// Pools a scenario may create (and jobs name): the root and a small tree.
pub const POOLS: [&str; 5] = ["/", "/a", "/b", "/a/x", "/a/y"];

/// Jobs alive at once (creations beyond it are skipped): keeps scenarios
/// small and the cluster able to run every service once room is added.
pub const MAX_LIVE_JOBS: usize = 6;

/// Time steps of [`Op::Tick`], in ms.
pub const TICKS_MS: [u64; 5] = [100, 500, 1_000, 5_000, 20_000];

/// Rounds of [`Driver::quiesce`] before it gives up.
pub const MAX_QUIESCE_ROUNDS: usize = 40;

/// A job to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    /// A service (else batch).
    pub service: bool,
    /// Its pool: this index, modulo, into the leaf pools of [`POOLS`]
    /// that exist when it is created.
    pub pool: u8,
    /// Instances (1–3).
    pub instances: u8,
    /// One gang of every instance.
    pub gang: bool,
    /// A batch gang is elastic: it starts with this many members (0: not
    /// elastic; used when below the gang's size).
    pub elastic_min: u8,
    /// cpu of a task: 500 or 1000 millicores.
    pub big: bool,
    /// Failed runs tolerated (0–3).
    pub max_failures: u8,
    /// Priority (0–3).
    pub priority: u8,
    /// Preemptible.
    pub preemptible: bool,
    /// Runs have a health check.
    pub health: bool,
    /// At most this many running at once (0: no limit; 0–2).
    pub max_running: u8,
    /// Batch runs end after 5 s (a run-time limit).
    pub deadline: bool,
    /// A drain stops a service's instances only while fewer than this many
    /// are down or unhealthy (1–2).
    pub max_unavailable: u8,
    /// Runs on slack (preemptible too): on what hosts lend of what their
    /// non-revocable runs do not use.
    pub revocable: bool,
}

/// One operation. Jobs, hosts and runs are picked by an index taken modulo
/// what exists when it runs, so every list of operations is meaningful (and
/// shrinks well).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create `POOLS[1 + p % 4]`.
    CreatePool(u8),
    /// Delete `POOLS[1 + p % 4]`.
    DeletePool(u8),
    /// Create a job.
    CreateJob(JobSpec),
    /// A scheduling cycle.
    Cycle,
    /// Time passes (`TICKS_MS[t % 5]`), timers fire.
    Tick(u8),
    /// A live run on an agent ends: exit 0, exit 1, or killed on its host
    /// (outcome % 3).
    Exit {
        /// Which live run.
        run: u8,
        /// How.
        outcome: u8,
    },
    /// A health verdict on a live run of a job with a health check.
    Health {
        /// Which run.
        run: u8,
        /// Healthy, or unhealthy.
        healthy: bool,
    },
    /// A started live run of a job without a health check reports a
    /// checkpoint now (also one being stopped, as during its notice).
    Checkpoint(u8),
    /// An agent ends one run it was told to stop.
    ConfirmKill(u8),
    /// Agents end every run they were told to stop.
    ConfirmKills,
    /// Kill a job.
    KillJob(u8),
    /// Restart a job.
    RestartJob(u8),
    /// Scale a job to `1 + n % 4` instances.
    ScaleJob(u8, u8),
    /// Edit a job (`JobAction::Edit`; refused but for batch jobs): from
    /// the first byte, priority `e & 3` if `e & 4`, running cap `(e >> 4)
    /// % 3` if `e & 8`, run time limit 5 s (`e & 128`) or none if `e & 64`;
    /// from the second, tolerated failures `(f >> 1) & 3` if `f & 1`.
    EditJob(u8, u8, u8),
    /// Delete a job.
    DeleteJob(u8),
    /// Kill an instance (its index modulo the count plus one: sometimes
    /// out of range).
    KillTask(u8, u8),
    /// Restart an instance.
    RestartTask(u8, u8),
    /// Start maintenance of a host (drain).
    Drain(u8),
    /// Complete maintenance of a host.
    Up(u8),
    /// An agent's session ends (its runs go on).
    Disconnect(u8),
    /// A host is declared lost: it died with its runs, or it is cut off
    /// and they run on.
    LoseHost {
        /// Which host.
        host: u8,
        /// It died.
        dies: bool,
    },
    /// An agent registers (again), listing its runs.
    Register(u8),
    /// The server restarts from its store.
    Crash,
    /// An agent takes launches but does not start them (they stay
    /// LAUNCHING) until [`Op::StartLaunches`].
    Stall(u8),
    /// A stalled agent starts what it holds, and launches at once again.
    StartLaunches(u8),
    /// A rolling update of a job (refused but for services without
    /// gangs, not killed) to a new plan; `variant` (below
    /// [`N_UPDATE_VARIANTS`]) picks the change and how to roll: see
    /// [`UpdateVariant`].
    UpdateJob(u8, u8),
    /// An action on the job's latest update (pause, resume, abort,
    /// roll back: `action % 4`).
    UpdateAction(u8, u8),
    /// Create a stateful job: the spec (never in gangs) with a volume;
    /// the variant (below [`N_VOLUME_VARIANTS`]) picks its size and what
    /// happens when its host is down: see [`VolumeVariant`].
    CreateStatefulJob(JobSpec, u8),
    /// Create a daemon job (of the spec: its pool, cpu, priority,
    /// preemption and health check) on every host, or only on those of
    /// one zone: `constraint % 3` is none, `zone == a`, `zone == b`.
    CreateDaemonJob(JobSpec, u8),
    /// Delete a volume: this index, modulo one more than the volumes
    /// there are, into them by id (the last: an unknown id).
    DeleteVolume(u8),
    /// A host's zone becomes `ZONES[zone % 3]`.
    SetZone {
        /// Which host.
        host: u8,
        /// Its new zone.
        zone: u8,
    },
    /// A new host of zone `ZONES[zone % 3]` registers (while there are
    /// fewer than [`MAX_HOSTS`]).
    AddHost(u8),
}

/// Zones of hosts (the `zone` attribute), which daemon jobs may name.
pub const ZONES: [&str; 3] = ["a", "b", "c"];

/// Hosts of a scenario at most ([`Op::AddHost`] beyond it is skipped).
pub const MAX_HOSTS: usize = 6;

/// Disk of a host, in MiB: room for a few volumes.
pub const HOST_DISK_MB: u64 = 8_000;

/// Distinct [`Op::CreateStatefulJob`] variants: 2 sizes × 3 policies.
pub const N_VOLUME_VARIANTS: u8 = 6;

/// What an [`Op::CreateStatefulJob`] variant asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeVariant {
    /// Volume size: 1000 or 3000 MiB.
    pub size_mb: u64,
    /// Give the volume up after its host is down this long (else wait
    /// for the host): 5 s or 20 s.
    pub relocate_after_ms: Option<u64>,
}

impl VolumeVariant {
    /// The variant of byte `v` (modulo [`N_VOLUME_VARIANTS`]).
    pub fn of(v: u8) -> VolumeVariant {
        let v = v % N_VOLUME_VARIANTS;
        VolumeVariant {
            size_mb: [1000, 3000][usize::from(v % 2)],
            relocate_after_ms: [None, Some(5_000), Some(20_000)][usize::from(v / 2)],
        }
    }
}

/// How a job's instances are pinned to hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinned {
    /// Not at all.
    No,
    /// A stateful job: each instance to its volume's host
    /// ([`VolumeVariant::of`] this byte).
    Volume(u8),
    /// A daemon job: one instance per host it matches (a constraint
    /// variant of [`Op::CreateDaemonJob`]).
    Daemon(u8),
}

impl Pinned {
    /// The daemon constraint of variant `c`.
    fn constraint(c: u8) -> Option<&'static str> {
        [None, Some("a"), Some("b")][usize::from(c % 3)]
    }
}

/// Distinct [`Op::UpdateJob`] variants: 3 changes × 3 batch sizes × 3
/// retry counts × 2 × 2 × 2.
pub const N_UPDATE_VARIANTS: u8 = 216;

/// What an [`Op::UpdateJob`] variant asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateVariant {
    /// 0: cpu of a task ±100 millicores (at most 1000), 1: one instance
    /// more (at most 4), 2: one less (at least 1).
    pub change: u8,
    /// How to roll.
    pub spec: UpdateSpec,
}

impl UpdateVariant {
    /// The variant of byte `v` (modulo [`N_UPDATE_VARIANTS`]).
    pub fn of(v: u8) -> UpdateVariant {
        let v = u32::from(v % N_UPDATE_VARIANTS);
        UpdateVariant {
            change: (v % 3) as u8,
            spec: UpdateSpec {
                batch_size: 1 + (v / 3) % 3,
                max_instance_retries: (v / 9) % 3,
                max_failed_instances: (v / 27) % 2,
                rollback_on_failure: (v / 54) % 2 == 1,
                start_paused: (v / 108) % 2 == 1,
            },
        }
    }
}

/// Hosts and operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// Hosts registered at the start (2–4).
    pub n_hosts: u8,
    /// Operations, in order.
    pub ops: Vec<Op>,
}

/// Number of operation kinds (the tag of an encoded operation, modulo).
const N_KINDS: u8 = 32;

/// Decodes fuzz input bytes; missing bytes read as 0.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

impl JobSpec {
    fn decode(input: &mut Bytes<'_>) -> JobSpec {
        let (a, b, c) = (input.byte(), input.byte(), input.byte());
        JobSpec {
            service: a & 1 != 0,
            gang: a & 2 != 0,
            preemptible: a & 4 != 0,
            health: a & 8 != 0,
            deadline: a & 16 != 0,
            max_failures: (a >> 5) & 3,
            big: a & 128 != 0,
            pool: b % 5,
            instances: 1 + (b / 5) % 3,
            priority: (b / 15) % 4,
            max_running: c % 3,
            max_unavailable: 1 + (c / 3) % 2,
            revocable: (c / 6) % 2 != 0,
            elastic_min: (c / 12) % 3,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let bit = |b: bool, at: u8| u8::from(b) << at;
        out.push(
            bit(self.service, 0)
                | bit(self.gang, 1)
                | bit(self.preemptible, 2)
                | bit(self.health, 3)
                | bit(self.deadline, 4)
                | ((self.max_failures & 3) << 5)
                | bit(self.big, 7),
        );
        out.push(self.pool % 5 + 5 * ((self.instances - 1) % 3) + 15 * (self.priority % 4));
        out.push(
            self.max_running % 3
                + 3 * ((self.max_unavailable - 1) % 2)
                + 6 * u8::from(self.revocable)
                + 12 * (self.elastic_min % 3),
        );
    }
}

impl Scenario {
    /// The scenario encoded by fuzz input bytes: the host count, then per
    /// operation a tag byte and its arguments. Every input decodes.
    pub fn decode(data: &[u8]) -> Scenario {
        let mut input = Bytes(data);
        let n_hosts = 2 + input.byte() % 3;
        let mut ops = Vec::new();
        while !input.0.is_empty() {
            let tag = input.byte() % N_KINDS;
            let op = match tag {
                0 => Op::CreatePool(input.byte()),
                1 => Op::DeletePool(input.byte()),
                2 => Op::CreateJob(JobSpec::decode(&mut input)),
                3 => Op::Cycle,
                4 => Op::Tick(input.byte() % 5),
                5 => Op::Exit {
                    run: input.byte(),
                    outcome: input.byte() % 3,
                },
                6 => {
                    let b = input.byte();
                    Op::Health {
                        run: b >> 1,
                        healthy: b & 1 != 0,
                    }
                }
                7 => Op::ConfirmKill(input.byte()),
                8 => Op::ConfirmKills,
                9 => Op::KillJob(input.byte()),
                10 => Op::RestartJob(input.byte()),
                11 => Op::ScaleJob(input.byte(), input.byte() % 4),
                12 => Op::DeleteJob(input.byte()),
                13 => Op::KillTask(input.byte(), input.byte()),
                14 => Op::RestartTask(input.byte(), input.byte()),
                15 => Op::Drain(input.byte()),
                16 => Op::Up(input.byte()),
                17 => Op::Disconnect(input.byte()),
                18 => {
                    let b = input.byte();
                    Op::LoseHost {
                        host: b >> 1,
                        dies: b & 1 != 0,
                    }
                }
                19 => Op::Register(input.byte()),
                20 => Op::Crash,
                21 => Op::Stall(input.byte()),
                22 => Op::StartLaunches(input.byte()),
                23 => Op::UpdateJob(input.byte(), input.byte() % N_UPDATE_VARIANTS),
                24 => Op::UpdateAction(input.byte(), input.byte() % 4),
                25 => {
                    let spec = JobSpec::decode(&mut input);
                    Op::CreateStatefulJob(spec, input.byte() % N_VOLUME_VARIANTS)
                }
                26 => {
                    let spec = JobSpec::decode(&mut input);
                    Op::CreateDaemonJob(spec, input.byte() % 3)
                }
                27 => Op::DeleteVolume(input.byte()),
                28 => {
                    let b = input.byte();
                    Op::SetZone {
                        host: b / 3,
                        zone: b % 3,
                    }
                }
                30 => Op::Checkpoint(input.byte()),
                31 => Op::EditJob(input.byte(), input.byte(), input.byte()),
                _ => Op::AddHost(input.byte() % 3),
            };
            ops.push(op);
        }
        Scenario { n_hosts, ops }
    }

    /// Bytes that [`Scenario::decode`] turns back into this scenario
    /// (arguments in their canonical ranges: as the proptest strategies
    /// make them).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.n_hosts.saturating_sub(2) % 3];
        for op in &self.ops {
            match op {
                Op::CreatePool(p) => out.extend([0, *p]),
                Op::DeletePool(p) => out.extend([1, *p]),
                Op::CreateJob(spec) => {
                    out.push(2);
                    spec.encode(&mut out);
                }
                Op::Cycle => out.push(3),
                Op::Tick(t) => out.extend([4, t % 5]),
                Op::Exit { run, outcome } => out.extend([5, *run, outcome % 3]),
                Op::Health { run, healthy } => out.extend([6, (run << 1) | u8::from(*healthy)]),
                Op::ConfirmKill(r) => out.extend([7, *r]),
                Op::ConfirmKills => out.push(8),
                Op::KillJob(j) => out.extend([9, *j]),
                Op::RestartJob(j) => out.extend([10, *j]),
                Op::ScaleJob(j, n) => out.extend([11, *j, n % 4]),
                Op::DeleteJob(j) => out.extend([12, *j]),
                Op::KillTask(j, i) => out.extend([13, *j, *i]),
                Op::RestartTask(j, i) => out.extend([14, *j, *i]),
                Op::Drain(h) => out.extend([15, *h]),
                Op::Up(h) => out.extend([16, *h]),
                Op::Disconnect(h) => out.extend([17, *h]),
                Op::LoseHost { host, dies } => out.extend([18, (host << 1) | u8::from(*dies)]),
                Op::Register(h) => out.extend([19, *h]),
                Op::Crash => out.push(20),
                Op::Stall(h) => out.extend([21, *h]),
                Op::StartLaunches(h) => out.extend([22, *h]),
                Op::UpdateJob(j, v) => out.extend([23, *j, v % N_UPDATE_VARIANTS]),
                Op::UpdateAction(j, a) => out.extend([24, *j, a % 4]),
                Op::CreateStatefulJob(spec, v) => {
                    out.push(25);
                    spec.encode(&mut out);
                    out.push(v % N_VOLUME_VARIANTS);
                }
                Op::CreateDaemonJob(spec, c) => {
                    out.push(26);
                    spec.encode(&mut out);
                    out.push(c % 3);
                }
                Op::DeleteVolume(v) => out.extend([27, *v]),
                Op::SetZone { host, zone } => out.extend([28, (host % 85) * 3 + zone % 3]),
                Op::AddHost(zone) => out.extend([29, zone % 3]),
                Op::Checkpoint(r) => out.extend([30, *r]),
                Op::EditJob(j, e, f) => out.extend([31, *j, *e, *f]),
            }
        }
        out
    }
}

/// What the model expects of a job the core accepted.
#[derive(Clone, Debug)]
struct JobModel {
    id: Arc<str>,
    spec: JobSpec,
    /// Its pool.
    pool: &'static str,
    /// Instances now.
    instances: u32,
    /// A kill of the running job was accepted (and no restart since).
    killed: bool,
    /// Deleted.
    deleted: bool,
    /// Instances killed by request (and not restarted since).
    killed_instances: Vec<bool>,
    /// Every run of it ended as it should (exit 0), nothing killed, lost
    /// or failed by the scenario: a batch job must then succeed.
    clean: bool,
    /// Updates the core accepted, oldest first.
    updates: Vec<UpdateModel>,
    /// Instances killed by request (and not restarted since), with the
    /// run and config version killed, and whether its config was seen
    /// changed since: two known bugs of the core let an update start them
    /// again (`sim::tests::regression_an_update_restarts_an_instance_killed_by_its_user`,
    /// `regression_a_replacing_update_restarts_an_instance_killed_by_its_user`);
    /// the model forgives an instance that got a new run after an update
    /// changed its config (only updates do).
    kill_pending: BTreeMap<u32, (u32, u64, bool)>,
    /// Stateful, daemon, or neither.
    pinned: Pinned,
    /// A daemon's instances killed by request (and not restarted since),
    /// with the host each was on: it stays killed while it stays there.
    daemon_kills: BTreeMap<u32, Arc<str>>,
    /// After an edit of its running cap: the largest cap it had since (0:
    /// none), which bounds its live runs (runs on hosts outlive a lowered
    /// cap); None before any.
    cap_seen: Option<u32>,
}

impl JobModel {
    /// Batch, service or daemon.
    fn kind(&self) -> JobKind {
        match (self.pinned, self.spec.service) {
            (Pinned::Daemon(_), _) => JobKind::Daemon,
            (_, true) => JobKind::Service,
            (_, false) => JobKind::Batch,
        }
    }

    fn plan(&self) -> JobPlan {
        job_plan(&self.spec, self.pool, self.pinned)
    }
}

/// What the model knows of an update the core accepted.
#[derive(Clone, Debug)]
struct UpdateModel {
    id: Arc<str>,
    /// Instances it may have down at once: its batch size, or the batch of
    /// the update it replaced if that was bigger (it takes it over).
    bound: usize,
    /// The job's instances before it: a rollback returns to them.
    from_count: u32,
    /// Seen turned around (the instance count then went back).
    backward: bool,
}

/// What a scenario did, so tests can tell that scenarios reach deep states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Operations applied.
    pub ops: u64,
    /// Inputs the core refused.
    pub refused: u64,
    /// Jobs created.
    pub jobs: u64,
    /// Runs launched on agents.
    pub launches: u64,
    /// Kills sent.
    pub kills: u64,
    /// Crashes and recoveries.
    pub crashes: u64,
    /// Batch jobs that succeeded at the end.
    pub succeeded: u64,
    /// Service instances running at the end.
    pub services_running: u64,
    /// Rounds the last quiesce took.
    pub quiesce_rounds: u64,
    /// Updates the core accepted.
    pub updates: u64,
    /// Updates that succeeded (by the end).
    pub updates_succeeded: u64,
    /// Updates rolled back (by the end).
    pub updates_rolled_back: u64,
    /// Updates that failed or were aborted (by the end).
    pub updates_stopped: u64,
    /// Volumes created.
    pub volumes_created: u64,
    /// Volumes deleted by request.
    pub volumes_deleted: u64,
    /// Volumes given up (their host down too long).
    pub volumes_given_up: u64,
    /// Daemon jobs created.
    pub daemon_jobs: u64,
    /// Daemon instances running at the end.
    pub daemons_running: u64,
    /// Pinned instances left waiting for room on their host at the end.
    pub pinned_waiting: u64,
}

/// A [`Sim`] and the model of what its jobs must reach.
#[derive(Debug)]
pub struct Driver {
    /// The simulated cluster.
    pub sim: Sim,
    jobs: Vec<JobModel>,
    hosts: Vec<Arc<str>>,
    next_job: u32,
    next_update: u32,
    big_host: bool,
    /// What happened.
    pub stats: Stats,
    /// Forgive the known bug of updates restarting instances killed by
    /// request (`JobModel::kill_pending`); its regression tests turn it
    /// off.
    pub forgive_known_bugs: bool,
    /// Each host's zone.
    zones: BTreeMap<Arc<str>, &'static str>,
    /// Hosts added by [`Op::AddHost`] so far.
    added_hosts: u32,
    /// Volumes after the last operation: id to (job id, instance, host).
    volumes: BTreeMap<Arc<str>, (Arc<str>, u32, Arc<str>)>,
    /// Since when hosts are seen not up (after an operation).
    down_since: BTreeMap<Arc<str>, u64>,
    /// Hosts declared lost (and not registered since, nor forgotten in a
    /// crash).
    lost: BTreeSet<Arc<str>>,
}

/// A host's registration in a scenario: `cores` cores, `mem` MiB,
/// `disk_mb` of disk, its name and zone as attributes.
fn scenario_host(
    name: &str,
    cores: u64,
    mem: u64,
    zone: &str,
    disk_mb: u64,
) -> peloton_engine::host::HostSpec {
    let mut spec = super::host_spec(name, cores, mem);
    spec.capacity.0[peloton_engine::Dim::Disk.idx()] = disk_mb;
    spec.attributes.push(("zone".into(), zone.to_string()));
    spec
}

fn pool_config(path: &str) -> PoolConfig {
    // Generous reservations: non-preemptible tasks only run within their
    // pool's reservation, and once room is added every job must fit: a
    // leaf holds at most MAX_LIVE_JOBS × 4 instances × 1 core = 24 cores.
    let cores = if path.matches('/').count() == 1 {
        64
    } else {
        32
    };
    // Disk for volumes: up to MAX_LIVE_JOBS × 4 instances × 3000 MiB.
    PoolConfig::default().with_reservation(Resources::new(cores * 1000, cores * 1024, 100_000, 0))
}

fn job_plan(spec: &JobSpec, pool: &str, pinned: Pinned) -> JobPlan {
    let mut p = unpinned_plan(spec, pool);
    match pinned {
        Pinned::No => {}
        Pinned::Volume(v) => {
            let v = VolumeVariant::of(v);
            // Gang jobs cannot have volumes.
            p.gang = 1;
            p.elastic_min = 0;
            p.max_running = u32::from(spec.max_running);
            p.default_mut().volume = Some(crate::VolumeTemplate {
                size_mb: v.size_mb,
                path: "data".into(),
            });
            p.volume_policy = crate::VolumePolicy {
                host_down_timeout_ms: v.relocate_after_ms.unwrap_or(0),
                relocate: v.relocate_after_ms.is_some(),
            };
        }
        Pinned::Daemon(c) => {
            p.kind = JobKind::Daemon;
            p.instance_count = 1;
            p.gang = 1;
            p.elastic_min = 0;
            p.max_running = 0;
            p.max_running_time_ms = 0;
            if let Some(zone) = Pinned::constraint(c) {
                p.default_mut().constraint = format!("zone == {zone}");
            }
        }
    }
    p
}

fn unpinned_plan(spec: &JobSpec, pool: &str) -> JobPlan {
    let n = u32::from(spec.instances);
    let mut p = plan(pool, n, 0);
    p.default_mut().request = Resources::new(if spec.big { 1000 } else { 500 }, 64, 0, 0);
    p.kind = if spec.service {
        JobKind::Service
    } else {
        JobKind::Batch
    };
    p.gang = if spec.gang { n } else { 1 };
    if p.gang > 1 && !spec.service && u32::from(spec.elastic_min) < p.gang {
        p.elastic_min = u32::from(spec.elastic_min);
    }
    p.priority = u32::from(spec.priority);
    p.preemptible = spec.preemptible || spec.revocable;
    p.default_mut().revocable = spec.revocable;
    p.max_running = u32::from(spec.max_running);
    if p.max_running != 0 && p.max_running < p.gang {
        // A gang larger than the running limit could never start.
        p.max_running = p.gang;
    }
    p.max_unavailable = u32::from(spec.max_unavailable);
    p.default_mut().health_check = spec.health;
    p.default_mut().restart.max_failures = u32::from(spec.max_failures);
    p.default_mut().restart.backoff_ms = 500;
    p.default_mut().restart.max_backoff_ms = 4_000;
    if spec.deadline && !spec.service {
        p.max_running_time_ms = 5_000;
    }
    if p.gang > 1 {
        // Gang members get ports chosen at placement: the invariants check
        // that no two current runs on a host hold one, through restarts
        // and recoveries.
        p.default_mut().port_names = Box::new(["rdv".into()]);
        p.default_mut().ports = 1;
    }
    p
}

impl Driver {
    /// A cluster of `n_hosts` (2–4) small hosts, each registered by its
    /// agent.
    pub fn new(n_hosts: u8) -> Self {
        let mut sim = Sim::new();
        // The log only when asked for (failure messages then end with it).
        sim.quiet = std::env::var_os("PELOTON_SIM_LOG").is_none();
        let mut hosts = Vec::new();
        let mut zones = BTreeMap::new();
        for h in 0..n_hosts.clamp(2, 4) {
            let name: Arc<str> = format!("h{h}").into();
            let zone = ZONES[usize::from(h % 2)];
            sim.add_host_spec(scenario_host(
                &name,
                2 + u64::from(h % 2),
                4096,
                zone,
                HOST_DISK_MB,
            ))
            .expect("a new host registers");
            zones.insert(name.clone(), zone);
            hosts.push(name);
        }
        Driver {
            sim,
            jobs: Vec::new(),
            hosts,
            next_job: 0,
            next_update: 0,
            big_host: false,
            stats: Stats::default(),
            forgive_known_bugs: false,
            zones,
            added_hosts: 0,
            volumes: BTreeMap::new(),
            down_since: BTreeMap::new(),
            lost: BTreeSet::new(),
        }
    }

    /// Runs a whole scenario: every operation, the quiesce phase and the
    /// final checks. Panics on a violation.
    pub fn run(scenario: &Scenario) -> Stats {
        let mut d = Driver::new(scenario.n_hosts);
        for op in &scenario.ops {
            d.apply(op);
        }
        d.quiesce();
        d.check_final();
        d.stats
    }

    fn step(&mut self, input: Input) -> Result<Answer, Error> {
        let (launches, kills) = (self.sim.n_launches, self.sim.n_kills);
        let r = self.sim.step(input);
        self.stats.launches += self.sim.n_launches - launches;
        self.stats.kills += self.sim.n_kills - kills;
        if r.is_err() {
            self.stats.refused += 1;
        }
        r
    }

    fn host(&self, h: u8) -> Arc<str> {
        self.hosts[usize::from(h) % self.hosts.len()].clone()
    }

    fn job(&self, j: u8) -> Option<usize> {
        (!self.jobs.is_empty()).then(|| usize::from(j) % self.jobs.len())
    }

    /// Live runs on the agents (`pred` on host and run), in a fixed order.
    fn runs_where(
        &self,
        pred: impl Fn(&super::Agent, &super::AgentRun) -> bool,
    ) -> Vec<(Arc<str>, u64)> {
        let mut out = Vec::new();
        for (host, a) in &self.sim.agents {
            for (&launch, r) in &a.runs {
                if r.live() && pred(a, r) {
                    out.push((host.clone(), launch));
                }
            }
        }
        out
    }

    fn model_of(&mut self, job_id: &str) -> Option<&mut JobModel> {
        self.jobs.iter_mut().find(|j| &*j.id == job_id)
    }

    /// Applies one operation and checks every per-step property.
    pub fn apply(&mut self, op: &Op) {
        self.stats.ops += 1;
        self.sim.say(format!("> {op:?}"));
        let now = self.sim.now;
        match op {
            Op::CreatePool(p) => {
                let path = POOLS[1 + usize::from(*p) % 4];
                let _ = self.step(Input::CreatePool {
                    path: path.into(),
                    config: pool_config(path),
                });
            }
            Op::DeletePool(p) => {
                let path = POOLS[1 + usize::from(*p) % 4];
                let _ = self.step(Input::DeletePool {
                    path: path.into(),
                    version: 0,
                    force: false,
                });
            }
            Op::CreateJob(spec) => self.create_job(spec, Pinned::No),
            Op::CreateStatefulJob(spec, v) => self.create_job(spec, Pinned::Volume(*v)),
            Op::CreateDaemonJob(spec, c) => self.create_job(spec, Pinned::Daemon(*c % 3)),
            Op::DeleteVolume(v) => self.delete_volume(*v),
            Op::SetZone { host, zone } => {
                let host = self.host(*host);
                let zone = ZONES[usize::from(*zone % 3)];
                let r = self.step(Input::SetHostAttribute {
                    hosts: vec![host.to_string()],
                    key: "zone".into(),
                    value: zone.into(),
                });
                if r.is_ok() {
                    // The shell sets it again whenever the host registers
                    // and at recovery (as it does host pools): here its
                    // agent registers with it, and the store has it.
                    let set = |spec: &mut peloton_engine::host::HostSpec| {
                        spec.attributes.retain(|(k, _)| k != "zone");
                        spec.attributes.push(("zone".into(), zone.into()));
                    };
                    let agent = self.sim.agents.get_mut(&host).and_then(|a| a.spec.as_mut());
                    set(agent.expect("a registered host"));
                    if let Some((spec, _, _)) = self.sim.store.hosts.get_mut(&*host) {
                        set(spec);
                    }
                    self.zones.insert(host, zone);
                }
            }
            Op::AddHost(zone) => {
                if self.hosts.len() >= MAX_HOSTS {
                    return;
                }
                let name: Arc<str> = format!("n{}", self.added_hosts).into();
                self.added_hosts += 1;
                let zone = ZONES[usize::from(*zone % 3)];
                let r = self
                    .sim
                    .add_host_spec(scenario_host(&name, 2, 4096, zone, HOST_DISK_MB));
                assert!(r.is_ok(), "a new host registers: {r:?}");
                self.zones.insert(name.clone(), zone);
                self.hosts.push(name);
            }
            Op::Cycle => {
                let _ = self.step(Input::Cycle);
            }
            Op::Tick(t) => {
                self.sim.now += TICKS_MS[usize::from(*t) % 5];
                let _ = self.step(Input::Tick);
                self.sim.report_usage();
            }
            Op::Exit { run, outcome } => {
                let runs = self.runs_where(|_, r| r.started);
                if runs.is_empty() {
                    return;
                }
                let (host, launch) = runs[usize::from(*run) % runs.len()].clone();
                let (phase, code) = match outcome % 3 {
                    0 => (RunPhase::Succeeded, 0),
                    1 => (RunPhase::Failed, 1),
                    _ => (RunPhase::Killed, 0),
                };
                if phase != RunPhase::Succeeded {
                    let job_id = self.sim.agents[&host].runs[&launch].key.job_id.clone();
                    if let Some(m) = self.model_of(&job_id) {
                        m.clean = false;
                    }
                }
                self.sim.end_run(&host, launch, phase, code);
            }
            Op::Health { run, healthy } => {
                let checked: BTreeSet<Arc<str>> = self
                    .jobs
                    .iter()
                    .filter(|j| j.spec.health)
                    .map(|j| j.id.clone())
                    .collect();
                let runs = self
                    .runs_where(|a, r| a.connected && r.started && checked.contains(&r.key.job_id));
                if runs.is_empty() {
                    return;
                }
                let (host, launch) = runs[usize::from(*run) % runs.len()].clone();
                let key = self.sim.agents[&host].runs[&launch].key.clone();
                if !healthy && let Some(m) = self.model_of(&key.job_id) {
                    m.clean = false;
                }
                let health = if *healthy {
                    Health::Healthy
                } else {
                    Health::Unhealthy
                };
                self.sim.health(&host, key, health);
            }
            Op::Checkpoint(r) => {
                let unchecked: BTreeSet<Arc<str>> = self
                    .jobs
                    .iter()
                    .filter(|j| !j.spec.health)
                    .map(|j| j.id.clone())
                    .collect();
                let runs = self.runs_where(|a, r| {
                    a.connected && r.started && unchecked.contains(&r.key.job_id)
                });
                if let Some((host, launch)) = runs.get(usize::from(*r) % runs.len().max(1)) {
                    let key = self.sim.agents[host].runs[launch].key.clone();
                    let host = host.clone();
                    self.sim.checkpoint(&host, key);
                }
            }
            Op::ConfirmKill(r) => {
                let runs = self.runs_where(|_, r| r.stopping);
                if let Some((_, launch)) = runs.get(usize::from(*r) % runs.len().max(1)) {
                    self.sim.confirm_kills(Some(*launch));
                }
            }
            Op::ConfirmKills => self.sim.confirm_kills(None),
            Op::KillJob(j) => {
                let Some(j) = self.job(*j) else { return };
                let id = self.jobs[j].id.clone();
                let running = self
                    .sim
                    .core
                    .job_key(&id)
                    .ok()
                    .and_then(|k| self.sim.core.job(k))
                    .is_some_and(|job| !job.state.is_terminal());
                let r = self.step(Input::JobAction {
                    id: id.to_string(),
                    version: 0,
                    action: JobAction::Kill,
                });
                if r.is_ok() && running {
                    self.jobs[j].killed = true;
                    self.jobs[j].clean = false;
                }
            }
            Op::RestartJob(j) => {
                let Some(j) = self.job(*j) else { return };
                let id = self.jobs[j].id.to_string();
                let r = self.step(Input::JobAction {
                    id,
                    version: 0,
                    action: JobAction::Restart,
                });
                if r.is_ok() {
                    let m = &mut self.jobs[j];
                    m.killed = false;
                    m.killed_instances.iter_mut().for_each(|k| *k = false);
                    m.kill_pending.clear();
                    m.daemon_kills.clear();
                }
            }
            Op::EditJob(j, e, f) => {
                let Some(j) = self.job(*j) else { return };
                let edit = JobEdit {
                    priority: (e & 4 != 0).then_some(u32::from(e & 3)),
                    max_running: (e & 8 != 0).then_some(u32::from((e >> 4) % 3)),
                    max_running_time_ms: (e & 64 != 0).then_some(if e & 128 != 0 {
                        5_000
                    } else {
                        0
                    }),
                    max_failures: (f & 1 != 0).then_some(u32::from((f >> 1) & 3)),
                };
                let id = self.jobs[j].id.to_string();
                let r = self.step(Input::JobAction {
                    id,
                    version: 0,
                    action: JobAction::Edit(edit),
                });
                if r.is_ok() {
                    let m = &mut self.jobs[j];
                    if let Some(p) = edit.priority {
                        m.spec.priority = p as u8;
                    }
                    if let Some(n) = edit.max_running {
                        let before = m.cap_seen.unwrap_or(m.plan().max_running);
                        m.cap_seen = Some(if before == 0 || n == 0 {
                            0
                        } else {
                            before.max(n)
                        });
                        m.spec.max_running = n as u8;
                    }
                    if let Some(n) = edit.max_failures {
                        m.spec.max_failures = n as u8;
                    }
                    // A run time limit set or lifted (runs on hosts keep
                    // theirs) or other tolerated failures: whether it ends
                    // well is not predicted any more.
                    if edit.max_running_time_ms.is_some() || edit.max_failures.is_some() {
                        m.clean = false;
                    }
                }
            }
            Op::ScaleJob(j, n) => {
                let Some(j) = self.job(*j) else { return };
                let count = 1 + u32::from(*n % 4);
                let id = self.jobs[j].id.to_string();
                let r = self.step(Input::JobAction {
                    id,
                    version: 0,
                    action: JobAction::Scale(count),
                });
                if r.is_ok() {
                    let m = &mut self.jobs[j];
                    if count < m.instances {
                        m.clean = false;
                    }
                    m.instances = count;
                    m.killed_instances.resize(count as usize, false);
                }
            }
            Op::DeleteJob(j) => {
                let Some(j) = self.job(*j) else { return };
                let id = self.jobs[j].id.clone();
                let volumes: Vec<(Arc<str>, Arc<str>)> = self
                    .volumes
                    .iter()
                    .filter(|(_, (job, _, _))| *job == id)
                    .map(|(v, (_, _, host))| (host.clone(), v.clone()))
                    .collect();
                let r = self.step(Input::JobAction {
                    id: id.to_string(),
                    version: 0,
                    action: JobAction::Delete,
                });
                if r.is_ok() {
                    self.jobs[j].deleted = true;
                    // Its volumes go with it: their hosts are told.
                    for (host, v) in volumes {
                        assert!(
                            self.sim.volume_deletes.contains(&(host.clone(), v.clone())),
                            "volume {v} of deleted job {id} was not deleted on {host}\n{}",
                            self.describe()
                        );
                        self.volumes.remove(&v);
                    }
                }
            }
            Op::KillTask(j, i) | Op::RestartTask(j, i)
                if self
                    .job(*j)
                    .is_some_and(|j| matches!(self.jobs[j].pinned, Pinned::Daemon(_))) =>
            {
                let j = self.job(*j).expect("a job");
                self.daemon_task_action(j, *i, matches!(op, Op::RestartTask(..)));
            }
            Op::KillTask(j, i) | Op::RestartTask(j, i) => {
                let Some(j) = self.job(*j) else { return };
                let restart = matches!(op, Op::RestartTask(..));
                let instance = u32::from(*i) % (self.jobs[j].instances + 1);
                let job_id = self.jobs[j].id.to_string();
                let r = self.step(Input::TaskAction {
                    job_id,
                    instances: vec![instance],
                    version: 0,
                    restart,
                });
                if r.is_ok() {
                    let run = self.run_of(j, instance);
                    let m = &mut self.jobs[j];
                    m.killed_instances[instance as usize] = !restart;
                    m.clean &= restart;
                    match run {
                        Some((run, config)) if !restart => {
                            m.kill_pending.insert(instance, (run, config, false))
                        }
                        _ => m.kill_pending.remove(&instance),
                    };
                }
            }
            Op::Drain(h) | Op::Up(h) => {
                let host = self.host(*h);
                let _ = self.step(Input::Maintenance {
                    hosts: vec![host.to_string()],
                    start: matches!(op, Op::Drain(_)),
                });
            }
            Op::Disconnect(h) => {
                let host = self.host(*h);
                if self.sim.agents[&host].connected {
                    let _ = self.sim.disconnect(&host);
                }
            }
            Op::LoseHost { host, dies } => {
                let host = self.host(*host);
                let _ = self.sim.lose_host(&host, *dies);
                self.lost.insert(host);
            }
            Op::Register(h) => {
                let host = self.host(*h);
                if self.sim.register(&host).is_ok() {
                    self.lost.remove(&host);
                }
            }
            Op::Stall(h) => {
                let host = self.host(*h);
                self.sim.agents.get_mut(&host).expect("host").stalled = true;
            }
            Op::StartLaunches(h) => {
                let host = self.host(*h);
                self.sim.start_launches(&host);
            }
            Op::Crash => {
                self.stats.crashes += 1;
                self.sim.crash();
                // Recovered hosts are away until their agents register.
                self.lost.clear();
            }
            Op::UpdateJob(j, v) => {
                let Some(j) = self.job(*j) else { return };
                self.update_job(j, UpdateVariant::of(*v));
            }
            Op::UpdateAction(j, a) => {
                let Some(j) = self.job(*j) else { return };
                let Some(u) = self.jobs[j].updates.last() else {
                    return;
                };
                let action = [
                    UpdateAction::Pause,
                    UpdateAction::Resume,
                    UpdateAction::Abort,
                    UpdateAction::Rollback,
                ][usize::from(*a % 4)];
                let id = u.id.to_string();
                let _ = self.step(Input::UpdateAction { id, action });
            }
        }
        assert!(self.sim.now >= now, "time only moves forward");
        self.observe_updates();
        self.observe_pinned(&format!("{op:?}"));
        self.check_step();
        if *op == Op::Cycle {
            self.check_daemons_after_cycle();
        }
    }

    /// Kills or restarts an instance of a daemon job (its index modulo
    /// the instances plus one: sometimes out of range).
    fn daemon_task_action(&mut self, j: usize, i: u8, restart: bool) {
        let core = &self.sim.core;
        let m = &self.jobs[j];
        let job = core.job_key(&m.id).ok().and_then(|k| core.job(k));
        let n = job.map_or(0, |job| job.tasks.len() as u32);
        let instance = u32::from(i) % (n + 1);
        let host = job
            .and_then(|job| job.tasks.get(instance as usize))
            .and_then(|t| t.daemon_host)
            .map(|h| core.host_name(h).clone());
        let r = self.step(Input::TaskAction {
            job_id: m.id.to_string(),
            instances: vec![instance],
            version: 0,
            restart,
        });
        if r.is_ok() {
            let m = &mut self.jobs[j];
            match host {
                Some(host) if !restart => {
                    m.daemon_kills.insert(instance, host);
                }
                _ => {
                    m.daemon_kills.remove(&instance);
                }
            }
        }
    }

    /// Deletes the volume of index `v` (modulo one more than the volumes:
    /// the last is an unknown id): refused exactly while a run of its
    /// instance holds its host; once deleted its host is told.
    fn delete_volume(&mut self, v: u8) {
        let ids: Vec<Arc<str>> = self.volumes.keys().cloned().collect();
        let pick = usize::from(v) % (ids.len() + 1);
        let id: Arc<str> = ids
            .get(pick)
            .cloned()
            .unwrap_or_else(|| "no-such-volume".into());
        let core = &self.sim.core;
        let in_use = core.volume(&id).map(|vol| core.volume_in_use(vol));
        let r = self.step(Input::DeleteVolume { id: id.to_string() });
        match in_use {
            None => assert!(
                matches!(r, Err(Error::VolumeNotFound(_))),
                "deleting unknown volume {id}: {r:?}"
            ),
            Some(true) => assert!(
                matches!(r, Err(Error::Precondition(_))),
                "deleting volume {id} in use: {r:?}\n{}",
                self.describe()
            ),
            Some(false) => {
                assert!(
                    r.is_ok(),
                    "deleting volume {id}, not in use: {r:?}\n{}",
                    self.describe()
                );
                let host = self.volumes[&id].2.clone();
                assert!(
                    self.sim
                        .volume_deletes
                        .contains(&(host.clone(), id.clone())),
                    "deleted volume {id} was not deleted on {host}\n{}",
                    self.describe()
                );
                assert!(self.sim.core.volume(&id).is_none(), "{id} is gone");
                self.volumes.remove(&id);
                self.stats.volumes_deleted += 1;
            }
        }
    }

    /// Follows volumes and hosts after an operation: a volume that went
    /// without a request (deleting it or its job) was given up: its job
    /// relocates, and its host was seen not up for at least the job's
    /// timeout (and its host was told). Follows which daemon instances
    /// stay killed.
    fn observe_pinned(&mut self, op: &str) {
        let now = self.sim.now;
        let core = &self.sim.core;
        let current: BTreeMap<Arc<str>, (Arc<str>, u32, Arc<str>)> = core
            .volumes()
            .map(|v| {
                let job = core.job(v.job).expect("a volume's job lives").id.clone();
                (
                    v.id.clone(),
                    (job, v.instance, core.host_name(v.host).clone()),
                )
            })
            .collect();
        for (id, (job, i, host)) in &self.volumes {
            if current.contains_key(id) {
                continue;
            }
            let m = self.jobs.iter().find(|m| m.id == *job).expect("a model");
            let relocate = match m.pinned {
                Pinned::Volume(v) => VolumeVariant::of(v).relocate_after_ms,
                _ => None,
            };
            let since = self.down_since.get(host).copied();
            assert!(
                relocate.is_some_and(|after| since.is_some_and(|t| now.saturating_sub(t) >= after)),
                "volume {id} of {job}/{i} on {host} went by itself ({op}; relocate after \
                 {relocate:?} ms, host not up since {since:?}, now {now})\n{}",
                self.describe()
            );
            assert!(
                self.sim
                    .volume_deletes
                    .contains(&(host.clone(), id.clone())),
                "volume {id} given up but not deleted on {host}\n{}",
                self.describe()
            );
            self.stats.volumes_given_up += 1;
        }
        self.stats.volumes_created += current
            .keys()
            .filter(|id| !self.volumes.contains_key(*id))
            .count() as u64;
        self.volumes = current;
        self.sim.volume_deletes.clear();
        for host in &self.hosts {
            let up = self.sim.engine.hosts().lookup(host).is_some_and(|id| {
                self.sim.engine.hosts().state(id) == peloton_engine::host::HostState::Up
            });
            if up {
                self.down_since.remove(host);
            } else {
                self.down_since.entry(host.clone()).or_insert(now);
            }
        }
        // A daemon instance killed by request stays so while it stays on
        // its host (once retired, it may be reused elsewhere).
        for m in &mut self.jobs {
            if m.deleted || m.daemon_kills.is_empty() {
                continue;
            }
            let job = core.job_key(&m.id).ok().and_then(|k| core.job(k));
            m.daemon_kills.retain(|&i, host| {
                job.and_then(|job| job.tasks.get(i as usize))
                    .and_then(|t| t.daemon_host)
                    .is_some_and(|h| core.host_name(h) == host)
            });
        }
    }

    /// Creates a job of `spec`, pinned as `pinned` (while fewer than
    /// [`MAX_LIVE_JOBS`] live).
    fn create_job(&mut self, spec: &JobSpec, pinned: Pinned) {
        if self.jobs.iter().filter(|j| !j.deleted).count() >= MAX_LIVE_JOBS {
            return;
        }
        let tree = self.sim.engine.resources().tree();
        let leaves: Vec<&'static str> = POOLS
            .into_iter()
            .filter(|p| tree.resolve(p).is_ok_and(|id| tree.is_leaf(id)))
            .collect();
        let pool = leaves[usize::from(spec.pool) % leaves.len()];
        let id: Arc<str> = format!("j{}", self.next_job).into();
        self.next_job += 1;
        let mut spec = spec.clone();
        match pinned {
            Pinned::No => {}
            // Gang jobs cannot have volumes.
            Pinned::Volume(_) => spec.gang = false,
            // A daemon keeps running, one instance per host.
            Pinned::Daemon(_) => {
                spec = JobSpec {
                    service: true,
                    instances: 1,
                    gang: false,
                    max_running: 0,
                    deadline: false,
                    ..spec
                }
            }
        }
        let r = self.step(Input::CreateJob {
            id: id.clone(),
            plan: Box::new(job_plan(&spec, pool, pinned)),
        });
        if r.is_ok() {
            self.stats.jobs += 1;
            self.stats.daemon_jobs += u64::from(matches!(pinned, Pinned::Daemon(_)));
            self.jobs.push(JobModel {
                id,
                pool,
                instances: u32::from(spec.instances),
                killed: false,
                deleted: false,
                killed_instances: vec![false; usize::from(spec.instances)],
                clean: true,
                updates: Vec::new(),
                kill_pending: BTreeMap::new(),
                pinned,
                daemon_kills: BTreeMap::new(),
                cap_seen: None,
                spec,
            });
        }
    }

    /// Asks for an update of job `j` (the model's index). (One whose pool
    /// has child pools now is refused: see
    /// `sim::tests::regression_an_update_is_accepted_when_the_pool_became_inner`.)
    fn update_job(&mut self, j: usize, v: UpdateVariant) {
        let m = &self.jobs[j];
        let core = &self.sim.core;
        let job = core.job_key(&m.id).ok().and_then(|k| core.job(k));
        let mut plan = job.map_or_else(|| m.plan(), |job| job.plan.clone());
        // The batch of the update in progress, which a new one takes over.
        let inherited = job
            .and_then(|job| job.latest_update())
            .and_then(|id| core.update(id))
            .filter(|u| !u.state.is_terminal())
            .map_or(0, |u| u.in_progress.len());
        let n = m.instances;
        let count = match v.change {
            0 => n,
            1 if n < 4 => n + 1,
            _ if n == 1 => n + 1,
            _ => n - 1,
        };
        if v.change == 0 {
            let cpu = plan.default.request.0[0];
            plan.default_mut().request.0[0] = if cpu >= 1000 { cpu - 100 } else { cpu + 100 };
        }
        plan.instance_count = count;
        let id: Arc<str> = format!("u{}", self.next_update).into();
        self.next_update += 1;
        let r = self.step(Input::UpdateJob(Box::new(UpdateRequest {
            job_id: m.id.to_string(),
            version: 0,
            id: id.clone(),
            plan,
            spec: v.spec,
        })));
        if r.is_ok() {
            self.stats.updates += 1;
            let m = &mut self.jobs[j];
            m.updates.push(UpdateModel {
                id,
                bound: (v.spec.batch_size as usize).max(inherited),
                from_count: n,
                backward: false,
            });
            m.instances = count;
            m.killed_instances.resize(count as usize, false);
        }
    }

    /// The current run number and config version of instance `i` of job
    /// `j`.
    fn run_of(&self, j: usize, i: u32) -> Option<(u32, u64)> {
        let core = &self.sim.core;
        core.job_key(&self.jobs[j].id)
            .ok()
            .and_then(|k| core.job(k))
            .and_then(|job| job.tasks.get(i as usize))
            .map(|t| (t.run, t.config))
    }

    /// Follows the core's updates: one turned around (by request or on
    /// failure) took the job back to its instance count before it; an
    /// update that took in an instance killed by request while its run
    /// was ending restarts it (known bugs: see `JobModel::kill_pending`).
    fn observe_updates(&mut self) {
        for j in 0..self.jobs.len() {
            let m = &self.jobs[j];
            if m.deleted || m.kill_pending.is_empty() || !self.forgive_known_bugs {
                continue;
            }
            let mut forgiven = Vec::new();
            let mut ended = Vec::new();
            let mut touched = Vec::new();
            for (&i, &(run, config, moved)) in &m.kill_pending {
                match self.run_of(j, i) {
                    None => ended.push(i),
                    Some((now, c)) if now != run && (moved || c != config) => forgiven.push(i),
                    Some((_, c)) if c != config => touched.push(i),
                    Some(_) => {}
                }
            }
            let m = &mut self.jobs[j];
            for i in touched {
                if let Some(p) = m.kill_pending.get_mut(&i) {
                    p.2 = true;
                }
            }
            for i in ended {
                m.kill_pending.remove(&i);
            }
            for i in forgiven {
                m.kill_pending.remove(&i);
                if let Some(k) = m.killed_instances.get_mut(i as usize) {
                    *k = false;
                }
            }
        }
        for m in &mut self.jobs {
            if m.deleted {
                continue;
            }
            let Some(um) = m.updates.last_mut() else {
                continue;
            };
            let Some(u) = self.sim.core.update(&um.id) else {
                continue;
            };
            let backward = matches!(
                u.state,
                UpdateState::RollingBackward | UpdateState::RolledBack
            ) || u.paused_from == Some(UpdateState::RollingBackward);
            if backward && !um.backward {
                um.backward = true;
                m.instances = um.from_count;
                m.killed_instances.resize(um.from_count as usize, false);
            }
        }
    }

    /// Updates' safety after every step: only a job's latest update may be
    /// in progress, and instances it has down being moved (in its batch
    /// and not running healthy on its goal spec) are at most its batch
    /// size (or the batch it took over).
    fn check_updates(&self) {
        let core = &self.sim.core;
        for m in self.jobs.iter().filter(|m| !m.deleted) {
            let Some(job) = core.job_key(&m.id).ok().and_then(|k| core.job(k)) else {
                continue;
            };
            let latest = job.latest_update();
            for um in &m.updates {
                let Some(u) = core.update(&um.id) else {
                    continue; // trimmed (ended long ago)
                };
                if u.state.is_terminal() {
                    continue;
                }
                assert!(
                    latest == Some(&um.id),
                    "{} is {:?} but is not the latest update of {}\n{}",
                    um.id,
                    u.state,
                    m.id,
                    self.describe()
                );
                let goal = u.goal();
                let down = u
                    .in_progress
                    .iter()
                    .filter(|&&i| {
                        job.tasks.get(i as usize).is_some_and(|t| {
                            !(t.config == goal
                                && t.state == TaskState::Running
                                && (t.health == Health::Healthy
                                    || (t.health == Health::None && !m.spec.health)))
                        })
                    })
                    .count();
                assert!(
                    down <= um.bound,
                    "update {} of {} has {down} instances down (batch {:?}), more than \
                     its batch size {} (or the batch it took over): {u:?}\n{}",
                    um.id,
                    m.id,
                    u.in_progress,
                    um.bound,
                    self.describe()
                );
            }
        }
    }

    /// Stateful instances and daemons, after every step:
    /// - volume ids are unique, each names its instance (one a
    ///   instance), belongs to a live job, and is stored as the core has
    ///   it;
    /// - a run of an instance with a volume is on its volume's host (in
    ///   the core and on the agents, but for runs of a host cut off and
    ///   declared lost), and a placed run of a task with a volume has one
    ///   there;
    /// - the engine holds reservations only for pinned instances (with a
    ///   volume, or of a daemon), on their pin host, at most what their
    ///   next task asks for;
    /// - a daemon job has at most one instance bound to a host, and at
    ///   most one run going on a host (but runs told to stop).
    fn check_pinned(&self) {
        let (sim, core) = (&self.sim, &self.sim.core);
        let mut ids = BTreeSet::new();
        for v in core.volumes() {
            assert!(ids.insert(v.id.clone()), "volume id {} twice", v.id);
            assert_eq!(core.volume(&v.id), Some(v), "volume {} by id", v.id);
            let job = core
                .job(v.job)
                .unwrap_or_else(|| panic!("volume {} of a deleted job\n{}", v.id, self.describe()));
            let stored = sim.store.volumes.get(&v.id);
            assert!(
                stored.is_some_and(|r| *r.job_id == *job.id
                    && r.instance == v.instance
                    && *r.host == **core.host_name(v.host)),
                "volume {} is stored as {stored:?}",
                v.id
            );
        }
        assert_eq!(
            sim.store.volumes.keys().cloned().collect::<BTreeSet<_>>(),
            ids,
            "the store has the core's volumes"
        );
        // A volume's disk stays held on its host while no engine task of
        // its instance (current or stopping) holds it.
        for v in core.volumes() {
            let on_host = core
                .job(v.job)
                .and_then(|j| j.tasks.get(v.instance as usize));
            let current = on_host
                .is_some_and(|t| t.state.on_host() && t.handle.is_some() && t.host == Some(v.host));
            let held = core
                .held(v.job, v.instance)
                .is_some_and(|h| h.handle.is_some() && h.host == Some(v.host));
            if current || held {
                continue;
            }
            let held = sim.engine.reservation(v.job.0, v.instance);
            assert!(
                held.is_some_and(|(slot, amount)| slot == v.host.0
                    && amount.0[peloton_engine::Dim::Disk.idx()] >= v.size_mb),
                "volume {} on {}, not in use, has {held:?} reserved\n{}",
                v.id,
                core.host_name(v.host),
                self.describe()
            );
        }
        for (k, job) in core.jobs_by_id("") {
            for (i, t) in job.tasks.iter().enumerate() {
                let i = i as u32;
                let Some(h) = t.host.filter(|_| t.state.on_host()) else {
                    continue;
                };
                if job.template(i).volume.is_some() {
                    assert_eq!(
                        core.volume_of(k, i).map(|v| v.host),
                        Some(h),
                        "{}/{i} runs on {} without its volume there\n{}",
                        job.id,
                        core.host_name(h),
                        self.describe()
                    );
                }
            }
        }
        for (host, a) in &sim.agents {
            for r in a.runs.values().filter(|r| r.live() && !r.stale) {
                let Some(v) = core
                    .job_key(&r.key.job_id)
                    .ok()
                    .and_then(|k| core.volume_of(k, r.key.instance))
                else {
                    continue;
                };
                assert_eq!(
                    core.host_name(v.host),
                    host,
                    "{}/{} runs on {host}, its volume {} is on {}\n{}",
                    r.key.job_id,
                    r.key.instance,
                    v.id,
                    core.host_name(v.host),
                    self.describe()
                );
            }
        }
        // A pinned instance coming back (waiting, queued, backing off)
        // has its whole next request reserved on its host, unless it gave
        // its place up (preempted for room) or it does not fit there.
        for (k, job) in core.jobs_by_id("") {
            if job.kill_requested {
                continue;
            }
            for (i, t) in job.tasks.iter().enumerate() {
                let i = i as u32;
                let Some(slot) = core.pin_of(k, i) else {
                    continue;
                };
                let coming_back = matches!(
                    t.state,
                    TaskState::Initialized
                        | TaskState::Pending
                        | TaskState::Ready
                        | TaskState::Placing
                        | TaskState::Backoff
                        | TaskState::Lost
                        | TaskState::Preempted
                );
                if !coming_back || t.gave_way || core.held(k, i).is_some() {
                    continue;
                }
                let tmpl = job.template(i);
                let mut want = tmpl.request;
                want.0[peloton_engine::Dim::Gpu.idx()] = 0;
                if let Some(v) = core.volume_of(k, i).filter(|v| v.host == slot) {
                    want.0[peloton_engine::Dim::Disk.idx()] += v.size_mb;
                }
                let have = sim.engine.reservation(k.0, i);
                let mut room = sim.engine.hosts().free(slot.idx());
                if let Some((_, amount)) = have {
                    room.add_assign(&amount);
                }
                assert!(
                    have == Some((slot.0, want)) || !want.fits_in(&room),
                    "{}/{i} ({:?}) has {have:?} reserved, wants {want} on {} (room {room})\n{}",
                    job.id,
                    t.state,
                    core.host_name(slot),
                    self.describe()
                );
            }
        }
        for ((job, i), (slot, amount)) in sim.engine.reservations() {
            let k = JobKey(job);
            let j = core.job(k).unwrap_or_else(|| {
                panic!(
                    "a reservation for instance {i} of a deleted job\n{}",
                    self.describe()
                )
            });
            let pinned = core.volume_of(k, i).is_some() || j.plan.kind == JobKind::Daemon;
            assert!(
                pinned && core.pin_of(k, i) == Some(HostSlot(slot)),
                "{}/{i} has {amount} reserved on {}, pinned to {:?}\n{}",
                j.id,
                core.host_name(HostSlot(slot)),
                core.pin_of(k, i).map(|h| core.host_name(h)),
                self.describe()
            );
            if j.tasks.get(i as usize).is_none() {
                // Scaled away: only its volume's disk, once any step ended.
                let disk = core.volume_of(k, i).map_or(0, |v| v.size_mb);
                assert!(
                    amount == peloton_engine::Resources::new(0, 0, disk, 0),
                    "{}/{i} was scaled away but has {amount} reserved\n{}",
                    j.id,
                    self.describe()
                );
            }
            let tmpl = j.template(i);
            let mut most = tmpl.request;
            most.0[peloton_engine::Dim::Gpu.idx()] = 0;
            if let Some(v) = core.volume_of(k, i) {
                most.0[peloton_engine::Dim::Disk.idx()] += v.size_mb;
            }
            assert!(
                amount.fits_in(&most),
                "{}/{i} has {amount} reserved, more than {most}",
                j.id
            );
        }
        for m in self.jobs.iter().filter(|m| !m.deleted) {
            if !matches!(m.pinned, Pinned::Daemon(_)) {
                continue;
            }
            let Some(job) = core.job_key(&m.id).ok().and_then(|k| core.job(k)) else {
                continue;
            };
            let mut bound = BTreeSet::new();
            for (i, t) in job.tasks.iter().enumerate() {
                match t.daemon_host {
                    Some(h) => assert!(
                        bound.insert(h),
                        "{} has two instances on {}\n{}",
                        m.id,
                        core.host_name(h),
                        self.describe()
                    ),
                    // Retired: its run ended (or is stopping).
                    None => assert!(
                        t.state.is_terminal(),
                        "{}/{i} is {:?}, bound to no host\n{}",
                        m.id,
                        t.state,
                        self.describe()
                    ),
                }
            }
            // (A run told to stop, or that the core holds until its host
            // confirms the end: its kill may have been lost with a session.)
            let k = core.job_key(&m.id).expect("live");
            let held = |r: &super::AgentRun| {
                core.held(k, r.key.instance)
                    .is_some_and(|h| h.launch.0 == r.key.launch)
            };
            for (host, a) in &sim.agents {
                let going: Vec<u32> = a
                    .runs
                    .values()
                    .filter(|r| r.live() && !r.stale && !r.stopping && r.key.job_id == m.id)
                    .filter(|r| !held(r))
                    .map(|r| r.key.instance)
                    .collect();
                assert!(
                    going.len() <= 1,
                    "{} runs instances {going:?} on {host}\n{}",
                    m.id,
                    self.describe()
                );
            }
        }
    }

    /// Daemons after a cycle: each daemon job not killed has an instance
    /// bound to every up host it matches (not in maintenance), and only to
    /// hosts it matches that are up, draining, or down while their agent
    /// is away (not lost, not in maintenance: an agent restart keeps its
    /// daemons), unless a run of the job is still stopping there; its runs
    /// are on the hosts their instances are bound to (runs still stopping
    /// excepted: they are held, not current).
    fn check_daemons_after_cycle(&self) {
        use peloton_engine::host::HostState;
        let (core, engine) = (&self.sim.core, &self.sim.engine);
        for m in self.jobs.iter().filter(|m| !m.deleted) {
            let Pinned::Daemon(c) = m.pinned else {
                continue;
            };
            let Some(job) = core.job_key(&m.id).ok().and_then(|k| core.job(k)) else {
                continue;
            };
            if job.kill_requested {
                continue;
            }
            let mut bound = BTreeSet::new();
            for (i, t) in job.tasks.iter().enumerate() {
                if t.state.on_host() {
                    assert_eq!(
                        t.host,
                        t.daemon_host,
                        "{}/{i} runs on a host it is not bound to\n{}",
                        m.id,
                        self.describe()
                    );
                }
                let Some(h) = t.daemon_host else { continue };
                let host = core.host_name(h);
                bound.insert(host.clone());
                let state = engine
                    .hosts()
                    .lookup(host)
                    .map(|id| engine.hosts().state(id));
                let away = state == Some(HostState::Down)
                    && !self.sim.agents[host].connected
                    && !self.lost.contains(host)
                    && !core.in_maintenance(h);
                assert!(
                    (matches!(state, Some(HostState::Up | HostState::Draining)) || away)
                        && self.daemon_matches(c, host),
                    "{}/{i} is bound to {host} ({state:?}, zone {:?})\n{}",
                    m.id,
                    self.zones.get(host),
                    self.describe()
                );
            }
            let k = core.job_key(&m.id).expect("live");
            for host in &self.hosts {
                let Some(id) = engine.hosts().lookup(host) else {
                    continue;
                };
                let slot = HostSlot(id.idx() as u32);
                let up = engine.hosts().state(id) == HostState::Up && !core.in_maintenance(slot);
                // (A host where a run of the job is still stopping gets its
                // instance once that run is gone.)
                let stopping = (0..job.tasks.len() as u32)
                    .any(|i| core.held(k, i).is_some_and(|h| h.host == Some(slot)));
                if up && !stopping && self.daemon_matches(c, host) {
                    assert!(
                        bound.contains(host),
                        "{} has no instance on {host}, an up host it matches\n{}",
                        m.id,
                        self.describe()
                    );
                }
            }
        }
    }

    /// What must hold after every step.
    pub fn check_step(&self) {
        let sim = &self.sim;
        sim.core.check_invariants(&sim.engine);
        sim.engine.check_invariants();
        sim.check_no_double_runs();
        self.check_updates();
        self.check_pinned();
        // A job's running limit holds on the agents: its instances with a
        // live run (also one told to stop) are at most `max_running`.
        let mut live: BTreeMap<Arc<str>, BTreeSet<u32>> = BTreeMap::new();
        for a in sim.agents.values() {
            for r in a.runs.values().filter(|r| r.live() && !r.stale) {
                live.entry(r.key.job_id.clone())
                    .or_default()
                    .insert(r.key.instance);
            }
        }
        for m in &self.jobs {
            let limit = match (m.plan().max_running, m.cap_seen) {
                (_, Some(0)) => continue,
                (now, Some(seen)) if now != 0 => now.max(seen),
                (now, _) => now,
            };
            if limit == 0 {
                continue;
            }
            let n = live.get(&m.id).map_or(0, BTreeSet::len);
            assert!(
                n <= limit as usize,
                "{} runs {n} instances, more than its max_running {limit}\n{}",
                m.id,
                self.describe()
            );
        }
        // A connected agent runs exactly the core's current runs on its
        // host (and runs it was told to stop).
        for (host, a) in &sim.agents {
            if !a.connected {
                continue;
            }
            for r in a.runs.values().filter(|r| r.live() && !r.stopping) {
                let key = &r.key;
                let current = sim.current(&key.job_id, key.instance);
                let on_host = sim
                    .core
                    .job_key(&key.job_id)
                    .ok()
                    .and_then(|k| sim.core.job(k))
                    .and_then(|j| j.tasks.get(key.instance as usize))
                    .is_some_and(|t| t.state.on_host());
                assert!(
                    on_host && current.as_ref().is_some_and(|(h, k)| h == host && k == key),
                    "{host} runs {}/{} (run {}, launch {}), which is not the current run \
                     there ({current:?}), and was not told to stop it\n{}",
                    key.job_id,
                    key.instance,
                    key.run,
                    key.launch,
                    self.describe()
                );
            }
        }
        for (_, job) in sim.core.jobs_by_id("") {
            for (i, t) in job.tasks.iter().enumerate() {
                let Some(slot) = t.host else { continue };
                if !t.state.on_host() || t.handle.is_none() {
                    continue; // orphans wait for their agent
                }
                let host = sim.core.host_name(slot);
                let Some(a) = sim.agents.get(host).filter(|a| a.connected) else {
                    continue;
                };
                // (Running only once the agent started it.)
                assert!(
                    a.runs.get(&t.launch.0).is_some_and(|r| r.live()
                        && !r.stopping
                        && (r.started || t.state != TaskState::Running)),
                    "{}/{i} is {:?} on {host} (launch {}), which does not run it\n{}",
                    job.id,
                    t.state,
                    t.launch.0,
                    self.describe()
                );
            }
        }
    }

    /// Brings every host back and out of maintenance, adds a host with
    /// room for every job, then confirms kills, lets time pass, runs
    /// cycles and lets batch runs exit 0 until nothing changes. Panics if
    /// the core does not settle.
    pub fn quiesce(&mut self) {
        for host in self.hosts.clone() {
            if !self.sim.agents[&host].connected {
                let _ = self.sim.register(&host);
                self.check_step();
            }
        }
        let _ = self.step(Input::Maintenance {
            hosts: self.hosts.iter().map(|h| h.to_string()).collect(),
            start: false,
        });
        if !self.big_host {
            self.big_host = true;
            self.sim
                .add_host_spec(scenario_host("big", 256, 256 * 1024, "a", 1 << 30))
                .expect("a new host registers");
            self.hosts.push("big".into());
            self.zones.insert("big".into(), "a");
        }
        self.check_step();
        let batch: BTreeSet<Arc<str>> = self
            .jobs
            .iter()
            .filter(|j| j.kind() == JobKind::Batch)
            .map(|j| j.id.clone())
            .collect();
        for host in self.hosts.clone() {
            self.sim.start_launches(&host);
        }
        self.check_step();
        for round in 0..MAX_QUIESCE_ROUNDS {
            self.settle_updates();
            let revision = self.sim.core.revision();
            self.sim.confirm_kills(None);
            self.sim.now += 60_000;
            let _ = self.step(Input::Tick);
            let _ = self.step(Input::Cycle);
            let runs = self.runs_where(|_, r| !r.stopping && batch.contains(&r.key.job_id));
            for (host, launch) in &runs {
                self.sim.end_run(host, *launch, RunPhase::Succeeded, 0);
            }
            let _ = self.step(Input::Cycle);
            self.observe_updates();
            self.check_step();
            let quiet = self.runs_where(|_, r| r.stopping).is_empty();
            if runs.is_empty() && quiet && self.sim.core.revision() == revision {
                self.stats.quiesce_rounds = round as u64 + 1;
                return;
            }
        }
        panic!(
            "the core did not settle in {MAX_QUIESCE_ROUNDS} rounds:\n{}",
            self.describe()
        );
    }

    /// Whether job `m`'s pool can no longer take its runs (deleted, or it
    /// got child pools): then its paused update cannot resume.
    fn pool_unusable(&self, m: &JobModel) -> bool {
        let tree = self.sim.engine.resources().tree();
        tree.resolve(m.pool).is_ok_and(|id| !tree.is_leaf(id)) || tree.resolve(m.pool).is_err()
    }

    /// What lets updates end in the quiesce phase: paused ones resume
    /// (refused, and left paused, while the job's pool cannot take its
    /// runs), and running instances of services with a health check are
    /// reported healthy.
    fn settle_updates(&mut self) {
        let paused: Vec<String> = self
            .jobs
            .iter()
            .filter(|m| !m.deleted)
            .filter_map(|m| m.updates.last())
            .filter(|um| {
                self.sim
                    .core
                    .update(&um.id)
                    .is_some_and(|u| u.state == UpdateState::Paused)
            })
            .map(|um| um.id.to_string())
            .collect();
        for id in paused {
            let m = self
                .jobs
                .iter()
                .find(|m| m.updates.last().is_some_and(|u| *u.id == *id));
            let unusable = m.is_some_and(|m| self.pool_unusable(m));
            let r = self.step(Input::UpdateAction {
                id,
                action: UpdateAction::Resume,
            });
            assert!(r.is_ok() || unusable, "a paused update resumes: {r:?}");
            self.observe_updates();
            self.check_step();
        }
        let checked: BTreeSet<Arc<str>> = self
            .jobs
            .iter()
            .filter(|j| j.spec.health && !j.deleted)
            .map(|j| j.id.clone())
            .collect();
        let runs = self.runs_where(|a, r| {
            a.connected && r.started && !r.stopping && checked.contains(&r.key.job_id)
        });
        for (host, launch) in runs {
            let key = self.sim.agents[&host].runs[&launch].key.clone();
            let core = &self.sim.core;
            let unproven = core
                .job_key(&key.job_id)
                .ok()
                .and_then(|k| core.job(k))
                .and_then(|j| j.tasks.get(key.instance as usize))
                .is_some_and(|t| {
                    t.state == TaskState::Running
                        && t.launch.0 == key.launch
                        && t.health != Health::Healthy
                });
            if unproven {
                self.sim.health(&host, key, Health::Healthy);
                self.observe_updates();
                self.check_step();
            }
        }
    }

    /// Liveness, once quiesced: what every job must have reached.
    pub fn check_final(&mut self) {
        self.observe_pinned("quiesce");
        let f = self.check_jobs_final();
        self.stats.succeeded += f.succeeded;
        self.stats.services_running += f.services_running;
        self.stats.daemons_running += f.daemons_running;
        self.stats.pinned_waiting += f.pinned_waiting;
        self.check_volumes_final();
        self.check_updates_final();
    }

    /// Every update ended (none is left paused: the quiesce resumed them),
    /// but one waiting for room under its job's running limit; the
    /// latest update of a job that succeeded left every instance on its
    /// new spec, one rolled back every instance on its old one.
    fn check_updates_final(&mut self) {
        let core = &self.sim.core;
        let (mut succeeded, mut rolled_back, mut stopped) = (0, 0, 0);
        for m in self.jobs.iter().filter(|m| !m.deleted) {
            let Some(job) = core.job_key(&m.id).ok().and_then(|k| core.job(k)) else {
                continue;
            };
            let why = || format!("{}: {m:?}\n{}", m.id, self.describe());
            for (n, um) in m.updates.iter().enumerate() {
                let Some(u) = core.update(&um.id) else {
                    continue;
                };
                let latest = n + 1 == m.updates.len();
                match u.state {
                    UpdateState::Succeeded => succeeded += 1,
                    UpdateState::RolledBack => rolled_back += 1,
                    UpdateState::Failed | UpdateState::Aborted => stopped += 1,
                    state => {
                        // Instances of its batch (or failed ones, which
                        // count in it) may wait for room under the job's
                        // running limit, taken by instances that run on
                        // (or wait for room on the host they are pinned
                        // to); or one of its batch, pinned to a host, waits
                        // for room there.
                        let limit = job.plan.max_running as usize;
                        let k = core.job_key(&m.id).expect("live");
                        let active = (0..job.tasks.len() as u32)
                            .filter(|&i| {
                                job.tasks[i as usize].state == TaskState::Running
                                    || self.waits_for_room(k, i)
                            })
                            .count();
                        let stuck = u.in_progress.iter().any(|&i| self.waits_for_room(k, i));
                        let under_limit = limit != 0
                            && active >= limit
                            && u.in_progress.iter().chain(u.failed_now()).any(|&i| {
                                job.tasks
                                    .get(i as usize)
                                    .is_some_and(|t| t.state == TaskState::Initialized)
                            });
                        // Or it is paused, its job's pool unable to take
                        // its runs.
                        let blocked = state == UpdateState::Paused && self.pool_unusable(m);
                        assert!(
                            latest
                                && (blocked
                                    || (state != UpdateState::Paused && (stuck || under_limit))),
                            "update {} did not end: {u:?}\n{}",
                            um.id,
                            why()
                        );
                    }
                }
                if !latest {
                    continue;
                }
                let on = match u.state {
                    UpdateState::Succeeded => u.to,
                    UpdateState::RolledBack => u.from,
                    _ => continue,
                };
                assert_eq!(job.config, on, "update {} {:?}: {}", um.id, u.state, why());
                for (i, t) in job.tasks.iter().enumerate() {
                    assert_eq!(
                        t.config,
                        on,
                        "instance {i} after update {} {:?}: {}",
                        um.id,
                        u.state,
                        why()
                    );
                }
            }
        }
        self.stats.updates_succeeded += succeeded;
        self.stats.updates_rolled_back += rolled_back;
        self.stats.updates_stopped += stopped;
    }

    /// Every agent keeps only volumes the core knows there (the others
    /// were deleted, or deleted when it registered).
    fn check_volumes_final(&self) {
        for (host, a) in &self.sim.agents {
            for id in &a.volumes {
                assert!(
                    self.volumes.get(id).is_some_and(|(_, _, h)| h == host),
                    "{host} keeps volume {id}, which the core does not know there\n{}",
                    self.describe()
                );
            }
        }
    }

    /// Whether instance `i` of job `k`, pinned to a host and queued or
    /// waiting, cannot fit there: the host's free resources, what is
    /// reserved for it there and (for a daemon) what preemptible
    /// non-daemon tasks there hold are less than its request.
    fn waits_for_room(&self, k: JobKey, i: u32) -> bool {
        let (core, engine) = (&self.sim.core, &self.sim.engine);
        let Some(job) = core.job(k) else {
            return false;
        };
        let Some(t) = job.tasks.get(i as usize) else {
            return false;
        };
        if !matches!(
            t.state,
            TaskState::Initialized | TaskState::Pending | TaskState::Ready | TaskState::Placing
        ) {
            return false;
        }
        let Some(slot) = core.pin_of(k, i) else {
            return false;
        };
        let hosts = engine.hosts();
        let mut room = hosts.free(slot.idx());
        if let Some((s, amount)) = engine.reservation(k.0, i)
            && s == slot.0
        {
            room.add_assign(&amount);
        }
        let tmpl = job.template(i);
        let mut need = tmpl.request;
        if let Some(v) = &tmpl.volume {
            need.0[peloton_engine::Dim::Disk.idx()] += v.size_mb;
        }
        let borrowed = hosts.borrowed(slot.idx());
        // A revocable task may also run on what the host lends now.
        if tmpl.revocable {
            let lent = hosts.reclaimable(slot.idx()).saturating_sub(&borrowed).min(
                &hosts
                    .capacity(slot.idx())
                    .saturating_sub(&hosts.free(slot.idx())),
            );
            if need.fits_in(&room.saturating_add(&lent)) {
                return false;
            }
        }
        if job.plan.kind == JobKind::Daemon {
            // A daemon may evict preemptible non-daemon tasks (a revocable
            // one only revocable tasks); what they free repays what
            // revocable tasks borrowed first.
            use peloton_engine::task::flags;
            for h in engine.tasks().on_host(slot.0) {
                let spec = engine.tasks().spec(h).expect("live");
                if spec.flags & flags::PREEMPTIBLE != 0
                    && spec.flags & flags::DAEMON == 0
                    && (!tmpl.revocable || spec.flags & flags::REVOCABLE != 0)
                {
                    room.add_assign(&spec.request);
                }
            }
        }
        let room = room.saturating_sub(&borrowed);
        !need.fits_in(&room)
    }

    /// Whether a daemon job of constraint variant `c` matches `host`.
    fn daemon_matches(&self, c: u8, host: &str) -> bool {
        Pinned::constraint(c).is_none_or(|zone| self.zones.get(host) == Some(&zone))
    }

    fn check_jobs_final(&self) -> FinalCounts {
        let sim = &self.sim;
        let (mut succeeded, mut services_running) = (0, 0);
        let (mut daemons_running, mut pinned_waiting) = (0, 0);
        let mut running_runs = BTreeSet::new();
        let mut n_live = 0;
        for m in &self.jobs {
            let found = sim.core.job_key(&m.id).ok().and_then(|k| sim.core.job(k));
            if m.deleted {
                assert!(found.is_none(), "{} was deleted", m.id);
                continue;
            }
            n_live += 1;
            let job = found.unwrap_or_else(|| panic!("{} was accepted and is gone", m.id));
            let k = sim.core.job_key(&m.id).expect("found");
            let why = || format!("{}: {m:?}\n{}", m.id, self.describe());
            assert_eq!(job.held, 0, "no run of {} is left stopping", m.id);
            if m.kind() != JobKind::Daemon {
                assert_eq!(job.tasks.len() as u32, m.instances, "{}", why());
            }
            for (i, t) in job.tasks.iter().enumerate() {
                assert!(sim.core.held(k, i as u32).is_none(), "{}", why());
                if t.state == TaskState::Running {
                    running_runs.insert((m.id.clone(), i as u32, t.launch.0));
                }
            }
            if m.killed {
                assert_eq!(job.state, JobState::Killed, "{}", why());
            } else if let Pinned::Daemon(c) = m.pinned {
                // One instance on every host it matches (all are up now),
                // running unless killed there by request; retired ones
                // ended.
                let mut bound = BTreeMap::new();
                for (i, t) in job.tasks.iter().enumerate() {
                    match t.daemon_host {
                        Some(h) => assert!(
                            bound
                                .insert(sim.core.host_name(h).clone(), i as u32)
                                .is_none(),
                            "two instances on {}: {}",
                            sim.core.host_name(h),
                            why()
                        ),
                        None => assert!(t.state.is_terminal(), "instance {i} of {}", why()),
                    }
                }
                for host in &self.hosts {
                    let matches = self.daemon_matches(c, host);
                    let Some(&i) = bound.get(host) else {
                        assert!(!matches, "no instance on matching host {host}: {}", why());
                        continue;
                    };
                    assert!(
                        matches,
                        "instance {i} on {host}, which it does not match: {}",
                        why()
                    );
                    let t = &job.tasks[i as usize];
                    if m.daemon_kills.get(&i) == Some(host) {
                        assert_eq!(t.state, TaskState::Killed, "instance {i} of {}", why());
                    } else if t.state == TaskState::Running {
                        daemons_running += 1;
                    } else {
                        assert!(
                            self.waits_for_room(k, i),
                            "instance {i} on {host} does not run: {}",
                            why()
                        );
                        pinned_waiting += 1;
                    }
                }
            } else if m.kind() == JobKind::Batch {
                // (A stateful instance may wait for room on its host, and
                // others for room under the running limit it holds.)
                let (stuck, waiting): (Vec<u32>, Vec<u32>) = (0..job.tasks.len() as u32)
                    .filter(|&i| !job.tasks[i as usize].state.is_terminal())
                    .partition(|&i| self.waits_for_room(k, i));
                let limit = m.plan().max_running as usize;
                assert!(
                    waiting.iter().all(|&i| {
                        job.tasks[i as usize].state == TaskState::Initialized
                            && limit != 0
                            && stuck.len() >= limit
                    }),
                    "batch job {}",
                    why()
                );
                pinned_waiting += stuck.len() as u64;
                if m.clean && !m.spec.deadline && stuck.is_empty() {
                    assert_eq!(job.state, JobState::Succeeded, "{}", why());
                }
                if job.state == JobState::Succeeded {
                    succeeded += 1;
                }
            } else {
                // Every instance not killed runs, up to the running limit;
                // the rest wait their turn, a gang at a time: then the
                // next gang does not fit under the limit.
                let plan = m.plan();
                let limit = match plan.max_running {
                    0 => u32::MAX,
                    n => n,
                };
                let mut n_running = 0;
                let mut n_wanted = 0;
                let mut n_stuck = 0;
                for (i, t) in job.tasks.iter().enumerate() {
                    if m.killed_instances[i] {
                        assert_eq!(t.state, TaskState::Killed, "instance {i} of {}", why());
                        continue;
                    }
                    if self.waits_for_room(k, i as u32) {
                        // (It holds its place under the running limit.)
                        n_stuck += 1;
                        continue;
                    }
                    n_wanted += 1;
                    assert!(
                        matches!(t.state, TaskState::Running | TaskState::Initialized),
                        "instance {i} of {}",
                        why()
                    );
                    n_running += u32::from(t.state == TaskState::Running);
                }
                let n_waiting = n_wanted - n_running;
                pinned_waiting += u64::from(n_stuck);
                assert!(
                    n_waiting == 0 || n_running + n_stuck + n_waiting.min(plan.gang) > limit,
                    "{n_waiting} instances wait with room under max_running: {}",
                    why()
                );
                assert!(
                    n_running <= limit,
                    "{n_running} running, over max_running: {}",
                    why()
                );
                services_running += u64::from(n_running);
            }
        }
        assert_eq!(sim.core.n_jobs(), n_live, "the core has the jobs created");
        // The agents run exactly the running instances, and every end was
        // acknowledged.
        let mut on_agents = BTreeSet::new();
        for (host, a) in &sim.agents {
            assert!(a.connected, "{host} is back");
            for r in a.runs.values() {
                assert!(
                    r.live() && !r.stopping,
                    "{host} still has {r:?}\n{}",
                    self.describe()
                );
                on_agents.insert((r.key.job_id.clone(), r.key.instance, r.key.launch));
            }
        }
        assert_eq!(
            on_agents, running_runs,
            "the agents run the running instances"
        );
        FinalCounts {
            succeeded,
            services_running,
            daemons_running,
            pinned_waiting,
        }
    }

    /// The jobs, their tasks and the agents' runs, for failure messages.
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let sim = &self.sim;
        let mut s = String::new();
        for (_, job) in sim.core.jobs_by_id("") {
            let _ = writeln!(
                s,
                "job {} {:?} kill_requested={} held={} waiting={:?}",
                job.id, job.state, job.kill_requested, job.held, job.waiting
            );
            for (i, t) in job.tasks.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "  {i}#{} {:?} host={:?} launch={} reason={:?}",
                    t.run,
                    t.state,
                    t.host.map(|h| sim.core.host_name(h).clone()),
                    t.launch.0,
                    t.reason
                );
            }
        }
        for (host, a) in &sim.agents {
            let _ = writeln!(s, "agent {host} connected={}", a.connected);
            for r in a.runs.values() {
                let _ = writeln!(
                    s,
                    "  {}/{}#{} launch={} stopping={} ended={:?} stale={}",
                    r.key.job_id,
                    r.key.instance,
                    r.key.run,
                    r.key.launch,
                    r.stopping,
                    r.ended,
                    r.stale
                );
            }
        }
        if !sim.quiet {
            let _ = write!(s, "log:\n{}", sim.log);
        }
        s
    }
}

/// What the final checks counted.
struct FinalCounts {
    succeeded: u64,
    services_running: u64,
    daemons_running: u64,
    pinned_waiting: u64,
}

/// The fuzz target's driver: decodes `data` into a scenario and runs it.
/// Panics on a violation.
pub fn fuzz_lifecycle_ops(data: &[u8]) -> Stats {
    Driver::run(&Scenario::decode(data))
}
