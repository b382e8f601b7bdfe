//! `fallow admin …`: `keys create` works on Postgres directly (the bootstrap: there may be
//! no api yet) or over the admin API with `--url`; every other command talks to the admin
//! API (`admin_cli.rs`).

use super::admin_cli::{self, AdminClientArgs};
use crate::cli::{AdminCommand, KeysCommand, ServiceArgs};
use crate::config::Settings;

pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Keys {
            command:
                KeysCommand::Create {
                    tenant,
                    url: Some(url),
                    token,
                    ..
                },
        } => {
            let client = AdminClientArgs {
                url,
                token,
                json: false,
            };
            admin_cli::create_key(&client, &tenant).await
        }
        AdminCommand::Keys {
            command:
                KeysCommand::Create {
                    tenant,
                    url: None,
                    service,
                    ..
                },
        } => create_key(&tenant, *service).await,
        AdminCommand::Keys {
            command: KeysCommand::Remote(command),
        } => admin_cli::keys(command).await,
        AdminCommand::Remote(command) => admin_cli::run(command).await,
    }
}

pub async fn create_key(tenant: &str, service: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&service)?;
    let pool = fallow_scheduler::db::connect(&settings.database_url, None).await?;
    fallow_scheduler::db::ensure_migrated(&pool).await?;
    let key = fallow_scheduler::tenants::create_key(&pool, tenant).await?;
    println!("{key}");
    eprintln!("API key for tenant {tenant:?} created. It is shown only once; store it now.");
    Ok(())
}
