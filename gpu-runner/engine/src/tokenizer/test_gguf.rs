//! Test-only: reads the `tokenizer.ggml.*` keys of a GGUF file into a [`GgufVocab`], so the
//! tokenizer can be tested against a real model without depending on the engine's reader.

use std::io::{BufReader, Read};
use std::path::Path;

use super::vocab::GgufVocab;

/// The default test model (`FALLOW_TEST_MODEL` overrides); tests skip, with a message, when
/// it is absent.
pub fn smollm2_path() -> String {
    std::env::var("FALLOW_TEST_MODEL").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        .to_string()
    })
}

#[derive(Debug)]
pub enum Meta {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> std::io::Result<String> {
        let len = self.u64()? as usize;
        let mut b = vec![0u8; len];
        self.0.read_exact(&mut b)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    fn value(&mut self, ty: u32) -> std::io::Result<Meta> {
        Ok(match ty {
            0 => Meta::Int(i64::from(self.bytes::<1>()?[0])),
            1 => Meta::Int(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => Meta::Int(i64::from(u16::from_le_bytes(self.bytes()?))),
            3 => Meta::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => Meta::Int(i64::from(self.u32()?)),
            5 => Meta::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => Meta::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => Meta::Bool(self.bytes::<1>()?[0] != 0),
            8 => Meta::Str(self.string()?),
            9 => {
                let elem = self.u32()?;
                let n = self.u64()? as usize;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem)?);
                }
                Meta::Array(v)
            }
            10 => Meta::Int(self.u64()? as i64),
            11 => Meta::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Meta::Float(f64::from_le_bytes(self.bytes()?)),
            t => return Err(std::io::Error::other(format!("bad gguf type {t}"))),
        })
    }
}

/// All metadata key/values of a GGUF file (v2/v3).
pub fn read_metadata(path: &Path) -> std::io::Result<Vec<(String, Meta)>> {
    let mut r = Reader(BufReader::new(std::fs::File::open(path)?));
    if &r.bytes::<4>()? != b"GGUF" {
        return Err(std::io::Error::other("not a gguf file"));
    }
    let _version = r.u32()?;
    let _tensors = r.u64()?;
    let n_kv = r.u64()?;
    let mut out = Vec::new();
    for _ in 0..n_kv {
        let key = r.string()?;
        let ty = r.u32()?;
        out.push((key, r.value(ty)?));
    }
    Ok(out)
}

/// The vocabulary and chat template of a GGUF file, or `None` (after saying why) when the
/// file is absent.
pub fn load(path: &str) -> Option<(GgufVocab, Option<String>)> {
    if !Path::new(path).exists() {
        fallow_protocol::testing::skip_for_want_of(&format!("{path} (scripts/fetch-models.sh)"));
        return None;
    }
    let meta = read_metadata(Path::new(path)).ok()?;
    let get = |k: &str| meta.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let int = |k: &str| match get(k) {
        Some(Meta::Int(i)) => Some(*i),
        _ => None,
    };
    let boolean = |k: &str| match get(k) {
        Some(Meta::Bool(b)) => Some(*b),
        _ => None,
    };
    let string = |k: &str| match get(k) {
        Some(Meta::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let strings = |k: &str| match get(k) {
        Some(Meta::Array(v)) => v
            .iter()
            .filter_map(|m| match m {
                Meta::Str(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let vocab = GgufVocab {
        model: string("tokenizer.ggml.model").unwrap_or_default(),
        pre: string("tokenizer.ggml.pre"),
        tokens: strings("tokenizer.ggml.tokens"),
        scores: match get("tokenizer.ggml.scores") {
            Some(Meta::Array(v)) => Some(
                v.iter()
                    .map(|m| {
                        if let Meta::Float(f) = m {
                            *f as f32
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            ),
            _ => None,
        },
        token_types: match get("tokenizer.ggml.token_type") {
            Some(Meta::Array(v)) => Some(
                v.iter()
                    .map(|m| if let Meta::Int(i) = m { *i as i32 } else { 0 })
                    .collect(),
            ),
            _ => None,
        },
        merges: strings("tokenizer.ggml.merges"),
        bos_id: int("tokenizer.ggml.bos_token_id").map(|i| i as u32),
        eos_id: int("tokenizer.ggml.eos_token_id").map(|i| i as u32),
        eot_ids: ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
            .iter()
            .filter_map(|k| int(k).map(|i| i as u32))
            .collect(),
        unk_id: int("tokenizer.ggml.unknown_token_id").map(|i| i as u32),
        pad_id: int("tokenizer.ggml.padding_token_id").map(|i| i as u32),
        add_bos: boolean("tokenizer.ggml.add_bos_token"),
        add_eos: boolean("tokenizer.ggml.add_eos_token"),
        add_space_prefix: boolean("tokenizer.ggml.add_space_prefix"),
    };
    Some((vocab, string("tokenizer.chat_template")))
}

/// The Gemma 3 test model, next to the SmolLM2 one.
pub fn gemma3_path() -> String {
    Path::new(&smollm2_path())
        .with_file_name("gemma-3-270m-Q4_K_M.gguf")
        .to_string_lossy()
        .into_owned()
}
