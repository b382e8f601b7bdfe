//! How a step's attention spreads over the GPU. The attention kernel runs one block per
//! (query token, group of query heads sharing a KV head); a decode step of a few sequences
//! is then a few dozen blocks on a GPU with more than a hundred multiprocessors, each block
//! walking the whole context alone. Split-K gives each block one `partition` of the keys
//! instead, and the last of a token's blocks to finish merges their partial softmaxes, so
//! that a long context of one sequence is read by the whole GPU at once. A short one too: a
//! decode at batch 1 is one block per KV head, each a chain of dependent 32-key iterations
//! (load, score, update), so even 100 keys are worth spreading over several blocks.
//! `FALLOW_CUDA_DEBUG=split-min-keys=N` sets the fewest keys a split block gets (a multiple of 32;
//! [`DEFAULT_MIN_PARTITION`] by default, 1 << 30 never splits).

/// Query heads one attention block serves (`ATTN_HEADS` in attention.cu).
pub const HEADS_PER_BLOCK: usize = 4;
/// Fewer keys than this per block do not repay the partial results' round trip: two of the
/// kernel's iterations (8 warps × 4 keys each).
pub const DEFAULT_MIN_PARTITION: usize = 64;
/// Keys one iteration of an attention block reads (ATTN_WARPS × ATTN_KEYS in attention.cu).
pub const KEYS_PER_ITERATION: usize = 32;
/// Blocks wanted per multiprocessor, so that each has another to switch to.
const BLOCKS_PER_SM: usize = 2;
/// The partial-result buffer holds at most this many splits per (token, head).
pub const MAX_SPLITS: usize = 64;
/// The partition of an unsplit step: larger than any context.
const WHOLE: usize = 1 << 30;

/// Keys per block and blocks per (token, head group) of one attention launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionSplit {
    pub splits: usize,
    pub partition: usize,
}

impl AttentionSplit {
    pub const WHOLE: AttentionSplit = AttentionSplit {
        splits: 1,
        partition: WHOLE,
    };

    /// The split for `tokens` query tokens of a model with `n_heads` / `n_kv_heads`, whose
    /// longest key range is `max_keys`, on a GPU of `sm_count` multiprocessors, giving no
    /// split fewer than `min_partition` keys.
    pub fn plan(
        tokens: usize,
        n_heads: usize,
        n_kv_heads: usize,
        max_keys: usize,
        sm_count: usize,
        min_partition: usize,
    ) -> AttentionSplit {
        let blocks = tokens * head_blocks(n_heads, n_kv_heads);
        let wanted = (BLOCKS_PER_SM * sm_count).div_ceil(blocks.max(1));
        let most = max_keys / min_partition.max(1);
        let splits = wanted.min(most).min(MAX_SPLITS);
        if splits <= 1 {
            return AttentionSplit::WHOLE;
        }
        // Whole warps' worth of keys per partition; rounding up may leave fewer splits.
        let partition = max_keys.div_ceil(splits).next_multiple_of(32);
        AttentionSplit {
            splits: max_keys.div_ceil(partition),
            partition,
        }
    }
}

/// Attention blocks per query token: each KV head's query heads in groups of
/// [`HEADS_PER_BLOCK`].
pub fn head_blocks(n_heads: usize, n_kv_heads: usize) -> usize {
    let group = n_heads / n_kv_heads.max(1);
    n_kv_heads * group.div_ceil(HEADS_PER_BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200_SMS: usize = 132;

    fn plan(tokens: usize, n_heads: usize, n_kv: usize, keys: usize) -> AttentionSplit {
        AttentionSplit::plan(tokens, n_heads, n_kv, keys, H200_SMS, DEFAULT_MIN_PARTITION)
    }

    #[test]
    fn a_single_long_decode_spreads_over_the_gpu() {
        // Llama-3.1-8B shapes (32 query heads, 8 KV heads) on an H200 (132 SMs).
        let split = plan(1, 32, 8, 8192);
        assert_eq!(head_blocks(32, 8), 8);
        assert!(split.splits >= 16, "{split:?}");
        assert!(split.splits * split.partition >= 8192);
        assert!(
            (split.splits - 1) * split.partition < 8192,
            "no empty split"
        );
        assert_eq!(split.partition % 32, 0);
    }

    #[test]
    fn a_short_decode_at_batch_one_is_split_into_blocks_of_a_few_iterations() {
        // The bench's batch-1 graph: a 16-block table of 16 keys.
        let split = plan(1, 32, 8, 256);
        assert_eq!(
            split,
            AttentionSplit {
                splits: 4,
                partition: 64
            }
        );
        // Fewer keys than two iterations' worth: one block per head group, as before.
        assert_eq!(plan(1, 32, 8, 48), AttentionSplit::WHOLE);
        // With the old floor of 256 keys the same step was not split at all.
        assert_eq!(
            AttentionSplit::plan(1, 32, 8, 256, H200_SMS, 256),
            AttentionSplit::WHOLE
        );
    }

    #[test]
    fn full_batches_are_not_split() {
        assert_eq!(
            plan(512, 32, 8, 4096),
            AttentionSplit::WHOLE,
            "a prefill chunk fills the GPU by itself"
        );
        assert_eq!(plan(64, 32, 8, 2048), AttentionSplit::WHOLE);
    }

    #[test]
    fn splits_never_exceed_the_partial_buffer_or_shrink_below_a_partition() {
        for min_partition in [32, DEFAULT_MIN_PARTITION, 256] {
            for keys in [
                1,
                31,
                63,
                64,
                65,
                255,
                256,
                257,
                1000,
                4096,
                100_000,
                1 << 20,
            ] {
                for tokens in [1, 2, 3, 8] {
                    let s = AttentionSplit::plan(tokens, 9, 3, keys, H200_SMS, min_partition);
                    assert!(s.splits >= 1 && s.splits <= MAX_SPLITS, "{keys} {s:?}");
                    assert!(s.splits * s.partition >= keys);
                    if s.splits > 1 {
                        assert!(s.partition >= min_partition.min(keys), "{keys} {s:?}");
                        assert!((s.splits - 1) * s.partition < keys, "no empty split");
                    }
                }
            }
        }
    }

    #[test]
    fn the_kernel_is_built_for_the_splits_heads_and_keys_planned_here() {
        use super::super::kernels::source_defines;
        let per_warp: usize = 4;
        for (name, value) in [
            ("ATTN_MAX_SPLITS", MAX_SPLITS),
            ("ATTN_HEADS", HEADS_PER_BLOCK),
            ("ATTN_KEYS", per_warp),
            ("ATTN_WARPS", KEYS_PER_ITERATION / per_warp),
        ] {
            assert_eq!(
                source_defines(name),
                [value.to_string()],
                "{name} in attention.cu"
            );
        }
    }

    #[test]
    fn large_groups_take_several_blocks_per_kv_head() {
        assert_eq!(head_blocks(9, 3), 3);
        assert_eq!(head_blocks(28, 4), 8, "group of 7: 4 + 3");
        assert_eq!(head_blocks(32, 1), 8);
    }
}
