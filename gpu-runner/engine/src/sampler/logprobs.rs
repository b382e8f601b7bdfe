//! Log-softmax values of processed logits, without materialising the whole distribution.

use super::{MAX_TOP_LOGPROBS, MIN_LOGPROB};

/// The logprob of `token` and the `n` most likely tokens' (best first), as a response
/// reports them, from logits without NaN. `scratch` is reused.
pub(super) fn report(
    logits: &[f32],
    token: u32,
    n: usize,
    scratch: &mut Vec<u32>,
) -> (f32, Vec<(u32, f32)>) {
    let norm = log_normaliser(logits);
    let top = top_n(logits, norm, n.min(MAX_TOP_LOGPROBS), scratch);
    (logprob_of(logits, norm, token), top)
}

/// `max + ln Σ exp(l - max)`: subtracting it from a logit gives its logprob.
fn log_normaliser(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return 0.0;
    }
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    max + sum.ln()
}

fn logprob_of(logits: &[f32], normaliser: f32, token: u32) -> f32 {
    let lp = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| l - normaliser);
    if lp.is_finite() {
        lp
    } else {
        MIN_LOGPROB
    }
}

/// The `n` most likely tokens, best first (ties to the lower id). `scratch` is reused.
fn top_n(logits: &[f32], normaliser: f32, n: usize, scratch: &mut Vec<u32>) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    scratch.clear();
    scratch.extend(0..logits.len() as u32);
    let better = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if n < scratch.len() {
        scratch.select_nth_unstable_by(n - 1, better);
    }
    scratch[..n].sort_unstable_by(better);
    scratch[..n]
        .iter()
        .map(|&t| (t, logprob_of(logits, normaliser, t)))
        .collect()
}
