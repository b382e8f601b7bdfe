//! Which served model a request names: a base model, or a LoRA adapter over one.
//!
//! An adapter is asked for as `model: "BASE:NAME"` (SGLang's syntax), as `model: "NAME"`
//! when one base has an adapter of that name, or as a base model with SGLang's `lora_path`:
//! a relative path the runner reads inside its `--lora-dir`. The job then runs on the base's
//! engine, in the adapter's queue (see `fallow_protocol::adapter`).

use crate::error::ApiError;
use fallow_protocol::adapter::{base_of, AdapterRef};
use fallow_protocol::job::GenerateRequest;
use fallow_scheduler::runners::{ModelEntry, ModelKind};
use serde_json::Value;
use std::path::{Component, Path};

/// The longest `lora_path` accepted.
const MAX_LORA_PATH: usize = 1024;

/// A request's model as runners serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// The base model's id: the engine that runs the job.
    pub base: String,
    pub adapter: Option<AdapterRef>,
}

impl ServedModel {
    /// Points a validated request at the base model and its adapter.
    pub fn apply(&self, request: &mut GenerateRequest) {
        request.model = self.base.clone();
        request.adapter = self.adapter.clone();
    }
}

/// The live entry whose limits and output syntax apply to `model` (an adapter's carries its
/// base's), and the model as runners serve it. 404 for a name no runner serves; 400 for a
/// `lora_path` that is not a plain relative path, names an adapter twice, or that no runner
/// of the base can read.
pub fn resolve<'a>(
    models: &'a [ModelEntry],
    model: &str,
    lora_path: Option<&Value>,
) -> Result<(&'a ModelEntry, ServedModel), ApiError> {
    let lora_path = parse_lora_path(lora_path)?;
    let entry = find(models, model)?;
    let served = match (&entry.parent, lora_path) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "lora_path",
                format!("`{model}` is already a LoRA adapter; `lora_path` goes with a base model."),
            ))
        }
        (None, Some(path)) => {
            if entry.kind != ModelKind::Chat || !entry.lora_dir {
                return Err(ApiError::invalid(
                    "lora_path",
                    format!(
                        "No runner serving `{}` reads LoRA adapters from a directory \
                         (`--lora-dir`), so `lora_path` cannot be served over it.",
                        entry.id
                    ),
                ));
            }
            ServedModel {
                base: entry.id.clone(),
                adapter: Some(AdapterRef::at_path(path)),
            }
        }
        (Some(base), None) => ServedModel {
            base: base.clone(),
            adapter: Some(AdapterRef {
                name: adapter_name(&entry.id, base).to_owned(),
                // An adapter an operator loaded is read from the runners' lora dir.
                lora_path: entry.lora_path.clone(),
            }),
        },
        (None, None) => ServedModel {
            base: entry.id.clone(),
            adapter: None,
        },
    };
    Ok((entry, served))
}

/// [`resolve`] when no runner is known to serve anything (none is up): read from the
/// syntax alone, so a batch waits for its runners instead of failing.
pub fn resolve_unseen(model: &str, lora_path: Option<&Value>) -> Result<ServedModel, ApiError> {
    let lora_path = parse_lora_path(lora_path)?;
    let base = base_of(model);
    Ok(match lora_path {
        Some(path) => ServedModel {
            base: model.to_owned(),
            adapter: Some(AdapterRef::at_path(path)),
        },
        None if base != model => ServedModel {
            base: base.to_owned(),
            adapter: Some(AdapterRef::named(adapter_name(model, base))),
        },
        None => ServedModel {
            base: model.to_owned(),
            adapter: None,
        },
    })
}

/// The entry `model` names: by id (`BASE:NAME` for an adapter), or an adapter's bare name
/// when exactly one base has an adapter of that name.
fn find<'a>(models: &'a [ModelEntry], model: &str) -> Result<&'a ModelEntry, ApiError> {
    if let Some(entry) = models.iter().find(|m| m.id == model) {
        return Ok(entry);
    }
    let named: Vec<&ModelEntry> = models
        .iter()
        .filter(|m| {
            m.parent
                .as_deref()
                .is_some_and(|base| adapter_name(&m.id, base) == model)
        })
        .collect();
    match named.as_slice() {
        [entry] => Ok(entry),
        [] => Err(ApiError::ModelNotFound(model.to_owned())),
        several => {
            let ids: Vec<&str> = several.iter().map(|m| m.id.as_str()).collect();
            Err(ApiError::invalid(
                "model",
                format!(
                    "`{model}` names a LoRA adapter of several base models; ask for one of {}.",
                    ids.join(", ")
                ),
            ))
        }
    }
}

/// The adapter's name within its id `BASE:NAME`.
fn adapter_name<'a>(id: &'a str, base: &str) -> &'a str {
    id.strip_prefix(base)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or(id)
}

/// `lora_path` when it is a plain relative path: what a runner may look for inside its
/// `--lora-dir` (the runner checks again where links lead).
pub(crate) fn parse_lora_path(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    let path = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(path)) => path.trim(),
        Some(_) => {
            return Err(ApiError::invalid(
                "lora_path",
                "`lora_path` must be a string: a path inside the server's LoRA directory.",
            ))
        }
    };
    let plain = Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    let printable = !path.chars().any(|c| c.is_control() || c == '\\');
    if path.is_empty() || path.len() > MAX_LORA_PATH || !plain || !printable {
        return Err(ApiError::invalid(
            "lora_path",
            format!(
                "`lora_path` {path:?} must be a relative path inside the server's LoRA \
                 directory, without `..`, at most {MAX_LORA_PATH} bytes."
            ),
        ));
    }
    Ok(Some(path.to_owned()))
}

#[cfg(test)]
#[path = "adapter_tests.rs"]
mod tests;
