//! Grammar masks computed off the critical path: while the backend runs a step's forward
//! pass on this thread, another thread computes the masks of the step's constrained
//! sequences, in parallel over rayon's pool. A mask depends only on the tokens so far, never
//! on the logits being computed, so by the time the logits arrive the masks are ready.

use rayon::prelude::*;

use crate::engine::grammar::SeqGrammar;

/// Runs `forward` here and the masks of `grammars` on a scoped thread; returns `forward`'s
/// result once both are done. Without grammars nothing is spawned.
pub(super) fn overlapped<T>(mut grammars: Vec<&mut SeqGrammar>, forward: impl FnOnce() -> T) -> T {
    if grammars.is_empty() {
        return forward();
    }
    std::thread::scope(|scope| {
        // Without a thread, the sampler computes each mask when it needs it.
        let worker = std::thread::Builder::new()
            .name("grammar-masks".into())
            .spawn_scoped(scope, move || {
                grammars.par_iter_mut().for_each(|g| g.prepare_mask());
            });
        let out = forward();
        if let Ok(handle) = worker {
            if handle.join().is_err() {
                tracing::error!("grammar mask thread panicked");
            }
        }
        out
    })
}
