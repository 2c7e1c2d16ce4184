//! The `peloton` binary against a real server on 127.0.0.1 (port 0) with
//! simulated hosts: the examples run end to end, and errors are readable
//! with the right exit codes. The server is secure (see `common`).

mod common;

use std::path::PathBuf;
use std::process::Output;

use peloton_gateway::config::Config;
use serde_json::Value;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

async fn peloton(server: &str, args: &[&str]) -> Output {
    let mut cmd = common::cli();
    cmd.arg("--server").arg(server).args(args);
    cmd.output().await.expect("the CLI runs")
}

/// A server on `data_dir` with `sim_hosts` simulated hosts, a free port and
/// fast cycles.
async fn start_server(
    data_dir: &std::path::Path,
    sim_hosts: u32,
) -> peloton_gateway::server::Server {
    peloton_gateway::server::start(&Config {
        data_dir: data_dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        sim_hosts,
        cycle_interval_ms: 5,
        ..common::secure_config()
    })
    .await
    .unwrap()
}

/// A server with `sim_hosts` simulated hosts and the example pools
/// (`examples/pools.yaml`): its data dir (kept while it runs), the server
/// and its URL.
async fn with_example_pools(
    sim_hosts: u32,
) -> (tempfile::TempDir, peloton_gateway::server::Server, String) {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), sim_hosts).await;
    let url = common::url(server.addr);
    let pools = examples().join("pools.yaml");
    let out = peloton(&url, &["respool", "create", &pools.to_string_lossy()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    (dir, server, url)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn ok_json(server: &str, args: &[&str]) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    let out = peloton(server, &all).await;
    assert!(
        out.status.success(),
        "peloton {args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("peloton {args:?}: not JSON ({e}): {}", text(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_run_end_to_end_and_errors_are_readable() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), 16).await;
    let url = common::url(server.addr);
    let ex = examples();
    let ex = |f: &str| ex.join(f).to_string_lossy().into_owned();

    // Pools from the example tree.
    let out = peloton(&url, &["respool", "create", &ex("pools.yaml")]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pools = ok_json(&url, &["respool", "list"]).await;
    let paths: Vec<&str> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    for p in ["/", "/prod", "/prod/web", "/batch/research", "/demo"] {
        assert!(paths.contains(&p), "{p} missing from {paths:?}");
    }

    // Hello world, waited for: exit 0 once every instance succeeded.
    let out = peloton(&url, &["job", "create", &ex("hello.yaml"), "--wait"]).await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let jobs = ok_json(&url, &["job", "query", "--name", "hello"]).await;
    let jobs = jobs["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    let id = jobs[0]["id"].as_str().unwrap().to_string();
    assert_eq!(jobs[0]["status"]["state"], "succeeded");
    let tasks = ok_json(&url, &["task", "list", &id]).await;
    let tasks = tasks["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    for t in tasks {
        assert_eq!(t["current"]["state"], "succeeded", "{t}");
        assert!(t["current"]["host"].as_str().unwrap().starts_with("sim-"));
    }
    let out = peloton(&url, &["task", "get", &id, "0"]).await;
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("succeeded"),
        "{}",
        text(&out.stdout)
    );

    // The constrained example lands only in zones z1 and z2, one per host.
    let out = peloton(&url, &["job", "create", &ex("constrained.yaml"), "--wait"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let hosts = ok_json(&url, &["host", "list"]).await;
    let hosts = hosts["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 16);
    let zone_of = |name: &str| {
        hosts
            .iter()
            .find(|h| h["name"] == name)
            .map(|h| h["attributes"]["zone"].as_str().unwrap().to_string())
            .unwrap()
    };
    let web = ok_json(&url, &["job", "query", "--name", "zoned"]).await;
    let web_id = web["jobs"][0]["id"].as_str().unwrap().to_string();
    let tasks = ok_json(&url, &["task", "list", &web_id]).await;
    let mut seen = std::collections::HashSet::new();
    for t in tasks["tasks"].as_array().unwrap() {
        let host = t["current"]["host"].as_str().unwrap();
        assert!(["z1", "z2"].contains(&zone_of(host).as_str()), "{t}");
        assert!(seen.insert(host.to_string()), "two instances on {host}");
    }
    assert_eq!(seen.len(), 2);

    // Errors: a server error is exit 1 with the gRPC code in words; a bad
    // spec file is exit 2 and names the file; nothing was created.
    let out = peloton(&url, &["job", "get", "no-such-job"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: x\npool: /demo\ninstances: 0\ntask: {command: /bin/true, resources: {cpu: 1}}\n",
    )
    .unwrap();
    let out = peloton(&url, &["job", "create", bad.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // The server's refusal names the field as the file does.
    assert!(
        text(&out.stderr).contains("error: invalid argument: instances: "),
        "{}",
        text(&out.stderr)
    );
    for (yaml, path) in [
        (
            "instances: 1\ntask: {command: /bin/true, resources: {cpu: -1}}\n",
            "task.resources.cpu: ",
        ),
        (
            "instances: 2\nsla: {gang_size: 3}\ntask: {command: /bin/true, resources: {cpu: 1}}\n",
            "sla.gang_size: ",
        ),
        (
            "instances: 2\ntask: {command: /bin/true, resources: {cpu: 1}}\n\
             overrides: [{instance: 1, task: {command: /bin/true, resources: {cpu: -2}}}]\n",
            "overrides[0].task.resources.cpu: ",
        ),
    ] {
        std::fs::write(&bad, format!("name: x\npool: /demo\n{yaml}")).unwrap();
        let out = peloton(&url, &["job", "create", bad.to_str().unwrap()]).await;
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let why = text(&out.stderr);
        assert!(
            why.contains(&format!("invalid argument: {path}")),
            "{yaml}: {why}"
        );
        assert!(!why.contains("spec."), "{why}");
    }
    std::fs::write(&bad, "name: x\ncomand: oops\n").unwrap();
    let out = peloton(&url, &["job", "create", bad.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.yaml"),
        "{}",
        text(&out.stderr)
    );
    let jobs = ok_json(&url, &["job", "query"]).await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 2);

    server.shutdown().await.unwrap();
    // With the server gone, the CLI says where it tried to connect.
    let out = peloton(&url, &["job", "query"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&url), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_example_rolls_to_v2_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), 4).await;
    let url = common::url(server.addr);
    let ex = examples();
    let ex = |f: &str| ex.join(f).to_string_lossy().into_owned();
    let out = peloton(&url, &["respool", "create", &ex("pools.yaml")]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = ok_json(&url, &["job", "create", &ex("service.yaml")]).await;
    let id = job["job"]["id"].as_str().unwrap().to_string();
    // Simulated hosts run no health checks: running is enough.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let j = ok_json(&url, &["job", "get", &id]).await;
        if j["job"]["status"]["state"] == "running" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{j}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Waits for the update: exit 0 once it succeeded (simulated hosts
    // report every run healthy).
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        peloton(
            &url,
            &[
                "--output",
                "json",
                "job",
                "update",
                &id,
                &ex("service-v2.yaml"),
                "--batch-size",
                "2",
            ],
        ),
    )
    .await
    .expect("peloton job update waits for the update, which must end within 60 s");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let u: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(u["update"]["status"]["state"], "succeeded", "{u}");
    assert_eq!(u["update"]["status"]["instances_done"], 3, "{u}");
    let list = ok_json(&url, &["update", "list", &id]).await;
    assert_eq!(list["updates"].as_array().unwrap().len(), 1, "{list}");
    let j = ok_json(&url, &["job", "get", &id]).await;
    assert_eq!(j["job"]["spec"]["task"]["env"]["VERSION"], "v2", "{j}");
    // Actions on a finished update are refused with exit 1 and the reason.
    let uid = u["update"]["id"].as_str().unwrap();
    let out = peloton(&url, &["update", "pause", uid]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot be paused"),
        "{}",
        text(&out.stderr)
    );
    // A batch job is not rolled: its update is an edit, and the same spec
    // changes nothing.
    let hello = ok_json(&url, &["job", "create", &ex("hello.yaml")]).await;
    let hid = hello["job"]["id"].as_str().unwrap();
    let out = peloton(&url, &["job", "update", hid, &ex("hello.yaml")]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nothing to change"),
        "{}",
        text(&out.stderr)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_pools_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), 4).await;
    let url = common::url(server.addr);
    let ex = examples();
    let ex = |f: &str| ex.join(f).to_string_lossy().into_owned();
    let out = peloton(&url, &["respool", "create", &ex("pools.yaml")]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = peloton(&url, &["hostpool", "create", "team-a"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton(
        &url,
        &[
            "hostpool",
            "move",
            "--to",
            "team-a",
            "sim-00000",
            "sim-00001",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pools = ok_json(&url, &["hostpool", "list"]).await;
    assert_eq!(
        pools,
        serde_json::json!({"pools": [
            {"name": "default", "hosts": ["sim-00002", "sim-00003"]},
            {"name": "team-a", "hosts": ["sim-00000", "sim-00001"]},
        ]})
    );
    let out = peloton(&url, &["hostpool", "list"]).await;
    assert!(
        text(&out.stdout).contains("team-a"),
        "{}",
        text(&out.stdout)
    );
    let out = peloton(&url, &["host", "list"]).await;
    let table = text(&out.stdout);
    assert!(table.contains("HOST POOL"), "{table}");
    let hosts = ok_json(&url, &["host", "list"]).await;
    assert_eq!(hosts["hosts"][0]["host_pool"], "team-a");
    assert_eq!(hosts["hosts"][3]["host_pool"], "default");

    // A job naming the pool (`host_pool:` in its YAML) runs there.
    let spec = dir.path().join("in-pool.yaml");
    let hello = std::fs::read_to_string(ex("hello.yaml")).unwrap();
    std::fs::write(&spec, format!("{hello}host_pool: team-a\n")).unwrap();
    let out = peloton(&url, &["job", "create", spec.to_str().unwrap(), "--wait"]).await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let jobs = ok_json(&url, &["job", "query"]).await;
    let id = jobs["jobs"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(jobs["jobs"][0]["spec"]["host_pool"], "team-a");
    let tasks = ok_json(&url, &["task", "list", &id]).await;
    for t in tasks["tasks"].as_array().unwrap() {
        let host = t["current"]["host"].as_str().unwrap();
        assert!(host == "sim-00000" || host == "sim-00001", "{t}");
    }

    // Refusals: exit 1 with the reason.
    let out = peloton(&url, &["hostpool", "delete", "team-a"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("still has 2 host(s)"),
        "{}",
        text(&out.stderr)
    );
    let out = peloton(&url, &["hostpool", "create", "bad name"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("name"), "{}", text(&out.stderr));
    let out = peloton(
        &url,
        &[
            "hostpool",
            "move",
            "--to",
            "default",
            "sim-00000",
            "sim-00001",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton(&url, &["hostpool", "delete", "team-a"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pools = ok_json(&url, &["hostpool", "list"]).await;
    assert_eq!(pools["pools"].as_array().unwrap().len(), 1, "{pools}");
    server.shutdown().await.unwrap();
}

/// Secrets from files, kept across an update without `--secret`, replaced
/// or cleared on request; stateful and daemon examples with their volumes
/// and one instance per host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_volumes_and_daemons_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), 3).await;
    let url = common::url(server.addr);
    let ex = examples();
    let ex = |f: &str| ex.join(f).to_string_lossy().into_owned();
    let out = peloton(&url, &["respool", "create", &ex("pools.yaml")]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Secrets.
    let token = dir.path().join("token");
    std::fs::write(&token, b"s3cr3t-value").unwrap();
    let secret = format!("token={}", token.display());
    let job = ok_json(
        &url,
        &["job", "create", &ex("service.yaml"), "--secret", &secret],
    )
    .await;
    let id = job["job"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        job["job"]["secrets"],
        serde_json::json!([{"name": "token", "size": 12}])
    );
    let shown = text(
        &peloton(&url, &["-o", "json", "job", "get", &id])
            .await
            .stdout,
    );
    assert!(!shown.contains("s3cr3t"), "{shown}");
    let out = peloton(
        &url,
        &["job", "update", &id, &ex("service-v2.yaml"), "--no-wait"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = ok_json(&url, &["job", "get", &id]).await;
    assert_eq!(
        job["job"]["secrets"],
        serde_json::json!([{"name": "token", "size": 12}]),
        "an update without --secret keeps the secrets"
    );
    let out = peloton(
        &url,
        &[
            "job",
            "update",
            &id,
            &ex("service.yaml"),
            "--no-wait",
            "--clear-secrets",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = ok_json(&url, &["job", "get", &id]).await;
    assert_eq!(job["job"]["secrets"], serde_json::json!([]));
    let out = peloton(
        &url,
        &[
            "job",
            "create",
            &ex("hello.yaml"),
            "--secret",
            "token=/no/such/file",
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("secret token (/no/such/file)"),
        "{}",
        text(&out.stderr)
    );

    // A stateful job: a volume per instance, each pinned to its host.
    let job = ok_json(&url, &["job", "create", &ex("stateful.yaml")]).await;
    let stateful = job["job"]["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let volumes = loop {
        let v = ok_json(&url, &["volume", "list", "--job", &stateful]).await;
        if v["volumes"].as_array().unwrap().len() == 2 {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no two volumes: {v} {}",
            ok_json(&url, &["task", "list", &stateful]).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let tasks = ok_json(&url, &["task", "list", &stateful]).await;
    for (v, t) in volumes["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .zip(tasks["tasks"].as_array().unwrap())
    {
        assert_eq!(v["size_mb"], 100);
        assert_eq!(v["path"], "data");
        assert_eq!(v["host"], t["pinned_host"]);
        assert_eq!(v["id"], t["volume_id"]);
    }
    let vid = volumes["volumes"][0]["id"].as_str().unwrap().to_string();
    let out = peloton(&url, &["volume", "delete", &vid]).await;
    assert!(!out.status.success(), "a volume in use is not deleted");
    assert!(
        text(&out.stderr).contains("in use"),
        "{}",
        text(&out.stderr)
    );
    let v = ok_json(&url, &["volume", "get", &vid]).await;
    assert_eq!(v["in_use"], true);
    let out = peloton(&url, &["volume", "get", "no-such-volume"]).await;
    assert!(!out.status.success());

    // A daemon job: one instance on each of the three hosts.
    let job = ok_json(&url, &["job", "create", &ex("daemon.yaml")]).await;
    let daemon = job["job"]["id"].as_str().unwrap().to_string();
    loop {
        let tasks = ok_json(&url, &["task", "list", &daemon]).await;
        let mut hosts: Vec<String> = tasks["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["current"]["state"] == "running")
            .map(|t| t["current"]["host"].as_str().unwrap().to_string())
            .collect();
        hosts.sort();
        hosts.dedup();
        if hosts.len() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline + std::time::Duration::from_secs(60),
            "daemons on {hosts:?} only: {tasks}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let job = ok_json(&url, &["job", "get", &daemon]).await;
    assert_eq!(job["job"]["spec"]["instances"], 3);
    let out = peloton(&url, &["job", "scale", &daemon, "5"]).await;
    assert!(!out.status.success(), "a daemon job is not scaled");
}

/// `peloton` with `env` set and `stdin` piped in.
async fn peloton_with(server: &str, env: &[(&str, &str)], stdin: &str, args: &[&str]) -> Output {
    use tokio::io::AsyncWriteExt as _;
    let mut cmd = common::cli();
    cmd.arg("--server").arg(server).args(args);
    cmd.env_remove("PELOTON_POOL").envs(env.iter().copied());
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("the CLI starts");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("stdin written");
    drop(input);
    child.wait_with_output().await.expect("the CLI runs")
}

/// The everyday path: a one-line submit (`peloton run`, its pool from the
/// environment or the config file), `-q` for just the id, a spec from
/// stdin (`job create -`), and a unique start of an id in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_liners_quiet_ids_stdin_specs_and_id_prefixes() {
    let (dir, _server, url) = with_example_pools(4).await;

    // One line, waited for: only the id is printed, the exit code says it
    // succeeded.
    let out = peloton_with(
        &url,
        &[],
        "",
        &[
            "run",
            "--pool",
            "/demo",
            "-n",
            "2",
            "--cpu",
            "0.1",
            "--mem",
            "64",
            "-q",
            "--wait",
            "--",
            "/bin/echo",
            "hi",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let id = text(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 36, "only the id: {:?}", text(&out.stdout));
    // Its spec is the command line's.
    let job = ok_json(&url, &["job", "get", &id[..8]]).await["job"].clone();
    assert_eq!(job["id"], id.as_str(), "{job}");
    // Named after the command, with a random tail (names are unique
    // among a pool's unfinished jobs).
    let name = job["spec"]["name"].as_str().unwrap_or_default();
    assert!(
        name.starts_with("echo-") && name.len() == "echo-".len() + 6,
        "{job}"
    );
    assert_eq!(job["spec"]["pool"], "/demo", "{job}");
    assert_eq!(job["spec"]["instances"], 2, "{job}");
    assert_eq!(job["status"]["state"], "succeeded", "{job}");

    // The pool from PELOTON_POOL, else the config file's `pool`; with
    // neither, a clear refusal that names the flag.
    let out = peloton_with(
        &url,
        &[("PELOTON_POOL", "/demo")],
        "",
        &["run", "-q", "--", "/bin/true"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim().len(), 36);
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "pool: /demo\n").unwrap();
    let config = config.to_string_lossy().into_owned();
    let out = peloton_with(
        &url,
        &[("PELOTON_CONFIG", &config)],
        "",
        &["run", "-q", "--", "/bin/true"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton_with(&url, &[], "", &["run", "--", "/bin/true"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--pool"),
        "{}",
        text(&out.stderr)
    );

    // A spec from stdin.
    let spec = std::fs::read_to_string(examples().join("hello.yaml")).unwrap();
    let out = peloton_with(&url, &[], &spec, &["job", "create", "-q", "-"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let hello = text(&out.stdout).trim().to_string();
    assert_eq!(hello.len(), 36, "{hello:?}");
    let out = peloton(&url, &["job", "query", "-q", "--name", "hello"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), hello);
    // The caller's jobs: on this secure server, its token's.
    let out = peloton(&url, &["job", "query", "-q", "--mine"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).lines().any(|l| l == hello),
        "{}",
        text(&out.stdout)
    );
    let out = peloton(&url, &["job", "query", "-q", "--owner", "somebody-else"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "");

    // `-o yaml` of a job is its spec file: submitted again, the same spec.
    let out = peloton(&url, &["job", "get", "-o", "yaml", &hello]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let yaml = text(&out.stdout);
    assert!(
        yaml.starts_with(&format!("# job {hello} (version 1")),
        "{yaml}"
    );
    // While hello has not ended its name is held; once it has, the file
    // submits it again.
    let out = peloton_with(&url, &[], &yaml, &["job", "create", "-q", "-"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&hello) && text(&out.stderr).contains("distinct names"),
        "{}",
        text(&out.stderr)
    );
    let out = peloton(&url, &["job", "kill", &hello]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    json_until(&url, &["job", "get", &hello], "hello killed", |v| {
        v["job"]["status"]["state"] == "killed"
    })
    .await;
    let out = peloton_with(&url, &[], &yaml, &["job", "create", "-q", "-"]).await;
    assert!(out.status.success(), "{yaml}\n{}", text(&out.stderr));
    let again = text(&out.stdout).trim().to_string();
    let spec_of = async |id: &str| ok_json(&url, &["job", "get", id]).await["job"]["spec"].clone();
    assert_eq!(spec_of(&again).await, spec_of(&hello).await);
    // One name per field: `-o json`'s spec is the spec file, key for key
    // (`task`, `instances`, `sla.gang_size`, `overrides[].task`).
    let file = "name: gang\npool: /demo\ninstances: 2\nsla: {gang_size: 2, priority: 3}\n\
                task: {command: /bin/true, resources: {cpu: 0.1, memory_mb: 32}, sim: {duration_ms: 10}}\n\
                overrides: [{instance: 1, task: {command: /bin/false, resources: {cpu: 0.1, memory_mb: 32}}}]\n";
    let out = peloton_with(&url, &[], file, &["job", "create", "-q", "-"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let gang = text(&out.stdout).trim().to_string();
    let out = peloton(&url, &["job", "get", "-o", "yaml", &gang]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let yaml: Value = serde_norway::from_slice(&out.stdout).expect("YAML");
    let json = spec_of(&gang).await;
    assert_eq!(json, yaml);
    assert_eq!(json["sla"]["gang_size"], 2, "{json}");
    assert_eq!(json["instances"], 2, "{json}");
    assert_eq!(
        json["overrides"][0]["task"]["command"], "/bin/false",
        "{json}"
    );
    for api_name in ["default_task", "instance_count", "min_running_instances"] {
        assert!(!json.to_string().contains(api_name), "{json}");
    }
    // Other reads print their JSON's fields as YAML.
    let out = peloton(&url, &["job", "query", "-o", "yaml", "--name", "hello"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: serde_norway::Value = serde_norway::from_slice(&out.stdout).expect("YAML");
    assert_eq!(
        listed["jobs"].as_sequence().map(Vec::len),
        Some(2),
        "{}",
        text(&out.stdout)
    );
}

/// A failed `--wait` says why (each instance that did not succeed, its
/// exit and reason, on stderr); `job restart --failed` runs only those
/// again; killing a job that already ended says there is nothing to kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wait_says_why_and_only_failed_instances_restart() {
    let (_dir, _server, url) = with_example_pools(4).await;
    let task = |exit: i32| {
        format!(
            "{{command: /bin/true, resources: {{cpu: 0.1, memory_mb: 32}}, \
             restart: {{max_failures: 0}}, sim: {{duration_ms: 10, exit_code: {exit}}}}}"
        )
    };
    let spec = format!(
        "name: mixed\npool: /demo\ninstances: 3\ntask: {}\noverrides:\n  - {{instance: 1, task: {}}}\n",
        task(0),
        task(7)
    );
    let out = peloton_with(&url, &[], &spec, &["job", "create", "-q", "--wait", "-"]).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let id = text(&out.stdout).trim().to_string();
    let why = text(&out.stderr);
    assert!(
        why.contains(&format!("job {id} failed: 1 instance(s) did not succeed")),
        "{why}"
    );
    assert!(why.contains("instance 1: failed (run 1, exit 7"), "{why}");
    assert!(!why.contains("instance 0:"), "{why}");

    // Only instance 1 runs again.
    let out = peloton(&url, &["job", "restart", "--failed", &id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("restarting 1 failed instance(s)"),
        "{}",
        text(&out.stdout)
    );
    let tasks = ok_json(&url, &["task", "list", &id]).await;
    let runs: Vec<u64> = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["current"]["run_id"].as_u64().unwrap())
        .collect();
    assert_eq!(runs, [1, 2, 1], "{tasks}");

    // A job that ended: nothing to kill, said so, exit 0.
    let done = peloton_with(&url, &[], "name: done\npool: /demo\ntask: {command: /bin/true, resources: {cpu: 0.1, memory_mb: 32}, sim: {duration_ms: 10}}\n", &["job", "create", "-q", "--wait", "-"]).await;
    assert!(done.status.success(), "{}", text(&done.stderr));
    let done = text(&done.stdout).trim().to_string();
    let out = peloton(&url, &["job", "kill", &done]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("already ended (succeeded): nothing to kill"),
        "{}",
        text(&out.stderr)
    );
}

/// Dependencies between jobs through the CLI: a spec's `after` (a unique
/// start of an id will do) keeps the job pending, `job get` says what it
/// waits for (WAITING FOR; `status.waiting_for` in JSON), and it runs once
/// the job it waits for succeeded; one waiting for that job to fail is
/// killed, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_for_another_through_the_cli() {
    let (_dir, _server, url) = with_example_pools(2).await;
    let spec = |name: &str, after: &str| {
        format!(
            "name: {name}\npool: /demo\n{after}task:\n  command: /bin/true\n  \
             resources: {{cpu: 0.1, memory_mb: 32}}\n  sim: {{duration_ms: 3000}}\n"
        )
    };
    let create = async |yaml: String| {
        let out = peloton_with(&url, &[], &yaml, &["job", "create", "-q", "-"]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };
    let first = create(spec("first", "")).await;
    let then = create(spec(
        "then",
        &format!("after: {{succeeded: [{}]}}\n", &first[..8]),
    ))
    .await;
    let unless = create(spec("unless", &format!("after: {{failed: [{first}]}}\n"))).await;

    let out = peloton(&url, &["job", "get", &then]).await;
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        shown.contains(&format!("succeeded: {first}")) && shown.contains("WAITING FOR"),
        "{shown}"
    );
    let job = ok_json(&url, &["job", "get", &then]).await["job"].clone();
    assert_eq!(job["status"]["state"], "pending", "{job}");
    assert_eq!(
        job["status"]["waiting_for"]["succeeded"][0],
        first.as_str(),
        "{job}"
    );
    assert_eq!(
        job["spec"]["after"]["succeeded"][0],
        first.as_str(),
        "{job}"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let job = loop {
        let job = ok_json(&url, &["job", "get", &then]).await["job"].clone();
        if job["status"]["state"] == "succeeded" {
            break job;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(job["status"]["waiting_for"], Value::Null, "{job}");
    let job = ok_json(&url, &["job", "get", &unless]).await["job"].clone();
    assert_eq!(job["status"]["state"], "killed", "{job}");
    let task = ok_json(&url, &["task", "get", &unless, "0"]).await;
    assert!(
        task.to_string().contains(&format!(
            "dependency {first} succeeded: afternotok cannot be met"
        )),
        "{task}"
    );
}

/// A spec file in `dir` for a long batch job on the simulated hosts.
fn batch_file(dir: &std::path::Path, name: &str, extra: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\ntype: batch\npool: /demo\ninstances: 4\n{extra}\
             task:\n  command: /bin/true\n  resources: {{cpu: 0.1, memory_mb: 32}}\n  \
             sim: {{duration_ms: 600000, exit_code: 0}}\n"
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

async fn running_count(url: &str, id: &str) -> usize {
    let tasks = ok_json(url, &["task", "list", id]).await;
    tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["current"]["state"] == "running")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_job_is_edited_for_its_pending_instances_with_its_version() {
    let (dir, server, url) = with_example_pools(4).await;
    let spec = batch_file(
        dir.path(),
        "edit-me",
        "sla: {priority: 1, max_running_instances: 1}\n",
    );
    let out = peloton(&url, &["job", "create", "-q", &spec]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    for _ in 0..200 {
        if running_count(&url, &id).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(running_count(&url, &id).await, 1);

    // Nothing to change, and a stale version, are refused: exit 1, the
    // reason (the current version named), and nothing changes.
    let out = peloton(&url, &["job", "edit", &id]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nothing to change"),
        "{}",
        text(&out.stderr)
    );
    let out = peloton(
        &url,
        &["job", "edit", &id, "--priority", "9", "--version", "7"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the current version is 1"),
        "{}",
        text(&out.stderr)
    );

    // The edit: a new version and config; the cap lets one more run.
    let j = ok_json(
        &url,
        &[
            "job",
            "edit",
            &id,
            "--priority",
            "7",
            "--max-running",
            "2",
            "--max-running-time-ms",
            "900000",
            "--max-failures",
            "3",
            "--version",
            "1",
        ],
    )
    .await;
    assert_eq!(j["job"]["version"], 2, "{j}");
    let j = ok_json(&url, &["job", "get", &id]).await;
    let sla = &j["job"]["spec"]["sla"];
    assert_eq!(sla["priority"], 7, "{j}");
    assert_eq!(sla["max_running_instances"], 2, "{j}");
    assert_eq!(sla["max_running_time_ms"], 900000, "{j}");
    assert_eq!(
        j["job"]["spec"]["task"]["restart"]["max_failures"], 3,
        "{j}"
    );
    assert_eq!(j["job"]["status"]["config_version"], 2, "{j}");
    // Every instance tolerates the new failures, the one running at the
    // edit (still on config 1) too; task get says so.
    for i in ["0", "1"] {
        let t = ok_json(&url, &["task", "get", &id, i]).await;
        assert_eq!(t["task"]["max_failures"], 3, "{t}");
    }
    let t = ok_json(&url, &["task", "get", &id, "0"]).await;
    assert_eq!(t["task"]["config_version"], 1, "{t}");
    let out = peloton(&url, &["task", "get", &id, "0"]).await;
    assert!(
        text(&out.stdout)
            .lines()
            .any(|l| l.starts_with("MAX FAILURES") && l.trim_end().ends_with('3')),
        "{}",
        text(&out.stdout)
    );
    let mut running = 0;
    for _ in 0..200 {
        running = running_count(&url, &id).await;
        if running == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(running, 2);

    // `job update` of a batch job: a spec that changes only editable
    // fields is an edit; another change is refused naming the field.
    let raised = batch_file(
        dir.path(),
        "edit-me",
        "sla: {priority: 9, max_running_instances: 2, max_running_time_ms: 900000}\n",
    );
    // (The file has no max_failures: 0, a change from 3 too.)
    let out = peloton(&url, &["job", "update", &id, &raised]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("edited batch job"),
        "{}",
        text(&out.stdout)
    );
    let j = ok_json(&url, &["job", "get", &id]).await;
    assert_eq!(j["job"]["spec"]["sla"]["priority"], 9, "{j}");
    assert_eq!(
        // 0 is the default: the spec file leaves it out.
        j["job"]["spec"]["task"]["restart"]["max_failures"]
            .as_u64()
            .unwrap_or(0),
        0,
        "{j}"
    );
    assert_eq!(j["job"]["version"], 3, "{j}");
    let file = std::fs::read_to_string(&raised).unwrap();
    std::fs::write(
        &raised,
        file.replace("command: /bin/true", "command: /bin/false"),
    )
    .unwrap();
    let out = peloton(&url, &["job", "update", &id, &raised]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("task.command"),
        "{}",
        text(&out.stderr)
    );

    // A service is not edited: its spec rolls.
    let svc = ok_json(
        &url,
        &[
            "job",
            "create",
            &examples().join("service.yaml").to_string_lossy(),
        ],
    )
    .await;
    let sid = svc["job"]["id"].as_str().unwrap();
    let out = peloton(&url, &["job", "edit", sid, "--priority", "3"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("rolling update"),
        "{}",
        text(&out.stderr)
    );

    // The edit survives a restart of the server.
    server.shutdown().await.unwrap();
    let server = start_server(dir.path(), 4).await;
    let url = common::url(server.addr);
    let j = ok_json(&url, &["job", "get", &id]).await;
    assert_eq!(j["job"]["spec"]["sla"]["priority"], 9, "{j}");
    assert_eq!(j["job"]["spec"]["sla"]["max_running_instances"], 2, "{j}");
    assert_eq!(j["job"]["status"]["config_version"], 3, "{j}");
    assert_eq!(j["job"]["version"], 3, "{j}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_killed_by_label_or_owner_once_confirmed() {
    let (dir, server, url) = with_example_pools(4).await;
    let mut ids = Vec::new();
    for (name, team) in [("kx1", "x"), ("kx2", "x"), ("ky", "y")] {
        let spec = batch_file(dir.path(), name, &format!("labels: {{team: {team}}}\n"));
        let out = peloton(&url, &["job", "create", "-q", &spec]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        ids.push(text(&out.stdout).trim().to_owned());
    }
    let state = async |id: &str| {
        let j = ok_json(&url, &["job", "get", id]).await;
        j["job"]["status"]["state"].as_str().unwrap().to_owned()
    };
    let active = |s: &str| matches!(s, "initialized" | "pending" | "running");

    // Without a terminal and without --yes: listed, refused, none killed.
    let out = peloton(&url, &["job", "kill", "--selector", "team=x"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("refusing to kill 2 job(s)"), "{err}");
    assert!(
        err.contains(&ids[0]) && err.contains(&ids[1]) && !err.contains(&ids[2]),
        "{err}"
    );
    for id in &ids {
        assert!(active(&state(id).await), "{id}");
    }

    // --yes: the two are killed, the other runs on.
    let out = peloton(&url, &["job", "kill", "--selector", "team=x", "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!active(&state(&ids[0]).await));
    assert!(!active(&state(&ids[1]).await));
    assert!(active(&state(&ids[2]).await));

    // Nothing matches: said, and success.
    let out = peloton(&url, &["job", "kill", "--selector", "team=nobody", "--yes"]).await;
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("no active job matches"),
        "{}",
        text(&out.stderr)
    );

    // --mine: the caller's (on this secure server, its token's) jobs.
    let out = peloton(&url, &["job", "kill", "--mine", "--yes"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!active(&state(&ids[2]).await));

    // Ids still work, several at once; a selector with ids is refused.
    let out = peloton(&url, &["job", "kill", &ids[0], &ids[1]]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton(&url, &["job", "kill", &ids[0], "--selector", "team=x"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    server.shutdown().await.unwrap();
}

/// Cron jobs through the CLI: a bad schedule is refused naming its field
/// and creates nothing; a `schedule:` job shows its schedule and next tick,
/// its `-o yaml` is a spec file that creates it again, it survives a
/// restart of the server, and its first tick (within ~65 s: `* * * * *`)
/// creates a job `<id>-<minutes since the epoch>` that runs and is listed
/// in its ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_job_ticks_a_job_and_survives_a_restart_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), 2).await;
    let url = common::url(server.addr);
    let pools = examples().join("pools.yaml");
    let out = peloton(&url, &["respool", "create", &pools.to_string_lossy()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let spec = |schedule: &str| {
        format!(
            "name: nightly\npool: /demo\nschedule: {schedule}\ntask:\n  command: /bin/true\n  \
             resources: {{cpu: 0.1, memory_mb: 32}}\n  sim: {{duration_ms: 500}}\n"
        )
    };
    for (schedule, field) in [
        ("{cron: '61 * * * *'}", "schedule.cron"),
        ("{cron: '* * * *'}", "schedule.cron"),
        (
            "{cron: '@hourly', time_zone: Mars/Olympus}",
            "schedule.time_zone",
        ),
        (
            "{cron: '@hourly', keep_succeeded: 1000}",
            "schedule.keep_succeeded",
        ),
    ] {
        let out = peloton_with(&url, &[], &spec(schedule), &["job", "create", "-"]).await;
        assert!(!out.status.success(), "{schedule} was accepted");
        assert!(
            text(&out.stderr).contains(field),
            "{schedule}: {}",
            text(&out.stderr)
        );
    }
    let jobs = ok_json(&url, &["job", "query"]).await;
    assert_eq!(jobs["jobs"].as_array().map_or(0, |j| j.len()), 0, "{jobs}");

    let yaml =
        spec("{cron: '* * * * *', time_zone: Europe/Berlin, overlap: forbid, keep_succeeded: 1}");
    let out = peloton_with(&url, &[], &yaml, &["job", "create", "-q", "-"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();

    let out = peloton(&url, &["job", "get", &id]).await;
    let shown = text(&out.stdout);
    assert!(
        shown.contains("* * * * * (Europe/Berlin), overlap forbid, keep 1 succeeded, 1 failed")
            && shown.contains("NEXT TICK"),
        "{shown}"
    );
    // `-o yaml` is a spec file that creates the same cron job again.
    let out = peloton(&url, &["job", "get", &id, "-o", "yaml"]).await;
    let file = text(&out.stdout);
    assert!(
        file.contains("schedule:") && file.contains("overlap: forbid"),
        "{file}"
    );
    // Under the same name while the first one is scheduled: refused (a
    // pool's unfinished jobs have distinct names); renamed, it goes.
    let again = peloton_with(&url, &[], &file, &["job", "create", "-q", "-"]).await;
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("distinct names"),
        "{}",
        text(&again.stderr)
    );
    assert!(file.contains("name: nightly\n"), "{file}");
    let file = file.replace("name: nightly\n", "name: nightly-copy\n");
    let again = peloton_with(&url, &[], &file, &["job", "create", "-q", "-"]).await;
    assert!(again.status.success(), "{}", text(&again.stderr));
    let again = text(&again.stdout).trim().to_string();
    let copy = ok_json(&url, &["job", "get", &again]).await["job"].clone();
    let orig = ok_json(&url, &["job", "get", &id]).await["job"].clone();
    assert_eq!(copy["spec"]["schedule"], orig["spec"]["schedule"]);
    let out = peloton(&url, &["job", "kill", &again]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let killed = ok_json(&url, &["job", "get", &again]).await["job"].clone();
    assert_eq!(killed["status"]["state"], "killed", "{killed}");
    assert_eq!(killed["status"]["cron"]["next_tick_ms"], 0, "{killed}");

    // The schedule survives a restart.
    server.shutdown().await.unwrap();
    let server = start_server(dir.path(), 2).await;
    let url = common::url(server.addr);
    let job = ok_json(&url, &["job", "get", &id]).await["job"].clone();
    assert_eq!(job["status"]["state"], "running", "{job}");
    let next = job["status"]["cron"]["next_tick_ms"].as_u64().unwrap();
    assert!(next > 0 && next % 60_000 == 0, "{job}");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let tick = loop {
        let job = ok_json(&url, &["job", "get", &id]).await["job"].clone();
        if let Some(t) = job["status"]["cron"]["ticks"].get(0) {
            break t.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no tick: {job}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let at = tick["tick_ms"].as_u64().unwrap();
    assert_eq!(at, next, "the first tick after the restart: {tick}");
    let child = tick["job_id"].as_str().unwrap().to_string();
    assert_eq!(child, format!("{id}-{}", at / 60_000));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let job = ok_json(&url, &["job", "get", &child]).await["job"].clone();
        assert_eq!(job["spec"]["schedule"], Value::Null, "{job}");
        if job["status"]["state"] == "succeeded" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let jobs = ok_json(&url, &["job", "query", "--name", "nightly"]).await;
    assert!(jobs.to_string().contains(&child), "{jobs}");
    let out = peloton(&url, &["job", "get", &id]).await;
    assert!(text(&out.stdout).contains(&child), "{}", text(&out.stdout));
    server.shutdown().await.unwrap();
}

/// Polls `peloton -o json ARGS` until `done` holds of its answer (30 s).
async fn json_until(url: &str, args: &[&str], what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let v = ok_json(url, args).await;
        if done(&v) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited for {what}: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Destructive actions refuse and name the way out: moving hosts that run
/// tasks of other host pools says how many run where (and `--force` stops
/// them: they wait for hosts of their own pool); deleting a pool that
/// holds jobs says so (unfinished: kill them; ended: delete them, or
/// `--force` deletes them with it). Nothing changes on a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_actions_refuse_and_name_the_way_out() {
    let (_dir, _server, url) = with_example_pools(2).await;
    let spec = "name: long\npool: /demo\ninstances: 2\ntask: {command: /bin/true, \
                resources: {cpu: 0.5, memory_mb: 32}, sim: {duration_ms: 600000}}\n";
    let out = peloton_with(&url, &[], spec, &["job", "create", "-q", "-"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let running = |v: &Value| {
        v["tasks"]
            .as_array()
            .is_some_and(|t| t.len() == 2 && t.iter().all(|t| t["current"]["state"] == "running"))
    };
    let tasks = json_until(&url, &["task", "list", &id], "2 running", running).await;
    let mut per_host = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks["tasks"].as_array().unwrap() {
        *per_host
            .entry(t["current"]["host"].as_str().unwrap().to_string())
            .or_default() += 1;
    }

    let out = peloton(&url, &["hostpool", "create", "other"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let before = ok_json(&url, &["hostpool", "list"]).await;
    let move_all = [
        "hostpool",
        "move",
        "--to",
        "other",
        "sim-00000",
        "sim-00001",
    ];
    let out = peloton(&url, &move_all).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let why = text(&out.stderr);
    assert!(
        why.contains("2 task(s) of jobs outside host pool \"other\" run on these hosts"),
        "{why}"
    );
    for (host, n) in &per_host {
        assert!(why.contains(&format!("{host} ({n})")), "{why}");
    }
    assert!(why.contains("--force"), "{why}");
    assert_eq!(ok_json(&url, &["hostpool", "list"]).await, before);
    let tasks = ok_json(&url, &["task", "list", &id]).await;
    assert!(running(&tasks), "{tasks}");

    // Forced: the tasks stop and wait for a host of their own pool.
    let mut forced = move_all.to_vec();
    forced.push("--force");
    let out = peloton(&url, &forced).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tasks = json_until(&url, &["task", "list", &id], "both waiting again", |v| {
        v["tasks"].as_array().is_some_and(|t| {
            t.iter()
                .all(|t| t["current"]["run_id"] == 2 && t["current"]["host"] == "")
        })
    })
    .await;
    let reason = ok_json(&url, &["task", "get", &id, "0"]).await;
    assert!(
        reason.to_string().contains("moved to host pool other"),
        "{reason}\n{tasks}"
    );

    // A pool with an unfinished job: kill it first.
    let pools_before = ok_json(&url, &["respool", "list"]).await["pools"]
        .as_array()
        .unwrap()
        .len();
    let out = peloton(&url, &["respool", "delete", "/demo"]).await;
    assert_eq!(out.status.code(), Some(1));
    let why = text(&out.stderr);
    assert!(
        why.contains(&format!(
            "pool /demo has 1 unfinished job(s) ({id}); kill them first"
        )),
        "{why}"
    );
    let out = peloton(&url, &["job", "kill", &id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    json_until(&url, &["job", "get", &id], "killed", |v| {
        v["job"]["status"]["state"] == "killed"
    })
    .await;
    // Ended jobs: refused, naming how many and the way out.
    let out = peloton(&url, &["respool", "delete", "/demo"]).await;
    assert_eq!(out.status.code(), Some(1));
    let why = text(&out.stderr);
    assert!(why.contains("pool /demo holds 1 ended job(s)"), "{why}");
    assert!(why.contains("delete them first"), "{why}");
    assert!(why.contains("--force"), "{why}");
    assert!(ok_json(&url, &["job", "get", &id]).await["job"]["id"] == id.as_str());
    let out = peloton(&url, &["respool", "delete", "--force", "/demo"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton(&url, &["job", "get", &id]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    let pools_after = ok_json(&url, &["respool", "list"]).await["pools"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(pools_after + 1, pools_before);
}

/// A job's name in place of its id through the CLI: `POOL/NAME` names the
/// job of that pool in get, task get/list and kill; a bare name several
/// unfinished jobs carry is refused naming them and the way out; once one
/// of them is killed the bare name names the other. A name with a '/' is
/// refused, naming the file's field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_named_in_place_of_ids_through_the_cli() {
    let (dir, server, url) = with_example_pools(4).await;
    let demo = batch_file(dir.path(), "train", "");
    let batch = dir.path().join("train-batch.yaml");
    std::fs::write(
        &batch,
        std::fs::read_to_string(&demo)
            .unwrap()
            .replace("pool: /demo", "pool: /batch/adhoc"),
    )
    .unwrap();
    let batch = batch.to_string_lossy().into_owned();
    let mut ids = Vec::new();
    for file in [&demo, &batch] {
        let out = peloton(&url, &["job", "create", "-q", file]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        ids.push(text(&out.stdout).trim().to_owned());
    }
    let (a, b) = (&ids[0], &ids[1]);

    // A pool's unfinished jobs have distinct names: a second train in
    // /demo is refused, naming the job that holds the name.
    let out = peloton(&url, &["job", "create", "-q", &demo]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("already exists")
            && err.contains(a.as_str())
            && err.contains("\"train\"")
            && err.contains("distinct names"),
        "{err}"
    );
    // Commands without --name get distinct names of their own.
    let mut run_names = Vec::new();
    for _ in 0..2 {
        let out = peloton(
            &url,
            &["run", "--pool", "/demo", "-q", "--", "/bin/sleep", "60"],
        )
        .await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let id = text(&out.stdout).trim().to_owned();
        let job = ok_json(&url, &["job", "get", &id]).await;
        let name = job["job"]["spec"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(name.starts_with("sleep-"), "{job}");
        // Its name names it.
        let named = ok_json(&url, &["job", "get", &name]).await;
        assert_eq!(named["job"]["id"], id.as_str(), "{named}");
        run_names.push(name);
    }
    assert_ne!(run_names[0], run_names[1]);

    let job = ok_json(&url, &["job", "get", "/demo/train"]).await;
    assert_eq!(job["job"]["id"], a.as_str(), "{job}");
    let task = ok_json(&url, &["task", "get", "/batch/adhoc/train", "0"]).await;
    assert!(task.to_string().contains(b.as_str()), "{task}");
    let tasks = ok_json(&url, &["task", "list", "/demo/train"]).await;
    assert_eq!(tasks["tasks"].as_array().map(Vec::len), Some(4), "{tasks}");

    // Two unfinished jobs named train: refused, naming both.
    let out = peloton(&url, &["job", "get", "train"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("2 unfinished jobs are named \"train\"")
            && err.contains(a.as_str())
            && err.contains(b.as_str())
            && err.contains("POOL/NAME"),
        "{err}"
    );

    // Killed by its name; then the bare name names the other.
    let out = peloton(&url, &["job", "kill", "/demo/train"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    json_until(&url, &["job", "get", a], "the job killed", |v| {
        v["job"]["status"]["state"] == "killed"
    })
    .await;
    let job = ok_json(&url, &["job", "get", "train"]).await;
    assert_eq!(job["job"]["id"], b.as_str(), "{job}");

    // The killed train's name is free again: a new one takes it and the
    // name names the new one; the old one cannot be restarted meanwhile.
    let out = peloton(&url, &["job", "create", "-q", &demo]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c = text(&out.stdout).trim().to_owned();
    let job = ok_json(&url, &["job", "get", "/demo/train"]).await;
    assert_eq!(job["job"]["id"], c.as_str(), "{job}");
    let out = peloton(&url, &["job", "restart", a]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(c.as_str()) && err.contains("distinct names"),
        "{err}"
    );

    // A name that could not name its job: refused, naming the field.
    let out = peloton(
        &url,
        &["run", "--pool", "/demo", "--name", "x/y", "--", "/bin/true"],
    )
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("name") && err.contains("has a '/'"), "{err}");
    server.shutdown().await.unwrap();
}

/// `-o wide` adds columns to the list and get commands' tables; `-o name`
/// prints one `KIND/ID` a line, and a `job/ID` line names the job in the
/// next command (a pipe). Other commands refuse `-o name` as a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_and_name_output_through_the_cli() {
    let (dir, server, url) = with_example_pools(4).await;
    let spec = batch_file(dir.path(), "wide", "labels: {team: ml}\n");
    let out = peloton(&url, &["job", "create", "-q", &spec]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    let stdout = async |args: &[&str]| {
        let out = peloton(&url, args).await;
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };

    // Names, one a line.
    assert_eq!(
        stdout(&["job", "query", "-o", "name"]).await,
        format!("job/{id}\n")
    );
    assert_eq!(
        stdout(&["job", "get", "-o", "name", &id[..8]]).await,
        format!("job/{id}\n")
    );
    let tasks = stdout(&["task", "list", "-o", "name", &id]).await;
    let want: Vec<String> = (0..4).map(|i| format!("task/{id}/{i}")).collect();
    assert_eq!(tasks.lines().collect::<Vec<_>>(), want, "{tasks}");
    assert_eq!(
        stdout(&["task", "get", "-o", "name", &id, "2"]).await,
        format!("task/{id}/2\n")
    );
    let hosts = stdout(&["host", "list", "-o", "name"]).await;
    assert_eq!(hosts.lines().count(), 4, "{hosts}");
    assert!(hosts.lines().all(|l| l.starts_with("host/")), "{hosts}");
    let pools = stdout(&["respool", "list", "-o", "name"]).await;
    assert!(pools.lines().any(|l| l == "respool/demo"), "{pools}");
    assert_eq!(
        stdout(&["respool", "get", "-o", "name", "/demo"]).await,
        "respool/demo\n"
    );

    // Wide tables: the usual columns and more.
    let wide = stdout(&["job", "query", "-o", "wide"]).await;
    let header = wide.lines().next().unwrap();
    for column in [
        "ID", "NAME", "POOL", "CREATED", "PRIORITY", "VERSION", "LABELS",
    ] {
        assert!(header.contains(column), "{wide}");
    }
    assert!(wide.contains(&id) && wide.contains("team=ml"), "{wide}");
    let plain = stdout(&["job", "query"]).await;
    assert!(!plain.lines().next().unwrap().contains("LABELS"), "{plain}");
    let wide = stdout(&["job", "get", "-o", "wide", &id]).await;
    assert!(wide.lines().next().unwrap().contains("PRIORITY"), "{wide}");
    let wide = stdout(&["task", "list", "-o", "wide", &id]).await;
    let header = wide.lines().next().unwrap();
    for column in ["INSTANCE", "HOST", "JOB", "CONFIG", "EXIT", "FINISHED"] {
        assert!(header.contains(column), "{wide}");
    }
    assert_eq!(
        wide.lines().filter(|l| l.contains(&id)).count(),
        4,
        "{wide}"
    );
    let wide = stdout(&["task", "get", "-o", "wide", &id, "0"]).await;
    assert!(wide.lines().next().unwrap().contains("CONFIG"), "{wide}");
    let wide = stdout(&["host", "list", "-o", "wide"]).await;
    assert!(wide.lines().next().unwrap().contains("LAST SEEN"), "{wide}");
    let wide = stdout(&["respool", "list", "-o", "wide"]).await;
    assert!(wide.lines().next().unwrap().contains("DEMAND"), "{wide}");

    // Name lines name what they name in the next command: tasks (of one
    // job or several), hosts, pools.
    let out = peloton(
        &url,
        &["task", "get", "-o", "json", &format!("task/{id}/1")],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = tasks.lines().take(2).collect();
    let out = peloton(&url, &[&["task", "kill"][..], &lines].concat()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("instances 0, 1"),
        "{}",
        text(&out.stdout)
    );
    let out = peloton(&url, &["task", "kill", lines[0], "3"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("task/JOB/INSTANCE"),
        "{}",
        text(&out.stderr)
    );
    let host = hosts.lines().next().unwrap();
    for action in ["drain", "up"] {
        let out = peloton(&url, &["host", action, host]).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            !text(&out.stdout).contains("host/"),
            "{}",
            text(&out.stdout)
        );
    }
    let pool = ok_json(&url, &["respool", "get", "respool/demo"]).await;
    assert_eq!(pool["pool"]["path"], "/demo", "{pool}");

    // A job/ID line names the job in the next command.
    let line = stdout(&["job", "query", "-o", "name"]).await;
    let out = peloton(&url, &["job", "kill", line.trim()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    json_until(&url, &["job", "get", &id], "the job killed", |v| {
        v["job"]["status"]["state"] == "killed"
    })
    .await;

    // Elsewhere -o name is a usage error.
    let out = peloton(&url, &["hostpool", "list", "-o", "name"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("-o name"),
        "{}",
        text(&out.stderr)
    );
    server.shutdown().await.unwrap();
}

/// `cron run-now` starts a tick now (its job's id printed; it runs and
/// succeeds) and a second one in the same minute is refused; `cron
/// suspend` stops the ticks (job get says so, also after a restart of the
/// server) and `cron resume` brings them back. A job without a schedule
/// is refused. The cron job is named by its name throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_job_runs_now_and_is_suspended_and_resumed_through_the_cli() {
    let (dir, server, url) = with_example_pools(2).await;
    let yaml = "name: yearly\npool: /demo\nschedule: {cron: '0 0 1 1 *', overlap: forbid}\n\
                task:\n  command: /bin/true\n  resources: {cpu: 0.1, memory_mb: 32}\n  \
                sim: {duration_ms: 200}\n";
    let out = peloton_with(&url, &[], yaml, &["job", "create", "-q", "-"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();

    let out = peloton(&url, &["cron", "run-now", "yearly"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tick = text(&out.stdout).trim().to_string();
    assert!(tick.starts_with(&format!("{id}-")), "{tick}");
    // The tick's job is named after its tick, so the cron job's name
    // still names the cron job alone while the tick's job runs.
    let tick_job = ok_json(&url, &["job", "get", &tick]).await["job"].clone();
    let tick_name = tick_job["spec"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        tick_name,
        format!("yearly{}", &tick[id.len()..]),
        "{tick_job}"
    );
    // This minute's tick exists (or still runs: forbid): refused.
    let again = peloton(&url, &["cron", "run-now", "yearly"]).await;
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("exists already")
            || text(&again.stderr).contains("overlap: forbid"),
        "{}",
        text(&again.stderr)
    );
    json_until(
        &url,
        &["job", "get", &tick],
        "the tick's job to succeed",
        |v| v["job"]["status"]["state"] == "succeeded",
    )
    .await;
    let job = ok_json(&url, &["job", "get", &id]).await["job"].clone();
    assert_eq!(
        job["status"]["cron"]["ticks"][0]["job_id"],
        tick.as_str(),
        "{job}"
    );

    // Suspended: no next tick, said by job get; kept across a restart.
    let out = peloton(&url, &["cron", "suspend", "yearly"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = ok_json(&url, &["job", "get", &id]).await["job"].clone();
    assert_eq!(job["status"]["cron"]["suspended"], true, "{job}");
    assert_eq!(job["status"]["cron"]["next_tick_ms"], 0, "{job}");
    server.shutdown().await.unwrap();
    let server = start_server(dir.path(), 2).await;
    let url = common::url(server.addr);
    let out = peloton(&url, &["job", "get", &id]).await;
    assert!(
        text(&out.stdout).contains("suspended; `cron resume` resumes it"),
        "{}",
        text(&out.stdout)
    );
    let out = peloton(&url, &["cron", "resume", &id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = ok_json(&url, &["job", "get", &id]).await["job"].clone();
    assert_eq!(job["status"]["cron"]["suspended"], false, "{job}");
    assert!(
        job["status"]["cron"]["next_tick_ms"].as_u64().unwrap() > 0,
        "{job}"
    );

    // Not a cron job: refused, naming why.
    let plain = batch_file(dir.path(), "plain", "");
    let out = peloton(&url, &["job", "create", "-q", &plain]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = peloton(&url, &["cron", "suspend", "plain"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a cron job"),
        "{}",
        text(&out.stderr)
    );
    server.shutdown().await.unwrap();
}
