//! What `POST /v1/chat/completions` answers: a `chat.completion` object, or a stream of
//! `chat.completion.chunk` objects. Field order and null-versus-absent follow OpenAI's
//! responses, because some clients are strict about both.

use crate::parsers::{OutputCollector, ParsedChoice, ParsedMessage};
use fallow_protocol::job::{Completion, FinishReason, OutputFormat, TokenLogprob, Usage};
use serde::Serialize;

/// `system_fingerprint`: identifies the server build that produced a response.
pub const SYSTEM_FINGERPRINT: &str = concat!("fp_fallow_", env!("CARGO_PKG_VERSION"));

/// The public id of a job's completion (`chatcmpl-` + the job's uuid without dashes).
pub fn completion_id(job: uuid::Uuid) -> String {
    format!("chatcmpl-{}", job.simple())
}

/// OpenAI's spelling of a finish reason.
pub fn finish_reason_str(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// The finish reason of a choice that may have called tools: a natural stop after a call is
/// `tool_calls` (`function_call` for legacy functions), as OpenAI reports it.
pub fn choice_finish_reason(reason: FinishReason, called: bool, legacy: bool) -> &'static str {
    match (reason, called, legacy) {
        (FinishReason::Stop, true, false) => "tool_calls",
        (FinishReason::Stop, true, true) => "function_call",
        _ => finish_reason_str(reason),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct UsageOut {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Present when the model's reasoning was split off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: u32,
}

impl UsageOut {
    /// The usage with the reasoning tokens of all choices (`None`: reasoning not split).
    pub fn with_reasoning(usage: Usage, reasoning_tokens: Option<u32>) -> Self {
        UsageOut {
            completion_tokens_details: reasoning_tokens
                .map(|reasoning_tokens| CompletionTokensDetails { reasoning_tokens }),
            ..usage.into()
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl From<Usage> for UsageOut {
    fn from(usage: Usage) -> Self {
        UsageOut {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.total_tokens(),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
            completion_tokens_details: None,
        }
    }
}

/// `logprobs` of a choice: the job's per-token entries already have OpenAI's shape.
#[derive(Debug, Clone, Serialize)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: UsageOut,
    pub system_fingerprint: &'static str,
    /// SGLang's extensions, with `return_cached_tokens_details` or `return_routed_experts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sglext: Option<SglExt>,
}

/// SGLang's `sglext` object.
#[derive(Debug, Clone, Serialize)]
pub struct SglExt {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens_details: Option<CachedTokensDetails>,
    /// `return_routed_experts`: base64 of little-endian int32 expert ids shaped
    /// `[tokens, routed layers, experts per token]` (one choice: n = 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<String>,
}

/// Where cached prompt tokens came from. Fallow's prefix cache lives on the device only.
#[derive(Debug, Clone, Serialize)]
pub struct CachedTokensDetails {
    pub device: u32,
    pub host: u32,
    pub storage: u32,
}

impl SglExt {
    /// The extensions a finished job's answer carries: cache details when asked for, the
    /// routed experts when the job returned them; `None` when neither.
    pub fn of(done: &Completion, cached_tokens_details: bool) -> Option<Self> {
        let ext = SglExt {
            cached_tokens_details: cached_tokens_details.then_some(CachedTokensDetails {
                device: done.usage.cached_tokens,
                host: 0,
                storage: 0,
            }),
            routed_experts: done.choices.first().and_then(|c| c.routed_experts.clone()),
        };
        (ext.cached_tokens_details.is_some() || ext.routed_experts.is_some()).then_some(ext)
    }
}

#[derive(Debug, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<serde_json::Value>,
    /// SGLang's `return_hidden_states`: the last layer's hidden state at the last token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_states: Option<Vec<f32>>,
}

/// The answer's message. `reasoning_content` (vLLM, SGLang) and `reasoning` (OpenRouter,
/// Lilac) carry the same text, so clients of either convention find it.
#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
    /// The legacy form of one call (requests with `functions`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionOut>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionOut {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl AssistantMessage {
    /// The message of a parsed choice: content `null` when the turn only called tools.
    pub fn from_parsed(message: ParsedMessage, legacy: bool) -> Self {
        let content = if message.content.is_empty() && !message.tool_calls.is_empty() {
            None
        } else {
            Some(message.content)
        };
        let mut calls = message.tool_calls.into_iter().map(|call| ToolCallOut {
            id: call.id,
            kind: "function",
            function: FunctionOut {
                name: call.name,
                arguments: call.arguments,
            },
        });
        let (tool_calls, function_call) = if legacy {
            (Vec::new(), calls.next().map(|call| call.function))
        } else {
            (calls.collect(), None)
        };
        AssistantMessage {
            role: "assistant",
            content,
            reasoning_content: message.reasoning.clone(),
            reasoning: message.reasoning,
            tool_calls,
            function_call,
        }
    }
}

impl ChatCompletion {
    /// The response for a finished job whose deltas were not seen (a stored result, a batch
    /// line): its text is parsed whole.
    pub fn from_completion(
        job: uuid::Uuid,
        created: i64,
        model: String,
        done: &Completion,
        format: &OutputFormat,
    ) -> Self {
        let n = done.choices.len() as u32;
        let parsed = OutputCollector::new(format, job, n).finish(done);
        Self::from_parsed(completion_id(job), created, model, done, parsed, format)
    }

    /// The response from a finished job and its parsed choices.
    pub fn from_parsed(
        id: String,
        created: i64,
        model: String,
        done: &Completion,
        parsed: Vec<ParsedChoice>,
        format: &OutputFormat,
    ) -> Self {
        let mut reasoning_tokens: Option<u32> = None;
        let mut parsed = parsed.into_iter();
        let choices = done
            .choices
            .iter()
            .map(|choice| {
                let ParsedChoice {
                    message,
                    reasoning_tokens: tokens,
                } = parsed.next().unwrap_or(ParsedChoice {
                    message: ParsedMessage {
                        content: choice.text.clone(),
                        ..ParsedMessage::default()
                    },
                    reasoning_tokens: None,
                });
                if let Some(tokens) = tokens {
                    *reasoning_tokens.get_or_insert(0) += tokens;
                }
                let called = !message.tool_calls.is_empty();
                Choice {
                    index: choice.index,
                    message: AssistantMessage::from_parsed(message, format.legacy_functions),
                    logprobs: choice.logprobs.as_ref().map(|content| ChoiceLogprobs {
                        content: content.clone(),
                    }),
                    finish_reason: choice_finish_reason(
                        choice.finish_reason,
                        called,
                        format.legacy_functions,
                    ),
                    matched_stop: choice.matched_stop.clone(),
                    hidden_states: choice.hidden_states.clone(),
                }
            })
            .collect();
        ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices,
            usage: UsageOut::with_reasoning(done.usage, reasoning_tokens),
            system_fingerprint: SYSTEM_FINGERPRINT,
            sglext: SglExt::of(done, format.cached_tokens_details),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub system_fingerprint: &'static str,
    pub choices: Vec<ChunkChoice>,
    /// Absent unless usage was asked for; then `null` on content chunks and set on the
    /// usage chunk (or on every chunk with `continuous_usage_stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageOut>>,
    /// `sglext.routed_experts`, in a chunk of its own after the choice finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sglext: Option<SglExt>,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionDelta>,
    /// SGLang's `return_hidden_states`, in a chunk of its own after the choice finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_states: Option<Vec<f32>>,
}

/// A call in a stream: the first delta of a call has its `id`, `type` and `function.name`
/// (with `arguments: ""`); later ones only `index` and more `function.arguments`.
#[derive(Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}
