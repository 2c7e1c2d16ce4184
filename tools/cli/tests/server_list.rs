//! `--server` with several addresses, against real servers on 127.0.0.1:
//! a dead address is skipped, one that never answers names every address,
//! and a channel whose server went away finds it at its next address (the
//! same data directory served from another port, as a new leader would).

use std::path::{Path, PathBuf};
use std::process::Output;

use peloton_cli::channel::LeaderChannel;
use peloton_cli::servers::parse_servers;
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
    tokio::process::Command::new(env!("CARGO_BIN_EXE_peloton"))
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
        ..Config::default()
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
    let servers = format!("{DEAD}, http://{}", server.addr);
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
            "error: cannot connect to any of the Peloton servers: http://127.0.0.1:1: "
        ),
        "{stderr}"
    );
    assert!(stderr.contains("; http://127.0.0.1:2: "), "{stderr}");
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
    let servers =
        parse_servers(&format!("{},127.0.0.1:{second_port}", first.addr)).expect("valid list");
    let channel = LeaderChannel::connect(servers).await.expect("connects");
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
