//! Every file in `examples/` runs to success on the quick start's cluster:
//! a real `pelotond --local-agents 3` (three real agents on this machine,
//! sharing its cores and memory) and the `peloton` binary, as the README
//! has a new user do it. The directory is read, not listed here, so a new
//! example is covered as soon as it is added:
//!
//! - a file with a top-level `pools:` is a pool tree, created first;
//! - `NAME-vN.yaml` next to `NAME.yaml` is an update of NAME's job, rolled
//!   out (`job update`) once that job runs, and must succeed;
//! - any other file is a job: a batch job must end SUCCEEDED; a service or
//!   stateful job must have every instance RUNNING (and HEALTHY when it has
//!   a health check); a daemon one RUNNING instance on every host.
//!
//! Subdirectories (such as `examples/peloton/`, Peloton's own format) are
//! covered by their own tests.
//!
//! Needs `pelotond` and `peloton-agent` next to `peloton` (`cargo test
//! --workspace` builds them; alone: `cargo build -p peloton-gateway -p
//! peloton-agent` first).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Per example: generous, for a busy two-core machine.
const TIMEOUT: Duration = Duration::from_secs(120);

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn sibling(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_peloton")).with_file_name(name);
    assert!(
        p.exists(),
        "{} not found: build it first (cargo build -p peloton-gateway -p peloton-agent)",
        p.display()
    );
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What a file of `examples/` is.
#[derive(Debug)]
enum Example {
    Pools(PathBuf),
    Job {
        path: PathBuf,
        kind: String,
        instances: u64,
        health_check: bool,
        /// `NAME-vN.yaml` files, in order.
        updates: Vec<PathBuf>,
    },
}

/// The examples in the order they run: pool files first, then jobs by
/// name, each with its updates.
fn examples() -> Vec<Example> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    // NAME-vN → NAME, when NAME.yaml is there too.
    let base_of = |stem: &str| -> Option<String> {
        let (base, version) = stem.rsplit_once("-v")?;
        (!version.is_empty()
            && version.bytes().all(|b| b.is_ascii_digit())
            && names.iter().any(|n| n == base))
        .then(|| base.to_owned())
    };
    let mut pools = Vec::new();
    let mut jobs: BTreeMap<String, Example> = BTreeMap::new();
    let mut updates: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for path in files {
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml"),
            "{}: examples are YAML files",
            path.display()
        );
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let yaml: Value = serde_norway::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if yaml.get("pools").is_some() {
            pools.push(Example::Pools(path));
        } else if let Some(base) = base_of(&stem) {
            updates.entry(base).or_default().push(path);
        } else {
            let task = &yaml["task"];
            jobs.insert(
                stem,
                Example::Job {
                    kind: yaml["type"].as_str().unwrap_or("batch").to_owned(),
                    instances: yaml["instances"].as_u64().unwrap_or(1),
                    health_check: !task["health_check"].is_null(),
                    path,
                    updates: Vec::new(),
                },
            );
        }
    }
    for (base, files) in updates {
        match jobs.get_mut(&base) {
            Some(Example::Job { updates, .. }) => updates.extend(files),
            _ => unreachable!("{base} has updates but is not a job"),
        }
    }
    pools.extend(jobs.into_values());
    pools
}

/// The quick start's cluster; SIGKILLs what is left of it when dropped.
struct QuickStart {
    server: Child,
    data: PathBuf,
    url: String,
    agents: Vec<u32>,
    stopped: bool,
}

impl QuickStart {
    async fn start(data: &Path) -> QuickStart {
        let mut server = Command::new(sibling("pelotond"))
            .arg("--data-dir")
            .arg(data)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--no-metrics",
                "--local-agents",
                "3",
            ])
            .arg("--agent-bin")
            .arg(sibling("peloton-agent"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("pelotond starts");
        let out = Arc::new(Mutex::new(String::new()));
        let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
        let seen = out.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut seen = seen.lock().unwrap();
                seen.push_str(&line);
                seen.push('\n');
            }
        });
        let (url, agents) = eventually("pelotond and its 3 agents", async || {
            let out = out.lock().unwrap().clone();
            let url = out
                .lines()
                .find_map(|l| l.strip_prefix("pelotond: serving gRPC on "))?
                .to_owned();
            let agents: Vec<u32> = out
                .lines()
                .filter_map(|l| l.split_once(" (pid ")?.1.split(',').next()?.parse().ok())
                .collect();
            (agents.len() == 3).then_some((url, agents))
        })
        .await;
        QuickStart {
            server,
            data: data.to_path_buf(),
            url,
            agents,
            stopped: false,
        }
    }

    async fn peloton(&self, args: &[&str]) -> Output {
        // pelotond is secure: TLS with the CA it made, and its admin token,
        // as the README has a new user set them.
        Command::new(env!("CARGO_BIN_EXE_peloton"))
            .env_remove("PELOTON_CONFIG")
            .env_remove("PELOTON_TOKEN")
            .env("XDG_CONFIG_HOME", &self.data)
            .env("PELOTON_CA_FILE", self.data.join("tls").join("ca.pem"))
            .env("PELOTON_TOKEN_FILE", self.data.join("admin-token"))
            .args(["--server", &self.url])
            .args(args)
            .output()
            .await
            .expect("peloton runs")
    }

    async fn ok(&self, args: &[&str]) -> String {
        let out = self.peloton(args).await;
        assert!(
            out.status.success(),
            "peloton {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    async fn json(&self, args: &[&str]) -> Value {
        let all: Vec<&str> = ["-o", "json"].iter().chain(args).copied().collect();
        let out = self.ok(&all).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("peloton {args:?}: {e}: {out}"))
    }

    fn sandbox_marker(&self) -> String {
        format!("PELOTON_SANDBOX={}", self.data.display())
    }
}

impl Drop for QuickStart {
    fn drop(&mut self) {
        let _ = self.server.start_kill();
        for pid in self.agents.iter().filter(|_| !self.stopped) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        for pid in processes_with_env(&self.sandbox_marker()) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Live processes whose environment has a variable starting with `needle`.
fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z');
        if !zombie
            && env
                .split(|&b| b == 0)
                .any(|v| v.starts_with(needle.as_bytes()))
        {
            out.push(pid);
        }
    }
    out
}

/// Polls `check` (every 100 ms) until it returns `Some`; the last value it
/// saw is in the panic message.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {TIMEOUT:?}: {what}"))
}

/// Waits until every task of the job runs (and is healthy when checked);
/// `instances`: how many (a daemon: one per host).
async fn wait_running(qs: &QuickStart, name: &str, id: &str, instances: usize, health: bool) {
    let mut last = Value::Null;
    let done = tokio::time::timeout(TIMEOUT, async {
        loop {
            let tasks = qs.json(&["task", "list", id]).await;
            let list = tasks["tasks"].as_array().cloned().unwrap_or_default();
            let ready = list
                .iter()
                .filter(|t| {
                    t["current"]["state"] == "running"
                        && (!health || t["current"]["health"] == "healthy")
                })
                .count();
            if list.len() == instances && ready == instances {
                return;
            }
            last = tasks;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "{name}: not every instance runs: {last:#}");
}

async fn wait_succeeded(qs: &QuickStart, name: &str, id: &str) {
    let mut last = Value::Null;
    let done = tokio::time::timeout(TIMEOUT, async {
        loop {
            let job = qs.json(&["job", "get", id]).await;
            let state = job["job"]["status"]["state"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            match state.as_str() {
                "succeeded" => return Ok(()),
                "failed" | "killed" => return Err(state),
                _ => {}
            }
            last = job;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    match done {
        Ok(Ok(())) => {}
        Ok(Err(state)) => {
            let tasks = qs.json(&["task", "list", id]).await;
            panic!("{name}: job {state}: {tasks:#}");
        }
        Err(_) => panic!("{name}: not succeeded within {TIMEOUT:?}: {last:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_runs_to_success_on_the_quick_start_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("peloton-data");
    let mut qs = QuickStart::start(&data).await;
    let hosts = eventually("3 hosts up", async || {
        let hosts = qs.json(&["host", "list"]).await;
        let up = hosts["hosts"]
            .as_array()?
            .iter()
            .filter(|h| h["state"] == "up" && h["connected"] == true)
            .count();
        (up == 3).then_some(hosts)
    })
    .await;
    // The table shows each host's isolation, as JSON does.
    let table = qs.ok(&["host", "list"]).await;
    assert!(table.contains("ISOLATION"), "{table}");
    let isolation = hosts["hosts"][0]["isolation"].as_str().unwrap().to_owned();
    assert!(!isolation.is_empty());
    for line in table.lines().filter(|l| l.starts_with("local-")) {
        assert!(line.contains(&isolation), "{line}");
    }

    let examples = examples();
    assert!(examples.len() >= 2, "{examples:?}");
    assert!(matches!(examples[0], Example::Pools(_)), "{examples:?}");
    let mut ran = Vec::new();
    for example in &examples {
        match example {
            Example::Pools(path) => {
                qs.ok(&["respool", "create", path.to_str().unwrap()]).await;
                ran.push(path.clone());
            }
            Example::Job {
                path,
                kind,
                instances,
                health_check,
                updates,
            } => {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let job = qs.json(&["job", "create", path.to_str().unwrap()]).await;
                let id = job["job"]["id"].as_str().expect("job id").to_owned();
                let instances = usize::try_from(*instances).unwrap();
                match kind.as_str() {
                    "batch" => wait_succeeded(&qs, &name, &id).await,
                    "service" | "stateful" => {
                        wait_running(&qs, &name, &id, instances, *health_check).await;
                    }
                    "daemon" => wait_running(&qs, &name, &id, 3, *health_check).await,
                    other => panic!("{name}: unknown job type {other}"),
                }
                ran.push(path.clone());
                for update in updates {
                    let out = qs
                        .peloton(&[
                            "job",
                            "update",
                            &id,
                            update.to_str().unwrap(),
                            "--batch-size",
                            "2",
                        ])
                        .await;
                    assert!(
                        out.status.success(),
                        "{}: {}{}",
                        update.display(),
                        text(&out.stdout),
                        text(&out.stderr)
                    );
                    wait_running(&qs, &name, &id, instances, *health_check).await;
                    let tasks = qs.json(&["task", "list", &id]).await;
                    // Every instance runs the new version.
                    for t in tasks["tasks"].as_array().unwrap() {
                        assert!(t["config_version"].as_u64() >= Some(2), "{t}");
                    }
                    ran.push(update.clone());
                }
            }
        }
    }
    let files = std::fs::read_dir(examples_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .count();
    assert_eq!(ran.len(), files, "ran {ran:?}");

    // The quick start's Ctrl-C leaves nothing running.
    let marker = qs.sandbox_marker();
    assert!(!processes_with_env(&marker).is_empty());
    let pid = qs.server.id().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(TIMEOUT, qs.server.wait())
        .await
        .expect("pelotond stops")
        .unwrap();
    qs.stopped = true;
    assert!(status.success(), "{status}");
    let left = processes_with_env(&marker);
    assert!(left.is_empty(), "task processes left: {left:?}");
}

/// The README's "Quick start" section: its `sh` blocks, in order.
fn quick_start_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(examples_dir().join("../README.md")).expect("README.md");
    let start = readme
        .find("\n## Quick start\n")
        .expect("a Quick start section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + 6..];
        let close = body.find("```").expect("a closed block");
        blocks.push(body[..close].to_owned());
        rest = &body[close + 3..];
    }
    blocks
}

/// The README's quick start, run as written: its build names every binary
/// the page then runs (not run here: the test's own build made them; they
/// stand in `target/release/` of a scratch checkout, beside `examples/`);
/// the main job's block runs through bash in that directory (the cluster on
/// a free port given by PELOTON_LISTEN, where the page's default is
/// 127.0.0.1:5391; the CLI told by PELOTON_SERVER), the first job's block through `bash
/// -e` in another process, as in a second terminal, and must print the
/// job's output; Ctrl-C then stops everything. The test command is the
/// one CI runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_runs_as_written() {
    let blocks = quick_start_blocks();
    let [build, main_job, first_job, test] = <[String; 4]>::try_from(blocks.clone())
        .unwrap_or_else(|_| panic!("build, run, first job, test: {blocks:#?}"));
    assert_eq!(test.trim(), "bash scripts/test.sh");
    let build_words: Vec<&str> = build.split_whitespace().collect();
    assert_eq!(build_words[..3], ["cargo", "build", "--release"], "{build}");
    let page = format!("{main_job}\n{first_job}");
    for (binary, package, used) in [
        ("pelotond", "peloton-gateway", "target/release/pelotond"),
        ("peloton-agent", "peloton-agent", "--local-agents"),
        ("peloton", "peloton-cli", "\npeloton "),
    ] {
        assert!(page.contains(used), "{binary} is not used as {used:?}");
        assert!(
            build_words.windows(2).any(|w| w == ["-p", package]),
            "the build does not build {binary} ({package}): {build}"
        );
    }
    assert!(
        first_job.contains("export PATH=$PWD/target/release:$PATH"),
        "{first_job}"
    );

    // The checkout as the build leaves it.
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    for name in ["pelotond", "peloton-agent"] {
        std::os::unix::fs::symlink(sibling(name), release.join(name)).unwrap();
    }
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_peloton"), release.join("peloton")).unwrap();
    std::os::unix::fs::symlink(examples_dir(), dir.path().join("examples")).unwrap();
    // The page's commands as written, on free ports (so two runs on one
    // machine, or a quick start running beside the test, do not collide):
    // pelotond takes them from PELOTON_LISTEN and PELOTON_METRICS_LISTEN,
    // the CLI from PELOTON_SERVER, where the page's defaults would be.
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let (port, metrics_port) = (free_port(), free_port());
    let shell = |script: &str| {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .current_dir(dir.path())
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join(".config"));
        for var in [
            "PELOTON_SERVER",
            "PELOTON_CONFIG",
            "PELOTON_TOKEN",
            "PELOTON_TOKEN_FILE",
            "PELOTON_CA_FILE",
            "PELOTON_CERT_FILE",
            "PELOTON_KEY_FILE",
            "PELOTON_POOL",
            "PELOTON_LISTEN",
            "PELOTON_METRICS_LISTEN",
        ] {
            cmd.env_remove(var);
        }
        cmd
    };
    let mut server = shell(main_job.trim())
        .env("PELOTON_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "PELOTON_METRICS_LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("bash runs");
    let data = dir.path().join("peloton-data");
    let marker = format!("PELOTON_SANDBOX={}", data.display());
    let guard = KillOnDrop(marker.clone());
    let out = Arc::new(Mutex::new(String::new()));
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let seen = out.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut seen = seen.lock().unwrap();
            seen.push_str(&line);
            seen.push('\n');
        }
    });
    eventually("the demo to finish", async || {
        let out = out.lock().unwrap().clone();
        assert!(!out.contains("demo: finished: JOB_STATE_FAILED"), "{out}");
        (out.contains(&format!(
            "pelotond: serving gRPC on https://127.0.0.1:{port}"
        )) && out.contains("demo: finished: JOB_STATE_SUCCEEDED"))
        .then_some(())
    })
    .await;

    let mut second = shell(&format!("set -e -o pipefail\n{first_job}"));
    second.env("PELOTON_SERVER", format!("127.0.0.1:{port}"));
    let done = second.output().await.expect("bash runs");
    let stdout = text(&done.stdout);
    assert!(
        done.status.success(),
        "the first job's block failed: {stdout}{}",
        text(&done.stderr)
    );
    assert!(stdout.contains("succeeded"), "{stdout}");
    assert!(stdout.contains("local-"), "{stdout}");
    assert_eq!(
        stdout.lines().last(),
        Some("hello from Peloton"),
        "{stdout}"
    );

    // Ctrl-C stops the cluster and its tasks.
    let pid = server.id().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(TIMEOUT, server.wait())
        .await
        .expect("pelotond stops")
        .unwrap();
    assert!(status.success(), "{status}: {}", out.lock().unwrap());
    let left = processes_with_env(&marker);
    assert!(left.is_empty(), "task processes left: {left:?}");
    drop(guard);
}

/// SIGKILLs every process whose environment holds the marker (a failed
/// test's tasks and agents).
struct KillOnDrop(String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in processes_with_env(&self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}
