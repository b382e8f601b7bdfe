//! Structured outputs at the boundary: `response_format` (OpenAI), `regex` and `ebnf`
//! (SGLang) become one validated [`Constraint`], and `stop_regex` a list of checked
//! patterns. Every constraint is compiled here, without a model, so a schema llguidance
//! cannot enforce or a malformed regex or grammar is a 400 naming the parameter, never a
//! job that fails on a runner.

use fallow_protocol::job::Constraint;
use serde_json::Value;

use super::caps::{
    json_len, too_many_bytes, MAX_CONSTRAINT_BYTES, MAX_STOP_REGEXES, MAX_STOP_REGEX_BYTES,
};
use super::gbnf::gbnf_to_lark;
use crate::error::ApiError;
use crate::openai::request::ChatCompletionRequest;

/// The request's constraint, if it asks for one. At most one of `response_format`
/// (`json_object` / `json_schema`), `regex` and `ebnf` may be set.
pub(super) fn validate_constraint(
    wire: &ChatCompletionRequest,
) -> Result<Option<Constraint>, ApiError> {
    check_sizes(wire)?;
    let mut found: Vec<(&'static str, Constraint)> = Vec::new();
    if let Some(c) = response_format(wire.response_format.as_ref())? {
        found.push(("response_format", c));
    }
    if let Some(pattern) = &wire.regex {
        found.push((
            "regex",
            Constraint::Regex {
                pattern: pattern.clone(),
            },
        ));
    }
    if let Some(ebnf) = &wire.ebnf {
        let grammar = gbnf_to_lark(ebnf).map_err(|e| {
            error(
                "ebnf",
                "invalid_grammar",
                format!("`ebnf` is not a valid GBNF grammar: {e}."),
            )
        })?;
        found.push(("ebnf", Constraint::Lark { grammar }));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(name, _)| *name).collect();
        return Err(error(
            names[1],
            "conflicting_constraints",
            format!(
                "Only one of `response_format` (json_object/json_schema), `regex` and `ebnf` \
                 may be set; got {}.",
                names.join(", ")
            ),
        ));
    }
    let Some((param, constraint)) = found.pop() else {
        return Ok(None);
    };
    if let Err(message) = fallow_protocol::grammar::check(&constraint) {
        return Err(compile_error(param, &constraint, &message));
    }
    Ok(Some(constraint))
}

/// Each constraint at most [`MAX_CONSTRAINT_BYTES`] (a schema as compact JSON), checked
/// before anything compiles it: compiling is work for the api and the engine, and every
/// job of the request stores a copy.
fn check_sizes(wire: &ChatCompletionRequest) -> Result<(), ApiError> {
    let sizes = [
        (
            "response_format",
            wire.response_format.as_ref().map(json_len),
        ),
        ("regex", wire.regex.as_ref().map(String::len)),
        ("ebnf", wire.ebnf.as_ref().map(String::len)),
    ];
    for (param, bytes) in sizes {
        if let Some(bytes) = bytes.filter(|&b| b > MAX_CONSTRAINT_BYTES) {
            return Err(too_many_bytes(param, "is", bytes, MAX_CONSTRAINT_BYTES));
        }
    }
    Ok(())
}

/// `response_format`: `text` (or absent) is no constraint.
fn response_format(format: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let invalid = |message: String| error("response_format", "invalid_response_format", message);
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let spec = format
                .get("json_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    invalid(
                        "`response_format.json_schema` must be an object with a `schema`.".into(),
                    )
                })?;
            let schema = spec.get("schema").cloned().ok_or_else(|| {
                invalid("`response_format.json_schema.schema` is required.".into())
            })?;
            if !schema.is_object() && !schema.is_boolean() {
                return Err(invalid(
                    "`response_format.json_schema.schema` must be a JSON schema object.".into(),
                ));
            }
            let strict = match spec.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(invalid(
                        "`response_format.json_schema.strict` must be a boolean.".into(),
                    ))
                }
            };
            Ok(Some(Constraint::JsonSchema { schema, strict }))
        }
        Some(other) => Err(invalid(format!(
            "`response_format.type` must be `text`, `json_object` or `json_schema`, got `{other}`."
        ))),
        None => Err(invalid(
            "`response_format` must be an object with a string `type`.".into(),
        )),
    }
}

/// llguidance's complaint, with a code that says which kind of problem it is.
/// A forced tool call's grammar (`tool_choice: "required"` or a named function, built by
/// `parsers::grammar`) as the request's constraint, compiled here like the others: a tool
/// whose parameters schema cannot be enforced is a 400 naming `tools`.
pub(super) fn forced_call_constraint(grammar: String) -> Result<Constraint, ApiError> {
    let constraint = Constraint::Lark { grammar };
    if let Err(message) = fallow_protocol::grammar::check(&constraint) {
        let code = if message.contains("Unimplemented keys") {
            "unsupported_schema_feature"
        } else {
            "invalid_tool_schema"
        };
        return Err(error(
            "tools",
            code,
            format!("A tool's `parameters` schema cannot be enforced for a forced call: {message}"),
        ));
    }
    Ok(constraint)
}

fn compile_error(param: &'static str, constraint: &Constraint, message: &str) -> ApiError {
    let (code, what) = match constraint {
        Constraint::JsonSchema { .. } | Constraint::JsonObject
            if message.contains("Unimplemented keys") =>
        {
            (
                "unsupported_schema_feature",
                "uses a JSON schema feature that cannot be enforced",
            )
        }
        Constraint::JsonSchema { .. } | Constraint::JsonObject => (
            "invalid_json_schema",
            "is not a JSON schema that can be enforced",
        ),
        Constraint::Regex { .. } => ("invalid_regex", "is not a valid regular expression"),
        Constraint::Lark { .. } => ("invalid_grammar", "is not a valid grammar"),
    };
    error(param, code, format!("`{param}` {what}: {message}"))
}

/// `stop_regex`: one pattern or a list, each a valid regex (Rust `regex` syntax).
pub(super) fn validate_stop_regex(wire: &ChatCompletionRequest) -> Result<Vec<String>, ApiError> {
    let patterns = wire
        .stop_regex
        .clone()
        .map(|s| s.into_vec())
        .unwrap_or_default();
    if patterns.len() > MAX_STOP_REGEXES {
        return Err(error(
            "stop_regex",
            "too_many_stop_regexes",
            format!(
                "`stop_regex` has {} patterns; at most {MAX_STOP_REGEXES} are allowed.",
                patterns.len()
            ),
        ));
    }
    for pattern in &patterns {
        if pattern.is_empty() {
            return Err(error(
                "stop_regex",
                "invalid_regex",
                "`stop_regex` patterns must not be empty (one would match at once).",
            ));
        }
        if pattern.len() > MAX_STOP_REGEX_BYTES {
            return Err(super::caps::too_many_bytes(
                "stop_regex",
                "has a pattern of",
                pattern.len(),
                MAX_STOP_REGEX_BYTES,
            ));
        }
        if let Err(e) = regex::Regex::new(pattern) {
            return Err(error(
                "stop_regex",
                "invalid_regex",
                format!("`stop_regex` {pattern:?} is not a valid regular expression: {e}"),
            ));
        }
    }
    Ok(patterns)
}

fn error(param: &str, code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::InvalidRequest {
        message: message.into(),
        param: Some(param.to_string()),
        code: Some(code),
    }
}
