//! Waiting for work: `LISTEN fallow_jobs` turned into a wake-up for idle runners.
//!
//! `NOTIFY` is only a hint, never the source of truth: a waiter always wakes after its
//! timeout too, and runners poll on that cadence. One background task per [`Queue`] (shared
//! by its clones) holds the `LISTEN` connection, is started on the first wait, reconnects
//! with backoff when Postgres goes away, and ends when the last clone of the queue is dropped.

use super::{Queue, NOTIFY_CHANNEL};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::sync::{OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

#[derive(Default)]
pub(super) struct WakeHub {
    notify: Notify,
    /// Dropped with the hub, which tells the listener task to end.
    stop: OnceLock<oneshot::Sender<()>>,
}

impl WakeHub {
    fn wake(&self) {
        // Wake everyone waiting now, and leave one permit so that a runner that was busy
        // claiming when the hint came does not sleep through it.
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

impl Queue {
    /// Waits until a `NOTIFY` hint arrives or `timeout` passes.
    pub async fn wait_for_work(&self, timeout: Duration) {
        self.wake.stop.get_or_init(|| {
            let (stop_tx, stop_rx) = oneshot::channel();
            let hub = std::sync::Arc::downgrade(&self.wake);
            tokio::spawn(listen(self.pool.clone(), hub, stop_rx));
            stop_tx
        });
        let _ = tokio::time::timeout(timeout, self.wake.notify.notified()).await;
    }
}

async fn listen(pool: PgPool, hub: Weak<WakeHub>, mut stop: oneshot::Receiver<()>) {
    let mut retry = Duration::from_millis(100);
    loop {
        let connected = tokio::select! {
            _ = &mut stop => return,
            c = connect(&pool) => c,
        };
        match connected {
            Ok(mut listener) => {
                retry = Duration::from_millis(100);
                loop {
                    let received = tokio::select! {
                        _ = &mut stop => return,
                        r = listener.try_recv() => r,
                    };
                    match received {
                        Ok(Some(_)) => {}
                        // Connection lost (reconnected on the next call): hints may have been
                        // missed, so wake everyone to look for themselves.
                        Ok(None) => {}
                        Err(_) if pool.is_closed() => return,
                        Err(e) => {
                            tracing::warn!(error = %e, "job notification listener failed");
                            break;
                        }
                    }
                    match hub.upgrade() {
                        Some(hub) => hub.wake(),
                        None => return,
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot LISTEN for job notifications"),
        }
        if pool.is_closed() {
            return;
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(Duration::from_secs(30));
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}
