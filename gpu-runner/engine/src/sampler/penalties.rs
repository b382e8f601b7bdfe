//! Logit processing before selection: bias, `min_tokens` masking and repetition /
//! frequency / presence penalties. Each touches only the tokens it concerns, never the
//! whole vocabulary.

use super::SeqSampler;

/// Whether [`apply`] would leave every logit as it is for `seq`'s next token (kept next to
/// it so the two cannot drift apart).
pub(super) fn change_nothing(seq: &SeqSampler) -> bool {
    let params = &seq.params;
    params.logit_bias.is_empty()
        && (seq.num_generated >= params.min_tokens as usize || seq.suppressed_early.is_empty())
        && !(params.repetition_penalty != 1.0 && params.repetition_penalty > 0.0)
        && params.frequency_penalty == 0.0
        && params.presence_penalty == 0.0
}

pub(super) fn apply(logits: &mut [f32], seq: &SeqSampler) {
    let params = &seq.params;
    for (&token, &bias) in &params.logit_bias {
        if let Some(l) = logits.get_mut(token as usize) {
            *l += bias;
        }
    }
    if seq.num_generated < params.min_tokens as usize {
        for &token in &seq.suppressed_early {
            if let Some(l) = logits.get_mut(token as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    let repetition = params.repetition_penalty;
    if repetition != 1.0 && repetition > 0.0 {
        let generated_only = seq
            .output_counts
            .keys()
            .filter(|t| !seq.prompt_tokens.contains(t));
        for &token in seq.prompt_tokens.iter().chain(generated_only) {
            if let Some(l) = logits.get_mut(token as usize) {
                *l = if *l > 0.0 {
                    *l / repetition
                } else {
                    *l * repetition
                };
            }
        }
    }
    let (frequency, presence) = (params.frequency_penalty, params.presence_penalty);
    if frequency != 0.0 || presence != 0.0 {
        for (&token, &count) in &seq.output_counts {
            if let Some(l) = logits.get_mut(token as usize) {
                *l -= frequency * count as f32 + presence;
            }
        }
    }
}
