//! Quantize (reference) → dequantize round trips stay within each format's error budget.

use super::ref_quant::quantize;
use super::Rng;
use crate::quant::{dequantize, GgmlType};

/// Largest acceptable RMS error relative to the RMS of normally distributed input.
fn budget(t: GgmlType) -> f32 {
    match t {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1e-3,
        GgmlType::BF16 => 5e-3,
        GgmlType::Q8_0 => 0.01,
        GgmlType::Q6K => 0.05,
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K => 0.08,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K => 0.16,
        // Eight magnitudes a sign under a power-of-two scale: coarser than Q4_0's sixteen
        // steps under a fitted one.
        GgmlType::MXFP4 => 0.25,
    }
}

fn rms(v: impl Iterator<Item = f32>) -> f32 {
    let (sum, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
    (sum / n.max(1) as f64).sqrt() as f32
}

#[test]
fn round_trips_stay_within_each_formats_error_budget() {
    let mut rng = Rng::new(7);
    for t in GgmlType::ALL {
        let x = rng.normals(256 * 8, 0.3);
        let bytes = quantize(t, &x);
        assert_eq!(
            bytes.len(),
            t.row_bytes(x.len()).unwrap(),
            "{t:?} byte count"
        );
        let mut y = vec![f32::NAN; x.len()];
        dequantize(t, &bytes, &mut y);
        let err = rms(x.iter().zip(&y).map(|(a, b)| a - b)) / rms(x.iter().copied());
        assert!(
            err <= budget(t),
            "{t:?}: relative RMS error {err} > {}",
            budget(t)
        );
    }
}

#[test]
fn zero_blocks_dequantize_to_zero_not_nan() {
    for t in GgmlType::ALL {
        let x = vec![0f32; 512];
        let mut y = vec![f32::NAN; 512];
        dequantize(t, &quantize(t, &x), &mut y);
        assert!(y.iter().all(|&v| v == 0.0), "{t:?}");
    }
}

#[test]
fn dequantize_row_matches_the_row_of_dequantize_all() {
    let mut rng = Rng::new(8);
    for t in GgmlType::ALL {
        let (rows, cols) = (3, 512);
        let m = super::matmul::matrix(t, rows, cols, &rng.normals(rows * cols, 1.0));
        let all = m.dequantize_all();
        let mut row = vec![0f32; cols];
        m.dequantize_row(2, &mut row);
        assert_eq!(row, all[2 * cols..], "{t:?}");
    }
}
