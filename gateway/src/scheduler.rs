//! The shell around the lifecycle core: one thread owns the engine, the
//! core, the host backend and the store's write side.
//!
//! gRPC handlers send [`Command`]s over a bounded channel (a full channel
//! makes senders wait: backpressure) and await a reply. One iteration:
//! 1. wait for a command or the next deadline (cycle, timer, simulated run
//!    end), then drain up to `max_batch` commands;
//! 2. turn each into a core [`Input`] and [`Lifecycle::step`] it (reads are
//!    answered from the core's state);
//! 3. step a cycle if one is due, the simulator's updates, the timers and
//!    the lost hosts;
//! 4. write the effects' rows and events in one store transaction, then
//!    answer, dispatch launches and kills, send acknowledgements, and
//!    publish the events.
//!
//! In `run` the transaction is pipelined: the store's writer thread
//! ([`crate::writer`]) commits iteration N's batch while the loop steps
//! N+1, and what waits for a batch ([`Pending`]) is released once the
//! writer says it is durable. One batch is in flight at a time, so batches
//! land in order; N's result is taken before N+1's rows are encoded, so a
//! failed N holds N+1 back in memory (below). `iterate` alone, as tests
//! drive it, commits on the loop thread.
//!
//! A failed commit (a full disk) does not stop the process: the batch and
//! everything that waits for it (answers, launches, kills, acknowledgements,
//! events) are kept and the commit is tried again with a back-off; until it
//! lands nothing is stepped, mutating commands are refused at once with
//! UNAVAILABLE, reads are answered from memory, agents' heartbeats go on and
//! their reports are held ([`Outage`]). The clock is read once per
//! iteration ([`Scheduler::iterate`]) and passed in.

mod access;
mod apps;
mod forecast;
mod handlers;
mod hosts;
mod outage;
#[cfg(test)]
mod shell_tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use peloton_engine::Engine;
use tokio::sync::{broadcast, mpsc};

use crate::agent_hub::AgentHub;
use crate::backend::{HostBackend, Kill, TaskUpdate};
use crate::clock::Now;
use crate::convert::Limits;
use crate::lifecycle::{CoreConfig, Effects, Input, Lifecycle};
use crate::metrics::Metrics;
use crate::store::{Snapshot, Store, WriteBatch};
use crate::writer::{Writer, Written};
use crate::{persist, reads};

pub use crate::command::{AppCommand, Command, EventBatch, Reply};
pub use crate::lifecycle::JobAction;

/// What woke the loop.
enum Wake {
    Command(Command),
    /// Every sender is gone.
    Closed,
    Deadline,
    /// The batch in flight, written (or failed).
    Written(Box<Written>),
}

/// Options of the loop.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// Least time between two cycles while work arrives.
    pub cycle_interval: Duration,
    /// A cycle runs at least this often.
    pub idle_cycle_interval: Duration,
    /// Most commands applied in one iteration (one commit).
    pub max_batch: usize,
    /// Least time from one commit to the start of the next iteration that
    /// has commands (see `Config::commit_spacing_ms`).
    pub commit_spacing: Duration,
    /// `run` commits on the store's writer thread while it steps the next
    /// iteration (see the module documentation); false: on the loop thread.
    pub pipelined_commit: bool,
    /// Request limits.
    pub limits: Limits,
    /// Events kept in the store for resuming watches.
    pub event_retention: u64,
    /// Earlier runs kept per task.
    pub max_history: usize,
    /// An agent host not heard from for this long is lost.
    pub host_lost_after: Duration,
    /// What hosts lend revocable tasks.
    pub overcommit: crate::lifecycle::OvercommitConfig,
    /// The simulated cluster's hosts (simulated mode), added by the core
    /// as it recovers.
    pub simulated_hosts: Vec<peloton_engine::host::HostSpec>,
    /// A finished job is removed this long after it finished.
    pub job_retention: Duration,
    /// At most this many finished jobs are kept (the oldest go first).
    pub max_finished_jobs: usize,
    /// A client-mode application not heard from for this long is
    /// unregistered.
    pub app_lease: Duration,
    /// While work waits, a start forecast is made this often (zero:
    /// never), within these bounds.
    pub forecast_interval: Duration,
    pub forecast: peloton_engine::ForecastConfig,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            cycle_interval: Duration::from_millis(2),
            idle_cycle_interval: Duration::from_millis(1000),
            max_batch: 1024,
            commit_spacing: Duration::ZERO,
            pipelined_commit: true,
            limits: Limits::default(),
            event_retention: 5_000_000,
            max_history: 8,
            host_lost_after: Duration::from_secs(10),
            simulated_hosts: Vec::new(),
            overcommit: crate::lifecycle::OvercommitConfig::default(),
            job_retention: Duration::from_millis(CoreConfig::default().retention_ms),
            max_finished_jobs: CoreConfig::default().max_finished_jobs,
            app_lease: Duration::from_secs(60),
            forecast_interval: Duration::from_millis(crate::lifecycle::FORECAST_INTERVAL_MS),
            forecast: peloton_engine::ForecastConfig::default(),
        }
    }
}

/// An iteration at least this long is logged with its phases.
const SLOW_ITERATION: Duration = Duration::from_millis(250);

/// Least time between the starts of two cycles. While work arrives
/// (`wanted`): the configured interval, or twice the last cycle's length if
/// longer, so that cycles take at most half of the loop's time, however
/// long they get. Otherwise the idle interval (or that, if longer).
fn cycle_spacing(
    interval: Duration,
    last_took: Duration,
    wanted: bool,
    idle: Duration,
) -> Duration {
    let busy = interval.max(last_took.saturating_mul(2));
    if wanted { busy } else { idle.max(busy) }
}

pub(crate) use crate::clock::wall_ms as now_ms;

/// Most events whose list's room an iteration keeps for the next.
const KEPT_EVENT_ROOM: usize = 1 << 18;

/// First wait before a failed commit is tried again; it doubles up to
/// [`RETRY_COMMIT_MAX_MS`].
const RETRY_COMMIT_FIRST_MS: u64 = 100;
/// Longest wait between two tries of a failed commit: writes resume at
/// most this long after space returns.
const RETRY_COMMIT_MAX_MS: u64 = 2_000;
/// Agents' run reports held while the store cannot write (a message
/// carries at most `agent_hub::MAX_REPORTS_PER_MESSAGE`). Past it a message's
/// reports are dropped and its agent's session closed: the agent registers
/// again, listing its runs, once the store writes.
const MAX_HELD_REPORTS: usize = 100_000;

/// While a commit has failed (see the module documentation).
#[derive(Debug, Default)]
struct Outage {
    /// The failed commit, kept until a retry writes it (`Scheduler::batch`
    /// holds its rows, `fx` and `deferred` what waits for it).
    failed: Option<FailedCommit>,
    /// Agent commands that came meanwhile (reports, goodbyes), applied
    /// once the batch is written.
    held: Vec<Command>,
    /// Reports in `held`.
    held_reports: usize,
    /// Applications heard from meanwhile: their leases are renewed once
    /// the batch is written (at most [`MAX_HELD_REPORTS`]).
    heard: std::collections::BTreeSet<String>,
}

impl Outage {
    /// An application heard from while the store cannot write.
    fn hold_heard(&mut self, id: &str) {
        if self.heard.len() < MAX_HELD_REPORTS {
            self.heard.insert(id.to_string());
        }
    }
}

#[derive(Debug)]
struct FailedCommit {
    /// What waits for the batch, released once it is written.
    pending: Pending,
    /// The last error.
    error: String,
    since_ms: u64,
    attempts: u64,
    delay_ms: u64,
    next_try_ms: u64,
}

type Deferred = Box<dyn FnOnce() + Send>;

/// What waits for a batch to be durable: its answers, launches, kills,
/// rendezvous updates, acknowledgements, volume deletions, access changes
/// and events, taken from the iteration that made it.
#[derive(Default)]
struct Pending {
    events: Vec<crate::lifecycle::Event>,
    deferred: Vec<Deferred>,
    launches: Vec<crate::lifecycle::Launch>,
    kills: Vec<Kill>,
    rendezvous: Vec<crate::lifecycle::RendezvousUpdate>,
    acks: Vec<(Arc<str>, crate::lifecycle::AgentRunKey)>,
    volume_deletes: Vec<(Arc<str>, Arc<str>)>,
    access: Vec<crate::lifecycle::AccessChange>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("events", &self.events.len())
            .field("answers", &self.deferred.len())
            .field("launches", &self.launches.len())
            .field("kills", &self.kills.len())
            .finish_non_exhaustive()
    }
}

/// The loop's state. Create with [`Scheduler::new`], then [`Scheduler::run`]
/// on its own thread.
pub struct Scheduler {
    engine: Engine,
    core: Lifecycle,
    store: Arc<dyn Store>,
    backend: Box<dyn HostBackend>,
    config: LoopConfig,
    metrics: Arc<Metrics>,
    fx: Effects,
    batch: WriteBatch,
    deferred: Vec<Deferred>,
    events_tx: broadcast::Sender<EventBatch>,
    kills: Vec<Kill>,
    updates: Vec<TaskUpdate>,
    /// The hub agents' last-seen times are read from.
    hub: Option<Arc<AgentHub>>,
    /// Whether this server leads (PostgreSQL store): while it does not
    /// (its lease lapsed), agents cannot reach it, and the core is told so
    /// (`Input::AgentsReachable`).
    leading: Option<tokio::sync::watch::Receiver<bool>>,
    last_trim: u64,
    last_cycle: Option<Instant>,
    /// How long the last cycle took (see [`cycle_spacing`]).
    last_cycle_took: Duration,
    last_pool_metrics: Option<Instant>,
    /// The iteration's clock reading ([`Scheduler::iterate`]): wall
    /// milliseconds for the core, the store and agents...
    now: u64,
    /// ...and the same moment on the monotonic clock, for pacing.
    now_at: Instant,
    /// Set while the store cannot write.
    outage: Outage,
    /// The authentication table tokens are published to (a secure
    /// server's; none: tokens are refused and no audit log is kept).
    shared_access: Option<Arc<crate::access::Access>>,
    /// The table jobs' pools and names are published to, on every server:
    /// calls name jobs by id prefixes and names on an insecure one too.
    job_index: Option<Arc<crate::access::Access>>,
    /// Start forecasts, run on a thread of their own.
    forecaster: crate::forecaster::Forecaster,
    /// The store's writer thread (`run`; none: commits on this thread).
    writer: Option<Writer>,
    /// What waits for the batch the writer has in flight.
    in_flight: Option<Pending>,
    /// A written batch's lists, emptied, for the next one.
    spare_batch: WriteBatch,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("jobs", &self.core.n_jobs())
            .field("revision", &self.core.revision())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A loop over `engine` (empty), recovering the store's contents and
    /// the configured simulated hosts.
    pub fn new(
        mut engine: Engine,
        store: Arc<dyn Store>,
        backend: Box<dyn HostBackend>,
        config: LoopConfig,
        metrics: Arc<Metrics>,
        snapshot: Snapshot,
        hub: Option<Arc<AgentHub>>,
    ) -> anyhow::Result<Self> {
        // Bounded by commits; a watcher that falls further behind catches up
        // from the store.
        let (events_tx, _) = broadcast::channel(256);
        let core_config = CoreConfig {
            max_history: config.max_history,
            max_instances_per_job: config.limits.max_instances_per_job,
            agent_mode: hub.is_some(),
            retention_ms: config.job_retention.as_millis() as u64,
            max_finished_jobs: config.max_finished_jobs,
            app_lease_ms: config.app_lease.as_millis() as u64,
            host_lost_after_ms: config.host_lost_after.as_millis() as u64,
            forecast_interval_ms: config.forecast_interval.as_millis() as u64,
            overcommit: config.overcommit,
            takeover_after_ms: hub
                .as_ref()
                .map_or(CoreConfig::default().takeover_after_ms, |h| {
                    h.takeover_after_ms()
                }),
            ..CoreConfig::default()
        };
        let now = now_ms();
        let revision = snapshot.revision;
        let (mut recovered, specs_in_rows) = persist::recovered(&snapshot, core_config.agent_mode)?;
        recovered.host_pools = snapshot.host_pools.clone();
        recovered.host_pool_members = snapshot.host_pool_members.clone();
        (recovered.tokens, recovered.audit) = persist::recovered_access(&snapshot)?;
        recovered.secrets = persist::recovered_secrets(&snapshot)?;
        recovered.usage = persist::recovered_usage(&snapshot)?;
        recovered.simulated_hosts = config.simulated_hosts.clone();
        let mut fx = Effects::default();
        let core = Lifecycle::recover(core_config, &mut engine, revision, recovered, now, &mut fx)
            .map_err(|e| anyhow::anyhow!(e))?;
        for (id, v) in specs_in_rows {
            // An older store kept the spec in the job row only: it goes to
            // the configs table before the row loses it.
            let key = core.job_key(&id).expect("recovered");
            fx.rows.push(crate::lifecycle::RowKey::Config(key, v));
        }
        let batch = WriteBatch::default();
        metrics.jobs.set(core.n_jobs() as i64);
        Ok(Scheduler {
            engine,
            core,
            store,
            backend,
            config,
            metrics,
            fx,
            batch,
            deferred: Vec::new(),
            events_tx,
            kills: Vec::new(),
            updates: Vec::new(),
            hub,
            leading: None,
            last_trim: revision,
            last_cycle: None,
            last_cycle_took: Duration::ZERO,
            last_pool_metrics: None,
            now,
            now_at: Instant::now(),
            outage: Outage::default(),
            shared_access: None,
            job_index: None,
            forecaster: crate::forecaster::Forecaster::default(),
            writer: None,
            in_flight: None,
            spare_batch: WriteBatch::default(),
        })
    }

    /// Runs until a [`Command::Shutdown`] or until every sender is gone:
    /// waits for a command or the next deadline ([`Scheduler::next_wake`]),
    /// drains up to `max_batch` commands, reads the clock once and runs an
    /// [`Scheduler::iterate`]. Waiting is the only thing done here; all
    /// else is in the iteration, which tests drive with their own clock.
    pub fn run(mut self, mut rx: mpsc::Receiver<Command>, rt: tokio::runtime::Handle) {
        let mut commands = Vec::with_capacity(self.config.max_batch);
        // What recovery changed and the first cycle go in one commit: a
        // restart writes each instance it starts again once.
        let began = Instant::now();
        let recovered_at = self.core.revision() - self.fx.events.len() as u64;
        self.iterate(Now::read(), &mut commands);
        tracing::info!(
            recovered_revision = recovered_at,
            revision = self.core.revision(),
            "recovery and the first cycle committed in {} ms",
            began.elapsed().as_millis()
        );
        if self.config.pipelined_commit {
            match Writer::start(self.store.clone()) {
                Ok(w) => self.writer = Some(w),
                Err(e) => tracing::warn!(
                    error = %e,
                    "no writer thread: the loop commits on its own thread"
                ),
            }
        }
        // When the last iteration with commands committed.
        let mut last_commit = Instant::now();
        loop {
            let wait = self.next_wake().saturating_duration_since(Instant::now());
            // A command, the batch in flight written, or the deadline.
            let first = rt.block_on(async {
                // (Pending for ever while no batch is in flight.)
                let written = async {
                    match self.writer.as_mut() {
                        Some(w) => w.written().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    c = tokio::time::timeout(wait, rx.recv()) => match c {
                        Ok(Some(c)) => Wake::Command(c),
                        Ok(None) => Wake::Closed,
                        Err(_) => Wake::Deadline,
                    },
                    w = written => Wake::Written(Box::new(w)),
                }
            });
            let mut stop = false;
            match first {
                Wake::Written(w) => {
                    // Released (or failed) at this moment's clock.
                    let now = Now::read();
                    self.now = now.ms;
                    self.now_at = now.at;
                    self.written(*w);
                    continue;
                }
                Wake::Command(c) => commands.push(c),
                Wake::Closed => stop = true,
                Wake::Deadline => {}
            }
            // Group commit: under load, what arrives within the spacing
            // goes in one commit (a lone command after a quiet spell is
            // committed at once).
            let since = last_commit.elapsed();
            if !commands.is_empty() && since < self.config.commit_spacing {
                std::thread::sleep(self.config.commit_spacing - since);
            }
            while commands.len() < self.config.max_batch {
                match rx.try_recv() {
                    Ok(c) => commands.push(c),
                    Err(_) => break,
                }
            }
            let had_commands = !commands.is_empty();
            let now = Now::read();
            stop |= self.iterate(now, &mut commands);
            if had_commands {
                last_commit = Instant::now();
            }
            if stop {
                // The batch in flight lands (or stays failed) before the
                // loop ends: its callers hear either way.
                if let Some(w) = self.writer.as_mut().and_then(Writer::wait) {
                    self.written(w);
                }
                tracing::info!(revision = self.core.revision(), "scheduling loop stopped");
                return;
            }
        }
    }

    /// One iteration at `now`: applies `commands` (drained), steps what is
    /// due (a cycle, the backend's updates, timers, lost hosts and lapsed
    /// leases), commits once, and only then answers, dispatches to real
    /// hosts and publishes events. True when one of the commands was
    /// [`Command::Shutdown`] (the others are applied first).
    pub fn iterate(&mut self, now: Now, commands: &mut Vec<Command>) -> bool {
        self.now = now.ms;
        self.now_at = now.at;
        // The batch in flight, if written meanwhile: its answers go now.
        if let Some(w) = self.writer.as_mut().and_then(Writer::try_take) {
            self.written(w);
        }
        // A stopwatch for the slow-iteration log, not a decision.
        let began = Instant::now();
        let n_commands = commands.len();
        let mut stop = false;
        for c in commands.drain(..) {
            if matches!(c, Command::Shutdown) {
                stop = true;
                continue;
            }
            self.handle(c);
        }
        let handled = began.elapsed();
        self.work();
        let worked = began.elapsed();
        self.finish_iteration();
        let took = began.elapsed();
        if took >= SLOW_ITERATION {
            tracing::info!(
                commands = n_commands,
                handle_ms = handled.as_millis() as u64,
                work_ms = (worked - handled).as_millis() as u64,
                commit_ms = (took - worked).as_millis() as u64,
                revision = self.core.revision(),
                "slow iteration: {} ms",
                took.as_millis()
            );
        }
        stop
    }

    /// Least time from one cycle's start to the next's ([`cycle_spacing`]).
    /// The configured interval is a few milliseconds: a freed slot waits
    /// for the next cycle, so short tasks are bound by it.
    fn cycle_spacing(&self) -> Duration {
        cycle_spacing(
            self.config.cycle_interval,
            self.last_cycle_took,
            self.core.wants_cycle(),
            self.config.idle_cycle_interval,
        )
    }

    /// When the loop must run again if no command comes first: the next
    /// cycle, core timer, simulated run end, lost-host or lease check, or
    /// (while a commit has failed) its retry. Computed from the last
    /// iteration's clock reading.
    pub fn next_wake(&self) -> Instant {
        let now = Now::at(self.now, self.now_at);
        if let Some(failed) = &self.outage.failed {
            // Nothing else moves until the failed batch is written.
            return now.instant_of(failed.next_try_ms);
        }
        let mut until = match self.last_cycle {
            None => now.at,
            Some(last) => last + self.cycle_spacing(),
        };
        let mut ms_deadline = self.core.next_deadline();
        if let Some(b) = self.backend.next_deadline() {
            ms_deadline = Some(ms_deadline.map_or(b, |t| t.min(b)));
        }
        if self.hub.is_some()
            && let Some(next) = self.core.liveness_deadline()
        {
            ms_deadline = Some(ms_deadline.map_or(next, |t| t.min(next)));
        }
        if let Some(t) = ms_deadline {
            until = until.min(now.instant_of(t));
        }
        if self.forecaster.out {
            until = until.min(now.at + crate::forecaster::POLL);
        }
        until
    }

    /// Steps an input the loop itself makes (these cannot be refused).
    fn step(&mut self, input: Input) {
        let r = self
            .core
            .step(&mut self.engine, input, self.now, &mut self.fx);
        debug_assert!(r.is_ok(), "{r:?}");
    }

    /// Cycles, backend updates, timers and lost hosts (none while a failed
    /// commit waits for its retry).
    fn work(&mut self) {
        if !self.retry_commit() {
            return;
        }
        let due = match self.last_cycle {
            None => true,
            Some(last) => self.now_at.saturating_duration_since(last) >= self.cycle_spacing(),
        };
        if due {
            // A stopwatch: how long cycles take paces them.
            let start = Instant::now();
            self.step(Input::Cycle);
            self.last_cycle = Some(self.now_at);
            self.last_cycle_took = start.elapsed();
            self.metrics
                .cycle_seconds
                .observe(self.last_cycle_took.as_secs_f64());
            self.update_pool_metrics();
        }
        let now_dispatch = !self.backend.dispatch_after_commit();
        if now_dispatch {
            self.dispatch();
        }
        self.backend.poll(self.now, &mut self.updates);
        if !self.updates.is_empty() {
            let updates = std::mem::take(&mut self.updates);
            self.step(Input::Updates(updates));
        }
        let mut usage = Vec::new();
        self.backend.usage(self.now, &mut usage);
        for report in usage {
            self.step(Input::Usage(Box::new(report)));
        }
        if self.core.next_deadline().is_some_and(|t| t <= self.now) {
            self.step(Input::Tick);
        }
        self.follow_liveness();
        self.follow_forecasts();
        if now_dispatch {
            // Kills issued while applying updates and timers.
            self.dispatch();
        }
    }

    /// Hands the effects' launches and kills to the backend.
    fn dispatch(&mut self) {
        let mut launches = std::mem::take(&mut self.fx.launches);
        let mut rendezvous = std::mem::take(&mut self.fx.rendezvous_updates);
        let kills = std::mem::take(&mut self.fx.kills);
        self.send_runs(&mut launches, &mut rendezvous, kills);
        // Emptied by the backend; their room serves the next effects.
        self.fx.launches = launches;
        self.fx.rendezvous_updates = rendezvous;
    }

    /// Hands launches, rendezvous updates and kills to the backend (kills
    /// it could not send yet stay for the next time).
    fn send_runs(
        &mut self,
        launches: &mut Vec<crate::lifecycle::Launch>,
        rendezvous: &mut Vec<crate::lifecycle::RendezvousUpdate>,
        kills: Vec<Kill>,
    ) {
        self.kills.extend(kills);
        let core = &self.core;
        self.backend
            .launch(self.now, launches, &|job| core.secrets_of(job).cloned());
        self.backend.update_rendezvous(self.now, rendezvous);
        self.backend.kill(self.now, &mut self.kills);
    }

    /// Publishes jobs' pools and names to `access`, and on a secure server
    /// its tokens: tokens are created and revoked, and the audit log kept,
    /// only then.
    pub fn with_access(mut self, access: Arc<crate::access::Access>) -> Self {
        self.job_index = Some(access.clone());
        if access.is_secure() {
            self.attach_access(access);
        }
        self.publish_all_jobs();
        self
    }

    /// Follows whether this server leads (see `leading`).
    pub fn with_leading(mut self, leading: tokio::sync::watch::Receiver<bool>) -> Self {
        self.leading = Some(leading);
        self
    }

    fn finish_iteration(&mut self) {
        if self.outage.failed.is_some() {
            // Nothing was stepped: the failed batch is all there is.
            return;
        }
        // The batch in flight first: batches land in order, and if it
        // failed this iteration's effects stay in memory, unencoded, until
        // it is written (`retry_commit`).
        if let Some(w) = self.writer.as_mut().and_then(Writer::wait) {
            self.written(w);
            if self.outage.failed.is_some() {
                return;
            }
        }
        let events = std::mem::take(&mut self.fx.events);
        persist::state_rows(&self.core, &mut self.fx.state_rows, &mut self.batch);
        persist::rows(
            &self.core,
            &self.engine,
            self.fx.take_rows(),
            &mut self.batch,
            &self.metrics,
        );
        if !events.is_empty() {
            self.batch.events = Some(persist::encode_events(&events));
            let retention = self.config.event_retention;
            let revision = self.core.revision();
            if revision > self.last_trim + retention / 10 + 1 && revision > retention {
                self.batch.trim_events_before = Some(revision - retention);
                self.last_trim = revision;
            }
        }
        for app in self.fx.lapsed_apps.drain(..) {
            tracing::warn!(
                %app,
                lease_ms = self.config.app_lease.as_millis() as u64,
                "application unregistered: its driver was not heard from"
            );
        }
        let c = std::mem::take(&mut self.fx.counters);
        self.metrics.placements.inc_by(c.placements);
        self.metrics.placement_failures.inc_by(c.placement_failures);
        self.metrics.runs_finished.inc_by(c.runs_finished);
        self.metrics.preemptions.inc_by(c.preemptions);
        self.metrics.tasks_accepted.inc_by(c.tasks_accepted);
        let pending = self.take_pending(events);
        if self.batch.is_empty() {
            // Nothing to write (reads, refusals): nothing to wait for.
            self.release(pending);
            return;
        }
        self.batch.revision = self.core.revision();
        if let Some(writer) = self.writer.as_mut() {
            let batch = std::mem::replace(&mut self.batch, std::mem::take(&mut self.spare_batch));
            writer.send(batch);
            self.in_flight = Some(pending);
            return;
        }
        let start = Instant::now();
        let result = self.store.commit(&self.batch);
        let batch = std::mem::take(&mut self.batch);
        self.in_flight = Some(pending);
        self.written(Written {
            batch,
            result,
            took: start.elapsed(),
        });
    }

    /// What waits for the batch this iteration made, taken from the
    /// effects and the answers.
    fn take_pending(&mut self, events: Vec<crate::lifecycle::Event>) -> Pending {
        Pending {
            events,
            deferred: std::mem::take(&mut self.deferred),
            launches: std::mem::take(&mut self.fx.launches),
            kills: std::mem::take(&mut self.fx.kills),
            rendezvous: std::mem::take(&mut self.fx.rendezvous_updates),
            acks: std::mem::take(&mut self.fx.acks),
            volume_deletes: std::mem::take(&mut self.fx.volume_deletes),
            access: std::mem::take(&mut self.fx.access),
        }
    }

    /// The batch in flight is back: durable, so what waited for it goes;
    /// or failed, so memory is ahead of the store: the batch and what
    /// waits for it are kept, writes refused, the commit retried
    /// (`retry_commit`).
    fn written(&mut self, w: Written) {
        let pending = self.in_flight.take().expect("a batch in flight");
        match w.result {
            Ok(()) => {
                self.metrics.commit_seconds.observe(w.took.as_secs_f64());
                let mut batch = w.batch;
                batch.clear();
                self.batch_room(batch);
                self.release(pending);
            }
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "store commit failed: writes are refused and the batch is retried until it lands; reads are served"
                );
                // The failed batch is the one retried; the iteration being
                // made (if any) has encoded nothing yet.
                debug_assert!(self.batch.is_empty());
                let room = std::mem::replace(&mut self.batch, w.batch);
                self.batch_room(room);
                let now = self.now;
                self.outage.failed = Some(FailedCommit {
                    pending,
                    error: e.to_string(),
                    since_ms: now,
                    attempts: 1,
                    delay_ms: RETRY_COMMIT_FIRST_MS,
                    next_try_ms: now + RETRY_COMMIT_FIRST_MS,
                });
                self.metrics.store_unwritable.set(1);
            }
        }
    }

    /// Keeps an empty batch's lists for the next batch (the larger room).
    fn batch_room(&mut self, batch: WriteBatch) {
        if self.batch.is_empty() && self.batch.tasks.capacity() < batch.tasks.capacity() {
            self.spare_batch = std::mem::replace(&mut self.batch, batch);
        } else if self.spare_batch.tasks.capacity() < batch.tasks.capacity() {
            self.spare_batch = batch;
        }
    }

    /// What waited for a commit, once it is durable: dispatches, answers,
    /// events.
    fn release(&mut self, p: Pending) {
        let Pending {
            events,
            deferred,
            mut launches,
            kills,
            mut rendezvous,
            acks,
            volume_deletes,
            access,
        } = p;
        // Handlers check a job's pool before they ask the loop anything:
        // they know of a job before its creator hears of it.
        self.publish_jobs(&events);
        self.publish_access(access);
        // Answers first: their callers wait on them.
        for d in deferred {
            d();
        }
        // Real hosts hear of launches and kills only once they are durable:
        // a crash before the commit must not leave a run the store does not
        // know (it would run twice), nor a kill it does not know of. (For
        // the simulator these are what is left of the iteration.)
        self.send_runs(&mut launches, &mut rendezvous, kills);
        self.send_acks(acks);
        self.send_volume_deletes(volume_deletes);
        if !events.is_empty() {
            // Built only for watchers (a commit may carry a million);
            // no receivers is fine.
            if self.events_tx.receiver_count() > 0 {
                let _ = self
                    .events_tx
                    .send(Arc::new(persist::events_to_pb(&events)));
            }
        }
        // The list's room serves the next iteration's events (up to a
        // bound: one huge commit, a restart's, does not pin its memory).
        if self.fx.events.is_empty()
            && events.capacity() > self.fx.events.capacity()
            && events.capacity() <= KEPT_EVENT_ROOM
        {
            let mut events = events;
            events.clear();
            self.fx.events = events;
        }
    }

    fn update_pool_metrics(&mut self) {
        if self
            .last_pool_metrics
            .is_some_and(|t| self.now_at.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        self.last_pool_metrics = Some(self.now_at);
        reads::pool_metrics(&self.engine, &self.core, &self.metrics);
        self.metrics.jobs.set(self.core.n_jobs() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_are_spaced_by_the_interval_or_twice_the_last_cycle() {
        let ms = Duration::from_millis;
        let idle = ms(1000);
        // Cheap cycles while work arrives: the configured interval.
        assert_eq!(cycle_spacing(ms(2), ms(0), true, idle), ms(2));
        assert_eq!(
            cycle_spacing(ms(2), Duration::from_micros(300), true, idle),
            ms(2)
        );
        // A long cycle holds the next one back twice as long as it took
        // (start to start), so cycles take at most half of the loop.
        assert_eq!(cycle_spacing(ms(2), ms(35), true, idle), ms(70));
        assert_eq!(cycle_spacing(ms(2), ms(5000), true, idle), ms(10_000));
        // Nothing to do: the idle interval, unless cycles are that long.
        assert_eq!(cycle_spacing(ms(2), ms(1), false, idle), idle);
        assert_eq!(cycle_spacing(ms(2), ms(800), false, idle), ms(1600));
        assert_eq!(cycle_spacing(ms(50), ms(0), true, ms(20)), ms(50));
    }
}
