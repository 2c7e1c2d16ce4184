//! The host manager's interface to hosts, and the simulated backend.
//!
//! The scheduling loop hands [`Launch`] and [`Kill`] batches to a
//! [`HostBackend`] and polls it for [`TaskUpdate`]s. The simulated backend
//! below runs a task for the time its spec's `sim` section says and ends it
//! with the exit code it says; [`crate::agent_backend::AgentBackend`] sends them
//! to real host agents over their gRPC sessions (whose updates reach the
//! loop as commands).
//!
//! Contract for every backend: a kill is always answered by a final update
//! of that run (`Killed`, or the way it ended if it ended first; `Killed`
//! for a run the host does not know), because the loop keeps a killed run's
//! resources, and does not start the instance again, until then.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use std::sync::Arc;

use rustc_hash::FxHashMap;

pub use crate::lifecycle::{Kill, Launch, RunRef, RunStatus, TaskUpdate};

/// A job's secrets (with their values), as the core keeps them: sent with
/// launches only.
pub type Secrets<'a> =
    &'a dyn Fn(crate::lifecycle::JobKey) -> Option<Arc<[crate::lifecycle::Secret]>>;

/// Where runs happen.
pub trait HostBackend: Send + std::fmt::Debug {
    /// Starts runs (placement already reserved their resources); a real
    /// host gets its job's `secrets` with each run.
    fn launch(&mut self, now_ms: u64, launches: &mut Vec<Launch>, secrets: Secrets<'_>);
    /// Stops runs; unknown runs are ignored.
    fn kill(&mut self, now_ms: u64, kills: &mut Vec<Kill>);
    /// Appends status changes due by `now_ms`.
    fn poll(&mut self, now_ms: u64, out: &mut Vec<TaskUpdate>);
    /// The earliest time a status change is due, if any.
    fn next_deadline(&self) -> Option<u64>;
    /// Whether launches and kills may reach hosts only after the commit
    /// that records them. True for real hosts (a crash before the commit
    /// must not leave a run the store does not know); the simulator
    /// restarts with the server, so it takes them at once and its answers
    /// land in the same iteration (one commit instead of two).
    fn dispatch_after_commit(&self) -> bool {
        false
    }
}

/// Simulated hosts: every launch runs at once and ends after its duration.
#[derive(Debug, Default)]
pub struct SimBackend {
    /// (end time, run), earliest first.
    ends: BinaryHeap<Reverse<(u64, RunRef)>>,
    /// Live runs and their exit codes.
    live: FxHashMap<RunRef, i32>,
    /// Updates produced by launch and kill, delivered on the next poll.
    ready: Vec<TaskUpdate>,
}

impl SimBackend {
    /// An empty simulator.
    pub fn new() -> Self {
        SimBackend::default()
    }

    /// Runs in progress.
    pub fn n_running(&self) -> usize {
        self.live.len()
    }
}

impl HostBackend for SimBackend {
    fn launch(&mut self, now_ms: u64, launches: &mut Vec<Launch>, _secrets: Secrets<'_>) {
        for l in launches.drain(..) {
            let t = &l.template;
            self.live.insert(l.run, t.sim_exit_code);
            self.ends
                .push(Reverse((now_ms.saturating_add(t.sim_duration_ms), l.run)));
            self.ready.push(TaskUpdate {
                run: l.run,
                status: RunStatus::Running,
                time_ms: now_ms,
            });
        }
    }

    fn kill(&mut self, now_ms: u64, kills: &mut Vec<Kill>) {
        for k in kills.drain(..) {
            // A run that already ended was answered by its exit; an unknown
            // one is answered too (the contract: every kill gets an answer).
            self.live.remove(&k.run);
            self.ready.push(TaskUpdate {
                run: k.run,
                status: RunStatus::Killed,
                time_ms: now_ms,
            });
        }
    }

    fn poll(&mut self, now_ms: u64, out: &mut Vec<TaskUpdate>) {
        out.append(&mut self.ready);
        while let Some(&Reverse((end, run))) = self.ends.peek() {
            if end > now_ms {
                break;
            }
            self.ends.pop();
            if let Some(code) = self.live.remove(&run) {
                out.push(TaskUpdate {
                    run,
                    status: RunStatus::Exited(code),
                    time_ms: end,
                });
            }
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        if !self.ready.is_empty() {
            return Some(0);
        }
        // Killed runs leave stale heap entries; they cost a pop each.
        self.ends.peek().map(|Reverse((t, _))| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(instance: u32) -> RunRef {
        RunRef {
            job: crate::lifecycle::JobKey(0),
            instance,
            run: 1,
            launch: crate::lifecycle::LaunchId(u64::from(instance)),
        }
    }

    fn launch(instance: u32, duration_ms: u64, exit_code: i32) -> Launch {
        let spec = peloton_proto::v1::TaskSpec {
            command: "true".into(),
            resources: Some(peloton_proto::v1::Resources {
                cpu: 1.0,
                ..Default::default()
            }),
            sim: Some(peloton_proto::v1::SimSpec {
                duration_ms,
                exit_code,
            }),
            ..Default::default()
        };
        let template =
            crate::convert::task_template("t", Some(&spec), &Default::default()).expect("valid");
        Launch {
            run: run(instance),
            host: "h".into(),
            job_id: "j".into(),
            config: 1,
            template: Arc::new(template),
            volume: None,
        }
    }

    #[test]
    fn runs_end_after_their_duration_with_their_code_and_kills_win() {
        let mut sim = SimBackend::new();
        let host: Arc<str> = "h".into();
        let job: Arc<str> = "j".into();
        let mut launches = vec![launch(0, 100, 0), launch(1, 50, 3), launch(2, 10, 0)];
        sim.launch(1000, &mut launches, &|_| None);
        sim.kill(
            1001,
            &mut vec![Kill {
                run: run(2),
                host,
                job_id: job,
                grace_ms: 0,
                delay_ms: 0,
            }],
        );
        let mut out = Vec::new();
        sim.poll(1049, &mut out);
        let statuses: Vec<_> = out.iter().map(|u| (u.run.instance, &u.status)).collect();
        assert_eq!(
            statuses,
            vec![
                (0, &RunStatus::Running),
                (1, &RunStatus::Running),
                (2, &RunStatus::Running),
                (2, &RunStatus::Killed),
            ]
        );
        out.clear();
        sim.poll(1100, &mut out);
        let statuses: Vec<_> = out
            .iter()
            .map(|u| (u.run.instance, u.status.clone(), u.time_ms))
            .collect();
        assert_eq!(
            statuses,
            vec![
                (1, RunStatus::Exited(3), 1050),
                (0, RunStatus::Exited(0), 1100)
            ]
        );
        assert_eq!(sim.n_running(), 0);
    }
}
