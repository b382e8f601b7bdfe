//! The Files API: `POST /v1/files` (multipart `file` + `purpose=batch`), `GET /v1/files`,
//! `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`. Uploads are
//! streamed to a staged file (counting bytes and lines against the limits) and then handed
//! to the object store; downloads stream from the store. A key sees only its tenant's files.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiMultipart;
use crate::openai::files::{FileDeleted, FileObject, ListPage};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::multipart::Field;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fallow_scheduler::batch::{file_id, files, object_key, parse_public_id, FileRecord};
use fallow_scheduler::store::{ObjectStore, StagedFile};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use uuid::Uuid;

/// The store, or 503 when this server was started without one.
pub fn store(state: &AppState) -> Result<&ObjectStore, ApiError> {
    state.store().ok_or_else(|| {
        ApiError::Unavailable("files and batches are not enabled on this server".into())
    })
}

pub async fn upload_file(
    State(state): State<AppState>,
    caller: Caller,
    ApiMultipart(mut multipart): ApiMultipart,
) -> Result<Json<FileObject>, ApiError> {
    let store = store(&state)?;
    let (mut purpose, mut upload) = (None, None);
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| multipart_error(&state, e))?
    {
        match field.name() {
            Some("purpose") => {
                purpose = Some(field.text().await.map_err(|e| multipart_error(&state, e))?)
            }
            Some("file") => upload = Some(stage_upload(&state, store, field).await?),
            _ => {}
        }
    }
    match purpose.as_deref().map(str::trim) {
        Some("batch") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "purpose",
                format!("`purpose` `{other}` is not supported; use `batch`."),
            ))
        }
        None => return Err(ApiError::invalid("purpose", "`purpose` is required.")),
    }
    let (filename, staged, bytes) =
        upload.ok_or_else(|| ApiError::invalid("file", "A `file` part is required."))?;
    let id = Uuid::new_v4();
    let record = FileRecord {
        id,
        tenant_id: caller.tenant_id(),
        purpose: "batch".into(),
        filename,
        bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        object_key: object_key(id),
        created_at: state.queue().clock().now(),
    };
    store
        .put_file(&record.object_key, &staged.path)
        .await
        .map_err(fallow_scheduler::SchedulerError::from)?;
    if let Err(e) = files::insert(state.queue().pool(), &record).await {
        let _ = store.delete(&record.object_key).await;
        return Err(e.into());
    }
    Ok(Json(FileObject::from(&record)))
}

/// Streams the `file` part to a staged file; returns (filename, staged file, bytes).
async fn stage_upload(
    state: &AppState,
    store: &ObjectStore,
    mut field: Field<'_>,
) -> Result<(String, StagedFile, u64), ApiError> {
    let config = state.config();
    let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
    let staged = StagedFile {
        path: store
            .staging_path()
            .await
            .map_err(fallow_scheduler::SchedulerError::from)?,
    };
    let mut out = tokio::fs::File::create(&staged.path)
        .await
        .map_err(|e| ApiError::Internal(format!("staging the upload: {e}")))?;
    let (mut bytes, mut lines, mut last) = (0u64, 0u64, b'\n');
    while let Some(chunk) = field.chunk().await.map_err(|e| multipart_error(state, e))? {
        bytes += chunk.len() as u64;
        if bytes > config.max_file_bytes {
            return Err(too_large(state));
        }
        lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        if let Some(&b) = chunk.last() {
            last = b;
        }
        if lines > config.max_file_lines {
            return Err(ApiError::invalid(
                "file",
                format!("The file has more than {} lines.", config.max_file_lines),
            ));
        }
        out.write_all(&chunk)
            .await
            .map_err(|e| ApiError::Internal(format!("staging the upload: {e}")))?;
    }
    if last != b'\n' && lines + 1 > config.max_file_lines {
        return Err(ApiError::invalid(
            "file",
            format!("The file has more than {} lines.", config.max_file_lines),
        ));
    }
    out.sync_all()
        .await
        .map_err(|e| ApiError::Internal(format!("staging the upload: {e}")))?;
    Ok((filename, staged, bytes))
}

fn too_large(state: &AppState) -> ApiError {
    ApiError::PayloadTooLarge {
        limit: usize::try_from(state.config().max_file_bytes).unwrap_or(usize::MAX),
    }
}

fn multipart_error(state: &AppState, e: axum::extract::multipart::MultipartError) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(state);
    }
    ApiError::invalid("file", format!("Could not read the multipart body: {e}"))
}

#[derive(Debug, Deserialize)]
pub struct ListParams {
    pub after: Option<String>,
    pub limit: Option<i64>,
    pub purpose: Option<String>,
}

/// The page size asked for, within OpenAI's bounds.
pub fn page_limit(limit: Option<i64>, max: i64) -> Result<i64, ApiError> {
    match limit {
        None => Ok(20.min(max)),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid(
            "limit",
            format!("`limit` must be between 1 and {max}, got {n}."),
        )),
    }
}

pub async fn list_files(
    State(state): State<AppState>,
    caller: Caller,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<ListPage<FileObject>>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let limit = page_limit(params.limit, 10_000)?;
    let after = params
        .after
        .as_deref()
        .map(|a| {
            parse_public_id(a, "file-")
                .ok_or_else(|| ApiError::invalid("after", "`after` is not a file id."))
        })
        .transpose()?;
    let rows = files::list(
        state.queue().pool(),
        caller.tenant_id(),
        params.purpose.as_deref(),
        after,
        limit + 1,
    )
    .await?;
    let data = rows.iter().map(FileObject::from).collect();
    Ok(Json(ListPage::new(
        data,
        limit as usize,
        |f: &FileObject| f.id.clone(),
    )))
}

/// The file behind a public id, if the caller may see it.
pub async fn visible_file(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<FileRecord, ApiError> {
    let not_found = || ApiError::NotFound(format!("No such File object: {id}"));
    let uuid = parse_public_id(id, "file-").ok_or_else(not_found)?;
    files::get(state.queue().pool(), uuid, caller.tenant_id())
        .await?
        .ok_or_else(not_found)
}

fn path_id(id: Result<Path<String>, PathRejection>) -> String {
    id.map(|Path(id)| id).unwrap_or_default()
}

pub async fn get_file(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<FileObject>, ApiError> {
    let file = visible_file(&state, &caller, &path_id(id)).await?;
    Ok(Json(FileObject::from(&file)))
}

pub async fn get_file_content(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let store = store(&state)?;
    let file = visible_file(&state, &caller, &path_id(id)).await?;
    let reader = store
        .get(&file.object_key)
        .await
        .map_err(fallow_scheduler::SchedulerError::from)?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, file.bytes.to_string()),
        ],
        body,
    )
        .into_response())
}

pub async fn delete_file(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<FileDeleted>, ApiError> {
    let store = store(&state)?;
    let file = visible_file(&state, &caller, &path_id(id)).await?;
    if let Some(file) = files::delete(state.queue().pool(), file.id, caller.tenant_id()).await? {
        if let Err(e) = store.delete(&file.object_key).await {
            tracing::warn!(file = %file_id(file.id), error = %e, "deleting a file's contents failed");
        }
    }
    Ok(Json(FileDeleted {
        id: file_id(file.id),
        object: "file",
        deleted: true,
    }))
}
