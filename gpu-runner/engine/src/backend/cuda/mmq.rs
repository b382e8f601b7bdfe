//! The int8 tensor-core products of quantized matrices (mmq.cu), which serve the batches past
//! the GEMVs' (up to [`MMQ_MAX_ROWS`] token rows) when x is read as int8 ([`QuantX::Int8`]):
//! how a product is shaped into blocks. A block is 128 weight rows over one slice of K; a
//! matrix of few rows (an 8B's 4096) is split over K so that it still fills the GPU, its
//! slices' partial sums then added in order by `mmq_sum`. And which products they serve
//! ([`MmqChoice`]): formats checked on this GPU ([`super::mmq_check`]), shapes timed against
//! the expansion for cuBLAS ([`super::mmq_tune`]).
//!
//! [`QuantX::Int8`]: super::weights::QuantX::Int8

use super::options::MmqMode;
use crate::quant::GgmlType;

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

/// The token-row counts the tensor-core products are timed at against the expansion; a
/// product of `n` rows follows the choice for the smallest of them ≥ `n`.
pub(super) const MMQ_TUNED_ROWS: [usize; 2] = [16, MMQ_MAX_ROWS];

/// What the choice between the tensor-core product and the expansion is keyed by: the
/// matrix's `[rows, cols]`, its first part's format and the tuned row count standing for
/// the product's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmqShape {
    pub rows: usize,
    pub cols: usize,
    pub format: GgmlType,
    pub batch: usize,
}

impl MmqShape {
    /// The shape `n` token rows through `[rows, cols]` weights (first part `format`) are
    /// served as.
    pub fn of(rows: usize, cols: usize, format: GgmlType, n: usize) -> MmqShape {
        let batch = MMQ_TUNED_ROWS
            .iter()
            .copied()
            .find(|&b| b >= n)
            .unwrap_or(MMQ_MAX_ROWS);
        MmqShape {
            rows,
            cols,
            format,
            batch,
        }
    }
}

/// One shape timed both ways on this GPU (mean ms per product).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MmqTiming {
    pub shape: MmqShape,
    pub tensor_cores_ms: f32,
    pub expanded_ms: f32,
}

impl MmqTiming {
    /// Whether the tensor-core product serves the shape: not slower than the expansion (a
    /// NaN never wins).
    pub fn tensor_cores_win(&self) -> bool {
        self.tensor_cores_ms <= self.expanded_ms
    }
}

/// Which quantized products of up to [`MMQ_MAX_ROWS`] token rows, with x read as int8, the
/// int8 tensor-core products serve rather than the blocks expanded for cuBLAS.
#[derive(Debug, Clone, Default)]
pub struct MmqChoice {
    /// `Some(true)` wherever the format passed the check, `Some(false)` nowhere; `None`
    /// where timing found them faster ([`MmqMode`]).
    forced: Option<bool>,
    /// The formats whose product disagreed with their expansion on this GPU; `None` until
    /// checked, when no product is served.
    rejected: Option<Vec<GgmlType>>,
    /// The shapes timed here; `None` until timed, when (unless forced) none is served.
    timed: Option<Vec<MmqTiming>>,
}

impl MmqChoice {
    /// Asks for `mode` from now on, forgetting the timings (the check's result stays).
    pub fn set_mode(&mut self, mode: MmqMode) {
        self.forced = match mode {
            MmqMode::Timed => None,
            MmqMode::Always => Some(true),
            MmqMode::Never => Some(false),
        };
        self.timed = None;
    }

    /// Whether the formats were checked on this GPU.
    pub fn is_checked(&self) -> bool {
        self.rejected.is_some()
    }

    /// Records the check's result: the formats whose products disagreed.
    pub fn set_rejected(&mut self, rejected: Vec<GgmlType>) {
        self.rejected = Some(rejected);
    }

    /// The formats the check rejected (none before it ran).
    pub fn rejected(&self) -> Vec<GgmlType> {
        self.rejected.clone().unwrap_or_default()
    }

    /// Whether a matrix of parts in these formats may go to the tensor cores at all
    /// (checked, none rejected, not forced off): what timing then decides per shape.
    pub fn takes(&self, mut formats: impl Iterator<Item = GgmlType>) -> bool {
        self.forced != Some(false)
            && self
                .rejected
                .as_ref()
                .is_some_and(|rejected| formats.all(|f| !rejected.contains(&f)))
    }

    /// Whether the shapes are still to be timed (not forced, not timed yet).
    pub fn needs_timing(&self) -> bool {
        self.forced.is_none() && self.timed.is_none()
    }

    /// Records the timings (a later call replaces them).
    pub fn set_timed(&mut self, timed: Vec<MmqTiming>) {
        self.timed = Some(timed);
    }

    /// The timings taken here (none before, or when forced).
    pub fn timings(&self) -> &[MmqTiming] {
        self.timed.as_deref().unwrap_or_default()
    }

    /// Whether the tensor-core product is preferred for `shape`: forced on, or timed faster
    /// there (a shape not timed is not).
    pub fn prefers(&self, shape: MmqShape) -> bool {
        match self.forced {
            Some(on) => on,
            None => self
                .timings()
                .iter()
                .any(|t| t.shape == shape && t.tensor_cores_win()),
        }
    }

    /// Whether the tensor-core product serves `shape`, of parts in `formats`: a format it
    /// takes ([`MmqChoice::takes`]), preferred there ([`MmqChoice::prefers`]).
    #[cfg(test)]
    fn serves(&self, shape: MmqShape, formats: impl Iterator<Item = GgmlType>) -> bool {
        self.takes(formats) && self.prefers(shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(rows: usize, batch: usize, tensor_cores_ms: f32, expanded_ms: f32) -> MmqTiming {
        MmqTiming {
            shape: MmqShape::of(rows, 4096, GgmlType::Q4K, batch),
            tensor_cores_ms,
            expanded_ms,
        }
    }

    fn choice_of(mode: MmqMode) -> MmqChoice {
        let mut choice = MmqChoice::default();
        choice.set_mode(mode);
        choice
    }

    #[test]
    fn a_product_follows_the_timing_of_the_smallest_tuned_row_count_that_covers_it() {
        let mut choice = choice_of(MmqMode::Timed);
        choice.set_rejected(vec![]);
        choice.set_timed(vec![
            timing(4096, 16, 1.0, 2.0),
            timing(4096, 64, 3.0, 2.0),
            timing(14336, 64, f32::NAN, 2.0),
        ]);
        let q4k = || [GgmlType::Q4K].into_iter();
        let serves = |rows, n| choice.serves(MmqShape::of(rows, 4096, GgmlType::Q4K, n), q4k());
        assert!(serves(4096, 9) && serves(4096, 16));
        assert!(!serves(4096, 17) && !serves(4096, 64));
        // A time that is not a number never wins; a shape not timed is not served.
        assert!(!serves(14336, 64));
        assert!(!serves(1024, 16));
        // Nor another format of the same shape.
        let q6k = MmqShape::of(4096, 4096, GgmlType::Q6K, 9);
        assert!(!choice.serves(q6k, [GgmlType::Q6K].into_iter()));
    }

    #[test]
    fn nothing_is_served_before_the_check_nor_a_matrix_with_a_rejected_part() {
        let shape = MmqShape::of(4096, 4096, GgmlType::Q4K, 64);
        let mut choice = choice_of(MmqMode::Always);
        assert!(!choice.is_checked());
        assert!(!choice.serves(shape, [GgmlType::Q4K].into_iter()));
        choice.set_rejected(vec![GgmlType::Q6K]);
        assert!(choice.serves(shape, [GgmlType::Q4K].into_iter()));
        assert!(!choice.serves(shape, [GgmlType::Q4K, GgmlType::Q6K].into_iter()));
        assert_eq!(choice.rejected(), [GgmlType::Q6K]);
    }

    #[test]
    fn the_mode_forces_the_tensor_core_products_on_or_off_or_leaves_them_to_timing() {
        let shape = MmqShape::of(4096, 4096, GgmlType::Q8_0, 30);
        let formats = || [GgmlType::Q8_0].into_iter();
        for (mode, timed, served) in [
            (MmqMode::Always, false, true),
            (MmqMode::Never, false, false),
            (MmqMode::Timed, true, false),
        ] {
            let mut choice = choice_of(mode);
            choice.set_rejected(vec![]);
            assert_eq!(choice.needs_timing(), timed, "{mode:?}");
            assert_eq!(choice.serves(shape, formats()), served, "{mode:?}");
        }
    }

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
        use crate::backend::cuda::kernels::source_defines;
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
