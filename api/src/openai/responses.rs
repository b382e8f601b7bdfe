//! The Responses API on the wire (`/v1/responses`): the create body as clients send it
//! (lenient, every field optional, unknown fields kept for a debug log), the settings every
//! answer echoes, and the `response` object with its output items, exactly as OpenAI's SDKs
//! parse them. Conversion into a chat request happens in [`crate::validate::responses`];
//! turning a job's text into output items and stream events in [`crate::responses`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `POST /v1/responses`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CreateResponseRequest {
    pub model: Option<String>,
    /// A string (one user message) or a list of input items.
    pub input: Option<ResponseInput>,
    /// A system message put before the conversation; never carried to the next turn.
    pub instructions: Option<Value>,
    /// Function tools in the Responses shape: `{type, name, description, parameters, strict}`.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{format: {type: text | json_object | json_schema, …}, verbosity}`.
    pub text: Option<Value>,
    /// `{effort, summary}`; the effort is passed to the chat template.
    pub reasoning: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_logprobs: Option<i64>,
    pub metadata: Option<Map<String, Value>>,
    /// Keep the response for retrieval and continuation (default true).
    pub store: Option<bool>,
    pub user: Option<String>,
    pub stream: Option<bool>,
    /// Answer at once with `status: "queued"`; the job runs on its own.
    pub background: Option<bool>,
    pub previous_response_id: Option<String>,
    pub include: Option<Vec<String>>,
    pub truncation: Option<String>,
    pub service_tier: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `input`: one user message, or items.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<Value>),
}

/// The request's settings that every `response` object echoes. Stored with the job (in its
/// output format), so a poll, a resumed stream or a batch line answers with them too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseSettings {
    pub created_at: i64,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub metadata: Map<String, Value>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub store: bool,
    pub background: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: Option<f64>,
    pub top_logprobs: Option<i64>,
    pub truncation: String,
    pub user: Option<String>,
    /// `include` asked for `message.output_text.logprobs`.
    #[serde(default)]
    pub output_logprobs: bool,
}

/// A `response` object.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: i64,
    pub status: &'static str,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub max_tool_calls: Option<i64>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub service_tier: &'static str,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_logprobs: Option<i64>,
    pub top_p: Option<f64>,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Map<String, Value>,
}

impl ResponseObject {
    /// A response without output yet, in `status`.
    pub fn new(
        id: String,
        model: String,
        settings: &ResponseSettings,
        status: &'static str,
    ) -> Self {
        let s = settings.clone();
        ResponseObject {
            id,
            object: "response",
            created_at: s.created_at,
            status,
            background: s.background,
            error: None,
            incomplete_details: None,
            instructions: s.instructions,
            max_output_tokens: s.max_output_tokens,
            max_tool_calls: None,
            model,
            output: Vec::new(),
            parallel_tool_calls: s.parallel_tool_calls,
            previous_response_id: s.previous_response_id,
            reasoning: s.reasoning,
            service_tier: "default",
            store: s.store,
            temperature: s.temperature,
            text: s.text,
            tool_choice: s.tool_choice,
            tools: s.tools,
            top_logprobs: s.top_logprobs,
            top_p: s.top_p,
            truncation: s.truncation,
            usage: None,
            user: s.user,
            metadata: s.metadata,
        }
    }

    /// The concatenated text of the output messages (the SDK's `output_text`).
    pub fn output_text(&self) -> String {
        let mut text = String::new();
        for item in &self.output {
            if let OutputItem::Message { content, .. } = item {
                for part in content {
                    text.push_str(&part.text);
                }
            }
        }
        text
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// One item of `output`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
}

impl OutputItem {
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. }
            | OutputItem::Reasoning { id, .. } => id,
        }
    }

    pub fn set_status(&mut self, new: &'static str) {
        match self {
            OutputItem::Message { status, .. }
            | OutputItem::FunctionCall { status, .. }
            | OutputItem::Reasoning { status, .. } => *status = new,
        }
    }
}

/// An `output_text` content part.
#[derive(Debug, Clone, Serialize)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<fallow_protocol::job::TokenLogprob>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        OutputText {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// A `reasoning_text` content part of a reasoning item.
#[derive(Debug, Clone, Serialize)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl ReasoningText {
    pub fn new(text: String) -> Self {
        ReasoningText {
            kind: "reasoning_text",
            text,
        }
    }
}

/// `resp_` + the job's uuid without dashes: a response is its job.
pub fn response_id(job: uuid::Uuid) -> String {
    format!("resp_{}", job.simple())
}

/// The job behind a public response id (`resp_<uuid>`).
pub fn parse_response_id(id: &str) -> Option<uuid::Uuid> {
    uuid::Uuid::parse_str(id.strip_prefix("resp_")?).ok()
}
