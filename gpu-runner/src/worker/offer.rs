//! A model this runner may serve: where its files are, how to load it, and how the operator
//! wants it kept warm. Inspected once at start (a bad path fails there, not at the first
//! request), so the runner can list it, and budget its memory, before ever loading it.

use fallow_engine::runtime::{self, LoadError, LoadOptions};
use fallow_engine::tokenizer::OutputSyntax;
use fallow_scheduler::runners::ModelEntry;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ModelOffer {
    /// The id clients ask for.
    pub id: String,
    pub path: PathBuf,
    pub options: LoadOptions,
    /// How long the model stays loaded without work; `None`: until its memory is needed.
    pub keep_alive: Option<Duration>,
    /// Warm replicas of this model the runners keep between them: a runner that may serve
    /// it loads it while fewer are warm, and does not unload it while that would leave fewer.
    pub min_warm: u32,
    pub context_length: u32,
    /// How it writes tool calls and reasoning, for the api's parsers.
    pub output_syntax: OutputSyntax,
    /// Memory it takes once loaded (refined after each load).
    pub resident_bytes: u64,
}

/// How an operator wants a model kept warm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmPolicy {
    pub keep_alive: Option<Duration>,
    pub min_warm: u32,
}

impl ModelOffer {
    /// Opens the model's files (not its engine) to learn its context length and size.
    pub fn inspect(
        id: &str,
        path: PathBuf,
        options: LoadOptions,
        policy: WarmPolicy,
    ) -> Result<ModelOffer, LoadError> {
        let facts = runtime::inspect(&path, &options)?;
        Ok(ModelOffer {
            id: id.to_string(),
            path,
            options,
            keep_alive: policy.keep_alive,
            min_warm: policy.min_warm,
            context_length: facts.context_length as u32,
            output_syntax: facts.output_syntax,
            resident_bytes: facts.resident_bytes,
        })
    }

    /// How `/v1/models` lists it.
    pub fn entry(&self, created: i64) -> ModelEntry {
        ModelEntry {
            id: self.id.clone(),
            context_length: self.context_length,
            owned_by: "fallow".to_string(),
            created,
            tool_parser: self.output_syntax.tool_parser.clone(),
            reasoning_parser: self.output_syntax.reasoning_parser.clone(),
        }
    }
}
