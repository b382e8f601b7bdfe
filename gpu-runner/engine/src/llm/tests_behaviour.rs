use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn greedy_generation_streams_text_until_max_tokens() {
    let mut e = engine(Rule::Successor);
    e.add_request(request(1, vec![0], greedy(3))).unwrap();
    let outputs = run_all(&mut e);
    let (text, tokens, finish, _) = choice(&outputs, 1, 0);
    assert_eq!(text, "bcd");
    assert_eq!(tokens, vec![1, 2, 3]);
    assert_eq!(finish, Some(FinishReason::Length));
    let usage = outputs.last().unwrap().usage;
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (1, 3));
}

#[test]
fn eos_stops_the_choice_without_adding_text() {
    let mut e = engine(Rule::Successor);
    e.add_request(request(1, vec![23], greedy(10))).unwrap();
    let outputs = run_all(&mut e);
    let (text, tokens, finish, matched) = choice(&outputs, 1, 0);
    assert_eq!(text, "yz");
    assert_eq!(tokens, vec![24, 25, EOS]);
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(matched, None);
    assert_eq!(outputs.last().unwrap().usage.completion_tokens, 3);
}

#[test]
fn a_stop_string_across_tokens_is_held_back_and_trimmed() {
    let mut e = engine(Rule::Successor);
    let mut sampling = greedy(10);
    sampling.stop = vec!["cd".into()];
    e.add_request(request(1, vec![0], sampling)).unwrap();
    let outputs = run_all(&mut e);
    let texts: Vec<&str> = outputs.iter().map(|o| o.text.as_str()).collect();
    assert_eq!(
        texts,
        vec!["b", "", ""],
        "'c' is held until 'd' proves the match"
    );
    let (_, _, finish, matched) = choice(&outputs, 1, 0);
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(matched, Some(serde_json::json!("cd")));
}

#[test]
fn no_stop_trim_keeps_the_matched_stop_string_in_the_text() {
    let mut e = engine(Rule::Successor);
    let mut sampling = greedy(10);
    sampling.stop = vec!["cd".into()];
    sampling.no_stop_trim = true;
    e.add_request(request(1, vec![0], sampling)).unwrap();
    let (text, _, finish, matched) = choice(&run_all(&mut e), 1, 0);
    assert_eq!(text, "bcd");
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(matched, Some(serde_json::json!("cd")));
}

#[test]
fn a_stop_token_id_is_reported_as_the_match() {
    let mut e = engine(Rule::Successor);
    let mut sampling = greedy(10);
    sampling.stop_token_ids = vec![3];
    e.add_request(request(1, vec![0], sampling)).unwrap();
    let (text, _, finish, matched) = choice(&run_all(&mut e), 1, 0);
    assert_eq!(text, "bc");
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(matched, Some(serde_json::json!(3)));
}

#[test]
fn min_tokens_keeps_generating_past_eos() {
    let mut e = engine(Rule::Successor);
    let mut sampling = greedy(4);
    sampling.min_tokens = 4;
    e.add_request(request(1, vec![24], sampling)).unwrap();
    let (_, tokens, finish, _) = choice(&run_all(&mut e), 1, 0);
    assert!(!tokens.contains(&EOS));
    assert_eq!(tokens.len(), 4);
    assert_eq!(finish, Some(FinishReason::Length));
}

#[test]
fn logprobs_come_with_each_token() {
    let mut e = engine(Rule::Successor);
    let mut sampling = greedy(2);
    sampling.logprobs = true;
    sampling.top_logprobs = 2;
    e.add_request(request(1, vec![0], sampling)).unwrap();
    let outputs = run_all(&mut e);
    let lp = outputs[0].logprobs.as_ref().unwrap();
    assert_eq!(lp.len(), 1);
    assert_eq!(lp[0].token, "b");
    assert_eq!(lp[0].bytes, b"b".to_vec());
    assert!(lp[0].logprob < 0.0 && lp[0].logprob > -0.01);
    assert_eq!(lp[0].top_logprobs.len(), 2);
    assert_eq!(lp[0].top_logprobs[0].token, "b");
}

#[test]
fn invalid_requests_are_rejected_with_clear_errors() {
    let mut e = engine(Rule::Successor);
    let err = e.add_request(request(1, vec![], greedy(1))).unwrap_err();
    assert_eq!(err.code(), "invalid_request");
    let err = e.add_request(request(1, vec![99], greedy(1))).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    let err = e
        .add_request(request(1, vec![0; 250], greedy(10)))
        .unwrap_err();
    assert_eq!(err.code(), "context_length_exceeded");
    let mut n0 = request(1, vec![0], greedy(1));
    n0.n = 0;
    assert_eq!(e.add_request(n0).unwrap_err().code(), "invalid_request");
    let mut huge = request(1, vec![0], greedy(1));
    huge.n = u32::MAX;
    assert!(e
        .add_request(huge)
        .unwrap_err()
        .to_string()
        .contains("n must be"));
    e.add_request(request(1, vec![0], greedy(1))).unwrap();
    let err = e.add_request(request(1, vec![0], greedy(1))).unwrap_err();
    assert_eq!(err.code(), "duplicate_request");
}

#[test]
fn a_request_without_max_tokens_is_capped_by_the_kv_pool() {
    // 8 blocks of 4 = 32 positions < the 256-token context.
    let mut e = engine_with(FakeBackend::new(Rule::HistorySum, 8, 4, 10.0), 4, 64);
    let sampling = Sampling {
        temperature: 0.0,
        ..Sampling::default()
    };
    e.add_request(request(1, vec![0; 10], sampling)).unwrap();
    let (_, tokens, finish, _) = choice(&run_all(&mut e), 1, 0);
    assert_eq!(tokens.len(), 23, "10 + 23 − 1 = 32 positions");
    assert_eq!(finish, Some(FinishReason::Length));
}

#[test]
fn max_length_bounds_the_prompt_and_the_completion_together() {
    let mut e = engine(Rule::HistorySum);
    let capped = |max_tokens: Option<u32>| Sampling {
        temperature: 0.0,
        ignore_eos: true,
        max_tokens,
        max_length: Some(30),
        ..Sampling::default()
    };
    e.add_request(request(1, vec![1; 22], capped(None)))
        .unwrap();
    e.add_request(request(2, vec![1; 22], capped(Some(50))))
        .unwrap();
    e.add_request(request(3, vec![1; 22], capped(Some(3))))
        .unwrap();
    let outputs = run_all(&mut e);
    for (id, expected) in [(1, 8), (2, 8), (3, 3)] {
        let (_, tokens, finish, _) = choice(&outputs, id, 0);
        assert_eq!(tokens.len(), expected, "request {id}");
        assert_eq!(finish, Some(FinishReason::Length), "request {id}");
    }
}

#[test]
fn a_prompt_that_fills_max_length_is_refused_for_its_input() {
    let mut e = engine(Rule::HistorySum);
    let sampling = Sampling {
        max_length: Some(30),
        ..Sampling::default()
    };
    let err = e
        .add_request(request(1, vec![1; 30], sampling))
        .unwrap_err();
    assert_eq!(err.code(), "invalid_request");
    assert!(err.to_string().contains("max_length"), "{err}");
}

#[test]
fn aborting_frees_blocks_at_once() {
    let mut e = engine(Rule::HistorySum);
    e.add_request(request(1, vec![1; 20], greedy(50))).unwrap();
    e.step().unwrap();
    assert!(e.stats().free_blocks < e.stats().total_blocks);
    e.abort(1);
    e.abort(1);
    let stats = e.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
    assert_eq!((stats.running, stats.waiting, stats.requests), (0, 0, 0));
    assert!(!e.has_work());
}

#[test]
fn n_choices_share_the_prompt_and_sum_their_usage() {
    let mut e = engine_with(FakeBackend::new(Rule::HistorySum, 64, 4, 1.0), 8, 64);
    let mut r = request(
        1,
        (0..13).collect(),
        Sampling {
            temperature: 1.0,
            seed: Some(11),
            max_tokens: Some(6),
            ignore_eos: true,
            ..Sampling::default()
        },
    );
    r.n = 3;
    e.add_request(r).unwrap();
    let mut outputs = e.step().unwrap();
    assert_eq!(outputs.len(), 1, "choice 0 runs the prompt alone");
    outputs.extend(e.step().unwrap());
    for fork in [1, 2] {
        // 13 prompt tokens = 3 full blocks of 4 shared, 1 recomputed.
        assert_eq!(e.batcher.cached_prompt_tokens(fork), Some(12));
    }
    outputs.extend(run_all(&mut e));
    let choices: Vec<_> = (0..3).map(|i| choice(&outputs, 1, i).1).collect();
    assert!(choices.iter().all(|t| t.len() == 6));
    assert!(
        choices[0] != choices[1] || choices[1] != choices[2],
        "seeds differ per choice: {choices:?}"
    );
    assert_eq!(outputs.last().unwrap().usage.completion_tokens, 18);
    let stats = e.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
}

/// Greedy and seeded outputs of one request, alone and among 16 others with mixed
/// prompt lengths, a small token budget (chunked prefill) and a small pool (preemption),
/// and seeded ones alike whether the host or the backend draws them.
#[test]
fn outputs_do_not_depend_on_batch_composition() {
    let target = |sampling: Sampling| request(0, (0..11).map(|t| t % 26).collect(), sampling);
    let seeded = Sampling {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(1234),
        max_tokens: Some(20),
        ..Sampling::default()
    };
    let drawn = Arc::new(AtomicUsize::new(0));
    // The seeded request once more on a backend that draws sampled tokens itself.
    let backends: [fn(usize, &Arc<AtomicUsize>) -> FakeBackend; 2] = [
        |blocks, _| FakeBackend::new(Rule::HistorySum, blocks, 4, 1.5),
        |blocks, counter| FakeBackend::new(Rule::HistorySum, blocks, 4, 1.5).drawing(counter),
    ];
    let cases = [
        (greedy(20), backends[0]),
        (seeded.clone(), backends[0]),
        (seeded, backends[1]),
    ];
    let mut alone_tokens = Vec::new();
    for (sampling, backend) in cases {
        let mut alone = engine_with(backend(64, &drawn), 8, 32);
        alone.add_request(target(sampling.clone())).unwrap();
        let expected = choice(&run_all(&mut alone), 0, 0).1;
        alone_tokens.push(expected.clone());

        let mut crowded = engine_with(backend(40, &drawn), 6, 16);
        let mut outputs = Vec::new();
        for id in 1..=16u64 {
            let len = 1 + (id as usize * 7) % 30;
            let prompt = (0..len as u32).map(|t| (t * 3 + id as u32) % 26).collect();
            let mut other = sampling.clone();
            other.seed = Some(id);
            crowded.add_request(request(id, prompt, other)).unwrap();
            if id == 8 {
                crowded.add_request(target(sampling.clone())).unwrap();
            }
            outputs.extend(crowded.step().unwrap());
        }
        outputs.extend(run_all(&mut crowded));
        assert_eq!(choice(&outputs, 0, 0).1, expected);
        let stats = crowded.stats();
        assert!(stats.preemptions > 0, "the crowded pool forced preemptions");
        assert_eq!(stats.free_blocks, stats.total_blocks);
    }
    assert!(
        drawn.load(Ordering::Relaxed) >= 2 * 20,
        "the drawing backend drew the sampled tokens"
    );
    // One definition of a draw (`TokenDraw`): the same seed gives the same tokens whether
    // the host sampler draws them or the backend does.
    assert_eq!(alone_tokens[1], alone_tokens[2]);
}

/// On a backend that draws, only sequences whose draw needs nothing but the raw logits are
/// sent as draws (logprobs come back with them); the others still get their logits (here:
/// a logit bias).
#[test]
fn a_drawing_backend_draws_only_what_needs_no_processing_on_the_host() {
    let drawn = Arc::new(AtomicUsize::new(0));
    let mut e = engine_with(
        FakeBackend::new(Rule::Successor, 64, 4, 10.0).drawing(&drawn),
        8,
        32,
    );
    let sampled = Sampling {
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(5),
        ..Sampling::default()
    };
    let with_logprobs = Sampling {
        logprobs: true,
        ..sampled.clone()
    };
    let mut biased = sampled.clone();
    biased.logit_bias.insert(3, -100.0);
    e.add_request(request(1, vec![0, 1], with_logprobs))
        .unwrap();
    e.add_request(request(2, vec![5, 6], biased)).unwrap();
    let outputs = run_all(&mut e);
    assert_eq!(
        drawn.load(Ordering::Relaxed),
        5,
        "the logprobs request was drawn remotely, the biased one not"
    );
    assert!(outputs
        .iter()
        .filter(|o| o.request_id == 1)
        .all(|o| o.logprobs.is_some()));
    e.add_request(request(3, vec![10, 11], sampled)).unwrap();
    let outputs = run_all(&mut e);
    assert_eq!(
        drawn.load(Ordering::Relaxed),
        10,
        "one draw per generated token"
    );
    // A peak of 10 over 27 other tokens: the successor, almost surely.
    assert_eq!(choice(&outputs, 3, 0).1, vec![12, 13, 14, 15, 16]);
}

#[test]
fn a_repeated_prompt_reports_cached_tokens() {
    let mut e = engine(Rule::HistorySum);
    let prompt: Vec<u32> = (0..10).collect();
    e.add_request(request(1, prompt.clone(), greedy(2)))
        .unwrap();
    let first = run_all(&mut e);
    e.add_request(request(2, prompt, greedy(2))).unwrap();
    let second = run_all(&mut e);
    assert_eq!(first.last().unwrap().usage.cached_tokens, 0);
    assert_eq!(
        second.last().unwrap().usage.cached_tokens,
        8,
        "two full blocks of 4"
    );
    assert_eq!(choice(&first, 1, 0).1, choice(&second, 2, 0).1);
}

#[test]
fn aborting_a_request_with_held_back_choices_frees_everything() {
    let mut e = engine(Rule::HistorySum);
    let mut r = request(1, (0..9).collect(), greedy(5));
    r.n = 4;
    e.add_request(r).unwrap();
    assert_eq!(
        e.stats().waiting,
        4,
        "choice 0 waits to run, three are held back"
    );
    e.abort(1);
    let stats = e.stats();
    assert_eq!((stats.waiting, stats.requests), (0, 0));
    assert_eq!(stats.free_blocks, stats.total_blocks);
    assert!(e.step().unwrap().is_empty());
}
