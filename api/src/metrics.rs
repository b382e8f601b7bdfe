//! Prometheus metrics, named after vLLM's (`vllm:` → `fallow:`). The recorder is global to
//! the process, so it is installed once (a `OnceLock`); if another recorder got there first
//! (an embedding program, or a second server in the same test binary) the api keeps working
//! and `/metrics` says so.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

pub const REQUESTS: &str = "fallow:request_received_total";
pub const REQUEST_SUCCESS: &str = "fallow:request_success_total";
pub const REQUEST_ERRORS: &str = "fallow:request_errors_total";
pub const REQUEST_CANCELLED: &str = "fallow:request_cancelled_total";
pub const E2E_LATENCY: &str = "fallow:e2e_request_latency_seconds";
pub const TTFT: &str = "fallow:time_to_first_token_seconds";
pub const PROMPT_TOKENS: &str = "fallow:prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "fallow:generation_tokens_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus handle, installing the recorder on first use.
pub fn prometheus_handle() -> Option<PrometheusHandle> {
    HANDLE.get_or_init(install).clone()
}

fn install() -> Option<PrometheusHandle> {
    let builder = match PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
    {
        Ok(builder) => builder,
        Err(err) => {
            tracing::warn!(error = %err, "invalid histogram buckets; metrics disabled");
            return None;
        }
    };
    match builder.install_recorder() {
        Ok(handle) => {
            register_at_zero();
            Some(handle)
        }
        Err(err) => {
            tracing::warn!(error = %err, "a metrics recorder is already installed; /metrics will be empty");
            None
        }
    }
}

/// Finish reasons counted from the start, as vLLM registers them.
const FINISH_REASONS: [&str; 3] = ["stop", "length", "tool_calls"];

/// Creates every api counter and histogram at 0, so `/metrics` lists them before the first
/// request and dashboards show 0 rather than "no data". Labelled families start with the
/// labels a request can give them first.
fn register_at_zero() {
    for name in [
        REQUESTS,
        REQUEST_CANCELLED,
        PROMPT_TOKENS,
        GENERATION_TOKENS,
    ] {
        metrics::counter!(name).increment(0);
    }
    for reason in FINISH_REASONS {
        metrics::counter!(REQUEST_SUCCESS, "finished_reason" => reason).increment(0);
    }
    metrics::counter!(REQUEST_ERRORS, "type" => "invalid_request_error").increment(0);
    for name in [E2E_LATENCY, TTFT] {
        // A histogram handle registers the series; nothing is recorded.
        drop(metrics::histogram!(name));
    }
    crate::runner_api::metered::register_at_zero();
}

/// Counts a finished request and its latency.
pub fn record_success(
    finish_reason: &'static str,
    e2e_seconds: f64,
    usage: &fallow_protocol::job::Usage,
) {
    metrics::counter!(REQUEST_SUCCESS, "finished_reason" => finish_reason).increment(1);
    metrics::histogram!(E2E_LATENCY).record(e2e_seconds);
    metrics::counter!(PROMPT_TOKENS).increment(u64::from(usage.prompt_tokens));
    metrics::counter!(GENERATION_TOKENS).increment(u64::from(usage.completion_tokens));
}

/// Serves only `GET /metrics`, for a process without the api (a standalone runner), until
/// `shutdown` resolves.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = prometheus_handle();
    let render = move || {
        let handle = handle.clone();
        async move {
            match handle {
                Some(h) => {
                    h.run_upkeep();
                    h.render()
                }
                None => "# another metrics recorder is installed in this process\n".to_string(),
            }
        }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(render));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
