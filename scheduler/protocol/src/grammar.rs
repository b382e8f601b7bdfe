//! A [`Constraint`] as llguidance sees it, and the check that a constraint compiles.
//!
//! Both tiers need the same translation: the api checks a request's constraint before it
//! becomes a job (so a bad schema is a 400, not a failed job), and the engine compiles it
//! against the model's vocabulary. Keeping the translation here means the two cannot
//! disagree about what a constraint means.
//!
//! JSON is generated compactly (`", "` and `": "` separators, no other whitespace): small
//! models given free whitespace tend to spend their token budget on newlines. An object
//! schema that names its properties and leaves `additionalProperties` unset admits only
//! those keys, as xgrammar's default strict mode does: a small model otherwise invents keys
//! until its budget runs out.

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
            TopLevelGrammar::from_json_schema(strict_compact(schema.clone()))
        }
        Constraint::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
        Constraint::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
    }
}

/// `schema` as Fallow enforces it: objects closed to the keys they name (see the module
/// doc) and compact separators. For `%json { … }` in a Lark grammar too (forced tool
/// calls), which reads the same `x-guidance` options.
pub fn strict_compact(mut schema: Value) -> Value {
    close_named_objects(&mut schema);
    with_options(schema)
}

/// Sets `additionalProperties: false` on every object schema that lists `properties` and
/// says nothing of other keys, through every keyword that holds subschemas. The members of
/// an `allOf` are left open: closing each would refuse the keys the others name.
fn close_named_objects(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    let open_to_others = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|key| map.contains_key(*key));
    if map.contains_key("properties") && !open_to_others {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(children) = value {
                    children.values_mut().for_each(close_named_objects);
                }
            }
            "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(children) = value {
                    children.iter_mut().for_each(close_named_objects);
                }
            }
            "allOf" => {
                if let Value::Array(children) = value {
                    children.iter_mut().for_each(close_nested_only);
                }
            }
            "items" | "additionalProperties" | "contains" | "not" | "if" | "then" | "else" => {
                close_named_objects(value)
            }
            _ => {}
        }
    }
}

/// An `allOf` member: its own keys stay open, the schemas inside it are closed.
fn close_nested_only(schema: &mut Value) {
    let had_rule = schema
        .as_object()
        .is_some_and(|map| map.contains_key("additionalProperties"));
    close_named_objects(schema);
    if let (false, Value::Object(map)) = (had_rule, schema) {
        map.remove("additionalProperties");
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

/// Whether `constraint` admits `text` as a whole output (over bytes, no model needed): for
/// tests and diagnostics of what a grammar allows. The [`NAMED_SPECIALS`] in `text` are read
/// as those special tokens, everything else byte by byte.
pub fn admits(constraint: &Constraint, text: &str) -> Result<bool, String> {
    let factory = byte_factory()?;
    let parser = factory
        .create_parser(top_level_grammar(constraint))
        .map_err(|e| first_line(&e.to_string()))?;
    let mut matcher = llguidance::Matcher::new(Ok(parser));
    let bytes = ByteEnv::tokens(text);
    let valid = matcher
        .validate_tokens(&bytes)
        .map_err(|e| first_line(&e.to_string()))?;
    if valid < bytes.len() {
        return Ok(false);
    }
    matcher
        .consume_tokens(&bytes)
        .map_err(|e| first_line(&e.to_string()))?;
    matcher
        .is_accepting()
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

/// The special tokens Fallow's own grammars name: harmony's (gpt-oss), whose forced calls
/// spell its headers with them. They are in the byte vocabulary so that those grammars
/// compile, and can be tested, without a model.
pub const NAMED_SPECIALS: [&str; 7] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
];

/// Tokens 0..=254 are single bytes; 255 (a byte no UTF-8 text contains) is EOS; the
/// [`NAMED_SPECIALS`] follow, from 256.
struct ByteEnv {
    trie: TokTrie,
}

impl ByteEnv {
    const EOS: TokenId = 255;
    const FIRST_SPECIAL: TokenId = 256;

    fn new() -> Self {
        let mut words: Vec<Vec<u8>> = (0u8..255).map(|b| vec![b]).collect();
        for name in std::iter::once("<eos>").chain(NAMED_SPECIALS) {
            let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            word.extend_from_slice(name.as_bytes());
            words.push(word);
        }
        let size = words.len() as u32;
        ByteEnv {
            trie: TokTrie::from(&TokRxInfo::new(size, Self::EOS), &words),
        }
    }

    /// `text` as this vocabulary's tokens: named specials as themselves, the rest as bytes.
    fn tokens(text: &str) -> Vec<TokenId> {
        let mut tokens = Vec::with_capacity(text.len());
        let mut rest = text;
        while !rest.is_empty() {
            let special = (Self::FIRST_SPECIAL..)
                .zip(NAMED_SPECIALS)
                .find(|(_, name)| rest.starts_with(name));
            match special {
                Some((id, name)) => {
                    tokens.push(id);
                    rest = &rest[name.len()..];
                }
                None => {
                    let len = rest.chars().next().map_or(1, char::len_utf8);
                    tokens.extend(rest.as_bytes()[..len].iter().map(|&b| TokenId::from(b)));
                    rest = &rest[len..];
                }
            }
        }
        tokens
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

    fn weather_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city", "unit"]
        })
    }

    fn schema(schema: Value) -> Constraint {
        Constraint::JsonSchema {
            schema,
            strict: false,
        }
    }

    #[test]
    fn an_object_that_names_its_keys_admits_no_other_key() {
        let weather = schema(weather_schema());
        let named = r#"{"city": "Paris", "unit": "celsius"}"#;
        assert_eq!(admits(&weather, named), Ok(true));
        let extra = r#"{"city": "Paris", "unit": "celsius", "location": "Paris"}"#;
        assert_eq!(admits(&weather, extra), Ok(false));
    }

    #[test]
    fn an_object_that_allows_other_keys_keeps_them() {
        let mut open = weather_schema();
        open["additionalProperties"] = json!(true);
        let extra = r#"{"city": "Paris", "unit": "celsius", "location": "Paris"}"#;
        assert_eq!(admits(&schema(open), extra), Ok(true));
        let bare = schema(json!({"type": "object"}));
        assert_eq!(admits(&bare, r#"{"anything": 1}"#), Ok(true));
    }

    #[test]
    fn nested_objects_are_closed_too() {
        let nested = schema(json!({
            "type": "object",
            "properties": {"place": weather_schema()},
            "required": ["place"]
        }));
        let inner_extra = r#"{"place": {"city": "Paris", "unit": "celsius", "x": 1}}"#;
        assert_eq!(admits(&nested, inner_extra), Ok(false));
        let list = schema(json!({"type": "array", "items": weather_schema()}));
        assert_eq!(
            admits(&list, r#"[{"city": "Paris", "unit": "celsius"}]"#),
            Ok(true)
        );
        assert_eq!(
            admits(&list, r#"[{"city": "Paris", "unit": "celsius", "x": 1}]"#),
            Ok(false)
        );
    }

    #[test]
    fn the_members_of_all_of_are_not_closed_against_each_other() {
        let both = schema(json!({
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
            ]
        }));
        assert_eq!(admits(&both, r#"{"a": 1, "b": 2}"#), Ok(true));
    }

    #[test]
    fn json_is_compact_in_schemas_and_in_lark_json_blocks() {
        let weather = schema(weather_schema());
        assert_eq!(
            admits(&weather, "{\n  \"city\": \"Paris\", \"unit\": \"celsius\"}"),
            Ok(false)
        );
        let call = strict_compact(weather_schema());
        let lark = Constraint::Lark {
            grammar: format!("start: \"<tool_call>\" call\ncall: %json {call}\n"),
        };
        assert_eq!(
            admits(&lark, r#"<tool_call>{"city": "Paris", "unit": "celsius"}"#),
            Ok(true)
        );
        assert_eq!(
            admits(
                &lark,
                "<tool_call>{\n        \"city\": \"Paris\", \"unit\": \"celsius\"}"
            ),
            Ok(false)
        );
        assert_eq!(
            admits(
                &lark,
                r#"<tool_call>{"city": "Paris", "unit": "celsius", "x": 1}"#
            ),
            Ok(false)
        );
    }

    #[test]
    fn an_invalid_lark_grammar_is_refused() {
        assert!(check(&Constraint::Lark {
            grammar: "start: undefined_rule".into()
        })
        .is_err());
    }
}
