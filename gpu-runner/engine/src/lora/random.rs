//! Random PEFT adapters for a base model: what `fallow bench random-lora` writes and the
//! tests load. A is drawn with fan-in scaling and B with `strength / √r`, so `strength`
//! sets how far the adapter moves the logits (0 gives B = 0, an adapter that changes
//! nothing).

use std::path::Path;

use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Value};

use super::Target;
use crate::model::ModelConfig;

/// What to draw.
#[derive(Debug, Clone)]
pub struct RandomAdapter {
    pub rank: usize,
    pub targets: Vec<Target>,
    pub seed: u64,
    pub strength: f32,
}

impl RandomAdapter {
    /// Writes `adapter_config.json` and `adapter_model.safetensors` for `config` into `dir`.
    pub fn write(&self, dir: &Path, config: &ModelConfig) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut tensors = Vec::new();
        for layer in 0..config.n_layers {
            for &target in &self.targets {
                let (in_dim, out_dim) = target.dims(config);
                let group = match target {
                    Target::Q | Target::K | Target::V | Target::O => "self_attn",
                    _ => "mlp",
                };
                let prefix = format!(
                    "base_model.model.model.layers.{layer}.{group}.{}",
                    target.hf_name()
                );
                let a_scale = (3.0 / in_dim as f32).sqrt();
                let b_scale = self.strength * (3.0 / self.rank as f32).sqrt();
                let mut draw = |n: usize, scale: f32| -> Vec<f32> {
                    (0..n)
                        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
                        .collect()
                };
                let a = draw(self.rank * in_dim, a_scale);
                let b = draw(out_dim * self.rank, b_scale);
                tensors.push((
                    format!("{prefix}.lora_A.weight"),
                    vec![self.rank, in_dim],
                    a,
                ));
                tensors.push((
                    format!("{prefix}.lora_B.weight"),
                    vec![out_dim, self.rank],
                    b,
                ));
            }
        }
        let names: Vec<&str> = self.targets.iter().map(|t| t.hf_name()).collect();
        let adapter_config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.rank,
            "lora_alpha": self.rank,
            "lora_dropout": 0.0,
            "target_modules": names,
            "bias": "none",
            "use_rslora": false,
            "use_dora": false,
            "fan_in_fan_out": false,
            "modules_to_save": null,
        });
        std::fs::write(
            dir.join("adapter_config.json"),
            serde_json::to_vec_pretty(&adapter_config)?,
        )?;
        let refs: Vec<(&str, &[usize], &[f32])> = tensors
            .iter()
            .map(|(n, s, d)| (n.as_str(), s.as_slice(), d.as_slice()))
            .collect();
        write_safetensors(&dir.join("adapter_model.safetensors"), &refs)
    }
}

/// Writes F32 tensors `(name, shape, values)` as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(&str, &[usize], &[f32])]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape, data) in tensors {
        let len = data.len() * 4;
        header.insert(
            (*name).to_string(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let header = serde_json::to_vec(&Value::Object(header))?;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    for (_, _, data) in tensors {
        out.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    }
    std::fs::write(path, out)
}
