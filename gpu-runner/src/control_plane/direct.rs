//! The direct transport: the runner holds the database's and Redis's URLs and runs the
//! control plane's statements itself. For trusted runners inside the cluster.

use super::{ControlPlane, PlaneError, PlaneResult, StreamCaps};
use fallow_protocol::job::{Completion, JobEvent, Progress};
use fallow_scheduler::queue::{
    Checkpoint, ClaimScope, ClaimedJob, FailOutcome, LeaseRenewal, Queue,
};
use fallow_scheduler::runners::{self, RunnerInfo, RunnerState};
use fallow_scheduler::stream::TokenRelay;
use fallow_scheduler::SchedulerError;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Postgres (through the queue) and Redis (through the relay).
#[derive(Clone)]
pub struct Direct {
    queue: Queue,
    relay: TokenRelay,
}

impl Direct {
    pub fn new(queue: Queue, relay: TokenRelay) -> Self {
        Direct { queue, relay }
    }
}

/// A registry call's error: `NotFound` means the runner is unknown.
fn unknown_runner(id: Uuid) -> impl FnOnce(SchedulerError) -> PlaneError {
    move |err| match err {
        SchedulerError::NotFound(_) => PlaneError::UnknownRunner(id),
        other => other.into(),
    }
}

impl ControlPlane for Direct {
    fn register<'a>(&'a self, info: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<Uuid>> {
        async move { Ok(runners::register(self.queue.pool(), info).await?) }.boxed()
    }

    fn register_as<'a>(&'a self, id: Uuid, info: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<()>> {
        async move { Ok(runners::register_as(self.queue.pool(), id, info).await?) }.boxed()
    }

    fn deregister(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<()>> {
        async move { Ok(runners::deregister(self.queue.pool(), id).await?) }.boxed()
    }

    fn heartbeat(&self, id: Uuid, in_flight: i32) -> BoxFuture<'_, PlaneResult<RunnerState>> {
        async move {
            runners::heartbeat(self.queue.pool(), id, in_flight)
                .await
                .map_err(unknown_runner(id))
        }
        .boxed()
    }

    fn state(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<Option<RunnerState>>> {
        async move { Ok(runners::state(self.queue.pool(), id).await?) }.boxed()
    }

    fn report_state<'a>(
        &'a self,
        id: Uuid,
        from: &'a [RunnerState],
        to: RunnerState,
    ) -> BoxFuture<'a, PlaneResult<RunnerState>> {
        async move {
            runners::report_state(self.queue.pool(), id, from, to)
                .await
                .map_err(unknown_runner(id))
        }
        .boxed()
    }

    fn set_warm<'a>(&'a self, id: Uuid, warm: &'a [String]) -> BoxFuture<'a, PlaneResult<()>> {
        async move { Ok(runners::set_warm(self.queue.pool(), id, warm).await?) }.boxed()
    }

    fn drain_left(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<Option<Duration>>> {
        async move { Ok(runners::drain_left(self.queue.pool(), id).await?) }.boxed()
    }

    fn take_evictions(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<Vec<String>>> {
        async move { Ok(runners::take_evictions(self.queue.pool(), id).await?) }.boxed()
    }

    fn warm_replicas(&self) -> BoxFuture<'_, PlaneResult<HashMap<String, i64>>> {
        async move { Ok(runners::warm_replicas(self.queue.pool()).await?) }.boxed()
    }

    fn pool_turn(
        &self,
        id: Uuid,
        owner_idle: bool,
        max_share: f64,
    ) -> BoxFuture<'_, PlaneResult<bool>> {
        async move { Ok(runners::pool_turn(self.queue.pool(), id, owner_idle, max_share).await?) }
            .boxed()
    }

    fn state_hints(&self, id: Uuid) -> mpsc::Receiver<()> {
        runners::state_hints(self.queue.pool().clone(), id)
    }

    fn claim<'a>(
        &'a self,
        id: Uuid,
        scope: &'a ClaimScope<'a>,
        limit: i64,
        lease: Duration,
    ) -> BoxFuture<'a, PlaneResult<Vec<ClaimedJob>>> {
        async move { Ok(self.queue.claim_in(id, scope, limit, lease).await?) }.boxed()
    }

    fn wait_for_work(&self, timeout: Duration) -> BoxFuture<'_, ()> {
        self.queue.wait_for_work(timeout).boxed()
    }

    fn renew<'a>(
        &'a self,
        id: Uuid,
        held: &'a [Checkpoint],
        lease: Duration,
    ) -> BoxFuture<'a, PlaneResult<LeaseRenewal>> {
        async move { Ok(self.queue.renew_with_checkpoints(id, held, lease).await?) }.boxed()
    }

    fn complete<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        completion: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>> {
        async move { Ok(self.queue.complete(job, attempt, completion).await?) }.boxed()
    }

    fn fail<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        error: &'a str,
        retryable: bool,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        async move { Ok(self.queue.fail(job, attempt, error, retryable).await?) }.boxed()
    }

    fn fail_and_continue<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        error: &'a str,
        progress: &'a Progress,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        async move {
            Ok(self
                .queue
                .fail_and_continue(job, attempt, error, progress)
                .await?)
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        progress: Option<&'a Progress>,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>> {
        async move { Ok(self.queue.release(job, attempt, progress).await?) }.boxed()
    }

    fn mark_cancelled<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        partial: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>> {
        async move {
            Ok(self
                .queue
                .mark_cancelled(job, attempt, Some(partial))
                .await?)
        }
        .boxed()
    }

    fn append<'a>(
        &'a self,
        streamed: &'a [(Uuid, i32)],
        events: &'a [(Uuid, JobEvent)],
        caps: StreamCaps<'a>,
    ) -> BoxFuture<'a, PlaneResult<Vec<Uuid>>> {
        // Redis does not fence: a stale attempt's events are told apart by their readers.
        async move {
            if !streamed.is_empty() {
                self.queue.mark_all_streamed(streamed, None).await?;
            }
            self.relay.append_capped(events, caps).await?;
            Ok(Vec::new())
        }
        .boxed()
    }

    fn cancel_signals(&self) -> mpsc::Receiver<Uuid> {
        self.relay.cancel_signals()
    }
}
