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
        .map(|path| call_name(path.as_str()))
        .unwrap_or("unknown");
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(REQUESTS, "call" => call, "status" => status).increment(1);
    response
}

/// `/runner/v1/jobs/{id}/complete` → `complete`; `/runner/v1/claim` → `claim`.
fn call_name(route: &str) -> &'static str {
    const CALLS: &[&str] = &[
        "register",
        "deregister",
        "heartbeat",
        "state",
        "warm",
        "drain",
        "evictions",
        "warm-replicas",
        "pool-turn",
        "claim",
        "renew",
        "complete",
        "cancelled",
        "fail",
        "release",
        "streamed",
        "events",
        "notices",
    ];
    let last = route.rsplit('/').next().unwrap_or_default();
    CALLS
        .iter()
        .find(|call| **call == last)
        .copied()
        .unwrap_or("unknown")
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
        assert_eq!(call_name("/runner/v1/nope"), "unknown");
    }
}
