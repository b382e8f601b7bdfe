//! What the engine accepts ([`EngineRequest`]), how it is checked, and the per-request and
//! per-choice state the loop keeps.

use std::sync::Arc;

use fallow_protocol::job::{Sampling, Usage};

use super::EngineError;
use crate::batcher::SeqId;
use crate::grammar::SeqGrammar;
use crate::lora::LoraAdapter;
use crate::stop_regex::StopRegexes;
use crate::stop_strings::StopStrings;

/// One generation request: a tokenized prompt and `n` choices to sample from it.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Caller's id; unique among requests in the engine.
    pub id: u64,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    /// Number of choices, ≥ 1.
    pub n: u32,
    /// Lower runs first.
    pub priority: i32,
    /// Progress of an earlier attempt this request continues; `None` for a fresh request.
    pub resume: Option<Resume>,
    /// The LoRA adapter to run the request through (`None`: the base model).
    pub adapter: Option<Arc<LoraAdapter>>,
}

/// What an earlier attempt generated, per choice (index = choice index; `len() == n`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resume {
    pub choices: Vec<ResumeChoice>,
}

/// One choice's progress in an earlier attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResumeChoice {
    /// Token ids the earlier attempt generated for this choice (and the client saw), in order.
    pub tokens: Vec<u32>,
    /// The choice had already finished: it is not run again and produces no output.
    pub finished: bool,
}

/// Most choices one request may ask for (OpenAI's limit); each is a sequence.
pub const MAX_CHOICES: u32 = 128;

/// The limits a request is checked against.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub vocab_size: usize,
    pub context_length: usize,
    /// Positions the whole KV pool holds.
    pub pool_tokens: usize,
}

/// Checks a request and returns its effective `max_tokens` per choice.
pub(super) fn validate(request: &EngineRequest, limits: Limits) -> Result<usize, EngineError> {
    let invalid = |m: String| Err(EngineError::InvalidRequest(m));
    if request.n == 0 || request.n > MAX_CHOICES {
        return invalid(format!(
            "n must be between 1 and {MAX_CHOICES}, got {}",
            request.n
        ));
    }
    let prompt_len = request.prompt.len();
    if prompt_len == 0 {
        return invalid("prompt: must contain at least one token".into());
    }
    if let Some(&bad) = request
        .prompt
        .iter()
        .find(|&&t| t as usize >= limits.vocab_size)
    {
        return invalid(format!(
            "prompt: token id {bad} is outside the vocabulary of {}",
            limits.vocab_size
        ));
    }
    if let Some(&bad) = request
        .sampling
        .logit_bias
        .keys()
        .find(|&&t| t as usize >= limits.vocab_size)
    {
        return invalid(format!(
            "logit_bias: token id {bad} is outside the vocabulary of {}",
            limits.vocab_size
        ));
    }
    let room = limits.context_length.saturating_sub(prompt_len);
    if room == 0 {
        return Err(EngineError::ContextLengthExceeded(format!(
            "the prompt has {prompt_len} tokens, which leaves no room to generate in the \
             model's context of {} tokens",
            limits.context_length
        )));
    }
    // The last sampled token is never run, so a choice occupies prompt + max_tokens − 1.
    let pool_room = (limits.pool_tokens + 1).saturating_sub(prompt_len);
    let max_tokens = match request.sampling.max_length {
        None => request.sampling.max_tokens,
        Some(total) => {
            let left = (total as usize).saturating_sub(prompt_len);
            if left == 0 {
                return invalid(format!(
                    "max_length: the prompt has {prompt_len} tokens, which leaves no room under \
                     max_length ({total})"
                ));
            }
            // Unset, max_tokens is what max_length leaves within the context and the pool;
            // a client's own max_tokens is still checked against them below.
            let left = request
                .sampling
                .max_tokens
                .map_or(left.min(room).min(pool_room), |m| left.min(m as usize));
            Some(u32::try_from(left).unwrap_or(u32::MAX))
        }
    };
    let max_tokens = match max_tokens {
        Some(0) => invalid("max_tokens must be at least 1".into()),
        Some(max) if max as usize > room => Err(EngineError::ContextLengthExceeded(format!(
            "prompt ({prompt_len} tokens) + max_tokens ({max}) exceeds the model's context \
             of {} tokens",
            limits.context_length
        ))),
        Some(max) if max as usize > pool_room => Err(EngineError::ContextLengthExceeded(format!(
            "prompt ({prompt_len} tokens) + max_tokens ({max}) exceeds the KV cache of {} tokens",
            limits.pool_tokens
        ))),
        Some(max) => Ok(max as usize),
        None if pool_room == 0 => Err(EngineError::ContextLengthExceeded(format!(
            "the prompt has {prompt_len} tokens but the KV cache holds {}",
            limits.pool_tokens
        ))),
        None => Ok(room.min(pool_room)),
    }?;
    if let Some(resume) = &request.resume {
        super::resume::validate(resume, request, limits, max_tokens)?;
    }
    Ok(max_tokens)
}

/// A request in flight.
#[derive(Debug)]
pub(super) struct RequestState {
    pub prompt: Vec<u32>,
    /// Shared by the choices' samplers rather than copied into each.
    pub sampling: Arc<Sampling>,
    pub priority: i32,
    pub arrival: u64,
    pub max_tokens: usize,
    pub usage: Usage,
    /// Choices in the batcher.
    pub live: Vec<SeqId>,
    /// Choices held back until choice 0's prompt is in the prefix cache.
    pub pending: Vec<u32>,
    /// Whether choice 0 has produced a token (its prompt blocks are committed).
    pub first_token_seen: bool,
    /// The compiled constraint, fresh; each choice starts from a clone.
    pub grammar: Option<SeqGrammar>,
    pub stop_regexes: StopRegexes,
    /// The stop strings' automaton, built once and shared by the choices.
    pub stop_strings: Arc<StopStrings>,
    pub adapter: Option<Arc<LoraAdapter>>,
}

impl RequestState {
    pub fn is_done(&self) -> bool {
        self.live.is_empty() && self.pending.is_empty()
    }
}
