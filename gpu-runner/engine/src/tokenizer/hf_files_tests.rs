//! Tests of [`Tokenizer::from_files`]: SmolLM2's vocabulary written out as a Hugging Face
//! `tokenizer.json` (the same layout as the published one) must give llama.cpp's ids too.

use serde_json::{json, Value};

use super::test_gguf;
use super::vocab::GgufVocab;
use super::Tokenizer;

/// A `tokenizer.json` like SmolLM2's: byte-level BPE, digits split, control tokens added.
fn tokenizer_json(vocab: &GgufVocab) -> Value {
    let types = vocab.token_types.clone().unwrap_or_default();
    let added: Vec<Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types.get(*i) == Some(&3))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let model_vocab: serde_json::Map<String, Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": model_vocab, "merges": vocab.merges}
    })
}

#[test]
fn a_tokenizer_json_gives_the_same_ids_as_the_gguf_vocabulary() {
    let Some((vocab, template)) = test_gguf::load(&test_gguf::smollm2_path()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("tokenizer.json");
    let config_path = dir.path().join("tokenizer_config.json");
    std::fs::write(&json_path, tokenizer_json(&vocab).to_string()).unwrap();
    let config = json!({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
                        "chat_template": template});
    std::fs::write(&config_path, config.to_string()).unwrap();

    let from_files = Tokenizer::from_files(&json_path, Some(&config_path)).unwrap();
    let from_gguf = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let texts = [
        "Hello, world! 2024",
        "<|im_start|>user\nnaïve 🦀 中文<|im_end|>\n",
        "  spaces\t\ttabs\n\n\nnewlines  ",
        "fn f() -> u32 { 42 }",
    ];
    for text in texts {
        assert_eq!(
            from_files.encode(text, false).unwrap(),
            from_gguf.encode(text, false).unwrap(),
            "{text:?}"
        );
        let ids = from_files.encode(text, false).unwrap();
        assert_eq!(from_files.decode(&ids, false), text);
    }
    assert_eq!(from_files.bos_id(), Some(1));
    assert_eq!(from_files.eos_text(), "<|im_end|>");
    assert!(from_files.is_special(2));
    assert!(from_files.eos_ids().contains(&0));
    assert!(!from_files.add_bos_by_default());
    assert!(from_files.chat_template().is_some());
}

#[test]
fn missing_or_malformed_tokenizer_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tokenizer.json");
    assert!(Tokenizer::from_files(&missing, None).is_err());
    std::fs::write(&missing, "{not json").unwrap();
    assert!(Tokenizer::from_files(&missing, None).is_err());
}
