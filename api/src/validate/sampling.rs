//! Sampling parameter validation: ranges, defaults, and OpenAI-to-internal conventions
//! (`top_k = -1` means off, `max_completion_tokens` overrides `max_tokens`).

use super::caps::{
    too_many, too_many_bytes, MAX_LOGIT_BIAS, MAX_STOP_BYTES, MAX_STOP_SEQUENCES,
    MAX_STOP_TOKEN_IDS, MAX_STOP_TOTAL_BYTES,
};
use super::Limits;
use crate::error::ApiError;
use crate::openai::request::ChatCompletionRequest;
use fallow_protocol::job::Sampling;
use std::collections::BTreeMap;

pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Temperatures below this are treated as 0 (greedy), as Qwen's server documents.
pub const GREEDY_BELOW: f32 = 0.01;

pub(super) fn validate_n(n: Option<i64>, max_n: u32) -> Result<u32, ApiError> {
    let n = n.unwrap_or(1);
    if n < 1 || n > i64::from(max_n) {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {max_n}, got {n}."),
        ));
    }
    Ok(n as u32)
}

pub(super) fn validate_sampling(
    wire: &ChatCompletionRequest,
    limits: &Limits,
) -> Result<Sampling, ApiError> {
    let defaults = Sampling::default();
    let (max_tokens, min_tokens) = validate_lengths(wire, limits.context_length)?;
    let (logprobs, top_logprobs) = validate_logprobs(wire.logprobs, wire.top_logprobs)?;
    Ok(Sampling {
        max_tokens,
        min_tokens,
        temperature: validate_temperature(wire.temperature)?,
        top_p: validate_top_p(wire.top_p)?,
        top_k: validate_top_k(wire.top_k)?,
        min_p: float_in("min_p", wire.min_p, 0.0, 1.0, defaults.min_p)?,
        // Seeds are 64-bit patterns; a negative seed is as good as any other. A request
        // without one gets a random one here, at enqueue, so that a runner continuing it
        // after a preemption draws what the first runner would have.
        seed: Some(wire.seed.map_or_else(rand::random, |s| s as u64)),
        presence_penalty: float_in("presence_penalty", wire.presence_penalty, -2.0, 2.0, 0.0)?,
        frequency_penalty: float_in("frequency_penalty", wire.frequency_penalty, -2.0, 2.0, 0.0)?,
        repetition_penalty: validate_repetition_penalty(wire.repetition_penalty)?,
        logit_bias: validate_logit_bias(wire.logit_bias.as_ref())?,
        stop: validate_stop(wire)?,
        stop_token_ids: validate_stop_token_ids(wire.stop_token_ids.as_deref())?,
        ignore_eos: wire.ignore_eos.unwrap_or(false),
        skip_special_tokens: wire.skip_special_tokens.unwrap_or(true),
        logprobs,
        top_logprobs,
        constraint: super::constraint::validate_constraint(wire)?,
        stop_regex: super::constraint::validate_stop_regex(wire)?,
        no_stop_trim: wire.no_stop_trim.unwrap_or(false),
        max_length: validate_max_length(wire.max_length)?,
        return_hidden_states: wire.return_hidden_states.unwrap_or(false),
        return_routed_experts: wire.return_routed_experts.unwrap_or(false),
    })
}

/// SGLang returns one `sglext.routed_experts` per answer, so it is asked for with one
/// choice.
pub(super) fn check_routed_experts_n(sampling: &Sampling, n: u32) -> Result<(), ApiError> {
    if sampling.return_routed_experts && n > 1 {
        return Err(ApiError::invalid(
            "n",
            "`return_routed_experts` returns the routes of one choice: ask for it with n = 1.",
        ));
    }
    Ok(())
}

/// Qwen's `max_length`: a positive token count; whether the prompt leaves room under it is
/// known only once the runner has tokenized the prompt.
fn validate_max_length(value: Option<i64>) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v >= 1 => Ok(Some(u32::try_from(v).unwrap_or(u32::MAX))),
        Some(v) => Err(ApiError::invalid(
            "max_length",
            format!("`max_length` (prompt plus completion tokens) must be at least 1, got {v}."),
        )),
    }
}

fn validate_temperature(value: Option<f64>) -> Result<f32, ApiError> {
    let temperature = float_in(
        "temperature",
        value,
        0.0,
        2.0,
        Sampling::default().temperature,
    )?;
    // Below 0.01 sampling is greedy in all but name; say so exactly (0 = greedy), so the
    // sampler never divides logits by a vanishing temperature.
    Ok(if temperature < GREEDY_BELOW {
        0.0
    } else {
        temperature
    })
}

fn validate_top_p(value: Option<f64>) -> Result<f32, ApiError> {
    match value {
        None => Ok(1.0),
        Some(p) if p > 0.0 && p <= 1.0 => Ok(p as f32),
        Some(p) => Err(ApiError::invalid(
            "top_p",
            format!("`top_p` must be in (0, 1], got {p}."),
        )),
    }
}

/// OpenAI-style clients send `-1` for "off"; internally off is 0.
fn validate_top_k(value: Option<i64>) -> Result<u32, ApiError> {
    match value {
        None | Some(-1) => Ok(0),
        Some(k) => u32::try_from(k).map_err(|_| {
            ApiError::invalid(
                "top_k",
                format!("`top_k` must be -1 (off) or a non-negative integer, got {k}."),
            )
        }),
    }
}

fn float_in(
    param: &str,
    value: Option<f64>,
    lo: f64,
    hi: f64,
    default: f32,
) -> Result<f32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if v >= lo && v <= hi => Ok(v as f32),
        Some(v) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}, got {v}."),
        )),
    }
}

fn validate_repetition_penalty(value: Option<f64>) -> Result<f32, ApiError> {
    match value {
        None => Ok(1.0),
        Some(v) if v > 0.0 && v.is_finite() => Ok(v as f32),
        Some(v) => Err(ApiError::invalid(
            "repetition_penalty",
            format!("`repetition_penalty` must be greater than 0, got {v}."),
        )),
    }
}

/// `max_completion_tokens` (preferred) or `max_tokens`: 1 ..= context length;
/// `min_tokens`: 0 ..= max_tokens.
fn validate_lengths(
    wire: &ChatCompletionRequest,
    context_length: u32,
) -> Result<(Option<u32>, u32), ApiError> {
    let (param, value) = match (wire.max_completion_tokens, wire.max_tokens) {
        (Some(v), _) => ("max_completion_tokens", Some(v)),
        (None, v) => ("max_tokens", v),
    };
    let max_tokens = match value {
        None => None,
        Some(v) if v >= 1 && v <= i64::from(context_length) => Some(v as u32),
        Some(v) => {
            return Err(ApiError::InvalidRequest {
                message: format!(
                    "`{param}` must be between 1 and the model's context length ({context_length}), got {v}."
                ),
                param: Some(param.to_owned()),
                code: if v > i64::from(context_length) {
                    Some("context_length_exceeded")
                } else {
                    None
                },
            })
        }
    };
    let ceiling = max_tokens.unwrap_or(context_length);
    let min_tokens = match wire.min_tokens {
        None => 0,
        Some(v) if v >= 0 && v <= i64::from(ceiling) => v as u32,
        Some(v) => {
            return Err(ApiError::invalid(
                "min_tokens",
                format!("`min_tokens` must be between 0 and {ceiling} (the max tokens), got {v}."),
            ))
        }
    };
    Ok((max_tokens, min_tokens))
}

fn validate_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<(bool, u32), ApiError> {
    let logprobs = logprobs.unwrap_or(false);
    let top = top.unwrap_or(0);
    if !(0..=MAX_TOP_LOGPROBS).contains(&top) {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {top}."),
        ));
    }
    if top > 0 && !logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` requires `logprobs` to be true.",
        ));
    }
    Ok((logprobs, top as u32))
}

fn validate_logit_bias(
    bias: Option<&BTreeMap<String, f64>>,
) -> Result<BTreeMap<u32, f32>, ApiError> {
    let count = bias.map_or(0, BTreeMap::len);
    if count > MAX_LOGIT_BIAS {
        return Err(too_many("logit_bias", "entries", count, MAX_LOGIT_BIAS));
    }
    let mut out = BTreeMap::new();
    for (key, &value) in bias.into_iter().flatten() {
        let token: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!(
                    "`logit_bias` keys must be token ids (non-negative integers), got `{key}`."
                ),
            )
        })?;
        if !(-100.0..=100.0).contains(&value) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` values must be between -100 and 100, got {value} for token {token}."),
            ));
        }
        out.insert(token, value as f32);
    }
    Ok(out)
}

/// At most [`MAX_STOP_SEQUENCES`] strings, each at most [`MAX_STOP_BYTES`] and all
/// together at most [`MAX_STOP_TOTAL_BYTES`]: every choice holds back up to the longest
/// and the engine matches all of them on every token.
fn validate_stop(wire: &ChatCompletionRequest) -> Result<Vec<String>, ApiError> {
    let stop: Vec<String> = wire
        .stop
        .clone()
        .map(|s| s.into_vec())
        .unwrap_or_default()
        .into_iter()
        // An empty stop string would end every choice at once; clients mean "no stop".
        .filter(|s| !s.is_empty())
        .collect();
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(too_many(
            "stop",
            "sequences",
            stop.len(),
            MAX_STOP_SEQUENCES,
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(too_many_bytes(
            "stop",
            "has a sequence of",
            long.len(),
            MAX_STOP_BYTES,
        ));
    }
    let total: usize = stop.iter().map(String::len).sum();
    if total > MAX_STOP_TOTAL_BYTES {
        return Err(too_many_bytes(
            "stop",
            "sequences total",
            total,
            MAX_STOP_TOTAL_BYTES,
        ));
    }
    Ok(stop)
}

fn validate_stop_token_ids(ids: Option<&[i64]>) -> Result<Vec<u32>, ApiError> {
    let ids = ids.unwrap_or_default();
    if ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(too_many(
            "stop_token_ids",
            "ids",
            ids.len(),
            MAX_STOP_TOKEN_IDS,
        ));
    }
    ids.iter()
        .map(|&id| {
            u32::try_from(id).map_err(|_| {
                ApiError::invalid(
                    "stop_token_ids",
                    format!("`stop_token_ids` must be non-negative token ids, got {id}."),
                )
            })
        })
        .collect()
}
