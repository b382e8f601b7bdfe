//! Fallow's control plane below the api tier.
//! The request, event and result types it stores are `fallow_protocol`'s.
//!
//! - [`db`]: connecting to Postgres, running migrations, fresh schemas for tests.
//! - [`queue`]: the job queue in Postgres — enqueue, claim (`SKIP LOCKED`), heartbeat,
//!   fenced completion, retries, cancellation, reaping and pruning.
//! - [`stream`]: the Redis Streams token relay between runners and the api, plus the
//!   cancel signal channel.
//! - [`tenants`]: tenants and API keys (only hashes are stored, see [`credentials`]).
//! - [`rate`]: per-tenant request and token rate limits in Redis, and the batch quota.
//! - [`loras`]: the LoRA adapters operators loaded through the admin API.
//! - [`runners`]: the runner registry, and the tokens runners on lent machines hold.
//! - [`runner_wire`]: the bodies of the runner API, which gateway runners speak.
//! - [`store`]: the object store for file contents (local directory or S3), streaming.
//! - [`batch`]: OpenAI-style batches — validation, bulk expansion into jobs, finalisation.
//! - [`maintenance`]: the loops that reap expired leases and prune finished jobs.
//! - [`clock`]: an injectable `now` so tests control time.

pub mod batch;
pub mod clock;
pub mod credentials;
pub mod db;
pub mod error;
pub mod loras;
pub mod maintenance;
pub mod queue;
pub mod rate;
pub mod runner_wire;
pub mod runners;
pub mod store;
pub mod stream;
pub mod tenants;

pub use error::SchedulerError;
