//! Logits → next token, per sequence.
//!
//! Each sequence owns a [`SeqSampler`]: its validated [`Sampling`] parameters, its own RNG
//! (seeded from `seed + choice index`, or from entropy when unseeded) and the counts its
//! penalties need. Because no RNG is shared, a seeded sequence draws the same tokens
//! whatever else is in the batch. The [`Sampler`] holds only scratch buffers, reused for
//! every token so the hot path allocates nothing.
//!
//! Processing order for one row of logits:
//! 0. A constrained sequence's grammar mask ([`crate::grammar`]) sets every token
//!    the grammar does not allow to −∞, before anything else.
//! 1. `logit_bias` is added; NaN logits become −∞.
//! 2. Until `min_tokens` tokens exist, EOS (unless `ignore_eos`) and `stop_token_ids` are
//!    masked to −∞.
//! 3. Penalties: repetition (prompt and generated tokens, divide positive / multiply
//!    negative logits), then frequency and presence (generated tokens only), as vLLM does.
//! 4. **Logprobs** are the log-softmax of these processed logits, *before* temperature and
//!    top-k/top-p/min-p truncation: the model's distribution as the request shaped it, not
//!    an artefact of the sampling knobs (OpenAI's convention). −∞ is reported as −9999.0,
//!    as OpenAI does, so the value stays valid JSON. Under a grammar they are the
//!    *constrained* distribution: renormalised over the allowed tokens, disallowed
//!    alternatives never listed with a finite value.
//! 5. Selection ([`TokenDraw`], the definition device backends draw by too): temperature
//!    < 1e-5 is greedy (arg max, ties to the lowest id); otherwise logits are divided by the
//!    temperature, then min-p, top-k and top-p cut the candidate set, and one uniform number
//!    from the sequence's RNG picks a token.

mod logprobs;
pub use select::argmax;
mod draw;
use draw::DrawScratch;
pub use draw::TokenDraw;
mod penalties;
mod select;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use fallow_protocol::job::Sampling;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Below this temperature sampling is greedy (dividing by it would overflow).
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// Most alternatives reported per position (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The logprob reported for a token the processing made impossible.
pub const MIN_LOGPROB: f32 = -9999.0;

/// One chosen token, with its logprob and the best alternatives when the request asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: Option<f32>,
    /// `(token, logprob)`, best first; at most `top_logprobs` entries.
    pub top: Vec<(u32, f32)>,
}

/// One sequence's sampling parameters, RNG and token history.
#[derive(Debug)]
pub struct SeqSampler {
    /// The request's parameters, shared by its choices.
    params: Arc<Sampling>,
    rng: StdRng,
    /// Masked while fewer than `min_tokens` tokens were generated.
    suppressed_early: Vec<u32>,
    /// Generated token → how often (frequency and presence penalties).
    output_counts: HashMap<u32, u32>,
    /// Distinct prompt tokens; filled only when a repetition penalty is set.
    prompt_tokens: HashSet<u32>,
    num_generated: usize,
}

impl SeqSampler {
    /// `choice_index` offsets the seed so the `n` choices of one request differ.
    /// `params` may be the request's shared `Arc` (the engine) or an owned value (tests).
    pub fn new(
        params: impl Into<Arc<Sampling>>,
        choice_index: u32,
        prompt: &[u32],
        eos_ids: &[u32],
    ) -> Self {
        let params = params.into();
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed.wrapping_add(u64::from(choice_index))),
            None => StdRng::from_entropy(),
        };
        let mut suppressed_early = params.stop_token_ids.clone();
        if !params.ignore_eos {
            suppressed_early.extend_from_slice(eos_ids);
        }
        let prompt_tokens = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        SeqSampler {
            params,
            rng,
            suppressed_early,
            output_counts: HashMap::new(),
            prompt_tokens,
            num_generated: 0,
        }
    }

    pub fn params(&self) -> &Sampling {
        &self.params
    }

    /// Tokens generated so far.
    pub fn num_generated(&self) -> usize {
        self.num_generated
    }

    pub fn is_greedy(&self) -> bool {
        self.params.temperature < GREEDY_TEMPERATURE
    }

    /// Whether the next token is the plain argmax of the raw logits: greedy, no logprobs,
    /// and no processing that would move a logit (grammar mask, bias, `min_tokens` masking,
    /// penalties).
    /// Such a sequence can take its token from the device ([`Sampler::take_picked`]).
    pub fn only_needs_argmax(&self) -> bool {
        self.is_greedy() && !self.params.logprobs && self.draws_from_raw_logits()
    }

    /// For a sequence whose draw needs nothing but its raw logits (no grammar mask, bias,
    /// `min_tokens` masking or penalties) and more than their argmax (it samples, or wants
    /// logprobs), so that a backend can draw it where the logits are: the draw, its uniform
    /// number taken from the sequence's own RNG when it samples. The result is then
    /// recorded with [`Sampler::take_picked`].
    pub fn remote_draw(&mut self) -> Option<TokenDraw> {
        if self.only_needs_argmax() || !self.draws_from_raw_logits() {
            return None;
        }
        Some(self.next_draw())
    }

    /// For a constrained sequence whose draw needs nothing but its raw logits and its
    /// grammar's mask (no bias, `min_tokens` masking or penalties): the draw a backend makes
    /// among the allowed tokens where the logits are ([`Sampler::sample_constrained`]'s
    /// definition; greedy ones too, as a draw at temperature 0). Recorded with
    /// [`Sampler::take_picked`].
    pub fn remote_draw_under_mask(&mut self) -> Option<TokenDraw> {
        if self.params.constraint.is_none() || !penalties::change_nothing(self) {
            return None;
        }
        Some(self.next_draw())
    }

    /// The next token's draw: the sampling knobs and, when sampling, the next uniform
    /// number of the sequence's RNG (one per sampled token, wherever it is drawn).
    fn next_draw(&mut self) -> TokenDraw {
        let u = self.next_uniform();
        let p = &self.params;
        TokenDraw {
            temperature: if self.is_greedy() { 0.0 } else { p.temperature },
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            u,
            logprobs: p
                .logprobs
                .then(|| p.top_logprobs.min(MAX_TOP_LOGPROBS as u32) as u8),
        }
    }

    /// The uniform number the next token's draw takes: one from the RNG per sampled token,
    /// none for greedy sequences, whose RNG is never touched.
    fn next_uniform(&mut self) -> f32 {
        if self.is_greedy() {
            0.0
        } else {
            self.rng.gen::<f32>()
        }
    }

    /// Counts `token` as generated as if it had just been drawn (a resumed request's
    /// earlier tokens): the RNG moves past the number its draw took, and the penalties and
    /// `min_tokens` see it. A seeded sequence then draws what it would have drawn next.
    pub fn replay(&mut self, token: u32) {
        self.next_uniform();
        self.record(token);
    }

    fn draws_from_raw_logits(&self) -> bool {
        self.params.constraint.is_none() && penalties::change_nothing(self)
    }

    fn record(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
        self.num_generated += 1;
    }
}

/// Scratch space shared by all sequences of an engine; one sample at a time.
#[derive(Debug, Default)]
pub struct Sampler {
    logits: Vec<f32>,
    /// Token ids (the top logprobs).
    candidates: Vec<u32>,
    draw: DrawScratch,
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what a backend picked for a sequence that [`SeqSampler::only_needs_argmax`]
    /// or drew for one with [`SeqSampler::remote_draw`].
    pub fn take_picked(&mut self, picked: &Sampled, seq: &mut SeqSampler) -> Sampled {
        seq.record(picked.token);
        picked.clone()
    }

    /// Picks the next token of `seq` from one row of raw model logits and records it in the
    /// sequence's history. An empty row yields token 0 rather than a panic.
    pub fn sample(&mut self, raw_logits: &[f32], seq: &mut SeqSampler) -> Sampled {
        self.sample_constrained(raw_logits, seq, None)
    }

    /// [`Sampler::sample`] restricted to the tokens set in `allowed` (bit `t % 32` of word
    /// `t / 32`; ids past its end are disallowed), a grammar's mask.
    pub fn sample_constrained(
        &mut self,
        raw_logits: &[f32],
        seq: &mut SeqSampler,
        allowed: Option<&[u32]>,
    ) -> Sampled {
        self.logits.clear();
        self.logits.extend(
            raw_logits
                .iter()
                .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l }),
        );
        if let Some(words) = allowed {
            mask_disallowed(&mut self.logits, words);
        }
        penalties::apply(&mut self.logits, seq);
        let token = seq.next_draw().pick_with(&self.logits, &mut self.draw);
        let (logprob, top) = if seq.params.logprobs {
            let n = seq.params.top_logprobs as usize;
            let (logprob, top) = logprobs::report(&self.logits, token, n, &mut self.candidates);
            (Some(logprob), top)
        } else {
            (None, Vec::new())
        };
        seq.record(token);
        Sampled {
            token,
            logprob,
            top,
        }
    }
}

/// Sets the logits of tokens not in `allowed` (bit `t % 32` of word `t / 32`; ids past its
/// end are not allowed) to −∞, a 32-token word at a time.
pub fn mask_disallowed(logits: &mut [f32], allowed: &[u32]) {
    for (index, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = allowed.get(index).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (bit, logit) in chunk.iter_mut().enumerate() {
            if bits >> bit & 1 == 0 {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests;
