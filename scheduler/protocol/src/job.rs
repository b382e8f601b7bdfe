//! The internal, validated vocabulary shared by the api tier, the runners and the engine: what
//! a job asks for (`GenerateRequest`), what a runner streams back (`JobEvent`), and how it
//! ended (`Completion`). Nothing here knows about HTTP or OpenAI's wire format; `api` converts
//! at its boundary. The engine reads `Sampling` (with its `Constraint`), `FinishReason`,
//! `Usage` and the logprob types as they are, so one validated sampling type flows from the
//! api to the sampler.

use crate::adapter::AdapterRef;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::progress::{ChoiceProgress, Progress};

/// Who speaks a chat message. `developer` is folded into `system` by the api, because
/// chat templates know only the four classic roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// Text parts already joined; `None` only for an assistant turn that carried tool calls.
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The calls an assistant turn made (its `tool_calls`, or a legacy `function_call`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// An assistant turn's reasoning (`reasoning_content` or `reasoning` on the wire), for
    /// templates that render it (Qwen3 keeps the latest turn's thinking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A plain text turn: no name, tool calls or reasoning.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(content.into()),
            name: None,
            tool_call_id: None,
            tool_calls: Vec::new(),
            reasoning_content: None,
        }
    }
}

/// One function call of an earlier assistant turn, as the client sent it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the JSON text the model wrote (OpenAI sends a string).
    pub arguments: String,
}

/// How a job's raw text is turned into an OpenAI message: which parsers run and how
/// reasoning is delivered. The runner ignores it; the api applies it to the stream, the
/// stored result and batch lines alike, so the same job always reads the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutputFormat {
    /// The tool-call syntax to parse (`hermes`, `llama3_json`, `mistral`); `None` when the
    /// request offered no tools (or `tool_choice` was `none`): the text stays content.
    pub tool_parser: Option<String>,
    /// Report calls the legacy way (`message.function_call`, finish reason `function_call`).
    pub legacy_functions: bool,
    /// At most one call is reported (`parallel_tool_calls: false`, or legacy functions).
    pub single_tool_call: bool,
    /// The reasoning syntax to split off (`qwen3`, `deepseek_r1`); `None` = no reasoning.
    pub reasoning_parser: Option<String>,
    /// `stream_reasoning`: `false` sends the reasoning in one delta once it is complete.
    pub stream_reasoning: bool,
    /// Answer as a legacy `text_completion` (`/v1/completions`), not a chat completion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_completion: Option<TextFormat>,
    /// SGLang `return_cached_tokens_details`: the answer carries
    /// `sglext.cached_tokens_details`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cached_tokens_details: bool,
    /// Answer as a Responses API `response` (`/v1/responses`). The value holds the request's
    /// settings that every answer echoes; it is the api's, opaque to everyone else, and
    /// stored with the job so that any api process (a poll, a resumed stream, a batch line)
    /// answers for the job alike.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses: Option<serde_json::Value>,
    /// Answer as an embedding list (`/v1/embeddings`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<EmbeddingFormat>,
}

/// How an embedding answer presents its vectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EmbeddingFormat {
    /// `encoding_format: "base64"`: each vector as base64 of its little-endian f32 bytes.
    pub base64: bool,
    /// Each vector cut to this many dimensions and normalised again (Matryoshka models).
    pub dimensions: Option<u32>,
}

/// How a legacy completion presents its choices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TextFormat {
    /// The integer `logprobs`: legacy logprobs with up to this many alternatives.
    pub logprobs: Option<u32>,
    /// The prompt is echoed before each choice's text.
    pub echo: bool,
}

impl Default for OutputFormat {
    fn default() -> Self {
        OutputFormat {
            tool_parser: None,
            legacy_functions: false,
            single_tool_call: false,
            reasoning_parser: None,
            stream_reasoning: true,
            text_completion: None,
            cached_tokens_details: false,
            responses: None,
            embeddings: None,
        }
    }
}

/// Sampling controls, validated (ranges checked, defaults filled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Upper bound on generated tokens per choice; `None` = up to the context length.
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    /// 0 = greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = off (the wire's −1 is mapped to 0).
    pub top_k: u32,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    /// token id → additive bias.
    pub logit_bias: BTreeMap<u32, f32>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub logprobs: bool,
    /// 0..=20
    pub top_logprobs: u32,
    /// A grammar the output must follow; `None` = free text.
    #[serde(default)]
    pub constraint: Option<Constraint>,
    /// The choice stops when its generated text matches any of these regexes (SGLang
    /// `stop_regex`; `finish_reason: stop`).
    #[serde(default)]
    pub stop_regex: Vec<String>,
    /// SGLang `no_stop_trim`: a matched stop string (or regex match) stays in the output.
    #[serde(default)]
    pub no_stop_trim: bool,
    /// Qwen `max_length`: prompt plus completion tokens at most this; the engine lowers
    /// `max_tokens` to what is left after the prompt, and refuses a prompt that fills it.
    #[serde(default)]
    pub max_length: Option<u32>,
    /// SGLang `return_hidden_states`: each choice also returns the last layer's hidden state
    /// (after the final norm) at the position that produced its last token.
    #[serde(default)]
    pub return_hidden_states: bool,
    /// SGLang `return_routed_experts` (a mixture-of-experts model): each choice also returns
    /// the experts every token it ran was routed to.
    #[serde(default)]
    pub return_routed_experts: bool,
}

/// A grammar the generated text must follow (constrained decoding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Constraint {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// JSON valid against the schema (`response_format: json_schema`).
    JsonSchema {
        schema: serde_json::Value,
        strict: bool,
    },
    /// The whole output matches the regex (SGLang `regex`).
    Regex { pattern: String },
    /// A grammar in llguidance's Lark syntax (SGLang `ebnf` is converted to it; tool-call grammars are built in it).
    Lark { grammar: String },
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            max_tokens: None,
            min_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: BTreeMap::new(),
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
            logprobs: false,
            top_logprobs: 0,
            constraint: None,
            stop_regex: Vec::new(),
            no_stop_trim: false,
            max_length: None,
            return_hidden_states: false,
            return_routed_experts: false,
        }
    }
}

/// Everything a runner needs to generate one chat completion (all `n` choices).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub sampling: Sampling,
    /// Number of choices, ≥ 1.
    pub n: u32,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// Whether the client reads tokens as they come. Only then does a token reach the client
    /// before the job ends, which rules out retrying the job from scratch.
    #[serde(default)]
    pub stream: bool,
    /// Extra variables for the chat template (`chat_template_kwargs`).
    #[serde(default)]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The functions the model may call, as chat templates read them (Hugging Face's
    /// `tools`: `{"type": "function", "function": {name, description, parameters}}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// How the api presents the output (tool calls, reasoning).
    #[serde(default)]
    pub output: OutputFormat,
    /// What the prompt is: the chat `messages` above (rendered by the chat template), or a
    /// raw prompt of the legacy completions API that bypasses the template. Rows written
    /// before this field existed read as `Messages`.
    #[serde(default)]
    pub input: Prompt,
    /// What the runner is asked to do with the prompt; rows without it generate.
    #[serde(default)]
    pub task: Task,
    /// The inputs of a `Task::Embed` job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed: Option<EmbedRequest>,
    /// What earlier attempts generated before their runners handed the job back: the next
    /// runner continues from it instead of starting over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The LoRA adapter to run over `model` (then the base model), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<AdapterRef>,
}

impl GenerateRequest {
    /// The queue the job waits in: its model's, or its adapter's over that model.
    pub fn queue_model(&self) -> String {
        match &self.adapter {
            Some(adapter) => adapter.queue(&self.model),
            None => self.model.clone(),
        }
    }

    /// One completion of `messages` through the chat template, every other option at its
    /// default: what tools, benchmarks and tests build.
    pub fn chat(model: impl Into<String>, messages: Vec<ChatMessage>, sampling: Sampling) -> Self {
        Self {
            model: model.into(),
            messages,
            sampling,
            n: 1,
            add_generation_prompt: true,
            continue_final_message: false,
            stream: false,
            chat_template_kwargs: Default::default(),
            tools: Vec::new(),
            output: Default::default(),
            input: Default::default(),
            task: Default::default(),
            embed: None,
            progress: None,
            adapter: None,
        }
    }
}

/// What an embedding job (`Task::Embed`) embeds: one vector per input, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbedRequest {
    pub inputs: Vec<EmbedInput>,
}

/// One input of an embedding job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EmbedInput {
    /// Tokenized by the model's tokenizer, special tokens included.
    Text { text: String },
    /// Token ids, run as they are.
    Tokens { ids: Vec<u32> },
}

/// A job's prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Prompt {
    /// `GenerateRequest::messages`, through the model's chat template.
    #[default]
    Messages,
    /// Raw text, tokenized as is (with the BOS token when the model's tokenizer adds one).
    Text { text: String },
    /// Token ids, used as they are (the runner checks them against the vocabulary).
    Tokens { ids: Vec<u32> },
}

/// What a job asks of the runner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// Generate `n` choices (chat and legacy completions).
    #[default]
    Generate,
    /// Only tokenize the prompt (`POST /tokenize`): the result's `tokenized.tokens`.
    Tokenize,
    /// Only decode `Prompt::Tokens` (`POST /detokenize`): the result's `tokenized.text`.
    Detokenize,
    /// Embed `GenerateRequest::embed`'s inputs (`POST /v1/embeddings`): the result's
    /// `embeddings`.
    Embed,
}

/// The answer to a `Tokenize` or `Detokenize` job; no engine step is involved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokenized {
    pub tokens: Vec<u32>,
    pub text: String,
    /// The model's context length, as `max_model_len` in vLLM's answer.
    pub max_model_len: u32,
}

/// Why a choice stopped, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    /// The job was cancelled (client gone or explicit cancel).
    Abort,
}

/// One alternative at a sampled position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// Log-probability information for one generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn total_tokens(&self) -> u32 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// One choice's final state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceResult {
    pub index: u32,
    pub text: String,
    pub finish_reason: FinishReason,
    /// The stop string or token id that ended the choice, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// With `Sampling::return_hidden_states`: the hidden state (hidden-size floats) at the
    /// position that produced the choice's last token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_states: Option<Vec<f32>>,
    /// With `Sampling::return_routed_experts`: SGLang's encoding, base64 of little-endian
    /// int32 expert ids shaped `[tokens, routed layers, experts per token]`, for every
    /// position the choice ran (the prompt and each generated token but the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<String>,
}

/// The stored result of a finished job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub choices: Vec<ChoiceResult>,
    pub usage: Usage,
    /// A token-id prompt as text, for `echo` (the api knows the text of any other prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_text: Option<String>,
    /// The answer of a tokenize / detokenize job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenized: Option<Tokenized>,
    /// The answer of an embedding job: one vector per input, in order (`usage.prompt_tokens`
    /// counts the tokens of all inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<Vec<Vec<f32>>>,
}

/// What a runner appends to a job's Redis stream. The last event of a stream is always
/// `Final` or `Error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JobEvent {
    /// The runner started this attempt (prompt processed or about to be).
    Started {
        attempt: i32,
        /// A token-id prompt as text, so a streamed `echo` can send it first.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_text: Option<String>,
        /// This attempt continues the earlier attempts' output (their events stand, and
        /// its deltas follow them); otherwise it starts over.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        continues: bool,
    },
    /// New text for one choice. `finish_reason` is set on the choice's last delta.
    Delta {
        index: u32,
        text: String,
        /// The tokens generated since the previous delta (their text may be held back), so
        /// the job's progress can be rebuilt from its stream if its runner dies.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        token_ids: Vec<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<Vec<TokenLogprob>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<FinishReason>,
        /// Usage so far (for `continuous_usage_stats`).
        usage: Usage,
        /// Where the choice stood before this delta, over every attempt; absent in entries
        /// written before deltas had it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<crate::position::ChoicePosition>,
    },
    /// The job finished; carries the whole result.
    Final { completion: Completion },
    /// The job failed or was given up on; nothing more follows.
    Error { code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_stored_before_prompts_and_tasks_existed_reads_as_chat_generation() {
        let old = serde_json::json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "sampling": serde_json::to_value(Sampling::default()).unwrap_or_default(),
            "n": 1, "add_generation_prompt": true, "continue_final_message": false
        });
        let request: GenerateRequest =
            serde_json::from_value(old).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(request.input, Prompt::Messages);
        assert_eq!(request.task, Task::Generate);
        assert!(!request.sampling.no_stop_trim);
    }

    #[test]
    fn prompts_round_trip_through_json() {
        for input in [
            Prompt::Messages,
            Prompt::Text { text: "a".into() },
            Prompt::Tokens { ids: vec![1, 2] },
        ] {
            let json = serde_json::to_value(&input).unwrap_or_default();
            let back: Prompt = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, input);
        }
    }
}
