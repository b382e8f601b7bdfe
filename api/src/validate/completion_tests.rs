use super::*;
use crate::extract::parse_json_body;
use crate::validate::ModelParsers;
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

fn validate(body: serde_json::Value) -> Result<ValidCompletion, ApiError> {
    let mut full = json!({"model": "m"});
    if let (Some(obj), Some(extra)) = (full.as_object_mut(), body.as_object()) {
        obj.extend(extra.clone());
    }
    let wire: CompletionRequest = match parse_json_body(full.to_string().as_bytes()) {
        Ok(wire) => wire,
        Err(err) => panic!("test body did not parse: {err}"),
    };
    validate_completion(wire, &LIMITS)
}

fn accepted(body: serde_json::Value) -> ValidCompletion {
    validate(body.clone()).unwrap_or_else(|e| panic!("{body} was refused: {e}"))
}

fn refused_param(body: serde_json::Value) -> String {
    match validate(body.clone()) {
        Err(ApiError::InvalidRequest { param: Some(p), .. }) => p,
        other => panic!("{body} was not refused with a param: {other:?}"),
    }
}

#[test]
fn a_string_prompt_is_one_raw_text_job_with_sixteen_max_tokens() {
    let valid = accepted(json!({"prompt": "Hello"}));
    let jobs: Vec<_> = valid.jobs().collect();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(
        job.input,
        Prompt::Text {
            text: "Hello".into()
        }
    );
    assert!(job.messages.is_empty() && !job.add_generation_prompt);
    assert_eq!(job.sampling.max_tokens, Some(16));
    assert_eq!(valid.prompt_texts, vec![Some("Hello".to_string())]);
}

#[test]
fn every_prompt_shape_becomes_one_job_per_prompt_in_order() {
    let tokens = |ids: &[u32]| Prompt::Tokens { ids: ids.to_vec() };
    let inputs = |v: ValidCompletion| v.jobs().map(|j| j.input).collect::<Vec<_>>();
    assert_eq!(
        inputs(accepted(json!({"prompt": [1, 2, 3]}))),
        vec![tokens(&[1, 2, 3])]
    );
    assert_eq!(
        inputs(accepted(json!({"prompt": [[1], [2, 3]]}))),
        vec![tokens(&[1]), tokens(&[2, 3])]
    );
    let strings = accepted(json!({"prompt": ["a", "b"], "n": 2}));
    assert_eq!(strings.n, 2);
    assert_eq!(
        inputs(strings),
        vec![
            Prompt::Text { text: "a".into() },
            Prompt::Text { text: "b".into() }
        ]
    );
}

#[test]
fn malformed_prompts_name_the_offending_element() {
    assert_eq!(refused_param(json!({})), "prompt");
    assert_eq!(refused_param(json!({"prompt": []})), "prompt");
    assert_eq!(refused_param(json!({"prompt": ""})), "prompt");
    assert_eq!(refused_param(json!({"prompt": [1, -2]})), "prompt[1]");
    assert_eq!(refused_param(json!({"prompt": ["a", 3]})), "prompt[1]");
    assert_eq!(refused_param(json!({"prompt": [[1], []]})), "prompt[1]");
    assert_eq!(refused_param(json!({"prompt": {"x": 1}})), "prompt");
}

#[test]
fn suffix_best_of_and_out_of_range_logprobs_are_refused() {
    assert_eq!(
        refused_param(json!({"prompt": "a", "suffix": "b"})),
        "suffix"
    );
    assert_eq!(
        refused_param(json!({"prompt": "a", "best_of": 3})),
        "best_of"
    );
    assert_eq!(
        refused_param(json!({"prompt": "a", "logprobs": 6})),
        "logprobs"
    );
    assert_eq!(
        refused_param(json!({"prompt": "a", "echo": true, "logprobs": 1})),
        "echo"
    );
    assert!(validate(json!({"prompt": "a", "suffix": null, "best_of": 1})).is_ok());
}

#[test]
fn integer_logprobs_turn_on_token_logprobs_with_that_many_alternatives() {
    let valid = accepted(json!({"prompt": "a", "logprobs": 3}));
    assert_eq!(valid.logprobs, Some(3));
    assert!(valid.shared.sampling.logprobs);
    assert_eq!(valid.shared.sampling.top_logprobs, 3);
}

#[test]
fn the_chat_paths_sampling_extras_and_constraints_apply() {
    let valid = accepted(json!({
        "prompt": "a", "max_tokens": 5, "top_k": 4, "min_p": 0.1, "ignore_eos": true,
        "stop_token_ids": [7], "regex": "[0-9]+", "no_stop_trim": true, "stream": true
    }));
    let sampling = &valid.shared.sampling;
    assert_eq!(sampling.max_tokens, Some(5));
    assert_eq!(sampling.top_k, 4);
    assert!(sampling.ignore_eos && sampling.no_stop_trim);
    assert_eq!(sampling.stop_token_ids, vec![7]);
    assert!(sampling.constraint.is_some());
    assert!(valid.delivery.stream && valid.shared.stream);
    assert_eq!(
        refused_param(json!({"prompt": "a", "temperature": 3.0})),
        "temperature"
    );
}

#[test]
fn the_prompts_share_one_request_and_each_job_gets_its_own_prompt() {
    let valid = accepted(json!({"prompt": ["a", "b", "c"], "stop": ["END"], "max_tokens": 5}));
    assert_eq!(valid.prompts.len(), 3);
    assert_eq!(valid.shared.input, Prompt::Messages);
    let jobs: Vec<_> = valid.jobs().collect();
    assert_eq!(jobs.len(), 3);
    for (job, text) in jobs.iter().zip(["a", "b", "c"]) {
        assert_eq!(job.input, Prompt::Text { text: text.into() });
        assert_eq!(job.sampling.stop, ["END"]);
        assert_eq!(job.sampling.max_tokens, Some(5));
    }
}
