//! Persistent volumes and secrets with real processes and no server: a
//! volume's data across runs, agent restarts and sandbox garbage
//! collection, its deletion, secrets as private files that exist only
//! while the run lives and nowhere else on disk, and the readable failures
//! of bad volume paths, volume ids and secret names.
//!
//! Tests wait for phases with generous timeouts and never assert how long
//! anything took.

mod supervised;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use peloton_agent::{GcPolicy, SupervisorConfig, now_ms};
use peloton_proto::v1;
use supervised::ProtoSupervisor;
use v1::RunPhase as P;

const TIMEOUT: Duration = Duration::from_secs(30);
const VOLUME: &str = "vol-7";

fn key(job_id: &str, instance: u32, run_id: u32) -> v1::RunKey {
    v1::RunKey {
        job_id: job_id.to_owned(),
        instance,
        run_id,
        launch_id: 1000 * u64::from(run_id) + u64::from(instance),
    }
}

fn shell(line: &str) -> v1::TaskSpec {
    v1::TaskSpec {
        shell: line.to_owned(),
        ..v1::TaskSpec::default()
    }
}

/// A launch of `spec` with the volume `id` at `path` ("" for the default).
fn with_volume(key: &v1::RunKey, mut spec: v1::TaskSpec, id: &str, path: &str) -> v1::LaunchRun {
    spec.volume = Some(v1::VolumeSpec {
        size_mb: 10,
        path: path.to_owned(),
    });
    v1::LaunchRun {
        key: Some(key.clone()),
        spec: Some(spec),
        volume: Some(v1::VolumeMount {
            id: id.to_owned(),
            size_mb: 10,
        }),
        ..v1::LaunchRun::default()
    }
}

fn with_secrets(key: &v1::RunKey, spec: v1::TaskSpec, secrets: &[(&str, &[u8])]) -> v1::LaunchRun {
    v1::LaunchRun {
        key: Some(key.clone()),
        spec: Some(spec),
        volume: None,
        secrets: secrets
            .iter()
            .map(|(name, value)| v1::Secret {
                name: (*name).to_owned(),
                value: value.to_vec(),
                size: 0,
            })
            .collect(),
        ..v1::LaunchRun::default()
    }
}

fn config(dir: &Path) -> SupervisorConfig {
    SupervisorConfig::new(dir, env!("CARGO_BIN_EXE_peloton-agent"))
}

/// Collects every acknowledged sandbox.
fn collect_everything() -> GcPolicy {
    GcPolicy {
        max_age_ms: 0,
        max_disk_bytes: 0,
    }
}

/// A supervisor and the latest report of each run.
struct Harness {
    supervisor: ProtoSupervisor,
    latest: HashMap<v1::RunKey, v1::RunReport>,
}

impl Harness {
    fn open(dir: &Path) -> Harness {
        Harness {
            supervisor: ProtoSupervisor::open(config(dir)).expect("supervisor opens"),
            latest: HashMap::new(),
        }
    }

    fn drain(&mut self) {
        for report in self.supervisor.take_reports(usize::MAX) {
            let key = report.key.clone().expect("reports name their run");
            self.latest.insert(key, report);
        }
    }

    fn wait_for(&mut self, key: &v1::RunKey, phase: P) -> v1::RunReport {
        let start = Instant::now();
        loop {
            self.supervisor.poll();
            self.drain();
            if let Some(report) = self.latest.get(key)
                && report.phase() == phase
            {
                return report.clone();
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "run {key:?} did not reach {phase:?}; latest: {:?}",
                self.latest.get(key)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sandbox(&self, key: &v1::RunKey) -> PathBuf {
        self.supervisor.sandbox_dir(key)
    }

    fn stdout(&self, key: &v1::RunKey) -> String {
        std::fs::read_to_string(self.sandbox(key).join("stdout")).expect("stdout")
    }

    fn ack(&mut self, key: &v1::RunKey) {
        self.supervisor.ack(std::slice::from_ref(key));
    }
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < TIMEOUT, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every file under `dir` whose content contains `needle` (symbolic links
/// are not followed: a volume is searched once, where it lives).
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = path.symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file()
                && std::fs::read(&path)
                    .is_ok_and(|data| data.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn a_volume_keeps_its_data_across_runs_restarts_and_gc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    assert!(h.supervisor.volumes().is_empty());

    // The first run writes into its volume, at the default path.
    let first = key("job-v", 0, 1);
    h.supervisor.launch(&[with_volume(
        &first,
        shell(
            "test \"$PELOTON_VOLUME\" = \"$PELOTON_SANDBOX/data\" || exit 3; \
             mkdir -p data/sub && echo kept > \"$PELOTON_VOLUME/sub/file\"",
        ),
        VOLUME,
        "",
    )]);
    let done = h.wait_for(&first, P::Succeeded);
    assert_eq!(done.exit_code, 0, "{done:?}");
    let volume = h.supervisor.volumes_dir().join(VOLUME);
    assert_eq!(
        std::fs::read_to_string(volume.join("sub/file")).expect("in the volume"),
        "kept\n"
    );
    assert_eq!(
        std::fs::read_link(h.sandbox(&first).join("data")).expect("a link"),
        volume
    );
    assert_eq!(h.supervisor.volumes(), [VOLUME]);

    // Its sandbox is collected; the link goes, the volume stays.
    h.ack(&first);
    let outcome = h
        .supervisor
        .collect_garbage(&collect_everything(), u64::MAX / 2);
    assert_eq!(outcome.removed, [h.sandbox(&first)]);
    assert!(!h.sandbox(&first).exists());
    assert_eq!(
        std::fs::read_to_string(volume.join("sub/file")).expect("survived gc"),
        "kept\n"
    );

    // An agent restart: a new supervisor on the same work directory.
    drop(h);
    let mut h = Harness::open(dir.path());
    assert_eq!(h.supervisor.volumes(), [VOLUME]);

    // A later run of the instance, the volume at another path, reads it
    // back and adds to it.
    let second = key("job-v", 0, 2);
    h.supervisor.launch(&[with_volume(
        &second,
        shell(
            "test \"$PELOTON_VOLUME\" = \"$PELOTON_SANDBOX/state/db\" || exit 3; \
             cat state/db/sub/file; echo more >> \"$PELOTON_VOLUME/sub/file\"",
        ),
        VOLUME,
        "state/db",
    )]);
    let done = h.wait_for(&second, P::Succeeded);
    assert_eq!(done.exit_code, 0, "{done:?}");
    assert_eq!(h.stdout(&second), "kept\n");
    h.ack(&second);
    let _ = h
        .supervisor
        .collect_garbage(&collect_everything(), u64::MAX / 2);
    assert!(!h.sandbox(&second).exists());
    assert_eq!(
        std::fs::read_to_string(volume.join("sub/file")).expect("survived"),
        "kept\nmore\n"
    );

    // Deletion: bad and unknown ids are ignored, the volume goes.
    let deletion = h.supervisor.delete_volumes(
        &[
            "../sandboxes".to_owned(),
            "unknown".to_owned(),
            VOLUME.to_owned(),
        ],
        now_ms(),
    );
    assert!(h.supervisor.volumes().is_empty());
    deletion.finish();
    assert!(!volume.exists());
    let left: Vec<_> = std::fs::read_dir(h.supervisor.volumes_dir())
        .expect("volumes dir")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(h.supervisor.sandboxes_dir().exists());
}

#[test]
fn a_volume_in_use_is_not_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let k = key("job-u", 0, 1);
    h.supervisor.launch(&[with_volume(
        &k,
        shell("echo x > data/f; exec sleep 600"),
        VOLUME,
        "data",
    )]);
    h.wait_for(&k, P::Running);
    let volume = h.supervisor.volumes_dir().join(VOLUME);
    wait_until("the task wrote into its volume", || {
        volume.join("f").exists()
    });
    // Also after a restart: the run's record names its volume.
    drop(h);
    let mut h = Harness::open(dir.path());
    let deletion = h.supervisor.delete_volumes(&[VOLUME.to_owned()], now_ms());
    assert!(deletion.is_empty());
    deletion.finish();
    assert!(volume.join("f").exists());
    assert_eq!(h.supervisor.volumes(), [VOLUME]);

    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 0,
        delay_ms: 0,
        ..Default::default()
    }]);
    h.wait_for(&k, P::Killed);
    h.supervisor
        .delete_volumes(&[VOLUME.to_owned()], now_ms())
        .finish();
    assert!(!volume.exists());
    assert!(h.supervisor.volumes().is_empty());
}

#[test]
fn bad_volume_paths_and_ids_fail_the_run_with_a_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let cases = [
        (VOLUME, "/etc/x", "must be relative"),
        (VOLUME, "../outside", "must not contain '..'"),
        (VOLUME, "a/../../b", "must not contain '..'"),
        (VOLUME, "stdout", "taken by a file of the agent"),
        (VOLUME, ".peloton-secrets", "taken by a file of the agent"),
        ("../escape", "data", "volume id \"../escape\""),
        (".hidden", "data", "volume id \".hidden\""),
    ];
    let long_id = "v".repeat(201);
    let cases = cases
        .into_iter()
        .chain([(long_id.as_str(), "data", "1 to 200 characters")]);
    for (n, (id, path, expected)) in (0u32..).zip(cases) {
        let k = key("job-bad", n, 1);
        h.supervisor
            .launch(&[with_volume(&k, shell("touch ran"), id, path)]);
        let failed = h.wait_for(&k, P::Failed);
        assert!(
            failed.reason.contains(expected) && failed.reason.contains("volume"),
            "{id:?} at {path:?}: {:?}",
            failed.reason
        );
        assert!(!h.sandbox(&k).join("ran").exists(), "the task never ran");
    }
    // Nothing was created for them.
    assert!(h.supervisor.volumes().is_empty());
    assert!(!dir.path().join("escape").exists());
}

#[test]
fn a_secret_is_a_private_file_only_while_the_run_lives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    // Binary, and distinctive enough to be searched for.
    let value: &[u8] = b"s3cr3t-\x00\xff-7f1e9c2a-VALUE";
    // The task compares its secret with a copy outside the work directory,
    // so that the value itself is never in its command or its output.
    let expected = elsewhere.path().join("expected");
    std::fs::write(&expected, value).expect("write");
    let mut h = Harness::open(dir.path());
    let k = key("job-s", 0, 1);
    let line = format!(
        "f=\"$PELOTON_SECRETS/db-password\"; \
         test \"$PELOTON_SECRETS\" = \"$PELOTON_SANDBOX/.peloton-secrets\" && echo at-path; \
         cmp -s \"$f\" '{}' && echo same; cat \"$PELOTON_SECRETS/empty\"; \
         stat -c %a \"$f\" \"$PELOTON_SECRETS\"; touch ready; \
         while [ ! -f go ]; do sleep 0.05; done",
        expected.display()
    );
    h.supervisor.launch(&[with_secrets(
        &k,
        shell(&line),
        &[("db-password", value), ("empty", b"")],
    )]);
    h.wait_for(&k, P::Running);
    let sandbox = h.sandbox(&k);
    wait_until("the task read its secret", || {
        sandbox.join("ready").exists()
    });
    let secret = sandbox.join(".peloton-secrets/db-password");
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&secret), 0o600);
    assert_eq!(mode(&sandbox.join(".peloton-secrets")), 0o700);
    // While the run lives, the value is in its file and nowhere else under
    // the work directory (not task.json, not run.json, not a log).
    let work_dir = dir.path().canonicalize().expect("canonical");
    assert_eq!(files_containing(&work_dir, value), [secret]);

    std::fs::write(sandbox.join("go"), "").expect("touch go");
    let done = h.wait_for(&k, P::Succeeded);
    assert_eq!(done.exit_code, 0, "{done:?}");
    assert_eq!(h.stdout(&k), "at-path\nsame\n600\n700\n");
    // Once it has ended, nowhere.
    assert!(!sandbox.join(".peloton-secrets").exists());
    assert!(files_containing(&work_dir, value).is_empty());
}

#[test]
fn secrets_of_a_readopted_run_are_removed_when_it_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let k = key("job-r", 0, 1);
    h.supervisor.launch(&[with_secrets(
        &k,
        shell("exec sleep 600"),
        &[("token", b"readopted-secret-31337")],
    )]);
    h.wait_for(&k, P::Running);
    let secrets = h.sandbox(&k).join(".peloton-secrets");
    assert!(secrets.join("token").exists());
    drop(h);
    let mut h = Harness::open(dir.path());
    assert!(secrets.join("token").exists(), "kept while the run lives");
    h.supervisor.kill(&[v1::KillRun {
        key: Some(k.clone()),
        grace_ms: 0,
        delay_ms: 0,
        ..Default::default()
    }]);
    h.wait_for(&k, P::Killed);
    assert!(!secrets.exists());
    assert!(files_containing(dir.path(), b"readopted-secret-31337").is_empty());
}

#[test]
fn bad_secret_names_fail_the_run_with_a_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::open(dir.path());
    let long = "s".repeat(65);
    let cases: [&[(&str, &[u8])]; 6] = [
        &[("ok", b"v"), (".hidden", b"v")],
        &[("a/b", b"v")],
        &[("", b"v")],
        &[("../../escape", b"v")],
        &[(long.as_str(), b"v")],
        &[("twice", b"1"), ("twice", b"2")],
    ];
    for (n, secrets) in (0u32..).zip(cases) {
        let k = key("job-bs", n, 1);
        h.supervisor
            .launch(&[with_secrets(&k, shell("touch ran"), secrets)]);
        let failed = h.wait_for(&k, P::Failed);
        assert!(
            failed.reason.starts_with("secret name"),
            "{secrets:?}: {:?}",
            failed.reason
        );
        let sandbox = h.sandbox(&k);
        assert!(!sandbox.join("ran").exists(), "the task never ran");
        assert!(!sandbox.join(".peloton-secrets").exists());
    }
    assert!(!dir.path().join("escape").exists());
}
