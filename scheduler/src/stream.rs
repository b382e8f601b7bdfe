//! The Redis Streams token relay. One stream per job (`fallow:job:{id}`), appended per
//! engine step in one pipelined round trip, capped with `MAXLEN ~`, expiring after `ttl`.
//! A live job's cap leaves room for every entry its request can produce ([`entries_needed`]):
//! a continuation and a resuming reader need the stream from its start, so a legitimate
//! stream is never trimmed; the cap only stops a runaway one.
//! Cancel signals travel on the `fallow:cancel` pub/sub channel.
//!
//! Redis carries tokens and signals only; Postgres holds every job's state. So every call
//! here fails with `SchedulerError::Redis` while Redis is away and works again once it is
//! back, and nothing here panics:
//! - appends, pings and publishes share one [`ConnectionManager`], which reconnects itself;
//! - blocking reads (`XREAD BLOCK`) each take a dedicated connection from a small idle pool,
//!   because a blocked command on the shared multiplexed connection would stall every append
//!   queued behind it;
//! - the cancel subscription runs in its own task that resubscribes with backoff.

use crate::SchedulerError;
use fallow_protocol::job::JobEvent;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, AsyncConnectionConfig, Client, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OnceCell;
use uuid::Uuid;

mod cancel;

/// The pub/sub channel carrying job ids whose cancellation was requested.
pub const CANCEL_CHANNEL: &str = "fallow:cancel";

/// The Redis key of a job's token stream.
pub fn stream_key(job: Uuid) -> String {
    format!("fallow:job:{job}")
}

/// The most entries a job's stream can legitimately hold, or `None` when its request does
/// not bound them (no `max_tokens`: the model's context does). Each choice's tokens each
/// give at most one delta, plus a last delta carrying its finish; each attempt adds a start,
/// and the job ends with one final entry (a few more leave room for errors).
pub fn entries_needed(n: u32, max_tokens: Option<u32>, attempt: i32) -> Option<usize> {
    let per_choice = max_tokens? as usize + 1;
    let attempts = attempt.max(1) as usize;
    Some((n.max(1) as usize).saturating_mul(per_choice) + attempts + 8)
}

/// Tunables of the relay; `Default` suits production.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// How long a job's stream lives after its last append (a reader that comes back later
    /// finds the job's result in Postgres instead).
    pub ttl: Duration,
    /// Approximate cap on entries per stream (`MAXLEN ~`), raised for a job whose request
    /// can produce more.
    pub max_len: usize,
    /// Entries returned per read at most.
    pub read_count: usize,
    /// Idle dedicated connections kept for blocking reads.
    pub idle_readers: usize,
    /// Deadline for a non-blocking command's reply, and for connecting.
    pub response_timeout: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            ttl: Duration::from_secs(3600),
            max_len: 10_000,
            read_count: 512,
            idle_readers: 16,
            response_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Clone)]
pub struct TokenRelay {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: RelayConfig,
    /// Created on first successful use, so a relay can start while Redis is still down.
    manager: OnceCell<ConnectionManager>,
    /// Idle dedicated connections for `XREAD BLOCK`. A std mutex: held only to push or pop.
    readers: Mutex<Vec<MultiplexedConnection>>,
}

/// One stream entry: its Redis id (used as the SSE `id:`) and the event.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    pub id: String,
    pub event: JobEvent,
}

impl TokenRelay {
    /// Connects (lazily reconnecting after Redis restarts).
    pub async fn connect(url: &str) -> Result<Self, SchedulerError> {
        Self::connect_with(url, RelayConfig::default()).await
    }

    /// [`connect`](Self::connect) with explicit tunables. A malformed URL is an error; an
    /// unreachable Redis is only logged, and the connection is made on first use.
    pub async fn connect_with(url: &str, config: RelayConfig) -> Result<Self, SchedulerError> {
        let client = Client::open(url)?;
        let relay = TokenRelay {
            inner: Arc::new(Inner {
                client,
                config,
                manager: OnceCell::new(),
                readers: Mutex::new(Vec::new()),
            }),
        };
        if let Err(e) = relay.manager().await {
            tracing::warn!(error = %e, "redis not reachable yet; will connect on first use");
        }
        Ok(relay)
    }

    pub fn config(&self) -> &RelayConfig {
        &self.inner.config
    }

    /// Appends events for several jobs in one pipelined round trip, each stream capped at
    /// the configured `max_len`.
    pub async fn append(&self, events: &[(Uuid, JobEvent)]) -> Result<(), SchedulerError> {
        self.append_capped(events, |_| Some(0)).await
    }

    /// [`append`](Self::append), with each job's stream capped at what `needed(job)` says
    /// it can hold ([`entries_needed`]; never below `max_len`), or not at all (`None`: an
    /// unbounded request, or a job's last entry).
    pub async fn append_capped(
        &self,
        events: &[(Uuid, JobEvent)],
        needed: impl Fn(Uuid) -> Option<usize>,
    ) -> Result<(), SchedulerError> {
        if events.is_empty() {
            return Ok(());
        }
        let config = &self.inner.config;
        let mut pipe = redis::pipe();
        let mut keys = BTreeSet::new();
        for (job, event) in events {
            let data = serde_json::to_string(event)
                .map_err(|e| SchedulerError::Corrupt(format!("event not serialisable: {e}")))?;
            let key = stream_key(*job);
            let xadd = pipe.cmd("XADD").arg(&key);
            if let Some(needed) = needed(*job) {
                xadd.arg("MAXLEN").arg("~").arg(needed.max(config.max_len));
            }
            xadd.arg("*").arg("data").arg(data).ignore();
            keys.insert(key);
        }
        let ttl = config.ttl.as_secs().max(1);
        for key in keys {
            pipe.cmd("EXPIRE").arg(key).arg(ttl).ignore();
        }
        let mut conn = self.manager().await?;
        pipe.query_async::<()>(&mut conn).await?;
        self.settle_finished(events).await;
        Ok(())
    }

    /// Settles the token reservation of each job whose `Final` was just written: here, where
    /// every job's end passes once, rather than in a reader, since a background response or
    /// a batch line may have none.
    async fn settle_finished(&self, events: &[(Uuid, JobEvent)]) {
        for (job, event) in events {
            if let JobEvent::Final { completion } = event {
                let used = u64::from(completion.usage.total_tokens());
                if let Err(err) = crate::rate::settle(self, *job, used).await {
                    tracing::warn!(%job, error = %err, "could not settle a token reservation");
                }
            }
        }
    }

    /// Entries after `after` (`"0"` = from the start), waiting up to `block` for at least one.
    /// Returns an empty vec on timeout.
    pub async fn read_after(
        &self,
        job: Uuid,
        after: &str,
        block: Duration,
    ) -> Result<Vec<StreamEntry>, SchedulerError> {
        let block_ms = block.as_millis().min(u128::from(u32::MAX)) as usize;
        let mut options = StreamReadOptions::default().count(self.inner.config.read_count);
        // BLOCK 0 would mean "forever"; a zero wait is a plain non-blocking read instead.
        if block_ms > 0 {
            options = options.block(block_ms);
        }
        let key = stream_key(job);
        let (mut conn, mut reused) = self.reader().await?;
        let reply = loop {
            // The server answers by the block deadline; allow the usual reply time on top.
            conn.set_response_timeout(block + self.inner.config.response_timeout);
            let read: Result<Option<StreamReadReply>, redis::RedisError> =
                conn.xread_options(&[&key], &[after], &options).await;
            match read {
                Ok(reply) => break reply,
                // An idle pooled connection may have died with a Redis restart; then its
                // siblings did too. XREAD only reads, so retrying on a fresh one is safe.
                Err(e) if reused && (e.is_io_error() || e.is_connection_dropped()) => {
                    self.inner
                        .readers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                    (conn, reused) = self.reader().await?;
                }
                Err(e) => return Err(e.into()),
            }
        };
        // Only a connection that answered goes back to the pool; one that failed, or whose
        // read was abandoned mid-flight (future dropped), is simply closed.
        self.return_reader(conn);
        let Some(reply) = reply else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::new();
        for key in reply.keys {
            for entry in key.ids {
                let event = decode_event(&entry.id, entry.map.get("data"))?;
                entries.push(StreamEntry {
                    id: entry.id,
                    event,
                });
            }
        }
        Ok(entries)
    }

    /// Every entry of `job`'s stream, in order, without waiting.
    pub async fn read_all(&self, job: Uuid) -> Result<Vec<StreamEntry>, SchedulerError> {
        let mut all: Vec<StreamEntry> = Vec::new();
        loop {
            let after = all.last().map_or_else(|| "0".to_string(), |e| e.id.clone());
            let page = self.read_after(job, &after, Duration::ZERO).await?;
            if page.is_empty() {
                return Ok(all);
            }
            all.extend(page);
        }
    }

    /// Publishes a cancel signal for a job to all runners.
    pub async fn signal_cancel(&self, job: Uuid) -> Result<(), SchedulerError> {
        let mut conn = self.manager().await?;
        let _receivers: i64 = conn.publish(CANCEL_CHANNEL, job.to_string()).await?;
        Ok(())
    }

    /// A stream of job ids whose cancellation was signalled; reconnects on its own.
    pub fn cancel_signals(&self) -> tokio::sync::mpsc::Receiver<Uuid> {
        cancel::spawn_subscriber(self.inner.client.clone())
    }

    /// PING, for `/ready`.
    pub async fn ping(&self) -> Result<(), SchedulerError> {
        let mut conn = self.manager().await?;
        let _pong: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    /// Whether `job`'s stream still exists (it expires `ttl` after its last entry).
    pub async fn exists(&self, job: Uuid) -> Result<bool, SchedulerError> {
        let mut conn = self.manager().await?;
        Ok(conn.exists(stream_key(job)).await?)
    }

    /// Deletes a job's stream (e.g. before a retried attempt starts streaming afresh).
    pub async fn delete(&self, job: Uuid) -> Result<(), SchedulerError> {
        let mut conn = self.manager().await?;
        let _deleted: i64 = conn.del(stream_key(job)).await?;
        Ok(())
    }

    /// The shared connection (appends, pings, publishes, and the rate limiter's scripts).
    pub(crate) async fn manager(&self) -> Result<ConnectionManager, SchedulerError> {
        let timeout = self.inner.config.response_timeout;
        let manager = self
            .inner
            .manager
            .get_or_try_init(|| async {
                // No retry schedule (its first sleep alone is about a second): while Redis
                // is down a caller should hear so at once (the api answers 503). The manager
                // tries to reconnect again on the next command anyway.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout)
                    .set_number_of_retries(0);
                ConnectionManager::new_with_config(self.inner.client.clone(), config).await
            })
            .await?;
        Ok(manager.clone())
    }

    /// A dedicated connection for one blocking read, and whether it was reused from the pool.
    async fn reader(&self) -> Result<(MultiplexedConnection, bool), SchedulerError> {
        let idle = self
            .inner
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        if let Some(conn) = idle {
            return Ok((conn, true));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.inner.config.response_timeout)
            .set_response_timeout(self.inner.config.response_timeout);
        let conn = self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok((conn, false))
    }

    fn return_reader(&self, conn: MultiplexedConnection) {
        let mut idle = self.inner.readers.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.inner.config.idle_readers {
            idle.push(conn);
        }
    }
}

fn decode_event(entry_id: &str, data: Option<&Value>) -> Result<JobEvent, SchedulerError> {
    let bytes = match data {
        Some(Value::BulkString(bytes)) => bytes.as_slice(),
        Some(Value::SimpleString(s)) => s.as_bytes(),
        _ => {
            return Err(SchedulerError::Corrupt(format!(
                "stream entry {entry_id} has no data field"
            )))
        }
    };
    serde_json::from_slice(bytes)
        .map_err(|e| SchedulerError::Corrupt(format!("stream entry {entry_id}: {e}")))
}
