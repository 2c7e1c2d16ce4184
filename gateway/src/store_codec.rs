//! The stored rows of jobs, tasks and job configs: their own messages,
//! versioned, apart from the API's read messages (a change to what the API
//! shows does not change what the store holds, nor the other way round).
//!
//! A row of this codec starts with [`ROW_V1`]: a 0 byte, which no protobuf
//! message starts with (field number 0 does not exist), then the version.
//! Rows written before (the API's `Job`, `Task` and `JobSpec` messages)
//! still decode.

use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;

use crate::convert;
use crate::lifecycle::{AppState, Job, JobRow, LaunchId, RunRecord, TaskRow};

/// First bytes of a row of this codec, version 1.
pub const ROW_V1: [u8; 2] = [0, 1];

/// A job's stored row: its status and versions (its specs are config rows;
/// recovery counts its tasks).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredJob {
    /// Bumped by every change a user makes.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// The job's state (the API's numbering).
    #[prost(int32, tag = "2")]
    pub state: i32,
    /// Created.
    #[prost(uint64, tag = "3")]
    pub created_at_ms: u64,
    /// Completed (0: not).
    #[prost(uint64, tag = "4")]
    pub completed_at_ms: u64,
    /// Killed as a whole.
    #[prost(bool, tag = "5")]
    pub kill_requested: bool,
    /// Version of the current config.
    #[prost(uint64, tag = "6")]
    pub config: u64,
    /// The latest update ("" for none).
    #[prost(string, tag = "7")]
    pub update_id: String,
    /// Application jobs: the driver's target.
    #[prost(message, optional, tag = "8")]
    pub app: Option<StoredApp>,
}

/// An application's stored target.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct StoredApp {
    /// Executors wanted.
    #[prost(uint32, tag = "1")]
    pub target: u32,
    /// Generation of the target.
    #[prost(uint64, tag = "2")]
    pub generation: u64,
    /// Unregistered.
    #[prost(bool, tag = "3")]
    pub closed: bool,
}

/// One run, stored.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredRun {
    /// Run id.
    #[prost(uint32, tag = "1")]
    pub run: u32,
    /// Its state (the API's numbering).
    #[prost(int32, tag = "2")]
    pub state: i32,
    /// Its host ("" if never placed).
    #[prost(string, tag = "3")]
    pub host: String,
    /// Created.
    #[prost(uint64, tag = "4")]
    pub created_at_ms: u64,
    /// Placed.
    #[prost(uint64, tag = "5")]
    pub placed_at_ms: u64,
    /// Started.
    #[prost(uint64, tag = "6")]
    pub started_at_ms: u64,
    /// Ended.
    #[prost(uint64, tag = "7")]
    pub finished_at_ms: u64,
    /// Exit code.
    #[prost(int32, tag = "8")]
    pub exit_code: i32,
    /// Why it is where it is.
    #[prost(string, tag = "9")]
    pub reason: String,
    /// Its launch.
    #[prost(uint64, tag = "10")]
    pub launch: u64,
}

/// A run told to stop whose end its host has not confirmed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredStopping {
    /// Its launch.
    #[prost(uint64, tag = "1")]
    pub launch: u64,
    /// Its host.
    #[prost(string, tag = "2")]
    pub host: String,
}

/// An instance's stored row.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredTask {
    /// The current run.
    #[prost(message, optional, tag = "1")]
    pub current: Option<StoredRun>,
    /// Failed runs in a row.
    #[prost(uint32, tag = "2")]
    pub failures: u32,
    /// Earlier runs, newest first.
    #[prost(message, repeated, tag = "3")]
    pub history: Vec<StoredRun>,
    /// A run of the instance told to stop.
    #[prost(message, optional, tag = "4")]
    pub stopping: Option<StoredStopping>,
    /// Start a new run once the host confirms.
    #[prost(bool, tag = "5")]
    pub restart_when_stopped: bool,
    /// Config version of the instance.
    #[prost(uint64, tag = "6")]
    pub config: u64,
    /// A daemon's instance: its host ("" for none).
    #[prost(string, tag = "7")]
    pub daemon_host: String,
}

/// `message` after the version bytes.
fn versioned(message: &impl Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(ROW_V1.len() + message.encoded_len());
    out.extend_from_slice(&ROW_V1);
    message
        .encode(&mut out)
        .expect("a Vec grows to fit the message");
    out
}

/// The message of a row of this codec, or `None` for a row written before
/// it (the API's message).
fn body(row: &[u8]) -> Result<Option<&[u8]>, String> {
    match row {
        [0, 1, rest @ ..] => Ok(Some(rest)),
        [0, v, ..] => Err(format!("row version {v} is unknown to this server")),
        _ => Ok(None),
    }
}

/// A job's row.
pub fn encode_job(job: &Job) -> Vec<u8> {
    versioned(&StoredJob {
        version: job.version,
        state: convert::job_state_to_pb(job.state) as i32,
        created_at_ms: job.created_at,
        completed_at_ms: job.completed_at,
        kill_requested: job.kill_requested,
        config: job.config,
        update_id: job
            .latest_update()
            .map(|u| u.to_string())
            .unwrap_or_default(),
        app: job.plan.app.map(|_| StoredApp {
            target: job.app.target,
            generation: job.app.generation,
            closed: job.app.closed,
        }),
    })
}

/// A job's row as the core's recovery input, with the spec an old row
/// carried itself (rows written before specs moved to config rows).
pub fn decode_job(id: &str, row: &[u8]) -> Result<(JobRow, Option<pb::JobSpec>), String> {
    let problem = |e: prost::DecodeError| format!("stored job {id}: {e}");
    let (stored, spec) = match body(row)? {
        Some(body) => (StoredJob::decode(body).map_err(problem)?, None),
        None => {
            let old = pb::Job::decode(row).map_err(problem)?;
            let status = old.status.unwrap_or_default();
            let stored = StoredJob {
                version: old.version,
                state: status.state,
                created_at_ms: status.created_at_ms,
                completed_at_ms: status.completed_at_ms,
                kill_requested: status.kill_requested,
                config: status.config_version,
                update_id: status.update_id,
                app: status.application.map(|a| StoredApp {
                    target: a.target,
                    generation: a.generation,
                    closed: a.unregistered,
                }),
            };
            (stored, old.spec)
        }
    };
    let state = pb::JobState::try_from(stored.state).unwrap_or_default();
    let row = JobRow {
        id: Arc::from(id),
        version: stored.version,
        state: convert::job_state_from_pb(state),
        created_at: stored.created_at_ms,
        completed_at: stored.completed_at_ms,
        kill_requested: stored.kill_requested,
        // Stores written before config versions existed hold version 0.
        config: stored.config.max(1),
        update: (!stored.update_id.is_empty()).then(|| stored.update_id.as_str().into()),
        app: stored
            .app
            .map(|a| AppState {
                target: a.target,
                generation: a.generation,
                closed: a.closed,
                failures: 0,
            })
            .unwrap_or_default(),
    };
    Ok((row, spec))
}

fn run_to_stored(r: &RunRecord) -> StoredRun {
    StoredRun {
        run: r.run,
        state: r.state as i32,
        host: r.host.to_string(),
        created_at_ms: r.created_at,
        placed_at_ms: r.placed_at,
        started_at_ms: r.started_at,
        finished_at_ms: r.finished_at,
        exit_code: r.exit_code,
        reason: r.reason.as_deref().unwrap_or_default().to_string(),
        launch: r.launch.0,
    }
}

fn run_from_stored(r: &StoredRun) -> RunRecord {
    RunRecord {
        run: r.run,
        state: convert::task_state_from_pb(r.state),
        host: r.host.as_str().into(),
        created_at: r.created_at_ms,
        placed_at: r.placed_at_ms,
        started_at: r.started_at_ms,
        finished_at: r.finished_at_ms,
        exit_code: r.exit_code,
        reason: (!r.reason.is_empty()).then(|| r.reason.as_str().into()),
        launch: LaunchId(r.launch),
    }
}

/// An instance's row.
pub fn encode_task(row: &TaskRow) -> Vec<u8> {
    versioned(&StoredTask {
        current: Some(run_to_stored(&row.current)),
        failures: row.failures,
        history: row.history.iter().map(run_to_stored).collect(),
        stopping: row.stopping.as_ref().map(|(launch, host)| StoredStopping {
            launch: launch.0,
            host: host.to_string(),
        }),
        restart_when_stopped: row.restart_when_stopped,
        config: row.config,
        daemon_host: row.daemon_host.as_deref().unwrap_or_default().to_string(),
    })
}

/// An instance's row as the core's recovery input.
pub fn decode_task(row: &[u8]) -> Result<TaskRow, String> {
    let problem = |e: prost::DecodeError| format!("stored task: {e}");
    if let Some(body) = body(row)? {
        let t = StoredTask::decode(body).map_err(problem)?;
        return Ok(TaskRow {
            current: run_from_stored(&t.current.unwrap_or_default()),
            failures: t.failures,
            history: t.history.iter().map(run_from_stored).collect(),
            stopping: t
                .stopping
                .map(|s| (LaunchId(s.launch), s.host.as_str().into())),
            restart_when_stopped: t.restart_when_stopped,
            config: t.config,
            daemon_host: (!t.daemon_host.is_empty()).then(|| t.daemon_host.as_str().into()),
        });
    }
    let old = pb::Task::decode(row).map_err(problem)?;
    let current = old.current.clone().unwrap_or_default();
    Ok(TaskRow {
        current: convert::run_from_pb(&current),
        failures: old.failure_count,
        history: old.history.iter().map(convert::run_from_pb).collect(),
        // Rows written before the stopping run was stored apart describe
        // it as the current run.
        stopping: old.stopping.then(|| {
            if old.stopping_launch_id != 0 {
                (
                    LaunchId(old.stopping_launch_id),
                    old.stopping_host.as_str().into(),
                )
            } else {
                (LaunchId(current.launch_id), current.host.as_str().into())
            }
        }),
        restart_when_stopped: old.restart_when_stopped,
        config: old.config_version,
        daemon_host: (!old.pinned_host.is_empty()).then(|| old.pinned_host.as_str().into()),
    })
}

/// A config version's row: the job's spec of that version.
pub fn encode_config(spec: &pb::JobSpec) -> Vec<u8> {
    versioned(spec)
}

/// A config row's spec.
pub fn decode_config(row: &[u8]) -> Result<pb::JobSpec, String> {
    let body = body(row)?.unwrap_or(row);
    pb::JobSpec::decode(body).map_err(|e| format!("stored job config: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{JobState, TaskState};

    fn run(run: u32, state: TaskState, host: &str, reason: Option<&str>) -> RunRecord {
        RunRecord {
            run,
            state,
            host: host.into(),
            created_at: 10,
            placed_at: 11,
            started_at: 12,
            finished_at: 13,
            exit_code: -3,
            reason: reason.map(Into::into),
            launch: LaunchId(99),
        }
    }

    #[test]
    fn task_rows_round_trip_and_start_with_their_version() {
        let rows = [
            TaskRow::default(),
            TaskRow {
                current: run(3, TaskState::Running, "h1", None),
                failures: 2,
                history: vec![
                    run(2, TaskState::Failed, "h2", Some("exit 3")),
                    run(1, TaskState::Lost, "", Some("host lost")),
                ],
                stopping: Some((LaunchId(7), "h2".into())),
                restart_when_stopped: true,
                config: 4,
                daemon_host: Some("h1".into()),
            },
        ];
        for row in rows {
            let bytes = encode_task(&row);
            assert_eq!(bytes[..2], ROW_V1);
            assert_eq!(decode_task(&bytes).unwrap(), row);
        }
    }

    /// Rows written before this codec were the API's messages: they still
    /// decode, to the same rows.
    #[test]
    fn rows_written_as_the_apis_messages_still_decode() {
        let old_task = pb::Task {
            current: Some(convert::run_to_pb(&run(2, TaskState::Killed, "h", None))),
            failure_count: 1,
            history: vec![convert::run_to_pb(&run(
                1,
                TaskState::Failed,
                "g",
                Some("x"),
            ))],
            stopping: true,
            restart_when_stopped: true,
            config_version: 3,
            pinned_host: "p".into(),
            ..Default::default()
        };
        let task = decode_task(&old_task.encode_to_vec()).unwrap();
        assert_eq!(task.current, run(2, TaskState::Killed, "h", None));
        assert_eq!(
            task.history,
            vec![run(1, TaskState::Failed, "g", Some("x"))]
        );
        // Without a stopping launch of its own, the current run's.
        assert_eq!(task.stopping, Some((LaunchId(99), "h".into())));
        assert_eq!((task.failures, task.config), (1, 3));
        assert!(task.restart_when_stopped);
        assert_eq!(task.daemon_host.as_deref(), Some("p"));

        let spec = pb::JobSpec {
            name: "old".into(),
            pool: "/a".into(),
            instance_count: 2,
            ..Default::default()
        };
        let old_job = pb::Job {
            id: "j".into(),
            spec: Some(spec.clone()),
            status: Some(pb::JobStatus {
                state: pb::JobState::Running as i32,
                created_at_ms: 5,
                completed_at_ms: 0,
                kill_requested: true,
                config_version: 0,
                update_id: "u".into(),
                application: Some(pb::ApplicationStatus {
                    target: 4,
                    generation: 6,
                    registered: true,
                    unregistered: false,
                }),
                ..Default::default()
            }),
            version: 8,
        };
        let (row, in_row) = decode_job("j", &old_job.encode_to_vec()).unwrap();
        assert_eq!(in_row, Some(spec.clone()));
        assert_eq!(
            (row.version, row.state, row.created_at, row.kill_requested),
            (8, JobState::Running, 5, true)
        );
        // Version 0 (before config versions) is the first.
        assert_eq!(row.config, 1);
        assert_eq!(row.update.as_deref(), Some("u"));
        assert_eq!((row.app.target, row.app.generation), (4, 6));

        assert_eq!(decode_config(&spec.encode_to_vec()).unwrap(), spec);
        let new = encode_config(&spec);
        assert_eq!(new[..2], ROW_V1);
        assert_eq!(decode_config(&new).unwrap(), spec);
    }

    #[test]
    fn a_row_of_an_unknown_version_is_an_error_naming_it() {
        let err = decode_task(&[0, 9, 1, 2]).unwrap_err();
        assert!(err.contains("row version 9"), "{err}");
        assert!(decode_job("j", &[0, 2]).unwrap_err().contains("version 2"));
    }
}
