//! A decoder embedding model (Qwen3-Embedding style) on the engine's own CPU backend:
//! prefill only, causal attention, and the final-norm hidden states that
//! [`Backend::hidden_rows`] keeps, pooled (usually the last token's row).
//!
//! Each call builds a backend over a scratch KV pool sized for its inputs and drops it on
//! return: embeddings keep no cache between calls, so memory is held only while they run.
//! The backend also computes the LM head's logits for the pooled rows (one row per input
//! for last-token pooling: a few percent of the prefill's work), which are dropped.

use std::path::Path;

use crate::backend::cpu::{CpuBackend, KvDtype};
use crate::backend::{Backend, LogitsMode, SeqSlice};
use crate::model::{self, ModelArtifacts};

use super::pooling::Pooling;
use super::EmbedError;

/// Tokens per scratch KV block.
const BLOCK_SIZE: usize = 16;

/// Most tokens in one forward pass: bounds the activations (and the logits the backend
/// computes alongside) whatever the batch; inputs beyond it run in further passes.
const TOKENS_PER_PASS: usize = 4096;

pub(crate) struct Decoder {
    artifacts: ModelArtifacts,
}

impl Decoder {
    /// Opens an HF directory or a GGUF file.
    pub(crate) fn open(dir: &Path) -> Result<Decoder, EmbedError> {
        let mut artifacts = model::open(dir)?;
        artifacts.use_cpu_layout();
        Ok(Decoder { artifacts })
    }

    pub(crate) fn hidden(&self) -> usize {
        self.artifacts.config.hidden
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.artifacts.config.vocab_size
    }

    /// Where the model's tokenizer comes from.
    pub(crate) fn vocab(&self) -> &model::VocabSource {
        &self.artifacts.vocab
    }

    pub(crate) fn context_length(&self) -> usize {
        self.artifacts.config.context_length
    }

    /// One pooled (unnormalised) vector per input, in order. Inputs are checked by the
    /// caller (non-empty, within the context, ids below the vocabulary).
    pub(crate) fn pooled(
        &self,
        inputs: &[&[u32]],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let passes = passes(inputs);
        let most_blocks = passes
            .iter()
            .map(|p| {
                inputs[p.clone()]
                    .iter()
                    .map(|ids| blocks_for(ids.len()))
                    .sum()
            })
            .max()
            .unwrap_or(0);
        if most_blocks == 0 {
            return Ok(Vec::new());
        }
        // f32 KV: the vectors are compared against f32 references, and the pool lives only
        // for this call.
        let mut backend =
            CpuBackend::with_kv_dtype(&self.artifacts, most_blocks, BLOCK_SIZE, KvDtype::F32)
                .map_err(|e| EmbedError::Backend(e.to_string()))?;
        // Last-token pooling needs one row per input; any other mode needs them all.
        let mode = match pooling {
            Pooling::LastToken => LogitsMode::Last,
            _ => LogitsMode::All,
        };
        let hidden = self.hidden();
        let mut out = Vec::with_capacity(inputs.len());
        for pass in passes {
            let group = &inputs[pass];
            let mut tables = Vec::with_capacity(group.len());
            let mut next = 0u32;
            for ids in group {
                let n = blocks_for(ids.len()) as u32;
                tables.push((next..next + n).collect::<Vec<u32>>());
                next += n;
            }
            let batch: Vec<SeqSlice<'_>> = group
                .iter()
                .zip(&tables)
                .map(|(ids, table)| SeqSlice {
                    adapter: None,
                    tokens: ids,
                    start_pos: 0,
                    block_table: table,
                    logits: mode,
                })
                .collect();
            let logits = backend
                .forward(&batch)
                .map_err(|e| EmbedError::Backend(e.to_string()))?;
            backend.recycle_logits(logits);
            let rows = backend
                .hidden_rows()
                .ok_or_else(|| EmbedError::Backend("the backend kept no hidden states".into()))?;
            let mut at = 0;
            for ids in group {
                let n = if mode == LogitsMode::Last {
                    1
                } else {
                    ids.len()
                };
                let mine = rows.get(at * hidden..(at + n) * hidden).ok_or_else(|| {
                    EmbedError::Backend("the backend returned too few hidden rows".into())
                })?;
                out.push(pooling.pool(mine, hidden));
                at += n;
            }
        }
        Ok(out)
    }
}

fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_SIZE)
}

/// Consecutive runs of inputs of at most [`TOKENS_PER_PASS`] tokens (an input longer than
/// that runs alone).
fn passes(inputs: &[&[u32]]) -> Vec<std::ops::Range<usize>> {
    let mut passes = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, ids) in inputs.iter().enumerate() {
        if i > start && tokens + ids.len() > TOKENS_PER_PASS {
            passes.push(start..i);
            (start, tokens) = (i, 0);
        }
        tokens += ids.len();
    }
    if start < inputs.len() {
        passes.push(start..inputs.len());
    }
    passes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_fill_up_to_the_token_budget_and_a_long_input_runs_alone() {
        let short = vec![0u32; 1000];
        let long = vec![0u32; TOKENS_PER_PASS + 1];
        let inputs: Vec<&[u32]> = vec![&short, &short, &short, &short, &long, &short];
        assert_eq!(passes(&inputs), vec![0..4, 4..5, 5..6]);
        assert!(passes(&[]).is_empty());
    }
}
