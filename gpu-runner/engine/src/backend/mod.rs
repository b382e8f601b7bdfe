//! The boundary a model runs behind. The batcher, block manager and sampler know only this
//! trait, so a CUDA backend (weights and KV on the device, one batched step per call) slots
//! in without changing them.

mod batch;
pub mod cpu;
pub mod cuda;
pub(crate) mod moe_routing;
pub mod step_masks;

use crate::lora::LoraAdapter;
use crate::model::ModelConfig;
use crate::sampler::{mask_disallowed, Sampled, TokenDraw};
pub use step_masks::{NoMasks, ReadyMasks, StepMasks};

/// Which logits a sequence wants back from a forward pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogitsMode {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The last position only (the usual case: decode, or the prompt's last chunk).
    Last,
    /// Every position of `tokens` (teacher forcing, prompt logprobs).
    All,
    /// The greedy token of the last position only (a sequence whose sampling needs nothing
    /// but the argmax): a device backend picks it where the logits are and copies back one id.
    Argmax,
    /// A token drawn from the last position's logits where they are (a sampled sequence whose
    /// logits nothing else moves); worth it with a backend that [`Backend::draws_on_device`].
    Draw(TokenDraw),
    /// A `Draw` among the tokens the sequence's grammar allows (a constrained sequence whose
    /// logits nothing else moves): its mask comes from the step's [`StepMasks`], applied
    /// where the logits are (disallowed tokens' logits are -inf, as on the host).
    DrawMasked(TokenDraw),
}

impl LogitsMode {
    /// Whether the backend returns a token rather than logits.
    pub fn picks_token(self) -> bool {
        matches!(
            self,
            LogitsMode::Argmax | LogitsMode::Draw(_) | LogitsMode::DrawMasked(_)
        )
    }
}

/// What one step returns: the logits rows of `Last`/`All` sequences and the token picked
/// (with logprobs when a draw asked) for every `Argmax` or `Draw` sequence, each in batch
/// order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepOutput {
    pub logits: Vec<f32>,
    pub picked: Vec<Sampled>,
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
    /// The LoRA adapter applied to this sequence's rows, if any (see [`crate::lora`]).
    pub adapter: Option<&'a LoraAdapter>,
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
    /// of `batch` (1 row for `Last`, `tokens.len()` rows for `All`, none for `None` or
    /// `Argmax`: those come from [`Backend::forward_step`]).
    fn forward(&mut self, batch: &[SeqSlice<'_>]) -> Result<Vec<f32>, BackendError>;

    /// Takes back a logits buffer that [`Backend::forward`] returned and its caller is done
    /// with, for the next step to reuse (a 16-sequence step of a 262k vocabulary is 16 MiB:
    /// allocating it afresh meant zeroing fresh pages every step). By default dropped.
    fn recycle_logits(&mut self, _logits: Vec<f32>) {}

    /// Whether [`SeqSlice::adapter`] is applied (the engine refuses adapters otherwise).
    fn serves_adapters(&self) -> bool {
        false
    }

    /// Whether `forward_step` draws [`LogitsMode::Draw`] and [`LogitsMode::DrawMasked`]
    /// sequences where the logits are (the engine sends them only to such a backend; the
    /// default `forward_step` draws them on the host, by the same definition).
    fn draws_on_device(&self) -> bool {
        false
    }

    /// [`Backend::forward`] plus the tokens of `Argmax`, `Draw` and `DrawMasked` sequences,
    /// the last under the masks `masks` yields (one per `DrawMasked` sequence, in batch
    /// order; asked for as late as the backend can). By default the logits come back to the
    /// host and the tokens are picked here; a device backend overrides this to keep those
    /// rows on the device.
    fn forward_step(
        &mut self,
        batch: &[SeqSlice<'_>],
        masks: &mut dyn StepMasks,
    ) -> Result<StepOutput, BackendError> {
        forward_step_on_host(self, batch, masks)
    }

    /// The last step's final hidden states (after the final norm), `hidden` floats per
    /// output row: one row per `Last`, `Argmax` or `Draw*` sequence and `tokens.len()` per
    /// `All` one, in batch order. `None` when the backend does not keep them on the host;
    /// the engine then refuses requests that ask for them.
    fn hidden_rows(&self) -> Option<&[f32]> {
        None
    }

    /// The last step's expert choices (a mixture-of-experts model): for every token the
    /// step ran, in batch order, for every routed layer in order, its `top_k` expert ids,
    /// best first. `None` for dense models, or where the backend does not keep them.
    fn routed_experts(&self) -> Option<&[u32]> {
        None
    }
}

/// [`Backend::forward_step`] by way of [`Backend::forward`]: picked rows come back as
/// logits and their tokens are picked here (the default for backends whose logits are on
/// the host anyway).
pub fn forward_step_on_host<B: Backend + ?Sized>(
    backend: &mut B,
    batch: &[SeqSlice<'_>],
    masks: &mut dyn StepMasks,
) -> Result<StepOutput, BackendError> {
    if !batch.iter().any(|s| s.logits.picks_token()) {
        return Ok(StepOutput {
            logits: backend.forward(batch)?,
            picked: Vec::new(),
        });
    }
    let as_last: Vec<SeqSlice<'_>> = batch
        .iter()
        .map(|s| SeqSlice {
            logits: if s.logits.picks_token() {
                LogitsMode::Last
            } else {
                s.logits
            },
            ..*s
        })
        .collect();
    let all = backend.forward(&as_last)?;
    let vocab = backend.config().vocab_size;
    let words = step_masks::words_for(vocab);
    let mut mask_rows = Vec::new();
    step_masks::wait_for_masks(batch, masks, words, &mut mask_rows)?;
    let mut next_mask = mask_rows.chunks_exact(words.max(1));
    let mut out = StepOutput::default();
    let mut rows = all.chunks_exact(vocab);
    for seq in batch {
        let n = match seq.logits {
            LogitsMode::None => 0,
            LogitsMode::Last
            | LogitsMode::Argmax
            | LogitsMode::Draw(_)
            | LogitsMode::DrawMasked(_) => 1,
            LogitsMode::All => seq.tokens.len(),
        };
        for _ in 0..n {
            let row = rows.next().ok_or_else(|| {
                BackendError::Failure("backend returned too few logits rows".into())
            })?;
            match seq.logits {
                LogitsMode::Draw(draw) => out.picked.push(draw.draw(row)),
                LogitsMode::Argmax => out.picked.push(TokenDraw::GREEDY.draw(row)),
                LogitsMode::DrawMasked(draw) => {
                    let mask = next_mask.next().ok_or_else(|| {
                        BackendError::Failure("a masked draw without its mask".into())
                    })?;
                    let mut masked = row.to_vec();
                    mask_disallowed(&mut masked, mask);
                    out.picked.push(draw.draw(&masked));
                }
                _ => out.logits.extend_from_slice(row),
            }
        }
    }
    backend.recycle_logits(all);
    Ok(out)
}
