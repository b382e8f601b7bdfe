//! Which kernel serves attention over runs of prompt tokens: the tensor-core one
//! (`paged_prefill_mma_*`, prefill_mma.cu) wherever the head size fits it, else the f32 one
//! (`paged_prefill_*`, attention.cu; head sizes not a multiple of 16). Long prompts spend most of their prefill in attention
//! on the f32 kernel (its work grows with the square of the length, the matrix products'
//! linearly); the tensor cores do the same products many times faster. The two take tiles
//! of different sizes, which the step's inputs are packed for.

use super::forward::kernel_variant;
use super::options::PrefillChoice;

/// A prefill attention kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// mma.sync bf16 products with f32 accumulation (Q and P split into two bf16 parts).
    TensorCores,
    /// f32 arithmetic on the CUDA cores; any head size up to 256.
    F32,
}

impl PrefillKernel {
    /// The kernel `choice` gives a model's `head_dim`: `Auto` takes the tensor cores where
    /// they fit, `TensorCores` insists on them, `F32` takes the f32 kernel.
    pub fn choose(head_dim: usize, choice: PrefillChoice) -> Result<PrefillKernel, String> {
        match choice {
            PrefillChoice::Auto => Ok(if Self::tensor_cores_fit(head_dim) {
                PrefillKernel::TensorCores
            } else {
                PrefillKernel::F32
            }),
            PrefillChoice::TensorCores => PrefillKernel::TensorCores.check(head_dim),
            PrefillChoice::F32 => Ok(PrefillKernel::F32),
        }
    }

    /// `self`, if it can serve heads of `head_dim`.
    pub fn check(self, head_dim: usize) -> Result<PrefillKernel, String> {
        match self {
            PrefillKernel::TensorCores if !Self::tensor_cores_fit(head_dim) => Err(format!(
                "the tensor-core prefill needs head_dim a multiple of 16 up to 256, not {head_dim}"
            )),
            kernel => Ok(kernel),
        }
    }

    /// The tensor-core kernel multiplies 16 dimensions at a time, up to 256 (the most the
    /// CUDA backend serves).
    fn tensor_cores_fit(head_dim: usize) -> bool {
        head_dim > 0 && head_dim.is_multiple_of(16) && head_dim <= 256
    }

    /// Consecutive prompt tokens one block serves (MMA_TOKENS in prefill_mma.cu,
    /// PREFILL_TOKENS in attention.cu).
    pub fn tile_tokens(self) -> usize {
        match self {
            PrefillKernel::TensorCores => 16,
            PrefillKernel::F32 => 8,
        }
    }

    /// Threads per block: a warp per query head of the block's group (ATTN_HEADS) for the
    /// tensor cores, a warp per token for f32.
    pub fn threads(self) -> u32 {
        match self {
            PrefillKernel::TensorCores => 128,
            PrefillKernel::F32 => 256,
        }
    }

    /// The instantiation for heads of `head_dim` (which [`PrefillKernel::check`] accepted).
    pub fn kernel(self, head_dim: usize) -> &'static str {
        let variant = kernel_variant(head_dim.div_ceil(32));
        match self {
            PrefillKernel::TensorCores => [
                "paged_prefill_mma_1",
                "paged_prefill_mma_2",
                "paged_prefill_mma_4",
                "paged_prefill_mma_8",
            ][variant],
            PrefillKernel::F32 => [
                "paged_prefill_1",
                "paged_prefill_2",
                "paged_prefill_4",
                "paged_prefill_8",
            ][variant],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_cores_serve_the_head_sizes_they_fit_and_f32_the_rest() {
        for (head_dim, want) in [
            (64, PrefillKernel::TensorCores),
            (128, PrefillKernel::TensorCores),
            (16, PrefillKernel::TensorCores),
            (48, PrefillKernel::TensorCores),
            (256, PrefillKernel::TensorCores),
            (40, PrefillKernel::F32),
            (264, PrefillKernel::F32),
        ] {
            assert_eq!(
                PrefillKernel::choose(head_dim, PrefillChoice::Auto),
                Ok(want),
                "{head_dim}"
            );
        }
        assert_eq!(
            PrefillKernel::choose(128, PrefillChoice::F32),
            Ok(PrefillKernel::F32)
        );
        assert!(PrefillKernel::choose(40, PrefillChoice::TensorCores)
            .unwrap_err()
            .contains("not 40"));
    }

    #[test]
    fn each_head_size_gets_the_instantiation_that_covers_it() {
        assert_eq!(
            PrefillKernel::TensorCores.kernel(128),
            "paged_prefill_mma_4"
        );
        assert_eq!(PrefillKernel::TensorCores.kernel(48), "paged_prefill_mma_2");
        assert_eq!(PrefillKernel::TensorCores.kernel(16), "paged_prefill_mma_1");
        assert_eq!(
            PrefillKernel::TensorCores.kernel(256),
            "paged_prefill_mma_8"
        );
        assert_eq!(PrefillKernel::F32.kernel(256), "paged_prefill_8");
    }
}
