//! Sampling a step's logits rows. Each sampled sequence draws over the whole vocabulary
//! (0.5–3 ms for a 262k-token one), so when several do, they draw in parallel on the CPU
//! worker team, each thread with its own scratch buffers; every sequence keeps its own
//! RNG, grammar and history, so the tokens do not depend on which thread drew them.

use std::cell::RefCell;
use std::collections::HashMap;

use super::choice::Choice;
use super::postprocess::Row;
use super::LlmEngine;
use crate::batcher::SeqId;
use crate::sampler::{Sampled, Sampler};
use crate::team;

thread_local! {
    /// Each team thread's sampling scratch, reused across steps.
    static SCRATCH: RefCell<Sampler> = RefCell::new(Sampler::new());
}

/// One sequence to sample: its choice, its logits, and the result.
struct Draw<'a> {
    row: usize,
    choice: &'a mut Choice,
    logits: &'a [f32],
    sampled: Option<Sampled>,
}

/// Samples `choice`'s next token from `logits` under its grammar's mask, if any.
fn sample(sampler: &mut Sampler, choice: &mut Choice, logits: &[f32]) -> Sampled {
    let allowed = choice.grammar.as_mut().and_then(|g| {
        g.prepare_mask();
        g.mask_words()
    });
    sampler.sample_constrained(logits, &mut choice.sampler, allowed)
}

impl LlmEngine {
    /// The sampled token of every `Row::Logits` row (by row index; `None` for other rows and
    /// for sequences that are gone).
    pub(super) fn sample_rows(&mut self, rows: &[(SeqId, Row<'_>)]) -> Vec<Option<Sampled>> {
        let wanted: HashMap<SeqId, (usize, &[f32])> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, (seq, row))| match row {
                Row::Logits(logits) => Some((*seq, (i, *logits))),
                Row::Picked(_) => None,
            })
            .collect();
        let mut out: Vec<Option<Sampled>> = (0..rows.len()).map(|_| None).collect();
        let mut draws: Vec<Draw<'_>> = self
            .choices
            .iter_mut()
            .filter_map(|(seq, choice)| {
                wanted.get(seq).map(|&(row, logits)| Draw {
                    row,
                    choice,
                    logits,
                    sampled: None,
                })
            })
            .collect();
        if let [draw] = draws.as_mut_slice() {
            // One draw: no hand-off to the team.
            draw.sampled = Some(sample(&mut self.sampler, draw.choice, draw.logits));
        } else {
            team::for_each_mut(&mut draws, |draw| {
                SCRATCH.with_borrow_mut(|sampler| {
                    draw.sampled = Some(sample(sampler, draw.choice, draw.logits));
                })
            });
        }
        for draw in draws {
            out[draw.row] = draw.sampled;
        }
        out
    }
}
