//! Tests of the SentencePiece path with Gemma 3's 262k vocabulary (byte fallback, `▁`,
//! Gemma turn markers). Skipped when the model file is absent.

use std::sync::OnceLock;

use serde_json::{json, Map};

use super::test_gguf;
use super::{ChatTemplate, IncrementalDecoder, Tokenizer, GEMMA_CHAT_TEMPLATE};

fn gemma3() -> Option<&'static Tokenizer> {
    static CELL: OnceLock<Option<Tokenizer>> = OnceLock::new();
    CELL.get_or_init(|| {
        let (vocab, _) = test_gguf::load(&test_gguf::gemma3_path())?;
        Some(Tokenizer::from_gguf_vocab(&vocab).expect("Gemma 3 vocabulary builds"))
    })
    .as_ref()
}

#[test]
fn gemma_text_round_trips_through_ids() {
    let Some(tok) = gemma3() else { return };
    for text in [
        "Hello world",
        " two  spaces and\ttab\n\nnewlines ",
        "数学 ∑ π — 🦀 👩‍👩‍👧‍👦",
        "<start_of_turn>user\nHi<end_of_turn>",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false), text, "ids {ids:?}");
    }
}

#[test]
fn gemma_turn_markers_are_single_special_tokens_and_end_generation() {
    let Some(tok) = gemma3() else { return };
    let ids = tok.encode("<start_of_turn>model\n", false).unwrap();
    assert!(tok.is_special(ids[0]));
    let end = tok.encode("<end_of_turn>", false).unwrap();
    assert_eq!(end.len(), 1);
    assert!(tok.eos_ids().contains(&end[0]));
    assert_eq!(tok.bos_text(), "<bos>");
    assert!(tok.add_bos_by_default());
}

#[test]
fn byte_fallback_tokens_stream_only_whole_characters() {
    let Some(tok) = gemma3() else { return };
    // A rare character is spelled with `<0xXX>` byte tokens.
    let text = "rare: \u{10348} ok";
    let ids = tok.encode(text, false).unwrap();
    let byte_tokens = ids
        .iter()
        .filter(|&&id| tok.vocab_entry(id).is_some_and(|e| e.starts_with("<0x")))
        .count();
    assert!(byte_tokens >= 2, "expected byte fallback in {ids:?}");
    let mut decoder = IncrementalDecoder::new(false);
    let mut streamed = String::new();
    for &id in &ids {
        let chunk = decoder.push(tok, id);
        assert!(!chunk.contains('\u{FFFD}'), "broken character in {chunk:?}");
        streamed.push_str(&chunk);
    }
    assert!(!decoder.has_pending());
    assert_eq!(streamed, text);
}

#[test]
fn the_gemma_template_prompt_gets_exactly_one_bos() {
    let Some(tok) = gemma3() else { return };
    let template =
        ChatTemplate::new(GEMMA_CHAT_TEMPLATE, &tok.bos_text(), &tok.eos_text()).unwrap();
    let prompt = template
        .render(
            &[json!({"role": "user", "content": "Hi"})],
            true,
            None,
            &Map::new(),
            false,
        )
        .unwrap();
    let ids = tok.encode_prompt(&prompt).unwrap();
    let bos = tok.bos_id().unwrap();
    assert_eq!(ids[0], bos);
    assert_eq!(ids.iter().filter(|&&id| id == bos).count(), 1);
}
