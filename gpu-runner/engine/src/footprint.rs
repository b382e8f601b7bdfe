//! How much memory a model takes where it runs: its weights as the backend stores them plus
//! its KV pool. A runner with a memory budget decides what to load and what to evict from
//! these figures, so they count what the backends really allocate: the CPU backend keeps
//! weights in their file's (quantized) format, the CUDA backend converts them to bf16.
//!
//! The KV pool is the operator's bytes when given. Otherwise the CPU backend takes a default
//! and a CUDA model gets room for every sequence slot at its full context (an engine never
//! holds more live tokens than that), within what the runner's memory budget leaves after the
//! weights, and at load within the device memory then free. So several models can share a
//! GPU, and the budget's figure for a model is what it will really take (or more).

use crate::backend::cuda::{device_block_format, CudaWeights};
use crate::model::Weights;
use crate::runtime::{Device, LoadOptions};

/// The CPU backend's KV pool when the operator gives none.
pub const DEFAULT_CPU_KV_BYTES: usize = 512 << 20;

/// How big a model's KV pool is to be, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPoolSize {
    /// Exactly this many (the operator's bytes, or the CPU default).
    Blocks(usize),
    /// As many as the device's free memory allows at load, up to this many.
    UpTo(usize),
}

impl KvPoolSize {
    /// The most blocks the pool can have.
    pub fn most(self) -> usize {
        match self {
            KvPoolSize::Blocks(n) | KvPoolSize::UpTo(n) => n,
        }
    }
}

/// The KV pool `options` ask for, in blocks of `per_block` bytes, for a model whose weights
/// take `weights` bytes and which serves `context_length` tokens.
pub fn kv_pool_size(
    options: &LoadOptions,
    per_block: usize,
    weights: u64,
    context_length: usize,
) -> KvPoolSize {
    let per_block = per_block.max(1);
    match (options.kv_cache_bytes, options.device) {
        (0, Device::Cpu) => KvPoolSize::Blocks((DEFAULT_CPU_KV_BYTES / per_block).max(1)),
        (0, Device::Cuda(_)) => {
            let per_sequence = context_length.max(1).div_ceil(options.block_size.max(1));
            let mut most = per_sequence.saturating_mul(options.max_num_seqs.max(1));
            if let Some(budget) = options.memory_budget_bytes.filter(|&b| b > 0) {
                let left = budget.saturating_sub(weights) / per_block as u64;
                most = most.min(usize::try_from(left).unwrap_or(usize::MAX));
            }
            KvPoolSize::UpTo(most.max(1))
        }
        (bytes, _) => KvPoolSize::Blocks((bytes / per_block).max(1)),
    }
}

/// Bytes the weights take on `device` (on CUDA, stored as `cuda_weights` says).
pub fn weights_bytes(weights: &Weights, device: Device, cuda_weights: CudaWeights) -> u64 {
    let matrices: u64 = weights
        .matrices()
        .map(|m| {
            // The embedding table stays bf16 on CUDA (the gather reads its rows).
            let mode = if std::ptr::eq(m, &weights.token_embd) {
                CudaWeights::Bf16
            } else {
                cuda_weights
            };
            match (device, device_block_format(m, mode)) {
                (Device::Cpu, _) => m.data.as_slice().len() as u64,
                (Device::Cuda(_), Some(t)) => {
                    (m.rows * m.cols / t.block_elems() * t.block_bytes()) as u64
                }
                (Device::Cuda(_), None) => (m.rows * m.cols * 2) as u64,
            }
        })
        .sum();
    // Vectors are f32 on the CPU and bf16 on the GPU.
    let per_element = match device {
        Device::Cpu => 4,
        Device::Cuda(_) => 2,
    };
    matrices + (weights.vector_elements() * per_element) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;

    fn cuda(kv_cache_bytes: usize, budget: Option<u64>) -> LoadOptions {
        LoadOptions {
            kv_cache_bytes,
            device: Device::Cuda(0),
            block_size: 16,
            max_num_seqs: 8,
            memory_budget_bytes: budget,
            ..LoadOptions::default()
        }
    }

    #[test]
    fn an_automatic_cuda_pool_holds_every_slot_at_full_context_and_no_more() {
        // 8 slots of a 4096-token context in 16-token blocks of 1 MiB.
        let pool = kv_pool_size(&cuda(0, None), 1 << 20, 1 << 30, 4096);
        assert_eq!(pool, KvPoolSize::UpTo(8 * 256));
        // A context that does not fill its last block still gets it.
        assert_eq!(
            kv_pool_size(&cuda(0, None), 1 << 20, 0, 4097),
            KvPoolSize::UpTo(8 * 257)
        );
    }

    #[test]
    fn an_automatic_cuda_pool_leaves_the_budget_to_the_weights_first() {
        let (gib, mib) = (1u64 << 30, 1usize << 20);
        // 10 GiB budget, 8 GiB of weights: 2 GiB of 1 MiB blocks, fewer than the context asks.
        let pool = kv_pool_size(&cuda(0, Some(10 * gib)), mib, 8 * gib, 1 << 20);
        assert_eq!(pool, KvPoolSize::UpTo(2048));
        // A budget larger than the need does not grow the pool.
        let pool = kv_pool_size(&cuda(0, Some(100 * gib)), mib, 8 * gib, 4096);
        assert_eq!(pool, KvPoolSize::UpTo(8 * 256));
        // Weights beyond the budget: one block (the runner refuses to load it anyway).
        let pool = kv_pool_size(&cuda(0, Some(gib)), mib, 8 * gib, 4096);
        assert_eq!(pool, KvPoolSize::UpTo(1));
    }

    #[test]
    fn operator_bytes_are_exact_and_the_cpu_default_is_fixed() {
        assert_eq!(
            kv_pool_size(&cuda(64 << 20, Some(1)), 1 << 20, 0, 4096),
            KvPoolSize::Blocks(64)
        );
        let cpu = LoadOptions {
            kv_cache_bytes: 0,
            ..LoadOptions::default()
        };
        assert_eq!(
            kv_pool_size(&cpu, 1 << 20, 0, 1 << 20),
            KvPoolSize::Blocks(512)
        );
    }

    #[test]
    fn the_default_model_weighs_about_its_file_on_the_cpu_and_more_as_bf16() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if !path.exists() {
            fallow_protocol::testing::skip_for_want_of(&format!(
                "{} (scripts/fetch-models.sh)",
                path.display()
            ));
            return;
        }
        let file = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let artifacts = model::open(&path).expect("open the default model");
        let cpu = weights_bytes(&artifacts.weights, Device::Cpu, CudaWeights::Bf16);
        let gpu = weights_bytes(&artifacts.weights, Device::Cuda(0), CudaWeights::Bf16);
        let blocks = weights_bytes(&artifacts.weights, Device::Cuda(0), CudaWeights::Quantized);
        assert!(
            cpu <= file && cpu * 10 >= file * 9,
            "quantized weights ({cpu} B) are most of the file ({file} B)"
        );
        // 135M parameters as bf16.
        assert!((250_000_000..300_000_000).contains(&gpu), "{gpu}");
        // Kept in blocks, all but the (tied, bf16) embedding table: between the two.
        assert!(blocks > cpu && blocks < gpu, "{cpu} < {blocks} < {gpu}");
    }
}
