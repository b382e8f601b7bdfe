//! Per-tenant request and token limits at admission, and OpenAI's `x-ratelimit-*` headers.
//!
//! A generation request is admitted by [`admit`], next to the active-job check: it counts one
//! request and reserves tokens for it in the tenant's window ([`fallow_scheduler::rate`]), or
//! refuses it with a 429 naming the limit.
//! The api has no tokenizer, so a prompt is estimated at one token per 4 bytes (rounded up),
//! and a request reserves that plus `max_tokens × n` (nothing for an unset `max_tokens`:
//! such a request is charged what it really used once it is settled).
//! Once the jobs exist, [`Reservation::hold`] remembers each job's share, and the relay
//! settles it when the runner writes the job's `Final`
//! ([`fallow_scheduler::stream::TokenRelay::append`]), giving back
//! what was not used, whether or not anyone reads the stream (a background response).
//!
//! Headers: the [`headers`] middleware gives each request a slot that admission fills; once
//! the handler has answered, the slot's window becomes the six headers, on a 200 and a 429
//! alike. A request refused before admission (a 400) carries none, and neither does an
//! unlimited tenant: a limit of 0 sends none of its three headers.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use fallow_protocol::job::{EmbedInput, GenerateRequest, Prompt};
use fallow_scheduler::rate::{self, Admission, Limit, WindowLimits};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

tokio::task_local! {
    /// The window seen by this request's admission, for its response headers.
    static WINDOW: Arc<Mutex<Option<Admission>>>;
}

/// Tokens reserved for a request, per job, until the jobs exist and hold them.
#[derive(Debug, Default)]
#[must_use = "hold the reservation once the jobs are enqueued, so it can be settled"]
pub struct Reservation {
    admission: Option<Admission>,
    per_job: Vec<u64>,
}

/// Counts one request of the caller's tenant and reserves the tokens of `requests` (one per
/// job); a 429 if a limit refuses it. Callers without a tenant, or whose tenant has no
/// limits, pass without a round trip to Redis.
pub async fn admit(
    state: &AppState,
    caller: &Caller,
    requests: &[GenerateRequest],
) -> Result<Reservation, ApiError> {
    let Some(tenant) = &caller.tenant else {
        return Ok(Reservation::default());
    };
    let limits = WindowLimits {
        requests: tenant.rate.requests_per_minute.max(0) as u64,
        tokens: tenant.rate.tokens_per_minute.max(0) as u64,
        window: state.config().rate_window,
    };
    if limits.is_unlimited() {
        return Ok(Reservation::default());
    }
    let per_job: Vec<u64> = requests.iter().map(estimate_tokens).collect();
    let wanted = per_job.iter().fold(0u64, |sum, t| sum.saturating_add(*t));
    let admission = rate::admit(state.relay(), tenant.id, limits, wanted).await?;
    remember(&admission);
    if let Some(limit) = admission.refused {
        return Err(refusal(&admission, limit, wanted));
    }
    Ok(Reservation {
        admission: Some(admission),
        per_job,
    })
}

impl Reservation {
    /// Remembers each job's share (`jobs` in the order of the requests given to [`admit`]).
    /// A failure is only logged: the jobs are queued, and an unsettled reservation merely
    /// ends with its window.
    pub async fn hold(self, state: &AppState, jobs: &[Uuid]) {
        let Some(admission) = &self.admission else {
            return;
        };
        let shares: Vec<(Uuid, u64)> = jobs.iter().copied().zip(self.per_job).collect();
        if let Err(err) = rate::hold(state.relay(), admission, &shares).await {
            tracing::warn!(error = %err, "could not hold a token reservation; it ends with its window");
        }
    }
}

/// The most tokens a request may cost: its estimated prompt plus `max_tokens × n`.
pub fn estimate_tokens(request: &GenerateRequest) -> u64 {
    let prompt_bytes: usize = match &request.input {
        Prompt::Text { text } => text.len(),
        // Token ids are exact: count them as 4 bytes each, so they estimate as themselves.
        Prompt::Tokens { ids } => ids.len().saturating_mul(4),
        Prompt::Messages => {
            let messages: usize = request
                .messages
                .iter()
                .map(|m| {
                    m.content.as_deref().map_or(0, str::len)
                        + m.tool_calls
                            .iter()
                            .map(|c| c.name.len() + c.arguments.len())
                            .sum::<usize>()
                })
                .sum();
            let tools: usize = request.tools.iter().map(|t| t.to_string().len()).sum();
            messages + tools
        }
    };
    let embed_bytes: usize = request.embed.as_ref().map_or(0, |embed| {
        embed
            .inputs
            .iter()
            .map(|input| match input {
                EmbedInput::Text { text } => text.len(),
                EmbedInput::Tokens { ids } => ids.len().saturating_mul(4),
            })
            .sum()
    });
    let prompt_bytes = prompt_bytes.saturating_add(embed_bytes);
    let prompt = (prompt_bytes as u64).div_ceil(4);
    let per_choice = u64::from(request.sampling.max_tokens.unwrap_or(0));
    prompt.saturating_add(per_choice.saturating_mul(u64::from(request.n.max(1))))
}

fn refusal(admission: &Admission, limit: Limit, wanted: u64) -> ApiError {
    let wait = format_duration(admission.reset);
    let message = match limit {
        Limit::Requests => format!(
            "Rate limit reached for requests per minute: limit {}, used {}, requested 1. Please try again in {wait}.",
            admission.limits.requests, admission.requests_used
        ),
        Limit::Tokens if wanted > admission.limits.tokens => format!(
            "Request too large for tokens per minute: limit {}, requested {wanted} (the prompt estimated at 4 bytes a token, plus max_tokens × n). Lower max_tokens or the prompt.",
            admission.limits.tokens
        ),
        Limit::Tokens => format!(
            "Rate limit reached for tokens per minute: limit {}, used {}, requested {wanted}. Please try again in {wait}.",
            admission.limits.tokens, admission.tokens_used
        ),
    };
    ApiError::RateLimitReached {
        limit: limit.as_str(),
        message,
        retry_after: admission.reset,
    }
}

/// Keeps the window for this request's headers (outside the middleware: nowhere).
fn remember(admission: &Admission) {
    let _ = WINDOW.try_with(|slot| {
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(admission.clone());
    });
}

/// Middleware: runs the request with a window slot, then writes the window, if admission
/// filled it, as OpenAI's headers.
pub async fn headers(request: Request, next: Next) -> Response {
    let slot = Arc::new(Mutex::new(None));
    let mut response = WINDOW.scope(slot.clone(), next.run(request)).await;
    let window = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(admission) = window {
        write_headers(response.headers_mut(), &admission);
    }
    response
}

/// The three headers of each limit the tenant has.
pub fn write_headers(headers: &mut HeaderMap, admission: &Admission) {
    let reset = format_duration(admission.reset);
    let limits = [
        (
            "requests",
            admission.limits.requests,
            admission.requests_remaining(),
        ),
        (
            "tokens",
            admission.limits.tokens,
            admission.tokens_remaining(),
        ),
    ];
    for (name, limit, remaining) in limits {
        if limit == 0 {
            continue;
        }
        for (header, value) in [
            (format!("x-ratelimit-limit-{name}"), limit.to_string()),
            (
                format!("x-ratelimit-remaining-{name}"),
                remaining.to_string(),
            ),
            (format!("x-ratelimit-reset-{name}"), reset.clone()),
        ] {
            if let (Ok(header), Ok(value)) = (
                axum::http::HeaderName::try_from(header),
                HeaderValue::try_from(value),
            ) {
                headers.insert(header, value);
            }
        }
    }
}

/// A duration as OpenAI (and Go) write it: `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let seconds = match (rest / 1000, rest % 1000) {
        (s, 0) => format!("{s}s"),
        (s, frac) => {
            let frac = format!("{frac:03}");
            format!("{s}.{}s", frac.trim_end_matches('0'))
        }
    };
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_times_read_as_openai_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(format_duration(ms(20)), "20ms");
        assert_eq!(format_duration(ms(1000)), "1s");
        assert_eq!(format_duration(ms(1500)), "1.5s");
        assert_eq!(format_duration(ms(360_000)), "6m0s");
        assert_eq!(format_duration(ms(3_723_000)), "1h2m3s");
    }

    #[test]
    fn a_request_reserves_its_prompt_at_4_bytes_a_token_plus_max_tokens_per_choice() {
        let request = GenerateRequest {
            model: "m".into(),
            messages: Vec::new(),
            sampling: fallow_protocol::job::Sampling {
                max_tokens: Some(10),
                ..Default::default()
            },
            n: 2,
            add_generation_prompt: false,
            continue_final_message: false,
            stream: false,
            chat_template_kwargs: Default::default(),
            tools: Vec::new(),
            output: Default::default(),
            input: Prompt::Text {
                text: "x".repeat(9),
            },
            task: Default::default(),
            embed: None,
            progress: None,
            adapter: None,
        };
        assert_eq!(estimate_tokens(&request), 3 + 20);
    }
}
