//! A model made ready to serve: weights opened, tokenizer and chat template built, KV pool
//! sized from a byte budget, engine loop constructed. This is the one place that wires the
//! engine's parts together, for the worker and for the engine-only CLI commands alike.

use crate::backend::cpu::{kv_bytes_per_block, CpuBackend};
use crate::backend::cuda::{CudaBackend, CudaOptions};
use crate::backend::Backend;
use crate::footprint::{kv_pool_size, weights_bytes, DEFAULT_CPU_KV_BYTES};
use crate::llm::{EngineConfig, LlmEngine};
use crate::model::{self, ModelArtifacts, VocabSource};
use crate::tokenizer::{ChatTemplate, OutputSyntax, Tokenizer, GEMMA_CHAT_TEMPLATE};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    /// An NVIDIA GPU by ordinal.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (device 0), `cuda:N`, or `auto` (cuda:0 when a GPU is usable, else cpu).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            "auto" => Ok(match crate::backend::cuda::device::probe(0) {
                Ok(_) => Device::Cuda(0),
                Err(_) => Device::Cpu,
            }),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device `{s}` (cpu, cuda, cuda:N or auto)")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How to load a model and size its engine.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Bytes of memory given to the KV cache (0: automatic; on CUDA room for every sequence
    /// slot at full context within the memory budget and the device's free memory, on the
    /// CPU 512 MiB; see [`kv_pool_size`]).
    pub kv_cache_bytes: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most sequences decoding at once.
    pub max_num_seqs: usize,
    /// Token budget of one engine step (decodes + prefill chunks).
    pub max_batched_tokens: usize,
    pub enable_prefix_cache: bool,
    /// A chat template file that overrides the model's own.
    pub chat_template_file: Option<PathBuf>,
    /// Caps the model's context length (0 = the model's own).
    pub max_model_len: usize,
    pub device: Device,
    /// The model's tool-call syntax (`hermes`, `llama3_json`, `mistral`) when its chat
    /// template does not reveal it, or reveals it wrongly; `None` = detect.
    pub tool_parser: Option<String>,
    /// The model's reasoning syntax (`qwen3`, `deepseek_r1`); `None` = detect.
    pub reasoning_parser: Option<String>,
    /// The runner's memory budget for all its models (`--model-memory-mb`): an automatically
    /// sized KV pool leaves room in it for the model's weights.
    pub memory_budget_bytes: Option<u64>,
    /// On CUDA, every setting of the backend: how the matrices are stored, how x is read,
    /// the kernel cache and the debug switches.
    pub cuda: CudaOptions,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            kv_cache_bytes: DEFAULT_CPU_KV_BYTES,
            block_size: 16,
            max_num_seqs: 32,
            max_batched_tokens: 512,
            enable_prefix_cache: true,
            chat_template_file: None,
            max_model_len: 0,
            device: Device::Cpu,
            tool_parser: None,
            reasoning_parser: None,
            memory_budget_bytes: None,
            cuda: CudaOptions::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Model(#[from] model::ModelError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Everything needed to turn chat messages into tokens and tokens into text.
pub struct ModelFrontend {
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub context_length: usize,
    /// How the model writes tool calls and reasoning (published with the model, for the
    /// api's parsers).
    pub output_syntax: OutputSyntax,
}

/// A loaded model: its engine and its frontend.
pub struct LoadedModel {
    pub engine: LlmEngine,
    pub frontend: ModelFrontend,
    /// Memory the weights and the KV pool take on the device.
    pub resident_bytes: u64,
}

/// What a runner needs to know of a model before loading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// The context length it will serve (after `max_model_len`).
    pub context_length: usize,
    /// How it writes tool calls and reasoning.
    pub output_syntax: OutputSyntax,
    /// Memory it will take once loaded (at most: a CUDA KV pool sized automatically may get
    /// fewer blocks, if the device has less memory free at load).
    pub resident_bytes: u64,
}

/// Opens a model's files and builds its frontend (so a broken tokenizer or template fails
/// here) without building an engine: what it serves and how much memory loading it will take.
pub fn inspect(path: &Path, options: &LoadOptions) -> Result<ModelFacts, LoadError> {
    let artifacts = model::open(path)?;
    if let Device::Cuda(_) = options.device {
        artifacts
            .config
            .require_features("CUDA", model::CUDA_LACKS)?;
    }
    let frontend = build_frontend(&artifacts, options)?;
    let per_block = kv_bytes_per_block(&artifacts.config, options.block_size.max(1)).max(1);
    let weights = weights_bytes(&artifacts.weights, options.device, options.cuda.weights);
    let pool = kv_pool_size(options, per_block, weights, frontend.context_length);
    Ok(ModelFacts {
        context_length: frontend.context_length,
        output_syntax: frontend.output_syntax,
        resident_bytes: weights + (pool.most() * per_block) as u64,
    })
}

/// The model id a path is served under: the file or directory stem.
pub fn model_id_for(path: &Path) -> String {
    let name = path
        .file_stem()
        .or_else(|| path.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string());
    name
}

pub fn load(path: &Path, options: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let mut artifacts = model::open(path)?;
    if options.device == Device::Cpu {
        artifacts.use_cpu_layout();
    }
    let frontend = build_frontend(&artifacts, options)?;
    let block_size = options.block_size.max(1);
    let per_block = kv_bytes_per_block(&artifacts.config, block_size).max(1);
    let weights = weights_bytes(&artifacts.weights, options.device, options.cuda.weights);
    let pool = kv_pool_size(options, per_block, weights, frontend.context_length);
    let backend: Box<dyn Backend> = match options.device {
        Device::Cpu => Box::new(
            CpuBackend::new(&artifacts, pool.most(), block_size)
                .map_err(|e| LoadError::Backend(e.to_string()))?,
        ),
        Device::Cuda(ordinal) => {
            // `CudaBackend::new` refuses a model CUDA would run wrong too; here the refusal
            // is the model's error, not the device's.
            artifacts
                .config
                .require_features("CUDA", model::CUDA_LACKS)?;
            Box::new(
                CudaBackend::new(&artifacts, ordinal, pool, block_size, &options.cuda)
                    .map_err(|e| LoadError::Backend(e.to_string()))?,
            )
        }
    };
    let config = EngineConfig {
        max_num_seqs: options.max_num_seqs.max(1),
        max_batched_tokens: options.max_batched_tokens.max(block_size),
        enable_prefix_cache: options.enable_prefix_cache,
    };
    let mut engine = LlmEngine::new(backend, frontend.tokenizer.clone(), config);
    engine.add_eos_ids(&artifacts.eos_ids);
    // The pool as the backend sized it (an automatic CUDA pool may be smaller than asked).
    let kv_bytes = (engine.stats().total_blocks * per_block) as u64;
    Ok(LoadedModel {
        engine,
        frontend,
        resident_bytes: weights + kv_bytes,
    })
}

fn build_frontend(
    artifacts: &ModelArtifacts,
    options: &LoadOptions,
) -> Result<ModelFrontend, LoadError> {
    let tokenizer = match &artifacts.vocab {
        VocabSource::Gguf(vocab) => Tokenizer::from_gguf_vocab(vocab),
        VocabSource::TokenizerJson {
            tokenizer_json,
            tokenizer_config,
        } => Tokenizer::from_files(tokenizer_json, tokenizer_config.as_deref()),
    }
    .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
    let source = match &options.chat_template_file {
        Some(file) => std::fs::read_to_string(file).map_err(|source| LoadError::Io {
            path: file.clone(),
            source,
        })?,
        // A base model without a template of its own (Gemma 3 270M) still gets a usable one.
        None => artifacts
            .chat_template
            .clone()
            .unwrap_or_else(|| GEMMA_CHAT_TEMPLATE.to_string()),
    };
    let template = ChatTemplate::new(&source, &tokenizer.bos_text(), &tokenizer.eos_text())
        .map_err(|e| LoadError::Template(e.to_string()))?;
    let output_syntax = OutputSyntax::detect(&source).overridden(
        options.tool_parser.as_deref(),
        options.reasoning_parser.as_deref(),
    );
    let mut context_length = artifacts.config.context_length;
    if options.max_model_len > 0 {
        context_length = context_length.min(options.max_model_len);
    }
    Ok(ModelFrontend {
        tokenizer: Arc::new(tokenizer),
        template,
        context_length,
        output_syntax,
    })
}
