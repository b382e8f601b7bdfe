//! Reads a llama.cpp LoRA adapter (a GGUF with `general.type = adapter`, as its
//! `convert_lora_to_gguf.py` writes) into a [`LoraAdapter`] for one base model.
//!
//! Tensors are `blk.N.<projection>.weight.lora_a` (`rank × in`) and `.lora_b`
//! (`out × rank`); the scaling is `adapter.lora.alpha / rank`, as llama.cpp applies it
//! (llama.cpp's converter does not carry rank-stabilised scaling). For Llama, the converter
//! stores B's Q and K rows in the interleaved order of its GGUF bases.

use std::path::Path;

use super::pairs::{Assembly, Half, RowOrder};
use super::{LoraAdapter, LoraError, LoraPrecision, Target};
use crate::gguf::{GgufError, GgufFile};
use crate::model::{Arch, ModelConfig};

/// Reads and checks the adapter in `path` for the base `config`.
pub fn load(
    path: &Path,
    name: &str,
    config: &ModelConfig,
    precision: LoraPrecision,
) -> Result<LoraAdapter, LoraError> {
    let file = GgufFile::open(path).map_err(|e| match e {
        GgufError::Io(source) => LoraError::Read {
            path: path.display().to_string(),
            why: source.to_string(),
        },
        other => LoraError::Malformed(format!("{}: {other}", path.display())),
    })?;
    let text = |key: &str| file.get_str(key).unwrap_or("").to_string();
    if text("general.type") != "adapter" || text("adapter.type") != "lora" {
        return Err(LoraError::Unsupported(format!(
            "a GGUF that is not a LoRA adapter (general.type {:?}, adapter.type {:?})",
            text("general.type"),
            text("adapter.type")
        )));
    }
    let arch = text("general.architecture");
    let adapter_arch = match arch.as_str() {
        "llama" | "mistral" => Some(Arch::Llama),
        "qwen2" => Some(Arch::Qwen2),
        "qwen3" => Some(Arch::Qwen3),
        "gemma3" => Some(Arch::Gemma3),
        _ => None,
    };
    if adapter_arch != Some(config.arch) {
        return Err(LoraError::Mismatch(format!(
            "the adapter is for a {arch:?} model, the base is {:?}",
            config.arch
        )));
    }
    let mut halves = Vec::with_capacity(file.tensors.len());
    for t in &file.tensors {
        let (layer, target, is_a) = place(&t.name)?;
        let &[cols, rows] = t.dims.as_slice() else {
            return Err(LoraError::Malformed(format!(
                "`{}` has {} dimensions, not 2",
                t.name,
                t.dims.len()
            )));
        };
        let values = file
            .tensor_f32(&t.name)
            .map_err(|e| LoraError::Malformed(e.to_string()))?;
        halves.push(Half {
            name: t.name.clone(),
            layer,
            target,
            is_a,
            shape: [rows as usize, cols as usize],
            values,
        });
    }
    let rank = halves
        .iter()
        .find(|h| h.is_a)
        .map(|h| h.shape[0])
        .filter(|&r| r > 0)
        .ok_or_else(|| LoraError::Malformed("no lora_a tensor".into()))?;
    let alpha = file.get_f32("adapter.lora.alpha").unwrap_or(0.0);
    let mut targets: Vec<Target> = halves.iter().map(|h| h.target).collect();
    targets.sort_by_key(|t| *t as usize);
    targets.dedup();
    let assembly = Assembly {
        rank,
        // llama.cpp's rule: no alpha scales by 1.
        scaling: if alpha == 0.0 {
            1.0
        } else {
            alpha / rank as f32
        },
        config,
        precision,
        order: match config.arch {
            Arch::Llama => RowOrder::Interleaved,
            _ => RowOrder::HuggingFace,
        },
    };
    let layers = assembly.layers(halves)?;
    LoraAdapter::new(name, config, rank, targets, layers)
}

/// Where a tensor goes: layer, projection, and whether it is A.
fn place(name: &str) -> Result<(usize, Target, bool), LoraError> {
    let unexpected = || LoraError::Malformed(format!("unexpected tensor `{name}`"));
    if name.starts_with("token_embd") || name.starts_with("output") {
        return Err(LoraError::Unsupported(format!(
            "embedding or LM-head weights (`{name}`)"
        )));
    }
    let rest = name.strip_prefix("blk.").ok_or_else(unexpected)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(unexpected)?;
    let layer: usize = layer.parse().map_err(|_| unexpected())?;
    let (module, which) = rest.split_once(".weight.").ok_or_else(unexpected)?;
    let target = match module {
        "attn_q" => Target::Q,
        "attn_k" => Target::K,
        "attn_v" => Target::V,
        "attn_output" => Target::O,
        "ffn_gate" => Target::Gate,
        "ffn_up" => Target::Up,
        "ffn_down" => Target::Down,
        other => {
            return Err(LoraError::Unsupported(format!(
                "target `{other}` in `{name}`"
            )))
        }
    };
    match which {
        "lora_a" => Ok((layer, target, true)),
        "lora_b" => Ok((layer, target, false)),
        _ => Err(unexpected()),
    }
}
