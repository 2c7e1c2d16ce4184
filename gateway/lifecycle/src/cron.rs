//! Cron jobs (Kubernetes' CronJob, Nomad's periodic jobs). A batch job
//! whose plan has a [`Schedule`] is a *cron job*: it runs no task itself
//! (it has no instances and stays RUNNING until it is killed); each tick of
//! its schedule creates a job from its spec, the schedule left out, whose
//! id is the cron job's followed by `-` and the tick's time in minutes
//! since the epoch (as Kubernetes names a CronJob's jobs), so a tick's job
//! is found from its time and a tick never creates two jobs. Its name is
//! the cron job's name followed the same way, so the cron job's name stays
//! its own.
//!
//! Time is passed in: ticks fire on `Input::Tick` once due (the shell wakes
//! at [`Lifecycle::next_deadline`], which includes the next tick). A tick
//! that is due fires only if it is at most [`STARTING_DEADLINE_MS`] old; of
//! several due at once (the server was down) only the latest fires, so a
//! restart never starts a burst. The last tick looked at (fired, skipped or
//! missed) is stored with the cron job's row, so a restart neither repeats
//! nor forgets a tick.
//!
//! Overlap: `allow` starts the tick's job whatever runs (at most
//! [`MAX_ACTIVE_TICKS`] of them at once; beyond, the tick is skipped);
//! `forbid` skips the tick while a job of an earlier tick has not ended;
//! `replace` kills those jobs and starts the new one. History: at each tick
//! the ended jobs of earlier ticks beyond the newest `keep_succeeded`
//! succeeded and `keep_failed` failed (or killed) ones are deleted, as a
//! user's delete would; both at most [`MAX_CRON_HISTORY`]. Killing the cron
//! job stops its schedule and kills its ticks' jobs that still run;
//! restarting it resumes the schedule from then (ticks in between are not
//! made up).

use std::collections::VecDeque;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use peloton_engine::Engine;

use super::effects::Effects;
use super::model::{JobKey, JobKind, JobPlan, JobState};
use super::{Error, Lifecycle};

/// At most this many cron jobs that are not killed.
pub const MAX_CRON_JOBS: usize = 1000;

/// A tick more than this late is not fired (it is counted as missed): the
/// bound on catching up after the server was down (Kubernetes'
/// `startingDeadlineSeconds`, here fixed).
pub const STARTING_DEADLINE_MS: u64 = 5 * 60_000;

/// At most this many ended jobs of each kind (succeeded, failed) are kept.
pub const MAX_CRON_HISTORY: u32 = 100;

/// Succeeded ticks' jobs kept when the spec does not say (Kubernetes').
pub const DEFAULT_KEEP_SUCCEEDED: u32 = 3;

/// Failed ticks' jobs kept when the spec does not say (Kubernetes').
pub const DEFAULT_KEEP_FAILED: u32 = 1;

/// With `allow`, at most this many ticks' jobs run at once.
pub const MAX_ACTIVE_TICKS: usize = 16;

/// What a tick does while a job of an earlier tick has not ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overlap {
    /// Start the new one too.
    #[default]
    Allow,
    /// Skip the tick.
    Forbid,
    /// Kill the running ones, start the new one.
    Replace,
}

impl Overlap {
    /// As the spec spells it.
    pub fn name(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Forbid => "forbid",
            Overlap::Replace => "replace",
        }
    }
}

/// A cron job's schedule, validated.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The expression as written (5 fields, or `@hourly` and the like).
    pub cron: Arc<str>,
    /// The IANA time zone it is read in ("" is UTC).
    pub time_zone: Arc<str>,
    parsed: croner::Cron,
    tz: chrono_tz::Tz,
    /// What a tick does while an earlier one's job runs.
    pub overlap: Overlap,
    /// Ended jobs kept that succeeded.
    pub keep_succeeded: u32,
    /// Ended jobs kept that failed or were killed.
    pub keep_failed: u32,
    /// The spec of a tick's job (the cron job's, its schedule left out),
    /// encoded by the shell: opaque here.
    pub job_spec: Arc<[u8]>,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.cron == other.cron
            && self.time_zone == other.time_zone
            && self.overlap == other.overlap
            && self.keep_succeeded == other.keep_succeeded
            && self.keep_failed == other.keep_failed
            && self.job_spec == other.job_spec
    }
}

/// Parses a cron expression: five fields (minute, hour, day of month,
/// month, day of week), or one of `@yearly`, `@annually`, `@monthly`,
/// `@weekly`, `@daily`, `@hourly`. Errors are for the `cron` field.
fn parse_cron(cron: &str) -> Result<croner::Cron, String> {
    let cron = cron.trim();
    if cron.is_empty() {
        return Err("must not be empty, e.g. \"*/5 * * * *\" or \"@hourly\"".into());
    }
    if cron.len() > 256 {
        return Err("at most 256 bytes".into());
    }
    if !cron.starts_with('@') {
        let n = cron.split_whitespace().count();
        if n != 5 {
            return Err(format!(
                "{cron:?} has {n} fields; a cron expression has 5 (minute hour day-of-month month day-of-week), e.g. \"*/5 * * * *\""
            ));
        }
    }
    let parsed = croner::Cron::new(cron)
        .parse()
        .map_err(|e| format!("{cron:?} is not a cron expression: {e}"))?;
    // One that never matches (Feb 30) is refused too.
    let probe = Utc.timestamp_opt(0, 0).single().expect("epoch");
    parsed
        .find_next_occurrence(&probe, false)
        .map_err(|_| format!("{cron:?} never fires"))?;
    Ok(parsed)
}

/// Parses an IANA time zone ("" is UTC). Errors are for the `time_zone`
/// field.
fn parse_time_zone(name: &str) -> Result<chrono_tz::Tz, String> {
    if name.is_empty() {
        return Ok(chrono_tz::UTC);
    }
    name.parse::<chrono_tz::Tz>().map_err(|_| {
        format!("{name:?} is not an IANA time zone, e.g. \"UTC\" or \"Europe/Berlin\"")
    })
}

impl Schedule {
    /// A schedule, or the field that is wrong (`cron`, `time_zone`,
    /// `keep_succeeded`, `keep_failed`) and why.
    pub fn new(
        cron: &str,
        time_zone: &str,
        overlap: Overlap,
        keep_succeeded: Option<u32>,
        keep_failed: Option<u32>,
        job_spec: Arc<[u8]>,
    ) -> Result<Self, (&'static str, String)> {
        let parsed = parse_cron(cron).map_err(|e| ("cron", e))?;
        let tz = parse_time_zone(time_zone).map_err(|e| ("time_zone", e))?;
        let keep = |field, n: Option<u32>, default| match n {
            None => Ok(default),
            Some(n) if n <= MAX_CRON_HISTORY => Ok(n),
            Some(n) => Err((field, format!("{n} is more than {MAX_CRON_HISTORY}"))),
        };
        Ok(Schedule {
            cron: cron.trim().into(),
            time_zone: time_zone.into(),
            parsed,
            tz,
            overlap,
            keep_succeeded: keep("keep_succeeded", keep_succeeded, DEFAULT_KEEP_SUCCEEDED)?,
            keep_failed: keep("keep_failed", keep_failed, DEFAULT_KEEP_FAILED)?,
            job_spec,
        })
    }

    /// The first tick strictly after `ms` (ms since the epoch), if any. A
    /// wall-clock time that happens twice (clocks go back) fires once, at
    /// its first; one that does not happen (clocks go forward) fires at
    /// the first instant after the gap.
    pub fn next_after(&self, ms: u64) -> Option<u64> {
        let at: DateTime<Utc> = Utc.timestamp_millis_opt(i64::try_from(ms).ok()?).single()?;
        let local = at.with_timezone(&self.tz);
        let next = self.parsed.find_next_occurrence(&local, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok()
    }
}

/// One tick's job, kept in its cron job's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronTick {
    /// The tick's time (ms since the epoch).
    pub at: u64,
    /// The job it created.
    pub job: Arc<str>,
}

/// What a cron job remembers (stored with its row).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CronState {
    /// The last tick looked at: fired, skipped or missed (at creation:
    /// the creation time).
    pub last_tick: u64,
    /// Its ticks' jobs still kept, oldest first.
    pub ticks: VecDeque<CronTick>,
    /// Why the latest tick that created no job did not ("": none did).
    pub last_skip: Arc<str>,
    /// Suspended (`cron suspend`): no tick fires until it is resumed.
    pub suspended: bool,
}

/// The id of the job a cron job's tick at `at` creates.
pub fn tick_job_id(cron_job: &str, at: u64) -> String {
    format!("{cron_job}-{}", at / 60_000)
}

fn utc(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
        .map_or_else(
            || ms.to_string(),
            |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

impl Lifecycle {
    /// Checks a new job's schedule: only batch jobs, none that waits for
    /// other jobs, at most [`MAX_CRON_JOBS`].
    pub(super) fn check_schedule(&self, plan: &JobPlan) -> Result<(), Error> {
        if plan.schedule.is_none() {
            return Ok(());
        }
        if plan.kind != JobKind::Batch {
            return Err(Error::invalid(
                "spec.schedule",
                "only batch jobs have a schedule",
            ));
        }
        if !plan.after.is_empty() {
            return Err(Error::invalid(
                "spec.schedule",
                "a cron job cannot wait for other jobs (its ticks' jobs would)",
            ));
        }
        if self.cron_next.len() >= MAX_CRON_JOBS {
            return Err(Error::Exhausted(format!(
                "{MAX_CRON_JOBS} cron jobs are scheduled already, the most there may be; kill one first"
            )));
        }
        Ok(())
    }

    /// When cron job `k` ticks next (none once killed).
    pub fn cron_next_tick(&self, k: JobKey) -> Option<u64> {
        self.cron_due.get(&k).copied()
    }

    /// Puts a cron job's next tick after `from` on the calendar (none
    /// while it is suspended).
    pub(super) fn schedule_cron(&mut self, k: JobKey, from: u64) {
        self.unschedule_cron(k);
        let job = &self.jobs[&k];
        let Some(s) = &job.plan.schedule else {
            return;
        };
        if job.cron.as_ref().is_some_and(|c| c.suspended) {
            return;
        }
        if let Some(next) = s.next_after(from) {
            self.cron_next.insert((next, k));
            self.cron_due.insert(k, next);
        }
    }

    /// Takes a cron job off the calendar.
    pub(super) fn unschedule_cron(&mut self, k: JobKey) {
        if let Some(at) = self.cron_due.remove(&k) {
            self.cron_next.remove(&(at, k));
        }
    }

    /// The next tick of any cron job.
    pub(super) fn cron_deadline(&self) -> Option<u64> {
        self.cron_next.first().map(|&(at, _)| at)
    }

    /// Fires the ticks due by now.
    pub(super) fn fire_crons(&mut self, engine: &mut Engine, fx: &mut Effects) {
        while let Some(&(at, k)) = self.cron_next.first() {
            if at > self.now {
                break;
            }
            self.unschedule_cron(k);
            self.fire_cron(engine, k, fx);
            self.schedule_cron(k, self.now);
        }
    }

    /// Looks at cron job `k`'s ticks since its last one: the latest due
    /// one within the starting deadline fires; older ones are missed.
    fn fire_cron(&mut self, engine: &mut Engine, k: JobKey, fx: &mut Effects) {
        let now = self.now;
        let job = &self.jobs[&k];
        let schedule = job.plan.schedule.clone().expect("a cron job");
        let last = job.cron.as_ref().expect("a cron job").last_tick;
        let first_due = schedule.next_after(last).filter(|&t| t <= now);
        let Some(first_due) = first_due else {
            return;
        };
        // The latest due tick within the deadline (a few steps: ticks are
        // at least a minute apart).
        let floor = last.max(now.saturating_sub(STARTING_DEADLINE_MS + 1));
        let mut latest = None;
        let mut t = schedule.next_after(floor);
        while let Some(at) = t.filter(|&at| at <= now) {
            latest = Some(at);
            t = schedule.next_after(at);
        }
        let missed = if latest == Some(first_due) {
            None
        } else {
            Some(format!(
                "ticks from {} missed (the server was down); ",
                utc(first_due)
            ))
        };
        let outcome = match latest {
            Some(at) => self.run_tick(engine, k, at, &schedule, fx),
            None => Err(format!(
                "the ticks due since {} were more than {} s late: none fired",
                utc(first_due),
                STARTING_DEADLINE_MS / 1000
            )),
        };
        let job = self.job_mut(k);
        let state = job.cron.as_mut().expect("a cron job");
        state.last_tick = latest.unwrap_or(now);
        match outcome {
            Ok(()) => {
                if let Some(m) = missed {
                    state.last_skip = m.trim_end_matches("; ").into();
                }
            }
            Err(why) if latest.is_some() => {
                state.last_skip = format!("{}{why}", missed.unwrap_or_default()).into();
            }
            Err(why) => state.last_skip = why.into(),
        }
        self.dirty_jobs.insert(k);
        self.prune_ticks(engine, k, fx);
    }

    /// The tick at `at` of cron job `k`: its job created, as the overlap
    /// policy allows; or why not.
    fn run_tick(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        at: u64,
        schedule: &Schedule,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let job = &self.jobs[&k];
        let id: Arc<str> = tick_job_id(&job.id, at).into();
        if self.by_id.contains_key(&id) {
            return Err(format!("tick {}: job {id} exists already", utc(at)));
        }
        let active: Vec<JobKey> = job
            .cron
            .as_ref()
            .expect("a cron job")
            .ticks
            .iter()
            .filter_map(|t| self.by_id.get(&t.job).copied())
            .filter(|x| !self.jobs[x].state.is_terminal())
            .collect();
        match schedule.overlap {
            Overlap::Forbid if !active.is_empty() => {
                return Err(format!(
                    "tick {} skipped: job {} of an earlier tick has not ended (overlap: forbid)",
                    utc(at),
                    self.jobs[&active[0]].id
                ));
            }
            Overlap::Allow if active.len() >= MAX_ACTIVE_TICKS => {
                return Err(format!(
                    "tick {} skipped: {} jobs of earlier ticks have not ended, the most there may be",
                    utc(at),
                    active.len()
                ));
            }
            _ => {}
        }
        let mut plan = self.jobs[&k].plan.clone();
        plan.schedule = None;
        plan.spec = schedule.job_spec.clone();
        // Named after its tick as its id is, so the cron job's name names
        // the cron job alone, also while a tick's job runs.
        plan.name = tick_job_id(&plan.name, at).into();
        self.create_job(engine, id.clone(), plan, fx)
            .map_err(|e| format!("tick {}: its job was not created: {e}", utc(at)))?;
        // The jobs it replaces end only once it exists: a tick refused
        // leaves them running.
        if schedule.overlap == Overlap::Replace {
            let why = format!("replaced by the tick at {} (overlap: replace)", utc(at));
            for x in active {
                self.kill_job(engine, x, &why, fx);
            }
        }
        // The tick's job gets the cron job's secrets.
        if let Some(secrets) = self.secrets.get(&k).cloned() {
            let x = self.by_id[&id];
            self.secrets.insert(x, secrets);
            fx.state_rows
                .push(super::effects::StateRow::Secrets(id.clone()));
        }
        let state = self.job_mut(k).cron.as_mut().expect("a cron job");
        state.ticks.push_back(CronTick { at, job: id });
        state.last_skip = "".into();
        Ok(())
    }

    /// Deletes cron job `k`'s ended ticks' jobs beyond its history, and
    /// forgets ticks whose jobs are gone.
    fn prune_ticks(&mut self, engine: &mut Engine, k: JobKey, fx: &mut Effects) {
        let job = &self.jobs[&k];
        let schedule = job.plan.schedule.as_ref().expect("a cron job");
        let (mut succeeded, mut failed) = (schedule.keep_succeeded, schedule.keep_failed);
        let mut gone = Vec::new();
        let mut keep = VecDeque::new();
        for t in job.cron.as_ref().expect("a cron job").ticks.iter().rev() {
            let Some(&x) = self.by_id.get(&t.job) else {
                continue;
            };
            let state = self.jobs[&x].state;
            let room = match state {
                JobState::Succeeded => &mut succeeded,
                JobState::Failed | JobState::Killed => &mut failed,
                _ => {
                    keep.push_front(t.clone());
                    continue;
                }
            };
            if *room == 0 {
                gone.push(x);
            } else {
                *room -= 1;
                keep.push_front(t.clone());
            }
        }
        for x in &gone {
            self.remove_job(engine, *x, super::retention::REASON_CRON_HISTORY, fx);
        }
        if !gone.is_empty() {
            fx.rows.retain(|r| {
                !matches!(r, super::RowKey::Job(x) | super::RowKey::Task(x, _) | super::RowKey::Config(x, _) if gone.contains(x))
            });
        }
        let state = self.job_mut(k).cron.as_mut().expect("a cron job");
        if state.ticks != keep {
            state.ticks = keep;
            self.dirty_jobs.insert(k);
        }
    }

    /// A cron job is killed: its schedule stops and its ticks' jobs that
    /// have not ended are killed.
    pub(super) fn kill_cron(&mut self, engine: &mut Engine, k: JobKey, fx: &mut Effects) {
        self.unschedule_cron(k);
        let Some(state) = &self.jobs[&k].cron else {
            return;
        };
        let running: Vec<JobKey> = state
            .ticks
            .iter()
            .filter_map(|t| self.by_id.get(&t.job).copied())
            .filter(|x| !self.jobs[x].state.is_terminal())
            .collect();
        for x in running {
            self.kill_job(engine, x, "its cron job was killed", fx);
        }
    }

    /// `cron run-now`: a tick of cron job `k` now, its job created as the
    /// overlap policy allows (a job of this minute's tick that exists
    /// already, a forbidden overlap and too many running ticks are
    /// refused, as a tick of the schedule would skip); the schedule, and
    /// its last tick, are unchanged. Suspended cron jobs run now too.
    pub(super) fn cron_run_now(
        &mut self,
        engine: &mut Engine,
        k: JobKey,
        fx: &mut Effects,
    ) -> Result<(), Error> {
        let schedule = self.jobs[&k].plan.schedule.clone().expect("a cron job");
        let now = self.now;
        self.run_tick(engine, k, now, &schedule, fx)
            .map_err(Error::Precondition)?;
        self.dirty_jobs.insert(k);
        self.prune_ticks(engine, k, fx);
        Ok(())
    }

    /// `cron suspend` (true) and `cron resume` (false): a suspended cron
    /// job is off the calendar (its ticks' jobs that run go on); resumed,
    /// it ticks from now (the ticks in between are not made up), within
    /// the bound on scheduled cron jobs. Either is a no-op when it is so
    /// already (false: nothing changed).
    pub(super) fn suspend_cron(&mut self, k: JobKey, suspend: bool) -> Result<bool, Error> {
        let now = self.now;
        let was = self.jobs[&k].cron.as_ref().expect("a cron job").suspended;
        if was == suspend {
            return Ok(false);
        }
        if !suspend && self.cron_next.len() >= MAX_CRON_JOBS {
            return Err(Error::Exhausted(format!(
                "{MAX_CRON_JOBS} cron jobs are scheduled already, the most there may be; kill one first"
            )));
        }
        let state = self.job_mut(k).cron.as_mut().expect("a cron job");
        state.suspended = suspend;
        if suspend {
            self.unschedule_cron(k);
        } else {
            state.last_tick = now;
            self.schedule_cron(k, now);
        }
        self.dirty_jobs.insert(k);
        Ok(true)
    }

    /// A killed cron job is restarted: its schedule resumes from now.
    pub(super) fn resume_cron(&mut self, k: JobKey) {
        let now = self.now;
        let job = self.job_mut(k);
        if let Some(state) = job.cron.as_mut() {
            state.last_tick = now;
            self.schedule_cron(k, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> u64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis() as u64
    }

    fn utc_of(ms: u64) -> String {
        utc(ms)
    }

    fn schedule(cron: &str, tz: &str) -> Schedule {
        Schedule::new(cron, tz, Overlap::Allow, None, None, Arc::from(&[][..])).unwrap()
    }

    /// Ticks are read in the schedule's time zone, across both DST changes
    /// of Europe/Berlin in 2026 (29 March, 25 October).
    #[test]
    fn ticks_follow_the_time_zone_across_daylight_saving_changes() {
        let daily = schedule("30 2 * * *", "Europe/Berlin");
        let mut t = at("2026-03-27T12:00:00Z");
        let mut spring = Vec::new();
        for _ in 0..3 {
            t = daily.next_after(t).unwrap();
            spring.push(utc_of(t));
        }
        // 02:30 does not exist on 29 March: the tick comes right after the gap.
        assert_eq!(
            spring,
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z"
            ]
        );
        let mut t = at("2026-10-24T12:00:00Z");
        let mut autumn = Vec::new();
        for _ in 0..3 {
            t = daily.next_after(t).unwrap();
            autumn.push(utc_of(t));
        }
        // 02:30 happens twice on 25 October: one tick, at the first.
        assert_eq!(
            autumn,
            [
                "2026-10-25T00:30:00Z",
                "2026-10-26T01:30:00Z",
                "2026-10-27T01:30:00Z"
            ]
        );
        // UTC by default; nicknames are accepted.
        let hourly = schedule("@hourly", "");
        assert_eq!(
            utc_of(hourly.next_after(at("2026-01-01T10:00:00Z")).unwrap()),
            "2026-01-01T11:00:00Z"
        );
    }

    #[test]
    fn bad_expressions_and_zones_name_their_field() {
        let new = |cron, tz| {
            Schedule::new(
                cron,
                tz,
                Overlap::Allow,
                None,
                Some(200),
                Arc::from(&[][..]),
            )
            .map(|_| ())
            .unwrap_err()
            .0
        };
        assert_eq!(new("* * *", ""), "cron");
        assert_eq!(new("* * * * * *", ""), "cron");
        assert_eq!(new("0 0 30 2 *", ""), "cron");
        assert_eq!(new("@hourly", "Nowhere/City"), "time_zone");
        assert_eq!(new("@hourly", "UTC"), "keep_failed");
    }
}
