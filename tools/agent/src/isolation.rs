//! How a run is confined: a cgroup v2 per run, or rlimits as the fallback.
//!
//! cgroup v2 is used only when it demonstrably works: the unified hierarchy
//! is mounted at `/sys/fs/cgroup` with the `cpu` and `memory` controllers,
//! and the agent can create its parent cgroup (`/sys/fs/cgroup/peloton` by
//! default), enable both controllers for its children and create a child
//! that has `memory.max` and `cpu.max`. Anything less (cgroup v1, a hybrid
//! mount, no permission) falls back to RLIMIT_NOFILE set on the task
//! process just before it executes the task, and a watch on the resident
//! memory of the task's processes (the supervisor's, at most every
//! `MEMORY_WATCH_INTERVAL_MS`). Memory is never limited by address space
//! (RLIMIT_AS): what a process maps is not what it uses — a dynamically
//! linked `/bin/true` cannot even map libc under 2 MiB, and a JVM reserves
//! gigabytes it never touches. Either way a task's memory limit is at least
//! [`MEMORY_LIMIT_MIN_BYTES`], as Mesos never gives a container less than
//! 32 MB. The parent cgroup holds no process
//! itself (cgroup v2 forbids processes in a cgroup whose controllers are
//! enabled for its children); each run gets `<parent>/<sandbox name>`, which
//! only the task tree joins (the task's child joins it before it executes
//! the task) — the launcher stays outside, so `cgroup.kill` and the OOM
//! killer never take the process that records the exit status.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::run::Resources;

/// Where cgroup v2 must be mounted for the agent to use it.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// `cpu.max` period: 100 ms, the kernel's default.
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts.
const CPU_QUOTA_MIN_US: u64 = 1_000;
/// The floor of a task's memory limit: a smaller `memory_mb` (the API
/// accepts any) is raised to it where the limit is applied, so that a
/// shell, a dynamic loader and libc always fit (Mesos's floor is 32 MB).
pub(crate) const MEMORY_LIMIT_MIN_BYTES: u64 = 32 << 20;

/// The isolation in effect for every run of this agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// RLIMIT_NOFILE on the task process and the agent's watch on the
    /// resident memory of its processes; cpu, disk and GPUs are not
    /// enforced.
    Rlimit,
    /// One cgroup per run under `parent` (memory.max, cpu.max, cgroup.kill).
    CgroupV2 { parent: PathBuf },
}

impl Isolation {
    /// The name reported in `AgentRegister.isolation`.
    pub fn name(&self) -> &'static str {
        match self {
            Isolation::Rlimit => "rlimit",
            Isolation::CgroupV2 { .. } => "cgroup-v2",
        }
    }

    /// What is and is not enforced, for the agent's log.
    pub fn summary(&self, open_files: u64) -> String {
        match self {
            Isolation::Rlimit => format!(
                "rlimit: memory by the agent's watch on the resident memory (PSS) of each \
                 run's processes (from memory_mb, at least 32 MiB; killed above it), \
                 open files as RLIMIT_NOFILE {open_files}; cpu, disk and gpu are NOT enforced; \
                 kills find a run's processes through /proc"
            ),
            Isolation::CgroupV2 { parent } => format!(
                "cgroup-v2 under {}: memory.max from memory_mb (at least 32 MiB), cpu.max from cpu, \
                 open files as RLIMIT_NOFILE {open_files}, OOM kills from memory.events, \
                 kills with cgroup.kill; disk and gpu are NOT enforced",
                parent.display()
            ),
        }
    }

    /// cgroup v2 under `parent` if it works, else rlimits and why.
    pub fn detect(parent: &Path) -> (Isolation, Option<String>) {
        match Isolation::cgroup_v2(parent) {
            Ok(isolation) => (isolation, None),
            Err(why) => (Isolation::Rlimit, Some(why)),
        }
    }

    /// cgroup v2 under `parent`, or why it cannot be used.
    pub fn cgroup_v2(parent: &Path) -> Result<Isolation, String> {
        let mount = Path::new(CGROUP_MOUNT);
        let controllers = fs::read_to_string(mount.join("cgroup.controllers")).map_err(|e| {
            format!("no cgroup v2 hierarchy at {CGROUP_MOUNT} (cgroup.controllers: {e})")
        })?;
        for needed in ["cpu", "memory"] {
            if !controllers.split_whitespace().any(|c| c == needed) {
                return Err(format!(
                    "the cgroup v2 hierarchy at {CGROUP_MOUNT} lacks the {needed} controller"
                ));
            }
        }
        if !parent.starts_with(mount) || parent == mount {
            return Err(format!(
                "the cgroup parent {} is not below {CGROUP_MOUNT}",
                parent.display()
            ));
        }
        // Every cgroup from the mount down to the parent must pass the
        // controllers on to its children.
        let mut dir = mount.to_path_buf();
        for part in parent.strip_prefix(mount).unwrap_or(parent).components() {
            enable_controllers(&dir)?;
            dir.push(part);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
            }
        }
        enable_controllers(parent)?;
        let probe = parent.join(format!("probe-{}", std::process::id()));
        fs::create_dir(&probe)
            .map_err(|e| format!("cannot create the cgroup {}: {e}", probe.display()))?;
        let usable = probe.join("memory.max").exists() && probe.join("cpu.max").exists();
        let _ = remove_cgroup(&probe);
        if !usable {
            return Err(format!(
                "a child of {} has no memory.max or cpu.max",
                parent.display()
            ));
        }
        Ok(Isolation::CgroupV2 {
            parent: parent.to_path_buf(),
        })
    }
}

fn enable_controllers(dir: &Path) -> Result<(), String> {
    let path = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let has = |c: &str| enabled.split_whitespace().any(|e| e == c);
    if has("cpu") && has("memory") {
        return Ok(());
    }
    fs::write(&path, "+cpu +memory").map_err(|e| {
        format!(
            "cannot enable the cpu and memory controllers in {}: {e}",
            path.display()
        )
    })
}

/// Creates the run's cgroup with its limits; returns its path.
pub(crate) fn create_run_cgroup(
    parent: &Path,
    name: &str,
    resources: &Resources,
) -> io::Result<PathBuf> {
    let dir = parent.join(name);
    match fs::create_dir(&dir) {
        Ok(()) => {}
        // Left over from a launch the agent crashed in; limits are rewritten.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let memory =
        memory_limit_bytes(resources.memory_mb).map_or("max".to_owned(), |b| b.to_string());
    fs::write(dir.join("memory.max"), memory)?;
    // Without this the kernel swaps instead of enforcing memory.max; not
    // every kernel has swap accounting, so failure is fine.
    let _ = fs::write(dir.join("memory.swap.max"), "0");
    fs::write(dir.join("cpu.max"), cpu_max(resources.cpu))?;
    Ok(dir)
}

/// `cpu.max` for `cpu` cores: quota per 100 ms period, or no limit.
fn cpu_max(cpu: f64) -> String {
    if cpu.is_finite() && cpu > 0.0 {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "finite, positive, and clamped below"
        )]
        let quota = (cpu * CPU_PERIOD_US as f64).round().min(1e15) as u64;
        format!("{} {CPU_PERIOD_US}", quota.max(CPU_QUOTA_MIN_US))
    } else {
        format!("max {CPU_PERIOD_US}")
    }
}

/// The memory limit a request sets, in bytes: `memory_mb`, and never less
/// than [`MEMORY_LIMIT_MIN_BYTES`]; none for no request.
pub(crate) fn memory_limit_bytes(memory_mb: f64) -> Option<u64> {
    if memory_mb.is_finite() && memory_mb > 0.0 {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "finite, positive, and clamped below"
        )]
        let bytes = (memory_mb * 1024.0 * 1024.0).ceil().min(9e18) as u64;
        Some(bytes.max(MEMORY_LIMIT_MIN_BYTES))
    } else {
        None
    }
}

/// The pids in a cgroup.
pub(crate) fn cgroup_pids(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// SIGKILL to every process in the cgroup (and its children), even those
/// that left the task's process group or tree.
pub(crate) fn kill_cgroup(dir: &Path) {
    if fs::write(dir.join("cgroup.kill"), "1").is_err() {
        // Kernels before 5.14 have no cgroup.kill.
        crate::proc::kill_all(&cgroup_pids(dir));
    }
}

/// The kernel's OOM killer killed something in the cgroup.
pub(crate) fn cgroup_oom_killed(dir: &Path) -> bool {
    fs::read_to_string(dir.join("memory.events")).is_ok_and(|events| {
        events.lines().any(|line| {
            line.strip_prefix("oom_kill ")
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        })
    })
}

/// Removes an empty run cgroup; a missing one is fine.
pub(crate) fn remove_cgroup(dir: &Path) -> io::Result<()> {
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_limits() {
        assert_eq!(cpu_max(1.5), "150000 100000");
        assert_eq!(cpu_max(0.001), "1000 100000");
        assert_eq!(cpu_max(0.0), "max 100000");
        assert_eq!(cpu_max(f64::NAN), "max 100000");
        assert_eq!(memory_limit_bytes(64.0), Some(64 << 20));
        assert_eq!(memory_limit_bytes(32.5), Some((32 << 20) + (1 << 19)));
        // The floor: a shell and libc always fit.
        assert_eq!(memory_limit_bytes(2.0), Some(32 << 20));
        assert_eq!(memory_limit_bytes(0.1), Some(32 << 20));
        assert_eq!(memory_limit_bytes(0.0), None);
        assert_eq!(memory_limit_bytes(-3.0), None);
        assert_eq!(memory_limit_bytes(f64::NAN), None);
    }
}
