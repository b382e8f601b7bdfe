//! Fallow's embedding models against sentence-transformers and transformers themselves.
//!
//! - all-MiniLM-L6-v2 (a BERT encoder, mean pooling, normalised; `scripts/fetch-models.sh
//!   --minilm`): `tests/fixtures/minilm_embeddings.json` holds sentence-transformers' ids
//!   and vectors for a few texts (short, long-ish, unicode, punctuation, whitespace).
//! - `tests/fixtures/tiny/qwen3_embed/`: a random-weight Qwen3 decoder laid out like
//!   Qwen3-Embedding (last-token pooling, normalised), with transformers' vectors in its
//!   `reference.json`.
//!
//! Both written by `scripts/make_embedding_fixtures.py`. A missing MiniLM is a skip (a
//! failure under `CI=true`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use fallow_engine::embed::{EmbedError, EmbeddingModel, Pooling};
use serde::Deserialize;

/// Least cosine similarity accepted per vector: both sides compute in f32 on the same
/// weights (what remains is summation order and the references' 6-decimal rounding).
const MIN_COSINE: f32 = 0.999;

#[derive(Deserialize)]
struct Reference {
    dimensions: usize,
    max_seq_length: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn reference(path: &Path) -> Reference {
    let text = std::fs::read_to_string(path).expect("read reference");
    serde_json::from_str(&text).expect("parse reference")
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

fn assert_close(got: &[Vec<f32>], cases: &[Case]) {
    assert_eq!(got.len(), cases.len());
    for (vector, case) in got.iter().zip(cases) {
        assert_eq!(vector.len(), case.embedding.len(), "{:?}", case.text);
        let c = cosine(vector, &case.embedding);
        assert!(c >= MIN_COSINE, "cosine {c} for {:?}", case.text);
    }
}

fn minilm() -> Option<(EmbeddingModel, Reference)> {
    let dir = common::model_file("all-MiniLM-L6-v2")?;
    let model = EmbeddingModel::open(&dir).expect("open all-MiniLM-L6-v2");
    Some((model, reference(&fixtures().join("minilm_embeddings.json"))))
}

fn tiny_decoder() -> (EmbeddingModel, Reference) {
    let dir = fixtures().join("tiny/qwen3_embed");
    let model = EmbeddingModel::open(&dir).expect("open tiny qwen3_embed");
    (model, reference(&dir.join("reference.json")))
}

/// `n` inputs cycling through the references' ids.
fn cycled(cases: &[Case], n: usize) -> Vec<Vec<u32>> {
    cases
        .iter()
        .map(|c| c.ids.clone())
        .cycle()
        .take(n)
        .collect()
}

#[test]
fn minilm_is_detected_and_describes_itself() {
    let Some((model, reference)) = minilm() else {
        return;
    };
    let dir = common::model_file("all-MiniLM-L6-v2").expect("present");
    assert!(EmbeddingModel::detect(&dir));
    assert_eq!(model.dimensions(), reference.dimensions);
    assert_eq!(model.max_input_tokens(), reference.max_seq_length);
    assert_eq!(model.vocab_size(), 30522);
    assert!(model.matryoshka_dimensions().is_empty());
    assert_eq!(model.pooling(), Pooling::Mean);
    assert!(model.normalizes());
}

#[test]
fn minilm_tokenizes_as_sentence_transformers_does() {
    let Some((model, reference)) = minilm() else {
        return;
    };
    for case in &reference.cases {
        let ids = model.tokenize(&case.text).expect("tokenize");
        assert_eq!(ids, case.ids, "{:?}", case.text);
    }
}

#[test]
fn minilm_vectors_match_sentence_transformers() {
    let Some((model, reference)) = minilm() else {
        return;
    };
    let inputs: Vec<Vec<u32>> = reference.cases.iter().map(|c| c.ids.clone()).collect();
    assert_close(&model.embed(&inputs).expect("embed"), &reference.cases);
    for v in model.embed(&inputs).expect("embed") {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
}

#[test]
fn a_batch_of_64_gives_each_input_the_vector_it_gets_alone() {
    let Some((model, reference)) = minilm() else {
        return;
    };
    let inputs = cycled(&reference.cases, 64);
    let batched = model.embed(&inputs).expect("embed batch");
    assert_eq!(batched.len(), 64);
    for (ids, vector) in inputs.iter().zip(&batched) {
        let alone = model.embed(std::slice::from_ref(ids)).expect("embed one");
        let max_diff = alone[0]
            .iter()
            .zip(vector)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max_diff < 1e-5, "batched vector differs by {max_diff}");
    }
}

#[test]
fn sixty_four_short_inputs_embed_in_well_under_a_second() {
    let Some((model, _)) = minilm() else {
        return;
    };
    let texts: Vec<String> = (0..64)
        .map(|i| format!("A short sentence number {i} about the weather today."))
        .collect();
    let inputs: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| model.tokenize(t).expect("tokenize"))
        .collect();
    model.embed(&inputs).expect("warm up");
    let start = Instant::now();
    let vectors = model.embed(&inputs).expect("embed");
    let took = start.elapsed();
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    eprintln!("64 inputs ({tokens} tokens) embedded in {took:?}");
    assert_eq!(vectors.len(), 64);
    // A generous bound: shared CI machines are slower and noisier than a quiet one.
    assert!(took.as_secs_f64() < 2.0, "64 inputs took {took:?}");
}

#[test]
fn invalid_inputs_are_the_callers_fault_and_name_the_input() {
    let Some((model, _)) = minilm() else {
        return;
    };
    let too_long = vec![101u32; model.max_input_tokens() + 1];
    let cases = [
        (vec![vec![101, 102], vec![]], "input 1 is empty"),
        (vec![vec![101, 30522, 102]], "token id 30522"),
        (vec![too_long], "more than the model's 256"),
    ];
    for (inputs, expected) in cases {
        let err = model.embed(&inputs).expect_err("invalid input");
        assert!(err.is_invalid_input(), "{err}");
        assert!(matches!(err, EmbedError::InvalidInput(_)));
        assert!(err.to_string().contains(expected), "{err}");
    }
    assert!(model.embed(&[]).expect("no inputs").is_empty());
    let at_limit = vec![101u32; model.max_input_tokens()];
    assert!(model.embed(&[at_limit]).is_ok());
}

#[test]
fn the_tiny_decoder_embedder_matches_transformers() {
    let (model, reference) = tiny_decoder();
    assert!(EmbeddingModel::detect(&fixtures().join("tiny/qwen3_embed")));
    assert_eq!(model.dimensions(), reference.dimensions);
    assert_eq!(model.max_input_tokens(), reference.max_seq_length);
    assert_eq!(model.matryoshka_dimensions(), [16, 32, 64]);
    assert_eq!(model.pooling(), Pooling::LastToken);
    for case in &reference.cases {
        assert_eq!(model.tokenize(&case.text).expect("tokenize"), case.ids);
    }
    let inputs: Vec<Vec<u32>> = reference.cases.iter().map(|c| c.ids.clone()).collect();
    assert_close(&model.embed(&inputs).expect("embed"), &reference.cases);
    let one_by_one: Vec<Vec<f32>> = inputs
        .iter()
        .flat_map(|ids| model.embed(std::slice::from_ref(ids)).expect("embed one"))
        .collect();
    assert_close(&one_by_one, &reference.cases);
}

#[test]
fn the_tiny_decoder_embedder_batches_64_and_refuses_bad_ids() {
    let (model, reference) = tiny_decoder();
    let inputs = cycled(&reference.cases, 64);
    let vectors = model.embed(&inputs).expect("embed 64");
    let expected: Vec<&Case> = reference.cases.iter().cycle().take(64).collect();
    for (v, case) in vectors.iter().zip(expected) {
        assert!(cosine(v, &case.embedding) >= MIN_COSINE, "{:?}", case.text);
    }
    let err = model.embed(&[vec![1, 320]]).expect_err("id 320");
    assert!(err.is_invalid_input(), "{err}");
}

#[test]
fn a_chat_model_is_not_an_embedding_model() {
    assert!(!EmbeddingModel::detect(&fixtures().join("tiny/qwen3")));
    assert!(!EmbeddingModel::detect(&fixtures().join("tiny/missing")));
}
