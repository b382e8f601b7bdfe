//! Continuing a request from the tokens an earlier attempt generated ([`Resume`]), so that
//! a job handed back by a preempted runner goes on elsewhere as if nothing had happened.
//!
//! A resumed choice's sequence is its prompt followed by the tokens already generated:
//! prefill recomputes their KV, as a preemption's recompute does. Everything else a token
//! changes (the sampler's penalty counts and RNG, the detokenizer, the stop-string and
//! stop-regex windows, the grammar, the stop conditions) is brought forward by *replaying*
//! the tokens through the same path a sampled token takes, with the text it produces thrown
//! away: the client has it already. A greedy or seeded choice then samples exactly the
//! tokens an uninterrupted run would have.
//!
//! Progress that the request could not have produced (a token the grammar forbids, a
//! finish before the last token) is refused rather than silently cut: continuing from it
//! would not be the run the client asked for.

use super::choice::Choice;
use super::request::{EngineRequest, Limits, Resume};
use super::EngineError;
use crate::sampler::Sampled;
use crate::tokenizer::Tokenizer;

/// Checks `resume` against its request, whose choices may generate `max_tokens` each.
pub(super) fn validate(
    resume: &Resume,
    request: &EngineRequest,
    limits: Limits,
    max_tokens: usize,
) -> Result<(), EngineError> {
    let invalid = |m: String| Err(EngineError::InvalidRequest(m));
    if request.sampling.return_hidden_states {
        return invalid(
            "resume: cannot be combined with return_hidden_states (hidden states of resumed \
             tokens are not kept)"
                .into(),
        );
    }
    if resume.choices.len() != request.n as usize {
        return invalid(format!(
            "resume: has progress for {} choices but the request has n = {}",
            resume.choices.len(),
            request.n
        ));
    }
    let prompt_len = request.prompt.len();
    for (index, choice) in resume.choices.iter().enumerate() {
        let generated = choice.tokens.len();
        if let Some(&bad) = choice
            .tokens
            .iter()
            .find(|&&t| t as usize >= limits.vocab_size)
        {
            return invalid(format!(
                "resume: choice {index} has token id {bad}, outside the vocabulary of {}",
                limits.vocab_size
            ));
        }
        if generated > max_tokens {
            return invalid(format!(
                "resume: choice {index} has {generated} tokens, more than max_tokens \
                 ({max_tokens}) allows"
            ));
        }
        if prompt_len + generated > limits.context_length {
            return invalid(format!(
                "resume: the prompt ({prompt_len} tokens) and choice {index}'s {generated} \
                 tokens exceed the model's context of {} tokens",
                limits.context_length
            ));
        }
    }
    if resume.choices.iter().all(|c| c.finished) {
        return invalid("resume: every choice has already finished; nothing is left to run".into());
    }
    Ok(())
}

/// Whether `resume` carries generated tokens (a fresh start otherwise, whatever it says).
pub(super) fn has_progress(resume: Option<&Resume>) -> bool {
    resume.is_some_and(|r| r.choices.iter().any(|c| c.finished || !c.tokens.is_empty()))
}

/// The progress of choice `index`: its tokens and whether it had finished.
pub(super) fn progress(resume: Option<&Resume>, index: u32) -> (&[u32], bool) {
    resume
        .and_then(|r| r.choices.get(index as usize))
        .map_or((&[], false), |c| (c.tokens.as_slice(), c.finished))
}

impl Choice {
    /// Brings the choice to where an uninterrupted run had it after generating `tokens`,
    /// each taken as if just sampled; the text they produce is dropped. Fails if the
    /// grammar forbids one of them or the choice would have ended on one of them (an
    /// unfinished choice must still be running after its last token).
    pub(super) fn replay(
        &mut self,
        tokenizer: &Tokenizer,
        tokens: &[u32],
    ) -> Result<(), EngineError> {
        let index = self.index;
        let mismatch = |position: usize, token: u32, why: &str| {
            Err(EngineError::InvalidRequest(format!(
                "resume: the progress does not match the request: choice {index}'s token \
                 {token} (at position {position} of its tokens) {why}"
            )))
        };
        for (position, &token) in tokens.iter().enumerate() {
            // The original draw computed the grammar's mask before the token was taken;
            // doing the same keeps the grammar's state identical, and checks the token.
            if let Some(grammar) = self.grammar.as_mut() {
                if !grammar.allows(token) {
                    return mismatch(position, token, "is not allowed by the constraint");
                }
            }
            self.sampler.replay(token);
            let sampled = Sampled {
                token,
                logprob: None,
                top: Vec::new(),
            };
            if self.absorb(tokenizer, &sampled).finish.is_some() {
                return mismatch(position, token, "would have ended the choice");
            }
        }
        Ok(())
    }
}
