//! The `fallow` binary: parses the command line and hands off to a command module.

mod cli;
mod commands;
mod config;
mod telemetry;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    telemetry::init(cli.verbose);
    match commands::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
