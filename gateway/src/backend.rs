//! The host manager's interface to hosts, and the simulated backend.
//!
//! The scheduling loop hands [`Launch`] and [`Kill`] batches to a
//! [`HostBackend`] and polls it for [`TaskUpdate`]s. The simulated backend
//! below runs a task for the time its spec's `sim` section says and ends it
//! with the exit code it says; [`crate::agent_backend::AgentBackend`] sends them
//! to real host agents over their gRPC sessions (whose updates reach the
//! loop as commands).
//!
//! Simulated hosts also report synthetic usage (`HostBackend::usage`):
//! each run uses a fixed share of its request (`sim_profile`, from a hash
//! of its id), each host reports every [`SIM_USAGE_INTERVAL_MS`] at a
//! second of its own, as agents do, so benchmarks exercise usage at any
//! number of hosts.
//!
//! Contract for every backend: a kill is always answered by a final update
//! of that run (`Killed`, or the way it ended if it ended first; `Killed`
//! for a run the host does not know), because the loop keeps a killed run's
//! resources, and does not start the instance again, until then.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::lifecycle::AgentRunKey;
use crate::lifecycle::usage::{RunUsage, UsageReport};
pub use crate::lifecycle::{Kill, Launch, RendezvousUpdate, RunRef, RunStatus, TaskUpdate};
use peloton_engine::{Dim, Resources};

/// How often each simulated host reports usage (agents' default).
pub const SIM_USAGE_INTERVAL_MS: u64 = 10_000;

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
    /// Tells running members of elastic gangs their gang's new membership
    /// (simulated runs have no files to rewrite: dropped).
    fn update_rendezvous(&mut self, _now_ms: u64, updates: &mut Vec<RendezvousUpdate>) {
        updates.clear();
    }
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
    /// Appends the usage reports due by `now_ms` (real hosts' come as
    /// commands instead: none here).
    fn usage(&mut self, _now_ms: u64, _out: &mut Vec<UsageReport>) {}
}

/// FNV-1a: a hash that is the same on every machine and version.
fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A simulated run's usage: a tenth to nine tenths of its requested CPU
/// (millicores) and a fifth to four fifths of its requested memory
/// (bytes), fixed by its job id and instance.
pub fn sim_profile(job_id: &str, instance: u32, request: Resources) -> (u64, u64) {
    let h = fnv(job_id.bytes().chain(instance.to_le_bytes()));
    let cpu_tenths = 1 + h % 9;
    let memory_fifths = 1 + (h >> 32) % 4;
    (
        request[Dim::Cpu] * cpu_tenths / 10,
        (request[Dim::Memory] << 20) * memory_fifths / 5,
    )
}

/// A simulated live run: its exit code, and what its usage reports need.
#[derive(Debug)]
struct SimRun {
    exit_code: i32,
    host: Arc<str>,
    /// The second (of each interval) its host reports at.
    phase: u8,
    job_id: Arc<str>,
    started_ms: u64,
    /// Its request's CPU (millicores) and memory (MiB).
    cpu: u32,
    memory_mb: u32,
}

/// Simulated hosts: every launch runs at once and ends after its duration.
#[derive(Debug, Default)]
pub struct SimBackend {
    /// (end time, run), earliest first.
    ends: BinaryHeap<Reverse<(u64, RunRef)>>,
    /// Live runs (one map: a launch costs one insert).
    live: FxHashMap<RunRef, SimRun>,
    /// Updates produced by launch and kill, delivered on the next poll.
    ready: Vec<TaskUpdate>,
    /// The last second whose hosts reported usage (0: none yet).
    usage_second: u64,
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
        let phases = SIM_USAGE_INTERVAL_MS / 1000;
        for l in launches.drain(..) {
            let t = &l.template;
            self.live.insert(
                l.run,
                SimRun {
                    exit_code: t.sim_exit_code,
                    phase: (fnv(l.host.bytes()) % phases) as u8,
                    host: l.host.clone(),
                    job_id: l.job_id.clone(),
                    started_ms: now_ms,
                    cpu: t.request[Dim::Cpu].min(u64::from(u32::MAX)) as u32,
                    memory_mb: t.request[Dim::Memory].min(u64::from(u32::MAX)) as u32,
                },
            );
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
            if let Some(r) = self.live.remove(&run) {
                out.push(TaskUpdate {
                    run,
                    status: RunStatus::Exited(r.exit_code),
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

    /// Every host whose second came since the last call reports (at most
    /// one interval's worth of seconds: a stalled loop does not catch up
    /// on reports nobody would read), measured at that second.
    fn usage(&mut self, now_ms: u64, out: &mut Vec<UsageReport>) {
        let second = now_ms / 1000;
        let phases = SIM_USAGE_INTERVAL_MS / 1000;
        let from = (self.usage_second + 1).max(second.saturating_sub(phases - 1));
        if self.usage_second >= second || self.usage_second == 0 {
            // Nothing new, or the first call: it starts the count.
            self.usage_second = self.usage_second.max(second);
            return;
        }
        self.usage_second = second;
        for s in from..=second {
            let time_ms = s * 1000;
            let phase = (s % phases) as u8;
            let mut by_host: FxHashMap<&Arc<str>, Vec<RunUsage>> = FxHashMap::default();
            for (run, r) in &self.live {
                if r.phase != phase {
                    continue;
                }
                let request = Resources::new(u64::from(r.cpu), u64::from(r.memory_mb), 0, 0);
                let (cpu_millis, memory_bytes) = sim_profile(&r.job_id, run.instance, request);
                by_host.entry(&r.host).or_default().push(RunUsage {
                    key: AgentRunKey {
                        job_id: r.job_id.clone(),
                        instance: run.instance,
                        run: run.run,
                        launch: run.launch.0,
                    },
                    // ms at millicores: µs.
                    cpu_usec: time_ms.saturating_sub(r.started_ms) * cpu_millis,
                    memory_bytes,
                    disk_bytes: 0,
                });
            }
            let mut reports: Vec<UsageReport> = by_host
                .into_iter()
                .map(|(host, mut runs)| {
                    runs.sort_unstable_by(|a, b| {
                        (&a.key.job_id, a.key.instance).cmp(&(&b.key.job_id, b.key.instance))
                    });
                    UsageReport {
                        host: host.clone(),
                        time_ms,
                        runs,
                    }
                })
                .collect();
            // In host order: the same reports whatever the map's order.
            reports.sort_unstable_by(|a, b| a.host.cmp(&b.host));
            out.append(&mut reports);
        }
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
            gpu: Default::default(),
            ports: None,
            rendezvous: None,
        }
    }

    #[test]
    fn each_host_reports_its_runs_synthetic_usage_once_an_interval() {
        let mut sim = SimBackend::new();
        let mut launches = vec![launch(0, 60_000, 0), launch(1, 15_000, 0)];
        sim.launch(1_000, &mut launches, &|_| None);
        let (cpu0, mem0) = sim_profile("j", 0, launch(0, 1, 0).template.request);
        assert!((100..=900).contains(&cpu0), "{cpu0} of 1000 millicores");
        let mut reports = Vec::new();
        // The first call starts the count; then each host reports once in
        // every interval, at its own second.
        sim.usage(1_500, &mut reports);
        for t in (2_000..=21_000).step_by(500) {
            sim.usage(t, &mut reports);
        }
        // Seconds 2 to 21: two or three times, ten seconds apart.
        assert!((2..=3).contains(&reports.len()), "{reports:?}");
        let (first, second) = (&reports[0], &reports[1]);
        assert_eq!(second.time_ms - first.time_ms, SIM_USAGE_INTERVAL_MS);
        let run0 = |r: &UsageReport| r.runs.iter().find(|u| u.key.instance == 0).cloned();
        let (a, b) = (run0(first).expect("run 0"), run0(second).expect("run 0"));
        assert_eq!(a.memory_bytes, mem0);
        // Cumulative CPU at its rate: 10 s more at cpu0 millicores.
        assert_eq!(b.cpu_usec - a.cpu_usec, 10_000 * cpu0);
        // A run that ended reports no more.
        let mut ended = Vec::new();
        sim.poll(30_000, &mut ended);
        sim.usage(30_000, &mut reports);
        reports.clear();
        for t in (31_000..=40_000).step_by(1000) {
            sim.usage(t, &mut reports);
        }
        let instances: Vec<u32> = reports
            .iter()
            .flat_map(|r| r.runs.iter().map(|u| u.key.instance))
            .collect();
        assert_eq!(instances, vec![0]);
        // Nothing to report once every run has ended.
        sim.poll(70_000, &mut ended);
        reports.clear();
        for t in (70_000..=90_000).step_by(1000) {
            sim.usage(t, &mut reports);
        }
        assert!(reports.is_empty(), "{reports:?}");
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
                preempted: None,
                notice_ms: 0,
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
