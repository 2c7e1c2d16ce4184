//! `peloton job update` and `peloton update ...`: rolling updates of
//! services, with a progress bar until the update ends.

use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use peloton_proto::v1::update_service_client::UpdateServiceClient;
use peloton_proto::v1::{
    GetUpdateRequest, ListUpdatesRequest, Update, UpdateActionRequest, UpdateJobRequest,
    UpdateSpec, UpdateState,
};
use serde_json::{Value, json};

use super::{Ctx, Outcome};
use crate::channel::LeaderChannel;
use crate::cli::{UpdateArgs, UpdateCommand};
use crate::names::name_of;
use crate::output::{
    Align, OutputFormat, Table, fmt_time_ms, or_dash, print_json, print_out, render_fields,
};
use crate::spec::load_job_file;

/// How often the progress bar asks for the update.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

type Client = UpdateServiceClient<LeaderChannel>;

async fn connect(ctx: &Ctx) -> Result<Client> {
    Ok(UpdateServiceClient::new(ctx.connect().await?))
}

fn update_of(update: Option<Update>) -> Result<Update> {
    update.context("the server returned no update")
}

fn state_of(u: &Update) -> UpdateState {
    u.status
        .as_ref()
        .and_then(|s| UpdateState::try_from(s.state).ok())
        .unwrap_or(UpdateState::Unknown)
}

fn is_terminal(state: UpdateState) -> bool {
    matches!(
        state,
        UpdateState::Succeeded
            | UpdateState::Failed
            | UpdateState::RolledBack
            | UpdateState::Aborted
    )
}

/// `peloton job update ID SPEC.yaml`.
pub(super) async fn create(ctx: &Ctx, args: UpdateArgs) -> Result<Outcome> {
    let loaded = load_job_file(&args.spec)?;
    super::print_notes(&args.spec, &loaded.notes);
    let mut spec = loaded.value.into_proto();
    let secrets = crate::spec::load_secrets(&args.secrets)?;
    let keep_secrets = secrets.is_empty() && !args.clear_secrets && spec.secrets.is_empty();
    if !secrets.is_empty() {
        spec.secrets = secrets;
    }
    // A file that names no pool (a Peloton file without `respoolID`, or a
    // native file without `pool`) updates the job in the pool it is in.
    if keep_secrets || spec.pool.is_empty() {
        let job =
            peloton_proto::v1::job_service_client::JobServiceClient::new(ctx.connect().await?)
                .get(peloton_proto::v1::GetJobRequest {
                    id: args.id.clone(),
                })
                .await?
                .into_inner()
                .job
                .context("the server returned no job")?;
        let current = job.spec.unwrap_or_default();
        if spec.pool.is_empty() {
            spec.pool = current.pool;
        }
        if keep_secrets {
            // Keep the job's secrets: name each without a value.
            spec.secrets = current
                .secrets
                .into_iter()
                .map(|s| peloton_proto::v1::Secret {
                    name: s.name,
                    value: Vec::new(),
                    size: 0,
                })
                .collect();
        }
    }
    let mut client = connect(ctx).await?;
    let request = UpdateJobRequest {
        job_id: args.id,
        version: args.version.version,
        spec: Some(spec),
        update: Some(UpdateSpec {
            batch_size: args.batch_size,
            max_instance_retries: args.max_instance_retries,
            max_failed_instances: args.max_failed_instances,
            rollback_on_failure: args.rollback_on_failure,
            start_paused: args.paused,
        }),
    };
    let answer = client
        .create(request)
        .await
        .map_err(crate::spec::in_file_terms)?
        .into_inner();
    let Some(update) = answer.update else {
        // A batch job is edited in place, not rolled (its spec may differ
        // only in what `job edit` changes).
        let job = answer.job.context("the server returned no job")?;
        match ctx.output {
            crate::output::OutputFormat::Table => crate::output::print_out(&format!(
                "edited batch job {} in place (version {}): its instances not started take the new values",
                job.id, job.version
            ))?,
            _ => crate::output::print_json(&serde_json::json!({
                "job": crate::output::job_json(&job)
            }))?,
        }
        return Ok(Outcome::Success);
    };
    if args.no_wait || args.paused {
        print_update(ctx.output, &update)?;
        return Ok(Outcome::Success);
    }
    let note = format!(
        "interrupted; update {} goes on (peloton update get {})",
        update.id, update.id
    );
    let Some(update) =
        super::until_interrupted(wait_for_update(&mut client, &update), note).await?
    else {
        return Ok(Outcome::Interrupted);
    };
    print_update(ctx.output, &update)?;
    if state_of(&update) == UpdateState::Succeeded {
        Ok(Outcome::Success)
    } else {
        Ok(Outcome::JobNotSucceeded)
    }
}

pub(super) async fn run(ctx: &Ctx, command: UpdateCommand) -> Result<Outcome> {
    let mut client = connect(ctx).await?;
    match command {
        UpdateCommand::Get { id } => {
            let u = update_of(
                client
                    .get(GetUpdateRequest { id })
                    .await?
                    .into_inner()
                    .update,
            )?;
            print_update(ctx.output, &u)?;
        }
        UpdateCommand::List { job } => {
            let updates = client
                .list(ListUpdatesRequest { job_id: job })
                .await?
                .into_inner()
                .updates;
            match ctx.output {
                OutputFormat::Table => print_out(&update_table(&updates))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "updates": updates.iter().map(update_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        UpdateCommand::Pause { id } => {
            let r = client.pause(UpdateActionRequest { id }).await?;
            print_update(ctx.output, &update_of(r.into_inner().update)?)?;
        }
        UpdateCommand::Resume { id } => {
            let r = client.resume(UpdateActionRequest { id }).await?;
            print_update(ctx.output, &update_of(r.into_inner().update)?)?;
        }
        UpdateCommand::Abort { id } => {
            let r = client.abort(UpdateActionRequest { id }).await?;
            print_update(ctx.output, &update_of(r.into_inner().update)?)?;
        }
        UpdateCommand::Rollback { id } => {
            let r = client.rollback(UpdateActionRequest { id }).await?;
            print_update(ctx.output, &update_of(r.into_inner().update)?)?;
        }
    }
    Ok(Outcome::Success)
}

/// Polls the update until it ends, showing updated instances on a progress
/// bar (on stderr, hidden when stderr is not a terminal).
async fn wait_for_update(client: &mut Client, created: &Update) -> Result<Update> {
    let id = created.id.as_str();
    // The total from the first frame on, not 0/0 until the first poll.
    let total = created.status.as_ref().map_or(0, |s| s.instances_total);
    let bar = ProgressBar::new(u64::from(total));
    let style = ProgressStyle::with_template(
        "{spinner} {elapsed:>4} [{bar:30}] {pos}/{len} updated  {msg}",
    )
    .context("progress bar template")?
    .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut interval = tokio::time::interval(POLL_INTERVAL);
    loop {
        interval.tick().await;
        let request = GetUpdateRequest { id: id.to_owned() };
        let update = match client.get(request).await {
            Ok(r) => update_of(r.into_inner().update)?,
            Err(err) => {
                bar.abandon();
                return Err(err.into());
            }
        };
        let status = update.status.clone().unwrap_or_default();
        bar.set_length(u64::from(status.instances_total));
        bar.set_position(u64::from(status.instances_done));
        bar.set_message(format!(
            "{}; moving {:?}; failed {:?}",
            name_of::<UpdateState>(status.state),
            status.instances_in_progress,
            status.instances_failed
        ));
        if is_terminal(state_of(&update)) {
            bar.finish_and_clear();
            return Ok(update);
        }
    }
}

pub fn update_json(u: &Update) -> Value {
    let spec = u.spec.unwrap_or_default();
    let status = u.status.clone().unwrap_or_default();
    json!({
        "id": u.id,
        "job_id": u.job_id,
        "from_version": u.from_version,
        "to_version": u.to_version,
        "spec": {
            "batch_size": spec.batch_size,
            "max_instance_retries": spec.max_instance_retries,
            "max_failed_instances": spec.max_failed_instances,
            "rollback_on_failure": spec.rollback_on_failure,
            "start_paused": spec.start_paused,
        },
        "status": {
            "state": name_of::<UpdateState>(status.state),
            "paused_from": if status.paused_from == 0 {
                Value::Null
            } else {
                Value::String(name_of::<UpdateState>(status.paused_from))
            },
            "instances_total": status.instances_total,
            "instances_done": status.instances_done,
            "instances_in_progress": status.instances_in_progress,
            "instances_failed": status.instances_failed,
            "instances_failed_rolling_back": status.instances_failed_rolling_back,
            "created_at_ms": status.created_at_ms,
            "completed_at_ms": status.completed_at_ms,
            "reason": status.reason,
        },
    })
}

fn print_update(output: OutputFormat, u: &Update) -> std::io::Result<()> {
    match output {
        OutputFormat::Table => {
            let status = u.status.clone().unwrap_or_default();
            let spec = u.spec.unwrap_or_default();
            print_out(&render_fields(&[
                ("UPDATE", u.id.clone()),
                ("JOB", u.job_id.clone()),
                ("STATE", name_of::<UpdateState>(status.state)),
                (
                    "VERSIONS",
                    format!("{} -> {}", u.from_version, u.to_version),
                ),
                (
                    "UPDATED",
                    format!("{}/{}", status.instances_done, status.instances_total),
                ),
                ("MOVING", format!("{:?}", status.instances_in_progress)),
                ("FAILED", format!("{:?}", status.instances_failed)),
                (
                    "FAILED BACK",
                    format!("{:?}", status.instances_failed_rolling_back),
                ),
                ("BATCH SIZE", spec.batch_size.to_string()),
                ("CREATED", fmt_time_ms(status.created_at_ms)),
                ("COMPLETED", fmt_time_ms(status.completed_at_ms)),
                ("REASON", or_dash(&status.reason)),
            ]))
        }
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({"update": update_json(u)})),
    }
}

fn update_table(updates: &[Update]) -> String {
    let mut table = Table::new(&[
        ("UPDATE", Align::Left),
        ("STATE", Align::Left),
        ("VERSIONS", Align::Left),
        ("UPDATED", Align::Right),
        ("FAILED", Align::Right),
        ("CREATED", Align::Left),
    ]);
    for u in updates {
        let status = u.status.clone().unwrap_or_default();
        table.row(vec![
            u.id.clone(),
            name_of::<UpdateState>(status.state),
            format!("{} -> {}", u.from_version, u.to_version),
            format!("{}/{}", status.instances_done, status.instances_total),
            status.instances_failed.len().to_string(),
            fmt_time_ms(status.created_at_ms),
        ]);
    }
    table.render()
}
