//! `peloton-bench spark`: how fast a Spark-like framework gets its
//! executors through the application API (`ApplicationService`).
//!
//! Every measurement is one target jump, 0 → `--executors` (N), on a freshly
//! registered application (client mode: executors are the instances of the
//! application's own job, ids "0", "1", …). In both parts the bench opens
//! `WatchExecutors` (from the revision after the registration, and waits for
//! its first message) *before* it calls `SetExecutorTarget {generation: 1,
//! total: N}`; the clock starts just before that call. Event times are when
//! the bench received them (client and server share this machine).
//!
//! 1. Simulated hosts (`sim_*`, skipped with `--hosts 0`): `pelotond
//!    --sim-hosts H` (the release binary next to this one, fresh temporary
//!    data dir), a pool `/spark-sim` without reservation, executors of 1 cpu
//!    and 512 MiB with a simulated run of an hour (`sim.duration_ms`).
//!    - `sim_first_running_s` / `sim_all_running_s`: to the first / the N-th
//!      distinct `launched` event of the stream (an executor is RUNNING);
//!    - `sim_executors_per_s`: N / `sim_all_running_s`;
//!    - `sim_target_call_ms`: the `SetExecutorTarget` call itself;
//!    - `sim_pending_events`: `pending` events seen on the way;
//!    - `sim_unregister_all_exited_s`: from the `Unregister` call until every
//!      executor has an `exited` event (KILLED) and `Get` shows none running
//!      or pending.
//! 2. Local agents (`local_*`, skipped with `--agents 0`): `pelotond` without
//!    simulated hosts plus `--agents` `peloton-agent` processes on fresh
//!    temporary work dirs, each offered an equal share of this machine's
//!    cores and of half its memory, started with `--stop-tasks-on-exit` and
//!    `--exit-with-parent` (so no executor outlives them). The bench plays
//!    the Spark driver: it listens on `127.0.0.1:PORT` and registers the
//!    application with `driver_url: tcp://127.0.0.1:PORT`. An executor (0.01
//!    cpu, 16 MiB) runs `exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/PORT &&
//!    echo "$PELOTON_INSTANCE_ID" >&3 && exec -a MARKER sleep 3600'`: it
//!    connects back, "registers" by sending its id, and stays alive holding
//!    the connection.
//!    - `local_first_registered_s` / `local_all_registered_s`: to the first /
//!      the N-th distinct id received by the driver (TCP);
//!    - `local_registered_per_s`: N / `local_all_registered_s`;
//!    - `local_first_running_s` / `local_all_running_s`: the same from the
//!      stream's `launched` events (an agent sees a run has started at its
//!      next look, `--poll-interval-ms`, 200 ms by default: these trail the
//!      registrations by about that much);
//!    - `local_target_call_ms`, `local_pending_events`: as above;
//!    - `local_agent_resources`: what each agent offered;
//!    - `local_unregister_all_exited_s`: from the `Unregister` call until
//!      every executor has an `exited` event and every driver connection
//!      is closed (then `Get` must show none running or pending);
//!    - `local_leftover_processes`: executor processes (found in /proc by
//!      MARKER) still alive after the agents and the server stopped; must
//!      be 0 (they are killed and the run fails otherwise).
//!
//! Both servers are secure (the default): the bench's gRPC clients use
//! TLS with the CA each makes in its data dir and its admin token, and the
//! agents present certificates naming their hosts from that CA;
//! `--insecure` starts them plaintext instead.
//!
//! A wait longer than `--timeout-s` fails the run with what was seen (and
//! the last pending reason); an executor that exits while the target rises
//! fails it too. Started processes are stopped (SIGTERM, then SIGKILL) and
//! temporary dirs removed on success and on error; if the bench itself is
//! killed, the agents still stop their executors (`--exit-with-parent`).
//!
//! ```sh
//! cargo build --release -p peloton-gateway -p peloton-agent -p peloton-bench
//! target/release/peloton-bench spark --hosts 100 --agents 3 --executors 100 [--json]
//! ```

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use pb::application_service_client::ApplicationServiceClient;
use pb::executor_event::Kind;
use peloton_gateway::client::Authed;
use peloton_proto::v1 as pb;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

use crate::launch::Process;

/// Options of one run.
#[derive(Debug, Clone)]
pub struct SparkOptions {
    /// Simulated hosts of the first part (0 skips it).
    pub hosts: u32,
    /// Local agents of the second part (0 skips it).
    pub agents: u32,
    /// The executor target.
    pub executors: u32,
    /// Longest wait of any phase.
    pub timeout: Duration,
    /// Start the servers with `--insecure` (plaintext, no tokens, agents
    /// without certificates).
    pub insecure: bool,
}

/// Executor resources on local agents.
const LOCAL_CPU: f64 = 0.01;
const LOCAL_MEMORY_MB: f64 = 16.0;

/// Runs the benchmark.
pub async fn run(o: SparkOptions) -> Result<Value> {
    ensure!(
        (1..=100_000).contains(&o.executors),
        "--executors: between 1 and 100000"
    );
    ensure!(o.agents <= 64, "--agents: at most 64");
    ensure!(
        o.hosts > 0 || o.agents > 0,
        "--hosts 0 and --agents 0: nothing to measure"
    );
    if o.agents > 0 {
        agent_share(&o)?;
    }
    let mut report = Map::new();
    report.insert("benchmark".into(), json!("spark"));
    report.insert("executors".into(), json!(o.executors));
    report.insert("sim_hosts".into(), json!(o.hosts));
    report.insert("local_agents".into(), json!(o.agents));
    if o.hosts > 0 {
        simulated(&o, &mut report)
            .await
            .context("simulated hosts")?;
    }
    if o.agents > 0 {
        local(&o, &mut report).await.context("local agents")?;
    }
    Ok(Value::Object(report))
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn secs(d: Duration) -> f64 {
    round3(d.as_secs_f64())
}

/// Part 1: simulated hosts.
async fn simulated(o: &SparkOptions, report: &mut Map<String, Value>) -> Result<()> {
    let (server, target) = crate::e2e::spawn_server(o.hosts, o.insecure)?;
    let channel = target.connect().await?;
    let pool = "/spark-sim";
    crate::e2e::create_pool(&channel, pool).await?;
    let executor = pb::TaskSpec {
        command: "/bin/true".into(),
        resources: Some(pb::Resources {
            cpu: 1.0,
            memory_mb: 512.0,
            ..Default::default()
        }),
        sim: Some(pb::SimSpec {
            duration_ms: 3_600_000,
            exit_code: 0,
        }),
        ..Default::default()
    };
    let mut apps = ApplicationServiceClient::new(channel);
    let app = register(&mut apps, pool, "spark://bench-driver:7078", executor, o).await?;
    let mut events = watch(&mut apps, &app).await?;
    let (start, call) = raise_target(&mut apps, &app.id, o.executors).await?;
    let mut seen = Seen::default();
    let deadline = start + o.timeout;
    while seen.launched.len() < o.executors as usize {
        let ev = next_event(&mut events, deadline, o.timeout, &seen, o.executors).await?;
        seen.take(ev)?;
    }
    let (first, all) = seen.launch_times(start);
    report.insert("sim_target_call_ms".into(), json!(round3(call * 1e3)));
    report.insert("sim_first_running_s".into(), json!(secs(first)));
    report.insert("sim_all_running_s".into(), json!(secs(all)));
    report.insert(
        "sim_executors_per_s".into(),
        json!(round3(f64::from(o.executors) / all.as_secs_f64().max(1e-9))),
    );
    report.insert("sim_pending_events".into(), json!(seen.pending_events));
    // End the application too (a check that it ends, not a figure).
    let unregistered = Instant::now();
    unregister_and_wait(&mut apps, &app.id, &mut events, &mut seen, None, o).await?;
    report.insert(
        "sim_unregister_all_exited_s".into(),
        json!(secs(unregistered.elapsed())),
    );
    drop(events);
    drop(server);
    Ok(())
}

/// What each local agent offers (cpu, MiB): an equal share of this
/// machine's cores and of half its memory; an error if the executors do
/// not fit.
fn agent_share(o: &SparkOptions) -> Result<(f64, f64)> {
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get()) as f64;
    let memory_mb = mem_total_mb().unwrap_or(8192.0) / 2.0;
    let agent_cpu = cores / f64::from(o.agents);
    let agent_mem = (memory_mb / f64::from(o.agents)).floor();
    // Each agent holds whole executors only.
    let per_agent = ((agent_cpu / LOCAL_CPU + 1e-9).floor()).min(agent_mem / LOCAL_MEMORY_MB);
    ensure!(
        per_agent * f64::from(o.agents) >= f64::from(o.executors),
        "--executors {}: executors of {LOCAL_CPU} cpu and {LOCAL_MEMORY_MB} MiB do not fit on {} \
         local agents of {agent_cpu:.2} cpu and {agent_mem} MiB each (this machine's cores and \
         half its memory; at most {} executors)",
        o.executors,
        o.agents,
        per_agent * f64::from(o.agents)
    );
    Ok((agent_cpu, agent_mem))
}

/// Part 2: local agents, the bench being the driver.
async fn local(o: &SparkOptions, report: &mut Map<String, Value>) -> Result<()> {
    let (agent_cpu, agent_mem) = agent_share(o)?;
    let token = "bench-token";
    // Dropped last (declared first): the agents' work dirs.
    let work = tempfile::tempdir()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("the driver cannot listen on 127.0.0.1")?;
    let port = listener.local_addr()?.port();
    let marker = format!("peloton-bench-spark-executor-{}-{port}", std::process::id());
    // Dropped after the agents and the server: kills (and counts) any
    // executor left behind.
    let reaper = Reaper {
        marker: marker.clone(),
    };
    let (server, target) =
        crate::e2e::spawn_server_with(0, &["--agent-token".into(), token.into()], o.insecure)?;
    let agent_bin = crate::e2e::sibling_binary(
        "peloton-agent",
        "-p peloton-gateway -p peloton-agent -p peloton-bench",
    )?;
    let mut agents = Vec::new();
    for i in 0..o.agents {
        let host = format!("spark-bench-{i}");
        let mut extra = crate::e2e::agent_tls_args(
            &target,
            server.data_dir(),
            &host,
            &work.path().join("certs"),
        )?;
        extra.extend([
            "--stop-tasks-on-exit".into(),
            "--exit-with-parent".into(),
            std::process::id().to_string(),
        ]);
        // Spawned from this (the main) thread: --exit-with-parent follows it.
        let child = crate::launch::spawn_agent(
            &agent_bin,
            &target.url,
            token,
            &work.path().join(format!("agent-{i}")),
            &host,
            &format!("cpu={agent_cpu:.3},mem={agent_mem},disk=10000"),
            &extra,
        )?;
        agents.push(Process(child, AGENT_PATIENCE));
    }
    let channel = target.connect().await?;
    wait_hosts(&channel, o.agents, o.timeout).await?;
    let pool = "/spark-local";
    crate::e2e::create_pool(&channel, pool).await?;

    // The driver: one task per connection; an id when it registers, and
    // its end when the connection closes.
    let (driver_tx, mut driver) = mpsc::unbounded_channel();
    let accept = AbortOnDrop(tokio::spawn(serve_driver(listener, driver_tx)));

    let executor = pb::TaskSpec {
        shell: format!(
            "exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && \
             echo \"$PELOTON_INSTANCE_ID\" >&3 && exec -a {marker} sleep 3600'"
        ),
        resources: Some(pb::Resources {
            cpu: LOCAL_CPU,
            memory_mb: LOCAL_MEMORY_MB,
            ..Default::default()
        }),
        kill_grace_period_ms: 2_000,
        ..Default::default()
    };
    let driver_url = format!("tcp://127.0.0.1:{port}");
    let mut apps = ApplicationServiceClient::new(channel);
    let app = register(&mut apps, pool, &driver_url, executor, o).await?;
    let mut events = watch(&mut apps, &app).await?;
    let (start, call) = raise_target(&mut apps, &app.id, o.executors).await?;
    let n = o.executors as usize;
    let deadline = start + o.timeout;
    let mut seen = Seen::default();
    let mut registered: HashMap<String, Instant> = HashMap::new();
    let mut connected: HashSet<String> = HashSet::new();
    while registered.len() < n || seen.launched.len() < n {
        tokio::select! {
            ev = next_event(&mut events, deadline, o.timeout, &seen, o.executors) => seen.take(ev?)?,
            msg = driver.recv() => match msg.context("the driver stopped listening")? {
                Driver::Registered { id, at } => {
                    ensure!(
                        registered.insert(id.clone(), at).is_none(),
                        "executor {id} registered with the driver twice"
                    );
                    connected.insert(id);
                }
                Driver::Gone { id } => bail!(
                    "executor {id} closed its driver connection while the target was rising \
                     ({} of {n} registered)",
                    registered.len()
                ),
                Driver::Bad { what } => bail!("the driver got a bad registration: {what}"),
            },
            () = tokio::time::sleep_until(deadline.into()) => bail!(
                "after {} s: {} of {n} executors registered with the driver, {} launched; \
                 last pending reason: {}",
                o.timeout.as_secs(),
                registered.len(),
                seen.launched.len(),
                seen.last_pending.as_deref().unwrap_or("none")
            ),
        }
    }
    let launched: HashSet<&String> = seen.launched.keys().collect();
    let ids: HashSet<&String> = registered.keys().collect();
    ensure!(
        launched == ids,
        "the executors that registered are not those launched: registered but not \
         launched {:?}, launched but not registered {:?}",
        ids.difference(&launched).take(10).collect::<Vec<_>>(),
        launched.difference(&ids).take(10).collect::<Vec<_>>()
    );
    let first_reg = registered
        .values()
        .min()
        .map_or(Duration::ZERO, |t| *t - start);
    let all_reg = registered
        .values()
        .max()
        .map_or(Duration::ZERO, |t| *t - start);
    let (first, all) = seen.launch_times(start);
    report.insert("local_target_call_ms".into(), json!(round3(call * 1e3)));
    report.insert("local_first_registered_s".into(), json!(secs(first_reg)));
    report.insert("local_all_registered_s".into(), json!(secs(all_reg)));
    report.insert(
        "local_registered_per_s".into(),
        json!(round3(
            f64::from(o.executors) / all_reg.as_secs_f64().max(1e-9)
        )),
    );
    report.insert("local_first_running_s".into(), json!(secs(first)));
    report.insert("local_all_running_s".into(), json!(secs(all)));
    report.insert("local_pending_events".into(), json!(seen.pending_events));
    report.insert(
        "local_agent_resources".into(),
        json!(format!("cpu={agent_cpu:.3},mem={agent_mem}")),
    );

    let unregistered = Instant::now();
    unregister_and_wait(
        &mut apps,
        &app.id,
        &mut events,
        &mut seen,
        Some((&mut driver, &mut connected)),
        o,
    )
    .await?;
    report.insert(
        "local_unregister_all_exited_s".into(),
        json!(secs(unregistered.elapsed())),
    );
    drop(events);
    drop(accept);
    drop(agents);
    drop(server);
    let left = reaper.sweep();
    report.insert("local_leftover_processes".into(), json!(left));
    ensure!(
        left == 0,
        "{left} executor processes were still alive after the agents stopped (killed now)"
    );
    Ok(())
}

/// Waits until `n` agent hosts are connected and up.
async fn wait_hosts(channel: &Authed, n: u32, timeout: Duration) -> Result<()> {
    let mut hosts = pb::host_service_client::HostServiceClient::new(channel.clone());
    let deadline = Instant::now() + timeout.min(Duration::from_secs(60));
    loop {
        let up = hosts
            .list(pb::ListHostsRequest::default())
            .await?
            .into_inner()
            .hosts
            .iter()
            .filter(|h| h.connected && h.state() == pb::HostState::Up)
            .count();
        if up == n as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {up} of {n} agents registered with the server in time");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn register(
    apps: &mut ApplicationServiceClient<Authed>,
    pool: &str,
    driver_url: &str,
    executor: pb::TaskSpec,
    o: &SparkOptions,
) -> Result<pb::Application> {
    let app = apps
        .register(pb::RegisterAppRequest {
            name: "spark-bench".into(),
            owner: "peloton-bench".into(),
            pool: pool.into(),
            driver_url: driver_url.into(),
            executor: Some(executor),
            max_executors: o.executors,
            ..Default::default()
        })
        .await
        .context("ApplicationService.Register")?
        .into_inner()
        .app
        .context("Register answered no application")?;
    ensure!(
        app.target == 0 && app.running == 0 && app.pending == 0,
        "a fresh application has target {}, {} running, {} pending",
        app.target,
        app.running,
        app.pending
    );
    Ok(app)
}

/// An executor event and when the bench received it.
type Timed = (Instant, pb::ExecutorEvent);
type Events = mpsc::UnboundedReceiver<Result<Timed, tonic::Status>>;

/// Opens the executor stream from just after the registration, waits for
/// its first message, and reads it on a task of its own (so that every
/// event is timed as it arrives).
async fn watch(
    apps: &mut ApplicationServiceClient<Authed>,
    app: &pb::Application,
) -> Result<Events> {
    let mut stream = apps
        .watch_executors(pb::WatchExecutorsRequest {
            app_id: app.id.clone(),
            from_revision: app.revision + 1,
        })
        .await
        .context("ApplicationService.WatchExecutors")?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .map_err(|_| anyhow!("WatchExecutors sent no first message within 10 s"))?
        .context("WatchExecutors")?
        .context("WatchExecutors ended at once")?;
    let (tx, rx) = mpsc::unbounded_channel();
    let at = Instant::now();
    for e in first.events {
        let _ = tx.send(Ok((at, e)));
    }
    tokio::spawn(async move {
        loop {
            match stream.message().await {
                Ok(Some(batch)) => {
                    let at = Instant::now();
                    for e in batch.events {
                        if tx.send(Ok((at, e))).is_err() {
                            return;
                        }
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// Sets the target to `total` (generation 1); the time just before the
/// call and the call's duration in seconds.
async fn raise_target(
    apps: &mut ApplicationServiceClient<Authed>,
    id: &str,
    total: u32,
) -> Result<(Instant, f64)> {
    let start = Instant::now();
    let answer = apps
        .set_executor_target(pb::SetExecutorTargetRequest {
            app_id: id.into(),
            generation: 1,
            total,
        })
        .await
        .context("ApplicationService.SetExecutorTarget")?
        .into_inner();
    let call = start.elapsed().as_secs_f64();
    ensure!(
        answer.applied && answer.target == total && answer.generation == 1,
        "SetExecutorTarget {{generation: 1, total: {total}}} answered {answer:?}"
    );
    Ok((start, call))
}

/// The next event of the stream, or an error at the deadline or if the
/// stream fails or ends.
async fn next_event(
    events: &mut Events,
    deadline: Instant,
    timeout: Duration,
    seen: &Seen,
    n: u32,
) -> Result<Timed> {
    match tokio::time::timeout_at(deadline.into(), events.recv()).await {
        Err(_) => Err(anyhow!(
            "after {} s: {} of {n} executors launched, {} exited; last pending reason: {}",
            timeout.as_secs(),
            seen.launched.len(),
            seen.exited.len(),
            seen.last_pending.as_deref().unwrap_or("none")
        )),
        Ok(None) => Err(anyhow!("the WatchExecutors stream ended")),
        Ok(Some(Err(e))) => Err(anyhow!("the WatchExecutors stream failed: {e}")),
        Ok(Some(Ok(ev))) => Ok(ev),
    }
}

/// What the stream said so far.
#[derive(Default)]
struct Seen {
    /// Executor id → when its (first) launched event arrived.
    launched: HashMap<String, Instant>,
    /// Executor id → how it ended.
    exited: HashMap<String, pb::ExecutorExited>,
    pending_events: u64,
    last_pending: Option<String>,
    /// Exits are expected (after Unregister).
    ending: bool,
}

impl Seen {
    fn take(&mut self, (at, e): Timed) -> Result<()> {
        match e.kind {
            Some(Kind::Launched(_)) => {
                self.launched.entry(e.executor_id).or_insert(at);
            }
            Some(Kind::Pending(p)) => {
                self.pending_events += 1;
                self.last_pending = Some(p.reason);
            }
            Some(Kind::Exited(x)) => {
                if !self.ending {
                    bail!(
                        "executor {} exited while the target was rising: {:?}, code {}, {}",
                        e.executor_id,
                        x.cause(),
                        x.exit_code,
                        x.reason
                    );
                }
                self.exited.insert(e.executor_id, x);
            }
            None => {}
        }
        Ok(())
    }

    /// To the first and to the last launched event.
    fn launch_times(&self, start: Instant) -> (Duration, Duration) {
        let first = self
            .launched
            .values()
            .min()
            .map_or(Duration::ZERO, |t| *t - start);
        let all = self
            .launched
            .values()
            .max()
            .map_or(Duration::ZERO, |t| *t - start);
        (first, all)
    }
}

/// Unregisters the application and waits until every launched executor has
/// an exited event (and, with the driver, every connection is closed); then
/// `Get` must show none running or pending.
async fn unregister_and_wait(
    apps: &mut ApplicationServiceClient<Authed>,
    id: &str,
    events: &mut Events,
    seen: &mut Seen,
    mut driver: Option<(&mut mpsc::UnboundedReceiver<Driver>, &mut HashSet<String>)>,
    o: &SparkOptions,
) -> Result<()> {
    seen.ending = true;
    let answer = apps
        .unregister(pb::UnregisterAppRequest { app_id: id.into() })
        .await
        .context("ApplicationService.Unregister")?
        .into_inner()
        .app
        .context("Unregister answered no application")?;
    ensure!(
        answer.unregistered,
        "Unregister answered an application not unregistered: {answer:?}"
    );
    let deadline = Instant::now() + o.timeout;
    let all_exited = |seen: &Seen| seen.launched.keys().all(|k| seen.exited.contains_key(k));
    loop {
        let connections = driver.as_ref().map_or(0, |(_, c)| c.len());
        if all_exited(seen) && connections == 0 {
            break;
        }
        let left = seen.launched.len() - seen.exited.len().min(seen.launched.len());
        let late = || {
            anyhow!(
                "{} s after Unregister: {left} executors without an exited event, \
                 {connections} driver connections open",
                o.timeout.as_secs()
            )
        };
        match driver.as_mut() {
            Some((rx, connected)) => tokio::select! {
                ev = next_event(events, deadline, o.timeout, seen, o.executors) => {
                    seen.take(ev.map_err(|e| e.context(late()))?)?;
                }
                msg = rx.recv() => match msg.context("the driver stopped listening")? {
                    Driver::Gone { id } => {
                        connected.remove(&id);
                    }
                    Driver::Registered { id, .. } => {
                        bail!("executor {id} registered with the driver after Unregister")
                    }
                    Driver::Bad { what } => bail!("the driver got a bad registration: {what}"),
                },
                () = tokio::time::sleep_until(deadline.into()) => return Err(late()),
            },
            None => {
                let ev = next_event(events, deadline, o.timeout, seen, o.executors)
                    .await
                    .map_err(|e| e.context(late()))?;
                seen.take(ev)?;
            }
        }
    }
    let killed = seen
        .exited
        .values()
        .filter(|x| x.cause() == pb::ExecutorExitCause::Killed)
        .count();
    ensure!(
        killed == seen.exited.len(),
        "after Unregister, {} of {} executors ended otherwise than KILLED",
        seen.exited.len() - killed,
        seen.exited.len()
    );
    // The server's view agrees (it may lag the stream by a moment).
    loop {
        let app = apps
            .get(pb::GetAppRequest { app_id: id.into() })
            .await
            .context("ApplicationService.Get")?
            .into_inner()
            .app
            .context("Get answered no application")?;
        if app.running == 0 && app.pending == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "after Unregister and every exited event, Get still shows {} running and {} \
                 pending executors",
                app.running,
                app.pending
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the driver's listener saw.
enum Driver {
    Registered { id: String, at: Instant },
    Gone { id: String },
    Bad { what: String },
}

/// Accepts executor connections: each sends its id and a newline, then
/// holds the connection until it ends.
async fn serve_driver(listener: tokio::net::TcpListener, tx: mpsc::UnboundedSender<Driver>) {
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(socket);
            let mut line = String::new();
            let read = (&mut reader).take(64).read_line(&mut line).await;
            let at = Instant::now();
            let id = line.trim();
            match read {
                Ok(_) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => {
                    let id = id.to_string();
                    if tx.send(Driver::Registered { id: id.clone(), at }).is_err() {
                        return;
                    }
                    let mut buf = [0u8; 64];
                    while let Ok(1..) = reader.read(&mut buf).await {}
                    let _ = tx.send(Driver::Gone { id });
                }
                Ok(_) => {
                    let _ = tx.send(Driver::Bad {
                        what: format!("{line:?} is not an executor id"),
                    });
                }
                Err(e) => {
                    let _ = tx.send(Driver::Bad {
                        what: format!("reading the id: {e}"),
                    });
                }
            }
        });
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a stopped agent may take before SIGKILL: with
/// `--stop-tasks-on-exit` it stops its executors first (their kill grace is
/// 2 s), hence the patience.
const AGENT_PATIENCE: Duration = Duration::from_secs(30);

/// Kills executor processes (their command line holds `marker`) that
/// outlived their agents.
struct Reaper {
    marker: String,
}

impl Reaper {
    /// Kills the survivors now; how many there were.
    fn sweep(&self) -> usize {
        let pids = pids_with(&self.marker);
        for pid in &pids {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        pids.len()
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.sweep() > 0 {
            eprintln!(
                "peloton-bench spark: killed executor processes left behind ({})",
                self.marker
            );
        }
    }
}

/// Processes (not this one) whose command line contains `marker`.
fn pids_with(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .collect()
}

/// MemTotal of this machine, in MiB.
fn mem_total_mb() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
