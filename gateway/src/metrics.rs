//! Prometheus metrics, served as text over HTTP at `/metrics`.
//!
//! The loop thread updates them; the HTTP handler only encodes. Per-pool
//! series are bounded: only the first `max_pools` pools in path order get
//! them (label cardinality must not grow with the workload).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of per-pool series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// Pool path.
    pub pool: String,
}

/// Labels of per-pool, per-dimension series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolDimLabels {
    /// Pool path.
    pub pool: String,
    /// cpu, memory, disk or gpu.
    pub dim: String,
}

/// Every metric of the service.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Duration of a scheduling cycle.
    pub cycle_seconds: Histogram,
    /// Duration of a store commit.
    pub commit_seconds: Histogram,
    /// Tasks placed.
    pub placements: Counter,
    /// Admitted tasks a cycle could not place (counted once per cycle).
    pub placement_failures: Counter,
    /// Tasks accepted in created or scaled jobs.
    pub tasks_accepted: Counter,
    /// Runs that ended, by final state is not broken down (bounded labels).
    pub runs_finished: Counter,
    /// Tasks preempted.
    pub preemptions: Counter,
    /// Pending (queued) tasks per pool.
    pub pending_tasks: Family<PoolLabels, Gauge>,
    /// Entitlement per pool and dimension (engine units).
    pub entitlement: Family<PoolDimLabels, Gauge>,
    /// Allocation per pool and dimension.
    pub allocation: Family<PoolDimLabels, Gauge>,
    /// Demand per pool and dimension.
    pub demand: Family<PoolDimLabels, Gauge>,
    /// Measured usage per pool and dimension (the current runs of its
    /// subtree, as agents report them).
    pub used: Family<PoolDimLabels, Gauge>,
    /// Live jobs.
    pub jobs: Gauge,
    /// Live hosts that are up.
    pub hosts_up: Gauge,
    /// Watch streams open.
    pub watch_streams: Gauge,
    /// Events waiting in watch streams' buffers for their clients.
    pub watch_buffered_events: Gauge,
    /// Bytes of watch streams' buffers (all watches' together at most
    /// `watch_memory_mb`).
    pub watch_buffered_bytes: Gauge,
    /// 1 while the store cannot write (a commit failed and is retried;
    /// writes are refused), else 0.
    pub store_unwritable: Gauge,
    /// Most pools that get per-pool series.
    pub max_pools: usize,
}

impl Metrics {
    /// Registers everything.
    pub fn new(max_pools: usize) -> Self {
        let mut registry = Registry::with_prefix("peloton");
        let cycle_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        let commit_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            cycle_seconds,
            commit_seconds,
            placements: Counter::default(),
            placement_failures: Counter::default(),
            tasks_accepted: Counter::default(),
            runs_finished: Counter::default(),
            preemptions: Counter::default(),
            pending_tasks: Family::default(),
            entitlement: Family::default(),
            allocation: Family::default(),
            demand: Family::default(),
            used: Family::default(),
            jobs: Gauge::default(),
            hosts_up: Gauge::default(),
            watch_streams: Gauge::default(),
            watch_buffered_events: Gauge::default(),
            watch_buffered_bytes: Gauge::default(),
            store_unwritable: Gauge::default(),
            max_pools,
        };
        registry.register(
            "watch_streams",
            "Watch streams open",
            m.watch_streams.clone(),
        );
        registry.register(
            "watch_buffered_events",
            "Events waiting in watch streams' buffers for their clients",
            m.watch_buffered_events.clone(),
        );
        registry.register(
            "watch_buffered_bytes",
            "Bytes of the events waiting in watch streams' buffers (at most watch_memory_mb together)",
            m.watch_buffered_bytes.clone(),
        );
        registry.register(
            "cycle_duration_seconds",
            "Duration of one scheduling cycle (entitlement, admission, placement, preemption)",
            m.cycle_seconds.clone(),
        );
        registry.register(
            "store_commit_duration_seconds",
            "Duration of one durable store commit (a group of requests)",
            m.commit_seconds.clone(),
        );
        registry.register("placements", "Tasks placed on hosts", m.placements.clone());
        registry.register(
            "placement_failures",
            "Admitted tasks a cycle could not place, per cycle",
            m.placement_failures.clone(),
        );
        registry.register(
            "tasks_accepted",
            "Task instances accepted in created or scaled jobs",
            m.tasks_accepted.clone(),
        );
        registry.register(
            "runs_finished",
            "Task runs that ended",
            m.runs_finished.clone(),
        );
        registry.register("preemptions", "Task runs preempted", m.preemptions.clone());
        registry.register(
            "pool_pending_tasks",
            "Tasks queued for admission per pool",
            m.pending_tasks.clone(),
        );
        registry.register(
            "pool_entitlement",
            "Entitlement per pool and dimension (millicores, MiB, MiB, milli-GPUs)",
            m.entitlement.clone(),
        );
        registry.register(
            "pool_allocation",
            "Allocation per pool and dimension (millicores, MiB, MiB, milli-GPUs)",
            m.allocation.clone(),
        );
        registry.register(
            "pool_demand",
            "Demand per pool and dimension (millicores, MiB, MiB, milli-GPUs)",
            m.demand.clone(),
        );
        registry.register(
            "pool_used",
            "Measured usage of the current runs of a pool's subtree per dimension \
             (millicores, MiB, MiB; GPUs are not measured): compare with pool_allocation \
             and pool_entitlement",
            m.used.clone(),
        );
        registry.register("jobs", "Jobs known to the server", m.jobs.clone());
        registry.register("hosts_up", "Hosts that take new tasks", m.hosts_up.clone());
        registry.register(
            "store_unwritable",
            "1 while the store cannot write: writes are refused, the failed commit is retried",
            m.store_unwritable.clone(),
        );
        *m.registry.lock().expect("not poisoned") = registry;
        m
    }

    /// Drops a deleted pool's series.
    pub fn forget_pool(&self, path: &str) {
        self.pending_tasks.remove(&PoolLabels {
            pool: path.to_string(),
        });
        for dim in ["cpu", "memory", "disk", "gpu"] {
            let labels = PoolDimLabels {
                pool: path.to_string(),
                dim: dim.to_string(),
            };
            self.entitlement.remove(&labels);
            self.allocation.remove(&labels);
            self.demand.remove(&labels);
            self.used.remove(&labels);
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().expect("not poisoned");
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}
