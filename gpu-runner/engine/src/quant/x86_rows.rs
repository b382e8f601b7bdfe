//! The x86_64 row kernels (see [`super::formats::RowKernel`]) of every quantized format,
//! written once and compiled per instruction set by [`x86_row_kernels!`]: `avx2` (AVX2 +
//! FMA + F16C, 16 vector registers) and `vnni` (adds AVX-512 VL/BW/VNNI: 32 registers and
//! one-instruction u8×i8 dot products). The module that instantiates the macro supplies the
//! two integer primitives the kernels are built on:
//!
//! - `dot_u8_i8(u, s)`: Σ of four u8 × i8 products per i32 lane;
//! - `scaled_dot_acc(acc, u, s, scales)`: `acc` + Σ of (u8 × i8 pair sums) × i16 scales;
//! - `FULL_RANGE_U8`: whether `dot_u8_i8` is exact for u8 lanes up to 255 (VNNI's is; AVX2's
//!   saturates i16 pair sums above ~128), which lets Q8_0 use the unsigned form too.
//!
//! Loop order: a tile's tokens go in register-sized groups (8 tokens for the 32-element
//! formats — 16 measured slower even with 32 registers — 4 for the K-quants, then 2 and 1
//! for the rest); for each group the row's weight
//! blocks stream past once, each unpacked into 8-bit lanes and multiplied with every
//! token's activation block of the group while it sits in registers. The group's
//! accumulators stay in registers across the whole row (a tile-sized accumulator array
//! would live on the stack and cost a load and a store per block and token). Signed ×
//! signed products use |w| × (x·sign w), exact because activations lie in −127..=127.

macro_rules! x86_row_kernels {
    ($features:literal) => {
        use std::arch::x86_64::*;

        use crate::quant::act::{BlockQ8K, BlockQ8_1};
        use crate::quant::kquants::scale_min_k4;
        use crate::quant::matmul::TOKEN_TILE;

        /// A kernel over one group of tokens `t0 .. t0 + G` of a tile of `tn`.
        type GroupFn<A> = unsafe fn(&[u8], &[A], usize, usize, &mut [f32]);

        /// Covers the tile's `tn` tokens with the largest groups that fit; `kernels` lists
        /// (group size, kernel) from the largest size down to 1.
        #[inline]
        fn in_groups<A>(
            wrow: &[u8],
            acts: &[A],
            tn: usize,
            out: &mut [f32],
            kernels: &[(usize, GroupFn<A>)],
        ) {
            assert!(tn <= TOKEN_TILE && out.len() >= tn);
            let mut t0 = 0;
            while t0 < tn {
                let left = tn - t0;
                if let Some(&(g, kernel)) = kernels.iter().find(|(g, _)| *g <= left) {
                    // SAFETY: the kernels are only handed out where the CPU has this
                    // module's features (see `formats`); `t0 + g <= tn`.
                    unsafe { kernel(wrow, acts, tn, t0, out) };
                    t0 += g;
                }
            }
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        /// The two little-endian f16s at `b[0..4]` (a block's scale and offset), converted
        /// together by one F16C instruction.
        #[inline]
        #[target_feature(enable = $features)]
        fn f16_pair(b: &[u8]) -> (f32, f32) {
            let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
        }

        /// The little-endian f16 at `b[at..at + 2]`.
        #[inline]
        #[target_feature(enable = $features)]
        fn f16_at(b: &[u8], at: usize) -> f32 {
            let bits = u16::from_le_bytes([b[at], b[at + 1]]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn load32(bytes: &[u8]) -> __m256i {
            assert!(bytes.len() >= 32);
            // SAFETY: 32 bytes are readable (checked above); loadu needs no alignment.
            unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn load_i8x32(q: &[i8; 32]) -> __m256i {
            // SAFETY: the array is exactly 32 bytes; loadu needs no alignment.
            unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
        }

        /// The 16 i16 group sums of a Q8_K block.
        #[inline]
        #[target_feature(enable = $features)]
        fn load_bsums(a: &BlockQ8K) -> __m256i {
            // SAFETY: `bsums` is exactly 16 × i16 = 32 bytes; loadu needs no alignment.
            unsafe { _mm256_loadu_si256(a.bsums.as_ptr().cast()) }
        }

        /// The 32 nibbles of a 16-byte Q4 block as u8 lanes in element order (low first).
        #[inline]
        #[target_feature(enable = $features)]
        fn unpack_nibbles(qs: &[u8]) -> __m256i {
            assert!(qs.len() >= 16);
            // SAFETY: 16 bytes are readable (checked above).
            let packed = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(packed, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
            _mm256_set_m128i(hi, lo)
        }

        /// The 32 quants of a Q5 block (`qh` 4 bytes of fifth bits, `qs` 16 bytes of
        /// nibbles) as u8 lanes in 0..32.
        #[inline]
        #[target_feature(enable = $features)]
        fn unpack_q5(qh: &[u8], qs: &[u8]) -> __m256i {
            let bits = i32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
            // Byte j gets byte j/8 of the bit field, then keeps only bit j%8.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(bits),
                _mm256_set_epi64x(
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                    0x0101_0101_0101_0101,
                    0,
                ),
            );
            let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
            _mm256_or_si256(
                unpack_nibbles(qs),
                _mm256_and_si256(set, _mm256_set1_epi8(0x10)),
            )
        }

        /// `sum · d` for a token's activation scale `d`. Multiplying by the weight scale
        /// (broadcast once per block) in the following FMA, rather than by the product of
        /// the two scales, saves a scalar multiply and a broadcast per block and token: with
        /// AVX-512 the broadcast of `d` folds into the multiply's memory operand.
        #[inline]
        #[target_feature(enable = $features)]
        fn scaled(sum: __m256, d: f32) -> __m256 {
            _mm256_mul_ps(sum, _mm256_set1_ps(d))
        }

        /// `acc + scale · v` for i32 lanes `v` (a block's integer dot products).
        #[inline]
        #[target_feature(enable = $features)]
        fn add_scaled(acc: __m256, scale: f32, v: __m256i) -> __m256 {
            _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(v), acc)
        }

        /// Writes a group's results: `out[t0 + j] = Σ lanes of acc[j] + extra[j]`.
        #[inline]
        #[target_feature(enable = $features)]
        fn store_group<const G: usize>(
            acc: &[__m256; G],
            extra: &[f32; G],
            t0: usize,
            out: &mut [f32],
        ) {
            for j in 0..G {
                out[t0 + j] = hsum(acc[j]) + extra[j];
            }
        }

        // The formats of the affine kernel, as its const parameter.
        const Q4_0: u8 = 0;
        const Q5_0: u8 = 1;
        const Q4_1: u8 = 2;
        const Q5_1: u8 = 3;
        const Q8_0: u8 = 4;
        const MXFP4: u8 = 5;

        const fn block_bytes(fmt: u8) -> usize {
            match fmt {
                Q4_0 => 18,
                Q5_0 => 22,
                Q4_1 => 20,
                Q8_0 => 34,
                MXFP4 => 17,
                _ => 24,
            }
        }

        /// A 32-element format's block as u8 lanes `u`, a scale `d` and an offset `m`,
        /// weights being `d·u + m`: Q4_1 and Q5_1 store `m`; Q4_0, Q5_0 and Q8_0 store
        /// `u − 8`, `u − 16` and `u − 128`, i.e. `m = −8d`, `−16d` and `−128d` (Q8_0 only
        /// where `FULL_RANGE_U8`); MXFP4's codes become `KVALUES + 12`, `m = −12d`. Writing
        /// the symmetric formats this way lets their lanes stay unsigned for the u8 × i8 product (no sign
        /// juggling per token), the offset meeting the activation block's sum instead.
        #[inline]
        #[target_feature(enable = $features)]
        fn unpack_affine<const FMT: u8>(block: &[u8]) -> (__m256i, f32, f32) {
            match FMT {
                Q4_0 => {
                    let d = f16_at(block, 0);
                    (unpack_nibbles(&block[2..18]), d, -8.0 * d)
                }
                Q5_0 => {
                    let d = f16_at(block, 0);
                    (unpack_q5(&block[2..6], &block[6..22]), d, -16.0 * d)
                }
                Q4_1 => {
                    let (d, m) = f16_pair(block);
                    (unpack_nibbles(&block[4..20]), d, m)
                }
                Q8_0 => {
                    let d = f16_at(block, 0);
                    let u = _mm256_xor_si256(load32(&block[2..34]), _mm256_set1_epi8(-128));
                    (u, d, -128.0 * d)
                }
                MXFP4 => {
                    use crate::quant::mxfp4::{half_scale, OFFSET};
                    let d = half_scale(block[0]);
                    let u = _mm256_shuffle_epi8(mxfp4_table(), unpack_nibbles(&block[1..17]));
                    (u, d, -f32::from(OFFSET) * d)
                }
                _ => {
                    let (d, m) = f16_pair(block);
                    (unpack_q5(&block[4..8], &block[8..24]), d, m)
                }
            }
        }

        /// `mxfp4::KVALUES_UNSIGNED` in both 128-bit lanes, for `_mm256_shuffle_epi8`.
        #[inline]
        #[target_feature(enable = $features)]
        fn mxfp4_table() -> __m256i {
            let t = &crate::quant::mxfp4::KVALUES_UNSIGNED;
            // SAFETY: the table is exactly 16 bytes; loadu needs no alignment.
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
        }

        /// Q8_0 over tokens `t0 .. t0 + G` where the dot product saturates for u8 lanes
        /// above ~128, so its quants (all of i8) stay signed: |w| × (x·sign w).
        #[target_feature(enable = $features)]
        fn group_q8_0<const G: usize>(
            wrow: &[u8],
            acts: &[BlockQ8_1],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            for (b, block) in wrow.chunks_exact(34).enumerate() {
                let (w, dw) = (load32(&block[2..34]), f16_at(block, 0));
                let (w_abs, dw) = (_mm256_sign_epi8(w, w), _mm256_set1_ps(dw));
                let a = &acts[b * tn + t0..][..G];
                for j in 0..G {
                    let x = _mm256_sign_epi8(load_i8x32(&a[j].qs), w);
                    let sum = _mm256_cvtepi32_ps(dot_u8_i8(w_abs, x));
                    acc[j] = _mm256_fmadd_ps(scaled(sum, a[j].d), dw, acc[j]);
                }
            }
            store_group(&acc, &[0.0; G], t0, out);
        }

        /// Q4_0, Q4_1, Q5_0, Q5_1 over tokens `t0 .. t0 + G`: the offset `m` meets the
        /// activation sum.
        #[target_feature(enable = $features)]
        fn group_affine<const FMT: u8, const G: usize>(
            wrow: &[u8],
            acts: &[BlockQ8_1],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            let mut offsets = [0f32; G];
            for (b, block) in wrow.chunks_exact(block_bytes(FMT)).enumerate() {
                let (w, dw, mw) = unpack_affine::<FMT>(block);
                let dw = _mm256_set1_ps(dw);
                let a = &acts[b * tn + t0..][..G];
                for j in 0..G {
                    let sum = _mm256_cvtepi32_ps(dot_u8_i8(w, load_i8x32(&a[j].qs)));
                    acc[j] = _mm256_fmadd_ps(scaled(sum, a[j].d), dw, acc[j]);
                    offsets[j] += mw * a[j].s;
                }
            }
            store_group(&acc, &offsets, t0, out);
        }

        fn row_affine<const FMT: u8>(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            in_groups(
                wrow,
                acts,
                tn,
                out,
                &[
                    (8, group_affine::<FMT, 8>),
                    (4, group_affine::<FMT, 4>),
                    (2, group_affine::<FMT, 2>),
                    (1, group_affine::<FMT, 1>),
                ],
            );
        }

        /// Q4_K (`FIVE = false`, 144-byte blocks) and Q5_K (176-byte blocks, with 32 bytes
        /// of fifth bits before the nibbles) over tokens `t0 .. t0 + G`.
        #[target_feature(enable = $features)]
        fn group_q45_k<const FIVE: bool, const G: usize>(
            wrow: &[u8],
            acts: &[BlockQ8K],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            let mask = _mm256_set1_epi8(0x0F);
            let (block_bytes, qs_at) = if FIVE { (176, 48) } else { (144, 16) };
            for (b, block) in wrow.chunks_exact(block_bytes).enumerate() {
                let (d, dmin) = f16_pair(block);
                let mut scales = [_mm256_setzero_si256(); 8];
                // Each group's min twice, to meet the two 16-element sums of its group.
                let mut mins = [0i16; 16];
                for g in 0..8 {
                    let (sc, mn) = scale_min_k4(g, &block[4..16]);
                    scales[g] = _mm256_set1_epi16(sc as i16);
                    mins[2 * g] = mn as i16;
                    mins[2 * g + 1] = mn as i16;
                }
                // SAFETY: `mins` is exactly 32 bytes; loadu needs no alignment.
                let mins = unsafe { _mm256_loadu_si256(mins.as_ptr().cast()) };
                let mut w = [_mm256_setzero_si256(); 8];
                for c in 0..4 {
                    let q = load32(&block[qs_at + 32 * c..qs_at + 32 * c + 32]);
                    w[2 * c] = _mm256_and_si256(q, mask);
                    w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                }
                if FIVE {
                    let qh = load32(&block[16..48]);
                    for (g, wg) in w.iter_mut().enumerate() {
                        let bit = _mm256_set1_epi8(1 << g);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                        *wg = _mm256_or_si256(*wg, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
                    }
                }
                let a = &acts[b * tn + t0..][..G];
                for j in 0..G {
                    let mut sumi = _mm256_setzero_si256();
                    for g in 0..8 {
                        let x = load32(bytes_of_i8(&a[j].qs[32 * g..32 * g + 32]));
                        sumi = scaled_dot_acc(sumi, w[g], x, scales[g]);
                    }
                    let min_sum = _mm256_madd_epi16(mins, load_bsums(&a[j]));
                    acc[j] = add_scaled(acc[j], d * a[j].d, sumi);
                    acc[j] = add_scaled(acc[j], -dmin * a[j].d, min_sum);
                }
            }
            store_group(&acc, &[0.0; G], t0, out);
        }

        /// Q6_K over tokens `t0 .. t0 + G`.
        #[target_feature(enable = $features)]
        fn group_q6_k<const G: usize>(
            wrow: &[u8],
            acts: &[BlockQ8K],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
            for (b, block) in wrow.chunks_exact(210).enumerate() {
                let d = f16_at(block, 208);
                // SAFETY: bytes 192..208 of the block are its 16 i8 scales.
                let sc16 = _mm256_cvtepi8_epi16(unsafe {
                    _mm_loadu_si128(block[192..208].as_ptr().cast())
                });
                // Quants as u8 `q + 32` in element order, 32 per vector.
                let mut w = [_mm256_setzero_si256(); 8];
                for half in 0..2 {
                    let ql0 = load32(&block[64 * half..64 * half + 32]);
                    let ql1 = load32(&block[64 * half + 32..64 * half + 64]);
                    let qh = load32(&block[128 + 32 * half..160 + 32 * half]);
                    let high = |bits: __m256i| _mm256_slli_epi16(_mm256_and_si256(bits, m3), 4);
                    w[4 * half] = _mm256_or_si256(_mm256_and_si256(ql0, m4), high(qh));
                    w[4 * half + 1] =
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), high(_mm256_srli_epi16(qh, 2)));
                    w[4 * half + 2] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        high(_mm256_srli_epi16(qh, 4)),
                    );
                    w[4 * half + 3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        high(_mm256_srli_epi16(qh, 6)),
                    );
                }
                let sc = &block[192..208];
                let scales: [__m256i; 8] = std::array::from_fn(|k| {
                    _mm256_set_m128i(
                        _mm_set1_epi16(sc[2 * k + 1] as i8 as i16),
                        _mm_set1_epi16(sc[2 * k] as i8 as i16),
                    )
                });
                let a = &acts[b * tn + t0..][..G];
                for j in 0..G {
                    let mut sumi = _mm256_setzero_si256();
                    for k in 0..8 {
                        let x = load32(bytes_of_i8(&a[j].qs[32 * k..32 * k + 32]));
                        sumi = scaled_dot_acc(sumi, w[k], x, scales[k]);
                    }
                    // Undo the +32 offset: Σ_g sc_g · 32 · Σ_{i∈g} x_i.
                    let offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load_bsums(&a[j])), 5);
                    let total = _mm256_sub_epi32(sumi, offset);
                    acc[j] = add_scaled(acc[j], d * a[j].d, total);
                }
            }
            store_group(&acc, &[0.0; G], t0, out);
        }

        fn row_q45_k<const FIVE: bool>(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            in_groups(
                wrow,
                acts,
                tn,
                out,
                &[
                    (4, group_q45_k::<FIVE, 4>),
                    (2, group_q45_k::<FIVE, 2>),
                    (1, group_q45_k::<FIVE, 1>),
                ],
            );
        }

        fn bytes_of_i8(v: &[i8]) -> &[u8] {
            // SAFETY: i8 and u8 have the same size and alignment; every bit pattern is valid.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
        }

        /// The row kernels, handed out by `formats` only where the CPU has this module's
        /// features.
        pub(crate) fn row_q4_0(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            row_affine::<Q4_0>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q5_0(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            row_affine::<Q5_0>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q8_0(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            if FULL_RANGE_U8 {
                return row_affine::<Q8_0>(wrow, acts, tn, out);
            }
            in_groups(
                wrow,
                acts,
                tn,
                out,
                &[
                    (8, group_q8_0::<8>),
                    (4, group_q8_0::<4>),
                    (2, group_q8_0::<2>),
                    (1, group_q8_0::<1>),
                ],
            );
        }

        pub(crate) fn row_mxfp4(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            row_affine::<MXFP4>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q4_1(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            row_affine::<Q4_1>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q5_1(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
            row_affine::<Q5_1>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q4_k(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            row_q45_k::<false>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q5_k(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            row_q45_k::<true>(wrow, acts, tn, out)
        }

        pub(crate) fn row_q6_k(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            in_groups(
                wrow,
                acts,
                tn,
                out,
                &[
                    (4, group_q6_k::<4>),
                    (2, group_q6_k::<2>),
                    (1, group_q6_k::<1>),
                ],
            );
        }
    };
}

pub(crate) use x86_row_kernels;
