//! `POST /tokenize` and `POST /detokenize` on the wire, in vLLM's and SGLang's shapes.

use super::request::WireMessage;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `{model, prompt}` or `{model, messages, add_generation_prompt}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<Value>,
    pub messages: Option<Vec<WireMessage>>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub max_model_len: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
