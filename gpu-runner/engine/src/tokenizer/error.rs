//! Errors of the tokenizer layer: building a tokenizer from a vocabulary or files, and encoding.

use std::path::PathBuf;

/// Why a tokenizer could not be built or could not encode a text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The vocabulary is malformed (empty, inconsistent lengths, ids out of range, ...).
    #[error("invalid tokenizer vocabulary: {0}")]
    InvalidVocab(String),
    /// `tokenizer.ggml.model` names a tokenizer kind we do not implement.
    #[error("unsupported tokenizer model {0:?} (supported: \"gpt2\", \"llama\")")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not know; guessing would silently
    /// produce token ids that differ from the ones the model was trained on.
    #[error("unknown pre-tokenizer {0:?}")]
    UnknownPreTokenizer(String),
    /// A tokenizer file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A tokenizer file is not valid JSON or does not have the expected shape.
    #[error("invalid tokenizer file {path}: {message}")]
    InvalidFile { path: PathBuf, message: String },
    /// The `tokenizers` crate rejected the model or failed while encoding.
    #[error("tokenizer backend error: {0}")]
    Backend(String),
}
