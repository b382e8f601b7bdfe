//! `POST /v1/embeddings` → an embedding job. OpenAI's rules: `input` is a string, a list of
//! strings, a list of token ids or a list of token-id lists, at most 2048 inputs, none
//! empty; `encoding_format` is `float` or `base64`; `dimensions` only for a model whose
//! vectors may be cut (Matryoshka). Each refusal names its field.

use super::caps::{MAX_PROMPT_BYTES, MAX_PROMPT_TOKEN_IDS};
use crate::error::ApiError;
use crate::openai::embeddings::EmbeddingRequest;
use fallow_protocol::job::{
    EmbedInput, EmbedRequest, EmbeddingFormat, GenerateRequest, OutputFormat, Sampling, Task,
};
use fallow_scheduler::runners::{ModelEntry, ModelKind};
use serde_json::Value;

/// OpenAI's bound on the inputs of one request.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The model asked for, which must be given.
pub fn embedding_model(wire: &EmbeddingRequest) -> Result<String, ApiError> {
    match wire.model.as_deref().map(str::trim) {
        Some(model) if !model.is_empty() => Ok(model.to_owned()),
        _ => Err(ApiError::invalid("model", "`model` is required.")),
    }
}

/// The embedding job `wire` asks of `entry`'s model.
pub fn validate_embeddings(
    wire: EmbeddingRequest,
    entry: &ModelEntry,
) -> Result<GenerateRequest, ApiError> {
    if entry.kind != ModelKind::Embedding {
        return Err(ApiError::invalid(
            "model",
            format!(
                "`{}` is not an embedding model: it answers chat and completions. The models with `kind: \"embedding\"` in `/v1/models` answer here.",
                entry.id
            ),
        ));
    }
    let inputs = validate_input(wire.input)?;
    let base64 = match wire.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`encoding_format` must be `float` or `base64`, not `{other}`."),
            ))
        }
    };
    let dimensions = validate_dimensions(wire.dimensions, entry)?;
    Ok(GenerateRequest {
        model: entry.id.clone(),
        messages: Vec::new(),
        sampling: Sampling::default(),
        n: 1,
        add_generation_prompt: false,
        continue_final_message: false,
        stream: false,
        chat_template_kwargs: Default::default(),
        tools: Vec::new(),
        output: OutputFormat {
            embeddings: Some(EmbeddingFormat { base64, dimensions }),
            ..OutputFormat::default()
        },
        input: Default::default(),
        task: Task::Embed,
        embed: Some(EmbedRequest { inputs }),
        progress: None,
        adapter: None,
    })
}

fn validate_input(input: Option<Value>) -> Result<Vec<EmbedInput>, ApiError> {
    let bad = |message: String| ApiError::invalid("input", message);
    let inputs = match input {
        None | Some(Value::Null) => return Err(bad("`input` is required.".into())),
        Some(Value::String(text)) => vec![text_input(text, "input")?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(bad("`input` must not be an empty list.".into()))
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![EmbedInput::Tokens {
                ids: token_ids(&items, "input")?,
            }]
        }
        Some(Value::Array(items)) => {
            if items.len() > MAX_EMBEDDING_INPUTS {
                return Err(bad(format!(
                    "`input` has {} items; at most {MAX_EMBEDDING_INPUTS} are allowed.",
                    items.len()
                )));
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    let param = format!("input[{i}]");
                    match item {
                        Value::String(text) => text_input(text, &param),
                        Value::Array(ids) => Ok(EmbedInput::Tokens {
                            ids: token_ids(&ids, &param)?,
                        }),
                        _ => Err(ApiError::invalid(
                            param.clone(),
                            format!("`{param}` must be a string or a list of token ids."),
                        )),
                    }
                })
                .collect::<Result<_, _>>()?
        }
        Some(_) => {
            return Err(bad(
                "`input` must be a string, a list of strings, a list of token ids or a list of token-id lists."
                    .into(),
            ))
        }
    };
    let (bytes, ids) = inputs
        .iter()
        .fold((0, 0), |(bytes, ids), input| match input {
            EmbedInput::Text { text } => (bytes + text.len(), ids),
            EmbedInput::Tokens { ids: list } => (bytes, ids + list.len()),
        });
    if bytes > MAX_PROMPT_BYTES {
        return Err(bad(format!(
            "`input` holds {bytes} bytes of text; at most {MAX_PROMPT_BYTES} are allowed."
        )));
    }
    if ids > MAX_PROMPT_TOKEN_IDS {
        return Err(bad(format!(
            "`input` holds {ids} token ids; at most {MAX_PROMPT_TOKEN_IDS} are allowed."
        )));
    }
    Ok(inputs)
}

fn text_input(text: String, param: &str) -> Result<EmbedInput, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be an empty string."),
        ));
    }
    Ok(EmbedInput::Text { text })
}

fn token_ids(items: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must not be an empty list of token ids."),
        ));
    }
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        param,
                        format!("`{param}` holds `{v}`, which is not a token id."),
                    )
                })
        })
        .collect()
}

/// `dimensions`: any length up to the model's, for a model that declares Matryoshka
/// lengths; its own full length for any model.
fn validate_dimensions(
    dimensions: Option<i64>,
    entry: &ModelEntry,
) -> Result<Option<u32>, ApiError> {
    let Some(asked) = dimensions else {
        return Ok(None);
    };
    let full = entry.dimensions.unwrap_or(0);
    if asked < 1 || asked > i64::from(full) {
        return Err(ApiError::invalid(
            "dimensions",
            format!(
                "`dimensions` must be between 1 and {full}, the length of `{}`'s vectors.",
                entry.id
            ),
        ));
    }
    if asked != i64::from(full) && entry.matryoshka_dimensions.is_empty() {
        return Err(ApiError::invalid(
            "dimensions",
            format!(
                "`{}` does not support `dimensions`: its vectors were not trained to be cut (no Matryoshka dimensions declared).",
                entry.id
            ),
        ));
    }
    Ok(Some(asked as u32))
}
