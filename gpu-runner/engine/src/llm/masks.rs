//! Grammar masks computed off the critical path: while the backend runs a step's forward
//! pass on this thread, another thread computes the masks of the step's constrained
//! sequences, in parallel over rayon's pool. A mask depends only on the tokens so far, never
//! on the logits being computed, so by the time the logits arrive the masks are ready. A
//! backend that draws on the device takes the masks of its `DrawMasked` sequences through
//! [`StepMasks`] once its logits are on their way; the others are sampled on the host.

use std::sync::Mutex;
use std::thread::ScopedJoinHandle;

use rayon::prelude::*;

use crate::backend::step_masks::append_row;
use crate::backend::StepMasks;
use crate::grammar::SeqGrammar;

/// A grammar whose mask the step needs, and whether the backend applies it (a `DrawMasked`
/// sequence) rather than the host sampler.
pub(super) struct StepGrammar<'g> {
    pub grammar: &'g mut SeqGrammar,
    pub on_device: bool,
}

/// Runs `forward` here and the masks of `grammars` on a scoped thread; returns `forward`'s
/// result once both are done. `forward` gets the masks of the `on_device` grammars, in the
/// order given, from its [`StepMasks`]. Without grammars nothing is spawned.
pub(super) fn overlapped<T>(
    grammars: Vec<StepGrammar<'_>>,
    forward: impl FnOnce(&mut dyn StepMasks) -> T,
) -> T {
    if grammars.is_empty() {
        return forward(&mut crate::backend::NoMasks);
    }
    // Shared with the worker, so that the grammars stay reachable if no thread can be had.
    let slot = Mutex::new(grammars);
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("grammar-masks".into())
            .spawn_scoped(scope, || {
                if let Ok(mut grammars) = slot.lock() {
                    grammars
                        .par_iter_mut()
                        .for_each(|g| g.grammar.prepare_mask());
                }
            })
            .ok();
        let mut feed = Feed {
            worker,
            slot: &slot,
        };
        let out = forward(&mut feed);
        feed.join();
        out
    })
}

/// The masks of a step as its forward pass asks for them.
struct Feed<'scope, 'a, 'g> {
    worker: Option<ScopedJoinHandle<'scope, ()>>,
    slot: &'a Mutex<Vec<StepGrammar<'g>>>,
}

impl Feed<'_, '_, '_> {
    fn join(&mut self) {
        if let Some(handle) = self.worker.take() {
            if handle.join().is_err() {
                tracing::error!("grammar mask thread panicked");
            }
        }
    }
}

impl StepMasks for Feed<'_, '_, '_> {
    fn wait_into(&mut self, words: usize, out: &mut Vec<u32>) -> usize {
        self.join();
        // A worker that panicked poisoned the lock; the grammars are still whole (a mask
        // is computed or not), so carry on with them.
        let mut grammars = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut n = 0;
        for g in grammars.iter_mut().filter(|g| g.on_device) {
            // Computed by the worker already, unless it could not run.
            g.grammar.prepare_mask();
            append_row(g.grammar.mask_words().unwrap_or(&[]), words, out);
            n += 1;
        }
        n
    }
}
