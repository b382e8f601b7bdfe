//! Builders shared by the api's unit tests.

use fallow_protocol::job::{ChoiceResult, Completion, FinishReason, Usage};

/// A finished job whose choices (stopped normally) hold `texts`, in order.
pub fn completion(texts: &[&str], usage: Usage) -> Completion {
    Completion {
        choices: texts
            .iter()
            .enumerate()
            .map(|(i, t)| ChoiceResult {
                index: i as u32,
                text: (*t).to_owned(),
                finish_reason: FinishReason::Stop,
                matched_stop: None,
                logprobs: None,
                hidden_states: None,
                routed_experts: None,
            })
            .collect(),
        usage,
        ..Default::default()
    }
}
