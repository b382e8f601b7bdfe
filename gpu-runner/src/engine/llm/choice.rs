//! One choice of a request: turns each sampled token into streamable text, logprobs and,
//! at the end, a finish reason.

use fallow_scheduler::job::{FinishReason, TokenLogprob};

use super::output::token_logprob;
use crate::engine::sampler::{Sampled, SeqSampler};
use crate::engine::stop::{StopConditions, StopMatcher, TokenStop};
use crate::engine::tokenizer::{IncrementalDecoder, Tokenizer};

/// A choice's sampler, detokenizer and stop state.
#[derive(Debug)]
pub(super) struct Choice {
    pub request_id: u64,
    pub index: u32,
    pub sampler: SeqSampler,
    pub decoder: IncrementalDecoder,
    pub matcher: StopMatcher,
    pub conditions: StopConditions,
    pub want_logprobs: bool,
}

/// What one token adds to a choice's output.
#[derive(Debug, Default)]
pub(super) struct ChoiceDelta {
    pub text: String,
    pub logprobs: Option<Vec<TokenLogprob>>,
    pub finish: Option<FinishReason>,
    pub matched_stop: Option<serde_json::Value>,
}

impl Choice {
    /// Folds in a token the sampler just chose (and counted). A stop token ends the choice
    /// without text; a stop string ends it with the text before the match; at the end,
    /// held-back text is released.
    pub(super) fn absorb(&mut self, tokenizer: &Tokenizer, sampled: &Sampled) -> ChoiceDelta {
        let generated = self.sampler.num_generated();
        let token_stop = self.conditions.check(sampled.token, generated);
        let allow_stop_strings = self.conditions.allows_stop(generated);
        let mut delta = ChoiceDelta {
            logprobs: self.want_logprobs.then(Vec::new),
            ..ChoiceDelta::default()
        };
        let mut matched = None;
        if token_stop.is_none_or(TokenStop::keeps_text) {
            let piece = self.decoder.push(tokenizer, sampled.token);
            matched = self
                .matcher
                .push(&piece, allow_stop_strings, &mut delta.text);
            if let (Some(list), Some(lp)) =
                (delta.logprobs.as_mut(), token_logprob(tokenizer, sampled))
            {
                list.push(lp);
            }
        }
        if let (None, Some(stop)) = (matched, token_stop) {
            // The choice ends here: release what the detokenizer and the matcher held.
            let tail = self.decoder.finish();
            matched = self
                .matcher
                .push(&tail, allow_stop_strings, &mut delta.text);
            if matched.is_none() {
                self.matcher.flush(&mut delta.text);
                delta.finish = Some(stop.finish_reason());
                delta.matched_stop = stop.matched();
            }
        }
        if let Some(index) = matched {
            delta.finish = Some(FinishReason::Stop);
            delta.matched_stop = self.matcher.stop(index).map(serde_json::Value::from);
        }
        delta
    }
}
