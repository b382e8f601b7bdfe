//! Dequantisation checked against vectors produced by ggml's reference implementation
//! (gguf-py's `quants.dequantize`) from random blocks with finite scales.
//! Record layout: `type_id u32, n_elems u32, n_bytes u32, bytes, n_elems × f32`.

use crate::quant::{dequantize, GgmlType};

const GOLDEN: &[u8] = include_bytes!("../testdata/ggml_golden.bin");

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

#[test]
fn dequantisation_matches_ggml_reference_for_every_type() {
    let mut seen = Vec::new();
    let mut at = 0;
    while at < GOLDEN.len() {
        let (id, n, len) = (
            u32_at(GOLDEN, at) as u32,
            u32_at(GOLDEN, at + 4),
            u32_at(GOLDEN, at + 8),
        );
        let dtype = GgmlType::from_ggml_id(id).unwrap();
        let bytes = &GOLDEN[at + 12..at + 12 + len];
        let expected: Vec<f32> = GOLDEN[at + 12 + len..at + 12 + len + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        at += 12 + len + 4 * n;
        assert_eq!(
            len,
            n / dtype.block_elems() * dtype.block_bytes(),
            "{dtype:?} size"
        );
        let mut got = vec![f32::NAN; n];
        dequantize(dtype, bytes, &mut got);
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                "{dtype:?}[{i}]: got {g}, ggml {e}"
            );
        }
        seen.push(dtype);
    }
    assert_eq!(seen, GgmlType::ALL);
}

#[test]
fn type_ids_round_trip_and_unknown_ids_are_refused() {
    for t in GgmlType::ALL {
        assert_eq!(GgmlType::from_ggml_id(t.ggml_id()), Some(t));
    }
    for id in [4, 5, 9, 10, 11, 15, 16, 24, 29, 31, 1000] {
        assert_eq!(GgmlType::from_ggml_id(id), None, "id {id}");
    }
}
