//! Overcommit on slack with real processes: services that reserve most of
//! three local agents and use almost nothing lend it to a revocable batch
//! job of busy loops that would not fit the unallocated room; when the
//! services' memory rises into what the busy loops borrowed, every one of
//! them is preempted by the QoS controller, and no service run is harmed.
//! The agents report every second (`--usage-interval 1`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Cluster, ClusterOptions, eventually, job, processes_with_env, task_spec};
use peloton_proto::v1 as pb;

/// Each agent's advertised capacity.
const HOST_CPU: f64 = 2.0;
const HOST_MEMORY_MB: f64 = 2048.0;
/// A service instance per host reserves three quarters of it.
const SERVICE_CPU: f64 = 1.5;
const SERVICE_MEMORY_MB: f64 = 1536.0;
/// What a service holds once its trigger file appears: within its own
/// allocation (so its memory limit never kills it), and far into what the
/// host lends (1536 - 1150 - 20 % of 1536 = 79 MiB, less than the 256 MiB
/// each busy loop borrowed).
const RISE_MB: u64 = 1150;
/// A revocable busy loop: more of both than a host leaves unallocated
/// (0.5 cores, 512 MiB), so it runs only on what the service lends; two
/// do not fit one host (2 cores > 0.5 free + 1.35 lent).
const BATCH_CPU: f64 = 1.0;
const BATCH_MEMORY_MB: f64 = 768.0;
/// A service's memory that leaves its host less to lend than its busy
/// loop borrowed (1536 - 20 % - 256 = 973 MiB), and below what it rises to.
const RISE_SEEN_MB: f64 = 1000.0;
/// Report interval of the agents.
const REPORT_INTERVAL_MS: u64 = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocable_busy_loops_run_on_idle_service_room_and_go_when_services_use_it() {
    let cluster = Cluster::start_with(
        3,
        ClusterOptions {
            agent_resources: format!("cpu={HOST_CPU},mem={HOST_MEMORY_MB},disk=10000"),
            agent_args: vec![
                "--usage-interval".into(),
                (REPORT_INTERVAL_MS / 1000).to_string(),
            ],
            ..Default::default()
        },
    )
    .await;
    let trigger = cluster.dir.path().join("rise");

    // Services: one instance a host (two do not fit one), sleeping until
    // the trigger, then holding RISE_MB (`tail` keeps a line it has not
    // seen the end of).
    let mut sleeper = task_spec(&format!(
        "while [ ! -e {trigger} ]; do sleep 0.2; done; \
         (head -c {bytes} /dev/zero; sleep 600) | tail",
        trigger = trigger.display(),
        bytes = RISE_MB << 20,
    ));
    sleeper.resources = Some(pb::Resources {
        cpu: SERVICE_CPU,
        memory_mb: SERVICE_MEMORY_MB,
        ..Default::default()
    });
    let services = cluster
        .create(pb::JobSpec {
            r#type: pb::JobType::Service as i32,
            ..job("services", 3, sleeper)
        })
        .await;
    let running = cluster.wait_running(&services, 3).await;
    let mut service_hosts: Vec<String> = running
        .iter()
        .map(|t| t.current.as_ref().expect("run").host.clone())
        .collect();
    service_hosts.sort();
    assert_eq!(service_hosts, ["a0", "a1", "a2"], "one service a host");

    // The unallocated room of each host is less than a busy loop needs.
    let mut unallocated_cpu = 0.0;
    for h in cluster.hosts().await {
        let free = h.free.expect("free");
        unallocated_cpu += free.cpu;
        assert!(
            free.cpu < BATCH_CPU && free.memory_mb < BATCH_MEMORY_MB,
            "{}: {free:?} would hold a busy loop without lending",
            h.name
        );
    }
    // Every service measured (two readings), using next to nothing.
    eventually("the services' usage reported twice", async || {
        let mut seen = 0;
        for i in 0..3 {
            let t = cluster.task(&services, i).await?;
            let u = t.current.as_ref()?.used?;
            let started = t.current.as_ref()?.started_at_ms;
            if u.reported_at_ms > started + 2 * REPORT_INTERVAL_MS {
                assert!(u.memory_mb < 50.0, "a sleeper holds {u:?}");
                seen += 1;
            }
        }
        (seen == 3).then_some(())
    })
    .await;

    // The revocable busy loops (niced: they are lent CPU the machine has,
    // on a machine the test's own server and agents share).
    let mut busy = task_spec("exec nice -n 19 sh -c 'while :; do :; done'");
    busy.revocable = true;
    busy.resources = Some(pb::Resources {
        cpu: BATCH_CPU,
        memory_mb: BATCH_MEMORY_MB,
        ..Default::default()
    });
    let batch = cluster.create(job("busy", 3, busy)).await;
    let running = cluster.wait_running(&batch, 3).await;
    let mut batch_hosts: Vec<String> = running
        .iter()
        .map(|t| t.current.as_ref().expect("run").host.clone())
        .collect();
    batch_hosts.sort();
    assert_eq!(batch_hosts, ["a0", "a1", "a2"], "one busy loop a host");
    // Together they ask for more than the hosts leave unallocated: they
    // run on what the services lend.
    assert!(3.0 * BATCH_CPU > unallocated_cpu, "{unallocated_cpu}");
    for h in cluster.hosts().await {
        let free = h.free.expect("free");
        assert_eq!(
            (free.cpu, free.memory_mb),
            (0.0, 0.0),
            "{}: a busy loop borrowed beyond the free room",
            h.name
        );
    }
    let batch_pids = || {
        let mut n = 0;
        for (_, dir, path) in cluster.sandboxes() {
            if dir.contains(&batch) {
                n += processes_with_env(&format!("PELOTON_SANDBOX={}", path.display())).len();
            }
        }
        n
    };
    assert!(batch_pids() >= 3, "the busy loops run as processes");

    // The services' use rises into the lent room.
    let trigger_ms = wall_ms();
    std::fs::write(&trigger, b"").expect("the trigger file");
    // Each host's first report of its service's rise, as the test sees
    // them: memory past what leaves room for the busy loop's loan
    // (1536 - 20 % - 256 = 973 MiB), so that this report must end it.
    let mut first_rise_ms: BTreeMap<String, u64> = BTreeMap::new();
    let preempted = eventually(
        "every busy loop preempted and its end confirmed",
        async || {
            watch_rise(&cluster, &services, &mut first_rise_ms).await;
            let mut ends = Vec::new();
            for i in 0..3 {
                let t = cluster.task(&batch, i).await?;
                if t.stopping {
                    return None;
                }
                let run = t
                    .history
                    .iter()
                    .find(|r| r.state() == pb::TaskState::Preempted)?;
                ends.push((t.instance, run.clone()));
            }
            Some(ends)
        },
    )
    .await;
    // The processes are gone once the agents confirm.
    eventually("the busy loops' processes gone", async || {
        (batch_pids() == 0).then_some(())
    })
    .await;
    let gone_ms = wall_ms();
    eventually("every host's rise seen", async || {
        watch_rise(&cluster, &services, &mut first_rise_ms).await;
        (first_rise_ms.len() == 3).then_some(())
    })
    .await;
    // A preempted run's end is when its agent confirmed it (the server
    // notes it as told to stop until then).
    for (instance, run) in &preempted {
        assert!(
            run.finished_at_ms >= trigger_ms,
            "instance {instance} preempted before the services' use rose: {run:#?}"
        );
        // Two paths end a loan when the services' use rises, and either
        // may see the rise first: the host's usage controller (the
        // services need the room back) or entitlement, whose slack (room
        // allocated but unused) shrinks with the same report.
        assert!(
            run.reason.contains("non-revocable tasks need the")
                || run.reason.contains("slack reclaimed in"),
            "instance {instance} preempted for another reason: {}",
            run.reason
        );
        let rise_ms = first_rise_ms[&run.host];
        eprintln!(
            "busy loop {instance} on {} preempted and its end confirmed by its agent {} ms after \
             its host's first report of the rise the test saw (report interval \
             {REPORT_INTERVAL_MS} ms)",
            run.host,
            run.finished_at_ms as i64 - rise_ms as i64,
        );
        assert!(
            run.finished_at_ms <= rise_ms + 2 * REPORT_INTERVAL_MS,
            "busy loop {instance} on {} preempted at {}, the rise reported at {rise_ms}",
            run.host,
            run.finished_at_ms
        );
    }
    let last_rise_ms = first_rise_ms.values().max().copied().unwrap_or_default();
    eprintln!(
        "every busy loop's processes gone {} ms after the last host's first report of the rise",
        gone_ms as i64 - last_rise_ms as i64
    );

    // No service run was killed, failed or OOM-killed: each is on its
    // first run, running, holding what it rose to.
    tokio::time::sleep(Duration::from_millis(2 * REPORT_INTERVAL_MS)).await;
    for i in 0..3 {
        let t = cluster.task(&services, i).await.expect("service task");
        let run = t.current.as_ref().expect("run");
        assert_eq!(
            (run.state(), run.run_id, t.failure_count, t.history.len()),
            (pb::TaskState::Running, 1, 0, 0),
            "service instance {i}: {t:#?}"
        );
        let held = run.used.map_or(0.0, |u| u.memory_mb);
        assert!(
            held >= RISE_SEEN_MB,
            "service instance {i} holds {held} MiB"
        );
    }
    // And the busy loops wait: nothing is lent that would hold them.
    for i in 0..3 {
        let t = cluster.task(&batch, i).await.expect("batch task");
        let state = t.current.as_ref().expect("run").state();
        assert_ne!(state, pb::TaskState::Running, "instance {i}: {t:#?}");
    }
}

/// Notes the first report of each host's service rise (memory of at
/// least [`RISE_SEEN_MB`]) that is current now.
async fn watch_rise(cluster: &Cluster, services: &str, first_rise_ms: &mut BTreeMap<String, u64>) {
    for i in 0..3 {
        let Some(run) = cluster.task(services, i).await.and_then(|t| t.current) else {
            continue;
        };
        if let Some(u) = run.used
            && u.memory_mb >= RISE_SEEN_MB
        {
            let first = first_rise_ms.entry(run.host).or_insert(u.reported_at_ms);
            *first = (*first).min(u.reported_at_ms);
        }
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64
}
