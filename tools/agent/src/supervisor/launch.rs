//! Launches: a run taken in (sandbox, first record, secrets) and its task
//! started through the launcher, in batches.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::Supervisor;
use super::held::{Run, bare_report, final_report};
use crate::launcher::{Start, StartRequest};
use crate::record::{self, DEFAULT_KILL_GRACE_MS, RUN_FILE, RunRecord, TaskPlan};
use crate::run::{Phase, PhaseReport, RunId, RunPlan};
use crate::secrets;

/// Why a launch is not taken in.
enum Refusal {
    /// The run was launched before (launches are idempotent): ignored.
    Known,
    /// It fails before any record holds it (reported once).
    Failed(String),
}

impl Supervisor {
    /// Starts runs. A run whose sandbox already exists was launched before:
    /// the launch is ignored (launches are idempotent). `now_ms` is the
    /// time of the launch (the wall clock, ms).
    pub fn launch(&mut self, runs: &[RunPlan], now_ms: u64) {
        // Runs on record and ready (in `self.runs` already), whose tasks
        // start together.
        let mut ready = Vec::new();
        for plan in runs {
            if let Some(run) = self.launch_one(plan, now_ms) {
                ready.push(run);
            }
        }
        self.start_tasks(ready, now_ms);
    }

    /// Takes a run in (into `self.runs`, unless it is a known run): its
    /// sandbox made and its first record written, its key is returned with
    /// its sandbox and task plan to have its task started (by
    /// [`Supervisor::start_tasks`]), unless it has failed already.
    fn launch_one(
        &mut self,
        launch: &RunPlan,
        now: u64,
    ) -> Option<(RunId, PathBuf, Option<TaskPlan>)> {
        let key = launch.key.clone();
        let dir = match self.admit(&key) {
            Ok(dir) => dir,
            Err(Refusal::Known) => {
                tracing::debug!(run = %key.sandbox_name(), "launch of a known run ignored");
                return None;
            }
            Err(Refusal::Failed(reason)) => {
                // No record holds the run, so this failure is not durable:
                // the server learns of it once.
                self.outbox
                    .push(&key, bare_report(&key, PhaseReport::failed(now, reason)));
                return None;
            }
        };
        let mut run = Run::new(first_record(launch, now), dir);
        // Debug: the end of the run is logged at info, with its outcome.
        tracing::debug!(run = %key.sandbox_name(), "launching");
        match self.prepare(&mut run, launch) {
            Ok(()) => {
                // Recorded with the first record, and sent to the launcher.
                let plan = run.plan.clone();
                run.may_hold_secrets = !launch.secrets.is_empty();
                self.commit(&mut run);
                // Secrets are written once the run is on record, so that a
                // crash cannot leave them in a sandbox no record owns (such
                // a sandbox is only collected after the age limit).
                match secrets::write(&run.dir, &launch.secrets) {
                    Ok(()) => {
                        let dir = run.dir.clone();
                        self.runs.insert(key.clone(), run);
                        return Some((key, dir, plan));
                    }
                    Err(e) => {
                        let reason = format!("cannot write the secrets into the sandbox: {e}");
                        self.end(&mut run, PhaseReport::failed(now, reason));
                    }
                }
            }
            Err(reason) => self.end(&mut run, PhaseReport::failed(now, reason)),
        }
        self.runs.insert(key, run);
        None
    }

    /// Whether a launch of `key` is new and fits, and if so its sandbox,
    /// made (empty).
    fn admit(&self, key: &RunId) -> Result<PathBuf, Refusal> {
        // No sandbox can be named after an invalid key.
        key.validate().map_err(Refusal::Failed)?;
        let dir = self.sandboxes.join(key.sandbox_name());
        if self.runs.contains_key(key) {
            return Err(Refusal::Known);
        }
        if self.runs.len() >= self.config.max_runs {
            if dir.join(RUN_FILE).exists() {
                return Err(Refusal::Known);
            }
            return Err(Refusal::Failed(format!(
                "the agent already holds {} runs (its --max-runs)",
                self.runs.len()
            )));
        }
        make_sandbox(&dir)?;
        Ok(dir)
    }

    /// Starts the tasks of runs taken in by [`Supervisor::launch_one`], in
    /// order, through the launcher in one batch of requests.
    fn start_tasks(&mut self, ready: Vec<(RunId, PathBuf, Option<TaskPlan>)>, now_ms: u64) {
        if ready.is_empty() {
            return;
        }
        let requests: Vec<StartRequest<'_>> = ready
            .iter()
            .map(|(key, dir, plan)| StartRequest {
                key,
                dir,
                plan: plan.as_ref(),
            })
            .collect();
        let starts = self.launcher.start(&requests);
        for ((key, _, _), start) in ready.iter().zip(starts) {
            let Some(mut run) = self.runs.remove(key) else {
                continue;
            };
            if let Err(reason) = self.started(&mut run, start, now_ms) {
                self.end(&mut run, PhaseReport::failed(now_ms, reason));
            }
            self.runs.insert(key.clone(), run);
        }
    }

    /// Takes in what became of the start of `run`'s task.
    fn started(&mut self, run: &mut Run, start: Start, now_ms: u64) -> Result<(), String> {
        match start {
            Start::Running {
                task,
                launcher,
                started_ms,
            } => {
                run.record.task = Some(task);
                run.record.launcher = Some(launcher);
                // The task has executed: it runs (a `started` entry
                // would say no more than this record does) since the
                // launcher's clock said so (the wall clock it stamps the
                // run's `exit` entry with), not since the launch or this
                // answer (a short task may have ended meanwhile). 0 only
                // from a launcher that sends no time. A clock stepped back
                // meanwhile cannot end the run before it started (`end`).
                let started = if started_ms == 0 { now_ms } else { started_ms };
                run.record.report = PhaseReport::new(Phase::Running, started);
                self.commit(run);
                Ok(())
            }
            Start::NotStarted { launcher } => {
                // It could not start; the launcher recorded why.
                run.record.launcher = Some(launcher);
                let exit = record::read_news(&run.dir, true)
                    .map_err(|e| format!("cannot read why the task did not start: {e}"))?
                    .exit
                    .ok_or_else(|| "the task did not start (no reason recorded)".to_owned())?;
                let report = final_report(&exit, run.record.kill_requested);
                self.end(run, report);
                Ok(())
            }
            Start::Failed(reason) => Err(reason),
        }
    }
}

/// Creates a run's sandbox `dir`, empty.
fn make_sandbox(dir: &Path) -> Result<(), Refusal> {
    // Created first: a sandbox that exists already is looked at only
    // then (a launch seldom finds one), which saves two lookups a run.
    let mut created = fs::create_dir(dir);
    if matches!(&created, Err(e) if e.kind() == io::ErrorKind::AlreadyExists) {
        if dir.join(RUN_FILE).exists() {
            // An acknowledged run (the server resent the launch).
            return Err(Refusal::Known);
        }
        // An agent died creating it, before the record that a task's
        // start always follows: nothing runs there, start afresh.
        created = fs::remove_dir_all(dir).and_then(|()| fs::create_dir(dir));
    }
    created
        .map_err(|e| Refusal::Failed(format!("cannot create the sandbox {}: {e}", dir.display())))
}

/// The first record of a run launched at `now`: STARTING.
fn first_record(launch: &RunPlan, now: u64) -> RunRecord {
    RunRecord {
        kill_grace_ms: match launch.task.as_ref().map_or(0, |t| t.kill_grace_ms) {
            0 => DEFAULT_KILL_GRACE_MS,
            ms => ms,
        },
        stop_signal: launch.task.as_ref().ok().and_then(|t| t.stop_signal),
        ..RunRecord::starting(launch.key.clone(), now)
    }
}
