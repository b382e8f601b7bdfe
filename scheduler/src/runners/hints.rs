//! Telling a runner at once that an operator changed its state: `set_state` sends a
//! `NOTIFY` on [`STATE_CHANNEL`] with the runner id, and the runner listens here. Only a
//! hint: the runner re-reads its row, and its heartbeat re-reads it anyway.

use super::STATE_CHANNEL;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Listens for operator state changes of `runner`; each hint arrives as `()`. Reconnects
/// with backoff; the heartbeat stays the fallback for hints lost meanwhile.
pub fn state_hints(pool: PgPool, runner: Uuid) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut retry = Duration::from_millis(200);
        loop {
            match listen(&pool, runner, &tx).await {
                Ok(()) => return, // the worker is gone
                Err(e) if pool.is_closed() => {
                    tracing::debug!(error = %e, "state listener stopped with its pool");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "runner state listener failed; reconnecting"),
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(30));
            // Anything may have changed while we were deaf.
            if tx.try_send(()).is_err() && tx.is_closed() {
                return;
            }
        }
    });
    rx
}

async fn listen(pool: &PgPool, runner: Uuid, tx: &mpsc::Sender<()>) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(STATE_CHANNEL).await?;
    let me = runner.to_string();
    loop {
        let note = tokio::select! {
            _ = tx.closed() => return Ok(()),
            note = listener.recv() => note?,
        };
        if note.payload() == me {
            // Full channel = a hint is already pending; one refresh covers both.
            let _ = tx.try_send(());
        }
    }
}
