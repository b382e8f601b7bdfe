//! When a choice stops, and what text is safe to stream before it does.
//!
//! [`StopConditions`] decides on each generated token id: EOS (unless `ignore_eos`),
//! `stop_token_ids`, or `max_tokens` reached (→ `length`). Stop tokens end the choice
//! without their text.
//!
//! [`StopMatcher`] finds stop strings in the detokenized text, across token boundaries:
//! text that could be the start of a stop string is held back until the next token shows
//! whether it is, so nothing is ever streamed and then retracted. A matched stop string and
//! everything after it are dropped from the output.

use fallow_protocol::job::{FinishReason, Sampling};

/// Finds stop strings in streamed text, holding back possible beginnings of one.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Longest stop string, in bytes.
    max_len: usize,
    /// Text received but not yet released: a suffix that may begin a stop string.
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopMatcher {
            stops,
            max_len,
            held: String::new(),
        }
    }

    /// Adds `delta`, appends the text that is now safe to stream to `out`, and returns the
    /// index (into the non-empty stops) of the stop string that matched, if one did. With
    /// `allow_match` false (before `min_tokens`) text flows but nothing stops.
    pub fn push(&mut self, delta: &str, allow_match: bool, out: &mut String) -> Option<usize> {
        if self.stops.is_empty() {
            out.push_str(delta);
            return None;
        }
        self.held.push_str(delta);
        if allow_match {
            if let Some((pos, index)) = self.earliest_match() {
                out.push_str(&self.held[..pos]);
                self.held.clear();
                return Some(index);
            }
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
    }

    /// The stop string a [`StopMatcher::push`] index names.
    pub fn stop(&self, index: usize) -> Option<&str> {
        self.stops.get(index).map(String::as_str)
    }

    fn earliest_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| self.held.find(stop.as_str()).map(|pos| (pos, index)))
            .min()
    }

    /// Where the longest suffix of `held` that is a proper prefix of some stop begins
    /// (`held.len()` when none is).
    fn hold_start(&self) -> usize {
        let earliest = self
            .held
            .len()
            .saturating_sub(self.max_len.saturating_sub(1));
        (earliest..self.held.len())
            .filter(|&start| self.held.is_char_boundary(start))
            .find(|&start| {
                let suffix = &self.held[start..];
                self.stops
                    .iter()
                    .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            })
            .unwrap_or(self.held.len())
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
            stop_token_ids: params.stop_token_ids.clone(),
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
            if self.stop_token_ids.contains(&token) {
                return Some(TokenStop::StopToken(token));
            }
        }
        (num_generated >= self.max_tokens).then_some(TokenStop::Length)
    }
}

#[cfg(test)]
#[path = "stop_tests.rs"]
mod tests;
