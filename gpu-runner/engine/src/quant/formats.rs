//! The quantized weight formats as types: each names its activation block type and its
//! per-block integer dot product, and picks the fastest row kernel this CPU can run, and
//! the tile kernel for its interleaved layout where this CPU has one.

use super::act::{ActBlock, BlockQ8K, BlockQ8_1};
use super::ggml_type::GgmlType;
use super::{kquants, legacy, mxfp4};

/// Computes, for one weight row and a tile of `tn` tokens whose activation blocks are laid
/// out block-major (`acts[b * tn + t]`), `out[t] = Σ_b dot(row block b, acts[b * tn + t])`.
/// Block-major order lets a kernel unpack each weight block once and reuse it for every
/// token of the tile while it is in registers.
pub(crate) type RowKernel<A> = fn(wrow: &[u8], acts: &[A], tn: usize, out: &mut [f32]);

/// Computes, for one tile of 8 interleaved rows (see `interleave`) and a tile of `tn`
/// tokens laid out as for [`RowKernel`], `out[t * 8 + r] = Σ_b dot(row r's block b, acts[b * tn
/// + t])`.
pub(crate) type TileKernel<A> = fn(tile: &[u8], acts: &[A], tn: usize, out: &mut [f32]);

/// A quantized weight block format.
pub(crate) trait WeightFormat {
    type Act: ActBlock;
    const BLOCK_BYTES: usize;
    /// Dot product of one weight block with one activation block.
    fn dot(block: &[u8], a: &Self::Act) -> f32;
    /// The row kernel to use on this CPU (portable unless a SIMD one is available).
    fn row_kernel() -> RowKernel<Self::Act> {
        scalar_row::<Self>
    }
    /// The tile kernel of the interleaved layout on this CPU, if it has one.
    fn tile_kernel() -> Option<TileKernel<Self::Act>> {
        None
    }
}

/// The portable row kernel, written in terms of [`WeightFormat::dot`].
pub(crate) fn scalar_row<W: WeightFormat + ?Sized>(
    wrow: &[u8],
    acts: &[W::Act],
    tn: usize,
    out: &mut [f32],
) {
    let out = &mut out[..tn];
    out.fill(0.0);
    for (b, block) in wrow.chunks_exact(W::BLOCK_BYTES).enumerate() {
        for (o, a) in out.iter_mut().zip(&acts[b * tn..(b + 1) * tn]) {
            *o += W::dot(block, a);
        }
    }
}

macro_rules! weight_format {
    ($name:ident, $act:ty, $bytes:expr, $dot:path, $simd:expr, $tile:expr) => {
        pub(crate) struct $name;
        impl WeightFormat for $name {
            type Act = $act;
            const BLOCK_BYTES: usize = $bytes;
            #[inline(always)]
            fn dot(block: &[u8], a: &$act) -> f32 {
                $dot(block, a)
            }
            fn row_kernel() -> RowKernel<$act> {
                let simd: Option<RowKernel<$act>> = $simd;
                simd.unwrap_or(scalar_row::<Self>)
            }
            fn tile_kernel() -> Option<TileKernel<$act>> {
                $tile
            }
        }
    };
}

weight_format!(
    Q4_0,
    BlockQ8_1,
    18,
    legacy::dot_q4_0,
    simd::q4_0(),
    simd::tile_q4_0()
);
weight_format!(
    Q4_1,
    BlockQ8_1,
    20,
    legacy::dot_q4_1,
    simd::q4_1(),
    simd::tile_q4_1()
);
weight_format!(
    Q5_0,
    BlockQ8_1,
    22,
    legacy::dot_q5_0,
    simd::q5_0(),
    simd::tile_q5_0()
);
weight_format!(
    Q5_1,
    BlockQ8_1,
    24,
    legacy::dot_q5_1,
    simd::q5_1(),
    simd::tile_q5_1()
);
weight_format!(
    Q8_0,
    BlockQ8_1,
    34,
    legacy::dot_q8_0,
    simd::q8_0(),
    simd::tile_q8_0()
);
weight_format!(
    Q4K,
    BlockQ8K,
    144,
    kquants::dot_q4_k,
    simd::q4_k(),
    simd::tile_q4_k()
);
weight_format!(
    Q5K,
    BlockQ8K,
    176,
    kquants::dot_q5_k,
    simd::q5_k(),
    simd::tile_q5_k()
);
weight_format!(
    Q6K,
    BlockQ8K,
    210,
    kquants::dot_q6_k,
    simd::q6_k(),
    simd::tile_q6_k()
);

weight_format!(
    MXFP4,
    BlockQ8_1,
    17,
    mxfp4::dot_mxfp4,
    simd::mxfp4(),
    simd::tile_mxfp4()
);

/// Whether this CPU has a tile kernel for `dtype` (so its matrices are worth interleaving).
pub(crate) fn has_tile_kernel(dtype: GgmlType) -> bool {
    match dtype {
        GgmlType::Q4_0 => Q4_0::tile_kernel().is_some(),
        GgmlType::Q4_1 => Q4_1::tile_kernel().is_some(),
        GgmlType::Q5_0 => Q5_0::tile_kernel().is_some(),
        GgmlType::Q5_1 => Q5_1::tile_kernel().is_some(),
        GgmlType::Q8_0 => Q8_0::tile_kernel().is_some(),
        GgmlType::Q4K => Q4K::tile_kernel().is_some(),
        GgmlType::Q5K => Q5K::tile_kernel().is_some(),
        GgmlType::Q6K => Q6K::tile_kernel().is_some(),
        GgmlType::MXFP4 => MXFP4::tile_kernel().is_some(),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => false,
    }
}

/// Whether this CPU can run the AVX2 kernels (which also use FMA and F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether this CPU can run the VNNI kernels (AVX-512 VL/BW/VNNI on top of AVX2).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// Runtime selection of SIMD row kernels (VNNI, else AVX2); `None` where the CPU has
/// neither. [`CpuKernels::Avx2`](crate::cpu_settings::CpuKernels) (`FALLOW_CPU_KERNELS=avx2`)
/// skips VNNI, to compare the two, and `Scalar` skips both.
mod simd {
    use super::*;

    /// The best kernel set this CPU may run, within the settings' cap.
    #[cfg(target_arch = "x86_64")]
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Level {
        Scalar,
        Avx2,
        Vnni,
    }

    /// Decided once per process: every matrix product asks, and the CPU's features are
    /// detected once.
    #[cfg(target_arch = "x86_64")]
    fn level() -> Level {
        use crate::cpu_settings::{settings, CpuKernels};
        static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| {
            let cap = match settings().kernels {
                CpuKernels::Scalar => Level::Scalar,
                CpuKernels::Avx2 => Level::Avx2,
                CpuKernels::Best => Level::Vnni,
            };
            let detected = if has_vnni() {
                Level::Vnni
            } else if has_avx2() {
                Level::Avx2
            } else {
                Level::Scalar
            };
            cap.min(detected)
        })
    }

    macro_rules! x86_kernel {
        ($fn_name:ident, $act:ty, $kernel:ident) => {
            pub(super) fn $fn_name() -> Option<RowKernel<$act>> {
                #[cfg(target_arch = "x86_64")]
                match level() {
                    Level::Vnni => return Some(crate::quant::vnni::$kernel),
                    Level::Avx2 => return Some(crate::quant::avx2::rows::$kernel),
                    Level::Scalar => {}
                }
                None
            }
        };
    }

    /// A tile kernel at the VNNI and (unless `vnni_only`) AVX2 levels.
    macro_rules! x86_tile_kernel {
        ($fn_name:ident, $act:ty, $kernel:ident, vnni_only: $vnni_only:expr) => {
            pub(super) fn $fn_name() -> Option<TileKernel<$act>> {
                #[cfg(target_arch = "x86_64")]
                match level() {
                    Level::Vnni => return Some(crate::quant::vnni::tiles::$kernel),
                    Level::Avx2 if !$vnni_only => return Some(crate::quant::avx2::tiles::$kernel),
                    Level::Avx2 | Level::Scalar => {}
                }
                None
            }
        };
    }

    x86_tile_kernel!(tile_q4_0, BlockQ8_1, tile_q4_0, vnni_only: false);
    x86_tile_kernel!(tile_q4_1, BlockQ8_1, tile_q4_1, vnni_only: false);
    x86_tile_kernel!(tile_q5_0, BlockQ8_1, tile_q5_0, vnni_only: false);
    x86_tile_kernel!(tile_q5_1, BlockQ8_1, tile_q5_1, vnni_only: false);
    // AVX2's u8 × i8 product saturates on Q8_0's +128 quants.
    x86_tile_kernel!(tile_q8_0, BlockQ8_1, tile_q8_0, vnni_only: true);
    x86_tile_kernel!(tile_q4_k, BlockQ8K, tile_q4_k, vnni_only: false);
    x86_tile_kernel!(tile_q5_k, BlockQ8K, tile_q5_k, vnni_only: false);
    x86_tile_kernel!(tile_q6_k, BlockQ8K, tile_q6_k, vnni_only: false);
    // Codes become 0..=24: AVX2's pair sums stay far from saturating.
    x86_tile_kernel!(tile_mxfp4, BlockQ8_1, tile_mxfp4, vnni_only: false);

    x86_kernel!(q4_0, BlockQ8_1, row_q4_0);
    x86_kernel!(q4_1, BlockQ8_1, row_q4_1);
    x86_kernel!(q5_0, BlockQ8_1, row_q5_0);
    x86_kernel!(q5_1, BlockQ8_1, row_q5_1);
    x86_kernel!(q8_0, BlockQ8_1, row_q8_0);
    x86_kernel!(q4_k, BlockQ8K, row_q4_k);
    x86_kernel!(q5_k, BlockQ8K, row_q5_k);
    x86_kernel!(q6_k, BlockQ8K, row_q6_k);
    x86_kernel!(mxfp4, BlockQ8_1, row_mxfp4);
}
