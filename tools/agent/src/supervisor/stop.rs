//! Kills: from the server (with a deregistration delay and a grace), and
//! of every run when the agent stops with its tasks.

use std::io::Write;

use nix::sys::signal::Signal;

use super::held::{Run, bare_report, persist};
use super::{StopGrace, Supervisor};
use crate::proc::LazySnapshot;
use crate::record::{PREEMPTED_FILE, RUN_FILE};
use crate::run::{KillRequest, Phase, PhaseReport, RunId};

/// When a kill's signals go: the stop signal `delay_ms` after the kill,
/// SIGKILL `grace_ms` after that.
#[derive(Debug, Clone, Copy)]
struct KillTiming {
    delay_ms: u64,
    grace_ms: u64,
}

/// A kill's preemption: why (written into the run's `PELOTON_PREEMPTED`)
/// and its notice (SIGTERM to the main process at once; the stop signal
/// no sooner than `notice_ms` after the kill).
#[derive(Debug, Clone, Copy)]
struct Preemption<'a> {
    reason: &'a str,
    notice_ms: u64,
}

impl Supervisor {
    /// Stops runs: SIGTERM once `delay_ms` (the task's deregistration
    /// delay) has passed — now, without one — and SIGKILL to the whole tree
    /// `grace_ms` after it (see [`Supervisor::poll`]). A second kill of a
    /// run never puts its signals off: each goes at the earliest time any
    /// kill asked for. An unknown run is reported KILLED at once; an ended
    /// one has its final phase reported again; an acknowledged one stays
    /// silent (it is never reported again). `now_ms` is the time of the
    /// kill.
    ///
    /// A preempted run (`KillRequest::preempted`) first has the reason
    /// written into its `PELOTON_PREEMPTED` file; with a notice, the first
    /// such kill also sends SIGTERM to its main process at once, and its
    /// stop signal waits for the notice too (the later of the delay and the
    /// notice).
    pub fn kill(&mut self, requests: &[KillRequest], now_ms: u64) {
        let mut procs = LazySnapshot::default();
        for request in requests {
            let preemption = request.preempted.as_deref().map(|reason| Preemption {
                reason,
                notice_ms: request.notice_ms,
            });
            let timing = KillTiming {
                delay_ms: request.delay_ms.max(preemption.map_or(0, |p| p.notice_ms)),
                grace_ms: request.grace_ms,
            };
            self.kill_one(request.key.clone(), timing, preemption, now_ms, &mut procs);
        }
    }

    fn kill_one(
        &mut self,
        key: RunId,
        timing: KillTiming,
        preemption: Option<Preemption<'_>>,
        now: u64,
        procs: &mut LazySnapshot,
    ) {
        let Some(mut run) = self.runs.remove(&key) else {
            let acked_on_disk = key.validate().is_ok()
                && self
                    .sandboxes
                    .join(key.sandbox_name())
                    .join(RUN_FILE)
                    .exists();
            if acked_on_disk {
                tracing::debug!(run = %key.sandbox_name(), "kill of an acknowledged run ignored");
            } else {
                let report = PhaseReport {
                    reason: "not running on this host".to_owned(),
                    ..PhaseReport::new(Phase::Killed, now)
                };
                let report = bare_report(&key, report);
                self.outbox.push(&key, report);
            }
            return;
        };
        // It may have ended since the last poll; then that is its phase.
        self.observe(&mut run, now, procs);
        if run.record.report.phase.is_final() {
            self.outbox.push(&key, run.report());
        } else {
            if let Some(p) = preemption {
                self.tell_preempted(&run, p);
            }
            let KillTiming { delay_ms, grace_ms } = timing;
            let asked = now.saturating_add(delay_ms);
            let due = match (run.record.kill_requested, run.record.stop_signal_due_ms) {
                (false, _) => asked,
                (true, Some(waiting)) => waiting.min(asked),
                // Sent already: again now, as a repeated kill always did.
                (true, None) => now,
            };
            let deadline = due.saturating_add(grace_ms);
            if !run.record.kill_requested || deadline < run.record.kill_deadline_ms {
                run.record.kill_deadline_ms = deadline;
            }
            run.record.kill_requested = true;
            run.record.stop_signal_due_ms = (due > now).then_some(due);
            // The server has decided; no verdict can change that.
            run.stop_checks();
            // Durable before any signal: a restarted agent must know that
            // this run's end is a KILLED, not a FAILED (and when to signal
            // it, during a deregistration delay).
            persist(&mut run, &self.open_journals);
            if due > now {
                tracing::info!(
                    run = %key.sandbox_name(),
                    delay_ms = due - now,
                    grace_ms,
                    "killing after its deregistration delay"
                );
            } else {
                tracing::info!(run = %key.sandbox_name(), grace_ms, "killing");
                self.launcher.terminate(&run.record, &run.dir, procs);
            }
            self.observe(&mut run, now, procs);
        }
        self.runs.insert(key, run);
    }

    /// Writes the run's `PELOTON_PREEMPTED` file, once, with the reason; the
    /// first time, with a notice, SIGTERM goes to the task's main process
    /// (a kill sent again does not signal again). The file is written
    /// before any signal, so a task's handler can tell a preemption from
    /// another stop.
    fn tell_preempted(&self, run: &Run, preemption: Preemption<'_>) {
        let path = run.dir.join(PREEMPTED_FILE);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{}", preemption.reason));
        match written {
            Ok(()) => {
                if preemption.notice_ms > 0 {
                    tracing::info!(
                        run = %run.record.key.sandbox_name(),
                        notice_ms = preemption.notice_ms,
                        "preempted: notice sent"
                    );
                    self.launcher.notify(&run.record, Signal::SIGTERM);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => tracing::warn!(
                run = %run.record.key.sandbox_name(),
                error = %e,
                "cannot write the preemption marker"
            ),
        }
    }

    /// Stops every live run as a kill from the server would (SIGTERM now,
    /// SIGKILL once the grace has passed: each run's own kill grace period,
    /// or none with [`StopGrace::Now`]); they end KILLED, reported to the
    /// next session. Used when the agent stops with its tasks
    /// (`--stop-tasks-on-exit`), at `now_ms`. Returns how many runs are
    /// still alive.
    pub fn kill_all(&mut self, grace: StopGrace, now_ms: u64) -> usize {
        let live: Vec<(RunId, KillTiming)> = self
            .runs
            .iter()
            .filter(|(_, run)| !run.record.report.phase.is_final())
            .map(|(key, run)| {
                // The agent is going away: no deregistration delay.
                let grace_ms = match grace {
                    StopGrace::Own => run.record.kill_grace_ms,
                    StopGrace::Now => 0,
                };
                let timing = KillTiming {
                    delay_ms: 0,
                    grace_ms,
                };
                (key.clone(), timing)
            })
            .collect();
        let mut procs = LazySnapshot::default();
        for (key, timing) in live {
            self.kill_one(key, timing, None, now_ms, &mut procs);
        }
        self.live_runs()
    }
}
