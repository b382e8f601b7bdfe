//! Reads a PEFT LoRA directory (`adapter_config.json` + `adapter_model.safetensors`) into a
//! [`LoraAdapter`] for one base model, refusing what Fallow cannot apply exactly: DoRA,
//! `fan_in_fan_out`, trained biases, `modules_to_save`, per-module rank or alpha patterns,
//! and embedding or LM-head targets.
//!
//! The scaling (`alpha / r`, or `alpha / √r` with rank-stabilised LoRA) is folded into B.
//! Llama-architecture GGUF bases store Q/K rows permuted for interleaved RoPE, so B's rows
//! of those projections are permuted the same way here.

use std::path::Path;

use serde_json::Value;

use super::pairs::{Assembly, Half, RowOrder};
use super::{LayerLora, LoraAdapter, LoraError, LoraPrecision, Target};
use crate::model::safetensors::SafetensorsFile;
use crate::model::ModelConfig;

/// The adapter's configuration, as far as it changes what the weights mean.
#[derive(Debug, Clone, PartialEq)]
pub struct PeftConfig {
    pub rank: usize,
    pub scaling: f32,
    pub targets: Vec<Target>,
}

/// Reads and checks `dir`'s adapter for the base `config`, held in f16 as served.
pub fn load(dir: &Path, name: &str, config: &ModelConfig) -> Result<LoraAdapter, LoraError> {
    load_as(dir, name, config, LoraPrecision::default())
}

/// [`load`], holding the weights in `precision`.
pub fn load_as(
    dir: &Path,
    name: &str,
    config: &ModelConfig,
    precision: LoraPrecision,
) -> Result<LoraAdapter, LoraError> {
    let read = |path: &Path, why: String| LoraError::Read {
        path: path.display().to_string(),
        why,
    };
    let config_path = dir.join("adapter_config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| read(&config_path, e.to_string()))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| LoraError::Malformed(format!("adapter_config.json: {e}")))?;
    let peft = parse_config(&json)?;
    let weights_path = dir.join("adapter_model.safetensors");
    if !weights_path.is_file() && dir.join("adapter_model.bin").is_file() {
        return Err(LoraError::Unsupported(
            "a pickled adapter_model.bin (save it as safetensors)".into(),
        ));
    }
    let file = SafetensorsFile::open(&weights_path).map_err(|e| match e {
        crate::model::ModelError::Io { source, .. } => read(&weights_path, source.to_string()),
        other => LoraError::Malformed(format!("adapter_model.safetensors: {other}")),
    })?;
    let layers = read_pairs(&file, &peft, config, precision)?;
    LoraAdapter::new(name, config, peft.rank, peft.targets, layers)
}

/// Checks `adapter_config.json` and extracts rank, scaling and targets.
pub fn parse_config(json: &Value) -> Result<PeftConfig, LoraError> {
    let unsupported = |what: &str| Err(LoraError::Unsupported(what.into()));
    let truthy = |key: &str| json.get(key).is_some_and(|v| v.as_bool() == Some(true));
    let non_empty = |key: &str| match json.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    match json.get("peft_type").and_then(Value::as_str) {
        None | Some("LORA") => {}
        Some(other) => return unsupported(&format!("peft_type {other} (only LORA)")),
    }
    if truthy("use_dora") {
        return unsupported("DoRA (use_dora)");
    }
    if truthy("fan_in_fan_out") {
        return unsupported("fan_in_fan_out");
    }
    if non_empty("modules_to_save") {
        return unsupported("modules_to_save");
    }
    if non_empty("rank_pattern") || non_empty("alpha_pattern") {
        return unsupported("per-module rank_pattern or alpha_pattern");
    }
    for key in ["lora_bias", "use_qalora", "use_bdlora"] {
        if truthy(key) {
            return unsupported(key);
        }
    }
    for key in [
        "layer_replication",
        "trainable_token_indices",
        "target_parameters",
    ] {
        if non_empty(key) {
            return unsupported(key);
        }
    }
    match json.get("bias").and_then(Value::as_str) {
        None | Some("none") => {}
        Some(other) => return unsupported(&format!("trained biases (bias = {other})")),
    }
    let rank = json
        .get("r")
        .and_then(Value::as_u64)
        .filter(|&r| r > 0)
        .ok_or_else(|| LoraError::Malformed("`r` must be a positive integer".into()))?
        as usize;
    let alpha = match json.get("lora_alpha") {
        None | Some(Value::Null) => rank as f64,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| LoraError::Malformed("`lora_alpha` must be a number".into()))?,
    };
    let scaling = if truthy("use_rslora") {
        alpha / (rank as f64).sqrt()
    } else {
        alpha / rank as f64
    } as f32;
    let targets = parse_targets(json.get("target_modules"))?;
    Ok(PeftConfig {
        rank,
        scaling,
        targets,
    })
}

fn parse_targets(value: Option<&Value>) -> Result<Vec<Target>, LoraError> {
    let names: Vec<&str> = match value {
        Some(Value::String(s)) if s == "all-linear" => {
            return Ok(Target::ALL.to_vec());
        }
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => {
            return Err(LoraError::Malformed(
                "`target_modules` must list module names".into(),
            ))
        }
    };
    let mut targets = Vec::new();
    for name in names {
        let target = match Target::parse(name) {
            Some(t) => t,
            None if ["embed_tokens", "lm_head", "wte", "tok_embeddings"].contains(&name) => {
                return Err(LoraError::Unsupported(format!(
                    "an embedding or LM-head target ({name})"
                )))
            }
            None => {
                return Err(LoraError::Unsupported(format!(
                    "target module `{name}` (supported: q_proj, k_proj, v_proj, o_proj, \
                     gate_proj, up_proj, down_proj)"
                )))
            }
        };
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    if targets.is_empty() {
        return Err(LoraError::Malformed("`target_modules` is empty".into()));
    }
    Ok(targets)
}

/// Where a tensor goes: layer, projection, and whether it is A.
fn place(name: &str) -> Result<(usize, Target, bool), LoraError> {
    let unexpected = || LoraError::Malformed(format!("unexpected tensor `{name}`"));
    if ["embed_tokens", "lm_head", "lora_embedding"]
        .iter()
        .any(|s| name.contains(s))
    {
        return Err(LoraError::Unsupported(format!(
            "embedding or LM-head weights (`{name}`)"
        )));
    }
    if name.contains("lora_magnitude_vector") {
        return Err(LoraError::Unsupported("DoRA magnitude vectors".into()));
    }
    let rest = name
        .split_once("layers.")
        .map(|(_, rest)| rest)
        .ok_or_else(unexpected)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(unexpected)?;
    let layer: usize = layer.parse().map_err(|_| unexpected())?;
    let parts: Vec<&str> = rest.split('.').collect();
    let [.., module, which, "weight"] = parts.as_slice() else {
        return Err(unexpected());
    };
    let target = Target::parse(module)
        .ok_or_else(|| LoraError::Unsupported(format!("target module `{module}` in `{name}`")))?;
    match *which {
        "lora_A" => Ok((layer, target, true)),
        "lora_B" => Ok((layer, target, false)),
        _ => Err(unexpected()),
    }
}

/// Every `lora_A` / `lora_B` tensor of `file`, placed, then assembled for the base.
fn read_pairs(
    file: &SafetensorsFile,
    peft: &PeftConfig,
    config: &ModelConfig,
    precision: LoraPrecision,
) -> Result<Vec<LayerLora>, LoraError> {
    let mut halves = Vec::with_capacity(file.tensors.len());
    for (name, entry) in &file.tensors {
        let (layer, target, is_a) = place(name)?;
        if !peft.targets.contains(&target) {
            return Err(LoraError::Malformed(format!(
                "`{name}` targets {} which target_modules does not list",
                target.hf_name()
            )));
        }
        let &[rows, cols] = entry.shape.as_slice() else {
            return Err(LoraError::Malformed(format!(
                "`{name}` has shape {:?}, not a matrix",
                entry.shape
            )));
        };
        let values = file
            .vector(name)
            .map_err(|e| LoraError::Malformed(e.to_string()))?;
        halves.push(Half {
            name: name.clone(),
            layer,
            target,
            is_a,
            shape: [rows, cols],
            values,
        });
    }
    Assembly {
        rank: peft.rank,
        scaling: peft.scaling,
        config,
        precision,
        order: RowOrder::HuggingFace,
    }
    .layers(halves)
}
