//! Who calls the runner API: the holder of a live runner token, and the runner registered
//! with it. Tokens are looked up by hash and kept for a second, so a runner's per-step calls
//! do not each cost a query; a revocation through this process applies at once, through
//! another within that second.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use fallow_scheduler::credentials;
use fallow_scheduler::runners::tokens::{self, RunnerToken};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a looked-up token is trusted without asking Postgres again.
const TOKEN_TTL: Duration = Duration::from_secs(1);

/// The header in which a registered runner names itself.
pub const RUNNER_HEADER: &str = "x-fallow-runner";

/// Tokens recently looked up, by hash.
#[derive(Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<String, (RunnerToken, Instant)>>,
}

impl TokenCache {
    fn get(&self, hash: &str) -> Option<RunnerToken> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(hash)
            .filter(|(_, at)| at.elapsed() < TOKEN_TTL)
            .map(|(token, _)| token.clone())
    }

    fn put(&self, hash: String, token: RunnerToken) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, (_, at)| at.elapsed() < TOKEN_TTL);
        entries.insert(hash, (token, Instant::now()));
    }

    /// Forgets every token: one was revoked, or bound to another runner.
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// A caller holding a live runner token.
#[derive(Debug, Clone)]
pub struct Runner {
    pub token: RunnerToken,
    /// The runner id it sent in [`RUNNER_HEADER`], if any.
    claimed_id: Option<Uuid>,
}

impl Runner {
    /// The runner registered with this token, which must be the one calling: a runner
    /// replaced by a newer registration of the same token gets a 409 and stops.
    pub async fn id(&self, state: &AppState) -> Result<Uuid, ApiError> {
        let Some(claimed) = self.claimed_id else {
            return Err(not_registered());
        };
        if self.token.runner_id == Some(claimed) {
            return Ok(claimed);
        }
        // Registered through another api process within the cache's second: ask again.
        let fresh = tokens::by_id(state.queue().pool(), self.token.id).await?;
        match fresh.and_then(|token| token.runner_id) {
            Some(bound) if bound == claimed => Ok(claimed),
            Some(_) => Err(ApiError::Conflict {
                message: "Another runner has registered with this runner token since; this one is replaced and must stop.".into(),
                code: "runner_replaced",
            }),
            None => Err(not_registered()),
        }
    }
}

fn not_registered() -> ApiError {
    ApiError::Conflict {
        message: "This runner is not registered with its token; register first.".into(),
        code: "runner_not_registered",
    }
}

impl FromRequestParts<AppState> for Runner {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secret = crate::auth::bearer_key(parts).ok_or(ApiError::InvalidRunnerToken)?;
        if !secret.starts_with(tokens::TOKEN_PREFIX) {
            return Err(ApiError::InvalidRunnerToken);
        }
        let hash = credentials::hash(secret);
        let cache = &state.runner_api().tokens;
        let token = match cache.get(&hash) {
            Some(token) => token,
            None => {
                let token = tokens::authenticate(state.queue().pool(), secret)
                    .await?
                    .ok_or(ApiError::InvalidRunnerToken)?;
                cache.put(hash, token.clone());
                token
            }
        };
        let claimed_id = parts
            .headers
            .get(RUNNER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Ok(Runner { token, claimed_id })
    }
}
