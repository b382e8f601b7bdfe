//! The paged KV cache of the CPU backend: per layer, K and V arrays shaped
//! `[num_blocks, n_kv_heads, block_size, head_dim]`, addressed through a sequence's block
//! table. Head-major within a block because attention reads one KV head's rows position
//! after position: that way they are adjacent in memory (a block's worth at a time)
//! instead of one head-sized piece out of every slot.
//!
//! Stored as f16 by default, as llama.cpp does: rounding K/V the way llama.cpp rounds them
//! keeps our greedy decoding on llama.cpp's path at near-ties, and the same memory budget
//! holds twice the blocks. Attention converts on read inside its inner loops
//! ([`super::attention`]). f32 storage stays selectable ([`KvDtype::F32`]) for exactness checks.

use half::{f16, slice::HalfFloatSliceExt};

use crate::model::ModelConfig;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// IEEE half precision, round-to-nearest-even on write (llama.cpp's default cache type).
    #[default]
    F16,
    F32,
}

impl KvDtype {
    pub fn size_bytes(self) -> usize {
        match self {
            KvDtype::F16 => std::mem::size_of::<f16>(),
            KvDtype::F32 => std::mem::size_of::<f32>(),
        }
    }
}

/// Bytes one KV block costs across all layers (K and V) with the default element type.
pub fn kv_bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
    kv_bytes_per_block_as(config, block_size, KvDtype::default())
}

/// Bytes one KV block costs across all layers (K and V) stored as `dtype`.
pub fn kv_bytes_per_block_as(config: &ModelConfig, block_size: usize, dtype: KvDtype) -> usize {
    config.n_layers * 2 * block_size * config.kv_dim() * dtype.size_bytes()
}

/// How many whole blocks of the default element type fit in `budget_bytes` (0 if not even
/// one does).
pub fn num_blocks_for_budget(
    config: &ModelConfig,
    block_size: usize,
    budget_bytes: usize,
) -> usize {
    budget_bytes / kv_bytes_per_block(config, block_size).max(1)
}

/// One layer's K and V arrays, in whichever element type the pool stores.
pub enum KvLayer<'a> {
    F16 { k: &'a [f16], v: &'a [f16] },
    F32 { k: &'a [f32], v: &'a [f32] },
}

enum Store {
    F16 { k: Vec<Vec<f16>>, v: Vec<Vec<f16>> },
    F32 { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
}

pub struct KvPool {
    store: Store,
    block_size: usize,
    num_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

/// `n_layers` zeroed arrays of `per_layer` elements each.
fn alloc<T: Clone>(n_layers: usize, per_layer: usize, zero: T) -> Vec<Vec<T>> {
    (0..n_layers)
        .map(|_| vec![zero.clone(); per_layer])
        .collect()
}

impl KvPool {
    /// Allocates the pool; `None` if its size overflows.
    pub fn new(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Option<Self> {
        let row = config.kv_dim();
        let per_layer = num_blocks.checked_mul(block_size)?.checked_mul(row)?;
        per_layer.checked_mul(dtype.size_bytes())?;
        let n = config.n_layers;
        let store = match dtype {
            KvDtype::F16 => Store::F16 {
                k: alloc(n, per_layer, f16::ZERO),
                v: alloc(n, per_layer, f16::ZERO),
            },
            KvDtype::F32 => Store::F32 {
                k: alloc(n, per_layer, 0f32),
                v: alloc(n, per_layer, 0f32),
            },
        };
        Some(KvPool {
            store,
            block_size,
            num_blocks,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Offset, in a layer's K or V array, of KV head `kv_head`'s row in slot `slot` of
    /// block `block`. Callers validate the block id first (in range).
    #[inline]
    pub fn head_row_offset(&self, block: usize, kv_head: usize, slot: usize) -> usize {
        ((block * self.n_kv_heads + kv_head) * self.block_size + slot) * self.head_dim
    }

    /// Stores one token's K and V rows (`n_kv_heads · head_dim` each) for `layer`,
    /// rounding to nearest-even when the pool holds f16.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let block = block_table[pos / self.block_size] as usize;
        let slot = pos % self.block_size;
        let hd = self.head_dim;
        for h in 0..self.n_kv_heads {
            let off = self.head_row_offset(block, h, slot);
            let (kh, vh) = (&k[h * hd..][..hd], &v[h * hd..][..hd]);
            match &mut self.store {
                Store::F16 { k: ks, v: vs } => {
                    ks[layer][off..off + hd].convert_from_f32_slice(kh);
                    vs[layer][off..off + hd].convert_from_f32_slice(vh);
                }
                Store::F32 { k: ks, v: vs } => {
                    ks[layer][off..off + hd].copy_from_slice(kh);
                    vs[layer][off..off + hd].copy_from_slice(vh);
                }
            }
        }
    }

    /// The whole K and V arrays of a layer.
    pub fn layer(&self, layer: usize) -> KvLayer<'_> {
        match &self.store {
            Store::F16 { k, v } => KvLayer::F16 {
                k: &k[layer],
                v: &v[layer],
            },
            Store::F32 { k, v } => KvLayer::F32 {
                k: &k[layer],
                v: &v[layer],
            },
        }
    }
}
