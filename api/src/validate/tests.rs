use super::*;
use crate::error::ApiError;
use crate::extract::parse_json_body;
use fallow_protocol::job::Constraint;
use fallow_protocol::job::Role;
use serde_json::json;

const LIMITS: Limits = Limits {
    max_messages: 4,
    max_n: 3,
    context_length: 2048,
    parsers: ModelParsers {
        tool: None,
        reasoning: None,
    },
};

fn request(extra: serde_json::Value) -> ChatCompletionRequest {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(obj), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    match parse_json_body(body.to_string().as_bytes()) {
        Ok(req) => req,
        Err(err) => panic!("test body did not parse: {err}"),
    }
}

fn validate(extra: serde_json::Value) -> Result<ValidChat, ApiError> {
    validate_chat(request(extra), &LIMITS)
}

/// Asserts the request is refused with a 400 naming `param` and containing `needle`.
fn assert_rejected(extra: serde_json::Value, param: &str, needle: &str) {
    match validate(extra.clone()) {
        Err(ApiError::InvalidRequest {
            message,
            param: Some(p),
            ..
        }) => {
            assert_eq!(p, param, "wrong param for {extra}: {message}");
            assert!(
                message.contains(needle),
                "message `{message}` lacks `{needle}` for {extra}"
            );
        }
        Err(other) => panic!("unexpected error for {extra}: {other:?}"),
        Ok(_) => panic!("accepted {extra}, expected a rejection naming {param}"),
    }
}

fn accepted(extra: serde_json::Value) -> ValidChat {
    match validate(extra.clone()) {
        Ok(valid) => valid,
        Err(err) => panic!("rejected {extra}: {err}"),
    }
}

#[test]
fn a_client_seed_is_kept_and_requests_without_one_get_different_seeds() {
    assert_eq!(accepted(json!({"seed": 7})).request.sampling.seed, Some(7));
    assert_eq!(
        accepted(json!({"seed": -1})).request.sampling.seed,
        Some(u64::MAX)
    );
    let seeds: std::collections::HashSet<_> = (0..8)
        .map(|_| accepted(json!({})).request.sampling.seed)
        .collect();
    assert_eq!(seeds.len(), 8, "each unseeded request draws its own seed");
}

#[test]
fn a_minimal_request_gets_the_openai_defaults() {
    let valid = accepted(json!({}));
    assert_eq!(valid.request.model, "m");
    assert_eq!(valid.request.n, 1);
    assert!(
        valid.request.sampling.seed.is_some(),
        "a seed is fixed at enqueue"
    );
    assert_eq!(
        fallow_protocol::job::Sampling {
            seed: None,
            ..valid.request.sampling
        },
        fallow_protocol::job::Sampling::default()
    );
    assert!(valid.request.add_generation_prompt);
    assert!(!valid.delivery.stream);
    assert_eq!(valid.priority, 0);
}

#[test]
fn a_missing_model_is_refused_naming_model() {
    let wire: ChatCompletionRequest = parse_json_body(br#"{"messages":[]}"#).unwrap_or_default();
    match validate_chat(wire, &LIMITS) {
        Err(ApiError::InvalidRequest { param: Some(p), .. }) => assert_eq!(p, "model"),
        other => panic!("expected a model error, got {other:?}"),
    }
}

#[test]
fn messages_must_be_present_and_within_the_limit() {
    assert_rejected(json!({"messages": []}), "messages", "at least one");
    let many = json!({"messages": vec![json!({"role": "user", "content": "x"}); 5]});
    assert_rejected(many, "messages", "at most 4");
}

#[test]
fn roles_are_checked_and_developer_becomes_system() {
    let valid = accepted(json!({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]}));
    let roles: Vec<Role> = valid.request.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Tool]
    );
    assert_eq!(valid.request.messages[2].content.as_deref(), Some(""));
    assert_eq!(
        valid.request.messages[3].tool_call_id.as_deref(),
        Some("c1")
    );
    assert_rejected(
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
        "messages[0].role",
        "wizard",
    );
    assert_rejected(
        json!({"messages": [{"content": "x"}]}),
        "messages[0].role",
        "required",
    );
    assert_rejected(
        json!({"messages": [{"role": "user"}]}),
        "messages[0].content",
        "required",
    );
}

#[test]
fn array_content_joins_text_parts_and_refuses_images() {
    let valid = accepted(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
    ]}]}));
    assert_eq!(valid.request.messages[0].content.as_deref(), Some("a\nb"));
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}
    ]}]});
    assert_rejected(image, "messages[0].content[0]", "image_url");
}

#[test]
fn temperature_top_p_and_min_p_ranges_are_enforced() {
    assert_rejected(
        json!({"temperature": 2.5}),
        "temperature",
        "between 0 and 2",
    );
    assert_rejected(
        json!({"temperature": -0.1}),
        "temperature",
        "between 0 and 2",
    );
    assert_rejected(json!({"top_p": 0}), "top_p", "(0, 1]");
    assert_rejected(json!({"top_p": 1.5}), "top_p", "(0, 1]");
    assert_rejected(json!({"min_p": 1.5}), "min_p", "between 0 and 1");
    let valid = accepted(json!({"temperature": 0, "top_p": 1, "min_p": 0.05}));
    assert_eq!(valid.request.sampling.temperature, 0.0);
    assert_eq!(valid.request.sampling.min_p, 0.05);
    let near_zero = accepted(json!({"temperature": 0.005}));
    assert_eq!(near_zero.request.sampling.temperature, 0.0);
}

#[test]
fn top_k_minus_one_means_off_and_other_negatives_are_refused() {
    assert_eq!(accepted(json!({"top_k": -1})).request.sampling.top_k, 0);
    assert_eq!(accepted(json!({"top_k": 40})).request.sampling.top_k, 40);
    assert_rejected(json!({"top_k": -2}), "top_k", "-1 (off)");
}

#[test]
fn n_must_be_between_one_and_the_configured_maximum() {
    assert_rejected(json!({"n": 0}), "n", "between 1 and 3");
    assert_rejected(json!({"n": 4}), "n", "between 1 and 3");
    assert_eq!(accepted(json!({"n": 3})).request.n, 3);
}

#[test]
fn penalties_are_bounded_and_repetition_penalty_must_be_positive() {
    assert_rejected(
        json!({"presence_penalty": 2.5}),
        "presence_penalty",
        "between -2 and 2",
    );
    assert_rejected(
        json!({"frequency_penalty": -3}),
        "frequency_penalty",
        "between -2 and 2",
    );
    assert_rejected(
        json!({"repetition_penalty": 0}),
        "repetition_penalty",
        "greater than 0",
    );
    assert_eq!(
        accepted(json!({"repetition_penalty": 1.1}))
            .request
            .sampling
            .repetition_penalty,
        1.1
    );
}

#[test]
fn top_logprobs_is_bounded_and_requires_logprobs() {
    assert_rejected(
        json!({"logprobs": true, "top_logprobs": 21}),
        "top_logprobs",
        "between 0 and 20",
    );
    assert_rejected(
        json!({"top_logprobs": 2}),
        "top_logprobs",
        "requires `logprobs`",
    );
    let s = accepted(json!({"logprobs": true, "top_logprobs": 5}))
        .request
        .sampling;
    assert!(s.logprobs);
    assert_eq!(s.top_logprobs, 5);
}

#[test]
fn max_completion_tokens_is_an_alias_that_wins_and_is_bounded_by_the_context() {
    assert_eq!(
        accepted(json!({"max_tokens": 7}))
            .request
            .sampling
            .max_tokens,
        Some(7)
    );
    let both = accepted(json!({"max_tokens": 7, "max_completion_tokens": 9}));
    assert_eq!(both.request.sampling.max_tokens, Some(9));
    assert_rejected(json!({"max_tokens": 0}), "max_tokens", "between 1 and");
    assert_rejected(
        json!({"max_completion_tokens": 4096}),
        "max_completion_tokens",
        "2048",
    );
    assert_rejected(
        json!({"max_tokens": 5, "min_tokens": 6}),
        "min_tokens",
        "between 0 and 5",
    );
}

#[test]
fn logit_bias_keys_must_be_token_ids_and_values_bounded() {
    let s = accepted(json!({"logit_bias": {"50256": -100, "7": 5.5}}))
        .request
        .sampling;
    assert_eq!(s.logit_bias.get(&50256), Some(&-100.0));
    assert_eq!(s.logit_bias.get(&7), Some(&5.5));
    assert_rejected(
        json!({"logit_bias": {"hello": 1}}),
        "logit_bias",
        "token ids",
    );
    assert_rejected(
        json!({"logit_bias": {"1": 101}}),
        "logit_bias",
        "between -100 and 100",
    );
}

#[test]
fn stop_is_a_string_or_a_list_of_at_most_sixteen() {
    assert_eq!(
        accepted(json!({"stop": "END"})).request.sampling.stop,
        ["END"]
    );
    assert_eq!(
        accepted(json!({"stop": ["a", "", "b"]}))
            .request
            .sampling
            .stop,
        ["a", "b"]
    );
    let many: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    assert_rejected(json!({"stop": many}), "stop", "at most 16");
}

#[test]
fn priority_is_bounded_and_maps_onto_the_job_priority() {
    assert_eq!(accepted(json!({"priority": -5})).priority, -5);
    assert_rejected(
        json!({"priority": 5000}),
        "priority",
        "lower is served first",
    );
}

#[test]
fn stream_options_are_honoured_only_when_streaming() {
    let opts = json!({"include_usage": true, "continuous_usage_stats": true});
    let streamed = accepted(json!({"stream": true, "stream_options": opts.clone()}));
    assert!(streamed.delivery.include_usage && streamed.delivery.continuous_usage);
    let unstreamed = accepted(json!({"stream_options": opts}));
    assert!(!unstreamed.delivery.include_usage);
}

#[test]
fn unsupported_features_are_refused_loudly() {
    assert_rejected(
        json!({"guided_json": {"type": "object"}}),
        "guided_json",
        "not supported",
    );
    accepted(json!({"tools": [], "response_format": {"type": "text"}, "regex": null}));
}

#[path = "constraint_tests.rs"]
mod constraint_tests;

#[test]
fn unknown_fields_and_template_kwargs_are_accepted() {
    let valid = accepted(json!({
        "user": "u", "store": false, "some_future_field": 1,
        "chat_template_kwargs": {"enable_thinking": false}, "reasoning_effort": "low"
    }));
    let kwargs = &valid.request.chat_template_kwargs;
    assert_eq!(kwargs.get("enable_thinking"), Some(&json!(false)));
    assert_eq!(kwargs.get("reasoning_effort"), Some(&json!("low")));
}

#[test]
fn continue_final_message_needs_a_final_assistant_turn() {
    assert_rejected(
        json!({"continue_final_message": true}),
        "continue_final_message",
        "assistant",
    );
    let valid = accepted(json!({"continue_final_message": true, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}
    ]}));
    assert!(valid.request.continue_final_message && !valid.request.add_generation_prompt);
}

fn weather_tool() -> serde_json::Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
}

#[test]
fn tools_reach_the_template_and_the_output_format_names_the_parser() {
    let valid = accepted(json!({"tools": [weather_tool()]}));
    assert_eq!(valid.request.tools, [weather_tool()]);
    assert_eq!(valid.request.output.tool_parser.as_deref(), Some("hermes"));
    assert!(!valid.request.output.single_tool_call);
    assert!(!valid.request.output.legacy_functions);
    // `none`: the model is not to call, so it is not shown the tools either.
    let none = accepted(json!({"tools": [weather_tool()], "tool_choice": "none"}));
    assert!(none.request.tools.is_empty());
    assert_eq!(none.request.output.tool_parser, None);
}

#[test]
fn a_forced_call_is_enforced_by_a_grammar_in_the_models_tool_syntax() {
    let named = accepted(json!({"tools": [weather_tool()],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
    match &named.request.sampling.constraint {
        Some(Constraint::Lark { grammar }) => {
            assert!(grammar.contains("get_weather") && grammar.contains("<tool_call>"))
        }
        other => panic!("expected a Lark constraint, got {other:?}"),
    }
    let required = accepted(json!({"tools": [weather_tool()], "tool_choice": "required"}));
    assert!(required.request.sampling.constraint.is_some());
    let auto = accepted(json!({"tools": [weather_tool()]}));
    assert_eq!(
        auto.request.sampling.constraint, None,
        "auto: the model decides"
    );
    assert_eq!(
        forced_call_grammar(&auto.request.output, auto.tools.as_ref(), None),
        None
    );
}

#[test]
fn a_forced_call_after_reasoning_compiles_for_both_reasoning_syntaxes() {
    let named = accepted(json!({"tools": [weather_tool()], "tool_choice": "required"}));
    for syntax in ["deepseek_r1", "qwen3"] {
        let grammar =
            forced_call_grammar(&named.request.output, named.tools.as_ref(), Some(syntax))
                .expect("a grammar");
        let constraint = Constraint::Lark { grammar };
        assert_eq!(
            fallow_protocol::grammar::check(&constraint),
            Ok(()),
            "{syntax}"
        );
    }
}

#[test]
fn a_forced_call_cannot_be_combined_with_another_constraint() {
    assert_rejected(
        json!({"tools": [weather_tool()], "tool_choice": "required",
               "response_format": {"type": "json_object"}}),
        "tool_choice",
        "cannot be combined",
    );
}

#[test]
fn a_forced_call_whose_parameters_cannot_be_enforced_is_a_400_naming_tools() {
    let tool = json!({"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": true}}}}});
    assert_rejected(
        json!({"tools": [tool], "tool_choice": "required"}),
        "tools",
        "cannot be enforced",
    );
}

#[test]
fn legacy_functions_become_tools_answered_one_call_at_a_time() {
    let valid = accepted(json!({"functions": [{"name": "f"}], "function_call": "auto"}));
    assert_eq!(
        valid.request.tools,
        [json!({"type": "function", "function": {"name": "f"}})]
    );
    assert!(valid.request.output.legacy_functions && valid.request.output.single_tool_call);
    assert_rejected(
        json!({"tools": [weather_tool()], "functions": [{"name": "f"}]}),
        "functions",
        "not both",
    );
    assert_rejected(
        json!({"function_call": "auto"}),
        "function_call",
        "functions",
    );
}

#[test]
fn tool_definitions_are_checked_field_by_field() {
    assert_rejected(json!({"tools": ["x"]}), "tools[0]", "object");
    assert_rejected(
        json!({"tools": [{"function": {"name": "f"}}]}),
        "tools[0].type",
        "required",
    );
    assert_rejected(
        json!({"tools": [{"type": "function"}]}),
        "tools[0].function",
        "required",
    );
    assert_rejected(
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
        "tools[0].function.parameters",
        "JSON Schema",
    );
    assert_rejected(
        json!({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}),
        "tools[0].function.strict",
        "boolean",
    );
    assert_rejected(
        json!({"tools": [weather_tool(), weather_tool()]}),
        "tools[1].function.name",
        "more than once",
    );
    assert_rejected(
        json!({"tools": [weather_tool()], "tool_choice": "sometimes"}),
        "tool_choice",
        "must be",
    );
}

#[test]
fn assistant_tool_calls_and_reasoning_are_kept_for_the_template() {
    let valid = accepted(json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "reasoning": "hmm",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]}));
    let assistant = &valid.request.messages[1];
    assert_eq!(assistant.content, None);
    assert_eq!(assistant.reasoning_content.as_deref(), Some("hmm"));
    assert_eq!(assistant.tool_calls[0].id, "c1");
    assert_eq!(assistant.tool_calls[0].arguments, "{\"a\":1}");
    assert_rejected(
        json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}),
        "messages[0].tool_calls[0].function.name",
        "required",
    );
    assert_rejected(
        json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}),
        "messages[0].tool_calls",
        "only assistant",
    );
}

#[test]
fn reasoning_controls_shape_the_output_format() {
    let thinker = Limits {
        parsers: ModelParsers {
            tool: None,
            reasoning: Some("qwen3".into()),
        },
        ..LIMITS
    };
    let valid = validate_chat(request(json!({"stream_reasoning": false})), &thinker)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        valid.request.output.reasoning_parser.as_deref(),
        Some("qwen3")
    );
    assert!(!valid.request.output.stream_reasoning);
    for off in [
        json!({"separate_reasoning": false}),
        json!({"chat_template_kwargs": {"thinking": false}}),
    ] {
        let valid = validate_chat(request(off), &thinker).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(valid.request.output.reasoning_parser, None);
    }
}

#[test]
fn return_cached_tokens_details_and_no_stop_trim_reach_the_job() {
    let valid = accepted(json!({"return_cached_tokens_details": true, "no_stop_trim": true}));
    assert!(valid.request.output.cached_tokens_details);
    assert!(valid.request.sampling.no_stop_trim);
    let plain = accepted(json!({}));
    assert!(!plain.request.output.cached_tokens_details);
    assert!(!plain.request.sampling.no_stop_trim);
}

#[path = "caps_tests.rs"]
mod caps_tests;

fn harmony_limits() -> Limits {
    Limits {
        parsers: ModelParsers {
            tool: Some("harmony".into()),
            reasoning: Some("harmony".into()),
        },
        ..LIMITS
    }
}

#[test]
fn a_harmony_model_keeps_its_special_tokens_and_its_reasoning_split_even_without_thinking() {
    let limits = harmony_limits();
    let plain = validate_chat(request(json!({})), &limits).expect("valid");
    assert!(!plain.request.sampling.skip_special_tokens);
    assert_eq!(
        plain.request.output.reasoning_parser.as_deref(),
        Some("harmony")
    );
    assert_eq!(plain.request.output.tool_parser, None);
    let off = request(json!({"chat_template_kwargs": {"enable_thinking": false},
                             "reasoning_effort": "high"}));
    let off = validate_chat(off, &limits).expect("valid");
    assert_eq!(
        off.request.output.reasoning_parser.as_deref(),
        Some("harmony")
    );
    assert_eq!(
        off.request.chat_template_kwargs.get("reasoning_effort"),
        Some(&json!("high"))
    );
    let kept = request(json!({"separate_reasoning": false}));
    let kept = validate_chat(kept, &limits).expect("valid");
    assert_eq!(kept.request.output.reasoning_parser, None);
}

#[test]
fn a_harmony_model_gets_openais_other_efforts_as_the_nearest_of_its_three() {
    let limits = harmony_limits();
    for (asked, written) in [("minimal", "low"), ("none", "low"), ("xhigh", "high")] {
        let valid = validate_chat(request(json!({"reasoning_effort": asked})), &limits);
        let valid = valid.expect("valid");
        assert_eq!(
            valid.request.chat_template_kwargs.get("reasoning_effort"),
            Some(&json!(written)),
            "{asked}"
        );
    }
    let refused = validate_chat(request(json!({"reasoning_effort": "extreme"})), &limits);
    let refused = format!("{:?}", refused.err());
    assert!(
        refused.contains("reasoning_effort") && refused.contains("extreme"),
        "an unknown effort must be refused naming it: {refused}"
    );
    // Other models' templates get the client's word as it is.
    let other = validate_chat(request(json!({"reasoning_effort": "minimal"})), &LIMITS);
    assert_eq!(
        other
            .expect("valid")
            .request
            .chat_template_kwargs
            .get("reasoning_effort"),
        Some(&json!("minimal"))
    );
}

#[test]
fn a_forced_harmony_call_is_a_grammar_over_its_special_tokens_that_compiles() {
    let limits = harmony_limits();
    let wire = request(json!({"tools": [weather_tool()], "tool_choice": "required"}));
    let valid = validate_chat(wire, &limits).expect("valid");
    assert_eq!(valid.request.output.tool_parser.as_deref(), Some("harmony"));
    match &valid.request.sampling.constraint {
        Some(constraint @ Constraint::Lark { grammar }) => {
            assert!(grammar.contains("<|channel|> \"commentary to=functions.get_weather \""));
            assert_eq!(fallow_protocol::grammar::check(constraint), Ok(()));
        }
        other => panic!("expected a Lark constraint, got {other:?}"),
    }
}
