//! File metadata: one row per uploaded (or generated) file. A key sees only its own
//! tenant's files; without authentication (`tenant = None`) every file is visible.

use crate::SchedulerError;
use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FileRecord {
    pub id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub purpose: String,
    pub filename: String,
    pub bytes: i64,
    pub object_key: String,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, tenant_id, purpose, filename, bytes, object_key, created_at";

pub async fn insert<'e>(db: impl PgExecutor<'e>, file: &FileRecord) -> Result<(), SchedulerError> {
    sqlx::query(
        "INSERT INTO files (id, tenant_id, purpose, filename, bytes, object_key, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(file.id)
    .bind(file.tenant_id)
    .bind(&file.purpose)
    .bind(&file.filename)
    .bind(file.bytes)
    .bind(&file.object_key)
    .bind(file.created_at)
    .execute(db)
    .await?;
    Ok(())
}

/// The file if it exists and `tenant` may see it.
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<Uuid>,
) -> Result<Option<FileRecord>, SchedulerError> {
    let row = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM files WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2)"
    ))
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    Ok(row)
}

/// Newest first; `after` is the last id of the previous page.
pub async fn list(
    pool: &PgPool,
    tenant: Option<Uuid>,
    purpose: Option<&str>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<FileRecord>, SchedulerError> {
    let rows = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM files \
         WHERE ($1::uuid IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR purpose = $2) \
           AND ($3::uuid IS NULL OR (created_at, id) < \
                (SELECT created_at, id FROM files WHERE id = $3)) \
         ORDER BY created_at DESC, id DESC LIMIT $4"
    ))
    .bind(tenant)
    .bind(purpose)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

/// Deletes the row and returns it (the caller then deletes the object).
pub async fn delete(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<Uuid>,
) -> Result<Option<FileRecord>, SchedulerError> {
    let row = sqlx::query_as(&format!(
        "DELETE FROM files WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2) \
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    Ok(row)
}
