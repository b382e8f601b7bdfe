//! Opening a GGUF file as a model: config from `{arch}.*` metadata, weights by llama.cpp's
//! tensor names (`blk.N.attn_q.weight`, …), vocabulary from `tokenizer.ggml.*`.

use std::path::Path;
use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::quant::QMatrix;
use crate::tokenizer::vocab::GgufVocab;

use super::config::{self, MetadataSource};
use super::weights::{self, Role, TensorNames, TensorSource};
use super::{ModelArtifacts, ModelError, VocabSource};

impl MetadataSource for GgufFile {
    fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }
    fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }
    fn get_str(&self, key: &str) -> Option<String> {
        self.get(key)?.as_str().map(str::to_string)
    }
}

impl TensorSource for GgufFile {
    fn has(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }
    fn matrix(&self, name: &str) -> Result<QMatrix, ModelError> {
        Ok(GgufFile::matrix(self, name)?)
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        Ok(self.tensor_f32(name)?)
    }
    fn stacked(&self, name: &str) -> Result<(QMatrix, usize), ModelError> {
        Ok(self.stacked_matrix(name)?)
    }
}

/// llama.cpp's tensor names.
struct GgufNames {
    /// gpt-oss names its pre-FFN norm `post_attention_norm` (llama.cpp's `attn_post_norm`).
    gpt_oss: bool,
}

impl TensorNames for GgufNames {
    fn name(&self, role: Role, layer: usize) -> String {
        let blk = |s: &str| format!("blk.{layer}.{s}");
        match role {
            Role::TokenEmbd => "token_embd.weight".into(),
            Role::OutputNorm => "output_norm.weight".into(),
            Role::Output => "output.weight".into(),
            Role::RopeFreqs => "rope_freqs.weight".into(),
            Role::AttnNorm => blk("attn_norm.weight"),
            Role::Q => blk("attn_q.weight"),
            Role::K => blk("attn_k.weight"),
            Role::V => blk("attn_v.weight"),
            Role::O => blk("attn_output.weight"),
            Role::QBias => blk("attn_q.bias"),
            Role::KBias => blk("attn_k.bias"),
            Role::VBias => blk("attn_v.bias"),
            Role::OBias => blk("attn_output.bias"),
            Role::AttnSinks => blk("attn_sinks.weight"),
            Role::QNorm => blk("attn_q_norm.weight"),
            Role::KNorm => blk("attn_k_norm.weight"),
            Role::PostAttnNorm => blk("post_attention_norm.weight"),
            Role::FfnNorm if self.gpt_oss => blk("post_attention_norm.weight"),
            Role::FfnNorm => blk("ffn_norm.weight"),
            Role::Gate => blk("ffn_gate.weight"),
            Role::Up => blk("ffn_up.weight"),
            Role::Down => blk("ffn_down.weight"),
            Role::PostFfnNorm => blk("post_ffw_norm.weight"),
            Role::Router => blk("ffn_gate_inp.weight"),
            Role::GateExps => blk("ffn_gate_exps.weight"),
            Role::UpExps => blk("ffn_up_exps.weight"),
            Role::DownExps => blk("ffn_down_exps.weight"),
            Role::GateUpExps => blk("ffn_gate_up_exps.weight"),
            // llama.cpp's converter writes gpt-oss's experts in the usual layout.
            Role::GateUpExpsTransposed | Role::DownExpsTransposed | Role::GateUpExpsBias => {
                blk("__not_in_gguf__")
            }
            Role::RouterBias => blk("ffn_gate_inp.bias"),
            Role::GateExpsBias => blk("ffn_gate_exps.bias"),
            Role::UpExpsBias => blk("ffn_up_exps.bias"),
            Role::DownExpsBias => blk("ffn_down_exps.bias"),
            Role::SharedGate => blk("ffn_gate_shexp.weight"),
            Role::SharedUp => blk("ffn_up_shexp.weight"),
            Role::SharedDown => blk("ffn_down_shexp.weight"),
            Role::SharedExpertGate => blk("ffn_gate_inp_shexp.weight"),
        }
    }

    /// Early Mixtral GGUF files: `blk.N.ffn_gate.E.weight`.
    fn expert(&self, role: Role, layer: usize, expert: usize) -> String {
        let kind = match role {
            Role::Gate => "gate",
            Role::Up => "up",
            _ => "down",
        };
        format!("blk.{layer}.ffn_{kind}.{expert}.weight")
    }
}

/// Opens a GGUF model file.
pub fn open_file(path: &Path) -> Result<ModelArtifacts, ModelError> {
    let gguf = GgufFile::open(path)?;
    let vocab = read_vocab(&gguf)?;
    let vocab_fallback = match gguf.tensor("token_embd.weight") {
        Some(t) => t.dims.get(1).copied().unwrap_or(0) as usize,
        None => vocab.tokens.len(),
    };
    let mut config = config::from_gguf(&gguf, vocab_fallback)?;
    let gpt_oss = config.arch == config::Arch::GptOss;
    let weights = weights::build(&mut config, &gguf, &GgufNames { gpt_oss })?;
    // gpt-oss reads its output-projection, router and expert biases and its sinks (a fused
    // `ffn_gate_up_exps.bias` it does not, and refuses); nothing else reads any of them.
    let unused: &[&str] = match gpt_oss {
        true => &[
            "ffn_gate.bias",
            "ffn_up.bias",
            "ffn_down.bias",
            "ffn_gate_up_exps.bias",
        ],
        false => &[
            "attn_output.bias",
            "ffn_gate.bias",
            "ffn_up.bias",
            "ffn_down.bias",
            "ffn_gate_inp.bias",
            "_exps.bias",
            "attn_sinks.weight",
        ],
    };
    weights::reject_unused_tensors(gguf.tensors.iter().map(|t| t.name.as_str()), unused)?;
    let chat_template = gguf
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let eos_ids = vocab
        .eos_id
        .into_iter()
        .chain(vocab.eot_ids.iter().copied())
        .collect();
    Ok(ModelArtifacts {
        config,
        weights: Arc::new(weights),
        vocab: VocabSource::Gguf(vocab),
        chat_template,
        eos_ids,
    })
}

/// Decodes the `tokenizer.ggml.*` keys. Only the token list and model name are required.
pub fn read_vocab(gguf: &GgufFile) -> Result<GgufVocab, ModelError> {
    let id = |k: &str| {
        gguf.get(k)
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
    };
    let flag = |k: &str| gguf.get(k).and_then(|v| v.as_bool());
    let present = |k: &str| gguf.get(k).is_some();
    let tokens = gguf
        .get_str_array("tokenizer.ggml.tokens")?
        .into_iter()
        .map(str::to_string)
        .collect();
    let merges = if present("tokenizer.ggml.merges") {
        gguf.get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .map(str::to_string)
            .collect()
    } else {
        Vec::new()
    };
    let scores = if present("tokenizer.ggml.scores") {
        Some(gguf.get_f32_array("tokenizer.ggml.scores")?)
    } else {
        None
    };
    let token_types = if present("tokenizer.ggml.token_type") {
        Some(gguf.get_i32_array("tokenizer.ggml.token_type")?)
    } else {
        None
    };
    Ok(GgufVocab {
        model: gguf.get_str("tokenizer.ggml.model")?.to_string(),
        pre: gguf
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        tokens,
        scores,
        token_types,
        merges,
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        eot_ids: ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
            .iter()
            .filter_map(|k| id(k))
            .collect(),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: flag("tokenizer.ggml.add_bos_token"),
        add_eos: flag("tokenizer.ggml.add_eos_token"),
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
    })
}
