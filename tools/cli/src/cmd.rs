//! The commands: each connects through one shared channel, makes its calls
//! and prints the result in the chosen format.

mod access;
mod cluster;
mod convert;
mod host;
mod hostpool;
mod job;
mod respool;
mod task;
mod update;
mod usage;
mod volume;
mod watch;

use crate::channel::LeaderChannel;
use crate::cli::{Cli, Command};
use crate::error::EXIT_JOB_NOT_SUCCEEDED;
use crate::output::OutputFormat;
use crate::settings::{self, Options};

/// How a command that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// `job create --wait` saw the job end other than SUCCEEDED.
    JobNotSucceeded,
    /// Ctrl-C while waiting for a job (which keeps running).
    Interrupted,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::JobNotSucceeded => EXIT_JOB_NOT_SUCCEEDED,
            Outcome::Interrupted => 130,
        }
    }
}

/// What every command needs.
#[derive(Debug)]
struct Ctx {
    /// Where to connect, and how: the flags and their variables (the config
    /// file and the token are read when connecting).
    options: Options,
    /// Table, JSON or YAML (`-o wide` and `-o name` are tables, their
    /// [`Ctx::view`] says how).
    output: OutputFormat,
    view: crate::output::View,
}

impl Ctx {
    /// Connects to the first server that accepts (see [`LeaderChannel`]),
    /// with the CA and token configured (see [`settings`]). Commands call
    /// it after reading their input files, so a bad file is reported
    /// without needing a server; commands without a server (`convert`)
    /// never read the config file.
    async fn connect(&self) -> anyhow::Result<LeaderChannel> {
        let resolved = settings::resolve(&self.options, &settings::process_env)?;
        Ok(LeaderChannel::connect_with(resolved.servers, resolved.security).await?)
    }
}

/// Waits for `wait` unless Ctrl-C comes first: then says `on_interrupt`
/// (what goes on without us) and returns `None`.
async fn until_interrupted<T>(
    wait: impl std::future::Future<Output = anyhow::Result<T>>,
    on_interrupt: String,
) -> anyhow::Result<Option<T>> {
    tokio::select! {
        done = wait => done.map(Some),
        interrupted = tokio::signal::ctrl_c() => {
            anyhow::Context::context(interrupted, "listening for Ctrl-C")?;
            eprintln!("{on_interrupt}");
            Ok(None)
        }
    }
}

/// Whether `command` prints `-o name`'s lines.
fn lists_by_name(command: &Command) -> bool {
    use crate::cli::{HostCommand, JobCommand, RespoolCommand, TaskCommand};
    matches!(
        command,
        Command::Job(JobCommand::Get { .. } | JobCommand::Query(_))
            | Command::Task(TaskCommand::List { .. } | TaskCommand::Get { .. })
            | Command::Host(HostCommand::List)
            | Command::Respool(RespoolCommand::List | RespoolCommand::Get { .. })
    )
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<Outcome> {
    use crate::output::View;
    let (output, view) = cli.output.split();
    crate::output::set_output(output);
    if view == View::Name && !lists_by_name(&cli.command) {
        return Err(crate::error::UsageError(
            "-o name: only job query/get, task list/get, host list and respool list/get \
             print names"
                .into(),
        )
        .into());
    }
    let ctx = Ctx {
        options: Options {
            server: cli.server,
            config: cli.config,
            ca_file: cli.ca_file,
            cert_file: cli.cert_file,
            key_file: cli.key_file,
        },
        output,
        view,
    };
    match cli.command {
        Command::Respool(command) => respool::run(&ctx, command).await,
        Command::Job(command) => job::run(&ctx, command).await,
        Command::Task(command) => task::run(&ctx, command).await,
        Command::Host(command) => host::run(&ctx, command).await,
        Command::Cluster(command) => cluster::run(&ctx, command).await,
        Command::Update(command) => update::run(&ctx, command).await,
        Command::Volume(command) => volume::run(&ctx, command).await,
        Command::Hostpool(command) => hostpool::run(&ctx, command).await,
        Command::Cron(command) => job::cron(&ctx, command).await,
        Command::Watch(args) => watch::run(&ctx, args).await,
        Command::Token(command) => access::token(&ctx, command).await,
        Command::Agent(command) => access::agent(&ctx, command).await,
        Command::Whoami => access::whoami(&ctx).await,
        Command::Audit(args) => access::audit(&ctx, args).await,
        Command::Usage(args) => usage::usage(&ctx, args).await,
        Command::Convert(target) => convert::run(&target),
        Command::Run(args) => job::run_command(&ctx, args).await,
        Command::Explain { field } => {
            let f = crate::explain::explain(&field).map_err(crate::error::UsageError)?;
            match ctx.output {
                OutputFormat::Table => crate::output::print_out(&crate::explain::render(&f))?,
                OutputFormat::Json | OutputFormat::Yaml => {
                    crate::output::print_json(&serde_json::json!({
                        "field": f.path, "type": f.kind, "default": f.default, "required": f.required,
                        "description": f.description,
                        "values": f.values.iter().map(|(v, d)| serde_json::json!({"value": v, "description": d})).collect::<Vec<_>>(),
                        "fields": f.fields,
                    }))?;
                }
            }
            Ok(Outcome::Success)
        }
        Command::Completion { shell } => {
            let mut command = <crate::cli::Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "peloton", &mut script);
            crate::output::print_out(&String::from_utf8_lossy(&script))?;
            Ok(Outcome::Success)
        }
    }
}

/// The notes of a Peloton-format file (fields kept as labels or ignored),
/// on stderr so that they never mix with the output.
fn print_notes(file: &std::path::Path, notes: &[crate::peloton_yaml::Note]) {
    for note in notes {
        eprintln!("note: {}: {note}", file.display());
    }
}

/// A refusal the server would lift with `force` (a destructive action it
/// names, such as stopping tasks or deleting ended jobs) names the flag.
fn force_hint(status: tonic::Status, forced: bool) -> tonic::Status {
    if forced
        || status.code() != tonic::Code::FailedPrecondition
        || !status.message().contains("with force")
    {
        return status;
    }
    let message = format!("{} (--force to do so)", status.message());
    tonic::Status::new(status.code(), message)
}
