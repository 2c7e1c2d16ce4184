//! `peloton task ...`: the instances of a job.

use anyhow::{Context, Result, ensure};
use peloton_proto::v1::task_service_client::TaskServiceClient;
use peloton_proto::v1::{
    GetTaskRequest, KillTaskRequest, ListTasksRequest, RestartTaskRequest, Task, TaskLogsRequest,
    TaskLogsResponse, TaskRun, TaskState,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::cli::{LogOptions, TaskCommand};
use crate::names::name_of;
use crate::output::{
    Align, OutputFormat, Table, View, fmt_forecast, fmt_time_ms, fmt_usage, or_dash, print_json,
    print_names, print_out, render_fields, task_json,
};

pub(super) async fn run(ctx: &Ctx, command: TaskCommand) -> Result<Outcome> {
    let mut client = client(ctx).await?;
    let restart = matches!(command, TaskCommand::Restart { .. });
    match command {
        TaskCommand::List { job, states } => {
            let states: Vec<i32> = states.into_iter().map(Into::into).collect();
            let tasks = list_tasks(&mut client, &job, &states).await?;
            match ctx.output {
                OutputFormat::Table if ctx.view == View::Name => {
                    print_names(tasks.iter().map(task_name))?;
                }
                OutputFormat::Table => print_out(&task_table(&tasks, ctx.view == View::Wide))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "tasks": tasks.iter().map(task_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        TaskCommand::Get { job, instance } => {
            let (job, instance) = task_ref(job, instance)?;
            let instance = instance.with_context(|| {
                format!("INSTANCE: which instance of {job}? (or give task/JOB/INSTANCE)")
            })?;
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
                OutputFormat::Table if ctx.view == View::Name => print_names([task_name(&task)])?,
                OutputFormat::Table if ctx.view == View::Wide => {
                    print_out(&task_table(std::slice::from_ref(&task), true))?;
                }
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
        }
        | TaskCommand::Restart {
            job,
            instances,
            version,
        } => {
            let job_version = version.version;
            for (job, instances) in task_targets(job, instances, job_version)? {
                let (job_id, named) = (job.clone(), instances.clone());
                if restart {
                    let request = RestartTaskRequest {
                        job_id,
                        instances: named,
                        job_version,
                    };
                    client.restart(request).await?;
                } else {
                    let request = KillTaskRequest {
                        job_id,
                        instances: named,
                        job_version,
                    };
                    client.kill(request).await?;
                }
                let verb = if restart { "restarting" } else { "killing" };
                print_done(ctx.output, verb, &job, &instances)?;
            }
        }
        TaskCommand::Logs {
            job,
            instance,
            options,
        } => {
            let (job, instance) = task_ref(job, instance)?;
            return logs(ctx, job, instance, options).await;
        }
    }
    Ok(Outcome::Success)
}

/// The job and instance of `task/JOB/INSTANCE` (a `-o name` line), None
/// for anything else (a job's id or name: names have no '/').
fn task_name_parts(given: &str) -> Option<Result<(String, u32)>> {
    let rest = given.strip_prefix("task/")?;
    Some(match rest.rsplit_once('/') {
        Some((job, i)) if !job.is_empty() => i
            .parse()
            .map(|i| (job.to_string(), i))
            .with_context(|| format!("{given}: {i:?} is not an instance number")),
        _ => Err(anyhow::anyhow!(
            "{given}: a task is named task/JOB/INSTANCE"
        )),
    })
}

/// `JOB [INSTANCE]`, or `task/JOB/INSTANCE`: the job, and the instance if
/// one is named.
fn task_ref(job: String, instance: Option<u32>) -> Result<(String, Option<u32>)> {
    match (task_name_parts(&job), instance) {
        (Some(_), Some(_)) => anyhow::bail!("INSTANCE: {job} names the instance already"),
        (Some(parts), None) => parts.map(|(job, i)| (job, Some(i))),
        (None, instance) => Ok((job, instance)),
    }
}

/// The instances `task kill|restart` names, by job in the order given:
/// `JOB INSTANCE...`, or `task/JOB/INSTANCE` lines (of several jobs too,
/// as `task list -o name` prints them; a job version then applies to
/// every job, so it is refused with more than one).
fn task_targets(job: String, rest: Vec<String>, version: u64) -> Result<Vec<(String, Vec<u32>)>> {
    if task_name_parts(&job).is_none() {
        ensure!(
            !rest.is_empty(),
            "INSTANCE: name at least one instance of {job}"
        );
        let instances = rest
            .iter()
            .map(|i| {
                i.parse::<u32>().with_context(|| {
                    format!("INSTANCE: {i:?} is not an instance number (JOB INSTANCE..., or task/JOB/INSTANCE...)")
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        return Ok(vec![(job, instances)]);
    }
    let mut targets: Vec<(String, Vec<u32>)> = Vec::new();
    for given in std::iter::once(&job).chain(&rest) {
        let (job, i) = task_name_parts(given).unwrap_or_else(|| {
            Err(anyhow::anyhow!(
                "{given}: after a task/JOB/INSTANCE every task is named so"
            ))
        })?;
        match targets.iter_mut().find(|(j, _)| *j == job) {
            Some((_, instances)) => instances.push(i),
            None => targets.push((job, vec![i])),
        }
    }
    ensure!(
        version == 0 || targets.len() == 1,
        "--version: the tasks are of {} jobs; a version is one job's",
        targets.len()
    );
    Ok(targets)
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

/// `-o name`'s line of a task: `task/JOB/INSTANCE`.
fn task_name(task: &Task) -> String {
    format!("task/{}/{}", task.job_id, task.instance)
}

/// Tasks' rows; `wide` (`-o wide`) adds their job, config version, exit
/// code, finish time, volume and pinned host.
fn task_table(tasks: &[Task], wide: bool) -> String {
    let mut columns = vec![
        ("INSTANCE", Align::Right),
        ("STATE", Align::Left),
        ("HEALTH", Align::Left),
        ("HOST", Align::Left),
        ("RUN", Align::Right),
        ("FAILURES", Align::Right),
        ("STARTED", Align::Left),
        ("REASON", Align::Left),
    ];
    if wide {
        columns.extend([
            ("JOB", Align::Left),
            ("CONFIG", Align::Right),
            ("EXIT", Align::Right),
            ("FINISHED", Align::Left),
            ("VOLUME", Align::Left),
            ("PINNED TO", Align::Left),
        ]);
    }
    let mut table = Table::new(&columns);
    for task in tasks {
        let run = task.current.clone().unwrap_or_default();
        let mut row = vec![
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
        ];
        if wide {
            row.extend([
                task.job_id.clone(),
                task.config_version.to_string(),
                exit_code(&run),
                fmt_time_ms(run.finished_at_ms),
                or_dash(&task.volume_id),
                or_dash(&task.pinned_host),
            ]);
        }
        table.row(row);
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
        // A batch instance ends failed above it (its job's current value).
        ("MAX FAILURES", task.max_failures.to_string()),
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

/// Most instances whose logs one `--follow` of a whole job reads at once.
const MAX_FOLLOWED_INSTANCES: usize = 256;
/// Longest partial line held before it is printed as it is.
const MAX_LINE_BYTES: usize = 1 << 20;

/// `task logs` / `job logs`: one instance's output as the task wrote it
/// (or line by line after its time), or every launched instance's, each
/// line after `[INSTANCE]`: one after the other, or interleaved as they
/// come with `--follow`.
pub(super) async fn logs(
    ctx: &Ctx,
    job: String,
    instance: Option<u32>,
    options: LogOptions,
) -> Result<Outcome> {
    use std::io::Write;
    let mut client = client(ctx).await?;
    if let Some(instance) = instance {
        let request = log_request(&job, instance, &options);
        let mut stream = client.logs(request).await?.into_inner();
        let mut lines = Lines::new(None, options.timestamps);
        let mut out = std::io::stdout().lock();
        while let Some(chunk) = stream.message().await? {
            lines.push(&mut out, &chunk)?;
            out.flush()?;
        }
        lines.finish(&mut out)?;
        return Ok(Outcome::Success);
    }
    // Every instance that has been launched (a run to read).
    let tasks = list_tasks(&mut client, &job, &[]).await?;
    let launched: Vec<u32> = tasks
        .iter()
        .filter(|t| t.current.as_ref().is_some_and(|r| r.launch_id > 0) || !t.history.is_empty())
        .map(|t| t.instance)
        .collect();
    if launched.is_empty() {
        eprintln!("no instance of job {job} has been launched yet: no logs");
        return Ok(Outcome::Success);
    }
    if !options.follow {
        let mut out = std::io::stdout().lock();
        for i in launched {
            let request = log_request(&job, i, &options);
            let mut lines = Lines::new(Some(i), options.timestamps);
            match client.logs(request).await {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(chunk)) => lines.push(&mut out, &chunk)?,
                            Ok(None) => break,
                            Err(e) => {
                                eprintln!("[{i}] no more log: {}", e.message());
                                break;
                            }
                        }
                    }
                }
                Err(e) => eprintln!("[{i}] no log: {}", e.message()),
            }
            lines.finish(&mut out)?;
            out.flush()?;
        }
        return Ok(Outcome::Success);
    }
    if launched.len() > MAX_FOLLOWED_INSTANCES {
        anyhow::bail!(
            "{} instances are launched; --follow of a whole job reads at most {MAX_FOLLOWED_INSTANCES} (name one instance)",
            launched.len()
        );
    }
    // One stream per instance; lines interleave as they come, each whole.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    for i in launched {
        let mut client = client.clone();
        let request = log_request(&job, i, &options);
        let tx = tx.clone();
        let timestamps = options.timestamps;
        tokio::spawn(async move {
            let mut lines = Lines::new(Some(i), timestamps);
            let mut stream = match client.logs(request).await {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    eprintln!("[{i}] no log: {}", e.message());
                    return;
                }
            };
            loop {
                let mut text = Vec::new();
                match stream.message().await {
                    Ok(Some(chunk)) => {
                        let _ = lines.push(&mut text, &chunk);
                    }
                    Ok(None) => {
                        let _ = lines.finish(&mut text);
                        let _ = tx.send(text).await;
                        return;
                    }
                    Err(e) => {
                        eprintln!("[{i}] no more log: {}", e.message());
                        let _ = lines.finish(&mut text);
                        let _ = tx.send(text).await;
                        return;
                    }
                }
                if !text.is_empty() && tx.send(text).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut out = std::io::stdout();
    while let Some(text) = rx.recv().await {
        out.write_all(&text)?;
        out.flush()?;
    }
    Ok(Outcome::Success)
}

fn log_request(job: &str, instance: u32, options: &LogOptions) -> TaskLogsRequest {
    TaskLogsRequest {
        job_id: job.to_owned(),
        instance,
        run_id: options.run.unwrap_or(0),
        stderr: options.stderr,
        offset: 0,
        follow: options.follow,
        tail_lines: options.tail.unwrap_or(0),
        since_ms: options.since.unwrap_or(0),
        timestamps: options.timestamps,
    }
}

/// Output bytes made into lines, each after its instance (`[I] `) and/or
/// the time it was written by; raw bytes when neither is asked for.
struct Lines {
    prefix: Option<String>,
    timestamps: bool,
    /// A line begun and not ended yet.
    partial: Vec<u8>,
    /// The time of the latest mark seen (what a partial line is shown
    /// with at the end).
    last_time_ms: u64,
}

impl Lines {
    fn new(instance: Option<u32>, timestamps: bool) -> Self {
        Lines {
            prefix: instance.map(|i| format!("[{i}] ")),
            timestamps,
            partial: Vec::new(),
            last_time_ms: 0,
        }
    }

    fn push(
        &mut self,
        out: &mut impl std::io::Write,
        chunk: &TaskLogsResponse,
    ) -> std::io::Result<()> {
        if self.prefix.is_none() && !self.timestamps {
            return out.write_all(&chunk.data);
        }
        let mut start = 0;
        for (k, &b) in chunk.data.iter().enumerate() {
            if b != b'\n' && self.partial.len() + (k - start) < MAX_LINE_BYTES {
                continue;
            }
            let end = chunk.offset + k as u64 + 1;
            // The first mark at or past the line's end: written by then.
            let time = chunk
                .marks
                .iter()
                .find(|m| m.offset >= end)
                .or(chunk.marks.last())
                .map_or(0, |m| m.time_ms);
            self.last_time_ms = self.last_time_ms.max(time);
            self.partial.extend_from_slice(&chunk.data[start..=k]);
            self.emit(out, time)?;
            start = k + 1;
        }
        self.partial.extend_from_slice(&chunk.data[start..]);
        if let Some(m) = chunk.marks.last() {
            self.last_time_ms = self.last_time_ms.max(m.time_ms);
        }
        Ok(())
    }

    fn emit(&mut self, out: &mut impl std::io::Write, time_ms: u64) -> std::io::Result<()> {
        if self.timestamps {
            write!(out, "{} ", fmt_log_time(time_ms))?;
        }
        if let Some(p) = &self.prefix {
            out.write_all(p.as_bytes())?;
        }
        out.write_all(&self.partial)?;
        if self.partial.last() != Some(&b'\n') {
            out.write_all(b"\n")?;
        }
        self.partial.clear();
        Ok(())
    }

    /// Prints a last line that has no newline.
    fn finish(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        if self.partial.is_empty() {
            return Ok(());
        }
        self.emit(out, self.last_time_ms)
    }
}

/// A mark's time as RFC 3339 UTC with milliseconds ("-" for none).
fn fmt_log_time(ms: u64) -> String {
    if ms == 0 {
        return "-".to_owned();
    }
    let date = fmt_time_ms(ms);
    format!("{}T{}.{:03}Z", &date[..10], &date[11..], ms % 1000)
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use peloton_proto::v1::LogMark;

    fn chunk(offset: u64, data: &str, marks: &[(u64, u64)]) -> TaskLogsResponse {
        TaskLogsResponse {
            data: data.as_bytes().to_vec(),
            offset,
            marks: marks
                .iter()
                .map(|&(offset, time_ms)| LogMark { offset, time_ms })
                .collect(),
        }
    }

    #[test]
    fn lines_get_their_instance_and_the_time_of_the_first_mark_past_them() {
        let mut lines = Lines::new(Some(3), true);
        let mut out = Vec::new();
        // "a\n" written by 1000 ms, "bb\nc" by 2000 ms, the rest later.
        lines
            .push(&mut out, &chunk(0, "a\nbb\nc", &[(2, 1000), (7, 2000)]))
            .unwrap();
        lines
            .push(&mut out, &chunk(7, "d\n", &[(9, 3000)]))
            .unwrap();
        lines
            .push(&mut out, &chunk(9, "tail", &[(13, 4000)]))
            .unwrap();
        lines.finish(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "1970-01-01T00:00:01.000Z [3] a\n\
             1970-01-01T00:00:02.000Z [3] bb\n\
             1970-01-01T00:00:03.000Z [3] cd\n\
             1970-01-01T00:00:04.000Z [3] tail\n"
        );
    }

    #[test]
    fn without_prefix_or_times_the_bytes_pass_as_they_are() {
        let mut lines = Lines::new(None, false);
        let mut out = Vec::new();
        lines.push(&mut out, &chunk(0, "x\ny", &[])).unwrap();
        lines.finish(&mut out).unwrap();
        assert_eq!(out, b"x\ny");
    }
}
