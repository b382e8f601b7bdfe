//! Connecting to Postgres and applying `migrations/`.
//!
//! Every table is created unqualified, so the connection's `search_path` decides where the
//! schema lives. Production uses the server default (`public`); each test gets a fresh
//! schema (`t_<uuid>`), which keeps tests independent while they share one database.

use crate::SchedulerError;
use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

/// Migrations embedded at build time, so a binary never needs the source tree.
static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Pool sizing for [`connect_with`].
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub max_connections: u32,
    /// How long `acquire` waits before the caller sees an error (and the api a 503).
    pub acquire_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Connects with a pool whose connections use `schema` first in their search path (tests
/// use a fresh schema each; production uses `public`).
pub async fn connect(url: &str, schema: Option<&str>) -> Result<PgPool, SchedulerError> {
    connect_with(url, schema, &PoolConfig::default()).await
}

/// [`connect`] with explicit pool sizing.
pub async fn connect_with(
    url: &str,
    schema: Option<&str>,
    config: &PoolConfig,
) -> Result<PgPool, SchedulerError> {
    let search_path = schema.map(quoted_identifier).transpose()?;
    let pool = PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.acquire_timeout)
        .after_connect(move |conn, _meta| {
            let search_path = search_path.clone();
            Box::pin(async move {
                if let Some(path) = search_path {
                    conn.execute(format!("SET search_path TO {path}").as_str())
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?;
    Ok(pool)
}

/// Applies `migrations/` (embedded at build time).
pub async fn migrate(pool: &PgPool) -> Result<(), SchedulerError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// What a service does as it starts: nothing when the schema is this binary's, which needs
/// only `SELECT` on `_sqlx_migrations`, so least-privilege roles need no `CREATE` on the
/// schema; otherwise it applies the pending migrations, and says to run `fallow migrate`
/// as the schema's owner when its role may not.
/// Returns how many migrations it found pending.
pub async fn ensure_migrated(pool: &PgPool) -> Result<usize, SchedulerError> {
    let pending = pending_migrations(pool).await?;
    if pending == 0 {
        return Ok(0);
    }
    match MIGRATOR.run(pool).await {
        Err(MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _))
            if has_code(&e, INSUFFICIENT_PRIVILEGE) =>
        {
            Err(SchedulerError::MigrationsPending {
                pending,
                cause: e.to_string(),
            })
        }
        result => Ok(result.map(|()| pending)?),
    }
}

/// How many of this binary's migrations the schema lacks, or has in another form or half
/// applied; a schema with migrations this binary does not know counts too, so that sqlx's
/// check explains it. Read with sqlx's own queries, which need only `SELECT`.
async fn pending_migrations(pool: &PgPool) -> Result<usize, SchedulerError> {
    let mut conn = pool.acquire().await?;
    let applied = match conn.list_applied_migrations().await {
        Ok(applied) => applied,
        Err(MigrateError::Execute(e)) if has_code(&e, UNDEFINED_TABLE) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let dirty = !applied.is_empty() && conn.dirty_version().await?.is_some();
    let applied: HashMap<i64, &[u8]> = applied
        .iter()
        .map(|m| (m.version, &m.checksum[..]))
        .collect();
    let known: HashSet<i64> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect();
    let missing = MIGRATOR
        .iter()
        .filter(|m| known.contains(&m.version))
        .filter(|m| applied.get(&m.version) != Some(&&m.checksum[..]))
        .count();
    let unknown = applied.keys().filter(|v| !known.contains(v)).count();
    Ok(missing + unknown + usize::from(dirty))
}

const UNDEFINED_TABLE: &str = "42P01";
const INSUFFICIENT_PRIVILEGE: &str = "42501";

fn has_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(code))
}

/// Creates a uniquely named schema, migrates it, returns (pool, schema name). For tests.
pub async fn fresh_schema(url: &str) -> Result<(PgPool, String), SchedulerError> {
    let schema = format!("t_{}", Uuid::new_v4().simple());
    {
        let admin = PgPoolOptions::new().max_connections(1).connect(url).await?;
        admin
            .execute(format!("CREATE SCHEMA {}", quoted_identifier(&schema)?).as_str())
            .await?;
        admin.close().await;
    }
    let pool = connect(url, Some(&schema)).await?;
    migrate(&pool).await?;
    Ok((pool, schema))
}

/// Drops a schema made by [`fresh_schema`] with everything in it. For test clean-up.
pub async fn drop_schema(pool: &PgPool, schema: &str) -> Result<(), SchedulerError> {
    let sql = format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        quoted_identifier(schema)?
    );
    pool.execute(sql.as_str()).await?;
    Ok(())
}

/// Schema names end up inside SQL text (`SET search_path` takes no bind parameters), so
/// only plain identifiers are accepted, and they are quoted anyway.
fn quoted_identifier(name: &str) -> Result<String, SchedulerError> {
    let plain = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain {
        let message = format!("schema name {name:?} must be 1-63 characters of a-z, 0-9 and _");
        return Err(SchedulerError::Database(sqlx::Error::Configuration(
            message.into(),
        )));
    }
    Ok(format!("\"{name}\""))
}

#[cfg(test)]
mod tests {
    use super::quoted_identifier;

    #[test]
    fn plain_schema_names_are_quoted() {
        assert_eq!(
            quoted_identifier("t_abc123").ok().as_deref(),
            Some("\"t_abc123\"")
        );
    }

    #[test]
    fn schema_names_with_sql_in_them_are_rejected() {
        assert!(quoted_identifier("x\"; DROP TABLE jobs; --").is_err());
        assert!(quoted_identifier("").is_err());
        assert!(quoted_identifier("Public").is_err());
    }
}
