//! Continuous batching under one token budget per step (vLLM v1 style) — pure: no backend,
//! no tokenizer, only token ids and block bookkeeping.
//!
//! Every step, [`Batcher::schedule`] spends `max_batched_tokens` on, in order:
//! 1. running decodes (one token each), so streams keep flowing;
//! 2. running prefills, chunked to what is left of the budget, so a long prompt never
//!    stalls running streams;
//! 3. waiting sequences, best first (lower `priority` value, then earlier arrival), while
//!    `max_num_seqs` and the free blocks allow.
//!
//! When blocks run out, the least important running sequence (highest priority value,
//! then youngest) is preempted by recompute: it loses its blocks and goes back to waiting
//! with its tokens, and is re-prefilled later (mostly from the prefix cache). A waiting
//! sequence of strictly better priority may preempt a worse running one the same way.
//!
//! The engine then runs the [`ScheduledStep`], calls [`Batcher::complete_step`], and for
//! every entry that wanted logits either [`Batcher::append_token`]s the sampled token or
//! [`Batcher::finish`]es the sequence.

mod schedule;
mod sequence;

use std::collections::{BTreeSet, HashMap};

use crate::kv::{BlockHash, BlockManager};
use sequence::{SeqKey, Sequence};

/// The batcher's name for one sequence (one choice of one request).
pub type SeqId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatcherConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens (decodes + prefill chunks) in one step.
    pub max_batched_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatcherError {
    #[error("sequence {0} already exists")]
    Duplicate(SeqId),
    #[error("sequence {0} has no tokens")]
    Empty(SeqId),
    #[error("sequence {id} may reach {max_len} positions = {needed} KV blocks, but the pool has {total}")]
    TooLong {
        id: SeqId,
        max_len: usize,
        needed: usize,
        total: usize,
    },
    #[error("unknown sequence {0}")]
    Unknown(SeqId),
    #[error("sequence {0} has uncomputed tokens and cannot take a new one")]
    NotReady(SeqId),
}

/// One sequence's share of a step: run `tokens[start..end]` at positions `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    pub start: usize,
    pub end: usize,
    /// True when `end` reaches the sequence's last token: its logits give the next token.
    pub wants_logits: bool,
}

impl ScheduledSeq {
    pub fn num_tokens(&self) -> usize {
        self.end - self.start
    }
}

/// What to run this step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduledStep {
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences that lost their blocks this step (they will be recomputed).
    pub preempted: Vec<SeqId>,
}

impl ScheduledStep {
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(ScheduledSeq::num_tokens).sum()
    }
}

/// Waiting and running sequences plus the block pool they share.
#[derive(Debug)]
pub struct Batcher {
    config: BatcherConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    waiting: BTreeSet<SeqKey>,
    running: BTreeSet<SeqKey>,
    /// Reused snapshot of `running` while scheduling mutates it.
    scratch: Vec<SeqKey>,
    /// Preemptions since start (a metric: non-zero means the KV pool is too small).
    total_preemptions: u64,
}

impl Batcher {
    pub fn new(config: BatcherConfig, blocks: BlockManager) -> Self {
        Batcher {
            config,
            blocks,
            seqs: HashMap::new(),
            waiting: BTreeSet::new(),
            running: BTreeSet::new(),
            scratch: Vec::new(),
            total_preemptions: 0,
        }
    }

    /// Queues a sequence whose `tokens` (the prompt) are all still to be computed and which
    /// may grow to `max_len` positions. `arrival` orders sequences of equal priority (the
    /// choices of one request share it).
    pub fn add(
        &mut self,
        id: SeqId,
        tokens: Vec<u32>,
        max_len: usize,
        priority: i32,
        arrival: u64,
    ) -> Result<(), BatcherError> {
        self.add_in(id, tokens, max_len, priority, arrival, None)
    }

    /// [`Batcher::add`] within a prefix-cache namespace (see [`crate::kv::BlockTable::in_namespace`]):
    /// the sequence shares cached blocks only with sequences of the same namespace.
    pub fn add_in(
        &mut self,
        id: SeqId,
        tokens: Vec<u32>,
        max_len: usize,
        priority: i32,
        arrival: u64,
        namespace: Option<BlockHash>,
    ) -> Result<(), BatcherError> {
        if self.seqs.contains_key(&id) {
            return Err(BatcherError::Duplicate(id));
        }
        if tokens.is_empty() {
            return Err(BatcherError::Empty(id));
        }
        let max_len = max_len.max(tokens.len());
        let needed = self.blocks.blocks_for(max_len);
        if needed > self.blocks.num_blocks() {
            return Err(BatcherError::TooLong {
                id,
                max_len,
                needed,
                total: self.blocks.num_blocks(),
            });
        }
        let key = SeqKey {
            priority,
            arrival,
            id,
        };
        self.seqs.insert(id, Sequence::new(key, tokens, namespace));
        self.waiting.insert(key);
        Ok(())
    }

    /// Appends a sampled token to a sequence whose tokens are all computed.
    pub fn append_token(&mut self, id: SeqId, token: u32) -> Result<(), BatcherError> {
        let seq = self.seqs.get_mut(&id).ok_or(BatcherError::Unknown(id))?;
        if seq.num_computed != seq.tokens.len() {
            return Err(BatcherError::NotReady(id));
        }
        seq.tokens.push(token);
        Ok(())
    }

    /// Records that `step` ran: advances each sequence's computed prefix and names its new
    /// full blocks in the prefix cache.
    pub fn complete_step(&mut self, step: &ScheduledStep) {
        for entry in &step.seqs {
            let Some(seq) = self.seqs.get_mut(&entry.seq_id) else {
                continue; // aborted between schedule and completion
            };
            if seq.num_computed == entry.start && entry.end <= seq.tokens.len() {
                seq.num_computed = entry.end;
                self.blocks
                    .commit_full_blocks(&mut seq.table, &seq.tokens[..entry.end]);
            }
        }
    }

    /// Removes a sequence (finished or aborted) and frees its blocks at once. Returns
    /// whether it existed; a second call is a no-op.
    pub fn finish(&mut self, id: SeqId) -> bool {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.waiting.remove(&seq.key);
        self.running.remove(&seq.key);
        self.blocks.free(&mut seq.table);
        true
    }

    /// Same as [`Batcher::finish`]; named for the caller's intent.
    pub fn abort(&mut self, id: SeqId) -> bool {
        self.finish(id)
    }

    pub fn tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.tokens.as_slice())
    }

    pub fn block_table(&self, id: SeqId) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.table.blocks())
    }

    /// Prompt tokens served from the prefix cache at the sequence's first admission.
    pub fn cached_prompt_tokens(&self, id: SeqId) -> Option<usize> {
        self.seqs.get(&id).and_then(|s| s.cached_prompt_tokens)
    }

    /// How many times the sequence lost its blocks.
    pub fn num_preemptions(&self, id: SeqId) -> Option<u32> {
        self.seqs.get(&id).map(|s| s.num_preemptions)
    }

    /// Preemptions since the batcher started.
    pub fn total_preemptions(&self) -> u64 {
        self.total_preemptions
    }

    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn config(&self) -> BatcherConfig {
        self.config
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// Checks that block ref counts match the live tables and that waiting sequences hold
    /// no blocks (tests).
    pub fn check_consistency(&self) -> Result<(), String> {
        for key in &self.waiting {
            match self.seqs.get(&key.id) {
                Some(seq) if seq.table.is_empty() => {}
                Some(_) => return Err(format!("waiting sequence {} holds blocks", key.id)),
                None => return Err(format!("waiting sequence {} is unknown", key.id)),
            }
        }
        if self.waiting.len() + self.running.len() != self.seqs.len() {
            return Err("a sequence is neither waiting nor running".into());
        }
        self.blocks
            .check_consistency(self.seqs.values().map(|s| &s.table))
    }
}

#[cfg(test)]
mod tests;
