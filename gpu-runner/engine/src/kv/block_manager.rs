//! The block pool: free list, reference counts and the prefix cache (nano-vllm / vLLM v1
//! style). Pure bookkeeping — the backend owns the memory the block ids point into.

use std::collections::HashMap;

use super::free_list::FreeList;
use super::hash::{block_hash, BlockHash};
use super::{blocks_needed, BlockTable};

/// Not enough free blocks for an allocation; nothing was allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: need {needed}, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

/// What a committed full block holds, kept to verify a hash hit (a 64-bit collision must
/// not hand one prompt another prompt's KV).
#[derive(Debug)]
struct CachedBlock {
    hash: BlockHash,
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
}

/// Owns the ids `0..num_blocks` of a backend's KV pool.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    enable_prefix_cache: bool,
    ref_counts: Vec<u32>,
    cached: Vec<Option<CachedBlock>>,
    by_hash: HashMap<BlockHash, u32>,
    free: FreeList,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_cache: bool) -> Self {
        BlockManager {
            block_size: block_size.max(1),
            enable_prefix_cache,
            ref_counts: vec![0; num_blocks],
            cached: (0..num_blocks).map(|_| None).collect(),
            by_hash: HashMap::new(),
            free: FreeList::full(num_blocks),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks nobody references (including cached ones that may still be hit).
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Fraction of the pool referenced by live sequences, 0.0 ..= 1.0.
    pub fn usage(&self) -> f32 {
        match self.num_blocks() {
            0 => 0.0,
            total => 1.0 - self.free.len() as f32 / total as f32,
        }
    }

    /// Blocks needed to hold `num_tokens` positions.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        blocks_needed(num_tokens, self.block_size)
    }

    /// Claims the longest cached prefix of `tokens` for an empty `table` and returns how many
    /// tokens it covers. Only full blocks are shared, and never the last token: that one
    /// must be computed so the sequence gets logits.
    pub fn match_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        if !self.enable_prefix_cache || !table.is_empty() || tokens.is_empty() {
            return 0;
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut parent = table.root;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = block_hash(parent, chunk);
            let Some(block) = self.lookup(hash, parent, chunk) else {
                break;
            };
            if self.ref_counts[block as usize] == 0 {
                self.free.remove(block);
            }
            self.ref_counts[block as usize] += 1;
            table.blocks.push(block);
            table.hashes.push(hash);
            parent = Some(hash);
        }
        table.blocks.len() * self.block_size
    }

    fn lookup(&self, hash: BlockHash, parent: Option<BlockHash>, tokens: &[u32]) -> Option<u32> {
        let block = *self.by_hash.get(&hash)?;
        let cached = self.cached[block as usize].as_ref()?;
        (cached.hash == hash && cached.parent == parent && *cached.tokens == *tokens)
            .then_some(block)
    }

    /// Whether growing `table` to `num_tokens` positions would succeed now.
    pub fn can_allocate(&self, table: &BlockTable, num_tokens: usize) -> bool {
        self.blocks_for(num_tokens).saturating_sub(table.len()) <= self.free.len()
    }

    /// Grows `table` to cover `num_tokens` positions, all or nothing. Fresh blocks come from
    /// the front of the free list, evicting a cached block's identity if it had one.
    pub fn allocate_slots(
        &mut self,
        table: &mut BlockTable,
        num_tokens: usize,
    ) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_for(num_tokens).saturating_sub(table.len());
        if needed > self.free.len() {
            return Err(OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        for _ in 0..needed {
            let Some(block) = self.free.pop_front() else {
                // Unreachable after the length check; fail closed rather than panic.
                return Err(OutOfBlocks { needed, free: 0 });
            };
            self.evict(block);
            self.ref_counts[block as usize] = 1;
            table.blocks.push(block);
        }
        Ok(())
    }

    fn evict(&mut self, block: u32) {
        if let Some(cached) = self.cached[block as usize].take() {
            if self.by_hash.get(&cached.hash) == Some(&block) {
                self.by_hash.remove(&cached.hash);
            }
        }
    }

    /// Names the full blocks among the first `computed.len()` positions (whose KV is now
    /// written) in the prefix cache, so later sequences can share them. A block whose
    /// content another block already holds stays private (it is freed as uncached).
    pub fn commit_full_blocks(&mut self, table: &mut BlockTable, computed: &[u32]) {
        if !self.enable_prefix_cache {
            return;
        }
        let full = (computed.len() / self.block_size).min(table.len());
        for index in table.hashes.len()..full {
            let tokens = &computed[index * self.block_size..(index + 1) * self.block_size];
            let parent = table.last_hash();
            let hash = block_hash(parent, tokens);
            table.hashes.push(hash);
            let block = table.blocks[index];
            if self.cached[block as usize].is_none() && !self.by_hash.contains_key(&hash) {
                self.by_hash.insert(hash, block);
                self.cached[block as usize] = Some(CachedBlock {
                    hash,
                    parent,
                    tokens: tokens.into(),
                });
            }
        }
    }

    /// Drops the table's references and empties it; calling it again is a no-op. Blocks
    /// are released tail first, so a prompt's shared head outlives its private tail in the
    /// cache, and uncached blocks are reused before any cached one is evicted.
    pub fn free(&mut self, table: &mut BlockTable) {
        for &block in table.blocks.iter().rev() {
            let count = &mut self.ref_counts[block as usize];
            *count = count.saturating_sub(1);
            if *count == 0 {
                if self.cached[block as usize].is_some() {
                    self.free.push_back(block);
                } else {
                    self.free.push_front(block);
                }
            }
        }
        table.blocks.clear();
        table.hashes.clear();
    }

    /// Checks the pool's invariants against every live table (tests and debug builds).
    pub fn check_consistency<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a BlockTable>,
    ) -> Result<(), String> {
        let mut counts = vec![0u32; self.num_blocks()];
        for table in tables {
            for &block in table.blocks() {
                counts[block as usize] += 1;
            }
        }
        for (block, (&expected, &actual)) in counts.iter().zip(&self.ref_counts).enumerate() {
            if expected != actual {
                return Err(format!(
                    "block {block}: ref count {actual}, {expected} users"
                ));
            }
            if (actual == 0) != self.free.contains(block as u32) {
                return Err(format!(
                    "block {block}: ref count {actual} but free-list mismatch"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "block_manager_tests.rs"]
mod tests;
