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

pub async fn insert<'e>(db: impl PgExecutor<'e>, file: &FileRecord) -> Result<(), SchedulerError> {
    sqlx::query(include_str!("queries/insert_file.sql"))
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
    let row = sqlx::query_as(include_str!("queries/get_file.sql"))
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
    let rows = sqlx::query_as(include_str!("queries/list_files.sql"))
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
    let row = sqlx::query_as(include_str!("queries/delete_file.sql"))
        .bind(id)
        .bind(tenant)
        .fetch_optional(pool)
        .await?;
    Ok(row)
}
