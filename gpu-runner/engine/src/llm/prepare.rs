//! Working a request out before it joins the engine: checking it against the model's limits
//! and compiling its stop strings, stop regexes and grammar. A [`Preparer`] is a handle that
//! any thread may hold, so a host runs this beside the engine thread rather than on it: a
//! fresh json_schema, a long stop list or the first constrained request's wait for the
//! grammar vocabulary then pauses no other sequence. [`LlmEngine::add_prepared`] does only
//! the bookkeeping that must happen on the engine thread.

use std::sync::{Arc, Mutex};

use fallow_protocol::job::Constraint;

use super::request::{self, EngineRequest, Limits};
use super::EngineError;
use crate::grammar::{GrammarSlot, SeqGrammar};
use crate::model::ModelConfig;
use crate::stop_regex::StopRegexes;
use crate::stop_strings::StopStrings;
use crate::tokenizer::Tokenizer;

/// A request checked and compiled, ready for [`super::LlmEngine::add_prepared`].
#[derive(Debug)]
pub struct Prepared {
    pub(super) request: EngineRequest,
    pub(super) max_tokens: usize,
    pub(super) stop_regexes: StopRegexes,
    pub(super) stop_strings: Arc<StopStrings>,
    pub(super) grammar: Option<SeqGrammar>,
}

impl Prepared {
    pub fn id(&self) -> u64 {
        self.request.id
    }

    /// The prompt's token ids.
    pub fn prompt(&self) -> &[u32] {
        &self.request.prompt
    }
}

/// Prepares requests for one engine; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Preparer {
    tokenizer: Arc<Tokenizer>,
    eos_ids: Arc<[u32]>,
    grammars: Arc<Mutex<GrammarSlot>>,
    limits: Limits,
    /// The model's shape, when its backend serves LoRA adapters: what adapters are read for.
    adapter_base: Option<Arc<ModelConfig>>,
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preparer").finish_non_exhaustive()
    }
}

impl Preparer {
    pub(super) fn new(
        tokenizer: Arc<Tokenizer>,
        eos_ids: Arc<[u32]>,
        grammars: Arc<Mutex<GrammarSlot>>,
        limits: Limits,
        adapter_base: Option<Arc<ModelConfig>>,
    ) -> Self {
        Preparer {
            tokenizer,
            eos_ids,
            grammars,
            limits,
            adapter_base,
        }
    }

    /// The shape LoRA adapters must have to run over this model, or `None` when its backend
    /// serves no adapters.
    pub fn adapter_base(&self) -> Option<&ModelConfig> {
        self.adapter_base.as_deref()
    }

    /// Checks `request` and compiles what it asks for. A constrained request waits here,
    /// on the caller's thread, for the grammar vocabulary if it is still being built.
    pub fn prepare(&self, request: EngineRequest) -> Result<Prepared, EngineError> {
        let max_tokens = request::validate(&request, self.limits)?;
        let stop_regexes = StopRegexes::compile(&request.sampling.stop_regex)
            .map_err(EngineError::InvalidRequest)?;
        let stop_strings = Arc::new(
            StopStrings::new(&request.sampling.stop).map_err(EngineError::InvalidRequest)?,
        );
        let grammar = match &request.sampling.constraint {
            Some(constraint) => Some(self.compile(constraint)?),
            None => None,
        };
        Ok(Prepared {
            request,
            max_tokens,
            stop_regexes,
            stop_strings,
            grammar,
        })
    }

    fn compile(&self, constraint: &Constraint) -> Result<SeqGrammar, EngineError> {
        let mut slot = self
            .grammars
            .lock()
            .map_err(|_| EngineError::Internal("the grammar compiler panicked earlier".into()))?;
        slot.get(&self.tokenizer, &self.eos_ids)
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .compile(constraint)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))
    }
}
