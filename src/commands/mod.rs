//! One module per subcommand. Service commands share the connection and start-up helpers in
//! `services.rs`.

mod admin;
pub mod admin_cli;
mod admin_http;
mod batch;
mod bench;
mod bench_e2e;
mod bench_lora;
mod bench_neighbour;
mod generate;
mod services;

use crate::cli::{BatchCommand, BenchCommand, Cli, Command};

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate::generate(args),
        Command::Chat(args) => generate::chat(args),
        Command::Bench {
            command: BenchCommand::Engine(args),
        } => bench::engine(args),
        Command::Bench {
            command: BenchCommand::RandomLora(args),
        } => bench_lora::random_lora(args),
        other => runtime()?.block_on(run_async(other)),
    }
}

async fn run_async(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Dev(args) => services::dev(args).await,
        Command::Api(args) => services::api(args).await,
        Command::Scheduler(args) => services::scheduler(args).await,
        Command::Runner(args) => services::runner(args).await,
        Command::Migrate(args) => services::migrate(args).await,
        Command::Bench {
            command: BenchCommand::E2e(args),
        } => bench_e2e::e2e(args).await,
        Command::Bench {
            command: BenchCommand::Neighbour(args),
        } => bench_neighbour::neighbour(args).await,
        Command::Batch { command } => match command {
            BatchCommand::Submit { file, wait, client } => {
                batch::submit(&client, &file, wait).await
            }
            BatchCommand::Status { id, client } => batch::status(&client, &id).await,
            BatchCommand::Results { id, output, client } => {
                batch::results(&client, &id, output.as_deref()).await
            }
        },
        Command::Admin { command } => admin::run(command).await,
        Command::Generate(_)
        | Command::Chat(_)
        | Command::Bench {
            command: BenchCommand::Engine(_) | BenchCommand::RandomLora(_),
        } => unreachable!("engine-only commands run without a runtime"),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
