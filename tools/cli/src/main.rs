//! `peloton`: parse the command line, run the command, turn a failure into
//! one line on stderr and an exit code (see `peloton --help`).

use std::process::ExitCode;

use clap::Parser;
use peloton_cli::cli::Cli;
use peloton_cli::{cmd, error};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(error::EXIT_SERVER);
        }
    };
    match runtime.block_on(cmd::run(cli)) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(err) if error::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            let (message, code) = error::report(&err);
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}
