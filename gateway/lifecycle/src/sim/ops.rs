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
//! pause, resume, abort and rollback. [`Driver::apply`] runs one
//! operation and then checks what must hold after every step:
//! - the core's and the engine's invariants;
//! - no instance has two live runs on the agents (but for runs of a host
//!   cut off and declared lost);
//! - a job's instances with a live run are at most its `max_running`;
//! - a connected agent runs exactly the core's current runs on its host
//!   (RUNNING ones started), but for runs it was told to stop;
//! - only a job's latest update is in progress, and the instances an
//!   update has down being moved (in its batch, not running healthy on its
//!   goal spec) are at most its batch size, or the batch it took over from
//!   the update it replaced.
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
//! its new (old) config.
//!
//! Three bugs of updates this found are fixed, with regression tests in
//! `sim::tests` ([`Driver::forgive_known_bugs`] stays off: it tolerated an
//! update restarting an instance killed by request while they were open).
//!
//! Bugs of the core this found have regression tests in `sim::tests`.
//!
//! The same scenarios come from proptest strategies (`sim::tests`) and from
//! raw bytes ([`Scenario::decode`], the `lifecycle_ops` fuzz target), and
//! [`Scenario::encode`] writes seed inputs for the fuzz corpus.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use peloton_engine::{PoolConfig, Resources};

use super::{Sim, plan};
use crate::{
    Answer, Error, Health, Input, JobAction, JobKind, JobPlan, JobState, RunPhase, TaskState,
    UpdateAction, UpdateRequest, UpdateSpec, UpdateState,
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
const N_KINDS: u8 = 25;

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
        out.push(self.max_running % 3 + 3 * ((self.max_unavailable - 1) % 2));
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
                _ => Op::UpdateAction(input.byte(), input.byte() % 4),
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
    PoolConfig::default().with_reservation(Resources::new(cores * 1000, cores * 1024, 0, 0))
}

fn job_plan(spec: &JobSpec, pool: &str) -> JobPlan {
    let n = u32::from(spec.instances);
    let mut p = plan(pool, n, 0);
    p.default.request = Resources::new(if spec.big { 1000 } else { 500 }, 64, 0, 0);
    p.kind = if spec.service {
        JobKind::Service
    } else {
        JobKind::Batch
    };
    p.gang = if spec.gang { n } else { 1 };
    p.priority = u32::from(spec.priority);
    p.preemptible = spec.preemptible;
    p.max_running = u32::from(spec.max_running);
    if p.max_running != 0 && p.max_running < p.gang {
        // A gang larger than the running limit could never start.
        p.max_running = p.gang;
    }
    p.max_unavailable = u32::from(spec.max_unavailable);
    p.default.health_check = spec.health;
    p.default.restart.max_failures = u32::from(spec.max_failures);
    p.default.restart.backoff_ms = 500;
    p.default.restart.max_backoff_ms = 4_000;
    if spec.deadline && !spec.service {
        p.max_running_time_ms = 5_000;
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
        for h in 0..n_hosts.clamp(2, 4) {
            let name = format!("h{h}");
            sim.add_host(&name, 2 + u64::from(h % 2), 4096)
                .expect("a new host registers");
            hosts.push(Arc::from(name));
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
                });
            }
            Op::CreateJob(spec) => {
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
                let r = self.step(Input::CreateJob {
                    id: id.clone(),
                    plan: Box::new(job_plan(spec, pool)),
                });
                if r.is_ok() {
                    self.stats.jobs += 1;
                    self.jobs.push(JobModel {
                        id,
                        spec: spec.clone(),
                        pool,
                        instances: u32::from(spec.instances),
                        killed: false,
                        deleted: false,
                        killed_instances: vec![false; usize::from(spec.instances)],
                        clean: true,
                        updates: Vec::new(),
                        kill_pending: BTreeMap::new(),
                    });
                }
            }
            Op::Cycle => {
                let _ = self.step(Input::Cycle);
            }
            Op::Tick(t) => {
                self.sim.now += TICKS_MS[usize::from(*t) % 5];
                let _ = self.step(Input::Tick);
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
                let id = self.jobs[j].id.to_string();
                let r = self.step(Input::JobAction {
                    id,
                    version: 0,
                    action: JobAction::Delete,
                });
                if r.is_ok() {
                    self.jobs[j].deleted = true;
                }
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
            }
            Op::Register(h) => {
                let host = self.host(*h);
                let _ = self.sim.register(&host);
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
        self.check_step();
    }

    /// Asks for an update of job `j` (the model's index). (One whose pool
    /// has child pools now is refused: see
    /// `sim::tests::regression_an_update_is_accepted_when_the_pool_became_inner`.)
    fn update_job(&mut self, j: usize, v: UpdateVariant) {
        let m = &self.jobs[j];
        let core = &self.sim.core;
        let job = core.job_key(&m.id).ok().and_then(|k| core.job(k));
        let mut plan = job.map_or_else(|| job_plan(&m.spec, m.pool), |job| job.plan.clone());
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
            plan.default.request.0[0] = if cpu >= 1000 { cpu - 100 } else { cpu + 100 };
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

    /// What must hold after every step.
    pub fn check_step(&self) {
        let sim = &self.sim;
        sim.core.check_invariants(&sim.engine);
        sim.engine.check_invariants();
        sim.check_no_double_runs();
        self.check_updates();
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
            let limit = job_plan(&m.spec, m.pool).max_running;
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
                .add_host("big", 256, 256 * 1024)
                .expect("a new host registers");
            self.hosts.push("big".into());
        }
        self.check_step();
        let batch: BTreeSet<Arc<str>> = self
            .jobs
            .iter()
            .filter(|j| !j.spec.service)
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

    /// What lets updates end in the quiesce phase: paused ones resume,
    /// and running instances of services with a health check are
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
            let r = self.step(Input::UpdateAction {
                id,
                action: UpdateAction::Resume,
            });
            assert!(r.is_ok(), "a paused update resumes: {r:?}");
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
        let (succeeded, services_running) = self.check_jobs_final();
        self.stats.succeeded += succeeded;
        self.stats.services_running += services_running;
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
                        // running limit, taken by instances that run on.
                        let limit = job.plan.max_running as usize;
                        let running = job
                            .tasks
                            .iter()
                            .filter(|t| t.state == TaskState::Running)
                            .count();
                        assert!(
                            latest
                                && state != UpdateState::Paused
                                && limit != 0
                                && running >= limit
                                && u.in_progress.iter().chain(&u.failed).any(|&i| {
                                    job.tasks
                                        .get(i as usize)
                                        .is_some_and(|t| t.state == TaskState::Initialized)
                                }),
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

    fn check_jobs_final(&self) -> (u64, u64) {
        let sim = &self.sim;
        let (mut succeeded, mut services_running) = (0, 0);
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
            assert_eq!(job.tasks.len() as u32, m.instances, "{}", why());
            for (i, t) in job.tasks.iter().enumerate() {
                assert!(sim.core.held(k, i as u32).is_none(), "{}", why());
                if t.state == TaskState::Running {
                    running_runs.insert((m.id.clone(), i as u32, t.launch.0));
                }
            }
            if m.killed {
                assert_eq!(job.state, JobState::Killed, "{}", why());
            } else if !m.spec.service {
                assert!(job.state.is_terminal(), "batch job {}", why());
                if m.clean && !m.spec.deadline {
                    assert_eq!(job.state, JobState::Succeeded, "{}", why());
                }
                if job.state == JobState::Succeeded {
                    succeeded += 1;
                }
            } else {
                // Every instance not killed runs, up to the running limit;
                // the rest wait their turn, a gang at a time: then the
                // next gang does not fit under the limit.
                let plan = job_plan(&m.spec, m.pool);
                let limit = match plan.max_running {
                    0 => u32::MAX,
                    n => n,
                };
                let mut n_running = 0;
                let mut n_wanted = 0;
                for (i, t) in job.tasks.iter().enumerate() {
                    if m.killed_instances[i] {
                        assert_eq!(t.state, TaskState::Killed, "instance {i} of {}", why());
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
                assert!(
                    n_waiting == 0 || n_running + n_waiting.min(plan.gang) > limit,
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
        (succeeded, services_running)
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

/// The fuzz target's driver: decodes `data` into a scenario and runs it.
/// Panics on a violation.
pub fn fuzz_lifecycle_ops(data: &[u8]) -> Stats {
    Driver::run(&Scenario::decode(data))
}
