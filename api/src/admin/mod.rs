//! The operator's API under `/admin/…`, authenticated by its own token ([`auth`]; tenant
//! keys never work here):
//!
//! - [`runners`]: list and show runners; cordon, drain, resume.
//! - [`jobs`]: queue depth per model and priority; job search and cancellation.
//! - [`tenants`]: tenants, their limits, and their API keys (create, list, revoke).
//! - [`runner_tokens`]: the credentials of runners on lent machines (create, list, revoke).
//! - [`loras`]: LoRA adapters over the base models (load, unload, list).
//! - [`gauges`]: queue and runner gauges for `/metrics`, read from Postgres at scrape time.
//! - [`dashboard`]: the live operator page at `/dashboard`, a client of this API.
//!
//! Every answer is JSON; lists are `{"object":"list","data":[…]}` like the OpenAI API's.

pub mod auth;
pub mod dashboard;
pub mod gauges;
mod jobs;
mod loras;
mod runner_tokens;
mod runners;
mod tenants;

use crate::state::AppState;
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;

/// The admin routes, to be nested under `/admin`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/runners", get(runners::list))
        .route("/runners/{id}", get(runners::show))
        .route("/runners/{id}/cordon", post(runners::cordon))
        .route("/runners/{id}/drain", post(runners::drain))
        .route("/runners/{id}/resume", post(runners::resume))
        .route("/runners/{id}/evict", post(runners::evict))
        .route("/queue", get(jobs::queue_depth))
        .route("/jobs", get(jobs::search))
        .route("/jobs/{id}/cancel", post(jobs::cancel))
        .route("/tenants", get(tenants::list))
        .route("/tenants/{name}/limits", post(tenants::set_limits))
        .route(
            "/tenants/{name}/keys",
            post(tenants::create_key).get(tenants::list_tenant_keys),
        )
        .route("/keys", get(tenants::list_keys))
        .route("/keys/{id}/revoke", post(tenants::revoke_key))
        .route(
            "/runner-tokens",
            post(runner_tokens::create).get(runner_tokens::list),
        )
        .route("/runner-tokens/{which}/revoke", post(runner_tokens::revoke))
        .route("/loras", post(loras::load).get(loras::list))
        .route("/loras/{id}/unload", post(loras::unload))
}

/// `{"object":"list","data":[…]}`.
#[derive(Debug, Serialize)]
pub struct AdminList<T> {
    pub object: &'static str,
    pub data: Vec<T>,
}

impl<T> AdminList<T> {
    pub fn new(data: Vec<T>) -> Self {
        AdminList {
            object: "list",
            data,
        }
    }
}

/// A path id that must be a UUID; anything else is a 400 naming it.
fn parse_id(what: &str, raw: &str) -> Result<uuid::Uuid, crate::error::ApiError> {
    raw.parse().map_err(|_| {
        crate::error::ApiError::invalid("id", format!("{raw:?} is not a valid {what} id (a UUID)"))
    })
}
