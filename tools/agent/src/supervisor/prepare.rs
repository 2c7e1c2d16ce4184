//! A run's preparation before its first record: the spec checked, ports,
//! volume, secrets' directory and cgroup set up, the task plan resolved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::Supervisor;
use super::held::Run;
use crate::isolation::{self, Isolation};
use crate::ports;
use crate::record::{DEFAULT_PATH, TaskPlan};
use crate::run::{AssignedPort, Command, RunId, RunPlan, TaskSpec};
use crate::secrets;
use crate::volumes;

/// Variables of the agent's environment that tasks inherit (nothing else:
/// the agent's environment may hold its token).
const INHERITED_ENV: [&str; 3] = ["PATH", "LANG", "TZ"];

/// A task's environment as it is built.
type Env = BTreeMap<String, String>;

impl Supervisor {
    /// Checks the spec, takes ports, creates the cgroup, sets up the volume
    /// and the secrets, resolves the task plan (written to the journal with
    /// the run's first record).
    pub(super) fn prepare(&mut self, run: &mut Run, launch: &RunPlan) -> Result<(), String> {
        let spec = launch.task.as_ref().map_err(Clone::clone)?;
        let (program, args) = task_command(&spec.command)?;
        run.record.health_check.clone_from(&spec.health_check);
        let mut env = task_env(spec, &run.record.key, &run.dir)?;
        // Checked before anything is created for the run.
        let volume = match &launch.volume {
            Some(id) => {
                volumes::validate_id(id)?;
                Some((id.clone(), volumes::mount_path(&spec.volume_path)?))
            }
            None => None,
        };
        secrets::validate(&launch.secrets)?;
        check_port_names(&spec.ports)?;
        let numbers = self.ports.allocate(spec.ports.len())?;
        for (name, number) in spec.ports.iter().zip(&numbers) {
            env.insert(ports::port_env_name(name), number.to_string());
            run.record.ports.push(AssignedPort {
                name: name.clone(),
                port: *number,
            });
        }
        if let Some((id, path)) = volume {
            self.attach_volume(run, id, &path, &mut env)?;
        }
        if !launch.secrets.is_empty() {
            // The values go to their files only (see `launch_one`); the
            // environment, and so the journal's plan, gets the directory.
            env.insert(
                "PELOTON_SECRETS".to_owned(),
                secrets::dir(&run.dir).to_string_lossy().into_owned(),
            );
        }
        let mut plan = TaskPlan {
            program,
            args,
            env: env.into_iter().collect(),
            open_files: Some(self.config.open_files),
            cgroup: None,
        };
        self.isolate(run, &mut plan, spec)?;
        run.plan = Some(plan);
        Ok(())
    }

    /// Makes the volume `id` visible at `path` in the run's sandbox (and
    /// in its environment as `PELOTON_VOLUME`), creating it if it is new.
    fn attach_volume(
        &self,
        run: &mut Run,
        id: String,
        path: &Path,
        env: &mut Env,
    ) -> Result<(), String> {
        // Recorded first: while the run lives, its volume is not deleted.
        run.record.volume = Some(id.clone());
        let target = volumes::ensure(&self.volumes, &id)
            .map_err(|e| format!("cannot create the volume {id:?}: {e}"))?;
        let at = volumes::link(&run.dir, path, &target).map_err(|e| {
            format!(
                "cannot make the volume {id:?} visible at {:?} in the sandbox: {e}",
                path.display()
            )
        })?;
        env.insert(
            "PELOTON_VOLUME".to_owned(),
            at.to_string_lossy().into_owned(),
        );
        Ok(())
    }

    /// Sets the run's memory limit (at least `MEMORY_LIMIT_MIN_BYTES`),
    /// which limits what the task's processes hold, never the address space
    /// they map: `memory.max` of a cgroup made for the run, or the agent's
    /// watch (either `memory_limit`).
    fn isolate(&self, run: &mut Run, plan: &mut TaskPlan, spec: &TaskSpec) -> Result<(), String> {
        match &self.config.isolation {
            Isolation::Rlimit => {
                run.record.resident_limit_bytes =
                    isolation::memory_limit_bytes(spec.resources.memory_mb);
            }
            Isolation::CgroupV2 { parent } => {
                let name = run.record.key.sandbox_name();
                let cgroup = isolation::create_run_cgroup(parent, &name, &spec.resources)
                    .map_err(|e| format!("cannot create the run's cgroup: {e}"))?;
                run.record.cgroup = Some(cgroup.clone());
                plan.cgroup = Some(cgroup);
            }
        }
        Ok(())
    }
}

/// The program and arguments a command runs as.
fn task_command(command: &Command) -> Result<(String, Vec<String>), String> {
    let (program, args) = match command {
        Command::Exec { program, args } => (program.clone(), args.clone()),
        Command::Shell(line) => ("/bin/sh".to_owned(), vec!["-c".to_owned(), line.clone()]),
    };
    if program.contains('\0') || args.iter().any(|a| a.contains('\0')) {
        return Err("the task's command contains a NUL byte".to_owned());
    }
    Ok((program, args))
}

/// The task's environment before its ports, volume and secrets: what it
/// inherits from the agent, its spec's variables, and the run's identity.
fn task_env(spec: &TaskSpec, key: &RunId, dir: &Path) -> Result<Env, String> {
    let mut env: Env = INHERITED_ENV
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
        .collect();
    env.entry("PATH".to_owned())
        .or_insert_with(|| DEFAULT_PATH.to_owned());
    for (name, value) in &spec.env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(format!("env: {name:?} is not a usable variable"));
        }
        env.insert(name.clone(), value.clone());
    }
    env.insert("PELOTON_JOB_ID".to_owned(), key.job_id.clone());
    env.insert("PELOTON_INSTANCE_ID".to_owned(), key.instance.to_string());
    env.insert("PELOTON_RUN_ID".to_owned(), key.run_id.to_string());
    env.insert("PELOTON_TASK_ID".to_owned(), key.task_id());
    env.insert(
        "PELOTON_SANDBOX".to_owned(),
        dir.to_string_lossy().into_owned(),
    );
    Ok(env)
}

/// Port names are not empty and name distinct variables.
fn check_port_names(names: &[String]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for name in names {
        if name.is_empty() || !seen.insert(ports::port_env_name(name)) {
            return Err(format!(
                "ports: {name:?} is empty or names the same variable as another port"
            ));
        }
    }
    Ok(())
}
