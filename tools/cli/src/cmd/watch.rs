//! `peloton watch`: the event stream, one line per event.

use anyhow::{Context, Result, bail};
use peloton_proto::v1::watch_service_client::WatchServiceClient;
use peloton_proto::v1::{Event, JobState, TaskState, WatchRequest, event};

use super::{Ctx, Outcome};
use crate::cli::WatchArgs;
use crate::names::name_of;
use crate::output::{OutputFormat, event_json, fmt_time_ms, or_dash, print_out};

pub(super) async fn run(ctx: &Ctx, args: WatchArgs) -> Result<Outcome> {
    let mut client = WatchServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
    let request = WatchRequest {
        // 0: the API's "from now".
        from_revision: args.from.unwrap_or(0),
        job_id: args.job.unwrap_or_default(),
    };
    let mut stream = client.watch(request).await?.into_inner();
    loop {
        let message = tokio::select! {
            message = stream.message() => message?,
            // Ctrl-C is how a watch normally ends.
            interrupted = tokio::signal::ctrl_c() => {
                interrupted.context("listening for Ctrl-C")?;
                return Ok(Outcome::Success);
            }
        };
        let Some(response) = message else {
            bail!("the server ended the watch stream");
        };
        let mut lines = String::new();
        for event in &response.events {
            let line = match ctx.output {
                OutputFormat::Table => event_line(event),
                OutputFormat::Json | OutputFormat::Yaml => event_json(event).to_string(),
            };
            lines.push_str(&line);
            lines.push('\n');
        }
        if !lines.is_empty() {
            print_out(&lines)?;
        }
    }
}

/// `REVISION  TIME  job ID STATE` or `REVISION  TIME  task ID/INSTANCE run N STATE on HOST: REASON`.
fn event_line(event: &Event) -> String {
    let head = format!("{:>8}  {}", event.revision, fmt_time_ms(event.time_ms));
    match &event.kind {
        Some(event::Kind::Job(job)) => {
            let mut line = format!(
                "{head}  job   {}  {}",
                job.job_id,
                name_of::<JobState>(job.state)
            );
            if job.deleted {
                // "deleted" by a user, or "retention" once its time is up.
                line.push_str("  deleted");
                if !job.reason.is_empty() && job.reason != "deleted" {
                    line.push_str(&format!(" ({})", job.reason));
                }
            }
            line
        }
        Some(event::Kind::Task(task)) => {
            let mut line = format!(
                "{head}  task  {}/{}  run {}  {}  {}",
                task.job_id,
                task.instance,
                task.run_id,
                name_of::<TaskState>(task.state),
                or_dash(&task.host)
            );
            if !task.reason.is_empty() {
                line.push_str("  ");
                line.push_str(&task.reason);
            }
            line
        }
        None => format!("{head}  (unknown event)"),
    }
}
