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
    /// The schema is behind this binary and the service's role may not migrate it.
    #[error("the database schema lacks {pending} of this version's migrations, and this role may not apply them ({cause}): run `fallow migrate` as the schema's owner first")]
    MigrationsPending { pending: usize, cause: String },
    /// A stored payload could not be decoded (a bug or a schema mismatch).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    #[error("{0}")]
    NotFound(String),
    /// Admitting `asked` more jobs would take the tenant past its `max_active_jobs`; the api
    /// answers 429.
    #[error("{active} jobs active for this tenant and {asked} more asked; the limit is {limit}")]
    TenantOverLimit { active: i64, asked: i64, limit: i64 },
    /// The object store (local directory or S3) failed.
    #[error("object store: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// An error with every cause behind it: some `Display`s say only "service error" (the S3
/// SDK) or "error sending request" (reqwest), and the source chain says what went wrong.
pub fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
