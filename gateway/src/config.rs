//! Server configuration: a YAML file, overridden by command-line flags, and
//! the simulated cluster (generated or from a YAML host file).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use peloton_engine::host::HostSpec;
use peloton_engine::{Dim, Resources};
use serde::Deserialize;

/// Writes `token` to `path` (mode 0600) by a rename, creating `dir`.
fn write_private(dir: &Path, path: &Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Everything `pelotond` can be told.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the embedded store keeps its file (and local agents their
    /// work dirs).
    pub data_dir: PathBuf,
    /// The store: unset for the embedded one in `data_dir`, or a
    /// PostgreSQL URL (`postgres://user:password@host:port/db`), which
    /// several servers may share: one leads, the others stand by.
    pub store: Option<String>,
    /// With a PostgreSQL store: the leader's lease. A standby takes over
    /// within about this long of the leader's death.
    pub lease_ms: u64,
    /// With a PostgreSQL store: the URL clients use to reach this server,
    /// named by standbys (default: `https://` and the listen address;
    /// `http://` when not secure).
    pub advertise: Option<String>,
    /// gRPC address (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Prometheus `/metrics` address; none to disable.
    pub metrics_listen: Option<SocketAddr>,
    /// Least time between two scheduling cycles while work arrives (start
    /// to start, a cycle also waits at least twice as long as the last took).
    pub cycle_interval_ms: u64,
    /// A cycle runs at least this often.
    pub idle_cycle_interval_ms: u64,
    /// Most requests applied (and committed) together.
    pub max_batch: usize,
    /// Group commit: under load, iterations with requests start at least
    /// this long after the last commit, so that what arrives meanwhile
    /// shares one commit (one `fdatasync`) — up to this much more latency
    /// for a write, none after a quiet spell. 0 (the default) commits every
    /// iteration at once. See ARCHITECTURE.md for what it trades.
    pub commit_spacing_ms: u64,
    /// Commit on the loop's own thread (`pelotond --sync-commit`), not on
    /// the store's writer thread while the loop steps the next iteration
    /// (the default: a pipelined commit; both make answers and dispatches
    /// wait for their batch to be durable).
    pub sync_commit: bool,
    /// Requests waiting for the loop before senders wait.
    pub command_queue: usize,
    /// Instances of one job.
    pub max_instances_per_job: u32,
    /// Threads of the engine's parallel scans (one pool, shared by
    /// entitlement, admission and placement; default: the machine's cores,
    /// at most 16).
    pub engine_threads: usize,
    /// Generated simulated hosts.
    pub sim_hosts: u32,
    /// Simulated hosts from a YAML file.
    pub sim_hosts_file: Option<PathBuf>,
    /// Pools that get per-pool metric series.
    pub metrics_max_pools: usize,
    /// Events kept for resuming watches.
    pub event_retention: u64,
    /// Page cache of the embedded store, in MiB.
    pub store_cache_mb: usize,
    /// Memory of every watch stream's buffer together, in MiB: past it,
    /// the watches whose clients left a message untaken longest are ended
    /// with RESOURCE_EXHAUSTED.
    pub watch_memory_mb: usize,
    /// Memory of one watch stream's buffer, in KiB (at most
    /// `watch_memory_mb`): a watch whose buffer is full catches up from
    /// the store once its client reads again.
    pub watch_buffer_kb: usize,
    /// The token agents must present. Unset: read from
    /// `<data_dir>/agent-token`, created with a random token if missing.
    pub agent_token: Option<String>,
    /// Agents send a heartbeat this often.
    pub agent_heartbeat_ms: u64,
    /// An agent host not heard from for this long is lost: its runs are
    /// LOST and start again elsewhere.
    pub host_lost_after_ms: u64,
    /// While work waits, a start forecast is made this often (0: never).
    pub forecast_interval_ms: u64,
    /// Blocked queue heads given hosts reserved from their expected start,
    /// with backfill behind them, per scheduling cycle (0: none: queues
    /// keep strict order and gangs wait in placement). At most 64.
    pub backfill_reservations: usize,
    /// Queue entries looked at behind a reserved head per cycle.
    pub backfill_depth: usize,
    /// A finished job (succeeded, failed or killed) is removed, with its
    /// tasks, from memory and the store this many seconds after it
    /// finished (reads of it then answer NOT_FOUND).
    pub job_retention_s: u64,
    /// At most this many finished jobs are kept; the oldest go first.
    pub max_finished_jobs: usize,
    /// A client-mode application whose driver is not heard from (no open
    /// executor stream, no call) for this long is unregistered: its
    /// executors stop and its job ends.
    pub app_lease_ms: u64,
    /// Overcommit: of the CPU non-revocable tasks on a host are allocated
    /// and do not use, this percentage of their allocation is kept back;
    /// the rest is lent to revocable tasks (100: lend none).
    pub overcommit_cpu_margin_pct: u8,
    /// Likewise for memory.
    pub overcommit_memory_margin_pct: u8,
    /// Serve TLS only, want a bearer token on every call, check it against
    /// its roles and audit every mutating call (see `access.rs`). On by
    /// default; `false` (`pelotond --insecure`) serves plaintext to anyone
    /// who reaches the port, for experiments on a closed machine.
    pub secure: bool,
    /// Secure: serve `/metrics` over TLS too (with the server's
    /// certificate; no token: scrapers authenticate by network). Off by
    /// default: Prometheus scrapes a private address in plaintext.
    pub metrics_tls: bool,
    /// Secure: the server's certificate chain (PEM). Unset (with `tls_key`
    /// unset too): issued by a private CA kept in `<data_dir>/tls/`
    /// (created once), for localhost, the loopback addresses, this host's
    /// name and the listen address.
    pub tls_cert: Option<PathBuf>,
    /// Secure: the server's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Secure: the CA agents' client certificates must be signed by
    /// (default: the private CA in `<data_dir>/tls/`; none when `tls_cert`
    /// is given, so set it whenever agents connect). An agent registers
    /// only the host its certificate names. API clients may present a
    /// user certificate signed by it and recorded with their token.
    pub tls_client_ca: Option<PathBuf>,
    /// Secure: the private key (PEM) of `tls_client_ca`, so the server can
    /// sign user certificates (`AccessService.IssueCertificate`). Not
    /// needed with the private CA, whose key the server holds.
    pub tls_client_ca_key: Option<PathBuf>,
    /// Secure: the bootstrap admin token (a cluster admin named "admin").
    /// Unset: read from `<data_dir>/admin-token`, created with a random
    /// token if missing.
    pub admin_token: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("peloton-data"),
            store: None,
            lease_ms: 5000,
            advertise: None,
            listen: "127.0.0.1:5391".parse().expect("valid"),
            metrics_listen: Some("127.0.0.1:9391".parse().expect("valid")),
            cycle_interval_ms: 2,
            idle_cycle_interval_ms: 1000,
            max_batch: 1024,
            commit_spacing_ms: 0,
            sync_commit: false,
            command_queue: 4096,
            max_instances_per_job: 100_000,
            engine_threads: default_engine_threads(),
            sim_hosts: 0,
            sim_hosts_file: None,
            metrics_max_pools: 256,
            event_retention: 5_000_000,
            store_cache_mb: 64,
            watch_memory_mb: crate::service::DEFAULT_WATCH_MEMORY_BYTES >> 20,
            watch_buffer_kb: crate::service::DEFAULT_WATCH_BUFFER_BYTES >> 10,
            agent_token: None,
            agent_heartbeat_ms: 1000,
            host_lost_after_ms: 10_000,
            forecast_interval_ms: crate::lifecycle::FORECAST_INTERVAL_MS,
            backfill_reservations: peloton_engine::backfill::BackfillConfig::default()
                .max_reservations,
            backfill_depth: peloton_engine::backfill::BackfillConfig::default().depth,
            job_retention_s: 7 * 24 * 3600,
            max_finished_jobs: 10_000,
            app_lease_ms: 60_000,
            overcommit_cpu_margin_pct: 10,
            overcommit_memory_margin_pct: 20,
            secure: true,
            metrics_tls: false,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_client_ca_key: None,
            admin_token: None,
        }
    }
}

impl Config {
    /// Reads a YAML configuration file.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        serde_norway::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Checks bounds.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.max_batch >= 1, "max_batch: must be at least 1");
        anyhow::ensure!(
            self.tls_cert.is_some() == self.tls_key.is_some(),
            "tls_cert and tls_key: give both or neither"
        );
        anyhow::ensure!(
            self.tls_client_ca_key.is_none() || self.tls_client_ca.is_some(),
            "tls_client_ca_key: only with tls_client_ca (the private CA's key is the server's already)"
        );
        anyhow::ensure!(
            self.secure
                || (self.tls_cert.is_none()
                    && self.tls_client_ca.is_none()
                    && self.tls_client_ca_key.is_none()
                    && self.admin_token.is_none()
                    && !self.metrics_tls),
            "tls_cert, tls_key, tls_client_ca, tls_client_ca_key, admin_token and metrics_tls: not with secure: false (--insecure)"
        );
        if let Some(url) = &self.store {
            anyhow::ensure!(
                url.starts_with("postgres://") || url.starts_with("postgresql://"),
                "store: must be a postgres:// or postgresql:// URL (unset for the embedded store), not {:?}",
                crate::pgstore::redact(url)
            );
            url.parse::<postgres::Config>()
                .map_err(|e| anyhow::anyhow!("store: {e}"))?;
        }
        anyhow::ensure!(
            (300..=600_000).contains(&self.lease_ms),
            "lease_ms: must be 300–600000"
        );
        if let Some(a) = &self.advertise {
            anyhow::ensure!(
                (a.starts_with("http://") || a.starts_with("https://"))
                    && a.parse::<axum::http::Uri>().is_ok(),
                "advertise: must be an http:// or https:// URL, not {a:?}"
            );
        }
        anyhow::ensure!(self.command_queue >= 1, "command_queue: must be at least 1");
        anyhow::ensure!(
            self.commit_spacing_ms <= 1000,
            "commit_spacing_ms: must be 0–1000"
        );
        anyhow::ensure!(
            (1..=1_000_000).contains(&self.max_instances_per_job),
            "max_instances_per_job: must be 1–1000000"
        );
        anyhow::ensure!(
            (1..=256).contains(&self.engine_threads),
            "engine_threads: must be 1–256"
        );
        anyhow::ensure!(
            self.idle_cycle_interval_ms >= self.cycle_interval_ms,
            "idle_cycle_interval_ms: must be at least cycle_interval_ms"
        );
        anyhow::ensure!(self.sim_hosts <= 1_000_000, "sim_hosts: at most 1000000");
        anyhow::ensure!(
            self.backfill_reservations <= peloton_engine::backfill::MAX_RESERVATIONS,
            "backfill_reservations: must be 0–{}",
            peloton_engine::backfill::MAX_RESERVATIONS
        );
        anyhow::ensure!(
            (1..=10_000).contains(&self.backfill_depth),
            "backfill_depth: must be 1–10000"
        );
        anyhow::ensure!(
            (1..=65_536).contains(&self.store_cache_mb),
            "store_cache_mb: must be 1–65536"
        );
        anyhow::ensure!(
            (1..=65_536).contains(&self.watch_memory_mb),
            "watch_memory_mb: must be 1–65536"
        );
        anyhow::ensure!(
            (64..=self.watch_memory_mb * 1024).contains(&self.watch_buffer_kb),
            "watch_buffer_kb: must be 64–{} (at most watch_memory_mb)",
            self.watch_memory_mb * 1024
        );
        anyhow::ensure!(
            (10..=60_000).contains(&self.agent_heartbeat_ms),
            "agent_heartbeat_ms: must be 10–60000"
        );
        anyhow::ensure!(
            self.host_lost_after_ms >= 2 * self.agent_heartbeat_ms,
            "host_lost_after_ms: must be at least twice agent_heartbeat_ms"
        );
        anyhow::ensure!(
            self.job_retention_s <= 100 * 365 * 24 * 3600,
            "job_retention_s: at most 100 years"
        );
        anyhow::ensure!(
            (100..=86_400_000).contains(&self.app_lease_ms),
            "app_lease_ms: must be 100–86400000"
        );
        anyhow::ensure!(
            self.overcommit_cpu_margin_pct <= 100,
            "overcommit_cpu_margin_pct: must be 0–100"
        );
        anyhow::ensure!(
            self.overcommit_memory_margin_pct <= 100,
            "overcommit_memory_margin_pct: must be 0–100"
        );
        anyhow::ensure!(
            self.max_finished_jobs <= 100_000_000,
            "max_finished_jobs: at most 100000000"
        );
        if let Some(t) = &self.agent_token {
            anyhow::ensure!(
                !t.is_empty() && t.len() <= 1024,
                "agent_token: must be 1–1024 characters"
            );
        }
        Ok(())
    }

    /// Whether tasks run on simulated hosts (otherwise on agents).
    pub fn simulated(&self) -> bool {
        self.sim_hosts > 0 || self.sim_hosts_file.is_some()
    }

    /// The agents' token: configured, or kept in the data dir (created on
    /// first use, readable only by the owner).
    pub fn resolve_agent_token(&self) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.job_retention_s <= 100 * 365 * 24 * 3600,
            "job_retention_s: at most 100 years"
        );
        anyhow::ensure!(
            self.max_finished_jobs <= 100_000_000,
            "max_finished_jobs: at most 100000000"
        );
        if let Some(t) = &self.agent_token {
            return Ok(t.clone());
        }
        let path = self.data_dir.join("agent-token");
        if let Some(url) = &self.store {
            // Shared by every server of the database (an agent registers
            // with whichever leads), kept in the data dir too for local
            // agents and operators.
            // On a thread of its own: the blocking client may not run on
            // an async thread, and this is called from both kinds.
            let token = std::thread::scope(|s| {
                s.spawn(|| crate::pgstore::shared_agent_token(url))
                    .join()
                    .map_err(|_| anyhow::anyhow!("reading the agent token panicked"))
            })??;
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current.trim() != token {
                write_private(&self.data_dir, &path, &token)?;
            }
            return Ok(token);
        }
        self.kept_secret(&path, || uuid::Uuid::new_v4().simple().to_string())
    }

    /// The secret kept in `path` (trimmed), or a new one from `make`,
    /// written there readable only by the owner.
    fn kept_secret(&self, path: &Path, make: impl FnOnce() -> String) -> anyhow::Result<String> {
        match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        }
        let secret = make();
        write_private(&self.data_dir, path, &secret)?;
        Ok(secret)
    }

    /// The bootstrap admin token: configured, or kept in the data dir
    /// (created on first use, readable only by the owner).
    pub fn resolve_admin_token(&self) -> anyhow::Result<String> {
        if let Some(t) = &self.admin_token {
            anyhow::ensure!(
                (16..=512).contains(&t.len()),
                "admin_token: must be 16–512 characters"
            );
            return Ok(t.clone());
        }
        let path = self.data_dir.join("admin-token");
        let token = self.kept_secret(&path, crate::access::new_secret)?;
        anyhow::ensure!(
            (16..=512).contains(&token.len()),
            "{}: the admin token must be 16–512 characters",
            path.display()
        );
        Ok(token)
    }

    /// The simulated hosts this configuration describes.
    pub fn sim_host_specs(&self) -> anyhow::Result<Vec<HostSpec>> {
        let mut hosts = generated_hosts(self.sim_hosts);
        if let Some(path) = &self.sim_hosts_file {
            hosts.extend(hosts_from_file(path)?);
        }
        Ok(hosts)
    }
}

/// `n` generated hosts: three in four have 16 cores and 64 GiB, one in four
/// 32 cores and 128 GiB; attributes `zone` (z1–z4), `rack` (20 hosts each)
/// and `host`.
pub fn generated_hosts(n: u32) -> Vec<HostSpec> {
    (0..n)
        .map(|i| {
            let name = format!("sim-{i:05}");
            let big = i % 4 == 3;
            let mut capacity = Resources::ZERO;
            capacity[Dim::Cpu] = if big { 32_000 } else { 16_000 };
            capacity[Dim::Memory] = if big { 128 * 1024 } else { 64 * 1024 };
            capacity[Dim::Disk] = 500 * 1024;
            HostSpec {
                attributes: vec![
                    ("zone".into(), format!("z{}", i % 4 + 1)),
                    ("rack".into(), format!("r{}", i / 20)),
                    ("host".into(), name.clone()),
                ],
                name,
                capacity,
                gpu_devices: 0,
                ports: 1000,
            }
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    hosts: Vec<HostEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    name: String,
    #[serde(default = "one")]
    count: u32,
    cpu: f64,
    memory_mb: f64,
    #[serde(default)]
    disk_mb: f64,
    #[serde(default)]
    gpus: u8,
    #[serde(default)]
    attributes: std::collections::BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

/// Hosts from a YAML file: `hosts: [{name, count, cpu, memory_mb, disk_mb,
/// gpus, attributes}]`; with `count` > 1 the names get a `-N` suffix.
pub fn hosts_from_file(path: &Path) -> anyhow::Result<Vec<HostSpec>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let file: HostFile =
        serde_norway::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, h) in file.hosts.into_iter().enumerate() {
        for (field, v) in [
            ("cpu", h.cpu),
            ("memory_mb", h.memory_mb),
            ("disk_mb", h.disk_mb),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{}: hosts[{i}].{field}: must be a non-negative number",
                path.display()
            );
        }
        anyhow::ensure!(
            h.count >= 1,
            "{}: hosts[{i}].count: must be at least 1",
            path.display()
        );
        let mut capacity = Resources::ZERO;
        capacity[Dim::Cpu] = (h.cpu * 1000.0) as u64;
        capacity[Dim::Memory] = h.memory_mb as u64;
        capacity[Dim::Disk] = h.disk_mb as u64;
        capacity[Dim::Gpu] = u64::from(h.gpus) * 1000;
        for n in 0..h.count {
            let name = if h.count == 1 {
                h.name.clone()
            } else {
                format!("{}-{n}", h.name)
            };
            let mut attributes: Vec<(String, String)> = h
                .attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !h.attributes.contains_key("host") {
                attributes.push(("host".into(), name.clone()));
            }
            out.push(HostSpec {
                name,
                capacity,
                gpu_devices: h.gpus,
                ports: 1000,
                attributes,
            });
        }
    }
    Ok(out)
}

/// The engine's threads by default: the machine's cores, at most 16 (results
/// are the same for any number).
pub fn default_engine_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_set_fields_and_reject_unknown_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "data_dir: /var/lib/peloton\nlisten: 0.0.0.0:7000\nsim_hosts: 3\nmetrics_listen: null\n",
        )
        .unwrap();
        let c = Config::from_file(&path).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/peloton"));
        assert_eq!(c.listen.port(), 7000);
        assert_eq!(c.metrics_listen, None);
        assert_eq!(c.sim_host_specs().unwrap().len(), 3);
        assert_eq!(c.cycle_interval_ms, Config::default().cycle_interval_ms);
        std::fs::write(&path, "sim_host: 3\n").unwrap();
        let e = Config::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("unknown field `sim_host`"), "{e}");
        std::fs::write(&path, "commit_spacing_ms: 4\n").unwrap();
        assert_eq!(Config::from_file(&path).unwrap().commit_spacing_ms, 4);
        let e = Config {
            commit_spacing_ms: 5000,
            ..Config::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("commit_spacing_ms: must be 0–1000"), "{e}");
    }

    #[test]
    fn backfill_bounds_are_checked() {
        for (config, field) in [
            (
                Config {
                    backfill_reservations: 65,
                    ..Config::default()
                },
                "backfill_reservations: must be 0–64",
            ),
            (
                Config {
                    backfill_depth: 0,
                    ..Config::default()
                },
                "backfill_depth: must be 1–10000",
            ),
        ] {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        Config {
            backfill_reservations: 0,
            ..Config::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn a_watch_buffer_is_at_most_the_watch_memory() {
        let e = Config {
            watch_memory_mb: 1,
            watch_buffer_kb: 2048,
            ..Config::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("watch_buffer_kb: must be 64–1024"), "{e}");
        let e = Config {
            watch_memory_mb: 0,
            ..Config::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("watch_memory_mb: must be 1–65536"), "{e}");
        Config::default().validate().unwrap();
    }

    #[test]
    fn overcommit_margins_are_percentages() {
        for (config, field) in [
            (
                Config {
                    overcommit_cpu_margin_pct: 101,
                    ..Config::default()
                },
                "overcommit_cpu_margin_pct: must be 0–100",
            ),
            (
                Config {
                    overcommit_memory_margin_pct: 200,
                    ..Config::default()
                },
                "overcommit_memory_margin_pct: must be 0–100",
            ),
        ] {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        Config {
            overcommit_cpu_margin_pct: 100,
            overcommit_memory_margin_pct: 0,
            ..Config::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn host_files_expand_counts_and_name_bad_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.yaml");
        std::fs::write(
            &path,
            "hosts:\n  - {name: gpu, count: 2, cpu: 32, memory_mb: 262144, gpus: 8, attributes: {zone: z1}}\n  - {name: small, cpu: 4, memory_mb: 8192}\n",
        )
        .unwrap();
        let hosts = hosts_from_file(&path).unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1", "small"]);
        assert_eq!(hosts[0].capacity[Dim::Gpu], 8000);
        assert!(hosts[0].attributes.contains(&("zone".into(), "z1".into())));
        std::fs::write(&path, "hosts:\n  - {name: a, cpu: -1, memory_mb: 1}\n").unwrap();
        let e = hosts_from_file(&path).unwrap_err().to_string();
        assert!(e.contains("hosts[0].cpu"), "{e}");
    }
}
