//! pick_rows: greedy picks, draws and logprobs against the host definition (`TokenDraw`);
//! mask_rows: grammar masks applied before the picks, as the host sampler applies them.

use super::runner::Runner;
use super::Values;
use crate::backend::cuda::emu::Arg;
use crate::backend::cuda::step::{pick_params, LOGPROB_STRIDE};
use crate::backend::step_masks::{append_row, words_for};
use crate::sampler::{mask_disallowed, Sampled, TokenDraw};

/// Runs pick_rows over `rows` (each `vocab` wide, after a logit row that it must not touch)
/// with `draws`, on blocks of `threads`: the picks as the backend reports them.
fn emulated_picks(
    emu: &Runner,
    rows: &[Vec<f32>],
    draws: &[TokenDraw],
    threads: u32,
) -> Vec<Sampled> {
    emulated_masked_picks(emu, rows, draws, &vec![None; rows.len()], threads)
}

/// [`emulated_picks`] with a grammar mask for the rows that have one: mask_rows, then
/// pick_rows, as the backend launches them. The rows must come out as the host masks them.
fn emulated_masked_picks(
    emu: &Runner,
    rows: &[Vec<f32>],
    draws: &[TokenDraw],
    masks: &[Option<&[u32]>],
    threads: u32,
) -> Vec<Sampled> {
    let vocab = rows[0].len();
    let first = 1;
    let mut logits = vec![7.0f32; vocab];
    logits.extend(rows.iter().flatten());
    let mut want_logits = logits.clone();
    let words = words_for(vocab);
    let mut mask_buf = Vec::new();
    let mut params = Vec::new();
    for (r, (draw, mask)) in draws.iter().zip(masks).enumerate() {
        let index = mask.map(|m| {
            append_row(m, words, &mut mask_buf);
            mask_disallowed(&mut want_logits[(first + r) * vocab..][..vocab], m);
            mask_buf.len() / words - 1
        });
        params.extend(pick_params(draw, index));
    }
    mask_buf.push(0); // never empty
    if masks.iter().any(Option::is_some) {
        emu.launch(
            "mask_rows",
            (rows.len() as u32, 1, 1),
            256,
            &[
                Arg::buf(&mut logits),
                Arg::I32(first as i32),
                Arg::I32(vocab as i32),
                Arg::buf(&mut params),
                Arg::buf(&mut mask_buf),
                Arg::I32(words as i32),
            ],
        );
    }
    let mut ids = vec![-1i32; rows.len()];
    let mut logprobs = vec![f32::NAN; rows.len() * LOGPROB_STRIDE];
    emu.launch(
        "pick_rows",
        (rows.len() as u32, 1, 1),
        threads,
        &[
            Arg::buf(&mut logits),
            Arg::I32(first as i32),
            Arg::I32(vocab as i32),
            Arg::buf(&mut params),
            Arg::buf(&mut ids),
            Arg::buf(&mut logprobs),
        ],
    );
    let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits();
    assert!(
        logits.iter().zip(&want_logits).all(|(a, b)| same(a, b)),
        "unmasked rows untouched, masked ones as the host masks them"
    );
    ids.iter()
        .zip(draws)
        .enumerate()
        .map(|(r, (&id, d))| {
            let row = &logprobs[r * LOGPROB_STRIDE..(r + 1) * LOGPROB_STRIDE];
            crate::backend::cuda::forward::picked_row(id as u32, d.logprobs, Some(row), vocab)
        })
        .collect()
}

#[test]
fn pick_rows_takes_the_first_largest_logit_for_greedy_rows_and_never_nan() {
    let Some(emu) = Runner::get() else { return };
    let vocab = 3000usize;
    let mut values = Values(3);
    let mut rows: Vec<Vec<f32>> = (0..3).map(|_| values.vec(vocab)).collect();
    rows[0][2999] = 5.0; // the last token
    rows[1][17] = 9.0; // a tie: the lower id wins
    rows[1][2500] = 9.0;
    rows[1][3] = f32::NAN;
    rows[2].fill(f32::NAN); // nothing but NaN: token 0
    let picks = emulated_picks(emu, &rows, &[TokenDraw::GREEDY; 3], 1024);
    let ids: Vec<u32> = picks.iter().map(|p| p.token).collect();
    assert_eq!(ids, vec![2999, 17, 0]);
    assert!(picks
        .iter()
        .all(|p| p.logprob.is_none() && p.top.is_empty()));
}

#[test]
fn pick_rows_draws_what_the_host_definition_draws() {
    let Some(emu) = Runner::get() else { return };
    let vocab = 1000usize;
    let mut values = Values(21);
    let knobs = [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.0),
        (1.0, 40, 1.0, 0.0),
        (1.0, 0, 0.9, 0.0),
        (1.3, 0, 0.5, 0.0),
        (1.0, 0, 1.0, 0.05),
        (0.8, 50, 0.8, 0.01),
        (1.0, 1, 1.0, 0.0),
        (1.0, 0, 0.0, 0.0),
        (2.0, 5000, 0.95, 0.0),
    ];
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    for (i, &(temperature, top_k, top_p, min_p)) in knobs.iter().enumerate() {
        for u in [0.0f32, 0.31, 0.77, 0.999] {
            // Sharp rows (logits over ±8) and rows with tied logits, NaN and −∞.
            let mut row: Vec<f32> = values.vec(vocab).iter().map(|v| v * 8.0).collect();
            if i % 2 == 1 {
                for t in (0..vocab).step_by(7) {
                    row[t] = 4.0;
                }
                row[5] = f32::NAN;
                row[6] = f32::NEG_INFINITY;
            }
            rows.push(row);
            draws.push(TokenDraw {
                temperature,
                top_k,
                top_p,
                min_p,
                u,
                logprobs: None,
            });
        }
    }
    // Cuts that fall inside a run of tied tokens: one best token, twenty tied at e^-5 of it.
    let mut tied = vec![-10.0f32; vocab];
    tied[0] = 10.0;
    tied[1..=20].fill(5.0);
    for (top_k, top_p) in [(0, 0.885), (0, 0.9), (3, 1.0), (3, 0.995)] {
        for u in [0.5f32, 0.999] {
            rows.push(tied.clone());
            draws.push(TokenDraw {
                temperature: 1.0,
                top_k,
                top_p,
                min_p: 0.0,
                u,
                logprobs: None,
            });
        }
    }
    let want: Vec<u32> = rows
        .iter()
        .zip(&draws)
        .map(|(row, d)| d.pick(row))
        .collect();
    let got = emulated_picks(emu, &rows, &draws, 256);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.token, *w, "row {i}: {:?}", draws[i]);
    }
}

#[test]
fn top_k_and_top_p_cuts_of_a_large_vocabulary_are_the_host_definitions_whether_searched_among_gathered_tokens_or_whole_rows(
) {
    // 12000 tokens, more than the kernel gathers (PICK_CANDIDATES): sharp rows whose cuts
    // keep a few tokens (searched among the tokens of the heaviest weight exponents), flat
    // ones whose cuts keep thousands (searched pass by pass over the row), and a row of a
    // few thousand tokens well above the rest (gathered, close to the limit).
    let Some(emu) = Runner::get() else { return };
    let vocab = 12_000usize;
    let mut values = Values(77);
    let sharp: Vec<f32> = values.vec(vocab).iter().map(|v| v * 8.0).collect();
    let flat: Vec<f32> = values.vec(vocab).iter().map(|v| v * 0.05).collect();
    let shelf: Vec<f32> = values
        .vec(vocab)
        .iter()
        .enumerate()
        .map(|(i, v)| if i % 4 == 1 { 6.0 + v * 0.5 } else { v * 0.5 })
        .collect();
    let cases = [
        (&sharp, 40, 1.0, 0.0),
        (&sharp, 0, 0.9, 0.0),
        (&sharp, 40, 0.8, 0.0),
        (&sharp, 0, 0.95, 0.05),
        (&flat, 0, 0.9, 0.0),
        (&flat, 6000, 1.0, 0.0),
        (&flat, 100, 0.5, 0.0),
        (&shelf, 0, 0.5, 0.0),
        (&shelf, 2500, 0.99, 0.0),
    ];
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    for (row, top_k, top_p, min_p) in cases {
        for u in [0.1f32, 0.6, 0.95] {
            rows.push(row.clone());
            draws.push(TokenDraw {
                temperature: 1.0,
                top_k,
                top_p,
                min_p,
                u,
                logprobs: None,
            });
        }
    }
    let got = emulated_picks(emu, &rows, &draws, 256);
    for (i, (row, d)) in rows.iter().zip(&draws).enumerate() {
        assert_eq!(got[i].token, d.pick(row), "row {i}: {d:?}");
    }
}

#[test]
fn pick_rows_reports_the_logprobs_the_host_sampler_reports() {
    let Some(emu) = Runner::get() else { return };
    let vocab = 700usize;
    let mut values = Values(5);
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    // The alternatives are looked for among the tokens of the heaviest weights, gathered;
    // the last row has fewer tokens of any weight than it asks for, so the whole row is.
    for (i, (temperature, n)) in [(0.0, 0u8), (0.0, 5), (1.0, 20), (0.7, 3), (1.0, 20)]
        .into_iter()
        .enumerate()
    {
        let mut row: Vec<f32> = values.vec(vocab).iter().map(|v| v * 6.0).collect();
        // Ties among the best (the lower id first), NaN and −∞ tokens.
        row[40] = 9.0;
        row[30] = 9.0;
        row[3] = f32::NAN;
        row[4] = f32::NEG_INFINITY;
        if i >= 3 {
            row.iter_mut().skip(10).for_each(|l| *l = f32::NEG_INFINITY);
        }
        rows.push(row);
        draws.push(TokenDraw {
            temperature,
            u: 0.42,
            logprobs: Some(n),
            ..TokenDraw::GREEDY
        });
    }
    let got = emulated_picks(emu, &rows, &draws, 256);
    for (i, (row, d)) in rows.iter().zip(&draws).enumerate() {
        let want = d.draw(row);
        let g = &got[i];
        assert_eq!(g.token, want.token, "row {i}");
        let (gl, wl) = (
            g.logprob.expect("a logprob"),
            want.logprob.expect("a logprob"),
        );
        assert!((gl - wl).abs() <= 1e-4, "row {i}: logprob {gl}, want {wl}");
        assert_eq!(g.top.len(), want.top.len(), "row {i}");
        for ((gt, glp), (wt, wlp)) in g.top.iter().zip(&want.top) {
            assert_eq!(
                gt, wt,
                "row {i}: alternatives {:?}, want {:?}",
                g.top, want.top
            );
            assert!((glp - wlp).abs() <= 1e-4, "row {i}: {glp} vs {wlp}");
        }
    }
}

#[test]
fn masked_rows_pick_among_the_allowed_tokens_as_the_host_sampler_does() {
    let Some(emu) = Runner::get() else { return };
    let vocab = 1000usize;
    let words = words_for(vocab);
    let mut values = Values(77);
    // A mask allowing a scattered few (not the row's best), every token, every token but
    // the best, and a short mask (ids past its 10 words disallowed).
    let few: Vec<u32> = (0..words as u32)
        .map(|w| if w % 5 == 2 { 0x8001_0010 } else { 0 })
        .collect();
    let all = vec![u32::MAX; words];
    let short = [u32::MAX; 10];
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    let mut masks: Vec<Option<&[u32]>> = Vec::new();
    for (i, mask) in [Some(&few[..]), Some(&all[..]), None, Some(&short[..])]
        .into_iter()
        .enumerate()
    {
        for (temperature, top_p, logprobs) in
            [(0.0, 1.0, None), (1.0, 0.9, Some(5)), (0.7, 1.0, None)]
        {
            let mut row: Vec<f32> = values.vec(vocab).iter().map(|v| v * 6.0).collect();
            row[999] = 20.0; // past the short mask, and not among the few
            row[3] = f32::NAN;
            rows.push(row);
            draws.push(TokenDraw {
                temperature,
                top_p,
                u: 0.1 + 0.2 * i as f32,
                logprobs,
                ..TokenDraw::GREEDY
            });
            masks.push(mask);
        }
    }
    let got = emulated_masked_picks(emu, &rows, &draws, &masks, 256);
    for (i, ((row, d), mask)) in rows.iter().zip(&draws).zip(&masks).enumerate() {
        let mut masked = row.clone();
        if let Some(m) = mask {
            mask_disallowed(&mut masked, m);
        }
        let want = d.draw(&masked);
        assert_eq!(got[i].token, want.token, "row {i}: {d:?}");
        if let Some(m) = mask {
            let t = got[i].token as usize;
            assert!(
                m.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1),
                "row {i}: {t} allowed"
            );
        }
        if let (Some(g), Some(w)) = (got[i].logprob, want.logprob) {
            assert!((g - w).abs() <= 1e-4, "row {i}: logprob {g}, want {w}");
            let ids = |s: &Sampled| s.top.iter().map(|(t, _)| *t).collect::<Vec<_>>();
            assert_eq!(ids(&got[i]), ids(&want), "row {i}: alternatives");
        }
    }
}
