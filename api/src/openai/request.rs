//! The body of `POST /v1/chat/completions` as clients send it. Every field is optional at
//! this layer (a missing `model` is a validation error naming `model`, not a serde error),
//! numbers are read wide (`i64`/`f64`) so that range checks can name the parameter and its
//! limit, and unknown fields land in `extra` to be logged at debug.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<WireMessage>>,
    pub max_tokens: Option<i64>,
    /// OpenAI's newer name for `max_tokens`; wins when both are sent.
    pub max_completion_tokens: Option<i64>,
    /// Qwen: prompt plus completion tokens at most this.
    pub max_length: Option<i64>,
    /// SGLang: return the last layer's hidden state of each choice's last token.
    pub return_hidden_states: Option<bool>,
    /// SGLang: return the experts each token was routed to (mixture-of-experts models).
    pub return_routed_experts: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StopSpec>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// Token id (as a string, JSON keys are strings) → bias.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub min_tokens: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Passed to the chat template as a variable (GLM-style templates read it).
    pub reasoning_effort: Option<String>,
    /// Lower is served first; default 0.
    pub priority: Option<i64>,
    /// Function tools, checked one by one by validation (errors name `tools[i]…`).
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": …}}`.
    pub tool_choice: Option<Value>,
    /// Whether a turn may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// The legacy form of `tools`: bare function definitions.
    pub functions: Option<Vec<Value>>,
    /// The legacy `tool_choice`: `none`, `auto` or `{"name": …}`.
    pub function_call: Option<Value>,
    /// SGLang: split the reasoning off into `reasoning_content` (default true).
    pub separate_reasoning: Option<bool>,
    /// SGLang: stream reasoning deltas as they come (default true); `false` sends the
    /// reasoning in one delta once it is complete.
    pub stream_reasoning: Option<bool>,
    /// `text`, `json_object` or `json_schema` (checked in `validate::constraint`).
    pub response_format: Option<Value>,
    /// SGLang: the whole output matches this regex.
    pub regex: Option<String>,
    /// SGLang: the output follows this GBNF grammar (converted to llguidance's Lark).
    pub ebnf: Option<String>,
    /// SGLang: stop when the generated text matches one of these regexes.
    pub stop_regex: Option<StopSpec>,
    /// SGLang: keep a matched stop string in the output.
    pub no_stop_trim: Option<bool>,
    /// SGLang: add `sglext.cached_tokens_details` to the answer
    /// (`usage.prompt_tokens_details.cached_tokens` is always reported).
    pub return_cached_tokens_details: Option<bool>,
    /// Accepted for compatibility; not used.
    pub user: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub continuous_usage_stats: Option<bool>,
}

/// `stop` may be one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WireMessage {
    pub role: Option<String>,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool_calls: Option<Vec<Value>>,
    pub function_call: Option<Value>,
    /// An earlier assistant turn's reasoning, sent back (vLLM/SGLang name it
    /// `reasoning_content`, others `reasoning`).
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A message's content: a plain string or a list of typed parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of an array content. Only `text` parts are understood; the others are
/// rejected by validation with a clear message.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub text: Option<String>,
}
