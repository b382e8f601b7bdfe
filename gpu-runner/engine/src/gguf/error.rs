//! Errors of the GGUF reader. Every message names the key or tensor at fault so a bad
//! model file can be diagnosed from the log line alone.

use thiserror::Error;

/// Why a GGUF file could not be read or a value could not be taken from it.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot read GGUF file: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file (bad magic)")]
    BadMagic,
    #[error("unsupported GGUF version {0} (only v2 and v3 are supported)")]
    UnsupportedVersion(u32),
    #[error("GGUF file is truncated or corrupt while reading {what}")]
    Truncated { what: String },
    #[error("tensor `{tensor}` has unsupported ggml type id {type_id}")]
    UnsupportedType { tensor: String, type_id: u32 },
    #[error("tensor `{tensor}` lies outside the file or has an invalid shape")]
    OutOfBounds { tensor: String },
    #[error("metadata key `{0}` is missing")]
    MissingKey(String),
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("metadata key `{key}` has the wrong type: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("tensor `{tensor}` has {dims} dimensions; expected at most 2 non-trivial")]
    NotAMatrix { tensor: String, dims: usize },
}
