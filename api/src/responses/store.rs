//! Stored responses in Postgres (`responses`, migration 0009): a response's input items, the
//! context a later turn continues from, and the finished `response` object. One typed
//! function per statement in `queries/`. Who may see a row is the caller's business
//! ([`crate::auth::Caller::may_see`]).

use crate::error::ApiError;
use chrono::{DateTime, Utc};
use fallow_scheduler::SchedulerError;
use serde_json::Value;
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// A stored response.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub model: String,
    pub previous_response_id: Option<Uuid>,
    /// This request's input items, with ids.
    pub input_items: Vec<Value>,
    /// Every item the model was shown, earlier turns first.
    pub context: Vec<Value>,
    /// The finished `response` object (`None` while its job runs).
    pub response: Option<Value>,
    pub created_at: DateTime<Utc>,
}

fn db(err: sqlx::Error) -> ApiError {
    SchedulerError::Database(err).into()
}

pub async fn insert(pool: &PgPool, row: &StoredResponse) -> Result<(), ApiError> {
    sqlx::query(include_str!("queries/insert_response.sql"))
        .bind(row.id)
        .bind(row.tenant_id)
        .bind(&row.model)
        .bind(row.previous_response_id)
        .bind(Value::Array(row.input_items.clone()))
        .bind(Value::Array(row.context.clone()))
        .bind(&row.response)
        .bind(row.created_at)
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(())
}

pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<StoredResponse>, ApiError> {
    let row = sqlx::query(include_str!("queries/get_response.sql"))
        .bind(id)
        .fetch_optional(pool)
        .await
        .map_err(db)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let list = |name: &str| -> Result<Vec<Value>, ApiError> {
        match row.try_get::<Value, _>(name).map_err(db)? {
            Value::Array(items) => Ok(items),
            _ => Err(ApiError::Internal(format!(
                "responses.{name} is not a list"
            ))),
        }
    };
    Ok(Some(StoredResponse {
        id: row.try_get("id").map_err(db)?,
        tenant_id: row.try_get("tenant_id").map_err(db)?,
        model: row.try_get("model").map_err(db)?,
        previous_response_id: row.try_get("previous_response_id").map_err(db)?,
        input_items: list("input_items")?,
        context: list("context")?,
        response: row.try_get("response").map_err(db)?,
        created_at: row.try_get("created_at").map_err(db)?,
    }))
}

/// Records the finished response (the first writer wins).
pub async fn finish(pool: &PgPool, id: Uuid, response: &Value) -> Result<(), ApiError> {
    sqlx::query(include_str!("queries/finish_response.sql"))
        .bind(id)
        .bind(response)
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(())
}

/// Whether a row was deleted.
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<bool, ApiError> {
    let done = sqlx::query(include_str!("queries/delete_response.sql"))
        .bind(id)
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(done.rows_affected() > 0)
}
