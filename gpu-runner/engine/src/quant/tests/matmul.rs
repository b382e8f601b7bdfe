//! Matrix products against f32 maths on the dequantized weights.

use super::ref_quant::quantize;
use super::Rng;
use crate::quant::act::{ActBlock, BlockQ8K, BlockQ8_1};
use crate::quant::{GgmlType, QMatrix, QuantError, TensorBytes};

/// A `rows × cols` matrix of type `t` holding `values` (reference-quantized).
pub fn matrix(t: GgmlType, rows: usize, cols: usize, values: &[f32]) -> QMatrix {
    QMatrix::new(t, rows, cols, TensorBytes::Owned(quantize(t, values))).unwrap()
}

/// `x` as the kernels see it: quantized to the activation type of `t` and back.
fn as_seen_by_kernel(t: GgmlType, x: &[f32]) -> Vec<f32> {
    match t {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => x.to_vec(),
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => x
            .chunks_exact(256)
            .flat_map(|c| {
                let b = BlockQ8K::quantize(c);
                b.qs.map(|q| q as f32 * b.d)
            })
            .collect(),
        _ => x
            .chunks_exact(32)
            .flat_map(|c| {
                let b = BlockQ8_1::quantize(c);
                b.qs.map(|q| q as f32 * b.d)
            })
            .collect(),
    }
}

/// Checks `m.matmul(x)` against f64 products of the dequantized weights with `x_ref`,
/// within `tol · Σ|w||x|` per output.
fn check(m: &QMatrix, x: &[f32], x_ref: &[f32], n_tokens: usize, tol: f64) {
    let (rows, cols) = (m.rows, m.cols);
    let w = m.dequantize_all();
    let mut out = vec![f32::NAN; rows * n_tokens];
    m.matmul(x, n_tokens, &mut out);
    for t in 0..n_tokens {
        for r in 0..rows {
            let (wr, xt) = (
                &w[r * cols..(r + 1) * cols],
                &x_ref[t * cols..(t + 1) * cols],
            );
            let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = wr
                .iter()
                .zip(xt)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let got = out[t * rows + r] as f64;
            assert!(
                (got - exact).abs() <= tol * scale + 1e-6,
                "{:?} n_tokens={n_tokens} out[{t},{r}] = {got}, expected {exact} (scale {scale})",
                m.dtype
            );
        }
    }
}

const TOKEN_COUNTS: [usize; 4] = [1, 3, 32, 41];

#[test]
fn products_equal_exact_maths_on_the_quantized_activations() {
    let mut rng = Rng::new(11);
    for t in GgmlType::ALL {
        let (rows, cols) = (37, 512);
        let m = matrix(t, rows, cols, &rng.normals(rows * cols, 0.5));
        for n_tokens in TOKEN_COUNTS {
            let x = rng.normals(n_tokens * cols, 1.0);
            check(&m, &x, &as_seen_by_kernel(t, &x), n_tokens, 1e-5);
        }
    }
}

#[test]
fn products_approximate_f32_maths_within_activation_quantisation_error() {
    let mut rng = Rng::new(12);
    for t in GgmlType::ALL {
        let (rows, cols) = (19, 768);
        let m = matrix(t, rows, cols, &rng.normals(rows * cols, 0.5));
        let x = rng.normals(5 * cols, 1.0);
        check(&m, &x, &x, 5, 0.02);
    }
}

#[test]
fn float_matrices_with_odd_widths_multiply_exactly() {
    let mut rng = Rng::new(13);
    let (rows, cols) = (5, 7);
    let w = rng.normals(rows * cols, 1.0);
    let m = QMatrix::from_f32(rows, cols, &w).unwrap();
    let x = rng.normals(2 * cols, 1.0);
    check(&m, &x, &x, 2, 1e-6);
}

#[test]
fn mxfp4_with_f32_activations_multiplies_exactly_beside_a_quantized_twin() {
    use crate::quant::{Activations, MatJob};
    let mut rng = Rng::new(14);
    let (rows, cols) = (40, 512);
    let values = rng.normals(rows * cols, 0.5);
    let mut exact = matrix(GgmlType::MXFP4, rows, cols, &values).with_f32_activations();
    let mut rounded = matrix(GgmlType::MXFP4, rows, cols, &values);
    assert_eq!(exact.activations(), Activations::F32);
    // The float path reads rows: only the quantized twin takes the tile layout.
    exact.use_cpu_layout();
    rounded.use_cpu_layout();
    assert_eq!(exact.layout, crate::quant::Layout::Rows);
    let tiles = crate::quant::formats::has_tile_kernel(GgmlType::MXFP4);
    assert_eq!(rounded.layout == crate::quant::Layout::Interleaved, tiles);
    for n_tokens in TOKEN_COUNTS {
        let x = rng.normals(n_tokens * cols, 1.0);
        check(&exact, &x, &x, n_tokens, 1e-5);
        // In one grouped call, each matrix still takes its own route.
        let (mut a, mut b) = (vec![0.0; n_tokens * rows], vec![0.0; n_tokens * rows]);
        let mut jobs = [
            MatJob {
                mat: &exact,
                x: &x,
                n_tokens,
                out: &mut a,
            },
            MatJob {
                mat: &rounded,
                x: &x,
                n_tokens,
                out: &mut b,
            },
        ];
        QMatrix::matmul_grouped(&mut jobs);
        let (mut alone_a, mut alone_b) = (vec![0.0; a.len()], vec![0.0; b.len()]);
        exact.matmul(&x, n_tokens, &mut alone_a);
        rounded.matmul(&x, n_tokens, &mut alone_b);
        assert_eq!((a, b), (alone_a, alone_b), "n_tokens={n_tokens}");
    }
}

#[test]
fn zero_tokens_or_rows_is_a_no_op() {
    let m = matrix(GgmlType::Q4_1, 2, 32, &[0.5; 64]);
    m.matmul(&[], 0, &mut []);
    let empty = QMatrix::new(GgmlType::Q8_0, 0, 32, TensorBytes::Owned(vec![])).unwrap();
    empty.matmul(&[1.0; 32], 1, &mut []);
}

#[test]
fn matrices_of_the_wrong_size_or_partial_blocks_are_refused() {
    let short = QMatrix::new(GgmlType::Q4_0, 2, 32, TensorBytes::Owned(vec![0; 18]));
    assert!(matches!(
        short,
        Err(QuantError::WrongSize {
            expected: 36,
            got: 18,
            ..
        })
    ));
    let partial = QMatrix::new(GgmlType::Q4K, 1, 128, TensorBytes::Owned(vec![0; 72]));
    assert!(matches!(
        partial,
        Err(QuantError::PartialBlock {
            cols: 128,
            block: 256,
            ..
        })
    ));
    let huge = QMatrix::new(GgmlType::F32, usize::MAX / 2, 4, TensorBytes::Owned(vec![]));
    assert!(matches!(huge, Err(QuantError::WrongSize { .. })));
}

/// Grouped products (each its own input, some sharing one) equal the same products made
/// one at a time, bit for bit, in the row and the interleaved layouts and for mixed types.
#[test]
fn grouped_products_equal_the_same_products_made_one_at_a_time() {
    use crate::quant::MatJob;
    let mut rng = Rng::new(41);
    let (rows, cols) = (64, 512);
    for types in [
        [GgmlType::Q4K, GgmlType::Q4K, GgmlType::Q4K],
        [GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0],
        [GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16],
    ] {
        for interleave in [false, true] {
            let mats: Vec<QMatrix> = types
                .iter()
                .map(|&t| {
                    let mut m = matrix(t, rows, cols, &rng.normals(rows * cols, 1.0));
                    if interleave {
                        m.use_cpu_layout();
                    }
                    m
                })
                .collect();
            // Products 0 and 1 share an input of 3 tokens; product 2 has 40 tokens.
            let (a, b) = (rng.normals(3 * cols, 1.0), rng.normals(40 * cols, 1.0));
            let inputs: [(&[f32], usize); 3] = [(&a, 3), (&a, 3), (&b, 40)];
            let alone: Vec<Vec<f32>> = mats
                .iter()
                .zip(inputs)
                .map(|(m, (x, n))| {
                    let mut out = vec![0.0; n * rows];
                    m.matmul(x, n, &mut out);
                    out
                })
                .collect();
            let mut outs: Vec<Vec<f32>> = inputs.iter().map(|(_, n)| vec![0.0; n * rows]).collect();
            let mut jobs: Vec<MatJob<'_>> = mats
                .iter()
                .zip(inputs)
                .zip(outs.iter_mut())
                .map(|((mat, (x, n_tokens)), out)| MatJob {
                    mat,
                    x,
                    n_tokens,
                    out,
                })
                .collect();
            QMatrix::matmul_grouped(&mut jobs);
            drop(jobs);
            assert_eq!(outs, alone, "{types:?}, interleaved {interleave}");
        }
    }
}

#[test]
#[ignore = "timing only"]
fn time_mxfp4_routes_against_bf16_and_q4_0() {
    // One of gpt-oss-20b's expert matrices (2880 × 2880), at decode and at a prefill chunk.
    let mut rng = Rng::new(15);
    let (rows, cols) = (2880, 2880);
    let values = rng.normals(rows * cols, 0.5);
    let in_cpu_layout = |mut m: QMatrix| {
        m.use_cpu_layout();
        m
    };
    let mxfp4 = || matrix(GgmlType::MXFP4, rows, cols, &values);
    let q4_0 = || matrix(GgmlType::Q4_0, rows, cols, &values);
    let cases = [
        ("bf16", matrix(GgmlType::BF16, rows, cols, &values)),
        ("mxfp4 f32 x", mxfp4().with_f32_activations()),
        ("mxfp4 int8 x rows", mxfp4()),
        ("mxfp4 int8 x tiles", in_cpu_layout(mxfp4())),
        ("q4_0 rows", q4_0()),
        ("q4_0 tiles", in_cpu_layout(q4_0())),
    ];
    for n in [1, 16] {
        let x = rng.normals(n * cols, 1.0);
        let mut out = vec![0f32; n * rows];
        for (name, m) in &cases {
            let mut best = f64::MAX;
            for _ in 0..20 {
                let t0 = std::time::Instant::now();
                m.matmul(&x, n, &mut out);
                best = best.min(t0.elapsed().as_secs_f64());
            }
            eprintln!(
                "{name:>16} n={n:>2}: {:.3} ms, {:.1} GB/s of weights",
                best * 1e3,
                m.bytes().len() as f64 / best / 1e9
            );
        }
    }
}
