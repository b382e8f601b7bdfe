//! The runner registry: registration, heartbeats, which models are live, and the operator's
//! states (`active`, `cordoned`, `draining`, `yielded`, `dead`).
//!
//! Heartbeat times are the database's own `now()` on both write and read, so the liveness
//! window is measured on one clock no matter how far runners' clocks drift.

use crate::SchedulerError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::BTreeMap;
use uuid::Uuid;

/// A runner whose last heartbeat is older than this is not serving anything.
pub const LIVE_WITHIN_SECS: i64 = 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunnerInfo {
    pub host: String,
    /// e.g. {"kind":"cpu","cores":2,"memory_bytes":…}
    pub devices: serde_json::Value,
    pub slots: i32,
    pub models: Vec<ModelEntry>,
}

/// A model a runner serves, as `/v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub id: String,
    pub context_length: u32,
    pub owned_by: String,
    /// Unix seconds when the runner loaded it.
    pub created: i64,
}

/// A registered runner, as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerRecord {
    pub id: Uuid,
    pub host: String,
    pub devices: serde_json::Value,
    pub slots: i32,
    pub models: Vec<ModelEntry>,
    pub state: String,
    pub in_flight: i32,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
}

/// The states an operator (or the runner itself) can put a runner in.
pub const RUNNER_STATES: [&str; 5] = ["active", "cordoned", "draining", "yielded", "dead"];

pub async fn register(pool: &PgPool, info: &RunnerInfo) -> Result<Uuid, SchedulerError> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO runners (id, host, devices, slots, models) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(&info.host)
    .bind(&info.devices)
    .bind(info.slots.max(0))
    .bind(models_json(&info.models)?)
    .execute(pool)
    .await?;
    Ok(id)
}

pub async fn heartbeat(pool: &PgPool, runner: Uuid, in_flight: i32) -> Result<(), SchedulerError> {
    let done =
        sqlx::query("UPDATE runners SET last_heartbeat = now(), in_flight = $2 WHERE id = $1")
            .bind(runner)
            .bind(in_flight.max(0))
            .execute(pool)
            .await?;
    if done.rows_affected() == 0 {
        return Err(SchedulerError::NotFound(format!(
            "runner {runner} is not registered"
        )));
    }
    Ok(())
}

/// Replaces the models a runner has warm (after it loads or evicts one).
pub async fn set_models(
    pool: &PgPool,
    runner: Uuid,
    models: &[ModelEntry],
) -> Result<(), SchedulerError> {
    sqlx::query("UPDATE runners SET models = $2 WHERE id = $1")
        .bind(runner)
        .bind(models_json(models)?)
        .execute(pool)
        .await?;
    Ok(())
}

/// Models served by runners whose heartbeat is recent, deduplicated by id.
pub async fn live_models(pool: &PgPool) -> Result<Vec<ModelEntry>, SchedulerError> {
    let rows: Vec<(serde_json::Value,)> = sqlx::query_as(
        "SELECT models FROM runners \
         WHERE state IN ('active', 'draining') \
           AND last_heartbeat > now() - make_interval(secs => $1) \
         ORDER BY registered_at",
    )
    .bind(LIVE_WITHIN_SECS as f64)
    .fetch_all(pool)
    .await?;
    // BTreeMap: a stable, sorted listing; the first (oldest) runner's entry wins.
    let mut models = BTreeMap::new();
    for (value,) in rows {
        for entry in decode_models(value)? {
            models.entry(entry.id.clone()).or_insert(entry);
        }
    }
    Ok(models.into_values().collect())
}

pub async fn deregister(pool: &PgPool, runner: Uuid) -> Result<(), SchedulerError> {
    sqlx::query("DELETE FROM runners WHERE id = $1")
        .bind(runner)
        .execute(pool)
        .await?;
    Ok(())
}

/// All registered runners, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<RunnerRecord>, SchedulerError> {
    let rows: Vec<RunnerRow> = sqlx::query_as(
        "SELECT id, host, devices, slots, models, state, in_flight, registered_at, \
         last_heartbeat FROM runners ORDER BY registered_at, id",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(RunnerRecord::try_from).collect()
}

/// One runner, if registered.
pub async fn get(pool: &PgPool, runner: Uuid) -> Result<Option<RunnerRecord>, SchedulerError> {
    let row: Option<RunnerRow> = sqlx::query_as(
        "SELECT id, host, devices, slots, models, state, in_flight, registered_at, \
         last_heartbeat FROM runners WHERE id = $1",
    )
    .bind(runner)
    .fetch_optional(pool)
    .await?;
    row.map(RunnerRecord::try_from).transpose()
}

/// Sets a runner's state (cordon, drain, resume = `active`, …); false if it is unknown.
pub async fn set_state(pool: &PgPool, runner: Uuid, state: &str) -> Result<bool, SchedulerError> {
    if !RUNNER_STATES.contains(&state) {
        return Err(SchedulerError::NotFound(format!(
            "unknown runner state {state:?}; expected one of {RUNNER_STATES:?}"
        )));
    }
    let done = sqlx::query("UPDATE runners SET state = $2 WHERE id = $1")
        .bind(runner)
        .bind(state)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[derive(sqlx::FromRow)]
struct RunnerRow {
    id: Uuid,
    host: String,
    devices: serde_json::Value,
    slots: i32,
    models: serde_json::Value,
    state: String,
    in_flight: i32,
    registered_at: DateTime<Utc>,
    last_heartbeat: DateTime<Utc>,
}

impl TryFrom<RunnerRow> for RunnerRecord {
    type Error = SchedulerError;
    fn try_from(row: RunnerRow) -> Result<Self, SchedulerError> {
        Ok(RunnerRecord {
            models: decode_models(row.models)?,
            id: row.id,
            host: row.host,
            devices: row.devices,
            slots: row.slots,
            state: row.state,
            in_flight: row.in_flight,
            registered_at: row.registered_at,
            last_heartbeat: row.last_heartbeat,
        })
    }
}

fn models_json(models: &[ModelEntry]) -> Result<serde_json::Value, SchedulerError> {
    serde_json::to_value(models)
        .map_err(|e| SchedulerError::Corrupt(format!("model list not serialisable: {e}")))
}

fn decode_models(value: serde_json::Value) -> Result<Vec<ModelEntry>, SchedulerError> {
    serde_json::from_value(value)
        .map_err(|e| SchedulerError::Corrupt(format!("runner models: {e}")))
}
