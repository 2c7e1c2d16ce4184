//! A simulated cluster around the core, for tests and fuzzing: a real
//! engine, a model of agents (the runs each host has, the kills it was
//! told, the final reports it keeps until they are acknowledged), a model
//! of the store (the rows written at each commit) and a `crash` that
//! rebuilds the engine and the core from that store, as the service does.
//!
//! [`Sim`] does what the shell does after each step (write rows, publish
//! events, dispatch launches and kills; agents start launches at once) and
//! checks after every step what must hold: the core's and the engine's
//! invariants, gap-free event revisions, and that no instance has two
//! live runs on the agents. The fixture tests (`tests.rs`) script it with
//! text; [`ops`] drives it with random operations against a model of what
//! every job must reach (a proptest and the `lifecycle_ops` fuzz target).
//!
//! Compiled for tests, and for other crates with the `testkit` feature.

pub mod ops;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use peloton_engine::host::HostSpec;
use peloton_engine::task::Strategy;
use peloton_engine::{Engine, EngineConfig, PoolConfig, Resources};
use rustc_hash::FxHashMap;

use crate::{
    AgentRunKey, Answer, CoreConfig, Effects, Error, EventKind, Health, Holder, HostRegistration,
    Input, JobKind, JobPlan, JobRow, Lifecycle, RestartPolicy, RowKey, RunPhase, RunReport,
    StateRow, TaskRow, TaskState, TaskTemplate, Update,
};
use crate::{Recovered, RecoveredHost, RecoveredJob, RecoveredVolume};

/// One run as its agent has it.
#[derive(Clone, Debug)]
pub struct AgentRun {
    /// How the run is named.
    pub key: AgentRunKey,
    /// It was told to stop (and has not yet).
    pub stopping: bool,
    /// Its process was started (a stalled agent has received the launch
    /// and not started it yet).
    pub started: bool,
    /// It ended (phase, exit code); the agent reports it until the server
    /// acknowledges it.
    pub ended: Option<(RunPhase, i32)>,
    /// It ran on through a partition after the server declared its host
    /// lost (and started the instance elsewhere): the one accepted case of
    /// an instance running twice, until the host returns and is told to
    /// stop it.
    pub stale: bool,
}

impl AgentRun {
    /// Its process runs.
    pub fn live(&self) -> bool {
        self.ended.is_none()
    }
}

/// What an agent has.
#[derive(Debug, Default)]
pub struct Agent {
    /// What it registers with.
    pub spec: Option<HostSpec>,
    /// Runs by launch id: live ones, and ended ones not acknowledged.
    pub runs: BTreeMap<u64, AgentRun>,
    /// Its session is attached: launches and kills reach it and its reports
    /// reach the server.
    pub connected: bool,
    /// It takes launches but does not start them yet (until
    /// [`Sim::start_launches`]).
    pub stalled: bool,
    /// Volumes on its disk.
    pub volumes: std::collections::BTreeSet<Arc<str>>,
}

/// The store's rows, as the shell would write them.
#[derive(Debug, Default)]
pub struct StoreModel {
    /// Pools: configuration and version.
    pub pools: BTreeMap<String, (PoolConfig, u64)>,
    /// Hosts: registration and maintenance.
    pub hosts: BTreeMap<String, (HostSpec, bool, Arc<str>)>,
    /// Jobs: row and plan.
    pub jobs: BTreeMap<Arc<str>, (JobRow, JobPlan)>,
    /// Task rows.
    pub tasks: BTreeMap<(Arc<str>, u32), TaskRow>,
    /// Plans of config versions, by job id and version.
    pub configs: BTreeMap<(Arc<str>, u64), JobPlan>,
    /// Updates by id: job id and the update.
    pub updates: BTreeMap<Arc<str>, (Arc<str>, Update)>,
    /// Volumes by id.
    pub volumes: BTreeMap<Arc<str>, RecoveredVolume>,
    /// Host pools besides "default".
    pub host_pools: std::collections::BTreeSet<Arc<str>>,
    /// Hosts outside "default", with their host pool.
    pub host_pool_members: BTreeMap<Arc<str>, String>,
    /// Tokens by name.
    pub tokens: BTreeMap<Arc<str>, crate::Token>,
    /// The audit log by sequence number.
    pub audit: BTreeMap<u64, crate::AuditEntry>,
    /// Jobs' secrets by job id.
    pub secrets: BTreeMap<Arc<str>, Vec<crate::Secret>>,
    /// The usage ledger by sequence number (its rows are not logged: every
    /// ended run writes one; the `ledger` fixture command shows them).
    pub usage: BTreeMap<u64, crate::UsageRecord>,
}

/// The core, its engine, agents and store.
#[derive(Debug)]
pub struct Sim {
    /// The engine.
    pub engine: Engine,
    /// The core.
    pub core: Lifecycle,
    /// The time.
    pub now: u64,
    /// Effects not yet taken.
    pub fx: Effects,
    /// What the store holds.
    pub store: StoreModel,
    /// Agents by host name.
    pub agents: BTreeMap<Arc<str>, Agent>,
    /// Events and errors, one a line (unless `quiet`).
    pub log: String,
    /// Keep no log.
    pub quiet: bool,
    /// Runs launched on agents so far.
    pub n_launches: u64,
    /// Kills dispatched so far.
    pub n_kills: u64,
    /// Volume deletions sent to hosts (host, volume id), oldest first
    /// (the driver takes them after each operation).
    pub volume_deletes: Vec<(Arc<str>, Arc<str>)>,
    /// The last event revision published.
    last_revision: u64,
}

/// An engine of one thread.
pub fn engine() -> Engine {
    let mut config = EngineConfig::default();
    config.resources.threads = 1;
    Engine::new(config)
}

/// The core's settings in the simulation (agent mode).
pub fn config() -> CoreConfig {
    CoreConfig {
        max_history: 4,
        max_instances_per_job: 1000,
        agent_mode: true,
        ..CoreConfig::default()
    }
}

/// The simulated clock's first reading (ms).
pub const START_MS: u64 = 1_000_000;

/// The address a simulated agent registers for its host: `ip-<name>`.
pub fn sim_address(host: &str) -> Arc<str> {
    format!("ip-{host}").into()
}

/// The ports a simulated agent registers: as many as its host offers,
/// from 31000 up.
pub fn sim_port_ranges(spec: &HostSpec) -> Vec<crate::rendezvous::PortRange> {
    (spec.ports > 0)
        .then(|| crate::rendezvous::PortRange {
            first: 31000,
            last: (31000 + spec.ports - 1).min(65535) as u16,
        })
        .into_iter()
        .collect()
}

/// A task template of `cpu` millicores and `mem` MiB, no retries.
pub fn template(cpu: u64, mem: u64) -> TaskTemplate {
    TaskTemplate {
        request: Resources::new(cpu, mem, 0, 0),
        ports: 0,
        port_names: Box::default(),
        constraint: String::new(),
        revocable: false,
        controller: false,
        max_per_host: 0,
        restart: RestartPolicy {
            max_failures: 0,
            backoff_ms: 1000,
            max_backoff_ms: 8000,
        },
        kill_grace_ms: 1000,
        shutdown_delay_ms: 0,
        preemption_notice_ms: 0,
        health_check: false,
        volume: None,
        expected_runtime_ms: 0,
        command_key: crate::runtime::command_key(["sim"]),
        sim_duration_ms: 0,
        sim_exit_code: 0,
        spec: Arc::from(&[][..]),
    }
}

/// A batch job of `n` instances of `cpu` millicores in `pool`.
pub fn plan(pool: &str, n: u32, cpu: u64) -> JobPlan {
    JobPlan {
        kind: JobKind::Batch,
        name: "".into(),
        owner: "".into(),
        pool: pool.into(),
        host_pool: crate::DEFAULT_HOST_POOL.into(),
        instance_count: n,
        default: Arc::new(template(cpu, 64)),
        overrides: FxHashMap::default(),
        priority: 0,
        preemptible: false,
        max_running: 0,
        gang: 1,
        elastic_min: 0,
        max_running_time_ms: 0,
        max_unavailable: 1,
        strategy: Strategy::FirstFit,
        volume_policy: crate::VolumePolicy::default(),
        app: None,
        rendezvous: None,
        after: Arc::from([]),
        schedule: None,
        spec: Arc::from(&[][..]),
    }
}

/// The identity of a simulated host's agent (one agent per host name).
pub fn agent_id_of(host: &str) -> Arc<str> {
    format!("agent-{host}").into()
}

/// ` ports a=31099,b=31098 rank 0/2 gen 1` for a gang member, rank 0's
/// with every member (` [0@h1 a=31099 b=31098, 1@h2 …]`, `+` for a
/// member whose address is not its `sim_address`); "" for other runs.
fn rendezvous_words(l: &crate::Launch) -> String {
    let ports = |p: &crate::model::AssignedPorts| -> String {
        p.iter()
            .map(|(name, port)| format!("{name}={port}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut out = String::new();
    if let Some(p) = &l.ports {
        out += &format!(" ports {}", ports(p));
    }
    if let Some(r) = &l.rendezvous {
        let g = &r.gang;
        out += &format!(" rank {}/{} gen {}", r.rank, g.members.len(), g.generation);
        if r.rank == 0 {
            let members: Vec<String> = g
                .members
                .iter()
                .map(|m| {
                    let odd = if m.address == sim_address(&m.host) {
                        ""
                    } else {
                        "+"
                    };
                    let ports = if m.ports.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", ports(&m.ports))
                    };
                    format!("{}@{}{odd}{ports}", m.instance, m.host)
                })
                .collect();
            out += &format!(" [{}]", members.join(", "));
        }
    }
    out
}

/// A gang member's launch says of it what its gang says of it (rank,
/// instance, host, ports), as every other member's launch does.
fn check_launch_rendezvous(l: &crate::Launch) {
    let Some(r) = &l.rendezvous else {
        return;
    };
    let me = &r.gang.members[r.rank as usize];
    assert_eq!(me.rank, r.rank, "ranks in order");
    assert_eq!(me.instance, l.run.instance, "a member's rank names it");
    assert_eq!(me.host, l.host, "a member's host in its gang");
    assert_eq!(
        Some(&me.ports),
        l.ports.as_ref().or(Some(&Box::default())),
        "a member's ports in its gang"
    );
}

/// A host's registration: `cpu` cores, `mem` MiB.
/// ` gpus 1,3` (` share 500` for a share of one device); "" for none.
fn gpu_words(g: peloton_engine::host::GpuGrant) -> String {
    if g.devices == 0 {
        return String::new();
    }
    let list: Vec<String> = (0..16)
        .filter(|i| g.devices & (1 << i) != 0)
        .map(|i| i.to_string())
        .collect();
    let share = if u64::from(g.milli_per_device) < peloton_engine::host::MILLI_GPUS_PER_DEVICE {
        format!(" share {}", g.milli_per_device)
    } else {
        String::new()
    };
    format!(" gpus {}{share}", list.join(","))
}

pub fn host_spec(name: &str, cpu: u64, mem: u64) -> HostSpec {
    HostSpec {
        name: name.to_string(),
        capacity: Resources::new(cpu * 1000, mem, 0, 0),
        gpu_devices: 0,
        ports: 100,
        attributes: vec![("host".into(), name.to_string())],
    }
}

impl Default for Sim {
    fn default() -> Self {
        Sim::new()
    }
}

impl Sim {
    /// No hosts, no pools but the root, no jobs.
    pub fn new() -> Self {
        Sim::with_config(config())
    }

    /// No hosts, no pools but the root, no jobs; a core with `config`.
    pub fn with_config(config: CoreConfig) -> Self {
        let engine = engine();
        let core = Lifecycle::new(config, &engine, 0);
        Sim {
            engine,
            core,
            now: START_MS,
            fx: Effects::default(),
            store: StoreModel::default(),
            agents: BTreeMap::new(),
            log: String::new(),
            quiet: false,
            n_launches: 0,
            n_kills: 0,
            volume_deletes: Vec::new(),
            last_revision: 0,
        }
    }

    /// Adds a line to the log.
    pub fn say(&mut self, line: impl AsRef<str>) {
        if !self.quiet {
            self.log.push_str(line.as_ref());
            self.log.push('\n');
        }
    }

    /// One input at `now`, then what the shell does after it.
    pub fn step(&mut self, input: Input) -> Result<Answer, Error> {
        let r = self
            .core
            .step(&mut self.engine, input, self.now, &mut self.fx);
        if let Err(e) = &r {
            self.say(format!("error: {e}"));
        }
        self.commit();
        r
    }

    /// What the shell does after an iteration: write rows, publish events,
    /// acknowledge final reports, dispatch launches and kills (agents start
    /// launches at once, with a RUNNING report).
    pub fn commit(&mut self) {
        self.core.check_invariants(&self.engine);
        self.engine.check_invariants();
        self.write_rows();
        for e in std::mem::take(&mut self.fx.events) {
            assert_eq!(
                e.revision,
                self.last_revision + 1,
                "event revisions are gap-free"
            );
            self.last_revision = e.revision;
            let line = match e.kind {
                EventKind::Task {
                    job,
                    instance,
                    run,
                    state,
                    host,
                    reason,
                    health,
                } => {
                    let mut l = format!("{job}/{instance}#{run} {}", state.name());
                    if !host.is_empty() && state != TaskState::Initialized {
                        let _ = write!(l, " @{host}");
                    }
                    if health != Health::None {
                        let _ = write!(l, " [{health:?}]");
                    }
                    if !reason.is_empty() {
                        let _ = write!(l, " ({reason})");
                    }
                    l
                }
                EventKind::Job {
                    job,
                    state,
                    deleted,
                    reason,
                } => format!(
                    "job {job} {}{}",
                    state.name(),
                    if !deleted {
                        String::new()
                    } else if &*reason == "deleted" {
                        " deleted".to_string()
                    } else {
                        format!(" deleted ({reason})")
                    }
                ),
            };
            self.say(line);
        }
        for (host, key) in std::mem::take(&mut self.fx.acks) {
            if let Some(a) = self.agents.get_mut(&host)
                && a.connected
                && a.runs.get(&key.launch).is_some_and(|r| !r.live())
            {
                a.runs.remove(&key.launch);
            }
        }
        for (host, id) in std::mem::take(&mut self.fx.volume_deletes) {
            self.say(format!("  delete volume {id} @{host}"));
            self.volume_deletes.push((host.clone(), id.clone()));
            if let Some(a) = self.agents.get_mut(&host)
                && a.connected
            {
                a.volumes.remove(&id);
            }
        }
        // Launches before kills, as the shell hands them to its backend
        // (a run placed and preempted in one step is launched, then killed).
        let launches = std::mem::take(&mut self.fx.launches);
        let mut started: BTreeMap<Arc<str>, Vec<RunReport>> = BTreeMap::new();
        for l in launches {
            self.check_launch_volume(&l);
            check_launch_rendezvous(&l);
            self.say(format!(
                "  launch {}/{}#{} @{} config {}{}{}{}",
                l.job_id,
                l.run.instance,
                l.run.run,
                l.host,
                l.config,
                l.volume
                    .as_ref()
                    .map(|(id, mb)| format!(" volume {id} {mb}MiB"))
                    .unwrap_or_default(),
                gpu_words(l.gpu),
                rendezvous_words(&l),
            ));
            if let Some((id, _)) = &l.volume
                && let Some(a) = self.agents.get_mut(&l.host)
                && a.connected
            {
                a.volumes.insert(id.clone());
            }
            let key = AgentRunKey {
                job_id: l.job_id.clone(),
                instance: l.run.instance,
                run: l.run.run,
                launch: l.run.launch.0,
            };
            let agent = self
                .agents
                .get_mut(&l.host)
                .expect("launch to a known host");
            if !agent.connected {
                continue; // the launch is lost with the session
            }
            let stalled = agent.stalled;
            let old = agent.runs.insert(
                key.launch,
                AgentRun {
                    key: key.clone(),
                    stopping: false,
                    started: !stalled,
                    ended: None,
                    stale: false,
                },
            );
            assert!(old.is_none(), "launch {} is launched twice", key.launch);
            self.n_launches += 1;
            if stalled {
                continue;
            }
            started.entry(l.host.clone()).or_default().push(self.report(
                key,
                RunPhase::Running,
                0,
                Health::None,
            ));
        }
        for u in std::mem::take(&mut self.fx.rendezvous_updates) {
            let l = crate::Launch {
                run: u.run,
                host: u.host.clone(),
                job_id: u.job_id.clone(),
                config: 0,
                template: Arc::new(template(0, 0)),
                volume: None,
                gpu: Default::default(),
                ports: u.rendezvous.gang.members[u.rendezvous.rank as usize]
                    .ports
                    .clone()
                    .into(),
                rendezvous: Some(u.rendezvous.clone()),
            };
            check_launch_rendezvous(&l);
            // Every update names a run its host's agent holds and that
            // still runs there.
            if let Some(a) = self.agents.get(&u.host)
                && a.connected
            {
                assert!(
                    a.runs
                        .get(&u.run.launch.0)
                        .is_some_and(|r| !r.stopping && r.ended.is_none()),
                    "rendezvous update for {}/{} launch {}: not a live run of {}",
                    u.job_id,
                    u.run.instance,
                    u.run.launch.0,
                    u.host
                );
            }
            let g = &u.rendezvous.gang;
            let members: Vec<String> = g
                .members
                .iter()
                .map(|m| format!("{}@{}", m.instance, m.host))
                .collect();
            self.say(format!(
                "  rendezvous {}/{}#{} @{} rank {}/{} gen {} [{}]",
                u.job_id,
                u.run.instance,
                u.run.run,
                u.host,
                u.rendezvous.rank,
                g.members.len(),
                g.generation,
                members.join(", ")
            ));
        }
        for k in std::mem::take(&mut self.fx.kills) {
            self.n_kills += 1;
            self.say(format!(
                "  kill {}/{}#{} @{}{}{}",
                k.job_id,
                k.run.instance,
                k.run.run,
                k.host,
                if k.delay_ms > 0 {
                    format!(" after {} ms", k.delay_ms)
                } else {
                    String::new()
                },
                if k.notice_ms > 0 {
                    format!(" with notice {} ms", k.notice_ms)
                } else {
                    String::new()
                }
            ));
            // A kill for a host without a session is lost; the server
            // kills again when the agent registers.
            if let Some(a) = self.agents.get_mut(&k.host)
                && a.connected
                && let Some(r) = a.runs.get_mut(&k.run.launch.0)
                && r.live()
            {
                r.stopping = true;
            }
        }
        for (host, reports) in started {
            let r = self.core.step(
                &mut self.engine,
                Input::AgentReports { host, reports },
                self.now,
                &mut self.fx,
            );
            assert!(r.is_ok());
            self.commit();
        }
        self.check_no_double_runs();
    }

    /// A launch of an instance with a volume goes to its volume's host
    /// and names that volume; one of a task with a volume carries it.
    fn check_launch_volume(&self, l: &crate::Launch) {
        let Some(job) = self.core.job(l.run.job) else {
            return;
        };
        let i = l.run.instance;
        if let Some(v) = self.core.volume_of(l.run.job, i) {
            assert_eq!(
                (self.core.host_name(v.host), Some(&v.id)),
                (&l.host, l.volume.as_ref().map(|(id, _)| id)),
                "{}/{i} is launched on {} with {:?}, its volume is {} on {}\n{}",
                l.job_id,
                l.host,
                l.volume,
                v.id,
                self.core.host_name(v.host),
                self.log
            );
        }
        let wants = job.plan_of(l.config).template(i).volume.is_some();
        assert_eq!(
            wants,
            l.volume.is_some(),
            "{}/{i}: a launch carries a volume exactly when its task has one ({:?})\n{}",
            l.job_id,
            l.volume,
            self.log
        );
    }

    fn write_rows(&mut self) {
        self.write_state_rows();
        let mut updates_seen = std::collections::BTreeSet::new();
        for row in self.fx.take_rows() {
            match row {
                RowKey::Job(k) => {
                    if let (Some(r), Some(j)) = (self.core.job_row(k), self.core.job(k)) {
                        self.store.jobs.insert(r.id.clone(), (r, j.plan.clone()));
                    }
                }
                RowKey::JobDeleted(_, id) => {
                    self.store.jobs.remove(&id);
                    self.store.tasks.retain(|(j, _), _| *j != id);
                    self.store.configs.retain(|(j, _), _| *j != id);
                }
                RowKey::Config(k, v) => {
                    if let Some(j) = self.core.job(k) {
                        self.store
                            .configs
                            .insert((j.id.clone(), v), j.plan_of(v).clone());
                    }
                }
                RowKey::ConfigDeleted(id, v) => {
                    self.store.configs.remove(&(id, v));
                }
                RowKey::Update(id) => {
                    if !updates_seen.insert(id.clone()) {
                        continue;
                    }
                    if let Some(u) = self.core.update(&id) {
                        let job = self.core.job(u.job).expect("live").id.clone();
                        let line = format!(
                            "update {id} v{}->v{} {} cursor={} batch={:?} failed={:?}{} done={}{}",
                            u.from,
                            u.to,
                            u.state.name(),
                            u.cursor,
                            u.in_progress,
                            u.failed,
                            if u.failed_back.is_empty() {
                                String::new()
                            } else {
                                format!(" failed_back={:?}", u.failed_back)
                            },
                            self.core.update_counts(u).done,
                            u.reason
                                .as_deref()
                                .map(|r| format!(" ({r})"))
                                .unwrap_or_default()
                        );
                        self.store.updates.insert(id, (job, u.clone()));
                        self.say(line);
                    }
                }
                RowKey::UpdateDeleted(id) => {
                    self.store.updates.remove(&id);
                }
                RowKey::Task(k, i) => {
                    if let Some(row) = self.core.task_row(k, i) {
                        let id = self.core.job(k).expect("live").id.clone();
                        self.store.tasks.insert((id, i), row);
                    }
                }
                RowKey::TaskDeleted(id, i) => {
                    self.store.tasks.remove(&(id, i));
                }
                RowKey::Pool(path) => {
                    let tree = self.engine.resources().tree();
                    if let Ok(id) = tree.resolve(&path) {
                        let config = *tree.config(id);
                        let v = self.core.pool_version(&path);
                        self.store.pools.insert(path, (config, v));
                    }
                }
                RowKey::PoolDeleted(path) => {
                    self.store.pools.remove(&path);
                }
                RowKey::Volume(k, i) => {
                    if let Some(v) = self.core.volume_of(k, i) {
                        let job_id = self.core.job(k).expect("live").id.to_string();
                        self.store.volumes.insert(
                            v.id.clone(),
                            RecoveredVolume {
                                id: v.id.to_string(),
                                job_id,
                                instance: i,
                                host: self.core.host_name(v.host).to_string(),
                                size_mb: v.size_mb,
                                path: v.path.to_string(),
                                created_at: v.created_at,
                            },
                        );
                    }
                }
                RowKey::VolumeDeleted(id) => {
                    self.store.volumes.remove(&id);
                }
                RowKey::Host(slot) => {
                    let name = self.core.host_name(slot).to_string();
                    let spec = self.agents[name.as_str()].spec.clone().expect("registered");
                    let maintenance = self.core.in_maintenance(slot);
                    let agent = self
                        .core
                        .agent_host(slot)
                        .map(|a| a.agent_id.clone())
                        .unwrap_or_default();
                    self.store.hosts.insert(name, (spec, maintenance, agent));
                }
            }
        }
    }

    /// The rows of the tables beside the jobs, as the shell writes them.
    fn write_state_rows(&mut self) {
        // Only logged by the shell.
        self.fx.lapsed_apps.clear();
        // The shell ends these sessions: what is sent to them is lost.
        for host in std::mem::take(&mut self.fx.ended_sessions) {
            self.say(format!("session of {host} ended"));
            if let Some(agent) = self.agents.get_mut(&host) {
                agent.connected = false;
            }
        }
        for change in std::mem::take(&mut self.fx.access) {
            let line = match change {
                crate::AccessChange::TokenCreated(name) => format!("token {name} created"),
                crate::AccessChange::TokenRevoked {
                    digest,
                    certificates,
                } => format!(
                    "token {:02x} revoked with {} certificates",
                    digest[0],
                    certificates.len()
                ),
                crate::AccessChange::CertificateIssued {
                    fingerprint,
                    digest,
                    not_after_ms,
                } => format!(
                    "certificate {:02x} of {:02x} until {}",
                    fingerprint[0],
                    digest[0],
                    not_after_ms.saturating_sub(START_MS)
                ),
                crate::AccessChange::CertificatesRemoved(fps) => format!(
                    "certificates removed: {}",
                    fps.iter()
                        .map(|f| format!("{:02x}", f[0]))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            };
            self.say(format!("  access: {line}"));
        }
        for row in std::mem::take(&mut self.fx.state_rows) {
            match row {
                StateRow::HostPool(name) => {
                    if self.core.host_pools().exists(&name) {
                        self.say(format!("  row host pool {name}"));
                        self.store.host_pools.insert(name);
                    } else {
                        self.say(format!("  row host pool {name} deleted"));
                        self.store.host_pools.remove(&name);
                    }
                }
                StateRow::Token(name) => match self.core.access().token(&name).cloned() {
                    Some(t) => {
                        self.say(format!(
                            "  row token {name} certificates={}",
                            t.certificates.len()
                        ));
                        self.store.tokens.insert(name, t);
                    }
                    None => {
                        self.say(format!("  row token {name} deleted"));
                        self.store.tokens.remove(&name);
                    }
                },
                StateRow::Audit(seq) => match self.core.access().audit_entry(seq).cloned() {
                    Some(e) => {
                        self.say(format!("  row audit {seq} {} {}", e.principal, e.method));
                        self.store.audit.insert(seq, e);
                    }
                    None => {
                        self.say(format!("  row audit {seq} deleted"));
                        self.store.audit.remove(&seq);
                    }
                },
                StateRow::Usage(seq) => match self.core.ledger().record(seq).cloned() {
                    Some(r) => {
                        self.store.usage.insert(seq, r);
                    }
                    None => {
                        self.store.usage.remove(&seq);
                    }
                },
                StateRow::Secrets(id) => {
                    let secrets = self
                        .core
                        .job_key(&id)
                        .ok()
                        .and_then(|k| self.core.secrets_of(k))
                        .map(|s| s.to_vec());
                    match secrets {
                        Some(s) => {
                            let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
                            self.say(format!("  row secrets {id}: {}", names.join(" ")));
                            self.store.secrets.insert(id, s);
                        }
                        None => {
                            self.say(format!("  row secrets {id} deleted"));
                            self.store.secrets.remove(&id);
                        }
                    }
                }
                StateRow::HostPoolMember(host) => {
                    let pools = self.core.host_pools();
                    if pools.is_member(&host) {
                        let pool = pools.pool_of(&host).to_string();
                        self.say(format!("  row host {host} in {pool}"));
                        self.store.host_pool_members.insert(host, pool);
                    } else {
                        self.say(format!("  row host {host} in default"));
                        self.store.host_pool_members.remove(&host);
                    }
                }
            }
        }
    }

    /// A report of a run, dated now.
    pub fn report(
        &self,
        key: AgentRunKey,
        phase: RunPhase,
        code: i32,
        health: Health,
    ) -> RunReport {
        RunReport {
            key,
            phase,
            time_ms: self.now,
            exit_code: code,
            reason: String::new(),
            started_ms: self.now,
            health,
            health_detail: if health == Health::Unhealthy {
                "check failed".into()
            } else {
                String::new()
            },
            ports: Vec::new(),
            checkpoint_ms: 0,
        }
    }

    /// The agent of `host` reports that run `key` checkpointed now.
    pub fn checkpoint(&mut self, host: &Arc<str>, key: AgentRunKey) {
        let mut r = self.report(key, RunPhase::Running, 0, Health::None);
        r.checkpoint_ms = self.now;
        self.agent_reports(host.clone(), vec![r]);
    }

    /// The model's safety property: no instance has two live runs on the
    /// agents (but for runs of a partitioned host the server gave up on).
    pub fn check_no_double_runs(&self) {
        let mut seen = FxHashMap::default();
        for (host, a) in &self.agents {
            for r in a.runs.values().filter(|r| r.live() && !r.stale) {
                let key = &r.key;
                if let Some(other) = seen.insert((key.job_id.clone(), key.instance), host.clone()) {
                    panic!(
                        "{}/{} runs twice: on {other} and {host}\n{}",
                        key.job_id, key.instance, self.log
                    );
                }
            }
        }
    }

    /// Every connected agent reports its live runs' usage (synthetic: run
    /// `launch` uses `launch % 4` quarter cores since time 0, and
    /// `launch % 8 + 1` MiB). Usage is soft state: the steps write no row
    /// and make no event, unless the QoS controller preempts revocable
    /// runs.
    pub fn report_usage(&mut self) {
        let reports: Vec<crate::usage::UsageReport> = self
            .agents
            .iter()
            .filter(|(_, a)| a.connected)
            .map(|(host, a)| crate::usage::UsageReport {
                host: host.clone(),
                time_ms: self.now,
                runs: a
                    .runs
                    .values()
                    .filter(|r| r.started && r.ended.is_none())
                    .map(|r| crate::usage::RunUsage {
                        key: r.key.clone(),
                        cpu_usec: self.now * (r.key.launch % 4) * 250,
                        memory_bytes: (r.key.launch % 8 + 1) << 20,
                        disk_bytes: 0,
                    })
                    .collect(),
            })
            .collect();
        for report in reports {
            let r = self.core.step(
                &mut self.engine,
                Input::Usage(Box::new(report)),
                self.now,
                &mut self.fx,
            );
            assert!(r.is_ok(), "{r:?}");
            // The only change a report may make: the QoS controller
            // preempts revocable runs (and what follows from it in their
            // jobs: a gang's other members, the job's state).
            let qos_jobs: rustc_hash::FxHashSet<Arc<str>> = self
                .fx
                .events
                .iter()
                .filter_map(|e| match &e.kind {
                    EventKind::Task {
                        job, state, reason, ..
                    } if *state == TaskState::Preempted
                        && reason.starts_with("preempted: revocable") =>
                    {
                        Some(job.clone())
                    }
                    _ => None,
                })
                .collect();
            let follows = |e: &crate::Event| match &e.kind {
                EventKind::Task { job, .. } | EventKind::Job { job, .. } => qos_jobs.contains(job),
            };
            assert!(
                self.fx.events.iter().all(follows)
                    && (!qos_jobs.is_empty() || self.fx.rows.is_empty()),
                "a usage report wrote {:?} and made events {:?}",
                self.fx.rows,
                self.fx.events
            );
            self.commit();
        }
    }

    /// [`Sim::current`] of `J/I`.
    pub fn current_key(&self, target: &str) -> Option<(Arc<str>, AgentRunKey)> {
        let (job, i) = target.split_once('/')?;
        self.current(job, i.parse().ok()?)
    }

    /// The current run of instance `i` of job `job`, as the core sees it:
    /// its host and key (none if it has no host).
    pub fn current(&self, job: &str, i: u32) -> Option<(Arc<str>, AgentRunKey)> {
        let k = self.core.job_key(job).ok()?;
        let job = self.core.job(k)?;
        let t = job.tasks.get(i as usize)?;
        let host = self.core.host_name(t.host?).clone();
        let key = AgentRunKey {
            job_id: job.id.clone(),
            instance: i,
            run: t.run,
            launch: t.launch.0,
        };
        Some((host, key))
    }

    /// Reports of a host's agent, if its session is attached (else they
    /// wait for its registration).
    pub fn agent_reports(&mut self, host: Arc<str>, reports: Vec<RunReport>) {
        if self.agents.get(&host).is_some_and(|a| a.connected) {
            let _ = self.step(Input::AgentReports { host, reports });
        }
    }

    /// A new agent registers an empty host (or an agent that lost every
    /// run registers again).
    pub fn add_host(&mut self, name: &str, cpu: u64, mem: u64) -> Result<Answer, Error> {
        self.add_host_spec(host_spec(name, cpu, mem))
    }

    /// A new agent registers an empty host with this registration.
    pub fn add_host_spec(&mut self, spec: HostSpec) -> Result<Answer, Error> {
        let name: Arc<str> = spec.name.as_str().into();
        let agent = self.agents.entry(name).or_default();
        agent.spec = Some(spec.clone());
        agent.connected = true;
        agent.stalled = false;
        agent.runs.clear();
        agent.volumes.clear();
        let agent_id = agent_id_of(&spec.name);
        self.step(Input::AgentRegistered(Box::new(HostRegistration {
            address: sim_address(&spec.name),
            port_ranges: sim_port_ranges(&spec),
            spec,
            isolation: "test".into(),
            runs: Vec::new(),
            volumes: Vec::new(),
            agent_id,
            holder: None,
        })))
    }

    /// A known host's agent registers again, listing its runs: live ones
    /// as running (or starting), ended ones with their end.
    pub fn register(&mut self, name: &str) -> Result<Answer, Error> {
        let agent = self.agents.get_mut(name).expect("known host");
        agent.connected = true;
        let spec = agent.spec.clone().expect("spec");
        let runs: Vec<AgentRun> = agent.runs.values().cloned().collect();
        let volumes: Vec<String> = agent.volumes.iter().map(|v| v.to_string()).collect();
        let runs = runs
            .into_iter()
            .map(|r| {
                let (phase, code) = match r.ended {
                    None if r.started => (RunPhase::Running, 0),
                    None => (RunPhase::Starting, 0),
                    Some(end) => end,
                };
                self.report_of(&r, phase, code)
            })
            .collect();
        self.step(Input::AgentRegistered(Box::new(HostRegistration {
            address: sim_address(&spec.name),
            port_ranges: sim_port_ranges(&spec),
            spec,
            isolation: "test".into(),
            runs,
            volumes,
            agent_id: agent_id_of(name),
            holder: None,
        })))
    }

    /// Another agent (another work directory, so another identity) given
    /// a known host's name registers it, with no runs.
    pub fn register_twin(&mut self, name: &str) -> Result<Answer, Error> {
        let spec = self.agents[name].spec.clone().expect("spec");
        self.step(Input::AgentRegistered(Box::new(HostRegistration {
            address: sim_address(&spec.name),
            port_ranges: sim_port_ranges(&spec),
            spec,
            isolation: "test".into(),
            runs: Vec::new(),
            volumes: Vec::new(),
            agent_id: format!("twin-of-{name}").into(),
            holder: None,
        })))
    }

    /// An agent with identity `agent_id` registers a known host's name,
    /// with no runs, while a session of `holder` (last heard at `heard_ms`)
    /// holds the host.
    pub fn claim(&mut self, name: &str, agent_id: &str, holder: Holder) -> Result<Answer, Error> {
        let spec = self.agents[name].spec.clone().expect("spec");
        let r = self.step(Input::AgentRegistered(Box::new(HostRegistration {
            address: sim_address(&spec.name),
            port_ranges: sim_port_ranges(&spec),
            spec,
            isolation: "test".into(),
            runs: Vec::new(),
            volumes: Vec::new(),
            agent_id: agent_id.into(),
            holder: Some(holder),
        })));
        if r.is_ok() {
            let agent = self.agents.get_mut(name).expect("known host");
            agent.connected = true;
            agent.runs.clear();
        }
        r
    }

    /// A run ends on its host (`phase` Succeeded, Failed or Killed); the
    /// agent reports it if it can.
    pub fn end_run(&mut self, host: &Arc<str>, launch: u64, phase: RunPhase, code: i32) {
        let agent = self.agents.get_mut(host).expect("host");
        let Some(r) = agent.runs.get_mut(&launch) else {
            return;
        };
        if !r.live() {
            return;
        }
        r.ended = Some((phase, code));
        let r = r.clone();
        let report = self.report_of(&r, phase, code);
        self.agent_reports(host.clone(), vec![report]);
    }

    /// A report of an agent's run (one never started says so).
    fn report_of(&self, r: &AgentRun, phase: RunPhase, code: i32) -> RunReport {
        let mut report = self.report(r.key.clone(), phase, code, Health::None);
        if !r.started {
            report.started_ms = 0;
        }
        report
    }

    /// A stalled agent starts the launches it holds (and takes launches at
    /// once again), reporting them running if it can.
    pub fn start_launches(&mut self, host: &Arc<str>) {
        let agent = self.agents.get_mut(host).expect("host");
        agent.stalled = false;
        let mut keys = Vec::new();
        for r in agent.runs.values_mut() {
            if r.live() && !r.started {
                r.started = true;
                keys.push(r.key.clone());
            }
        }
        let reports: Vec<RunReport> = keys
            .into_iter()
            .map(|k| self.report(k, RunPhase::Running, 0, Health::None))
            .collect();
        if !reports.is_empty() {
            self.agent_reports(host.clone(), reports);
        }
    }

    /// A health verdict on a live run.
    pub fn health(&mut self, host: &Arc<str>, key: AgentRunKey, health: Health) {
        let r = self.report(key, RunPhase::Running, 0, health);
        self.agent_reports(host.clone(), vec![r]);
    }

    /// Agents end every run they were told to stop (`only`: just that
    /// launch) and report it if they can.
    pub fn confirm_kills(&mut self, only: Option<u64>) {
        let mut by_host = Vec::new();
        for (host, a) in &mut self.agents {
            let mut killed = Vec::new();
            for r in a.runs.values_mut() {
                if r.live() && r.stopping && only.is_none_or(|l| l == r.key.launch) {
                    r.ended = Some((RunPhase::Killed, 0));
                    killed.push(r.clone());
                }
            }
            if !killed.is_empty() {
                by_host.push((host.clone(), killed));
            }
        }
        for (host, runs) in by_host {
            let reports = runs
                .iter()
                .map(|r| self.report_of(r, RunPhase::Killed, 0))
                .collect();
            self.agent_reports(host, reports);
        }
    }

    /// An agent's session breaks before the server hears of it (its
    /// goodbye is on the way, or held while the store cannot write): what
    /// the server sends meanwhile is lost with the session.
    pub fn cut(&mut self, name: &str) {
        self.agents.get_mut(name).expect("host").connected = false;
    }

    /// An agent's session ends; its runs go on.
    pub fn disconnect(&mut self, name: &str) -> Result<Answer, Error> {
        let agent = self.agents.get_mut(name).expect("host");
        agent.connected = false;
        self.step(Input::AgentDisconnected { host: name.into() })
    }

    /// A host goes silent and the server declares it lost: it died with
    /// its runs (`dies`), or it is cut off and they run on (stale).
    pub fn lose_host(&mut self, name: &str, dies: bool) -> Result<Answer, Error> {
        let agent = self.agents.get_mut(name).expect("host");
        agent.connected = false;
        if dies {
            agent.runs.clear();
            agent.stalled = false;
        } else {
            for r in agent.runs.values_mut() {
                r.stale = true;
            }
        }
        self.step(Input::HostLost {
            host: name.into(),
            silent_ms: 10_000,
        })
    }

    /// The server restarts: a new engine and core from the store model.
    /// Agents keep their runs and lose their sessions (kills in flight are
    /// lost with them); they register again on their own (`register`).
    pub fn crash(&mut self) {
        let mut rec = Recovered::default();
        for (path, (config, version)) in &self.store.pools {
            rec.pools.push((path.clone(), *config, *version));
        }
        for (name, (spec, maintenance, agent_id)) in &self.store.hosts {
            rec.hosts.push(RecoveredHost {
                name: name.clone(),
                spec: Some(spec.clone()),
                maintenance: *maintenance,
                isolation: "test".into(),
                agent_id: agent_id.clone(),
            });
        }
        for (id, (row, plan)) in &self.store.jobs {
            let tasks = self
                .store
                .tasks
                .range((id.clone(), 0)..=(id.clone(), u32::MAX))
                .map(|((_, i), r)| (*i, r.clone()))
                .collect();
            let old_configs = self
                .store
                .configs
                .iter()
                .filter(|((j, v), _)| j == id && *v != row.config)
                .map(|((_, v), p)| (*v, p.clone()))
                .collect();
            let mut updates: Vec<Update> = self
                .store
                .updates
                .values()
                .filter(|(j, _)| j == id)
                .map(|(_, u)| u.clone())
                .collect();
            updates.sort_by_key(|u| u.created_at);
            rec.jobs.push(RecoveredJob {
                row: row.clone(),
                plan: plan.clone(),
                old_configs,
                updates,
                tasks,
            });
        }
        rec.volumes = self.store.volumes.values().cloned().collect();
        rec.host_pools = self
            .store
            .host_pools
            .iter()
            .map(|n| n.to_string())
            .collect();
        rec.host_pool_members = self
            .store
            .host_pool_members
            .iter()
            .map(|(h, p)| (h.to_string(), p.clone()))
            .collect();
        rec.tokens = self.store.tokens.values().cloned().collect();
        rec.audit = self.store.audit.values().cloned().collect();
        rec.usage = self.store.usage.values().cloned().collect();
        rec.secrets = self
            .store
            .secrets
            .iter()
            .map(|(id, s)| (id.to_string(), s.clone()))
            .collect();
        self.engine = engine();
        let revision = self.core.revision();
        self.fx = Effects::default();
        self.core = Lifecycle::recover(
            *self.core.config(),
            &mut self.engine,
            revision,
            rec,
            self.now,
            &mut self.fx,
        )
        .expect("the store's rows recover");
        for a in self.agents.values_mut() {
            a.connected = false;
            for r in a.runs.values_mut() {
                r.stopping = false;
            }
        }
        self.commit();
    }
}
