//! Tests of [`Tokenizer`] on small hand-made vocabularies, so the SentencePiece space rules,
//! byte fallback and error paths are covered without model files.

use super::vocab::GgufVocab;
use super::{IncrementalDecoder, Tokenizer, TokenizerError};

/// A SentencePiece vocabulary in the Llama 2 style (dummy-prefix space, byte fallback).
fn toy_spm() -> GgufVocab {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (text, score) in [
        ("▁", -1.0),
        ("▁Hello", -2.0),
        ("▁world", -2.0),
        ("H", -5.0),
        ("e", -5.0),
        ("l", -5.0),
        ("o", -5.0),
        ("w", -5.0),
        ("r", -5.0),
        ("d", -5.0),
        ("▁H", -4.0),
        ("▁He", -3.5),
        ("▁Hel", -3.2),
        ("▁Hell", -3.0),
        ("▁w", -4.0),
        ("▁wo", -3.5),
        ("▁wor", -3.2),
        ("▁worl", -3.0),
    ] {
        tokens.push(text.into());
        types.push(1);
        scores.push(score);
    }
    GgufVocab {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        ..GgufVocab::default()
    }
}

fn id_of(tok: &Tokenizer, entry: &str) -> u32 {
    (0..tok.vocab_size() as u32)
        .find(|&id| tok.vocab_entry(id) == Some(entry))
        .unwrap()
}

#[test]
fn sentencepiece_text_gets_a_dummy_prefix_space_that_decoding_removes() {
    let tok = Tokenizer::from_gguf_vocab(&toy_spm()).unwrap();
    let ids = tok.encode("Hello world", false).unwrap();
    assert_eq!(ids, vec![id_of(&tok, "▁Hello"), id_of(&tok, "▁world")]);
    assert_eq!(tok.decode(&ids, false), "Hello world");
    assert!(tok.add_bos_by_default());
    assert_eq!(tok.encode("Hello", true).unwrap()[0], 1);
}

#[test]
fn text_after_a_special_token_gets_the_prefix_space_again() {
    let tok = Tokenizer::from_gguf_vocab(&toy_spm()).unwrap();
    let ids = tok.encode("Hello</s>world", false).unwrap();
    assert_eq!(ids, vec![id_of(&tok, "▁Hello"), 2, id_of(&tok, "▁world")]);
}

#[test]
fn streaming_keeps_the_leading_space_of_a_continuation_but_not_of_a_sequence_start() {
    let tok = Tokenizer::from_gguf_vocab(&toy_spm()).unwrap();
    let ids = tok.encode("Hello world", false).unwrap();
    let stream = |mut d: IncrementalDecoder| -> String {
        let mut s: String = ids.iter().map(|&id| d.push(&tok, id)).collect();
        s.push_str(&d.finish());
        s
    };
    assert_eq!(stream(IncrementalDecoder::new(false)), " Hello world");
    assert_eq!(
        stream(IncrementalDecoder::at_sequence_start(false, &tok)),
        "Hello world"
    );
}

#[test]
fn byte_fallback_characters_are_emitted_only_when_complete() {
    let tok = Tokenizer::from_gguf_vocab(&toy_spm()).unwrap();
    let ids = tok.encode("é", false).unwrap();
    // "▁" then the two UTF-8 bytes of é.
    assert_eq!(ids.len(), 3);
    let mut d = IncrementalDecoder::new(true);
    assert_eq!(d.push(&tok, ids[0]), " ");
    assert_eq!(d.push(&tok, ids[1]), "");
    assert!(d.has_pending());
    assert_eq!(d.push(&tok, ids[2]), "é");
    assert_eq!(tok.token_bytes(ids[1]), vec![0xC3]);
}

#[test]
fn a_cut_character_at_the_end_comes_out_as_a_replacement_character() {
    let tok = Tokenizer::from_gguf_vocab(&toy_spm()).unwrap();
    let mut d = IncrementalDecoder::new(false);
    assert_eq!(d.push(&tok, 3 + 0xE2), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    // A byte that can never start a character is replaced at once.
    assert_eq!(d.push(&tok, 3 + 0x80), "\u{FFFD}");
}

#[test]
fn skipping_special_tokens_hides_control_tokens_only() {
    let tok = Tokenizer::from_gguf_vocab(&toy_spm()).unwrap();
    let ids = [1, id_of(&tok, "▁Hello"), 2];
    assert_eq!(tok.decode(&ids, true), "Hello");
    assert_eq!(tok.decode(&ids, false), "<s> Hello</s>");
    assert!(tok.is_special(1) && !tok.is_special(id_of(&tok, "▁Hello")));
}

#[test]
fn malformed_vocabularies_are_errors() {
    let mut bad = toy_spm();
    bad.token_types = Some(vec![1, 2]);
    assert!(matches!(
        Tokenizer::from_gguf_vocab(&bad),
        Err(TokenizerError::InvalidVocab(_))
    ));
    let empty = GgufVocab {
        model: "llama".into(),
        ..GgufVocab::default()
    };
    assert!(Tokenizer::from_gguf_vocab(&empty).is_err());
    let bert = GgufVocab {
        model: "bert".into(),
        ..toy_spm()
    };
    assert!(matches!(
        Tokenizer::from_gguf_vocab(&bert),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    let unknown_pre = GgufVocab {
        model: "gpt2".into(),
        pre: Some("no-such-pre".into()),
        ..toy_spm()
    };
    assert!(matches!(
        Tokenizer::from_gguf_vocab(&unknown_pre),
        Err(TokenizerError::UnknownPreTokenizer(_))
    ));
}
