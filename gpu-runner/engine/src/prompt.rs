//! A request's prompt → token ids. Chat messages go through the model's chat template; messages
//! and tools reach it in the shapes Hugging Face's `apply_chat_template` gives it, so model
//! templates render tool calls, tool results and reasoning as the model was trained to see
//! them. A raw prompt (legacy completions) is tokenized as is, token ids are checked against
//! the vocabulary. Errors come back as `(code, message)` pairs; the runner ends the job with
//! them as a request error (the api answers 400).

use crate::runtime::ModelFrontend;
use fallow_protocol::job::{ChatMessage, GenerateRequest, Prompt, Task, Tokenized, ToolCall};
use serde_json::{json, Value};

/// The prompt's token ids, whatever form the job gives it in.
pub fn encode_prompt(
    frontend: &ModelFrontend,
    request: &GenerateRequest,
) -> Result<Vec<u32>, (String, String)> {
    let ids = match &request.input {
        Prompt::Messages => return encode_chat(frontend, request),
        Prompt::Text { text } => {
            // BOS as the model's tokenizer config says (`add_bos_token`), as vLLM's
            // `add_special_tokens` default does for a completions prompt.
            let tokenizer = &frontend.tokenizer;
            tokenizer
                .encode(text, tokenizer.add_bos_by_default())
                .map_err(|e| ("invalid_request".to_string(), format!("tokenizer: {e}")))?
        }
        Prompt::Tokens { ids } => {
            check_token_ids(frontend, ids)?;
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err((
            "invalid_request".to_string(),
            "The prompt is empty: it has no tokens.".to_string(),
        ));
    }
    check_length(frontend, ids.len(), "prompt")?;
    Ok(ids)
}

/// Token ids a client sent must name tokens of this model's vocabulary.
pub fn check_token_ids(frontend: &ModelFrontend, ids: &[u32]) -> Result<(), (String, String)> {
    let vocab = frontend.tokenizer.vocab_size();
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(at) => Err((
            "invalid_request".to_string(),
            format!(
                "Token id {} (at position {at}) is out of range: this model's vocabulary has {vocab} tokens (ids 0..{}).",
                ids[at],
                vocab.saturating_sub(1)
            ),
        )),
        None => Ok(()),
    }
}

fn check_length(frontend: &ModelFrontend, len: usize, what: &str) -> Result<(), (String, String)> {
    if len >= frontend.context_length {
        return Err((
            "context_length_exceeded".to_string(),
            format!(
                "This model's maximum context length is {} tokens; the {what} is {len} tokens.",
                frontend.context_length,
            ),
        ));
    }
    Ok(())
}

/// Chat messages through the model's chat template, then the tokenizer; refused when the
/// prompt leaves no room in the context.
pub fn encode_chat(
    frontend: &ModelFrontend,
    request: &GenerateRequest,
) -> Result<Vec<u32>, (String, String)> {
    let ids = chat_tokens(frontend, request)?;
    check_length(frontend, ids.len(), "prompt rendered from the messages")?;
    Ok(ids)
}

/// The answer of a tokenize / detokenize job, from the tokenizer and template alone (no
/// engine step). A tokenized prompt may be longer than the context: counting is the point.
pub fn tokenization(
    frontend: &ModelFrontend,
    request: &GenerateRequest,
) -> Result<Tokenized, (String, String)> {
    let tokenizer = &frontend.tokenizer;
    let tokens = match &request.input {
        Prompt::Messages => chat_tokens(frontend, request)?,
        Prompt::Text { text } => tokenizer
            .encode(text, tokenizer.add_bos_by_default())
            .map_err(|e| ("invalid_request".to_string(), format!("tokenizer: {e}")))?,
        Prompt::Tokens { ids } => {
            check_token_ids(frontend, ids)?;
            ids.clone()
        }
    };
    let text = match (&request.task, &request.input) {
        (Task::Detokenize, _) => tokenizer.decode(&tokens, request.sampling.skip_special_tokens),
        _ => String::new(),
    };
    Ok(Tokenized {
        tokens,
        text,
        max_model_len: u32::try_from(frontend.context_length).unwrap_or(u32::MAX),
    })
}

fn chat_tokens(
    frontend: &ModelFrontend,
    request: &GenerateRequest,
) -> Result<Vec<u32>, (String, String)> {
    let messages: Vec<Value> = request.messages.iter().map(message_value).collect();
    // Templates test `tools` for truthiness (`{% if tools %}`): no tools is `None`.
    let tools = (!request.tools.is_empty()).then(|| Value::Array(request.tools.clone()));
    let text = frontend
        .template
        .render(
            &messages,
            request.add_generation_prompt && !request.continue_final_message,
            tools.as_ref(),
            &request.chat_template_kwargs,
            request.continue_final_message,
        )
        .map_err(|e| ("invalid_request".to_string(), format!("chat template: {e}")))?;
    let tokenizer = &frontend.tokenizer;
    // Templates that write the BOS token themselves must not get a second one.
    let bos = tokenizer.bos_text();
    let add_bos = tokenizer.add_bos_by_default() && (bos.is_empty() || !text.starts_with(&bos));
    let ids = tokenizer
        .encode(&text, add_bos)
        .map_err(|e| ("invalid_request".to_string(), format!("tokenizer: {e}")))?;
    Ok(ids)
}

/// One message as templates read it: `content` is `null` for a turn that only called tools
/// (as in transformers), `tool_calls` carry their arguments as an object, reasoning is both
/// `reasoning_content` (Qwen3) and `thinking` (gpt-oss).
fn message_value(message: &ChatMessage) -> Value {
    let mut value = json!({
        "role": message.role.as_str(),
        "content": message.content.clone().map_or(Value::Null, Value::String),
    });
    if let Some(name) = &message.name {
        value["name"] = json!(name);
    }
    if let Some(id) = &message.tool_call_id {
        value["tool_call_id"] = json!(id);
    }
    if !message.tool_calls.is_empty() {
        value["tool_calls"] = message.tool_calls.iter().map(tool_call_value).collect();
    }
    if let Some(reasoning) = &message.reasoning_content {
        value["reasoning_content"] = json!(reasoning);
        // gpt-oss's template reads an assistant turn's reasoning as `thinking`.
        value["thinking"] = json!(reasoning);
    }
    value
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`. Templates write the
/// arguments with `tojson` (Qwen, Llama 3.1), so they get the parsed object, as vLLM gives
/// them; arguments that are not a JSON object stay the client's string.
fn tool_call_value(call: &ToolCall) -> Value {
    let arguments = match serde_json::from_str::<Value>(&call.arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => Value::String(call.arguments.clone()),
    };
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fallow_protocol::job::Role;

    #[test]
    fn an_assistant_tool_call_reaches_the_template_in_hugging_face_shape() {
        let message = ChatMessage {
            role: Role::Assistant,
            content: None,
            name: None,
            tool_call_id: None,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into(),
            }],
            reasoning_content: Some("think".into()),
        };
        assert_eq!(
            message_value(&message),
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
                "reasoning_content": "think",
                "thinking": "think",
            })
        );
    }

    #[test]
    fn arguments_that_are_not_an_object_stay_a_string() {
        let call = ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: "not json".into(),
        };
        assert_eq!(
            tool_call_value(&call)["function"]["arguments"],
            json!("not json")
        );
    }
}
