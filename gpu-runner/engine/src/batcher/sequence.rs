//! The batcher's record of one sequence.

use super::SeqId;
use crate::kv::{BlockHash, BlockTable};

/// Orders sequences by importance: lower priority value first, then earlier arrival, then
/// id. The least important running sequence is the last one, the preemption victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct SeqKey {
    pub(super) priority: i32,
    pub(super) arrival: u64,
    pub(super) id: SeqId,
}

#[derive(Debug)]
pub(super) struct Sequence {
    pub(super) key: SeqKey,
    /// Prompt followed by the generated tokens.
    pub(super) tokens: Vec<u32>,
    /// Leading tokens whose KV is in `table`'s blocks.
    pub(super) num_computed: usize,
    pub(super) table: BlockTable,
    /// Set at the first admission; later re-admissions after preemption do not change it.
    pub(super) cached_prompt_tokens: Option<usize>,
    pub(super) num_preemptions: u32,
}

impl Sequence {
    pub(super) fn new(key: SeqKey, tokens: Vec<u32>, namespace: Option<BlockHash>) -> Self {
        Sequence {
            key,
            tokens,
            num_computed: 0,
            table: BlockTable::in_namespace(namespace),
            cached_prompt_tokens: None,
            num_preemptions: 0,
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }
}
