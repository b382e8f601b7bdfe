//! Hand-built GGUF files (see [`GgufWriter`]) and deliberately broken variants of them.

use std::io::Write;

use crate::gguf::writer::GgufWriter;
use crate::gguf::*;
use crate::quant::GgmlType;

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let mut f = tempfile::NamedTempFile::new().map_err(GgufError::Io)?;
    f.write_all(bytes).map_err(GgufError::Io)?;
    GgufFile::open(f.path())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A Q8_0 block with scale 0.5 (f16 0x3800) and quants `q0 + i`.
fn q8_0_block(q0: i8) -> Vec<u8> {
    let mut b = vec![0x00, 0x38];
    b.extend((0..32).map(|i| (q0 + i as i8) as u8));
    b
}

fn sample_file() -> GgufWriter {
    use MetaValue::*;
    GgufWriter::new()
        .meta("general.architecture", String("llama".into()))
        .meta("general.alignment", U32(64))
        .meta("t.u8", U8(200))
        .meta("t.i8", I8(-5))
        .meta("t.u16", U16(60000))
        .meta("t.i16", I16(-30000))
        .meta("t.u32", U32(4_000_000_000))
        .meta("t.i32", I32(-7))
        .meta("t.f32", F32(1.5))
        .meta("t.bool", Bool(true))
        .meta("t.u64", U64(1 << 40))
        .meta("t.i64", I64(-(1 << 40)))
        .meta("t.f64", F64(2.25))
        .meta(
            "t.tokens",
            Array(vec![String("a".into()), String("bc".into())]),
        )
        .meta("t.scores", Array(vec![F32(0.5), F32(-1.0)]))
        .meta("t.types", Array(vec![I32(1), I32(3)]))
        .meta(
            "t.nested",
            Array(vec![Array(vec![U8(1), U8(2)]), Array(vec![U8(3)])]),
        )
        .meta("t.empty", Array(vec![]))
        .tensor(
            "norm.weight",
            &[4],
            GgmlType::F32,
            f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
        )
        .tensor(
            "w.weight",
            &[32, 2],
            GgmlType::Q8_0,
            [q8_0_block(-16), q8_0_block(0)].concat(),
        )
}

#[test]
fn a_hand_built_file_yields_every_metadata_type() {
    let g = open_bytes(&sample_file().to_bytes()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("t.u8").unwrap(), 200);
    assert_eq!(g.get_i64("t.i8").unwrap(), -5);
    assert_eq!(g.get_u32("t.u16").unwrap(), 60000);
    assert_eq!(g.get_i64("t.i16").unwrap(), -30000);
    assert_eq!(g.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get_i64("t.i32").unwrap(), -7);
    assert_eq!(g.get_f32("t.f32").unwrap(), 1.5);
    assert!(g.get_bool("t.bool").unwrap());
    assert_eq!(g.get_u64("t.u64").unwrap(), 1 << 40);
    assert_eq!(g.get_i64("t.i64").unwrap(), -(1 << 40));
    assert_eq!(g.get("t.f64").and_then(MetaValue::as_f64), Some(2.25));
    assert_eq!(g.get_str_array("t.tokens").unwrap(), vec!["a", "bc"]);
    assert_eq!(g.get_f32_array("t.scores").unwrap(), vec![0.5, -1.0]);
    assert_eq!(g.get_i32_array("t.types").unwrap(), vec![1, 3]);
    let nested = g.get_array("t.nested").unwrap();
    assert_eq!(nested[0].as_array().map(<[_]>::len), Some(2));
    assert_eq!(nested[1], MetaValue::Array(vec![MetaValue::U8(3)]));
    assert_eq!(g.get_array("t.empty").unwrap().len(), 0);
}

#[test]
fn a_hand_built_file_yields_its_tensors() {
    let g = open_bytes(&sample_file().to_bytes()).unwrap();
    assert_eq!(g.tensors.len(), 2);
    assert_eq!(
        g.tensor_f32("norm.weight").unwrap(),
        vec![1.0, 2.0, 3.0, 4.0]
    );
    let w = g.matrix("w.weight").unwrap();
    assert_eq!((w.dtype, w.rows, w.cols), (GgmlType::Q8_0, 2, 32));
    let mut row = vec![0f32; 32];
    w.dequantize_row(1, &mut row);
    assert_eq!(row[0], 0.0);
    assert_eq!(row[31], 15.5);
    let norm = g.matrix("norm.weight").unwrap();
    assert_eq!((norm.rows, norm.cols), (1, 4));
    let all = g.tensor_f32("w.weight").unwrap();
    assert_eq!((all.len(), all[0]), (64, -8.0));
}

#[test]
fn a_dense_mxfp4_tensor_is_a_matrix_read_in_place_that_multiplies() {
    // Row 0: every code 7 (twice E2M1: 12) at e = 127, so 6.0; row 1: code 9 (−1) at
    // e = 130, so −4.0.
    let blocks = [
        [vec![127], vec![0x77; 16]].concat(),
        [vec![130], vec![0x99; 16]].concat(),
    ];
    let w = GgufWriter::new().tensor("m.weight", &[32, 2], GgmlType::MXFP4, blocks.concat());
    let g = open_bytes(&w.to_bytes()).unwrap();
    let m = g.matrix("m.weight").unwrap();
    assert_eq!((m.dtype, m.rows, m.cols), (GgmlType::MXFP4, 2, 32));
    assert!(matches!(m.data, crate::quant::TensorBytes::Mapped { .. }));
    let all = g.tensor_f32("m.weight").unwrap();
    assert!(all[..32].iter().all(|&v| v == 6.0) && all[32..].iter().all(|&v| v == -4.0));
    let mut out = [0f32; 2];
    m.matmul(&[1.0; 32], 1, &mut out);
    assert_eq!(out, [192.0, -128.0]);
}

#[test]
fn a_version_2_file_is_read() {
    let mut w = sample_file();
    w.version = 2;
    assert_eq!(open_bytes(&w.to_bytes()).unwrap().version, 2);
}

#[test]
fn missing_keys_tensors_and_wrong_types_are_named() {
    let g = open_bytes(&sample_file().to_bytes()).unwrap();
    assert!(matches!(g.get_u32("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(g.matrix("nope"), Err(GgufError::MissingTensor(k)) if k == "nope"));
    let err = g.get_u32("general.architecture").unwrap_err();
    assert!(matches!(&err, GgufError::WrongType { key, .. } if key == "general.architecture"));
    assert!(err.to_string().contains("string"));
    assert!(g.get_u32("t.i8").is_err(), "negative values are not u32");
    assert!(g.get_str_array("t.scores").is_err());
}

#[test]
fn bad_magic_and_old_versions_are_rejected() {
    let mut bytes = sample_file().to_bytes();
    bytes[0] = b'X';
    assert!(matches!(open_bytes(&bytes), Err(GgufError::BadMagic)));
    let mut w = sample_file();
    w.version = 1;
    assert!(matches!(
        open_bytes(&w.to_bytes()),
        Err(GgufError::UnsupportedVersion(1))
    ));
    assert!(matches!(open_bytes(b"GG"), Err(GgufError::BadMagic)));
}

#[test]
fn every_truncation_of_a_file_is_an_error_not_a_panic() {
    let bytes = sample_file().to_bytes();
    for len in 0..bytes.len() {
        assert!(
            open_bytes(&bytes[..len]).is_err(),
            "truncated to {len} bytes was accepted"
        );
    }
}

#[test]
fn a_cut_in_tensor_data_names_the_tensor() {
    let bytes = sample_file().to_bytes();
    match open_bytes(&bytes[..bytes.len() - 1]) {
        Err(GgufError::OutOfBounds { tensor }) => assert_eq!(tensor, "w.weight"),
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
}

#[test]
fn a_cut_in_metadata_names_the_key() {
    let w = GgufWriter::new().meta("a.long.string", MetaValue::String("x".repeat(100)));
    let bytes = w.to_bytes();
    let cut = bytes.len() - 40;
    match open_bytes(&bytes[..cut]) {
        Err(GgufError::Truncated { what }) => assert!(what.contains("a.long.string"), "{what}"),
        other => panic!("expected Truncated, got {other:?}"),
    }
}

/// Byte offset just after `needle`'s first occurrence.
fn after(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
        + needle.len()
}

#[test]
fn corrupt_lengths_are_errors_not_huge_allocations() {
    let base = sample_file().to_bytes();
    // Array count of t.tokens: after key, type (9), element type (8).
    let mut bytes = base.clone();
    let at = after(&bytes, b"t.tokens") + 8;
    bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        matches!(open_bytes(&bytes), Err(GgufError::Truncated { what }) if what.contains("t.tokens"))
    );
    // String length of the first token.
    let mut bytes = base.clone();
    let at = after(&bytes, b"t.tokens") + 16;
    bytes[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(matches!(
        open_bytes(&bytes),
        Err(GgufError::Truncated { .. })
    ));
    // Tensor count.
    let mut bytes = base.clone();
    bytes[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(
        open_bytes(&bytes),
        Err(GgufError::Truncated { .. })
    ));
    // An unknown value type for a key.
    let mut bytes = base;
    let at = after(&bytes, b"t.bool");
    bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(
        matches!(open_bytes(&bytes), Err(GgufError::Truncated { what }) if what.contains("t.bool"))
    );
}

#[test]
fn metadata_arrays_beyond_the_element_budget_are_refused() {
    use crate::gguf::reader::parse_header_with_budget;
    let bytes = sample_file().to_bytes();
    // The sample holds 2 + 2 + 2 + (2 + 2 + 1) + 0 = 11 array elements.
    assert!(parse_header_with_budget(&bytes, 11).is_ok());
    let err = parse_header_with_budget(&bytes, 10).err().unwrap();
    assert!(matches!(err, GgufError::Truncated { what } if what.contains("too large")));
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut v = MetaValue::U8(1);
    for _ in 0..20 {
        v = MetaValue::Array(vec![v]);
    }
    let bytes = GgufWriter::new().meta("deep", v).to_bytes();
    assert!(
        matches!(open_bytes(&bytes), Err(GgufError::Truncated { what }) if what.contains("deep"))
    );
}

#[test]
fn tensors_outside_the_file_or_of_unknown_type_are_rejected() {
    let base = sample_file().to_bytes();
    // Offset of w.weight: after its name, n_dims (4), 2 dims (16), type (4).
    let mut bytes = base.clone();
    let at = after(&bytes, b"w.weight") + 24;
    bytes[at..at + 8].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
    assert!(
        matches!(open_bytes(&bytes), Err(GgufError::OutOfBounds { tensor }) if tensor == "w.weight")
    );
    // A dimension so large the size overflows.
    let mut bytes = base.clone();
    let at = after(&bytes, b"w.weight") + 4;
    bytes[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(matches!(
        open_bytes(&bytes),
        Err(GgufError::OutOfBounds { .. })
    ));
    // Type id 10 (Q2_K) is not supported.
    let mut bytes = base.clone();
    let at = after(&bytes, b"w.weight") + 20;
    bytes[at..at + 4].copy_from_slice(&10u32.to_le_bytes());
    assert!(matches!(
        open_bytes(&bytes),
        Err(GgufError::UnsupportedType { tensor, type_id: 10 }) if tensor == "w.weight"
    ));
    // A row length that is not a whole number of Q8_0 blocks.
    let w = GgufWriter::new().tensor("odd", &[16, 1], GgmlType::Q8_0, vec![0; 34]);
    assert!(
        matches!(open_bytes(&w.to_bytes()), Err(GgufError::OutOfBounds { tensor }) if tensor == "odd")
    );
}

#[test]
fn a_non_power_of_two_alignment_is_rejected() {
    let w = GgufWriter::new().meta("general.alignment", MetaValue::U32(48));
    assert!(
        matches!(open_bytes(&w.to_bytes()), Err(GgufError::Truncated { what }) if what.contains("alignment"))
    );
}

#[test]
fn three_dimensional_tensors_are_not_matrices() {
    let w = GgufWriter::new().tensor("cube", &[1, 2, 2], GgmlType::F32, f32_bytes(&[0.0; 4]));
    let g = open_bytes(&w.to_bytes()).unwrap();
    assert!(matches!(
        g.matrix("cube"),
        Err(GgufError::NotAMatrix { .. })
    ));
    assert_eq!(g.tensor_f32("cube").unwrap().len(), 4);
}
