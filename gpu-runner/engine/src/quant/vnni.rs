//! x86_64 row kernels for CPUs with AVX-512 VNNI (and VL/BW): the shared
//! [`super::x86_rows`] source compiled with 32 vector registers and VNNI's one-instruction
//! dot products — `vpdpbusd` (u8 × i8, four products summed into each i32 lane) replaces
//! AVX2's `maddubs` + `madd`, and `vpdpwssd` folds the K-quants' scale multiply and
//! accumulation into one. Still 256-bit vectors: on the CPUs this targets, 512-bit integer
//! ops issue as two halves, so wider vectors would add shuffles without adding throughput.
//! `formats` hands these out only after `formats::has_vnni`.

use super::x86_rows::x86_row_kernels;

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
fn scaled_dot_acc(acc: __m256i, u: __m256i, s: __m256i, scales: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), scales)
}

/// `vpdpbusd` sums u8 × i8 products straight into i32: exact for every u8.
const FULL_RANGE_U8: bool = true;

x86_row_kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni");

/// The tile kernels (from the shared [`super::x86_tiles`] source) with VNNI.
pub(crate) mod tiles {
    use super::super::x86_ktiles::x86_ktile_kernels;
    use super::super::x86_tiles::x86_tile_kernels;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn dot_u8_i8_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    fn dot_i16_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }

    /// `vpdpbusd` sums u8 × i8 products straight into i32: exact for every u8.
    const FULL_RANGE_U8: bool = true;

    /// AVX-512VL gives 32 vector registers.
    const WIDE_REGISTERS: bool = true;

    x86_tile_kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni");
    x86_ktile_kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni");
}
