//! The int8 tensor-core products of quantized matrices (mmq.cu), which serve the batches past
//! the GEMVs' (up to [`MMQ_MAX_ROWS`] token rows) when x is read as int8 ([`QuantX::Int8`]):
//! how a product is shaped into blocks. A block is 128 weight rows over one slice of K; a
//! matrix of few rows (an 8B's 4096) is split over K so that it still fills the GPU, its
//! slices' partial sums then added in order by `mmq_sum`.
//!
//! [`QuantX::Int8`]: super::weights::QuantX::Int8

/// Warps per block, 16 weight rows each (MMQ_WARPS in mmq.cu).
pub(super) const MMQ_WARPS: usize = 8;
/// Weight rows per block.
pub(super) const MMQ_BLOCK_ROWS: usize = 16 * MMQ_WARPS;
/// Token rows a product takes at most (MMQ_MAX_ROWS in mmq.cu).
pub(super) const MMQ_MAX_ROWS: usize = 64;
/// Inputs of x a block stages at a time (MMQ_STAGE in mmq.cu): slices are whole stages.
pub(super) const MMQ_STAGE: usize = 256;
/// Threads per block of `mmq_sum` (a thread per output).
pub(super) const MMQ_SUM_THREADS: usize = 256;
/// Blocks per SM a product aims for (an mmq block takes ~200 registers per thread: one fits
/// an SM at a time, and a second waits to take its place).
pub(super) const MMQ_BLOCKS_PER_SM: usize = 2;

/// How one product is split over K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MmqSplit {
    /// Slices of K (blockIdx.y); with more than one, the partial sums go to scratch first.
    pub slices: usize,
    /// Groups of 32 inputs per slice (the last may have fewer).
    pub slice_groups: usize,
}

impl MmqSplit {
    /// The split of `n` token rows through `rows` × `cols` weights: enough slices that the
    /// row blocks times the slices reach `target_blocks`, no more than K has stages, and no
    /// more partial sums than the `room` floats of scratch hold (none without it).
    pub fn plan(rows: usize, cols: usize, n: usize, target_blocks: usize, room: usize) -> MmqSplit {
        let stages = cols.div_ceil(MMQ_STAGE).max(1);
        let row_blocks = rows.div_ceil(MMQ_BLOCK_ROWS).max(1);
        let fit = room / (n * rows).max(1);
        let wanted = target_blocks
            .div_ceil(row_blocks)
            .clamp(1, stages)
            .min(fit.max(1));
        let per_slice = stages.div_ceil(wanted);
        MmqSplit {
            slices: stages.div_ceil(per_slice),
            slice_groups: per_slice * MMQ_STAGE / 32,
        }
    }

    /// Floats of scratch the partial sums take (0 when one slice writes the output).
    pub fn scratch(&self, rows: usize, n: usize) -> usize {
        if self.slices > 1 {
            self.slices * rows * n
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_of_few_rows_is_split_over_k_until_it_fills_the_gpu() {
        // Llama-3 8B's attention output at batch 64 on 132 SMs: 32 row blocks, 16 stages.
        let split = MmqSplit::plan(4096, 4096, 64, 264, usize::MAX);
        assert_eq!(split.slices, 8);
        assert_eq!(split.slice_groups, 2 * MMQ_STAGE / 32);
        // Its feed-forward's 28672 gate/up rows fill it alone.
        assert_eq!(MmqSplit::plan(28672, 4096, 64, 264, usize::MAX).slices, 2);
        assert_eq!(MmqSplit::plan(28672, 4096, 64, 100, usize::MAX).slices, 1);
    }

    #[test]
    fn slices_are_whole_stages_and_cover_k_without_an_empty_one() {
        for cols in [32, 256, 576, 1536, 2304, 4096, 14336] {
            for target in [1, 7, 264, 10_000] {
                let s = MmqSplit::plan(300, cols, 24, target, usize::MAX);
                let groups = cols / 32;
                assert_eq!(s.slice_groups % (MMQ_STAGE / 32), 0);
                assert!(
                    s.slices * s.slice_groups >= groups,
                    "{cols} {target}: {s:?}"
                );
                assert!(
                    (s.slices - 1) * s.slice_groups < groups,
                    "{cols} {target}: {s:?}"
                );
            }
        }
    }

    #[test]
    fn the_partial_sums_never_take_more_scratch_than_there_is() {
        let (rows, n) = (4096, 64);
        assert_eq!(MmqSplit::plan(rows, 4096, n, 264, 0).slices, 1);
        let room = 3 * rows * n + 5;
        let s = MmqSplit::plan(rows, 4096, n, 264, room);
        assert!(s.slices > 1 && s.scratch(rows, n) <= room, "{s:?}");
        assert_eq!(MmqSplit::plan(rows, 4096, n, 1, room).scratch(rows, n), 0);
    }

    #[test]
    fn the_kernels_are_built_for_the_block_and_stage_planned_here() {
        use crate::engine::backend::cuda::kernels::source_defines;
        for (name, value) in [
            ("MMQ_WARPS", MMQ_WARPS),
            ("MMQ_MAX_ROWS", MMQ_MAX_ROWS),
            ("MMQ_STAGE", MMQ_STAGE),
            ("MMQ_STAGE_GROUPS", MMQ_STAGE / 32),
        ] {
            assert_eq!(
                source_defines(name),
                [value.to_string()],
                "{name} in mmq.cu"
            );
        }
    }
}
