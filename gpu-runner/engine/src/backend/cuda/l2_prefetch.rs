//! How much of its weights a bf16 GEMV asks L2 for before it waits on the kernel that writes
//! its input. With an early start a GEMV's blocks are resident while the previous kernel
//! ends; after an attention or a norm (a few blocks, latency-bound) the memory sits idle
//! then, so each warp asks L2 for the first bytes of its weight row (kernels.cu's
//! `l2_prefetch`), and the product then reads them from L2 instead of waiting on memory.
//! The rows prefetched at once must fit in L2 with room to spare, or the later ones evict
//! the earlier ones before they are read: each row gets an equal share of half the L2
//! among the rows whose warps can be resident together. A decode attention block likewise
//! asks for the K and V rows of its first [`ATTENTION_KEYS`] keys while the QKV product ends.
//! `FALLOW_CUDA_DEBUG=no-l2-prefetch` turns both off; without early starts (before sm_90, or turned
//! off) the callers prefetch nothing, as nothing would overlap.

/// The share of L2 the prefetched rows may take; the rest keeps the previous kernel's
/// working set (activations, KV rows) and the rows already read.
const L2_SHARE: f64 = 0.5;

/// Keys of its range whose K and V rows a decode attention block prefetches: its first four
/// passes (8 warps × 4 keys each), where a short decode spends its time; capped so that a
/// long range does not flood L2 ahead of being read.
pub const ATTENTION_KEYS: i32 = 128;

/// Bulk prefetches move whole 16-byte pieces.
const PIECE: usize = 16;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L2Prefetch {
    /// Bytes of L2 the prefetched rows may take together (0: none prefetched).
    budget: usize,
    /// Warps the whole device holds at once: the most rows whose warps can prefetch
    /// before the previous kernel ends.
    resident_warps: usize,
}

impl L2Prefetch {
    /// For a device of `l2_bytes` of L2 and `sm_count` multiprocessors of
    /// `threads_per_sm` threads each. [`L2Prefetch::default`] asks for nothing.
    pub fn new(l2_bytes: usize, sm_count: usize, threads_per_sm: usize) -> Self {
        L2Prefetch {
            budget: (l2_bytes as f64 * L2_SHARE) as usize,
            resident_warps: sm_count * threads_per_sm / 32,
        }
    }

    /// Bytes of each row a GEMV over `rows` rows of `row_bytes` prefetches, `rows_per_warp`
    /// rows to a warp: the equal share of the budget of the rows resident together, whole
    /// pieces, at most the row.
    pub fn row_bytes(&self, rows: usize, row_bytes: usize, rows_per_warp: usize) -> u32 {
        let together = rows.min(self.resident_warps * rows_per_warp.max(1));
        if together == 0 {
            return 0;
        }
        let share = (self.budget / together).min(row_bytes) / PIECE * PIECE;
        u32::try_from(share).unwrap_or(u32::MAX / PIECE as u32 * PIECE as u32)
    }

    /// Keys whose K and V rows a decode attention block prefetches (0 when turned off).
    pub fn attention_keys(&self) -> i32 {
        if self.budget > 0 {
            ATTENTION_KEYS
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200: 50 MiB of L2, 132 SMs of 2048 threads (8448 warps).
    fn h200() -> L2Prefetch {
        L2Prefetch::new(50 << 20, 132, 2048)
    }

    #[test]
    fn a_small_matrix_is_prefetched_whole_and_a_large_one_within_half_the_l2() {
        // Llama-3 8B's output projection: 4096 rows of 8 KiB (32 MiB) — 6.25 KiB of each.
        let o = h200().row_bytes(4096, 8192, 1);
        assert_eq!(o, 6400);
        assert!(4096 * o as usize <= 25 << 20);
        // SmolLM2's (576 rows of 1152 bytes): all of it.
        assert_eq!(h200().row_bytes(576, 1152, 1), 1152);
        // The gate/up rows (28672 of 8 KiB): the 8448 resident warps' share.
        let gate_up = h200().row_bytes(28672, 8192, 1) as usize;
        assert_eq!(gate_up % 16, 0);
        assert!(8448 * gate_up <= 25 << 20 && 8448 * (gate_up + 16) > 25 << 20);
        // On the tensor cores a warp holds 16 rows: all 28672 are resident together, each
        // with its share of the same half of L2.
        let mma = h200().row_bytes(28672, 8192, 16) as usize;
        assert!(28672 * mma <= 25 << 20 && 28672 * (mma + 16) > 25 << 20);
    }

    #[test]
    fn the_default_prefetches_nothing() {
        let off = L2Prefetch::default();
        assert_eq!(off.row_bytes(4096, 8192, 1), 0);
        assert_eq!(off.attention_keys(), 0);
        assert_eq!(h200().attention_keys(), ATTENTION_KEYS);
        assert_eq!(h200().row_bytes(0, 8192, 1), 0);
    }
}
