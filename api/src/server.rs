//! Running the api on a listener until a shutdown future resolves. The listener is passed
//! in (tests bind `127.0.0.1:0`), and so is the shutdown signal: no globals, no ports
//! chosen here.

use crate::routes::{metrics_router, router};
use crate::state::AppState;
use axum::serve::ListenerExt;
use std::future::Future;
use std::time::Duration;

/// How often histogram samples are folded into the Prometheus buckets when nobody scrapes.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Serves the api until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = state.metrics().cloned().map(|handle| {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        })
    });
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "api listening");
    }
    let closing = state.clone();
    let shutdown = async move {
        shutdown.await;
        closing.runner_api().closing.close();
    };
    // Streams are many small writes; Nagle's algorithm would hold each behind the last
    // one's acknowledgement.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
    });
    let result = axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await;
    if let Some(task) = upkeep {
        task.abort();
    }
    result
}

/// Serves `GET /metrics` alone on `listener` (`--metrics-listen`) until `shutdown`
/// resolves. The histogram upkeep runs in [`serve`], which runs beside it.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics listening");
    }
    axum::serve(listener, metrics_router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
