//! The interleaved layout: every row survives the repacking exactly, every tile kernel (AVX2
//! and VNNI) agrees with the portable row kernel, and an interleaved matrix multiplies like
//! the ggml-layout one.

use super::ref_quant::quantize;
use super::{kernel_agrees, random_acts, raw_blocks, Rng};
use crate::quant::formats::{self as f, scalar_row, TileKernel, WeightFormat};
use crate::quant::interleave::{self, TILE_ROWS};
use crate::quant::{Activations, GgmlType, Layout, QMatrix, TensorBytes};

/// The matrix in the interleaved layout, whatever this CPU would choose.
fn interleaved(m: &QMatrix) -> QMatrix {
    let tile = interleave::tile_bytes(m.dtype, m.cols);
    let mut out = vec![0u8; m.bytes().len()];
    for (rows, dst) in m.bytes().chunks_exact(tile).zip(out.chunks_exact_mut(tile)) {
        interleave::write_tile(m.dtype, rows, m.row_bytes(), dst);
    }
    QMatrix {
        dtype: m.dtype,
        rows: m.rows,
        cols: m.cols,
        data: TensorBytes::Owned(out),
        layout: Layout::Interleaved,
        activations: Activations::Quantized,
    }
}

#[test]
fn interleaving_keeps_every_row_bit_for_bit() {
    let mut rng = Rng::new(41);
    for t in GgmlType::ALL
        .into_iter()
        .filter(|&t| interleave::supports(t))
    {
        let (rows, cols) = (2 * TILE_ROWS, 512);
        let bytes = raw_blocks(&mut rng, t, rows * cols / t.block_elems());
        let m = QMatrix::new(t, rows, cols, TensorBytes::Owned(bytes)).unwrap();
        let want = m.dequantize_all();
        let got = interleaved(&m).dequantize_all();
        assert!(
            want.iter()
                .zip(&got)
                .all(|(w, g)| w.to_bits() == g.to_bits()),
            "{t:?}: a row changed in the interleaved layout"
        );
    }
}

fn compare<W: WeightFormat>(t: GgmlType, kernel: TileKernel<W::Act>) {
    let mut rng = Rng::new(t.ggml_id() as u64 + 200);
    let cols = 1024;
    let nb = cols / t.block_elems();
    let quantized: Vec<u8> = (0..TILE_ROWS)
        .flat_map(|_| quantize(t, &rng.normals(cols, 0.7)))
        .collect();
    for rows in [quantized, raw_blocks(&mut rng, t, TILE_ROWS * nb)] {
        let m = QMatrix::new(t, TILE_ROWS, cols, TensorBytes::Owned(rows)).unwrap();
        let tile = interleaved(&m);
        for tn in [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 31, 32] {
            let acts = random_acts::<W::Act>(&mut rng, cols, tn);
            let mut got = vec![f32::NAN; tn * TILE_ROWS];
            kernel(tile.bytes(), &acts, tn, &mut got);
            let rb = m.row_bytes();
            for r in 0..TILE_ROWS {
                let wrow = &m.bytes()[r * rb..(r + 1) * rb];
                let mut want = vec![0f32; tn];
                scalar_row::<W>(wrow, &acts, tn, &mut want);
                for (tok, w) in want.iter().enumerate() {
                    let g = got[tok * TILE_ROWS + r];
                    assert!(
                        kernel_agrees::<W>(wrow, &acts, tn, tok, *w, g),
                        "{t:?} tn={tn} row {r} token {tok}: scalar {w}, tile kernel {g}"
                    );
                }
            }
        }
    }
}

#[test]
fn avx2_tile_kernels_match_the_scalar_kernel() {
    if !f::has_avx2() {
        eprintln!("skipping: this CPU lacks AVX2/FMA/F16C");
        return;
    }
    use crate::quant::avx2::tiles as k;
    compare::<f::Q4_0>(GgmlType::Q4_0, k::tile_q4_0);
    compare::<f::Q4_1>(GgmlType::Q4_1, k::tile_q4_1);
    compare::<f::Q5_0>(GgmlType::Q5_0, k::tile_q5_0);
    compare::<f::Q5_1>(GgmlType::Q5_1, k::tile_q5_1);
    compare::<f::Q4K>(GgmlType::Q4K, k::tile_q4_k);
    compare::<f::Q5K>(GgmlType::Q5K, k::tile_q5_k);
    compare::<f::Q6K>(GgmlType::Q6K, k::tile_q6_k);
    compare::<f::MXFP4>(GgmlType::MXFP4, k::tile_mxfp4);
}

#[test]
fn vnni_tile_kernels_match_the_scalar_kernel() {
    if !f::has_vnni() {
        eprintln!("skipping: this CPU lacks AVX-512 VNNI");
        return;
    }
    use crate::quant::vnni::tiles as k;
    compare::<f::Q4_0>(GgmlType::Q4_0, k::tile_q4_0);
    compare::<f::Q4_1>(GgmlType::Q4_1, k::tile_q4_1);
    compare::<f::Q5_0>(GgmlType::Q5_0, k::tile_q5_0);
    compare::<f::Q5_1>(GgmlType::Q5_1, k::tile_q5_1);
    compare::<f::Q8_0>(GgmlType::Q8_0, k::tile_q8_0);
    compare::<f::Q4K>(GgmlType::Q4K, k::tile_q4_k);
    compare::<f::Q5K>(GgmlType::Q5K, k::tile_q5_k);
    compare::<f::Q6K>(GgmlType::Q6K, k::tile_q6_k);
    compare::<f::MXFP4>(GgmlType::MXFP4, k::tile_mxfp4);
}

#[test]
fn a_matrix_in_the_cpu_layout_multiplies_like_the_ggml_layout() {
    let mut rng = Rng::new(43);
    for t in GgmlType::ALL
        .into_iter()
        .filter(|&t| interleave::supports(t))
    {
        let (rows, cols) = (3 * TILE_ROWS, 512);
        let m = QMatrix::new(
            t,
            rows,
            cols,
            TensorBytes::Owned(quantize(t, &rng.normals(rows * cols, 0.5))),
        )
        .unwrap();
        let cpu = QMatrix::new(t, rows, cols, TensorBytes::Owned(m.bytes().to_vec()))
            .unwrap()
            .into_cpu_layout();
        assert_eq!(
            cpu.layout == Layout::Interleaved,
            f::has_tile_kernel(t),
            "{t:?}: interleaved exactly where this CPU has a tile kernel"
        );
        // 40 tokens: two token tiles, the second partial.
        let n = 40;
        let x = rng.normals(n * cols, 1.0);
        let (mut want, mut got) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        m.matmul(&x, n, &mut want);
        cpu.matmul(&x, n, &mut got);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert!(
                (w - g).abs() <= 1e-4 * w.abs().max(1.0),
                "{t:?} ({:?}) output {i}: {w} vs {g}",
                cpu.layout
            );
        }
        let mut row = vec![0f32; cols];
        cpu.dequantize_row(rows - 1, &mut row);
        assert_eq!(row, m.dequantize_all()[(rows - 1) * cols..]);
    }
}

#[test]
#[ignore = "timing only"]
fn time_tile_kernels_streaming_and_in_cache() {
    // A matrix far bigger than the caches (Gemma 3's LM head) against one that stays in L2,
    // both for the same number of multiply-adds: the gap is what memory costs.
    let mut rng = Rng::new(7);
    for t in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_1] {
        let (cols, n) = (640, 16);
        let x = rng.normals(n * cols, 1.0);
        for (rows, reps) in [(262_144, 1), (4096, 64)] {
            let bytes = raw_blocks(&mut rng, t, rows * cols / 32);
            let m = QMatrix::new(t, rows, cols, TensorBytes::Owned(bytes))
                .unwrap()
                .into_cpu_layout();
            let mut out = vec![0f32; n * rows];
            let mut best = f64::MAX;
            for _ in 0..10 {
                let t0 = std::time::Instant::now();
                for _ in 0..reps {
                    m.matmul(&x, n, &mut out);
                }
                best = best.min(t0.elapsed().as_secs_f64());
            }
            eprintln!(
                "{t:?} {rows}x{cols} ×{reps}: {:.2} ms, {:.1} GB/s, {:.1} GMAC/s",
                best * 1e3,
                (m.bytes().len() * reps) as f64 / best / 1e9,
                (rows * cols * n * reps) as f64 / best / 1e9
            );
        }
    }
}

#[test]
#[ignore = "timing only"]
fn time_interleaving_at_load() {
    let mut rng = Rng::new(9);
    for (t, rows, cols) in [(GgmlType::Q8_0, 65_536, 640), (GgmlType::Q4K, 16_384, 2048)] {
        let bytes = raw_blocks(&mut rng, t, rows * cols / t.block_elems());
        let len = bytes.len();
        let m = QMatrix::new(t, rows, cols, TensorBytes::Owned(bytes)).unwrap();
        let t0 = std::time::Instant::now();
        let m = m.into_cpu_layout();
        let s = t0.elapsed().as_secs_f64();
        assert_eq!(m.layout == Layout::Interleaved, f::has_tile_kernel(t));
        eprintln!(
            "{t:?}: {:.0} MB in {:.0} ms, {:.2} GB/s",
            len as f64 / 1e6,
            s * 1e3,
            len as f64 / s / 1e9
        );
    }
}
