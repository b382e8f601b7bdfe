//! A model this runner may serve: where its files are, how to load it, and how the operator
//! wants it kept warm. Inspected once at start (a bad path fails there, not at the first
//! request), so the runner can list it, and budget its memory, before ever loading it.

use fallow_engine::embed::EmbeddingModel;
use fallow_engine::runtime::{self, LoadOptions, LoadedModel};
use fallow_engine::tokenizer::OutputSyntax;
use fallow_scheduler::runners::{ModelEntry, ModelKind};
use std::path::{Path, PathBuf};
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
    /// What an embedding model's vectors are like; `None` for a generative model.
    pub embedding: Option<EmbeddingFacts>,
}

/// An embedding model's vector length, and the shorter lengths it may be cut to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingFacts {
    pub dimensions: u32,
    pub matryoshka_dimensions: Vec<u32>,
}

/// A loaded model, ready for its host thread.
pub enum LoadedOffer {
    Generative(Box<LoadedModel>),
    Embedding {
        model: Box<EmbeddingModel>,
        resident_bytes: u64,
    },
}

impl LoadedOffer {
    pub fn resident_bytes(&self) -> u64 {
        match self {
            LoadedOffer::Generative(loaded) => loaded.resident_bytes,
            LoadedOffer::Embedding { resident_bytes, .. } => *resident_bytes,
        }
    }
}

/// How an operator wants a model kept warm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmPolicy {
    pub keep_alive: Option<Duration>,
    pub min_warm: u32,
}

impl ModelOffer {
    /// Opens the model's files (not its engine) to learn its context length and size; an
    /// embedding model is opened whole (it is small, and has no engine to start).
    pub fn inspect(
        id: &str,
        path: PathBuf,
        options: LoadOptions,
        policy: WarmPolicy,
    ) -> anyhow::Result<ModelOffer> {
        let mut offer = ModelOffer {
            id: id.to_string(),
            path,
            options,
            keep_alive: policy.keep_alive,
            min_warm: policy.min_warm,
            context_length: 0,
            output_syntax: OutputSyntax::default(),
            resident_bytes: 0,
            embedding: None,
        };
        if EmbeddingModel::detect(&offer.path) {
            let model = EmbeddingModel::open(&offer.path)?;
            offer.context_length = model.max_input_tokens() as u32;
            offer.resident_bytes = weights_bytes(&offer.path);
            offer.embedding = Some(EmbeddingFacts {
                dimensions: model.dimensions() as u32,
                matryoshka_dimensions: model
                    .matryoshka_dimensions()
                    .iter()
                    .map(|&d| d as u32)
                    .collect(),
            });
        } else {
            let facts = runtime::inspect(&offer.path, &offer.options)?;
            offer.context_length = facts.context_length as u32;
            offer.output_syntax = facts.output_syntax;
            offer.resident_bytes = facts.resident_bytes;
        }
        Ok(offer)
    }

    /// Loads the model (on a blocking thread: this reads the weights).
    pub fn load(&self) -> Result<LoadedOffer, String> {
        if self.embedding.is_some() {
            let model = EmbeddingModel::open(&self.path).map_err(|e| e.to_string())?;
            return Ok(LoadedOffer::Embedding {
                model: Box::new(model),
                resident_bytes: self.resident_bytes,
            });
        }
        runtime::load(&self.path, &self.options)
            .map(|loaded| LoadedOffer::Generative(Box::new(loaded)))
            .map_err(|e| e.to_string())
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
            kind: match self.embedding {
                Some(_) => ModelKind::Embedding,
                None => ModelKind::Chat,
            },
            dimensions: self.embedding.as_ref().map(|e| e.dimensions),
            matryoshka_dimensions: self
                .embedding
                .as_ref()
                .map(|e| e.matryoshka_dimensions.clone())
                .unwrap_or_default(),
            parent: None,
            lora_dir: false,
            lora_path: None,
        }
    }
}

/// The size of a model directory's weight files: what an embedding model takes in memory.
fn weights_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
