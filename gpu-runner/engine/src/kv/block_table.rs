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
    /// The parent hash of the first block: `None`, or a namespace (a LoRA adapter's) whose
    /// sequences share cached blocks only among themselves.
    pub(super) root: Option<BlockHash>,
}

impl BlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose blocks are named under `root` (see [`super::hash::namespace_root`]).
    pub fn in_namespace(root: Option<BlockHash>) -> Self {
        BlockTable {
            root,
            ..Self::default()
        }
    }

    /// The parent hash of the next block to be named.
    pub(super) fn last_hash(&self) -> Option<BlockHash> {
        self.hashes.last().copied().or(self.root)
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
