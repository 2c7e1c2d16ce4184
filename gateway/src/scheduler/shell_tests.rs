//! The shell as data: the loop driven iteration by iteration through
//! fixtures, with a test transport (commands and their reply channels), a
//! store that fails on demand, a backend that records what reaches hosts,
//! and a clock the test moves. Everything that leaves the loop — commits,
//! answers, launches, kills — is written to one trace in the order it
//! happened, and each fixture compares the trace with what it expects.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use expect_test::{Expect, expect};
use peloton_engine::{Engine, EngineConfig};
use peloton_proto::v1 as pb;
use tokio::sync::oneshot;

use super::{Command, LoopConfig, Reply, Scheduler};
use crate::agent_backend::AgentBackend;
use crate::agent_hub::{AgentHub, Registration, Session};
use crate::backend::{HostBackend, Kill, Launch, Secrets, SimBackend, TaskUpdate};
use crate::clock::Now;
use crate::command::{AgentCommand, HostCommand, JobCommand, PoolCommand};
use crate::convert;
use crate::metrics::Metrics;
use crate::store::{RedbStore, Snapshot, Store, StoreError, WriteBatch};

/// What left the loop, in order. Answers are looked for whenever anything
/// else happens, so an answer's place in the trace is where it was sent
/// (to within the step that sent it).
#[derive(Clone, Default)]
struct Trace(Arc<Mutex<TraceInner>>);

#[derive(Default)]
struct TraceInner {
    lines: Vec<String>,
    /// Replies not received yet: each gives its line once it has come.
    pending: Vec<Box<dyn FnMut() -> Option<String> + Send>>,
    /// Job ids by first appearance, shown as j1, j2, ... (ids are random).
    jobs: Vec<String>,
}

impl Trace {
    fn push(&self, line: String) {
        self.poll();
        self.0.lock().unwrap().lines.push(line);
    }

    /// Writes the answers that have come since the last look (the lock is
    /// not held while replies are shown: showing a job names it).
    fn poll(&self) {
        let mut pending = std::mem::take(&mut self.0.lock().unwrap().pending);
        let mut lines = Vec::new();
        pending.retain_mut(|p| match p() {
            Some(line) => {
                lines.push(line);
                false
            }
            None => true,
        });
        let mut t = self.0.lock().unwrap();
        t.lines.extend(lines);
        pending.append(&mut t.pending);
        t.pending = pending;
    }

    fn job(&self, id: &str) -> String {
        let mut t = self.0.lock().unwrap();
        let n = match t.jobs.iter().position(|j| j == id) {
            Some(n) => n,
            None => {
                t.jobs.push(id.to_string());
                t.jobs.len() - 1
            }
        };
        format!("j{}", n + 1)
    }

    /// The lines so far, job ids shown by their names.
    fn take(&self) -> String {
        self.poll();
        let mut t = self.0.lock().unwrap();
        let lines = std::mem::take(&mut t.lines);
        let mut text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        for (n, id) in t.jobs.iter().enumerate() {
            text = text.replace(id.as_str(), &format!("j{}", n + 1));
        }
        text
    }
}

/// The embedded store, failing every commit while `fail` is set (a full
/// disk, a database away).
#[derive(Debug)]
struct TestStore {
    inner: RedbStore,
    fail: Arc<AtomicBool>,
    /// While set, a commit waits (a slow disk): the loop moves on.
    hold: Arc<AtomicBool>,
    trace: Trace,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Trace")
    }
}

impl Store for TestStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.inner.load()
    }

    fn commit(&self, batch: &WriteBatch) -> Result<(), StoreError> {
        while self.hold.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.fail.load(Ordering::SeqCst) {
            self.trace.push("commit failed: disk full".into());
            return Err(StoreError::msg("disk full"));
        }
        self.inner.commit(batch)?;
        self.trace.push(format!(
            "commit: revision {}, {} job rows, {} task rows",
            batch.revision,
            batch.jobs.len(),
            batch.tasks.len()
        ));
        Ok(())
    }

    fn events_from(&self, from: u64, max_rows: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        self.inner.events_from(from, max_rows)
    }
}

/// Simulated hosts that, like real ones, hear of launches and kills only
/// after the commit that records them; each is written to the trace.
#[derive(Debug)]
struct TestBackend {
    /// The simulator, or real agents' sessions.
    sim: Box<dyn HostBackend>,
    trace: Trace,
}

impl HostBackend for TestBackend {
    fn launch(&mut self, now_ms: u64, launches: &mut Vec<Launch>, secrets: Secrets<'_>) {
        for l in launches.iter() {
            let job = self.trace.job(&l.job_id);
            self.trace.push(format!(
                "launch {job}/{} run {} on {}",
                l.run.instance, l.run.run, l.host
            ));
        }
        self.sim.launch(now_ms, launches, secrets);
    }

    fn kill(&mut self, now_ms: u64, kills: &mut Vec<Kill>) {
        for k in kills.iter() {
            self.trace.push(format!(
                "kill instance {} run {}",
                k.run.instance, k.run.run
            ));
        }
        self.sim.kill(now_ms, kills);
    }

    fn poll(&mut self, now_ms: u64, out: &mut Vec<TaskUpdate>) {
        self.sim.poll(now_ms, out);
    }

    fn next_deadline(&self) -> Option<u64> {
        self.sim.next_deadline()
    }

    fn dispatch_after_commit(&self) -> bool {
        true
    }
}

/// The loop with its test transport, store and clock.
struct Shell {
    scheduler: Scheduler,
    now: Now,
    trace: Trace,
    fail: Arc<AtomicBool>,
    hold: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl Shell {
    /// A loop over two simulated hosts on an empty store, after its first
    /// iteration (recovery and the first cycle).
    fn new() -> Shell {
        Shell::build(2, None)
    }

    /// A loop of real agents' hosts (none registered yet), following
    /// `leading`.
    fn with_agents(leading: tokio::sync::watch::Receiver<bool>) -> Shell {
        let hub = Arc::new(AgentHub::new("agent-token".into(), 1000));
        Shell::build(0, Some((hub, leading)))
    }

    fn build(
        sim_hosts: u32,
        agents: Option<(Arc<AgentHub>, tokio::sync::watch::Receiver<bool>)>,
    ) -> Shell {
        let dir = tempfile::tempdir().unwrap();
        let trace = Trace::default();
        let fail = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(AtomicBool::new(false));
        let store = TestStore {
            inner: RedbStore::open(dir.path()).unwrap(),
            fail: fail.clone(),
            hold: hold.clone(),
            trace: trace.clone(),
        };
        let snapshot = store.load().unwrap();
        let engine = Engine::new(EngineConfig::default());
        let hub = agents.as_ref().map(|(hub, _)| hub.clone());
        let backend = TestBackend {
            sim: match &hub {
                None => Box::new(SimBackend::new()),
                Some(hub) => Box::new(AgentBackend::new(hub.clone())),
            },
            trace: trace.clone(),
        };
        let mut scheduler = Scheduler::new(
            engine,
            Arc::new(store),
            Box::new(backend),
            LoopConfig {
                simulated_hosts: crate::config::generated_hosts(sim_hosts),
                ..LoopConfig::default()
            },
            Arc::new(Metrics::new(16)),
            snapshot,
            hub,
        )
        .unwrap();
        if let Some((_, leading)) = agents {
            scheduler = scheduler.with_leading(leading);
        }
        let mut shell = Shell {
            scheduler,
            now: Now::read(),
            trace,
            fail,
            hold,
            _dir: dir,
        };
        shell.iterate(Duration::ZERO, Vec::new());
        shell.trace.take();
        shell
    }

    /// An agent's registration of `host` (2 cpus) on a session whose
    /// messages are dropped.
    fn register(&self, label: &str, host: &str) -> Command {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        std::mem::forget(rx);
        let register = pb::AgentRegister {
            host: host.into(),
            resources: Some(pb::Resources {
                cpu: 2.0,
                memory_mb: 2048.0,
                disk_mb: 1024.0,
                ..Default::default()
            }),
            ports: 100,
            agent_id: format!("agent-of-{host}"),
            ..Default::default()
        };
        let spec = convert::host_spec(
            host,
            register.resources.as_ref(),
            &register.attributes,
            register.ports,
        )
        .unwrap();
        let registration = Registration {
            session: Session {
                id: 1,
                agent_id: format!("agent-of-{host}").into(),
                tx,
            },
            register,
            spec,
        };
        self.ask(
            label,
            |_: &()| "registered".into(),
            |reply| {
                Command::Agents(AgentCommand::AgentRegister {
                    registration: Box::new(registration),
                    reply,
                })
            },
        )
    }

    fn list_hosts(&self, label: &str) -> Command {
        self.ask(
            label,
            |r: &pb::ListHostsResponse| {
                let hosts: Vec<_> = r
                    .hosts
                    .iter()
                    .map(|h| format!("{} {}", h.name, h.state().as_str_name()))
                    .collect();
                hosts.join(", ")
            },
            |reply| {
                Command::Hosts(HostCommand::ListHosts {
                    request: pb::ListHostsRequest::default(),
                    reply,
                })
            },
        )
    }

    /// A command whose reply is written to the trace as `label: ...` once
    /// it comes.
    fn ask<T: std::fmt::Debug + Send + 'static>(
        &self,
        label: &str,
        show: impl Fn(&T) -> String + Send + 'static,
        command: impl FnOnce(Reply<T>) -> Command,
    ) -> Command {
        let (tx, mut rx) = oneshot::channel::<Result<T, tonic::Status>>();
        let label = label.to_string();
        self.trace
            .0
            .lock()
            .unwrap()
            .pending
            .push(Box::new(move || match rx.try_recv() {
                Ok(Ok(v)) => Some(format!("answer {label}: {}", show(&v))),
                Ok(Err(e)) => Some(format!("answer {label}: {:?} {}", e.code(), e.message())),
                Err(oneshot::error::TryRecvError::Empty) => None,
                Err(oneshot::error::TryRecvError::Closed) => {
                    Some(format!("answer {label}: dropped"))
                }
            }));
        command(tx)
    }

    fn create_pool(&self, label: &str, path: &str) -> Command {
        let config = convert::pool_config(Some(&pb::PoolSpec {
            reservation: Some(pb::Resources {
                cpu: 8.0,
                memory_mb: 8192.0,
                ..Default::default()
            }),
            ..Default::default()
        }))
        .unwrap();
        self.ask(
            label,
            |p: &pb::Pool| format!("pool {}", p.path),
            |reply| {
                Command::Pools(PoolCommand::CreatePool {
                    path: path.into(),
                    config,
                    reply,
                })
            },
        )
    }

    /// A job named after its label (names are unique among a pool's
    /// unfinished jobs).
    fn create_job(&self, label: &str, instances: u32) -> Command {
        let spec = pb::JobSpec {
            name: label.replace(' ', "-"),
            r#type: pb::JobType::Batch as i32,
            pool: "/p".into(),
            instance_count: instances,
            default_task: Some(pb::TaskSpec {
                command: "/bin/true".into(),
                resources: Some(pb::Resources {
                    cpu: 1.0,
                    memory_mb: 256.0,
                    ..Default::default()
                }),
                sim: Some(pb::SimSpec {
                    duration_ms: 60_000,
                    exit_code: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let plan = convert::job_plan(&spec, &convert::Limits::default()).unwrap();
        let trace = self.trace.clone();
        self.ask(
            label,
            move |j: &pb::Job| format!("job {}", trace.job(&j.id)),
            |reply| {
                Command::Jobs(JobCommand::CreateJob {
                    plan: Box::new(plan),
                    secrets: Vec::new(),
                    reply,
                })
            },
        )
    }

    fn list_pools(&self, label: &str) -> Command {
        self.ask(
            label,
            |r: &pb::ListPoolsResponse| {
                let paths: Vec<_> = r.pools.iter().map(|p| p.path.as_str()).collect();
                format!("pools {}", paths.join(" "))
            },
            |reply| {
                Command::Pools(PoolCommand::ListPools {
                    request: pb::ListPoolsRequest::default(),
                    viewer: None,
                    reply,
                })
            },
        )
    }

    /// From now on the loop commits on a writer thread while it steps the
    /// next iteration, as `run` does.
    fn pipelined(mut self) -> Shell {
        let store = self.scheduler.store.clone();
        self.scheduler.writer = Some(super::Writer::start(store).unwrap());
        self
    }

    /// What `run` does when the batch in flight comes back while it waits:
    /// waits for it, then releases what waited for it (or holds it if the
    /// commit failed).
    fn settle(&mut self) {
        if let Some(w) = self.scheduler.writer.as_mut().and_then(super::Writer::wait) {
            self.scheduler.written(w);
        }
        self.trace.poll();
    }

    /// Lets a held commit go on after `ms`, from another thread (the loop
    /// meanwhile waits for it).
    fn unhold_after(&self, ms: u64) -> std::thread::JoinHandle<()> {
        let hold = self.hold.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            hold.store(false, Ordering::SeqCst);
        })
    }

    /// Moves the clock on by `after` and runs one iteration over
    /// `commands`; the iteration's header goes to the trace first.
    fn iterate(&mut self, after: Duration, mut commands: Vec<Command>) {
        self.now = self.now.later(after);
        self.trace.push(format!(
            "-- iteration at +{} ms, {} commands",
            after.as_millis(),
            commands.len()
        ));
        self.scheduler.iterate(self.now, &mut commands);
        self.trace.poll();
    }

    fn check(&self, want: Expect) {
        want.assert_eq(&self.trace.take());
    }
}

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

#[test]
fn an_iteration_commits_once_then_answers_then_dispatches() {
    let mut shell = Shell::new();
    let pool = shell.create_pool("create /p", "/p");
    let job = shell.create_job("create job", 2);
    // Refused by the core: answered at once, before the commit, and
    // changes nothing.
    let again = shell.create_pool("create /p again", "/p");
    shell.iterate(10 * MS, vec![pool, job, again]);
    shell.check(expect![[r#"
        -- iteration at +10 ms, 3 commands
        answer create /p again: AlreadyExists pool /p already exists
        commit: revision 9, 1 job rows, 2 task rows
        answer create /p: pool /p
        answer create job: job j1
        launch j1/0 run 1 on sim-00000
        launch j1/1 run 1 on sim-00000
    "#]]);
    // The hosts report the runs started: written, nothing sent.
    shell.iterate(10 * MS, Vec::new());
    shell.check(expect![[r#"
        -- iteration at +10 ms, 0 commands
        commit: revision 12, 1 job rows, 2 task rows
    "#]]);
}

/// Pipelined: iteration N's batch is written while N+1 is stepped; N's
/// answers and launches go once N is durable, before N+1's, and N+1's wait
/// for N+1's own commit.
#[test]
fn a_pipelined_loop_steps_the_next_batch_while_the_last_is_written() {
    let mut shell = Shell::new().pipelined();
    let pool = shell.create_pool("create /p", "/p");
    let job = shell.create_job("create job", 2);
    shell.hold.store(true, Ordering::SeqCst);
    shell.iterate(10 * MS, vec![pool, job]);
    // In flight: nothing has left yet.
    shell.check(expect![[r#"
        -- iteration at +10 ms, 2 commands
    "#]]);
    // The next iteration is stepped while the disk is slow; at its end
    // the loop waits for the batch in flight, whose answers and launches
    // then go; this iteration's own wait for its commit.
    let unhold = shell.unhold_after(50);
    let job2 = shell.create_job("create job 2", 1);
    let read = shell.list_pools("list pools");
    shell.iterate(MS, vec![job2, read]);
    unhold.join().unwrap();
    shell.check(expect![[r#"
        -- iteration at +1 ms, 2 commands
        commit: revision 9, 1 job rows, 2 task rows
        answer create /p: pool /p
        answer create job: job j1
        launch j1/0 run 1 on sim-00000
        launch j1/1 run 1 on sim-00000
    "#]]);
    shell.settle();
    shell.check(expect![[r#"
        commit: revision 11, 1 job rows, 0 task rows
        answer create job 2: job j2
        answer list pools: pools / /p
    "#]]);
}

/// Pipelined, with a failed commit found at the end of the next iteration:
/// that iteration's effects stay in memory (its answers and launches too)
/// until the failed batch is written, then follow it in order.
#[test]
fn a_pipelined_loop_holds_the_next_batch_behind_a_failed_one() {
    let mut shell = Shell::new().pipelined();
    let pool = shell.create_pool("create /p", "/p");
    shell.iterate(MS, vec![pool]);
    shell.settle();
    shell.trace.take();

    shell.fail.store(true, Ordering::SeqCst);
    shell.hold.store(true, Ordering::SeqCst);
    let job = shell.create_job("create job", 1);
    shell.iterate(MS, vec![job]);
    let unhold = shell.unhold_after(50);
    let job2 = shell.create_job("create job 2", 1);
    shell.iterate(MS, vec![job2]);
    unhold.join().unwrap();
    shell.check(expect![[r#"
        -- iteration at +1 ms, 1 commands
        -- iteration at +1 ms, 1 commands
        commit failed: disk full
    "#]]);
    // Refused while the store cannot write.
    let write = shell.create_job("create another", 1);
    shell.iterate(10 * MS, vec![write]);
    shell.fail.store(false, Ordering::SeqCst);
    shell.iterate(100 * MS, Vec::new());
    shell.settle();
    shell.check(expect![[r#"
        -- iteration at +10 ms, 1 commands
        answer create another: Unavailable the store cannot write (store: disk full), for 0 s now: writes are refused until it can and are retried by the server every 2 s; reads are served
        -- iteration at +100 ms, 0 commands
        commit: revision 5, 1 job rows, 1 task rows
        answer create job: job j1
        launch j1/0 run 1 on sim-00000
        commit: revision 12, 2 job rows, 2 task rows
        answer create job 2: job j2
        launch j2/0 run 1 on sim-00000
    "#]]);
}

#[test]
fn a_failed_commit_holds_answers_and_launches_refuses_writes_and_serves_reads() {
    let mut shell = Shell::new();
    let pool = shell.create_pool("create /p", "/p");
    shell.iterate(MS, vec![pool]);
    shell.trace.take();

    shell.fail.store(true, Ordering::SeqCst);
    let job = shell.create_job("create job", 1);
    shell.iterate(MS, vec![job]);
    // Neither the answer nor the launch leaves before the batch is durable.
    shell.check(expect![[r#"
        -- iteration at +1 ms, 1 commands
        commit failed: disk full
    "#]]);

    // Meanwhile writes are refused at once, reads answered from memory,
    // and the batch is not tried again before its back-off (100 ms).
    let write = shell.create_job("create another", 1);
    let read = shell.list_pools("list pools");
    shell.iterate(50 * MS, vec![write, read]);
    shell.check(expect![[r#"
        -- iteration at +50 ms, 2 commands
        answer create another: Unavailable the store cannot write (store: disk full), for 0 s now: writes are refused until it can and are retried by the server every 2 s; reads are served
        answer list pools: pools / /p
    "#]]);

    // Still failing at the retry: the back-off doubles.
    shell.iterate(60 * MS, Vec::new());
    shell.check(expect![[r#"
        -- iteration at +60 ms, 0 commands
        commit failed: disk full
    "#]]);
    shell.fail.store(false, Ordering::SeqCst);
    shell.iterate(100 * MS, Vec::new());
    shell.check(expect![[r#"
        -- iteration at +100 ms, 0 commands
    "#]]);
    // Once the retry lands, what waited for it is released in order.
    shell.iterate(100 * MS, Vec::new());
    shell.check(expect![[r#"
        -- iteration at +100 ms, 0 commands
        commit: revision 5, 1 job rows, 1 task rows
        answer create job: job j1
        launch j1/0 run 1 on sim-00000
        commit: revision 7, 1 job rows, 1 task rows
    "#]]);
}

#[test]
fn the_next_wake_is_the_retry_while_a_commit_has_failed_and_the_cycle_otherwise() {
    let mut shell = Shell::new();
    let pool = shell.create_pool("create /p", "/p");
    let job = shell.create_job("create job", 1);
    shell.iterate(10 * MS, vec![pool, job]);
    // The hosts have news (the run started): the loop runs again at once.
    assert_eq!(shell.scheduler.next_wake(), shell.now.at);
    let cycled_at = shell.now.at;
    shell.iterate(MS, Vec::new());
    // Then the next cycle comes no sooner than the configured spacing after
    // the last, and no later than the idle interval.
    let wake = shell.scheduler.next_wake();
    let config = LoopConfig::default();
    assert!(wake >= cycled_at + config.cycle_interval, "{wake:?}");
    assert!(
        wake <= shell.now.at + config.idle_cycle_interval,
        "{wake:?}"
    );

    shell.fail.store(true, Ordering::SeqCst);
    let job = shell.create_job("create job 2", 1);
    shell.iterate(MS, vec![job]);
    assert_eq!(shell.scheduler.next_wake(), shell.now.at + 100 * MS);
}

#[test]
fn no_host_is_lost_while_the_server_does_not_lead_and_its_agents_get_slack_when_it_leads_again() {
    let (lead, leading) = tokio::sync::watch::channel(true);
    let mut shell = Shell::with_agents(leading);
    let reg = shell.register("register h1", "h1");
    shell.iterate(MS, vec![reg]);
    shell.trace.take();

    // The lease lapses: the agent cannot reach this server, and its
    // silence is not held against its host however long it lasts.
    lead.send(true).unwrap();
    lead.send(false).unwrap();
    shell.iterate(30 * SECOND, Vec::new());
    // Not leading, the loop still waits between its looks (it spun).
    assert!(
        shell.scheduler.next_wake() > shell.now.at,
        "the loop would spin while not leading"
    );
    let list = shell.list_hosts("hosts");
    shell.iterate(MS, vec![list]);
    shell.check(expect![[r#"
        -- iteration at +30000 ms, 0 commands
        -- iteration at +1 ms, 1 commands
        answer hosts: h1 HOST_STATE_UP
    "#]]);

    // Leading again: the agent gets the reconnect slack of a restart
    // (10 s) before it counts as silent, then the lost timeout (10 s);
    // then its host is down. (The loop sees the lead come back at its next
    // iteration: it wakes at least every half second while it watches
    // hosts.)
    lead.send(true).unwrap();
    shell.iterate(MS, Vec::new());
    shell.iterate(15 * SECOND, Vec::new());
    let list = shell.list_hosts("hosts");
    shell.iterate(MS, vec![list]);
    shell.check(expect![[r#"
        -- iteration at +1 ms, 0 commands
        -- iteration at +15000 ms, 0 commands
        -- iteration at +1 ms, 1 commands
        answer hosts: h1 HOST_STATE_UP
    "#]]);
    shell.iterate(10 * SECOND, Vec::new());
    let list = shell.list_hosts("hosts");
    shell.iterate(MS, vec![list]);
    shell.check(expect![[r#"
        -- iteration at +10000 ms, 0 commands
        -- iteration at +1 ms, 1 commands
        answer hosts: h1 HOST_STATE_DOWN
    "#]]);
}

#[test]
fn refused_reads_are_answered_at_once_with_their_code() {
    let (_lead, leading) = tokio::sync::watch::channel(true);
    let mut shell = Shell::with_agents(leading);
    let pool = shell.create_pool("create /p", "/p");
    let job = shell.create_job("create job", 1);
    shell.iterate(MS, vec![pool, job]);
    let id = shell.trace.0.lock().unwrap().jobs[0].clone();
    shell.trace.take();
    let past = shell.ask(
        "tasks from 5",
        |r: &pb::ListTasksResponse| format!("{} tasks", r.tasks.len()),
        |reply| {
            Command::Jobs(JobCommand::ListTasks {
                request: pb::ListTasksRequest {
                    job_id: id.clone(),
                    from_instance: 5,
                    ..Default::default()
                },
                reply,
            })
        },
    );
    let logs = shell.ask(
        "logs of instance 0",
        |_: &(pb::RunKey, crate::agent_hub::Outbox)| "a session".into(),
        |reply| {
            Command::Agents(AgentCommand::LogTarget {
                job_id: id.clone(),
                instance: 0,
                run_id: 0,
                reply,
            })
        },
    );
    shell.iterate(MS, vec![past, logs]);
    shell.check(expect![[r#"
        -- iteration at +1 ms, 2 commands
        answer tasks from 5: OutOfRange from_instance: 5 is past the job's last instance (it has 1, 0–0)
        answer logs of instance 0: NotFound j1/0 has not been launched yet
    "#]]);
}
