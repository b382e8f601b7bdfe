//! What can go wrong with an embedding model, split by whose fault it is: the caller's
//! input ([`EmbedError::InvalidInput`], a 400 upstream) or the model's files and the
//! machine (everything else).

/// Why a model could not be opened or an input not embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The caller's input is unusable; the message names the input and the problem.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The model directory is missing something, or holds something we cannot run.
    #[error("embedding model: {0}")]
    Load(String),
    /// The tokenizer failed on a text (not expected for any valid UTF-8 string).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The decoder backend refused or failed a forward pass.
    #[error("backend: {0}")]
    Backend(String),
}

impl EmbedError {
    /// Whether the caller's input, not the model or the machine, is at fault.
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, EmbedError::InvalidInput(_))
    }
}

impl From<crate::model::ModelError> for EmbedError {
    fn from(e: crate::model::ModelError) -> Self {
        EmbedError::Load(e.to_string())
    }
}
