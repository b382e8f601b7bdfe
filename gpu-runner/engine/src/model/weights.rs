//! The tensors of a decoder-only transformer in one layout for every source format. Big
//! matrices stay quantized (or f16/bf16) as [`QMatrix`] views into the mmapped file; small
//! vectors (norms, biases) are f32, with any norm-weight offset already applied.
//!
//! Building goes through [`TensorSource`] + [`TensorNames`], so the GGUF and safetensors
//! loaders share the shape checks and only differ in how they name and fetch tensors.

use crate::quant::QMatrix;

use super::{ModelConfig, ModelError};

/// One transformer block.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub wo: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Bias of the attention output projection (gpt-oss).
    pub bo: Option<Vec<f32>>,
    /// One sink logit per query head (gpt-oss): joins the softmax's denominator only.
    pub sinks: Option<Vec<f32>>,
    /// Per-head RMSNorm weights (`head_dim`) applied to Q and K before RoPE.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma: norm of the attention output before the residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: FeedForward,
    /// Gemma: norm of the feed-forward output before the residual add.
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A gated feed-forward: `down · (act(gate · x) ⊙ (up · x))`.
pub struct DenseFfn {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
}

impl DenseFfn {
    fn matrices(&self) -> [&QMatrix; 3] {
        [&self.gate, &self.up, &self.down]
    }

    fn matrices_mut(&mut self) -> [&mut QMatrix; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }
}

/// A mixture of experts: the router's scores pick each token's experts.
pub struct MoeFfn {
    /// `[n_experts, hidden]`.
    pub router: QMatrix,
    /// Added to the router's logits (gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<DenseFfn>,
    /// The experts' biases (gpt-oss); boxed to keep [`FeedForward`]'s variants close in size.
    pub expert_biases: Option<Box<ExpertBiases>>,
    /// Qwen2-MoE's shared expert, which every token goes through.
    pub shared: Option<SharedExpert>,
}

/// Every expert's gate, up and down biases, expert after expert: `gate` and `up` hold
/// `n_experts × ffn`, `down` `n_experts × hidden`.
pub struct ExpertBiases {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

impl ExpertBiases {
    fn len(&self) -> usize {
        self.gate.len() + self.up.len() + self.down.len()
    }
}

/// An expert every token goes through, its output scaled by `sigmoid(gate · x)`.
pub struct SharedExpert {
    pub ffn: DenseFfn,
    /// `[1, hidden]`.
    pub gate: QMatrix,
}

/// The feed-forward sub-block of one layer.
pub enum FeedForward {
    Dense(DenseFfn),
    Moe(MoeFfn),
}

impl FeedForward {
    /// The dense feed-forward, for backends without an expert path.
    pub fn dense(&self) -> Option<&DenseFfn> {
        match self {
            FeedForward::Dense(d) => Some(d),
            FeedForward::Moe(_) => None,
        }
    }

    /// Every matrix, the router included.
    pub fn matrices(&self) -> Vec<&QMatrix> {
        match self {
            FeedForward::Dense(d) => d.matrices().to_vec(),
            FeedForward::Moe(m) => std::iter::once(&m.router)
                .chain(m.experts.iter().flat_map(DenseFfn::matrices))
                .chain(m.shared.iter().flat_map(|s| s.ffn.matrices()))
                .collect(),
        }
    }

    fn matrices_mut(&mut self) -> Vec<&mut QMatrix> {
        match self {
            FeedForward::Dense(d) => d.matrices_mut().into_iter().collect(),
            FeedForward::Moe(m) => std::iter::once(&mut m.router)
                .chain(m.experts.iter_mut().flat_map(DenseFfn::matrices_mut))
                .chain(m.shared.iter_mut().flat_map(|s| s.ffn.matrices_mut()))
                .collect(),
        }
    }
}

/// All weights of a model.
pub struct Weights {
    pub token_embd: QMatrix,
    pub output_norm: Vec<f32>,
    /// The LM head; `None` when tied to `token_embd`.
    pub output: Option<QMatrix>,
    /// Llama 3.1 RoPE frequency divisors from GGUF `rope_freqs.weight` (`head_dim / 2`).
    pub rope_freq_factors: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// The matrix producing logits (the LM head, or the embeddings when tied).
    pub fn lm_head(&self) -> &QMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Every weight matrix (the LM head once, even when tied).
    pub fn matrices(&self) -> impl Iterator<Item = &QMatrix> {
        let per_layer = self.layers.iter().flat_map(|l| {
            [&l.wq, &l.wk, &l.wv, &l.wo]
                .into_iter()
                .chain(l.ffn.matrices())
        });
        std::iter::once(&self.token_embd)
            .chain(self.output.as_ref())
            .chain(per_layer)
    }

    /// Rearranges every matrix into the layout this CPU's kernels read fastest (see
    /// [`QMatrix::use_cpu_layout`]): for weights the CPU backend will run, not for a CUDA
    /// upload or an inspection, which would only pay for reading and copying them.
    pub fn use_cpu_layout(&mut self) {
        let per_layer = self.layers.iter_mut().flat_map(|l| {
            [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo]
                .into_iter()
                .chain(l.ffn.matrices_mut())
        });
        for m in std::iter::once(&mut self.token_embd)
            .chain(self.output.as_mut())
            .chain(per_layer)
        {
            m.use_cpu_layout();
        }
    }

    /// Elements of every vector (norms, biases, RoPE factors).
    pub fn vector_elements(&self) -> usize {
        let per_layer: usize = self
            .layers
            .iter()
            .map(|l| {
                let moe = match &l.ffn {
                    FeedForward::Moe(m) => {
                        m.router_bias.as_ref().map_or(0, Vec::len)
                            + m.expert_biases.as_ref().map_or(0, |b| b.len())
                    }
                    FeedForward::Dense(_) => 0,
                };
                let optional = [
                    &l.bq,
                    &l.bk,
                    &l.bv,
                    &l.bo,
                    &l.sinks,
                    &l.q_norm,
                    &l.k_norm,
                    &l.post_attn_norm,
                    &l.post_ffn_norm,
                ];
                l.attn_norm.len()
                    + l.ffn_norm.len()
                    + moe
                    + optional
                        .iter()
                        .map(|v| v.as_ref().map_or(0, Vec::len))
                        .sum::<usize>()
            })
            .sum();
        per_layer + self.output_norm.len() + self.rope_freq_factors.as_ref().map_or(0, Vec::len)
    }
}

/// The role of a tensor, independent of how a format names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    TokenEmbd,
    OutputNorm,
    Output,
    RopeFreqs,
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    /// The attention output projection's bias.
    OBias,
    /// Per-head attention sink logits (`[n_heads]`).
    AttnSinks,
    QNorm,
    KNorm,
    PostAttnNorm,
    FfnNorm,
    Gate,
    Up,
    Down,
    PostFfnNorm,
    /// The experts' router (`[n_experts, hidden]`).
    Router,
    /// All experts' gate (up, down) matrices stacked in one 3-D tensor.
    GateExps,
    UpExps,
    DownExps,
    /// Gate and up stacked per expert in one 3-D tensor (`[n_experts, 2 × ffn, hidden]`).
    GateUpExps,
    /// transformers' gpt-oss experts, stored for `x · W`: `[n_experts, hidden, 2 × ffn]`
    /// with gate and up in alternate columns, and down `[n_experts, ffn, hidden]`.
    GateUpExpsTransposed,
    DownExpsTransposed,
    /// The router's bias (`[n_experts]`).
    RouterBias,
    /// The experts' biases: `[n_experts, ffn]` each for gate and up, `[n_experts, hidden]`
    /// for down, or gate and up alternating in one `[n_experts, 2 × ffn]` (gpt-oss in
    /// transformers).
    GateExpsBias,
    UpExpsBias,
    DownExpsBias,
    GateUpExpsBias,
    /// The shared expert's gate, up and down matrices, and its `[1, hidden]` gate.
    SharedGate,
    SharedUp,
    SharedDown,
    SharedExpertGate,
}

/// Maps a role (and layer, for block tensors) to the format's tensor name.
pub trait TensorNames {
    fn name(&self, role: Role, layer: usize) -> String;
    /// One expert's own `Gate`, `Up` or `Down` matrix, where a format stores them apart.
    fn expert(&self, role: Role, layer: usize, expert: usize) -> String;
}

/// Fetches tensors by name from one format.
pub trait TensorSource {
    fn has(&self, name: &str) -> bool;
    fn matrix(&self, name: &str) -> Result<QMatrix, ModelError>;
    fn vector(&self, name: &str) -> Result<Vec<f32>, ModelError>;
    /// A 3-D tensor of stacked matrices as one `[slabs × rows, cols]` view, and `slabs`.
    fn stacked(&self, name: &str) -> Result<(QMatrix, usize), ModelError>;
    /// A tensor of raw bytes (`U8`: MXFP4 blocks and scales), with its shape; formats
    /// without such tensors have none.
    fn bytes_u8(&self, name: &str) -> Result<(&[usize], &[u8]), ModelError> {
        Err(ModelError::MissingTensor(name.into()))
    }
}

/// Rejects checkpoints with tensors the forward pass would silently ignore (an output
/// projection or feed-forward bias, a shared expert): better an error naming the tensor
/// than wrong logits.
pub fn reject_unused_tensors<'a>(
    mut names: impl Iterator<Item = &'a str>,
    unused_suffixes: &[&str],
) -> Result<(), ModelError> {
    match names.find(|n| unused_suffixes.iter().any(|s| n.ends_with(s))) {
        Some(name) => Err(ModelError::Unsupported(format!(
            "tensor `{name}` is not implemented, and the model would be wrong without it"
        ))),
        None => Ok(()),
    }
}

/// Builds and shape-checks the weights. Sets `config.tie_embeddings` from the presence of
/// the output matrix.
pub fn build(
    config: &mut ModelConfig,
    src: &dyn TensorSource,
    names: &dyn TensorNames,
) -> Result<Weights, ModelError> {
    let l = Loader { config, src, names };
    let token_embd = l.matrix(Role::TokenEmbd, 0, config.vocab_size, config.hidden)?;
    let output_name = names.name(Role::Output, 0);
    let output = if src.has(&output_name) {
        Some(l.matrix(Role::Output, 0, config.vocab_size, config.hidden)?)
    } else {
        None
    };
    let rope_freqs_name = names.name(Role::RopeFreqs, 0);
    let rope_freq_factors = if src.has(&rope_freqs_name) {
        Some(l.vector(Role::RopeFreqs, 0, config.head_dim / 2)?)
    } else {
        None
    };
    let output_norm = l.norm(Role::OutputNorm, 0, config.hidden)?;
    let layers = (0..config.n_layers)
        .map(|i| l.layer(i))
        .collect::<Result<Vec<_>, _>>()?;
    config.tie_embeddings = output.is_none();
    Ok(Weights {
        token_embd,
        output_norm,
        output,
        rope_freq_factors,
        layers,
    })
}

struct Loader<'a> {
    config: &'a ModelConfig,
    src: &'a dyn TensorSource,
    names: &'a dyn TensorNames,
}

impl Loader<'_> {
    fn matrix(
        &self,
        role: Role,
        layer: usize,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix, ModelError> {
        let name = self.names.name(role, layer);
        let m = self.src.matrix(&name)?;
        if m.rows != rows || m.cols != cols {
            return Err(ModelError::Shape {
                name,
                found: vec![m.rows, m.cols],
                expected: vec![rows, cols],
            });
        }
        Ok(m)
    }

    fn vector(&self, role: Role, layer: usize, len: usize) -> Result<Vec<f32>, ModelError> {
        let name = self.names.name(role, layer);
        let v = self.src.vector(&name)?;
        if v.len() != len {
            return Err(ModelError::Shape {
                name,
                found: vec![v.len()],
                expected: vec![len],
            });
        }
        Ok(v)
    }

    /// A norm weight with the config's offset applied (HF Gemma stores `w`, means `1 + w`).
    fn norm(&self, role: Role, layer: usize, len: usize) -> Result<Vec<f32>, ModelError> {
        let mut v = self.vector(role, layer, len)?;
        let offset = self.config.norm_weight_offset;
        if offset != 0.0 {
            v.iter_mut().for_each(|x| *x += offset);
        }
        Ok(v)
    }

    /// Loads the tensor if the format has it; errors if `required` and it is absent.
    fn optional<T>(
        &self,
        role: Role,
        layer: usize,
        required: bool,
        load: impl FnOnce() -> Result<T, ModelError>,
    ) -> Result<Option<T>, ModelError> {
        let name = self.names.name(role, layer);
        if self.src.has(&name) {
            load().map(Some)
        } else if required {
            Err(ModelError::MissingTensor(name))
        } else {
            Ok(None)
        }
    }

    fn layer(&self, i: usize) -> Result<LayerWeights, ModelError> {
        let c = self.config;
        let (h, q, kv, hd, ffn) = (c.hidden, c.q_dim(), c.kv_dim(), c.head_dim, c.ffn);
        let bias = |role, len| self.optional(role, i, c.qkv_bias, || self.vector(role, i, len));
        let qk_norm = |role| self.optional(role, i, c.qk_norm, || self.norm(role, i, hd));
        // Only Gemma has sandwich norms; HF Llama-likes reuse the name
        // `post_attention_layernorm` for their pre-FFN norm, so never probe for them.
        let post = |role| match c.post_norms {
            true => self.norm(role, i, h).map(Some),
            false => Ok(None),
        };
        Ok(LayerWeights {
            attn_norm: self.norm(Role::AttnNorm, i, h)?,
            wq: self.matrix(Role::Q, i, q, h)?,
            wk: self.matrix(Role::K, i, kv, h)?,
            wv: self.matrix(Role::V, i, kv, h)?,
            wo: self.matrix(Role::O, i, h, q)?,
            bq: bias(Role::QBias, q)?,
            bk: bias(Role::KBias, kv)?,
            bv: bias(Role::VBias, kv)?,
            // Read only where the config declares them: elsewhere the loader refuses them.
            bo: match c.o_bias {
                true => Some(self.vector(Role::OBias, i, h)?),
                false => None,
            },
            sinks: match c.attn_sinks {
                true => Some(self.vector(Role::AttnSinks, i, c.n_heads)?),
                false => None,
            },
            q_norm: qk_norm(Role::QNorm)?,
            k_norm: qk_norm(Role::KNorm)?,
            post_attn_norm: post(Role::PostAttnNorm)?,
            ffn_norm: self.norm(Role::FfnNorm, i, h)?,
            ffn: match c.layer_moe(i) {
                Some(moe) => {
                    FeedForward::Moe(super::moe_weights::load(self.src, self.names, i, moe, h)?)
                }
                None => FeedForward::Dense(DenseFfn {
                    gate: self.matrix(Role::Gate, i, ffn, h)?,
                    up: self.matrix(Role::Up, i, ffn, h)?,
                    down: self.matrix(Role::Down, i, h, ffn)?,
                }),
            },
            post_ffn_norm: post(Role::PostFfnNorm)?,
        })
    }
}
