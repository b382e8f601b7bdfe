//! The grammar module against real vocabularies: SmolLM2's byte-level BPE and Gemma 3's
//! SentencePiece (skipped when the model files are absent). A seeded random walk over the
//! allowed tokens stands in for a model: whatever it picks, the text must follow the
//! constraint.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use fallow_protocol::job::Constraint;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::{Advance, Grammars, SeqGrammar};
use crate::tokenizer::{test_gguf, Tokenizer};

fn load(path: &str) -> Option<Arc<Tokenizer>> {
    let (vocab, _) = test_gguf::load(path)?;
    Some(Arc::new(
        Tokenizer::from_gguf_vocab(&vocab).expect("vocabulary builds"),
    ))
}

fn smollm2() -> Option<&'static Arc<Tokenizer>> {
    static CELL: OnceLock<Option<Arc<Tokenizer>>> = OnceLock::new();
    CELL.get_or_init(|| load(&test_gguf::smollm2_path()))
        .as_ref()
}

fn gemma3() -> Option<&'static Arc<Tokenizer>> {
    static CELL: OnceLock<Option<Arc<Tokenizer>>> = OnceLock::new();
    CELL.get_or_init(|| load(&test_gguf::gemma3_path()))
        .as_ref()
}

fn grammars(tokenizer: &Arc<Tokenizer>) -> Grammars {
    let started = Instant::now();
    let g = Grammars::new(tokenizer.clone(), &tokenizer.eos_ids()).expect("grammar vocabulary");
    eprintln!(
        "grammar vocabulary of {} tokens built in {:?}",
        tokenizer.vocab_size(),
        started.elapsed()
    );
    g
}

/// The allowed token ids of the current mask.
fn allowed(grammar: &mut SeqGrammar) -> Vec<u32> {
    grammar.prepare_mask();
    let words = grammar.mask_words().expect("mask computed");
    let mut ids = Vec::new();
    for (w, &bits) in words.iter().enumerate() {
        for b in 0..32 {
            if bits >> b & 1 == 1 {
                ids.push((w * 32 + b) as u32);
            }
        }
    }
    ids
}

/// Picks random allowed tokens until the grammar completes or EOS is picked; returns the
/// text and whether it ended properly.
fn random_walk(tokenizer: &Tokenizer, mut grammar: SeqGrammar, seed: u64) -> (String, bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bytes = Vec::new();
    for _ in 0..300 {
        let ids = allowed(&mut grammar);
        assert!(!ids.is_empty(), "a live grammar allows something");
        let token = ids[rng.gen_range(0..ids.len())];
        if tokenizer.is_eos(token) {
            assert!(grammar.is_accepting(), "EOS only when the text is complete");
            return (String::from_utf8(bytes).expect("utf-8"), true);
        }
        bytes.extend_from_slice(tokenizer.piece(token));
        if grammar.advance(token).expect("allowed token") == Advance::Complete {
            return (String::from_utf8(bytes).expect("utf-8"), true);
        }
    }
    (String::from_utf8_lossy(&bytes).into_owned(), false)
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
            "inner": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": false
            }
        },
        "required": ["color", "count", "tags", "inner"],
        "additionalProperties": false
    })
}

/// The walk's text is JSON that satisfies [`schema`].
fn assert_follows_schema(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 4, "{text}");
    assert!(["red", "green", "blue"].contains(&obj["color"].as_str().unwrap()));
    assert!(obj["count"].as_u64().is_some_and(|n| n <= 99), "{text}");
    let tags = obj["tags"].as_array().unwrap();
    assert!(tags.len() <= 2);
    assert!(tags
        .iter()
        .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 4)));
    assert!(obj["inner"]["ok"].is_boolean(), "{text}");
}

fn json_schema_walks_follow_the_schema(tokenizer: &Arc<Tokenizer>) {
    let mut g = grammars(tokenizer);
    let constraint = Constraint::JsonSchema {
        schema: schema(),
        strict: true,
    };
    for seed in 0..10 {
        let started = Instant::now();
        let grammar = g.compile(&constraint).unwrap();
        let compiled = started.elapsed();
        let (text, done) = random_walk(tokenizer, grammar, seed);
        assert!(done, "seed {seed} did not finish: {text:?}");
        assert_follows_schema(&text);
        if seed == 0 {
            eprintln!("compiled in {compiled:?}; walk: {text}");
        }
    }
}

#[test]
fn smollm2_json_schema_walks_follow_the_schema() {
    let Some(tok) = smollm2() else { return };
    json_schema_walks_follow_the_schema(tok);
}

#[test]
fn gemma3_json_schema_walks_follow_the_schema() {
    let Some(tok) = gemma3() else { return };
    json_schema_walks_follow_the_schema(tok);
}

#[test]
fn regex_walks_match_the_whole_pattern() {
    let re = regex::Regex::new(r"^\d{3}-(yes|no)$").unwrap();
    for tok in [smollm2(), gemma3()].into_iter().flatten() {
        let mut g = grammars(tok);
        let constraint = Constraint::Regex {
            pattern: r"\d{3}-(yes|no)".into(),
        };
        for seed in 0..10 {
            let (text, done) = random_walk(tok, g.compile(&constraint).unwrap(), seed);
            assert!(done && re.is_match(&text), "{text:?}");
        }
    }
}

#[test]
fn json_object_walks_parse_as_objects() {
    let Some(tok) = smollm2() else { return };
    let mut g = grammars(tok);
    let mut finished = 0;
    for seed in 0..10 {
        let (text, done) = random_walk(tok, g.compile(&Constraint::JsonObject).unwrap(), seed);
        // Random tokens may nest without end; those that end must be objects.
        if done {
            finished += 1;
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v.is_object(), "{text}");
        }
    }
    eprintln!("{finished}/10 random json_object walks finished");
}

#[test]
fn end_of_generation_tokens_are_allowed_exactly_when_the_grammar_accepts() {
    let Some(tok) = smollm2() else { return };
    let mut g = grammars(tok);
    let mut grammar = g
        .compile(&Constraint::Regex {
            pattern: "a+".into(),
        })
        .unwrap();
    let im_end = 2;
    assert!(tok.is_eos(im_end));
    assert!(!grammar.allows(im_end), "nothing generated yet");
    let a = tok.encode("a", false).unwrap()[0];
    assert!(grammar.allows(a));
    assert_eq!(grammar.advance(a).unwrap(), Advance::Continue);
    assert!(grammar.allows(im_end), "\"a\" is complete");
    assert!(!grammar.allows(tok.encode("b", false).unwrap()[0]));
}

#[test]
fn choices_cloned_from_one_grammar_advance_independently() {
    let Some(tok) = smollm2() else { return };
    let mut g = grammars(tok);
    let constraint = Constraint::Lark {
        grammar: r#"start: "yes" | "no""#.into(),
    };
    let mut first = g.compile(&constraint).unwrap();
    let mut second = g.compile(&constraint).unwrap();
    let yes = tok.encode("yes", false).unwrap();
    let no = tok.encode("no", false).unwrap();
    assert_eq!((yes.len(), no.len()), (1, 1));
    assert_eq!(first.advance(yes[0]).unwrap(), Advance::Complete);
    assert!(
        second.allows(no[0]),
        "the second copy is still at the start"
    );
    assert_eq!(second.advance(no[0]).unwrap(), Advance::Complete);
}

#[test]
fn a_constraint_that_does_not_compile_is_an_error() {
    let Some(tok) = smollm2() else { return };
    let mut g = grammars(tok);
    let err = g
        .compile(&Constraint::Lark {
            grammar: "start: nowhere".into(),
        })
        .unwrap_err();
    assert!(matches!(err, super::GrammarError::Compile(_)), "{err}");
}

/// Mask computation cost per token on the real vocabulary (printed; run with
/// `--nocapture`). Asserts only a generous bound so a slow CI machine does not fail it.
#[test]
fn json_schema_masks_are_cheap_to_compute() {
    let Some(tok) = smollm2() else { return };
    let mut g = grammars(tok);
    let constraint = Constraint::JsonSchema {
        schema: schema(),
        strict: true,
    };
    let mut grammar = g.compile(&constraint).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let (mut steps, started) = (0u32, Instant::now());
    loop {
        let ids = allowed(&mut grammar);
        let token = ids[rng.gen_range(0..ids.len())];
        steps += 1;
        if tok.is_eos(token) || grammar.advance(token).unwrap() == Advance::Complete {
            break;
        }
    }
    let per_token = started.elapsed() / steps;
    eprintln!("{steps} masks, {per_token:?} per mask + advance");
    assert!(per_token.as_millis() < 50, "{per_token:?}");
}

/// A byte-fallback vocabulary with harmony's markers as control tokens, as gpt-oss's are.
fn harmony_vocabulary() -> Arc<Tokenizer> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for special in [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
    ] {
        tokens.push(special.into());
        types.push(3);
    }
    let scores = Some(vec![0.0; tokens.len()]);
    let vocab = crate::tokenizer::GgufVocab {
        model: "llama".into(),
        tokens,
        scores,
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        ..Default::default()
    };
    Arc::new(Tokenizer::from_gguf_vocab(&vocab).expect("vocabulary builds"))
}

#[test]
fn a_grammar_naming_harmonys_markers_allows_them_as_special_tokens_only() {
    let tok = harmony_vocabulary();
    let mut g = grammars(&tok);
    // As the api writes a forced harmony call (`parsers::harmony::grammar`).
    let grammar = "start: analysis? call\n\
                   analysis: <|channel|> \"analysis\" <|message|> REASONING <|end|> <|start|> \"assistant\"\n\
                   REASONING: /(?s:.*)/\n\
                   call: call_0\n\
                   call_0: <|channel|> \"commentary to=functions.f \" <|constrain|> \"json\" <|message|> args_0\n\
                   args_0: %json {\"type\": \"object\", \"properties\": {}, \"additionalProperties\": false}\n";
    let mut grammar = g
        .compile(&Constraint::Lark {
            grammar: grammar.into(),
        })
        .expect("compiles against the vocabulary");
    let special = |text: &str| {
        (0..tok.vocab_size() as u32)
            .find(|&id| tok.vocab_entry(id) == Some(text))
            .expect("in the vocabulary")
    };
    let byte = |b: u8| 3 + u32::from(b);
    let text = |s: &str| s.bytes().map(byte).collect::<Vec<u32>>();
    let call = special("<|call|>");
    assert_eq!(allowed(&mut grammar), [special("<|channel|>")]);
    let mut walk = vec![special("<|channel|>")];
    walk.extend(text("analysis"));
    walk.push(special("<|message|>"));
    walk.extend(text("hm <|end"));
    walk.extend([special("<|end|>"), special("<|start|>")]);
    walk.extend(text("assistant"));
    walk.push(special("<|channel|>"));
    walk.extend(text("commentary to=functions.f "));
    walk.push(special("<|constrain|>"));
    walk.extend(text("json"));
    walk.push(special("<|message|>"));
    walk.extend(text("{"));
    for &token in &walk {
        assert!(grammar.allows(token), "token {token} is allowed");
        assert!(!grammar.allows(call), "no end before the arguments");
        assert_eq!(grammar.advance(token).unwrap(), Advance::Continue);
    }
    assert!(
        !grammar.allows(byte(b'<')),
        "the markers are never spelled as text"
    );
    let close = byte(b'}');
    assert!(grammar.allows(close));
    let step = grammar.advance(close).unwrap();
    assert!(
        step == Advance::Complete || grammar.allows(call),
        "{step:?}"
    );
}
