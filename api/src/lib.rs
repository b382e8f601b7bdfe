//! Fallow's OpenAI-compatible HTTP tier. It holds no model and never waits on an engine: it
//! validates requests, puts jobs in the Postgres queue and relays their token streams from
//! Redis back to clients.
//!
//! - [`config`]: the tier's limits and switches ([`ApiConfig`]).
//! - [`openai`]: OpenAI's wire format (lenient requests, exact responses).
//! - [`validate`]: wire request → the scheduler's validated `GenerateRequest`.
//! - [`parsers`]: a model's raw text → reasoning, tool calls and content (pure, incremental).
//! - [`error`]: the one error type and its one table to status codes and OpenAI envelopes.
//! - [`extract`]: JSON and multipart body extractors that answer in that envelope (415 for
//!   another `Content-Type`, never 422).
//! - [`auth`]: Bearer key → tenant.
//! - [`host_check`]: the `Host`/`Origin` check against DNS rebinding.
//! - [`rate_limit`]: per-tenant requests and tokens per minute, and OpenAI's headers.
//! - [`batch_quota`]: the per-tenant quota of queued batch lines.
//! - [`admin`]: the operator's API under `/admin/…` (its own token).
//! - [`runner_api`]: the runner API under `/runner/v1/…`, for runners holding a runner token.
//! - [`catalog`]: the live models, briefly cached.
//! - [`follow`]: following a job's Redis stream, with a deadline and a Postgres fallback.
//! - [`chunks`]: stream entries → `chat.completion.chunk`s, in OpenAI's order.
//! - [`stream_choice`]: one streamed choice through the parsers, as OpenAI's deltas.
//! - [`sse`]: chunks → server-sent events; the job's body stream.
//! - [`responses`]: the Responses API: a job → a `response` and its typed events, and the
//!   stored responses that `previous_response_id` continues.
//! - [`text_chunks`]: the jobs of a legacy completion → `text_completion` chunks.
//! - [`cancel`]: cancel a job when its client goes away (a drop guard).
//! - [`metrics`]: Prometheus metrics with vLLM-style names.
//! - [`routes`]: the HTTP endpoints and the router.
//! - [`server`]: binding the router (and `/metrics` alone) to a listener with graceful
//!   shutdown.

pub mod admin;
pub mod auth;
pub mod batch_quota;
pub mod cancel;
pub mod catalog;
pub mod chunks;
pub mod config;
pub mod error;
pub mod extract;
pub mod follow;
pub mod host_check;
pub mod metrics;
pub mod openai;
pub mod parsers;
pub mod rate_limit;
pub mod responses;
pub mod routes;
pub mod runner_api;
pub mod server;
pub mod sse;
pub mod state;
pub mod stream_choice;
pub mod text_chunks;
pub mod validate;

#[cfg(test)]
mod hostile_input;
#[cfg(test)]
mod test_support;

pub use config::ApiConfig;
pub use error::ApiError;
pub use routes::router;
pub use server::serve;
pub use state::AppState;
