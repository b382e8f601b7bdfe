//! Which bf16 GEMV instantiation serves each decode-sized product. The kernel comes in
//! several shapes ([`GEMV_VARIANTS`]: output columns per block × 16-byte loads in flight per
//! lane, with or without the next tile's loads issued before the current tile is summed, x
//! staged tile by tile or all at once), and each can keep L2 asked for [`AHEAD_BYTES`] of its
//! weight row past the tile it loads (bulk prefetches: more bytes in flight than its
//! registers hold); all compute the same bits. Which one streams a matrix fastest depends on
//! the GPU and on the matrix (how many blocks fill the SMs, how long each walks K), so at
//! load the backend times every variant at every distance on the model's own matrices at 1,
//! 4 and 8 token rows and keeps the fastest per shape ([`CudaBackend::tune_gemv`]); a product
//! of `n` rows uses the choice made for the smallest tuned row count ≥ `n`.
//! `FALLOW_CUDA_GEMV=w8u4` (a variant's name, optionally with a distance: `w8u4:2048`) skips
//! the timing and uses that everywhere.

use std::collections::HashMap;

use cudarc::driver::sys::CUevent_flags;

use super::buffer::DeviceBuf;
use super::gemm::{GemvForm, GEMV_MAX_ROWS};
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

/// The distances timed: bytes of each row, past the tile whose loads go out, that a GEMV
/// keeps L2 asked for (0: none). Up to a few tiles: the rows resident at once times the
/// distance must stay well within L2, or lines are evicted before they are read.
pub const AHEAD_BYTES: [u32; 3] = [0, 2048, 8192];

/// A variant and its prefetch distance: what serves one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvPick {
    /// Index into [`GEMV_VARIANTS`].
    pub variant: usize,
    /// Bytes of the row past the tile being loaded kept asked of L2 (a multiple of 16).
    pub ahead: u32,
}

impl GemvPick {
    /// What serves a shape no timing chose: the default variant, no prefetching ahead.
    pub const DEFAULT: GemvPick = GemvPick {
        variant: DEFAULT_VARIANT,
        ahead: 0,
    };

    /// `w8u4`, or `w8u4:2048` with a distance.
    pub fn name(&self) -> String {
        let v = GEMV_VARIANTS[self.variant].name;
        if self.ahead == 0 {
            v.to_string()
        } else {
            format!("{v}:{}", self.ahead)
        }
    }
}

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

/// The variant and distance per shape: timed, or one for all.
#[derive(Debug, Clone, Default)]
pub struct GemvChoice {
    forced: Option<GemvPick>,
    tuned: HashMap<GemvShape, GemvPick>,
}

impl GemvChoice {
    /// One variant for every product (`FALLOW_CUDA_GEMV=<name>[:<bytes ahead>]`), or, with
    /// `None` or `auto`, the timed choice.
    pub fn from_setting(setting: Option<&str>) -> Result<Self, String> {
        let forced = match setting {
            None | Some("auto") | Some("") => None,
            Some(setting) => Some(parse_pick(setting)?),
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

    /// The variant and distance for `n` rows through `[rows, cols]` weights.
    pub fn pick(&self, rows: usize, cols: usize, gated: bool, n: usize) -> GemvPick {
        if let Some(p) = self.forced {
            return p;
        }
        let shape = GemvShape {
            rows,
            cols,
            gated,
            batch: bucket(n),
        };
        self.tuned.get(&shape).copied().unwrap_or(GemvPick::DEFAULT)
    }

    pub fn record(&mut self, shape: GemvShape, pick: GemvPick) {
        self.tuned.insert(shape, pick);
    }
}

/// `w8u4` or `w8u4:2048` (bytes ahead, a multiple of 16).
fn parse_pick(setting: &str) -> Result<GemvPick, String> {
    let (name, ahead) = match setting.split_once(':') {
        Some((name, ahead)) => (name, Some(ahead)),
        None => (setting, None),
    };
    let variant = variant_named(name).ok_or_else(|| {
        let names: Vec<&str> = GEMV_VARIANTS.iter().map(|v| v.name).collect();
        format!(
            "FALLOW_CUDA_GEMV={setting}: not a GEMV variant (auto or one of {}, optionally \
             followed by :<bytes ahead>)",
            names.join(", ")
        )
    })?;
    let ahead = match ahead {
        None => 0,
        Some(a) => a
            .parse::<u32>()
            .ok()
            .filter(|b| b % 16 == 0)
            .ok_or_else(|| {
                format!("FALLOW_CUDA_GEMV={setting}: bytes ahead must be a multiple of 16")
            })?,
    };
    Ok(GemvPick { variant, ahead })
}

/// Every variant at every distance, in the order they are timed.
pub fn candidates() -> Vec<GemvPick> {
    (0..GEMV_VARIANTS.len())
        .flat_map(|variant| AHEAD_BYTES.map(|ahead| GemvPick { variant, ahead }))
        .collect()
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
    /// Times every GEMV variant at every distance on this model's bf16 matrices (QKV,
    /// output, gate/up, the down projection gated and plain, the LM head) at each of
    /// [`TUNED_ROWS`] and keeps the fastest per shape. Inputs are zeros: the time depends on
    /// shapes, not values. Well under a second at load; nothing when a variant is forced.
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
            // Of the activation the gate/up GEMV wrote (forward.rs's fused GLU).
            ("down", false, layers.iter().map(|l| &l.w_down).collect()),
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
            let form = if *gated {
                GemvForm::GatedInput(0)
            } else {
                GemvForm::Plain
            };
            for batch in TUNED_ROWS {
                let picks = candidates();
                let mut times = Vec::with_capacity(picks.len());
                for pick in &picks {
                    let variant = &GEMV_VARIANTS[pick.variant];
                    if !self.gemm.gemv_usable(variant, batch, cols, *gated) {
                        times.push(f32::NAN); // never chosen
                        continue;
                    }
                    let launch = |i: usize| {
                        let w = matrices[i % matrices.len()].bf16_ptr().unwrap_or(0);
                        let (pick, out) = (*pick, out.ptr());
                        self.gemm
                            .gemv_bf16(pick, w, rows, cols, input, batch, out, form, None)
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
                self.gemm.gemv_choice.record(shape, picks[best]);
                let micros = times[best] * 1e3;
                let bytes = (rows * cols * 2) as f64;
                let default = picks.iter().position(|p| *p == GemvPick::DEFAULT);
                choices.push(format!(
                    "{what} {rows}x{cols} n={batch}: {} {micros:.1} µs ({:.0} GB/s; default {:.1} µs)",
                    picks[best].name(),
                    bytes / f64::from(times[best]) / 1e6,
                    default.map_or(f32::NAN, |d| times[d] * 1e3),
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
        let pick = |variant, ahead| GemvPick { variant, ahead };
        choice.record(shape(1), pick(5, 2048));
        choice.record(shape(4), pick(1, 0));
        assert_eq!(choice.pick(6144, 4096, false, 1), pick(5, 2048));
        assert_eq!(choice.pick(6144, 4096, false, 3), pick(1, 0));
        assert_eq!(
            choice.pick(6144, 4096, false, 8),
            GemvPick::DEFAULT,
            "untimed"
        );
        assert_eq!(
            choice.pick(6144, 4096, true, 1),
            GemvPick::DEFAULT,
            "the gated kernel is timed apart"
        );
        let forced = GemvChoice::from_setting(Some(GEMV_VARIANTS[3].name)).expect("a variant");
        assert_eq!(forced.pick(6144, 4096, false, 1), pick(3, 0));
        assert!(!forced.is_timed());
    }

    #[test]
    fn the_setting_names_a_variant_or_leaves_it_to_timing() {
        assert!(GemvChoice::from_setting(None).is_ok_and(|c| c.is_timed()));
        assert!(GemvChoice::from_setting(Some("auto")).is_ok_and(|c| c.is_timed()));
        let c = GemvChoice::from_setting(Some("w16u8")).expect("a variant");
        assert_eq!(c.pick(1, 8, false, 1).variant, 5);
        let c = GemvChoice::from_setting(Some("w16u8:2048")).expect("a variant and distance");
        assert_eq!(
            c.pick(1, 8, false, 1),
            GemvPick {
                variant: 5,
                ahead: 2048
            }
        );
        assert_eq!(c.pick(1, 8, false, 1).name(), "w16u8:2048");
        let err = GemvChoice::from_setting(Some("w3u3")).expect_err("no such variant");
        assert!(err.contains("w8u4"), "{err}");
        let err = GemvChoice::from_setting(Some("w8u4:100")).expect_err("not whole pieces");
        assert!(err.contains("multiple of 16"), "{err}");
    }

    #[test]
    fn every_variant_is_timed_at_every_distance_and_the_default_among_them() {
        let picks = candidates();
        assert_eq!(picks.len(), GEMV_VARIANTS.len() * AHEAD_BYTES.len());
        assert!(picks.contains(&GemvPick::DEFAULT));
        assert!(AHEAD_BYTES.iter().all(|a| a % 16 == 0));
    }

    #[test]
    fn the_fastest_time_wins_and_nan_never_does() {
        assert_eq!(fastest(&[3.0, 1.5, 2.0]), Some(1));
        assert_eq!(fastest(&[f32::NAN, 2.0, 4.0]), Some(1));
        assert_eq!(fastest(&[f32::NAN]), None);
        assert_eq!(fastest(&[]), None);
    }
}
