//! A task's `stop_signal` and memory limit on real agents: a kill sends
//! the task its own signal first (Spark executors decommission on SIGPWR),
//! and a task is held to what it really holds, never to the address space
//! it maps: a JVM starts, a shell under `memory_mb: 2` runs (the limit is
//! at least 32 MiB), and a task is killed when what it holds goes above
//! its `memory_mb`.

mod common;

use common::{Cluster, eventually, job, task_spec};
use pb::TaskState as T;
use peloton_proto::v1 as pb;

/// Whether `java` can be run here (CI installs a JDK; a machine without one
/// skips the JVM case unless `PELOTON_REQUIRE_SPARK` is set).
fn have_java() -> bool {
    let ok = std::process::Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("PELOTON_REQUIRE_SPARK").is_some() {
        panic!("java is required (PELOTON_REQUIRE_SPARK is set) but cannot be run");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_sends_the_tasks_own_stop_signal_before_sigkill() {
    let cluster = Cluster::start(1).await;
    cluster.wait_hosts_up(1).await;
    let mut task = task_spec(
        "exec perl -e '$| = 1; $SIG{PWR} = sub { print \"decommissioning\\n\"; exit 0 }; \
         $SIG{TERM} = sub { print \"term\\n\"; exit 0 }; print \"ready\\n\"; sleep 1 while 1'",
    );
    task.stop_signal = "SIGPWR".into();
    task.kill_grace_period_ms = 60_000;
    let id = cluster.create(job("pwr", 1, task)).await;
    // Its logs can be read once it runs.
    cluster.wait_running(&id, 1).await;
    eventually("the task ready", async || {
        cluster
            .logs(&id, 0, false)
            .await
            .contains("ready")
            .then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, pb::JobState::Killed).await;
    // It ended on its own signal, long before the grace period.
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let out = cluster.logs(&id, 0, false).await;
    assert!(out.contains("decommissioning"), "{out}");
    assert!(!out.contains("term"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limits_hold_what_a_task_holds_not_its_address_space() {
    let cluster = Cluster::start(1).await;
    cluster.wait_hosts_up(1).await;
    let isolation = cluster.hosts().await[0].isolation.clone();

    // 2 MiB of address space cannot even map libc ("failed to map
    // segment", exit 127); 2 MiB of memory is raised to the 32 MiB floor.
    let mut tiny = task_spec("exec /bin/true");
    tiny.resources.as_mut().expect("resources").memory_mb = 2.0;
    let mut spec = job("tiny", 1, tiny);
    spec.default_task.as_mut().expect("task").restart = None;
    let id = cluster.create(spec).await;
    cluster.wait_job(&id, pb::JobState::Succeeded).await;

    // Holds 300 MiB for real under a limit of 128 MiB: killed, FAILED, and
    // the reason says so; under either kind of limit.
    for kind in [pb::MemoryLimit::Default, pb::MemoryLimit::Resident] {
        let mut hog = task_spec(
            "exec perl -e '$x = \"a\" x (300 * 1024 * 1024); print \"holding\\n\"; sleep 60'",
        );
        hog.resources.as_mut().expect("resources").memory_mb = 128.0;
        hog.memory_limit = kind as i32;
        let id = cluster
            .create(job(&format!("hog-{}", kind as i32), 1, hog))
            .await;
        cluster.wait_job(&id, pb::JobState::Failed).await;
        let t = cluster.task(&id, 0).await.expect("task");
        let run = t.current.expect("run");
        assert_eq!(run.state(), T::Failed, "{run:?}");
        if isolation.starts_with("rlimit") {
            assert!(
                run.reason.contains("memory limit exceeded"),
                "{isolation}: {run:?}"
            );
        }
    }

    if !have_java() {
        eprintln!("SKIPPED the JVM half: no java here");
        return;
    }
    // A JVM under 256 MiB, which reserves far more address space than
    // that: it runs under either kind of limit.
    for kind in [pb::MemoryLimit::Default, pb::MemoryLimit::Resident] {
        let mut jvm = task_spec("exec java -Xmx64m -XX:+UseSerialGC -version");
        jvm.memory_limit = kind as i32;
        let id = cluster
            .create(job(&format!("jvm-{}", kind as i32), 1, jvm))
            .await;
        cluster.wait_job(&id, pb::JobState::Succeeded).await;
        let err = cluster.logs(&id, 0, true).await;
        assert!(err.contains("version"), "{err}");
    }
}
