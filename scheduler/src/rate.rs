//! Per-tenant rate limits, shared by every api process through Redis: requests and tokens
//! per window (a minute in production), and the batch quota ([`batch_quota`]).
//!
//! The window is fixed, one per tenant and window index, kept in a Redis hash
//! (`fallow:rate:{tenant}:{index}` with fields `r` and `t`).
//! A fixed window is one `EVAL` per admission, needs Redis's clock only, and its reset time
//! is the same for requests and tokens, which is what OpenAI's headers report.
//! Its one weakness, a burst of twice the limit across a window's edge, is acceptable for
//! limits meant to share a fleet, not to meter it to the token.
//!
//! Tokens are reserved at admission (an estimate of the prompt plus the most the request may
//! generate) and settled when the api sees the job's `Final`: each job's reservation is
//! remembered under `fallow:rate:job:{id}` until its window ends.
//! A job whose client vanished is never settled: its reservation ends with its window.

pub mod batch_quota;

use crate::stream::TokenRelay;
use crate::SchedulerError;
use redis::Script;
use std::sync::LazyLock;
use std::time::Duration;
use uuid::Uuid;

static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rate/scripts/admit.lua")));
static SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rate/scripts/settle.lua")));

/// A tenant's limits for one window; 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    pub requests: u64,
    pub tokens: u64,
    /// The window's length: a minute, shorter only in tests.
    pub window: Duration,
}

impl WindowLimits {
    pub fn is_unlimited(&self) -> bool {
        self.requests == 0 && self.tokens == 0
    }
}

/// Which limit refused a request; its name is OpenAI's error `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Requests,
    Tokens,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
        }
    }
}

/// The outcome of an admission, and the window as it stands after it.
#[derive(Debug, Clone)]
pub struct Admission {
    /// `None`: admitted (one request counted, the tokens reserved).
    pub refused: Option<Limit>,
    pub limits: WindowLimits,
    /// Requests counted in the window, this one included if admitted.
    pub requests_used: u64,
    /// Tokens reserved or used in the window, this request's included if admitted.
    pub tokens_used: u64,
    /// Time until the window ends and both counts start again from 0.
    pub reset: Duration,
    /// The window's Redis key, which reservations point at.
    window_key: String,
}

impl Admission {
    pub fn requests_remaining(&self) -> u64 {
        self.limits.requests.saturating_sub(self.requests_used)
    }
    pub fn tokens_remaining(&self) -> u64 {
        self.limits.tokens.saturating_sub(self.tokens_used)
    }
}

/// The Redis key prefix of a tenant's windows.
fn tenant_key(tenant: Uuid) -> String {
    format!("fallow:rate:{tenant}")
}

/// The Redis key of a job's token reservation.
pub fn reservation_key(job: Uuid) -> String {
    format!("fallow:rate:job:{job}")
}

/// Counts one request of `tenant` and reserves `tokens`, unless a limit refuses it.
/// Atomic across api processes: one script on Redis.
pub async fn admit(
    relay: &TokenRelay,
    tenant: Uuid,
    limits: WindowLimits,
    tokens: u64,
) -> Result<Admission, SchedulerError> {
    let window_ms = u64::try_from(limits.window.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut conn = relay.manager().await?;
    let (refused, requests, tokens_used, reset_ms, window_key): (String, i64, i64, i64, String) =
        ADMIT
            .key(tenant_key(tenant))
            .arg(window_ms)
            .arg(limits.requests)
            .arg(limits.tokens)
            .arg(tokens)
            .invoke_async(&mut conn)
            .await?;
    let refused = match refused.as_str() {
        "requests" => Some(Limit::Requests),
        "tokens" => Some(Limit::Tokens),
        _ => None,
    };
    Ok(Admission {
        refused,
        limits,
        requests_used: requests.max(0) as u64,
        tokens_used: tokens_used.max(0) as u64,
        reset: Duration::from_millis(reset_ms.max(0) as u64),
        window_key,
    })
}

/// Remembers each job's share of an admitted reservation, so that [`settle`] can give back
/// what the job does not use. Nothing to remember without a token limit.
pub async fn hold(
    relay: &TokenRelay,
    admission: &Admission,
    jobs: &[(Uuid, u64)],
) -> Result<(), SchedulerError> {
    if admission.refused.is_some() || admission.limits.tokens == 0 || jobs.is_empty() {
        return Ok(());
    }
    // The window's own expiry plus its slack: a reservation never outlives its window.
    let ttl_ms = u64::try_from(admission.reset.as_millis()).unwrap_or(u64::MAX) + 1000;
    let mut pipe = redis::pipe();
    for (job, tokens) in jobs {
        pipe.cmd("SET")
            .arg(reservation_key(*job))
            .arg(format!("{}|{tokens}", admission.window_key))
            .arg("PX")
            .arg(ttl_ms)
            .ignore();
    }
    let mut conn = relay.manager().await?;
    pipe.query_async::<()>(&mut conn).await?;
    Ok(())
}

/// Settles a job's reservation with the tokens it really used; false if it had none (no
/// token limit, already settled, or its window has ended).
pub async fn settle(relay: &TokenRelay, job: Uuid, used: u64) -> Result<bool, SchedulerError> {
    let mut conn = relay.manager().await?;
    let settled: i64 = SETTLE
        .key(reservation_key(job))
        .arg(used)
        .invoke_async(&mut conn)
        .await?;
    Ok(settled == 1)
}
