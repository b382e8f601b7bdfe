//! Tests of the tokenizer against a real vocabulary (SmolLM2's, read from the GGUF file) and
//! of the chat template with real model templates. Skipped when the model file is absent.

use std::sync::OnceLock;

use serde_json::{json, Map};

use super::test_gguf;
use super::{ChatTemplate, IncrementalDecoder, TemplateError, Tokenizer};

/// SmolLM2's tokenizer and chat template, loaded once for all tests.
fn smollm2() -> Option<&'static (Tokenizer, Option<String>)> {
    static CELL: OnceLock<Option<(Tokenizer, Option<String>)>> = OnceLock::new();
    CELL.get_or_init(|| {
        let (vocab, template) = test_gguf::load(&test_gguf::smollm2_path())?;
        let tokenizer = Tokenizer::from_gguf_vocab(&vocab).expect("SmolLM2 vocabulary builds");
        Some((tokenizer, template))
    })
    .as_ref()
}

const ROUND_TRIP_TEXTS: &[&str] = &[
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\nand more",
    "naïve café — déjà vu; Ærøskøbing",
    "emoji: 🦀🚀👩‍👩‍👧‍👦 👍🏽",
    "中文分词测试，日本語のテキスト、한국어 문장",
    "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    "numbers 1234567890 and 3.14159e-10",
    "",
    " ",
    "\u{0}\u{7f} control chars",
];

#[test]
fn encoding_then_decoding_gives_back_the_text() {
    let Some((tok, _)) = smollm2() else { return };
    for text in ROUND_TRIP_TEXTS {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(&tok.decode(&ids, false), text, "ids {ids:?}");
    }
}

#[test]
fn chatml_markers_in_text_encode_as_single_special_tokens() {
    let Some((tok, _)) = smollm2() else { return };
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert!(tok.is_special(1) && tok.is_special(2));
    assert_eq!(tok.decode(&ids, true), "user\nHi");
}

#[test]
fn end_of_generation_ids_include_im_end_and_endoftext() {
    let Some((tok, _)) = smollm2() else { return };
    let eos = tok.eos_ids();
    assert!(eos.contains(&2), "{eos:?}");
    assert!(eos.contains(&0), "{eos:?}");
    assert_eq!(tok.eos_text(), "<|im_end|>");
    assert_eq!(tok.vocab_size(), 49152);
}

#[test]
fn digits_are_tokenized_one_by_one() {
    let Some((tok, _)) = smollm2() else { return };
    let ids = tok.encode("2024", false).unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(tok.token_bytes(ids[0]), b"2");
}

#[test]
fn token_bytes_are_raw_bytes_not_the_byte_level_alphabet() {
    let Some((tok, _)) = smollm2() else { return };
    let ids = tok.encode(" hello", false).unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(tok.token_bytes(ids[0]), b" hello");
    assert_eq!(tok.vocab_entry(ids[0]), Some("Ġhello"));
}

#[test]
fn incremental_decoding_holds_back_a_split_emoji_until_complete() {
    let Some((tok, _)) = smollm2() else { return };
    let text = "I love 🦀!";
    let ids = tok.encode(text, false).unwrap();
    let mut decoder = IncrementalDecoder::new(false);
    let mut streamed = String::new();
    let mut saw_held_back = false;
    for &id in &ids {
        let chunk = decoder.push(tok, id);
        if std::str::from_utf8(tok.piece(id)).is_err() {
            saw_held_back |= chunk.is_empty() || !chunk.contains('\u{FFFD}');
        }
        assert!(
            !chunk.contains('\u{FFFD}'),
            "emitted a broken character: {chunk:?}"
        );
        streamed.push_str(&chunk);
    }
    streamed.push_str(&decoder.finish());
    assert!(
        saw_held_back,
        "the emoji should span several byte tokens: {ids:?}"
    );
    assert_eq!(streamed, text);
}

#[test]
fn incremental_decoding_matches_whole_decoding_and_skips_specials() {
    let Some((tok, _)) = smollm2() else { return };
    let text = "<|im_start|>assistant\n漢字 and 🚀🚀<|im_end|>";
    let ids = tok.encode(text, false).unwrap();
    let mut decoder = IncrementalDecoder::new(true);
    let mut streamed: String = ids.iter().map(|&id| decoder.push(tok, id)).collect();
    streamed.push_str(&decoder.finish());
    assert_eq!(streamed, tok.decode(&ids, true));
    assert_eq!(streamed, "assistant\n漢字 and 🚀🚀");
}

#[test]
fn the_gguf_chatml_template_renders_the_canonical_prompt() {
    let Some((tok, Some(source))) = smollm2() else {
        return;
    };
    let template = ChatTemplate::new(source, &tok.bos_text(), &tok.eos_text()).unwrap();
    let messages = [
        json!({"role": "system", "content": "You are helpful."}),
        json!({"role": "user", "content": "Hi there"}),
    ];
    let prompt = template
        .render(&messages, true, None, &Map::new(), false)
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode_prompt(&prompt).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
}

#[test]
fn continue_final_message_ends_the_prompt_inside_the_last_message() {
    let Some((tok, Some(source))) = smollm2() else {
        return;
    };
    let template = ChatTemplate::new(source, &tok.bos_text(), &tok.eos_text()).unwrap();
    let messages = [
        json!({"role": "user", "content": "Count"}),
        json!({"role": "assistant", "content": "1, 2,"}),
    ];
    let prompt = template
        .render(&messages, true, None, &Map::new(), true)
        .unwrap();
    assert!(
        prompt.ends_with("<|im_start|>assistant\n1, 2,"),
        "{prompt:?}"
    );
}

#[test]
fn a_template_calling_raise_exception_gives_its_message_as_an_error() {
    let template = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
        "",
        "",
    )
    .unwrap();
    let err = template
        .render(
            &[json!({"role": "assistant", "content": "x"})],
            false,
            None,
            &Map::new(),
            false,
        )
        .unwrap_err();
    match err {
        TemplateError::Raised(message) => assert_eq!(message, "first must be user"),
        other => panic!("expected Raised, got {other:?}"),
    }
}
