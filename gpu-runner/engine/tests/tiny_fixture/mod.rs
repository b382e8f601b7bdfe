//! What the tests over the tiny fixtures (`fixtures/tiny/`) share: opening one, and the CPU
//! backend's logits of one sequence at every position.

use std::path::{Path, PathBuf};

use fallow_engine::backend::cpu::{CpuBackend, KvDtype};
use fallow_engine::backend::{Backend, LogitsMode, SeqSlice};
use fallow_engine::model::{self, ModelArtifacts};

/// As in `safetensors_vs_transformers.rs`.
pub const TOLERANCE: f32 = 1e-3;
pub const BLOCK_SIZE: usize = 16;
/// Longer than the gpt-oss fixture's 5-token window.
pub const TOKENS: [u32; 12] = [5, 77, 200, 13, 9, 250, 41, 41, 3, 180, 66, 300];

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(name)
}

pub fn open(dir: &Path) -> ModelArtifacts {
    model::open(dir).unwrap_or_else(|e| panic!("{}: open failed: {e}", dir.display()))
}

/// Logits at every position of `TOKENS`, with an f32 KV cache.
pub fn logits(artifacts: &ModelArtifacts) -> Vec<f32> {
    let mut backend = CpuBackend::with_kv_dtype(artifacts, 4, BLOCK_SIZE, KvDtype::F32)
        .unwrap_or_else(|e| panic!("backend: {e}"));
    backend
        .forward(&[SeqSlice {
            adapter: None,
            tokens: &TOKENS,
            start_pos: 0,
            block_table: &[0],
            logits: LogitsMode::All,
        }])
        .unwrap_or_else(|e| panic!("forward: {e}"))
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
