//! `/metrics` of a real (secure) server: Prometheus text with the
//! documented series after a job ran, in plaintext by default and over TLS
//! when asked.

mod common;

use std::time::{Duration, Instant};

use peloton_gateway::client::Authed;
use peloton_gateway::config::Config;
use peloton_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    // Bytes, whatever they are (a TLS endpoint answers with no HTTP).
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A real (secure) server on `dir` (metrics on a free port if `metrics`)
/// and a channel to it as the admin.
async fn start(
    dir: &std::path::Path,
    sim_hosts: u32,
    metrics: bool,
) -> (peloton_gateway::server::Server, Authed) {
    let server = peloton_gateway::server::start(&Config {
        metrics_listen: metrics.then(|| "127.0.0.1:0".parse().unwrap()),
        ..common::config(dir, sim_hosts)
    })
    .await
    .unwrap();
    let channel = common::admin_channel(server.addr).await;
    (server, channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_prometheus_conventions_and_count_work() {
    let dir = tempfile::tempdir().unwrap();
    let (server, channel) = start(dir.path(), 4, true).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["peloton.v1.JobService", "peloton.v1.WatchService"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    }
    let mut pools =
        pb::resource_pool_service_client::ResourcePoolServiceClient::new(channel.clone());
    pools
        .create(pb::CreatePoolRequest {
            path: "/m".into(),
            spec: None,
        })
        .await
        .unwrap();
    let mut jobs = pb::job_service_client::JobServiceClient::new(channel.clone());
    let job = jobs
        .create(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                name: "m".into(),
                pool: "/m".into(),
                instance_count: 3,
                // Non-preemptible work needs a reservation; this pool has none.
                sla: Some(pb::Sla {
                    preemptible: true,
                    ..Default::default()
                }),
                default_task: Some(pb::TaskSpec {
                    shell: "true".into(),
                    resources: Some(pb::Resources {
                        cpu: 1.0,
                        ..Default::default()
                    }),
                    sim: Some(pb::SimSpec {
                        duration_ms: 10,
                        exit_code: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let j = jobs
            .get(pb::GetJobRequest { id: job.id.clone() })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        if j.status.as_ref().unwrap().state() == pb::JobState::Succeeded {
            break;
        }
        if Instant::now() > deadline {
            let mut tasks = pb::task_service_client::TaskServiceClient::new(channel.clone());
            let t = tasks
                .get(pb::GetTaskRequest {
                    job_id: job.id.clone(),
                    instance: 0,
                })
                .await
                .unwrap()
                .into_inner();
            panic!("job did not finish: {:?}\ntask 0: {t:?}", j.status);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Per-pool gauges refresh at most once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    jobs.get(pb::GetJobRequest { id: job.id.clone() })
        .await
        .unwrap();
    let text = scrape(server.metrics_addr.unwrap()).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for needle in [
        "# TYPE peloton_cycle_duration_seconds histogram",
        "# TYPE peloton_store_commit_duration_seconds histogram",
        "peloton_placements_total 3",
        "peloton_tasks_accepted_total 3",
        "peloton_runs_finished_total 3",
        "peloton_pool_pending_tasks{pool=\"/m\"} 0",
        "peloton_pool_entitlement{pool=\"/m\",dim=\"cpu\"}",
        "peloton_pool_allocation{pool=\"/m\",dim=\"memory\"}",
        "peloton_pool_demand{pool=\"/\",dim=\"gpu\"}",
        "peloton_hosts_up 4",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_watch_streams_and_answers_what_it_received() {
    let dir = tempfile::tempdir().unwrap();
    let (server, channel) = start(dir.path(), 1, false).await;
    let mut watch = pb::watch_service_client::WatchServiceClient::new(channel.clone())
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut pools = pb::resource_pool_service_client::ResourcePoolServiceClient::new(channel);
    pools
        .create(pb::CreatePoolRequest {
            path: "/w".into(),
            spec: None,
        })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(15), server.shutdown())
        .await
        .expect("shutdown finishes with a watch open")
        .unwrap();
    // The stream ends (with UNAVAILABLE or a closed connection).
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the watch stream ends");
    assert!(!matches!(end, Ok(Some(_))));
    // What was acknowledged is there after a restart.
    let (server, channel) = start(dir.path(), 0, false).await;
    let mut pools = pb::resource_pool_service_client::ResourcePoolServiceClient::new(channel);
    pools
        .get(pb::GetPoolRequest { path: "/w".into() })
        .await
        .expect("the pool survived the restart");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_over_tls_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let server = peloton_gateway::server::start(&Config {
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_tls: true,
        ..common::config(dir.path(), 2)
    })
    .await
    .unwrap();
    let at = server.metrics_addr.unwrap();
    // With the server's certificate (the tests' CA trusts it); no token.
    let text = common::https_request(
        at,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("peloton_hosts_up 2"), "{text}");
    // Plaintext gets no HTTP answer.
    let plain = tokio::time::timeout(Duration::from_secs(30), scrape(at))
        .await
        .expect("the plaintext attempt ends");
    assert!(!plain.starts_with("HTTP/"), "plaintext answered: {plain}");
    server.shutdown().await.unwrap();
}

/// The commits counted so far (`peloton_store_commit_duration_seconds`).
async fn commits(addr: std::net::SocketAddr) -> u64 {
    let text = scrape(addr).await;
    text.lines()
        .find_map(|l| l.strip_prefix("peloton_store_commit_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no commit count in:\n{text}"))
}

/// Group commit (`commit_spacing_ms`): writes that arrive together while
/// the loop waits out the spacing share one commit, and every one of them
/// is answered, and durable, after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_puts_writes_that_arrive_together_in_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let config = |dir: &std::path::Path| Config {
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        commit_spacing_ms: 400,
        // No cycle commits anything in between.
        idle_cycle_interval_ms: 60_000,
        ..common::config(dir, 0)
    };
    let server = peloton_gateway::server::start(&config(dir.path()))
        .await
        .unwrap();
    let channel = common::admin_channel(server.addr).await;
    let metrics = server.metrics_addr.unwrap();
    let pools = pb::resource_pool_service_client::ResourcePoolServiceClient::new(channel);
    let create = |path: String| {
        let mut pools = pools.clone();
        async move {
            pools
                .create(pb::CreatePoolRequest { path, spec: None })
                .await
        }
    };
    // One write opens a spacing window (it is committed at once, after a
    // quiet spell); sixteen more sent now all land within it.
    create("/g".into()).await.unwrap();
    let before = commits(metrics).await;
    let answers = futures::future::join_all((0..16).map(|i| create(format!("/g/p{i}")))).await;
    for answer in answers {
        answer.expect("every write is answered");
    }
    let after = commits(metrics).await;
    assert_eq!(after - before, 1, "sixteen writes in one commit");
    server.shutdown().await.unwrap();
    // Durable: all there after a restart.
    let server = peloton_gateway::server::start(&config(dir.path()))
        .await
        .unwrap();
    let mut pools = pb::resource_pool_service_client::ResourcePoolServiceClient::new(
        common::admin_channel(server.addr).await,
    );
    for i in 0..16 {
        pools
            .get(pb::GetPoolRequest {
                path: format!("/g/p{i}"),
            })
            .await
            .expect("the pool survived the restart");
    }
    server.shutdown().await.unwrap();
}

/// The value of one series (`name{labels}`) in a scrape, if present.
fn series(text: &str, name_and_labels: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Per pool, what runs use (as simulated hosts report it every 10 s) is
/// exported beside what they are allocated and entitled to: up to the
/// allocation while they run, in the pool and its parents, and back to 0
/// once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_usage_is_exported_beside_allocation_and_entitlement() {
    let dir = tempfile::tempdir().unwrap();
    let (server, channel) = start(dir.path(), 2, true).await;
    let metrics = server.metrics_addr.unwrap();
    let mut pools =
        pb::resource_pool_service_client::ResourcePoolServiceClient::new(channel.clone());
    pools
        .create(pb::CreatePoolRequest {
            path: "/u".into(),
            spec: None,
        })
        .await
        .unwrap();
    let mut jobs = pb::job_service_client::JobServiceClient::new(channel.clone());
    let job = jobs
        .create(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                name: "u".into(),
                pool: "/u".into(),
                instance_count: 2,
                sla: Some(pb::Sla {
                    preemptible: true,
                    ..Default::default()
                }),
                default_task: Some(pb::TaskSpec {
                    shell: "true".into(),
                    resources: Some(pb::Resources {
                        cpu: 1.0,
                        memory_mb: 64.0,
                        ..Default::default()
                    }),
                    sim: Some(pb::SimSpec {
                        duration_ms: 600_000,
                        exit_code: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let used_cpu = "peloton_pool_used{pool=\"/u\",dim=\"cpu\"}";
    // Each simulated host reports once every 10 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(metrics).await;
        if series(&text, used_cpu).is_some_and(|v| v > 0) {
            break text;
        }
        assert!(Instant::now() < deadline, "no usage of /u in:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let used = series(&text, used_cpu).unwrap();
    let allocated = series(&text, "peloton_pool_allocation{pool=\"/u\",dim=\"cpu\"}").unwrap();
    assert_eq!(allocated, 2000, "{text}");
    // Simulated runs use a tenth to nine tenths of their request.
    assert!(used > 0 && used < allocated, "{used} of {allocated}");
    assert!(
        series(&text, "peloton_pool_used{pool=\"/\",dim=\"cpu\"}").unwrap() >= used,
        "a parent counts its subtree's usage:\n{text}"
    );
    assert!(series(&text, "peloton_pool_used{pool=\"/u\",dim=\"memory\"}").unwrap() > 0);
    assert!(series(&text, "peloton_pool_entitlement{pool=\"/u\",dim=\"cpu\"}").is_some());
    jobs.kill(pb::KillJobRequest {
        id: job.id.clone(),
        version: 0,
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(metrics).await;
        if series(&text, used_cpu) == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage of /u stays after its runs ended:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.shutdown().await.unwrap();
}
