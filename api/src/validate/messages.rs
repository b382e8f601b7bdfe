//! Conversation validation: roles, content shapes, and the message count limit.

use crate::error::ApiError;
use crate::openai::request::{ContentPart, MessageContent, WireMessage};
use fallow_scheduler::job::{ChatMessage, Role};

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
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| validate_message(i, message))
        .collect()
}

fn validate_message(i: usize, message: WireMessage) -> Result<ChatMessage, ApiError> {
    let role = parse_role(i, message.role.as_deref())?;
    if message.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) || message.function_call.is_some()
    {
        return Err(ApiError::invalid(
            format!("messages[{i}].tool_calls"),
            "Tool calls in messages are not supported by this server yet.",
        ));
    }
    let content = match message.content {
        Some(content) => Some(join_content(i, content)?),
        // An assistant turn may have no text (it carried a tool call elsewhere); treat it
        // as empty rather than refusing the whole conversation.
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
    })
}

fn parse_role(i: usize, role: Option<&str>) -> Result<Role, ApiError> {
    let param = format!("messages[{i}].role");
    match role {
        Some("system") | Some("developer") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        // `function` is the legacy name of a tool result.
        Some("tool") | Some("function") => Ok(Role::Tool),
        Some(other) => Err(ApiError::invalid(
            param,
            format!(
                "`messages[{i}].role` is `{other}`; expected one of system, developer, user, assistant, tool."
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
                    format!("messages[{i}].content[{j}].type"),
                    format!(
                        "Content part type `{other}` is not supported: the models served here read text only."
                    ),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}
