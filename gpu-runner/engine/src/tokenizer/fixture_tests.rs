//! Token ids and pieces compared with llama.cpp's, from fixtures that llama-cpp-python wrote
//! into `gpu-runner/engine/tests/fixtures/` (`smollm2_tokenize.json`, and the larger
//! `tokenizer_corpus_*.json` from `make_tokenizer_corpus.py`: `tokenize(text, add_bos,
//! special=True)` and `detokenize([id], special)`). Skipped when a fixture or model is absent.

use std::path::PathBuf;

use serde::Deserialize;

use super::test_gguf;
use super::Tokenizer;

#[derive(Debug, Deserialize)]
struct Fixture {
    model_file: String,
    cases: Vec<Case>,
    #[serde(default)]
    pieces: Vec<Pieces>,
}

#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    add_bos: bool,
    ids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct Pieces {
    ids: Vec<u32>,
    /// `token_to_piece(id, special=False)`.
    pieces: Vec<Vec<u8>>,
    /// `token_to_piece(id, special=True)`.
    pieces_special: Vec<Vec<u8>>,
}

fn fixtures_dir() -> PathBuf {
    std::env::var("FALLOW_FIXTURES_DIR").map_or_else(
        |_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")),
        PathBuf::from,
    )
}

/// The fixture and a tokenizer for its model, or `None` (after saying why).
fn load(name: &str) -> Option<(Fixture, Tokenizer)> {
    let path = fixtures_dir().join(name);
    let Ok(raw) = std::fs::read_to_string(&path) else {
        fallow_protocol::testing::skip_for_want_of(&format!("fixture {}", path.display()));
        return None;
    };
    let fixture: Fixture = serde_json::from_str(&raw).expect("fixture parses");
    let model = PathBuf::from(test_gguf::smollm2_path()).with_file_name(&fixture.model_file);
    let (vocab, _) = test_gguf::load(&model.to_string_lossy())?;
    let tokenizer = Tokenizer::from_gguf_vocab(&vocab).expect("vocabulary builds");
    Some((fixture, tokenizer))
}

fn assert_ids_match_llama_cpp(fixture_name: &str) {
    let Some((fixture, tok)) = load(fixture_name) else {
        return;
    };
    let mut mismatches = Vec::new();
    for case in &fixture.cases {
        // llama.cpp's `add_bos` means "add the specials the model wants"; ours is literal.
        let add_bos = case.add_bos && tok.add_bos_by_default();
        let ids = tok.encode(&case.text, add_bos).expect("encodes");
        if ids != case.ids {
            mismatches.push(format!(
                "{:?}: ours {ids:?}, llama.cpp {:?}",
                case.text, case.ids
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

fn assert_pieces_match_llama_cpp(fixture_name: &str) {
    let Some((fixture, tok)) = load(fixture_name) else {
        return;
    };
    for entry in &fixture.pieces {
        for (i, &id) in entry.ids.iter().enumerate() {
            assert_eq!(tok.token_bytes(id), entry.pieces_special[i], "token {id}");
            let shown: &[u8] = if tok.is_special(id) {
                &[]
            } else {
                tok.piece(id)
            };
            assert_eq!(
                shown,
                entry.pieces[i].as_slice(),
                "token {id} without specials"
            );
        }
    }
}

#[test]
fn smollm2_token_ids_equal_llama_cpp_on_the_whole_corpus() {
    assert_ids_match_llama_cpp("smollm2_tokenize.json");
    assert_ids_match_llama_cpp("tokenizer_corpus_smollm2.json");
}

#[test]
fn smollm2_token_pieces_equal_llama_cpp() {
    assert_pieces_match_llama_cpp("smollm2_tokenize.json");
    assert_pieces_match_llama_cpp("tokenizer_corpus_smollm2.json");
}

#[test]
fn gemma3_token_ids_equal_llama_cpp_on_the_whole_corpus() {
    assert_ids_match_llama_cpp("tokenizer_corpus_gemma3.json");
}

#[test]
fn gemma3_token_pieces_equal_llama_cpp() {
    assert_pieces_match_llama_cpp("tokenizer_corpus_gemma3.json");
}
