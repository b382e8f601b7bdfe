//! Hostile input, generated: thousands of mutated chat, completions and responses bodies,
//! and their bytes cut and flipped, go through the body parser and the validators. Every one
//! must end in an answer or a 4xx, never a panic or a 5xx. Bounded and seeded, so a failure
//! names the case that reproduces it.

use super::responses::validate_response;
use super::*;
use crate::extract::parse_json_body;
use crate::hostile_input::{chat_seed, completion_seed, mangle_bytes, mutate, response_seed, Rng};
use crate::openai::completions::CompletionRequest;
use crate::openai::responses::CreateResponseRequest;

const CASES: u64 = 3000;

const LIMITS: Limits = Limits {
    max_messages: 64,
    max_n: 8,
    context_length: 2048,
    parsers: ModelParsers {
        tool: None,
        reasoning: None,
    },
};

/// A refusal must be the client's fault: a 4xx, never a 5xx.
fn assert_client_error(err: &ApiError, case: u64, body: &[u8]) {
    let (status, _) = err.status_and_body();
    assert!(
        status.is_client_error(),
        "case {case}: {status} for {}: {err:?}",
        String::from_utf8_lossy(body)
    );
}

/// Runs `check` on `CASES` mutations of `seed` and as many mangled byte strings of it.
fn hammer(seed: Value, salt: u64, check: impl Fn(&[u8]) -> Result<(), ApiError>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ salt);
    let seed_bytes = seed.to_string().into_bytes();
    if let Err(err) = check(&seed_bytes) {
        panic!("the seed itself is refused: {err:?}");
    }
    let mut accepted = 0;
    for case in 0..CASES {
        let body = if case % 2 == 0 {
            mutate(&mut rng, &seed).to_string().into_bytes()
        } else {
            mangle_bytes(&mut rng, &seed_bytes)
        };
        match check(&body) {
            Ok(()) => accepted += 1,
            Err(err) => assert_client_error(&err, case, &body),
        }
    }
    // Both outcomes happen: the edits reach past the parser into the validators.
    assert!(
        CASES / 20 < accepted && accepted < CASES / 2,
        "{accepted} of {CASES} accepted"
    );
}

#[test]
fn thousands_of_mutated_chat_bodies_end_in_an_answer_or_a_4xx() {
    hammer(chat_seed(), 1, |body| {
        let wire: ChatCompletionRequest = parse_json_body(body)?;
        validate_chat(wire, &LIMITS).map(|_| ())
    });
}

#[test]
fn thousands_of_mutated_completions_bodies_end_in_an_answer_or_a_4xx() {
    hammer(completion_seed(), 2, |body| {
        let wire: CompletionRequest = parse_json_body(body)?;
        completion::validate_completion(wire, &LIMITS).map(|_| ())
    });
}

#[test]
fn thousands_of_mutated_responses_bodies_end_in_an_answer_or_a_4xx() {
    hammer(response_seed(), 3, |body| {
        let wire: CreateResponseRequest = parse_json_body(body)?;
        validate_response(wire, Vec::new(), &LIMITS, 0).map(|_| ())
    });
}
