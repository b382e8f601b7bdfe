//! Which models runners hold in memory, and operators' requests to unload them.
//!
//! A runner writes its own `warm` list whenever it starts loading or unloads a model, so
//! claims (see `queue/queries/claim.sql`) can send a job to a runner that has its model warm
//! and other runners can tell how many warm replicas a model has. An operator's eviction is
//! a request queued on the runner's row (`evict`) plus a state hint; the runner takes the
//! requests on its next hint or heartbeat and unloads the model once its jobs are done.

use super::{LIVENESS_WINDOW, STATE_CHANNEL};
use crate::SchedulerError;
use sqlx::PgPool;
use std::collections::HashMap;
use uuid::Uuid;

/// Replaces the models the runner holds in memory (loaded or loading).
pub async fn set_warm(pool: &PgPool, runner: Uuid, warm: &[String]) -> Result<(), SchedulerError> {
    sqlx::query(include_str!("queries/set_warm.sql"))
        .bind(runner)
        .bind(warm)
        .execute(pool)
        .await?;
    Ok(())
}

/// How many live, active runners hold each model warm (models warm nowhere are absent).
pub async fn warm_replicas(pool: &PgPool) -> Result<HashMap<String, i64>, SchedulerError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(include_str!("queries/warm_replicas.sql"))
        .bind(LIVENESS_WINDOW.as_secs_f64())
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Asks a runner to unload `model` and tells it at once (the heartbeat is the fallback).
/// False if the runner is unknown.
pub async fn request_evict(
    pool: &PgPool,
    runner: Uuid,
    model: &str,
) -> Result<bool, SchedulerError> {
    let changed: Option<Uuid> = sqlx::query_scalar(include_str!("queries/request_evict.sql"))
        .bind(runner)
        .bind(model)
        .bind(STATE_CHANNEL)
        .fetch_optional(pool)
        .await?;
    Ok(changed.is_some())
}

/// Takes (and clears) the runner's pending eviction requests.
pub async fn take_evictions(pool: &PgPool, runner: Uuid) -> Result<Vec<String>, SchedulerError> {
    let taken: Option<Vec<String>> = sqlx::query_scalar(include_str!("queries/take_evictions.sql"))
        .bind(runner)
        .fetch_optional(pool)
        .await?;
    Ok(taken.unwrap_or_default())
}
