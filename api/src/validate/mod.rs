//! The boundary between OpenAI's lenient wire format and the scheduler's validated
//! [`GenerateRequest`]. Every rule names the parameter it checks and the limit it enforces,
//! so a client can fix its request from the error alone.

pub(crate) mod adapter;
pub mod caps;
mod completion;
mod constraint;
mod embeddings;
mod gbnf;
mod messages;
mod reasoning_effort;
pub mod responses;
mod sampling;
mod tokenize;
mod tools;

pub use adapter::{resolve, resolve_unseen, ServedModel};
pub use completion::{validate_completion, validate_prompt, ValidCompletion};
pub use embeddings::{embedding_model, validate_embeddings, MAX_EMBEDDING_INPUTS};
pub use tokenize::{detokenize_model, tokenize_model, validate_detokenize, validate_tokenize};
pub use tools::{ToolChoice, ToolRequest, DEFAULT_TOOL_PARSER};

use crate::error::ApiError;
use crate::openai::request::ChatCompletionRequest;
use crate::parsers::grammar;
use crate::parsers::harmony::HARMONY;
use fallow_protocol::job::{GenerateRequest, OutputFormat};
use serde_json::{Map, Value};

/// Request `priority` is accepted in this range (lower = served first, default 0). It maps
/// one to one onto the job priority of an interactive job; batch jobs are enqueued at
/// [`BATCH_PRIORITY_BASE`] and above, so interactive work always runs first.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -1000..=1000;

/// The lowest job priority a batch job gets (its own priority is added to it).
pub const BATCH_PRIORITY_BASE: i32 = 100_000;

/// Limits that depend on the server's configuration and on the model asked for.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_messages: usize,
    pub max_n: u32,
    /// The model's context length in tokens.
    pub context_length: u32,
    /// How the model writes tool calls and reasoning, as its runner published it.
    pub parsers: ModelParsers,
}

/// The output syntaxes of a model (`ModelEntry::tool_parser` / `reasoning_parser`);
/// `None` = not known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelParsers {
    pub tool: Option<String>,
    pub reasoning: Option<String>,
}

impl ModelParsers {
    /// Whether the model writes harmony (gpt-oss), in either role.
    pub fn speaks_harmony(&self) -> bool {
        [&self.tool, &self.reasoning]
            .iter()
            .any(|name| name.as_deref() == Some(HARMONY))
    }
}

/// How the client wants the answer delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivery {
    pub stream: bool,
    /// A last chunk with `choices: []` and the usage (and `usage: null` elsewhere).
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
}

/// A request that passed validation.
#[derive(Debug, Clone)]
pub struct ValidChat {
    pub request: GenerateRequest,
    pub delivery: Delivery,
    /// The job priority (interactive band).
    pub priority: i32,
    /// The request's tools, if it offers any.
    pub tools: Option<ToolRequest>,
}

/// The model asked for; checked first because the other limits depend on it.
pub fn requested_model(wire: &ChatCompletionRequest) -> Result<&str, ApiError> {
    match wire.model.as_deref().map(str::trim) {
        Some(model) if !model.is_empty() => Ok(model),
        _ => Err(ApiError::invalid("model", "`model` is required.")),
    }
}

/// Converts a wire request into the scheduler's validated request.
pub fn validate_chat(wire: ChatCompletionRequest, limits: &Limits) -> Result<ValidChat, ApiError> {
    let model = requested_model(&wire)?.to_owned();
    if !wire.extra.is_empty() {
        let names: Vec<&str> = wire.extra.keys().map(String::as_str).collect();
        tracing::debug!(fields = ?names, "ignoring unknown request fields");
    }
    reject_unsupported(&wire)?;
    let priority = validate_priority(wire.priority)?;
    let delivery = delivery(&wire);
    let mut sampling = sampling::validate_sampling(&wire, limits)?;
    let n = sampling::validate_n(wire.n, limits.max_n)?;
    sampling::check_routed_experts_n(&sampling, n)?;
    let continue_final_message = wire.continue_final_message.unwrap_or(false);
    let add_generation_prompt = match (wire.add_generation_prompt, continue_final_message) {
        (Some(true), true) => {
            return Err(ApiError::invalid(
                "continue_final_message",
                "`continue_final_message` and `add_generation_prompt` cannot both be true.",
            ))
        }
        (Some(explicit), _) => explicit,
        (None, cont) => !cont,
    };
    let tools = tools::validate_tools(&wire)?;
    let mut chat_template_kwargs = wire.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(mut effort) = wire.reasoning_effort.clone() {
        if limits.parsers.speaks_harmony() {
            effort = reasoning_effort::harmony_effort(&effort)?.to_owned();
        }
        chat_template_kwargs
            .entry("reasoning_effort")
            .or_insert(Value::String(effort));
    }
    let output = output_format(
        &wire,
        tools.as_ref(),
        &limits.parsers,
        &chat_template_kwargs,
    );
    if output.tool_parser.as_deref() == Some("mistral") || limits.parsers.speaks_harmony() {
        // `[TOOL_CALLS]` and harmony's channel markers are special tokens: they must reach
        // the parser (and, unparsed, the client, so harmony's messages stay told apart).
        sampling.skip_special_tokens = false;
    }
    // A forced call (`tool_choice: "required"` or a named function) is enforced by grammar,
    // so its arguments always parse and match the function's schema.
    // The model's reasoning syntax, whether or not its reasoning is split off.
    let reasoning = (!thinking_off(&chat_template_kwargs))
        .then_some(limits.parsers.reasoning.as_deref())
        .flatten();
    if let Some(grammar) = forced_call_grammar(&output, tools.as_ref(), reasoning) {
        if sampling.constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "A forced tool call (`tool_choice` `required` or a named function) cannot be \
                 combined with `response_format`, `regex` or `ebnf`.",
            ));
        }
        sampling.constraint = Some(constraint::forced_call_constraint(grammar)?);
    }
    let messages = messages::validate_messages(wire.messages, limits.max_messages)?;
    if continue_final_message
        && messages.last().map(|m| m.role) != Some(fallow_protocol::job::Role::Assistant)
    {
        return Err(ApiError::invalid(
            "continue_final_message",
            "`continue_final_message` requires the last message to have role `assistant`.",
        ));
    }
    let request = GenerateRequest {
        model,
        messages,
        sampling,
        n,
        add_generation_prompt,
        continue_final_message,
        stream: delivery.stream,
        chat_template_kwargs,
        // `tool_choice: "none"` keeps the tools out of the prompt: the model is not to call.
        tools: tools
            .as_ref()
            .filter(|t| t.choice != ToolChoice::None)
            .map(|t| t.tools.clone())
            .unwrap_or_default(),
        output,
        input: fallow_protocol::job::Prompt::Messages,
        task: fallow_protocol::job::Task::Generate,
        embed: None,
        progress: None,
        adapter: None,
    };
    Ok(ValidChat {
        request,
        delivery,
        priority,
        tools,
    })
}

/// How the job's text will be read: the model's tool syntax when the request lets it call
/// (Hermes when the runner published none), its reasoning syntax unless the client asked to
/// keep reasoning in the content or turned thinking off in the template. Harmony models
/// reason whatever the template is told, so turning thinking off leaves their reasoning
/// split off.
fn output_format(
    wire: &ChatCompletionRequest,
    tools: Option<&ToolRequest>,
    parsers: &ModelParsers,
    template_kwargs: &Map<String, Value>,
) -> OutputFormat {
    let calling = tools.filter(|t| t.choice != ToolChoice::None);
    let separate = |name: &String| {
        wire.separate_reasoning.unwrap_or(true)
            && (name == HARMONY || !thinking_off(template_kwargs))
    };
    OutputFormat {
        tool_parser: calling.map(|_| {
            parsers
                .tool
                .clone()
                .unwrap_or_else(|| DEFAULT_TOOL_PARSER.to_owned())
        }),
        legacy_functions: calling.is_some_and(|t| t.legacy),
        single_tool_call: calling.is_some_and(|t| !t.several_calls()),
        reasoning_parser: parsers.reasoning.clone().filter(separate),
        stream_reasoning: wire.stream_reasoning.unwrap_or(true),
        text_completion: None,
        cached_tokens_details: wire.return_cached_tokens_details.unwrap_or(false),
        responses: None,
        embeddings: None,
    }
}

/// Whether the template was asked not to think (`enable_thinking` / `thinking`: false).
fn thinking_off(template_kwargs: &Map<String, Value>) -> bool {
    ["enable_thinking", "thinking"]
        .iter()
        .any(|key| template_kwargs.get(*key) == Some(&Value::Bool(false)))
}

/// The grammar a forced call needs, in the model's own tool syntax, after the reasoning the
/// model writes in `reasoning` syntax (`None`: it does not reason).
pub fn forced_call_grammar(
    output: &OutputFormat,
    tools: Option<&ToolRequest>,
    reasoning: Option<&str>,
) -> Option<String> {
    let tools = tools?;
    let parser = output.tool_parser.as_deref()?;
    let calls =
        grammar::forced_call_grammar(parser, &tools.forced_functions(), tools.several_calls())?;
    Some(grammar::after_reasoning(calls, reasoning))
}

fn delivery(wire: &ChatCompletionRequest) -> Delivery {
    let stream = wire.stream.unwrap_or(false);
    // `stream_options` only means something for streams; OpenAI rejects it otherwise, we
    // are lenient and ignore it.
    let options = wire.stream_options.unwrap_or_default();
    Delivery {
        stream,
        include_usage: stream && options.include_usage.unwrap_or(false),
        continuous_usage: stream && options.continuous_usage_stats.unwrap_or(false),
    }
}

fn validate_priority(priority: Option<i64>) -> Result<i32, ApiError> {
    let priority = priority.unwrap_or(0);
    if !PRIORITY_RANGE.contains(&priority) {
        return Err(ApiError::invalid(
            "priority",
            format!(
                "`priority` must be between {} and {} (lower is served first), got {priority}.",
                PRIORITY_RANGE.start(),
                PRIORITY_RANGE.end()
            ),
        ));
    }
    // In range by the check above, so the conversion cannot fail.
    Ok(i32::try_from(priority).unwrap_or(0))
}

/// Structured-output extensions of vLLM and SGLang not offered (`response_format`, `regex`,
/// `ebnf` and `stop_regex` are). They arrive as unknown fields; ignoring them would silently
/// return unconstrained text, so they are refused.
const CONSTRAINT_FIELDS: [&str; 5] = [
    "structural_tag",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

/// SGLang fields whose effect Fallow does not offer, each with the reason. Every one would
/// change the answer, so it is refused rather than ignored; `null` or `false` asks for
/// nothing and passes.
pub const UNSUPPORTED_FIELDS: [(&str, &str); 1] = [(
    "custom_logit_processor",
    "custom logit processors are Python objects that SGLang unpickles and runs; a Rust \
     server cannot run them",
)];

/// Features the engine does not offer yet are refused loudly rather than ignored, so a
/// client never silently gets unconstrained text where it asked for JSON.
fn reject_unsupported(wire: &ChatCompletionRequest) -> Result<(), ApiError> {
    for field in CONSTRAINT_FIELDS {
        if wire.extra.get(field).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` (constrained generation) is not supported by this server yet."),
            ));
        }
    }
    for (field, reason) in UNSUPPORTED_FIELDS {
        let asked = wire
            .extra
            .get(field)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false));
        if asked {
            return Err(ApiError::InvalidRequest {
                message: format!("`{field}` is not supported: {reason}."),
                param: Some(field.to_owned()),
                code: Some("unsupported_parameter"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod documented_fields_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
