//! One choice of a request: turns each sampled token into streamable text, logprobs and,
//! at the end, a finish reason.

use fallow_protocol::job::{FinishReason, TokenLogprob};

use super::output::token_logprob;
use crate::grammar::{Advance, SeqGrammar};
use crate::sampler::{Sampled, SeqSampler};
use crate::stop::{StopConditions, StopMatcher, TokenStop};
use crate::stop_regex::RegexStop;
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// A choice's sampler, detokenizer, grammar and stop state.
#[derive(Debug)]
pub(super) struct Choice {
    pub request_id: u64,
    pub index: u32,
    pub sampler: SeqSampler,
    pub decoder: IncrementalDecoder,
    pub matcher: StopMatcher,
    pub regex_stop: RegexStop,
    pub conditions: StopConditions,
    /// The constraint's state for this choice (its own copy); `None` = free text.
    pub grammar: Option<SeqGrammar>,
    pub want_logprobs: bool,
    /// `no_stop_trim`: a matched stop string stays in the text.
    pub keep_stop: bool,
    /// `return_hidden_states`: the hidden state of the last position run, kept each step.
    pub want_hidden: bool,
    pub hidden: Vec<f32>,
    /// `return_routed_experts`: each position's expert ids (`[position][routed layer][k]`),
    /// written as positions run (a recomputed position overwrites itself).
    pub want_routes: bool,
    pub routes: Vec<u32>,
    /// The request's LoRA adapter, applied to this choice's rows.
    pub adapter: Option<std::sync::Arc<crate::lora::LoraAdapter>>,
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
    /// without text; a stop string ends it with the text before the match; a complete
    /// grammar ends it with the token's text; at the end, held-back text is released.
    pub(super) fn absorb(&mut self, tokenizer: &Tokenizer, sampled: &Sampled) -> ChoiceDelta {
        let generated = self.sampler.num_generated();
        let token_stop = self.grammar_stop(sampled.token, generated);
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
            let stop = self.matcher.stop(index);
            if let (true, Some(stop)) = (self.keep_stop, stop) {
                delta.text.push_str(stop);
            }
            delta.matched_stop = stop.map(serde_json::Value::from);
        } else if let Some(m) = self.regex_stop.push(&delta.text, allow_stop_strings) {
            if !self.keep_stop {
                delta.text.truncate(m.keep);
            }
            delta.finish = Some(FinishReason::Stop);
            delta.matched_stop = Some(serde_json::Value::from(m.pattern));
        }
        delta
    }

    /// The token-level stop for `token`, with the grammar advanced by it: a grammar that can
    /// go no further ends the choice (`stop`, even at `max_tokens`). One that fails (it should
    /// not: the token came from its mask) ends the choice too, rather than going on
    /// unconstrained.
    fn grammar_stop(&mut self, token: u32, generated: usize) -> Option<TokenStop> {
        let token_stop = self.conditions.check(token, generated);
        let Some(grammar) = self.grammar.as_mut() else {
            return token_stop;
        };
        if matches!(
            token_stop,
            Some(TokenStop::Eos(_) | TokenStop::StopToken(_))
        ) {
            return token_stop;
        }
        match grammar.advance(token) {
            Ok(Advance::Continue) => token_stop,
            Ok(Advance::Complete) => Some(TokenStop::GrammarComplete),
            Err(e) => {
                tracing::warn!(error = %e, token, "grammar rejected a sampled token");
                self.grammar = None;
                Some(TokenStop::GrammarComplete)
            }
        }
    }
}
