//! Files in Peloton's own format through the `peloton` binary, against real
//! servers: every file under `examples/peloton/` on the README's
//! quick-start cluster (`pelotond --local-agents 3`: real agents, real
//! processes), in docs/peloton-compatibility.md's order (after `examples/pools.yaml` and a
//! job still running in /demo), where the jobs run to the end (services:
//! running and healthy); and, on a server with simulated hosts, the conversion round
//! trip, refusals that name the field, and keys in either case. And
//! uber/peloton's own files (tests/data/uber-peloton/): what each one
//! gives, as a table, and a sample of its batch jobs run on the quick
//! start's cluster to SUCCEEDED.
//!
//! The quick-start tests run `pelotond` and `peloton-agent` found next to
//! the `peloton` binary: `cargo test --workspace` builds them; for this
//! target alone, `cargo build -p peloton-gateway -p peloton-agent` first.
//! The simulated-host server is secure (see `common`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use peloton_cli::spec::{JobTypeName, load_job_file};
use peloton_gateway::config::Config;
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(90);

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The files of `examples/peloton/`, pools first.
fn peloton_examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples().join("peloton"))
        .expect("examples/peloton/ exists")
        .map(|e| e.expect("readable directory").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort_by_key(|p| (!is_pool_file(p), p.clone()));
    assert!(files.len() >= 3, "{files:?}");
    files
}

fn is_pool_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("respool"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `server`: an address of a test server (trusting the test CA, with the
/// admin token), or a config file (`*.yaml`) naming the server, its CA and
/// token (the secure quick start's).
async fn peloton(server: &str, args: &[&str]) -> Output {
    let (mut cmd, flag) = if server.ends_with(".yaml") {
        (common::bare_cli(), "--config")
    } else {
        (common::cli(), "--server")
    };
    cmd.arg(flag).arg(server).args(args);
    cmd.output().await.expect("the CLI runs")
}

async fn ok(server: &str, args: &[&str]) -> Output {
    let out = peloton(server, args).await;
    assert!(
        out.status.success(),
        "peloton {args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

async fn ok_json(server: &str, args: &[&str]) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    let out = ok(server, &all).await;
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("peloton {args:?}: not JSON ({e}): {}", text(&out.stdout)))
}

/// Polls `check` until it returns `Ok`; panics with the last `Err` after
/// [`TIMEOUT`].
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out waiting for {what}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `pelotond --local-agents 3` on a fresh data dir, as the README's quick
/// start runs it. Dropping it (also on a panic) stops the server, which
/// stops its agents, and kills any task process left from its sandboxes.
struct QuickStart {
    dir: tempfile::TempDir,
    server: std::process::Child,
    /// The CLI's config file for this cluster (see [`peloton`]).
    url: String,
}

impl QuickStart {
    async fn start() -> QuickStart {
        QuickStart::start_with(3).await
    }

    /// The quick start with `agents` local agents, which share this
    /// machine's cores and memory.
    async fn start_with(agents: u32) -> QuickStart {
        let cli = PathBuf::from(env!("CARGO_BIN_EXE_peloton"));
        let [pelotond, agent] = ["pelotond", "peloton-agent"].map(|name| {
            let p = cli.with_file_name(name);
            assert!(
                p.exists(),
                "{} not found: build it first (`cargo build -p peloton-gateway -p peloton-agent`; \
                 `cargo test --workspace` does)",
                p.display()
            );
            p
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = std::fs::File::create(dir.path().join("pelotond.log")).expect("log file");
        let server = std::process::Command::new(pelotond)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--no-metrics"])
            .args(["--local-agents", &agents.to_string(), "--agent-bin"])
            .arg(agent)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("pelotond starts");
        // pelotond is secure: the CLI reads where it is, its CA and its admin
        // token from a config file (paths relative to the file).
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "server: 127.0.0.1:{port}\nca_file: data/tls/ca.pem\n\
                 token_file: data/admin-token\n"
            ),
        )
        .expect("config file");
        let cluster = QuickStart {
            dir,
            server,
            url: config.to_string_lossy().into_owned(),
        };
        let url = cluster.url.clone();
        eventually("every agent host up", async || {
            let out = peloton(&url, &["--output", "json", "host", "list"]).await;
            let hosts: Value =
                serde_json::from_slice(&out.stdout).map_err(|_| text(&out.stderr))?;
            let up = hosts["hosts"]
                .as_array()
                .map_or(0, |h| h.iter().filter(|h| h["state"] == "up").count());
            if up == agents as usize {
                Ok(())
            } else {
                Err(hosts.to_string())
            }
        })
        .await;
        cluster
    }

    /// The tasks still running from this cluster's sandboxes.
    fn task_pids(&self) -> Vec<u32> {
        let marker = format!("PELOTON_SANDBOX={}", self.dir.path().display());
        std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
                    .filter(|pid| {
                        std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                            env.split(|b| *b == 0)
                                .any(|var| String::from_utf8_lossy(var).starts_with(&marker))
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for QuickStart {
    fn drop(&mut self) {
        // SIGTERM: the server stops its agents (and waits for them).
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.server.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline && matches!(self.server.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
        // Agents leave their tasks running by design; a test leaves none.
        for pid in self.task_pids() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    }
}

async fn job_state(url: &str, id: &str) -> String {
    let job = ok_json(url, &["job", "get", id]).await;
    job["job"]["status"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peloton_examples_run_on_the_quick_start_cluster() {
    let cluster = QuickStart::start().await;
    let url = cluster.url.clone();
    let url = url.as_str();
    // As the docs go: docs/user-guide.md first (the pools, a job that
    // ran, and one that keeps running in /demo, which from then on takes
    // no child pools), then the Peloton files.
    ok(
        url,
        &[
            "respool",
            "create",
            &path_str(&examples().join("pools.yaml")),
        ],
    )
    .await;
    let hello = path_str(&examples().join("hello.yaml"));
    ok(url, &["job", "create", &hello, "--wait"]).await;
    let daemon = path_str(&examples().join("daemon.yaml"));
    let daemon = ok_json(url, &["job", "create", &daemon]).await;
    let daemon = daemon["job"]["id"].as_str().expect("id").to_owned();
    eventually("the daemon running", async || {
        let state = job_state(url, &daemon).await;
        if state == "running" {
            Ok(())
        } else {
            Err(state)
        }
    })
    .await;
    const POOL: &str = "/peloton";
    for file in peloton_examples() {
        let file_str = path_str(&file);
        if is_pool_file(&file) {
            let created = ok(
                url,
                &["--output", "json", "respool", "create", POOL, &file_str],
            )
            .await;
            // Informational fields (owningTeam, ...) are said on stderr.
            assert!(
                text(&created.stderr).contains("note: "),
                "{}",
                text(&created.stderr)
            );
            let out: Value = serde_json::from_slice(&created.stdout).expect("JSON");
            let spec = &out["pools"][0]["spec"];
            assert_eq!(out["pools"][0]["path"], POOL, "{out}");
            // Its per-kind shares, and Peloton's gpu limit 0 as the smallest.
            assert_eq!(spec["shares"]["cpu"], 2.0, "{out}");
            assert_eq!(spec["shares"]["memory_mb"], 1.0, "{out}");
            assert_eq!(spec["limit"]["gpu"], 0.001, "{out}");
            continue;
        }
        let kind = load_job_file(&file)
            .unwrap_or_else(|e| panic!("{e}"))
            .value
            .job_type;
        match kind {
            JobTypeName::Batch => {
                // --wait exits 0 only if the job succeeded.
                let out = peloton(url, &["job", "create", POOL, &file_str, "--wait"]).await;
                assert!(
                    out.status.success(),
                    "{file_str}: {}{}",
                    text(&out.stdout),
                    text(&out.stderr)
                );
                let name = load_job_file(&file)
                    .map(|l| l.value.name)
                    .unwrap_or_default();
                let jobs = ok_json(url, &["job", "query", "--name", &name]).await;
                let job = &jobs["jobs"][0];
                assert_eq!(job["status"]["state"], "succeeded", "{job}");
                assert_eq!(job["spec"]["pool"], POOL, "{job}");
                let id = job["id"].as_str().expect("id").to_owned();
                let tasks = ok_json(url, &["task", "list", &id]).await;
                for t in tasks["tasks"].as_array().expect("tasks") {
                    assert_eq!(t["current"]["state"], "succeeded", "{t}");
                    assert!(
                        t["current"]["host"]
                            .as_str()
                            .unwrap_or("")
                            .starts_with("local-")
                    );
                }
                if file.ends_with("batch.yaml") {
                    // The merged instance config ran its own command.
                    let out = ok(url, &["task", "logs", &id, "0"]).await;
                    assert!(text(&out.stdout).contains("instance 0 has a command of its own"));
                    let out = ok(url, &["task", "logs", &id, "1"]).await;
                    assert!(
                        text(&out.stdout).contains(&format!("hello from instance 1 of {id}")),
                        "{}",
                        text(&out.stdout)
                    );
                }
            }
            JobTypeName::Application => {
                unreachable!("{file_str}: Peloton's files have no application jobs")
            }
            JobTypeName::Service | JobTypeName::Stateful | JobTypeName::Daemon => {
                let job = ok_json(url, &["job", "create", POOL, &file_str]).await;
                let id = job["job"]["id"].as_str().expect("id").to_owned();
                let n = job["job"]["spec"]["instances"].as_u64().expect("count");
                let tasks = eventually("every instance running and healthy", async || {
                    let tasks = ok_json(url, &["task", "list", &id]).await;
                    let list = tasks["tasks"].as_array().cloned().unwrap_or_default();
                    let ready = list.iter().filter(|t| {
                        t["current"]["state"] == "running"
                            && matches!(t["current"]["health"].as_str(), Some("healthy" | "none"))
                    });
                    if ready.count() as u64 == n {
                        Ok(list)
                    } else {
                        Err(tasks.to_string())
                    }
                })
                .await;
                assert_eq!(job_state(url, &id).await, "running");
                if file.ends_with("service.yaml") {
                    // Peloton's envname: the port under the name the file gave it.
                    let port = tasks[0]["current"]["ports"]["http"].as_u64().expect("port");
                    let out = ok(url, &["task", "logs", &id, "0"]).await;
                    assert!(
                        text(&out.stdout).contains(&format!("serving on port {port}")),
                        "{}",
                        text(&out.stdout)
                    );
                }
                ok(url, &["job", "kill", &id]).await;
                eventually("the service killed", async || {
                    let state = job_state(url, &id).await;
                    if state == "killed" {
                        Ok(())
                    } else {
                        Err(state)
                    }
                })
                .await;
            }
        }
    }
    ok(url, &["job", "kill", &daemon]).await;
    eventually("the daemon killed", async || {
        let state = job_state(url, &daemon).await;
        if state == "killed" {
            Ok(())
        } else {
            Err(state)
        }
    })
    .await;
    assert!(cluster.task_pids().is_empty(), "tasks left running");
}

/// A server with simulated hosts, in this process.
async fn sim_server(dir: &Path) -> peloton_gateway::server::Server {
    peloton_gateway::server::start(&Config {
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("address"),
        metrics_listen: None,
        sim_hosts: 4,
        cycle_interval_ms: 5,
        ..common::secure_config()
    })
    .await
    .expect("server starts")
}

/// Every key lowercased (`instanceCount:` → `instancecount:`), as in
/// Peloton's example/ files.
fn lowercase_keys(yaml: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    for c in yaml.chars().chain(std::iter::once('\n')) {
        if c.is_ascii_alphabetic() {
            word.push(c);
            continue;
        }
        if c == ':' {
            word.make_ascii_lowercase();
        }
        out.push_str(&word);
        word.clear();
        out.push(c);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversion_round_trips_and_bad_fields_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = sim_server(dir.path()).await;
    let url = common::url(server.addr);
    let url = url.as_str();
    ok(
        url,
        &[
            "respool",
            "create",
            &path_str(&examples().join("pools.yaml")),
        ],
    )
    .await;
    let spec_of = |job: &Value| job["job"]["spec"].clone();

    // Pools (first: /demo takes no children once it has jobs): created
    // from the Peloton file, then deleted and created again from its
    // conversion: the same spec.
    for file in peloton_examples().iter().filter(|f| is_pool_file(f)) {
        // Its name is the path's last part.
        let renamed = dir.path().join("converted.yaml");
        let yaml = std::fs::read_to_string(file).expect("read");
        std::fs::write(&renamed, yaml.replace("name: peloton", "name: converted")).expect("w");
        let renamed = path_str(&renamed);
        let first = ok_json(url, &["respool", "create", "/demo/converted", &renamed]).await;
        let out = peloton(url, &["respool", "create", "/demo/converted", &renamed]).await;
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        ok(url, &["respool", "delete", "/demo/converted"]).await;
        let out = ok(url, &["convert", "/demo/converted", &renamed]).await;
        let native = dir.path().join("native-pool.yaml");
        std::fs::write(&native, &out.stdout).expect("write");
        let second = ok_json(url, &["respool", "create", &path_str(&native)]).await;
        assert_eq!(first["pools"][0]["spec"], second["pools"][0]["spec"]);
        assert_eq!(second["pools"][0]["path"], "/demo/converted");
        ok(url, &["respool", "delete", "/demo/converted"]).await;
    }

    // Jobs: the one created from the Peloton file and the one created from
    // its conversion have the same spec. (Each is killed before the next
    // comes: a pool's unfinished jobs have distinct names.)
    let ended = async |job: &Value| {
        let id = job["job"]["id"].as_str().expect("id").to_owned();
        ok(url, &["job", "kill", &id]).await;
        for _ in 0..300 {
            let state = ok_json(url, &["job", "get", &id]).await["job"]["status"]["state"].clone();
            if ["killed", "succeeded", "failed"]
                .iter()
                .any(|s| state == *s)
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("job {id} did not end");
    };
    for file in peloton_examples().iter().filter(|f| !is_pool_file(f)) {
        let file_str = path_str(file);
        let from_peloton = ok_json(url, &["job", "create", "/demo", &file_str]).await;
        ended(&from_peloton).await;
        let out = ok(url, &["convert", "/demo", &file_str]).await;
        let converted = dir.path().join("converted.yaml");
        std::fs::write(&converted, &out.stdout).expect("write");
        let from_native = ok_json(url, &["job", "create", &path_str(&converted)]).await;
        ended(&from_native).await;
        assert_eq!(
            spec_of(&from_peloton),
            spec_of(&from_native),
            "{}",
            text(&out.stdout)
        );
        assert_eq!(spec_of(&from_peloton)["pool"], "/demo");

        // The same file with lowercase keys gives the same spec.
        let lower = dir.path().join("lower.yaml");
        let original = std::fs::read_to_string(file).expect("read");
        std::fs::write(&lower, lowercase_keys(&original)).expect("write");
        let from_lower = ok_json(url, &["job", "create", "/demo", &path_str(&lower)]).await;
        ended(&from_lower).await;
        assert_eq!(spec_of(&from_lower), spec_of(&from_peloton));
    }

    // Refusals: exit 2, the file and the field's path named, nothing made.
    let before = ok_json(url, &["job", "query"]).await["jobs"]
        .as_array()
        .map_or(0, Vec::len);
    let bad = dir.path().join("bad.yaml");
    let base = "name: bad\ninstanceCount: 1\ndefaultConfig:\n  resource: {cpuLimit: 0.1}\n  command: {value: 'true'}\n";
    for (extra, needle) in [
        (
            "  container: {type: 1, docker: {image: debian}}\n",
            "bad.yaml: defaultConfig.container: container images (Docker or Mesos) are not supported",
        ),
        (
            "  ports: [{name: http, value: 8080}]\n",
            "bad.yaml: defaultConfig.ports[0].value: static ports are not supported",
        ),
        (
            "  mesosSpec: {}\n",
            "bad.yaml: defaultConfig.mesosSpec: unknown field of Peloton's task config (TaskConfig)",
        ),
        (
            "sla: {minimumRunningInstance: 2}\n",
            "bad.yaml: sla.minimumRunningInstance: unknown field of Peloton's SlaConfig",
        ),
    ] {
        std::fs::write(&bad, format!("{base}{extra}")).expect("write");
        let out = peloton(url, &["job", "create", "/demo", &path_str(&bad)]).await;
        assert_eq!(out.status.code(), Some(2), "{extra}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(needle),
            "{extra}: {}",
            text(&out.stderr)
        );
        let out = peloton(url, &["convert", &path_str(&bad)]).await;
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(needle), "{}", text(&out.stderr));
    }
    std::fs::write(&bad, base).expect("write");
    let out = peloton(url, &["job", "create", "demo", &path_str(&bad)]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("RESPOOL: expected an absolute pool path"));
    std::fs::write(&bad, "name: other\nresources: [{kind: cpu, limit: 1}]\n").expect("write");
    let out = peloton(url, &["respool", "create", "/demo/one", &path_str(&bad)]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("name: \"other\" does not match the pool path /demo/one"),
        "{}",
        text(&out.stderr)
    );
    let after = ok_json(url, &["job", "query"]).await["jobs"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(after, before, "a refused file created a job");
    let pools = ok_json(url, &["respool", "list"]).await;
    let paths: Vec<&str> = pools["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert!(!paths.contains(&"/demo/one"), "{paths:?}");

    // The native format keeps working as it did, pool argument or not.
    let hello = path_str(&examples().join("hello.yaml"));
    let job = ok_json(url, &["job", "create", &hello]).await;
    assert_eq!(job["job"]["spec"]["pool"], "/demo");
    let job = ok_json(url, &["job", "create", "/batch/adhoc", &hello]).await;
    assert_eq!(job["job"]["spec"]["pool"], "/batch/adhoc");
    server.shutdown().await.expect("shutdown");
}

/// uber/peloton's own files (see tests/data/uber-peloton/README.md).
fn uber_peloton() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/uber-peloton")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("readable directory").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

/// What converting a file of uber/peloton gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Job,
    /// A batch job whose instance 0 is its controller task (its override).
    ControllerJob,
    Pool,
    /// Refused: the start of the error after the file's name (its field's
    /// path and why).
    Refused(&'static str),
}

const IMAGES: &str = "container images (Docker or Mesos) are not supported";

/// Every file of tests/data/uber-peloton/ and what it gives: a file refused
/// that is not listed here (or listed otherwise) fails the test.
const UBER_PELOTON: &[(&str, Expect)] = {
    use Expect::*;
    &[
        ("example/default_respool.yaml", Pool),
        (
            "example/helloworld_job.yaml",
            Refused("defaultconfig.container: "),
        ),
        ("example/helloworld_pool.yaml", Pool),
        // A template: Peloton's generate_instance_config.py adds the count.
        (
            "example/performance/testjob_base.yaml",
            Refused("instanceCount: missing: the number of instances"),
        ),
        ("example/performance/testjob_base_100k.yaml", Job),
        ("example/performance/testjob_base_50k.yaml", Job),
        ("example/performance/testjob_large_long.yaml", Job),
        ("example/performance/testjob_large_short.yaml", Job),
        ("example/performance/testjob_xlarge_short.yaml", Job),
        (
            "example/test_http_health.yaml",
            Refused("defaultconfig.command.uris: fetching URIs into the sandbox is not supported"),
        ),
        ("example/test_http_no_container.yaml", Job),
        // Instance 0 a controller; fdlimit.
        ("example/testjob.yaml", ControllerJob),
        (
            "example/testjob_docker.yaml",
            Refused("defaultconfig.container: "),
        ),
        (
            "example/testjob_gpu_mesos_containerizer.yaml",
            Refused("defaultconfig.container: "),
        ),
        ("example/testjob_host_affinity_constraint.yaml", Job),
        (
            "example/testjob_persistent_volume_docker.yaml",
            Refused("defaultconfig.container: "),
        ),
        ("example/testjob_revocable.yaml", Job),
        ("example/testjob_stateless_preemptible.yaml", Job),
        ("example/testjob_stateless_revocable.yaml", Job),
        ("example/testjob_stateless_service.yaml", Job),
        ("example/testjob_stateless_service_host_limit.yaml", Job),
        (
            "example/testjob_unified.yaml",
            Refused("defaultconfig.container: "),
        ),
        // A default health check with an empty command that every instance
        // overrides.
        ("example/testjob_with_health_check.yaml", Job),
        ("pkg/cli/testdata/test_respool_parent.yaml", Pool),
        (
            "tests/integration/aurorabridge_test/test_configs/test_dc_labrat.yaml",
            Refused("this is an Aurora job update request"),
        ),
        ("tests/integration/test_configs/long_running_job.yaml", Job),
        (
            "tests/integration/test_configs/long_running_job_update_instances.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_canary_respool.yaml",
            Pool,
        ),
        (
            "tests/integration/test_configs/test_controller_job.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_hostreservation_job_large.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_hostreservation_job_median.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_hostreservation_pool.yaml",
            Pool,
        ),
        (
            "tests/integration/test_configs/test_job.yaml",
            Refused("defaultConfig.container: "),
        ),
        (
            "tests/integration/test_configs/test_job_fail.yaml",
            Refused("defaultConfig.container: "),
        ),
        (
            "tests/integration/test_configs/test_job_host_affinity_constraint.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_job_no_container.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_job_revocable.yaml",
            Refused("defaultConfig.container: "),
        ),
        (
            "tests/integration/test_configs/test_job_succecced_controller_task.yaml",
            ControllerJob,
        ),
        (
            "tests/integration/test_configs/test_non_preemptible_job.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_preemptible_job.yaml",
            Job,
        ),
        // killOnPreempt; even instances non-preemptible.
        (
            "tests/integration/test_configs/test_preemptible_job_preemption_override.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_preemptible_job_preemption_policy.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_preemptible_job_preemption_restart_policy.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_preemption_pool_A.yaml",
            Pool,
        ),
        (
            "tests/integration/test_configs/test_preemption_pool_B.yaml",
            Pool,
        ),
        ("tests/integration/test_configs/test_respool.yaml", Pool),
        (
            "tests/integration/test_configs/test_respool_controller_limit.yaml",
            Pool,
        ),
        (
            "tests/integration/test_configs/test_stateful_job.yaml",
            Refused("defaultConfig.container: "),
        ),
        // changeLog given twice.
        (
            "tests/integration/test_configs/test_stateless_job.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_stateless_job_failed_health_check_config.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_stateless_job_host_limit_1.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_stateless_job_large.yaml",
            Job,
        ),
        (
            "tests/integration/test_configs/test_stateless_respool.yaml",
            Pool,
        ),
        // Its count is set by the test that uses it.
        (
            "tests/integration/test_configs/test_task.yaml",
            Refused("defaultConfig.container: "),
        ),
        (
            "tests/integration/test_configs/test_update_stateless_job_large.yaml",
            Job,
        ),
    ]
};

/// Each file as `peloton convert` and `job create` / `respool create` read
/// it: accepted or refused as [`UBER_PELOTON`] says, and what is accepted
/// passes the server's own checks of a job or pool spec.
#[test]
fn uber_peloton_files_are_accepted_or_refused_by_name() {
    let root = uber_peloton();
    let mut files = Vec::new();
    yaml_files(&root, &mut files);
    let mut found: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(&root)
                .expect("under root")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    found.sort();
    let listed: Vec<String> = UBER_PELOTON.iter().map(|(f, _)| (*f).to_owned()).collect();
    assert_eq!(found, listed, "the table lists every file, in order");
    let mut failures = Vec::new();
    for (rel, expect) in UBER_PELOTON {
        let file = root.join(rel);
        let origin = file.display().to_string();
        let got = match peloton_cli::spec::convert_file(&file, None) {
            Err(e) => {
                let text = e.to_string();
                let reason = text
                    .strip_prefix(&format!("{origin}: "))
                    .unwrap_or(&text)
                    .to_owned();
                match expect {
                    Expect::Refused(start) if reason.starts_with(start) => continue,
                    _ => format!("refused: {reason}"),
                }
            }
            Ok(_) if matches!(expect, Expect::Refused(_)) => "accepted".to_owned(),
            Ok(_) if *expect == Expect::Pool => {
                let pools = peloton_cli::spec::load_pool_file(&file, None)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .value;
                let entry = pools[0].clone().into_entry();
                match peloton_gateway::convert::pool_config(Some(&entry.spec)) {
                    Ok(_) => continue,
                    Err(e) => format!("a pool the server refuses: {}", e.message()),
                }
            }
            Ok(_) => {
                let mut spec =
                    peloton_cli::spec::load_job_spec(&file).unwrap_or_else(|e| panic!("{e}"));
                if spec.pool.is_empty() {
                    spec.pool = "/p".into();
                }
                match peloton_gateway::convert::job_plan(&spec, &Default::default()) {
                    Ok(plan) => match (expect, plan.has_controller_instance()) {
                        (Expect::Job, false) | (Expect::ControllerJob, true) => continue,
                        (_, false) => "a job".to_owned(),
                        (_, true) => "a job whose instance 0 is its controller task".to_owned(),
                    },
                    Err(e) => format!("a job the server refuses: {}", e.message()),
                }
            }
        };
        failures.push(format!("{rel}: expected {expect:?}, got {got}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Refused only for container images, fetched URIs, a count left to a
    // script, and not being a job config at all.
    for (rel, expect) in UBER_PELOTON {
        if let Expect::Refused(start) = expect {
            let text = peloton_cli::spec::convert_file(&root.join(rel), None)
                .unwrap_err()
                .to_string();
            assert!(
                text.contains(IMAGES)
                    || text.contains("URIs")
                    || text.contains("instanceCount: missing")
                    || text.contains("Aurora"),
                "{rel}: {start}: {text}"
            );
        }
    }
}

/// A sample of uber/peloton's batch jobs that [`UBER_PELOTON`] accepts,
/// run unchanged on the quick start's cluster in Peloton's own pools, to
/// the end: every task SUCCEEDED. The sample is what can run here and
/// soon: the commands exist on any host (`echo`, `sleep`), and the memory
/// is more than a shell needs (most of Peloton's files ask for 0.1 or
/// 2 MB). Peloton's other short batch jobs need a few GB of memory per
/// task, 50,000 tasks, or a host named `peloton-mesos-agent0`; the rest
/// sleep for minutes.
///
/// These files ask for a whole core per task: the cluster has at most one
/// agent per core (the quick start's three on three cores or more).
///
/// Peloton's `test_job_succecced_controller_task.yaml` runs too: its
/// workers (`sleep 1; exit 1`) fail, its controller task (instance 0,
/// `sleep 2; echo …`) succeeds, and the job SUCCEEDED, as in Peloton.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uber_peloton_batch_jobs_run_to_success_on_the_quick_start_cluster() {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let cluster = QuickStart::start_with(cores.clamp(1, 3) as u32).await;
    let url = cluster.url.clone();
    let url = url.as_str();
    let root = uber_peloton().join("tests/integration/test_configs");
    // Peloton's pools for these jobs, as its integration tests create
    // them (under the root, named by their `name`).
    for pool in ["test_respool.yaml", "test_hostreservation_pool.yaml"] {
        ok(url, &["respool", "create", &path_str(&root.join(pool))]).await;
    }
    // Each file, its pool, and whether its instance 0 is a controller task
    // (the job ends as that task does, whatever the others did).
    let sample = [
        // 100 × `echo` (shell: false; `arguments[0]` is argv[0]).
        (
            "test_job_no_container.yaml",
            "/TestPelotonResPool_integration",
            false,
        ),
        // 3 × 1 GB, `echo … && sleep 30`.
        (
            "test_hostreservation_job_large.yaml",
            "/TestPelotonResPool_hostreservation",
            false,
        ),
        // 3 × 0.1 core.
        (
            "test_job_succecced_controller_task.yaml",
            "/TestPelotonResPool_integration",
            true,
        ),
    ];
    let mut jobs = Vec::new();
    for (file, pool, controller) in sample {
        let file = path_str(&root.join(file));
        let created = ok(url, &["--output", "json", "job", "create", pool, &file]).await;
        // fdLimit, said on stderr.
        assert!(
            text(&created.stderr).contains("fdLimit: ignored"),
            "{}",
            text(&created.stderr)
        );
        let job: Value = serde_json::from_slice(&created.stdout).expect("JSON");
        let id = job["job"]["id"].as_str().expect("id").to_owned();
        jobs.push((file, id, controller));
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    for (file, id, controller) in &jobs {
        loop {
            let state = job_state(url, id).await;
            if matches!(state.as_str(), "succeeded" | "failed" | "killed") {
                let tasks = ok_json(url, &["task", "list", id]).await;
                assert_eq!(state, "succeeded", "{file}: {tasks}");
                let tasks = tasks["tasks"].as_array().expect("tasks");
                assert!(!tasks.is_empty(), "{file}");
                for t in tasks {
                    let state = &t["current"]["state"];
                    if *controller && t["instance"] != 0 {
                        // Failed, or stopped if the controller ended first.
                        assert!(state == "failed" || state == "killed", "{file}: {t}");
                    } else {
                        assert_eq!(state, "succeeded", "{file}: {t}");
                    }
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{file}: still {state} after 300 s: {}",
                ok_json(url, &["task", "list", id]).await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    assert!(cluster.task_pids().is_empty(), "tasks left running");
}
