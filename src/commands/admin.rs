//! `fallow admin …`.

use crate::cli::ServiceArgs;
use crate::config::Settings;

pub async fn create_key(tenant: &str, service: ServiceArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&service)?;
    let pool = fallow_scheduler::db::connect(&settings.database_url, None).await?;
    fallow_scheduler::db::migrate(&pool).await?;
    let key = fallow_scheduler::tenants::create_key(&pool, tenant).await?;
    println!("{key}");
    eprintln!("API key for tenant {tenant:?} created. It is shown only once; store it now.");
    Ok(())
}
