//! Loading one mixture-of-experts layer: the router and every expert's three matrices, as
//! views into the mapped file whichever way the format stores them:
//! - one 3-D tensor per projection (llama.cpp's `ffn_{gate,up,down}_exps`);
//! - gate and up fused in one 3-D tensor, down in another (transformers 5's
//!   `mlp.experts.gate_up_proj` / `down_proj`);
//! - a matrix per expert (published Qwen3-MoE and Mixtral checkpoints);
//! - gpt-oss's transposed, interleaved tensors ([`super::gpt_oss_experts`], copied).
//!
//! Splitting a stacked tensor copies nothing ([`QMatrix::split_rows`]). The router's and
//! experts' biases (gpt-oss) are read where the format has them.

use crate::quant::QMatrix;

use super::gpt_oss_experts;
use super::weights::{
    DenseFfn, ExpertBiases, MoeFfn, Role, SharedExpert, TensorNames, TensorSource,
};
use super::{ModelError, MoeConfig};

/// Reads layer `layer`'s router and experts, checked against `moe` and `hidden`.
pub(super) fn load(
    src: &dyn TensorSource,
    names: &dyn TensorNames,
    layer: usize,
    moe: &MoeConfig,
    hidden: usize,
) -> Result<MoeFfn, ModelError> {
    let (e, f) = (moe.n_experts, moe.expert_ffn);
    let router_name = names.name(Role::Router, layer);
    let router = shaped(&router_name, src.matrix(&router_name)?, e, hidden)?;
    let fused = names.name(Role::GateUpExps, layer);
    let transposed = names.name(Role::GateUpExpsTransposed, layer);
    let experts = if src.has(&transposed) || gpt_oss_experts::has_mxfp4(src, &transposed) {
        let down = names.name(Role::DownExpsTransposed, layer);
        gpt_oss_experts::experts(src, &transposed, &down, (e, f, hidden))?
    } else if src.has(&fused) {
        let gate_up = split(src, &fused, e, 2 * f, hidden)?;
        let down = split(src, &names.name(Role::DownExps, layer), e, hidden, f)?;
        gate_up
            .into_iter()
            .zip(down)
            .map(|(gu, down)| {
                let [gate, up]: [QMatrix; 2] = halves(&fused, gu)?;
                Ok(DenseFfn { gate, up, down })
            })
            .collect::<Result<Vec<_>, ModelError>>()?
    } else if src.has(&names.name(Role::GateExps, layer)) {
        let part = |role, rows, cols| split(src, &names.name(role, layer), e, rows, cols);
        let (gates, ups, downs) = (
            part(Role::GateExps, f, hidden)?,
            part(Role::UpExps, f, hidden)?,
            part(Role::DownExps, hidden, f)?,
        );
        gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((gate, up), down)| DenseFfn { gate, up, down })
            .collect()
    } else {
        (0..e)
            .map(|x| {
                let one = |role, rows, cols| {
                    let name = names.expert(role, layer, x);
                    shaped(&name, src.matrix(&name)?, rows, cols)
                };
                Ok(DenseFfn {
                    gate: one(Role::Gate, f, hidden)?,
                    up: one(Role::Up, f, hidden)?,
                    down: one(Role::Down, hidden, f)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?
    };
    let shared = shared_expert(src, names, layer, moe, hidden)?;
    let biased = moe.clamped_swiglu.is_some();
    let router_bias = match biased {
        true => Some(vector(src, &names.name(Role::RouterBias, layer), e)?),
        false => None,
    };
    let expert_biases = match biased {
        true => Some(Box::new(expert_biases(src, names, layer, (e, f, hidden))?)),
        false => None,
    };
    Ok(MoeFfn {
        router,
        router_bias,
        experts,
        expert_biases,
        shared,
    })
}

/// gpt-oss's expert biases: gate and up apart (GGUF) or alternating in one tensor
/// (transformers), and down.
fn expert_biases(
    src: &dyn TensorSource,
    names: &dyn TensorNames,
    layer: usize,
    (e, f, hidden): (usize, usize, usize),
) -> Result<ExpertBiases, ModelError> {
    let fused = names.name(Role::GateUpExpsBias, layer);
    let (gate, up) = if src.has(&fused) {
        gpt_oss_experts::split_gate_up_bias(&vector(src, &fused, e * 2 * f)?)
    } else {
        (
            vector(src, &names.name(Role::GateExpsBias, layer), e * f)?,
            vector(src, &names.name(Role::UpExpsBias, layer), e * f)?,
        )
    };
    let down = vector(src, &names.name(Role::DownExpsBias, layer), e * hidden)?;
    Ok(ExpertBiases { gate, up, down })
}

/// A float tensor of `len` elements whatever its shape (biases of all experts at once).
fn vector(src: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    if !src.has(name) {
        return Err(ModelError::MissingTensor(name.into()));
    }
    let v = src.vector(name)?;
    if v.len() != len {
        return Err(ModelError::Shape {
            name: name.into(),
            found: vec![v.len()],
            expected: vec![len],
        });
    }
    Ok(v)
}

/// The shared expert the config names, or `None`; one the config does not name is refused
/// rather than left out of the sum.
fn shared_expert(
    src: &dyn TensorSource,
    names: &dyn TensorNames,
    layer: usize,
    moe: &MoeConfig,
    hidden: usize,
) -> Result<Option<SharedExpert>, ModelError> {
    let gate_name = names.name(Role::SharedExpertGate, layer);
    let Some(f) = moe.shared_ffn else {
        return match src.has(&gate_name) || src.has(&names.name(Role::SharedGate, layer)) {
            true => Err(ModelError::Unsupported(format!(
                "tensor `{gate_name}`: a shared expert the model's config does not declare"
            ))),
            false => Ok(None),
        };
    };
    let one = |role, rows, cols| {
        let name = names.name(role, layer);
        shaped(&name, src.matrix(&name)?, rows, cols)
    };
    Ok(Some(SharedExpert {
        ffn: DenseFfn {
            gate: one(Role::SharedGate, f, hidden)?,
            up: one(Role::SharedUp, f, hidden)?,
            down: one(Role::SharedDown, hidden, f)?,
        },
        gate: one(Role::SharedExpertGate, 1, hidden)?,
    }))
}

/// A stacked tensor of `experts` matrices of `[rows, cols]`, one view per expert.
fn split(
    src: &dyn TensorSource,
    name: &str,
    experts: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<QMatrix>, ModelError> {
    let (m, slabs) = src.stacked(name)?;
    if slabs != experts || m.rows != experts * rows || m.cols != cols {
        return Err(ModelError::Shape {
            name: name.into(),
            found: vec![slabs, m.rows / slabs.max(1), m.cols],
            expected: vec![experts, rows, cols],
        });
    }
    m.split_rows(experts).map_err(|e| tensor_error(name, e))
}

/// Gate and up, the two halves of one expert's fused matrix.
fn halves(name: &str, m: QMatrix) -> Result<[QMatrix; 2], ModelError> {
    let parts = m.split_rows(2).map_err(|e| tensor_error(name, e))?;
    parts.try_into().map_err(|_| ModelError::Tensor {
        name: name.into(),
        why: "cannot split into gate and up halves".into(),
    })
}

fn shaped(name: &str, m: QMatrix, rows: usize, cols: usize) -> Result<QMatrix, ModelError> {
    if m.rows != rows || m.cols != cols {
        return Err(ModelError::Shape {
            name: name.into(),
            found: vec![m.rows, m.cols],
            expected: vec![rows, cols],
        });
    }
    Ok(m)
}

fn tensor_error(name: &str, e: crate::quant::QuantError) -> ModelError {
    ModelError::Tensor {
        name: name.into(),
        why: e.to_string(),
    }
}
