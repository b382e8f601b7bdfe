//! `response_format`, `regex`, `ebnf` and `stop_regex` at the boundary.

use super::*;
use fallow_protocol::job::Constraint;

fn error_of(extra: serde_json::Value) -> (String, Option<&'static str>, String) {
    match validate(extra.clone()) {
        Err(ApiError::InvalidRequest {
            message,
            param: Some(param),
            code,
        }) => (param, code, message),
        other => panic!("expected a 400 for {extra}, got {other:?}"),
    }
}

fn constraint_of(extra: serde_json::Value) -> Option<Constraint> {
    accepted(extra).request.sampling.constraint
}

#[test]
fn response_formats_become_constraints() {
    assert_eq!(
        constraint_of(json!({"response_format": {"type": "text"}})),
        None
    );
    assert_eq!(
        constraint_of(json!({"response_format": {"type": "json_object"}})),
        Some(Constraint::JsonObject)
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    assert_eq!(
        constraint_of(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}})),
        Some(Constraint::JsonSchema {
            schema,
            strict: true
        })
    );
    assert_eq!(
        constraint_of(json!({"regex": "[0-9]+"})),
        Some(Constraint::Regex {
            pattern: "[0-9]+".into()
        })
    );
}

#[test]
fn an_ebnf_grammar_is_converted_to_lark() {
    let Some(Constraint::Lark { grammar }) =
        constraint_of(json!({"ebnf": "root ::= \"yes\" | \"no\""}))
    else {
        panic!("ebnf gives a Lark constraint");
    };
    assert!(grammar.contains("start: g_root"), "{grammar}");
}

#[test]
fn only_one_constraint_at_a_time() {
    let (param, code, message) = error_of(json!({
        "response_format": {"type": "json_object"}, "regex": "a+"
    }));
    assert_eq!(param, "regex");
    assert_eq!(code, Some("conflicting_constraints"));
    assert!(message.contains("response_format, regex"), "{message}");
    let (param, ..) = error_of(json!({"regex": "a+", "ebnf": "root ::= \"a\""}));
    assert_eq!(param, "ebnf");
}

#[test]
fn an_unenforceable_schema_feature_is_named() {
    let (param, code, message) = error_of(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "x", "strict": true,
            "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}}));
    assert_eq!(param, "response_format");
    assert_eq!(code, Some("unsupported_schema_feature"));
    assert!(message.contains("uniqueItems"), "{message}");
}

#[test]
fn bad_regexes_and_grammars_are_refused_with_their_parameter() {
    assert_eq!(error_of(json!({"regex": "(unclosed"})).0, "regex");
    assert_eq!(
        error_of(json!({"regex": "(unclosed"})).1,
        Some("invalid_regex")
    );
    assert_eq!(error_of(json!({"ebnf": "root ::= \"open"})).0, "ebnf");
    assert_eq!(
        error_of(json!({"ebnf": "root ::= missing"})).1,
        Some("invalid_grammar")
    );
    assert_eq!(
        error_of(json!({"response_format": {"type": "json_schema"}})).0,
        "response_format"
    );
    assert_eq!(
        error_of(json!({"response_format": {"type": "xml"}})).0,
        "response_format"
    );
}

#[test]
fn stop_regex_takes_one_pattern_or_a_list() {
    let one = accepted(json!({"stop_regex": "\\d+"}));
    assert_eq!(one.request.sampling.stop_regex, vec!["\\d+".to_string()]);
    let many = accepted(json!({"stop_regex": ["a", "b+"]}));
    assert_eq!(many.request.sampling.stop_regex.len(), 2);
    let (param, code, _) = error_of(json!({"stop_regex": ["ok", "(bad"]}));
    assert_eq!(
        (param.as_str(), code),
        ("stop_regex", Some("invalid_regex"))
    );
}

#[test]
fn a_job_stored_before_constraints_existed_still_reads() {
    let mut stored = serde_json::to_value(fallow_protocol::job::Sampling::default()).unwrap();
    let obj = stored.as_object_mut().unwrap();
    obj.remove("constraint");
    obj.remove("stop_regex");
    let sampling: fallow_protocol::job::Sampling = serde_json::from_value(stored).unwrap();
    assert_eq!(sampling.constraint, None);
    assert!(sampling.stop_regex.is_empty());
}
