//! Operational endpoints: liveness, readiness (Postgres and Redis reachable), Prometheus
//! metrics, and the envelope answers for unknown routes and methods.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// Liveness: the process answers.
pub async fn health() -> &'static str {
    "ok"
}

/// Readiness: 200 when Postgres answers `SELECT 1` and Redis answers `PING`, else 503.
pub async fn ready(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    sqlx::query(include_str!("queries/ping_database.sql"))
        .execute(state.queue().pool())
        .await
        .map_err(|err| ApiError::Unavailable(format!("database unavailable: {err}")))?;
    state.relay().ping().await?;
    Ok("ready")
}

/// Prometheus text exposition.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let body = match state.metrics() {
        Some(handle) => {
            crate::admin::gauges::refresh(&state).await;
            handle.run_upkeep();
            handle.render()
        }
        None => "# metrics recorder not installed by fallow-api (another recorder is active)\n"
            .to_owned(),
    };
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

pub async fn unknown_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("Invalid URL ({method} {})", uri.path()))
}

pub async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}
