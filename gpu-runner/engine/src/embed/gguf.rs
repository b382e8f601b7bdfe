//! A GGUF file as an embedding model, the way llama.cpp reads one: a decoder architecture
//! the engine runs whose metadata sets `{arch}.pooling_type` (llama.cpp's enum: 1 mean,
//! 2 CLS, 3 last token, 4 rank), its vocabulary from `tokenizer.ggml.*` with BOS and EOS
//! added as `add_bos_token`/`add_eos_token` say, and vectors L2-normalised, as llama.cpp's
//! server returns them.
//!
//! Not served, with a load error rather than wrong vectors: rank pooling (a reranker's
//! score, not a vector) and BERT-family GGUF files (`bert`, `nomic-bert`, …), whose
//! WordPiece vocabulary the engine's tokenizer does not read; their safetensors
//! directories are served instead.

use std::path::Path;

use crate::gguf::GgufFile;

use super::pooling::Pooling;
use super::EmbedError;

/// GGUF architectures the engine's decoders run.
const DECODERS: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

/// Encoder architectures of llama.cpp, named in the refusal.
const ENCODERS: [&str; 4] = ["bert", "nomic-bert", "jina-bert-v2", "modern-bert"];

/// llama.cpp's `LLAMA_POOLING_TYPE_NONE`: a generative model.
const POOLING_NONE: u64 = 0;

/// What a GGUF embedding model's metadata says, before its weights are opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GgufEmbedding {
    pub pooling: Pooling,
}

/// The file's architecture and `{arch}.pooling_type`, `None` for anything that is not a
/// readable GGUF file.
fn pooling_type(path: &Path) -> Option<(String, Option<u64>)> {
    let gguf = GgufFile::open(path).ok()?;
    let arch = gguf.get_str("general.architecture").ok()?.to_string();
    let pooling = gguf.get_u64(&format!("{arch}.pooling_type")).ok();
    Some((arch, pooling))
}

/// Whether `path` is a GGUF file that declares a pooling type other than none. Encoders are
/// detected too, so that opening them gives the reason they are not served.
pub(crate) fn detect(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    match pooling_type(path) {
        Some((_, Some(p))) => p != POOLING_NONE,
        Some((arch, None)) => ENCODERS.contains(&arch.as_str()),
        None => false,
    }
}

impl GgufEmbedding {
    pub(crate) fn read(path: &Path) -> Result<GgufEmbedding, EmbedError> {
        let (arch, pooling) = pooling_type(path).ok_or_else(|| {
            EmbedError::Load(format!("{} is not a readable GGUF file", path.display()))
        })?;
        if !DECODERS.contains(&arch.as_str()) {
            return Err(EmbedError::Load(format!(
                "GGUF architecture `{arch}` is not served as an embedding model (decoders \
                 {} are; BERT-family models are served from their safetensors directory)",
                DECODERS.join(", ")
            )));
        }
        let pooling = match pooling {
            Some(1) => Pooling::Mean,
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::LastToken,
            Some(4) => {
                return Err(EmbedError::Load(
                    "pooling_type 4 (rank) makes a reranker, which is not served".into(),
                ))
            }
            Some(other) => {
                return Err(EmbedError::Load(format!(
                    "{arch}.pooling_type {other} is not one of 1 (mean), 2 (CLS), 3 (last)"
                )))
            }
            None => {
                return Err(EmbedError::Load(format!(
                    "{} sets no {arch}.pooling_type: it is not an embedding model",
                    path.display()
                )))
            }
        };
        Ok(GgufEmbedding { pooling })
    }
}
