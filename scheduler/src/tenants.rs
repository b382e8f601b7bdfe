//! Tenants and API keys. A key is `sk-fallow-` plus 32 random alphanumerics, shown once;
//! only its SHA-256 (hex) is stored ([`crate::credentials`]), so a leaked database leaks no
//! usable key.
//!
//! The statements live in `tenants/queries/*.sql`, one per operation.

use crate::{credentials, SchedulerError};
use sqlx::PgPool;
use uuid::Uuid;

/// Every key starts with this, so leaked keys are easy to recognise and scan for.
pub const KEY_PREFIX: &str = "sk-fallow-";

#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    /// Max queued+running jobs for this tenant.
    pub max_active_jobs: i64,
    /// This tenant's share of the fleet relative to other tenants' weights (default 1).
    pub weight: f64,
    /// Tenants of a higher class are served first within a band (default 0).
    pub class: i32,
    /// Rate limits and the batch quota (0: unlimited).
    pub rate: RateLimits,
}

/// A tenant's fair-share weight lies in (0, `MAX_WEIGHT`].
pub const MAX_WEIGHT: f64 = 1000.0;
/// A tenant's class lies in 0..=`MAX_CLASS`.
pub const MAX_CLASS: i32 = 100;

/// A tenant's rate limits and batch quota, as stored; 0 means unlimited (the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct RateLimits {
    /// Generation requests admitted per minute.
    pub requests_per_minute: i64,
    /// Tokens (prompt plus the most a request may generate) reserved per minute.
    pub tokens_per_minute: i64,
    /// Lines of unfinished batches the tenant may have at once.
    pub max_batch_queued_lines: i64,
}

/// The limits an operator changes at once; `None` keeps a limit as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct LimitsUpdate {
    pub max_active_jobs: Option<i64>,
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub max_batch_queued_lines: Option<i64>,
    /// Checked by the caller to lie in (0, [`MAX_WEIGHT`]].
    pub weight: Option<f64>,
    /// Checked by the caller to lie in 0..=[`MAX_CLASS`].
    pub class: Option<i32>,
}

/// A tenant row as the queries return it.
#[derive(sqlx::FromRow)]
struct TenantRow {
    id: Uuid,
    name: String,
    max_active_jobs: i64,
    weight: f64,
    class: i32,
    #[sqlx(flatten)]
    rate: RateLimits,
}

impl From<TenantRow> for Tenant {
    fn from(row: TenantRow) -> Self {
        Tenant {
            id: row.id,
            name: row.name,
            max_active_jobs: row.max_active_jobs,
            weight: row.weight,
            class: row.class,
            rate: row.rate,
        }
    }
}

/// Creates the tenant if needed and a new key for it; returns the plaintext key (once).
pub async fn create_key(pool: &PgPool, tenant: &str) -> Result<String, SchedulerError> {
    let key = credentials::generate(KEY_PREFIX);
    let mut tx = pool.begin().await?;
    let tenant_id = upsert_tenant(&mut tx, tenant).await?;
    sqlx::query(include_str!("tenants/queries/insert_key.sql"))
        .bind(Uuid::new_v4())
        .bind(tenant_id)
        .bind(hash_key(&key))
        .bind(credentials::shown(KEY_PREFIX, &key))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(key)
}

/// The tenant owning this key, if the key exists and is not revoked.
pub async fn tenant_for_key(pool: &PgPool, key: &str) -> Result<Option<Tenant>, SchedulerError> {
    let row: Option<TenantRow> = sqlx::query_as(include_str!("tenants/queries/tenant_for_key.sql"))
        .bind(hash_key(key))
        .fetch_optional(pool)
        .await?;
    Ok(row.map(Tenant::from))
}

/// Revokes a key; returns false if it was unknown or already revoked.
pub async fn revoke_key(pool: &PgPool, key: &str) -> Result<bool, SchedulerError> {
    let done = sqlx::query(include_str!("tenants/queries/revoke_key.sql"))
        .bind(hash_key(key))
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets a tenant's limit on queued+running jobs; returns false if the tenant is unknown.
pub async fn set_max_active_jobs(
    pool: &PgPool,
    tenant: &str,
    max_active_jobs: i64,
) -> Result<bool, SchedulerError> {
    let done = sqlx::query(include_str!("tenants/queries/set_max_active_jobs.sql"))
        .bind(tenant)
        .bind(max_active_jobs.max(0))
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Changes the limits `update` names (each clamped to 0 or more) and returns the tenant;
/// `None` if the tenant is unknown.
pub async fn set_limits(
    pool: &PgPool,
    tenant: &str,
    update: &LimitsUpdate,
) -> Result<Option<Tenant>, SchedulerError> {
    let row: Option<TenantRow> = sqlx::query_as(include_str!("tenants/queries/set_limits.sql"))
        .bind(tenant)
        .bind(update.max_active_jobs.map(|v| v.max(0)))
        .bind(update.requests_per_minute.map(|v| v.max(0)))
        .bind(update.tokens_per_minute.map(|v| v.max(0)))
        .bind(update.max_batch_queued_lines.map(|v| v.max(0)))
        .bind(update.weight)
        .bind(update.class)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(Tenant::from))
}

/// All tenants, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<Tenant>, SchedulerError> {
    let rows: Vec<TenantRow> = sqlx::query_as(include_str!("tenants/queries/list_tenants.sql"))
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(Tenant::from).collect())
}

/// An API key as operators see it: never the key itself, only its first characters.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct KeyRecord {
    pub id: Uuid,
    pub tenant: String,
    pub prefix: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every key (optionally of one tenant), oldest first.
pub async fn list_keys(
    pool: &PgPool,
    tenant: Option<&str>,
) -> Result<Vec<KeyRecord>, SchedulerError> {
    Ok(
        sqlx::query_as(include_str!("tenants/queries/list_keys.sql"))
            .bind(tenant)
            .fetch_all(pool)
            .await?,
    )
}

/// Revokes a key by its id (operators never hold the plaintext); false if it was unknown
/// or already revoked.
pub async fn revoke_key_id(pool: &PgPool, id: Uuid) -> Result<bool, SchedulerError> {
    let done = sqlx::query(include_str!("tenants/queries/revoke_key_id.sql"))
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// SHA-256 of the key, lowercase hex: what `api_keys.key_hash` holds.
pub fn hash_key(key: &str) -> String {
    credentials::hash(key)
}

async fn upsert_tenant(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    name: &str,
) -> Result<Uuid, SchedulerError> {
    let id: Uuid = sqlx::query_scalar(include_str!("tenants/queries/upsert_tenant.sql"))
        .bind(Uuid::new_v4())
        .bind(name)
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}
