//! A [`Constraint`] as llguidance sees it, and the check that a constraint compiles.
//!
//! Both tiers need the same translation: the api checks a request's constraint before it
//! becomes a job (so a bad schema is a 400, not a failed job), and the engine compiles it
//! against the model's vocabulary. Keeping the translation here means the two cannot
//! disagree about what a constraint means.
//!
//! JSON is generated compactly (`", "` and `": "` separators, no other whitespace): small
//! models given free whitespace tend to spend their token budget on newlines.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;
use serde_json::{json, Value};

use crate::job::Constraint;

/// The llguidance grammar a constraint stands for.
pub fn top_level_grammar(constraint: &Constraint) -> TopLevelGrammar {
    match constraint {
        Constraint::JsonObject => {
            TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"})))
        }
        // `strict` is kept for the record: the schema is enforced either way.
        Constraint::JsonSchema { schema, .. } => {
            TopLevelGrammar::from_json_schema(with_options(schema.clone()))
        }
        Constraint::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
        Constraint::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
    }
}

/// Adds llguidance's JSON options (`x-guidance`) unless the schema brings its own. A
/// keyword llguidance cannot enforce is an error, never silently dropped.
fn with_options(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(|| {
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// Compiles `constraint` against a byte-level vocabulary (no model needed) and returns
/// llguidance's message when it does not compile: an invalid regex or grammar, or a JSON
/// schema keyword it cannot enforce (`Unimplemented keys: ["uniqueItems"]`).
pub fn check(constraint: &Constraint) -> Result<(), String> {
    if let Constraint::JsonSchema { schema, .. } = constraint {
        if !schema.is_object() && !schema.is_boolean() {
            return Err("the JSON schema must be an object".into());
        }
    }
    let factory = byte_factory()?;
    factory
        .create_parser(top_level_grammar(constraint))
        .map(drop)
        .map_err(|e| first_line(&e.to_string()))
}

/// llguidance's errors may append the whole grammar; the first line says what is wrong.
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

/// One parser factory over a 256-token byte vocabulary, built once.
fn byte_factory() -> Result<&'static ParserFactory, String> {
    static FACTORY: OnceLock<Result<ParserFactory, String>> = OnceLock::new();
    FACTORY
        .get_or_init(|| {
            let env: TokEnv = Arc::new(ByteEnv::new());
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok(factory)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Tokens 0..=254 are single bytes; 255 (a byte no UTF-8 text contains) is EOS.
struct ByteEnv {
    trie: TokTrie,
}

impl ByteEnv {
    const EOS: TokenId = 255;

    fn new() -> Self {
        let mut words: Vec<Vec<u8>> = (0u8..255).map(|b| vec![b]).collect();
        let mut eos = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        eos.extend_from_slice(b"<eos>");
        words.push(eos);
        ByteEnv {
            trie: TokTrie::from(&TokRxInfo::new(256, Self::EOS), &words),
        }
    }
}

impl TokenizerEnv for ByteEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_with_an_unenforceable_keyword_is_refused_by_name() {
        let constraint = Constraint::JsonSchema {
            schema: json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
            strict: true,
        };
        let err = check(&constraint).unwrap_err();
        assert!(err.contains("uniqueItems"), "{err}");
    }

    #[test]
    fn a_non_strict_schema_is_enforced_all_the_same() {
        let constraint = Constraint::JsonSchema {
            schema: json!({"type": "array", "uniqueItems": true}),
            strict: false,
        };
        assert!(check(&constraint).is_err());
    }

    #[test]
    fn an_invalid_regex_is_refused() {
        let err = check(&Constraint::Regex {
            pattern: "(ab".into(),
        })
        .unwrap_err();
        assert!(!err.is_empty());
    }

    #[test]
    fn valid_constraints_compile_without_a_model() {
        for constraint in [
            Constraint::JsonObject,
            Constraint::Regex {
                pattern: r"\d{3}-[a-z]+".into(),
            },
            Constraint::Lark {
                grammar: "start: \"yes\" | \"no\"".into(),
            },
            Constraint::JsonSchema {
                schema: json!({
                    "type": "object",
                    "properties": {"a": {"type": "string", "enum": ["x", "y"]}},
                    "required": ["a"],
                    "additionalProperties": false
                }),
                strict: true,
            },
        ] {
            assert_eq!(check(&constraint), Ok(()), "{constraint:?}");
        }
    }

    #[test]
    fn an_invalid_lark_grammar_is_refused() {
        assert!(check(&Constraint::Lark {
            grammar: "start: undefined_rule".into()
        })
        .is_err());
    }
}
