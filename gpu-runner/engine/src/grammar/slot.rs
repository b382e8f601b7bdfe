//! [`GrammarSlot`]: the model's [`Grammars`], built on a background thread. Building the
//! vocabulary trie and llguidance's token slices takes ~0.3 s for a 50k vocabulary and
//! ~2.5 s for Gemma's 262k; done on the engine thread at the first constrained request it
//! would stall every sequence in the batch for that long. The engine starts the build at
//! its first request of any kind (by then its EOS ids are final) and waits for it only if
//! a constrained request arrives before it is done. The build thread runs at the lowest
//! CPU priority: on a small CPU runner it would otherwise take a core from the requests
//! being served for those seconds.

use std::sync::Arc;
use std::thread::JoinHandle;

use super::{GrammarError, Grammars};
use crate::background::lower_this_threads_priority;
use crate::tokenizer::Tokenizer;

#[derive(Default)]
enum State {
    #[default]
    Idle,
    Building(JoinHandle<Result<Grammars, GrammarError>>),
    Ready(Box<Grammars>),
    Failed(String),
}

/// The grammar compiler, from idle through building to ready (or failed, for good).
#[derive(Default)]
pub struct GrammarSlot {
    state: State,
}

impl std::fmt::Debug for GrammarSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Idle => "idle",
            State::Building(_) => "building",
            State::Ready(_) => "ready",
            State::Failed(_) => "failed",
        };
        f.debug_struct("GrammarSlot")
            .field("state", &state)
            .finish()
    }
}

impl GrammarSlot {
    /// Starts the build unless it has started; building here if no thread can be had.
    pub fn start(&mut self, tokenizer: &Arc<Tokenizer>, eos_ids: &[u32]) {
        if !matches!(self.state, State::Idle) {
            return;
        }
        let (tokenizer, eos_ids) = (tokenizer.clone(), eos_ids.to_vec());
        let spawned = std::thread::Builder::new()
            .name("grammar-vocab".into())
            .spawn({
                let tokenizer = tokenizer.clone();
                let eos_ids = eos_ids.clone();
                move || {
                    lower_this_threads_priority();
                    Grammars::new(tokenizer, &eos_ids)
                }
            });
        self.state = match spawned {
            Ok(handle) => State::Building(handle),
            Err(_) => Self::settle(Grammars::new(tokenizer, &eos_ids)),
        };
    }

    /// The compiler, waiting for the build if it is still running.
    pub fn get(
        &mut self,
        tokenizer: &Arc<Tokenizer>,
        eos_ids: &[u32],
    ) -> Result<&mut Grammars, GrammarError> {
        self.start(tokenizer, eos_ids);
        if let State::Building(_) = self.state {
            let State::Building(handle) = std::mem::take(&mut self.state) else {
                unreachable!("matched just above");
            };
            self.state = match handle.join() {
                Ok(result) => Self::settle(result),
                Err(_) => State::Failed("the grammar vocabulary build panicked".into()),
            };
        }
        match &mut self.state {
            State::Ready(grammars) => Ok(grammars),
            State::Failed(message) => Err(GrammarError::Vocabulary(message.clone())),
            State::Idle | State::Building(_) => Err(GrammarError::Vocabulary(
                "the grammar vocabulary was not built".into(),
            )),
        }
    }

    fn settle(result: Result<Grammars, GrammarError>) -> State {
        match result {
            Ok(grammars) => State::Ready(Box::new(grammars)),
            Err(e) => State::Failed(e.to_string()),
        }
    }
}
