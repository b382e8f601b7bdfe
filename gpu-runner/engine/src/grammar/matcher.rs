//! One sequence's place in its grammar: the mask of tokens allowed next, and advancing by
//! the token sampled.

use std::sync::Arc;

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use super::GrammarError;

/// A choice's grammar state. Cloning gives an independent copy (each of `n` choices has
/// its own); the compiled grammar inside is shared.
#[derive(Clone)]
pub struct SeqGrammar {
    matcher: Matcher,
    /// The allowed set for the next token, once computed.
    mask: Option<SimpleVob>,
    /// Only the end-of-generation tokens: the mask after the matcher failed.
    eos_only: Arc<SimpleVob>,
    failed: bool,
}

impl std::fmt::Debug for SeqGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqGrammar")
            .field("stopped", &self.matcher.is_stopped())
            .field("has_mask", &self.mask.is_some())
            .finish()
    }
}

/// What a token did to the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// More text may follow.
    Continue,
    /// The grammar is complete and nothing can extend it (or EOS was taken): the choice ends.
    Complete,
}

impl SeqGrammar {
    pub(super) fn new(matcher: Matcher, eos_only: Arc<SimpleVob>) -> Self {
        SeqGrammar {
            matcher,
            mask: None,
            eos_only,
            failed: false,
        }
    }

    /// Computes the allowed set for the next token, unless already computed. Safe to run on
    /// another thread while the forward pass runs (it needs no logits). If the matcher
    /// fails (a grammar too complex for its step budget, say), only end-of-generation
    /// tokens are allowed from then on: the choice ends rather than going on unconstrained.
    pub fn prepare_mask(&mut self) {
        if self.mask.is_some() {
            return;
        }
        let mask = if self.failed {
            Err(GrammarError::Matcher("failed before".into()))
        } else {
            self.matcher.compute_mask().map_err(GrammarError::matcher)
        };
        self.mask = Some(mask.unwrap_or_else(|e| {
            if !self.failed {
                tracing::warn!(error = %e, "grammar mask failed; ending the choice");
            }
            self.failed = true;
            (*self.eos_only).clone()
        }));
    }

    /// The allowed set as bit words (bit `t % 32` of word `t / 32` = token `t` allowed);
    /// `None` before [`SeqGrammar::prepare_mask`].
    pub fn mask_words(&self) -> Option<&[u32]> {
        self.mask.as_ref().map(SimpleVob::as_slice)
    }

    /// Whether the grammar allows `token` next (computing the mask if needed).
    pub fn allows(&mut self, token: u32) -> bool {
        self.prepare_mask();
        self.mask.as_ref().is_some_and(|m| m.is_allowed(token))
    }

    /// Consumes the sampled token; the mask is stale afterwards.
    pub fn advance(&mut self, token: u32) -> Result<Advance, GrammarError> {
        self.mask = None;
        if self.failed {
            return Ok(Advance::Complete);
        }
        self.matcher
            .consume_token(token)
            .map_err(GrammarError::matcher)?;
        Ok(if self.matcher.is_stopped() {
            Advance::Complete
        } else {
            Advance::Continue
        })
    }

    /// Whether the text so far is a complete match (EOS would be allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
