//! How a step's attention spreads over the GPU. The attention kernel runs one block per
//! (query token, group of query heads sharing a KV head); a decode step of a few sequences
//! is then a few dozen blocks on a GPU with more than a hundred multiprocessors, each block
//! walking the whole context alone. Split-K gives each block one `partition` of the keys
//! instead, and the last of a token's blocks to finish merges their partial softmaxes, so
//! that a long context of one sequence is read by the whole GPU at once.

/// Query heads one attention block serves (`ATTN_HEADS` in attention.cu).
pub const HEADS_PER_BLOCK: usize = 4;
/// Fewer keys than this per block do not repay the partial results' round trip.
const MIN_PARTITION: usize = 256;
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
    /// longest key range is `max_keys`, on a GPU of `sm_count` multiprocessors.
    pub fn plan(
        tokens: usize,
        n_heads: usize,
        n_kv_heads: usize,
        max_keys: usize,
        sm_count: usize,
    ) -> AttentionSplit {
        let blocks = tokens * head_blocks(n_heads, n_kv_heads);
        let wanted = (BLOCKS_PER_SM * sm_count).div_ceil(blocks.max(1));
        // Every split gets at least MIN_PARTITION keys.
        let most = max_keys / MIN_PARTITION;
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

    #[test]
    fn a_single_long_decode_spreads_over_the_gpu() {
        // Llama-3.1-8B shapes (32 query heads, 8 KV heads) on an H200 (132 SMs).
        let split = AttentionSplit::plan(1, 32, 8, 8192, 132);
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
    fn short_contexts_and_full_batches_are_not_split() {
        assert_eq!(
            AttentionSplit::plan(1, 32, 8, 500, 132),
            AttentionSplit::WHOLE
        );
        assert_eq!(
            AttentionSplit::plan(512, 32, 8, 4096, 132),
            AttentionSplit::WHOLE,
            "a prefill chunk fills the GPU by itself"
        );
        assert_eq!(
            AttentionSplit::plan(64, 32, 8, 2048, 132),
            AttentionSplit::WHOLE
        );
    }

    #[test]
    fn splits_never_exceed_the_partial_buffer_or_shrink_below_a_partition() {
        for keys in [1, 255, 256, 257, 1000, 4096, 100_000, 1 << 20] {
            for tokens in [1, 2, 3, 8] {
                let s = AttentionSplit::plan(tokens, 9, 3, keys, 132);
                assert!(s.splits >= 1 && s.splits <= MAX_SPLITS, "{keys} {s:?}");
                assert!(s.splits * s.partition >= keys);
                if s.splits > 1 {
                    assert!(s.partition >= MIN_PARTITION.min(keys));
                }
            }
        }
    }

    #[test]
    fn large_groups_take_several_blocks_per_kv_head() {
        assert_eq!(head_blocks(9, 3), 3);
        assert_eq!(head_blocks(28, 4), 8, "group of 7: 4 + 3");
        assert_eq!(head_blocks(32, 1), 8);
    }
}
