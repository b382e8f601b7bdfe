//! Text → the ids an embedding model runs on, by the model's own `tokenizer.json` through
//! the `tokenizers` crate, exactly as sentence-transformers calls it: special tokens added
//! by the post-processor (`[CLS] … [SEP]` for BERT, a trailing `<|endoftext|>` for
//! Qwen3-Embedding), no truncation and no padding (the file may ask for both: MiniLM's pads
//! to 128; the caller refuses over-long inputs instead of cutting them).
//!
//! A GGUF model's vocabulary runs through the engine's own [`Tokenizer`] instead, with BOS
//! and EOS added as its `add_bos_token`/`add_eos_token` metadata says (llama.cpp's rule).

use std::path::Path;

use crate::tokenizer::{GgufVocab, Tokenizer};

use super::EmbedError;

/// A model's tokenizer, configured for one input at a time.
pub(crate) enum EmbedTokenizer {
    /// `tokenizer.json`, run by the `tokenizers` crate.
    Hf {
        inner: Box<tokenizers::Tokenizer>,
        /// sentence-transformers' `do_lower_case`, applied before the tokenizer sees the text.
        lower_case: bool,
    },
    /// A GGUF file's `tokenizer.ggml.*` vocabulary.
    Gguf {
        inner: Box<Tokenizer>,
        add_bos: bool,
        /// The EOS id to append, when the vocabulary asks for one.
        eos: Option<u32>,
    },
}

impl EmbedTokenizer {
    pub(crate) fn open(dir: &Path, lower_case: bool) -> Result<Self, EmbedError> {
        let path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&path)
            .map_err(|e| EmbedError::Load(format!("cannot read {}: {e}", path.display())))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| EmbedError::Load(format!("{}: {e}", path.display())))?;
        inner
            .with_truncation(None)
            .map_err(|e| EmbedError::Load(format!("{}: {e}", path.display())))?;
        inner.with_padding(None);
        Ok(EmbedTokenizer::Hf {
            inner: Box::new(inner),
            lower_case,
        })
    }

    pub(crate) fn from_gguf(vocab: &GgufVocab) -> Result<Self, EmbedError> {
        let inner = Tokenizer::from_gguf_vocab(vocab)
            .map_err(|e| EmbedError::Load(format!("GGUF vocabulary: {e}")))?;
        let eos = match vocab.add_eos {
            Some(true) => Some(inner.eos_id().ok_or_else(|| {
                EmbedError::Load("add_eos_token is set but the vocabulary has no EOS".into())
            })?),
            _ => None,
        };
        Ok(EmbedTokenizer::Gguf {
            add_bos: inner.add_bos_by_default(),
            inner: Box::new(inner),
            eos,
        })
    }

    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        match self {
            EmbedTokenizer::Hf { inner, lower_case } => {
                let lowered;
                let text = if *lower_case {
                    lowered = text.to_lowercase();
                    lowered.as_str()
                } else {
                    text
                };
                let encoding = inner
                    .encode(text, true)
                    .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
                Ok(encoding.get_ids().to_vec())
            }
            EmbedTokenizer::Gguf {
                inner,
                add_bos,
                eos,
            } => {
                let mut ids = inner
                    .encode(text, *add_bos)
                    .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
                ids.extend(*eos);
                Ok(ids)
            }
        }
    }
}
