//! Replays the Alibaba GPU trace (cluster-trace-gpu-v2023, "openb") with the
//! methodology of Weng et al., "Beware of Fragmentation" (ATC '23): pods
//! arrive one by one, drawn from the trace with a fixed seed (each pod once
//! in a shuffled order, then with replacement), until the GPUs requested
//! reach `inflate` × the cluster's GPU capacity; none leave. We report the
//! GPU allocation rate when the first GPU pod fails, at the end, and the
//! GPUs left unallocated.
//!
//! The CSVs are read with arrow's CSV reader into record batches; the
//! columns are handed to the engine as host specs and task requests. Arrow
//! stays here: the engine never sees it.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use peloton_engine::Resources;
use peloton_engine::constraint::ConstraintTable;
use peloton_engine::host::{HostArena, HostLimits, HostSpec, MAX_GPU_DEVICES};
use peloton_engine::placement::{PlacementConfig, PlacementResult, Placer};
use peloton_engine::task::{NO_GANG, Strategy, TaskArena, TaskSpec, TaskState, flags};
use peloton_engine::testkit::Rng;

/// One pod of the trace, as the engine will request it.
#[derive(Clone, Copy, Debug)]
pub struct Pod {
    /// Request in the engine's units (gpu in milli-GPUs).
    pub request: Resources,
}

/// What one replay measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TraceReport {
    /// Scoring used.
    pub score: &'static str,
    /// GPUs in the cluster.
    pub gpu_capacity: f64,
    /// Pods that arrived.
    pub pods_arrived: u64,
    /// Pods placed.
    pub pods_placed: u64,
    /// GPU pods that failed.
    pub gpu_pods_failed: u64,
    /// Allocated ÷ capacity when the first GPU pod failed.
    pub gpu_alloc_rate_first_failure: f64,
    /// Allocated ÷ capacity at the end.
    pub gpu_alloc_rate_end: f64,
    /// GPUs not allocated at the end.
    pub unallocated_gpus: f64,
}

fn read_csv(path: &Path, fields: Vec<Field>) -> Result<Vec<RecordBatch>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let schema = Arc::new(Schema::new(fields));
    let reader = arrow_csv::ReaderBuilder::new(schema)
        .with_header(true)
        .with_batch_size(8192)
        .build(file)
        .with_context(|| format!("reading {}", path.display()))?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))
}

fn int_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a Int64Array> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .with_context(|| format!("column {name} missing or not an integer"))
}

fn string_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a StringArray> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .with_context(|| format!("column {name} missing or not text"))
}

fn non_negative(value: i64, what: &str, row: usize) -> Result<u64> {
    u64::try_from(value).map_err(|_| anyhow::anyhow!("row {row}: {what} is negative ({value})"))
}

/// Nodes of the trace as host specs (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn read_nodes(path: &Path) -> Result<Vec<HostSpec>> {
    let batches = read_csv(
        path,
        vec![
            Field::new("sn", DataType::Utf8, false),
            Field::new("cpu_milli", DataType::Int64, false),
            Field::new("memory_mib", DataType::Int64, false),
            Field::new("gpu", DataType::Int64, false),
            Field::new("model", DataType::Utf8, true),
        ],
    )?;
    let mut hosts = Vec::new();
    for batch in &batches {
        let (sn, cpu, memory, gpu, model) = (
            string_column(batch, "sn")?,
            int_column(batch, "cpu_milli")?,
            int_column(batch, "memory_mib")?,
            int_column(batch, "gpu")?,
            string_column(batch, "model")?,
        );
        for row in 0..batch.num_rows() {
            let gpus = non_negative(gpu.value(row), "gpu", row)?;
            if gpus > MAX_GPU_DEVICES as u64 {
                bail!(
                    "node {}: {gpus} GPUs, more than {MAX_GPU_DEVICES}",
                    sn.value(row)
                );
            }
            let mut attributes = Vec::new();
            if !model.is_null(row) && !model.value(row).is_empty() {
                attributes.push(("model".to_owned(), model.value(row).to_owned()));
            }
            hosts.push(HostSpec {
                name: sn.value(row).to_owned(),
                capacity: Resources::new(
                    non_negative(cpu.value(row), "cpu_milli", row)?,
                    non_negative(memory.value(row), "memory_mib", row)?,
                    0,
                    gpus * 1000,
                ),
                gpu_devices: gpus as u8,
                ports: 0,
                attributes,
            });
        }
    }
    Ok(hosts)
}

/// Pods of the trace (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,…`): a
/// pod with one GPU asks for `gpu_milli` of one device; with several, whole
/// devices.
pub fn read_pods(path: &Path) -> Result<Vec<Pod>> {
    let batches = read_csv(
        path,
        vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("cpu_milli", DataType::Int64, false),
            Field::new("memory_mib", DataType::Int64, false),
            Field::new("num_gpu", DataType::Int64, false),
            Field::new("gpu_milli", DataType::Int64, false),
            Field::new("gpu_spec", DataType::Utf8, true),
            Field::new("qos", DataType::Utf8, true),
            Field::new("pod_phase", DataType::Utf8, true),
            Field::new("creation_time", DataType::Int64, true),
            Field::new("deletion_time", DataType::Int64, true),
            Field::new("scheduled_time", DataType::Int64, true),
        ],
    )?;
    let mut pods = Vec::new();
    for batch in &batches {
        let (cpu, memory, num_gpu, gpu_milli) = (
            int_column(batch, "cpu_milli")?,
            int_column(batch, "memory_mib")?,
            int_column(batch, "num_gpu")?,
            int_column(batch, "gpu_milli")?,
        );
        for row in 0..batch.num_rows() {
            let n = non_negative(num_gpu.value(row), "num_gpu", row)?;
            let milli = non_negative(gpu_milli.value(row), "gpu_milli", row)?;
            let gpu = match n {
                0 => 0,
                1 => milli.min(1000),
                n => n * 1000,
            };
            pods.push(Pod {
                request: Resources::new(
                    non_negative(cpu.value(row), "cpu_milli", row)?,
                    non_negative(memory.value(row), "memory_mib", row)?,
                    0,
                    gpu,
                ),
            });
        }
    }
    if pods.is_empty() {
        bail!("{}: no pods", path.display());
    }
    Ok(pods)
}

/// One replay with the given scoring.
pub fn replay(
    nodes: &[HostSpec],
    pods: &[Pod],
    inflate: f64,
    seed: u64,
    gpu_aware: bool,
) -> Result<TraceReport> {
    let mut hosts = HostArena::new(HostLimits {
        max_hosts: nodes.len().max(1),
    });
    for node in nodes {
        hosts
            .add(node)
            .with_context(|| format!("node {}", node.name))?;
    }
    let gpu_capacity: u64 = nodes.iter().map(|n| n.capacity.0[3]).sum();
    if gpu_capacity == 0 {
        bail!("the cluster has no GPUs");
    }
    let target = (gpu_capacity as f64 * inflate) as u64;
    let constraints = ConstraintTable::new();
    // The trace's CPU pods may use GPU nodes (as in the paper's simulator).
    let mut placer = Placer::new(PlacementConfig {
        allow_cpu_tasks_on_gpu_hosts: true,
        gpu_aware,
        ..Default::default()
    });
    let mut tasks = TaskArena::new(10_000_000);
    let mut out = PlacementResult::default();
    let mut rng = Rng::new(seed);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let (mut requested, mut allocated) = (0u64, 0u64);
    let (mut arrived, mut placed, mut gpu_failed) = (0u64, 0u64, 0u64);
    let mut first_failure: Option<f64> = None;
    while requested < target {
        let index = if (arrived as usize) < order.len() {
            order[arrived as usize]
        } else {
            rng.below(pods.len() as u64) as usize
        };
        let pod = pods[index];
        arrived += 1;
        requested += pod.request.0[3];
        let spec = TaskSpec {
            request: pod.request,
            flags: flags::PREEMPTIBLE,
            gang: NO_GANG,
            strategy: Strategy::Pack,
            ..Default::default()
        };
        let task = tasks.add(&spec).context("task arena full")?;
        tasks.set_state(task, TaskState::Admitted)?;
        placer.place(&mut hosts, &mut tasks, &constraints, &[task], 0, &mut out)?;
        if out.placed.is_empty() {
            tasks.remove(task)?;
            if pod.request.0[3] > 0 {
                gpu_failed += 1;
                first_failure.get_or_insert(allocated as f64 / gpu_capacity as f64);
            }
        } else {
            placed += 1;
            allocated += pod.request.0[3];
        }
        if arrived > 10_000_000 {
            bail!("more than 10,000,000 pods without reaching the target");
        }
    }
    hosts.check_invariants();
    Ok(TraceReport {
        score: if gpu_aware { "gpu_aware" } else { "pack" },
        gpu_capacity: gpu_capacity as f64 / 1000.0,
        pods_arrived: arrived,
        pods_placed: placed,
        gpu_pods_failed: gpu_failed,
        gpu_alloc_rate_first_failure: first_failure
            .unwrap_or(allocated as f64 / gpu_capacity as f64),
        gpu_alloc_rate_end: allocated as f64 / gpu_capacity as f64,
        unallocated_gpus: (gpu_capacity - allocated) as f64 / 1000.0,
    })
}
