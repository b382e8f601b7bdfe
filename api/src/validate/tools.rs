//! Tools on the wire: `tools` + `tool_choice` + `parallel_tool_calls`, and the legacy
//! `functions` + `function_call`. Each tool is checked where a client can fix it (the error
//! names `tools[i].function.name`, `tool_choice`, …); what passes becomes the list the chat
//! template reads (Hugging Face's `tools` shape) and the tool part of the job's output
//! format.

use super::caps::{
    json_len, too_many, too_many_bytes, MAX_TOOLS, MAX_TOOLS_TOTAL_BYTES, MAX_TOOL_BYTES,
};
use crate::error::ApiError;
use crate::openai::request::ChatCompletionRequest;
use crate::parsers::grammar::FunctionSpec;
use serde_json::{json, Map, Value};

/// The syntax assumed for a model whose runner published none: Hermes-style
/// `<tool_call>` blocks are what most tool-capable templates ask for.
pub const DEFAULT_TOOL_PARSER: &str = "hermes";

/// Whether and how the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A request's validated tools.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// `{"type": "function", "function": {…}}` per tool, as sent.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// More than one call per turn allowed (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// Sent as legacy `functions`: answered with `function_call`.
    pub legacy: bool,
}

impl ToolRequest {
    /// Whether a turn may hold more than one call: `parallel_tool_calls`, except that a
    /// named `tool_choice` asks for exactly one call of that function.
    pub fn several_calls(&self) -> bool {
        self.parallel && !matches!(self.choice, ToolChoice::Named(_))
    }

    /// The functions a forced call may use: all for `required`, the named one otherwise;
    /// empty when the model is free not to call.
    pub fn forced_functions(&self) -> Vec<FunctionSpec<'_>> {
        let wanted = |name: &str| match &self.choice {
            ToolChoice::Required => true,
            ToolChoice::Named(chosen) => chosen == name,
            ToolChoice::None | ToolChoice::Auto => false,
        };
        self.tools
            .iter()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                let name = function.get("name")?.as_str()?;
                wanted(name).then(|| FunctionSpec {
                    name,
                    parameters: function.get("parameters"),
                })
            })
            .collect()
    }
}

/// The request's tools, or `None` when it offers none.
pub fn validate_tools(wire: &ChatCompletionRequest) -> Result<Option<ToolRequest>, ApiError> {
    let tools = wire.tools.as_deref().unwrap_or_default();
    let functions = wire.functions.as_deref().unwrap_or_default();
    if !tools.is_empty() && !functions.is_empty() {
        return Err(ApiError::invalid(
            "functions",
            "Send either `tools` or the legacy `functions`, not both.",
        ));
    }
    check_size("tools", tools)?;
    check_size("functions", functions)?;
    if !functions.is_empty() {
        let tools = functions
            .iter()
            .enumerate()
            .map(|(i, f)| Ok(json!({"type": "function", "function": function(&format!("functions[{i}]"), f)?})))
            .collect::<Result<Vec<_>, ApiError>>()?;
        check_unique(&tools, "functions", "")?;
        let choice = legacy_choice(wire.function_call.as_ref(), &tools)?;
        return Ok(Some(ToolRequest {
            tools,
            choice,
            parallel: false,
            legacy: true,
        }));
    }
    if wire.function_call.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(ApiError::invalid(
            "function_call",
            "`function_call` is only allowed together with `functions`.",
        ));
    }
    let choice = wire.tool_choice.as_ref().filter(|c| !c.is_null());
    if tools.is_empty() {
        return match choice.map(parse_tool_choice).transpose()? {
            None | Some(ToolChoice::None) | Some(ToolChoice::Auto) => Ok(None),
            Some(_) => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` requires `tools`: there is no tool to call.",
            )),
        };
    }
    let tools = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| wrapped_tool(i, tool))
        .collect::<Result<Vec<_>, ApiError>>()?;
    check_unique(&tools, "tools", ".function")?;
    let choice = match choice {
        Some(choice) => parse_tool_choice(choice)?,
        None => ToolChoice::Auto,
    };
    if let ToolChoice::Named(name) = &choice {
        if !has_function(&tools, name) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("`tool_choice` names the function `{name}`, which is not among `tools`."),
            ));
        }
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel: wire.parallel_tool_calls.unwrap_or(true),
        legacy: false,
    }))
}

/// At most [`MAX_TOOLS`] definitions, each at most [`MAX_TOOL_BYTES`] and all together at
/// most [`MAX_TOOLS_TOTAL_BYTES`] of compact JSON: the template renders them into the
/// prompt and a forced call compiles their schemas.
fn check_size(param: &str, tools: &[Value]) -> Result<(), ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(too_many(param, "definitions", tools.len(), MAX_TOOLS));
    }
    let mut total = 0;
    for (i, tool) in tools.iter().enumerate() {
        let bytes = json_len(tool);
        if bytes > MAX_TOOL_BYTES {
            let at = format!("{param}[{i}]");
            return Err(too_many_bytes(&at, "is", bytes, MAX_TOOL_BYTES));
        }
        total += bytes;
    }
    if total > MAX_TOOLS_TOTAL_BYTES {
        return Err(too_many_bytes(param, "total", total, MAX_TOOLS_TOTAL_BYTES));
    }
    Ok(())
}

fn wrapped_tool(i: usize, tool: &Value) -> Result<Value, ApiError> {
    let at = format!("tools[{i}]");
    let Some(tool) = tool.as_object() else {
        return Err(ApiError::invalid(&at, format!("`{at}` must be an object.")));
    };
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` is `{other}`; only `function` tools are supported."),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` is required and must be `function`."),
            ))
        }
    }
    let Some(f) = tool.get("function") else {
        return Err(ApiError::invalid(
            format!("{at}.function"),
            format!("`{at}.function` is required."),
        ));
    };
    Ok(json!({"type": "function", "function": function(&format!("{at}.function"), f)?}))
}

/// Checks one function definition (`at` names it in errors) and returns it as sent.
fn function(at: &str, f: &Value) -> Result<Value, ApiError> {
    let Some(f) = f.as_object() else {
        return Err(ApiError::invalid(at, format!("`{at}` must be an object.")));
    };
    let name_at = format!("{at}.name");
    match f.get("name").and_then(Value::as_str) {
        Some(name) if valid_name(name) => {}
        Some(name) => {
            return Err(ApiError::invalid(
                &name_at,
                format!(
                "`{name_at}` is `{name}`; a function name is 1 to 64 letters, digits, `_` or `-`."
            ),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                &name_at,
                format!("`{name_at}` is required and must be a string."),
            ))
        }
    }
    if f.get("description")
        .is_some_and(|d| !d.is_string() && !d.is_null())
    {
        return Err(ApiError::invalid(
            format!("{at}.description"),
            format!("`{at}.description` must be a string."),
        ));
    }
    if let Some(parameters) = f.get("parameters").filter(|p| !p.is_null()) {
        check_parameters(&format!("{at}.parameters"), parameters)?;
    }
    if f.get("strict")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(ApiError::invalid(
            format!("{at}.strict"),
            format!("`{at}.strict` must be a boolean."),
        ));
    }
    Ok(Value::Object(f.clone()))
}

/// `parameters` is a JSON Schema for an object of arguments.
fn check_parameters(at: &str, parameters: &Value) -> Result<(), ApiError> {
    let Some(schema) = parameters.as_object() else {
        return Err(ApiError::invalid(
            at,
            format!("`{at}` must be a JSON Schema object."),
        ));
    };
    if let Some(kind) = schema.get("type") {
        if kind.as_str() != Some("object") {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("`{at}.type` must be `object`: arguments are a JSON object."),
            ));
        }
    }
    if let Some(properties) = schema.get("properties") {
        if !properties.is_object() {
            return Err(ApiError::invalid(
                format!("{at}.properties"),
                format!("`{at}.properties` must be an object."),
            ));
        }
    }
    if let Some(required) = schema.get("required") {
        if !required
            .as_array()
            .is_some_and(|r| r.iter().all(Value::is_string))
        {
            return Err(ApiError::invalid(
                format!("{at}.required"),
                format!("`{at}.required` must be a list of property names."),
            ));
        }
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn function_name(tool: &Value) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

fn has_function(tools: &[Value], name: &str) -> bool {
    tools.iter().any(|t| function_name(t) == Some(name))
}

/// Two functions of one name could not be told apart in a call.
fn check_unique(tools: &[Value], list: &str, inner: &str) -> Result<(), ApiError> {
    for (i, tool) in tools.iter().enumerate() {
        let name = function_name(tool).unwrap_or_default();
        if tools[..i].iter().any(|t| function_name(t) == Some(name)) {
            return Err(ApiError::invalid(
                format!("{list}[{i}]{inner}.name"),
                format!("The function name `{name}` appears more than once in `{list}`."),
            ));
        }
    }
    Ok(())
}

fn parse_tool_choice(choice: &Value) -> Result<ToolChoice, ApiError> {
    let invalid = || {
        ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be `none`, `auto`, `required` or {\"type\": \"function\", \"function\": {\"name\": …}}.",
        )
    };
    match choice {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            _ => Err(invalid()),
        },
        Value::Object(obj) => {
            if obj.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid());
            }
            named(obj.get("function").and_then(Value::as_object)).ok_or_else(invalid)
        }
        _ => Err(invalid()),
    }
}

fn named(function: Option<&Map<String, Value>>) -> Option<ToolChoice> {
    let name = function?.get("name")?.as_str()?;
    Some(ToolChoice::Named(name.to_owned()))
}

/// `function_call`: `none`, `auto` or `{"name": …}` (default `auto`).
fn legacy_choice(choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let choice = match choice.filter(|c| !c.is_null()) {
        None => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::Object(obj)) => named(Some(obj)).ok_or_else(|| {
            ApiError::invalid(
                "function_call",
                "`function_call` must be `none`, `auto` or {\"name\": …}.",
            )
        })?,
        Some(_) => {
            return Err(ApiError::invalid(
                "function_call",
                "`function_call` must be `none`, `auto` or {\"name\": …}.",
            ))
        }
    };
    if let ToolChoice::Named(name) = &choice {
        if !has_function(tools, name) {
            return Err(ApiError::invalid(
                "function_call",
                format!(
                    "`function_call` names the function `{name}`, which is not among `functions`."
                ),
            ));
        }
    }
    Ok(choice)
}
