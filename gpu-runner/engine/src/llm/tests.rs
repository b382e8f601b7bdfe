//! The engine loop against a deterministic fake backend that really pages its "KV": it
//! stores each token in the block and slot the block table names, and computes logits
//! only from what it reads back through the table. Any bookkeeping bug (a wrong block, a
//! prefix-cache hit on the wrong content, a missed recompute) changes the output.

use std::sync::Arc;

use fallow_protocol::job::{FinishReason, Sampling};

use super::*;
use crate::backend::{forward_step_on_host, BackendError, StepMasks};
use crate::model::ModelConfig;
use crate::tokenizer::GgufVocab;

/// Letters a–z are ids 0–25, then `<|im_end|>` (EOS) and a space.
const VOCAB: usize = 28;
const EOS: u32 = 26;

#[derive(Clone, Copy)]
enum Rule {
    /// Next = last + 1 (so 'z' is followed by EOS).
    Successor,
    /// Next = (sum of all tokens so far + length) mod 26: depends on the whole history.
    HistorySum,
}

struct FakeBackend {
    config: ModelConfig,
    /// Claims to draw sampled tokens itself (it draws them on the host, by the same
    /// definition a device backend follows); counts the rows it drew.
    draws: Option<Arc<std::sync::atomic::AtomicUsize>>,
    block_size: usize,
    kv: Vec<Option<u32>>,
    rule: Rule,
    /// Height of the winning logit; low values make sampling interesting.
    peak: f32,
}

impl FakeBackend {
    fn new(rule: Rule, num_blocks: usize, block_size: usize, peak: f32) -> Self {
        let config = crate::model::config::from_hf_json(&serde_json::json!({
            "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8,
            "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": VOCAB,
            "max_position_embeddings": 256,
        }))
        .unwrap();
        FakeBackend {
            config,
            draws: None,
            block_size,
            kv: vec![None; num_blocks * block_size],
            rule,
            peak,
        }
    }

    /// This backend drawing sampled tokens itself; the counter counts its draws.
    fn drawing(mut self, counter: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        self.draws = Some(Arc::clone(counter));
        self
    }

    fn slot(&self, table: &[u32], pos: usize) -> Result<usize, BackendError> {
        let block = table
            .get(pos / self.block_size)
            .ok_or_else(|| BackendError::InvalidBatch(format!("position {pos} has no block")))?;
        Ok(*block as usize * self.block_size + pos % self.block_size)
    }

    fn history(&self, table: &[u32], len: usize) -> Result<Vec<u32>, BackendError> {
        (0..len)
            .map(|pos| {
                self.kv[self.slot(table, pos)?]
                    .ok_or_else(|| BackendError::InvalidBatch(format!("position {pos} unwritten")))
            })
            .collect()
    }
}

impl Backend for FakeBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.kv.len() / self.block_size
    }
    fn draws_on_device(&self) -> bool {
        self.draws.is_some()
    }
    fn forward_step(
        &mut self,
        batch: &[SeqSlice<'_>],
        masks: &mut dyn StepMasks,
    ) -> Result<StepOutput, BackendError> {
        if let Some(counter) = &self.draws {
            let drawn = batch
                .iter()
                .filter(|s| matches!(s.logits, LogitsMode::Draw(_) | LogitsMode::DrawMasked(_)))
                .count();
            counter.fetch_add(drawn, std::sync::atomic::Ordering::Relaxed);
        }
        forward_step_on_host(self, batch, masks)
    }
    fn forward(&mut self, batch: &[SeqSlice<'_>]) -> Result<Vec<f32>, BackendError> {
        let mut out = Vec::new();
        for slice in batch {
            for (i, &token) in slice.tokens.iter().enumerate() {
                let slot = self.slot(slice.block_table, slice.start_pos + i)?;
                self.kv[slot] = Some(token);
            }
            if slice.logits == LogitsMode::Last {
                let history =
                    self.history(slice.block_table, slice.start_pos + slice.tokens.len())?;
                let next = match self.rule {
                    Rule::Successor => (history[history.len() - 1] + 1) % VOCAB as u32,
                    Rule::HistorySum => (history.iter().sum::<u32>() + history.len() as u32) % 26,
                };
                let mut row = vec![0.0f32; VOCAB];
                row[next as usize] = self.peak;
                out.extend(row);
            }
        }
        Ok(out)
    }
}

fn tokenizer() -> Arc<Tokenizer> {
    let mut tokens: Vec<String> = (b'a'..=b'z').map(|c| (c as char).to_string()).collect();
    tokens.push("<|im_end|>".into());
    tokens.push("Ġ".into());
    let mut types = vec![1; 26];
    types.extend([3, 1]);
    let vocab = GgufVocab {
        model: "gpt2".into(),
        tokens,
        token_types: Some(types),
        eos_id: Some(EOS),
        ..GgufVocab::default()
    };
    Arc::new(Tokenizer::from_gguf_vocab(&vocab).unwrap())
}

fn engine_with(backend: FakeBackend, max_num_seqs: usize, max_batched_tokens: usize) -> LlmEngine {
    let config = EngineConfig {
        max_num_seqs,
        max_batched_tokens,
        enable_prefix_cache: true,
    };
    LlmEngine::new(Box::new(backend), tokenizer(), config)
}

fn engine(rule: Rule) -> LlmEngine {
    engine_with(FakeBackend::new(rule, 64, 4, 10.0), 8, 32)
}

fn greedy(max_tokens: u32) -> Sampling {
    Sampling {
        temperature: 0.0,
        max_tokens: Some(max_tokens),
        ..Sampling::default()
    }
}

fn request(id: u64, prompt: Vec<u32>, sampling: Sampling) -> EngineRequest {
    EngineRequest {
        adapter: None,
        id,
        prompt,
        sampling,
        n: 1,
        priority: 0,
        resume: None,
    }
}

/// Steps until idle, collecting every output.
fn run_all(engine: &mut LlmEngine) -> Vec<SeqOutput> {
    let mut outputs = Vec::new();
    for _ in 0..10_000 {
        if !engine.has_work() {
            return outputs;
        }
        outputs.extend(engine.step().unwrap());
    }
    panic!("engine did not drain");
}

/// (text, tokens, finish, matched_stop) of one choice.
fn choice(
    outputs: &[SeqOutput],
    id: u64,
    index: u32,
) -> (
    String,
    Vec<u32>,
    Option<FinishReason>,
    Option<serde_json::Value>,
) {
    let mine: Vec<&SeqOutput> = outputs
        .iter()
        .filter(|o| o.request_id == id && o.index == index)
        .collect();
    let text = mine.iter().map(|o| o.text.as_str()).collect();
    let tokens = mine.iter().flat_map(|o| o.token_ids.clone()).collect();
    let last = mine.last().unwrap();
    (text, tokens, last.finish, last.matched_stop.clone())
}

#[path = "tests_behaviour.rs"]
mod behaviour;
#[path = "tests_constrained.rs"]
mod constrained;
#[path = "tests_resume.rs"]
mod resume;
