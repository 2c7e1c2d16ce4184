//! The one translation between the server's protobuf messages and the
//! agent's own types (`run`): each message is parsed here once, as it
//! arrives, and each report is encoded here as it leaves. Nothing else in
//! the agent sees `peloton_proto`, except the session that carries the
//! messages.
//!
//! Public so that tests can drive the supervisor in the server's words.

use nix::sys::signal::Signal;
use peloton_proto::v1;

use crate::run::{
    CheckKind, Command, GangMember, GpuAssignment, Health, HealthCheckPlan, KillRequest, LogChunk,
    LogRequest, Phase, Rendezvous, Resources, RunId, RunPlan, RunReport, Secret, TaskSpec,
};
use crate::usage::UsageReport;

/// A run key as the agent names runs.
pub fn run_id(key: &v1::RunKey) -> RunId {
    RunId {
        job_id: key.job_id.clone(),
        instance: key.instance,
        run_id: key.run_id,
        launch_id: key.launch_id,
    }
}

/// A run's key as the server names runs.
pub fn run_key(id: &RunId) -> v1::RunKey {
    v1::RunKey {
        job_id: id.job_id.clone(),
        instance: id.instance,
        run_id: id.run_id,
        launch_id: id.launch_id,
    }
}

/// The plan of a launch; `None` for one without a run key (logged: there
/// is no run to report it on).
pub fn run_plan(launch: v1::LaunchRun) -> Option<RunPlan> {
    let Some(key) = &launch.key else {
        tracing::warn!("launch without a run key ignored");
        return None;
    };
    Some(RunPlan {
        key: run_id(key),
        task: task_spec(launch.spec.unwrap_or_default()),
        secrets: launch
            .secrets
            .into_iter()
            .map(|secret| Secret {
                name: secret.name,
                value: secret.value,
            })
            .collect(),
        volume: launch
            .volume
            .map(|mount| mount.id)
            .filter(|id| !id.is_empty()),
        gpu: GpuAssignment {
            devices: launch.gpu_devices,
            share_milli: launch.gpu_share_milli,
        },
        ports: launch.ports.into_iter().collect(),
        rendezvous: launch.rendezvous.map(rendezvous),
    })
}

/// Runs' new views of their elastic gangs.
pub fn rendezvous_updates(update: v1::UpdateRendezvous) -> Vec<(RunId, Rendezvous)> {
    update
        .runs
        .into_iter()
        .filter_map(|r| Some((run_id(r.key.as_ref()?), rendezvous(r.rendezvous?))))
        .collect()
}

/// A gang member's view of its gang.
fn rendezvous(r: v1::Rendezvous) -> Rendezvous {
    let spec = r.spec.unwrap_or_default();
    Rendezvous {
        size: r.size,
        rank: r.rank,
        generation: r.generation,
        members: r
            .members
            .into_iter()
            .map(|m| GangMember {
                rank: m.rank,
                instance: m.instance,
                host: m.host,
                address: m.address,
                ports: m.ports.into_iter().collect(),
            })
            .collect(),
        framework: spec.framework,
        port: spec.port,
    }
}

/// The task of a launch, or why it cannot be understood.
fn task_spec(spec: v1::TaskSpec) -> Result<TaskSpec, String> {
    let command = match (spec.command.is_empty(), spec.shell.is_empty()) {
        (false, true) => Command::Exec {
            program: spec.command,
            args: spec.args,
        },
        (true, false) => Command::Shell(spec.shell),
        (true, true) => return Err("the task spec sets neither command nor shell".to_owned()),
        (false, false) => return Err("the task spec sets both command and shell".to_owned()),
    };
    let health_check = spec.health_check.as_ref().map(health_check).transpose()?;
    Ok(TaskSpec {
        command,
        env: spec.env.into_iter().collect(),
        resources: spec.resources.map(resources).unwrap_or_default(),
        ports: spec.ports.into_iter().map(|port| port.name).collect(),
        health_check,
        kill_grace_ms: spec.kill_grace_period_ms,
        stop_signal: stop_signal(&spec.stop_signal).map(|signal| signal as i32),
        volume_path: spec.volume.map(|volume| volume.path).unwrap_or_default(),
    })
}

/// A task's health check; an error for one the agent cannot run at all.
fn health_check(spec: &v1::HealthCheck) -> Result<HealthCheckPlan, String> {
    use v1::health_check::Kind;
    let kind = match &spec.kind {
        None => {
            return Err(
                "the task's health check sets none of command, http and tcp_port".to_owned(),
            );
        }
        Some(Kind::Command(line)) => CheckKind::Command { line: line.clone() },
        Some(Kind::Http(http)) => CheckKind::Http {
            port: http.port.clone(),
            path: http.path.clone(),
        },
        Some(Kind::TcpPort(port)) => CheckKind::Tcp { port: port.clone() },
    };
    HealthCheckPlan::new(
        kind,
        spec.initial_delay_ms,
        spec.interval_ms,
        spec.timeout_ms,
        spec.max_consecutive_failures,
    )
}

/// A task's `stop_signal` (empty: none, so SIGTERM). The server accepts
/// only these names.
fn stop_signal(name: &str) -> Option<Signal> {
    Some(match name {
        "SIGINT" => Signal::SIGINT,
        "SIGQUIT" => Signal::SIGQUIT,
        "SIGHUP" => Signal::SIGHUP,
        "SIGUSR1" => Signal::SIGUSR1,
        "SIGUSR2" => Signal::SIGUSR2,
        "SIGPWR" => Signal::SIGPWR,
        _ => return None,
    })
}

/// A kill; `None` for one without a run key (logged).
pub fn kill_request(kill: &v1::KillRun) -> Option<KillRequest> {
    let Some(key) = &kill.key else {
        tracing::warn!("kill without a run key ignored");
        return None;
    };
    Some(KillRequest {
        key: run_id(key),
        delay_ms: kill.delay_ms,
        grace_ms: kill.grace_ms,
        preempted: (!kill.preempted.is_empty()).then(|| kill.preempted.clone()),
        notice_ms: kill.notice_ms,
    })
}

/// A log read (one without a run key names no valid run, and is answered
/// with an error).
pub fn log_request(read: &v1::ReadLog) -> LogRequest {
    LogRequest {
        request_id: read.request_id,
        key: run_id(&read.key.clone().unwrap_or_default()),
        stderr: read.stderr,
        offset: read.offset,
        max_bytes: read.max_bytes,
        tail_lines: read.tail_lines,
        since_ms: read.since_ms,
        times: read.times,
    }
}

pub fn log_chunk(chunk: LogChunk) -> v1::LogChunk {
    v1::LogChunk {
        request_id: chunk.request_id,
        offset: chunk.offset,
        data: chunk.data,
        eof: chunk.eof,
        error: chunk.error,
        marks: chunk
            .marks
            .into_iter()
            .map(|(offset, time_ms)| v1::LogMark { offset, time_ms })
            .collect(),
    }
}

pub fn resources(resources: v1::Resources) -> Resources {
    Resources {
        cpu: resources.cpu,
        memory_mb: resources.memory_mb,
        disk_mb: resources.disk_mb,
        gpu: resources.gpu,
    }
}

pub fn resources_to_proto(resources: Resources) -> v1::Resources {
    v1::Resources {
        cpu: resources.cpu,
        memory_mb: resources.memory_mb,
        disk_mb: resources.disk_mb,
        gpu: resources.gpu,
    }
}

/// A usage report, with the sums over its runs.
pub fn usage(report: &UsageReport) -> v1::AgentUsage {
    v1::AgentUsage {
        time_ms: report.time_ms,
        cpu_usec: report
            .runs
            .iter()
            .map(|r| r.cpu_usec)
            .fold(0, u64::saturating_add),
        memory_bytes: report
            .runs
            .iter()
            .map(|r| r.memory_bytes)
            .fold(0, u64::saturating_add),
        runs: report
            .runs
            .iter()
            .map(|r| v1::RunUsage {
                key: Some(run_key(&r.key)),
                cpu_usec: r.cpu_usec,
                memory_bytes: r.memory_bytes,
                disk_bytes: r.disk_bytes,
            })
            .collect(),
    }
}

pub fn report(report: RunReport) -> v1::RunReport {
    let phase = match report.phase.phase {
        Phase::Starting => v1::RunPhase::Starting,
        Phase::Running => v1::RunPhase::Running,
        Phase::Succeeded => v1::RunPhase::Succeeded,
        Phase::Failed => v1::RunPhase::Failed,
        Phase::Killed => v1::RunPhase::Killed,
    };
    let health = match report.health {
        Health::None => v1::Health::None,
        Health::Unknown => v1::Health::Unknown,
        Health::Healthy => v1::Health::Healthy,
        Health::Unhealthy => v1::Health::Unhealthy,
    };
    v1::RunReport {
        key: Some(run_key(&report.key)),
        phase: phase.into(),
        time_ms: report.phase.time_ms,
        exit_code: report.phase.exit_code,
        signal: report.phase.signal,
        oom_killed: report.phase.oom_killed,
        reason: report.phase.reason,
        started_ms: report.phase.started_ms,
        health: health.into(),
        ports: report
            .ports
            .into_iter()
            .map(|port| (port.name, u32::from(port.port)))
            .collect(),
        health_detail: report.health_detail,
        checkpoint_ms: report.checkpoint_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{AssignedPort, PhaseReport};

    fn launch(spec: v1::TaskSpec) -> v1::LaunchRun {
        v1::LaunchRun {
            key: Some(v1::RunKey {
                job_id: "j".to_owned(),
                instance: 1,
                run_id: 2,
                launch_id: 3,
            }),
            spec: Some(spec),
            ..v1::LaunchRun::default()
        }
    }

    #[test]
    fn a_launch_is_parsed_once_into_its_plan() {
        let spec = v1::TaskSpec {
            shell: "echo hi".to_owned(),
            env: [("A".to_owned(), "1".to_owned())].into_iter().collect(),
            ports: vec![v1::PortSpec {
                name: "http".to_owned(),
            }],
            stop_signal: "SIGPWR".to_owned(),
            kill_grace_period_ms: 7,
            ..v1::TaskSpec::default()
        };
        let mut run = launch(spec);
        run.volume = Some(v1::VolumeMount {
            id: "v1".to_owned(),
            size_mb: 1,
        });
        let plan = run_plan(run).expect("keyed");
        assert_eq!(plan.key.sandbox_name(), "j-1-2-3");
        assert_eq!(plan.volume.as_deref(), Some("v1"));
        let task = plan.task.expect("valid");
        assert_eq!(task.command, Command::Shell("echo hi".to_owned()));
        assert_eq!(task.ports, ["http"]);
        assert_eq!(task.stop_signal, Some(Signal::SIGPWR as i32));
        assert_eq!(task.kill_grace_ms, 7);
        assert!(run_plan(v1::LaunchRun::default()).is_none(), "no key");
        let empty_volume = v1::LaunchRun {
            volume: Some(v1::VolumeMount::default()),
            ..launch(v1::TaskSpec::default())
        };
        assert_eq!(run_plan(empty_volume).expect("keyed").volume, None);
    }

    #[test]
    fn a_launch_that_cannot_be_understood_carries_why() {
        let reason = |spec: v1::TaskSpec| run_plan(launch(spec)).expect("keyed").task.err();
        assert_eq!(
            reason(v1::TaskSpec::default()).as_deref(),
            Some("the task spec sets neither command nor shell")
        );
        assert_eq!(
            reason(v1::TaskSpec {
                command: "a".to_owned(),
                shell: "b".to_owned(),
                ..v1::TaskSpec::default()
            })
            .as_deref(),
            Some("the task spec sets both command and shell")
        );
        let check = |kind| v1::TaskSpec {
            shell: "true".to_owned(),
            health_check: Some(v1::HealthCheck {
                kind,
                ..v1::HealthCheck::default()
            }),
            ..v1::TaskSpec::default()
        };
        assert!(reason(check(None)).is_some_and(|r| r.contains("sets none of")));
        let nul = Some(v1::health_check::Kind::Command("true\0".to_owned()));
        assert!(reason(check(nul)).is_some_and(|r| r.contains("NUL byte")));
    }

    #[test]
    fn health_checks_apply_defaults_and_limits() {
        let http = |path: &str| {
            Some(v1::health_check::Kind::Http(v1::HttpHealthCheck {
                port: "http".to_owned(),
                path: path.to_owned(),
            }))
        };
        let plan = health_check(&v1::HealthCheck {
            kind: http(""),
            ..v1::HealthCheck::default()
        });
        assert_eq!(
            plan,
            Ok(HealthCheckPlan {
                kind: CheckKind::Http {
                    port: "http".to_owned(),
                    path: "/".to_owned()
                },
                initial_delay_ms: 0,
                interval_ms: 10_000,
                timeout_ms: 5_000,
                max_consecutive_failures: 3,
            })
        );
        let plan = health_check(&v1::HealthCheck {
            kind: http("ready"),
            interval_ms: 1,
            timeout_ms: u64::MAX,
            initial_delay_ms: u64::MAX,
            max_consecutive_failures: 7,
        })
        .expect("valid");
        assert_eq!(
            plan.kind,
            CheckKind::Http {
                port: "http".to_owned(),
                path: "/ready".to_owned()
            }
        );
        assert_eq!(
            (
                plan.interval_ms,
                plan.timeout_ms,
                plan.initial_delay_ms,
                plan.max_consecutive_failures
            ),
            (100, 86_400_000, 86_400_000, 7)
        );
    }

    #[test]
    fn reports_carry_phase_ports_and_health() {
        let key = RunId {
            job_id: "j".to_owned(),
            instance: 1,
            run_id: 2,
            launch_id: 3,
        };
        let encoded = report(RunReport {
            key: key.clone(),
            phase: PhaseReport::new(Phase::Running, 42),
            ports: vec![AssignedPort {
                name: "http".to_owned(),
                port: 31000,
            }],
            health: Health::Unhealthy,
            health_detail: "down".to_owned(),
            checkpoint_ms: 0,
        });
        assert_eq!(encoded.key.as_ref().map(run_id), Some(key));
        assert_eq!(encoded.phase(), v1::RunPhase::Running);
        assert_eq!((encoded.time_ms, encoded.started_ms), (42, 42));
        assert_eq!(encoded.ports.get("http"), Some(&31000));
        assert_eq!(encoded.health(), v1::Health::Unhealthy);
        assert_eq!(encoded.health_detail, "down");
    }
}
