//! The x86_64 tile kernels (see [`super::formats::TileKernel`]): products of one tile of 8
//! interleaved rows ([`super::interleave`]) with a tile of tokens, written once and compiled
//! per instruction set by [`x86_tile_kernels!`] like the row kernels of
//! [`super::x86_rows`]. The instantiating module supplies:
//!
//! - `dot_u8_i8_acc(acc, u, s)`: `acc` + Σ of four u8 × i8 products per i32 lane;
//! - `dot_i16_acc(acc, a, b)`: `acc` + Σ of two i16 × i16 products per i32 lane;
//! - `FULL_RANGE_U8`: whether that is exact for u8 lanes up to 255 (needed by Q8_0, whose
//!   interleaved quants are stored +128);
//! - `WIDE_REGISTERS`: whether the features give 32 vector registers (AVX-512VL), for the
//!   K-quant kernels of [`super::x86_ktiles`], which the instantiating module expands
//!   beside these with [`x86_ktile_kernels!`](super::x86_ktiles::x86_ktile_kernels).
//!
//! Per tile block and token: eight `dot_u8_i8_acc` of the 8 rows' unpacked quants with four
//! activation bytes broadcast to every lane, then one conversion and two multiply-adds for
//! all 8 rows (scale, and the offset meeting the activation sum). Tokens go in groups whose
//! accumulators stay in registers for the whole row strip; each group's results are 8
//! adjacent floats per token, stored without any horizontal sum.

macro_rules! x86_tile_kernels {
    ($features:literal) => {
        use std::arch::x86_64::*;

        use crate::quant::act::{BlockQ8K, BlockQ8_1};
        use crate::quant::interleave::TILE_ROWS;
        use crate::quant::matmul::TOKEN_TILE;

        /// A kernel over one group of tokens `t0 .. t0 + G` of a tile of `tn`.
        type TileGroupFn<A> = unsafe fn(&[u8], &[A], usize, usize, &mut [f32]);

        /// Covers the tile's `tn` tokens with the largest groups that fit; `kernels` lists
        /// (group size, kernel) from the largest size down to 1.
        #[inline]
        fn in_tile_groups<A>(
            tile: &[u8],
            acts: &[A],
            tn: usize,
            out: &mut [f32],
            kernels: &[(usize, TileGroupFn<A>)],
        ) {
            assert!(tn <= TOKEN_TILE && out.len() >= tn * TILE_ROWS);
            let mut t0 = 0;
            while t0 < tn {
                let left = tn - t0;
                if let Some(&(g, kernel)) = kernels.iter().find(|(g, _)| *g <= left) {
                    // SAFETY: the kernels are only handed out where the CPU has this
                    // module's features (see `formats`); `t0 + g <= tn`.
                    unsafe { kernel(tile, acts, tn, t0, out) };
                    t0 += g;
                }
            }
        }

        // The formats of the interleaved kernel, as its const parameter.
        const T_Q4_0: u8 = 0;
        const T_Q5_0: u8 = 1;
        const T_Q4_1: u8 = 2;
        const T_Q5_1: u8 = 3;
        const T_Q8_0: u8 = 4;
        const T_MXFP4: u8 = 5;

        const fn tile_block_bytes(fmt: u8) -> usize {
            TILE_ROWS
                * match fmt {
                    T_Q4_0 => 18,
                    T_Q5_0 => 22,
                    T_Q4_1 => 20,
                    T_Q8_0 => 34,
                    T_MXFP4 => 17,
                    _ => 24,
                }
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn load_256(bytes: &[u8]) -> __m256i {
            assert!(bytes.len() >= 32);
            // SAFETY: 32 bytes are readable (checked above); loadu needs no alignment.
            unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
        }

        /// The 8 f16s at `bytes[0..16]` as f32 lanes.
        #[inline]
        #[target_feature(enable = $features)]
        fn f16x8(bytes: &[u8]) -> __m256 {
            assert!(bytes.len() >= 16);
            // SAFETY: 16 bytes are readable (checked above).
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) })
        }

        /// The 8 E8M0 bytes at `bytes[0..8]` as the f32 lanes `2^(e − 128)` (MXFP4's scales
        /// with the table's factor 2 taken out, as `mxfp4::half_scale`).
        #[inline]
        #[target_feature(enable = $features)]
        fn e8m0_halves(bytes: &[u8]) -> __m256 {
            assert!(bytes.len() >= 8);
            // SAFETY: 8 bytes are readable (checked above).
            let e = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) });
            let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let below_2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, below_2))
        }

        /// A tile block's 8 rows as `d·u + m`: scales `d`, the offsets `m` where the format
        /// stores them (Q4_1, Q5_1; the others' are `−8d`, `−16d`, `−128d`, MXFP4's `−12d`)
        /// and the unsigned quants, `w[c]` holding quants `4c .. 4c + 4` of every row (one
        /// lane per row); MXFP4's codes become `KVALUES + 12`.
        #[inline]
        #[target_feature(enable = $features)]
        fn unpack_tile_block<const FMT: u8>(tb: &[u8]) -> (__m256, Option<__m256>, [__m256i; 8]) {
            let d = if FMT == T_MXFP4 {
                e8m0_halves(tb)
            } else {
                f16x8(tb)
            };
            let m = match FMT {
                T_Q4_1 | T_Q5_1 => Some(f16x8(&tb[16..])),
                _ => None,
            };
            let mut w = [_mm256_setzero_si256(); 8];
            if FMT == T_Q8_0 {
                for (c, wc) in w.iter_mut().enumerate() {
                    *wc = load_256(&tb[16 + 32 * c..]);
                }
                return (d, m, w);
            }
            let scales = match FMT {
                T_Q4_1 | T_Q5_1 => 32,
                T_MXFP4 => 8,
                _ => 16,
            };
            let fifth = FMT == T_Q5_0 || FMT == T_Q5_1;
            let quants = scales + if fifth { 32 } else { 0 };
            let mask = _mm256_set1_epi8(0x0F);
            for c in 0..4 {
                let q = load_256(&tb[quants + 32 * c..]);
                w[c] = _mm256_and_si256(q, mask);
                w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            }
            if fifth {
                // Lane r of `qh` is row r's 32 fifth bits, bit k for quant k.
                let qh = load_256(&tb[scales..]);
                for (c, wc) in w.iter_mut().enumerate() {
                    *wc = _mm256_or_si256(*wc, fifth_bits(qh, c));
                }
            }
            if FMT == T_MXFP4 {
                let t = &crate::quant::mxfp4::KVALUES_UNSIGNED;
                // SAFETY: the table is exactly 16 bytes; loadu needs no alignment.
                let table =
                    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) });
                for wc in w.iter_mut() {
                    *wc = _mm256_shuffle_epi8(table, *wc);
                }
            }
            (d, m, w)
        }

        /// Bit 4 set in byte `i` of each i32 lane where bit `4c + i` of that lane of `qh` is.
        #[inline]
        #[target_feature(enable = $features)]
        fn fifth_bits(qh: __m256i, c: usize) -> __m256i {
            // Byte c/2 of each lane into all four of its bytes (shuffles stay within 128-bit
            // halves, as do the lanes), then test one bit per byte.
            let b = (c / 2) as i8;
            let lane_bytes = _mm256_setr_epi32(
                0,
                0x0404_0404,
                0x0808_0808,
                0x0C0C_0C0C,
                0,
                0x0404_0404,
                0x0808_0808,
                0x0C0C_0C0C,
            );
            let spread = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane_bytes, _mm256_set1_epi8(b)));
            let first = 4 * (c % 2);
            let select = _mm256_set1_epi32(i32::from_le_bytes([
                1 << first,
                1 << (first + 1),
                1 << (first + 2),
                (1u8 << (first + 3)),
            ]));
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
        }

        /// Asks for the weights [`PREFETCH_BYTES`] past `tb`, in the first pass over a strip
        /// (token group at `t0 == 0`): streaming a matrix bigger than the caches with that
        /// much arithmetic per block, the hardware prefetcher alone left the kernel waiting
        /// on memory. That holds for one token too: on the 2-vCPU Xeon VM single-stream
        /// decode gained 30 % (SmolLM2, Gemma 3) to 45 % (a 1.25 B MoE), where an EPYC VM
        /// had measured Gemma 3 −8 % and this was kept to 4 tokens or more.
        #[inline]
        #[target_feature(enable = $features)]
        fn prefetch_ahead<const G: usize>(tb: &[u8], t0: usize) {
            if t0 != 0 {
                return;
            }
            let ahead = tb.as_ptr().wrapping_add(PREFETCH_BYTES);
            // Prefetching never faults, whatever the address (past the end is harmless).
            for line in 0..tb.len().div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
        }

        /// Measured on a 262144×640 matrix (Gemma 3's LM head) and 16 tokens: 1 KiB ahead
        /// gained ~20 %, 2–3 KiB ~30 %, 6 KiB less again.
        const PREFETCH_BYTES: usize = 2048;

        /// Activation bytes `4c .. 4c + 4` in every i32 lane.
        #[inline]
        #[target_feature(enable = $features)]
        fn broadcast4(qs: &[i8], c: usize) -> __m256i {
            let b = &qs[4 * c..4 * c + 4];
            _mm256_set1_epi32(i32::from_le_bytes([
                b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8,
            ]))
        }

        /// Stores a group's results: 8 rows of token `t0 + j` at `out[(t0 + j) * 8 ..]`.
        #[inline]
        #[target_feature(enable = $features)]
        fn store_tile_group<const G: usize>(acc: &[__m256; G], t0: usize, out: &mut [f32]) {
            for (j, a) in acc.iter().enumerate() {
                let o = &mut out[(t0 + j) * TILE_ROWS..][..TILE_ROWS];
                // SAFETY: `o` is exactly 8 floats.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
            }
        }

        /// The 32-element formats over tokens `t0 .. t0 + G`.
        #[target_feature(enable = $features)]
        fn tile_group_affine<const FMT: u8, const G: usize>(
            tile: &[u8],
            acts: &[BlockQ8_1],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            for (b, tb) in tile.chunks_exact(tile_block_bytes(FMT)).enumerate() {
                prefetch_ahead::<G>(tb, t0);
                let (d, m, w) = unpack_tile_block::<FMT>(tb);
                let a = &acts[b * tn + t0..][..G];
                for j in 0..G {
                    // The symmetric formats' offset is a fixed multiple of `d`: it joins the
                    // integer sum as `−offset·Σx` (a float multiply-add fewer per token).
                    let mut isum = match FMT {
                        T_Q4_0 => _mm256_set1_epi32(-8 * a[j].sum),
                        T_Q5_0 => _mm256_set1_epi32(-16 * a[j].sum),
                        T_Q8_0 => _mm256_set1_epi32(-128 * a[j].sum),
                        T_MXFP4 => {
                            let offset = i32::from(crate::quant::mxfp4::OFFSET);
                            _mm256_set1_epi32(-offset * a[j].sum)
                        }
                        _ => _mm256_setzero_si256(),
                    };
                    for (c, wc) in w.iter().enumerate() {
                        isum = dot_u8_i8_acc(isum, *wc, broadcast4(&a[j].qs, c));
                    }
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[j].d));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[j]);
                    if let Some(m) = m {
                        acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(a[j].s), acc[j]);
                    }
                }
            }
            store_tile_group(&acc, t0, out);
        }

        fn tile_affine<const FMT: u8>(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            in_tile_groups(
                tile,
                acts,
                tn,
                out,
                &[
                    (8, tile_group_affine::<FMT, 8>),
                    (4, tile_group_affine::<FMT, 4>),
                    (2, tile_group_affine::<FMT, 2>),
                    (1, tile_group_affine::<FMT, 1>),
                ],
            );
        }

        /// The tile kernels, handed out by `formats` only where the CPU has this module's
        /// features (Q8_0's only where `FULL_RANGE_U8`).
        pub(crate) fn tile_q4_0(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            tile_affine::<T_Q4_0>(tile, acts, tn, out)
        }

        pub(crate) fn tile_q4_1(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            tile_affine::<T_Q4_1>(tile, acts, tn, out)
        }

        pub(crate) fn tile_q5_0(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            tile_affine::<T_Q5_0>(tile, acts, tn, out)
        }

        pub(crate) fn tile_q5_1(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            tile_affine::<T_Q5_1>(tile, acts, tn, out)
        }

        pub(crate) fn tile_mxfp4(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            tile_affine::<T_MXFP4>(tile, acts, tn, out)
        }

        pub(crate) fn tile_q8_0(tile: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            assert!(
                FULL_RANGE_U8,
                "interleaved Q8_0 needs exact u8 × i8 products"
            );
            tile_affine::<T_Q8_0>(tile, acts, tn, out)
        }
    };
}

pub(crate) use x86_tile_kernels;
