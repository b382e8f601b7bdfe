//! Putting jobs on the queue: one transaction per call, however many jobs, then a `NOTIFY`
//! per model (delivered at commit, so a woken runner always finds the rows).

use super::{notify_queued, NewJob, Queue};
use crate::SchedulerError;
use uuid::Uuid;

impl Queue {
    /// Inserts the job (state `queued`) in one transaction and sends the `NOTIFY` hint.
    pub async fn enqueue(&self, job: NewJob) -> Result<Uuid, SchedulerError> {
        let ids = self.enqueue_many(std::slice::from_ref(&job)).await?;
        ids.into_iter()
            .next()
            .ok_or_else(|| SchedulerError::Corrupt("insert returned no job id".into()))
    }

    /// Inserts many jobs with one statement (`unnest` over parallel arrays) in one
    /// transaction; returns their ids in input order. Batches and tests use it.
    pub async fn enqueue_many(&self, jobs: &[NewJob]) -> Result<Vec<Uuid>, SchedulerError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let ids = self.insert(&mut tx, jobs).await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// Inserts the jobs and sends their `NOTIFY` hints inside the caller's transaction.
    pub(super) async fn insert(
        &self,
        conn: &mut sqlx::PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<Uuid>, SchedulerError> {
        let ids: Vec<Uuid> = jobs.iter().map(|_| Uuid::new_v4()).collect();
        let mut requests = Vec::with_capacity(jobs.len());
        for job in jobs {
            requests.push(
                serde_json::to_value(&job.request).map_err(|e| {
                    SchedulerError::Corrupt(format!("request not serialisable: {e}"))
                })?,
            );
        }
        let tenants: Vec<Option<Uuid>> = jobs.iter().map(|j| j.tenant_id).collect();
        // An adapter's job waits in the adapter's queue (see `fallow_protocol::adapter`).
        let queues: Vec<String> = jobs.iter().map(|j| j.request.queue_model()).collect();
        let models: Vec<&str> = queues.iter().map(String::as_str).collect();
        let kinds: Vec<&str> = jobs.iter().map(|j| j.kind.as_str()).collect();
        let priorities: Vec<i32> = jobs.iter().map(|j| j.priority).collect();
        // A job must be allowed at least one attempt, whatever the caller asked for.
        let max_attempts: Vec<i32> = jobs.iter().map(|j| j.max_attempts.max(1)).collect();
        let request_ids: Vec<Option<&str>> = jobs.iter().map(|j| j.request_id.as_deref()).collect();

        sqlx::query(include_str!("queries/enqueue.sql"))
            .bind(&ids)
            .bind(&tenants)
            .bind(&models)
            .bind(&kinds)
            .bind(&priorities)
            .bind(&max_attempts)
            .bind(&requests)
            .bind(&request_ids)
            .bind(self.clock.now())
            .execute(&mut *conn)
            .await?;
        notify_queued(conn, &models).await?;
        Ok(ids)
    }
}
