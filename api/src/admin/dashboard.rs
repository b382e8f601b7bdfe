//! `GET /dashboard`: a live page for operators — runners (state, device, models, load), the
//! queue, and charts of queue depth, throughput and latency — in plain HTML and JS that polls
//! the admin API and `/metrics`. The page itself holds no data, so it is served to anyone;
//! everything it shows comes from the admin API, which wants the admin token (taken from
//! `#token=…` or a form, kept in the tab's session storage).

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("dashboard.html");

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page runs only its own inline script and talks only to this origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
