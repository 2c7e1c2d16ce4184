//! The command line, in two stages: [`Args`] as typed (clap checks the
//! syntax of every flag and names the flag in its error), then
//! [`AgentConfig`], everything resolved — token file read, host name and
//! undeclared resources detected, isolation chosen.
//!
//! The hidden launcher mode (`peloton-agent launcher`, see `launcher`) is
//! not part of [`Args`]: the binary recognises it by its first argument
//! before anything else happens, so it never starts an async runtime and
//! never shows up in `--help`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::run::Resources;
use clap::{Parser, ValueEnum};

use crate::detect;
use crate::gc::GcPolicy;
use crate::isolation::Isolation;
use crate::ports::PortRange;
use crate::session::{OnExit, SessionConfig};
use crate::supervisor::{DEFAULT_MAX_RUNS, DEFAULT_OPEN_FILES, SupervisorConfig};
use crate::usage::DEFAULT_USAGE_INTERVAL_MS;

const RESOURCE_KEYS: &str = "cpu, mem, disk, gpu";

/// `peloton-agent`: runs Peloton tasks on this machine for a Peloton server.
///
/// SIGTERM or SIGINT stops the agent without stopping its tasks: they are
/// children of the agent's launcher process, which outlives the agent and
/// records how each ends, and an agent started again on the same work
/// directory takes them over (unless --stop-tasks-on-exit).
#[derive(Debug, Parser)]
#[command(name = "peloton-agent", version)]
pub struct Args {
    /// The server's gRPC address, e.g. http://10.0.0.1:5000; or several,
    /// comma-separated (servers sharing one database, one leading): they
    /// are tried in turn when a connection fails or a session breaks, and a
    /// standby's refusal ("not the leader") sends the agent to the leader
    /// it names. The tasks keep running across the switch.
    #[arg(long, value_name = "URL[,URL...]", value_parser = parse_server_list)]
    pub server: ServerList,
    /// Holds the sandboxes of runs and the agent's state (one agent per
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub work_dir: PathBuf,
    /// A file holding the server's agent token (trailing whitespace is
    /// ignored), readable only by the agent's user: the preferred way, as
    /// it keeps the token out of the process list.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The server's agent token itself (visible to every user in the
    /// process list: prefer --token-file).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// The CA (PEM) that signed a secure server's certificate: needed for
    /// https:// servers (`pelotond` keeps its private CA in
    /// DATA_DIR/tls/ca.pem).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// This agent's client certificate (PEM), naming its host: a secure
    /// server accepts an agent only for the host its certificate names.
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The private key (PEM) of --cert-file.
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// This host's name in the cluster (default: the machine's host name).
    /// Unique: while an agent holds a name, the server refuses another
    /// (one with another work directory) until the holder goes silent.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Resources offered to tasks, any subset of cpu=CORES,mem=MIB,disk=MIB,gpu=N;
    /// the rest is detected.
    #[arg(long, value_name = "LIST", value_parser = parse_resources)]
    pub resources: Option<ResourceOverrides>,
    /// A host attribute for placement constraints (repeatable).
    #[arg(long = "attr", value_name = "KEY=VALUE", value_parser = parse_attribute)]
    pub attributes: Vec<(String, String)>,
    /// Ports handed to tasks that ask for them, FIRST-LAST.
    #[arg(long, value_name = "FIRST-LAST")]
    pub ports: Option<PortRange>,
    /// The address tasks on this host are reachable at, registered with
    /// the server and given to gang members' peers (default: the local
    /// address this machine reaches the server from; 127.0.0.1 for a
    /// server on this machine).
    #[arg(long, value_name = "IP")]
    pub advertise_address: Option<std::net::IpAddr>,
    /// Logs as JSON lines (default: human-readable).
    #[arg(long)]
    pub log_json: bool,
    /// How runs are isolated: cgroup v2 when usable, else rlimits (auto);
    /// or insist on one.
    #[arg(long, value_enum, default_value_t = IsolationChoice::Auto)]
    pub isolation: IsolationChoice,
    /// The cgroup under which runs get theirs (cgroup v2 isolation).
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/cgroup/peloton")]
    pub cgroup_parent: PathBuf,
    /// Sandboxes of acknowledged runs are removed this long after the run
    /// ended.
    #[arg(long, value_name = "SECONDS", default_value_t = 7 * 24 * 3600)]
    pub gc_max_age_s: u64,
    /// Above this much disk, the oldest acknowledged sandboxes are removed.
    #[arg(long, value_name = "MIB", default_value_t = 10_240)]
    pub gc_max_disk_mb: u64,
    /// Time between garbage collections.
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub gc_interval_s: u64,
    /// Time between usage reports (what runs use: CPU, memory); a run
    /// whose memory moves by more than a quarter is reported sooner, but
    /// reports never come closer than a second apart.
    #[arg(long = "usage-interval", value_name = "SECONDS", default_value_t = DEFAULT_USAGE_INTERVAL_MS / 1000,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub usage_interval_s: u64,
    /// Time between looks at the runs (started? exited?).
    #[arg(long, value_name = "MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(10..=10_000))]
    pub poll_interval_ms: u64,
    /// Most runs held at once (alive, or ended and not yet acknowledged);
    /// launches beyond it fail.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_RUNS,
          value_parser = parse_max_runs)]
    pub max_runs: usize,
    /// On SIGTERM or SIGINT, stop every task first (SIGTERM, then SIGKILL
    /// after its kill grace period; a second signal kills them at once)
    /// and exit once all have ended. Their ends are reported by the next
    /// agent on this work directory. Without it, tasks keep running.
    #[arg(long)]
    pub stop_tasks_on_exit: bool,
    /// Stop as on SIGTERM when the process PID, which started this agent,
    /// ends (even killed with SIGKILL), or at once if it already has: for
    /// agents that a server starts and owns (`pelotond --local-agents`).
    /// Linux's parent-death signal; the parent must not be a thread that
    /// ends before it does.
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(u32).range(1..))]
    pub exit_with_parent: Option<u32>,
    /// RLIMIT_NOFILE of every task.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_OPEN_FILES,
          value_parser = clap::value_parser!(u64).range(16..))]
    pub open_files: u64,
}

/// `--isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsolationChoice {
    Auto,
    Rlimit,
    #[value(name = "cgroup-v2")]
    CgroupV2,
}

/// The dimensions `--resources` sets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ResourceOverrides {
    pub cpu: Option<f64>,
    pub memory_mb: Option<f64>,
    pub disk_mb: Option<f64>,
    pub gpu: Option<f64>,
}

/// `--server`: the addresses in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerList(pub Vec<String>);

fn parse_server_list(text: &str) -> Result<ServerList, String> {
    crate::session::parse_servers(text).map(ServerList)
}

fn parse_max_runs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=100_000) => Ok(n),
        _ => Err(format!("{text:?} is not a number from 1 to 100000")),
    }
}

/// `cpu=4,mem=8192,disk=10000,gpu=0`, any subset, each key once.
pub fn parse_resources(text: &str) -> Result<ResourceOverrides, String> {
    let mut out = ResourceOverrides::default();
    if text.trim().is_empty() {
        return Err(format!("empty; expected KEY=VALUE pairs ({RESOURCE_KEYS})"));
    }
    for item in text.split(',') {
        let item = item.trim();
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("{item:?} is not KEY=VALUE ({RESOURCE_KEYS})"));
        };
        let (key, value) = (key.trim(), value.trim());
        let number: f64 = value
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("{key}: {value:?} is not a non-negative number"))?;
        let slot = match key {
            "cpu" | "cpus" => {
                if number == 0.0 {
                    return Err("cpu: must be more than 0".to_owned());
                }
                &mut out.cpu
            }
            "mem" | "memory" => &mut out.memory_mb,
            "disk" => &mut out.disk_mb,
            "gpu" | "gpus" => {
                if number.fract() != 0.0 {
                    return Err(format!("gpu: {value:?} is not a whole number of GPUs"));
                }
                &mut out.gpu
            }
            _ => {
                return Err(format!(
                    "unknown resource {key:?} (expected one of {RESOURCE_KEYS})"
                ));
            }
        };
        if slot.replace(number).is_some() {
            return Err(format!("{key} is given twice"));
        }
    }
    Ok(out)
}

fn parse_attribute(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!("{text:?} is not KEY=VALUE with a non-empty key")),
    }
}

/// Everything the agent runs with.
#[derive(Debug)]
pub struct AgentConfig {
    pub session: SessionConfig,
    pub supervisor: SupervisorConfig,
    pub log_json: bool,
    /// Why cgroup v2 is not used, when it is not.
    pub isolation_fallback: Option<String>,
}

/// Why the arguments cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--token-file {path}: {error}")]
    TokenFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--token-file {0}: the file is empty")]
    EmptyTokenFile(PathBuf),
    #[error("--work-dir {path}: {error}")]
    WorkDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{flag} {path}: {error}")]
    TlsFile {
        flag: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "--server {0}: an https:// server needs --ca-file (the CA that signed its certificate)"
    )]
    NoCa(String),
    #[error("cannot tell the host name ({0}); pass --host")]
    HostName(String),
    #[error("--isolation cgroup-v2: {0}")]
    Isolation(String),
}

impl Args {
    /// Reads the token file, detects what was not given. `agent_exe` is
    /// the agent's own binary (executed once as the launcher).
    pub fn resolve(self, agent_exe: PathBuf) -> Result<AgentConfig, ConfigError> {
        let token = match (&self.token, &self.token_file) {
            (_, Some(path)) => {
                let text =
                    std::fs::read_to_string(path).map_err(|error| ConfigError::TokenFile {
                        path: path.clone(),
                        error,
                    })?;
                let token = text.trim_end().to_owned();
                if token.is_empty() {
                    return Err(ConfigError::EmptyTokenFile(path.clone()));
                }
                token
            }
            (Some(token), None) => token.clone(),
            (None, None) => String::new(),
        };
        let read = |flag: &'static str, path: &PathBuf| {
            std::fs::read_to_string(path).map_err(|error| ConfigError::TlsFile {
                flag,
                path: path.clone(),
                error,
            })
        };
        let tls = match &self.ca_file {
            Some(ca) => Some(crate::session::AgentTls {
                ca_pem: read("--ca-file", ca)?,
                identity: match (&self.cert_file, &self.key_file) {
                    (Some(c), Some(k)) => Some((read("--cert-file", c)?, read("--key-file", k)?)),
                    _ => None,
                },
            }),
            None => None,
        };
        if tls.is_none()
            && let Some(s) = self.server.0.iter().find(|s| s.starts_with("https://"))
        {
            return Err(ConfigError::NoCa(s.clone()));
        }
        std::fs::create_dir_all(&self.work_dir).map_err(|error| ConfigError::WorkDir {
            path: self.work_dir.clone(),
            error,
        })?;
        let host = match self.host {
            Some(host) => host,
            None => nix::unistd::gethostname()
                .map_err(|e| ConfigError::HostName(e.to_string()))?
                .into_string()
                .map_err(|_| ConfigError::HostName("not UTF-8".to_owned()))?,
        };
        let overrides = self.resources.unwrap_or_default();
        let resources = merge_resources(overrides, || detect::detect_resources(&self.work_dir));
        let (isolation, isolation_fallback) = match self.isolation {
            IsolationChoice::Auto => Isolation::detect(&self.cgroup_parent),
            IsolationChoice::Rlimit => (Isolation::Rlimit, None),
            IsolationChoice::CgroupV2 => (
                Isolation::cgroup_v2(&self.cgroup_parent).map_err(ConfigError::Isolation)?,
                None,
            ),
        };
        let supervisor = SupervisorConfig {
            work_dir: self.work_dir,
            agent_exe,
            isolation,
            ports: self.ports,
            max_runs: self.max_runs,
            open_files: self.open_files,
            // A whole number (checked by `parse_resources`, counted by
            // `detect`), at most what a `u32` holds.
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a whole, non-negative count of devices"
            )]
            gpus: resources.gpu.clamp(0.0, f64::from(u32::MAX)) as u32,
        };
        let session = SessionConfig {
            servers: self.server.0,
            token,
            tls,
            host,
            resources,
            attributes: self.attributes.into_iter().collect::<HashMap<_, _>>(),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            gc_interval: Duration::from_secs(self.gc_interval_s),
            usage_interval: Duration::from_secs(self.usage_interval_s),
            gc: GcPolicy {
                max_age_ms: self.gc_max_age_s.saturating_mul(1000),
                max_disk_bytes: self.gc_max_disk_mb.saturating_mul(1 << 20),
            },
            on_exit: if self.stop_tasks_on_exit {
                OnExit::StopTasks
            } else {
                OnExit::KeepTasks
            },
            advertise_address: self.advertise_address,
        };
        Ok(AgentConfig {
            session,
            supervisor,
            log_json: self.log_json,
            isolation_fallback,
        })
    }
}

/// The given dimensions, the rest detected (detection runs only if some
/// dimension is missing).
fn merge_resources(given: ResourceOverrides, detect: impl FnOnce() -> Resources) -> Resources {
    let all_given = given.cpu.is_some()
        && given.memory_mb.is_some()
        && given.disk_mb.is_some()
        && given.gpu.is_some();
    let detected = if all_given {
        Resources::default()
    } else {
        detect()
    };
    Resources {
        cpu: given.cpu.unwrap_or(detected.cpu),
        memory_mb: given.memory_mb.unwrap_or(detected.memory_mb),
        disk_mb: given.disk_mb.unwrap_or(detected.disk_mb),
        gpu: given.gpu.unwrap_or(detected.gpu),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_any_subset() {
        assert_eq!(
            parse_resources("cpu=4,mem=8192,disk=10000,gpu=0"),
            Ok(ResourceOverrides {
                cpu: Some(4.0),
                memory_mb: Some(8192.0),
                disk_mb: Some(10000.0),
                gpu: Some(0.0),
            })
        );
        assert_eq!(
            parse_resources(" cpu = 0.5 , memory=512"),
            Ok(ResourceOverrides {
                cpu: Some(0.5),
                memory_mb: Some(512.0),
                ..ResourceOverrides::default()
            })
        );
    }

    #[test]
    fn resource_errors_say_what_is_wrong() {
        let cases = [
            ("", "empty; expected KEY=VALUE pairs (cpu, mem, disk, gpu)"),
            ("cpu", "\"cpu\" is not KEY=VALUE (cpu, mem, disk, gpu)"),
            (
                "ram=4",
                "unknown resource \"ram\" (expected one of cpu, mem, disk, gpu)",
            ),
            ("cpu=four", "cpu: \"four\" is not a non-negative number"),
            ("mem=-1", "mem: \"-1\" is not a non-negative number"),
            ("mem=inf", "mem: \"inf\" is not a non-negative number"),
            ("cpu=0", "cpu: must be more than 0"),
            ("gpu=1.5", "gpu: \"1.5\" is not a whole number of GPUs"),
            ("cpu=1,cpu=2", "cpu is given twice"),
        ];
        for (input, message) in cases {
            assert_eq!(parse_resources(input), Err(message.to_owned()), "{input:?}");
        }
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let base = [
            "peloton-agent",
            "--server",
            "http://127.0.0.1:1",
            "--work-dir",
            "/tmp/x",
        ];
        let error = |extra: &[&str]| {
            let argv: Vec<&str> = base.iter().chain(extra).copied().collect();
            Args::try_parse_from(argv)
                .expect_err("must be refused")
                .to_string()
        };
        let message = error(&["--resources", "cpu=x"]);
        assert!(message.contains("--resources"), "{message}");
        assert!(
            message.contains("cpu: \"x\" is not a non-negative number"),
            "{message}"
        );
        assert!(error(&["--ports", "9-3"]).contains("--ports"));
        assert!(error(&["--attr", "=v"]).contains("--attr"));
        assert!(error(&["--token", "a", "--token-file", "f"]).contains("--token"));
        let server = Args::try_parse_from(["peloton-agent", "--server", "x:1", "--work-dir", "d"])
            .expect_err("bad server")
            .to_string();
        assert!(server.contains("--server"), "{server}");
        let parsed = Args::try_parse_from(base.iter().chain(&[
            "--attr",
            "zone=z1",
            "--ports",
            "31000-31999",
        ]))
        .expect("valid");
        assert_eq!(
            parsed.attributes,
            vec![("zone".to_owned(), "z1".to_owned())]
        );
        assert_eq!(parsed.ports.map(|p| p.len()), Some(1000));
        assert_eq!(parsed.gc_max_age_s, 604_800);
        assert_eq!(parsed.gc_max_disk_mb, 10_240);
    }

    #[test]
    fn server_takes_a_comma_separated_list() {
        let parse = |server: &str| {
            Args::try_parse_from(["peloton-agent", "--server", server, "--work-dir", "d"])
                .map(|args| args.server.0)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            parse("http://127.0.0.1:5391").expect("one"),
            ["http://127.0.0.1:5391"]
        );
        assert_eq!(
            parse("http://10.0.0.1:5000, http://10.0.0.2:5000").expect("two"),
            ["http://10.0.0.1:5000", "http://10.0.0.2:5000"]
        );
        let error = parse("http://10.0.0.1:5000,10.0.0.2:5000").expect_err("no scheme");
        assert!(error.contains("--server"), "{error}");
        assert!(
            error.contains("\"10.0.0.2:5000\" must start with http://"),
            "{error}"
        );
    }

    #[test]
    fn given_resources_win_and_the_rest_is_detected() {
        let detected = || Resources {
            cpu: 8.0,
            memory_mb: 1000.0,
            disk_mb: 50.0,
            gpu: 1.0,
        };
        let merged = merge_resources(parse_resources("mem=512").expect("valid"), detected);
        assert_eq!(merged.cpu, 8.0);
        assert_eq!(merged.memory_mb, 512.0);
        assert_eq!(merged.gpu, 1.0);
        let all = parse_resources("cpu=1,mem=2,disk=3,gpu=0").expect("valid");
        let merged = merge_resources(all, || panic!("nothing to detect"));
        assert_eq!((merged.cpu, merged.disk_mb), (1.0, 3.0));
    }
}
