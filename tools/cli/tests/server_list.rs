//! `--server` with several addresses, against real servers on 127.0.0.1:
//! a dead address is skipped, one that never answers names every address,
//! a channel whose server went away finds it at its next address (the
//! same data directory served from another port, as a new leader would),
//! and two servers on one PostgreSQL (from the system's packages): a
//! standby sends the CLI to the leader, and once the leader has gone the
//! CLI finds the standby that took over. Every server is secure (see
//! `common`): addresses without a scheme are `https://`, and standbys name
//! the leader by its `https://` URL.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use peloton_cli::channel::LeaderChannel;
use peloton_cli::servers::{Scheme, parse_servers_as};
use peloton_gateway::config::Config;
use peloton_proto::v1::resource_pool_service_client::ResourcePoolServiceClient;
use peloton_proto::v1::{CreatePoolRequest, GetPoolRequest, PoolSpec};
use serde_json::Value;

/// Nothing listens on port 1 of the loopback: connections are refused.
const DEAD: &str = "127.0.0.1:1";

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

async fn peloton(servers: &str, args: &[&str]) -> Output {
    common::cli()
        .env("PELOTON_SERVER", servers)
        .args(args)
        .output()
        .await
        .expect("the CLI runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn start_server(data_dir: &Path, listen: &str) -> peloton_gateway::server::Server {
    peloton_gateway::server::start(&Config {
        data_dir: data_dir.to_path_buf(),
        listen: listen.parse().expect("address"),
        metrics_listen: None,
        sim_hosts: 4,
        cycle_interval_ms: 5,
        ..common::secure_config()
    })
    .await
    .expect("server starts")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_first_address_is_skipped_for_writes_and_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = start_server(dir.path(), "127.0.0.1:0").await;
    let servers = format!("{DEAD}, {}", common::url(server.addr));
    let pools = examples().join("pools.yaml");
    let hello = examples().join("hello.yaml");

    let out = peloton(&servers, &["respool", "create", &pools.to_string_lossy()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton(
        &servers,
        &["job", "create", &hello.to_string_lossy(), "--wait"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = peloton(&servers, &["-o", "json", "job", "query", "--name", "hello"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let jobs: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(jobs["jobs"][0]["status"]["state"], "succeeded", "{jobs}");

    // A server error is still the server's answer: exit 1, not a retry.
    let out = peloton(&servers, &["job", "get", "no-such-job"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_reachable_names_each_address_and_exits_1() {
    let out = peloton(&format!("{DEAD},127.0.0.1:2"), &["job", "query"]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: cannot connect to any of the Peloton servers: https://127.0.0.1:1: "
        ),
        "{stderr}"
    );
    assert!(stderr.contains("; https://127.0.0.1:2: "), "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");

    // A bad list is a usage error, found before any connection.
    let out = peloton(&format!("{DEAD},,127.0.0.1:2"), &["job", "query"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("an empty address"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_goes_to_the_next_address_when_its_server_has_gone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = start_server(dir.path(), "127.0.0.1:0").await;
    let second_port = free_port();
    let servers = parse_servers_as(
        &format!("{},127.0.0.1:{second_port}", first.addr),
        Scheme::Https,
    )
    .expect("valid list");
    let channel = LeaderChannel::connect_with(servers, common::security())
        .await
        .expect("connects");
    let mut pools = ResourcePoolServiceClient::new(channel);
    let create = |path: &str| CreatePoolRequest {
        path: path.to_owned(),
        spec: Some(PoolSpec::default()),
    };
    pools
        .create(create("/a"))
        .await
        .expect("created at the first");

    // The state moves to the second address (as to a new leader); the
    // channel, connected to the first, cannot reconnect there: the call was
    // never sent, so even a write goes on to the next address.
    first.shutdown().await.expect("shutdown");
    let second = start_server(dir.path(), &format!("127.0.0.1:{second_port}")).await;
    pools
        .create(create("/b"))
        .await
        .expect("created at the second");
    for path in ["/a", "/b"] {
        pools
            .get(GetPoolRequest {
                path: path.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    second.shutdown().await.expect("shutdown");
}

/// A throwaway PostgreSQL for this test binary, from the system's packages
/// (started from a thread that never ends: the server dies with that
/// thread). Fails the test when PostgreSQL is missing.
fn local_postgres() -> &'static peloton_gateway::local_pg::LocalPostgres {
    static PG: std::sync::OnceLock<peloton_gateway::local_pg::LocalPostgres> =
        std::sync::OnceLock::new();
    PG.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(peloton_gateway::local_pg::LocalPostgres::start(false));
            loop {
                std::thread::park();
            }
        });
        rx.recv()
            .expect("the PostgreSQL starter")
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e:#}"))
    })
}

/// A server on the shared database `store`; it leads, or stands by until
/// it may (then `start` returns only once it leads).
fn shared_config(data_dir: &Path, listen: &str, store: &str) -> Config {
    Config {
        data_dir: data_dir.to_path_buf(),
        listen: listen.parse().expect("address"),
        metrics_listen: None,
        sim_hosts: 4,
        cycle_interval_ms: 5,
        store: Some(store.to_owned()),
        lease_ms: 1000,
        ..common::secure_config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_sends_the_cli_to_the_leader_and_a_new_leader_is_found() {
    let store = tokio::task::spawn_blocking(|| local_postgres().create_db("cli_standby"))
        .await
        .expect("create_db")
        .expect("database");
    let dir = tempfile::tempdir().expect("temp dir");
    let leader = peloton_gateway::server::start(&shared_config(
        &dir.path().join("a"),
        "127.0.0.1:0",
        &store,
    ))
    .await
    .expect("the first server leads");
    let leader_url = common::url(leader.addr);
    let standby_port = free_port();
    let standby_url = format!("https://127.0.0.1:{standby_port}");
    let standby = tokio::spawn({
        let config = shared_config(
            &dir.path().join("b"),
            &format!("127.0.0.1:{standby_port}"),
            &store,
        );
        async move { peloton_gateway::server::start(&config).await }
    });
    // Until it stands by (listening, the lease seen taken) it says so.
    let refusal = format!("not the leader: the leader is at {leader_url}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let said = match common::endpoint(&standby_url).connect().await {
            Ok(channel) => ResourcePoolServiceClient::new(channel)
                .get(common::authed(GetPoolRequest { path: "/".into() }))
                .await
                .map(|_| "served".to_owned())
                .unwrap_or_else(|status| status.message().to_owned()),
            Err(e) => e.to_string(),
        };
        if said == refusal {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby never named the leader; last: {said}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // The standby alone is enough: it names the leader, the CLI goes there.
    let pools = examples().join("pools.yaml");
    let out = peloton(
        &standby_url,
        &["respool", "create", &pools.to_string_lossy()],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let both = format!("{standby_url},{leader_url}");
    let hello = examples().join("hello.yaml");
    let out = peloton(
        &both,
        &["job", "create", &hello.to_string_lossy(), "--wait"],
    )
    .await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // The leader goes (its lease released); the standby takes over and
    // serves what the first one stored.
    leader.shutdown().await.expect("shutdown");
    let new_leader = tokio::time::timeout(std::time::Duration::from_secs(60), standby)
        .await
        .expect("the standby leads in time")
        .expect("joined")
        .expect("the standby starts");
    let out = peloton(&both, &["-o", "json", "job", "query", "--name", "hello"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let jobs: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(jobs["jobs"][0]["status"]["state"], "succeeded", "{jobs}");
    // Listed the other way round: the old leader's address is dead.
    let other_way = format!("{leader_url},{standby_url}");
    let out = peloton(&other_way, &["job", "query", "--name", "hello"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    new_leader.shutdown().await.expect("shutdown");
}
