//! Tenants and API keys. A key is `sk-fallow-` plus 32 random alphanumerics, shown once;
//! only its SHA-256 (hex) is stored, so a leaked database leaks no usable key.
//!
//! The statements live in `tenants/queries/*.sql`, one per operation.

use crate::SchedulerError;
use rand::distributions::Alphanumeric;
use rand::Rng;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// Every key starts with this, so leaked keys are easy to recognise and scan for.
pub const KEY_PREFIX: &str = "sk-fallow-";
const KEY_RANDOM_CHARS: usize = 32;
/// Characters of the key kept in clear (`prefix` column) to tell keys apart.
const SHOWN_CHARS: usize = KEY_PREFIX.len() + 4;

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
}

/// A tenant's fair-share weight lies in (0, `MAX_WEIGHT`].
pub const MAX_WEIGHT: f64 = 1000.0;
/// A tenant's class lies in 0..=`MAX_CLASS`.
pub const MAX_CLASS: i32 = 100;

/// A tenant as its row reads.
type TenantRow = (Uuid, String, i64, f64, i32);

impl From<TenantRow> for Tenant {
    fn from((id, name, max_active_jobs, weight, class): TenantRow) -> Self {
        Tenant {
            id,
            name,
            max_active_jobs,
            weight,
            class,
        }
    }
}

/// Creates the tenant if needed and a new key for it; returns the plaintext key (once).
pub async fn create_key(pool: &PgPool, tenant: &str) -> Result<String, SchedulerError> {
    let key = generate_key();
    let mut tx = pool.begin().await?;
    let tenant_id = upsert_tenant(&mut tx, tenant).await?;
    sqlx::query(include_str!("tenants/queries/insert_key.sql"))
        .bind(Uuid::new_v4())
        .bind(tenant_id)
        .bind(hash_key(&key))
        .bind(&key[..SHOWN_CHARS])
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

/// Sets a tenant's fair-share weight and class (`None` keeps the current value); returns
/// false if the tenant is unknown. Callers validate the ranges ([`MAX_WEIGHT`], [`MAX_CLASS`]);
/// the table's checks refuse a weight ≤ 0 or a negative class anyway.
pub async fn set_fair_share(
    pool: &PgPool,
    tenant: &str,
    weight: Option<f64>,
    class: Option<i32>,
) -> Result<bool, SchedulerError> {
    let done = sqlx::query(include_str!("tenants/queries/set_fair_share.sql"))
        .bind(tenant)
        .bind(weight)
        .bind(class)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
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
    hex::encode(Sha256::digest(key.as_bytes()))
}

fn generate_key() -> String {
    // thread_rng is a CSPRNG (ChaCha, reseeded from the OS).
    let random: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(KEY_RANDOM_CHARS)
        .map(char::from)
        .collect();
    format!("{KEY_PREFIX}{random}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_prefix_and_32_alphanumerics() {
        let key = generate_key();
        assert!(key.starts_with(KEY_PREFIX));
        let random = &key[KEY_PREFIX.len()..];
        assert_eq!(random.len(), 32);
        assert!(random.chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn key_hashes_are_sha256_hex() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
