//! Stateful and daemon jobs on a real cluster (`pelotond` and
//! `peloton-agent` processes on loopback, real tasks):
//! - a stateful instance keeps its volume's data across a restart, a crash
//!   of its process, a drain of its host and an agent restart, always
//!   coming back to that host; its volume cannot be deleted while it runs,
//!   and is removed from the agent's disk once deleted;
//! - it survives a server SIGKILL (volume, pin and run recovered) and waits
//!   for its lost host; a deleted volume, or one a relocating job gives up
//!   after its host's down time, lets it start fresh elsewhere;
//! - a daemon job follows the cluster: one instance per up host, a host
//!   that joins or starts to match gets one, a drained host loses it after
//!   its other work, a lost host loses it, and a constraint limits it to
//!   the hosts of a zone.
//!
//! Four tests were written against server bugs they found (old and new
//! runs of a pinned instance at once on a returning host, a given-up
//! volume left on its host, a daemon replaced by an agent restart); they
//! pass since those are fixed.
//!
//! The cluster and its helpers are in `common`. Tests wait for states with
//! generous deadlines and never assert how long anything took.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::*;
use pb::JobState as J;
use pb::TaskState as T;
use peloton_proto::v1 as pb;

fn quick_restarts() -> Option<pb::RestartPolicy> {
    Some(pb::RestartPolicy {
        max_failures: 0,
        backoff_ms: 100,
        max_backoff_ms: 1000,
    })
}

/// Each run appends its task id to `$PELOTON_VOLUME/log` and writes its pid
/// (that of the `sleep` it becomes) next to it.
const APPENDING_TASK: &str = r#"echo "$PELOTON_TASK_ID" >> "$PELOTON_VOLUME/log"; echo $$ > "$PELOTON_VOLUME/pid"; exec sleep 600"#;

fn stateful(name: &str) -> pb::JobSpec {
    let mut task = task_spec(APPENDING_TASK);
    task.volume = Some(pb::VolumeSpec {
        size_mb: 64,
        path: "data".into(),
    });
    task.kill_grace_period_ms = 500;
    task.restart = quick_restarts();
    let mut spec = job(name, 1, task);
    spec.r#type = pb::JobType::Stateful as i32;
    spec
}

fn daemon(name: &str, constraint: &str) -> pb::JobSpec {
    let mut task = task_spec("exec sleep 600");
    task.resources = Some(pb::Resources {
        cpu: 0.1,
        memory_mb: 32.0,
        ..Default::default()
    });
    task.constraint = constraint.into();
    task.kill_grace_period_ms = 500;
    task.restart = quick_restarts();
    // The instance count of a daemon job is ignored.
    let mut spec = job(name, 1, task);
    spec.r#type = pb::JobType::Daemon as i32;
    spec
}

fn run_of(t: &pb::Task) -> &pb::TaskRun {
    t.current.as_ref().expect("a current run")
}

/// The lines of the instance's volume log on the agent's disk.
fn volume_dir(cluster: &Cluster, host: &str, volume: &str) -> PathBuf {
    cluster.work_dir(host).join("volumes").join(volume)
}

fn log_lines(cluster: &Cluster, host: &str, volume: &str) -> Vec<String> {
    std::fs::read_to_string(volume_dir(cluster, host, volume).join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits for run `run_id` of instance 0 running, and for the volume log
/// to hold exactly the lines of runs 1..=run_id.
async fn wait_run_with_log(
    cluster: &Cluster,
    id: &str,
    run_id: u32,
    host: &str,
    volume: &str,
) -> pb::Task {
    let t = eventually(&format!("run {run_id} of {id}/0 running"), async || {
        let t = cluster.task(id, 0).await?;
        let run = t.current.as_ref()?;
        (run.run_id == run_id && run.state() == T::Running).then_some(t)
    })
    .await;
    assert_eq!(
        run_of(&t).host,
        host,
        "run {run_id} left its volume's host: {t:#?}"
    );
    assert_eq!(t.pinned_host, host, "{t:#?}");
    assert_eq!(t.volume_id, volume, "{t:#?}");
    // Every run that ran appended its line, in order, the first one's
    // included (the data outlived them all): runs that never started (one
    // that gave way while an old run stopped) have none.
    let first = format!("{id}-0-1");
    let this = format!("{id}-0-{run_id}");
    eventually(
        &format!("run {run_id} appended to the volume"),
        async || {
            let lines = log_lines(cluster, host, volume);
            let runs: Vec<u32> = lines
                .iter()
                .filter_map(|l| l.rsplit('-').next()?.parse().ok())
                .collect();
            let ordered = runs.windows(2).all(|w| w[0] < w[1]);
            (lines.first() == Some(&first) && lines.last() == Some(&this) && ordered).then_some(())
        },
    )
    .await;
    t
}

async fn volumes_of(cluster: &Cluster, id: &str) -> Vec<pb::Volume> {
    let mut volumes = cluster.c.volumes.clone();
    volumes
        .list(pb::ListVolumesRequest {
            job_id: id.into(),
            ..Default::default()
        })
        .await
        .expect("list volumes")
        .into_inner()
        .volumes
}

async fn delete_volume(cluster: &Cluster, volume: &str) -> Result<(), tonic::Status> {
    let mut volumes = cluster.c.volumes.clone();
    volumes
        .delete(pb::DeleteVolumeRequest { id: volume.into() })
        .await
        .map(|_| ())
}

async fn restart_instance(cluster: &Cluster, id: &str) {
    let mut tasks = cluster.c.tasks.clone();
    tasks
        .restart(pb::RestartTaskRequest {
            job_id: id.into(),
            instances: vec![0],
            job_version: 0,
        })
        .await
        .expect("restart");
}

async fn maintenance(cluster: &Cluster, host: &str, start: bool) {
    let mut hosts = cluster.c.hosts.clone();
    if start {
        hosts
            .start_maintenance(pb::StartMaintenanceRequest {
                hosts: vec![host.into()],
            })
            .await
            .expect("start maintenance");
    } else {
        hosts
            .complete_maintenance(pb::CompleteMaintenanceRequest {
                hosts: vec![host.into()],
            })
            .await
            .expect("complete maintenance");
    }
}

async fn host_named(cluster: &Cluster, name: &str) -> Option<pb::Host> {
    cluster.hosts().await.into_iter().find(|h| h.name == name)
}

async fn wait_host_down(cluster: &Cluster, name: &str) {
    eventually(&format!("host {name} down"), async || {
        let h = host_named(cluster, name).await?;
        (h.state() == pb::HostState::Down).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_instance_keeps_its_data_and_its_host_through_restarts_drains_and_agent_restarts()
 {
    let mut cluster = Cluster::start(3).await;
    let id = cluster.create(stateful("counter")).await;

    // Run 1: its volume is created on its host, and the instance pinned there.
    let first = cluster.wait_running(&id, 1).await.remove(0);
    let host = run_of(&first).host.clone();
    let t = eventually("the volume in the task's read", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.volume_id.is_empty()).then_some(t)
    })
    .await;
    let vid = t.volume_id.clone();
    assert_eq!(t.pinned_host, host, "{t:#?}");
    assert!(vid.starts_with(&format!("{id}-0-")), "{vid}");
    let vols = volumes_of(&cluster, &id).await;
    assert_eq!(vols.len(), 1, "{vols:#?}");
    let v = &vols[0];
    assert_eq!(
        (
            v.id.as_str(),
            v.instance,
            v.host.as_str(),
            v.size_mb,
            v.path.as_str(),
            v.in_use
        ),
        (vid.as_str(), 0, host.as_str(), 64, "data", true),
        "{v:#?}"
    );
    let h = host_named(&cluster, &host).await.expect("host");
    assert_eq!(h.volumes_disk_mb, 64, "{h:#?}");
    // The CLI lists it too.
    let out = cluster
        .cli()
        .args(["--output", "json", "volume", "list", "--job", &id])
        .output()
        .await
        .expect("peloton runs");
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listed["volumes"][0]["id"], vid.as_str(), "{listed}");
    assert_eq!(listed["volumes"][0]["host"], host.as_str(), "{listed}");
    assert_eq!(listed["volumes"][0]["in_use"], true, "{listed}");
    wait_run_with_log(&cluster, &id, 1, &host, &vid).await;

    // Run 2: a restart comes back to the same host and finds the data.
    restart_instance(&cluster, &id).await;
    wait_run_with_log(&cluster, &id, 2, &host, &vid).await;

    // Run 3: the task's process dies; the next run is on the same host too.
    let pid: i32 = std::fs::read_to_string(volume_dir(&cluster, &host, &vid).join("pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the task");
    let t = wait_run_with_log(&cluster, &id, 3, &host, &vid).await;
    assert_eq!(t.history[0].state(), T::Failed, "{t:#?}");

    // Drained: the instance stops and waits for its host, pinned, while the
    // other hosts are free.
    maintenance(&cluster, &host, true).await;
    wait_host_down(&cluster, &host).await;
    // Queued (pending, or admitted and not placed: placing), for its host
    // only.
    let t = eventually("the instance waiting for its host", async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        let waiting = matches!(run.state(), T::Pending | T::Ready | T::Placing);
        (run.run_id == 4 && waiting && t.pending_reason.contains("pinned")).then_some(t)
    })
    .await;
    assert_eq!(t.pinned_host, host, "{t:#?}");
    assert!(t.pending_reason.contains("pinned"), "{t:#?}");
    assert!(run_of(&t).host.is_empty(), "{t:#?}");
    assert_eq!(t.history[0].state(), T::Preempted, "{t:#?}");
    let v = &volumes_of(&cluster, &id).await[0];
    assert_eq!(
        (v.host.as_str(), v.in_use),
        (host.as_str(), false),
        "{v:#?}"
    );
    let h = host_named(&cluster, &host).await.expect("host");
    assert_eq!(h.volumes_disk_mb, 64, "{h:#?}");
    // Back from maintenance: run 4 goes there, and only there.
    maintenance(&cluster, &host, false).await;
    let t = wait_run_with_log(&cluster, &id, 4, &host, &vid).await;
    for h in &t.history {
        assert_eq!(h.host, host, "a run left the volume's host: {t:#?}");
    }

    // The agent stops (its task keeps running) and starts again over the
    // same work dir: it lists the volume, which the server keeps.
    cluster.sigterm_agent(&host).await;
    let run4 = format!("PELOTON_TASK_ID={id}-0-4");
    assert!(
        !processes_with_env(&run4).is_empty(),
        "the task outlives its agent"
    );
    eventually("the server sees the agent gone", async || {
        (!host_named(&cluster, &host).await?.connected).then_some(())
    })
    .await;
    cluster.start_agent(&host).await;
    cluster.wait_hosts_up(3).await;
    // The run was taken back, not started again.
    let t = eventually("the instance running after the agent restart", async || {
        let t = cluster.task(&id, 0).await?;
        (run_of(&t).state() == T::Running && run_of(&t).host == host).then_some(t)
    })
    .await;
    assert_eq!(run_of(&t).run_id, 4, "{t:#?}");
    assert_eq!(t.volume_id, vid, "{t:#?}");
    let vols = volumes_of(&cluster, &id).await;
    assert_eq!(vols.len(), 1, "{vols:#?}");
    assert_eq!(
        (vols[0].id.as_str(), vols[0].host.as_str()),
        (vid.as_str(), host.as_str())
    );
    assert_eq!(
        cluster.job(&id).await.expect("job").status.unwrap().state(),
        J::Running
    );
    // A run after the registration still finds every line (the volume was
    // not deleted as unknown): restart once more.
    let next = run_of(&t).run_id + 1;
    restart_instance(&cluster, &id).await;
    let t = eventually(&format!("run {next} running"), async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        (run.run_id == next && run.state() == T::Running).then_some(t)
    })
    .await;
    assert_eq!(run_of(&t).host, host, "{t:#?}");
    eventually("the last run appended to the volume", async || {
        let lines = log_lines(&cluster, &host, &vid);
        let want_last = format!("{id}-0-{next}");
        (lines.last() == Some(&want_last)).then_some(())
    })
    .await;
    let lines = log_lines(&cluster, &host, &vid);
    let want: Vec<String> = (1..=4).map(|r| format!("{id}-0-{r}")).collect();
    assert_eq!(lines[..4], want[..], "{lines:?}");

    // Deleting the volume of a running instance is refused.
    let err = delete_volume(&cluster, &vid).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(volume_dir(&cluster, &host, &vid).join("log").exists());
    // Once the job is killed, it is deleted, and leaves the agent's disk.
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
    let mut volumes = cluster.c.volumes.clone();
    let v = volumes
        .get(pb::GetVolumeRequest { id: vid.clone() })
        .await
        .expect("get volume")
        .into_inner()
        .volume
        .expect("volume");
    assert!(!v.in_use, "{v:#?}");
    delete_volume(&cluster, &vid).await.expect("delete");
    assert!(volumes_of(&cluster, &id).await.is_empty());
    let err = delete_volume(&cluster, &vid).await.expect_err("gone");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    eventually("the volume removed from the agent's disk", async || {
        (!volume_dir(&cluster, &host, &vid).exists()).then_some(())
    })
    .await;
    eventually("the volume's disk given back", async || {
        (host_named(&cluster, &host).await?.volumes_disk_mb == 0).then_some(())
    })
    .await;
}

/// Hosts running an instance of daemon job `id`, once they are exactly
/// `want` (one running instance per host, none elsewhere).
async fn wait_daemons_on(cluster: &Cluster, id: &str, want: &[&str]) -> Vec<pb::Task> {
    let want: BTreeSet<String> = want.iter().map(|h| (*h).to_owned()).collect();
    let tasks = eventually(&format!("daemon {id} running on {want:?}"), async || {
        let tasks = cluster.tasks(id).await;
        let running: Vec<&pb::Task> = tasks
            .iter()
            .filter(|t| t.current.as_ref().is_some_and(|r| r.state() == T::Running))
            .collect();
        let hosts: BTreeSet<String> = running.iter().map(|t| run_of(t).host.clone()).collect();
        (hosts == want && running.len() == want.len()).then_some(tasks)
    })
    .await;
    for t in &tasks {
        if run_of(t).state() == T::Running {
            assert_eq!(t.pinned_host, run_of(t).host, "{t:#?}");
        }
    }
    eventually("the daemon's instance count", async || {
        let spec = cluster.job(id).await?.spec?;
        (spec.instance_count as usize == want.len()).then_some(())
    })
    .await;
    tasks
}

/// Live task processes of job `id` under host `host`'s work dir.
fn daemon_processes(cluster: &Cluster, id: &str, host: &str) -> usize {
    let sandboxes = format!("PELOTON_SANDBOX={}", cluster.work_dir(host).display());
    let job = format!("PELOTON_JOB_ID={id}");
    let of_job: BTreeSet<u32> = processes_with_env(&job).into_iter().collect();
    processes_with_env(&sandboxes)
        .into_iter()
        .filter(|p| of_job.contains(p))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_job_runs_one_instance_per_host_as_hosts_join_drain_and_leave() {
    let mut cluster = Cluster::start(3).await;
    let id = cluster.create(daemon("node-agent", "")).await;
    wait_daemons_on(&cluster, &id, &["a0", "a1", "a2"]).await;
    for h in ["a0", "a1", "a2"] {
        eventually(&format!("one daemon process on {h}"), async || {
            (daemon_processes(&cluster, &id, h) == 1).then_some(())
        })
        .await;
    }

    // A fourth host joins: it gets one.
    cluster.start_agent("a3").await;
    cluster.wait_hosts_up(4).await;
    wait_daemons_on(&cluster, &id, &["a0", "a1", "a2", "a3"]).await;

    // Drained: the host loses its daemon, but only once its other work
    // has stopped (here a task that ignores SIGTERM for its grace period),
    // and goes down; back, it gets one again.
    let tasks = wait_daemons_on(&cluster, &id, &["a0", "a1", "a2", "a3"]).await;
    let on_a3 = tasks
        .iter()
        .find(|t| run_of(t).state() == T::Running && run_of(t).host == "a3")
        .expect("a daemon on a3")
        .instance;
    let mut spec = task_spec("trap '' TERM; exec sleep 600");
    spec.constraint = r#"rack == "r-a3""#.into();
    spec.kill_grace_period_ms = 2000;
    let other = cluster.create(job("other-work", 1, spec)).await;
    let t = cluster.wait_running(&other, 1).await.remove(0);
    assert_eq!(run_of(&t).host, "a3");
    wait_exec(&format!("PELOTON_JOB_ID={other}"), "sleep").await;
    maintenance(&cluster, "a3", true).await;
    let daemon_then = eventually("the other work stopping", async || {
        // Read the daemon first: if the other run is still stopping after,
        // it was stopping when the daemon was read.
        let d = cluster.task(&id, on_a3).await?;
        cluster.task(&other, 0).await?.stopping.then_some(d)
    })
    .await;
    assert_eq!(
        (
            run_of(&daemon_then).state(),
            run_of(&daemon_then).host.as_str()
        ),
        (T::Running, "a3"),
        "the daemon stopped before the host's other work: {daemon_then:#?}"
    );
    wait_host_down(&cluster, "a3").await;
    wait_daemons_on(&cluster, &id, &["a0", "a1", "a2"]).await;
    let stopped = eventually("the daemon's run on a3 confirmed ended", async || {
        let t = cluster.task(&id, on_a3).await?;
        (!t.stopping && run_of(&t).state() == T::Killed).then_some(t)
    })
    .await;
    let other_run = cluster
        .task(&other, 0)
        .await
        .expect("task")
        .history
        .into_iter()
        .find(|r| r.host == "a3")
        .expect("the other work's run on a3");
    assert!(
        run_of(&stopped).finished_at_ms >= other_run.finished_at_ms,
        "{stopped:#?} {other_run:#?}"
    );
    cluster.kill_job(&other).await;
    eventually("no daemon process left on a3", async || {
        (daemon_processes(&cluster, &id, "a3") == 0).then_some(())
    })
    .await;
    maintenance(&cluster, "a3", false).await;
    wait_daemons_on(&cluster, &id, &["a0", "a1", "a2", "a3"]).await;

    // A host lost (its agent SIGKILLed) loses it; when its agent comes
    // back, the host runs exactly one again.
    cluster.sigkill_agent("a1").await;
    wait_host_down(&cluster, "a1").await;
    wait_daemons_on(&cluster, &id, &["a0", "a2", "a3"]).await;
    cluster.start_agent("a1").await;
    cluster.wait_hosts_up(4).await;
    wait_daemons_on(&cluster, &id, &["a0", "a1", "a2", "a3"]).await;
    eventually("one daemon process on a1", async || {
        (daemon_processes(&cluster, &id, "a1") == 1).then_some(())
    })
    .await;

    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
    assert!(processes_with_env(&format!("PELOTON_JOB_ID={id}")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_job_with_a_zone_constraint_runs_only_on_that_zone() {
    let mut cluster = Cluster::start(0).await;
    cluster.start_agent_with("z1a", &["zone=z1"]).await;
    cluster.start_agent_with("z1b", &["zone=z1"]).await;
    cluster.start_agent_with("z2a", &["zone=z2"]).await;
    cluster.start_agent("nozone").await;
    cluster.wait_hosts_up(4).await;
    let id = cluster.create(daemon("zoned", r#"zone == "z1""#)).await;
    wait_daemons_on(&cluster, &id, &["z1a", "z1b"]).await;
    let everywhere = cluster.create(daemon("everywhere", "")).await;
    wait_daemons_on(&cluster, &everywhere, &["nozone", "z1a", "z1b", "z2a"]).await;

    // A host of the zone joins: it gets one; one of another zone does not.
    cluster.start_agent_with("z1c", &["zone=z1"]).await;
    cluster.start_agent_with("z2b", &["zone=z2"]).await;
    cluster.wait_hosts_up(6).await;
    wait_daemons_on(&cluster, &id, &["z1a", "z1b", "z1c"]).await;
    wait_daemons_on(
        &cluster,
        &everywhere,
        &["nozone", "z1a", "z1b", "z1c", "z2a", "z2b"],
    )
    .await;
    for h in ["z2a", "z2b", "nozone"] {
        assert_eq!(daemon_processes(&cluster, &id, h), 0, "{h}");
    }

    // Hosts whose agents come back with another zone: z2a starts to match
    // and gets one, z1b stops matching and loses its own.
    for (h, zone) in [("z2a", "zone=z1"), ("z1b", "zone=z2")] {
        cluster.sigterm_agent(h).await;
        eventually(&format!("the server sees {h} gone"), async || {
            (!host_named(&cluster, h).await?.connected).then_some(())
        })
        .await;
        cluster.start_agent_with(h, &[zone]).await;
    }
    cluster.wait_hosts_up(6).await;
    wait_daemons_on(&cluster, &id, &["z1a", "z1c", "z2a"]).await;
    eventually("no zoned daemon process left on z1b", async || {
        (daemon_processes(&cluster, &id, "z1b") == 0).then_some(())
    })
    .await;
    assert_eq!(daemon_processes(&cluster, &id, "z2a"), 1);
    wait_daemons_on(
        &cluster,
        &everywhere,
        &["nozone", "z1a", "z1b", "z1c", "z2a", "z2b"],
    )
    .await;

    cluster.kill_job(&id).await;
    cluster.kill_job(&everywhere).await;
    cluster.wait_job(&id, J::Killed).await;
    cluster.wait_job(&everywhere, J::Killed).await;
}

/// Like `APPENDING_TASK`, but it ignores SIGTERM (a stop lasts its whole
/// grace period) and records in the volume when each run started and was
/// last alive (`start-<task id>`, `alive-<task id>`, in ns).
///
/// Writes are renames: a SIGKILL between a truncating `>` and its write
/// would leave an empty record.
const RECORDING_TASK: &str = r#"trap '' TERM; v="$PELOTON_VOLUME"; t="$v/.tmp-$PELOTON_TASK_ID"; echo "$PELOTON_TASK_ID" >> "$v/log"; date +%s%N > "$t" && mv "$t" "$v/start-$PELOTON_TASK_ID"; while true; do date +%s%N > "$t" && mv "$t" "$v/alive-$PELOTON_TASK_ID"; sleep 0.1; done"#;

fn recording_stateful(name: &str) -> pb::JobSpec {
    let mut spec = stateful(name);
    let task = spec.default_task.as_mut().expect("task");
    task.shell = RECORDING_TASK.into();
    task.kill_grace_period_ms = 1000;
    spec
}

/// (start, last alive) of run `run_id` of `id`/0, from its volume.
fn run_interval(dir: &std::path::Path, id: &str, run_id: u32) -> Option<(u128, u128)> {
    let read = |f: &str| -> Option<u128> {
        std::fs::read_to_string(dir.join(format!("{f}-{id}-0-{run_id}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("start")?, read("alive")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_instance_survives_a_server_crash_and_waits_for_its_lost_host() {
    let mut cluster = Cluster::start(3).await;
    let id = cluster.create(recording_stateful("waiting")).await;
    let t = cluster.wait_running(&id, 1).await.remove(0);
    let host = run_of(&t).host.clone();
    let t = eventually("the volume in the task's read", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.volume_id.is_empty()).then_some(t)
    })
    .await;
    let vid = t.volume_id.clone();
    wait_run_with_log(&cluster, &id, 1, &host, &vid).await;

    // The server is SIGKILLed and restarted: the volume, the pin and the
    // run are recovered (the run taken over, not started again).
    let server = cluster.server.as_mut().expect("server");
    server.kill().await.expect("SIGKILL the server");
    cluster.start_server().await;
    cluster.wait_hosts_up(3).await;
    let t = eventually("the run taken over", async || {
        let t = cluster.task(&id, 0).await?;
        (run_of(&t).state() == T::Running).then_some(t)
    })
    .await;
    assert_eq!(
        (run_of(&t).run_id, run_of(&t).host.as_str()),
        (1, host.as_str()),
        "{t:#?}"
    );
    assert_eq!(
        (t.volume_id.as_str(), t.pinned_host.as_str()),
        (vid.as_str(), host.as_str())
    );
    let vols = volumes_of(&cluster, &id).await;
    assert_eq!(vols.len(), 1, "{vols:#?}");
    assert_eq!(
        (vols[0].id.as_str(), vols[0].host.as_str(), vols[0].in_use),
        (vid.as_str(), host.as_str(), true)
    );
    restart_instance(&cluster, &id).await;
    wait_run_with_log(&cluster, &id, 2, &host, &vid).await;

    // Its host is lost (the agent SIGKILLed; run 2 lives on): the instance
    // waits for that host, and is not placed elsewhere.
    cluster.sigkill_agent(&host).await;
    let t = eventually("run 2 lost and run 3 waiting", async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        let waiting = matches!(run.state(), T::Pending | T::Ready | T::Placing);
        (run.run_id == 3 && waiting && t.pending_reason.contains("pinned")).then_some(t)
    })
    .await;
    assert_eq!(t.history[0].state(), T::Lost, "{t:#?}");
    assert_eq!(t.pinned_host, host, "{t:#?}");
    assert!(t.pending_reason.contains("pinned"), "{t:#?}");
    let run2 = format!("PELOTON_TASK_ID={id}-0-2");
    assert!(
        !processes_with_env(&run2).is_empty(),
        "run 2 outlives its agent"
    );

    // The agent returns: run 2 is stopped (run 3, queued for the host,
    // gives way) and run 4 starts there once it is gone, with the data.
    cluster.start_agent(&host).await;
    cluster.wait_hosts_up(3).await;
    let t = wait_run_with_log(&cluster, &id, 4, &host, &vid).await;
    for h in t.history.iter().filter(|h| !h.host.is_empty()) {
        // (A run that gave way before it was placed has no host.)
        assert_eq!(h.host, host, "a run left the volume's host: {t:#?}");
    }
    eventually("run 2 gone", async || {
        processes_with_env(&run2).is_empty().then_some(())
    })
    .await;
    let t = cluster.task(&id, 0).await.expect("task");
    assert_eq!(
        (run_of(&t).run_id, run_of(&t).state()),
        (4, T::Running),
        "{t:#?}"
    );

    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_given_up_volume_lets_the_instance_start_fresh_elsewhere() {
    let mut cluster = Cluster::start(3).await;

    // Deleting the volume of an instance that waits for its drained host
    // lets it start at once elsewhere, with a new, empty volume; the old
    // one leaves the drained host's disk.
    let id = cluster.create(stateful("deleted")).await;
    let t = cluster.wait_running(&id, 1).await.remove(0);
    let first = run_of(&t).host.clone();
    let t = eventually("the volume in the task's read", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.volume_id.is_empty()).then_some(t)
    })
    .await;
    let old = t.volume_id.clone();
    wait_run_with_log(&cluster, &id, 1, &first, &old).await;
    maintenance(&cluster, &first, true).await;
    wait_host_down(&cluster, &first).await;
    eventually("run 2 waiting for its host", async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        let waiting = matches!(run.state(), T::Pending | T::Ready | T::Placing);
        (run.run_id == 2 && waiting).then_some(())
    })
    .await;
    delete_volume(&cluster, &old)
        .await
        .expect("delete a volume not in use");
    let t = eventually("the instance running elsewhere", async || {
        let t = cluster.task(&id, 0).await?;
        (run_of(&t).state() == T::Running && !t.volume_id.is_empty()).then_some(t)
    })
    .await;
    let second = run_of(&t).host.clone();
    assert_ne!(second, first, "{t:#?}");
    assert_ne!(t.volume_id, old, "{t:#?}");
    assert_eq!(t.pinned_host, second, "{t:#?}");
    let new = t.volume_id.clone();
    let run_id = run_of(&t).run_id;
    eventually("a fresh volume", async || {
        (log_lines(&cluster, &second, &new) == [format!("{id}-0-{run_id}")]).then_some(())
    })
    .await;
    eventually("the old volume removed from the drained host", async || {
        (!volume_dir(&cluster, &first, &old).exists()).then_some(())
    })
    .await;
    let vols = volumes_of(&cluster, &id).await;
    assert_eq!(vols.len(), 1, "{vols:#?}");
    assert_eq!(
        (vols[0].id.as_str(), vols[0].host.as_str()),
        (new.as_str(), second.as_str())
    );
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
    maintenance(&cluster, &first, false).await;
    cluster.wait_hosts_up(3).await;

    // A relocating job gives the volume of a lost host up after its
    // timeout and starts fresh elsewhere; when the host's agent returns
    // listing that volume, it is told to remove it.
    let mut spec = stateful("relocating");
    spec.stateful = Some(pb::StatefulPolicy {
        host_down_timeout_ms: 1000,
        on_host_down: pb::VolumeLossPolicy::Relocate as i32,
    });
    let id = cluster.create(spec).await;
    let t = cluster.wait_running(&id, 1).await.remove(0);
    let lost = run_of(&t).host.clone();
    let t = eventually("the volume in the task's read", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.volume_id.is_empty()).then_some(t)
    })
    .await;
    let old = t.volume_id.clone();
    wait_run_with_log(&cluster, &id, 1, &lost, &old).await;
    cluster.sigkill_agent(&lost).await;
    let t = eventually("the instance running fresh elsewhere", async || {
        let t = cluster.task(&id, 0).await?;
        let ok = run_of(&t).state() == T::Running
            && run_of(&t).host != lost
            && !t.volume_id.is_empty()
            && t.volume_id != old;
        ok.then_some(t)
    })
    .await;
    let elsewhere = run_of(&t).host.clone();
    assert_eq!(t.pinned_host, elsewhere, "{t:#?}");
    let run_id = run_of(&t).run_id;
    let new = t.volume_id.clone();
    eventually("a fresh volume", async || {
        (log_lines(&cluster, &elsewhere, &new) == [format!("{id}-0-{run_id}")]).then_some(())
    })
    .await;
    let vols = volumes_of(&cluster, &id).await;
    assert_eq!(vols.len(), 1, "{vols:#?}");
    assert_eq!(vols[0].id, new, "{vols:#?}");
    assert!(
        volume_dir(&cluster, &lost, &old).exists(),
        "its agent is away"
    );
    // The host's agent returns: its old run is stopped, the instance stays
    // where it is. (That the given-up volume then leaves the returning
    // host's disk is checked, and fails, in
    // `a_given_up_volume_leaves_its_host_when_the_host_returns`.)
    cluster.start_agent(&lost).await;
    cluster.wait_hosts_up(3).await;
    eventually("the old run stopped on the returning host", async || {
        processes_with_env(&format!("PELOTON_TASK_ID={id}-0-1"))
            .is_empty()
            .then_some(())
    })
    .await;
    let t = cluster.task(&id, 0).await.expect("task");
    assert_eq!(
        (run_of(&t).run_id, run_of(&t).host.as_str()),
        (run_id, elsewhere.as_str()),
        "{t:#?}"
    );
    let vols = volumes_of(&cluster, &id).await;
    assert_eq!(vols.len(), 1, "{vols:#?}");
    assert_eq!(vols[0].id, new, "{vols:#?}");
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}

// Server bug, found by this test: when a lost host's agent returns, the run
// that outlived its agent is killed (with a fixed 10 s grace, not the task's)
// and the instance's next run is launched on the same host — sharing the
// volume — in the same registration, without waiting for the old run's end:
// both ran on the volume at once for the whole grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_host_never_runs_two_runs_of_a_stateful_instance_at_once() {
    let mut cluster = Cluster::start(2).await;
    let id = cluster.create(recording_stateful("overlap")).await;
    let t = cluster.wait_running(&id, 1).await.remove(0);
    let host = run_of(&t).host.clone();
    let vid = eventually("the volume in the task's read", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.volume_id.is_empty()).then_some(t.volume_id)
    })
    .await;
    wait_run_with_log(&cluster, &id, 1, &host, &vid).await;
    cluster.sigkill_agent(&host).await;
    eventually("run 1 lost and run 2 waiting", async || {
        let t = cluster.task(&id, 0).await?;
        let run = t.current.as_ref()?;
        let waiting = matches!(run.state(), T::Pending | T::Ready | T::Placing);
        (run.run_id == 2 && waiting).then_some(())
    })
    .await;
    // Run 2, queued for the host, gives way while run 1 is stopped; run 3
    // starts once run 1 is gone.
    cluster.start_agent(&host).await;
    wait_run_with_log(&cluster, &id, 3, &host, &vid).await;
    let run1 = format!("PELOTON_TASK_ID={id}-0-1");
    eventually("run 1 gone", async || {
        processes_with_env(&run1).is_empty().then_some(())
    })
    .await;
    let dir = volume_dir(&cluster, &host, &vid);
    let r1 = run_interval(&dir, &id, 1).expect("run 1 recorded");
    let r2 = eventually("run 3 recorded", async || run_interval(&dir, &id, 3)).await;
    assert!(
        r1.1 < r2.0,
        "runs 1 and 3 of a stateful instance ran at once on its volume: run 3 started {} ms \
         before run 1's last sign of life",
        (r1.1 - r2.0) / 1_000_000
    );
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}

// Server bug, found by this test: the volume a relocating job gave up while
// its host was lost is never removed from that host. The returning agent
// lists it and the server sends DeleteVolumes at once, in the registration
// that also kills the instance's old run — which outlived its agent and
// still uses the volume, so the agent keeps it ("not deleting a volume that
// a live run uses") — and the server never asks again (until the agent's
// next registration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_up_volume_leaves_its_host_when_the_host_returns() {
    let mut cluster = Cluster::start(2).await;
    let mut spec = stateful("relocating");
    spec.stateful = Some(pb::StatefulPolicy {
        host_down_timeout_ms: 1000,
        on_host_down: pb::VolumeLossPolicy::Relocate as i32,
    });
    let id = cluster.create(spec).await;
    let t = cluster.wait_running(&id, 1).await.remove(0);
    let lost = run_of(&t).host.clone();
    let old = eventually("the volume in the task's read", async || {
        let t = cluster.task(&id, 0).await?;
        (!t.volume_id.is_empty()).then_some(t.volume_id)
    })
    .await;
    wait_run_with_log(&cluster, &id, 1, &lost, &old).await;
    cluster.sigkill_agent(&lost).await;
    eventually("the instance running fresh elsewhere", async || {
        let t = cluster.task(&id, 0).await?;
        let ok = run_of(&t).state() == T::Running
            && run_of(&t).host != lost
            && !t.volume_id.is_empty()
            && t.volume_id != old;
        ok.then_some(())
    })
    .await;
    cluster.start_agent(&lost).await;
    cluster.wait_hosts_up(2).await;
    eventually("the old run stopped on the returning host", async || {
        processes_with_env(&format!("PELOTON_TASK_ID={id}-0-1"))
            .is_empty()
            .then_some(())
    })
    .await;
    eventually(
        "the given-up volume removed from the returning host",
        async || (!volume_dir(&cluster, &lost, &old).exists()).then_some(()),
    )
    .await;
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}

// Server bug, found by this test: a host whose agent merely disconnected (an
// agent restart, which every other task survives) goes Down at once, and the
// next cycle (at the latest `idle_cycle_interval_ms` later) retires its
// daemon instance, as for a host that left: the daemon's run is killed when
// the agent returns and a new instance starts. Here a job created while the
// agent is away makes that cycle happen for sure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_keeps_its_runs_through_an_agent_restart() {
    let mut cluster = Cluster::start(2).await;
    let id = cluster.create(daemon("node-agent", "")).await;
    let launches = |tasks: &[pb::Task]| -> BTreeSet<(u32, String, u64)> {
        tasks
            .iter()
            .filter(|t| run_of(t).state() == T::Running)
            .map(|t| (t.instance, run_of(t).host.clone(), run_of(t).launch_id))
            .collect()
    };
    let before = launches(&wait_daemons_on(&cluster, &id, &["a0", "a1"]).await);
    cluster.sigterm_agent("a1").await;
    eventually("the server sees a1 gone", async || {
        (!host_named(&cluster, "a1").await?.connected).then_some(())
    })
    .await;
    // Work placed while the agent is away: a cycle runs.
    let mut spec = task_spec("exec sleep 600");
    spec.constraint = r#"rack == "r-a0""#.into();
    let during = cluster.create(job("during", 1, spec)).await;
    cluster.wait_running(&during, 1).await;
    cluster.start_agent("a1").await;
    cluster.wait_hosts_up(2).await;
    // Work placed after the registration: cycles have run since.
    let mut spec = task_spec("exec sleep 600");
    spec.constraint = r#"rack == "r-a1""#.into();
    let after = cluster.create(job("after", 1, spec)).await;
    cluster.wait_running(&after, 1).await;
    let now = launches(&wait_daemons_on(&cluster, &id, &["a0", "a1"]).await);
    assert_eq!(before, now, "the daemons' runs were replaced");
    assert_eq!(daemon_processes(&cluster, &id, "a1"), 1);
    cluster.kill_job(&during).await;
    cluster.kill_job(&after).await;
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}

// Server bug, found by this test (akin to the stateful one above): the
// daemon instance of a host whose agent went away is retired (its run told
// to stop, the kill going nowhere); when the agent returns, that run, still
// alive, is killed again (with a fixed 10 s grace, not the task's) while a
// new daemon instance for the host starts at once instead of waiting for
// the old run's end: two instances of the daemon on one host for the whole
// grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_host_runs_one_daemon_at_a_time() {
    let mut cluster = Cluster::start(2).await;
    let mut spec = daemon("node-agent", "");
    // Ignores SIGTERM: a stop lasts the whole grace period.
    spec.default_task.as_mut().expect("task").shell = "trap '' TERM; exec sleep 600".into();
    let id = cluster.create(spec).await;
    wait_daemons_on(&cluster, &id, &["a0", "a1"]).await;
    cluster.sigkill_agent("a1").await;
    wait_daemons_on(&cluster, &id, &["a0"]).await;
    cluster.start_agent("a1").await;
    wait_daemons_on(&cluster, &id, &["a0", "a1"]).await;
    assert_eq!(
        daemon_processes(&cluster, &id, "a1"),
        1,
        "two daemons of one job on a1 at once"
    );
    cluster.kill_job(&id).await;
    cluster.wait_job(&id, J::Killed).await;
}
