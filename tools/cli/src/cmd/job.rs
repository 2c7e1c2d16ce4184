//! `peloton job ...`: jobs, and waiting for one to end.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use peloton_proto::v1::job_service_client::JobServiceClient;
use peloton_proto::v1::{
    CreateJobRequest, DeleteJobRequest, EditJobRequest, GetJobRequest, Job, JobSpec, JobState,
    JobType, KillJobRequest, PlacementStrategy, PlanJobRequest, PlanJobResponse, QueryJobsRequest,
    RestartJobRequest, ScaleJobRequest, TaskState,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::channel::LeaderChannel;
use crate::cli::{JobCommand, JobOrder, QueryArgs, RunArgs};
use crate::names::{is_terminal_job_state, name_of};
use crate::output::{
    Align, OutputFormat, Table, View, fmt_dependencies, fmt_forecast, fmt_map, fmt_resources,
    fmt_task_counts, fmt_time_ms, fmt_usage, job_json, or_dash, print_json, print_names, print_out,
    render_fields,
};
use crate::spec::load_job_file;

/// How often `--wait` asks for the job.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Largest page the server serves.
const MAX_PAGE_SIZE: u32 = 1000;

type Client = JobServiceClient<LeaderChannel>;

pub(super) async fn run(ctx: &Ctx, command: JobCommand) -> Result<Outcome> {
    match command {
        JobCommand::Create {
            target,
            wait,
            secrets,
            quiet,
        } => {
            let (pool, file) = target.resolve()?;
            let mut loaded = load_job_file(&file)?;
            super::print_notes(&file, &loaded.notes);
            if let Some(pool) = pool {
                loaded.value.pool = pool.to_owned();
            }
            let mut spec = loaded.value.into_proto();
            spec.secrets.extend(crate::spec::load_secrets(&secrets)?);
            return submit(ctx, spec, wait, quiet).await;
        }
        JobCommand::Plan { target } => {
            let (pool, file) = target.resolve()?;
            let mut loaded = load_job_file(&file)?;
            super::print_notes(&file, &loaded.notes);
            if let Some(pool) = pool {
                loaded.value.pool = pool.to_owned();
            }
            let spec = loaded.value.into_proto();
            let mut client = connect(ctx).await?;
            let plan = client
                .plan(PlanJobRequest { spec: Some(spec) })
                .await
                .map_err(crate::spec::in_file_terms)?
                .into_inner();
            match ctx.output {
                OutputFormat::Json | OutputFormat::Yaml => print_json(&plan_json(&plan))?,
                OutputFormat::Table => print_out(&plan_table(&plan))?,
            }
            return Ok(Outcome::Success);
        }
        JobCommand::Usage { id, since, until } => {
            return super::usage::job_usage(ctx, id, since, until).await;
        }
        JobCommand::Get { id } => {
            let mut client = connect(ctx).await?;
            let job = get(&mut client, &id).await?;
            match ctx.view {
                View::Name => print_names([format!("job/{}", job.id)])?,
                View::Wide => print_out(&job_table(std::slice::from_ref(&job), true))?,
                View::Plain if ctx.output == OutputFormat::Yaml => print_out(&spec_file(&job)?)?,
                View::Plain => print_job(ctx.output, &job)?,
            }
        }
        JobCommand::Query(mut args) => {
            if args.mine {
                args.owner = Some(me(ctx).await?);
            }
            let mut client = connect(ctx).await?;
            let quiet = args.quiet;
            let jobs = query(&mut client, args).await?;
            if quiet {
                let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
                if !ids.is_empty() {
                    print_out(&ids.join("\n"))?;
                }
                return Ok(Outcome::Success);
            }
            match ctx.output {
                OutputFormat::Table if ctx.view == View::Name => {
                    print_names(jobs.iter().map(|j| format!("job/{}", j.id)))?;
                }
                OutputFormat::Table => print_out(&job_table(&jobs, ctx.view == View::Wide))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "jobs": jobs.iter().map(job_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        JobCommand::Kill {
            ids,
            selector,
            owner,
            mine,
            pool,
            yes,
            version,
        } => {
            let mut client = connect(ctx).await?;
            if ids.is_empty() {
                let owner = if mine { Some(me(ctx).await?) } else { owner };
                let selection = Selection {
                    selector,
                    owner,
                    pool,
                };
                return kill_selected(ctx, &mut client, selection, yes).await;
            }
            if ids.len() > 1 && version.version != 0 {
                bail!("--version names one job's version: give one job id with it");
            }
            for id in ids {
                let request = KillJobRequest {
                    id,
                    version: version.version,
                };
                let job = job_of(client.kill(request).await?.into_inner().job)?;
                note_if_ended(&job);
                print_job_row(ctx.output, &job)?;
            }
        }
        JobCommand::Edit {
            id,
            priority,
            max_running,
            max_running_time_ms,
            max_failures,
            version,
        } => {
            if priority.is_none()
                && max_running.is_none()
                && max_running_time_ms.is_none()
                && max_failures.is_none()
            {
                bail!(
                    "nothing to change: give --priority, --max-running, --max-running-time-ms or --max-failures"
                );
            }
            let mut client = connect(ctx).await?;
            let request = EditJobRequest {
                id,
                version: version.version,
                priority,
                max_running_instances: max_running,
                max_running_time_ms,
                max_failures,
            };
            let job = job_of(client.edit(request).await?.into_inner().job)?;
            print_job_row(ctx.output, &job)?;
        }
        JobCommand::Delete { id, version } => {
            let mut client = connect(ctx).await?;
            let request = DeleteJobRequest {
                id: id.clone(),
                version: version.version,
            };
            client.delete(request).await?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!("deleted job {id}"))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({}))?,
            }
        }
        JobCommand::Scale { id, count, version } => {
            let mut client = connect(ctx).await?;
            let request = ScaleJobRequest {
                id,
                instance_count: count,
                version: version.version,
            };
            let job = job_of(client.scale(request).await?.into_inner().job)?;
            print_job_row(ctx.output, &job)?;
        }
        JobCommand::Restart {
            id,
            version,
            failed: true,
        } => return restart_failed(ctx, &id, version.version).await,
        JobCommand::Restart {
            id,
            version,
            failed: false,
        } => {
            let mut client = connect(ctx).await?;
            let request = RestartJobRequest {
                id,
                version: version.version,
            };
            let job = job_of(client.restart(request).await?.into_inner().job)?;
            print_job_row(ctx.output, &job)?;
        }
        JobCommand::Update(args) => return super::update::create(ctx, args).await,
        JobCommand::Logs { id, options } => return super::task::logs(ctx, id, None, options).await,
    }
    Ok(Outcome::Success)
}

/// A kill by itself of a job that had ended says so: nothing was killed.
fn note_if_ended(job: &Job) {
    // A kill answers with the job stopping (or, with nothing running,
    // killed); one that had ended by itself comes back as it ended, no
    // kill asked of it.
    let state = job.status.as_ref().map_or(0, |s| s.state);
    let asked = job.status.as_ref().is_some_and(|s| s.kill_requested);
    if !asked && JobState::try_from(state).is_ok_and(is_terminal_job_state) {
        eprintln!(
            "job {} already ended ({}): nothing to kill",
            job.id,
            name_of::<JobState>(state)
        );
    }
}

/// Most jobs one `job kill --selector/--owner/--mine` kills.
const MAX_BULK_KILL: usize = 1000;

/// Which jobs a bulk kill takes.
struct Selection {
    selector: Vec<(String, String)>,
    owner: Option<String>,
    pool: Option<String>,
}

/// Kills the active jobs `selection` matches, once confirmed: lists them,
/// then asks on the terminal unless `yes`; without a terminal and without
/// `yes`, refuses. Each is killed at the version it was listed with, so a
/// job changed meanwhile is not killed unseen.
async fn kill_selected(
    ctx: &Ctx,
    client: &mut Client,
    selection: Selection,
    yes: bool,
) -> Result<Outcome> {
    use std::io::{BufRead, IsTerminal, Write};
    let active = [JobState::Initialized, JobState::Pending, JobState::Running];
    let args = QueryArgs {
        pool: selection.pool,
        states: active.to_vec(),
        name: None,
        owner: selection.owner.clone(),
        mine: false,
        labels: selection.selector,
        limit: Some(MAX_BULK_KILL as u32 + 1),
        quiet: false,
        sort: JobOrder::Created,
    };
    let jobs = query_pages(client, args, Some(MAX_BULK_KILL + 1)).await?;
    if jobs.len() > MAX_BULK_KILL {
        bail!(
            "more than {MAX_BULK_KILL} active jobs match: narrow the selection (--selector, --owner, --pool)"
        );
    }
    if jobs.is_empty() {
        eprintln!("no active job matches: nothing to kill");
        return Ok(Outcome::Success);
    }
    eprintln!("{} active job(s) match:", jobs.len());
    eprint!("{}", job_table(&jobs, false));
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            bail!(
                "refusing to kill {} job(s) without confirmation: stdin is not a terminal (pass --yes to kill them)",
                jobs.len()
            );
        }
        eprint!("Kill these {} job(s)? [y/N] ", jobs.len());
        std::io::stderr().flush()?;
        let mut answer = String::new();
        stdin.lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            eprintln!("nothing killed");
            return Ok(Outcome::Success);
        }
    }
    let mut failed = 0usize;
    for listed in &jobs {
        let request = KillJobRequest {
            id: listed.id.clone(),
            version: listed.version,
        };
        match client.kill(request).await {
            Ok(answer) => {
                let job = job_of(answer.into_inner().job)?;
                note_if_ended(&job);
                print_job_row(ctx.output, &job)?;
            }
            Err(status) => {
                failed += 1;
                eprintln!("job {}: not killed: {}", listed.id, status.message());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} job(s) were not killed", jobs.len());
    }
    Ok(Outcome::Success)
}

async fn connect(ctx: &Ctx) -> Result<Client> {
    Ok(JobServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES))
}

fn job_of(job: Option<Job>) -> Result<Job> {
    job.context("the server returned no job")
}

async fn get(client: &mut Client, id: &str) -> Result<Job> {
    let request = GetJobRequest { id: id.to_owned() };
    job_of(client.get(request).await?.into_inner().job)
}

/// Every page of the query, up to `--limit` jobs.
/// The caller as jobs' owners name it: its token's name on a secure
/// server (which records that as the owner), else `$USER`.
async fn me(ctx: &Ctx) -> Result<String> {
    let resolved = crate::settings::resolve(&ctx.options, &crate::settings::process_env)?;
    if resolved.security.ca.is_none() {
        return std::env::var("USER")
            .context("--mine: $USER is not set (and the server is not secure)");
    }
    let token =
        peloton_proto::v1::access_service_client::AccessServiceClient::new(ctx.connect().await?)
            .who_am_i(peloton_proto::v1::WhoAmIRequest {})
            .await?
            .into_inner()
            .token
            .context("the server returned no token")?;
    Ok(token.name)
}

/// Creates the job of `spec` and prints it (with `quiet`, its id only);
/// with `wait`, follows it to its end (see `--wait`).
async fn submit(ctx: &Ctx, mut spec: JobSpec, wait: bool, quiet: bool) -> Result<Outcome> {
    // A spec without an owner is the user's (a secure server records the
    // caller's token instead, whatever the spec says).
    if spec.owner.is_empty() {
        spec.owner = std::env::var("USER").unwrap_or_default();
    }
    let mut client = connect(ctx).await?;
    let request = CreateJobRequest { spec: Some(spec) };
    let created = client
        .create(request)
        .await
        .map_err(crate::spec::in_file_terms)?;
    let job = job_of(created.into_inner().job)?;
    if quiet {
        print_out(&job.id)?;
    } else if !wait {
        print_job(ctx.output, &job)?;
    }
    if !wait {
        return Ok(Outcome::Success);
    }
    let note = format!(
        "interrupted; job {} keeps running (peloton job get {})",
        job.id, job.id
    );
    let Some(job) = super::until_interrupted(wait_for_job(&mut client, &job), note).await? else {
        return Ok(Outcome::Interrupted);
    };
    if !quiet {
        print_job(ctx.output, &job)?;
    }
    let state = job.status.as_ref().map(|s| s.state);
    if state == Some(JobState::Succeeded.into()) {
        return Ok(Outcome::Success);
    }
    // Why, on stderr: the instances that did not succeed, and how their
    // last runs ended.
    let mut tasks = super::task::client(ctx).await?;
    let failed = [TaskState::Failed, TaskState::Lost, TaskState::Killed].map(i32::from);
    let ended = super::task::list_tasks(&mut tasks, &job.id, &failed).await?;
    eprint!("{}", why_not_succeeded(&job, &ended));
    Ok(Outcome::JobNotSucceeded)
}

/// Instances a failed `--wait` explains at most.
const MAX_EXPLAINED: usize = 5;

/// Why `job` did not succeed, from its instances that did not: one line
/// each (state, exit, host, reason), the first few, and how many more.
fn why_not_succeeded(job: &Job, ended: &[peloton_proto::v1::Task]) -> String {
    let state = name_of::<JobState>(job.status.as_ref().map_or(0, |s| s.state));
    let mut out = format!("job {} {state}", job.id);
    if ended.is_empty() {
        out.push('\n');
        return out;
    }
    out.push_str(&format!(": {} instance(s) did not succeed\n", ended.len()));
    for t in ended.iter().take(MAX_EXPLAINED) {
        let run = t.current.clone().unwrap_or_default();
        out.push_str(&format!(
            "  instance {}: {} (run {}, exit {}, host {}): {}\n",
            t.instance,
            name_of::<TaskState>(run.state),
            run.run_id,
            run.exit_code,
            or_dash(&run.host),
            super::task::reason(t)
        ));
    }
    if ended.len() > MAX_EXPLAINED {
        out.push_str(&format!(
            "  ... and {} more (peloton task list {} --state failed)\n",
            ended.len() - MAX_EXPLAINED,
            job.id
        ));
    }
    out
}

/// `job restart --failed`: the instances whose last run failed or was
/// lost run again (one call, at the job's version read first, so a job
/// changed meanwhile is refused as stale, not half restarted).
async fn restart_failed(ctx: &Ctx, id: &str, version: u64) -> Result<Outcome> {
    let mut jobs = connect(ctx).await?;
    let job = get(&mut jobs, id).await?;
    let mut tasks = super::task::client(ctx).await?;
    let failed = [TaskState::Failed, TaskState::Lost].map(i32::from);
    let instances: Vec<u32> = super::task::list_tasks(&mut tasks, &job.id, &failed)
        .await?
        .iter()
        .map(|t| t.instance)
        .collect();
    if instances.is_empty() {
        eprintln!(
            "job {}: no instance's last run failed: nothing to restart",
            job.id
        );
        print_job_row(ctx.output, &job)?;
        return Ok(Outcome::Success);
    }
    let version = if version == 0 { job.version } else { version };
    tasks
        .restart(peloton_proto::v1::RestartTaskRequest {
            job_id: job.id.clone(),
            instances: instances.clone(),
            job_version: version,
        })
        .await?;
    let job = get(&mut jobs, &job.id).await?;
    match ctx.output {
        OutputFormat::Table => print_out(&format!(
            "restarting {} failed instance(s) of job {}: {}",
            instances.len(),
            job.id,
            instances
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ))?,
        OutputFormat::Json | OutputFormat::Yaml => {
            print_json(&json!({ "job": job_json(&job), "instances": instances }))?;
        }
    }
    Ok(Outcome::Success)
}

/// `peloton run`: the job of a command line (see [`run_spec`]), submitted
/// as `job create` submits one.
pub(super) async fn run_command(ctx: &Ctx, args: RunArgs) -> Result<Outcome> {
    let pool = match &args.pool {
        Some(pool) => pool.clone(),
        None => crate::settings::default_pool(&ctx.options, &crate::settings::process_env)?
            .ok_or_else(|| {
                crate::error::UsageError(
                    "--pool: no pool given, and neither PELOTON_POOL nor the config file's `pool` \
                     names one"
                        .into(),
                )
            })?,
    };
    // The owner is filled in as for any spec without one (`submit`).
    let spec = run_spec(&args, &pool, "")?;
    submit(ctx, spec, args.wait, args.quiet).await
}

/// The batch job `peloton run` submits: `args.instances` instances of the
/// command in `pool`, each with the resources and environment given. It
/// goes through the spec file's checks and defaults (as the JSON of a
/// spec file, which YAML reads).
pub fn run_spec(args: &RunArgs, pool: &str, owner: &str) -> Result<JobSpec> {
    let (command, rest) = args
        .command
        .split_first()
        .context("COMMAND: the command to run, after `--`")?;
    let name = match &args.name {
        Some(name) => name.clone(),
        None => default_run_name(command),
    };
    let env: serde_json::Map<String, serde_json::Value> = args
        .env
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut file = json!({
        "name": name,
        "type": "batch",
        "pool": pool,
        "instances": args.instances,
        "task": {
            "command": command,
            "args": rest,
            "env": env,
            "resources": {"cpu": args.cpu, "memory_mb": args.memory_mb, "gpu": args.gpu},
        },
    });
    if !owner.is_empty() {
        file["owner"] = json!(owner);
    }
    let loaded = crate::spec::parse_job_file(&file.to_string(), "the command line")?;
    Ok(loaded.value.into_proto())
}

/// `peloton run`'s name for a job it was given no name for: the command's
/// file name and six random hex digits (`sleep-3fa2b1`), as names are
/// unique among a pool's unfinished jobs and the same command may run many
/// times at once.
fn default_run_name(command: &str) -> String {
    let base = std::path::Path::new(command)
        .file_name()
        .map_or_else(|| command.to_string(), |n| n.to_string_lossy().into_owned());
    // A name has no '/' (it names a job as POOL/NAME).
    let base = base.replace('/', "_");
    let tail = uuid::Uuid::new_v4().simple().to_string();
    format!("{base}-{}", &tail[..6])
}

/// The jobs `args` asks for, in its order: by creation time (with
/// `--limit`, the newest N: every page is read first), or by id (with
/// `--limit`, the first N ids).
async fn query(client: &mut Client, args: QueryArgs) -> Result<Vec<Job>> {
    let by_time = args.sort == JobOrder::Created;
    let keep = args.limit.map(|n| n as usize);
    let mut jobs = query_pages(client, args, if by_time { None } else { keep }).await?;
    if by_time {
        let created = |j: &Job| j.status.as_ref().map_or(0, |s| s.created_at_ms);
        jobs.sort_by(|a, b| created(a).cmp(&created(b)).then_with(|| a.id.cmp(&b.id)));
        if let Some(n) = keep {
            jobs.drain(..jobs.len().saturating_sub(n));
        }
    }
    Ok(jobs)
}

async fn query_pages(
    client: &mut Client,
    args: QueryArgs,
    limit: Option<usize>,
) -> Result<Vec<Job>> {
    let labels: HashMap<String, String> = args.labels.into_iter().collect();
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let page_size = match limit {
            Some(limit) => u32::try_from(limit - jobs.len()).unwrap_or(MAX_PAGE_SIZE),
            None => MAX_PAGE_SIZE,
        };
        let request = QueryJobsRequest {
            pool: args.pool.clone().unwrap_or_default(),
            states: args.states.iter().map(|&s| s.into()).collect(),
            name: args.name.clone().unwrap_or_default(),
            owner: args.owner.clone().unwrap_or_default(),
            labels: labels.clone(),
            page_size: page_size.min(MAX_PAGE_SIZE),
            page_token: page_token.clone(),
        };
        let page = client.query(request).await?.into_inner();
        jobs.extend(page.jobs);
        if let Some(limit) = limit
            && jobs.len() >= limit
        {
            jobs.truncate(limit);
            break;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        if page.next_page_token == page_token {
            bail!("the server returned the same page token twice; stopping");
        }
        page_token = page.next_page_token;
    }
    Ok(jobs)
}

/// The progress bar of `job create --wait`: its total is the job's
/// instance count from the first frame on (not 0/0 until the first poll).
fn job_bar(created: &Job) -> Result<ProgressBar> {
    let instances = created.spec.as_ref().map_or(0, |s| s.instance_count);
    let bar = ProgressBar::new(u64::from(instances));
    let style =
        ProgressStyle::with_template("{spinner} {elapsed:>4} [{bar:30}] {pos}/{len} done  {msg}")
            .context("progress bar template")?
            .progress_chars("=> ");
    bar.set_style(style);
    Ok(bar)
}

/// Polls the job until it is terminal, showing its tasks' states on a
/// progress bar (on stderr, hidden when stderr is not a terminal).
async fn wait_for_job(client: &mut Client, created: &Job) -> Result<Job> {
    let id = created.id.as_str();
    let bar = job_bar(created)?;
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut interval = tokio::time::interval(POLL_INTERVAL);
    loop {
        interval.tick().await;
        let job = match get(client, id).await {
            Ok(job) => job,
            Err(err) => {
                bar.abandon();
                return Err(err);
            }
        };
        let status = job.status.clone().unwrap_or_default();
        let instances = job.spec.as_ref().map_or(0, |s| s.instance_count);
        let done: u32 = status
            .task_counts
            .iter()
            .filter(|c| {
                [TaskState::Succeeded, TaskState::Failed, TaskState::Killed]
                    .iter()
                    .any(|&s| c.state == s as i32)
            })
            .map(|c| c.count)
            .sum();
        bar.set_length(u64::from(instances));
        bar.set_position(u64::from(done));
        bar.set_message(format!(
            "job {}; tasks: {}",
            name_of::<JobState>(status.state),
            fmt_task_counts(&status.task_counts)
        ));
        if JobState::try_from(status.state).is_ok_and(is_terminal_job_state) {
            bar.finish_and_clear();
            return Ok(job);
        }
    }
}

/// `job get -o yaml`: the job's spec as a spec file, which `job create`
/// and `job update` take back, after comment lines naming the job.
fn spec_file(job: &Job) -> Result<String> {
    let spec = job.spec.as_ref().context("the server returned no spec")?;
    let file = crate::spec::JobFile::from_proto(spec);
    let yaml = serde_norway::to_string(&file).context("writing the spec as YAML")?;
    let state = name_of::<JobState>(job.status.as_ref().map_or(0, |s| s.state));
    Ok(format!(
        "# job {} (version {}, {state}): its spec. `peloton job create FILE` submits\n\
         # it again; `peloton job update {} FILE` rolls a service to it (a batch\n\
         # job's priority, limits and running cap are edited so).\n{yaml}",
        job.id, job.version, job.id
    ))
}

/// `peloton cron ...`: a cron job's tick now, suspend, resume.
pub(super) async fn cron(ctx: &Ctx, command: crate::cli::CronCommand) -> Result<Outcome> {
    use crate::cli::CronCommand;
    use peloton_proto::v1::{CronActionKind, CronActionRequest};
    let (id, version, action) = match command {
        CronCommand::RunNow { job, version } => (job, version, CronActionKind::RunNow),
        CronCommand::Suspend { job, version } => (job, version, CronActionKind::Suspend),
        CronCommand::Resume { job, version } => (job, version, CronActionKind::Resume),
    };
    let mut client = connect(ctx).await?;
    let before = match action {
        CronActionKind::RunNow => ticks_of(&get(&mut client, &id).await?),
        _ => Vec::new(),
    };
    let request = CronActionRequest {
        id,
        version: version.version,
        action: action as i32,
    };
    let job = job_of(client.cron_action(request).await?.into_inner().job)?;
    if action == CronActionKind::RunNow && ctx.output == OutputFormat::Table {
        // The tick's job: the one the cron job did not have before.
        let now = get(&mut client, &job.id).await?;
        let started = ticks_of(&now).into_iter().find(|t| !before.contains(t));
        if let Some(tick) = started {
            print_out(&tick)?;
            return Ok(Outcome::Success);
        }
    }
    print_job_row(ctx.output, &job)?;
    Ok(Outcome::Success)
}

/// A cron job's ticks' job ids.
fn ticks_of(job: &Job) -> Vec<String> {
    job.status
        .as_ref()
        .and_then(|s| s.cron.as_ref())
        .map(|c| c.ticks.iter().map(|t| t.job_id.clone()).collect())
        .unwrap_or_default()
}

fn print_job(output: OutputFormat, job: &Job) -> std::io::Result<()> {
    match output {
        OutputFormat::Table => print_out(&job_details(job)),
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({"job": job_json(job)})),
    }
}

fn print_job_row(output: OutputFormat, job: &Job) -> std::io::Result<()> {
    match output {
        OutputFormat::Table => print_out(&job_table(std::slice::from_ref(job), false)),
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({"job": job_json(job)})),
    }
}

/// Jobs' rows; `wide` (`-o wide`) adds their priority, version, host
/// pool, completion time and labels.
fn job_table(jobs: &[Job], wide: bool) -> String {
    let mut columns = vec![
        ("ID", Align::Left),
        ("NAME", Align::Left),
        ("OWNER", Align::Left),
        ("TYPE", Align::Left),
        ("POOL", Align::Left),
        ("INSTANCES", Align::Right),
        ("STATE", Align::Left),
        ("TASKS", Align::Left),
        ("CREATED", Align::Left),
        ("START (EST.)", Align::Left),
    ];
    if wide {
        columns.extend([
            ("PRIORITY", Align::Right),
            ("VERSION", Align::Right),
            ("HOST POOL", Align::Left),
            ("COMPLETED", Align::Left),
            ("LABELS", Align::Left),
        ]);
    }
    let mut table = Table::new(&columns);
    for job in jobs {
        let spec = job.spec.clone().unwrap_or_default();
        let status = job.status.clone().unwrap_or_default();
        let mut row = vec![
            job.id.clone(),
            or_dash(&spec.name),
            or_dash(&spec.owner),
            name_of::<JobType>(spec.r#type),
            or_dash(&spec.pool),
            spec.instance_count.to_string(),
            name_of::<JobState>(status.state),
            fmt_task_counts(&status.task_counts),
            fmt_time_ms(status.created_at_ms),
            match &status.forecast {
                Some(f) if f.start_ms > 0 => format!("~{}", fmt_time_ms(f.start_ms)),
                Some(_) => "?".to_owned(),
                None => "-".to_owned(),
            },
        ];
        if wide {
            let mut labels: Vec<String> = spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            labels.sort_unstable();
            row.extend([
                spec.sla.as_ref().map_or(0, |s| s.priority).to_string(),
                job.version.to_string(),
                or_dash(&spec.host_pool),
                fmt_time_ms(status.completed_at_ms),
                or_dash(&labels.join(",")),
            ]);
        }
        table.row(row);
    }
    table.render()
}

fn job_details(job: &Job) -> String {
    let spec = job.spec.clone().unwrap_or_default();
    let status = job.status.clone().unwrap_or_default();
    let sla = spec.sla.unwrap_or_default();
    let task = spec.default_task.unwrap_or_default();
    let command = if task.shell.is_empty() {
        std::iter::once(task.command.as_str())
            .chain(task.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        format!("sh -c {:?}", task.shell)
    };
    let mut fields = vec![
        ("ID", job.id.clone()),
        ("NAME", or_dash(&spec.name)),
        ("OWNER", or_dash(&spec.owner)),
        ("TYPE", name_of::<JobType>(spec.r#type)),
        ("POOL", or_dash(&spec.pool)),
        ("STATE", name_of::<JobState>(status.state)),
        ("INSTANCES", spec.instance_count.to_string()),
        ("TASKS", fmt_task_counts(&status.task_counts)),
        ("COMMAND", or_dash(command.trim())),
        ("RESOURCES", fmt_resources(task.resources.as_ref())),
        ("USED", fmt_usage(status.used.as_ref())),
        ("ESTIMATED START", fmt_forecast(status.forecast.as_ref())),
        ("PLACEMENT", name_of::<PlacementStrategy>(spec.placement)),
        ("PRIORITY", sla.priority.to_string()),
        ("PREEMPTIBLE", sla.preemptible.to_string()),
    ];
    if sla.min_running_instances > 1 {
        fields.push(("GANG SIZE", sla.min_running_instances.to_string()));
    }
    if !spec.host_pool.is_empty() {
        fields.push(("HOST POOL", spec.host_pool.clone()));
    }
    if spec.after.is_some() {
        fields.push(("AFTER", fmt_dependencies(spec.after.as_ref())));
    }
    if status.waiting_for.is_some() {
        fields.push(("WAITING FOR", fmt_dependencies(status.waiting_for.as_ref())));
    }
    if let Some(schedule) = &spec.schedule {
        fields.push(("SCHEDULE", crate::output::fmt_schedule(schedule)));
    }
    if let Some(cron) = &status.cron {
        fields.push((
            "NEXT TICK",
            if cron.suspended {
                "- (suspended; `cron resume` resumes it)".to_owned()
            } else if cron.next_tick_ms == 0 {
                "- (killed; `job restart` resumes it)".to_owned()
            } else {
                fmt_time_ms(cron.next_tick_ms)
            },
        ));
        let ticks: Vec<String> = cron
            .ticks
            .iter()
            .map(|t| format!("{} {}", fmt_time_ms(t.tick_ms), t.job_id))
            .collect();
        fields.push((
            "TICKS",
            if ticks.is_empty() {
                "-".to_owned()
            } else {
                ticks.join("; ")
            },
        ));
        if !cron.last_skip.is_empty() {
            fields.push(("LAST SKIP", cron.last_skip.clone()));
        }
    }
    if !task.constraint.is_empty() {
        fields.push(("CONSTRAINT", task.constraint));
    }
    if !spec.secrets.is_empty() {
        let secrets: Vec<String> = spec
            .secrets
            .iter()
            .map(|s| format!("{} ({} B)", s.name, s.size))
            .collect();
        fields.push(("SECRETS", secrets.join(", ")));
    }
    if !spec.overrides.is_empty() {
        let instances: Vec<String> = spec
            .overrides
            .iter()
            .map(|o| o.instance.to_string())
            .collect();
        fields.push(("OVERRIDES", format!("instances {}", instances.join(", "))));
    }
    fields.extend([
        ("LABELS", fmt_map(&spec.labels)),
        ("CREATED", fmt_time_ms(status.created_at_ms)),
        ("COMPLETED", fmt_time_ms(status.completed_at_ms)),
        ("VERSION", job.version.to_string()),
    ]);
    render_fields(&fields)
}

/// A plan in words and a table of its instances.
fn plan_table(plan: &PlanJobResponse) -> String {
    let start = if plan.start_ms == 0 {
        "not all foreseen (see WHY NOT)".to_owned()
    } else {
        format!("~{}", fmt_time_ms(plan.start_ms))
    };
    let runtime = if plan.expected_runtime_ms == 0 {
        "unknown (runs until it ends or is stopped)".to_owned()
    } else {
        format!(
            "{} s ({})",
            plan.expected_runtime_ms / 1000,
            plan.expected_runtime_source
        )
    };
    let mut out = render_fields(&[
        ("ALL STARTED BY", start),
        ("EXPECTED RUNTIME", runtime),
        ("PLANNED AT", fmt_time_ms(plan.made_at_ms)),
    ]);
    let mut table = Table::new(&[
        ("INSTANCE", Align::Right),
        ("START", Align::Left),
        ("EARLIEST", Align::Left),
        ("HOST", Align::Left),
        ("QUEUE", Align::Right),
        ("WHY NOT", Align::Left),
    ]);
    for x in &plan.instances {
        table.row(vec![
            x.instance.to_string(),
            fmt_time_ms(x.start_ms),
            fmt_time_ms(x.earliest_ms),
            or_dash(&x.host),
            match x.queue_position {
                0 => "-".to_owned(),
                n => n.to_string(),
            },
            or_dash(&x.why_not),
        ]);
    }
    out.push('\n');
    out.push_str(&table.render());
    out.push('\n');
    if plan.victims.is_empty() {
        out.push_str("PREEMPTS: none\n");
        return out;
    }
    out.push_str("PREEMPTS:\n");
    let mut victims = Table::new(&[
        ("JOB", Align::Left),
        ("INSTANCE", Align::Right),
        ("POOL", Align::Left),
        ("HOST", Align::Left),
        ("PRIORITY", Align::Right),
        ("AT", Align::Left),
        ("WHY", Align::Left),
    ]);
    for v in &plan.victims {
        victims.row(vec![
            v.job_id.clone(),
            v.instance.to_string(),
            or_dash(&v.pool),
            or_dash(&v.host),
            v.priority.to_string(),
            fmt_time_ms(v.at_ms),
            or_dash(&v.reason),
        ]);
    }
    out.push_str(&victims.render());
    let total = plan.victims_total as usize;
    if total > plan.victims.len() {
        out.push_str(&format!("(the first {} of {total})\n", plan.victims.len()));
    }
    out
}

fn plan_json(plan: &PlanJobResponse) -> serde_json::Value {
    json!({
        "start_ms": plan.start_ms,
        "made_at_ms": plan.made_at_ms,
        "expected_runtime_ms": plan.expected_runtime_ms,
        "expected_runtime_source": plan.expected_runtime_source,
        "forecast_stopped": plan.forecast_stopped,
        "victims_total": plan.victims_total,
        "instances": plan.instances.iter().map(|x| json!({
            "instance": x.instance,
            "start_ms": x.start_ms,
            "earliest_ms": x.earliest_ms,
            "host": x.host,
            "queue_position": x.queue_position,
            "why_not": x.why_not,
        })).collect::<Vec<_>>(),
        "victims": plan.victims.iter().map(|v| json!({
            "job_id": v.job_id,
            "instance": v.instance,
            "pool": v.pool,
            "host": v.host,
            "priority": v.priority,
            "at_ms": v.at_ms,
            "reason": v.reason,
            "gang_mate": v.gang_mate,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn run_args(line: &[&str]) -> RunArgs {
        match crate::cli::Cli::try_parse_from(line)
            .expect("parses")
            .command
        {
            crate::cli::Command::Run(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_command_line_becomes_a_batch_job() {
        let args = run_args(&[
            "peloton",
            "run",
            "-n",
            "3",
            "--cpu",
            "2",
            "--mem",
            "512",
            "--gpu",
            "0.5",
            "-e",
            "A=1",
            "--",
            "/usr/bin/python3",
            "train.py",
            "--epochs",
            "3",
        ]);
        let spec = run_spec(&args, "/ml", "alice").expect("a spec");
        // Named after the command, with a random tail: names are unique
        // among a pool's unfinished jobs.
        let (base, tail) = spec.name.rsplit_once('-').expect("NAME-TAIL");
        assert_eq!(base, "python3");
        assert!(
            tail.len() == 6 && tail.bytes().all(|b| b.is_ascii_hexdigit()),
            "{}",
            spec.name
        );
        assert_ne!(
            run_spec(&args, "/ml", "alice").expect("a spec").name,
            spec.name
        );
        assert_eq!(spec.owner, "alice");
        assert_eq!(spec.pool, "/ml");
        assert_eq!(spec.instance_count, 3);
        assert_eq!(spec.r#type, JobType::Batch as i32);
        let task = spec.default_task.expect("task");
        assert_eq!(task.command, "/usr/bin/python3");
        assert_eq!(task.args, ["train.py", "--epochs", "3"]);
        assert_eq!(task.env.get("A").map(String::as_str), Some("1"));
        let r = task.resources.expect("resources");
        assert_eq!((r.cpu, r.memory_mb, r.gpu), (2.0, 512.0, 0.5));
        let named = run_args(&["peloton", "run", "--name", "x", "--", "true"]);
        assert_eq!(run_spec(&named, "/", "").expect("a spec").name, "x");
        // Bad amounts and no command are refused, naming the flag.
        let e = crate::cli::Cli::try_parse_from(["peloton", "run", "--cpu=-1", "--", "true"])
            .expect_err("negative cpu");
        assert!(e.to_string().contains("--cpu"), "{e}");
        assert!(crate::cli::Cli::try_parse_from(["peloton", "run", "--pool", "/"]).is_err());
    }

    #[test]
    fn the_progress_bar_shows_the_job_size_from_its_first_frame() {
        let job = Job {
            id: "j".to_owned(),
            spec: Some(JobSpec {
                instance_count: 4,
                ..JobSpec::default()
            }),
            ..Job::default()
        };
        let bar = job_bar(&job).expect("bar");
        assert_eq!(bar.length(), Some(4));
        assert_eq!(bar.position(), 0);
    }

    /// A plan shows whom it would preempt, in the table and in JSON, and
    /// says so when it preempts none.
    #[test]
    fn a_plan_shows_whom_it_would_preempt() {
        let mut plan = PlanJobResponse {
            instances: vec![peloton_proto::v1::PlannedInstance {
                instance: 0,
                host: "h1".to_owned(),
                queue_position: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(plan_table(&plan).ends_with("PREEMPTS: none\n"));
        assert_eq!(plan_json(&plan)["victims"], json!([]));
        plan.victims = vec![peloton_proto::v1::PlannedVictim {
            job_id: "batch-1".to_owned(),
            instance: 3,
            pool: "/batch".to_owned(),
            host: "h1".to_owned(),
            priority: 1,
            at_ms: 0,
            reason: "preempted: pool over its entitlement".to_owned(),
            gang_mate: false,
        }];
        let table = plan_table(&plan);
        let rows: Vec<&str> = table
            .lines()
            .skip_while(|l| *l != "PREEMPTS:")
            .skip(1)
            .collect();
        assert!(rows[0].starts_with("JOB"), "{table}");
        let cells: Vec<&str> = rows[1].split_whitespace().take(5).collect();
        assert_eq!(cells, ["batch-1", "3", "/batch", "h1", "1"], "{table}");
        assert!(rows[1].ends_with("preempted: pool over its entitlement"));
        assert_eq!(
            plan_json(&plan)["victims"][0],
            json!({
                "job_id": "batch-1",
                "instance": 3,
                "pool": "/batch",
                "host": "h1",
                "priority": 1,
                "at_ms": 0,
                "reason": "preempted: pool over its entitlement",
                "gang_mate": false,
            })
        );
    }
}
