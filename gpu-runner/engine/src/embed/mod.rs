//! Embedding models: text → token ids → one pooled (and usually L2-normalised) vector per
//! input, for OpenAI's `/v1/embeddings`.
//!
//! - [`EmbeddingModel`] here: detection, opening, input checks, the batch call.
//! - `layout`: a directory read the way sentence-transformers reads it (modules, pooling,
//!   normalisation, `max_seq_length`, Matryoshka dimensions), and the detection rule.
//! - `tokenize`: the model's `tokenizer.json`, special tokens added, never truncated.
//! - `bert`: BERT encoders (MiniLM, BGE, E5 …), batched on the CPU worker team.
//! - `decoder`: decoder embedding models (Qwen3-Embedding) on the CPU backend's prefill.
//! - [`pooling`]: CLS / mean / max / last-token pooling and L2 normalisation.
//!
//! **Detection** ([`EmbeddingModel::detect`]): a directory is an embedding model when its
//! `modules.json` lists a sentence-transformers `Pooling` module, or it has
//! `1_Pooling/config.json`, or its `config.json` `architectures` names a BERT encoder
//! (`BertModel`, `BertForMaskedLM`, `BertForPreTraining`), or it is one of the engine's
//! decoders (`model_type` llama, mistral, qwen2, qwen3, gemma3) whose `config.json` says
//! `"is_embedding": true` (pooled by its last token, normalised, when no sentence-transformers
//! files say otherwise).
//!
//! A GGUF file is an embedding model when its metadata sets `{arch}.pooling_type` (see
//! `gguf` for the rule and what is refused).
//!
//! **Matryoshka**: the dimensions a client may truncate to are read from
//! `"matryoshka_dimensions": [..]` in `config_sentence_transformers.json` (else
//! `config.json`); without that key, none are declared.
//!
//! Embeddings run on the CPU whatever the device the runner's chat models use.

mod bert;
mod decoder;
mod error;
mod gguf;
mod layout;
pub mod pooling;
mod tokenize;

use std::path::Path;

pub use error::EmbedError;
pub use pooling::Pooling;

use bert::Bert;
use decoder::Decoder;
use gguf::GgufEmbedding;
use layout::{Layout, Network};
use tokenize::EmbedTokenizer;

/// The network under an embedding model.
// One per loaded model, never moved on a hot path: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Net {
    Bert(Bert),
    Decoder(Decoder),
}

/// An opened embedding model: weights, tokenizer and pooling. `Send + Sync`: every call
/// works on its own buffers, so several threads may embed at once.
pub struct EmbeddingModel {
    network: Net,
    tokenizer: EmbedTokenizer,
    pooling: Pooling,
    normalize: bool,
    max_input_tokens: usize,
    matryoshka: Vec<usize>,
}

impl std::fmt::Debug for EmbeddingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingModel")
            .field("dimensions", &self.dimensions())
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .field("max_input_tokens", &self.max_input_tokens)
            .finish()
    }
}

impl EmbeddingModel {
    /// Whether `path` holds an embedding model (the rule is in the module docs). Reads a
    /// few small JSON files; a directory it cannot read is not one.
    pub fn detect(path: &Path) -> bool {
        layout::detect(path) || gguf::detect(path)
    }

    /// Opens the model in the directory (or GGUF file) `path`.
    pub fn open(path: &Path) -> Result<Self, EmbedError> {
        if path.is_file() {
            return Self::open_gguf(path);
        }
        let layout = Layout::read(path)?;
        let tokenizer = EmbedTokenizer::open(&layout.model_dir, layout.do_lower_case)?;
        let (network, positions) = match layout.network {
            Network::Bert => {
                let bert = Bert::open(&layout.model_dir, &layout.config)?;
                let positions = bert.config.max_positions;
                (Net::Bert(bert), positions)
            }
            Network::Decoder => {
                let decoder = Decoder::open(&layout.model_dir)?;
                let positions = decoder.context_length();
                (Net::Decoder(decoder), positions)
            }
        };
        // sentence-transformers' limit, never beyond what the network can position.
        let max_input_tokens = layout
            .max_seq_length
            .map_or(positions, |n| n.min(positions));
        let model = EmbeddingModel {
            network,
            tokenizer,
            pooling: layout.pooling,
            normalize: layout.normalize,
            max_input_tokens,
            matryoshka: layout.matryoshka,
        };
        if let Some(&too_big) = model.matryoshka.iter().find(|&&d| d > model.dimensions()) {
            return Err(EmbedError::Load(format!(
                "matryoshka_dimensions lists {too_big}, beyond the model's {} dimensions",
                model.dimensions()
            )));
        }
        Ok(model)
    }

    /// A GGUF decoder: pooled as its metadata says, normalised, limited by its context.
    fn open_gguf(path: &Path) -> Result<Self, EmbedError> {
        let facts = GgufEmbedding::read(path)?;
        let decoder = Decoder::open(path)?;
        let tokenizer = match decoder.vocab() {
            crate::model::VocabSource::Gguf(vocab) => EmbedTokenizer::from_gguf(vocab)?,
            crate::model::VocabSource::TokenizerJson { .. } => {
                return Err(EmbedError::Load(format!(
                    "{} carries no GGUF vocabulary",
                    path.display()
                )))
            }
        };
        Ok(EmbeddingModel {
            max_input_tokens: decoder.context_length(),
            network: Net::Decoder(decoder),
            tokenizer,
            pooling: facts.pooling,
            normalize: true,
            matryoshka: Vec::new(),
        })
    }

    /// Length of every output vector.
    pub fn dimensions(&self) -> usize {
        match &self.network {
            Net::Bert(b) => b.config.hidden,
            Net::Decoder(d) => d.hidden(),
        }
    }

    /// The longest input, in tokens (special tokens included): sentence-transformers'
    /// `max_seq_length`, else the network's positions.
    pub fn max_input_tokens(&self) -> usize {
        self.max_input_tokens
    }

    /// Dimensions a client may truncate to (Matryoshka), ascending; empty when the model
    /// declares none (see the module docs for the key).
    pub fn matryoshka_dimensions(&self) -> &[usize] {
        &self.matryoshka
    }

    /// Rows of the token embedding table: every id must be below it.
    pub fn vocab_size(&self) -> usize {
        match &self.network {
            Net::Bert(b) => b.config.vocab_size,
            Net::Decoder(d) => d.vocab_size(),
        }
    }

    /// How token vectors are pooled.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether vectors are L2-normalised.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// Text → the ids the model runs on, special tokens included, as sentence-transformers'
    /// tokenizer gives them; never truncated (the caller refuses inputs over
    /// [`EmbeddingModel::max_input_tokens`]).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        self.tokenizer.encode(text)
    }

    /// One vector per input, in order: pooled, and L2-normalised when the model says so.
    /// All inputs' tokens go through each weight matrix together; attention stays within
    /// each input. An empty input, one over `max_input_tokens()` or an id at or above
    /// `vocab_size()` is [`EmbedError::InvalidInput`], naming the input.
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.check(inputs)?;
        let views: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut vectors = match &self.network {
            Net::Bert(bert) => {
                let hidden = bert.config.hidden;
                let states = bert.hidden_states(&views);
                let mut at = 0;
                views
                    .iter()
                    .map(|ids| {
                        let rows = &states[at * hidden..(at + ids.len()) * hidden];
                        at += ids.len();
                        self.pooling.pool(rows, hidden)
                    })
                    .collect()
            }
            Net::Decoder(decoder) => decoder.pooled(&views, self.pooling)?,
        };
        if self.normalize {
            vectors.iter_mut().for_each(|v| pooling::l2_normalize(v));
        }
        Ok(vectors)
    }

    fn check(&self, inputs: &[Vec<u32>]) -> Result<(), EmbedError> {
        let (limit, vocab) = (self.max_input_tokens, self.vocab_size());
        for (i, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(EmbedError::InvalidInput(format!("input {i} is empty")));
            }
            if ids.len() > limit {
                return Err(EmbedError::InvalidInput(format!(
                    "input {i} has {} tokens, more than the model's {limit}",
                    ids.len()
                )));
            }
            if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(EmbedError::InvalidInput(format!(
                    "input {i}: token id {bad} is not below the vocabulary size {vocab}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod gguf_tests;
#[cfg(test)]
mod tests;
