//! `peloton-bench`: seeded synthetic workloads run against the engine, with
//! a human table or one JSON object per run.
//!
//! Every workload is generated from `--seed` by `peloton_engine::testkit`, so
//! a run is reproducible and the criterion suites in `benches/` measure the
//! same shapes.

mod bigsmall;
mod e2e;
mod forecast;
mod history;
mod launch;
mod overcommit;
mod recovery;
mod spark;
mod trace;
mod update;
mod whatif;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use peloton_engine::forecast::ForecastConfig;
use peloton_engine::testkit::{
    Rng, TreeSpec, bench_capacity, build_random_tree, check_entitlement_invariants,
    enqueue_random_tasks, random_leaf_demand,
};
use peloton_engine::{
    AdmissionLimits, AdmissionResult, EntitlementCalculator, EntitlementInput, Entitlements,
    PoolTreeLimits, ResourceManager, ResourceManagerConfig, Resources,
};
use serde_json::{Value, json};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "peloton-bench",
    version,
    about = "Benchmark harness for the Peloton engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug, Clone, Copy)]
struct Common {
    /// Seed of the generated workload.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Threads of the engine's pool (results do not depend on it).
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Full entitlement recomputation over a random pool tree.
    Entitlement {
        /// Pools in the tree, the root included.
        #[arg(long, default_value_t = 10_000)]
        pools: usize,
        /// Levels of the tree, the root included.
        #[arg(long, default_value_t = 4)]
        depth: usize,
        /// Timed recomputations (each on a fresh demand snapshot).
        #[arg(long, default_value_t = 500)]
        iterations: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Queue random tasks, compute entitlement, admit everything that fits.
    Admission {
        /// Pools in the tree, the root included.
        #[arg(long, default_value_t = 1_000)]
        pools: usize,
        /// Tasks to queue.
        #[arg(long, default_value_t = 1_000_000)]
        tasks: usize,
        /// Levels of the tree, the root included.
        #[arg(long, default_value_t = 4)]
        depth: usize,
        /// Cluster capacity as a fraction of the queued demand.
        #[arg(long, default_value_t = 0.7)]
        capacity_fraction: f64,
        #[command(flatten)]
        common: Common,
    },
    /// Place a synthetic workload on a synthetic cluster in one batch.
    Placement {
        /// Hosts in the cluster.
        #[arg(long, default_value_t = 10_000)]
        hosts: usize,
        /// Tasks to place.
        #[arg(long, default_value_t = 1_000_000)]
        tasks: usize,
        /// pack, spread, first_fit or gpu_frag.
        #[arg(long, default_value = "pack")]
        strategy: String,
        /// Use the plain pack score (no GPU fragmentation term).
        #[arg(long)]
        no_gpu_aware: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Replay the Alibaba GPU trace (openb) as the ATC '23 fragmentation
    /// paper does, with each placement strategy, and report the paper's
    /// metric: unallocated GPU % at 100 % arrived, per seed and the mean.
    /// The paper's cluster is the GPU-node list,
    /// openb_node_list_gpu_node.csv (1,213 nodes, 6,212 GPUs).
    TraceGpu {
        /// Node list CSV: the paper's cluster is
        /// ../shared/traces/alibaba-gpu-v2023-openb/openb_node_list_gpu_node.csv.
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        nodes: Option<PathBuf>,
        /// Pod list CSV (e.g. openb_pod_list_default.csv; any openb list).
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        pods: Option<PathBuf>,
        /// Replay every one of the 17 published openb workloads whose
        /// openb_pod_list_<workload>.csv is in DIR, against DIR's
        /// openb_node_list_gpu_node.csv, and print one table beside FGD's and
        /// BestFit's published figures, read from DIR's
        /// analysis_allo_discrete.csv (the simulator's expected results).
        /// Strategies default to gpu_frag,gpu_frag_learned.
        #[arg(long, value_name = "DIR")]
        all: Option<PathBuf>,
        /// Stop when the requested GPUs reach this multiple of the capacity.
        #[arg(long, default_value_t = 1.3)]
        inflate: f64,
        /// Seeds, as FIRST..LAST (inclusive) or one number; the paper
        /// reports the mean over 42..51.
        #[arg(long, default_value = "42..51")]
        seeds: String,
        /// Comma-separated strategies: gpu_frag, gpu_frag_learned,
        /// pack_gpu_aware, pack, spread, first_fit (default: all).
        #[arg(long)]
        strategies: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The whole service through gRPC: start (or connect to) a server with
    /// simulated hosts, submit jobs from concurrent clients, wait for every
    /// task to be placed.
    E2e {
        /// Simulated hosts of the started server.
        #[arg(long, default_value_t = 10_000)]
        hosts: u32,
        /// Jobs to submit.
        #[arg(long, default_value_t = 1_000)]
        jobs: u32,
        /// Instances per job.
        #[arg(long, default_value_t = 1_000)]
        tasks_per_job: u32,
        /// Concurrent submitting clients.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Use this server (e.g. https://127.0.0.1:5391) instead of starting one.
        #[arg(long)]
        server: Option<String>,
        /// With an https --server: the CA (PEM) that signed its
        /// certificate (a pelotond keeps its private CA in
        /// DATA_DIR/tls/ca.pem).
        #[arg(long, value_name = "FILE", requires = "server")]
        ca_file: Option<PathBuf>,
        /// With --server: a file holding the bearer token to send (e.g.
        /// DATA_DIR/admin-token); never on the command line.
        #[arg(long, value_name = "FILE", requires = "server")]
        token_file: Option<PathBuf>,
        /// With --server: its process id, to report its memory.
        #[arg(long)]
        server_pid: Option<u32>,
        /// The started server's store: a PostgreSQL URL (default: the
        /// embedded store in a temporary directory).
        #[arg(long, value_name = "URL", conflicts_with_all = ["server", "postgres"])]
        store: Option<String>,
        /// Start a throwaway PostgreSQL (from the system's packages, fsync
        /// on) and put the started server's store on it.
        #[arg(long, conflicts_with = "server")]
        postgres: bool,
        /// A further flag for the started server (repeatable), e.g.
        /// `--server-arg=--commit-spacing-ms=0`.
        #[arg(
            long = "server-arg",
            allow_hyphen_values = true,
            conflicts_with = "server"
        )]
        server_args: Vec<String>,
        /// Start the server with --insecure: plaintext, no tokens, no
        /// roles or audit (to measure what security costs). By default it
        /// is secure, as pelotond is: TLS with the private CA it makes in
        /// its data dir, whose admin token the clients send.
        #[arg(long, conflicts_with = "server")]
        insecure: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A crash and restart: a server with `jobs × tasks_per_job` stored
    /// instances, as many running as the simulated hosts hold, is SIGKILLed
    /// and started again on its data dir; how soon it serves, schedules
    /// again, and runs everything it ran.
    Recovery {
        /// Simulated hosts (each holds 160 or 320 of these tasks: 1,000
        /// hosts hold 200,000).
        #[arg(long, default_value_t = 1_000)]
        hosts: u32,
        /// Jobs to submit.
        #[arg(long, default_value_t = 1_000)]
        jobs: u32,
        /// Instances per job.
        #[arg(long, default_value_t = 1_000)]
        tasks_per_job: u32,
        /// Concurrent submitting clients.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Start the server with --insecure: plaintext, no tokens, no
        /// roles or audit (to measure what security costs). By default it
        /// is secure, as pelotond is: TLS with the private CA it makes in
        /// its data dir, whose admin token the clients send.
        #[arg(long)]
        insecure: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A bounded history: many short simulated tasks through a started
    /// server with a small job retention; the server's RSS and store size
    /// after the first million tasks and at the end.
    History {
        /// Simulated hosts of the started server.
        #[arg(long, default_value_t = 1_000)]
        hosts: u32,
        /// Tasks to run in all.
        #[arg(long, default_value_t = 10_000_000)]
        tasks: u64,
        /// Instances per job.
        #[arg(long, default_value_t = 1_000)]
        job_size: u32,
        /// Unfinished jobs out at once.
        #[arg(long, default_value_t = 64)]
        window: u32,
        /// Concurrent clients.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// How long each simulated task runs, in ms.
        #[arg(long, default_value_t = 1)]
        sim_ms: u64,
        /// The server's --job-retention-s.
        #[arg(long, default_value_t = 1)]
        retention_s: u64,
        /// The server's --max-finished-jobs.
        #[arg(long, default_value_t = 100)]
        max_finished_jobs: u64,
        /// The server's --event-retention (default: the server's).
        #[arg(long)]
        event_retention: Option<u64>,
        /// Let the server go idle after every million tasks (not only the
        /// first) and sample it then.
        #[arg(long)]
        settle_every_million: bool,
        /// A further flag for the server (repeatable), e.g.
        /// `--server-arg=--store-cache-mb=8`.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
        /// Start the server with --insecure: plaintext, no tokens, no
        /// roles or audit (to measure what security costs). By default it
        /// is secure, as pelotond is: TLS with the private CA it makes in
        /// its data dir, whose admin token the clients send.
        #[arg(long)]
        insecure: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Real tasks: start the server and local agents, run one job of
    /// `/bin/true` instances, report launched-and-finished tasks per second
    /// and the server's CPU per task.
    Launch {
        /// Local agents to start.
        #[arg(long, default_value_t = 3)]
        agents: u32,
        /// Instances of the job.
        #[arg(long, default_value_t = 2_000)]
        tasks: u32,
        /// Put the agents' work dirs (sandboxes) under this directory, e.g.
        /// a tmpfs (default: next to the server's store, on the temp dir).
        #[arg(long)]
        agents_dir: Option<PathBuf>,
        /// A further flag for the server (repeatable), e.g.
        /// `--server-arg=--commit-spacing-ms=0`.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
        /// Start the server with --insecure: plaintext, no tokens, no
        /// roles or audit (to measure what security costs). By default it
        /// is secure, as pelotond is: TLS with the private CA it makes in
        /// its data dir, whose admin token the clients send, and the agents present certificates naming their hosts from that CA.
        #[arg(long)]
        insecure: bool,
        /// Bare execs of `/bin/true` (a loop on every CPU) measured just
        /// before the job and again just after it: the machine's bound of
        /// the minute to read the launch rate against (0: none).
        #[arg(long, default_value_t = 1_000)]
        bare_execs: u32,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Overcommit on slack with real tasks: start the server and local
    /// agents splitting the machine's CPUs, services reserving three
    /// quarters of every host and using next to nothing, then a revocable
    /// batch job of busy loops that runs only on what they lend; report the
    /// machine's CPU use before and with it, and, once the services' memory
    /// rises into the lent room, the time until every busy loop is gone and
    /// the service runs that failed.
    Overcommit {
        /// Local agents to start.
        #[arg(long, default_value_t = 3)]
        agents: u32,
        /// Memory each agent advertises, MiB.
        #[arg(long, default_value_t = 2048)]
        agent_memory_mb: u64,
        /// The agents' usage report interval, seconds.
        #[arg(long, default_value_t = 1)]
        report_interval: u64,
        /// Seconds each CPU measurement lasts.
        #[arg(long, default_value_t = 5)]
        window: u64,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Rolling update of a service through gRPC: start a server with
    /// simulated hosts, run a service of `instances`, update every instance
    /// to a new spec `batch_size` at a time; report the seconds the update
    /// took and the scheduling loop's CPU per instance updated.
    Update {
        /// Simulated hosts of the started server.
        #[arg(long, default_value_t = 10_000)]
        hosts: u32,
        /// Instances of the service.
        #[arg(long, default_value_t = 10_000)]
        instances: u32,
        /// Instances updated at once.
        #[arg(long, default_value_t = 500)]
        batch_size: u32,
        /// Start the server with --insecure: plaintext, no tokens, no
        /// roles or audit (to measure what security costs). By default it
        /// is secure, as pelotond is: TLS with the private CA it makes in
        /// its data dir, whose admin token the clients send.
        #[arg(long)]
        insecure: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Spark-like executors through the application API: a target jump
    /// 0 → N on a fresh application, on simulated hosts (time to the first
    /// and to all N running) and on local agents with this bench as the
    /// driver (time to the first and all N executors registered back over
    /// TCP); then unregister and check every executor ended.
    Spark {
        /// Simulated hosts of the first part (0 skips it).
        #[arg(long, default_value_t = 100)]
        hosts: u32,
        /// Local agents of the second part (0 skips it).
        #[arg(long, default_value_t = 3)]
        agents: u32,
        /// The executor target.
        #[arg(long, default_value_t = 100)]
        executors: u32,
        /// Longest wait of any phase, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout_s: u64,
        /// Start the server with --insecure: plaintext, no tokens, no
        /// roles or audit (to measure what security costs). By default it
        /// is secure, as pelotond is: TLS with the private CA it makes in
        /// its data dir, whose admin token the clients send, and the agents present certificates naming their hosts from that CA.
        #[arg(long)]
        insecure: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The engine's forecast (when and where waiting tasks would start):
    /// its cost on a large synthetic cluster, and, with `--trace`, its
    /// accuracy replaying the Alibaba 2017 batch trace (forecast starts of
    /// waiting jobs against their starts in the replay, with true and with
    /// learned durations).
    Forecast {
        /// Simulated hosts (32 cores, 128 GiB each) of the cost part.
        #[arg(long, default_value_t = 10_000)]
        hosts: usize,
        /// Tasks running when the forecast is made (½–2 cores each).
        #[arg(long, default_value_t = 200_000)]
        running: usize,
        /// Tasks queued when it is made (jobs of 1–8 core tasks and gangs
        /// of half or whole hosts).
        #[arg(long, default_value_t = 100_000)]
        waiting: usize,
        /// Leaf pools of the cost part.
        #[arg(long, default_value_t = 4)]
        pools: usize,
        /// Timed forecasts of the cost part.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Skip the cost part.
        #[arg(long)]
        no_cost: bool,
        /// Compare the cost part's forecast with one that takes every end
        /// as its own step (no step window), bounded by this many steps (0:
        /// no comparison).
        #[arg(long, default_value_t = 0)]
        no_window_steps: u32,
        /// The forecasts' step bound (ForecastConfig::max_steps).
        #[arg(long, default_value_t = ForecastConfig::default().max_steps)]
        max_steps: u32,
        /// The forecasts' shortest step window, ms (min_step_ms).
        #[arg(long, default_value_t = ForecastConfig::default().min_step_ms)]
        min_step_ms: u64,
        /// The forecasts' resolution: a step further ahead also takes the
        /// ends within 1/resolution of the time from now.
        #[arg(long, default_value_t = ForecastConfig::default().resolution)]
        resolution: u32,
        /// The Alibaba 2017 trace's directory (server_event.csv,
        /// batch_task.csv), e.g. ../shared/traces/alibaba-v2017: replay it
        /// and report the forecast's accuracy.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Replay this fraction of each job's instances (rounded up).
        #[arg(long, default_value_t = 0.05)]
        scale: f64,
        /// Replay this fraction of the trace's machines. The trace's
        /// durations are end − create, its own waits included, and memory
        /// requests bind: at the same fraction as --scale the replay's
        /// memory is asked 1.9 times over and jobs queue for hours; at the
        /// default (158 machines) ≈ 0.8 on average, and jobs that wait wait
        /// a median of 21 minutes.
        #[arg(long, default_value_t = 0.12)]
        machine_scale: f64,
        /// At most this many instances per job (after --scale).
        #[arg(long, default_value_t = 1_000)]
        max_instances: u32,
        /// Replay only the jobs created in the first this many seconds of
        /// the trace (default: all, 61,259 s).
        #[arg(long, default_value_t = 86_400)]
        window: u64,
        /// Forecast every this many simulated seconds.
        #[arg(long, default_value_t = 60)]
        every: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Big gangs among small jobs (the workload of scripts/bigsmall/):
    /// the engine in simulated time with reservations and backfill and
    /// without, beside Slurm's figures on the same workload.
    Bigsmall {
        /// The workload CSV (scripts/bigsmall/gen.py writes it).
        #[arg(long, default_value = "scripts/bigsmall/workload.csv")]
        trace: PathBuf,
        /// Hosts of the cluster.
        #[arg(long, default_value_t = 16)]
        hosts: usize,
        /// Cores of each host.
        #[arg(long, default_value_t = 8)]
        cores: u64,
        /// Slurm's results on the same workload (scripts/bigsmall/slurm.sh
        /// writes them), shown beside if the file exists.
        #[arg(long, default_value = "scripts/bigsmall/slurm-results.json")]
        slurm: PathBuf,
        /// Skip the forecasts made at each submission.
        #[arg(long)]
        no_forecasts: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Capacity planning: replay a cluster snapshot (`peloton cluster
    /// snapshot DIR`) through the engine, as it is and with each change
    /// (hosts added or removed, a pool's reservation, limit, share or
    /// kind, backfill), and report waits, utilization and fairness side
    /// by side — if nothing else is submitted.
    Whatif {
        /// The snapshot's directory (hosts.arrow, pools.arrow, tasks.arrow).
        #[arg(long)]
        snapshot: PathBuf,
        /// Add N hosts shaped like HOST (default: the most common shape of
        /// the up hosts): N or N:HOST. Repeat for several variants.
        #[arg(long, value_name = "N[:HOST]")]
        add_hosts: Vec<String>,
        /// Take away the N least loaded up hosts (their tasks queue again).
        #[arg(long, value_name = "N")]
        remove_hosts: Vec<String>,
        /// Change a pool: PATH:KEY=VALUE[,KEY=VALUE…], KEY one of
        /// reservation.DIM, limit.DIM (0: no limit), share, kind
        /// (elastic|static); DIM cpu, memory_mb, disk_mb or gpu (cores,
        /// MiB, GPUs, as `peloton respool`).
        #[arg(long, value_name = "PATH:KEY=VALUE")]
        pool: Vec<String>,
        /// Backfill on, off, or on with at most N reservations a cycle
        /// (the baseline's is the engine's default: on).
        #[arg(long, value_name = "on|off|N")]
        backfill: Vec<String>,
        /// Simulated time replayed at most (d, h, m, s or ms).
        #[arg(long, default_value = "7d")]
        horizon: String,
        /// Moments (task ends) replayed at most.
        #[arg(long, default_value_t = 1_000_000)]
        max_steps: u64,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A short tour: entitlement and admission at moderate sizes.
    Demo {
        #[command(flatten)]
        common: Common,
    },
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn main() -> Result<()> {
    // The engine is measured as `pelotond` runs it: without transparent
    // huge pages (see its main). With them, the allocator's churn of
    // huge-page-advised memory costs the placement benchmark a quarter of
    // its time in the kernel zeroing and compacting pages, and its figures
    // vary by a third from run to run with the kernel's memory state.
    let _ = nix::sys::prctl::set_thp_disable(true);
    let cli = Cli::parse();
    match cli.command {
        Command::Entitlement {
            pools,
            depth,
            iterations,
            common,
        } => {
            let report = entitlement(pools, depth, iterations, common)?;
            print(&report, common.json, "entitlement");
        }
        Command::Admission {
            pools,
            tasks,
            depth,
            capacity_fraction,
            common,
        } => {
            let report = admission(pools, tasks, depth, capacity_fraction, common)?;
            print(&report, common.json, "admission");
        }
        Command::Placement {
            hosts,
            tasks,
            strategy,
            no_gpu_aware,
            common,
        } => {
            let report = placement(hosts, tasks, &strategy, !no_gpu_aware, common)?;
            print(&report, common.json, "placement");
        }
        Command::TraceGpu {
            nodes,
            pods,
            inflate,
            seeds,
            strategies,
            all,
            json,
        } => {
            if !(inflate > 0.0 && inflate <= 10.0) {
                bail!("--inflate must be in (0, 10]");
            }
            let seeds = parse_seeds(&seeds)?;
            let strategies = match strategies {
                None if all.is_some() => vec![
                    trace::TraceStrategy::GpuFrag,
                    trace::TraceStrategy::GpuFragLearned,
                ],
                None => trace::TraceStrategy::ALL.to_vec(),
                Some(list) => list
                    .split(',')
                    .map(|s| trace::TraceStrategy::parse(s.trim()))
                    .collect::<Result<Vec<_>>>()?,
            };
            if let Some(dir) = all {
                let report = trace::replay_all(&dir, inflate, &seeds, &strategies)?;
                if json {
                    let mut value = serde_json::to_value(&report)?;
                    value["benchmark"] = json!("trace-gpu --all");
                    value["inflate"] = json!(inflate);
                    println!("{}", serde_json::to_string_pretty(&value)?);
                } else {
                    print!("{}", trace::all_table(&report));
                }
                return Ok(());
            }
            let (Some(nodes), Some(pods)) = (nodes, pods) else {
                bail!("trace-gpu needs --nodes and --pods, or --all DIR");
            };
            let node_specs = trace::read_nodes(&nodes)?;
            let pod_list = trace::read_pods(&pods)?;
            let mut results = Vec::new();
            for &strategy in &strategies {
                let mut runs = Vec::new();
                for &seed in &seeds {
                    let run = trace::replay(&node_specs, &pod_list, inflate, seed, strategy)?;
                    if !json {
                        println!(
                            "{:<17} seed {:>4}: unallocated at 100% arrived {:>6.2}%  (first GPU failure at {:.2}% allocated, end {:.2}%)  {:.2} s",
                            strategy.name(),
                            seed,
                            run.unallocated_pct_at_100,
                            100.0 * run.gpu_alloc_rate_first_failure,
                            100.0 * run.gpu_alloc_rate_end,
                            run.run_seconds
                        );
                    }
                    runs.push(run);
                }
                let n = runs.len() as f64;
                let mean = runs.iter().map(|r| r.unallocated_pct_at_100).sum::<f64>() / n;
                let seconds = runs.iter().map(|r| r.run_seconds).sum::<f64>();
                if !json {
                    println!(
                        "{:<17} mean over {} seeds: unallocated at 100% arrived {:.2}%  ({:.1} s in all)",
                        strategy.name(),
                        runs.len(),
                        mean,
                        seconds
                    );
                }
                results.push(json!({
                    "strategy": strategy.name(),
                    "mean_unallocated_pct_at_100": mean,
                    "run_seconds": seconds,
                    "runs": serde_json::to_value(&runs)?,
                }));
            }
            if json {
                let report = json!({
                    "benchmark": "trace-gpu",
                    "nodes": node_specs.len(),
                    "pods_in_trace": pod_list.len(),
                    "inflate": inflate,
                    "seeds": seeds,
                    "strategies": results,
                });
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
        }
        Command::E2e {
            hosts,
            jobs,
            tasks_per_job,
            clients,
            server,
            ca_file,
            token_file,
            server_pid,
            store,
            postgres,
            server_args,
            insecure,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(e2e::run(e2e::E2eOptions {
                hosts,
                jobs,
                tasks_per_job,
                clients,
                server,
                server_pid,
                store,
                postgres,
                server_args,
                insecure,
                ca_file,
                token_file,
            }))?;
            print(&report, json, "e2e");
        }
        Command::Recovery {
            hosts,
            jobs,
            tasks_per_job,
            clients,
            insecure,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(recovery::run(recovery::RecoveryOptions {
                hosts,
                jobs,
                tasks_per_job,
                clients,
                insecure,
            }))?;
            print(&report, json, "recovery");
        }
        Command::History {
            hosts,
            tasks,
            job_size,
            window,
            clients,
            sim_ms,
            retention_s,
            max_finished_jobs,
            event_retention,
            settle_every_million,
            server_args,
            insecure,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(history::run(history::HistoryOptions {
                hosts,
                tasks,
                job_size,
                window,
                clients,
                sim_ms,
                retention_s,
                max_finished_jobs,
                event_retention,
                settle_every_million,
                server_args,
                insecure,
            }))?;
            print(&report, json, "history");
        }
        Command::Launch {
            agents,
            tasks,
            agents_dir,
            server_args,
            insecure,
            bare_execs,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(launch::run(launch::LaunchOptions {
                agents,
                tasks,
                agents_dir,
                server_args,
                insecure,
                bare_execs,
            }))?;
            print(&report, json, "launch");
        }
        Command::Overcommit {
            agents,
            agent_memory_mb,
            report_interval,
            window,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(overcommit::run(overcommit::OvercommitOptions {
                agents,
                agent_memory_mb,
                report_interval_s: report_interval,
                window_s: window,
            }))?;
            print(&report, json, "overcommit");
        }
        Command::Update {
            hosts,
            instances,
            batch_size,
            insecure,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(update::run(update::UpdateOptions {
                hosts,
                instances,
                batch_size,
                insecure,
            }))?;
            print(&report, json, "update");
        }
        Command::Spark {
            hosts,
            agents,
            executors,
            timeout_s,
            insecure,
            json,
        } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let report = rt.block_on(spark::run(spark::SparkOptions {
                hosts,
                agents,
                executors,
                timeout: Duration::from_secs(timeout_s),
                insecure,
            }))?;
            print(&report, json, "spark");
        }
        Command::Forecast {
            hosts,
            running,
            waiting,
            pools,
            runs,
            no_cost,
            no_window_steps,
            max_steps,
            min_step_ms,
            resolution,
            trace,
            scale,
            machine_scale,
            max_instances,
            window,
            every,
            common,
        } => {
            if max_steps == 0 || resolution == 0 {
                bail!("--max-steps and --resolution must be at least 1");
            }
            let config = ForecastConfig {
                max_steps,
                min_step_ms,
                resolution,
                ..ForecastConfig::default()
            };
            let mut report = json!({ "benchmark": "forecast" });
            if !no_cost {
                let cost = forecast::cost(&forecast::CostOptions {
                    hosts,
                    running,
                    waiting,
                    pools,
                    runs,
                    seed: common.seed,
                    threads: common.threads,
                    no_window_max_steps: no_window_steps,
                    config,
                })?;
                if !common.json {
                    print(&cost, false, "forecast: cost");
                }
                report["cost"] = cost;
            }
            if let Some(dir) = trace {
                let scale = forecast::TraceScale {
                    scale,
                    machine_scale,
                    max_instances,
                    window_s: window,
                };
                let accuracy =
                    forecast::accuracy_on_trace(&dir, &scale, every, &config, common.threads)?;
                if !common.json {
                    forecast::print_accuracy(&accuracy);
                }
                report["accuracy"] = accuracy;
            }
            if common.json {
                println!("{report}");
            }
        }
        Command::Bigsmall {
            trace,
            hosts,
            cores,
            slurm,
            no_forecasts,
            json,
        } => {
            if hosts == 0 || cores == 0 {
                bail!("--hosts and --cores must be at least 1");
            }
            let jobs = bigsmall::read_workload(&trace)?;
            let cluster = bigsmall::Cluster { hosts, cores };
            let mut rows = Vec::new();
            for backfill in [false, true] {
                rows.push(bigsmall::replay(&jobs, cluster, backfill, !no_forecasts)?);
            }
            if slurm.exists() {
                let text = std::fs::read_to_string(&slurm)
                    .with_context(|| format!("read {}", slurm.display()))?;
                let v: Value = serde_json::from_str(&text)
                    .with_context(|| format!("parse {}", slurm.display()))?;
                let slurm_rows = rows.len();
                match v {
                    Value::Array(items) => rows.extend(items),
                    Value::Object(ref map) if map.contains_key("policy") => rows.push(v),
                    Value::Object(map) => rows.extend(map.into_iter().map(|(k, mut r)| {
                        if r.get("policy").is_none() {
                            r["policy"] = json!(k);
                        }
                        r
                    })),
                    _ => bail!("{}: not a JSON array or object", slurm.display()),
                }
                for r in &mut rows[slurm_rows..] {
                    let name = r.get("policy").and_then(Value::as_str).unwrap_or("?");
                    r["policy"] = json!(format!("slurm-{name}"));
                }
            }
            if json {
                println!("{}", json!({ "benchmark": "bigsmall", "results": rows }));
            } else {
                println!(
                    "big gangs among small jobs: {} jobs on {hosts} hosts x {cores} cores ({})\n",
                    jobs.len(),
                    trace.display()
                );
                bigsmall::print_table(&rows);
            }
        }
        Command::Whatif {
            snapshot,
            add_hosts,
            remove_hosts,
            pool,
            backfill,
            horizon,
            max_steps,
            json,
        } => {
            let mut changes = Vec::new();
            for a in &add_hosts {
                changes.push(whatif::parse_add_hosts(a)?);
            }
            for r in &remove_hosts {
                changes.push(whatif::parse_remove_hosts(r)?);
            }
            for p in &pool {
                changes.push(whatif::parse_pool(p)?);
            }
            for b in &backfill {
                changes.push(whatif::parse_backfill(b)?);
            }
            if max_steps == 0 || max_steps > 100_000_000 {
                bail!("--max-steps {max_steps}: must be 1 to 100000000");
            }
            let bounds = whatif::Bounds {
                horizon_ms: whatif::parse_duration_ms(&horizon)?,
                max_steps,
            };
            let report = whatif::run(&snapshot, &changes, bounds)?;
            if json {
                println!("{report}");
            } else {
                whatif::print_table(&report);
            }
        }
        Command::Demo { common } => {
            if !common.json {
                println!(
                    "Peloton engine demo: synthetic pool trees and workloads (seed {}).\n",
                    common.seed
                );
            }
            let e = entitlement(10_000, 4, 200, common)?;
            print(
                &e,
                common.json,
                "entitlement: 10,000 pools, 4 levels, 4 dimensions",
            );
            if !common.json {
                println!();
            }
            let a = admission(1_000, 200_000, 4, 0.7, common)?;
            print(&a, common.json, "admission: 1,000 pools, 200,000 tasks");
            if !common.json {
                println!();
            }
            let p = placement(10_000, 200_000, "pack", true, common)?;
            print(
                &p,
                common.json,
                "placement: 10,000 hosts, 200,000 tasks, pack",
            );
        }
    }
    Ok(())
}

fn check_sizes(pools: usize, depth: usize) -> Result<()> {
    if !(2..=peloton_engine::pool::DEFAULT_MAX_POOLS).contains(&pools) {
        bail!(
            "--pools must be between 2 and {}",
            peloton_engine::pool::DEFAULT_MAX_POOLS
        );
    }
    if !(2..=peloton_engine::pool::MAX_DEPTH).contains(&depth) {
        bail!(
            "--depth must be between 2 and {}",
            peloton_engine::pool::MAX_DEPTH
        );
    }
    Ok(())
}

/// A manager sized for the workload: queue bounds as large as the task
/// count, so a few pools can hold many tasks.
fn manager(pools: usize, tasks: usize, threads: usize) -> ResourceManager {
    let defaults = AdmissionLimits::default();
    ResourceManager::new(ResourceManagerConfig {
        pools: PoolTreeLimits {
            max_pools: pools.max(2),
        },
        admission: AdmissionLimits {
            max_queued_per_pool: defaults.max_queued_per_pool.max(tasks),
            max_queued_total: defaults.max_queued_total.max(tasks),
            ..defaults
        },
        threads,
    })
}

fn entitlement(pools: usize, depth: usize, iterations: usize, common: Common) -> Result<Value> {
    check_sizes(pools, depth)?;
    if iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let mut rng = Rng::new(common.seed);
    let capacity = bench_capacity();
    let mut rm = manager(pools, 0, 1);
    let leaves = build_random_tree(&mut rm, &TreeSpec::new(pools, depth, capacity), &mut rng);
    let tree = rm.tree();
    // A few demand snapshots, cycled, so each recomputation sees new demand.
    let snapshots: Vec<EntitlementInput> = (0..8)
        .map(|_| {
            let mut input = EntitlementInput::default();
            random_leaf_demand(tree, &leaves, capacity, &mut rng, &mut input);
            input
        })
        .collect();
    let threads = thread_pool(common.threads)?;
    let mut calculator = EntitlementCalculator::new();
    let mut out = Entitlements::default();
    // Warm-up builds the plan and sizes every buffer.
    calculator.compute(tree, &snapshots[0], &mut out, threads.as_ref());
    check_entitlement_invariants(tree, &snapshots[0], &out);
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let input = &snapshots[i % snapshots.len()];
        let start = Instant::now();
        calculator.compute(tree, input, &mut out, threads.as_ref());
        samples.push(start.elapsed());
    }
    check_entitlement_invariants(tree, &snapshots[(iterations - 1) % snapshots.len()], &out);
    let stats = Stats::of(&mut samples);
    Ok(json!({
        "benchmark": "entitlement",
        "pools": tree.len(),
        "leaves": leaves.len(),
        "depth": depth,
        "dimensions": peloton_engine::N_DIMS,
        "threads": common.threads,
        "seed": common.seed,
        "iterations": iterations,
        "ms_per_recompute": stats.mean_ms,
        "ms_p50": stats.p50_ms,
        "ms_p99": stats.p99_ms,
        "ms_min": stats.min_ms,
        "invariants": "ok",
        "peak_rss_mb": peak_rss_mb(),
    }))
}

fn admission(
    pools: usize,
    tasks: usize,
    depth: usize,
    capacity_fraction: f64,
    common: Common,
) -> Result<Value> {
    check_sizes(pools, depth)?;
    let max_tasks = peloton_engine::admission::DEFAULT_MAX_QUEUED_TOTAL;
    if tasks == 0 || tasks > max_tasks {
        bail!("--tasks must be between 1 and {max_tasks}");
    }
    if !(capacity_fraction > 0.0 && capacity_fraction <= 10.0) {
        bail!("--capacity-fraction must be in (0, 10]");
    }
    let mut rng = Rng::new(common.seed);
    let mut rm = manager(pools, tasks, common.threads);
    let spec = TreeSpec::new(pools, depth, bench_capacity());
    let leaves = build_random_tree(&mut rm, &spec, &mut rng);

    let start = Instant::now();
    let demand = enqueue_random_tasks(&mut rm, &leaves, tasks, &mut rng)
        .context("queueing the generated tasks")?;
    let enqueue = start.elapsed();

    let capacity = Resources(std::array::from_fn(|d| {
        (demand.0[d] as f64 * capacity_fraction) as u64
    }));
    let slack = capacity.percent(10.0);
    let start = Instant::now();
    rm.recompute_entitlement(capacity, slack);
    let recompute = start.elapsed();

    // A scheduler reuses its output buffers from cycle to cycle; touch this
    // one once so the timing is of admission, not of first-touch page faults.
    let mut result = AdmissionResult::default();
    let placeholder = peloton_engine::Admitted {
        task: peloton_engine::TaskId(0),
        pool: rm.tree().root(),
        class: peloton_engine::TaskClass::Normal,
        controller: false,
        request: Resources::ZERO,
    };
    result.admitted.resize(tasks, placeholder);
    let start = Instant::now();
    rm.admit(&mut result);
    let admit = start.elapsed();
    rm.check_invariants();
    peloton_engine::testkit::check_admission(&rm, &result);

    let admitted = result.admitted.len();
    let waiting: u64 = rm
        .tree()
        .list()
        .iter()
        .map(|&p| rm.usage(p).map_or(0, |u| u.n_queued))
        .sum();
    if admitted as u64 + waiting != tasks as u64 {
        bail!("accounting mismatch: {admitted} admitted + {waiting} waiting != {tasks} queued");
    }
    Ok(json!({
        "benchmark": "admission",
        "pools": rm.tree().len(),
        "leaves": leaves.len(),
        "tasks": tasks,
        "threads": common.threads,
        "seed": common.seed,
        "admitted": admitted,
        "waiting": waiting,
        "blocked_queues": result.blocked.len(),
        "enqueue_ms": ms(enqueue),
        "enqueues_per_s": per_s(tasks, enqueue),
        "recompute_ms": ms(recompute),
        "admit_ms": ms(admit),
        "admissions_per_s": per_s(admitted, admit),
        "example_reason": result.blocked.first().map(|b| format!("{}: {b}", rm.tree().path(b.pool))),
        "invariants": "ok",
        "peak_rss_mb": peak_rss_mb(),
    }))
}

fn placement(
    n_hosts: usize,
    n_tasks: usize,
    strategy: &str,
    gpu_aware: bool,
    common: Common,
) -> Result<Value> {
    use peloton_engine::placement::{MAX_BATCH, PlacementConfig, PlacementResult, Placer};
    use peloton_engine::task::Strategy;
    if !(1..=1_000_000).contains(&n_hosts) {
        bail!("--hosts must be between 1 and 1000000");
    }
    if !(1..=MAX_BATCH * 10).contains(&n_tasks) {
        bail!("--tasks must be between 1 and {}", MAX_BATCH * 10);
    }
    let strategy = match strategy {
        "pack" => Strategy::Pack,
        "spread" => Strategy::Spread,
        "first_fit" => Strategy::FirstFit,
        "gpu_frag" => Strategy::GpuFrag,
        other => bail!("--strategy must be pack, spread, first_fit or gpu_frag, not {other:?}"),
    };
    let start = Instant::now();
    let mut w =
        peloton_engine::testkit::placement_workload(n_hosts, n_tasks, strategy, common.seed);
    let generate = start.elapsed();
    // A second copy of the same cluster and tasks: the placer first places
    // the cold copy (its buffers empty, as after a restart), then the warm
    // one with the buffers the first run sized, as a scheduler's long-lived
    // placer does. The cold copy's tasks are taken off their hosts again
    // (untimed), so the placer's per-host instance counts are empty; the
    // copy is a new host arena, so every shape is built again. The GPU mix
    // learned from the cold run's tasks stays (they are the same tasks).
    let mut cold =
        peloton_engine::testkit::placement_workload(n_hosts, n_tasks, strategy, common.seed);
    let mut placer = Placer::new(PlacementConfig {
        gpu_aware,
        ..Default::default()
    })
    .with_threads(common.threads);
    let mut out = PlacementResult::default();
    out.placed.reserve(n_tasks);
    let start = Instant::now();
    let mut cold_placed = 0;
    let mut cold_tasks = Vec::with_capacity(n_tasks);
    for chunk in cold.batch.chunks(MAX_BATCH) {
        placer
            .place(
                &mut cold.hosts,
                &mut cold.tasks,
                &cold.constraints,
                chunk,
                0,
                &mut out,
            )
            .context("placing a batch")?;
        cold_placed += out.placed.len();
        cold_tasks.extend(out.placed.iter().map(|p| p.task));
    }
    let cold_elapsed = start.elapsed();
    for task in cold_tasks {
        placer
            .unplace(&mut cold.hosts, &mut cold.tasks, task)
            .context("taking a cold run's task off its host")?;
    }
    drop(cold);
    let start = Instant::now();
    // Batches of at most MAX_BATCH tasks, as a scheduler would feed them.
    let mut placed = 0;
    let mut unplaced = 0;
    let mut example_reason = None;
    let mut stats = Vec::new();
    let mut batch_ms = Vec::new();
    for chunk in w.batch.chunks(MAX_BATCH) {
        let batch_start = Instant::now();
        placer
            .place(
                &mut w.hosts,
                &mut w.tasks,
                &w.constraints,
                chunk,
                0,
                &mut out,
            )
            .context("placing a batch")?;
        batch_ms.push(ms(batch_start.elapsed()));
        placed += out.placed.len();
        unplaced += out.unplaced.len();
        stats.push(placer.stats());
        if example_reason.is_none() {
            example_reason = out
                .unplaced
                .first()
                .map(|u| out.reason_of(u).describe(&w.hosts, &w.constraints));
        }
    }
    let elapsed = start.elapsed();
    w.hosts.check_invariants();
    let gpu_capacity: u64 = (0..w.hosts.n_slots())
        .map(|s| w.hosts.capacity(s).0[3])
        .sum();
    let gpu_free: u64 = (0..w.hosts.n_slots()).map(|s| w.hosts.free(s).0[3]).sum();
    Ok(json!({
        "benchmark": "placement",
        "hosts": n_hosts,
        "tasks": n_tasks,
        "strategy": strategy.name(),
        "gpu_aware": gpu_aware,
        "threads": common.threads,
        "seed": common.seed,
        "placed": placed,
        "unplaced": unplaced,
        "place_ms": ms(elapsed),
        "placements_per_s": per_s(placed, elapsed),
        "tasks_per_s": per_s(n_tasks, elapsed),
        "cold_place_ms": ms(cold_elapsed),
        "cold_tasks_per_s": per_s(n_tasks, cold_elapsed),
        "cold_placed": cold_placed,
        "generate_ms": ms(generate),
        "gpu_alloc_rate": if gpu_capacity > 0 { (gpu_capacity - gpu_free) as f64 / gpu_capacity as f64 } else { 0.0 },
        "example_reason": example_reason,
        "peak_rss_mb": peak_rss_mb(),
        "batches": stats.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>(),
        "batch_ms": batch_ms,
    }))
}

fn thread_pool(threads: usize) -> Result<Option<rayon::ThreadPool>> {
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    if threads == 1 {
        return Ok(None);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting the benchmark thread pool")?;
    Ok(Some(pool))
}

struct Stats {
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    min_ms: f64,
}

impl Stats {
    fn of(samples: &mut [Duration]) -> Stats {
        samples.sort();
        let n = samples.len();
        let total: Duration = samples.iter().sum();
        Stats {
            mean_ms: ms(total) / n as f64,
            p50_ms: ms(samples[n / 2]),
            p99_ms: ms(samples[(n * 99 / 100).min(n - 1)]),
            min_ms: ms(samples[0]),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn per_s(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// Peak resident set size of this process (VmHWM), in MiB; 0 where
/// `/proc` is unavailable.
pub(crate) fn peak_rss_mb() -> f64 {
    proc_status_mb("self", "VmHWM:")
}

/// A memory field (e.g. `VmHWM:`, `VmRSS:`) of `/proc/<process>/status`,
/// in MiB; 0 where it cannot be read.
fn proc_status_mb(process: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{process}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn print(report: &Value, as_json: bool, title: &str) {
    if as_json {
        println!("{report}");
        return;
    }
    println!("{title}");
    let Value::Object(map) = report else { return };
    let width = map.keys().map(String::len).max().unwrap_or(0);
    println!("  {:-<width$}-+-{:-<24}", "", "");
    for (key, value) in map {
        let shown = match value {
            Value::Number(n) if n.is_f64() => {
                let v = n.as_f64().unwrap_or(0.0);
                if v >= 1000.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.3}")
                }
            }
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        println!("  {key:<width$} | {shown}");
    }
}

/// Parses `--seeds`: `FIRST..LAST` (inclusive) or one number.
fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    let parse = |s: &str| {
        s.trim()
            .parse::<u64>()
            .with_context(|| format!("--seeds: {s:?} is not a number"))
    };
    let seeds: Vec<u64> = match text.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (parse(a)?, parse(b.trim_start_matches('='))?);
            if b < a {
                bail!("--seeds: {a}..{b} is empty");
            }
            (a..=b).collect()
        }
        None => vec![parse(text)?],
    };
    if seeds.len() > 1000 {
        bail!("--seeds: at most 1000 seeds");
    }
    Ok(seeds)
}
