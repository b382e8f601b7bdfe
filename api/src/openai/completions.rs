//! The legacy `POST /v1/completions` on the wire: the request (the chat request's sampling
//! fields plus `prompt`, `echo`, an integer `logprobs` and `suffix`), the `text_completion`
//! answer and its stream chunks, and the legacy logprobs shape
//! `{tokens, token_logprobs, top_logprobs, text_offset}`.

use super::request::ChatCompletionRequest;
use super::response::{finish_reason_str, SglExt, UsageOut, SYSTEM_FINGERPRINT};
use fallow_protocol::job::{Completion, TextFormat, TokenLogprob, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CompletionRequest {
    /// A string, a list of strings, a list of token ids or a list of token-id lists.
    pub prompt: Option<Value>,
    pub echo: Option<bool>,
    /// How many alternatives per position (0..=5); any value turns logprobs on.
    pub logprobs: Option<i64>,
    /// Insertion (fill in the middle) is not offered: refused.
    pub suffix: Option<Value>,
    pub best_of: Option<i64>,
    /// Every field the chat request shares (sampling, constraints, stream options, …).
    #[serde(flatten)]
    pub common: ChatCompletionRequest,
}

/// `logprobs` of a text completion choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LegacyLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// Appends the entries of generated tokens whose text starts `offset` characters into
    /// the choice's text. The sampled token is always among the alternatives (OpenAI: "up to
    /// `logprobs` + 1 elements").
    pub fn extend(&mut self, entries: &[TokenLogprob], mut offset: usize) -> usize {
        for entry in entries {
            self.tokens.push(entry.token.clone());
            self.token_logprobs.push(entry.logprob);
            let mut top = serde_json::Map::new();
            for alt in &entry.top_logprobs {
                top.insert(alt.token.clone(), Value::from(alt.logprob));
            }
            top.entry(entry.token.clone())
                .or_insert(Value::from(entry.logprob));
            self.top_logprobs.push(top);
            self.text_offset.push(offset);
            offset += entry.token.chars().count();
        }
        offset
    }
}

#[derive(Debug, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    pub usage: UsageOut,
    pub system_fingerprint: &'static str,
    /// SGLang's extensions: `routed_experts` with `return_routed_experts` (one prompt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sglext: Option<SglExt>,
}

#[derive(Debug, Serialize)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<LegacyLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<Value>,
    /// SGLang's `return_hidden_states`: the last layer's hidden state at the last token
    /// (streamed in a chunk of its own after the choice finished).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_states: Option<Vec<f32>>,
}

impl TextCompletion {
    /// The answer of the jobs of one request (one per prompt, each with `n` choices):
    /// choices prompt-major, then by choice index. `echo[p]` is the text echoed before
    /// prompt `p`'s choices (a token prompt's text comes from its job).
    pub fn from_jobs(
        id: String,
        created: i64,
        model: String,
        n: u32,
        format: &TextFormat,
        echo: &[Option<String>],
        completions: &[Completion],
    ) -> Self {
        let mut choices = Vec::new();
        let mut usage = Usage::default();
        for (p, completion) in completions.iter().enumerate() {
            usage.prompt_tokens += completion.usage.prompt_tokens;
            usage.completion_tokens += completion.usage.completion_tokens;
            usage.cached_tokens += completion.usage.cached_tokens;
            let echoed = match echo.get(p).cloned().flatten() {
                Some(text) => text,
                None if format.echo => completion.prompt_text.clone().unwrap_or_default(),
                None => String::new(),
            };
            let mut ordered: Vec<_> = completion.choices.iter().collect();
            ordered.sort_by_key(|c| c.index);
            for choice in ordered {
                let mut text = echoed.clone();
                let logprobs = format.logprobs.map(|_| {
                    let mut lp = LegacyLogprobs::default();
                    lp.extend(
                        choice.logprobs.as_deref().unwrap_or_default(),
                        text.chars().count(),
                    );
                    lp
                });
                text.push_str(&choice.text);
                choices.push(TextChoice {
                    index: p as u32 * n + choice.index,
                    text,
                    logprobs,
                    finish_reason: Some(finish_reason_str(choice.finish_reason)),
                    matched_stop: choice.matched_stop.clone(),
                    hidden_states: choice.hidden_states.clone(),
                });
            }
        }
        TextCompletion {
            id,
            object: "text_completion",
            created,
            model,
            choices,
            usage: usage.into(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            sglext: match completions {
                [one] => SglExt::of(one, false),
                _ => None,
            },
        }
    }
}

/// One SSE chunk of a streamed text completion (same `object` as the whole answer, as
/// OpenAI sends it).
#[derive(Debug, Serialize)]
pub struct TextCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
    pub system_fingerprint: &'static str,
    /// `sglext.routed_experts`, in a chunk of its own after the choice finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sglext: Option<SglExt>,
}

/// The public id of a text completion (`cmpl-` + its first job's uuid).
pub fn text_completion_id(job: uuid::Uuid) -> String {
    format!("cmpl-{}", job.simple())
}
