//! The runner API under `/runner/v1/…`: every call a runner makes, carried out here against
//! Postgres and Redis with the same statements and fences as a direct runner's, so a runner
//! on a lent machine needs only the api's URL and a runner token ([`auth`]). Tenant keys and
//! the admin token get a 401 here, and a runner token gets one on `/v1` and `/admin`.
//!
//! - [`registry`]: register (checked against the token), heartbeat, states, warm models.
//! - [`jobs`]: claim (a long poll), lease renewal, and each job's end, for its holder only.
//! - [`events`]: a step's events for all the runner's jobs, in one call.
//! - [`notices`]: cancellations and state changes, pushed as server-sent events.
//! - [`metered`]: every call counted by call and status.
//!
//! The bodies are [`fallow_scheduler::runner_wire`]'s.

pub mod auth;
mod events;
mod jobs;
pub mod metered;
mod notices;
mod registry;

use crate::state::AppState;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

/// A step's events, or a completion with its text and logprobs, may be far larger than a
/// client's request.
const BODY_LIMIT: usize = 64 << 20;

/// What the api keeps for the runner API: recently seen tokens and job holders, and whether
/// the api is shutting down.
#[derive(Default)]
pub struct RunnerApiState {
    pub tokens: auth::TokenCache,
    pub holders: events::HolderCache,
    pub closing: Closing,
}

/// Set when the api begins to shut down: the runners' notice streams, which never end on
/// their own, end then, so the graceful shutdown does not wait on them.
pub struct Closing(tokio::sync::watch::Sender<bool>);

impl Default for Closing {
    fn default() -> Self {
        Closing(tokio::sync::watch::channel(false).0)
    }
}

impl Closing {
    pub fn close(&self) {
        self.0.send_replace(true);
    }
    /// Resolves once the api is shutting down.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|closing| *closing).await;
        }
    }
}

/// The runner API's routes, to be nested under [`fallow_scheduler::runner_wire::BASE_PATH`].
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/register", post(registry::register))
        .route("/deregister", post(registry::deregister))
        .route("/heartbeat", post(registry::heartbeat))
        .route(
            "/state",
            get(registry::get_state).post(registry::report_state),
        )
        .route("/warm", post(registry::set_warm))
        .route("/drain", get(registry::drain_left))
        .route("/evictions", post(registry::take_evictions))
        .route("/warm-replicas", get(registry::warm_replicas))
        .route("/pool-turn", post(registry::pool_turn))
        .route("/claim", post(jobs::claim))
        .route("/renew", post(jobs::renew))
        .route("/jobs/{id}/complete", post(jobs::complete))
        .route("/jobs/{id}/cancelled", post(jobs::cancelled))
        .route("/jobs/{id}/fail", post(jobs::fail))
        .route("/jobs/{id}/release", post(jobs::release))
        .route("/events", post(events::append))
        .route("/notices", get(notices::notices))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .route_layer(axum::middleware::from_fn(metered::count))
}
