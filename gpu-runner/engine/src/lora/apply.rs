//! Applying a step's adapters: after each targeted projection `y = W x`, every row whose
//! sequence has an adapter gets `y += B(A x)` (B already scaled), and base rows are left
//! alone. Rows are grouped by adapter, so one adapter's small matrices stay in cache over
//! its rows; large steps (prefill) split the rows over the worker team.

use std::cell::RefCell;
use std::ops::Range;

use super::{LoraAdapter, Target};

/// Below this many multiply-adds a projection's deltas run on the calling thread: handing
/// them to the team costs more than a decode step's few rows.
const TEAM_WORK: usize = 1 << 15;

/// Rows per team task.
const CHUNK_ROWS: usize = 16;

/// The adapters of one step and the activation rows each applies to.
pub struct StepAdapters<'a> {
    /// Each distinct adapter of the step with its rows (ranges in row order).
    groups: Vec<(&'a LoraAdapter, Vec<Range<usize>>)>,
    /// One projection's tasks, kept for the step's next projection (no allocation per
    /// projection after the first).
    tasks: RefCell<Vec<(&'a LoraAdapter, Range<usize>)>>,
}

impl<'a> StepAdapters<'a> {
    /// Groups `seqs` (each a sequence's adapter, if any, and its activation rows) by adapter.
    pub fn new(seqs: impl IntoIterator<Item = (Option<&'a LoraAdapter>, Range<usize>)>) -> Self {
        let mut groups: Vec<(&'a LoraAdapter, Vec<Range<usize>>)> = Vec::new();
        for (adapter, rows) in seqs {
            let Some(adapter) = adapter else { continue };
            if rows.is_empty() {
                continue;
            }
            match groups.iter_mut().find(|(a, _)| a.id() == adapter.id()) {
                Some((_, ranges)) => ranges.push(rows),
                None => groups.push((adapter, vec![rows])),
            }
        }
        StepAdapters {
            groups,
            tasks: RefCell::new(Vec::new()),
        }
    }

    /// Whether no row of the step has an adapter.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Adds each adapter's `target` delta of `layer` to `out` (`n × out_dim`), from the
    /// projection's input `x` (`n × in_dim`).
    pub fn apply(&self, layer: usize, target: Target, x: &[f32], out: &mut [f32]) {
        let (mut work, mut out_dim) = (0, 0);
        let mut tasks = self.tasks.borrow_mut();
        tasks.clear();
        for (adapter, ranges) in &self.groups {
            let Some(pair) = adapter.layers.get(layer).and_then(|l| l.get(target)) else {
                continue;
            };
            out_dim = pair.out_dim;
            for rows in ranges {
                work += rows.len() * pair.rank * (pair.in_dim + pair.out_dim);
                let mut start = rows.start;
                while start < rows.end {
                    let end = (start + CHUNK_ROWS).min(rows.end);
                    tasks.push((adapter, start..end));
                    start = end;
                }
            }
        }
        if tasks.is_empty() {
            return;
        }
        let run = |adapter: &LoraAdapter, rows: Range<usize>, out_rows: &mut [f32]| {
            let Some(pair) = adapter.layers[layer].get(target) else {
                return;
            };
            pair.apply(
                &x[rows.start * pair.in_dim..rows.end * pair.in_dim],
                out_rows,
            );
        };
        if work < TEAM_WORK {
            for (adapter, rows) in tasks.iter() {
                let slice = &mut out[rows.start * out_dim..rows.end * out_dim];
                run(adapter, rows.clone(), slice);
            }
            return;
        }
        // Disjoint row ranges of `out`, one per task (a prompt-sized step: its allocation
        // is nothing beside the work).
        tasks.sort_by_key(|(_, rows)| rows.start);
        let mut pieces = Vec::with_capacity(tasks.len());
        let mut rest = out;
        let mut at = 0;
        for (adapter, rows) in tasks.drain(..) {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((rows.start - at) * out_dim);
            let (piece, tail) = tail.split_at_mut(rows.len() * out_dim);
            at = rows.end;
            rest = tail;
            pieces.push((adapter, rows, piece));
        }
        crate::team::for_each_mut(&mut pieces, |(adapter, rows, piece)| {
            run(adapter, rows.clone(), piece)
        });
    }
}
