//! The HTTP surface: which path goes to which handler, and the layers every request passes
//! (request id, tracing span, the `Host` check, body size limit). Unknown paths and
//! methods answer in the OpenAI error envelope too.

mod batches;
mod chat;
mod completions;
mod embeddings;
mod files;
mod models;
mod ops;
mod response_reads;
mod responses;
mod text_completions;
mod tokenize;

use crate::state::AppState;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// The request id header: echoed when the client sent one, generated otherwise.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The api's router with its state applied.
pub fn router(state: AppState) -> Router {
    let body_limit = state.config().max_body_bytes;
    let upload_limit = usize::try_from(state.config().max_file_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(64 << 10);
    let layers = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(PropagateRequestIdLayer::x_request_id());
    Router::new()
        .route("/v1/chat/completions", post(chat::create_chat_completion))
        .route(
            "/v1/chat/completions/{id}",
            get(completions::get_chat_completion),
        )
        .route(
            "/v1/chat/completions/{id}/stream",
            get(completions::resume_chat_stream),
        )
        .route("/v1/completions", post(text_completions::create_completion))
        .route("/v1/embeddings", post(embeddings::create_embeddings))
        .route("/v1/responses", post(responses::create_response))
        .route(
            "/v1/responses/{id}",
            get(response_reads::get_response).delete(response_reads::delete_response),
        )
        .route(
            "/v1/responses/{id}/cancel",
            post(response_reads::cancel_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(response_reads::list_input_items),
        )
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/v1/tokenize", post(tokenize::tokenize))
        .route("/v1/detokenize", post(tokenize::detokenize))
        .route(
            "/v1/files",
            post(files::upload_file)
                .get(files::list_files)
                // Uploads may be far larger than a chat request; multipart overhead included.
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route(
            "/v1/files/{id}",
            get(files::get_file).delete(files::delete_file),
        )
        .route("/v1/files/{id}/content", get(files::get_file_content))
        .route(
            "/v1/batches",
            post(batches::create_batch).get(batches::list_batches),
        )
        .route("/v1/batches/{id}", get(batches::get_batch))
        .route("/v1/batches/{id}/cancel", post(batches::cancel_batch))
        .route("/v1/models", get(models::list_models))
        .route("/v1/models/{*id}", get(models::get_model))
        .nest("/admin", crate::admin::routes())
        .nest(
            fallow_scheduler::runner_wire::BASE_PATH,
            crate::runner_api::routes(),
        )
        .route("/dashboard", get(crate::admin::dashboard::page))
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::unknown_route)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        // Inside the tracing layers, so refused requests are logged with their id.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::host_check::enforce,
        ))
        // OpenAI's x-ratelimit-* headers, from the window a request's admission saw.
        .layer(axum::middleware::from_fn(crate::rate_limit::headers))
        .layer(layers)
        .with_state(state)
}

/// `GET /metrics` alone, for its own listener (`--metrics-listen`); the main listener
/// serves it too, for the dashboard. No `Host` check there: it serves only counters and
/// gauges, and scrapers address it by whatever name their network gives it.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(ops::metrics))
        .fallback(ops::unknown_route)
        .with_state(state)
}

/// Every request's span carries its request id, so job logs can be tied to it.
fn request_span(request: &Request) -> tracing::Span {
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "http",
        method = %request.method(),
        path = %request.uri().path(),
        request_id,
    )
}
