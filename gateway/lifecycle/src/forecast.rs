//! Start forecasts of waiting instances: when and where each would start
//! and its place in its pool's queue, if nothing else happens.
//!
//! The engine forecasts ([`peloton_engine::forecast`]): its own cycle run
//! forward on a fork of the live state, running tasks ending at their
//! runtime estimates (per job: [`Lifecycle::runtime_estimate`] of its
//! first instance, so overrides of the estimate are not seen). The core
//! only prepares the request and keeps the answer, so that the run itself
//! can happen off the loop thread: every [`FORECAST_INTERVAL_MS`] (by
//! default) while
//! work waits, the shell takes a [`ForecastRequest`]
//! ([`Lifecycle::forecast_request`]: a fork and the estimates), runs it
//! wherever it likes, and steps [`crate::Input::Forecast`] with the
//! answer. One request is out at a time.
//!
//! Forecasts are soft state, like usage: nothing is stored, no row or
//! event is written, a restart starts without one. An answer is mapped to
//! instances when it arrives; an instance whose task changed meanwhile
//! (started, ended, queued again) is left out. Reads show an instance's
//! forecast while it waits in the engine. Instances not yet queued in the
//! engine (a job's running limit, backoff) have none.

use std::sync::Arc;

use peloton_engine::Engine;
use peloton_engine::forecast::{Forecast, ForecastConfig, Stopped, forecast_fork};
use peloton_engine::task::TaskHandle;
use rustc_hash::FxHashMap;

use crate::{JobKey, Lifecycle, TaskState as S};

/// A forecast is made at most this often while work waits, by default
/// ([`crate::CoreConfig::forecast_interval_ms`]).
pub const FORECAST_INTERVAL_MS: u64 = 10_000;

/// A request not answered within this long is given up (the shell lost
/// it); the next is made.
const FORECAST_TIMEOUT_MS: u64 = 60_000;

/// What the shell runs: a fork of the engine and each job's runtime
/// estimate.
pub struct ForecastRequest {
    /// The engine as it was when asked.
    pub sim: Engine,
    /// When it was asked.
    pub now_ms: u64,
    /// Runtime estimates by job number (jobs without one run forever).
    pub estimates: FxHashMap<u32, u64>,
    /// The bounds.
    pub config: ForecastConfig,
}

impl std::fmt::Debug for ForecastRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForecastRequest")
            .field("now_ms", &self.now_ms)
            .field("estimates", &self.estimates.len())
            .finish_non_exhaustive()
    }
}

impl ForecastRequest {
    /// Runs it (milliseconds to about a hundred at the largest clusters).
    pub fn run(self) -> Forecast {
        let estimates = self.estimates;
        forecast_fork(
            self.sim,
            self.now_ms,
            &|job, _| estimates.get(&job).copied(),
            &self.config,
        )
    }
}

/// An instance's forecast, as reads show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceForecast {
    /// When it would start (none: not within the forecast's bounds).
    pub start_ms: Option<u64>,
    /// The earliest it might.
    pub earliest_ms: Option<u64>,
    /// The host it would get.
    pub host: Option<Arc<str>>,
    /// Its place in its pool's queue (1: next; 0: not within the bounds).
    pub position: u32,
    /// The engine task it was made for (a later run's task has none).
    pub task: TaskHandle,
}

/// A job's forecast: over its instances that waited when it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobForecast {
    /// When the last of them would start (none if any would not within
    /// the bounds).
    pub start_ms: Option<u64>,
    /// The earliest the first might.
    pub earliest_ms: Option<u64>,
    /// The best queue position among them (0: none admitted within the
    /// bounds).
    pub position: u32,
}

/// The latest forecast, by instance.
#[derive(Debug, Default)]
pub(crate) struct Forecasts {
    /// When the latest answer was asked for (0: none yet).
    made_at: u64,
    /// Why it stopped.
    stopped: Stopped,
    by_instance: FxHashMap<(JobKey, u32), InstanceForecast>,
    by_job: FxHashMap<JobKey, JobForecast>,
    /// When the request out was made, if one is.
    asked_at: Option<u64>,
    /// When the last request was made.
    last_asked: u64,
}

impl Lifecycle {
    /// Whether a forecast is due: work waits in the engine, none is out,
    /// and the last was asked for [`crate::CoreConfig::forecast_interval_ms`]
    /// ago (never if that is 0). The loop looks at least every idle cycle.
    pub fn forecast_due(&self, engine: &Engine, now: u64) -> bool {
        let interval = self.config.forecast_interval_ms;
        let out = self
            .forecasts
            .asked_at
            .is_some_and(|at| now < at.saturating_add(FORECAST_TIMEOUT_MS));
        interval > 0
            && !out
            && now >= self.forecasts.last_asked.saturating_add(interval)
            && (engine.resources().n_queued_total() > 0 || !engine.waiting_tasks().is_empty())
    }

    /// A forecast to run now: a fork of `engine` and the jobs' runtime
    /// estimates. The answer comes back as [`crate::Input::Forecast`].
    pub fn forecast_request(&mut self, engine: &Engine, config: ForecastConfig) -> ForecastRequest {
        let now = self.now;
        self.forecasts.asked_at = Some(now);
        self.forecasts.last_asked = now;
        let estimates = self.job_estimates();
        ForecastRequest {
            sim: engine.fork(),
            now_ms: now,
            estimates,
            config,
        }
    }

    /// Keeps a forecast's answer: each waiting task's start, host and
    /// place, by instance.
    pub(crate) fn apply_forecast(&mut self, engine: &Engine, forecast: &Forecast) {
        self.forecasts.asked_at = None;
        self.forecasts.made_at = forecast.now_ms;
        self.forecasts.stopped = forecast.stopped;
        self.forecasts.by_instance.clear();
        self.forecasts.by_job.clear();
        for t in &forecast.tasks {
            let Some((k, i)) = self.instance_of(engine, t.task) else {
                continue;
            };
            let j = self.forecasts.by_job.entry(k).or_insert(JobForecast {
                start_ms: Some(0),
                earliest_ms: None,
                position: 0,
            });
            j.start_ms = j.start_ms.zip(t.start).map(|(a, s)| a.max(s.at_ms));
            if let Some(s) = t.start {
                j.earliest_ms = Some(
                    j.earliest_ms
                        .map_or(s.earliest_ms, |e| e.min(s.earliest_ms)),
                );
            }
            if t.position > 0 && (j.position == 0 || t.position < j.position) {
                j.position = t.position;
            }
            let host = t
                .start
                .and_then(|s| self.host_names.get(s.host as usize).cloned());
            self.forecasts.by_instance.insert(
                (k, i),
                InstanceForecast {
                    start_ms: t.start.map(|s| s.at_ms),
                    earliest_ms: t.start.map(|s| s.earliest_ms),
                    host,
                    position: t.position,
                    task: t.task,
                },
            );
        }
    }

    /// The latest forecast of an instance, while its task waits in the
    /// engine for the one it was made for.
    pub fn forecast_of(&self, engine: &Engine, k: JobKey, i: u32) -> Option<&InstanceForecast> {
        let f = self.forecasts.by_instance.get(&(k, i))?;
        let handle: TaskHandle = self.jobs.get(&k)?.tasks.get(i as usize)?.handle?;
        if handle != f.task {
            return None;
        }
        let waiting = engine
            .tasks()
            .state(handle)
            .is_ok_and(|s| s != peloton_engine::task::TaskState::Placed);
        waiting.then_some(f)
    }

    /// The latest forecast of a job's instances that waited then, while
    /// any of its instances waits in the engine.
    pub fn job_forecast(&self, k: JobKey) -> Option<&JobForecast> {
        let job = self.jobs.get(&k)?;
        let waiting = [S::Pending, S::Ready, S::Placing]
            .iter()
            .any(|&s| job.counts[s as usize] > 0);
        waiting.then(|| self.forecasts.by_job.get(&k)).flatten()
    }

    /// When the latest forecast was made (none yet: 0), and why it
    /// stopped.
    pub fn forecast_made(&self) -> (u64, Stopped) {
        (self.forecasts.made_at, self.forecasts.stopped)
    }

    /// How long each job's tasks are expected to run, by job number: its
    /// first instance's estimate ([`Lifecycle::runtime_estimate`]), taken
    /// for all of them; jobs without one are left out (they run forever).
    pub(crate) fn job_estimates(&self) -> FxHashMap<u32, u64> {
        self.jobs
            .keys()
            .filter_map(|&k| Some((k.0, self.runtime_estimate(k, 0)?.ms)))
            .collect()
    }
}
