//! LoRA adapters an operator loaded through the admin API (`fallow admin loras load`): each
//! is servable as `BASE:NAME` on every runner that holds `BASE` and reads adapters from a
//! `--lora-dir`, from its path inside it. Adapters given to a runner with `--lora` are its
//! own, and listed with its models instead.

use crate::SchedulerError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// A loaded adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct LoadedLora {
    pub base: String,
    pub name: String,
    /// Relative to each runner's `--lora-dir`.
    pub path: String,
    pub created_at: DateTime<Utc>,
}

/// Loads adapter `name` over `base` from `path`, or points a loaded one at `path`.
pub async fn load(
    pool: &PgPool,
    base: &str,
    name: &str,
    path: &str,
) -> Result<LoadedLora, SchedulerError> {
    Ok(sqlx::query_as(include_str!("loras/queries/load.sql"))
        .bind(base)
        .bind(name)
        .bind(path)
        .fetch_one(pool)
        .await?)
}

/// Unloads adapter `name` over `base`; `None` if it was not loaded.
pub async fn unload(
    pool: &PgPool,
    base: &str,
    name: &str,
) -> Result<Option<LoadedLora>, SchedulerError> {
    Ok(sqlx::query_as(include_str!("loras/queries/unload.sql"))
        .bind(base)
        .bind(name)
        .fetch_optional(pool)
        .await?)
}

/// Every loaded adapter.
pub async fn list(pool: &PgPool) -> Result<Vec<LoadedLora>, SchedulerError> {
    Ok(sqlx::query_as(include_str!("loras/queries/list.sql"))
        .fetch_all(pool)
        .await?)
}
