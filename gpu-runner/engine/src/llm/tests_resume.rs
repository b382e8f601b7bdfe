//! Resuming a request from an earlier attempt's tokens, on the fake backend: each request
//! runs once uninterrupted, then again in a fresh engine from the first `k` tokens of each
//! choice; the client's view (the first `k` outputs, then the resumed run's) must be the
//! uninterrupted run's, token for token and character for character.

use std::sync::atomic::{AtomicUsize, Ordering};

use fallow_protocol::job::Constraint;

use super::*;

/// Every output of choice `index` of request `id`, in order.
fn outputs_of(outputs: &[SeqOutput], id: u64, index: u32) -> Vec<SeqOutput> {
    outputs
        .iter()
        .filter(|o| o.request_id == id && o.index == index)
        .cloned()
        .collect()
}

/// What a client saw of each choice after `k` steps of it: the first `k` tokens (a choice
/// whose finish is among them is finished).
fn progress_after(outputs: &[SeqOutput], id: u64, n: u32, k: usize) -> Resume {
    let choices = (0..n)
        .map(|index| {
            let seen: Vec<SeqOutput> = outputs_of(outputs, id, index).into_iter().take(k).collect();
            ResumeChoice {
                tokens: seen.iter().flat_map(|o| o.token_ids.clone()).collect(),
                finished: seen.last().is_some_and(|o| o.finish.is_some()),
            }
        })
        .collect();
    Resume { choices }
}

/// Runs `r` uninterrupted, then resumed after `k` tokens per choice in a fresh engine, and
/// checks that the client sees the same tokens, text, finish and usage either way.
fn assert_resumes_identically(new_engine: &dyn Fn() -> LlmEngine, r: &EngineRequest, k: usize) {
    let mut whole = new_engine();
    whole.add_request(r.clone()).unwrap();
    let uninterrupted = run_all(&mut whole);

    let resume = progress_after(&uninterrupted, r.id, r.n, k);
    let mut resumed_engine = new_engine();
    let resumed_request = EngineRequest {
        resume: Some(resume.clone()),
        ..r.clone()
    };
    resumed_engine.add_request(resumed_request).unwrap();
    let resumed = run_all(&mut resumed_engine);

    for index in 0..r.n {
        let before = outputs_of(&uninterrupted, r.id, index);
        let after = outputs_of(&resumed, r.id, index);
        let progress = &resume.choices[index as usize];
        if progress.finished {
            assert!(after.is_empty(), "a finished choice {index} runs again");
            continue;
        }
        let seen = &before[..k.min(before.len())];
        let mut tokens: Vec<u32> = progress.tokens.clone();
        tokens.extend(after.iter().flat_map(|o| o.token_ids.clone()));
        let text: String = seen.iter().chain(&after).map(|o| o.text.as_str()).collect();
        let expected_tokens: Vec<u32> = before.iter().flat_map(|o| o.token_ids.clone()).collect();
        let expected_text: String = before.iter().map(|o| o.text.as_str()).collect();
        assert_eq!(tokens, expected_tokens, "choice {index} resumed after {k}");
        assert_eq!(text, expected_text, "choice {index} resumed after {k}");
        let (last, expected_last) = (after.last().unwrap(), before.last().unwrap());
        assert_eq!(last.finish, expected_last.finish);
        assert_eq!(last.matched_stop, expected_last.matched_stop);
    }
    let total = |outputs: &[SeqOutput]| {
        let usage = outputs.last().unwrap().usage;
        (usage.prompt_tokens, usage.completion_tokens)
    };
    assert_eq!(
        total(&resumed),
        total(&uninterrupted),
        "usage counts the resumed tokens once"
    );
    let stats = resumed_engine.stats();
    assert_eq!((stats.requests, stats.free_blocks), (0, stats.total_blocks));
}

fn history_engine() -> LlmEngine {
    engine_with(FakeBackend::new(Rule::HistorySum, 64, 4, 1.0), 8, 32)
}

fn seeded_with_penalties(max_tokens: u32) -> Sampling {
    Sampling {
        temperature: 1.0,
        top_p: 0.9,
        seed: Some(42),
        repetition_penalty: 1.3,
        frequency_penalty: 0.5,
        presence_penalty: 0.2,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Sampling::default()
    }
}

fn resumed(r: EngineRequest, choices: Vec<ResumeChoice>) -> EngineRequest {
    EngineRequest {
        resume: Some(Resume { choices }),
        ..r
    }
}

fn unfinished(tokens: Vec<u32>) -> ResumeChoice {
    ResumeChoice {
        tokens,
        finished: false,
    }
}

#[test]
fn a_greedy_request_resumed_after_k_tokens_continues_as_if_uninterrupted() {
    let r = request(1, (0..7).collect(), greedy(12));
    for k in [0, 1, 2, 5, 11] {
        assert_resumes_identically(&history_engine, &r, k);
    }
}

#[test]
fn a_seeded_request_with_penalties_resumed_after_k_tokens_draws_the_same_tokens() {
    let r = request(1, (0..7).collect(), seeded_with_penalties(16));
    for k in [1, 3, 8, 15] {
        assert_resumes_identically(&history_engine, &r, k);
    }
}

#[test]
fn a_seeded_request_drawn_by_the_backend_resumes_with_its_rng_where_it_was() {
    let drawn = Arc::new(AtomicUsize::new(0));
    let new_engine = || {
        engine_with(
            FakeBackend::new(Rule::HistorySum, 64, 4, 1.0).drawing(&drawn),
            8,
            32,
        )
    };
    let sampling = Sampling {
        temperature: 0.8,
        seed: Some(5),
        max_tokens: Some(12),
        ..Sampling::default()
    };
    let r = request(1, (3..9).collect(), sampling);
    for k in [1, 6] {
        assert_resumes_identically(&new_engine, &r, k);
    }
    assert!(drawn.load(Ordering::Relaxed) > 0, "the backend drew");
}

#[test]
fn n_seeded_choices_resume_with_finished_ones_left_alone() {
    let sampling = Sampling {
        stop_token_ids: vec![4, 9, 17],
        ..seeded_with_penalties(12)
    };
    let mut r = request(1, (0..9).collect(), sampling);
    r.n = 3;
    let mut whole = history_engine();
    whole.add_request(r.clone()).unwrap();
    let outputs = run_all(&mut whole);
    let lengths: Vec<usize> = (0..3).map(|i| outputs_of(&outputs, 1, i).len()).collect();
    assert_eq!(
        lengths,
        vec![8, 6, 3],
        "the seed ends the choices at different times"
    );
    // After 3 tokens choice 2 has finished; after 6, choices 1 and 2.
    for k in [3, 6] {
        assert_resumes_identically(&history_engine, &r, k);
    }
}

#[test]
fn resumed_choices_all_start_at_once_without_waiting_for_choice_0() {
    let mut r = request(1, (0..9).collect(), greedy(6));
    r.n = 2;
    let mut e = history_engine();
    e.add_request(resumed(
        r,
        vec![unfinished(vec![3]), unfinished(vec![5, 6])],
    ))
    .unwrap();
    assert_eq!(e.stats().waiting, 2, "no choice is held back");
    let first = e.step().unwrap();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|o| o.token_ids.len() == 1));
    assert_eq!(first[0].usage.completion_tokens, 3 + 1);
}

#[test]
fn a_constrained_request_resumed_mid_match_stays_valid_and_identical() {
    let sampling = Sampling {
        constraint: Some(Constraint::Regex {
            pattern: "[a-m]{3,6}z[n-y]+".into(),
        }),
        ..seeded_with_penalties(14)
    };
    let r = request(1, (0..5).collect(), sampling);
    // The seed's run is "bhdimkzr" then EOS, which the grammar allows once it accepts.
    for k in [1, 4, 7, 8] {
        assert_resumes_identically(&history_engine, &r, k);
    }
}

#[test]
fn a_resume_just_before_a_stop_string_stops_at_the_same_place() {
    let mut sampling = greedy(10);
    sampling.stop = vec!["de".into()];
    let r = request(1, vec![0], sampling.clone());
    for k in 1..=3 {
        assert_resumes_identically(&|| engine(Rule::Successor), &r, k);
    }
    // "d" may begin "dx": it is held back, and released by the resumed run.
    sampling.stop = vec!["dx".into()];
    let mut e = engine(Rule::Successor);
    e.add_request(resumed(
        request(1, vec![0], sampling),
        vec![unfinished(vec![1, 2, 3])],
    ))
    .unwrap();
    let outputs = run_all(&mut e);
    assert_eq!(outputs[0].text, "de");
    assert_eq!(outputs[0].token_ids, vec![4]);
}

#[test]
fn a_resume_whose_tokens_already_complete_a_stop_is_refused() {
    let mut sampling = greedy(10);
    sampling.stop = vec!["de".into()];
    let mut e = engine(Rule::Successor);
    let r = resumed(
        request(1, vec![0], sampling),
        vec![unfinished(vec![1, 2, 3, 4])],
    );
    let err = e.add_request(r).unwrap_err();
    assert_eq!(err.code(), "invalid_request");
    assert!(err.to_string().contains("does not match"), "{err}");
    let eos = resumed(
        request(2, vec![23], greedy(10)),
        vec![unfinished(vec![24, 25, EOS])],
    );
    let err = e.add_request(eos).unwrap_err();
    assert!(err.to_string().contains("would have ended"), "{err}");
}

#[test]
fn a_resume_the_grammar_forbids_is_refused_and_leaves_nothing_behind() {
    let sampling = Sampling {
        constraint: Some(Constraint::Regex {
            pattern: "[a-c]+".into(),
        }),
        ..greedy(6)
    };
    let mut r = request(1, vec![0], sampling);
    r.n = 2;
    let mut e = engine(Rule::Successor);
    let err = e
        .add_request(resumed(
            r,
            vec![unfinished(vec![1, 2]), unfinished(vec![1, 3])],
        ))
        .unwrap_err();
    assert!(
        err.to_string().contains("not allowed by the constraint"),
        "{err}"
    );
    let stats = e.stats();
    assert_eq!((stats.requests, stats.waiting), (0, 0));
    assert_eq!(stats.free_blocks, stats.total_blocks);
    assert!(!e.has_work());
}

#[test]
fn bad_resumes_are_refused_with_clear_errors() {
    let mut e = engine(Rule::Successor);
    let refuse = |e: &mut LlmEngine, r: EngineRequest, needle: &str| {
        let err = e.add_request(r).unwrap_err();
        assert_eq!(err.code(), "invalid_request", "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    };
    let mut two = request(1, vec![0], greedy(5));
    two.n = 2;
    refuse(
        &mut e,
        resumed(two.clone(), vec![unfinished(vec![1])]),
        "progress for 1 choices but the request has n = 2",
    );
    refuse(
        &mut e,
        resumed(
            request(1, vec![0], greedy(5)),
            vec![unfinished(vec![1, VOCAB as u32])],
        ),
        "outside the vocabulary",
    );
    refuse(
        &mut e,
        resumed(
            request(1, vec![0], greedy(2)),
            vec![unfinished(vec![1, 2, 3])],
        ),
        "more than max_tokens (2)",
    );
    refuse(
        &mut e,
        resumed(request(1, vec![0], greedy(2)), vec![unfinished(vec![1, 2])]),
        "would have ended",
    );
    let done = ResumeChoice {
        tokens: vec![1],
        finished: true,
    };
    refuse(
        &mut e,
        resumed(two, vec![done.clone(), done]),
        "every choice has already finished",
    );
    let mut hidden = greedy(5);
    hidden.return_hidden_states = true;
    refuse(
        &mut e,
        resumed(request(1, vec![0], hidden), vec![unfinished(vec![1])]),
        "hidden states of resumed tokens are not kept",
    );
    assert_eq!(e.stats().requests, 0);
}
