//! Fallow's inference engine. One step is schedule → run → postprocess (see [`llm`]).
//!
//! **Architecture Invariant**: the engine knows requests, never jobs: it depends on
//! `fallow_protocol`'s plain value types and on no database, queue, stream or HTTP crate
//! (`tests/dependencies.rs` checks the dependency tree).
//!
//! - [`gguf`]: GGUF v2/v3 reader (mmap, metadata, tensor infos).
//! - [`quant`]: block formats (Q4_0 … Q6_K, F16, BF16), dequantisation and dot products.
//! - [`model`]: model config, weights (GGUF / safetensors) and architectures.
//! - [`backend`]: the `Backend` trait a model runs behind, and the CPU backend.
//! - [`embed`]: embedding models (BERT encoders, decoder embedders): text → pooled vectors.
//! - [`tokenizer`]: tokenizers from `tokenizer.json` or GGUF vocabularies, the incremental
//!   detokenizer, chat templates.
//! - [`kv`]: the paged KV block manager with prefix caching (pure bookkeeping).
//! - [`batcher`]: continuous batching under one token budget per step (pure).
//! - [`sampler`]: logits → token, penalties, logprobs; [`stop`]: stop-string matching over
//!   a request's one automaton ([`stop_strings`]); [`stop_regex`]: `stop_regex` matching.
//! - [`grammar`]: constrained decoding (llguidance): a constraint → per-sequence token masks.
//! - [`llm`]: the engine loop tying them together.
//! - [`lora`]: LoRA adapters (PEFT), applied per sequence within a mixed batch.
//! - [`prompt`]: a request's prompt (chat messages through the template, raw text, token ids)
//!   → token ids, and tokenize/detokenize answers.
//! - [`runtime`]: the one place that wires a model's parts; [`footprint`]: what a model will
//!   take in memory.
//! - [`cpu_settings`]: the CPU backend's process-wide settings, set once at the edge.
//! - [`background`]: threads for work beside the steps, at the lowest CPU priority.
//! - [`team`]: the CPU backend's persistent worker threads; [`fast_exp`]: a vectorisable
//!   `e^x` for the backend's activations and the sampler.

pub mod backend;
pub mod background;
pub mod batcher;
pub mod cpu_settings;
pub mod embed;
pub mod fast_exp;
pub mod footprint;
pub mod gguf;
pub mod grammar;
pub mod kv;
pub mod llm;
pub mod lora;
pub mod model;
pub mod prompt;
pub mod quant;
pub mod runtime;
pub mod sampler;
pub mod stop;
pub mod stop_regex;
pub mod stop_strings;
pub(crate) mod team;
pub mod tokenizer;
