//! Every SIMD row kernel (AVX2 and VNNI) against the portable kernel, on reference-quantized
//! weights and on raw random blocks (which reach extreme quants such as Q8_0's −128), at
//! every tile width the token grouping treats differently.

use super::ref_quant::quantize;
use super::{kernel_agrees, random_acts, raw_blocks, Rng};
use crate::quant::act::{ActBlock, BlockQ8K, BlockQ8_1};
use crate::quant::formats::{self as f, scalar_row, RowKernel, WeightFormat};
use crate::quant::GgmlType;
use crate::quant::{avx2, vnni};

fn has_avx2() -> bool {
    let ok = f::has_avx2();
    if !ok {
        eprintln!("skipping: this CPU lacks AVX2/FMA/F16C");
    }
    ok
}

fn has_vnni() -> bool {
    let ok = f::has_vnni();
    if !ok {
        eprintln!("skipping: this CPU lacks AVX-512 VNNI");
    }
    ok
}

fn compare<W: WeightFormat>(t: GgmlType, simd: RowKernel<W::Act>) {
    let mut rng = Rng::new(t.ggml_id() as u64 + 100);
    let cols = 1024;
    let nb = cols / t.block_elems();
    for wrow in [
        quantize(t, &rng.normals(cols, 0.7)),
        raw_blocks(&mut rng, t, nb),
    ] {
        for tn in [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 31, 32] {
            let acts = random_acts::<W::Act>(&mut rng, cols, tn);
            let (mut want, mut got) = (vec![0f32; tn], vec![0f32; tn]);
            scalar_row::<W>(&wrow, &acts, tn, &mut want);
            simd(&wrow, &acts, tn, &mut got);
            for (tok, (w, g)) in want.iter().zip(&got).enumerate() {
                assert!(
                    kernel_agrees::<W>(&wrow, &acts, tn, tok, *w, *g),
                    "{t:?} tn={tn} token {tok}: scalar {w}, simd {g}"
                );
            }
        }
    }
}

#[test]
fn avx2_q4_0_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q4_0>(GgmlType::Q4_0, avx2::rows::row_q4_0);
    }
}

#[test]
fn avx2_q4_1_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q4_1>(GgmlType::Q4_1, avx2::rows::row_q4_1);
    }
}

#[test]
fn avx2_q5_0_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q5_0>(GgmlType::Q5_0, avx2::rows::row_q5_0);
    }
}

#[test]
fn avx2_q5_1_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q5_1>(GgmlType::Q5_1, avx2::rows::row_q5_1);
    }
}

#[test]
fn avx2_q5_k_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q5K>(GgmlType::Q5K, avx2::rows::row_q5_k);
    }
}

#[test]
fn avx2_q8_0_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q8_0>(GgmlType::Q8_0, avx2::rows::row_q8_0);
    }
}

#[test]
fn avx2_q4_k_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q4K>(GgmlType::Q4K, avx2::rows::row_q4_k);
    }
}

#[test]
fn avx2_q6_k_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::Q6K>(GgmlType::Q6K, avx2::rows::row_q6_k);
    }
}

#[test]
fn avx2_mxfp4_kernel_matches_the_scalar_kernel() {
    if has_avx2() {
        compare::<f::MXFP4>(GgmlType::MXFP4, avx2::rows::row_mxfp4);
    }
}

#[test]
fn vnni_q4_0_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q4_0>(GgmlType::Q4_0, vnni::row_q4_0);
    }
}

#[test]
fn vnni_q4_1_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q4_1>(GgmlType::Q4_1, vnni::row_q4_1);
    }
}

#[test]
fn vnni_q5_0_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q5_0>(GgmlType::Q5_0, vnni::row_q5_0);
    }
}

#[test]
fn vnni_q5_1_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q5_1>(GgmlType::Q5_1, vnni::row_q5_1);
    }
}

#[test]
fn vnni_q5_k_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q5K>(GgmlType::Q5K, vnni::row_q5_k);
    }
}

#[test]
fn vnni_q8_0_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q8_0>(GgmlType::Q8_0, vnni::row_q8_0);
    }
}

#[test]
fn vnni_q4_k_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q4K>(GgmlType::Q4K, vnni::row_q4_k);
    }
}

#[test]
fn vnni_q6_k_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::Q6K>(GgmlType::Q6K, vnni::row_q6_k);
    }
}

#[test]
fn vnni_mxfp4_kernel_matches_the_scalar_kernel() {
    if has_vnni() {
        compare::<f::MXFP4>(GgmlType::MXFP4, vnni::row_mxfp4);
    }
}

#[test]
fn activation_blocks_keep_quants_symmetric_and_sums_consistent() {
    let mut rng = Rng::new(5);
    let x = rng.normals(256, 3.0);
    let k = BlockQ8K::quantize(&x);
    assert!(k.qs.iter().all(|&q| q != i8::MIN));
    for (g, s) in k.bsums.iter().enumerate() {
        assert_eq!(
            *s as i32,
            k.qs[16 * g..16 * g + 16]
                .iter()
                .map(|&q| q as i32)
                .sum::<i32>()
        );
    }
    let b = BlockQ8_1::quantize(&x[..32]);
    assert!(b.qs.iter().all(|&q| q != i8::MIN));
    assert!((b.s - b.d * b.qs.iter().map(|&q| q as f32).sum::<f32>()).abs() < 1e-4);
}

#[test]
fn avx2_f32_dot_matches_the_scalar_dot_at_every_length() {
    if !has_avx2() {
        return;
    }
    let mut rng = Rng::new(21);
    for n in [0, 1, 7, 8, 9, 31, 32, 33, 100, 1027] {
        let (a, b) = (rng.normals(n, 1.0), rng.normals(n, 1.0));
        let (want, got) = (
            crate::quant::float::dot_f32_scalar(&a, &b),
            avx2::dot_f32(&a, &b),
        );
        assert!(
            (want - got).abs() <= 1e-4 * (n as f32).sqrt().max(1.0),
            "n={n}: {want} vs {got}"
        );
    }
}

#[test]
fn avx2_half_conversions_match_the_scalar_ones() {
    if !has_avx2() {
        return;
    }
    let mut rng = Rng::new(22);
    let bytes: Vec<u8> = (0..2 * 37).map(|_| rng.next_u64() as u8).collect();
    let f16_like: Vec<u8> = quantize(GgmlType::F16, &rng.normals(37, 3.0));
    for input in [&bytes, &f16_like] {
        let (mut want, mut got) = (vec![0f32; 37], vec![0f32; 37]);
        crate::quant::float::dequantize_f16_scalar(input, &mut want);
        avx2::f16_to_f32(input, &mut got);
        assert!(want
            .iter()
            .zip(&got)
            .all(|(w, g)| w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan())));
        crate::quant::float::dequantize_bf16_scalar(input, &mut want);
        avx2::bf16_to_f32(input, &mut got);
        assert!(want
            .iter()
            .zip(&got)
            .all(|(w, g)| w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan())));
    }
}

#[test]
fn avx2_mxfp4_dequantisation_is_bit_identical_to_the_scalar_one() {
    if !has_avx2() {
        return;
    }
    let mut rng = Rng::new(23);
    // Every scale byte, subnormal and overflowing ones included, with random codes.
    let mut bytes = raw_blocks(&mut rng, GgmlType::MXFP4, 256);
    for (e, block) in bytes.chunks_exact_mut(17).enumerate() {
        block[0] = e as u8;
    }
    let (mut want, mut got) = (vec![0f32; 256 * 32], vec![f32::NAN; 256 * 32]);
    for (block, w) in bytes.chunks_exact(17).zip(want.chunks_exact_mut(32)) {
        crate::quant::mxfp4::dequantize_mxfp4(block, w);
    }
    avx2::mxfp4_to_f32(&bytes, &mut got);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn avx2_activation_quantisation_is_bit_identical_to_the_scalar_one() {
    if !has_avx2() {
        return;
    }
    let mut rng = Rng::new(23);
    let mut inputs = vec![rng.normals(256, 1.0), vec![0.0; 256], vec![0.5; 256]];
    // Ties: with amax = 127 the scale is 1, so every x.5 value is a rounding tie.
    let mut ties: Vec<f32> = (0..256).map(|i| (i % 254) as f32 - 126.5).collect();
    ties[0] = 127.0;
    inputs.push(ties);
    for x in inputs {
        let (mut want, mut got) = ([0i8; 256], [0i8; 256]);
        let dw = crate::quant::act::quantize_symmetric_scalar(&x, &mut want);
        let dg = avx2::quantize_symmetric(&x, &mut got);
        assert_eq!((dw, want), (dg, got));
    }
}

#[test]
#[ignore = "timing only"]
fn time_activation_quantisation() {
    let mut rng = Rng::new(1);
    let x = rng.normals(64 * 1536, 1.0);
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let q0: Vec<BlockQ8_1> = x.chunks_exact(32).map(BlockQ8_1::quantize).collect();
        let t1 = std::time::Instant::now();
        let qk: Vec<BlockQ8K> = x.chunks_exact(256).map(BlockQ8K::quantize).collect();
        let t2 = std::time::Instant::now();
        eprintln!(
            "q8_1 {:?} q8k {:?} ({} {})",
            t1 - t0,
            t2 - t1,
            q0.len(),
            qk.len()
        );
    }
}
