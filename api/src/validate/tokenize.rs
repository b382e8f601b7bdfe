//! `/tokenize` and `/detokenize` bodies → a tokenize / detokenize job request. The api holds
//! no tokenizer: the runner answers these jobs from the model's tokenizer and chat template,
//! without an engine step.

use super::messages::validate_messages;
use super::{validate_prompt, Limits};
use crate::error::ApiError;
use crate::openai::tokenize::{DetokenizeRequest, TokenizeRequest};
use fallow_protocol::job::{GenerateRequest, OutputFormat, Prompt, Sampling, Task};

fn model_of(model: Option<&str>) -> Result<String, ApiError> {
    match model.map(str::trim) {
        Some(model) if !model.is_empty() => Ok(model.to_owned()),
        _ => Err(ApiError::invalid("model", "`model` is required.")),
    }
}

pub fn tokenize_model(wire: &TokenizeRequest) -> Result<String, ApiError> {
    model_of(wire.model.as_deref())
}

pub fn detokenize_model(wire: &DetokenizeRequest) -> Result<String, ApiError> {
    model_of(wire.model.as_deref())
}

fn job(model: String, input: Prompt, task: Task) -> GenerateRequest {
    GenerateRequest {
        model,
        messages: Vec::new(),
        sampling: Sampling::default(),
        n: 1,
        add_generation_prompt: false,
        continue_final_message: false,
        stream: false,
        chat_template_kwargs: Default::default(),
        tools: Vec::new(),
        output: OutputFormat::default(),
        input,
        task,
        embed: None,
        progress: None,
        adapter: None,
    }
}

/// A prompt is tokenized as `/v1/completions` would; messages as `/v1/chat/completions`
/// would (the same template, `add_generation_prompt` default true), so the count equals the
/// chat answer's `usage.prompt_tokens`.
pub fn validate_tokenize(
    wire: TokenizeRequest,
    limits: &Limits,
) -> Result<GenerateRequest, ApiError> {
    let model = tokenize_model(&wire)?;
    match (wire.prompt, wire.messages) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "messages",
            "Send either `prompt` or `messages`, not both.",
        )),
        (None, None) => Err(ApiError::invalid(
            "prompt",
            "`prompt` or `messages` is required.",
        )),
        (Some(prompt), None) => {
            let mut prompts = validate_prompt(Some(prompt))?;
            if prompts.len() != 1 {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must be one string (or one list of token ids) here.",
                ));
            }
            let input = prompts.remove(0);
            Ok(job(model, input, Task::Tokenize))
        }
        (None, Some(messages)) => {
            let continue_final = wire.continue_final_message.unwrap_or(false);
            let mut request = job(model, Prompt::Messages, Task::Tokenize);
            request.messages = validate_messages(Some(messages), limits.max_messages)?;
            request.continue_final_message = continue_final;
            request.add_generation_prompt =
                wire.add_generation_prompt.unwrap_or(true) && !continue_final;
            request.chat_template_kwargs = wire.chat_template_kwargs.unwrap_or_default();
            Ok(request)
        }
    }
}

pub fn validate_detokenize(wire: DetokenizeRequest) -> Result<GenerateRequest, ApiError> {
    let model = detokenize_model(&wire)?;
    let tokens = match wire.tokens {
        Some(serde_json::Value::Array(items)) if items.iter().all(|v| v.is_number()) => {
            serde_json::Value::Array(items)
        }
        _ => {
            return Err(ApiError::invalid(
                "tokens",
                "`tokens` must be a list of token ids.",
            ))
        }
    };
    let input = match validate_prompt(Some(tokens)) {
        Ok(mut prompts) if prompts.len() == 1 => prompts.remove(0),
        Ok(_) => {
            return Err(ApiError::invalid(
                "tokens",
                "`tokens` must be one list of token ids.",
            ))
        }
        Err(ApiError::InvalidRequest { message, .. }) => {
            return Err(ApiError::invalid(
                "tokens",
                message.replace("`prompt", "`tokens"),
            ))
        }
        Err(other) => return Err(other),
    };
    let mut request = job(model, input, Task::Detokenize);
    // The text as the tokens spell it, special tokens included (vLLM's default).
    request.sampling.skip_special_tokens = false;
    Ok(request)
}
