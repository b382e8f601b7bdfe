use super::*;

const EOS: u32 = 9;

fn params() -> Sampling {
    Sampling {
        temperature: 0.0,
        ..Sampling::default()
    }
}

fn seq(params: &Sampling) -> SeqSampler {
    SeqSampler::new(params.clone(), 0, &[1, 2, 3], &[EOS])
}

/// A peaked row: token `best` has the largest logit, the others decline by id distance.
fn row(best: u32) -> Vec<f32> {
    (0..10u32).map(|t| -(t.abs_diff(best) as f32)).collect()
}

fn draw_many(params: &Sampling, index: u32, logits: &[f32], count: usize) -> Vec<u32> {
    let mut sampler = Sampler::new();
    let mut s = SeqSampler::new(params.clone(), index, &[], &[EOS]);
    (0..count)
        .map(|_| sampler.sample(logits, &mut s).token)
        .collect()
}

#[test]
fn greedy_picks_the_arg_max() {
    let mut sampler = Sampler::new();
    let mut s = seq(&params());
    assert_eq!(sampler.sample(&row(4), &mut s).token, 4);
    assert_eq!(s.num_generated(), 1);
}

#[test]
fn a_tiny_temperature_is_greedy() {
    let p = Sampling {
        temperature: 1e-6,
        seed: Some(1),
        ..Sampling::default()
    };
    assert!(draw_many(&p, 0, &row(6), 50).iter().all(|&t| t == 6));
}

#[test]
fn top_k_of_one_is_greedy() {
    let p = Sampling {
        temperature: 5.0,
        top_k: 1,
        seed: Some(3),
        ..Sampling::default()
    };
    assert!(draw_many(&p, 0, &row(2), 100).iter().all(|&t| t == 2));
}

#[test]
fn a_tight_top_p_keeps_only_the_head() {
    let p = Sampling {
        temperature: 1.0,
        top_p: 0.01,
        seed: Some(3),
        ..Sampling::default()
    };
    assert!(draw_many(&p, 0, &row(7), 100).iter().all(|&t| t == 7));
}

#[test]
fn min_p_drops_unlikely_tokens() {
    let p = Sampling {
        temperature: 1.0,
        min_p: 0.3, // e^-1 ≈ 0.37 survives, e^-2 ≈ 0.14 does not
        seed: Some(5),
        ..Sampling::default()
    };
    let tokens = draw_many(&p, 0, &row(5), 300);
    assert!(tokens.iter().all(|&t| (4..=6).contains(&t)));
    assert!(tokens.contains(&4) && tokens.contains(&6));
}

#[test]
fn seeded_sampling_repeats_and_choices_differ() {
    let p = Sampling {
        temperature: 1.0,
        seed: Some(42),
        ..Sampling::default()
    };
    let flat = vec![0.0f32; 10];
    let first = draw_many(&p, 0, &flat, 64);
    assert_eq!(first, draw_many(&p, 0, &flat, 64));
    assert_ne!(
        first,
        draw_many(&p, 1, &flat, 64),
        "choice index offsets the seed"
    );
}

#[test]
fn seeded_sampling_does_not_depend_on_other_sequences_in_the_batch() {
    let p = Sampling {
        temperature: 0.8,
        seed: Some(7),
        ..Sampling::default()
    };
    let flat = vec![0.5f32; 10];
    let alone = draw_many(&p, 0, &flat, 32);
    // Interleave with another sequence sharing the same Sampler, as a batch would.
    let mut sampler = Sampler::new();
    let mut ours = SeqSampler::new(p.clone(), 0, &[], &[EOS]);
    let other_params = Sampling {
        temperature: 1.3,
        top_k: 3,
        ..Sampling::default()
    };
    let mut other = SeqSampler::new(other_params.clone(), 0, &[], &[EOS]);
    let mixed: Vec<u32> = (0..32)
        .map(|_| {
            sampler.sample(&row(3), &mut other);
            sampler.sample(&flat, &mut ours).token
        })
        .collect();
    assert_eq!(alone, mixed);
}

#[test]
fn logit_bias_forces_a_token() {
    let mut p = params();
    p.logit_bias.insert(0, 100.0);
    let mut sampler = Sampler::new();
    assert_eq!(sampler.sample(&row(5), &mut seq(&p)).token, 0);
}

#[test]
fn min_tokens_suppresses_eos_and_stop_ids_until_reached() {
    let mut p = params();
    p.min_tokens = 2;
    p.stop_token_ids = vec![8];
    let mut sampler = Sampler::new();
    let mut s = seq(&p);
    let eos_row = row(EOS);
    assert_ne!(sampler.sample(&eos_row, &mut s).token, EOS);
    let stop_row = row(8);
    assert_ne!(sampler.sample(&stop_row, &mut s).token, 8);
    assert_eq!(
        sampler.sample(&eos_row, &mut s).token,
        EOS,
        "allowed from the third token"
    );
}

#[test]
fn ignore_eos_leaves_eos_alone_under_min_tokens() {
    let mut p = params();
    p.min_tokens = 5;
    p.ignore_eos = true;
    let mut sampler = Sampler::new();
    assert_eq!(sampler.sample(&row(EOS), &mut seq(&p)).token, EOS);
}

#[test]
fn frequency_and_presence_penalties_push_repeated_tokens_down() {
    let mut p = params();
    p.frequency_penalty = 0.6;
    let mut sampler = Sampler::new();
    let mut s = seq(&p);
    // 4 leads 5 by 0.5: after one use the frequency penalty (0.6) flips them.
    let mut logits = vec![0.0f32; 10];
    logits[4] = 2.0;
    logits[5] = 1.5;
    assert_eq!(sampler.sample(&logits, &mut s).token, 4);
    assert_eq!(sampler.sample(&logits, &mut s).token, 5);
    let mut p = params();
    p.presence_penalty = 0.6;
    let mut s = seq(&p);
    assert_eq!(sampler.sample(&logits, &mut s).token, 4);
    assert_eq!(sampler.sample(&logits, &mut s).token, 5);
}

#[test]
fn repetition_penalty_covers_prompt_tokens() {
    let mut p = params();
    p.repetition_penalty = 2.0;
    let mut sampler = Sampler::new();
    let mut s = SeqSampler::new(p.clone(), 0, &[4], &[EOS]); // 4 is in the prompt
    let mut logits = vec![0.0f32; 10];
    logits[4] = 2.0; // → 1.0
    logits[5] = 1.5;
    assert_eq!(sampler.sample(&logits, &mut s).token, 5);
}

#[test]
fn logprobs_report_the_processed_distribution_with_top_alternatives() {
    let mut p = params();
    p.logprobs = true;
    p.top_logprobs = 3;
    let mut sampler = Sampler::new();
    let logits = row(2);
    let out = sampler.sample(&logits, &mut seq(&p));
    let norm: f32 = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
    let lp = out.logprob.unwrap();
    assert!((lp - (0.0 - norm)).abs() < 1e-5);
    let ids: Vec<u32> = out.top.iter().map(|&(t, _)| t).collect();
    assert_eq!(ids, vec![2, 1, 3], "best first, ties to the lower id");
    assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
}

#[test]
fn impossible_tokens_report_a_finite_logprob() {
    let mut p = params();
    p.logprobs = true;
    p.top_logprobs = 20;
    let mut logits = vec![f32::NEG_INFINITY; 4];
    logits[1] = 0.0;
    let out = Sampler::new().sample(&logits, &mut seq(&p));
    assert_eq!(out.token, 1);
    assert_eq!(out.top.len(), 4);
    assert_eq!(out.top[3].1, MIN_LOGPROB);
}

#[test]
fn nan_logits_never_win() {
    let mut logits = row(3);
    logits[0] = f32::NAN;
    assert_eq!(Sampler::new().sample(&logits, &mut seq(&params())).token, 3);
}

#[test]
fn top_p_over_a_large_vocabulary_keeps_exactly_the_nucleus() {
    // 5000 tokens: two share most of the mass, the long tail must never be drawn.
    let mut logits = vec![0.0f32; 5000];
    logits[1234] = 12.0;
    logits[4321] = 12.0;
    let p = Sampling {
        temperature: 1.0,
        top_p: 0.9,
        seed: Some(9),
        ..Sampling::default()
    };
    let tokens = draw_many(&p, 0, &logits, 200);
    assert!(tokens.iter().all(|&t| t == 1234 || t == 4321));
    assert!(tokens.contains(&1234) && tokens.contains(&4321));
}

#[test]
fn an_unrestricted_draw_follows_the_distribution() {
    // Token 1 has weight e^ln3 = 3 against token 0's 1: about 75 % of draws.
    let logits = [0.0f32, 3.0f32.ln()];
    let p = Sampling {
        temperature: 1.0,
        seed: Some(17),
        ..Sampling::default()
    };
    let ones = draw_many(&p, 0, &logits, 4000)
        .iter()
        .filter(|&&t| t == 1)
        .count();
    assert!((2800..3200).contains(&ones), "{ones} of 4000");
}

#[test]
fn only_plain_greedy_sequences_can_take_their_token_from_the_device() {
    assert!(seq(&params()).only_needs_argmax());
    let with = |f: fn(&mut Sampling)| {
        let mut p = params();
        f(&mut p);
        seq(&p).only_needs_argmax()
    };
    assert!(!with(|p| p.temperature = 0.7), "sampling needs the row");
    assert!(!with(|p| p.logprobs = true), "logprobs need the row");
    assert!(!with(|p| {
        p.logit_bias.insert(3, 1.0);
    }));
    assert!(!with(|p| p.repetition_penalty = 1.1));
    assert!(!with(|p| p.frequency_penalty = 0.5));
    assert!(!with(|p| p.presence_penalty = 0.5));
    assert!(
        with(|p| p.repetition_penalty = 1.0),
        "a neutral penalty changes nothing"
    );
    // min_tokens masks the end-of-sequence token until enough were generated.
    let mut p = params();
    p.min_tokens = 1;
    let mut s = seq(&p);
    assert!(!s.only_needs_argmax());
    Sampler::new().take_picked(
        &Sampled {
            token: 4,
            logprob: None,
            top: Vec::new(),
        },
        &mut s,
    );
    assert!(s.only_needs_argmax());
}

#[test]
fn sampled_sequences_with_untouched_logits_can_be_drawn_elsewhere_with_their_own_rng() {
    let sampled = Sampling {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.05,
        seed: Some(99),
        ..params()
    };
    let draw = seq(&sampled)
        .remote_draw()
        .expect("a plain sampled sequence");
    assert_eq!(
        (draw.temperature, draw.top_k, draw.top_p, draw.min_p),
        (0.8, 20, 0.9, 0.05)
    );
    assert!((0.0..1.0).contains(&draw.u));
    // The same seed draws the same uniform numbers, one per token.
    let (mut a, mut b) = (seq(&sampled), seq(&sampled));
    let us = |s: &mut SeqSampler| -> Vec<f32> {
        (0..4)
            .map(|_| s.remote_draw().map_or(-1.0, |d| d.u))
            .collect()
    };
    let first = us(&mut a);
    assert_eq!(first, us(&mut b));
    assert!(first.windows(2).all(|w| w[0] != w[1]));
    let with = |f: fn(&mut Sampling)| {
        let mut p = sampled.clone();
        f(&mut p);
        seq(&p).remote_draw().is_some()
    };
    assert!(!with(|p| p.temperature = 0.0), "greedy goes by argmax");
    let logprobs = Sampling {
        logprobs: true,
        top_logprobs: 50,
        ..sampled.clone()
    };
    assert_eq!(
        seq(&logprobs).remote_draw().and_then(|d| d.logprobs),
        Some(20),
        "logprobs come along, at most 20 alternatives"
    );
    let greedy_logprobs = Sampling {
        temperature: 0.0,
        ..logprobs.clone()
    };
    let d = seq(&greedy_logprobs)
        .remote_draw()
        .expect("greedy with logprobs");
    assert_eq!((d.temperature, d.u), (0.0, 0.0));
    assert!(!with(|p| {
        p.logit_bias.insert(3, 1.0);
    }));
    assert!(!with(|p| p.presence_penalty = 0.5));
}

#[test]
fn a_grammar_mask_leaves_only_allowed_tokens_to_sample() {
    let p = Sampling {
        temperature: 5.0,
        seed: Some(1),
        logprobs: true,
        top_logprobs: 5,
        ..Sampling::default()
    };
    let mut sampler = Sampler::new();
    let mut s = SeqSampler::new(p.clone(), 0, &[], &[EOS]);
    // Tokens 2 and 7 allowed; the row prefers 4.
    let allowed = [(1u32 << 2) | (1 << 7)];
    for _ in 0..50 {
        let out = sampler.sample_constrained(&row(4), &mut s, Some(&allowed));
        assert!(out.token == 2 || out.token == 7, "{}", out.token);
        // Logprobs are the constrained distribution: the two allowed tokens hold all mass.
        let mass: f32 = out
            .top
            .iter()
            .filter(|(_, lp)| *lp > MIN_LOGPROB)
            .map(|(_, lp)| lp.exp())
            .sum();
        assert!((mass - 1.0).abs() < 1e-4, "{:?}", out.top);
    }
}

#[test]
fn ids_past_the_mask_are_disallowed() {
    let mut sampler = Sampler::new();
    let mut s = seq(&params());
    // A mask of one word covers ids 0..32; a 40-token row's best id 35 is outside it.
    let logits: Vec<f32> = (0..40).map(|t| if t == 35 { 10.0 } else { 0.0 }).collect();
    let out = sampler.sample_constrained(&logits, &mut s, Some(&[1 << 3]));
    assert_eq!(out.token, 3);
}

#[test]
fn a_constrained_sequence_never_takes_the_devices_argmax() {
    let p = Sampling {
        constraint: Some(fallow_protocol::job::Constraint::JsonObject),
        ..params()
    };
    assert!(!seq(&p).only_needs_argmax());
}

#[test]
fn argmax_takes_the_first_of_equal_maxima_and_never_nan_at_any_length() {
    // The one-pass definition the device kernels also follow.
    let reference = |l: &[f32]| {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in l.iter().enumerate() {
            if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
                best = Some((i, x));
            }
        }
        best.map_or(0, |(i, _)| i as u32)
    };
    for n in [0, 1, 15, 16, 17, 33, 100] {
        let mut rows = vec![
            (0..n).map(|i| (i % 7) as f32).collect::<Vec<f32>>(),
            vec![f32::NAN; n],
            vec![f32::NEG_INFINITY; n],
            (0..n)
                .map(|i| if i % 3 == 0 { f32::NAN } else { -(i as f32) })
                .collect(),
        ];
        if n > 2 {
            let mut late = vec![0.0; n];
            late[n - 1] = 1.0;
            late[n / 2] = 1.0;
            rows.push(late);
        }
        for row in rows {
            assert_eq!(argmax(&row), reference(&row), "n={n}: {row:?}");
        }
    }
}

#[test]
#[ignore = "timing only"]
fn time_sampling_over_a_large_vocabulary() {
    // Gemma 3's vocabulary, logits shaped like a model's (a few likely tokens, a long tail).
    let logits: Vec<f32> = (0..262_144u32)
        .map(|t| -((t.wrapping_mul(2_654_435_761) >> 20) as f32) / 256.0)
        .collect();
    for (name, p) in [
        (
            "temperature 1",
            Sampling {
                temperature: 1.0,
                ..Sampling::default()
            },
        ),
        (
            "top_p 0.9",
            Sampling {
                temperature: 0.8,
                top_p: 0.9,
                ..Sampling::default()
            },
        ),
        (
            "top_k 40 top_p 0.9",
            Sampling {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                ..Sampling::default()
            },
        ),
        ("greedy", params()),
    ] {
        let mut sampler = Sampler::new();
        let mut s = SeqSampler::new(p.clone(), 0, &[], &[EOS]);
        let t0 = std::time::Instant::now();
        for _ in 0..50 {
            std::hint::black_box(sampler.sample(&logits, &mut s).token);
        }
        eprintln!(
            "{name}: {:.3} ms per draw",
            t0.elapsed().as_secs_f64() * 1e3 / 50.0
        );
    }
}

#[test]
fn the_nucleus_is_the_fewest_best_tokens_reaching_top_p_of_the_mass() {
    let mut next = uniform(0x1234_5678);
    for n in [10, 1000, 5000] {
        let logits: Vec<f32> = (0..n).map(|_| next() * 12.0).collect();
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let weights: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let by = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let total: f32 = weights.iter().sum();
        for top_p in [0.05, 0.5, 0.9, 0.999] {
            let mut kept: Vec<u32> = (0..n as u32).collect();
            select::keep_nucleus(&mut kept, &weights, top_p * total, by);
            // The kept tokens are exactly the best `kept.len()` ...
            let mut sorted: Vec<u32> = (0..n as u32).collect();
            sorted.sort_unstable_by(by);
            let mut got = kept.clone();
            got.sort_unstable_by(by);
            assert_eq!(got, sorted[..kept.len()], "n={n} top_p={top_p}");
            // ... and the fewest that reach the nucleus.
            let mass = |ids: &[u32]| ids.iter().map(|&t| weights[t as usize]).sum::<f32>();
            let tol = 1e-4 * total;
            assert!(
                mass(&got) >= top_p * total - tol,
                "n={n} top_p={top_p}: too little"
            );
            assert!(
                mass(&got[..got.len() - 1]) < top_p * total + tol,
                "n={n} top_p={top_p}: more than needed"
            );
        }
    }
}

#[test]
fn top_k_keeps_exactly_the_k_best_tokens_with_the_worst_last() {
    let mut next = uniform(0x2545_f491);
    for n in [10usize, 1000, 50_000] {
        // Coarse values: many ties, inside and across the boundary bucket.
        let weights: Vec<f32> = (0..n)
            .map(|_| (next() * 64.0).floor() / 64.0 + 0.01)
            .collect();
        let by = |a: &u32, b: &u32| {
            weights[*b as usize]
                .total_cmp(&weights[*a as usize])
                .then(a.cmp(b))
        };
        let mut sorted: Vec<u32> = (0..n as u32).collect();
        sorted.sort_unstable_by(by);
        for k in [1, 2, 7, 40, n / 2, n - 1].into_iter().filter(|&k| k < n) {
            let mut kept: Vec<u32> = (0..n as u32).collect();
            select::keep_top_k(&mut kept, &weights, k, by);
            assert_eq!(kept.len(), k, "n={n} k={k}");
            assert_eq!(kept.last(), Some(&sorted[k - 1]), "n={n} k={k}: worst last");
            kept.sort_unstable_by(by);
            assert_eq!(kept, sorted[..k], "n={n} k={k}");
        }
    }
}

#[test]
fn unfiltered_sampling_follows_the_softmax() {
    // 4 tokens with probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1.
    let logits: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
    let p = Sampling {
        temperature: 1.0,
        seed: Some(7),
        ..Sampling::default()
    };
    let draws = draw_many(&p, 0, &logits, 20_000);
    for (t, want) in [0.1f64, 0.2, 0.3, 0.4].iter().enumerate() {
        let got = draws.iter().filter(|&&d| d == t as u32).count() as f64 / draws.len() as f64;
        assert!((got - want).abs() < 0.015, "token {t}: {got} vs {want}");
    }
}

/// A deterministic stream of numbers in [0, 1) (xorshift).
fn uniform(mut state: u64) -> impl FnMut() -> f32 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    }
}
