//! `peloton volume list|get|delete`: the persistent volumes of stateful
//! instances.

use anyhow::{Context, Result};
use peloton_proto::v1::volume_service_client::VolumeServiceClient;
use peloton_proto::v1::{DeleteVolumeRequest, GetVolumeRequest, ListVolumesRequest, Volume};
use serde_json::{Value, json};

use super::{Ctx, Outcome};
use crate::cli::VolumeCommand;
use crate::output::{Align, OutputFormat, Table, fmt_time_ms, print_json, print_out};

pub(super) async fn run(ctx: &Ctx, command: VolumeCommand) -> Result<Outcome> {
    let mut client = VolumeServiceClient::new(ctx.connect().await?);
    match command {
        VolumeCommand::List { job, host } => {
            let volumes = client
                .list(ListVolumesRequest {
                    job_id: job.unwrap_or_default(),
                    host: host.unwrap_or_default(),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .volumes;
            match ctx.output {
                OutputFormat::Table => print_out(&volume_table(&volumes))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "volumes": volumes.iter().map(volume_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        VolumeCommand::Get { id } => {
            let v = client
                .get(GetVolumeRequest { id })
                .await?
                .into_inner()
                .volume
                .context("the server returned no volume")?;
            match ctx.output {
                OutputFormat::Table => print_out(&volume_table(std::slice::from_ref(&v)))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&volume_json(&v))?,
            }
        }
        VolumeCommand::Delete { id } => {
            client
                .delete(DeleteVolumeRequest { id: id.clone() })
                .await?;
            match ctx.output {
                OutputFormat::Table => println!("volume {id} deleted"),
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({ "deleted": id }))?,
            }
        }
    }
    Ok(Outcome::Success)
}

fn volume_json(v: &Volume) -> Value {
    json!({
        "id": v.id,
        "job_id": v.job_id,
        "instance": v.instance,
        "host": v.host,
        "size_mb": v.size_mb,
        "path": v.path,
        "in_use": v.in_use,
        "created_at_ms": v.created_at_ms,
    })
}

fn volume_table(volumes: &[Volume]) -> String {
    let mut table = Table::new(&[
        ("VOLUME", Align::Left),
        ("JOB", Align::Left),
        ("INSTANCE", Align::Right),
        ("HOST", Align::Left),
        ("SIZE_MB", Align::Right),
        ("PATH", Align::Left),
        ("IN_USE", Align::Left),
        ("CREATED", Align::Left),
    ]);
    for v in volumes {
        table.row(vec![
            v.id.clone(),
            v.job_id.clone(),
            v.instance.to_string(),
            v.host.clone(),
            v.size_mb.to_string(),
            v.path.clone(),
            if v.in_use { "yes" } else { "no" }.to_string(),
            fmt_time_ms(v.created_at_ms),
        ]);
    }
    table.render()
}
