//! Opening a Hugging Face model directory: `config.json`, safetensors weights (single or
//! sharded), `tokenizer.json` / `tokenizer_config.json` (chat template) and
//! `generation_config.json` (end-of-generation ids).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::quant::QMatrix;

use super::safetensors::SafetensorsSet;
use super::weights::{self, Role, TensorNames, TensorSource};
use super::{config, ModelArtifacts, ModelError, VocabSource};

impl TensorSource for SafetensorsSet {
    fn has(&self, name: &str) -> bool {
        SafetensorsSet::has(self, name)
    }
    fn matrix(&self, name: &str) -> Result<QMatrix, ModelError> {
        SafetensorsSet::matrix(self, name)
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        SafetensorsSet::vector(self, name)
    }
    fn stacked(&self, name: &str) -> Result<(QMatrix, usize), ModelError> {
        SafetensorsSet::stacked(self, name)
    }
    fn bytes_u8(&self, name: &str) -> Result<(&[usize], &[u8]), ModelError> {
        SafetensorsSet::bytes_u8(self, name)
    }
}

/// HF transformers' tensor names under a checkpoint-specific prefix (`model.` for text
/// models, `language_model.model.` for multimodal Gemma 3).
struct HfNames {
    prefix: String,
    /// Gemma names its pre-FFN norm `pre_feedforward_layernorm` and uses
    /// `post_attention_layernorm` for the sandwich norm; Llama-likes use the latter pre-FFN.
    gemma: bool,
    lm_head: String,
    /// Mixtral's published checkpoints: `block_sparse_moe.experts.E.w1` (gate), `w3` (up),
    /// `w2` (down); otherwise `mlp.experts.E.gate_proj` and so on.
    mixtral_names: bool,
    /// gpt-oss: `mlp.router`, and `mlp.experts.gate_up_proj` / `down_proj` stored for
    /// `x · W` (see `gpt_oss_experts`).
    gpt_oss: bool,
}

impl TensorNames for HfNames {
    fn name(&self, role: Role, layer: usize) -> String {
        let p = &self.prefix;
        let blk = |s: &str| format!("{p}layers.{layer}.{s}");
        match role {
            Role::TokenEmbd => format!("{p}embed_tokens.weight"),
            Role::OutputNorm => format!("{p}norm.weight"),
            Role::Output => self.lm_head.clone(),
            // HF checkpoints carry Llama 3 scaling in config.json, never as a tensor.
            Role::RopeFreqs => format!("{p}__no_rope_freqs__"),
            Role::AttnNorm => blk("input_layernorm.weight"),
            Role::Q => blk("self_attn.q_proj.weight"),
            Role::K => blk("self_attn.k_proj.weight"),
            Role::V => blk("self_attn.v_proj.weight"),
            Role::O => blk("self_attn.o_proj.weight"),
            Role::QBias => blk("self_attn.q_proj.bias"),
            Role::KBias => blk("self_attn.k_proj.bias"),
            Role::VBias => blk("self_attn.v_proj.bias"),
            Role::OBias => blk("self_attn.o_proj.bias"),
            Role::AttnSinks => blk("self_attn.sinks"),
            Role::QNorm => blk("self_attn.q_norm.weight"),
            Role::KNorm => blk("self_attn.k_norm.weight"),
            Role::PostAttnNorm => blk("post_attention_layernorm.weight"),
            Role::FfnNorm if self.gemma => blk("pre_feedforward_layernorm.weight"),
            Role::FfnNorm => blk("post_attention_layernorm.weight"),
            Role::Gate => blk("mlp.gate_proj.weight"),
            Role::Up => blk("mlp.up_proj.weight"),
            Role::Down => blk("mlp.down_proj.weight"),
            Role::PostFfnNorm => blk("post_feedforward_layernorm.weight"),
            Role::Router if self.mixtral_names => blk("block_sparse_moe.gate.weight"),
            Role::Router if self.gpt_oss => blk("mlp.router.weight"),
            Role::Router => blk("mlp.gate.weight"),
            Role::RouterBias => blk("mlp.router.bias"),
            Role::GateExps => blk("mlp.experts.gate_proj"),
            Role::UpExps => blk("mlp.experts.up_proj"),
            Role::DownExps => blk("mlp.experts.down_proj"),
            // The same names, two layouts: which one is the architecture's to say.
            Role::GateUpExps if self.gpt_oss => blk("__transposed__"),
            Role::GateUpExps => blk("mlp.experts.gate_up_proj"),
            Role::GateUpExpsTransposed if self.gpt_oss => blk("mlp.experts.gate_up_proj"),
            Role::DownExpsTransposed if self.gpt_oss => blk("mlp.experts.down_proj"),
            Role::GateUpExpsTransposed | Role::DownExpsTransposed => blk("__not_transposed__"),
            Role::GateUpExpsBias => blk("mlp.experts.gate_up_proj_bias"),
            Role::GateExpsBias => blk("mlp.experts.gate_proj_bias"),
            Role::UpExpsBias => blk("mlp.experts.up_proj_bias"),
            Role::DownExpsBias => blk("mlp.experts.down_proj_bias"),
            Role::SharedGate => blk("mlp.shared_expert.gate_proj.weight"),
            Role::SharedUp => blk("mlp.shared_expert.up_proj.weight"),
            Role::SharedDown => blk("mlp.shared_expert.down_proj.weight"),
            Role::SharedExpertGate => blk("mlp.shared_expert_gate.weight"),
        }
    }

    fn expert(&self, role: Role, layer: usize, expert: usize) -> String {
        let p = &self.prefix;
        let (block, w) = match (self.mixtral_names, role) {
            (true, Role::Gate) => ("block_sparse_moe", "w1"),
            (true, Role::Up) => ("block_sparse_moe", "w3"),
            (true, _) => ("block_sparse_moe", "w2"),
            (false, Role::Gate) => ("mlp", "gate_proj"),
            (false, Role::Up) => ("mlp", "up_proj"),
            (false, _) => ("mlp", "down_proj"),
        };
        format!("{p}layers.{layer}.{block}.experts.{expert}.{w}.weight")
    }
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Opens an HF model directory.
pub fn open_dir(dir: &Path) -> Result<ModelArtifacts, ModelError> {
    let config_json = read_json(&dir.join("config.json"))?;
    let mut config = config::from_hf_json(&config_json)?;
    let tensors = SafetensorsSet::open_dir(dir)?;
    if config.arch != config::Arch::GptOss {
        refuse_mxfp4_tensors(&tensors)?;
    }
    let names = detect_names(&tensors, config.arch);
    let weights = weights::build(&mut config, &tensors, &names)?;
    // gpt-oss reads its output-projection and expert biases; nothing else does.
    let unused: &[&str] = match config.arch {
        config::Arch::GptOss => &["gate_proj.bias", "up_proj.bias", "down_proj.bias"],
        _ => &[
            "o_proj.bias",
            "gate_proj.bias",
            "up_proj.bias",
            "down_proj.bias",
            "gate_up_proj_bias",
            "down_proj_bias",
            "mlp.router.bias",
            "self_attn.sinks",
        ],
    };
    weights::reject_unused_tensors(tensors.names(), unused)?;

    let tokenizer_json = dir.join("tokenizer.json");
    if !tokenizer_json.is_file() {
        return Err(ModelError::Io {
            path: tokenizer_json,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json is required"),
        });
    }
    let tokenizer_config = Some(dir.join("tokenizer_config.json")).filter(|p| p.is_file());
    let chat_template = read_chat_template(dir, tokenizer_config.as_deref())?;
    let mut eos_ids = eos_ids_of(&config_json);
    let gen_path = dir.join("generation_config.json");
    if gen_path.is_file() {
        for id in eos_ids_of(&read_json(&gen_path)?) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    Ok(ModelArtifacts {
        config,
        weights: Arc::new(weights),
        vocab: VocabSource::TokenizerJson {
            tokenizer_json,
            tokenizer_config,
        },
        chat_template,
        eos_ids,
    })
}

/// MXFP4 tensors (`*_blocks` + `*_scales`) are read for gpt-oss's experts only: anywhere
/// else they are refused by name rather than reported missing.
fn refuse_mxfp4_tensors(tensors: &SafetensorsSet) -> Result<(), ModelError> {
    match tensors.names().find(|n| n.ends_with("_blocks")) {
        Some(name) => Err(ModelError::Unsupported(format!(
            "tensor `{name}`: MXFP4 weights are read for gpt-oss's experts only"
        ))),
        None => Ok(()),
    }
}

fn detect_names(tensors: &SafetensorsSet, arch: config::Arch) -> HfNames {
    let gemma = arch == config::Arch::Gemma3;
    let suffix = "embed_tokens.weight";
    let prefix = tensors
        .names()
        .filter(|n| n.ends_with(suffix))
        .map(|n| n[..n.len() - suffix.len()].to_string())
        .min_by_key(String::len)
        .unwrap_or_else(|| "model.".to_string());
    // Older multimodal Gemma 3 checkpoints: `language_model.model.` → `language_model.lm_head`;
    // newer ones (`model.language_model.`) and text models keep a top-level `lm_head`.
    let lm_head = match prefix
        .strip_suffix("model.")
        .filter(|o| o.ends_with("language_model."))
    {
        Some(outer) => format!("{outer}lm_head.weight"),
        None => "lm_head.weight".to_string(),
    };
    let mixtral_names = tensors.names().any(|n| n.contains(".block_sparse_moe."));
    HfNames {
        lm_head,
        prefix,
        gemma,
        mixtral_names,
        gpt_oss: arch == config::Arch::GptOss,
    }
}

/// `eos_token_id` as an int or a list of ints.
fn eos_ids_of(v: &Value) -> Vec<u32> {
    let to_id = |x: &Value| x.as_u64().and_then(|i| u32::try_from(i).ok());
    match v.get("eos_token_id") {
        Some(Value::Array(a)) => a.iter().filter_map(to_id).collect(),
        Some(x) => to_id(x).into_iter().collect(),
        None => Vec::new(),
    }
}

/// The chat template from `chat_template.jinja`, or `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates of which we take "default").
fn read_chat_template(
    dir: &Path,
    tokenizer_config: Option<&Path>,
) -> Result<Option<String>, ModelError> {
    let jinja: PathBuf = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let text = std::fs::read_to_string(&jinja).map_err(|source| ModelError::Io {
            path: jinja,
            source,
        })?;
        return Ok(Some(text));
    }
    let Some(path) = tokenizer_config else {
        return Ok(None);
    };
    let v = read_json(path)?;
    Ok(match v.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    })
}
