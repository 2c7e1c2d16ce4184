//! `peloton respool ...`: resource pools.

use anyhow::{Context, Result};
use peloton_proto::v1::resource_pool_service_client::ResourcePoolServiceClient;
use peloton_proto::v1::{
    CreatePoolRequest, DeletePoolRequest, GetPoolRequest, ListPoolsRequest, Pool, PoolKind,
    UpdatePoolRequest,
};
use serde_json::json;

use super::{Ctx, Outcome};
use crate::channel::LeaderChannel;
use crate::cli::RespoolCommand;
use crate::error::UsageError;
use crate::names::name_of;
use crate::output::{
    Align, OutputFormat, Table, View, fmt_number, fmt_resources, fmt_usage, pool_json, print_json,
    print_names, print_out, render_fields,
};
use crate::spec::{PoolEntry, PoolFile, load_pool_file};

pub(super) async fn run(ctx: &Ctx, command: RespoolCommand) -> Result<Outcome> {
    match command {
        RespoolCommand::Create(target) => {
            let entries = load(&target)?;
            let mut client = connect(ctx).await?;
            let mut created = Vec::with_capacity(entries.len());
            for entry in entries {
                let request = CreatePoolRequest {
                    path: entry.path.clone(),
                    spec: Some(entry.spec),
                };
                let pool = client
                    .create(request)
                    .await
                    .with_context(|| failed_at("creating", &entry.path, &created))?
                    .into_inner()
                    .pool
                    .with_context(|| format!("the server returned no pool for {}", entry.path))?;
                created.push(pool);
            }
            print_pools(ctx.output, &created)?;
        }
        RespoolCommand::Get { path } => {
            let mut client = connect(ctx).await?;
            let pool = get(&mut client, &path).await?;
            match ctx.output {
                OutputFormat::Table if ctx.view == View::Name => {
                    print_names([format!("respool{}", pool.path)])?;
                }
                OutputFormat::Table if ctx.view == View::Wide => {
                    print_out(&pool_table(std::slice::from_ref(&pool), true))?;
                }
                OutputFormat::Table => print_out(&pool_details(&pool))?,
                OutputFormat::Json | OutputFormat::Yaml => {
                    print_json(&json!({"pool": pool_json(&pool)}))?;
                }
            }
        }
        RespoolCommand::List => {
            let mut client = connect(ctx).await?;
            // Page by page (a page ends before 3 MiB).
            let mut pools = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .list(ListPoolsRequest {
                        page_token,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                pools.extend(page.pools);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            pools.sort_by(|a, b| a.path.cmp(&b.path));
            match ctx.output {
                OutputFormat::Table if ctx.view == View::Name => {
                    print_names(pools.iter().map(|p| format!("respool{}", p.path)))?;
                }
                OutputFormat::Table => print_out(&pool_table(&pools, ctx.view == View::Wide))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
                    "pools": pools.iter().map(pool_json).collect::<Vec<_>>(),
                }))?,
            }
        }
        RespoolCommand::Update { target, version } => {
            let entries = load(&target)?;
            if entries.len() > 1 && version.version != 0 {
                return Err(UsageError(format!(
                    "--version applies to one pool, but {} holds {}",
                    target.resolve()?.1.display(),
                    entries.len()
                ))
                .into());
            }
            let mut client = connect(ctx).await?;
            let mut updated = Vec::with_capacity(entries.len());
            for entry in entries {
                let request = UpdatePoolRequest {
                    path: entry.path.clone(),
                    spec: Some(entry.spec),
                    version: version.version,
                };
                let pool = client
                    .update(request)
                    .await
                    .with_context(|| failed_at("updating", &entry.path, &updated))?
                    .into_inner()
                    .pool
                    .with_context(|| format!("the server returned no pool for {}", entry.path))?;
                updated.push(pool);
            }
            print_pools(ctx.output, &updated)?;
        }
        RespoolCommand::Delete {
            path,
            version,
            force,
        } => {
            let request = DeletePoolRequest {
                path: path.clone(),
                version: version.version,
                force,
            };
            connect(ctx)
                .await?
                .delete(request)
                .await
                .map_err(|s| super::force_hint(s, force))?;
            match ctx.output {
                OutputFormat::Table => print_out(&format!("deleted pool {path}"))?,
                OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({}))?,
            }
        }
    }
    Ok(Outcome::Success)
}

/// The pools of a file in either format; a pool path before it names its
/// (one) pool.
fn load(target: &crate::cli::PoolAndFile) -> Result<Vec<PoolEntry>> {
    let (path, file) = target.resolve()?;
    let loaded = load_pool_file(&file, path)?;
    super::print_notes(&file, &loaded.notes);
    Ok(loaded.value.into_iter().map(PoolFile::into_entry).collect())
}

type Client = ResourcePoolServiceClient<LeaderChannel>;

async fn connect(ctx: &Ctx) -> Result<Client> {
    Ok(ResourcePoolServiceClient::new(ctx.connect().await?)
        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES))
}

async fn get(client: &mut Client, path: &str) -> Result<Pool> {
    let request = GetPoolRequest {
        path: path.to_owned(),
    };
    client
        .get(request)
        .await?
        .into_inner()
        .pool
        .with_context(|| format!("the server returned no pool for {path}"))
}

/// Context for a failure in the middle of a file: which pool, and which
/// pools of the file were already done (they stay done).
fn failed_at(verb: &str, path: &str, done: &[Pool]) -> String {
    if done.is_empty() {
        format!("{verb} pool {path}")
    } else {
        let done: Vec<&str> = done.iter().map(|p| p.path.as_str()).collect();
        format!("{verb} pool {path} (after {})", done.join(", "))
    }
}

fn print_pools(output: OutputFormat, pools: &[Pool]) -> std::io::Result<()> {
    match output {
        OutputFormat::Table => print_out(&pool_table(pools, false)),
        OutputFormat::Json | OutputFormat::Yaml => print_json(&json!({
            "pools": pools.iter().map(pool_json).collect::<Vec<_>>(),
        })),
    }
}

/// Pools' rows; `wide` (`-o wide`) adds their demand, version, children
/// and limits in percent.
fn pool_table(pools: &[Pool], wide: bool) -> String {
    let mut columns = vec![
        ("PATH", Align::Left),
        ("KIND", Align::Left),
        ("SHARE", Align::Right),
        ("RESERVATION", Align::Left),
        ("LIMIT", Align::Left),
        ("ENTITLEMENT", Align::Left),
        ("ALLOCATION", Align::Left),
        ("USED", Align::Left),
        ("PENDING", Align::Right),
        ("RUNNING", Align::Right),
    ];
    if wide {
        columns.extend([
            ("DEMAND", Align::Left),
            ("VERSION", Align::Right),
            ("CHILDREN", Align::Right),
            ("SLACK LIMIT %", Align::Right),
            ("CONTROLLER LIMIT %", Align::Right),
        ]);
    }
    let mut table = Table::new(&columns);
    for pool in pools {
        let spec = pool.spec.unwrap_or_default();
        let status = pool.status.unwrap_or_default();
        let mut row = vec![
            pool.path.clone(),
            name_of::<PoolKind>(spec.kind),
            fmt_share(&spec),
            fmt_resources(spec.reservation.as_ref()),
            fmt_resources(spec.limit.as_ref()),
            fmt_resources(status.entitlement.as_ref()),
            fmt_resources(status.allocation.as_ref()),
            fmt_usage(status.used.as_ref()),
            status.pending_tasks.to_string(),
            status.running_tasks.to_string(),
        ];
        if wide {
            row.extend([
                fmt_resources(status.demand.as_ref()),
                pool.version.to_string(),
                pool.children.len().to_string(),
                fmt_number(spec.slack_limit_pct),
                fmt_number(spec.controller_limit_pct),
            ]);
        }
        table.row(row);
    }
    table.render()
}

fn pool_details(pool: &Pool) -> String {
    let spec = pool.spec.unwrap_or_default();
    let status = pool.status.unwrap_or_default();
    let children = if pool.children.is_empty() {
        "-".to_owned()
    } else {
        pool.children.join(", ")
    };
    render_fields(&[
        ("PATH", pool.path.clone()),
        ("KIND", name_of::<PoolKind>(spec.kind)),
        ("SHARE", fmt_share(&spec)),
        ("RESERVATION", fmt_resources(spec.reservation.as_ref())),
        ("LIMIT", fmt_resources(spec.limit.as_ref())),
        ("CONTROLLER LIMIT", fmt_pct(spec.controller_limit_pct)),
        ("SLACK LIMIT", fmt_pct(spec.slack_limit_pct)),
        (
            "ORDER",
            if spec.strict_order {
                "strict (no reservations, no backfill)"
            } else {
                "reservations and backfill"
            }
            .to_owned(),
        ),
        ("ENTITLEMENT", fmt_resources(status.entitlement.as_ref())),
        ("ALLOCATION", fmt_resources(status.allocation.as_ref())),
        ("USED", fmt_usage(status.used.as_ref())),
        ("DEMAND", fmt_resources(status.demand.as_ref())),
        ("PENDING TASKS", status.pending_tasks.to_string()),
        ("RUNNING TASKS", status.running_tasks.to_string()),
        ("CHILDREN", children),
        ("VERSION", pool.version.to_string()),
    ])
}

/// A share of 0 means 1; per-dimension shares (where they differ) per
/// dimension, a dimension left at 0 taking `share`.
fn fmt_share(spec: &peloton_proto::v1::PoolSpec) -> String {
    let share = if spec.share == 0.0 { 1.0 } else { spec.share };
    let Some(shares) = spec.shares else {
        return fmt_number(share);
    };
    let of = |s: f64| fmt_number(if s == 0.0 { share } else { s });
    format!(
        "cpu {} mem {} disk {} gpu {}",
        of(shares.cpu),
        of(shares.memory_mb),
        of(shares.disk_mb),
        of(shares.gpu)
    )
}

/// A percentage limit of 0 means 100.
fn fmt_pct(pct: f64) -> String {
    format!("{}%", fmt_number(if pct == 0.0 { 100.0 } else { pct }))
}

#[cfg(test)]
mod tests {
    use peloton_proto::v1::{PoolSpec, Resources};

    use super::fmt_share;

    #[test]
    fn shares_show_per_dimension_where_they_differ() {
        let mut spec = PoolSpec::default();
        assert_eq!(fmt_share(&spec), "1");
        spec.share = 2.0;
        assert_eq!(fmt_share(&spec), "2");
        spec.shares = Some(Resources {
            cpu: 3.0,
            memory_mb: 0.5,
            ..Default::default()
        });
        assert_eq!(fmt_share(&spec), "cpu 3 mem 0.5 disk 2 gpu 2");
    }
}
