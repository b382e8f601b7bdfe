//! The "postprocess" third of a step: sample, detokenize, check stops, report, free.

use super::{EngineError, LlmEngine, SeqOutput};
use crate::batcher::SeqId;
use crate::sampler::Sampled;

/// What the backend returned for one sequence.
pub(super) enum Row<'a> {
    /// Its logits, to sample from.
    Logits(&'a [f32]),
    /// Its token, already picked by the backend (greedy or drawn, with logprobs if asked).
    Picked(&'a Sampled),
}

impl LlmEngine {
    /// Handles one sequence's output row, given what [`LlmEngine::sample_rows`] drew for
    /// it (for a logits row). `None` if the sequence is gone (aborted).
    pub(super) fn postprocess(
        &mut self,
        seq: SeqId,
        row: &Row<'_>,
        drawn: Option<Sampled>,
    ) -> Result<Option<SeqOutput>, EngineError> {
        let Some(choice) = self.choices.get_mut(&seq) else {
            return Ok(None);
        };
        let sampled = match (row, drawn) {
            (Row::Picked(picked), _) => self.sampler.take_picked(picked, &mut choice.sampler),
            (Row::Logits(_), Some(sampled)) => sampled,
            (Row::Logits(_), None) => {
                return Err(EngineError::Internal(format!(
                    "sequence {seq} has logits but drew no token"
                )))
            }
        };
        let delta = choice.absorb(&self.tokenizer, &sampled);
        let hidden_states = (delta.finish.is_some() && choice.want_hidden)
            .then(|| std::mem::take(&mut choice.hidden));
        let routed_experts = (delta.finish.is_some() && choice.want_routes)
            .then(|| std::mem::take(&mut choice.routes));
        let (request_id, index) = (choice.request_id, choice.index);
        let state = self.requests.get_mut(&request_id).ok_or_else(|| {
            EngineError::Internal(format!("sequence {seq} outlived request {request_id}"))
        })?;
        state.usage.completion_tokens += 1;
        if !state.first_token_seen {
            // The first choice to get here ran the prompt; its cache hits are the request's.
            state.first_token_seen = true;
            state.usage.cached_tokens = self.batcher.cached_prompt_tokens(seq).unwrap_or(0) as u32;
        }
        let usage = state.usage;
        if delta.finish.is_some() {
            state.live.retain(|&s| s != seq);
            if state.is_done() {
                self.requests.remove(&request_id);
            }
            self.batcher.finish(seq);
            self.choices.remove(&seq);
        } else {
            self.batcher
                .append_token(seq, sampled.token)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
        }
        Ok(Some(SeqOutput {
            request_id,
            index,
            text: delta.text,
            token_ids: vec![sampled.token],
            logprobs: delta.logprobs,
            finish: delta.finish,
            matched_stop: delta.matched_stop,
            usage,
            hidden_states,
            routed_experts,
        }))
    }
}
