//! `POST /v1/completions` → one validated [`GenerateRequest`] per prompt. The sampling
//! fields go through the chat path's checks (the wire request embeds the chat one); what is
//! the legacy API's own is checked here: `prompt` in its four shapes, `echo`, the integer
//! `logprobs`, `suffix` and `best_of`. A raw prompt never meets the chat template.
//!
//! The prompts share one validated request (sampling, stop strings, constraint): up to 64
//! prompts do not hold 64 copies of it for the whole request. Each job's request is made
//! when it is enqueued ([`ValidCompletion::jobs`]).

use super::caps::{too_many, too_many_bytes, MAX_PROMPT_BYTES, MAX_PROMPT_TOKEN_IDS};
use super::{delivery, reject_unsupported, sampling, validate_priority, Delivery, Limits};
use crate::error::ApiError;
use crate::openai::completions::CompletionRequest;
use fallow_protocol::job::{GenerateRequest, OutputFormat, Prompt, Task, TextFormat};
use serde_json::Value;

/// OpenAI's default for the legacy endpoint (chat has none).
pub const DEFAULT_MAX_TOKENS: i64 = 16;
/// The most alternatives per position the legacy `logprobs` takes.
pub const MAX_LEGACY_LOGPROBS: i64 = 5;
/// Prompts in one request (each becomes a job of `n` choices).
pub const MAX_PROMPTS: usize = 64;

/// A completions request that passed validation: one job per prompt, in order.
#[derive(Debug, Clone)]
pub struct ValidCompletion {
    /// What every prompt's job shares; its `input` is set per prompt by
    /// [`ValidCompletion::jobs`].
    pub shared: GenerateRequest,
    /// The prompts, in order; each becomes one job of `n` choices.
    pub prompts: Vec<Prompt>,
    /// The text of each prompt given as text (for `echo`); `None` for token ids, whose
    /// text the runner reports.
    pub prompt_texts: Vec<Option<String>>,
    pub n: u32,
    pub echo: bool,
    /// `Some(k)`: legacy logprobs with up to `k` alternatives.
    pub logprobs: Option<u32>,
    pub delivery: Delivery,
    pub priority: i32,
}

pub fn validate_completion(
    mut wire: CompletionRequest,
    limits: &Limits,
) -> Result<ValidCompletion, ApiError> {
    let model = super::requested_model(&wire.common)?.to_owned();
    if wire.suffix.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(ApiError::invalid(
            "suffix",
            "`suffix` (insertion) is not supported by this server.",
        ));
    }
    if let Some(best_of) = wire.best_of {
        let n = wire.common.n.unwrap_or(1);
        if best_of != n {
            return Err(ApiError::invalid(
                "best_of",
                format!("`best_of` is not supported (it may only equal `n`, {n}); got {best_of}."),
            ));
        }
    }
    let prompts = validate_prompt(wire.prompt.take())?;
    let echo = wire.echo.unwrap_or(false);
    let logprobs = match wire.logprobs {
        None => None,
        Some(k) if (0..=MAX_LEGACY_LOGPROBS).contains(&k) => Some(k as u32),
        Some(k) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("`logprobs` must be between 0 and {MAX_LEGACY_LOGPROBS}, got {k}."),
            ))
        }
    };
    if echo && logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "`echo` together with `logprobs` needs the prompt's log-probabilities, which this \
             server does not compute; send one of them.",
        ));
    }
    let common = &mut wire.common;
    if common.max_tokens.is_none() && common.max_completion_tokens.is_none() {
        common.max_tokens = Some(DEFAULT_MAX_TOKENS);
    }
    // The chat request's own `logprobs`/`top_logprobs` are not this endpoint's.
    common.logprobs = logprobs.map(|_| true);
    common.top_logprobs = logprobs.map(i64::from);
    reject_unsupported(common)?;
    let priority = validate_priority(common.priority)?;
    let delivery = delivery(common);
    let sampling = sampling::validate_sampling(common, limits)?;
    let n = sampling::validate_n(common.n, limits.max_n)?;
    sampling::check_routed_experts_n(&sampling, n)?;
    if sampling.return_routed_experts && prompts.len() > 1 {
        return Err(ApiError::invalid(
            "prompt",
            "`return_routed_experts` returns the routes of one choice: send one prompt.",
        ));
    }
    let prompt_texts = prompts
        .iter()
        .map(|p| match p {
            Prompt::Text { text } => Some(text.clone()),
            _ => None,
        })
        .collect();
    let shared = GenerateRequest {
        model,
        messages: Vec::new(),
        sampling,
        n,
        add_generation_prompt: false,
        continue_final_message: false,
        stream: delivery.stream,
        chat_template_kwargs: Default::default(),
        tools: Vec::new(),
        output: OutputFormat {
            text_completion: Some(TextFormat { logprobs, echo }),
            ..OutputFormat::default()
        },
        input: Prompt::Messages,
        task: Task::Generate,
        embed: None,
        progress: None,
        adapter: None,
    };
    Ok(ValidCompletion {
        shared,
        prompts,
        prompt_texts,
        n,
        echo,
        logprobs,
        delivery,
        priority,
    })
}

impl ValidCompletion {
    /// The job request of each prompt, in order, made one at a time as they are consumed.
    pub fn jobs(&self) -> impl ExactSizeIterator<Item = GenerateRequest> + '_ {
        self.prompts.iter().map(|prompt| GenerateRequest {
            input: prompt.clone(),
            ..self.shared.clone()
        })
    }
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
pub fn validate_prompt(prompt: Option<Value>) -> Result<Vec<Prompt>, ApiError> {
    let prompts =
        match prompt {
            None | Some(Value::Null) => {
                return Err(ApiError::invalid("prompt", "`prompt` is required."))
            }
            Some(Value::String(text)) => vec![text_prompt("prompt", text)?],
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(ApiError::invalid("prompt", "`prompt` must not be empty."))
            }
            Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
                vec![token_prompt("prompt", &items)?]
            }
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    let param = format!("prompt[{i}]");
                    match item {
                        Value::String(text) => text_prompt(&param, text),
                        Value::Array(ids) => token_prompt(&param, &ids),
                        _ => Err(ApiError::invalid(
                            &param,
                            format!("`{param}` must be a string or a list of token ids."),
                        )),
                    }
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(ApiError::invalid(
                "prompt",
                "`prompt` must be a string, a list of strings, a list of token ids or a list of \
                 token-id lists.",
            )),
        };
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "At most {MAX_PROMPTS} prompts per request, got {}.",
                prompts.len()
            ),
        ));
    }
    check_prompt_size(&prompts)?;
    Ok(prompts)
}

/// All prompts together: at most [`MAX_PROMPT_BYTES`] of text and [`MAX_PROMPT_TOKEN_IDS`]
/// token ids, what one request may ask the engine thread to tokenize or run.
fn check_prompt_size(prompts: &[Prompt]) -> Result<(), ApiError> {
    let (mut bytes, mut ids) = (0, 0);
    for prompt in prompts {
        match prompt {
            Prompt::Text { text } => bytes += text.len(),
            Prompt::Tokens { ids: tokens } => ids += tokens.len(),
            Prompt::Messages => {}
        }
    }
    if bytes > MAX_PROMPT_BYTES {
        return Err(too_many_bytes("prompt", "holds", bytes, MAX_PROMPT_BYTES));
    }
    if ids > MAX_PROMPT_TOKEN_IDS {
        return Err(too_many("prompt", "token ids", ids, MAX_PROMPT_TOKEN_IDS));
    }
    Ok(())
}

fn text_prompt(param: &str, text: String) -> Result<Prompt, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be empty."),
        ));
    }
    Ok(Prompt::Text { text })
}

fn token_prompt(param: &str, items: &[Value]) -> Result<Prompt, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be an empty list of token ids."),
        ));
    }
    let ids = items
        .iter()
        .enumerate()
        .map(|(j, v)| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("{param}[{j}]"),
                        format!(
                            "`{param}[{j}]` must be a token id (a non-negative integer), got {v}."
                        ),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(Prompt::Tokens { ids })
}

#[cfg(test)]
#[path = "completion_tests.rs"]
mod tests;
