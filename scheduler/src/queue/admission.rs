//! Admitting interactive work within a tenant's `max_active_jobs`, atomically.
//!
//! Counting the tenant's active jobs and then inserting, in two steps, lets concurrent
//! requests all see room and all get in. Here the count and the insert share one
//! transaction that first locks the tenant's row, so admissions of one tenant take turns
//! and each one counts the jobs the previous ones inserted. Other tenants are not blocked.

use super::{NewJob, Queue};
use crate::SchedulerError;
use uuid::Uuid;

impl Queue {
    /// Inserts the interactive jobs of one request (all of the same tenant) only if the
    /// tenant's queued and running interactive jobs, these included, stay within its
    /// `max_active_jobs` (0 means unlimited); otherwise inserts nothing and returns
    /// [`SchedulerError::TenantOverLimit`]. Jobs without a tenant (no-auth mode) are not limited.
    pub async fn enqueue_admitted(&self, jobs: &[NewJob]) -> Result<Vec<Uuid>, SchedulerError> {
        let Some(first) = jobs.first() else {
            return Ok(Vec::new());
        };
        if jobs.iter().any(|j| j.tenant_id != first.tenant_id) {
            return Err(SchedulerError::Corrupt(
                "one admission must not mix tenants".into(),
            ));
        }
        let mut tx = self.pool.begin().await?;
        if let Some(tenant) = first.tenant_id {
            let limit: Option<i64> = sqlx::query_scalar(include_str!("queries/lock_tenant.sql"))
                .bind(tenant)
                .fetch_optional(&mut *tx)
                .await?;
            // A tenant deleted meanwhile has no limit left to enforce; its jobs' tenant
            // becomes NULL anyway.
            if let Some(limit) = limit.filter(|&l| l > 0) {
                // A statement of its own, after the lock: under READ COMMITTED it sees every
                // job the previous holder of the lock committed.
                let active: i64 =
                    sqlx::query_scalar(include_str!("queries/active_interactive_for_tenant.sql"))
                        .bind(tenant)
                        .fetch_one(&mut *tx)
                        .await?;
                let asked = i64::try_from(jobs.len()).unwrap_or(i64::MAX);
                if active.saturating_add(asked) > limit {
                    return Err(SchedulerError::TenantOverLimit {
                        active,
                        asked,
                        limit,
                    });
                }
            }
        }
        let ids = self.insert(&mut tx, jobs).await?;
        tx.commit().await?;
        Ok(ids)
    }
}
