//! The `fallow` binary: parses the command line and hands off to a command module.

mod cli;
mod commands;
mod config;
mod secrets;
mod telemetry;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    telemetry::init(cli.verbose);
    // The CPU backend's process-wide settings, read once here before any model loads.
    let configured = config::cpu_settings()
        .and_then(|s| fallow_engine::cpu_settings::configure(s).map_err(anyhow::Error::msg));
    match configured.and_then(|()| commands::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
