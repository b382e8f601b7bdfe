//! The model files in `models/` (git-ignored): each test is skipped, with a message, when
//! its file is absent.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::gguf::GgufFile;
use crate::quant::GgmlType;

fn model(file: &str) -> Option<GgufFile> {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "..", "models", file]
        .iter()
        .collect();
    if !path.exists() {
        fallow_protocol::testing::skip_for_want_of(&format!(
            "{} (scripts/fetch-models.sh)",
            path.display()
        ));
        return None;
    }
    Some(GgufFile::open(Path::new(&path)).unwrap())
}

/// Every tensor lies within the file (re-checked here, independently of `open`).
fn assert_tensors_within_file(g: &GgufFile) {
    for t in &g.tensors {
        let (start, len) = g.byte_range(t).unwrap();
        assert!(
            start >= g.data_offset() && start + len <= g.file_len(),
            "{} out of file",
            t.name
        );
        assert_eq!(
            (start - g.data_offset()) % g.alignment(),
            0,
            "{} misaligned",
            t.name
        );
    }
}

/// A real matrix multiplied by the quantized kernels agrees with f32 maths on its
/// dequantized weights (activation quantisation error only).
fn assert_matmul_close(g: &GgufFile, name: &str) {
    let m = g.matrix(name).unwrap();
    let n_tokens = 3;
    let x: Vec<f32> = (0..n_tokens * m.cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0f32; n_tokens * m.rows];
    m.matmul(&x, n_tokens, &mut out);
    let w = m.dequantize_all();
    for t in 0..n_tokens {
        for r in (0..m.rows).step_by(7) {
            let (wr, xt) = (
                &w[r * m.cols..(r + 1) * m.cols],
                &x[t * m.cols..(t + 1) * m.cols],
            );
            let exact: f32 = wr.iter().zip(xt).map(|(a, b)| a * b).sum();
            let scale: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
            let got = out[t * m.rows + r];
            assert!(
                (got - exact).abs() <= 0.02 * scale + 1e-5,
                "{name}[{t},{r}]: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn the_default_smollm2_model_file_parses() {
    let Some(g) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert!(g
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
    assert_tensors_within_file(&g);
    let q = g.matrix("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.dtype, q.rows, q.cols), (GgmlType::Q4_1, 576, 576));
    let embd = g.matrix("token_embd.weight").unwrap();
    assert_eq!((embd.rows, embd.cols), (49152, 576));
    let mut row = vec![0f32; 576];
    embd.dequantize_row(1, &mut row);
    assert!(row.iter().all(|v| v.is_finite()) && row.iter().any(|&v| v != 0.0));
    assert_eq!(g.tensor_f32("blk.0.attn_norm.weight").unwrap().len(), 576);
    assert_matmul_close(&g, "blk.0.ffn_down.weight");
    assert_matmul_close(&g, "blk.0.ffn_gate.weight");
}

#[test]
fn the_gemma3_k_quant_model_file_parses() {
    let Some(g) = model("gemma-3-270m-Q4_K_M.gguf") else {
        return;
    };
    assert_eq!(g.get_str("general.architecture").unwrap(), "gemma3");
    assert_tensors_within_file(&g);
    let types: BTreeSet<&str> = g.tensors.iter().map(|t| t.dtype.name()).collect();
    for t in ["q4_K", "q6_K", "q5_0", "q8_0", "f32"] {
        assert!(types.contains(t), "expected {t} tensors, found {types:?}");
    }
    for t in g.tensors.iter().filter(|t| t.dims.len() == 2).take(40) {
        let m = g.matrix(&t.name).unwrap();
        if m.rows * m.cols <= 1 << 22 {
            let w = m.dequantize_all();
            assert!(
                w.iter().all(|v| v.is_finite()),
                "{} has non-finite weights",
                t.name
            );
        }
    }
    assert_matmul_close(&g, "blk.1.attn_output.weight");
    assert_matmul_close(&g, "blk.1.ffn_down.weight");
    assert_matmul_close(&g, "blk.0.attn_q.weight");
}
