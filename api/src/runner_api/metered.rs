//! Counts the runner API's calls by call and status, for operators' dashboards:
//! `fallow:runner_api_requests_total{call,status}`. A call is named by its route, without
//! the job's id (`/jobs/{id}/complete` is `complete`).

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// Every call the runner API answers, by route.
pub const REQUESTS: &str = "fallow:runner_api_requests_total";
/// How long a claim took, long poll included, by whether it found jobs.
pub const CLAIM_SECONDS: &str = "fallow:runner_api_claim_seconds";

pub async fn count(request: Request, next: Next) -> Response {
    let call = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unknown", |path| call_name(path.as_str()))
        .to_string();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(REQUESTS, "call" => call, "status" => status).increment(1);
    response
}

/// The route's last segment: `/runner/v1/jobs/{id}/complete` → `complete`, `/claim` →
/// `claim`. Only matched routes are counted by name, so the labels stay few.
fn call_name(route: &str) -> &str {
    route.rsplit('/').next().unwrap_or(route)
}

/// Creates the families at 0, so `/metrics` lists them before the first runner calls.
pub fn register_at_zero() {
    metrics::counter!(REQUESTS, "call" => "claim", "status" => "200").increment(0);
    drop(metrics::histogram!(CLAIM_SECONDS, "outcome" => "jobs"));
}

#[cfg(test)]
mod tests {
    use super::call_name;

    #[test]
    fn a_call_is_named_by_its_route_without_the_jobs_id() {
        assert_eq!(call_name("/runner/v1/jobs/{id}/complete"), "complete");
        assert_eq!(call_name("/claim"), "claim");
        assert_eq!(call_name("/runner/v1/warm-replicas"), "warm-replicas");
    }
}
