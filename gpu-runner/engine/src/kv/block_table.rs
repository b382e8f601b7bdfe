//! One sequence's physical KV blocks, in position order.

use super::hash::BlockHash;

/// The blocks holding one sequence's KV, plus the chained hashes of its leading full blocks
/// that have been committed to the prefix cache (`hashes.len() <= blocks.len()`).
///
/// Only [`super::BlockManager`] changes a table, so its ref counts stay exact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    pub(super) blocks: Vec<u32>,
    pub(super) hashes: Vec<BlockHash>,
}

impl BlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Physical block ids, block `i` covering positions `i*block_size .. (i+1)*block_size`.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// How many leading full blocks are named in the prefix cache.
    pub fn num_hashed(&self) -> usize {
        self.hashes.len()
    }
}
