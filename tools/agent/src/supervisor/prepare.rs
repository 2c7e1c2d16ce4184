//! A run's preparation before its first record: the spec checked, ports,
//! volume, secrets' directory and cgroup set up, the task plan resolved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::Supervisor;
use super::held::Run;
use crate::isolation::{self, Isolation};
use crate::ports;
use crate::record::{self, DEFAULT_PATH, TaskPlan};
use crate::rendezvous;
use crate::run::{AssignedPort, Command, GpuAssignment, Rendezvous, RunId, RunPlan, TaskSpec};
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
        // The agent's own binary, for commands a task runs through it
        // (`$PELOTON_AGENT_BIN mpirun -- ...`).
        env.insert(
            "PELOTON_AGENT_BIN".to_owned(),
            self.config.agent_exe.to_string_lossy().into_owned(),
        );
        gpu_env(&launch.gpu, self.config.gpus, &mut env)?;
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
        let numbers = if launch.ports.is_empty() {
            self.ports.allocate(spec.ports.len())?
        } else {
            let chosen = chosen_ports(&spec.ports, &launch.ports)?;
            self.ports.take(&chosen)?;
            chosen
        };
        for (name, number) in spec.ports.iter().zip(&numbers) {
            env.insert(ports::port_env_name(name), number.to_string());
            run.record.ports.push(AssignedPort {
                name: name.clone(),
                port: *number,
            });
        }
        if let Some(r) = &launch.rendezvous {
            join_gang(r, &spec.ports, &run.dir, &mut env)?;
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

/// The ports the server chose for the task's named ports, in its spec's
/// order: one for each name, nothing else.
fn chosen_ports(names: &[String], chosen: &BTreeMap<String, u32>) -> Result<Vec<u16>, String> {
    if chosen.len() != names.len() {
        return Err(format!(
            "ports: the server chose {} port(s) for a task of {}",
            chosen.len(),
            names.len()
        ));
    }
    names
        .iter()
        .map(|name| {
            let port = chosen
                .get(name)
                .ok_or_else(|| format!("ports: the server chose no port {name:?}"))?;
            u16::try_from(*port)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("ports: {port} is not a port number"))
        })
        .collect()
}

/// A gang member's view of its gang: its variables into `env` (over the
/// spec's own), its files into the sandbox.
fn join_gang(r: &Rendezvous, ports: &[String], dir: &Path, env: &mut Env) -> Result<(), String> {
    let view = rendezvous::gang_view(r, ports, &dir.to_string_lossy())?;
    for (name, text) in &view.files {
        std::fs::write(dir.join(name), text)
            .map_err(|e| format!("cannot write {name} into the sandbox: {e}"))?;
    }
    env.extend(view.env);
    Ok(())
}

impl Supervisor {
    /// Elastic gangs: live members' files rewritten for their gang's new
    /// membership (`rendezvous.json`, and the MPI hostfile): each written
    /// whole beside it, then renamed over it, so a reader never sees half
    /// of one. Their environment stays as the task started with it. Runs
    /// this agent does not hold, or that have ended, are skipped.
    pub fn update_rendezvous(&mut self, updates: &[(RunId, Rendezvous)]) {
        for (key, r) in updates {
            let Some(run) = self.runs.get(key) else {
                tracing::debug!(run = %key.sandbox_name(), "rendezvous of an unknown run ignored");
                continue;
            };
            if run.record.report.phase.is_final() {
                continue;
            }
            let names: Vec<String> = run.record.ports.iter().map(|p| p.name.clone()).collect();
            let written =
                rendezvous::gang_view(r, &names, &run.dir.to_string_lossy()).and_then(|view| {
                    for (name, text) in &view.files {
                        let tmp = run.dir.join(format!(".{name}.new"));
                        std::fs::write(&tmp, text)
                            .and_then(|()| std::fs::rename(&tmp, run.dir.join(name)))
                            .map_err(|e| format!("cannot write {name} into the sandbox: {e}"))?;
                    }
                    Ok(())
                });
            match written {
                Ok(()) => tracing::info!(
                    run = %key.sandbox_name(),
                    generation = r.generation,
                    size = r.size,
                    "gang membership changed"
                ),
                Err(e) => tracing::warn!(run = %key.sandbox_name(), "rendezvous update: {e}"),
            }
        }
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
    env.insert(
        "PELOTON_CHECKPOINT".to_owned(),
        dir.join(record::CHECKPOINT_FILE)
            .to_string_lossy()
            .into_owned(),
    );
    env.insert(
        "PELOTON_PREEMPTED".to_owned(),
        dir.join(record::PREEMPTED_FILE)
            .to_string_lossy()
            .into_owned(),
    );
    Ok(env)
}

/// What the variables CUDA and the NVIDIA container runtime read say the
/// task sees: exactly the devices the server gave it, by the index
/// `nvidia-smi` shows (`CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA numbers
/// them the same way), in `CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`
/// and `PELOTON_GPU_DEVICES`, with a share of one device in
/// `PELOTON_GPU_SHARE_MILLI`. On a host with GPUs a task given none gets
/// `CUDA_VISIBLE_DEVICES=` and `NVIDIA_VISIBLE_DEVICES=void`: it sees
/// none. A host without GPUs sets nothing. These overwrite the spec's own
/// variables of the same names. It is all the agent enforces: nothing
/// stops a process that resets them, or opens `/dev/nvidia*` itself (no
/// device cgroup), and a share is not metered. A launch naming a device
/// the host does not offer fails with the reason.
fn gpu_env(gpu: &GpuAssignment, host_gpus: u32, env: &mut Env) -> Result<(), String> {
    if let Some(d) = gpu.devices.iter().find(|&&d| d >= host_gpus) {
        return Err(format!(
            "gpu_devices: device {d} is not one of this host's {host_gpus} GPUs"
        ));
    }
    if gpu.devices.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "gpu_devices: {:?} are not distinct device indices in ascending order",
            gpu.devices
        ));
    }
    if gpu.share_milli > 0 && (gpu.devices.len() != 1 || gpu.share_milli >= 1000) {
        return Err(format!(
            "gpu_share_milli: a share of {} milli-GPUs must be below 1000, of exactly one device",
            gpu.share_milli
        ));
    }
    if host_gpus == 0 {
        return Ok(());
    }
    let list = gpu
        .devices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    env.insert("CUDA_DEVICE_ORDER".to_owned(), "PCI_BUS_ID".to_owned());
    env.insert("CUDA_VISIBLE_DEVICES".to_owned(), list.clone());
    if list.is_empty() {
        env.insert("NVIDIA_VISIBLE_DEVICES".to_owned(), "void".to_owned());
        return Ok(());
    }
    env.insert("NVIDIA_VISIBLE_DEVICES".to_owned(), list.clone());
    env.insert("PELOTON_GPU_DEVICES".to_owned(), list);
    if gpu.share_milli > 0 {
        env.insert(
            "PELOTON_GPU_SHARE_MILLI".to_owned(),
            gpu.share_milli.to_string(),
        );
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(devices: &[u32], share_milli: u32, host_gpus: u32) -> Result<Vec<String>, String> {
        let mut env = Env::new();
        env.insert(
            "CUDA_VISIBLE_DEVICES".to_owned(),
            "from-the-spec".to_owned(),
        );
        let gpu = GpuAssignment {
            devices: devices.to_vec(),
            share_milli,
        };
        gpu_env(&gpu, host_gpus, &mut env)?;
        Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    #[test]
    fn a_task_sees_its_devices_and_none_else() {
        let cuda = |v: &str| format!("CUDA_VISIBLE_DEVICES={v}");
        let order = "CUDA_DEVICE_ORDER=PCI_BUS_ID".to_owned();
        assert_eq!(
            env_of(&[1, 3], 0, 4).unwrap(),
            [
                order.clone(),
                cuda("1,3"),
                "NVIDIA_VISIBLE_DEVICES=1,3".to_owned(),
                "PELOTON_GPU_DEVICES=1,3".to_owned(),
            ]
        );
        assert_eq!(
            env_of(&[2], 500, 4).unwrap(),
            [
                order.clone(),
                cuda("2"),
                "NVIDIA_VISIBLE_DEVICES=2".to_owned(),
                "PELOTON_GPU_DEVICES=2".to_owned(),
                "PELOTON_GPU_SHARE_MILLI=500".to_owned(),
            ]
        );
        // A CPU task on a GPU host sees no device; on a host without GPUs
        // nothing is set (the spec's own value stays).
        assert_eq!(
            env_of(&[], 0, 4).unwrap(),
            [order, cuda(""), "NVIDIA_VISIBLE_DEVICES=void".to_owned()]
        );
        assert_eq!(env_of(&[], 0, 0).unwrap(), [cuda("from-the-spec")]);
    }

    #[test]
    fn devices_the_host_does_not_offer_are_refused() {
        for (devices, share, gpus, message) in [
            (
                &[4][..],
                0,
                4,
                "gpu_devices: device 4 is not one of this host's 4 GPUs",
            ),
            (
                &[0],
                0,
                0,
                "gpu_devices: device 0 is not one of this host's 0 GPUs",
            ),
            (
                &[1, 1],
                0,
                4,
                "gpu_devices: [1, 1] are not distinct device indices in ascending order",
            ),
            (
                &[0, 1],
                500,
                4,
                "gpu_share_milli: a share of 500 milli-GPUs must be below 1000, of exactly one device",
            ),
        ] {
            assert_eq!(env_of(devices, share, gpus), Err(message.to_owned()));
        }
    }
}
