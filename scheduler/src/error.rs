//! The scheduler layer's one error type. The api maps it to HTTP in its error table.

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// Postgres unreachable or failing; the api answers 503.
    #[error("database unavailable: {0}")]
    Database(#[from] sqlx::Error),
    /// Redis unreachable or failing; the api answers 503.
    #[error("token relay unavailable: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored payload could not be decoded (a bug or a schema mismatch).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    #[error("{0}")]
    NotFound(String),
    /// The object store (local directory or S3) failed.
    #[error("object store: {0}")]
    Store(#[from] crate::store::StoreError),
}
