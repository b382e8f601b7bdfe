//! What one engine step reports per choice ([`SeqOutput`]) and the engine's load
//! ([`EngineStats`]).

use fallow_protocol::job::{FinishReason, TokenLogprob, TopLogprob, Usage};

use crate::sampler::Sampled;
use crate::tokenizer::Tokenizer;

/// New output of one choice in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqOutput {
    pub request_id: u64,
    /// The choice index, `0..n`.
    pub index: u32,
    /// New text to stream (may be empty: held back for a possible stop string, or an
    /// incomplete UTF-8 character).
    pub text: String,
    /// Tokens generated this step (including a final stop token, whose text is dropped).
    pub token_ids: Vec<u32>,
    /// Per token whose text belongs to the output, when the request asked for logprobs.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Set on the choice's last output.
    pub finish: Option<FinishReason>,
    /// The stop string (as a JSON string) or stop token id (number) that ended the choice.
    pub matched_stop: Option<serde_json::Value>,
    /// The whole request so far: completion tokens of all choices, cached prompt tokens.
    pub usage: Usage,
    /// On the choice's last output, when the request asked for it: the last layer's hidden
    /// state (after the final norm) at the position that produced the last token.
    pub hidden_states: Option<Vec<f32>>,
    /// On the choice's last output, when the request asked for it: the expert ids of every
    /// position it ran, `[position][routed layer][experts per token]`.
    pub routed_experts: Option<Vec<u32>>,
}

/// The engine's load, for metrics and placement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    /// Waiting sequences, including choices held back for prefix sharing.
    pub waiting: usize,
    pub free_blocks: usize,
    pub total_blocks: usize,
    /// Share of KV blocks in use, 0–100.
    pub kv_usage_percent: f32,
    pub requests: usize,
    /// Sequences preempted (recomputed) since start.
    pub preemptions: u64,
}

/// Converts a sampled token's logprobs into the wire shape.
pub(super) fn token_logprob(tokenizer: &Tokenizer, sampled: &Sampled) -> Option<TokenLogprob> {
    let logprob = sampled.logprob?;
    Some(TokenLogprob {
        token: tokenizer.token_text(sampled.token),
        logprob,
        bytes: tokenizer.token_bytes(sampled.token),
        top_logprobs: sampled
            .top
            .iter()
            .map(|&(id, logprob)| TopLogprob {
                token: tokenizer.token_text(id),
                logprob,
                bytes: tokenizer.token_bytes(id),
            })
            .collect(),
    })
}
