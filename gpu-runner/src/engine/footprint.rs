//! How much memory a model takes where it runs: its weights as the backend stores them plus
//! its KV pool. A runner with a memory budget decides what to load and what to evict from
//! these figures, so they count what the backends really allocate: the CPU backend keeps
//! weights in their file's (quantized) format, the CUDA backend converts them to bf16.

use crate::engine::model::Weights;
use crate::engine::runtime::Device;

/// Bytes the weights take on `device`.
pub fn weights_bytes(weights: &Weights, device: Device) -> u64 {
    let matrices: u64 = weights
        .matrices()
        .map(|m| match device {
            Device::Cpu => m.data.as_slice().len() as u64,
            Device::Cuda(_) => (m.rows * m.cols * 2) as u64,
        })
        .sum();
    // Vectors are f32 on the CPU and bf16 on the GPU.
    let per_element = match device {
        Device::Cpu => 4,
        Device::Cuda(_) => 2,
    };
    matrices + (weights.vector_elements() * per_element) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model;

    #[test]
    fn the_default_model_weighs_about_its_file_on_the_cpu_and_more_as_bf16() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if !path.exists() {
            eprintln!("SKIPPED: {} not fetched", path.display());
            return;
        }
        let file = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let artifacts = model::open(&path).expect("open the default model");
        let cpu = weights_bytes(&artifacts.weights, Device::Cpu);
        let gpu = weights_bytes(&artifacts.weights, Device::Cuda(0));
        assert!(
            cpu <= file && cpu * 10 >= file * 9,
            "quantized weights ({cpu} B) are most of the file ({file} B)"
        );
        // 135M parameters as bf16.
        assert!((250_000_000..300_000_000).contains(&gpu), "{gpu}");
    }
}
