//! Constrained decoding: a request's [`Constraint`] (JSON schema, JSON object, regex, Lark
//! grammar) compiled with llguidance against the model's vocabulary, and per sequence a
//! [`SeqGrammar`] that says which tokens may come next.
//!
//! - [`vocab`]: the tokenizer's per-token bytes as llguidance's token trie.
//! - [`matcher`]: one sequence's grammar state (mask, advance).
//! - [`slot`]: the compiler, built on a background thread so the engine never waits for it
//!   unless a constrained request comes first.
//!
//! How it is used by the loop ([`crate::llm`]): a request's constraint is compiled
//! once ([`Grammars::compile`], cached by constraint), each choice gets its own clone; before
//! a step's forward pass the masks of the constrained sequences in it are computed in
//! parallel, on another thread, while the forward runs; the sampler sets every disallowed
//! logit to −∞ before anything else; the sampled token advances the grammar, and when the
//! grammar can go no further the choice ends with `finish_reason: stop`.
//!
//! The grammar state lives with the choice, not with the KV cache, so it survives
//! preemption by recompute untouched: recomputing re-runs the prompt and the tokens already
//! consumed, and sampling resumes where the grammar was.

mod matcher;
mod slot;
mod vocab;

use std::collections::HashMap;
use std::sync::Arc;

use fallow_protocol::job::Constraint;
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};

pub use matcher::{Advance, SeqGrammar};
pub use slot::GrammarSlot;

use crate::tokenizer::Tokenizer;

/// Compiled grammars kept for reuse; past this many the cache starts over.
const CACHE_ENTRIES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("the constraint does not compile: {0}")]
    Compile(String),
    #[error("the grammar's vocabulary could not be built: {0}")]
    Vocabulary(String),
    #[error("the grammar matcher failed: {0}")]
    Matcher(String),
}

impl GrammarError {
    fn matcher(e: anyhow::Error) -> Self {
        GrammarError::Matcher(first_line(&e.to_string()))
    }
}

/// llguidance's errors may carry the parser state after the first line.
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

/// One model's grammar compiler: the token trie and llguidance's precomputed slices (built
/// once, ~tens of ms for a 50k vocabulary), plus compiled grammars by constraint.
pub struct Grammars {
    factory: ParserFactory,
    eos_only: Arc<SimpleVob>,
    cache: HashMap<String, Matcher>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("cached", &self.cache.len())
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// `eos_ids`: the ids that end generation (allowed when the grammar accepts).
    pub fn new(tokenizer: Arc<Tokenizer>, eos_ids: &[u32]) -> Result<Self, GrammarError> {
        let env = vocab::ModelTokEnv::build(tokenizer, eos_ids);
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        let eos_only = Arc::new(factory.tok_env().tok_trie().eos_token_set());
        Ok(Grammars {
            factory,
            eos_only,
            cache: HashMap::new(),
        })
    }

    /// A fresh grammar state for `constraint`; compiled once, then cloned from the cache.
    pub fn compile(&mut self, constraint: &Constraint) -> Result<SeqGrammar, GrammarError> {
        let key =
            serde_json::to_string(constraint).map_err(|e| GrammarError::Compile(e.to_string()))?;
        if let Some(matcher) = self.cache.get(&key) {
            return Ok(SeqGrammar::new(matcher.clone(), self.eos_only.clone()));
        }
        let parser = self
            .factory
            .create_parser(fallow_protocol::grammar::top_level_grammar(constraint))
            .map_err(|e| GrammarError::Compile(first_line(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(first_line(&e)));
        }
        if self.cache.len() >= CACHE_ENTRIES {
            self.cache.clear();
        }
        self.cache.insert(key, matcher.clone());
        Ok(SeqGrammar::new(matcher, self.eos_only.clone()))
    }
}

#[cfg(test)]
mod tests;
