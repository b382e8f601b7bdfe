//! A model on disk → everything the engine needs to run it: the resolved [`ModelConfig`],
//! the [`Weights`] (quantized views into mmapped files where possible), where the vocabulary
//! comes from, and the chat template.
//!
//! Two sources are supported: a single GGUF file ([`gguf_load`]) and a Hugging Face
//! directory with `config.json` + safetensors ([`hf_load`], [`safetensors`]). Both end in the
//! same [`Weights`] layout; the only numeric difference left for the backend is
//! [`ModelConfig::rope_style`] (llama-arch GGUF files have their Q/K rows permuted for
//! interleaved RoPE).

pub mod config;
pub mod features;
mod gguf_load;
mod gpt_oss_experts;
mod hf_load;
mod moe_weights;
mod mxfp4;
pub mod safetensors;
mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use config::{
    Activation, Arch, ClampedSwiglu, ModelConfig, MoeConfig, RopeScaling, RopeStyle, Yarn,
};
pub use features::{Feature, CUDA_LACKS};
pub use weights::{
    DenseFfn, ExpertBiases, FeedForward, LayerWeights, MoeFfn, SharedExpert, Weights,
};

use crate::gguf::GgufError;
use crate::tokenizer::vocab::GgufVocab;

/// Why a model could not be opened. Every message names the file, key or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("missing config key `{0}`")]
    MissingKey(String),
    #[error(
        "unsupported model architecture `{0}` (supported: llama, mistral, mixtral, qwen2, qwen2moe, qwen3, qwen3moe, gemma3, gpt-oss)"
    )]
    UnsupportedArch(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor `{name}`: {why}")]
    Tensor { name: String, why: String },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid safetensors file {path}: {why}")]
    Safetensors { path: PathBuf, why: String },
    #[error("{0} is neither a GGUF file nor a directory with config.json")]
    UnknownFormat(PathBuf),
}

/// Where the tokenizer's vocabulary comes from.
#[derive(Debug, Clone)]
pub enum VocabSource {
    /// Embedded in a GGUF file's `tokenizer.ggml.*` metadata.
    Gguf(GgufVocab),
    /// An HF `tokenizer.json` (and its `tokenizer_config.json` for special tokens).
    TokenizerJson {
        tokenizer_json: PathBuf,
        tokenizer_config: Option<PathBuf>,
    },
}

/// An opened model, ready to hand to a backend and a tokenizer builder.
pub struct ModelArtifacts {
    pub config: ModelConfig,
    pub weights: Arc<Weights>,
    pub vocab: VocabSource,
    /// The Jinja chat template (GGUF `tokenizer.chat_template` or `tokenizer_config.json`).
    pub chat_template: Option<String>,
    /// End-of-generation token ids beyond the tokenizer's own EOS
    /// (HF `generation_config.json` `eos_token_id`; GGUF eos/eot ids).
    pub eos_ids: Vec<u32>,
}

impl ModelArtifacts {
    /// Puts the weights in the CPU kernels' layout ([`Weights::use_cpu_layout`]) before a
    /// CPU backend is built on them. Only while these artifacts hold the only reference to
    /// the weights (as right after [`open`]); otherwise they stay as they are, still correct.
    pub fn use_cpu_layout(&mut self) {
        if let Some(weights) = Arc::get_mut(&mut self.weights) {
            weights.use_cpu_layout();
        }
    }
}

impl std::fmt::Debug for ModelArtifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelArtifacts")
            .field("config", &self.config)
            .field("has_chat_template", &self.chat_template.is_some())
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

/// Opens a model from a GGUF file or an HF directory (`config.json` + safetensors).
pub fn open(path: &Path) -> Result<ModelArtifacts, ModelError> {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return hf_load::open_dir(path);
        }
        return Err(ModelError::UnknownFormat(path.to_path_buf()));
    }
    if is_gguf(path)? {
        return gguf_load::open_file(path);
    }
    Err(ModelError::UnknownFormat(path.to_path_buf()))
}

/// True when the file starts with the GGUF magic.
fn is_gguf(path: &Path) -> Result<bool, ModelError> {
    use std::io::Read;
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 4];
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == b"GGUF"),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod tiny;
