//! The boundary a model runs behind. The batcher, block manager and sampler know only this
//! trait, so a CUDA backend (weights and KV on the device, one batched step per call) slots
//! in without changing them.

pub mod cpu;

use crate::engine::model::ModelConfig;

/// Which logits a sequence wants back from a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsMode {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The last position only (the usual case: decode, or the prompt's last chunk).
    Last,
    /// Every position of `tokens` (teacher forcing, prompt logprobs).
    All,
}

/// One sequence's share of a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqSlice<'a> {
    /// The new tokens to run this step.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`, i.e. how many tokens of this sequence are already in the KV
    /// cache (those are attended to, not recomputed).
    pub start_pos: usize,
    /// Physical KV block ids covering positions `0 .. start_pos + tokens.len()`, in order.
    pub block_table: &'a [u32],
    pub logits: LogitsMode,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("invalid forward batch: {0}")]
    InvalidBatch(String),
    #[error("backend failure: {0}")]
    Failure(String),
}

/// A model instance with its KV pool, ready to run batched steps.
pub trait Backend: Send {
    fn config(&self) -> &ModelConfig;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
    /// Blocks in the KV pool.
    fn num_blocks(&self) -> usize;
    /// Runs one step over all sequences, writing their new K/V into their blocks, and
    /// returns the requested logits rows (`vocab_size` floats each) concatenated in the order
    /// of `batch` (1 row for `Last`, `tokens.len()` rows for `All`, none for `None`).
    fn forward(&mut self, batch: &[SeqSlice<'_>]) -> Result<Vec<f32>, BackendError>;
}
