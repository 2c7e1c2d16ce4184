//! `peloton task ...`: the instances of a job.

use anyhow::{Context, Result, ensure};
use peloton_proto::v1::task_service_client::TaskServiceClient;
use peloton_proto::v1::{
    GetTaskRequest, KillTaskRequest, ListTasksRequest, RestartTaskRequest, Task, TaskLogsRequest,
    TaskRun, TaskState,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::cli::TaskCommand;
use crate::names::name_of;
use crate::output::{
    Align, OutputFormat, Table, fmt_forecast, fmt_time_ms, fmt_usage, or_dash, print_json,
    print_out, render_fields, task_json,
};

pub(super) async fn run(ctx: &Ctx, command: TaskCommand) -> Result<Outcome> {
    let mut client = client(ctx).await?;
    match command {
        TaskCommand::List { job, states } => {
            let states: Vec<i32> = states.into_iter().map(Into::into).collect();
            let tasks = list_tasks(&mut client, &job, &states).await?;
            match ctx.output {
                OutputFormat::Table => print_out(&task_table(&tasks))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "tasks": tasks.iter().map(task_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        TaskCommand::Get { job, instance } => {
            let request = GetTaskRequest {
                job_id: job.clone(),
                instance,
            };
            let task = client
                .get(request)
                .await?
                .into_inner()
                .task
                .with_context(|| format!("the server returned no task for {job}/{instance}"))?;
            match ctx.output {
                OutputFormat::Table => print_out(&task_details(&task))?,
                OutputFormat::Json | OutputFormat::Yaml => {
                    let mut shown = task_json(&task);
                    shown["usage"] = task.usage.iter().map(super::usage::record_json).collect();
                    print_json(&json!({ "task": shown }))?;
                }
            }
        }
        TaskCommand::Kill {
            job,
            instances,
            version,
        } => {
            let request = KillTaskRequest {
                job_id: job.clone(),
                instances: instances.clone(),
                job_version: version.version,
            };
            client.kill(request).await?;
            print_done(ctx.output, "killing", &job, &instances)?;
        }
        TaskCommand::Restart {
            job,
            instances,
            version,
        } => {
            let request = RestartTaskRequest {
                job_id: job.clone(),
                instances: instances.clone(),
                job_version: version.version,
            };
            client.restart(request).await?;
            print_done(ctx.output, "restarting", &job, &instances)?;
        }
        TaskCommand::Logs {
            job,
            instance,
            stderr,
            follow,
            run,
        } => {
            use std::io::Write;
            let request = TaskLogsRequest {
                job_id: job,
                instance,
                run_id: run.unwrap_or(0),
                stderr,
                offset: 0,
                follow,
            };
            let mut stream = client.logs(request).await?.into_inner();
            let mut out = std::io::stdout().lock();
            // Raw bytes, as the task wrote them, whatever the output format.
            while let Some(chunk) = stream.message().await? {
                out.write_all(&chunk.data)?;
                out.flush()?;
            }
        }
    }
    Ok(Outcome::Success)
}

fn print_done(
    output: OutputFormat,
    verb: &str,
    job: &str,
    instances: &[u32],
) -> std::io::Result<()> {
    match output {
        OutputFormat::Table => {
            let instances: Vec<String> = instances.iter().map(ToString::to_string).collect();
            print_out(&format!(
                "{verb} job {job} instances {}",
                instances.join(", ")
            ))
        }
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({})),
    }
}

/// Why a task is where it is: the engine's pending reason, else its run's.
/// Every task of `job` in `states` (all if empty), page after page.
pub(super) async fn list_tasks(
    client: &mut TaskServiceClient<crate::channel::LeaderChannel>,
    job: &str,
    states: &[i32],
) -> Result<Vec<Task>> {
    let mut tasks = Vec::new();
    let mut from_instance = 0;
    loop {
        let request = ListTasksRequest {
            job_id: job.to_owned(),
            states: states.to_vec(),
            from_instance,
            limit: 0,
        };
        let page = client.list(request).await?.into_inner();
        tasks.extend(page.tasks);
        if page.next_instance == 0 {
            break;
        }
        ensure!(
            page.next_instance > from_instance,
            "the server paginated backwards (from instance {from_instance} to {})",
            page.next_instance
        );
        from_instance = page.next_instance;
    }
    Ok(tasks)
}

/// A task client on `ctx`'s server.
pub(super) async fn client(ctx: &Ctx) -> Result<TaskServiceClient<crate::channel::LeaderChannel>> {
    Ok(TaskServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES))
}

pub(super) fn reason(task: &Task) -> String {
    if task.pending_reason.is_empty() {
        or_dash(
            &task
                .current
                .as_ref()
                .map(|r| r.reason.clone())
                .unwrap_or_default(),
        )
    } else {
        task.pending_reason.clone()
    }
}

/// When a task started; for one waiting, `~` and when it is forecast to
/// (as `squeue --start` shows), `?` if the forecast does not foresee it.
fn started(task: &Task, run: &TaskRun) -> String {
    match &task.forecast {
        Some(f) if run.started_at_ms == 0 && f.start_ms > 0 => {
            format!("~{}", fmt_time_ms(f.start_ms))
        }
        Some(_) if run.started_at_ms == 0 => "?".to_owned(),
        _ => fmt_time_ms(run.started_at_ms),
    }
}

fn task_table(tasks: &[Task]) -> String {
    let mut table = Table::new(&[
        ("INSTANCE", Align::Right),
        ("STATE", Align::Left),
        ("HEALTH", Align::Left),
        ("HOST", Align::Left),
        ("RUN", Align::Right),
        ("FAILURES", Align::Right),
        ("STARTED", Align::Left),
        ("REASON", Align::Left),
    ]);
    for task in tasks {
        let run = task.current.clone().unwrap_or_default();
        table.row(vec![
            task.instance.to_string(),
            name_of::<TaskState>(run.state),
            match run.health {
                0 => "-".to_string(),
                h => name_of::<peloton_proto::v1::Health>(h),
            },
            or_dash(&run.host),
            run.run_id.to_string(),
            task.failure_count.to_string(),
            started(task, &run),
            reason(task),
        ]);
    }
    table.render()
}

fn task_details(task: &Task) -> String {
    let run = task.current.clone().unwrap_or_default();
    let mut out = render_fields(&[
        ("JOB", task.job_id.clone()),
        ("INSTANCE", task.instance.to_string()),
        ("STATE", name_of::<TaskState>(run.state)),
        ("HOST", or_dash(&run.host)),
        ("RUN", run.run_id.to_string()),
        ("USED", fmt_usage(run.used.as_ref())),
        ("EXPECTED RUNTIME", expected_runtime(task)),
        ("FAILURES", task.failure_count.to_string()),
        ("PENDING REASON", or_dash(&task.pending_reason)),
        ("ESTIMATED START", fmt_forecast(task.forecast.as_ref())),
        ("CREATED", fmt_time_ms(run.created_at_ms)),
        ("PLACED", fmt_time_ms(run.placed_at_ms)),
        ("STARTED", fmt_time_ms(run.started_at_ms)),
        ("FINISHED", fmt_time_ms(run.finished_at_ms)),
        ("LAST CHECKPOINT", fmt_time_ms(run.last_checkpoint_ms)),
        ("EXIT CODE", exit_code(&run)),
        ("REASON", or_dash(&run.reason)),
    ]);
    if !task.history.is_empty() {
        let mut table = Table::new(&[
            ("RUN", Align::Right),
            ("STATE", Align::Left),
            ("HOST", Align::Left),
            ("STARTED", Align::Left),
            ("FINISHED", Align::Left),
            ("EXIT", Align::Right),
            ("REASON", Align::Left),
        ]);
        for run in &task.history {
            table.row(vec![
                run.run_id.to_string(),
                name_of::<TaskState>(run.state),
                or_dash(&run.host),
                fmt_time_ms(run.started_at_ms),
                fmt_time_ms(run.finished_at_ms),
                exit_code(run),
                or_dash(&run.reason),
            ]);
        }
        out.push_str("\nHISTORY (newest first)\n");
        out.push_str(&table.render());
    }
    if !task.usage.is_empty() {
        out.push_str("\nUSAGE OF ENDED RUNS (newest first)\n");
        out.push_str(&super::usage::record_table(&task.usage));
    }
    out
}

/// How long a run is expected to last and why (`D-HH:MM:SS (declared)`,
/// as Slurm writes times), `-` when unknown.
fn expected_runtime(task: &Task) -> String {
    if task.expected_runtime_source.is_empty() {
        return "-".to_owned();
    }
    format!(
        "{} ({})",
        super::usage::fmt_elapsed(task.expected_runtime_ms),
        task.expected_runtime_source
    )
}

/// The exit code once the run has finished, `-` before.
fn exit_code(run: &TaskRun) -> String {
    if run.finished_at_ms == 0 {
        "-".to_owned()
    } else {
        run.exit_code.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_runtime_says_where_it_comes_from() {
        let mut task = Task {
            expected_runtime_ms: 90_061_000,
            expected_runtime_source: "learned from 4 runs".into(),
            ..Task::default()
        };
        assert_eq!(expected_runtime(&task), "1-01:01:01 (learned from 4 runs)");
        assert!(
            task_details(&task).contains("\nEXPECTED RUNTIME:  1-01:01:01 (learned from 4 runs)")
        );
        task.expected_runtime_source.clear();
        task.expected_runtime_ms = 0;
        assert_eq!(expected_runtime(&task), "-");
    }
}
