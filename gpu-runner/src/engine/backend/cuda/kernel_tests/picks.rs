//! pick_rows: greedy picks, draws and logprobs against the host definition (`TokenDraw`).

use super::Values;
use crate::engine::backend::cuda::emulator::{Arg, Emulator};
use crate::engine::backend::cuda::step::{pick_params, LOGPROB_STRIDE};
use crate::engine::sampler::{Sampled, TokenDraw};

/// Runs pick_rows over `rows` (each `vocab` wide, after a logit row that it must not touch)
/// with `draws`, on blocks of `threads`: the picks as the backend reports them.
fn emulated_picks(
    emu: &Emulator,
    rows: &[Vec<f32>],
    draws: &[TokenDraw],
    threads: u32,
) -> Vec<Sampled> {
    let vocab = rows[0].len();
    let first = 1;
    let mut logits = vec![7.0f32; vocab];
    logits.extend(rows.iter().flatten());
    let before = logits.clone();
    let mut params: Vec<i32> = draws.iter().flat_map(pick_params).collect();
    let mut ids = vec![-1i32; rows.len()];
    let mut logprobs = vec![f32::NAN; rows.len() * LOGPROB_STRIDE];
    emu.launch(
        "pick_rows",
        (rows.len() as u32, 1, 1),
        threads,
        &[
            Arg::buf(&mut logits),
            Arg::I32(first),
            Arg::I32(vocab as i32),
            Arg::buf(&mut params),
            Arg::buf(&mut ids),
            Arg::buf(&mut logprobs),
        ],
    );
    let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits();
    assert!(
        logits.iter().zip(&before).all(|(a, b)| same(a, b)),
        "the rows are untouched"
    );
    ids.iter()
        .zip(draws)
        .enumerate()
        .map(|(r, (&id, d))| {
            let row = &logprobs[r * LOGPROB_STRIDE..(r + 1) * LOGPROB_STRIDE];
            crate::engine::backend::cuda::forward::picked_row(
                id as u32,
                d.logprobs,
                Some(row),
                vocab,
            )
        })
        .collect()
}

#[test]
fn pick_rows_takes_the_first_largest_logit_for_greedy_rows_and_never_nan() {
    let Some(emu) = Emulator::get() else { return };
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
    let Some(emu) = Emulator::get() else { return };
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
fn pick_rows_reports_the_logprobs_the_host_sampler_reports() {
    let Some(emu) = Emulator::get() else { return };
    let vocab = 700usize;
    let mut values = Values(5);
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    for (i, (temperature, n)) in [(0.0, 0u8), (0.0, 5), (1.0, 20), (0.7, 3)]
        .into_iter()
        .enumerate()
    {
        let mut row: Vec<f32> = values.vec(vocab).iter().map(|v| v * 6.0).collect();
        // Ties among the best (the lower id first), NaN and −∞ tokens.
        row[40] = 9.0;
        row[30] = 9.0;
        row[3] = f32::NAN;
        row[4] = f32::NEG_INFINITY;
        if i == 3 {
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
