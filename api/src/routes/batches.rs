//! The Batch API: `POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches?after=&limit=`,
//! `POST /v1/batches/{id}/cancel`. Creating a batch only records it (`validating`); the
//! scheduler's batch worker validates, expands and finalises it.

use super::files::{page_limit, visible_file};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openai::batches::{
    BatchObject, CreateBatchRequest, BATCH_ENDPOINTS, CHAT_ENDPOINT, COMPLETIONS_ENDPOINT,
    EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT,
};
use crate::openai::files::ListPage;
use crate::state::AppState;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use fallow_scheduler::batch::{self, parse_public_id, records, BatchRecord, NewBatch};
use serde::Deserialize;
use std::time::Duration;

/// Most `metadata` pairs (OpenAI's limit), and their key/value lengths.
const MAX_METADATA_PAIRS: usize = 16;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 512;

pub async fn create_batch(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateBatchRequest>,
) -> Result<Json<BatchObject>, ApiError> {
    super::files::store(&state)?;
    let input = body
        .input_file_id
        .as_deref()
        .ok_or_else(|| ApiError::invalid("input_file_id", "`input_file_id` is required."))?;
    let endpoint = body.endpoint.as_deref().unwrap_or("");
    if !BATCH_ENDPOINTS.contains(&endpoint) {
        return Err(ApiError::invalid(
            "endpoint",
            format!(
                "`endpoint` must be `{CHAT_ENDPOINT}`, `{COMPLETIONS_ENDPOINT}`, `{RESPONSES_ENDPOINT}` or `{EMBEDDINGS_ENDPOINT}`, got `{endpoint}`."
            ),
        ));
    }
    let window_text = body.completion_window.clone().unwrap_or_default();
    let window = parse_window(&window_text)?;
    let metadata = validate_metadata(body.metadata)?;
    let file = visible_file(&state, &caller, input)
        .await
        .map_err(|_| ApiError::invalid("input_file_id", format!("No such File object: {input}")))?;
    if file.purpose != "batch" {
        return Err(ApiError::invalid(
            "input_file_id",
            format!(
                "The file {input} has purpose `{}`, not `batch`.",
                file.purpose
            ),
        ));
    }
    let lines = crate::batch_quota::check(&state, &caller, &file).await?;
    let new = NewBatch {
        tenant_id: caller.tenant_id(),
        endpoint: endpoint.to_owned(),
        input_file_id: file.id,
        completion_window: window_text,
        window,
        metadata,
    };
    let record = records::create(state.queue().pool(), &new, state.queue().clock().now()).await?;
    crate::batch_quota::record(&state, record.id, lines).await?;
    tracing::info!(batch = %batch::batch_id(record.id), "batch created");
    Ok(Json(BatchObject::from(&record)))
}

/// `24h` (OpenAI's only window) or, as an extension, any `<n>h`, `<n>m` or `<n>s`.
fn parse_window(text: &str) -> Result<Duration, ApiError> {
    let invalid = || {
        ApiError::invalid(
            "completion_window",
            format!("`completion_window` must be `24h`, got `{text}`."),
        )
    };
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let secs = match unit {
        "h" => n.checked_mul(3600),
        "m" => n.checked_mul(60),
        "s" => Some(n),
        _ => None,
    }
    .filter(|&s| s > 0 && s <= 7 * 24 * 3600)
    .ok_or_else(invalid)?;
    Ok(Duration::from_secs(secs))
}

fn validate_metadata(
    metadata: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, ApiError> {
    let Some(value) = metadata.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let invalid = |msg: String| ApiError::invalid("metadata", msg);
    let map = value
        .as_object()
        .ok_or_else(|| invalid("`metadata` must be an object of strings.".into()))?;
    if map.len() > MAX_METADATA_PAIRS {
        return Err(invalid(format!(
            "`metadata` may have at most {MAX_METADATA_PAIRS} pairs."
        )));
    }
    for (k, v) in map {
        let ok = k.chars().count() <= MAX_METADATA_KEY
            && v.as_str()
                .is_some_and(|s| s.chars().count() <= MAX_METADATA_VALUE);
        if !ok {
            return Err(invalid(format!(
                "`metadata.{k}` must be a string of at most {MAX_METADATA_VALUE} characters (keys at most {MAX_METADATA_KEY})."
            )));
        }
    }
    Ok(Some(value))
}

async fn visible_batch(
    state: &AppState,
    caller: &Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<BatchRecord, ApiError> {
    let raw = id.map(|Path(id)| id).unwrap_or_default();
    let not_found = || ApiError::NotFound(format!("No such Batch object: {raw}"));
    let uuid = parse_public_id(&raw, "batch_").ok_or_else(not_found)?;
    records::get(state.queue().pool(), uuid, caller.tenant_id())
        .await?
        .ok_or_else(not_found)
}

pub async fn get_batch(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<BatchObject>, ApiError> {
    let record = visible_batch(&state, &caller, id).await?;
    Ok(Json(BatchObject::from(&record)))
}

#[derive(Debug, Deserialize)]
pub struct ListParams {
    pub after: Option<String>,
    pub limit: Option<i64>,
}

pub async fn list_batches(
    State(state): State<AppState>,
    caller: Caller,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<ListPage<BatchObject>>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let limit = page_limit(params.limit, 100)?;
    let after = params
        .after
        .as_deref()
        .map(|a| {
            parse_public_id(a, "batch_")
                .ok_or_else(|| ApiError::invalid("after", "`after` is not a batch id."))
        })
        .transpose()?;
    let rows = records::list(state.queue().pool(), caller.tenant_id(), after, limit + 1).await?;
    let data = rows.iter().map(BatchObject::from).collect();
    Ok(Json(ListPage::new(
        data,
        limit as usize,
        |b: &BatchObject| b.id.clone(),
    )))
}

pub async fn cancel_batch(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<BatchObject>, ApiError> {
    let record = visible_batch(&state, &caller, id).await?;
    let now = state.queue().clock().now();
    let running = records::cancel(state.queue().pool(), record.id, now).await?;
    for job in running {
        if let Err(e) = state.relay().signal_cancel(job).await {
            tracing::warn!(%job, error = %e, "could not signal a batch job's cancel");
        }
    }
    let record = records::get(state.queue().pool(), record.id, caller.tenant_id())
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "No such Batch object: {}",
                batch::batch_id(record.id)
            ))
        })?;
    Ok(Json(BatchObject::from(&record)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_completion_window_is_24h_or_a_duration_extension() {
        assert_eq!(parse_window("24h").ok(), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_window("90s").ok(), Some(Duration::from_secs(90)));
        for bad in ["", "h", "24", "0h", "-1h", "1d", "9999h"] {
            assert!(parse_window(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn metadata_must_be_a_small_object_of_strings() {
        assert!(validate_metadata(Some(serde_json::json!({"a": "b"}))).is_ok());
        assert!(validate_metadata(Some(serde_json::json!({"a": 1}))).is_err());
        assert!(validate_metadata(Some(serde_json::json!([1]))).is_err());
        assert_eq!(validate_metadata(None).ok(), Some(None));
    }
}
