//! `peloton hostpool ...`: host pools.

use anyhow::Result;
use peloton_proto::v1::host_pool_service_client::HostPoolServiceClient;
use peloton_proto::v1::{
    CreateHostPoolRequest, DeleteHostPoolRequest, HostPool, ListHostPoolsRequest, MoveHostsRequest,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::cli::HostPoolCommand;
use crate::output::{Align, OutputFormat, Table, print_json, print_out};

pub(super) async fn run(ctx: &Ctx, command: HostPoolCommand) -> Result<Outcome> {
    let mut client = HostPoolServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
    match command {
        HostPoolCommand::Create { name } => {
            let pool = client
                .create(CreateHostPoolRequest { name })
                .await?
                .into_inner()
                .pool
                .unwrap_or_default();
            match ctx.output {
                OutputFormat::Table => print_out(&format!("created host pool {}", pool.name))?,
                OutputFormat::Json | OutputFormat::Yaml => {
                    print_json(&json!({"pool": pool_json(&pool)}))?;
                }
            }
        }
        HostPoolCommand::Delete { name } => {
            client
                .delete(DeleteHostPoolRequest { name: name.clone() })
                .await?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!("deleted host pool {name}"))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({}))?,
            }
        }
        HostPoolCommand::List => {
            // Page by page (a page ends before 3 MiB; a pool with many
            // hosts continues on the next page under the same name).
            let mut pools: Vec<HostPool> = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .list(ListHostPoolsRequest {
                        page_token,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                for pool in page.pools {
                    match pools.last_mut() {
                        Some(last) if last.name == pool.name => last.hosts.extend(pool.hosts),
                        _ => pools.push(pool),
                    }
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            match ctx.output {
                OutputFormat::Table => print_out(&pool_table(&pools))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "pools": pools.iter().map(pool_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        HostPoolCommand::Move { to, hosts, force } => {
            client
                .move_hosts(MoveHostsRequest {
                    hosts: hosts.clone(),
                    to: to.clone(),
                    force,
                })
                .await
                .map_err(|s| super::force_hint(s, force))?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!("moved to {to}: {}", hosts.join(", ")))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({}))?,
            }
        }
    }
    Ok(Outcome::Success)
}

fn pool_json(pool: &HostPool) -> serde_json::Value {
    json!({"name": pool.name, "hosts": pool.hosts})
}

fn pool_table(pools: &[HostPool]) -> String {
    let mut table = Table::new(&[
        ("NAME", Align::Left),
        ("HOSTS", Align::Right),
        ("HOST NAMES", Align::Left),
    ]);
    for pool in pools {
        let names = if pool.hosts.len() > 8 {
            format!("{}, …", pool.hosts[..8].join(", "))
        } else {
            pool.hosts.join(", ")
        };
        table.row(vec![pool.name.clone(), pool.hosts.len().to_string(), names]);
    }
    table.render()
}
