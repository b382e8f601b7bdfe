//! Grammar masks for a step's [`LogitsMode::DrawMasked`](super::LogitsMode::DrawMasked)
//! sequences. A mask depends only on the tokens so far, never on the logits being computed,
//! so the engine computes it while the forward pass runs; a backend that draws on the device
//! asks for the masks only once its logits are on their way, and applies them there.

use super::{BackendError, LogitsMode, SeqSlice};

/// Where a step's masks come from.
pub trait StepMasks {
    /// Waits until the masks of the step's `DrawMasked` sequences are ready and appends them
    /// to `out` in batch order, `words` words each: bit `t % 32` of word `t / 32` is set when
    /// token `t` is allowed; a mask shorter than `words` allows nothing past its end. Returns
    /// how many masks it appended.
    fn wait_into(&mut self, words: usize, out: &mut Vec<u32>) -> usize;
}

/// A step without masked sequences.
pub struct NoMasks;

impl StepMasks for NoMasks {
    fn wait_into(&mut self, _words: usize, _out: &mut Vec<u32>) -> usize {
        0
    }
}

/// Masks known before the step (tests, and callers that computed them already).
pub struct ReadyMasks<'a>(pub Vec<&'a [u32]>);

impl StepMasks for ReadyMasks<'_> {
    fn wait_into(&mut self, words: usize, out: &mut Vec<u32>) -> usize {
        for mask in &self.0 {
            append_row(mask, words, out);
        }
        self.0.len()
    }
}

/// The masks of `batch`'s `DrawMasked` sequences from `masks`, `words` words each; an error
/// when fewer come than the batch has such sequences.
pub fn wait_for_masks(
    batch: &[SeqSlice<'_>],
    masks: &mut dyn StepMasks,
    words: usize,
    out: &mut Vec<u32>,
) -> Result<usize, BackendError> {
    let wanted = batch
        .iter()
        .filter(|s| matches!(s.logits, LogitsMode::DrawMasked(_)))
        .count();
    out.clear();
    if wanted == 0 {
        return Ok(0);
    }
    let got = masks.wait_into(words, out);
    if got < wanted {
        return Err(BackendError::InvalidBatch(format!(
            "{wanted} sequences draw under a grammar mask, {got} masks came"
        )));
    }
    Ok(wanted)
}

/// Appends `mask` to `out` as a row of exactly `words` words.
pub fn append_row(mask: &[u32], words: usize, out: &mut Vec<u32>) {
    let kept = mask.len().min(words);
    out.extend_from_slice(&mask[..kept]);
    out.resize(out.len() + (words - kept), 0);
}

/// Words of a mask row over `vocab` tokens.
pub fn words_for(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_cut_or_filled_to_the_vocabulary_width() {
        let mut out = Vec::new();
        let n = ReadyMasks(vec![&[0b101][..], &[1, 2, 3][..]]).wait_into(2, &mut out);
        assert_eq!(n, 2);
        assert_eq!(out, vec![0b101, 0, 1, 2]);
        assert_eq!(words_for(33), 2);
        assert_eq!(NoMasks.wait_into(4, &mut out), 0);
    }
}
