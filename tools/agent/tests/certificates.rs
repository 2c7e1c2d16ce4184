//! A secure server (the default) takes an agent only for the host its
//! client certificate names: an agent whose certificate names another host,
//! or one that presents no certificate, is refused at registration (and
//! says so on its log), and the host it asked for never appears; the same
//! host with a certificate naming it registers. (The TLS layer's side, a
//! certificate from another CA, is peloton-tls's handshake test.)

mod common;

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// An agent of `cluster` registering `host` with these TLS flags; its log
/// is read for the refusal.
fn agent(cluster: &Cluster, host: &str, tls: Vec<OsString>) -> Child {
    let work = cluster.work_dir(host);
    std::fs::create_dir_all(&work).expect("work dir");
    Command::new(env!("CARGO_BIN_EXE_peloton-agent"))
        .args(["--server", &cluster.url()])
        .args(tls)
        .arg("--work-dir")
        .arg(&work)
        .args(["--host", host, "--token", TOKEN])
        .args(["--resources", "cpu=4,mem=4096,disk=10000"])
        .args(["--isolation", "rlimit"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts")
}

/// The first line of the agent's log saying the server refused it.
async fn refusal(agent: &mut Child) -> String {
    let mut lines = BufReader::new(agent.stderr.take().expect("stderr")).lines();
    within("the agent to report its refusal", async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            if line.contains("the server refused this agent") {
                return line;
            }
        }
        panic!("the agent exited without reporting a refusal");
    })
    .await
}

async fn host_names(cluster: &Cluster) -> Vec<String> {
    let mut names: Vec<String> = cluster.hosts().await.into_iter().map(|h| h.name).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_refused_without_a_certificate_naming_their_host() {
    let mut cluster = Cluster::start(1).await;
    let certs = cluster.dir.path().join("certs");

    // A certificate naming host-a, used to register host-b.
    let mut tls = agent_tls_args(&certs, "host-a");
    let mut impostor = agent(&cluster, "host-b", tls.clone());
    let line = refusal(&mut impostor).await;
    assert!(line.contains("PermissionDenied"), "{line}");
    assert!(line.contains("host-a"), "{line}");

    // No client certificate at all (the server's CA only).
    tls.truncate(2);
    assert_eq!(tls[0], "--ca-file");
    let mut anonymous = agent(&cluster, "host-c", tls);
    let line = refusal(&mut anonymous).await;
    assert!(line.contains("Unauthenticated"), "{line}");
    assert!(line.contains("client certificate"), "{line}");

    // Both keep asking (with a back-off) and are never let in.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        impostor.try_wait().expect("wait").is_none(),
        "the agent gave up"
    );
    assert_eq!(host_names(&cluster).await, ["a0"]);

    // host-b with a certificate naming it is welcome.
    impostor.kill().await.expect("SIGKILL");
    cluster.start_agent("host-b").await;
    cluster.wait_hosts_up(2).await;
    assert_eq!(host_names(&cluster).await, ["a0", "host-b"]);
    cluster.agents.insert("host-c".into(), anonymous);
}
