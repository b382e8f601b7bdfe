//! A BERT encoder's shape and numerics from Hugging Face's `config.json`.

use serde_json::Value;

use crate::embed::EmbedError;

/// Which GELU the feed-forward uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gelu {
    /// `x·Φ(x)` with the exact normal CDF (`hidden_act: "gelu"`, BERT's own).
    Erf,
    /// The tanh approximation (`gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`).
    Tanh,
}

#[derive(Debug, Clone)]
pub(crate) struct BertConfig {
    pub hidden: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub n_layers: usize,
    pub vocab_size: usize,
    /// Rows of the position embedding table: the longest input it can run.
    pub max_positions: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
    pub gelu: Gelu,
}

impl BertConfig {
    pub(crate) fn from_json(cfg: &Value) -> Result<BertConfig, EmbedError> {
        let size = |key: &str| -> Result<usize, EmbedError> {
            cfg.get(key)
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
                .filter(|&v| v > 0)
                .ok_or_else(|| {
                    EmbedError::Load(format!("config.json: `{key}` must be a positive size"))
                })
        };
        let hidden = size("hidden_size")?;
        let n_heads = size("num_attention_heads")?;
        if !hidden.is_multiple_of(n_heads) {
            return Err(EmbedError::Load(format!(
                "config.json: hidden_size {hidden} is not a multiple of num_attention_heads {n_heads}"
            )));
        }
        let gelu = match cfg
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu")
        {
            "gelu" => Gelu::Erf,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Gelu::Tanh,
            other => {
                return Err(EmbedError::Load(format!(
                    "config.json: hidden_act `{other}` is not supported (gelu, gelu_new)"
                )))
            }
        };
        // Relative position schemes change attention itself; only absolute ones are run.
        match cfg.get("position_embedding_type").and_then(Value::as_str) {
            None | Some("absolute") => {}
            Some(other) => {
                return Err(EmbedError::Load(format!(
                    "config.json: position_embedding_type `{other}` is not supported (absolute)"
                )))
            }
        }
        Ok(BertConfig {
            hidden,
            n_heads,
            head_dim: hidden / n_heads,
            ffn: size("intermediate_size")?,
            n_layers: size("num_hidden_layers")?,
            vocab_size: size("vocab_size")?,
            max_positions: size("max_position_embeddings")?,
            // Every input is segment 0, so the table needs at least that row.
            type_vocab_size: match cfg.get("type_vocab_size") {
                Some(_) => size("type_vocab_size")?,
                None => 2,
            },
            layer_norm_eps: cfg
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .map_or(1e-12, |v| v as f32),
            gelu,
        })
    }
}
