//! LoRA adapters on tiny random models: the PEFT config is checked, an adapter gives the
//! same logits on the HF and GGUF copies of a base (Q/K rows permuted alike), B = 0 changes
//! nothing, a mixed step gives each row what it gets alone, and mismatches are refused.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::random::RandomAdapter;
use super::{peft, LoraAdapter, LoraError, LoraPrecision, Target};
use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BackendError, LogitsMode, SeqSlice};
use crate::model::tiny::write_tiny;
use crate::model::{self, Arch, ModelArtifacts};

const TOKENS: [u32; 9] = [1, 17, 42, 5, 88, 63, 9, 31, 70];

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

fn open(path: &Path) -> ModelArtifacts {
    model::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn adapter_for(
    dir: &Path,
    base: &ModelArtifacts,
    targets: &[Target],
    strength: f32,
) -> LoraAdapter {
    RandomAdapter {
        rank: 4,
        targets: targets.to_vec(),
        seed: 5,
        strength,
    }
    .write(dir, &base.config)
    .unwrap_or_else(|e| panic!("write adapter: {e}"));
    peft::load(dir, "test", &base.config).unwrap_or_else(|e| panic!("load adapter: {e}"))
}

/// Every position's logits of each sequence `(tokens, adapter)`, run together in one step.
fn step(base: &ModelArtifacts, seqs: &[(&[u32], Option<&LoraAdapter>)]) -> Vec<Vec<f32>> {
    let mut backend = CpuBackend::new(base, 64, 4).unwrap_or_else(|e| panic!("backend: {e}"));
    let tables: Vec<Vec<u32>> = (0..seqs.len() as u32)
        .map(|s| (s * 8..s * 8 + 8).collect())
        .collect();
    let batch: Vec<SeqSlice<'_>> = seqs
        .iter()
        .zip(&tables)
        .map(|((tokens, adapter), table)| SeqSlice {
            tokens,
            start_pos: 0,
            block_table: table,
            logits: LogitsMode::All,
            adapter: *adapter,
        })
        .collect();
    let logits = backend
        .forward(&batch)
        .unwrap_or_else(|e| panic!("forward: {e}"));
    let vocab = base.config.vocab_size;
    let mut rows = logits.chunks_exact(vocab);
    seqs.iter()
        .map(|(tokens, _)| {
            rows.by_ref()
                .take(tokens.len())
                .flatten()
                .copied()
                .collect()
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn an_adapter_gives_the_same_logits_on_the_hf_and_gguf_copies_of_its_base() {
    for arch in [Arch::Llama, Arch::Qwen3, Arch::Gemma3] {
        let dir = tempdir();
        let (hf, gguf) = write_tiny(dir.path(), arch, 3).unwrap_or_else(|e| panic!("write: {e}"));
        let (hf, gguf) = (open(&hf), open(&gguf));
        let lora_dir = dir.path().join("lora");
        let on_hf = adapter_for(&lora_dir, &hf, &Target::ALL, 1.0);
        let on_gguf = peft::load(&lora_dir, "test", &gguf.config)
            .unwrap_or_else(|e| panic!("load adapter: {e}"));
        let a = step(&hf, &[(&TOKENS, Some(&on_hf))]);
        let b = step(&gguf, &[(&TOKENS, Some(&on_gguf))]);
        let base = step(&hf, &[(&TOKENS, None)]);
        assert!(
            max_diff(&a[0], &b[0]) < 1e-3,
            "{arch:?}: {}",
            max_diff(&a[0], &b[0])
        );
        assert!(
            max_diff(&a[0], &base[0]) > 0.1,
            "{arch:?}: the adapter must matter ({})",
            max_diff(&a[0], &base[0])
        );
    }
}

#[test]
fn an_adapter_whose_b_is_zero_gives_exactly_the_base_logits() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Llama, 3).unwrap_or_else(|e| panic!("write: {e}"));
    let base = open(&hf);
    let zero = adapter_for(&dir.path().join("lora"), &base, &Target::ALL, 0.0);
    assert_eq!(
        step(&base, &[(&TOKENS, Some(&zero))]),
        step(&base, &[(&TOKENS, None)])
    );
}

#[test]
fn a_step_mixing_the_base_and_adapters_gives_each_row_what_it_gets_alone() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Qwen3, 4).unwrap_or_else(|e| panic!("write: {e}"));
    let base = open(&hf);
    let qv = adapter_for(&dir.path().join("qv"), &base, &[Target::Q, Target::V], 1.0);
    let mlp = adapter_for(
        &dir.path().join("mlp"),
        &base,
        &[Target::Down, Target::Up],
        1.0,
    );
    let seqs: [(&[u32], Option<&LoraAdapter>); 4] = [
        (&TOKENS, Some(&qv)),
        (&TOKENS[..5], None),
        (&TOKENS[2..], Some(&mlp)),
        (&TOKENS[1..], Some(&qv)),
    ];
    let together = step(&base, &seqs);
    for (seq, mixed) in seqs.iter().zip(&together) {
        let alone = step(&base, &[*seq]);
        assert!(
            max_diff(mixed, &alone[0]) < 1e-4,
            "{}",
            max_diff(mixed, &alone[0])
        );
    }
    assert!(max_diff(&together[0], &step(&base, &[(&TOKENS, None)])[0]) > 0.1);
}

#[test]
fn an_adapter_for_another_shape_is_refused_at_load_and_at_the_step() {
    let dir = tempdir();
    let (llama, _) =
        write_tiny(&dir.path().join("l"), Arch::Llama, 3).unwrap_or_else(|e| panic!("{e}"));
    let (gemma, _) =
        write_tiny(&dir.path().join("g"), Arch::Gemma3, 3).unwrap_or_else(|e| panic!("{e}"));
    let (llama, gemma) = (open(&llama), open(&gemma));
    let lora = dir.path().join("lora");
    let for_gemma = adapter_for(&lora, &gemma, &[Target::Q], 1.0);
    let refused = peft::load(&lora, "g", &llama.config);
    assert!(
        matches!(refused, Err(LoraError::Mismatch(_))),
        "{refused:?}"
    );
    let mut backend = CpuBackend::new(&llama, 8, 4).unwrap_or_else(|e| panic!("{e}"));
    let table = [0u32, 1, 2];
    let result = backend.forward(&[SeqSlice {
        tokens: &TOKENS,
        start_pos: 0,
        block_table: &table,
        logits: LogitsMode::Last,
        adapter: Some(&for_gemma),
    }]);
    assert!(matches!(result, Err(BackendError::InvalidBatch(_))));
}

#[test]
fn unsupported_peft_configs_are_refused_by_name() {
    let base = json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                      "target_modules": ["q_proj", "v_proj"], "bias": "none"});
    let with = |key: &str, value: serde_json::Value| {
        let mut c = base.clone();
        c[key] = value;
        peft::parse_config(&c)
    };
    for (key, value, named) in [
        ("use_dora", json!(true), "DoRA"),
        ("fan_in_fan_out", json!(true), "fan_in_fan_out"),
        ("modules_to_save", json!(["lm_head"]), "modules_to_save"),
        ("bias", json!("all"), "biases"),
        ("rank_pattern", json!({"q_proj": 4}), "rank_pattern"),
        ("peft_type", json!("IA3"), "IA3"),
        ("target_modules", json!(["q_proj", "lm_head"]), "LM-head"),
        ("target_modules", json!(["c_attn"]), "c_attn"),
    ] {
        match with(key, value) {
            Err(LoraError::Unsupported(why)) => assert!(why.contains(named), "{why}"),
            other => panic!("{key}: {other:?}"),
        }
    }
    let plain = peft::parse_config(&base).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((plain.rank, plain.scaling), (8, 2.0));
    assert_eq!(plain.targets, vec![Target::Q, Target::V]);
    let rs = with("use_rslora", json!(true)).unwrap_or_else(|e| panic!("{e}"));
    assert!((rs.scaling - 16.0 / 8f32.sqrt()).abs() < 1e-6);
    let all = with("target_modules", json!("all-linear")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(all.targets.len(), 7);
}

#[test]
fn a_corrupt_or_incomplete_adapter_fails_to_load_with_a_reason() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Llama, 3).unwrap_or_else(|e| panic!("write: {e}"));
    let base = open(&hf);
    let lora = dir.path().join("lora");
    adapter_for(&lora, &base, &[Target::Q], 1.0);
    let weights = lora.join("adapter_model.safetensors");
    let bytes = std::fs::read(&weights).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
    let corrupt = peft::load(&lora, "x", &base.config);
    assert!(
        matches!(corrupt, Err(LoraError::Malformed(_))),
        "{corrupt:?}"
    );
    std::fs::remove_file(&weights).unwrap_or_else(|e| panic!("{e}"));
    let missing = peft::load(&lora, "x", &base.config);
    assert!(
        matches!(missing, Err(LoraError::Read { .. })),
        "{missing:?}"
    );
    let nothing = peft::load(&dir.path().join("nowhere"), "x", &base.config);
    assert!(
        matches!(nothing, Err(LoraError::Read { .. })),
        "{nothing:?}"
    );
}

#[test]
fn an_adapter_counts_its_bytes_and_gets_a_fresh_id_per_load() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Llama, 3).unwrap_or_else(|e| panic!("write: {e}"));
    let base = open(&hf);
    let lora = dir.path().join("lora");
    let a = Arc::new(adapter_for(&lora, &base, &[Target::Q, Target::Down], 1.0));
    let b = peft::load(&lora, "again", &base.config).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(a.id(), b.id());
    let c = &base.config;
    let per_layer = 4 * (c.hidden + c.q_dim()) + 4 * (c.ffn + c.hidden);
    assert_eq!(
        a.bytes(),
        c.n_layers * per_layer * 2,
        "served adapters are f16"
    );
    let exact =
        peft::load_as(&lora, "f32", c, LoraPrecision::F32).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exact.bytes(), c.n_layers * per_layer * 4);
    assert!(a.fits(c));
}
