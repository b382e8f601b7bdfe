//! An embedding model directory read the way sentence-transformers reads it: which
//! network it holds, how its token vectors are pooled, whether they are normalised, its
//! input limit and the Matryoshka dimensions it declares. Also the detection rule that
//! tells such a directory from a chat model's.
//!
//! Rules (documented for operators in the engine's `embed` module docs):
//! - `modules.json` lists the modules. `Transformer` (its `path` is where the network's
//!   files are), `Pooling` (its `path` holds `config.json`) and `Normalize` are understood;
//!   any other module (`Dense`, …) is refused, since skipping it would give wrong vectors.
//! - Without `modules.json`, `1_Pooling/config.json` alone sets the pooling.
//! - Without either, a BERT encoder mean-pools, unnormalised (what sentence-transformers
//!   does with a plain Hugging Face directory), and a decoder marked `"is_embedding": true`
//!   in `config.json` pools its last token, normalised (Qwen3-Embedding's recipe).
//! - `sentence_bert_config.json` (next to the network's files) gives `max_seq_length` and
//!   `do_lower_case`.
//! - Matryoshka dimensions: `"matryoshka_dimensions": [..]` in
//!   `config_sentence_transformers.json`, else in `config.json`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::pooling::Pooling;
use super::EmbedError;

/// The network a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Network {
    /// A BERT encoder (bidirectional).
    Bert,
    /// One of the engine's decoder architectures, run causally.
    Decoder,
}

/// Everything about a directory but its weights and tokenizer.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Where `config.json`, the safetensors and `tokenizer.json` are.
    pub model_dir: PathBuf,
    /// The parsed `config.json`.
    pub config: Value,
    pub network: Network,
    pub pooling: Pooling,
    pub normalize: bool,
    pub max_seq_length: Option<usize>,
    /// Lower-case texts before tokenizing (sentence-transformers' own switch, on top of
    /// whatever the tokenizer does).
    pub do_lower_case: bool,
    /// As declared (checked against the output size by the caller).
    pub matryoshka: Vec<usize>,
}

/// One entry of `modules.json`.
struct Module {
    /// The class name without its package (`Pooling`, `Normalize`, …).
    kind: String,
    path: String,
}

/// The entries of `dir/modules.json`, `None` when there is none or it is unreadable.
fn modules(dir: &Path) -> Option<Vec<Module>> {
    let list = read_json(&dir.join("modules.json")).ok()?;
    let entries = list.as_array()?;
    Some(
        entries
            .iter()
            .map(|m| Module {
                kind: m
                    .get("type")
                    .and_then(Value::as_str)
                    .map(|t| t.rsplit('.').next().unwrap_or(t).to_string())
                    .unwrap_or_default(),
                path: m
                    .get("path")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect(),
    )
}

fn read_json(path: &Path) -> Result<Value, EmbedError> {
    let bytes = std::fs::read(path)
        .map_err(|e| EmbedError::Load(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| EmbedError::Load(format!("{}: invalid JSON: {e}", path.display())))
}

/// `config.json` names a BERT encoder: by an encoder class of `architectures` (a
/// classification head would make it a reranker, not an embedder), else `model_type`.
fn is_bert(config: &Value) -> bool {
    const ENCODERS: [&str; 3] = ["BertModel", "BertForMaskedLM", "BertForPreTraining"];
    match config.get("architectures").and_then(Value::as_array) {
        Some(archs) => archs
            .iter()
            .filter_map(Value::as_str)
            .any(|a| ENCODERS.contains(&a)),
        None => config.get("model_type").and_then(Value::as_str) == Some("bert"),
    }
}

/// `config.json`'s `model_type` is one of the engine's decoder architectures.
fn is_decoder(config: &Value) -> bool {
    matches!(
        config.get("model_type").and_then(Value::as_str),
        Some("llama" | "mistral" | "qwen2" | "qwen3" | "gemma3" | "gemma3_text")
    )
}

/// The explicit marker for a decoder embedding model without sentence-transformers files.
fn marked_embedding(config: &Value) -> bool {
    config.get("is_embedding").and_then(Value::as_bool) == Some(true)
}

/// Whether `path` holds an embedding model (see the module docs); never an error, a
/// directory it cannot read is not one.
pub(crate) fn detect(path: &Path) -> bool {
    if !path.is_dir() {
        return false;
    }
    if let Some(modules) = modules(path) {
        if modules.iter().any(|m| m.kind == "Pooling") {
            return true;
        }
    }
    if path.join("1_Pooling/config.json").is_file() {
        return true;
    }
    match read_json(&path.join("config.json")) {
        Ok(config) => is_bert(&config) || (is_decoder(&config) && marked_embedding(&config)),
        Err(_) => false,
    }
}

/// A module path from `modules.json`, kept inside the model directory.
fn module_dir(root: &Path, path: &str) -> Result<PathBuf, EmbedError> {
    let inside = Path::new(path)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !inside {
        return Err(EmbedError::Load(format!(
            "modules.json: module path {path:?} leaves the model directory"
        )));
    }
    Ok(root.join(path))
}

impl Layout {
    pub(crate) fn read(root: &Path) -> Result<Layout, EmbedError> {
        let mut model_dir = root.to_path_buf();
        let mut pooling_config = None;
        let mut normalize = false;
        match modules(root) {
            Some(modules) => {
                for m in modules {
                    match m.kind.as_str() {
                        "Transformer" => model_dir = module_dir(root, &m.path)?,
                        "Pooling" => {
                            let dir = module_dir(root, &m.path)?;
                            pooling_config = Some(read_json(&dir.join("config.json"))?);
                        }
                        "Normalize" => normalize = true,
                        other => {
                            return Err(EmbedError::Load(format!(
                                "modules.json: the sentence-transformers module `{other}` is \
                                 not supported (Transformer, Pooling and Normalize are)"
                            )))
                        }
                    }
                }
            }
            None if root.join("1_Pooling/config.json").is_file() => {
                pooling_config = Some(read_json(&root.join("1_Pooling/config.json"))?);
            }
            None => {}
        }
        let config = read_json(&model_dir.join("config.json"))?;
        let network = if is_bert(&config) {
            Network::Bert
        } else if is_decoder(&config) {
            Network::Decoder
        } else {
            let name = config
                .get("model_type")
                .and_then(Value::as_str)
                .unwrap_or("(no model_type)");
            return Err(EmbedError::Load(format!(
                "config.json: `{name}` is neither a BERT encoder nor a decoder the engine runs"
            )));
        };
        let pooling = match (&pooling_config, network) {
            (Some(c), _) => {
                check_pooled_width(c, &config)?;
                Pooling::from_config(c)?
            }
            (None, Network::Bert) => Pooling::Mean,
            (None, Network::Decoder) => {
                normalize = true;
                Pooling::LastToken
            }
        };
        let st = match model_dir.join("sentence_bert_config.json") {
            p if p.is_file() => read_json(&p)?,
            _ => Value::Null,
        };
        let max_seq_length = st
            .get("max_seq_length")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok());
        let do_lower_case = st.get("do_lower_case").and_then(Value::as_bool) == Some(true);
        let st_root = match root.join("config_sentence_transformers.json") {
            p if p.is_file() => read_json(&p)?,
            _ => Value::Null,
        };
        let matryoshka = match st_root
            .get("matryoshka_dimensions")
            .or_else(|| config.get("matryoshka_dimensions"))
        {
            Some(v) => matryoshka_list(v)?,
            None => Vec::new(),
        };
        Ok(Layout {
            model_dir,
            config,
            network,
            pooling,
            normalize,
            max_seq_length,
            do_lower_case,
            matryoshka,
        })
    }
}

/// The Pooling config's `word_embedding_dimension`, when given, is the network's width.
fn check_pooled_width(pooling: &Value, config: &Value) -> Result<(), EmbedError> {
    let declared = pooling
        .get("word_embedding_dimension")
        .and_then(Value::as_u64);
    let hidden = config.get("hidden_size").and_then(Value::as_u64);
    match (declared, hidden) {
        (Some(d), Some(h)) if d != h => Err(EmbedError::Load(format!(
            "the Pooling config pools {d}-wide vectors, config.json's hidden_size is {h}"
        ))),
        _ => Ok(()),
    }
}

/// A list of positive sizes, ascending and without repeats.
fn matryoshka_list(v: &Value) -> Result<Vec<usize>, EmbedError> {
    let bad = || {
        EmbedError::Load(format!(
            "matryoshka_dimensions must list positive sizes, got {v}"
        ))
    };
    let mut dims = v
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|d| {
            d.as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .filter(|&d| d > 0)
        })
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(bad)?;
    dims.sort_unstable();
    dims.dedup();
    Ok(dims)
}
