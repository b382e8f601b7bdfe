//! The `fallow` binary: parses the command line and hands off to a command module.

mod cli;
mod commands;
mod config;
mod secrets;
mod telemetry;

use clap::Parser;
use fallow_runner::control_plane::{PlaneError, EXIT_REVOKED};

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
            if PlaneError::is_revoked(&e) {
                // Restarting cannot help a revoked runner: systemd's unit does not.
                return std::process::ExitCode::from(EXIT_REVOKED);
            }
            std::process::ExitCode::FAILURE
        }
    }
}
