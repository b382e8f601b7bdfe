//! When a choice stops, and what text is safe to stream before it does.
//!
//! [`StopConditions`] decides on each generated token id: EOS (unless `ignore_eos`),
//! `stop_token_ids`, or `max_tokens` reached (→ `length`). Stop tokens end the choice
//! without their text.
//!
//! [`StopMatcher`] finds stop strings in the detokenized text, across token boundaries,
//! with the request's one automaton ([`crate::stop_strings`]):
//! text that could be the start of a stop string is held back until the next token shows
//! whether it is, so nothing is ever streamed and then retracted. A matched stop string and
//! everything after it are dropped from the output.

use std::sync::Arc;

use aho_corasick::automaton::StateID;
use fallow_protocol::job::{FinishReason, Sampling};

use crate::stop_strings::StopStrings;

/// Finds stop strings in streamed text, holding back possible beginnings of one.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    /// The request's automaton, shared by its choices.
    strings: Arc<StopStrings>,
    /// Text received but not yet released: a suffix that may begin a stop string.
    held: String,
    /// The automaton's state after `held`.
    state: StateID,
    /// `held` was taken in while matches were not allowed (before `min_tokens`), so it may
    /// hold a whole stop string the next allowed push must still see.
    unchecked: bool,
}

impl Default for StopMatcher {
    fn default() -> Self {
        StopMatcher::shared(Arc::default())
    }
}

impl StopMatcher {
    /// A matcher with its own automaton (tests; the engine shares one per request).
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher::shared(Arc::new(StopStrings::new(stops).unwrap_or_default()))
    }

    /// A matcher over a request's compiled stop strings.
    pub fn shared(strings: Arc<StopStrings>) -> Self {
        let state = strings.start();
        StopMatcher {
            strings,
            held: String::new(),
            state,
            unchecked: false,
        }
    }

    /// Adds `delta`, appends the text that is now safe to stream to `out`, and returns the
    /// index (into the non-empty stops) of the stop string that matched, if one did. With
    /// `allow_match` false (before `min_tokens`) text flows but nothing stops.
    ///
    /// Of several matches the one that starts first wins, then the lower index. Only the
    /// new bytes are walked, except once after `min_tokens`, when the held text is too.
    pub fn push(&mut self, delta: &str, allow_match: bool, out: &mut String) -> Option<usize> {
        if self.strings.is_empty() {
            out.push_str(delta);
            return None;
        }
        let mut scan_from = self.held.len();
        if allow_match && self.unchecked {
            scan_from = 0;
            self.state = self.strings.start();
        }
        self.unchecked = !allow_match;
        self.held.push_str(delta);
        let mut best = None;
        for (offset, &byte) in self.held.as_bytes()[scan_from..].iter().enumerate() {
            self.state = self.strings.next(self.state, byte);
            if allow_match {
                self.strings
                    .note_matches(self.state, scan_from + offset + 1, &mut best);
            }
        }
        if let Some((start, index)) = best {
            out.push_str(&self.held[..start]);
            self.held.clear();
            self.state = self.strings.start();
            return Some(index);
        }
        let keep_from = self.hold_start();
        out.push_str(&self.held[..keep_from]);
        self.held.replace_range(..keep_from, "");
        None
    }

    /// Releases held text when the choice ends for another reason (length, EOS).
    pub fn flush(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
        self.state = self.strings.start();
    }

    /// The stop string a [`StopMatcher::push`] index names.
    pub fn stop(&self, index: usize) -> Option<&str> {
        self.strings.stop(index)
    }

    /// Where the longest suffix of `held` that is a proper prefix of some stop begins
    /// (`held.len()` when none is). The automaton's state is the longest suffix that begins
    /// a stop; when that suffix is a whole stop and no more (possible only before
    /// `min_tokens`), the shorter suffixes are walked again until one is a proper prefix.
    fn hold_start(&mut self) -> usize {
        loop {
            let (depth, proper) = self.strings.depth(self.state);
            if depth == 0 || proper {
                // A stop starts at a character boundary, so the suffix does too.
                return self.held.len() - depth;
            }
            let from = self.held.len() - depth + 1;
            self.state = self.strings.walk(&self.held.as_bytes()[from..]);
        }
    }
}

/// Why a token ended its choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStop {
    /// An end-of-sequence token (`matched_stop` stays empty, as in vLLM).
    Eos(u32),
    /// One of the request's `stop_token_ids`.
    StopToken(u32),
    /// `max_tokens` (or the context) reached; the token itself is kept.
    Length,
    /// The request's grammar is complete and allows nothing more; the token is kept.
    GrammarComplete,
}

impl TokenStop {
    pub fn finish_reason(self) -> FinishReason {
        match self {
            TokenStop::Eos(_) | TokenStop::StopToken(_) | TokenStop::GrammarComplete => {
                FinishReason::Stop
            }
            TokenStop::Length => FinishReason::Length,
        }
    }

    /// Whether the token's text belongs in the output (not for stop tokens).
    pub fn keeps_text(self) -> bool {
        matches!(self, TokenStop::Length | TokenStop::GrammarComplete)
    }

    /// The `matched_stop` to report.
    pub fn matched(self) -> Option<serde_json::Value> {
        match self {
            TokenStop::StopToken(id) => Some(serde_json::Value::from(id)),
            TokenStop::Eos(_) | TokenStop::Length | TokenStop::GrammarComplete => None,
        }
    }
}

/// The token-level stop rules of one choice.
#[derive(Debug, Clone)]
pub struct StopConditions {
    eos_ids: Vec<u32>,
    /// Sorted and deduplicated, for a binary search per token.
    stop_token_ids: Vec<u32>,
    min_tokens: usize,
    max_tokens: usize,
}

impl StopConditions {
    /// `max_tokens` is the effective limit (the request's, or what the context leaves).
    pub fn new(params: &Sampling, eos_ids: &[u32], max_tokens: usize) -> Self {
        StopConditions {
            eos_ids: if params.ignore_eos {
                Vec::new()
            } else {
                eos_ids.to_vec()
            },
            stop_token_ids: sorted_ids(&params.stop_token_ids),
            min_tokens: params.min_tokens as usize,
            max_tokens: max_tokens.max(1),
        }
    }

    /// Whether stop strings may end the choice once it has `num_generated` tokens.
    pub fn allows_stop(&self, num_generated: usize) -> bool {
        num_generated >= self.min_tokens
    }

    /// Checks the `num_generated`-th token (1-based count including `token`).
    pub fn check(&self, token: u32, num_generated: usize) -> Option<TokenStop> {
        if self.allows_stop(num_generated) {
            if self.eos_ids.contains(&token) {
                return Some(TokenStop::Eos(token));
            }
            if self.stop_token_ids.binary_search(&token).is_ok() {
                return Some(TokenStop::StopToken(token));
            }
        }
        (num_generated >= self.max_tokens).then_some(TokenStop::Length)
    }
}

/// `ids` as a sorted set.
fn sorted_ids(ids: &[u32]) -> Vec<u32> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
#[path = "stop_tests.rs"]
mod tests;
