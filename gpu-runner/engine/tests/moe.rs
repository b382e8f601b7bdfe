//! Mixture-of-experts models beyond matching transformers' logits (that is
//! `safetensors_vs_transformers.rs`): the tiny fixtures are sensitive to routing, every way
//! of storing the experts gives the same model, and what Fallow cannot run right is refused
//! at load with the reason.

use std::collections::BTreeMap;
use std::path::Path;

use fallow_engine::backend::cpu::{CpuBackend, KvDtype};
use fallow_engine::backend::{Backend, LogitsMode, SeqSlice};
use fallow_engine::model;
use serde_json::{json, Value};

mod tiny_fixture;

use tiny_fixture::{fixture, logits, max_diff, open, BLOCK_SIZE, TOLERANCE};

fn open_err(dir: &Path) -> String {
    match model::open(dir) {
        Ok(_) => panic!("{} opened, but should be refused", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// A copy of fixture `name` in a temporary directory, for editing.
fn copy_of(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for entry in std::fs::read_dir(fixture(name)).unwrap_or_else(|e| panic!("read_dir: {e}")) {
        let path = entry.unwrap_or_else(|e| panic!("entry: {e}")).path();
        let to = dir.path().join(path.file_name().unwrap_or_default());
        std::fs::copy(&path, &to).unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
    }
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("config: {e}"));
    let mut config: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("json: {e}"));
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap_or_else(|e| panic!("write: {e}"));
}

/// A safetensors file's tensors: name → (dtype, shape, bytes).
type Tensors = BTreeMap<String, (String, Vec<usize>, Vec<u8>)>;

fn read_safetensors(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read: {e}"));
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default()) as usize;
    let header: BTreeMap<String, Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap_or_else(|e| panic!("header: {e}"));
    let data = &bytes[8 + n..];
    header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, v)| {
            let dtype = v["dtype"].as_str().unwrap_or_default().to_string();
            let shape = v["shape"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_u64)
                        .map(|d| d as usize)
                        .collect()
                })
                .unwrap_or_default();
            let at = |i: usize| v["data_offsets"][i].as_u64().unwrap_or_default() as usize;
            let bytes = data[at(0)..at(1)].to_vec();
            (name, (dtype, shape, bytes))
        })
        .collect()
}

fn write_safetensors(path: &Path, tensors: &Tensors) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, (dtype, shape, bytes)) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap_or_else(|e| panic!("write: {e}"));
}

#[test]
fn a_wrong_route_moves_the_logits_far_past_the_tolerance() {
    let dir = fixture("qwen3_moe");
    let right = logits(&open(&dir));
    let mut unnormalised = open(&dir);
    if let Some(moe) = unnormalised.config.moe.as_mut() {
        moe.norm_topk = false;
    }
    let mut one_expert = open(&dir);
    if let Some(moe) = one_expert.config.moe.as_mut() {
        moe.top_k = 1;
    }
    for (what, wrong) in [("unnormalised", unnormalised), ("top-1", one_expert)] {
        let diff = max_diff(&right, &logits(&wrong));
        assert!(diff > 100.0 * TOLERANCE, "{what}: logits moved only {diff}");
    }
}

#[test]
fn experts_stored_as_stacked_gate_up_and_down_tensors_give_the_same_model() {
    // transformers 5 holds Qwen3-MoE experts as `mlp.experts.gate_up_proj`
    // [experts, 2 × ffn, hidden] and `mlp.experts.down_proj` [experts, hidden, ffn];
    // llama.cpp's converter reads checkpoints saved that way.
    let dir = copy_of("qwen3_moe");
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_safetensors(&path);
    let config = open(&fixture("qwen3_moe")).config;
    let moe = config
        .moe
        .clone()
        .unwrap_or_else(|| panic!("qwen3_moe has experts"));
    for layer in (0..config.n_layers).filter(|&l| moe.sparse_layers[l]) {
        let prefix = format!("model.layers.{layer}.mlp.experts");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let mut dtype = String::new();
        for e in 0..moe.n_experts {
            let mut take = |w: &str| {
                let (d, _, bytes) = tensors
                    .remove(&format!("{prefix}.{e}.{w}.weight"))
                    .unwrap_or_else(|| panic!("{prefix}.{e}.{w} missing"));
                dtype = d;
                bytes
            };
            gate_up.extend(take("gate_proj"));
            gate_up.extend(take("up_proj"));
            down.extend(take("down_proj"));
        }
        let (e, f, h) = (moe.n_experts, moe.expert_ffn, config.hidden);
        tensors.insert(
            format!("{prefix}.gate_up_proj"),
            (dtype.clone(), vec![e, 2 * f, h], gate_up),
        );
        tensors.insert(format!("{prefix}.down_proj"), (dtype, vec![e, h, f], down));
    }
    write_safetensors(&path, &tensors);
    let stacked = open(dir.path());
    let per_expert = open(&fixture("qwen3_moe"));
    assert_eq!(logits(&stacked), logits(&per_expert));
}

#[test]
fn an_expert_of_the_wrong_width_is_refused_naming_the_tensor() {
    let dir = copy_of("qwen3_moe");
    edit_config(dir.path(), |c| c["moe_intermediate_size"] = json!(16));
    let err = open_err(dir.path());
    assert!(
        err.contains("model.layers.0.mlp.experts.0.gate_proj.weight") && err.contains("16"),
        "{err}"
    );
}

#[test]
fn a_router_for_another_number_of_experts_is_refused_naming_the_tensor() {
    let dir = copy_of("mixtral");
    edit_config(dir.path(), |c| c["num_local_experts"] = json!(8));
    let err = open_err(dir.path());
    assert!(
        err.contains("model.layers.0.block_sparse_moe.gate.weight"),
        "{err}"
    );
}

#[test]
fn more_experts_per_token_than_experts_is_refused() {
    let dir = copy_of("mixtral");
    edit_config(dir.path(), |c| c["num_experts_per_tok"] = json!(5));
    let err = open_err(dir.path());
    assert!(err.contains("experts per token (5)"), "{err}");
}

#[test]
fn a_shared_expert_fallow_would_ignore_is_refused_naming_the_tensor() {
    // Qwen2-MoE-style shared experts are not run: loading one must fail, not drop it.
    let dir = copy_of("qwen3_moe");
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_safetensors(&path);
    tensors.insert(
        "model.layers.0.mlp.shared_expert_gate.weight".into(),
        ("F32".into(), vec![1, 64], vec![0; 256]),
    );
    write_safetensors(&path, &tensors);
    let err = open_err(dir.path());
    assert!(err.contains("shared_expert_gate"), "{err}");
}

#[test]
fn the_experts_each_token_is_routed_to_are_those_transformers_chooses() {
    #[derive(serde::Deserialize)]
    struct Reference {
        sequences: Vec<Vec<u32>>,
        /// Per sequence, per position, per routed layer: transformers' top-k, best first.
        routed_experts: Vec<Vec<Vec<Vec<u32>>>>,
    }
    for name in ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"] {
        let path = fixture(name).join("reference.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        let reference: Reference = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        let artifacts = open(&fixture(name));
        // All sequences in one step: each token's route must still be its own.
        let mut backend = CpuBackend::with_kv_dtype(&artifacts, 16, BLOCK_SIZE, KvDtype::F32)
            .unwrap_or_else(|e| panic!("backend: {e}"));
        let tables: Vec<[u32; 2]> = (0..reference.sequences.len() as u32)
            .map(|i| [2 * i, 2 * i + 1])
            .collect();
        let batch: Vec<SeqSlice<'_>> = reference
            .sequences
            .iter()
            .zip(&tables)
            .map(|(tokens, table)| SeqSlice {
                adapter: None,
                tokens,
                start_pos: 0,
                block_table: table,
                logits: LogitsMode::Last,
            })
            .collect();
        backend
            .forward(&batch)
            .unwrap_or_else(|e| panic!("forward: {e}"));
        let got = backend
            .routed_experts()
            .unwrap_or_else(|| panic!("{name}: an MoE backend keeps its routes"));
        let want: Vec<u32> = reference
            .routed_experts
            .into_iter()
            .flatten()
            .flatten()
            .flatten()
            .collect();
        assert_eq!(got, want.as_slice(), "{name}: routed experts");
    }
}

#[test]
fn a_dense_model_reports_no_routes() {
    let artifacts = open(&fixture("qwen3"));
    let backend = CpuBackend::with_kv_dtype(&artifacts, 4, BLOCK_SIZE, KvDtype::F32)
        .unwrap_or_else(|e| panic!("backend: {e}"));
    assert!(backend.routed_experts().is_none());
}
