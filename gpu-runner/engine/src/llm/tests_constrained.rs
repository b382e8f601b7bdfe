//! Constrained decoding and `stop_regex` through the whole loop, on the fake backend
//! (letters a–z; the Successor rule wants the next letter, and EOS after `z`).

use std::sync::atomic::{AtomicUsize, Ordering};

use fallow_protocol::job::Constraint;

use super::*;

fn regex(pattern: &str) -> Option<Constraint> {
    Some(Constraint::Regex {
        pattern: pattern.into(),
    })
}

fn constrained(max_tokens: u32, constraint: Option<Constraint>) -> Sampling {
    Sampling {
        constraint,
        ..greedy(max_tokens)
    }
}

#[test]
fn a_complete_grammar_ends_the_choice_with_stop() {
    let mut e = engine(Rule::Successor);
    e.add_request(request(1, vec![0], constrained(10, regex("b[a-z]d"))))
        .unwrap();
    let (text, tokens, finish, matched) = choice(&run_all(&mut e), 1, 0);
    assert_eq!(text, "bcd");
    assert_eq!(tokens.len(), 3, "no EOS is needed once nothing can follow");
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(matched, None);
}

#[test]
fn masked_tokens_are_never_sampled_and_eos_comes_when_the_grammar_accepts() {
    let mut e = engine(Rule::Successor);
    // The model wants "bcd…"; only z may follow b, and after z the model wants EOS, which an
    // accepting grammar allows.
    e.add_request(request(1, vec![0], constrained(10, regex("bz+"))))
        .unwrap();
    let (text, tokens, finish, _) = choice(&run_all(&mut e), 1, 0);
    assert_eq!(text, "bz");
    assert_eq!(tokens, vec![1, 25, EOS]);
    assert_eq!(finish, Some(FinishReason::Stop));
}

#[test]
fn max_tokens_cuts_a_constrained_choice_with_length() {
    let mut e = engine(Rule::Successor);
    e.add_request(request(1, vec![0], constrained(3, regex("[a-z]+"))))
        .unwrap();
    let (text, _, finish, _) = choice(&run_all(&mut e), 1, 0);
    assert_eq!(text, "bcd");
    assert_eq!(finish, Some(FinishReason::Length));
}

#[test]
fn each_of_n_sampled_choices_follows_the_grammar_on_its_own() {
    let mut e = engine_with(FakeBackend::new(Rule::HistorySum, 64, 4, 0.5), 8, 32);
    let sampling = Sampling {
        temperature: 1.0,
        seed: Some(7),
        constraint: regex("[aeiou]{3}(x|y)"),
        ..greedy(10)
    };
    let mut r = request(1, vec![0, 1, 2], sampling);
    r.n = 4;
    e.add_request(r).unwrap();
    let outputs = run_all(&mut e);
    let re = regex::Regex::new("^[aeiou]{3}(x|y)$").unwrap();
    let mut texts = Vec::new();
    for index in 0..4 {
        let (text, _, finish, _) = choice(&outputs, 1, index);
        assert!(re.is_match(&text), "choice {index}: {text:?}");
        assert_eq!(finish, Some(FinishReason::Stop));
        texts.push(text);
    }
    texts.dedup();
    assert!(texts.len() > 1, "choices sample independently: {texts:?}");
}

/// A constrained request alone and among many in a crowded pool (chunked prefill,
/// preemption by recompute): the grammar state lives with the choice, so the output is the
/// same.
#[test]
fn a_constrained_choice_survives_preemption_unchanged() {
    let sampling = Sampling {
        temperature: 0.9,
        seed: Some(99),
        constraint: regex("[a-m]{9}[n-z]{9}"),
        ..greedy(20)
    };
    let target = || request(0, (0..11).map(|t| t % 26).collect(), sampling.clone());
    let mut alone = engine_with(FakeBackend::new(Rule::HistorySum, 64, 4, 1.5), 8, 32);
    alone.add_request(target()).unwrap();
    let expected = choice(&run_all(&mut alone), 0, 0);

    let mut crowded = engine_with(FakeBackend::new(Rule::HistorySum, 40, 4, 1.5), 6, 16);
    let mut outputs = Vec::new();
    for id in 1..=16u64 {
        let len = 1 + (id as usize * 7) % 30;
        let prompt = (0..len as u32).map(|t| (t * 3 + id as u32) % 26).collect();
        let mut other = sampling.clone();
        other.seed = Some(id);
        crowded.add_request(request(id, prompt, other)).unwrap();
        if id == 8 {
            crowded.add_request(target()).unwrap();
        }
        outputs.extend(crowded.step().unwrap());
    }
    outputs.extend(run_all(&mut crowded));
    assert!(crowded.stats().preemptions > 0);
    let got = choice(&outputs, 0, 0);
    assert_eq!(got, expected);
    assert!(regex::Regex::new("^[a-m]{9}[n-z]{9}$")
        .unwrap()
        .is_match(&got.0));
}

#[test]
fn a_constraint_that_does_not_compile_is_an_invalid_request() {
    let mut e = engine(Rule::Successor);
    let err = e
        .add_request(request(1, vec![0], constrained(3, regex("(unclosed"))))
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidRequest(_)), "{err:?}");
    assert!(!e.has_work());
}

#[test]
fn stop_regex_ends_the_choice_and_drops_the_unstreamed_match() {
    let mut e = engine(Rule::Successor);
    let mut sampling = greedy(20);
    sampling.stop_regex = vec!["[d-f]{2}".into()];
    e.add_request(request(1, vec![0], sampling)).unwrap();
    let outputs = run_all(&mut e);
    let (text, _, finish, matched) = choice(&outputs, 1, 0);
    // "b", "c", "d" stream; "e" completes the match "de", of which only "e" is unstreamed.
    assert_eq!(text, "bcd");
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(matched, Some(serde_json::json!("[d-f]{2}")));
}

/// On a backend that draws, constrained sequences are drawn there under their grammar's
/// mask (which the backend takes from the step while its forward pass runs), greedy and
/// sampled alike, and produce what the host sampler produces.
#[test]
fn a_drawing_backend_draws_constrained_tokens_under_their_masks_as_the_host_would() {
    let run = |drawing: bool| {
        let drawn = Arc::new(AtomicUsize::new(0));
        let backend = FakeBackend::new(Rule::HistorySum, 64, 4, 0.5);
        let backend = if drawing {
            backend.drawing(&drawn)
        } else {
            backend
        };
        let mut e = engine_with(backend, 8, 32);
        let sampled = Sampling {
            temperature: 1.0,
            seed: Some(11),
            constraint: regex("[aeiou]{3}(x|y)"),
            ..greedy(10)
        };
        e.add_request(request(1, vec![0, 1, 2], sampled)).unwrap();
        e.add_request(request(2, vec![0], constrained(10, regex("bz+"))))
            .unwrap();
        let outputs = run_all(&mut e);
        (
            choice(&outputs, 1, 0),
            choice(&outputs, 2, 0),
            drawn.load(Ordering::Relaxed),
        )
    };
    let (host_sampled, host_greedy, _) = run(false);
    let (sampled, greedy_choice, drawn) = run(true);
    assert!(
        regex::Regex::new("^[aeiou]{3}(x|y)$")
            .unwrap()
            .is_match(&sampled.0),
        "{sampled:?}"
    );
    assert!(
        regex::Regex::new("^bz+$")
            .unwrap()
            .is_match(&greedy_choice.0),
        "{greedy_choice:?}"
    );
    assert_eq!(sampled, host_sampled, "the same draws as on the host");
    assert_eq!(greedy_choice, host_greedy);
    assert_eq!(
        drawn,
        sampled.1.len() + greedy_choice.1.len(),
        "every token of both was drawn by the backend"
    );
}
