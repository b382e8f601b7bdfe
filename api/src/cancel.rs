//! Cancelling a job when its client goes away. The guard lives in the handler's future (or
//! the SSE body); when that is dropped before the job ended — the client disconnected or
//! the request timed out — `Drop` requests cancellation in Postgres and signals the runner
//! over Redis, so the engine frees the sequence's KV blocks within one step.

use fallow_scheduler::queue::Queue;
use fallow_scheduler::stream::TokenRelay;
use uuid::Uuid;

pub struct CancelOnDrop {
    queue: Queue,
    relay: TokenRelay,
    job: Uuid,
    armed: bool,
}

impl CancelOnDrop {
    pub fn new(queue: Queue, relay: TokenRelay, job: Uuid) -> Self {
        CancelOnDrop {
            queue,
            relay,
            job,
            armed: true,
        }
    }

    /// The guarded job.
    pub fn job(&self) -> Uuid {
        self.job
    }

    /// The job ended on its own; nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (queue, relay, job) = (self.queue.clone(), self.relay.clone(), self.job);
        // Drop cannot await; the cancellation runs as its own task. Outside a runtime (only
        // at process teardown) there is nobody left to cancel for.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(cancel_job(queue, relay, job));
            }
            Err(_) => tracing::warn!(%job, "no runtime to cancel the job on"),
        }
    }
}

/// Requests cancellation (row flag, or straight to `cancelled` if still queued) and tells
/// the runners. Failures are logged: the lease reaper or the runner's own limits still end
/// the job eventually.
pub async fn cancel_job(queue: Queue, relay: TokenRelay, job: Uuid) {
    metrics::counter!(crate::metrics::REQUEST_CANCELLED).increment(1);
    match queue.request_cancel(job).await {
        Ok(true) => tracing::info!(%job, "client gone; cancellation requested"),
        Ok(false) => tracing::debug!(%job, "client gone after the job finished"),
        Err(err) => tracing::warn!(%job, error = %err, "could not request cancellation"),
    }
    if let Err(err) = relay.signal_cancel(job).await {
        tracing::warn!(%job, error = %err, "could not signal cancellation to runners");
    }
}
