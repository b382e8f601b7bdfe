//! Chat messages → prompt token ids, through the model's chat template. Errors come back as
//! `(code, message)` pairs that end the job as a request error (the api answers 400).

use crate::engine::runtime::ModelFrontend;
use fallow_scheduler::job::{ChatMessage, GenerateRequest};
use serde_json::{json, Value};

pub fn encode_chat(
    frontend: &ModelFrontend,
    request: &GenerateRequest,
) -> Result<Vec<u32>, (String, String)> {
    let messages: Vec<Value> = request.messages.iter().map(message_value).collect();
    let text = frontend
        .template
        .render(
            &messages,
            request.add_generation_prompt && !request.continue_final_message,
            None,
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

fn message_value(message: &ChatMessage) -> Value {
    let mut value = json!({
        "role": message.role.as_str(),
        "content": message.content.clone().unwrap_or_default(),
    });
    if let Some(name) = &message.name {
        value["name"] = json!(name);
    }
    if let Some(id) = &message.tool_call_id {
        value["tool_call_id"] = json!(id);
    }
    value
}
