//! Hostile GGUF files, generated: a tiny model's file with its header cut short, bytes
//! flipped or lengths made huge. Opening each, reading every tensor and loading the model
//! must end in a value or an error, never a panic or an allocation the file cannot back.

use std::io::Write;

use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::gguf::GgufFile;
use crate::model::{self, tiny, Arch};

const CASES: usize = 2000;

/// `clean` with a few edits, most of them in the header (metadata and tensor infos), where
/// the lengths, counts, types and offsets are.
fn mangle(rng: &mut StdRng, clean: &[u8], header_len: usize) -> Vec<u8> {
    let mut bytes = clean.to_vec();
    match rng.gen_range(0..4) {
        0 => bytes.truncate(rng.gen_range(0..header_len.max(1))),
        1 => {
            for _ in 0..rng.gen_range(1..6) {
                let i = rng.gen_range(0..header_len.max(1));
                bytes[i] = rng.gen();
            }
        }
        2 => {
            // A length, count or offset made huge or negative-looking.
            let i = rng.gen_range(0..header_len.saturating_sub(8).max(1));
            let value: u64 = match rng.gen_range(0..4) {
                0 => u64::MAX,
                1 => 1 << 40,
                2 => u64::from(u32::MAX),
                _ => rng.gen(),
            };
            bytes[i..i + 8].copy_from_slice(&value.to_le_bytes());
        }
        _ => {
            let i = rng.gen_range(0..bytes.len());
            bytes[i] = rng.gen();
        }
    }
    bytes
}

#[test]
fn thousands_of_damaged_gguf_files_open_or_fail_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, path) = tiny::write_tiny(dir.path(), Arch::Llama, 7).expect("tiny model");
    let clean = std::fs::read(&path).expect("read");
    let header_len = GgufFile::open(&path)
        .expect("the clean file opens")
        .data_offset();
    let mut rng = StdRng::seed_from_u64(0x6767_7566);
    let mut opened = 0;
    for case in 0..CASES {
        let bytes = mangle(&mut rng, &clean, header_len);
        let mut file = tempfile::NamedTempFile::new_in(dir.path()).expect("temp file");
        file.write_all(&bytes).expect("write");
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let Ok(gguf) = GgufFile::open(file.path()) else {
                return false;
            };
            for t in &gguf.tensors {
                let _ = gguf.tensor_data(t);
                if t.dims.len() == 1 {
                    let _ = gguf.tensor_f32(&t.name);
                } else {
                    let _ = gguf.matrix(&t.name);
                }
            }
            let _ = model::open(file.path());
            true
        }));
        match result {
            Ok(true) => opened += 1,
            Ok(false) => {}
            Err(_) => panic!("case {case} panicked; its bytes differ from the clean file's"),
        }
    }
    // Some damage (a flipped data byte, say) leaves a valid file: both paths were exercised.
    assert!(opened > 0 && opened < CASES, "{opened} of {CASES} opened");
}
