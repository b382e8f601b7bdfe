//! What a runner asks of the control plane, as one trait: the worker does not know how its
//! calls travel. Two transports implement it:
//!
//! - [`direct`]: straight to Postgres and Redis, for trusted runners inside the cluster;
//! - [`gateway`]: the api tier's runner API, for runners on lent machines that hold only the
//!   api's URL and a runner token.
//!
//! Every state change stays fenced by `(id, attempt)`, whichever transport carries it.

use fallow_protocol::job::{Completion, JobEvent, Progress};
use fallow_scheduler::queue::{Checkpoint, ClaimScope, ClaimedJob, FailOutcome, LeaseRenewal};
use fallow_scheduler::runners::{RunnerInfo, RunnerState};
use fallow_scheduler::SchedulerError;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

pub mod backoff;
pub mod direct;
pub mod gateway;

pub use direct::Direct;
pub use gateway::Gateway;

pub type PlaneResult<T> = Result<T, PlaneError>;

/// The exit status of a runner the control plane no longer admits (`EX_CONFIG`): starting
/// it again cannot help until it has a new token, so a service manager should not.
pub const EXIT_REVOKED: u8 = 78;

impl PlaneError {
    /// Whether `error`, or any error behind it, says the runner is no longer admitted.
    pub fn is_revoked(error: &anyhow::Error) -> bool {
        error
            .chain()
            .any(|e| matches!(e.downcast_ref::<PlaneError>(), Some(PlaneError::Revoked(_))))
    }
}

/// Why a call to the control plane failed.
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    /// The control plane no longer knows this runner: it should register again.
    #[error("the control plane does not know runner {0}")]
    UnknownRunner(Uuid),
    /// A report on a job the runner no longer holds: the fence refused it, nothing changed.
    #[error("the job is no longer this runner's")]
    Fenced,
    /// The runner's token was revoked, or another runner registered with it since: this
    /// runner must stop, and nothing it reports counts any more.
    #[error("the runner's token no longer admits it: {0}")]
    Revoked(String),
    /// The call was refused, and asking again will not help.
    #[error("the control plane refused the call: {0}")]
    Refused(String),
    /// The control plane could not be reached, or failed; a later call may succeed.
    #[error("the control plane is unavailable: {0}")]
    Unavailable(String),
}

impl From<SchedulerError> for PlaneError {
    fn from(err: SchedulerError) -> Self {
        match err {
            SchedulerError::Database(_) | SchedulerError::Redis(_) | SchedulerError::Store(_) => {
                PlaneError::Unavailable(err.to_string())
            }
            _ => PlaneError::Refused(err.to_string()),
        }
    }
}

/// How many stream entries a job's stream must hold (see
/// [`fallow_scheduler::stream::entries_needed`]); `None`: no cap.
pub type StreamCaps<'a> = &'a (dyn Fn(Uuid) -> Option<usize> + Sync);

/// Every call a runner makes. Methods return boxed futures so the worker can hold any
/// transport as `Arc<dyn ControlPlane>`.
pub trait ControlPlane: Send + Sync {
    // The registry.

    /// Registers the runner; returns its id.
    fn register<'a>(&'a self, info: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<Uuid>>;
    /// Registers again under the same id, after the registry forgot the runner.
    fn register_as<'a>(&'a self, id: Uuid, info: &'a RunnerInfo) -> BoxFuture<'a, PlaneResult<()>>;
    fn deregister(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<()>>;
    /// Says the runner is alive, holding `in_flight` jobs; returns its state.
    fn heartbeat(&self, id: Uuid, in_flight: i32) -> BoxFuture<'_, PlaneResult<RunnerState>>;
    /// The runner's state, if it is registered.
    fn state(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<Option<RunnerState>>>;
    /// The runner's own state change, made only from `from`; returns the state after it.
    fn report_state<'a>(
        &'a self,
        id: Uuid,
        from: &'a [RunnerState],
        to: RunnerState,
    ) -> BoxFuture<'a, PlaneResult<RunnerState>>;
    /// The models the runner holds in memory now.
    fn set_warm<'a>(&'a self, id: Uuid, warm: &'a [String]) -> BoxFuture<'a, PlaneResult<()>>;
    /// How long a draining runner has left before it hands its jobs back; `None`: no
    /// deadline.
    fn drain_left(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<Option<Duration>>>;
    /// The models an operator asked this runner to unload, taken once.
    fn take_evictions(&self, id: Uuid) -> BoxFuture<'_, PlaneResult<Vec<String>>>;
    /// Warm replicas per model across live runners.
    fn warm_replicas(&self) -> BoxFuture<'_, PlaneResult<HashMap<String, i64>>>;
    /// Records whether the owner is idle; says whether the runner may be lent now under
    /// its pool's maximum share.
    fn pool_turn(
        &self,
        id: Uuid,
        owner_idle: bool,
        max_share: f64,
    ) -> BoxFuture<'_, PlaneResult<bool>>;
    /// A hint each time an operator changes the runner's state (it then reads the state).
    fn state_hints(&self, id: Uuid) -> mpsc::Receiver<()>;

    // The queue.

    /// Claims up to `limit` jobs within `scope`, each leased for `lease`.
    fn claim<'a>(
        &'a self,
        id: Uuid,
        scope: &'a ClaimScope<'a>,
        limit: i64,
        lease: Duration,
    ) -> BoxFuture<'a, PlaneResult<Vec<ClaimedJob>>>;
    /// Waits until work may have arrived, or `timeout` passes.
    fn wait_for_work(&self, timeout: Duration) -> BoxFuture<'_, ()>;
    /// Renews the held jobs' leases and stores their checkpoints.
    fn renew<'a>(
        &'a self,
        id: Uuid,
        held: &'a [Checkpoint],
        lease: Duration,
    ) -> BoxFuture<'a, PlaneResult<LeaseRenewal>>;
    /// Running → succeeded, fenced; false if the fence did not match.
    fn complete<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        completion: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>>;
    /// Running → retried or failed, fenced.
    fn fail<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        error: &'a str,
        retryable: bool,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>>;
    /// A retryable failure whose next attempt continues from `progress`; the attempt counts.
    fn fail_and_continue<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        error: &'a str,
        progress: &'a Progress,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>>;
    /// Hands a running job back unfinished, without using up an attempt, fenced.
    fn release<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        progress: Option<&'a Progress>,
    ) -> BoxFuture<'a, PlaneResult<FailOutcome>>;
    /// Running → cancelled (the runner stopped it on request), with what it had, fenced.
    fn mark_cancelled<'a>(
        &'a self,
        job: Uuid,
        attempt: i32,
        partial: &'a Completion,
    ) -> BoxFuture<'a, PlaneResult<bool>>;

    // The token streams.

    /// Appends one step's events, for all jobs at once, each stream capped by `caps`, in
    /// one try. The interactive jobs in `streamed` (each fenced by `(id, attempt)`) are
    /// first recorded as having sent tokens to their clients: once a client has seen
    /// tokens, the reaper must not restart the job. Returns the jobs whose events were
    /// refused (the runner no longer holds them).
    fn append<'a>(
        &'a self,
        streamed: &'a [(Uuid, i32)],
        events: &'a [(Uuid, JobEvent)],
        caps: StreamCaps<'a>,
    ) -> BoxFuture<'a, PlaneResult<Vec<Uuid>>>;
    /// The jobs whose cancellation is signalled, as they come.
    fn cancel_signals(&self) -> mpsc::Receiver<Uuid>;
}
