//! Which bf16 GEMV instantiation serves each decode-sized product. The kernel comes in
//! several shapes ([`GEMV_VARIANTS`]: output columns per block × 16-byte loads in flight per
//! lane, with or without the next tile's loads issued before the current tile is summed, x
//! staged tile by tile or all at once) that compute the same bits; which one streams a matrix fastest depends on the GPU
//! and on the matrix (how many blocks fill the SMs, how long each walks K). So at load the
//! backend times every variant on the model's own matrices at 1, 4 and 8 token rows and keeps
//! the fastest per shape ([`CudaBackend::tune_gemv`]); a product of `n` rows uses the
//! choice made for the smallest tuned row count ≥ `n`. `FALLOW_CUDA_GEMV=w8u4` (a variant's
//! name) skips the timing and uses that variant everywhere.

use std::collections::HashMap;

use cudarc::driver::sys::CUevent_flags;

use super::buffer::DeviceBuf;
use super::gemm::GEMV_MAX_ROWS;
use super::weights::{DeviceMatrix, Storage};
use super::{CudaBackend, CudaError};

/// One instantiation of kernels.cu's `GEMV_BF16(W, U)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvVariant {
    pub name: &'static str,
    /// Output columns (warps) per block.
    pub warps: usize,
    /// 16-byte loads of W in flight per lane.
    pub unroll: usize,
    /// Whether the next tile's loads go out before the current tile is summed.
    pub prefetch: bool,
    /// Whether all of x is staged at once in dynamic shared memory (no barrier per tile);
    /// only for products whose x fits ([`GemvVariant::fits`]).
    pub resident: bool,
    pub plain: &'static str,
    pub gated: &'static str,
}

/// Shared memory a resident variant may take (GEMV_RESIDENT_BYTES in kernels.cu: of the 48 KiB
/// a block gets without opting in to more, what the kernel's static shared memory leaves).
pub const RESIDENT_BYTES: usize = 40 * 1024;

impl GemvVariant {
    /// Dynamic shared memory for `n` rows of `cols` inputs (bf16): all of x when resident.
    pub fn shared_bytes(&self, n: usize, cols: usize) -> usize {
        if self.resident {
            n * cols * 2
        } else {
            0
        }
    }

    /// Whether this variant's shared memory can serve `n` rows of `cols` inputs.
    pub fn fits(&self, n: usize, cols: usize) -> bool {
        self.shared_bytes(n, cols) <= RESIDENT_BYTES
    }

    /// The kernel: the plain product, or the down projection with the activation fused.
    pub fn kernel(&self, gated: bool) -> &'static str {
        if gated {
            self.gated
        } else {
            self.plain
        }
    }
}

const fn variant(
    name: &'static str,
    (warps, unroll, prefetch, resident): (usize, usize, bool, bool),
    plain: &'static str,
    gated: &'static str,
) -> GemvVariant {
    GemvVariant {
        name,
        warps,
        unroll,
        prefetch,
        resident,
        plain,
        gated,
    }
}

/// Every instantiation, as kernels.cu's `GEMV_BF16` lines make them: each shape plain, with
/// prefetching (suffix `p`), and with x resident (suffix `r`).
pub const GEMV_VARIANTS: [GemvVariant; 18] = [
    variant(
        "w4u4",
        (4, 4, false, false),
        "gemv_bf16_w4u4",
        "gemv_bf16_gated_w4u4",
    ),
    variant(
        "w4u8",
        (4, 8, false, false),
        "gemv_bf16_w4u8",
        "gemv_bf16_gated_w4u8",
    ),
    variant(
        "w8u4",
        (8, 4, false, false),
        "gemv_bf16_w8u4",
        "gemv_bf16_gated_w8u4",
    ),
    variant(
        "w8u8",
        (8, 8, false, false),
        "gemv_bf16_w8u8",
        "gemv_bf16_gated_w8u8",
    ),
    variant(
        "w16u4",
        (16, 4, false, false),
        "gemv_bf16_w16u4",
        "gemv_bf16_gated_w16u4",
    ),
    variant(
        "w16u8",
        (16, 8, false, false),
        "gemv_bf16_w16u8",
        "gemv_bf16_gated_w16u8",
    ),
    variant(
        "w4u4p",
        (4, 4, true, false),
        "gemv_bf16_w4u4p",
        "gemv_bf16_gated_w4u4p",
    ),
    variant(
        "w4u8p",
        (4, 8, true, false),
        "gemv_bf16_w4u8p",
        "gemv_bf16_gated_w4u8p",
    ),
    variant(
        "w8u4p",
        (8, 4, true, false),
        "gemv_bf16_w8u4p",
        "gemv_bf16_gated_w8u4p",
    ),
    variant(
        "w8u8p",
        (8, 8, true, false),
        "gemv_bf16_w8u8p",
        "gemv_bf16_gated_w8u8p",
    ),
    variant(
        "w16u4p",
        (16, 4, true, false),
        "gemv_bf16_w16u4p",
        "gemv_bf16_gated_w16u4p",
    ),
    variant(
        "w16u8p",
        (16, 8, true, false),
        "gemv_bf16_w16u8p",
        "gemv_bf16_gated_w16u8p",
    ),
    variant(
        "w4u4r",
        (4, 4, true, true),
        "gemv_bf16_w4u4r",
        "gemv_bf16_gated_w4u4r",
    ),
    variant(
        "w4u8r",
        (4, 8, true, true),
        "gemv_bf16_w4u8r",
        "gemv_bf16_gated_w4u8r",
    ),
    variant(
        "w8u4r",
        (8, 4, true, true),
        "gemv_bf16_w8u4r",
        "gemv_bf16_gated_w8u4r",
    ),
    variant(
        "w8u8r",
        (8, 8, true, true),
        "gemv_bf16_w8u8r",
        "gemv_bf16_gated_w8u8r",
    ),
    variant(
        "w16u4r",
        (16, 4, true, true),
        "gemv_bf16_w16u4r",
        "gemv_bf16_gated_w16u4r",
    ),
    variant(
        "w16u8r",
        (16, 8, true, true),
        "gemv_bf16_w16u8r",
        "gemv_bf16_gated_w16u8r",
    ),
];

/// The variant used for a shape no timing chose (8 columns per block, 4 loads per lane).
pub const DEFAULT_VARIANT: usize = 2;

/// The token-row counts timed; a product of `n` rows uses the choice for [`bucket`]`(n)`.
pub const TUNED_ROWS: [usize; 3] = [1, 4, 8];

/// Launches per variant and shape when timing (each on another layer's matrix, so that the
/// weights come from memory, not from L2), after one untimed launch.
const TIMED_LAUNCHES: usize = 4;

/// The tuned row count that stands for `n` rows.
pub fn bucket(n: usize) -> usize {
    TUNED_ROWS
        .iter()
        .copied()
        .find(|&rows| rows >= n)
        .unwrap_or(GEMV_MAX_ROWS)
}

/// The variant named `name` (`w8u4`, …).
pub fn variant_named(name: &str) -> Option<usize> {
    GEMV_VARIANTS.iter().position(|v| v.name == name)
}

/// A product's shape as the choice is keyed: `[rows, cols]` weights, the gated down
/// projection or not, and the tuned row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemvShape {
    pub rows: usize,
    pub cols: usize,
    pub gated: bool,
    pub batch: usize,
}

/// The variant per shape: timed, or one for all.
#[derive(Debug, Clone, Default)]
pub struct GemvChoice {
    forced: Option<usize>,
    tuned: HashMap<GemvShape, usize>,
}

impl GemvChoice {
    /// One variant for every product (`FALLOW_CUDA_GEMV=<name>`), or, with `None` or
    /// `auto`, the timed choice.
    pub fn from_setting(setting: Option<&str>) -> Result<Self, String> {
        let forced = match setting {
            None | Some("auto") | Some("") => None,
            Some(name) => Some(variant_named(name).ok_or_else(|| {
                let names: Vec<&str> = GEMV_VARIANTS.iter().map(|v| v.name).collect();
                format!(
                    "FALLOW_CUDA_GEMV={name}: not a GEMV variant (auto or one of {})",
                    names.join(", ")
                )
            })?),
        };
        Ok(GemvChoice {
            forced,
            tuned: HashMap::new(),
        })
    }

    /// Whether the choice is left to timing.
    pub fn is_timed(&self) -> bool {
        self.forced.is_none()
    }

    /// The variant for `n` rows through `[rows, cols]` weights.
    pub fn variant(&self, rows: usize, cols: usize, gated: bool, n: usize) -> usize {
        if let Some(v) = self.forced {
            return v;
        }
        let shape = GemvShape {
            rows,
            cols,
            gated,
            batch: bucket(n),
        };
        self.tuned.get(&shape).copied().unwrap_or(DEFAULT_VARIANT)
    }

    pub fn record(&mut self, shape: GemvShape, variant: usize) {
        self.tuned.insert(shape, variant);
    }
}

/// The index of the smallest time (NaN never), `None` when none is a number.
pub fn fastest(times: &[f32]) -> Option<usize> {
    times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
}

impl CudaBackend {
    /// Times every GEMV variant on this model's bf16 matrices (QKV, output, gate/up, the
    /// gated down projection, the LM head) at each of [`TUNED_ROWS`] and keeps the fastest
    /// per shape. Inputs are zeros: the time depends on shapes, not values. A few
    /// milliseconds at load; nothing when a variant is forced.
    pub(super) fn tune_gemv(&mut self) -> Result<(), CudaError> {
        if !self.gemm.gemv_choice.is_timed() {
            return Ok(());
        }
        let layers = &self.weights.layers;
        let mut products: Vec<(&str, bool, Vec<&DeviceMatrix>)> = vec![
            ("qkv", false, layers.iter().map(|l| &l.wqkv).collect()),
            ("o", false, layers.iter().map(|l| &l.wo).collect()),
            (
                "gate_up",
                false,
                layers.iter().map(|l| &l.w_gate_up).collect(),
            ),
            ("down", true, layers.iter().map(|l| &l.w_down).collect()),
        ];
        products.push(("lm_head", false, vec![self.weights.lm_head()]));
        products.retain(|(_, _, ms)| {
            ms.first()
                .is_some_and(|m| matches!(m.storage, Storage::Bf16(_)) && m.cols.is_multiple_of(8))
        });
        let widest = products
            .iter()
            .filter_map(|(_, _, ms)| ms.first())
            .fold((0, 0), |(r, c), m| (r.max(m.rows), c.max(m.cols)));
        let n_max = GEMV_MAX_ROWS;
        let x = DeviceBuf::<u16>::zeros(&self.stream, n_max * widest.1)?;
        let gate_up = DeviceBuf::<f32>::zeros(&self.stream, n_max * 2 * widest.1)?;
        let out = DeviceBuf::<f32>::zeros(&self.stream, n_max * widest.0)?;
        let event = || {
            self.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(CudaError::driver)
        };
        let (start, stop) = (event()?, event()?);
        let mut choices = Vec::new();
        for (what, gated, matrices) in &products {
            let (rows, cols) = (matrices[0].rows, matrices[0].cols);
            let input = if *gated { gate_up.ptr() } else { x.ptr() };
            let act = gated.then_some(0);
            for batch in TUNED_ROWS {
                let mut times = Vec::with_capacity(GEMV_VARIANTS.len());
                for (v, variant) in GEMV_VARIANTS.iter().enumerate() {
                    if !self.gemm.gemv_usable(variant, batch, cols, *gated) {
                        times.push(f32::NAN); // never chosen
                        continue;
                    }
                    let launch = |i: usize| {
                        let w = matrices[i % matrices.len()].bf16_ptr().unwrap_or(0);
                        self.gemm
                            .gemv_bf16(v, w, rows, cols, input, batch, out.ptr(), act, None)
                    };
                    launch(TIMED_LAUNCHES)?;
                    start.record(&self.stream).map_err(CudaError::driver)?;
                    for i in 0..TIMED_LAUNCHES {
                        launch(i)?;
                    }
                    stop.record(&self.stream).map_err(CudaError::driver)?;
                    stop.synchronize().map_err(CudaError::driver)?;
                    let ms = start.elapsed_ms(&stop).map_err(CudaError::driver)?;
                    times.push(ms / TIMED_LAUNCHES as f32);
                }
                let Some(best) = fastest(&times) else {
                    continue;
                };
                let shape = GemvShape {
                    rows,
                    cols,
                    gated: *gated,
                    batch,
                };
                self.gemm.gemv_choice.record(shape, best);
                let micros = times[best] * 1e3;
                let bytes = (rows * cols * 2) as f64;
                choices.push(format!(
                    "{what} {rows}x{cols} n={batch}: {} {micros:.1} µs ({:.0} GB/s; default {:.1} µs)",
                    GEMV_VARIANTS[best].name,
                    bytes / f64::from(times[best]) / 1e6,
                    times[DEFAULT_VARIANT] * 1e3,
                ));
            }
        }
        tracing::info!(choices = ?choices, "bf16 GEMV variants timed on this GPU");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::backend::cuda::kernels::NAMES;

    #[test]
    fn every_variant_is_a_compiled_kernel_pair_with_a_unique_name() {
        for v in GEMV_VARIANTS {
            assert!(NAMES.contains(&v.plain), "{} missing from NAMES", v.plain);
            assert!(NAMES.contains(&v.gated), "{} missing from NAMES", v.gated);
            let suffix = match (v.prefetch, v.resident) {
                (_, true) => "r",
                (true, false) => "p",
                (false, false) => "",
            };
            let name = format!("w{}u{}{suffix}", v.warps, v.unroll);
            assert_eq!(v.name, name);
            assert_eq!(v.plain, format!("gemv_bf16_{name}"));
            assert_eq!(v.gated, format!("gemv_bf16_gated_{name}"));
            assert_eq!(variant_named(v.name).map(|i| GEMV_VARIANTS[i]), Some(v));
        }
        assert_eq!(GEMV_VARIANTS[DEFAULT_VARIANT].name, "w8u4");
    }

    #[test]
    fn a_resident_variant_serves_only_products_whose_x_fits_in_shared_memory() {
        let resident = GEMV_VARIANTS[variant_named("w8u4r").expect("listed")];
        let tiled = GEMV_VARIANTS[variant_named("w8u4p").expect("listed")];
        // One row of Llama-3 8B's down projection (14336 inputs): 28 KiB.
        assert!(resident.fits(1, 14336));
        assert_eq!(resident.shared_bytes(1, 14336), 28_672);
        // Four rows of it (112 KiB) do not; eight of a 4096-wide input (64 KiB) neither.
        assert!(!resident.fits(4, 14336));
        assert!(!resident.fits(8, 4096));
        assert!(resident.fits(4, 4096));
        assert!(tiled.fits(8, 14336) && tiled.shared_bytes(8, 14336) == 0);
    }

    #[test]
    fn a_product_uses_the_choice_timed_for_the_smallest_row_count_that_covers_it() {
        assert_eq!(
            (1..=8).map(bucket).collect::<Vec<_>>(),
            [1, 4, 4, 4, 8, 8, 8, 8]
        );
        let mut choice = GemvChoice::default();
        let shape = |batch| GemvShape {
            rows: 6144,
            cols: 4096,
            gated: false,
            batch,
        };
        choice.record(shape(1), 5);
        choice.record(shape(4), 1);
        assert_eq!(choice.variant(6144, 4096, false, 1), 5);
        assert_eq!(choice.variant(6144, 4096, false, 3), 1);
        assert_eq!(
            choice.variant(6144, 4096, false, 8),
            DEFAULT_VARIANT,
            "untimed"
        );
        assert_eq!(
            choice.variant(6144, 4096, true, 1),
            DEFAULT_VARIANT,
            "the gated kernel is timed apart"
        );
        let forced = GemvChoice::from_setting(Some(GEMV_VARIANTS[3].name)).expect("a variant");
        assert_eq!(forced.variant(6144, 4096, false, 1), 3);
        assert!(!forced.is_timed());
    }

    #[test]
    fn the_setting_names_a_variant_or_leaves_it_to_timing() {
        assert!(GemvChoice::from_setting(None).is_ok_and(|c| c.is_timed()));
        assert!(GemvChoice::from_setting(Some("auto")).is_ok_and(|c| c.is_timed()));
        let c = GemvChoice::from_setting(Some("w16u8")).expect("a variant");
        assert_eq!(c.variant(1, 8, false, 1), 5);
        let err = GemvChoice::from_setting(Some("w3u3")).expect_err("no such variant");
        assert!(err.contains("w8u4"), "{err}");
    }

    #[test]
    fn the_fastest_time_wins_and_nan_never_does() {
        assert_eq!(fastest(&[3.0, 1.5, 2.0]), Some(1));
        assert_eq!(fastest(&[f32::NAN, 2.0, 4.0]), Some(1));
        assert_eq!(fastest(&[f32::NAN]), None);
        assert_eq!(fastest(&[]), None);
    }
}
