//! Chat messages → prompt token ids, through the model's chat template. Messages and tools
//! reach the template in the shapes Hugging Face's `apply_chat_template` gives it, so model
//! templates render tool calls, tool results and reasoning as the model was trained to see
//! them. Errors come back as `(code, message)` pairs that end the job as a request error
//! (the api answers 400).

use crate::engine::runtime::ModelFrontend;
use fallow_scheduler::job::{ChatMessage, GenerateRequest, ToolCall};
use serde_json::{json, Value};

pub fn encode_chat(
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
    if ids.len() >= frontend.context_length {
        return Err((
            "context_length_exceeded".to_string(),
            format!(
                "This model's maximum context length is {} tokens; the messages are {} tokens.",
                frontend.context_length,
                ids.len()
            ),
        ));
    }
    Ok(ids)
}

/// One message as templates read it: `content` is `null` for a turn that only called tools
/// (as in transformers), `tool_calls` carry their arguments as an object.
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
    use fallow_scheduler::job::Role;

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
