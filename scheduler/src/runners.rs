//! The runner registry: registration, heartbeats, which models are live (`models`: what a
//! runner may serve) and warm (`warm`: what it holds in memory, see `warm.rs`), and the
//! operator's states ([`RunnerState`]: `active`, `cordoned`, `draining`, `drained`,
//! `yielded`, `dead`; `state.rs`).
//!
//! The `state` column is shared by two writers with different rights: the operator sets
//! `active` (resume), `cordoned` and `draining`; the runner itself only moves between states
//! it owns (`draining → drained`, `active ⇄ yielded`) with conditional updates, so it never
//! overwrites an operator's decision. The maintenance loop marks silent runners `dead`
//! (`liveness.rs`); a dead runner that heartbeats again is `active` again.
//!
//! Heartbeat times are the database's own `now()` on both write and read, so the liveness
//! window ([`LIVENESS_WINDOW`]) is measured on one clock no matter how far runners' clocks
//! drift.
//!
//! The statements live in `runners/queries/*.sql`, one per operation.

use crate::SchedulerError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;
use uuid::Uuid;

pub mod claim_replay;
mod hints;
mod liveness;
mod pools;
mod state;
pub mod tokens;
mod warm;

pub use hints::state_hints;
pub use liveness::{mark_dead, LIVENESS_WINDOW};
pub use pools::pool_turn;
pub use state::{RunnerState, UnknownRunnerState};
pub use warm::{request_evict, set_warm, take_evictions, warm_replicas};

/// The Postgres channel on which an operator's state change is announced (payload: the
/// runner id), so the runner reacts at once instead of at its next heartbeat.
pub const STATE_CHANNEL: &str = "fallow_runners";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunnerInfo {
    pub host: String,
    /// e.g. {"kind":"cpu","cores":2,"memory_bytes":…}
    pub devices: serde_json::Value,
    pub slots: i32,
    /// The models it may serve (it loads a cold one when a job needs it).
    pub models: Vec<ModelEntry>,
    /// The ids of those it holds in memory now.
    #[serde(default)]
    pub warm: Vec<String>,
    /// The operator's group of runners it belongs to (see `pools.rs`).
    #[serde(default = "default_pool")]
    pub pool: String,
}

/// The pool of runners that name none.
pub const DEFAULT_POOL: &str = "default";

fn default_pool() -> String {
    DEFAULT_POOL.to_string()
}

/// A model a runner serves, as `/v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub id: String,
    pub context_length: u32,
    pub owned_by: String,
    /// Unix seconds when the runner loaded it.
    pub created: i64,
    /// The tool-call syntax the model writes (`hermes`, `llama3_json`, `mistral`), as the
    /// runner read it from the chat template or its configuration; `None` = unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_parser: Option<String>,
    /// The reasoning syntax (`qwen3`: `<think>…</think>` when the model opens it,
    /// `deepseek_r1`: the template opened `<think>`); `None` = the model does not reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_parser: Option<String>,
    /// What the model answers; entries written before embeddings read as chat.
    #[serde(default)]
    pub kind: ModelKind,
    /// An embedding model's vector length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// The shorter lengths an embedding model's vectors may be cut to (Matryoshka), the
    /// only values `dimensions` may ask for; empty for a model that declares none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matryoshka_dimensions: Vec<u32>,
    /// A LoRA adapter's base model (its id is then `BASE:NAME`); `None` for a base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// A base model whose runner reads adapters by path (`lora_path`) from a `--lora-dir`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lora_dir: bool,
    /// An adapter an operator loaded (see [`crate::loras`]): its path inside the runners'
    /// `--lora-dir`. `None` for a runner's own `--lora` adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_path: Option<String>,
}

/// What a model answers: chat and (legacy) completions, or embeddings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    #[default]
    Chat,
    Embedding,
}

/// A registered runner, as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerRecord {
    pub id: Uuid,
    pub host: String,
    pub devices: serde_json::Value,
    pub slots: i32,
    pub models: Vec<ModelEntry>,
    /// Models held in memory (loaded or loading).
    pub warm: Vec<String>,
    pub pool: String,
    pub state: RunnerState,
    pub in_flight: i32,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    /// `direct` (Postgres and Redis) or `gateway` (the runner API, with a runner token).
    pub transport: String,
    /// The name of the runner token it registered with (gateway runners).
    pub token: Option<String>,
}

/// Registers a new runner under a fresh id.
pub async fn register(pool: &PgPool, info: &RunnerInfo) -> Result<Uuid, SchedulerError> {
    let id = Uuid::new_v4();
    register_as(pool, id, info).await?;
    Ok(id)
}

/// Registers a runner under a known id: a runner whose row was removed (an operator, or a
/// database restored from backup) registers again as itself, so the jobs it holds, which
/// name it, stay its own.
pub async fn register_as(pool: &PgPool, id: Uuid, info: &RunnerInfo) -> Result<(), SchedulerError> {
    sqlx::query(include_str!("runners/queries/register_runner.sql"))
        .bind(id)
        .bind(&info.host)
        .bind(&info.devices)
        .bind(info.slots.max(0))
        .bind(models_json(&info.models)?)
        .bind(&info.warm)
        .bind(&info.pool)
        .execute(pool)
        .await?;
    Ok(())
}

/// Records that the runner is alive and how many jobs it holds; returns its state, which
/// is how the runner learns of an operator's cordon or drain. A runner that was marked
/// `dead` (it stalled, its jobs were requeued) is `active` again. `NotFound` when the runner
/// is not registered: it should [`register_as`] itself again.
pub async fn heartbeat(
    pool: &PgPool,
    runner: Uuid,
    in_flight: i32,
) -> Result<RunnerState, SchedulerError> {
    let state: Option<RunnerState> =
        sqlx::query_scalar(include_str!("runners/queries/heartbeat.sql"))
            .bind(runner)
            .bind(in_flight.max(0))
            .fetch_optional(pool)
            .await?;
    state.ok_or_else(|| SchedulerError::NotFound(format!("runner {runner} is not registered")))
}

/// The runner's own state change, made only from the states in `from` (e.g. `draining →
/// drained`, `active → yielded`) so it never overrides the operator. Returns the state
/// after the call; `NotFound` if the runner is unknown.
pub async fn report_state(
    pool: &PgPool,
    runner: Uuid,
    from: &[RunnerState],
    to: RunnerState,
) -> Result<RunnerState, SchedulerError> {
    // Bound as the column's words (`text[]`, `text`), as the statement compares them.
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let state: Option<RunnerState> =
        sqlx::query_scalar(include_str!("runners/queries/report_state.sql"))
            .bind(runner)
            .bind(&from)
            .bind(to.as_str())
            .fetch_optional(pool)
            .await?;
    state.ok_or_else(|| SchedulerError::NotFound(format!("runner {runner} is not registered")))
}

/// The runner's current state, if registered.
pub async fn state(pool: &PgPool, runner: Uuid) -> Result<Option<RunnerState>, SchedulerError> {
    Ok(
        sqlx::query_scalar(include_str!("runners/queries/read_state.sql"))
            .bind(runner)
            .fetch_optional(pool)
            .await?,
    )
}

/// Replaces the models a runner may serve.
pub async fn set_models(
    pool: &PgPool,
    runner: Uuid,
    models: &[ModelEntry],
) -> Result<(), SchedulerError> {
    sqlx::query(include_str!("runners/queries/set_models.sql"))
        .bind(runner)
        .bind(models_json(models)?)
        .execute(pool)
        .await?;
    Ok(())
}

/// Models served by runners whose heartbeat is recent, deduplicated by id. A `yielded`
/// runner counts: its owner borrowed the machine for a while, and a request for its model
/// should wait in the queue for it rather than be refused; a cordoned or drained runner was
/// taken out of service on purpose and does not.
pub async fn live_models(pool: &PgPool) -> Result<Vec<ModelEntry>, SchedulerError> {
    let rows: Vec<(serde_json::Value,)> =
        sqlx::query_as(include_str!("runners/queries/live_models.sql"))
            .bind(LIVENESS_WINDOW.as_secs_f64())
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
    sqlx::query(include_str!("runners/queries/deregister_runner.sql"))
        .bind(runner)
        .execute(pool)
        .await?;
    Ok(())
}

/// All registered runners, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<RunnerRecord>, SchedulerError> {
    let rows: Vec<RunnerRow> = sqlx::query_as(include_str!("runners/queries/list_runners.sql"))
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(RunnerRecord::try_from).collect()
}

/// One runner, if registered.
pub async fn get(pool: &PgPool, runner: Uuid) -> Result<Option<RunnerRecord>, SchedulerError> {
    let row: Option<RunnerRow> = sqlx::query_as(include_str!("runners/queries/get_runner.sql"))
        .bind(runner)
        .fetch_optional(pool)
        .await?;
    row.map(RunnerRecord::try_from).transpose()
}

/// Sets a runner's state (cordon, drain, resume = `active`, …) and tells the runner at once
/// (`NOTIFY` on [`STATE_CHANNEL`]; the heartbeat is the fallback); false if it is unknown.
pub async fn set_state(
    pool: &PgPool,
    runner: Uuid,
    state: RunnerState,
) -> Result<bool, SchedulerError> {
    set_state_with(pool, runner, state, None).await
}

/// Drains a runner: it claims nothing new and finishes what it holds, and with a
/// `deadline`, hands back what it still holds by then (other runners continue those jobs).
pub async fn drain(
    pool: &PgPool,
    runner: Uuid,
    deadline: Option<Duration>,
) -> Result<bool, SchedulerError> {
    set_state_with(pool, runner, RunnerState::Draining, deadline).await
}

async fn set_state_with(
    pool: &PgPool,
    runner: Uuid,
    state: RunnerState,
    deadline: Option<Duration>,
) -> Result<bool, SchedulerError> {
    let changed: Option<Uuid> = sqlx::query_scalar(include_str!("runners/queries/set_state.sql"))
        .bind(runner)
        .bind(state.as_str())
        .bind(STATE_CHANNEL)
        .bind(deadline.map(|d| d.as_secs_f64()))
        .fetch_optional(pool)
        .await?;
    Ok(changed.is_some())
}

/// How long a draining runner's deadline leaves (zero once past), on the database's clock;
/// `None` when it is not draining or its drain has no deadline.
pub async fn drain_left(pool: &PgPool, runner: Uuid) -> Result<Option<Duration>, SchedulerError> {
    let left: Option<Option<f64>> =
        sqlx::query_scalar(include_str!("runners/queries/drain_left.sql"))
            .bind(runner)
            .fetch_optional(pool)
            .await?;
    Ok(left
        .flatten()
        .map(|seconds| Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX)))
}

#[derive(sqlx::FromRow)]
struct RunnerRow {
    id: Uuid,
    host: String,
    devices: serde_json::Value,
    slots: i32,
    models: serde_json::Value,
    warm: Vec<String>,
    pool: String,
    state: RunnerState,
    in_flight: i32,
    registered_at: DateTime<Utc>,
    last_heartbeat: DateTime<Utc>,
    transport: String,
    token: Option<String>,
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
            warm: row.warm,
            pool: row.pool,
            state: row.state,
            in_flight: row.in_flight,
            registered_at: row.registered_at,
            last_heartbeat: row.last_heartbeat,
            transport: row.transport,
            token: row.token,
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
