//! The cancel-signal subscriber: a task that SUBSCRIBEs to `fallow:cancel` and forwards job
//! ids into a channel, resubscribing with backoff whenever Redis goes away.
//!
//! Signals published while the subscription is down are lost; that is acceptable because
//! the signal is only the fast path. The row flag `cancel_requested` reaches the runner on
//! its next heartbeat regardless.

use super::CANCEL_CHANNEL;
use futures::StreamExt;
use redis::Client;
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Signals buffered for a slow consumer before the subscriber waits on it.
const BUFFER: usize = 1024;

pub(super) fn spawn_subscriber(client: Client) -> mpsc::Receiver<Uuid> {
    let (tx, rx) = mpsc::channel(BUFFER);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(subscribe_forever(client, tx));
        }
        // Without a runtime there is nothing to run the subscription on; the receiver just
        // reports a closed channel instead of the caller panicking.
        Err(e) => tracing::error!(error = %e, "cancel_signals called outside a tokio runtime"),
    }
    rx
}

async fn subscribe_forever(client: Client, tx: mpsc::Sender<Uuid>) {
    let mut retry = Duration::from_millis(100);
    loop {
        let ended = tokio::select! {
            _ = tx.closed() => return,
            ended = forward(&client, &tx) => ended,
        };
        match ended {
            // The consumer went away: done.
            Ok(Forwarded::ReceiverGone) => return,
            // The connection dropped after a healthy subscription: retry soon.
            Ok(Forwarded::ConnectionLost) => retry = Duration::from_millis(100),
            Err(e) => tracing::warn!(error = %e, "cancel subscription failed; retrying"),
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(Duration::from_secs(10));
    }
}

enum Forwarded {
    ReceiverGone,
    ConnectionLost,
}

async fn forward(client: &Client, tx: &mpsc::Sender<Uuid>) -> redis::RedisResult<Forwarded> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(CANCEL_CHANNEL).await?;
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        let payload: String = match message.get_payload() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable cancel signal ignored");
                continue;
            }
        };
        match Uuid::parse_str(payload.trim()) {
            Ok(job) => {
                if tx.send(job).await.is_err() {
                    return Ok(Forwarded::ReceiverGone);
                }
            }
            Err(_) => tracing::warn!(payload, "cancel signal without a job id ignored"),
        }
    }
    Ok(Forwarded::ConnectionLost)
}
