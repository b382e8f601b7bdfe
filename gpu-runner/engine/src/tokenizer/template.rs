//! [`ChatTemplate`]: renders chat messages into a prompt with the model's Hugging Face Jinja
//! chat template, on minijinja set up to behave like transformers' `apply_chat_template`:
//! `trim_blocks` + `lstrip_blocks`, loop controls, Python string/dict methods, a
//! `json.dumps`-compatible `tojson`, `raise_exception` and `strftime_now`.

use std::collections::BTreeMap;
use std::fmt::Write;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Map;

use super::pyjson::{dumps, DumpOptions};

const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source is not valid Jinja.
    #[error("invalid chat template: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`, usually to reject the conversation.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed (undefined values, type errors, ...).
    #[error("chat template failed: {0}")]
    Render(String),
    /// `continue_final_message` could not find the final message in the rendered prompt.
    #[error("continue_final_message: {0}")]
    ContinueFinalMessage(String),
}

/// The message of a `raise_exception` call, carried as the source of a minijinja error so it
/// can be told apart from minijinja's own errors.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// A compiled chat template with the tokenizer's BOS and EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; syntax errors are reported here rather than on first use.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders `messages` (OpenAI-style objects with `role` and `content`). `extra` holds
    /// template kwargs such as `enable_thinking`. With `continue_final_message` the prompt ends
    /// right after the final message's content, so the model continues it.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        extra: &Map<String, serde_json::Value>,
        continue_final_message: bool,
    ) -> Result<String, TemplateError> {
        let mut ctx: BTreeMap<String, Value> = extra
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
            .collect();
        ctx.entry("documents".into()).or_insert(Value::from(()));
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt && !continue_final_message),
        );
        ctx.insert(
            "tools".into(),
            tools.map_or(Value::from(()), Value::from_serialize),
        );
        ctx.insert("bos_token".into(), Value::from(self.bos.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos.as_str()));

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        let rendered = match template.render(&ctx).map_err(|e| render_error(&e)) {
            Ok(rendered) => rendered,
            Err(TemplateError::Render(message))
                if messages.iter().any(has_null_content) || lacks_description(tools) =>
            {
                // gpt-oss's template tests `'…' in message.content`, which fails on the
                // `null` content of a turn that only called tools, and writes
                // `"// " + tool.description`, which fails on a function without one (OpenAI
                // makes it optional). As llama.cpp does for content, such templates get an
                // empty text instead. The first error stands if that fails too.
                let texts: Vec<serde_json::Value> = messages.iter().map(with_text).collect();
                ctx.insert("messages".into(), Value::from_serialize(&texts));
                if let Some(tools) = tools.and_then(serde_json::Value::as_array) {
                    let described: Vec<serde_json::Value> =
                        tools.iter().map(with_description).collect();
                    ctx.insert("tools".into(), Value::from_serialize(&described));
                }
                template
                    .render(&ctx)
                    .map_err(|_| TemplateError::Render(message))?
            }
            Err(e) => return Err(e),
        };
        if continue_final_message {
            return cut_after_final_message(rendered, messages);
        }
        Ok(rendered)
    }
}

fn has_null_content(message: &serde_json::Value) -> bool {
    message
        .get("content")
        .is_some_and(serde_json::Value::is_null)
}

/// `message` with a `null` content replaced by an empty text.
fn with_text(message: &serde_json::Value) -> serde_json::Value {
    let mut message = message.clone();
    if has_null_content(&message) {
        message["content"] = serde_json::Value::String(String::new());
    }
    message
}

/// Whether a function tool (`{"type": "function", "function": {…}}`) has no `description`.
fn lacks_description(tools: Option<&serde_json::Value>) -> bool {
    tools
        .and_then(serde_json::Value::as_array)
        .is_some_and(|tools| {
            tools.iter().any(|tool| {
                tool.get("function")
                    .and_then(serde_json::Value::as_object)
                    .is_some_and(|function| !function.contains_key("description"))
            })
        })
}

/// `tool` with an empty `function.description` where it has none.
fn with_description(tool: &serde_json::Value) -> serde_json::Value {
    let mut tool = tool.clone();
    if let Some(function) = tool
        .get_mut("function")
        .and_then(serde_json::Value::as_object_mut)
    {
        function
            .entry("description")
            .or_insert_with(|| serde_json::Value::String(String::new()));
    }
    tool
}

/// Like transformers: find the final message's text in the prompt and cut right after it,
/// keeping its trailing whitespace only when the template kept it too.
fn cut_after_final_message(
    rendered: String,
    messages: &[serde_json::Value],
) -> Result<String, TemplateError> {
    let content = messages
        .last()
        .and_then(final_text)
        .ok_or_else(|| TemplateError::ContinueFinalMessage("no final message with text".into()))?;
    let stripped = content.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(TemplateError::ContinueFinalMessage(
            "the final message does not appear in the rendered prompt".into(),
        ));
    };
    let lstripped = content.trim_start();
    let end = if rendered[at..].starts_with(lstripped) {
        at + lstripped.len()
    } else {
        at + stripped.len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

/// The text of a message: its string content, or the last text part of a content list.
fn final_text(message: &serde_json::Value) -> Option<String> {
    match message.get("content")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(parts) => parts
            .iter()
            .rev()
            .find_map(|p| p.get("text").and_then(|t| t.as_str()).map(str::to_string)),
        _ => None,
    }
}

fn render_error(e: &Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(raised) = err.downcast_ref::<RaisedException>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = err.source();
    }
    TemplateError::Render(describe(e))
}

/// The error with its location, e.g. `undefined value (in chat_template:3)`.
fn describe(e: &Error) -> String {
    e.to_string()
}

/// Prints values as Python's Jinja does: `None` rather than minijinja's `none` (a tool-call
/// message with `content: null` renders "None" in the prompts models were trained on).
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    if value.is_none() {
        return out.write_str("None").map_err(Error::from);
    }
    minijinja::escape_formatter(out, state, value)
}

/// `raise_exception(message)`: templates use it to reject conversations they cannot render.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(
        Error::new(ErrorKind::InvalidOperation, "raise_exception called")
            .with_source(RaisedException(message)),
    )
}

/// `strftime_now(format)`: the current local time, as Python's `strftime` formats it.
fn strftime_now(format: String) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now: cannot format"))?;
    Ok(out)
}

/// `tojson(indent=None, ensure_ascii=False, separators=None, sort_keys=False)`, as
/// transformers defines it (an `indent` may also be passed positionally).
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut options = DumpOptions::default();
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    if let Some(unit) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        let unit = match unit.as_i64() {
            Some(n) => " ".repeat(usize::try_from(n).unwrap_or(0)),
            None => unit.as_str().unwrap_or_default().to_string(),
        };
        options = options.with_indent(unit);
    }
    if let Some(ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        options.ensure_ascii = ascii;
    }
    if let Some(sort) = kwargs.get::<Option<bool>>("sort_keys")? {
        options.sort_keys = sort;
    }
    if let Some(separators) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if let [item, key] = separators.as_slice() {
            options.item_separator = item.clone();
            options.key_separator = key.clone();
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(dumps(&json, &options)))
}
