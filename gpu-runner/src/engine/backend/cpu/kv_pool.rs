//! The paged KV cache of the CPU backend: per layer, K and V arrays shaped
//! `[num_blocks, block_size, n_kv_heads, head_dim]`, addressed through a sequence's block
//! table. Stored as f32: on CPU the cache is small next to the weights for the models we
//! serve, and f32 avoids a conversion in the innermost attention loop.

use crate::engine::model::ModelConfig;

/// Bytes one KV block costs across all layers (K and V, f32).
pub fn kv_bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
    config.n_layers * 2 * block_size * config.kv_dim() * std::mem::size_of::<f32>()
}

/// How many whole blocks fit in `budget_bytes` (0 if not even one does).
pub fn num_blocks_for_budget(
    config: &ModelConfig,
    block_size: usize,
    budget_bytes: usize,
) -> usize {
    budget_bytes / kv_bytes_per_block(config, block_size).max(1)
}

pub struct KvPool {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    block_size: usize,
    num_blocks: usize,
    /// Floats per token slot: `n_kv_heads · head_dim`.
    row: usize,
}

impl KvPool {
    /// Allocates the pool; `None` if its size overflows.
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Option<Self> {
        let row = config.kv_dim();
        let per_layer = num_blocks.checked_mul(block_size)?.checked_mul(row)?;
        let alloc = || {
            (0..config.n_layers)
                .map(|_| vec![0f32; per_layer])
                .collect::<Vec<_>>()
        };
        Some(KvPool {
            k: alloc(),
            v: alloc(),
            block_size,
            num_blocks,
            row,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Offset of the slot holding position `pos` of a sequence with `block_table`.
    /// Callers validate the table first (long enough, ids in range).
    #[inline]
    pub fn slot_offset(&self, block_table: &[u32], pos: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        (block * self.block_size + pos % self.block_size) * self.row
    }

    /// Stores one token's K and V rows (`n_kv_heads · head_dim` each) for `layer`.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let off = self.slot_offset(block_table, pos);
        self.k[layer][off..off + self.row].copy_from_slice(k);
        self.v[layer][off..off + self.row].copy_from_slice(v);
    }

    /// The whole K and V arrays of a layer.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }
}
