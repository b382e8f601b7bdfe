//! Validation of a forward batch and its flattened layout: where each sequence's tokens sit
//! in the step's activation matrix, their positions, and which rows produce logits.

use crate::backend::{BackendError, LogitsMode, SeqSlice};
use crate::model::ModelConfig;
use crate::sampler::TokenDraw;

/// The step's tokens, concatenated over sequences.
#[derive(Default)]
pub struct BatchLayout {
    /// First activation row of each sequence (plus a final entry = total tokens).
    pub offsets: Vec<usize>,
    /// Position of every activation row.
    pub positions: Vec<usize>,
    pub token_ids: Vec<u32>,
    /// Activation rows whose logits are returned, in output order.
    pub logit_rows: Vec<usize>,
    /// Activation rows whose token is returned (`LogitsMode::Argmax`, `Draw` or
    /// `DrawMasked`), in order.
    pub picked_rows: Vec<usize>,
    /// How each of `picked_rows` is picked (an argmax is a greedy draw).
    pub draws: Vec<TokenDraw>,
    /// For each of `picked_rows`, which of the step's masks applies (`DrawMasked`, in batch
    /// order), if any.
    pub masks: Vec<Option<usize>>,
    /// `DrawMasked` sequences in the step.
    pub n_masked: usize,
}

impl BatchLayout {
    pub fn n_tokens(&self) -> usize {
        self.token_ids.len()
    }

    fn pick(&mut self, row: usize, draw: TokenDraw) {
        self.picked_rows.push(row);
        self.draws.push(draw);
        self.masks.push(None);
    }

    /// Rebuilds the layout for `batch`, checking everything the kernels index with.
    pub fn build(
        &mut self,
        batch: &[SeqSlice<'_>],
        config: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<(), BackendError> {
        self.offsets.clear();
        self.positions.clear();
        self.token_ids.clear();
        self.logit_rows.clear();
        self.picked_rows.clear();
        self.draws.clear();
        self.masks.clear();
        self.n_masked = 0;
        for (i, seq) in batch.iter().enumerate() {
            validate_seq(i, seq, config, block_size, num_blocks)?;
            let first = self.token_ids.len();
            self.offsets.push(first);
            self.token_ids.extend_from_slice(seq.tokens);
            self.positions
                .extend(seq.start_pos..seq.start_pos + seq.tokens.len());
            match seq.logits {
                LogitsMode::None => {}
                LogitsMode::Last => self.logit_rows.push(first + seq.tokens.len() - 1),
                LogitsMode::All => self.logit_rows.extend(first..first + seq.tokens.len()),
                LogitsMode::Argmax => self.pick(first + seq.tokens.len() - 1, TokenDraw::GREEDY),
                LogitsMode::Draw(draw) => self.pick(first + seq.tokens.len() - 1, draw),
                LogitsMode::DrawMasked(draw) => {
                    self.pick(first + seq.tokens.len() - 1, draw);
                    *self.masks.last_mut().expect("just pushed") = Some(self.n_masked);
                    self.n_masked += 1;
                }
            }
        }
        self.offsets.push(self.token_ids.len());
        Ok(())
    }
}

fn validate_seq(
    i: usize,
    seq: &SeqSlice<'_>,
    config: &ModelConfig,
    block_size: usize,
    num_blocks: usize,
) -> Result<(), BackendError> {
    let invalid = |why: String| Err(BackendError::InvalidBatch(format!("sequence {i}: {why}")));
    if seq.tokens.is_empty() {
        return invalid("no tokens".into());
    }
    if let Some(adapter) = seq.adapter {
        if !adapter.fits(config) {
            return invalid(format!(
                "LoRA adapter `{}` was built for another base model",
                adapter.name
            ));
        }
    }
    if let Some(&bad) = seq
        .tokens
        .iter()
        .find(|&&t| t as usize >= config.vocab_size)
    {
        return invalid(format!(
            "token id {bad} >= vocab_size {}",
            config.vocab_size
        ));
    }
    let end = seq.start_pos.saturating_add(seq.tokens.len());
    if end > config.context_length {
        return invalid(format!(
            "positions up to {end} exceed context_length {}",
            config.context_length
        ));
    }
    let needed = end.div_ceil(block_size);
    if seq.block_table.len() < needed {
        return invalid(format!(
            "block table has {} blocks, {} positions need {needed} of size {block_size}",
            seq.block_table.len(),
            end
        ));
    }
    if let Some(&bad) = seq.block_table[..needed]
        .iter()
        .find(|&&b| b as usize >= num_blocks)
    {
        return invalid(format!("block id {bad} >= num_blocks {num_blocks}"));
    }
    Ok(())
}
