//! Conversation validation: roles, content shapes, and the message count and size limits.

use super::caps::{too_many_bytes, MAX_PROMPT_BYTES};
use crate::error::ApiError;
use crate::openai::request::{ContentPart, MessageContent, WireMessage};
use fallow_protocol::job::{ChatMessage, Role, ToolCall};
use serde_json::Value;

pub(super) fn validate_messages(
    messages: Option<Vec<WireMessage>>,
    max_messages: usize,
) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = messages.unwrap_or_default();
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one message.",
        ));
    }
    if messages.len() > max_messages {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "`messages` has {} messages; at most {max_messages} are allowed.",
                messages.len()
            ),
        ));
    }
    let messages: Vec<ChatMessage> = messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| validate_message(i, message))
        .collect::<Result<_, _>>()?;
    let bytes: usize = messages.iter().map(text_bytes).sum();
    if bytes > MAX_PROMPT_BYTES {
        return Err(too_many_bytes("messages", "hold", bytes, MAX_PROMPT_BYTES));
    }
    Ok(messages)
}

/// The text a message brings to the prompt: what the chat template renders and the
/// engine thread tokenizes.
fn text_bytes(message: &ChatMessage) -> usize {
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|c| c.name.len() + c.arguments.len())
        .sum();
    message.content.as_ref().map_or(0, String::len)
        + message.reasoning_content.as_ref().map_or(0, String::len)
        + message.name.as_ref().map_or(0, String::len)
        + calls
}

fn validate_message(i: usize, message: WireMessage) -> Result<ChatMessage, ApiError> {
    let role = parse_role(i, message.role.as_deref())?;
    let tool_calls = tool_calls(i, role, &message)?;
    let content = match message.content {
        Some(content) => Some(join_content(i, content)?),
        // An assistant turn that only called tools has no text (`null`, as templates expect).
        None if role == Role::Assistant && !tool_calls.is_empty() => None,
        // An assistant turn may have no text; treat it as empty rather than refusing the
        // whole conversation.
        None if role == Role::Assistant => Some(String::new()),
        None => {
            return Err(ApiError::invalid(
                format!("messages[{i}].content"),
                format!(
                    "`messages[{i}].content` is required for role `{}`.",
                    role.as_str()
                ),
            ))
        }
    };
    Ok(ChatMessage {
        role,
        content,
        name: message.name,
        tool_call_id: message.tool_call_id,
        tool_calls,
        reasoning_content: message.reasoning_content.or(message.reasoning),
    })
}

/// An assistant turn's `tool_calls` (or legacy `function_call`), for the template to show
/// the model its own earlier calls.
fn tool_calls(i: usize, role: Role, message: &WireMessage) -> Result<Vec<ToolCall>, ApiError> {
    let calls = message.tool_calls.as_deref().unwrap_or_default();
    let legacy = message.function_call.as_ref().filter(|c| !c.is_null());
    if calls.is_empty() && legacy.is_none() {
        return Ok(Vec::new());
    }
    if role != Role::Assistant {
        return Err(ApiError::invalid(
            format!("messages[{i}].tool_calls"),
            format!(
                "`messages[{i}]` has role `{}`; only assistant messages carry tool calls.",
                role.as_str()
            ),
        ));
    }
    let mut out = Vec::with_capacity(calls.len() + 1);
    for (j, call) in calls.iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        if call
            .get("type")
            .is_some_and(|t| t.as_str() != Some("function"))
        {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` must be `function`."),
            ));
        }
        let function = call.get("function").unwrap_or(&Value::Null);
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .map_or_else(|| format!("call_{i}_{j}"), str::to_owned);
        out.push(function_call(&format!("{at}.function"), id, function)?);
    }
    if let Some(call) = legacy {
        let at = format!("messages[{i}].function_call");
        out.push(function_call(&at, format!("call_{i}"), call)?);
    }
    Ok(out)
}

/// `{"name": …, "arguments": "<json>"}`; arguments sent as an object are accepted too.
fn function_call(at: &str, id: String, function: &Value) -> Result<ToolCall, ApiError> {
    let Some(name) = function.get("name").and_then(Value::as_str) else {
        return Err(ApiError::invalid(
            format!("{at}.name"),
            format!("`{at}.name` is required and must be a string."),
        ));
    };
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.arguments"),
                format!("`{at}.arguments` must be a JSON string."),
            ))
        }
    };
    Ok(ToolCall {
        id,
        name: name.to_owned(),
        arguments,
    })
}

fn parse_role(i: usize, role: Option<&str>) -> Result<Role, ApiError> {
    let param = format!("messages[{i}].role");
    match role {
        Some("system") | Some("developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        // `function` is the legacy name of a tool result (its `name` says whose).
        Some("tool") | Some("function") => Ok(Role::Tool),
        Some(other) => Err(ApiError::invalid(
            param,
            format!(
                "`messages[{i}].role` is `{other}`; expected one of system, developer, user, assistant, tool, function."
            ),
        )),
        None => Err(ApiError::invalid(
            param,
            format!("`messages[{i}].role` is required."),
        )),
    }
}

/// Text parts are joined with newlines (as vLLM does); any other part type is refused
/// because every model served here is text-only.
fn join_content(i: usize, content: MessageContent) -> Result<String, ApiError> {
    let parts = match content {
        MessageContent::Text(text) => return Ok(text),
        MessageContent::Parts(parts) => parts,
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, ContentPart { kind, text }) in parts.into_iter().enumerate() {
        match (kind.as_deref(), text) {
            (Some("text") | None, Some(text)) => texts.push(text),
            (Some("text") | None, None) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content[{j}].text"),
                    format!("`messages[{i}].content[{j}]` is a text part without `text`."),
                ))
            }
            (Some(other), _) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content[{j}]"),
                    format!(
                    "`messages[{i}].content[{j}]` is a `{other}` part: this model reads text only \
                         (image, video and audio inputs are not supported)."
                ),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}
