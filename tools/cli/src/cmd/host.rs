//! `peloton host ...`: hosts and maintenance.

use anyhow::Result;
use peloton_proto::v1::host_service_client::HostServiceClient;
use peloton_proto::v1::{
    CompleteMaintenanceRequest, Host, HostState, ListHostsRequest, StartMaintenanceRequest,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::channel::LeaderChannel;
use crate::cli::HostCommand;
use crate::names::name_of;
use crate::output::{
    Align, OutputFormat, Table, View, fmt_map, fmt_mib, fmt_number, fmt_time_ms, fmt_usage,
    host_json, or_dash, print_json, print_names, print_out,
};

/// Every host, page by page (in name order).
pub(super) async fn list_all(client: &mut HostServiceClient<LeaderChannel>) -> Result<Vec<Host>> {
    let mut hosts = Vec::new();
    let mut after = String::new();
    loop {
        let page = client
            .list(ListHostsRequest {
                after: after.clone(),
                limit: 0,
            })
            .await?
            .into_inner();
        hosts.extend(page.hosts);
        // A server that does not move forward would loop forever.
        if page.next_after.is_empty() || page.next_after <= after {
            break;
        }
        after = page.next_after;
    }
    Ok(hosts)
}

pub(super) async fn run(ctx: &Ctx, command: HostCommand) -> Result<Outcome> {
    let mut client = HostServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
    match command {
        HostCommand::List => {
            let hosts = list_all(&mut client).await?;
            match ctx.output {
                OutputFormat::Table if ctx.view == View::Name => {
                    print_names(hosts.iter().map(|h| format!("host/{}", h.name)))?;
                }
                OutputFormat::Table => print_out(&host_table(&hosts, ctx.view == View::Wide))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "hosts": hosts.iter().map(host_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        HostCommand::Drain { hosts } => {
            let request = StartMaintenanceRequest {
                hosts: hosts.clone(),
            };
            client.start_maintenance(request).await?;
            print_done(ctx.output, "draining", &hosts)?;
        }
        HostCommand::Up { hosts } => {
            let request = CompleteMaintenanceRequest {
                hosts: hosts.clone(),
            };
            client.complete_maintenance(request).await?;
            print_done(ctx.output, "up", &hosts)?;
        }
    }
    Ok(Outcome::Success)
}

fn print_done(output: OutputFormat, state: &str, hosts: &[String]) -> std::io::Result<()> {
    match output {
        OutputFormat::Table => print_out(&format!("{state}: {}", hosts.join(", "))),
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({})),
    }
}

/// The blocked heads a host is held for: `JOB/INSTANCE (N tasks)`, or -.
fn reserved_for(host: &Host) -> String {
    if host.reserved_for.is_empty() {
        return "-".into();
    }
    host.reserved_for
        .iter()
        .map(|r| {
            let head = r.head.clone().unwrap_or_default();
            format!("{}/{} ({} tasks)", head.job_id, head.instance, r.tasks)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Hosts' rows; `wide` (`-o wide`) adds whether each is connected, when it
/// was last heard from and the disk its volumes hold.
fn host_table(hosts: &[Host], wide: bool) -> String {
    let mut columns = vec![
        ("NAME", Align::Left),
        ("STATE", Align::Left),
        ("HOST POOL", Align::Left),
        ("CPU FREE/TOTAL", Align::Right),
        ("MEMORY FREE/TOTAL", Align::Right),
        ("GPU FREE/TOTAL", Align::Right),
        ("USED", Align::Right),
        ("TASKS", Align::Right),
        ("ISOLATION", Align::Left),
        ("ADDRESS", Align::Left),
        ("RESERVED FOR", Align::Left),
        ("ATTRIBUTES", Align::Left),
    ];
    if wide {
        columns.extend([
            ("CONNECTED", Align::Left),
            ("LAST SEEN", Align::Left),
            ("VOLUMES DISK", Align::Right),
        ]);
    }
    let mut table = Table::new(&columns);
    for host in hosts {
        let capacity = host.capacity.unwrap_or_default();
        let free = host.free.unwrap_or_default();
        let gpu = if capacity.gpu == 0.0 {
            "-".to_owned()
        } else {
            format!("{}/{}", fmt_number(free.gpu), fmt_number(capacity.gpu))
        };
        let mut row = vec![
            host.name.clone(),
            name_of::<HostState>(host.state),
            or_dash(&host.host_pool),
            format!("{}/{}", fmt_number(free.cpu), fmt_number(capacity.cpu)),
            format!(
                "{} / {}",
                fmt_mib(free.memory_mb),
                fmt_mib(capacity.memory_mb)
            ),
            gpu,
            // Measured (the agents' reports), beside the allocation above.
            fmt_usage(host.used.as_ref()),
            host.tasks_total.to_string(),
            // cgroup-v2 or rlimit for agents; none for simulated hosts.
            or_dash(&host.isolation),
            // Where its tasks are reachable (agents' registered address).
            or_dash(&host.address),
            // Reservations with backfill: the blocked heads held here.
            reserved_for(host),
            fmt_map(&host.attributes),
        ];
        if wide {
            row.extend([
                if host.connected { "yes" } else { "no" }.to_owned(),
                fmt_time_ms(host.last_seen_ms),
                fmt_mib(host.volumes_disk_mb as f64),
            ]);
        }
        table.row(row);
    }
    table.render()
}
