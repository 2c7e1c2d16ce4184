//! Watching runs: the launcher's news, ends, liveness, memory limits,
//! health checkers and usage.

use nix::sys::signal::Signal;

use super::held::{Run, final_report, persist};
use super::{Supervisor, remove_secrets};
use crate::health::{CheckTarget, HealthChecker};
use crate::isolation;
use crate::proc::{self, LazySnapshot};
use crate::record;
use crate::run::{Phase, PhaseReport, RunId};
use crate::usage::{self, RunUsage, UsageReport};
use crate::volumes;

/// How often polls look at the memory of runs without a cgroup, at most:
/// a `/proc` scan and a `smaps_rollup` read per process each time, however
/// often polls come (every end the launcher records brings one).
const MEMORY_WATCH_INTERVAL_MS: u64 = 200;

/// How often polls look at the runs' checkpoint files, at most (a `stat`
/// per live run).
const CHECKPOINT_WATCH_INTERVAL_MS: u64 = 500;

impl Supervisor {
    /// Looks at every live run once: started? exited? task gone? kill
    /// deadline passed? `now_ms` is the wall clock (ms) of the look.
    pub fn poll(&mut self, now_ms: u64) {
        let now = now_ms;
        let live = |runs: &std::collections::HashMap<RunId, Run>| -> Vec<RunId> {
            runs.iter()
                .filter(|(_, run)| !run.record.report.phase.is_final())
                .map(|(key, _)| key.clone())
                .collect()
        };
        let before = live(&self.runs);
        self.take_launcher_news();
        let keys: Vec<RunId> = live(&self.runs);
        if before.len() != keys.len() {
            // Runs whose end the launcher just told: their output's last
            // mark (see `logs`).
            for key in before.iter().filter(|k| !keys.contains(k)) {
                if let Some(run) = self.runs.get_mut(key) {
                    super::logs::sample_output(&run.dir, &mut run.output_sizes, now);
                }
            }
        }
        let mut procs = LazySnapshot::default();
        let watch_memory = now
            >= self
                .memory_watched_ms
                .saturating_add(MEMORY_WATCH_INTERVAL_MS);
        if watch_memory {
            self.memory_watched_ms = now;
        }
        let watch_checkpoints = now
            >= self
                .checkpoints_watched_ms
                .saturating_add(CHECKPOINT_WATCH_INTERVAL_MS);
        if watch_checkpoints {
            self.checkpoints_watched_ms = now;
        }
        let watch_output = now
            >= self
                .output_sampled_ms
                .saturating_add(super::logs::OUTPUT_SAMPLE_INTERVAL_MS);
        if watch_output {
            self.output_sampled_ms = now;
        }
        for key in keys {
            let Some(mut run) = self.runs.remove(&key) else {
                continue;
            };
            self.observe(&mut run, now, &mut procs);
            if watch_output || run.record.report.phase.is_final() {
                // About every second, and once at the end: when its output
                // was written (see `logs`).
                super::logs::sample_output(&run.dir, &mut run.output_sizes, now);
            }
            if watch_memory {
                self.watch_memory(&mut run, &mut procs);
            }
            if watch_checkpoints {
                self.watch_checkpoint(&mut run, now);
            }
            self.runs.insert(key, run);
        }
        self.report_health_changes();
    }

    /// A running run whose `PELOTON_CHECKPOINT` file is newer than when
    /// last looked at is reported (RUNNING, with the file's modification
    /// time): the server prefers, among equal victims, those that lose the
    /// least work. Also during a kill's notice: a checkpoint then shrinks
    /// what the preemption cost. A time ahead of `now` (the file's time
    /// set by hand) counts as now.
    fn watch_checkpoint(&mut self, run: &mut Run, now: u64) {
        if run.record.report.phase != Phase::Running {
            return;
        }
        let Some(at_ms) = std::fs::metadata(run.dir.join(record::CHECKPOINT_FILE))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(now))
        else {
            return;
        };
        if at_ms > run.checkpoint_ms {
            run.checkpoint_ms = at_ms;
            self.outbox.push(&run.record.key, run.report());
        }
    }

    pub(super) fn observe(&mut self, run: &mut Run, now: u64, procs: &mut LazySnapshot) {
        if run.record.report.phase.is_final() {
            return;
        }
        // Liveness first, then the exit entry: the launcher writes it
        // before it forgets the task, so "gone and no exit entry" is really
        // lost, unless the launcher is still cleaning up after the task.
        let alive = self.launcher.is_alive(&run.record);
        let launcher_recording = !alive && self.launcher.is_recording(&run.record);
        let news = if let Some(exit) = run.exit.take() {
            Ok(record::JournalNews {
                started: None,
                exit: Some(exit),
            })
        } else if run.record.report.phase == Phase::Starting || !alive {
            record::read_news(&run.dir, run.record.journal)
        } else {
            // Running and its task alive: whatever is written about it
            // will have been written when it is gone.
            Ok(record::JournalNews::default())
        };
        let (started, exit) = match news {
            Ok(news) => (news.started, Ok(news.exit)),
            Err(e) => (None, Err(e)),
        };
        if run.record.report.phase == Phase::Starting
            && let Some(started) = started
        {
            run.record.report = PhaseReport::new(Phase::Running, started.time_ms);
            // An older agent's wrapper: reported, not written, its `started` entry is the
            // durable record of it (a restarted agent finds it again), and
            // one write less per run is measurable in launches per second.
            self.outbox.push(&run.record.key, run.report());
        }
        match exit {
            Ok(Some(exit)) => {
                let mut report = final_report(&exit, run.record.kill_requested);
                if let Some(why) = &run.record.killed_by_agent
                    && report.phase != Phase::Succeeded
                {
                    report.phase = Phase::Failed;
                    report.oom_killed = true;
                    report.reason = why.clone();
                }
                self.end(run, report);
                return;
            }
            Err(e) => {
                tracing::warn!(run = %run.record.key.sandbox_name(), error = %e, "unreadable exit record");
            }
            Ok(None) => {}
        }
        if launcher_recording {
            // The task is gone and its launcher has yet to record the end
            // (it is cleaning up after it): the entry comes.
            return;
        }
        if !alive {
            // Whatever the task left behind goes with it.
            self.launcher.sweep(&run.record, &run.dir, now, procs);
            let report = if run.record.kill_requested {
                PhaseReport {
                    reason: "killed on request".to_owned(),
                    signal: Signal::SIGKILL as i32,
                    exit_code: 128 + Signal::SIGKILL as i32,
                    ..PhaseReport::new(Phase::Killed, now)
                }
            } else {
                PhaseReport::failed(now, "agent lost the run's exit status".to_owned())
            };
            self.end(run, report);
            return;
        }
        if run.record.kill_requested
            && let Some(due) = run.record.stop_signal_due_ms
            && now >= due
        {
            run.record.stop_signal_due_ms = None;
            persist(run, &self.open_journals);
            tracing::info!(run = %run.record.key.sandbox_name(), "deregistration delay over: stopping");
            self.launcher.terminate(&run.record, &run.dir, procs);
        }
        if run.record.kill_requested && now >= run.record.kill_deadline_ms {
            self.launcher.sweep(&run.record, &run.dir, now, procs);
        }
        self.start_checks(run, now);
    }

    /// Holds a run without a cgroup to its memory limit: SIGKILL to the
    /// task and its descendants once what they hold (their PSS) is above
    /// it; the run ends FAILED, "memory limit exceeded".
    fn watch_memory(&self, run: &mut Run, procs: &mut LazySnapshot) {
        let Some(limit) = run.record.resident_limit_bytes else {
            return;
        };
        if run.record.kill_requested || run.record.report.phase.is_final() {
            return;
        }
        let Some((root, with_root)) = self.launcher.memory_root(&run.record) else {
            return;
        };
        let mut pids = procs.get().descendants(root.pid);
        if with_root {
            pids.push(root.pid);
        }
        if run.record.killed_by_agent.is_some() {
            // Killed already: anything left (forked meanwhile, or an
            // agent restart between the record and the kill) goes too.
            proc::kill_all(&pids);
            return;
        }
        let used = proc::resident_bytes(&pids);
        if used > limit {
            let why = format!(
                "memory limit exceeded: its processes held {} MiB, above its limit of {} MiB",
                used >> 20,
                limit >> 20
            );
            tracing::warn!(run = %run.record.key.sandbox_name(), %why, "killing");
            run.record.killed_by_agent = Some(why);
            persist(run, &self.open_journals);
            proc::kill_all(&pids);
        }
    }

    /// Starts the run's checker if it is RUNNING, has a check, and has no
    /// checker yet (just started, or re-adopted).
    fn start_checks(&self, run: &mut Run, now_ms: u64) {
        let Some(plan) = &run.record.health_check else {
            return;
        };
        if run.checker.is_some()
            || run.record.report.phase != Phase::Running
            || run.record.kill_requested
        {
            return;
        }
        let target = CheckTarget {
            key: run.record.key.clone(),
            dir: run.dir.clone(),
            ports: run.record.ports.clone(),
            started_ms: run.record.report.started_ms,
        };
        match HealthChecker::start(plan.clone(), target, self.health_changes.clone(), now_ms) {
            Ok(checker) => run.checker = Some(checker),
            // Tried again at the next poll; meanwhile HEALTH_UNKNOWN.
            Err(e) => tracing::warn!(
                run = %run.record.key.sandbox_name(),
                error = %e,
                "cannot start the health checker"
            ),
        }
    }

    /// What every live run uses now (see `usage`): from its cgroup if it
    /// has one, else over its process tree (one `/proc` scan for all); at
    /// most `MAX_USAGE_RUNS` of them, in key order.
    pub fn usage(&self, now_ms: u64) -> UsageReport {
        let mut procs = LazySnapshot::default();
        let mut runs: Vec<RunUsage> = self
            .runs
            .values()
            .filter(|run| !run.record.report.phase.is_final())
            .filter_map(|run| {
                let (cpu_usec, memory_bytes) = match &run.record.cgroup {
                    Some(cgroup) => usage::measure_cgroup(cgroup)?,
                    None => {
                        let (root, with_root) = self.launcher.memory_root(&run.record)?;
                        let mut pids = procs.get().descendants(root.pid);
                        if with_root {
                            pids.push(root.pid);
                        }
                        usage::measure_processes(&pids)
                    }
                };
                Some(RunUsage {
                    key: run.record.key.clone(),
                    cpu_usec,
                    memory_bytes,
                    disk_bytes: 0,
                })
            })
            .collect();
        runs.sort_by(|a, b| a.key.cmp(&b.key));
        runs.truncate(usage::MAX_USAGE_RUNS);
        UsageReport {
            time_ms: now_ms,
            runs,
        }
    }

    /// Takes the launcher's news: which tasks' ends it has recorded.
    fn take_launcher_news(&mut self) {
        for (key, exit) in self.launcher.take_ended() {
            if let Some(run) = self.runs.get_mut(&key) {
                run.exit = Some(exit);
            }
        }
    }

    /// The run has ended with `report`: give back its ports and cgroup,
    /// record, report.
    pub(super) fn end(&mut self, run: &mut Run, report: PhaseReport) {
        debug_assert!(report.phase.is_final());
        // A success is the common case (thousands a second on a busy
        // host): at debug. Failures and kills stay at info.
        if report.phase == Phase::Succeeded {
            tracing::debug!(run = %run.record.key.sandbox_name(), "run succeeded");
        } else {
            tracing::info!(
                run = %run.record.key.sandbox_name(),
                phase = ?report.phase,
                reason = %report.reason,
                "run ended"
            );
        }
        let started_ms = report.started_ms.max(run.record.report.started_ms);
        run.record.report = PhaseReport {
            started_ms,
            // Never before its start: the two may come from different
            // readings of a clock (a launcher's start time after the
            // `now` of the poll that saw it gone) or a clock stepped back.
            time_ms: report.time_ms.max(started_ms),
            ..report
        };
        run.stop_checks();
        // Before the end is recorded: a crash in between leaves a live
        // record, whose end is observed (and this done) again.
        if run.may_hold_secrets {
            remove_secrets(&run.record.key, &run.dir);
        }
        self.ports.release(run.record.ports.iter().map(|p| p.port));
        if let Some(cgroup) = &run.record.cgroup {
            isolation::kill_cgroup(cgroup);
            if let Err(e) = isolation::remove_cgroup(cgroup) {
                tracing::warn!(cgroup = %cgroup.display(), error = %e, "cannot remove the run's cgroup");
            }
        }
        self.commit(run);
        if let Some(id) = run.record.volume.clone()
            && self.doomed_volumes.contains(&id)
            && !self.runs.values().any(|r| {
                r.record.key != run.record.key
                    && !r.record.report.phase.is_final()
                    && r.record.volume.as_deref() == Some(id.as_str())
            })
        {
            self.doomed_volumes.remove(&id);
            // Renamed to trash now (gone from the agent's list); the data
            // goes with the next garbage collection.
            match volumes::to_trash(&self.volumes, &id, run.record.report.time_ms) {
                Ok(_) => tracing::info!(volume = %id, "volume deleted after its last run ended"),
                Err(e) => tracing::warn!(volume = %id, error = %e, "cannot delete the volume"),
            }
        }
    }
}
