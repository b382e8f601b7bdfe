//! Text → the ids an embedding model runs on, by the model's own `tokenizer.json` through
//! the `tokenizers` crate, exactly as sentence-transformers calls it: special tokens added
//! by the post-processor (`[CLS] … [SEP]` for BERT, a trailing `<|endoftext|>` for
//! Qwen3-Embedding), no truncation and no padding (the file may ask for both: MiniLM's pads
//! to 128; the caller refuses over-long inputs instead of cutting them).

use std::path::Path;

use super::EmbedError;

/// A model's tokenizer, configured for one input at a time.
pub(crate) struct EmbedTokenizer {
    inner: tokenizers::Tokenizer,
    /// sentence-transformers' `do_lower_case`, applied before the tokenizer sees the text.
    lower_case: bool,
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
        Ok(EmbedTokenizer { inner, lower_case })
    }

    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let lowered;
        let text = if self.lower_case {
            lowered = text.to_lowercase();
            lowered.as_str()
        } else {
            text
        };
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }
}
