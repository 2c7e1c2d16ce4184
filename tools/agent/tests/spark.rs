//! Spark on Peloton, for real: pyspark drivers (the pinned `pyspark` from
//! PyPI, `tools/spark/PYSPARK_VERSION`) with the plugin of `tools/spark`
//! (built here with the system JDK), JVM executors run by three real
//! agents, and the scheduler's own API read to check what happened:
//!
//! - dynamic allocation grows to its maximum while there is work and
//!   shrinks to nothing once idle, and the result is right;
//! - a second application in a small pool waits, with a reason, and
//!   finishes once the first lets its executors go;
//! - an executor's host dies mid-job: Spark gets a replacement and the
//!   result is right;
//! - executors preempted by a higher-priority pool are not counted as task
//!   failures (`spark.task.maxFailures=1` would fail the job otherwise);
//! - cluster mode: drivers are controller tasks of their jobs, and a pool
//!   full of them still runs their executors.
//!
//! The server is secure, as by default: drivers reach its JSON/HTTP mirror
//! over https, trusting the test CA (`spark.peloton.caFile` or
//! `PELOTON_CA_FILE`), with a SUBMITTER token for their pool only (from
//! `spark.peloton.tokenFile`, `PELOTON_TOKEN_FILE` or `PELOTON_TOKEN`; a
//! cluster-mode driver gets its token as a job secret).
//!
//! Needs `java`/`javac` and `python3` with pyspark; without them these
//! tests say so and pass, unless `PELOTON_REQUIRE_SPARK` is set (as CI does
//! after installing them).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{Cluster, kill_processes_with_env, pki};
use peloton_proto::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// One Spark test at a time: each runs several JVMs on a small machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a driver may take.
const DRIVER_TIMEOUT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn wordcount() -> PathBuf {
    repo().join("tools/spark/python/wordcount.py")
}

/// The Python interpreter that has pyspark (its real path: tasks run with
/// a bare environment, where a shim may not work).
fn python() -> Option<String> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys, pyspark; print(sys.executable)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The plugin's jar, built once per test binary; `None` (with a note)
/// where Spark's side is missing and not required.
fn plugin() -> Option<(PathBuf, String)> {
    static JAR: OnceLock<Option<(PathBuf, String)>> = OnceLock::new();
    JAR.get_or_init(|| {
        let required = std::env::var_os("PELOTON_REQUIRE_SPARK").is_some();
        let missing = |what: &str| {
            assert!(!required, "{what} (PELOTON_REQUIRE_SPARK is set)");
            eprintln!(
                "SKIPPED: {what}; install a JDK and `pip install pyspark` to run the Spark tests"
            );
            None
        };
        let Some(python) = python() else {
            return missing("python3 with pyspark not found");
        };
        let out_dir = repo().join("target/spark-test");
        let built = std::process::Command::new("bash")
            .arg(repo().join("tools/spark/build.sh"))
            .arg(&out_dir)
            .output();
        match built {
            Ok(o) if o.status.success() => Some((out_dir.join("peloton-spark.jar"), python)),
            Ok(o) => missing(&format!(
                "the plugin does not build: {}",
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => missing(&format!("cannot run tools/spark/build.sh: {e}")),
        }
    })
    .clone()
}

fn master(cluster: &Cluster) -> String {
    format!("peloton://127.0.0.1:{}", cluster.port)
}

/// A new token `name`, SUBMITTER on `pool`'s subtree (all a driver needs);
/// its secret.
async fn submitter_token(cluster: &Cluster, name: &str, pool: &str) -> String {
    let mut access = pb::access_service_client::AccessServiceClient::new(cluster.channel());
    access
        .create_token(pb::CreateTokenRequest {
            name: name.into(),
            grants: vec![pb::Grant {
                role: pb::Role::Submitter as i32,
                pool: pool.into(),
            }],
        })
        .await
        .expect("create token")
        .into_inner()
        .secret
}

/// [`submitter_token`] in a file only its owner may read; the file.
async fn submitter_token_file(cluster: &Cluster, name: &str, pool: &str) -> PathBuf {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let secret = submitter_token(cluster, name, pool).await;
    let path = cluster.dir.path().join(format!("{name}.token"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("token file");
    writeln!(file, "{secret}").expect("token file");
    path
}

/// How a driver learns the server's CA and its token.
enum Credentials {
    /// `spark.peloton.caFile` and `spark.peloton.tokenFile` (a file).
    Conf(PathBuf),
    /// `PELOTON_CA_FILE` and `PELOTON_TOKEN` (the token itself).
    Env(String),
    /// `PELOTON_CA_FILE` only, no token.
    CaOnly,
}

/// A driver (client mode) started on this machine, for `pool`, with a
/// SUBMITTER token named `token` on it.
async fn driver(
    cluster: &Cluster,
    jar: &Path,
    python: &str,
    pool: &str,
    token: &str,
    args: &[&str],
) -> tokio::process::Child {
    let credentials = Credentials::Conf(submitter_token_file(cluster, token, pool).await);
    driver_with(cluster, jar, python, pool, credentials, args)
}

fn driver_with(
    cluster: &Cluster,
    jar: &Path,
    python: &str,
    pool: &str,
    credentials: Credentials,
    args: &[&str],
) -> tokio::process::Child {
    let mut command = Command::new(python);
    command
        .arg(wordcount())
        .arg(master(cluster))
        .arg(jar)
        .arg(pool)
        .args(["--local", "--conf", "spark.peloton.executor.cpus=1"])
        // Nothing from the environment of whoever runs the tests.
        .env_remove("PELOTON_CA_FILE")
        .env_remove("PELOTON_TOKEN")
        .env_remove("PELOTON_TOKEN_FILE");
    match credentials {
        Credentials::Conf(token_file) => {
            let conf = |key: &str, path: &Path| format!("{key}={}", path.display());
            command
                .arg("--conf")
                .arg(conf("spark.peloton.caFile", &pki().ca_file))
                .arg("--conf")
                .arg(conf("spark.peloton.tokenFile", &token_file));
        }
        Credentials::Env(token) => {
            command
                .env("PELOTON_CA_FILE", &pki().ca_file)
                .env("PELOTON_TOKEN", token);
        }
        Credentials::CaOnly => {
            command.env("PELOTON_CA_FILE", &pki().ca_file);
        }
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 starts")
}

/// Waits for a driver; its stdout, which must show the right result.
async fn finished(mut child: tokio::process::Child, what: &str) -> String {
    let mut out = String::new();
    let mut err = String::new();
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let status = tokio::time::timeout(DRIVER_TIMEOUT, async {
        let (a, b) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        a.and(b).expect("driver output");
        child.wait().await.expect("wait")
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the driver did not finish in {DRIVER_TIMEOUT:?}"));
    let tail: String = err
        .lines()
        .rev()
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        status.success(),
        "{what}: driver {status}\n{out}\n--- stderr (end) ---\n{tail}"
    );
    let line = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key).map(str::to_owned))
            .unwrap_or_else(|| panic!("{what}: no {key} in\n{out}\n{tail}"))
    };
    assert_eq!(line("RESULT "), line("EXPECTED "), "{what}");
    out
}

async fn create_pool(cluster: &Cluster, path: &str, spec: pb::PoolSpec) {
    let mut pools = cluster.c.pools.clone();
    pools
        .create(pb::CreatePoolRequest {
            path: path.into(),
            spec: Some(spec),
        })
        .await
        .expect("pool");
}

fn cpu_mem(cpu: f64, memory_mb: f64) -> Option<pb::Resources> {
    Some(pb::Resources {
        cpu,
        memory_mb,
        ..Default::default()
    })
}

async fn app(cluster: &Cluster, id: &str) -> pb::Application {
    let mut apps = cluster.c.apps.clone();
    apps.get(pb::GetAppRequest { app_id: id.into() })
        .await
        .expect("get app")
        .into_inner()
        .app
        .expect("app")
}

/// The application registered in `pool` (waits for its driver to register).
async fn app_in(cluster: &Cluster, pool: &str) -> String {
    app_in_other_than(cluster, pool, "").await
}

/// An application registered in `pool` other than `known`.
async fn app_in_other_than(cluster: &Cluster, pool: &str, known: &str) -> String {
    let mut jobs = cluster.c.jobs.clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let found = jobs
            .query(pb::QueryJobsRequest {
                pool: pool.into(),
                ..Default::default()
            })
            .await
            .expect("query")
            .into_inner()
            .jobs
            .into_iter()
            .find(|j| {
                j.id != known
                    && j.spec
                        .as_ref()
                        .is_some_and(|s| s.r#type == pb::JobType::Application as i32)
            });
        if let Some(j) = found {
            return j.id;
        }
        assert!(
            Instant::now() < deadline,
            "no application registered in {pool}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls the application until `ok`, up to `secs`.
async fn wait_app(
    cluster: &Cluster,
    id: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&pb::Application) -> bool,
) -> pb::Application {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let a = app(cluster, id).await;
        if ok(&a) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {a:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_allocation_grows_to_its_maximum_and_shrinks_to_zero() {
    let Some((jar, python)) = plugin() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start(3).await;
    create_pool(&cluster, "/spark", pb::PoolSpec::default()).await;
    let child = driver(
        &cluster,
        &jar,
        &python,
        "/spark",
        "dynamic",
        &[
            "--dynamic",
            "--max-executors",
            "4",
            "--idle-timeout",
            "3s",
            "--partitions",
            "16",
            "--sleep",
            "1.5",
            "--linger",
            "90",
        ],
    )
    .await;
    let id = app_in(&cluster, "/spark").await;
    // While it works: four executors, read from the scheduler.
    let a = wait_app(&cluster, &id, 120, "4 executors running", |a| {
        a.running == 4
    })
    .await;
    assert!(a.executors.iter().all(|e| !e.host.is_empty()), "{a:#?}");
    // Idle: none left, the application still registered (its driver
    // lingers).
    let a = wait_app(&cluster, &id, 120, "no executor once idle", |a| {
        a.running == 0 && a.pending == 0
    })
    .await;
    assert!(!a.unregistered, "{a:#?}");
    assert!(a.exited >= 4, "{a:#?}");
    let out = finished(child, "dynamic allocation").await;
    assert!(out.contains("EXECUTORS_AFTER_IDLE 0"), "{out}");
    let a = wait_app(&cluster, &id, 30, "unregistered", |a| a.unregistered).await;
    assert_eq!(a.state(), pb::JobState::Succeeded, "{a:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_application_waits_with_a_reason_and_finishes_when_the_first_lets_go() {
    let Some((jar, python)) = plugin() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start(3).await;
    // Room for four executors of 1 core.
    create_pool(
        &cluster,
        "/small",
        pb::PoolSpec {
            limit: cpu_mem(4.0, 8192.0),
            ..Default::default()
        },
    )
    .await;
    let dynamic = [
        "--dynamic",
        "--max-executors",
        "4",
        "--idle-timeout",
        "3s",
        "--partitions",
        "12",
        "--sleep",
        "2",
    ];
    let first = driver(&cluster, &jar, &python, "/small", "first", &dynamic).await;
    let first_id = app_in(&cluster, "/small").await;
    wait_app(
        &cluster,
        &first_id,
        120,
        "the first with 4 executors",
        |a| a.running == 4,
    )
    .await;
    // This one reads the CA and the token from the environment.
    let token = submitter_token(&cluster, "second", "/small").await;
    let second = driver_with(
        &cluster,
        &jar,
        &python,
        "/small",
        Credentials::Env(token),
        &dynamic,
    );
    let second_id = app_in_other_than(&cluster, "/small", &first_id).await;
    // Its executors wait, saying why, never refused.
    let a = wait_app(
        &cluster,
        &second_id,
        120,
        "the second's executors waiting",
        |a| a.pending > 0 && a.executors.iter().any(|e| !e.pending_reason.is_empty()),
    )
    .await;
    let reason = &a
        .executors
        .iter()
        .find(|e| !e.pending_reason.is_empty())
        .expect("one")
        .pending_reason;
    assert!(
        reason.contains("entitlement") || reason.contains("limit"),
        "{reason}"
    );
    finished(first, "the first application").await;
    wait_app(
        &cluster,
        &second_id,
        120,
        "the second running executors",
        |a| a.running > 0,
    )
    .await;
    finished(second, "the second application").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executors_host_dies_mid_job_and_spark_gets_a_replacement() {
    let Some((jar, python)) = plugin() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start(3).await;
    create_pool(&cluster, "/spark", pb::PoolSpec::default()).await;
    let child = driver(
        &cluster,
        &jar,
        &python,
        "/spark",
        "host-lost",
        &["--executors", "3", "--partitions", "24", "--sleep", "1.5"],
    )
    .await;
    let id = app_in(&cluster, "/spark").await;
    let a = wait_app(&cluster, &id, 120, "3 executors running", |a| {
        a.running == 3
    })
    .await;
    // The host of one executor dies: its agent and every process it ran.
    let host = a.executors[0].host.clone();
    let work = cluster.work_dir(&host);
    cluster.sigkill_agent(&host).await;
    kill_processes_with_env(&format!("PELOTON_SANDBOX={}", work.display()));
    // The server calls the host lost; the lost executors end, and new ones
    // (new ids) replace them elsewhere.
    let a = wait_app(&cluster, &id, 120, "replacements running", |a| {
        a.running == 3 && a.executors.iter().all(|e| e.host != host)
    })
    .await;
    assert!(a.exited >= 1, "{a:#?}");
    finished(child, "a host lost mid-job").await;
    let lost = cluster
        .tasks(&id)
        .await
        .into_iter()
        .filter(|t| t.current.as_ref().is_some_and(|r| r.host == host))
        .count();
    assert!(lost >= 1, "an executor ran on {host}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_executors_are_not_the_applications_failures() {
    let Some((jar, python)) = plugin() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start(3).await;
    // Production reserves the whole cluster (3 × 4 cores); Spark has none.
    create_pool(
        &cluster,
        "/prod",
        pb::PoolSpec {
            reservation: cpu_mem(12.0, 12_288.0),
            ..Default::default()
        },
    )
    .await;
    create_pool(&cluster, "/spark", pb::PoolSpec::default()).await;
    let child = driver(
        &cluster,
        &jar,
        &python,
        "/spark",
        "preempted",
        &[
            "--executors",
            "4",
            "--partitions",
            "48",
            "--sleep",
            "2",
            // One failure of a task would fail the job: a preemption must
            // not count as one.
            "--conf",
            "spark.task.maxFailures=1",
            "--conf",
            "spark.decommission.enabled=true",
            "--conf",
            "spark.peloton.executor.killGraceMs=5000",
        ],
    )
    .await;
    let id = app_in(&cluster, "/spark").await;
    let a = wait_app(&cluster, &id, 120, "4 executors running", |a| {
        a.running == 4
    })
    .await;
    // Every executor's JVM is up and working (it runs a Spark task).
    for e in &a.executors {
        let i: u32 = e.id.parse().expect("id");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !cluster
            .logs(&id, i, true)
            .await
            .contains("Got assigned task")
        {
            assert!(Instant::now() < deadline, "executor {i} never ran a task");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // Production claims 10 of the 12 cores for 20 s, non-preemptible.
    let mut jobs = cluster.c.jobs.clone();
    let prod = jobs
        .create(pb::CreateJobRequest {
            spec: Some(pb::JobSpec {
                name: "prod".into(),
                pool: "/prod".into(),
                instance_count: 10,
                default_task: Some(pb::TaskSpec {
                    shell: "sleep 20".into(),
                    resources: cpu_mem(1.0, 64.0),
                    ..Default::default()
                }),
                sla: Some(pb::Sla {
                    priority: 100,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .expect("prod job")
        .into_inner()
        .job
        .expect("job")
        .id;
    let a = wait_app(&cluster, &id, 120, "executors preempted", |a| a.exited >= 2).await;
    let preempted = cluster
        .tasks(&id)
        .await
        .into_iter()
        .filter(|t| {
            t.current
                .as_ref()
                .is_some_and(|r| r.reason.contains("preempt") || r.reason.contains("make room"))
        })
        .map(|t| t.instance)
        .collect::<Vec<u32>>();
    assert!(preempted.len() >= 2, "{a:#?}");
    // Each got SIGPWR and decommissioned (its own log says so) before it
    // was stopped for good.
    for &i in &preempted {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let err = cluster.logs(&id, i, true).await;
            if err.contains("Decommission executor") {
                break;
            }
            if Instant::now() >= deadline {
                let t = cluster.task(&id, i).await;
                let tail: Vec<&str> = err.lines().rev().take(25).collect();
                panic!(
                    "executor {i} did not decommission: {t:#?}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    finished(child, "preempted executors").await;
    let mut jobs = cluster.c.jobs.clone();
    let _ = jobs
        .kill(pb::KillJobRequest {
            id: prod,
            version: 0,
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_drivers_are_controller_tasks_and_cannot_starve_their_executors() {
    let Some((jar, python)) = plugin() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start(3).await;
    // Six cores; drivers (controllers) may hold a quarter of them: one
    // driver of 1 core at a time, the rest for executors.
    create_pool(
        &cluster,
        "/drivers",
        pb::PoolSpec {
            limit: cpu_mem(6.0, 12_288.0),
            controller_limit_pct: 25.0,
            ..Default::default()
        },
    )
    .await;
    // The driver's token comes as a job secret (a file in its sandbox,
    // never in the spec's reads), the CA from the host's disk.
    let token = submitter_token(&cluster, "drivers", "/drivers").await;
    let shell = format!(
        "PELOTON_TOKEN_FILE=\"$PELOTON_SECRETS/peloton-token\" \
         exec {python} {} {} {} - --local --executors 2 --partitions 6 --sleep 0.5 \
         --conf spark.peloton.executor.cpus=1",
        wordcount().display(),
        master(&cluster),
        jar.display()
    );
    let mut ids = Vec::new();
    let mut jobs = cluster.c.jobs.clone();
    for i in 0..3 {
        let spec = pb::JobSpec {
            name: format!("driver-{i}"),
            r#type: pb::JobType::Application as i32,
            pool: "/drivers".into(),
            instance_count: 1,
            default_task: Some(pb::TaskSpec {
                shell: shell.clone(),
                env: [
                    ("PATH".to_owned(), std::env::var("PATH").unwrap_or_default()),
                    (
                        "PELOTON_CA_FILE".to_owned(),
                        pki().ca_file.display().to_string(),
                    ),
                ]
                .into_iter()
                .collect(),
                resources: cpu_mem(1.0, 2048.0),
                controller: true,
                memory_limit: pb::MemoryLimit::Resident as i32,
                ..Default::default()
            }),
            sla: Some(pb::Sla {
                preemptible: true,
                ..Default::default()
            }),
            secrets: vec![pb::Secret {
                name: "peloton-token".into(),
                value: token.clone().into_bytes(),
                size: 0,
            }],
            ..Default::default()
        };
        let job = jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await
            .expect("driver job")
            .into_inner()
            .job
            .expect("job");
        ids.push(job.id);
    }
    // Never more than one driver at a time; all three finish right.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut saw_waiting_driver = false;
    loop {
        let mut running_drivers = 0;
        let mut done = 0;
        for id in &ids {
            let j = cluster.job(id).await.expect("job");
            let state = j.status.as_ref().expect("status").state();
            assert_ne!(
                state,
                pb::JobState::Failed,
                "{j:#?}\n{}",
                cluster.logs(id, 0, true).await
            );
            if state == pb::JobState::Succeeded {
                done += 1;
                continue;
            }
            let t = cluster.task(id, 0).await.expect("driver");
            match t.current.as_ref().map(|r| r.state()) {
                Some(pb::TaskState::Running) => running_drivers += 1,
                Some(pb::TaskState::Pending) if t.pending_reason.contains("controller") => {
                    saw_waiting_driver = true;
                }
                _ => {}
            }
        }
        assert!(
            running_drivers <= 1,
            "more drivers than the controller limit"
        );
        if done == ids.len() {
            break;
        }
        if Instant::now() >= deadline {
            let mut seen = String::new();
            for id in &ids {
                let t = cluster.task(id, 0).await;
                let launched = t
                    .as_ref()
                    .and_then(|t| t.current.as_ref())
                    .is_some_and(|r| !r.host.is_empty());
                let err = if launched {
                    cluster.logs(id, 0, true).await
                } else {
                    String::new()
                };
                let tail: Vec<&str> = err.lines().rev().take(30).collect();
                seen.push_str(&format!(
                    "driver {id}: {t:#?}\n{}\n{:#?}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                    app(&cluster, id).await
                ));
            }
            panic!("the drivers did not all finish:\n{seen}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        saw_waiting_driver,
        "a driver waited for the controller limit"
    );
    for id in &ids {
        let out = cluster.logs(id, 0, false).await;
        let result = out.lines().find_map(|l| l.strip_prefix("RESULT "));
        let expected = out.lines().find_map(|l| l.strip_prefix("EXPECTED "));
        assert!(result.is_some() && result == expected, "{out}");
        // Its executors were instances 1, 2, … of its own job.
        let a = app(&cluster, id).await;
        assert!(a.driver_in_job && a.registered && a.exited >= 2, "{a:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_a_token_or_with_one_in_its_conf_is_refused_saying_why() {
    let Some((jar, python)) = plugin() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::start(0).await;
    create_pool(&cluster, "/spark", pb::PoolSpec::default()).await;
    let failed = async |child: tokio::process::Child| {
        let out = tokio::time::timeout(DRIVER_TIMEOUT, child.wait_with_output())
            .await
            .expect("the driver to fail in time")
            .expect("driver output");
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // The CA but no token: the server refuses the registration.
    let child = driver_with(&cluster, &jar, &python, "/spark", Credentials::CaOnly, &[]);
    let err = failed(child).await;
    assert!(err.contains("UNAUTHENTICATED"), "{err}");
    assert!(err.contains("https://127.0.0.1:"), "{err}");
    // A token in Spark's configuration (shown in its UI) is not read.
    let token = submitter_token(&cluster, "in-conf", "/spark").await;
    let child = driver_with(
        &cluster,
        &jar,
        &python,
        "/spark",
        Credentials::Conf(cluster.admin_token_file()),
        &["--conf", &format!("spark.peloton.token={token}")],
    );
    let err = failed(child).await;
    assert!(err.contains("spark.peloton.token is not read"), "{err}");
    assert!(!err.contains(&token), "the token is shown: {err}");
}
