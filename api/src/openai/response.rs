//! What `POST /v1/chat/completions` answers: a `chat.completion` object, or a stream of
//! `chat.completion.chunk` objects. Field order and null-versus-absent follow OpenAI's
//! responses, because some clients are strict about both.

use fallow_scheduler::job::{Completion, FinishReason, TokenLogprob, Usage};
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

#[derive(Debug, Clone, Serialize)]
pub struct UsageOut {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
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
}

#[derive(Debug, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
}

impl ChatCompletion {
    /// The response for a finished job.
    pub fn from_completion(id: String, created: i64, model: String, done: &Completion) -> Self {
        let choices = done
            .choices
            .iter()
            .map(|choice| Choice {
                index: choice.index,
                message: AssistantMessage {
                    role: "assistant",
                    content: Some(choice.text.clone()),
                },
                logprobs: choice.logprobs.as_ref().map(|content| ChoiceLogprobs {
                    content: content.clone(),
                }),
                finish_reason: finish_reason_str(choice.finish_reason),
                matched_stop: choice.matched_stop.clone(),
            })
            .collect();
        ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices,
            usage: done.usage.into(),
            system_fingerprint: SYSTEM_FINGERPRINT,
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
}
