//! The host backend for real hosts: launches and kills go to the agents'
//! sessions in the [`AgentHub`]; their reports reach the loop as commands
//! (from [`crate::agents`], the session service). [`launch_run`] is the one
//! codec from a launch to the agent's message.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;
use rustc_hash::FxHashMap;

use crate::agent_hub::{AgentHub, MAX_RUNS_PER_MESSAGE};
use crate::backend::{HostBackend, Kill, Launch, RendezvousUpdate, RunRef, Secrets, TaskUpdate};

/// Bytes of launches in one message: far below the message limit, since
/// launches carry their jobs' secrets (up to 256 KiB each).
const MAX_LAUNCH_BYTES: usize = 4 << 20;

/// The wire name of a run.
pub fn run_key(job_id: &str, run: RunRef) -> pb::RunKey {
    pb::RunKey {
        job_id: job_id.to_string(),
        instance: run.instance,
        run_id: run.run,
        launch_id: run.launch.0,
    }
}

/// A launch as the agent's message: its run, the instance's resolved task
/// spec (as its user sent it), its volume, its job's secrets and the GPU
/// devices the engine gave it.
pub fn launch_run(l: &Launch, secrets: Option<&[crate::lifecycle::Secret]>) -> pb::LaunchRun {
    pb::LaunchRun {
        key: Some(run_key(&l.job_id, l.run)),
        // Encoded by `convert::task_template` from a message that decoded.
        spec: Some(pb::TaskSpec::decode(&*l.template.spec).expect("a template's spec decodes")),
        volume: l.volume.as_ref().map(|(id, size_mb)| pb::VolumeMount {
            id: id.to_string(),
            size_mb: *size_mb,
        }),
        secrets: secrets.map(crate::codec::to_pb).unwrap_or_default(),
        gpu_devices: crate::convert::gpu_device_indices(l.gpu),
        gpu_share_milli: crate::convert::gpu_share_milli(l.gpu),
        ports: l.ports.as_deref().map(ports_to_pb).unwrap_or_default(),
        rendezvous: l.rendezvous.as_ref().map(rendezvous_to_pb),
    }
}

fn ports_to_pb(ports: &[(Box<str>, u32)]) -> std::collections::HashMap<String, u32> {
    ports
        .iter()
        .map(|(name, port)| (name.to_string(), *port))
        .collect()
}

/// A gang member's view of its gang as the agent's message.
fn rendezvous_to_pb(r: &crate::lifecycle::rendezvous::LaunchRendezvous) -> pb::Rendezvous {
    let g = &r.gang;
    pb::Rendezvous {
        size: g.members.len() as u32,
        rank: r.rank,
        generation: g.generation,
        members: g
            .members
            .iter()
            .map(|m| pb::RendezvousMember {
                rank: m.rank,
                instance: m.instance,
                host: m.host.to_string(),
                address: m.address.to_string(),
                ports: ports_to_pb(&m.ports),
            })
            .collect(),
        spec: g.ask.as_ref().map(|a| pb::RendezvousSpec {
            framework: a.framework.to_string(),
            port: a.port.to_string(),
        }),
    }
}

/// Launches cut into messages of at most [`MAX_RUNS_PER_MESSAGE`] runs and
/// about [`MAX_LAUNCH_BYTES`] (at least one run each), in order.
fn launch_messages(runs: Vec<pb::LaunchRun>) -> Vec<pb::LaunchRuns> {
    let mut out = Vec::new();
    let mut cur = pb::LaunchRuns::default();
    let mut bytes = 0;
    for r in runs {
        let len = r.encoded_len();
        if !cur.runs.is_empty()
            && (cur.runs.len() >= MAX_RUNS_PER_MESSAGE || bytes + len > MAX_LAUNCH_BYTES)
        {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += len;
        cur.runs.push(r);
    }
    if !cur.runs.is_empty() {
        out.push(cur);
    }
    out
}

/// Items grouped by host, hosts in order.
fn by_host<T>(items: impl Iterator<Item = (Arc<str>, T)>) -> Vec<(Arc<str>, Vec<T>)> {
    let mut by_host: FxHashMap<Arc<str>, Vec<T>> = FxHashMap::default();
    for (host, item) in items {
        by_host.entry(host).or_default().push(item);
    }
    let mut hosts: Vec<_> = by_host.into_iter().collect();
    hosts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    hosts
}

/// Launches and kills to connected agents. Messages to an agent that is
/// not connected are dropped: when it registers again, the loop reconciles
/// (runs it does not report are lost and start again; kills are sent again).
#[derive(Debug)]
pub struct AgentBackend {
    hub: Arc<AgentHub>,
}

impl AgentBackend {
    /// Sends to the sessions of `hub`.
    pub fn new(hub: Arc<AgentHub>) -> Self {
        AgentBackend { hub }
    }
}

impl HostBackend for AgentBackend {
    fn launch(&mut self, _now_ms: u64, launches: &mut Vec<Launch>, secrets: Secrets<'_>) {
        let runs = launches.drain(..).map(|l| {
            let run = launch_run(&l, secrets(l.run.job).as_deref());
            (l.host, run)
        });
        for (host, runs) in by_host(runs) {
            let messages = launch_messages(runs);
            let n = messages.len();
            let sent = self.hub.send(
                &host,
                messages.into_iter().map(pb::server_message::Kind::Launch),
            );
            if sent < n {
                tracing::debug!(%host, "launches not sent: agent not connected");
            }
        }
    }

    fn kill(&mut self, _now_ms: u64, kills: &mut Vec<Kill>) {
        let runs = kills.drain(..).map(|k| {
            let run = pb::KillRun {
                key: Some(run_key(&k.job_id, k.run)),
                grace_ms: k.grace_ms,
                delay_ms: k.delay_ms,
                notice_ms: k.notice_ms,
                preempted: k.preempted.as_deref().unwrap_or_default().to_owned(),
            };
            (k.host, run)
        });
        for (host, mut runs) in by_host(runs) {
            let mut messages = Vec::new();
            while !runs.is_empty() {
                let rest = runs.split_off(runs.len().min(MAX_RUNS_PER_MESSAGE));
                messages.push(pb::server_message::Kind::Kill(pb::KillRuns { runs }));
                runs = rest;
            }
            self.hub.send(&host, messages);
        }
    }

    fn update_rendezvous(&mut self, _now_ms: u64, updates: &mut Vec<RendezvousUpdate>) {
        let runs = updates.drain(..).map(|u| {
            let run = pb::RunRendezvous {
                key: Some(run_key(&u.job_id, u.run)),
                rendezvous: Some(rendezvous_to_pb(&u.rendezvous)),
            };
            (u.host, run)
        });
        for (host, mut runs) in by_host(runs) {
            let mut messages = Vec::new();
            while !runs.is_empty() {
                let rest = runs.split_off(runs.len().min(MAX_RUNS_PER_MESSAGE));
                messages.push(pb::server_message::Kind::Rendezvous(pb::UpdateRendezvous {
                    runs,
                }));
                runs = rest;
            }
            // An agent away gets the current membership with the launches
            // sent again when it registers.
            self.hub.send(&host, messages);
        }
    }

    fn poll(&mut self, _now_ms: u64, _out: &mut Vec<TaskUpdate>) {
        // Agents' reports arrive as loop commands.
    }

    fn next_deadline(&self) -> Option<u64> {
        None
    }

    fn dispatch_after_commit(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{JobKey, LaunchId};

    fn launch(instance: u32, spec: &pb::TaskSpec) -> Launch {
        let limits = crate::convert::Limits {
            max_string_len: usize::MAX,
            ..Default::default()
        };
        let template = crate::convert::task_template("t", Some(spec), &limits).expect("valid");
        Launch {
            run: RunRef {
                job: JobKey(0),
                instance,
                run: 1,
                launch: LaunchId(7),
            },
            host: "h".into(),
            job_id: "j".into(),
            config: 1,
            template: Arc::new(template),
            volume: Some(("v".into(), 5)),
            gpu: Default::default(),
            ports: None,
            rendezvous: None,
        }
    }

    /// A valid task spec running `shell`.
    fn task(shell: String) -> pb::TaskSpec {
        pb::TaskSpec {
            shell,
            resources: Some(pb::Resources {
                cpu: 1.0,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The agent gets the instance's spec exactly as its user sent it,
    /// with its run, volume and secrets.
    #[test]
    fn a_launch_becomes_the_agents_message_with_the_users_spec() {
        let spec = pb::TaskSpec {
            args: vec!["hi".into()],
            ..task("echo".into())
        };
        let secret = crate::lifecycle::Secret {
            name: "s".into(),
            value: b"x".to_vec(),
        };
        let run = launch_run(&launch(3, &spec), Some(std::slice::from_ref(&secret)));
        assert_eq!(run.spec, Some(spec));
        assert_eq!(
            run.key.map(|k| (k.job_id, k.instance, k.launch_id)),
            Some(("j".into(), 3, 7))
        );
        assert_eq!(run.volume.map(|v| (v.id, v.size_mb)), Some(("v".into(), 5)));
        assert_eq!(
            run.secrets,
            vec![pb::Secret {
                name: "s".into(),
                value: b"x".to_vec(),
                size: 1,
            }]
        );
    }

    #[test]
    fn launches_are_cut_by_count_and_by_bytes_in_order() {
        let small = task("true".into());
        let runs: Vec<_> = (0..2500)
            .map(|i| launch_run(&launch(i, &small), None))
            .collect();
        let sizes: Vec<_> = launch_messages(runs).iter().map(|m| m.runs.len()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        let big = task("x".repeat(MAX_LAUNCH_BYTES / 3));
        let runs: Vec<_> = (0..5).map(|i| launch_run(&launch(i, &big), None)).collect();
        let messages = launch_messages(runs);
        let sizes: Vec<_> = messages.iter().map(|m| m.runs.len()).collect();
        assert_eq!(sizes, vec![2, 2, 1]);
        let order: Vec<_> = messages
            .iter()
            .flat_map(|m| m.runs.iter().map(|r| r.key.as_ref().unwrap().instance))
            .collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }
}
