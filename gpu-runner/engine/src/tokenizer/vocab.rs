//! A tokenizer vocabulary as GGUF metadata describes it (`tokenizer.ggml.*`), in plain data,
//! so the tokenizer builder does not depend on the GGUF reader.

/// `tokenizer.ggml.*` keys, decoded.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece-style).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name (e.g. "smollm", "llama-bpe", "qwen2").
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    /// llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// "a b" pairs, highest priority first.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Extra end-of-generation ids (`tokenizer.ggml.eot_token_id`, `eom_token_id`).
    pub eot_ids: Vec<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}
