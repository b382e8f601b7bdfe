//! A Responses API request (`POST /v1/responses`) → the chat request it means, validated by
//! exactly the chat endpoint's rules ([`validate_chat`]): input items become messages,
//! Responses-shaped tools become chat tools, `text.format` becomes `response_format`,
//! `max_output_tokens` becomes `max_completion_tokens`. What only the Responses API has is
//! checked here first (item shapes, tool and `include` kinds, `metadata`); a chat rule's
//! error is renamed to the Responses field it is about (`messages[3]` → `input[2]`,
//! `tools[0].function.name` → `tools[0].name`), so every refusal names a field the client
//! sent.

use super::{validate_chat, Limits, ValidChat};
use crate::error::ApiError;
use crate::openai::request::{ChatCompletionRequest, MessageContent, WireMessage};
use crate::openai::responses::{CreateResponseRequest, ResponseInput, ResponseSettings};
use serde_json::{json, Map, Value};

/// The one `include` value served: logprobs of the output text.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// OpenAI's metadata limits: 16 pairs, keys up to 64 characters, values up to 512.
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;

/// A Responses request that passed validation.
#[derive(Debug, Clone)]
pub struct ValidResponse {
    /// The chat request it means; its output format carries `settings`.
    pub chat: ValidChat,
    pub settings: ResponseSettings,
    /// This request's input items, normalised, with ids.
    pub input_items: Vec<Value>,
    /// Every item the model is shown: the earlier turns', then `input_items`.
    pub context: Vec<Value>,
    pub stream: bool,
    pub background: bool,
}

/// The model asked for.
pub fn requested_model(wire: &CreateResponseRequest) -> Result<&str, ApiError> {
    match wire.model.as_deref().map(str::trim) {
        Some(model) if !model.is_empty() => Ok(model),
        _ => Err(ApiError::invalid("model", "`model` is required.")),
    }
}

/// Validates `wire`, continuing from `prior` (the items of the previous response's context
/// and output; empty without `previous_response_id`).
pub fn validate_response(
    wire: CreateResponseRequest,
    prior: Vec<Value>,
    limits: &Limits,
    created_at: i64,
) -> Result<ValidResponse, ApiError> {
    let model = requested_model(&wire)?.to_owned();
    refuse_unsupported(&wire)?;
    let output_logprobs = check_include(wire.include.as_deref().unwrap_or_default())?;
    let store = wire.store.unwrap_or(true);
    let background = wire.background.unwrap_or(false);
    let stream = wire.stream.unwrap_or(false);
    if background && !store {
        return Err(ApiError::invalid(
            "background",
            "A background response must be stored: `background: true` requires `store: true`.",
        ));
    }
    let truncation = match wire.truncation.as_deref() {
        None | Some("disabled") => "disabled",
        Some("auto") => "auto",
        Some(other) => {
            return Err(ApiError::invalid(
                "truncation",
                format!("`truncation` must be `auto` or `disabled`, got `{other}`."),
            ))
        }
    };
    let metadata = check_metadata(wire.metadata.clone().unwrap_or_default())?;
    let instructions = match &wire.instructions {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "instructions",
                "`instructions` must be a string.",
            ))
        }
    };
    let tools = wire.tools.clone().unwrap_or_default();
    let chat_tools = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| chat_tool(i, tool))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_choice = wire.tool_choice.clone().filter(|c| !c.is_null());
    let chat_choice = tool_choice.as_ref().map(chat_tool_choice).transpose()?;
    let (text, response_format) = text_format(wire.text.as_ref())?;
    let (reasoning, effort) = reasoning(wire.reasoning.as_ref())?;

    let input_items = match wire.input.clone() {
        None => {
            return Err(ApiError::invalid(
                "input",
                "`input` is required: a string or a list of items.",
            ))
        }
        Some(ResponseInput::Text(text)) => vec![json!({
            "type": "message", "id": new_id("msg"), "status": "completed", "role": "user",
            "content": [{"type": "input_text", "text": text}],
        })],
        Some(ResponseInput::Items(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| normalize_item(&format!("input[{i}]"), item))
            .collect::<Result<_, _>>()?,
    };
    if input_items.is_empty() && prior.is_empty() {
        return Err(ApiError::invalid(
            "input",
            "`input` must contain at least one item.",
        ));
    }
    let input_param = |i: usize| match wire.input {
        Some(ResponseInput::Items(_)) => format!("input[{i}]"),
        _ => "input".to_owned(),
    };
    let mut origins: Vec<String> = Vec::new();
    let mut messages: Vec<WireMessage> = Vec::new();
    if let Some(text) = &instructions {
        origins.push("instructions".into());
        messages.push(message("system", text.clone()));
    }
    let labelled = prior
        .iter()
        .map(|item| (item, "previous_response_id".to_owned()))
        .chain(
            input_items
                .iter()
                .enumerate()
                .map(|(i, item)| (item, input_param(i))),
        );
    items_to_messages(labelled, &mut messages, &mut origins)?;
    let mut context = prior;
    context.extend(input_items.iter().cloned());

    let settings = ResponseSettings {
        created_at,
        instructions,
        max_output_tokens: wire.max_output_tokens,
        metadata,
        parallel_tool_calls: wire.parallel_tool_calls.unwrap_or(true),
        previous_response_id: wire.previous_response_id.clone(),
        reasoning,
        store,
        background,
        temperature: wire.temperature,
        text,
        tool_choice: tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools,
        top_p: wire.top_p,
        top_logprobs: wire.top_logprobs,
        truncation: truncation.to_owned(),
        user: wire.user.clone(),
        output_logprobs,
    };
    let logprobs = output_logprobs || wire.top_logprobs.is_some_and(|n| n > 0);
    let chat = ChatCompletionRequest {
        model: Some(model),
        messages: Some(messages),
        max_completion_tokens: wire.max_output_tokens,
        temperature: wire.temperature,
        top_p: wire.top_p,
        logprobs: Some(logprobs),
        top_logprobs: wire.top_logprobs.filter(|_| logprobs),
        stream: Some(stream),
        // `none` asks for no reasoning: templates that think are told not to.
        chat_template_kwargs: (effort.as_deref() == Some("none"))
            .then(|| Map::from_iter([("enable_thinking".to_owned(), Value::Bool(false))])),
        reasoning_effort: effort,
        tools: (!chat_tools.is_empty()).then_some(chat_tools),
        tool_choice: chat_choice,
        parallel_tool_calls: wire.parallel_tool_calls,
        response_format,
        user: wire.user,
        ..ChatCompletionRequest::default()
    };
    let mut chat = validate_chat(chat, limits).map_err(|e| rename_param(e, &origins))?;
    chat.request.output.responses = serde_json::to_value(&settings).ok();
    // A background job's events may be read (resumed) while it runs, so, like a stream, it
    // must never be retried from scratch after its first tokens.
    chat.request.stream = stream || background;
    Ok(ValidResponse {
        chat,
        settings,
        input_items,
        context,
        stream,
        background,
    })
}

/// Fields of the Responses API this server does not offer: refused, never ignored.
fn refuse_unsupported(wire: &CreateResponseRequest) -> Result<(), ApiError> {
    for field in ["conversation", "prompt"] {
        if wire.extra.get(field).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` is not supported by this server; use `previous_response_id` and `instructions`."),
            ));
        }
    }
    if !wire.extra.is_empty() {
        let names: Vec<&str> = wire.extra.keys().map(String::as_str).collect();
        tracing::debug!(fields = ?names, "ignoring unknown request fields");
    }
    Ok(())
}

/// Whether output logprobs were asked for; any other `include` value is refused.
fn check_include(include: &[String]) -> Result<bool, ApiError> {
    let mut logprobs = false;
    for (i, value) in include.iter().enumerate() {
        if value == INCLUDE_LOGPROBS {
            logprobs = true;
        } else {
            return Err(ApiError::invalid(
                format!("include[{i}]"),
                format!("`include[{i}]` is `{value}`; the only value supported is `{INCLUDE_LOGPROBS}`."),
            ));
        }
    }
    Ok(logprobs)
}

fn check_metadata(metadata: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    if metadata.len() > METADATA_PAIRS {
        return Err(ApiError::invalid(
            "metadata",
            format!(
                "`metadata` has {} pairs; at most {METADATA_PAIRS} are allowed.",
                metadata.len()
            ),
        ));
    }
    for (key, value) in &metadata {
        if key.chars().count() > METADATA_KEY_CHARS {
            return Err(ApiError::invalid(
                "metadata",
                format!(
                    "The `metadata` key `{key}` is longer than {METADATA_KEY_CHARS} characters."
                ),
            ));
        }
        match value.as_str() {
            Some(v) if v.chars().count() <= METADATA_VALUE_CHARS => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("metadata.{key}"),
                    format!("`metadata.{key}` is longer than {METADATA_VALUE_CHARS} characters."),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    format!("metadata.{key}"),
                    format!("`metadata.{key}` must be a string."),
                ))
            }
        }
    }
    Ok(metadata)
}

/// A Responses function tool → the chat shape (`{type, function: {…}}`); OpenAI's hosted
/// tools (web search, file search, computer use, code interpreter, MCP, image generation …)
/// are refused by name.
fn chat_tool(i: usize, tool: &Value) -> Result<Value, ApiError> {
    let at = format!("tools[{i}]");
    let Some(obj) = tool.as_object() else {
        return Err(ApiError::invalid(&at, format!("`{at}` must be an object.")));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` is `{other}`: this server runs no hosted tools; only `function` tools are supported."),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` is required and must be `function`."),
            ))
        }
    }
    let mut function = obj.clone();
    function.remove("type");
    Ok(json!({"type": "function", "function": function}))
}

/// `none` / `auto` / `required` / `{type: "function", name}` → chat's `tool_choice`.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(obj) => match obj.get("type").and_then(Value::as_str) {
            Some("function") => match obj.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(ApiError::invalid(
                    "tool_choice.name",
                    "`tool_choice.name` is required for a function choice.",
                )),
            },
            Some(other) => Err(ApiError::invalid(
                "tool_choice",
                format!("`tool_choice` of type `{other}` is not supported; use `none`, `auto`, `required` or {{\"type\": \"function\", \"name\": …}}."),
            )),
            None => Err(ApiError::invalid(
                "tool_choice.type",
                "`tool_choice.type` is required.",
            )),
        },
        _ => Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be `none`, `auto`, `required` or {\"type\": \"function\", \"name\": …}.",
        )),
    }
}

/// `text` → the echoed `text` and the chat `response_format`.
fn text_format(text: Option<&Value>) -> Result<(Value, Option<Value>), ApiError> {
    let default = json!({"format": {"type": "text"}});
    let Some(text) = text.filter(|t| !t.is_null()) else {
        return Ok((default, None));
    };
    let Some(obj) = text.as_object() else {
        return Err(ApiError::invalid("text", "`text` must be an object."));
    };
    let Some(format) = obj.get("format").filter(|f| !f.is_null()) else {
        let mut echo = obj.clone();
        echo.insert("format".into(), json!({"type": "text"}));
        return Ok((Value::Object(echo), None));
    };
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("text") => None,
        Some("json_object") => Some(json!({"type": "json_object"})),
        Some("json_schema") => {
            if !format.get("name").is_some_and(Value::is_string) {
                return Err(ApiError::invalid(
                    "text.format.name",
                    "`text.format.name` is required for a `json_schema` format.",
                ));
            }
            if !format
                .get("schema")
                .is_some_and(|s| s.is_object() || s.is_boolean())
            {
                return Err(ApiError::invalid(
                    "text.format.schema",
                    "`text.format.schema` is required and must be a JSON schema object.",
                ));
            }
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            Some(json!({"type": "json_schema", "json_schema": schema}))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "text.format.type",
                format!(
                "`text.format.type` is `{other}`; expected `text`, `json_object` or `json_schema`."
            ),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                "text.format.type",
                "`text.format.type` is required.",
            ))
        }
    };
    Ok((text.clone(), response_format))
}

/// `reasoning` → its echo and the effort the chat template is given.
fn reasoning(reasoning: Option<&Value>) -> Result<(Value, Option<String>), ApiError> {
    let Some(reasoning) = reasoning.filter(|r| !r.is_null()) else {
        return Ok((json!({"effort": null, "summary": null}), None));
    };
    let Some(obj) = reasoning.as_object() else {
        return Err(ApiError::invalid(
            "reasoning",
            "`reasoning` must be an object.",
        ));
    };
    let effort = match obj.get("effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e))
            if ["none", "minimal", "low", "medium", "high", "xhigh"].contains(&e.as_str()) =>
        {
            Some(e.clone())
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning.effort",
                format!(
                    "`reasoning.effort` must be `none`, `minimal`, `low`, `medium`, `high` or \
                     `xhigh`, got {other}."
                ),
            ))
        }
    };
    let summary = obj.get("summary").cloned().unwrap_or(Value::Null);
    Ok((json!({"effort": effort, "summary": summary}), effort))
}

/// A fresh item id (`msg_…`, `fc_…`).
fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// One input item, checked and normalised (type set, content as parts, an id); `at` names it.
fn normalize_item(at: &str, item: Value) -> Result<Value, ApiError> {
    let Value::Object(mut obj) = item else {
        return Err(ApiError::invalid(at, format!("`{at}` must be an object.")));
    };
    let kind = match obj.get("type") {
        None | Some(Value::Null) => "message".to_owned(),
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` must be a string."),
            ))
        }
    };
    let string = |obj: &Map<String, Value>, field: &str| -> Result<String, ApiError> {
        obj.get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("{at}.{field}"),
                    format!("`{at}.{field}` is required and must be a string."),
                )
            })
    };
    match kind.as_str() {
        "message" => {
            let role = string(&obj, "role")?;
            if !["user", "assistant", "system", "developer"].contains(&role.as_str()) {
                return Err(ApiError::invalid(
                    format!("{at}.role"),
                    format!("`{at}.role` is `{role}`; expected user, assistant, system or developer."),
                ));
            }
            let text_kind = if role == "assistant" { "output_text" } else { "input_text" };
            let parts = match obj.remove("content") {
                Some(Value::String(text)) => vec![json!({"type": text_kind, "text": text})],
                Some(Value::Array(parts)) => parts
                    .into_iter()
                    .enumerate()
                    .map(|(j, part)| normalize_part(&format!("{at}.content[{j}]"), part))
                    .collect::<Result<_, _>>()?,
                _ => {
                    return Err(ApiError::invalid(
                        format!("{at}.content"),
                        format!("`{at}.content` is required: a string or a list of parts."),
                    ))
                }
            };
            obj.insert("content".into(), Value::Array(parts));
            obj.insert("role".into(), Value::String(role));
        }
        "function_call" => {
            string(&obj, "call_id")?;
            string(&obj, "name")?;
            match obj.get("arguments") {
                Some(Value::String(_)) => {}
                None | Some(Value::Null) => {
                    obj.insert("arguments".into(), json!("{}"));
                }
                Some(args @ Value::Object(_)) => {
                    let text = args.to_string();
                    obj.insert("arguments".into(), Value::String(text));
                }
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{at}.arguments"),
                        format!("`{at}.arguments` must be a JSON string."),
                    ))
                }
            }
        }
        "function_call_output" => {
            string(&obj, "call_id")?;
            let output = match obj.get("output") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => {
                    return Err(ApiError::invalid(
                        format!("{at}.output"),
                        format!("`{at}.output` is required and must be a string."),
                    ))
                }
            };
            obj.insert("output".into(), Value::String(output));
        }
        "reasoning" => {}
        other => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` is `{other}`; only `message`, `function_call`, `function_call_output` and `reasoning` items are supported."),
            ))
        }
    }
    let prefix = match kind.as_str() {
        "function_call" => "fc",
        "function_call_output" => "fco",
        "reasoning" => "rs",
        _ => "msg",
    };
    if !obj.get("id").is_some_and(Value::is_string) {
        obj.insert("id".into(), Value::String(new_id(prefix)));
    }
    obj.insert("type".into(), Value::String(kind));
    obj.entry("status").or_insert_with(|| json!("completed"));
    Ok(Value::Object(obj))
}

/// A content part: text of some kind is kept; images, files and audio are refused.
fn normalize_part(at: &str, part: Value) -> Result<Value, ApiError> {
    let kind = part
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("input_text");
    match kind {
        "input_text" | "output_text" | "text" => match part.get("text").and_then(Value::as_str) {
            Some(text) => Ok(json!({"type": kind, "text": text})),
            None => Err(ApiError::invalid(
                format!("{at}.text"),
                format!("`{at}` is a text part without `text`."),
            )),
        },
        "refusal" => Ok(part),
        other => Err(ApiError::invalid(
            format!("{at}.type"),
            format!("`{at}` is an `{other}` part: this model reads text only."),
        )),
    }
}

fn message(role: &str, text: String) -> WireMessage {
    WireMessage {
        role: Some(role.to_owned()),
        content: Some(MessageContent::Text(text)),
        ..WireMessage::default()
    }
}

/// Normalised items → chat messages (with each message's origin, for error names): calls
/// join the assistant turn before them, a reasoning item goes with the assistant turn after
/// it, an output becomes a `tool` message named after its call.
fn items_to_messages<'a>(
    items: impl Iterator<Item = (&'a Value, String)>,
    messages: &mut Vec<WireMessage>,
    origins: &mut Vec<String>,
) -> Result<(), ApiError> {
    let mut reasoning: Option<String> = None;
    let mut call_names: Map<String, Value> = Map::new();
    for (item, origin) in items {
        let text_of = |v: &Value| -> String {
            v.as_array()
                .map(|parts| {
                    parts
                        .iter()
                        .filter_map(|p| p.get("text").or_else(|| p.get("refusal")))
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("")
                })
                .unwrap_or_default()
        };
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                let mut m = message(role, text_of(item.get("content").unwrap_or(&Value::Null)));
                if role == "assistant" {
                    m.reasoning_content = reasoning.take();
                }
                messages.push(m);
                origins.push(origin);
            }
            Some("function_call") => {
                let field = |name: &str| item.get(name).cloned().unwrap_or(Value::Null);
                if let (Some(id), Some(name)) = (field("call_id").as_str(), field("name").as_str())
                {
                    call_names.insert(id.to_owned(), json!(name));
                }
                let call = json!({"id": field("call_id"), "type": "function",
                                  "function": {"name": field("name"), "arguments": field("arguments")}});
                // A call belongs to the assistant turn right before it (its text, its
                // other calls), as chat templates expect one turn with `tool_calls`.
                let joins = messages
                    .last()
                    .is_some_and(|m| m.role.as_deref() == Some("assistant"));
                match messages.last_mut().filter(|_| joins) {
                    Some(last) => last.tool_calls.get_or_insert_with(Vec::new).push(call),
                    None => {
                        messages.push(WireMessage {
                            role: Some("assistant".into()),
                            tool_calls: Some(vec![call]),
                            reasoning_content: reasoning.take(),
                            ..WireMessage::default()
                        });
                        origins.push(origin);
                    }
                }
            }
            Some("function_call_output") => {
                let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
                let output = item.get("output").and_then(Value::as_str).unwrap_or("");
                messages.push(WireMessage {
                    role: Some("tool".into()),
                    content: Some(MessageContent::Text(output.to_owned())),
                    tool_call_id: Some(call_id.to_owned()),
                    name: call_names
                        .get(call_id)
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    ..WireMessage::default()
                });
                origins.push(origin);
            }
            Some("reasoning") => {
                let text = text_of(item.get("content").unwrap_or(&Value::Null));
                let text = if text.is_empty() {
                    text_of(item.get("summary").unwrap_or(&Value::Null))
                } else {
                    text
                };
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    origin.clone(),
                    format!("`{origin}` is not an item this server reads."),
                ))
            }
        }
    }
    Ok(())
}

/// A chat rule's error, renamed to the Responses field it is about.
fn rename_param(err: ApiError, origins: &[String]) -> ApiError {
    match err {
        ApiError::InvalidRequest {
            message,
            param: Some(param),
            code,
        } => ApiError::InvalidRequest {
            message,
            param: Some(responses_param(&param, origins)),
            code,
        },
        other => other,
    }
}

fn responses_param(param: &str, origins: &[String]) -> String {
    if param == "messages" {
        return "input".into();
    }
    if let Some(rest) = param.strip_prefix("messages[") {
        let index: Option<usize> = rest.split(']').next().and_then(|i| i.parse().ok());
        return index
            .and_then(|i| origins.get(i))
            .cloned()
            .unwrap_or_else(|| "input".into());
    }
    if param == "max_tokens" || param == "max_completion_tokens" {
        return "max_output_tokens".into();
    }
    if param == "logprobs" {
        return "top_logprobs".into();
    }
    if param == "reasoning_effort" {
        return "reasoning.effort".into();
    }
    if let Some(rest) = param.strip_prefix("response_format") {
        let rest = rest.strip_prefix(".json_schema").unwrap_or(rest);
        return format!("text.format{rest}");
    }
    if param.starts_with("tools[") {
        return param.replacen(".function", "", 1);
    }
    if param == "tool_choice" || param.starts_with("tool_choice.") {
        return param.replace(".function", "");
    }
    param.to_owned()
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
