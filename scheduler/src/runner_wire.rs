//! The bodies of the runner API (`/runner/v1/…`): what a gateway runner sends, and what the
//! api tier answers. The api serves them and the runner's gateway transport sends them, so
//! both read one definition. Durations travel as milliseconds.

use crate::queue::{Checkpoint, ClaimedJob, FailOutcome, LeaseRenewal};
use crate::runners::{RunnerInfo, RunnerState};
use fallow_protocol::job::{Completion, JobEvent, Progress};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use uuid::Uuid;

/// Where the runner API lives on the api tier.
pub const BASE_PATH: &str = "/runner/v1";

/// Events one append may carry at most: a step of every held job, with room to spare.
pub const MAX_EVENTS_PER_APPEND: usize = 4096;

/// The longest a claim waits for work before it answers with none.
pub const MAX_CLAIM_WAIT_MS: u64 = 30_000;

/// `POST /register`: a new runner, or (`id`) a runner the registry forgot, as itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Register {
    pub info: RunnerInfo,
    #[serde(default)]
    pub id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registered {
    pub runner_id: Uuid,
}

/// `POST /heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub in_flight: i32,
}

/// The runner's state; `None` from `GET /state` when it is not registered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateIs {
    pub state: Option<RunnerState>,
}

/// `POST /state`: the runner's own change, made only from `from`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportState {
    pub from: Vec<RunnerState>,
    pub to: RunnerState,
}

/// `POST /warm`: the models it holds now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Warm {
    pub warm: Vec<String>,
}

/// `GET /drain`: what is left of a drain's deadline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainLeft {
    pub left_ms: Option<u64>,
}

/// `POST /evictions`: the models to unload, taken once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Evictions {
    pub models: Vec<String>,
}

/// `GET /warm-replicas`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Replicas {
    pub replicas: HashMap<String, i64>,
}

/// `POST /pool-turn`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolTurnAsked {
    pub owner_idle: bool,
    pub max_share: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolTurn {
    pub turn: bool,
}

/// `POST /claim`: a long poll; answers as soon as jobs are claimed, or after `wait_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claim {
    pub warm: Vec<String>,
    #[serde(default)]
    pub cold: Vec<String>,
    #[serde(default)]
    pub cold_after_ms: u64,
    pub limit: i64,
    pub lease_ms: u64,
    #[serde(default)]
    pub wait_ms: u64,
    /// Names the claim, so that asking again after a lost answer gets the same jobs
    /// ([`crate::runners::claim_replay`]).
    #[serde(default)]
    pub claim_id: Option<Uuid>,
    /// Set when this is the same claim asked again: only then can there be an answer to
    /// replay, so a first ask costs no lookup.
    #[serde(default)]
    pub again: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claimed {
    pub jobs: Vec<ClaimedJob>,
}

/// `POST /renew`: the held jobs' leases, with their checkpoints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Renew {
    pub held: Vec<Checkpoint>,
    pub lease_ms: u64,
}

pub type Renewed = LeaseRenewal;

/// `POST /jobs/{id}/complete`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Complete {
    pub attempt: i32,
    pub completion: Completion,
}

/// `POST /jobs/{id}/cancelled`: stopped on request, with what it had.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cancelled {
    pub attempt: i32,
    pub partial: Completion,
}

/// Whether a completion (or cancellation) committed; false: the fence did not match.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Committed {
    pub committed: bool,
}

/// `POST /jobs/{id}/fail`; with `progress`, the next attempt continues from it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fail {
    pub attempt: i32,
    pub error: String,
    pub retryable: bool,
    #[serde(default)]
    pub progress: Option<Progress>,
}

/// `POST /jobs/{id}/release`: handed back unfinished, without using up an attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    pub attempt: i32,
    #[serde(default)]
    pub progress: Option<Progress>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub outcome: FailOutcome,
}

/// A job's attempt, which fences a report on it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct JobAttempt {
    pub job: Uuid,
    pub attempt: i32,
}

/// `POST /events`: one step's events for all the runner's jobs, in order; before them, the
/// jobs whose first tokens they carry to a client are marked `streamed`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Append {
    #[serde(default)]
    pub streamed: Vec<JobAttempt>,
    pub events: Vec<StepEvent>,
}

/// The answer to [`Append`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Appended {
    pub appended: usize,
    /// Jobs whose events were refused: not (or no longer) running on this runner.
    pub refused: Vec<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepEvent {
    pub job: Uuid,
    pub event: JobEvent,
    /// The entries the job's stream must hold ([`crate::stream::entries_needed`]); `None`:
    /// no cap.
    #[serde(default)]
    pub cap: Option<usize>,
}

/// What `GET /notices` pushes, one per server-sent event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "notice", rename_all = "snake_case")]
pub enum Notice {
    /// A job this runner holds was cancelled.
    Cancel { job: Uuid },
    /// An operator changed the runner's state: read it.
    State,
}
