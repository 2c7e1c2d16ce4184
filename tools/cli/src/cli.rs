//! The command line: global flags and the command tree, as clap derive
//! structs. Values are parsed here (states, labels) so a bad flag is a usage
//! error before any call is made.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use peloton_proto::v1::{Grant, JobState, Role, TaskState};

use crate::names;
use crate::output::OutputArg;

const AFTER_HELP: &str = "\
Secure servers (TLS and bearer tokens):
  An https:// server's certificate is checked against the CA file given by --ca-file,
  PELOTON_CA_FILE or `ca_file:` in the config file (pelotond, secure unless --insecure, keeps
  its private CA in DATA_DIR/tls/ca.pem). Once a CA file is configured, an address without a scheme is
  https://; otherwise it is http://.
  The token is never a flag. The first found of: PELOTON_TOKEN, PELOTON_TOKEN_FILE (a file
  holding it), the config file's `token_file`, the config file's `token`. It is sent as
  `authorization: Bearer <token>` with every call (the bootstrap admin token is in
  DATA_DIR/admin-token).
  Instead of a token, a client certificate issued for one (`peloton token cert NAME`):
  --cert-file and --key-file, PELOTON_CERT_FILE and PELOTON_KEY_FILE, or `cert_file:` and
  `key_file:` in the config file. A certificate from a flag or variable replaces any token; one
  from the config file is used when no token is found (a token found is sent and wins).

Config file:
  --config FILE or PELOTON_CONFIG, else $XDG_CONFIG_HOME/peloton/config.yaml (default
  ~/.config/peloton/config.yaml) if it exists. YAML with the keys server, ca_file,
  cert_file, key_file, token_file and token; relative paths are relative to the file's directory. Flags beat
  environment variables, which beat the file. Keep a file holding `token:` private
  (chmod 600).

Exit codes:
  0  success
  1  the server returned an error or could not be reached
  2  bad command line or spec file
  3  `job create --wait`: the job ended but did not succeed;
     `job update`: the update ended but did not succeed
  130  `job create --wait` interrupted (the job keeps running)
Refusals of a secure server (unauthenticated: no, unknown or revoked token; permission
denied: the token's grants do not cover the call) are server errors: exit 1.";

#[derive(Debug, Parser)]
#[command(
    name = "peloton",
    version,
    about = "Command-line client for the Peloton scheduler",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Address of the Peloton server, or several, comma-separated: the
    /// first that accepts a connection is used, and a call a standby refuses
    /// ("not the leader") goes to the leader it names, else to the next
    /// address. Without a scheme, `http://` is assumed, or `https://` when a
    /// CA file is configured. Default: the config file's `server`, else
    /// 127.0.0.1:5391.
    #[arg(
        long,
        global = true,
        help_heading = "Connection (every command)",
        value_name = "ADDRESS[,ADDRESS...]",
        env = "PELOTON_SERVER",
        hide_env_values = true
    )]
    pub server: Option<String>,
    /// The CA certificate (PEM) that https:// servers' certificates must be
    /// signed with. Default: the config file's `ca_file`.
    #[arg(
        long,
        global = true,
        help_heading = "Connection (every command)",
        value_name = "FILE",
        env = "PELOTON_CA_FILE",
        hide_env_values = true
    )]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM) to authenticate with instead of a token
    /// (`peloton token cert NAME` makes one). Default: the config file's
    /// `cert_file`.
    #[arg(
        long,
        global = true,
        help_heading = "Connection (every command)",
        value_name = "FILE",
        env = "PELOTON_CERT_FILE",
        hide_env_values = true
    )]
    pub cert_file: Option<PathBuf>,
    /// The private key (PEM) of --cert-file. Default: the config file's
    /// `key_file`.
    #[arg(
        long,
        global = true,
        help_heading = "Connection (every command)",
        value_name = "FILE",
        env = "PELOTON_KEY_FILE",
        hide_env_values = true
    )]
    pub key_file: Option<PathBuf>,
    /// The config file (YAML: server, ca_file, cert_file, key_file,
    /// token_file, token). Default:
    /// $XDG_CONFIG_HOME/peloton/config.yaml or ~/.config/peloton/config.yaml,
    /// if it exists.
    #[arg(
        long,
        global = true,
        help_heading = "Connection (every command)",
        value_name = "FILE",
        env = "PELOTON_CONFIG",
        hide_env_values = true
    )]
    pub config: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = OutputArg::Table)]
    pub output: OutputArg,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Resource pools.
    #[command(subcommand)]
    Respool(RespoolCommand),
    /// Jobs.
    #[command(subcommand)]
    Job(JobCommand),
    /// Tasks: the instances of a job.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Hosts and their maintenance.
    #[command(subcommand)]
    Host(HostCommand),
    /// The cluster as a whole.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Rolling updates of services.
    #[command(subcommand)]
    Update(UpdateCommand),
    /// Persistent volumes of stateful instances.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Host pools: a partition of the hosts that jobs name (`host_pool:`).
    #[command(subcommand)]
    Hostpool(HostPoolCommand),
    /// Cron jobs (`schedule:`): a tick now, suspend, resume.
    #[command(subcommand)]
    Cron(CronCommand),
    /// Print job and task events as they happen, until interrupted.
    Watch(WatchArgs),
    /// Access tokens of a secure server (cluster admins).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Agents on other machines (cluster admins).
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Show the caller: the token's name and grants.
    Whoami,
    /// The audit log of a secure server: every mutating call, allowed or
    /// not, newest first (cluster admins).
    Audit(AuditArgs),
    /// Sums of the ended runs' accounts (resource-seconds requested and
    /// used, wall time, peak memory), by owner, job or pool.
    Usage(UsageArgs),
    /// What a job spec field means: `peloton explain task.resources`
    /// (its type, default, description and fields; no server needed).
    /// Every field: docs/job-spec.md.
    Explain {
        /// The field's path, dot-separated (`sla.gang_size`); none: the
        /// spec's top-level fields.
        #[arg(value_name = "FIELD.PATH", default_value = "")]
        field: String,
    },
    /// Print a completion script for a shell: `source <(peloton completion
    /// bash)` (in ~/.bashrc), `peloton completion zsh >
    /// "${fpath[1]}/_peloton"`, `peloton completion fish >
    /// ~/.config/fish/completions/peloton.fish`.
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run a command as a batch job, without a spec file: `peloton run
    /// --pool /demo -n 4 --cpu 0.5 -- python3 train.py --epochs 3`. The
    /// pool defaults to `PELOTON_POOL` or the config file's `pool`.
    #[command(override_usage = "peloton run [OPTIONS] -- <COMMAND> [ARGS]...")]
    Run(RunArgs),
    /// Print the native YAML of a job or pool file in Peloton's format.
    #[command(
        override_usage = "peloton convert [RESPOOL] <FILE>",
        after_help = PELOTON_FORMAT
    )]
    Convert(PoolAndFile),
}

const PELOTON_FORMAT: &str = "\
Peloton's format (uber/peloton's v0 job config and resource pool config, keys in any case) is
read as well as ours, told apart by its keys (instanceCount, defaultConfig, resources, ...).
Every field is mapped, or refused with its YAML path and the reason (e.g. container: no Docker
images; static ports; HTTP health checks on a fixed port; URIs to fetch). As in Peloton, the
config each instance runs (instanceConfig merged over defaultConfig) is what is checked, and only
instance 0 may be a controller (in a larger batch job, its controller task: when it ends the
other instances are stopped and the job ends as it did). A health check with enabled: false is no health check; a
pool's policy must be PriorityFIFO (or UNKNOWN), what every pool does here. A job's owningTeam,
ldapGroups and description become the labels peloton.owning_team, peloton.ldap_groups and
peloton.description; a task's name is ignored; noted on stderr: changeLog and a pool's
owningTeam, ldapGroups and description (ignored), fdLimit (tasks get the agent's open-file
limit), a batch job's killOnPreempt (a preempted task runs again; a service may not set it),
a controller instance 0 of a larger service (an ordinary task),
preemptibility that differs between instances (the job is non-preemptible), a key given twice
(the last is taken). MB (memLimitMb, diskLimitMb, a
pool's memory and disk) are taken as MiB; cpu is cores. Where Peloton reads 0 as none (a pool's
limit, a kind the pool does not list, maxPercent), the smallest amount stands for it, as 0 means
no limit here. RESPOOL, as in Peloton's CLI, is the job's pool (`job create /demo job.yaml`) or
the pool's own path, ending in its name (`respool create /demo/batch pool.yaml`).
`peloton convert [RESPOOL] FILE` prints such a file in our format.";

/// `[RESPOOL] FILE`, Peloton's command-line shape: the pool first.
#[derive(Debug, Args)]
pub struct PoolAndFile {
    /// The file, or with two arguments the pool path (an absolute path
    /// such as /demo) followed by the file.
    #[arg(value_name = "RESPOOL|FILE")]
    first: String,
    /// The file, after a pool path.
    #[arg(value_name = "FILE")]
    second: Option<PathBuf>,
}

impl PoolAndFile {
    /// The pool path, if one is given, and the file.
    pub fn resolve(&self) -> Result<(Option<&str>, PathBuf), crate::error::UsageError> {
        match &self.second {
            None => Ok((None, PathBuf::from(&self.first))),
            Some(file) if self.first.starts_with('/') => Ok((Some(&self.first), file.clone())),
            Some(_) => Err(crate::error::UsageError(format!(
                "RESPOOL: expected an absolute pool path such as /demo before the file, got `{}`",
                self.first
            ))),
        }
    }
}

#[derive(Debug, Args)]
pub struct VersionArg {
    /// Fail if the entity changed since this version (0: whatever is current).
    #[arg(long, default_value_t = 0)]
    pub version: u64,
}

#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// Start one tick now, as the schedule's would (its overlap policy
    /// applies: refused where such a tick would be skipped); the schedule
    /// goes on unchanged. Prints the tick's job id.
    RunNow {
        /// The cron job (id, a unique start of it, or its name).
        job: String,
        #[command(flatten)]
        version: VersionArg,
    },
    /// No tick until resumed (kept across server restarts); the ticks'
    /// jobs that run go on.
    Suspend {
        /// The cron job.
        job: String,
        #[command(flatten)]
        version: VersionArg,
    },
    /// Tick again from now on (the ticks missed meanwhile are not made up).
    Resume {
        /// The cron job.
        job: String,
        #[command(flatten)]
        version: VersionArg,
    },
}

/// A pool's path as given: `/PATH`, or `respool/PATH` (a line of
/// `respool list -o name`).
fn parse_pool_path(given: &str) -> Result<String, String> {
    Ok(match given.strip_prefix("respool/") {
        Some(path) => format!("/{path}"),
        None => given.to_string(),
    })
}

#[derive(Debug, Subcommand)]
pub enum RespoolCommand {
    /// Create one pool, or a tree of pools (`pools: [...]`, created parents
    /// first), or one pool from Peloton's resource pool config.
    #[command(
        override_usage = "peloton respool create [RESPOOL] <FILE>",
        after_help = PELOTON_FORMAT
    )]
    Create(PoolAndFile),
    /// Show one pool.
    Get {
        /// Absolute path, e.g. /batch/research (or `-o name`'s respool/batch/research).
        #[arg(value_parser = parse_pool_path)]
        path: String,
    },
    /// List every pool.
    List,
    /// Replace the spec of the pool(s) in a YAML file (either format).
    #[command(override_usage = "peloton respool update [RESPOOL] <FILE> [--version N]")]
    Update {
        #[command(flatten)]
        target: PoolAndFile,
        #[command(flatten)]
        version: VersionArg,
    },
    /// Delete a pool. Refused while it holds jobs: unfinished ones must be
    /// killed first; ended ones (which could not be restarted without their
    /// pool) must be deleted first, or with `--force` go with it.
    Delete {
        /// Absolute path, e.g. /batch/research (or `-o name`'s respool/batch/research).
        #[arg(value_parser = parse_pool_path)]
        path: String,
        #[command(flatten)]
        version: VersionArg,
        /// Delete the pool's ended jobs with it.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job from a YAML spec: ours, or Peloton's job config.
    #[command(
        override_usage = "peloton job create [RESPOOL] <SPEC> [--wait] [--secret NAME=FILE]...",
        after_help = PELOTON_FORMAT
    )]
    Create {
        /// `[RESPOOL] SPEC`: the job's YAML file (`-`: stdin), after the
        /// pool it runs in if given (which then replaces the file's pool).
        #[command(flatten)]
        target: PoolAndFile,
        /// Show progress until the job ends; exit 3 unless it succeeded.
        #[arg(long)]
        wait: bool,
        /// A secret from a file (repeatable): delivered only to the job's
        /// tasks, as `$PELOTON_SECRETS/NAME` (mode 0600); never shown.
        #[arg(long = "secret", value_name = "NAME=FILE", value_parser = parse_secret)]
        secrets: Vec<(String, PathBuf)>,
        /// Print only the job's id (`ID=$(peloton job create -q spec.yaml)`);
        /// with --wait, nothing more: the exit code says how it ended.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Where and when a job from a YAML spec would start if submitted now,
    /// changing nothing: per instance its host, start time and queue
    /// position, and the running tasks it would preempt (the scheduler's
    /// forecast: running work ends at its runtime estimates; victims are
    /// chosen as the scheduler chooses them). A spec that would be refused
    /// is refused, naming the limit that binds.
    #[command(
        override_usage = "peloton job plan [RESPOOL] <SPEC>",
        after_help = PELOTON_FORMAT
    )]
    Plan {
        /// `[RESPOOL] SPEC`, as for `job create`.
        #[command(flatten)]
        target: PoolAndFile,
    },
    /// Show one job.
    Get { id: String },
    /// Find jobs (every filter must match).
    Query(QueryArgs),
    /// Kill every task of jobs: those named, or the active jobs a
    /// selector, an owner or `--mine` matches (listed first, and killed
    /// once confirmed: `--yes`, or `y` on a terminal).
    #[command(
        override_usage = "peloton job kill ID...\n       peloton job kill [--selector KEY=VALUE]... [--owner OWNER | --mine] [--pool POOL] [--yes]"
    )]
    Kill {
        /// Jobs to kill (ids or unique starts of them).
        #[arg(required_unless_present_any = ["selector", "owner", "mine"], conflicts_with_all = ["selector", "owner", "mine", "pool"])]
        ids: Vec<String>,
        /// Active jobs with this label (repeatable: every one must match).
        #[arg(long = "selector", short = 'l', value_name = "KEY=VALUE", value_parser = parse_label)]
        selector: Vec<(String, String)>,
        /// Active jobs of this owner.
        #[arg(long, conflicts_with = "mine")]
        owner: Option<String>,
        /// The caller's active jobs (as `job query --mine`).
        #[arg(long)]
        mine: bool,
        /// Only jobs in this pool (with a selector, owner or --mine).
        #[arg(long)]
        pool: Option<String>,
        /// Kill the matching jobs without asking.
        #[arg(short, long)]
        yes: bool,
        #[command(flatten)]
        version: VersionArg,
    },
    /// Change a batch job's priority, run time limit, tolerated failures or
    /// running-instance cap, for its instances not started yet (running
    /// ones keep theirs). Services change by `job update`.
    #[command(
        override_usage = "peloton job edit ID [--priority N] [--max-running N] [--max-running-time-ms MS] [--max-failures N] [--version V]"
    )]
    Edit {
        id: String,
        /// `sla.priority`.
        #[arg(long)]
        priority: Option<u32>,
        /// `sla.max_running_instances` (0: no limit).
        #[arg(long = "max-running", value_name = "N")]
        max_running: Option<u32>,
        /// `sla.max_running_time_ms` (0: no limit).
        #[arg(long = "max-running-time-ms", value_name = "MS")]
        max_running_time_ms: Option<u64>,
        /// `restart.max_failures` of every instance's task.
        #[arg(long = "max-failures", value_name = "N")]
        max_failures: Option<u32>,
        #[command(flatten)]
        version: VersionArg,
    },
    /// Delete a job (it must be terminal).
    Delete {
        id: String,
        #[command(flatten)]
        version: VersionArg,
    },
    /// Change the number of instances.
    Scale {
        id: String,
        /// New instance count.
        count: u32,
        #[command(flatten)]
        version: VersionArg,
    },
    /// Restart every task of a job (`--failed`: only the instances whose
    /// last run failed or was lost).
    Restart {
        id: String,
        #[command(flatten)]
        version: VersionArg,
        /// Only the instances whose last run failed or was lost.
        #[arg(long)]
        failed: bool,
    },
    /// Roll a service to a new spec, a batch of instances at a time; a
    /// batch job's spec may differ only in what `job edit` changes (an
    /// edit).
    Update(UpdateArgs),
    /// Every launched instance's stdout (or stderr), each line after
    /// `[INSTANCE]` (as `task logs JOB`).
    Logs {
        id: String,
        #[command(flatten)]
        options: LogOptions,
    },
    /// The accounts of a job's ended runs, one line per run (as Slurm's
    /// `sacct`): elapsed, state, exit, host, CPU requested and used
    /// (core-seconds), peak memory.
    Usage {
        id: String,
        /// Runs that ended at or after T (RFC 3339, or ago: 30m, 1h, 7d).
        #[arg(long, value_name = "T", value_parser = parse_time)]
        since: Option<u64>,
        /// Runs that ended before T (as --since).
        #[arg(long, value_name = "T", value_parser = parse_time)]
        until: Option<u64>,
    },
}

/// How `peloton usage` groups the runs' accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageBy {
    /// By the jobs' owners.
    Owner,
    /// By job.
    Job,
    /// By pool.
    Pool,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only runs of jobs in this pool.
    #[arg(long, value_name = "P")]
    pub pool: Option<String>,
    /// Only runs of jobs of this owner.
    #[arg(long)]
    pub owner: Option<String>,
    /// Sum by owner, job or pool.
    #[arg(long, value_enum, default_value_t = UsageBy::Owner)]
    pub by: UsageBy,
    /// Runs that ended at or after T (RFC 3339, e.g. 2026-12-01T00:00:00Z,
    /// or ago: 90s, 30m, 1h, 7d, 2w).
    #[arg(long, value_name = "T", value_parser = parse_time)]
    pub since: Option<u64>,
    /// Runs that ended before T (as --since).
    #[arg(long, value_name = "T", value_parser = parse_time)]
    pub until: Option<u64>,
    /// Write the runs' accounts (one row per run, the filters applied,
    /// not summed) to FILE as Arrow IPC, for notebooks.
    #[arg(long, value_name = "FILE")]
    pub arrow: Option<std::path::PathBuf>,
}

/// A time for `--since`/`--until`, in ms since the epoch: RFC 3339, or a
/// span ago (`90s`, `30m`, `1h`, `7d`, `2w`).
pub fn parse_time(text: &str) -> Result<u64, String> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    parse_time_at(text, now_ms)
}

/// [`parse_time`] with the time now given.
pub fn parse_time_at(text: &str, now_ms: u64) -> Result<u64, String> {
    let bad = || {
        format!(
            "`{text}` is neither an RFC 3339 time (2026-12-01T08:00:00Z) nor a span ago \
             (90s, 30m, 1h, 7d, 2w)"
        )
    };
    if let Some(unit) = text.chars().last().filter(char::is_ascii_alphabetic)
        && !text.contains('-')
    {
        let n: u64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
        let unit_ms: u64 = match unit {
            's' => 1000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            _ => return Err(bad()),
        };
        let ago = n.checked_mul(unit_ms).ok_or_else(bad)?;
        return now_ms.checked_sub(ago).ok_or_else(bad);
    }
    rfc3339_ms(text).ok_or_else(bad)
}

/// An RFC 3339 time (`YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`) in ms since
/// the epoch; none before it.
fn rfc3339_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        let digits = &frac[..n];
        millis = format!("{:0<3}", &digits[..n.min(3)]).parse().ok()?;
        rest = &frac[n..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest[1..].split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            sign * (h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    u64::try_from(secs * 1000 + millis).ok()
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// The service's job id.
    pub id: String,
    /// The new job spec (YAML).
    pub spec: PathBuf,
    /// Instances updated at once: at most this many are down because of
    /// the update at any moment.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// Failed runs of one instance on the new spec before it counts as failed.
    #[arg(long, default_value_t = 0)]
    pub max_instance_retries: u32,
    /// The update fails once more instances than this have failed.
    #[arg(long, default_value_t = 0)]
    pub max_failed_instances: u32,
    /// A failed update rolls back to the previous spec by itself.
    #[arg(long)]
    pub rollback_on_failure: bool,
    /// Create the update paused (`peloton update resume` starts it).
    #[arg(long)]
    pub paused: bool,
    /// Return at once instead of showing progress until the update ends.
    #[arg(long)]
    pub no_wait: bool,
    /// Replace the job's secrets with these (repeatable). Without any, the
    /// job keeps the secrets it has.
    #[arg(long = "secret", value_name = "NAME=FILE", value_parser = parse_secret)]
    pub secrets: Vec<(String, PathBuf)>,
    /// Remove every secret of the job.
    #[arg(long, conflicts_with = "secrets")]
    pub clear_secrets: bool,
    #[command(flatten)]
    pub version: VersionArg,
}

#[derive(Debug, Subcommand)]
pub enum UpdateCommand {
    /// Show one update.
    Get { id: String },
    /// A job's updates, newest first.
    List { job: String },
    /// Start no more instances until resumed.
    Pause { id: String },
    /// Go on with a paused update.
    Resume { id: String },
    /// Stop the update where it is (instances keep the spec they run).
    Abort { id: String },
    /// Move the instances back to the spec the update started from.
    Rollback { id: String },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Volumes, optionally of one job or on one host.
    List {
        /// Only this job's volumes.
        #[arg(long)]
        job: Option<String>,
        /// Only volumes on this host.
        #[arg(long)]
        host: Option<String>,
    },
    /// Show one volume.
    Get { id: String },
    /// Delete a volume and its data (refused while its instance runs on
    /// it); the instance's next run starts with a fresh volume, anywhere.
    Delete { id: String },
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Only jobs in this pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Only jobs in this state (repeatable): initialized, pending, running,
    /// succeeded, failed, killing, killed.
    #[arg(long = "state", value_name = "STATE", value_parser = names::parse::<JobState>)]
    pub states: Vec<JobState>,
    /// Only jobs with this name.
    #[arg(long)]
    pub name: Option<String>,
    /// Only jobs of this owner.
    #[arg(long, conflicts_with = "mine")]
    pub owner: Option<String>,
    /// Only the caller's jobs: those of its token on a secure server (the
    /// owner a secure server records), else of `$USER` (what the CLI puts
    /// in a spec without an owner).
    #[arg(long)]
    pub mine: bool,
    /// Only jobs with this label (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// At most this many jobs.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
    /// Print only the jobs' ids, one per line.
    #[arg(short, long)]
    pub quiet: bool,
    /// The order of the jobs shown: oldest first (`created`, the default),
    /// or by id.
    #[arg(long, value_enum, default_value_t = JobOrder::Created)]
    pub sort: JobOrder,
}

/// How `job query` orders the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JobOrder {
    /// Oldest first (the newest at the bottom, nearest the prompt).
    Created,
    /// By id.
    Id,
}

/// `peloton run`: a batch job from the command line.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The pool. Default: `PELOTON_POOL`, else the config file's `pool`.
    #[arg(long)]
    pub pool: Option<String>,
    /// Instances of the command.
    #[arg(short = 'n', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub instances: u32,
    /// Cores per instance.
    #[arg(long, default_value_t = 1.0, value_parser = parse_amount)]
    pub cpu: f64,
    /// Memory per instance, in MiB.
    #[arg(long = "mem", value_name = "MIB", default_value_t = 256.0, value_parser = parse_amount)]
    pub memory_mb: f64,
    /// GPUs per instance (a fraction shares one).
    #[arg(long, default_value_t = 0.0, value_parser = parse_amount)]
    pub gpu: f64,
    /// The job's name (unique among the pool's unfinished jobs). Default: the command's file
    /// name and six random hex digits, e.g. sleep-3fa2b1.
    #[arg(long)]
    pub name: Option<String>,
    /// An environment variable of the tasks (repeatable).
    #[arg(short, long = "env", value_name = "NAME=VALUE", value_parser = parse_label)]
    pub env: Vec<(String, String)>,
    /// Show progress until the job ends; exit 3 unless it succeeded.
    #[arg(long)]
    pub wait: bool,
    /// Print only the job's id.
    #[arg(short, long)]
    pub quiet: bool,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// List the tasks of a job.
    List {
        job: String,
        /// Only tasks in this state (repeatable), e.g. running, pending, failed.
        #[arg(long = "state", value_name = "STATE", value_parser = names::parse::<TaskState>)]
        states: Vec<TaskState>,
    },
    /// Show one task: its current run, earlier runs and why it is pending.
    /// `JOB INSTANCE`, or a `task/JOB/INSTANCE` line of `-o name`.
    Get {
        job: String,
        /// The instance (not with task/JOB/INSTANCE).
        instance: Option<u32>,
    },
    /// Kill instances of a job: `JOB INSTANCE...`, or `-o name`'s
    /// `task/JOB/INSTANCE` lines (of one job or several).
    Kill {
        job: String,
        #[arg(value_name = "INSTANCE")]
        instances: Vec<String>,
        /// The job's version.
        #[command(flatten)]
        version: VersionArg,
    },
    /// Restart instances of a job: `JOB INSTANCE...`, or `-o name`'s
    /// `task/JOB/INSTANCE` lines (of one job or several).
    Restart {
        job: String,
        #[arg(value_name = "INSTANCE")]
        instances: Vec<String>,
        /// The job's version.
        #[command(flatten)]
        version: VersionArg,
    },
    /// Print a task's stdout (or stderr), read from its host's agent;
    /// without an instance, every launched instance's, each line after
    /// `[INSTANCE]`.
    Logs {
        job: String,
        /// The instance (default: all of them).
        instance: Option<u32>,
        #[command(flatten)]
        options: LogOptions,
    },
}

/// What `task logs` and `job logs` show.
#[derive(Debug, Clone, Args)]
pub struct LogOptions {
    /// stderr instead of stdout.
    #[arg(long)]
    pub stderr: bool,
    /// Keep printing as the task writes, until its run ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// An earlier run (default: the current or latest launched run).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub run: Option<u32>,
    /// Only the last N lines (of each instance).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub tail: Option<u32>,
    /// Only output written at or after T (RFC 3339, or ago: 90s, 30m, 1h,
    /// 7d), to about a second.
    #[arg(long, value_name = "T", value_parser = parse_time)]
    pub since: Option<u64>,
    /// Each line after the time it was written by (UTC, to about a
    /// second: the agent samples its output's size).
    #[arg(long, short = 't')]
    pub timestamps: bool,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Write a snapshot of hosts, pools and tasks as Arrow IPC files, for
    /// notebooks, capacity planning and replay (`peloton-bench whatif`):
    /// DIR/hosts.arrow (one row per host: state, pool, capacity and free
    /// resources), DIR/pools.arrow (one row per resource pool: parent,
    /// reservation, limit, shares, kind, entitlement, allocation) and
    /// DIR/tasks.arrow (one row per task of every job: state, host,
    /// request, pending reason, priority, gang size, runtime estimate).
    /// Read them with pyarrow.ipc.open_file or any Arrow reader.
    Snapshot {
        /// Directory to write into (created if missing; existing files of
        /// the same names are replaced).
        dir: std::path::PathBuf,
    },
}

/// A host's name as given: `NAME`, or `host/NAME` (a line of `host list
/// -o name`; host names have no '/').
fn parse_host(given: &str) -> Result<String, String> {
    let name = given.strip_prefix("host/").unwrap_or(given);
    if name.is_empty() || name.contains('/') {
        return Err(format!("{given:?} is not a host name (NAME or host/NAME)"));
    }
    Ok(name.to_string())
}

#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// List hosts with their free and total resources.
    List,
    /// Start maintenance: drain the hosts' tasks and place nothing new on them.
    Drain {
        /// Host names (or `-o name`'s host/NAME lines).
        #[arg(required = true, value_name = "HOST", value_parser = parse_host)]
        hosts: Vec<String>,
    },
    /// Complete maintenance: the hosts take tasks again.
    Up {
        /// Host names (or `-o name`'s host/NAME lines).
        #[arg(required = true, value_name = "HOST", value_parser = parse_host)]
        hosts: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum HostPoolCommand {
    /// Create an empty host pool.
    Create { name: String },
    /// Delete a host pool (not "default"; it must have no hosts and no live job may name it).
    Delete { name: String },
    /// List host pools with their hosts.
    List,
    /// Move hosts into a host pool. Refused while they run tasks of jobs of
    /// other host pools (it names how many, where), unless `--force`.
    Move {
        /// The host pool they go to.
        #[arg(long)]
        to: String,
        /// Stop their tasks of jobs of other host pools: those start again on
        /// hosts of their own host pools (a daemon's instance there retires).
        #[arg(long)]
        force: bool,
        /// Host names (or `-o name`'s host/NAME lines).
        #[arg(required = true, value_name = "HOST", value_parser = parse_host)]
        hosts: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; its secret is printed this once (the server keeps
    /// only its digest).
    Create {
        /// Unique; 1-64 characters of [A-Za-z0-9._-].
        name: String,
        /// A role on a pool subtree (repeatable, at least one): ROLE is
        /// viewer, submitter, pool-admin or cluster-admin (on / only);
        /// POOL is an absolute path, covering the pools below it.
        #[arg(
            long = "grant",
            value_name = "ROLE:POOL",
            required = true,
            value_parser = parse_grant
        )]
        grants: Vec<Grant>,
    },
    /// List the tokens (never their secrets) and their certificates.
    List,
    /// Revoke a token: its next call is refused, and so is every call
    /// with its certificates.
    Revoke { name: String },
    /// Make a client certificate for a token: a key is made here and never
    /// leaves this machine; the server signs a request for it and records
    /// the certificate with the token. Writes DIR/NAME.pem and DIR/NAME.key
    /// (mode 0600); use them with --cert-file and --key-file.
    Cert {
        /// The token the certificate acts as.
        name: String,
        /// Where to write the certificate and its key.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Days it is valid (at most 365; default 90).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=365))]
        days: Option<u32>,
    },
    /// Revoke one client certificate of a token (by its fingerprint, as
    /// `token list -o json` or `token cert` shows it).
    CertRevoke { name: String, fingerprint: String },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Issue an agent's certificate for HOST, signed by the cluster's CA:
    /// a key made here, a request the server signs. Writes DIR/HOST.pem,
    /// DIR/HOST.key and DIR/agent-token (mode 0600) and DIR/ca.pem, and
    /// prints the `peloton-agent` command to run on HOST once DIR is
    /// copied there (to the same path).
    Cert {
        /// The host the agent registers as (its `--host`).
        host: String,
        /// Where to write the files (default: ./HOST, which must not exist
        /// or be empty).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Days it is valid (at most 365; default 365).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=365))]
        days: Option<u32>,
        /// The agent's work directory on HOST, for the printed command.
        #[arg(long, value_name = "DIR", default_value = "/var/lib/peloton")]
        work_dir: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this token's entries ("unauthenticated": calls without a valid
    /// token).
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Only entries before this sequence number (to page back from the
    /// oldest one shown).
    #[arg(long, value_name = "SEQ", value_parser = clap::value_parser!(u64).range(1..))]
    pub before: Option<u64>,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only this job's events.
    #[arg(long)]
    pub job: Option<String>,
    /// Replay the events from this revision on (inclusive), then follow.
    /// Revisions start at 1: `--from 1` replays every event the server
    /// still keeps (its --event-retention; older ones are refused with
    /// "no longer kept"). Without --from: only events from now on.
    #[arg(long, value_name = "REVISION", value_parser = parse_revision)]
    pub from: Option<u64>,
}

/// A revision to watch from: 1 or more (0 is the API's "from now", which
/// is what leaving `--from` out means).
fn parse_revision(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err(
            "revisions start at 1 (`--from 1`: from the oldest event kept); leave --from out to watch from now"
                .to_owned(),
        ),
        Ok(revision) => Ok(revision),
        Err(_) => Err(format!("{text:?} is not a revision (a whole number, 1 or more)")),
    }
}

/// The CLI's names of roles, as `--grant` takes them.
pub const ROLES: &[(Role, &str)] = &[
    (Role::Viewer, "viewer"),
    (Role::Submitter, "submitter"),
    (Role::PoolAdmin, "pool-admin"),
    (Role::ClusterAdmin, "cluster-admin"),
];

/// A role by its CLI name, case-insensitive, `_` for `-` allowed
/// (`pool-admin`, `POOL_ADMIN`).
pub fn parse_role(text: &str) -> Result<Role, String> {
    let wanted = text.replace('_', "-");
    ROLES
        .iter()
        .find(|(_, name)| name.eq_ignore_ascii_case(&wanted))
        .map(|(role, _)| *role)
        .ok_or_else(|| {
            let names: Vec<&str> = ROLES.iter().map(|(_, name)| *name).collect();
            format!(
                "unknown role `{text}` (expected one of: {})",
                names.join(", ")
            )
        })
}

/// The CLI name of a raw role (`unknown(9)` for one this client does not
/// know).
pub fn role_name(raw: i32) -> String {
    ROLES
        .iter()
        .find(|(role, _)| *role as i32 == raw)
        .map_or_else(|| format!("unknown({raw})"), |(_, name)| (*name).to_owned())
}

/// `ROLE:POOL`, e.g. `submitter:/a`.
pub fn parse_grant(text: &str) -> Result<Grant, String> {
    let Some((role, pool)) = text.split_once(':') else {
        return Err(format!(
            "expected ROLE:POOL (e.g. submitter:/a), got `{text}`"
        ));
    };
    let role = parse_role(role)?;
    if !pool.starts_with('/') {
        return Err(format!(
            "`{text}`: the pool must be an absolute path such as /a (or / for every pool)"
        ));
    }
    Ok(Grant {
        role: role as i32,
        pool: pool.to_owned(),
    })
}

/// Parses `key=value`; the value may contain `=`, the key may not be empty.
pub fn parse_secret(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, file)) if !name.is_empty() && !file.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(file)))
        }
        _ => Err(format!("expected NAME=FILE, got `{text}`")),
    }
}

/// A finite amount, 0 or more.
fn parse_amount(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("expected an amount of 0 or more, got `{text}`")),
    }
}

pub fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got `{text}`")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn completion_scripts_know_every_command_and_connection_flags_have_one_heading() {
        use clap::CommandFactory as _;
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "peloton", &mut script);
            let script = String::from_utf8(script).expect("UTF-8");
            for word in ["respool", "completion", "run", "server", "quiet"] {
                assert!(script.contains(word), "{shell:?} lacks {word}");
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let help = cmd
            .find_subcommand_mut("job")
            .and_then(|j| j.find_subcommand_mut("get"))
            .expect("job get")
            .render_long_help()
            .to_string();
        let heading = help
            .find("Connection (every command):")
            .expect("the heading");
        assert!(help[heading..].contains("--server"), "{help}");
        assert!(!help[..heading].contains("--server"), "{help}");
    }

    #[test]
    fn command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn pool_argument_comes_first_as_in_peloton() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|err| panic!("{err}"));
            match cli.command {
                Command::Job(JobCommand::Create { target, .. })
                | Command::Respool(RespoolCommand::Create(target))
                | Command::Convert(target) => target
                    .resolve()
                    .map(|(pool, file)| (pool.map(str::to_owned), file))
                    .map_err(|e| e.0),
                other => panic!("parsed as {other:?}"),
            }
        };
        assert_eq!(
            parse(&["peloton", "job", "create", "job.yaml", "--wait"]),
            Ok((None, PathBuf::from("job.yaml")))
        );
        assert_eq!(
            parse(&["peloton", "job", "create", "/demo", "job.yaml"]),
            Ok((Some("/demo".to_owned()), PathBuf::from("job.yaml")))
        );
        assert_eq!(
            parse(&["peloton", "respool", "create", "/demo/b", "pool.yaml"]),
            Ok((Some("/demo/b".to_owned()), PathBuf::from("pool.yaml")))
        );
        assert_eq!(
            parse(&["peloton", "convert", "pool.yaml"]),
            Ok((None, PathBuf::from("pool.yaml")))
        );
        let err = parse(&["peloton", "job", "create", "demo", "job.yaml"]).unwrap_err();
        assert!(
            err.starts_with("RESPOOL: expected an absolute pool path"),
            "{err}"
        );
        assert!(Cli::try_parse_from(["peloton", "job", "create", "/a", "b", "c"]).is_err());
    }

    #[test]
    fn grants_parse() {
        let grant = |role: Role, pool: &str| Grant {
            role: role as i32,
            pool: pool.to_owned(),
        };
        assert_eq!(
            parse_grant("submitter:/a"),
            Ok(grant(Role::Submitter, "/a"))
        );
        assert_eq!(parse_grant("Viewer:/"), Ok(grant(Role::Viewer, "/")));
        assert_eq!(
            parse_grant("POOL_ADMIN:/a/b"),
            Ok(grant(Role::PoolAdmin, "/a/b"))
        );
        assert_eq!(
            parse_grant("cluster-admin:/"),
            Ok(grant(Role::ClusterAdmin, "/"))
        );
        let err = parse_grant("owner:/a").unwrap_err();
        assert!(
            err.contains("unknown role `owner`") && err.contains("pool-admin"),
            "{err}"
        );
        assert!(
            parse_grant("viewer:a")
                .unwrap_err()
                .contains("absolute path")
        );
        assert!(parse_grant("viewer").unwrap_err().contains("ROLE:POOL"));
        for (role, name) in ROLES {
            assert_eq!(role_name(*role as i32), *name);
        }
        assert_eq!(role_name(99), "unknown(99)");
        let cli = Cli::try_parse_from([
            "peloton",
            "token",
            "create",
            "alice",
            "--grant",
            "submitter:/a",
            "--grant",
            "viewer:/",
        ])
        .unwrap_or_else(|err| panic!("{err}"));
        let Command::Token(TokenCommand::Create { name, grants }) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(name, "alice");
        assert_eq!(
            grants,
            [grant(Role::Submitter, "/a"), grant(Role::Viewer, "/")]
        );
        // At least one grant.
        assert!(Cli::try_parse_from(["peloton", "token", "create", "alice"]).is_err());
    }

    #[test]
    fn labels_parse() {
        assert_eq!(
            parse_label("team=infra"),
            Ok(("team".into(), "infra".into()))
        );
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_label("k="), Ok(("k".into(), String::new())));
        assert!(parse_label("=v").is_err());
        assert!(parse_label("novalue").is_err());
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "peloton",
            "job",
            "query",
            "--state",
            "running",
            "--state",
            "PENDING",
            "--label",
            "team=infra",
            "-o",
            "json",
        ])
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(cli.output, OutputArg::Json);
        let Command::Job(JobCommand::Query(query)) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(query.states, [JobState::Running, JobState::Pending]);
        assert_eq!(query.labels, [("team".to_owned(), "infra".to_owned())]);

        let watch = |args: &[&str]| {
            let argv = ["peloton", "watch"].iter().chain(args).copied();
            match Cli::try_parse_from(argv).map(|cli| cli.command) {
                Ok(Command::Watch(w)) => Ok(w.from),
                Ok(other) => panic!("parsed as {other:?}"),
                Err(err) => Err(err.to_string()),
            }
        };
        assert_eq!(watch(&[]), Ok(None));
        assert_eq!(watch(&["--from", "1"]), Ok(Some(1)));
        let zero = watch(&["--from", "0"]).unwrap_err();
        assert!(
            zero.contains("--from") && zero.contains("revisions start at 1"),
            "{zero}"
        );

        let err =
            Cli::try_parse_from(["peloton", "task", "list", "j", "--state", "done"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().contains("unknown task state `done`"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod time_tests {
    use super::parse_time_at;

    #[test]
    fn times_are_rfc_3339_or_a_span_ago() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_time_at("1h", now), Ok(now - 3_600_000));
        assert_eq!(parse_time_at("7d", now), Ok(now - 7 * 86_400_000));
        assert_eq!(parse_time_at("1970-01-01T00:00:01Z", now), Ok(1000));
        assert_eq!(
            parse_time_at("2026-12-06T12:00:00.5+01:00", now),
            Ok(1_796_554_800_500)
        );
        for bad in [
            "",
            "yesterday",
            "1y",
            "h",
            "2026-12-06",
            "2026-13-01T00:00:00Z",
            "-1h",
        ] {
            let e = parse_time_at(bad, now).unwrap_err();
            assert!(e.contains("RFC 3339"), "{bad}: {e}");
        }
    }
}
