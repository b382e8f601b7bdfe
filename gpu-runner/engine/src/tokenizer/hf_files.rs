//! Building a [`Tokenizer`] from a Hugging Face model directory: `tokenizer.json` (run by
//! the `tokenizers` crate, which matches added tokens itself) and the optional
//! `tokenizer_config.json` (BOS/EOS, `add_bos_token`, chat template).

use std::path::Path;

use serde_json::Value;

use super::codec::{Parts, TextEncoder, Tokenizer};
use super::error::TokenizerError;
use super::table::{parse_byte_token, PieceStyle, TokenKind, TokenTable};

impl Tokenizer {
    /// Loads `tokenizer.json` and, when given, `tokenizer_config.json`.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config: Option<&Path>,
    ) -> Result<Self, TokenizerError> {
        let raw = read(tokenizer_json)?;
        let hf = tokenizers::Tokenizer::from_bytes(raw.as_bytes()).map_err(|e| {
            TokenizerError::InvalidFile {
                path: tokenizer_json.to_path_buf(),
                message: e.to_string(),
            }
        })?;
        let json = parse(tokenizer_json, &raw)?;
        let config = match tokenizer_config {
            Some(path) => parse(path, &read(path)?)?,
            None => Value::Null,
        };
        let style = if contains_type(&json["decoder"], "ByteLevel")
            || contains_type(&json["pre_tokenizer"], "ByteLevel")
        {
            PieceStyle::ByteLevel
        } else {
            PieceStyle::SentencePiece
        };
        let table = token_table(&hf, style);
        let id_of = |text: Option<String>| text.and_then(|t| hf.token_to_id(&t));
        let template_bos = template_bos(&json);
        let bos = id_of(special_text(&config["bos_token"])).or_else(|| id_of(template_bos.clone()));
        let add_bos = config["add_bos_token"]
            .as_bool()
            .unwrap_or(template_bos.is_some());
        Ok(Self::from_parts(Parts {
            table,
            bos,
            eos: id_of(special_text(&config["eos_token"])),
            extra_eog: Vec::new(),
            add_bos,
            add_space_prefix: adds_space_prefix(&json),
            chat_template: chat_template(&config["chat_template"]),
            encoder: TextEncoder::Hf(Box::new(hf)),
        }))
    }
}

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse(path: &Path, raw: &str) -> Result<Value, TokenizerError> {
    serde_json::from_str(raw).map_err(|e| TokenizerError::InvalidFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Every id's text and kind; added tokens are control (special) or user-defined.
fn token_table(hf: &tokenizers::Tokenizer, style: PieceStyle) -> TokenTable {
    let vocab = hf.get_vocab(true);
    let n = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    let mut texts = vec![String::new(); n];
    let mut kinds = vec![TokenKind::Unused; n];
    for (text, id) in vocab {
        let kind = if style == PieceStyle::SentencePiece && parse_byte_token(&text).is_some() {
            TokenKind::Byte
        } else {
            TokenKind::Normal
        };
        kinds[id as usize] = kind;
        texts[id as usize] = text;
    }
    for (id, added) in hf.get_added_tokens_decoder() {
        let Some(slot) = kinds.get_mut(id as usize) else {
            continue;
        };
        *slot = if added.special {
            TokenKind::Control
        } else {
            TokenKind::UserDefined
        };
        texts[id as usize] = added.content.clone();
    }
    TokenTable::new(texts, kinds, style)
}

/// `"<s>"` or `{"content": "<s>", ...}` (AddedToken form) in `tokenizer_config.json`.
fn special_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The special token a `TemplateProcessing` post-processor puts before single sequences
/// (Llama 3's `<|begin_of_text|>`), i.e. the BOS the tokenizer adds by itself.
fn template_bos(json: &Value) -> Option<String> {
    let processor = &json["post_processor"];
    let processor = match processor["type"].as_str() {
        Some("Sequence") => processor["processors"]
            .as_array()?
            .iter()
            .find(|p| p["type"] == "TemplateProcessing")?,
        Some("TemplateProcessing") => processor,
        _ => return None,
    };
    let first = processor["single"].as_array()?.first()?;
    first["SpecialToken"]["id"].as_str().map(str::to_string)
}

/// Whether text gets a `▁` prepended (Llama 2 style `Prepend` normalizer or a `Metaspace`
/// pre-tokenizer that prepends).
fn adds_space_prefix(json: &Value) -> bool {
    let prepend = find_types(&json["normalizer"], "Prepend")
        .iter()
        .any(|n| n["prepend"] == "\u{2581}");
    let metaspace = find_types(&json["pre_tokenizer"], "Metaspace")
        .iter()
        .any(|m| {
            matches!(m["prepend_scheme"].as_str(), Some("always" | "first"))
                || m["add_prefix_space"] == true
        });
    prepend || metaspace
}

/// The chat template: a string, or a list of named templates (we take "default").
fn chat_template(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .or_else(|| list.first())
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

fn contains_type(value: &Value, ty: &str) -> bool {
    !find_types(value, ty).is_empty()
}

/// All objects with `"type": ty` in a (possibly nested `Sequence`) component.
fn find_types<'a>(value: &'a Value, ty: &str) -> Vec<&'a Value> {
    let mut found = Vec::new();
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if o.get("type").and_then(Value::as_str) == Some(ty) {
                    found.push(v);
                }
                stack.extend(o.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}
