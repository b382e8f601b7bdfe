//! Logging: `RUST_LOG` wins; otherwise info for Fallow's crates (debug with `-v`).

use tracing_subscriber::EnvFilter;

pub fn init(verbose: bool) {
    let default = if verbose {
        "info,fallow=debug,fallow_api=debug,fallow_scheduler=debug,fallow_protocol=debug,fallow_runner=debug,fallow_engine=debug"
    } else {
        "info,sqlx=warn"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
