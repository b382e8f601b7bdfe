//! The CUDA backend against the CPU backend on the same weights: the CPU backend is the
//! reference (it matches llama.cpp and transformers, see the other conformance suites), so
//! the CUDA backend passes the same suite by agreeing with it.
//!
//! - every tiny architecture fixture (Llama, Qwen2 biases, Qwen3 Q/K norms, Gemma 3 sliding
//!   window, sandwich norms, softcap): logits at every position, prefilled in two chunks so
//!   the second attends to a cached prefix, agree within bf16 tolerance;
//! - a batch mixing prefill chunks and decodes of several sequences gives each sequence the
//!   logits it gets alone (block tables, slots and per-token sequence indices line up);
//! - the default model (SmolLM2 Q4_1) and Gemma 3 270M (Q4_K_M) against llama.cpp's
//!   exact-math fixtures (the CUDA backend dequantizes, so that is its reference; see
//!   [`Case`]): 16 teacher-forced steps of every reference prompt pick llama.cpp's token unless
//!   llama.cpp is within `NEAR_TIE` of a tie, and llama.cpp's top-5 logprobs agree within
//!   `NEAR_TIE`;
//! - the whole engine on CUDA (continuous batching, chunked prefill, greedy tokens picked on
//!   the device) generates llama.cpp's greedy tokens for concurrent requests up to the first
//!   near tie, on both models;
//! - float matrices quantized at load stay close to bf16 (Q8_0, tiny fixtures), and Q4_K at
//!   load (a Llama as wide as its super-blocks) stores the host's blocks and computes their
//!   exact math within bf16 tolerance;
//! - the device argmax equals the host argmax of the same logits; the GEMV kernel (decode)
//!   equals cuBLAS; graph replays, split-K attention and early-started launches (sm_90)
//!   compute what eager, unsplit, plainly launched steps do; the tensor-core prefill
//!   attention agrees with the f32 kernel over a long prompt; draws under grammar masks
//!   (masks uploaded while the step runs, graphs ending before the picks) pick what the
//!   host picks under the same masks.
//!
//! Without a GPU (CI has none) the suite runs on the emulated driver, the kernels compiled
//! for the CPU (`runs_on`): the real models' tests only with `FALLOW_TEST_EMULATOR=all`
//! (minutes each), but for Gemma 3's teacher-forced steps, which no GPU check carries; with
//! neither a driver nor NVRTC every test skips (and fails in CI). The GPU machine runs this binary
//! through `gpu-runner/scripts/gpu-check.sh`.

use std::path::PathBuf;

use fallow_engine::backend::cpu::{CpuBackend, KvDtype};
use fallow_engine::backend::cuda::{
    device, emu, kernels, CudaBackend, CudaDebug, CudaOptions, CudaWeights, MmqMode, PrefillChoice,
    QuantX,
};
use fallow_engine::backend::{Backend, LogitsMode, NoMasks, ReadyMasks, SeqSlice};
use fallow_engine::footprint::KvPoolSize;
use fallow_engine::llm::EngineRequest;
use fallow_engine::lora::{peft, LoraAdapter, LoraPrecision};
use fallow_engine::model::{self, DenseFfn, FeedForward, LayerWeights, ModelArtifacts, Weights};
use fallow_engine::quant::{GgmlType, QMatrix};
use fallow_engine::runtime::{load, Device, LoadOptions};
use fallow_engine::sampler::{mask_disallowed, Sampled, TokenDraw};
use fallow_protocol::job::Sampling;
use fallow_protocol::testing::skip_for_want_of;

/// bf16 weights and activations on CUDA against the CPU backend's f32 activations on the
/// tiny (f32/f16/bf16) fixtures: logits may differ by this fraction of the row's largest
/// |logit| (measured on an H200: 0.005–0.012).
const RELATIVE_TOLERANCE: f32 = 0.05;
/// The reference's top-1/top-2 logit gap under which the CUDA backend may pick the other
/// token, and the bound on |Δ logprob| of the reference's top 5: the CPU suite's bounds.
const NEAR_TIE: f32 = 0.5;
/// Logits with x rounded to int8 per group of 32 (`QuantX::Int8`) against the exact math of
/// the same blocks, relative as `RELATIVE_TOLERANCE`: on the 256-wide random Llama (emulator)
/// 0.028–0.084 over a prompt's chunks (the int8 tensor-core products) and its decodes (0.021–
/// 0.062 against bf16 x), where bf16 weights against f32 ones give 0.015: x's 8 bits move
/// that random model's logits three to five times as far.
const INT8_X_TOLERANCE: f32 = 0.1;
const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 256;

/// The repository root: `FALLOW_REPO_DIR`, the working directory when it is one (the GPU
/// machine runs this binary from a copy of the repo), or where it was built.
fn repo_root() -> PathBuf {
    if let Ok(dir) = std::env::var("FALLOW_REPO_DIR") {
        return PathBuf::from(dir);
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    if cwd.join("gpu-runner/engine/tests/fixtures").is_dir() {
        return cwd;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the suite runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runs {
    /// On a GPU.
    Gpu,
    /// On the emulated driver (the kernels on the CPU): there is no NVIDIA driver here.
    Emulated,
}

/// Where the suite can run, once per process: on a GPU, or where there is no NVIDIA driver
/// on the emulated one (`FALLOW_TEST_EMULATOR=0` skips instead), which also needs NVRTC for
/// the kernels' PTX and a C++ compiler; `None` (each test skips, and fails in CI) where
/// neither.
fn runs_on() -> Option<Runs> {
    static RUNS: std::sync::OnceLock<Option<Runs>> = std::sync::OnceLock::new();
    *RUNS.get_or_init(|| {
        let runs = if device::driver_available() {
            Runs::Gpu
        } else if std::env::var("FALLOW_TEST_EMULATOR").as_deref() == Ok("0") {
            skip_for_want_of(
                "an NVIDIA driver (and FALLOW_TEST_EMULATOR=0 turns the emulated one off)",
            );
            return None;
        } else if !kernels::nvrtc_available() {
            skip_for_want_of(
                "NVRTC to build the kernels for the emulated driver (no NVIDIA driver)",
            );
            return None;
        } else {
            match emu::install_driver() {
                Ok(true) => Runs::Emulated,
                Ok(false) => return None,
                Err(e) => panic!("emulated CUDA driver: {e}"),
            }
        };
        match device::probe(0) {
            Ok(info) => {
                eprintln!("running on {info}");
                Some(runs)
            }
            Err(e) => {
                skip_for_want_of(&format!("a CUDA device: {e}"));
                None
            }
        }
    })
}

/// Whether the suite can run (on a GPU or the emulated driver); prints why not.
fn gpu() -> bool {
    let runs = runs_on();
    if runs.is_none() {
        eprintln!("SKIPPED: no CUDA device, real or emulated");
    }
    runs.is_some()
}

fn tiny(name: &str) -> ModelArtifacts {
    let dir = repo_root()
        .join("gpu-runner/engine/tests/fixtures/tiny")
        .join(name);
    model::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn backends(artifacts: &ModelArtifacts) -> (CpuBackend, CudaBackend) {
    let cpu = CpuBackend::with_kv_dtype(artifacts, NUM_BLOCKS, BLOCK_SIZE, KvDtype::F32)
        .expect("cpu backend");
    let cuda = cuda_with(artifacts, CudaWeights::Bf16);
    (cpu, cuda)
}

/// The options every backend of the suite starts with, its matrices stored as `weights`.
///
/// One GEMV variant for every backend, on the GPU too: most tests compare two backends'
/// logits bit for bit, and timing at each load may pick a tensor-core variant (sums in the
/// hardware's order) in one and a CUDA-core one in the other. On the emulator timing also
/// says nothing and costs seconds per model. The tiny-architecture test checks and times
/// them as at load; the variant tests force each in turn. Likewise the int8 tensor-core
/// products serve every batch they can (not the timing's pick against the expansion), so
/// that the tests reading x as int8 run them; the timing test times them as at load.
fn suite_options(weights: CudaWeights) -> CudaOptions {
    CudaOptions {
        weights,
        kernel_cache: CudaOptions::kernel_cache_from_vars(&|name| std::env::var_os(name)),
        debug: CudaDebug {
            gemv: Some("w8u4".to_string()),
            mmq: MmqMode::Always,
            // The emulated driver's times are the CPU's: one launch per candidate tests the
            // tuning's path; a GPU times it as at load.
            quick_tuning: runs_on() == Some(Runs::Emulated),
            ..CudaDebug::default()
        },
        ..CudaOptions::default()
    }
}

/// A CUDA backend of the suite's pool over `artifacts`, its matrices stored as `storage`.
fn cuda_with(artifacts: &ModelArtifacts, storage: CudaWeights) -> CudaBackend {
    CudaBackend::new(
        artifacts,
        0,
        KvPoolSize::Blocks(NUM_BLOCKS),
        BLOCK_SIZE,
        &suite_options(storage),
    )
    .expect("cuda backend")
}

/// A CUDA backend over `artifacts` (bf16) with a pool of `blocks` blocks (long contexts).
fn cuda_with_pool(artifacts: &ModelArtifacts, blocks: usize) -> CudaBackend {
    CudaBackend::new(
        artifacts,
        0,
        KvPoolSize::Blocks(blocks),
        BLOCK_SIZE,
        &suite_options(CudaWeights::Bf16),
    )
    .expect("cuda backend")
}

/// `cuda` with `x` read as `x` ([`CudaOptions::quant_x`]).
fn read_x_as(cuda: &mut CudaBackend, x: QuantX) {
    cuda.update_options(|o| o.quant_x = x).expect("x as asked");
}

fn table(first: u32, len: usize) -> Vec<u32> {
    (first..first + len.div_ceil(BLOCK_SIZE) as u32).collect()
}

/// Largest |Δ| over rows, relative to each reference row's largest |logit|.
fn relative_diff(cuda: &[f32], cpu: &[f32], vocab: usize) -> f32 {
    assert_eq!(cuda.len(), cpu.len(), "logit row count");
    cuda.chunks_exact(vocab)
        .zip(cpu.chunks_exact(vocab))
        .map(|(g, w)| {
            let scale = w.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            let worst = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            if worst.is_nan() {
                f32::INFINITY
            } else {
                worst / scale
            }
        })
        .fold(0f32, f32::max)
}

/// One decode step: token `s` for sequence `s`, all at `pos`, each returning its logits.
fn decode_step<'a>(tokens: &'a [u32], pos: usize, tables: &'a [Vec<u32>]) -> Vec<SeqSlice<'a>> {
    tokens
        .iter()
        .zip(tables)
        .map(|(token, table)| SeqSlice {
            adapter: None,
            tokens: std::slice::from_ref(token),
            start_pos: pos,
            block_table: table,
            logits: LogitsMode::Last,
        })
        .collect()
}

fn forward_both(
    want: &mut impl Backend,
    got: &mut impl Backend,
    batch: &[SeqSlice<'_>],
) -> (Vec<f32>, Vec<f32>) {
    let a = want.forward(batch).expect("reference forward");
    let b = got.forward(batch).expect("cuda forward");
    (a, b)
}

/// The largest relative |Δ logit| between the backends over one 26-token sequence: two
/// prefill chunks (the second attends to the first as a cached prefix; logits at every
/// position), then three one-token decode steps (the GEMVs, graphs).
fn chunked_prefill_then_decodes_diff(
    cpu: &mut impl Backend,
    cuda: &mut impl Backend,
    vocab: usize,
) -> f32 {
    let tokens: Vec<u32> = (0..26u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let blocks = table(0, tokens.len());
    let split = 9;
    let mut worst = 0f32;
    let mut steps = vec![(0, &tokens[..split]), (split, &tokens[split..23])];
    steps.extend((23..26).map(|p| (p, &tokens[p..p + 1])));
    for (start, chunk) in steps {
        let batch = [SeqSlice {
            adapter: None,
            tokens: chunk,
            start_pos: start,
            block_table: &blocks,
            logits: LogitsMode::All,
        }];
        let (want, got) = forward_both(cpu, cuda, &batch);
        worst = worst.max(relative_diff(&got, &want, vocab));
    }
    worst
}

#[test]
fn every_tiny_architecture_matches_the_cpu_backend_with_a_cached_prefix() {
    if !gpu() {
        return;
    }
    for name in ["llama", "qwen2", "qwen3", "gemma3"] {
        let artifacts = tiny(name);
        let vocab = artifacts.config.vocab_size;
        let (mut cpu, mut cuda) = backends(&artifacts);
        // The GEMV variants checked and timed as at load (the suite forces one, `runs_on`):
        // every one computes the product here.
        cuda.update_options(|o| o.debug.gemv = None)
            .expect("the GEMV variants timed");
        assert_eq!(
            cuda.gemv_variants_rejected(),
            Vec::<&str>::new(),
            "{name}: GEMV variants whose product is wrong on this GPU"
        );
        let worst = chunked_prefill_then_decodes_diff(&mut cpu, &mut cuda, vocab);
        eprintln!("{name}: max relative |Δ logit| {worst:.4}");
        assert!(worst <= RELATIVE_TOLERANCE, "{name}: {worst}");
    }
}

#[test]
fn every_tiny_mixture_of_experts_matches_the_cpu_backend_with_a_cached_prefix() {
    if !gpu() {
        return;
    }
    // Qwen3-MoE, Mixtral, Qwen2-MoE with its shared expert, and gpt-oss (biased experts,
    // clamped SwiGLU, sinks, YaRN, a window of 5 every other layer): the experts' grouped
    // products over prompt chunks (several tiles per expert) and decode steps.
    for name in ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"] {
        let artifacts = tiny(name);
        let vocab = artifacts.config.vocab_size;
        let (mut cpu, mut cuda) = backends(&artifacts);
        let worst = chunked_prefill_then_decodes_diff(&mut cpu, &mut cuda, vocab);
        eprintln!("{name}: max relative |Δ logit| {worst:.4}");
        assert!(worst <= RELATIVE_TOLERANCE, "{name}: {worst}");
    }
}

#[test]
fn gpt_oss_matches_the_cpu_backend_batched_with_either_prefill_kernel_and_split_decodes() {
    if !gpu() {
        return;
    }
    let checkpoint = tiny("gpt_oss");
    let gguf_path =
        repo_root().join("gpu-runner/engine/tests/fixtures/tiny/gpt_oss/model.f32.gguf");
    let gguf = model::open(&gguf_path).unwrap_or_else(|e| panic!("{gguf_path:?}: {e}"));
    // The sinks in every attention kernel: the tensor-core and the f32 prefill, and decodes
    // split over the keys (blocks of 32 of a 128-key table, their merge) or whole; graphs
    // replay the decodes. The GGUF as llama.cpp's converter writes it (YaRN's ramp rounded,
    // the SwiGLU clamped at 7) too.
    let cases = [
        ("checkpoint", &checkpoint, PrefillChoice::Auto, true),
        ("checkpoint", &checkpoint, PrefillChoice::F32, false),
        ("GGUF", &gguf, PrefillChoice::Auto, true),
    ];
    for (what, artifacts, prefill, split) in cases {
        let (mut cpu, mut cuda) = backends(artifacts);
        cuda.update_options(|o| {
            o.debug.prefill = prefill;
            o.debug.split_attention = split;
            o.debug.split_min_keys = 32;
        })
        .expect("prefill kernel and split");
        let vocab = artifacts.config.vocab_size;
        let worst = batched_steps_diff(&mut cpu, &mut cuda, vocab);
        eprintln!(
            "gpt_oss {what}, {prefill:?} prefill, split decodes {split}: max relative |Δ logit| {worst:.4}"
        );
        assert!(
            worst <= RELATIVE_TOLERANCE,
            "{what} {prefill:?} {split}: {worst}"
        );
    }
}

/// The largest relative |Δ logit| between the backends over two sequences sharing steps,
/// logits at every position: both prompts' first chunks in one step, then A's second chunk
/// beside B's decode, then decodes of both (graphs: captured, then replayed) and of A alone;
/// teacher-forced, 46 positions of A (past its sliding layers' window) and 14 of B.
fn batched_steps_diff(cpu: &mut impl Backend, cuda: &mut impl Backend, vocab: usize) -> f32 {
    let token = |s: u32, i: u32| (i * 37 + s * 101 + 5) % vocab as u32;
    let (a, b): (Vec<u32>, Vec<u32>) = (
        (0..46).map(|i| token(0, i)).collect(),
        (0..14).map(|i| token(1, i)).collect(),
    );
    let (table_a, table_b) = (table(0, 128), table(40, 128));
    fn seq<'a>(tokens: &'a [u32], start_pos: usize, block_table: &'a [u32]) -> SeqSlice<'a> {
        SeqSlice {
            adapter: None,
            tokens,
            start_pos,
            block_table,
            logits: LogitsMode::All,
        }
    }
    let mut steps = vec![
        vec![seq(&a[..20], 0, &table_a), seq(&b[..7], 0, &table_b)],
        vec![seq(&a[20..37], 20, &table_a), seq(&b[7..8], 7, &table_b)],
    ];
    for i in 0..6 {
        steps.push(vec![
            seq(&a[37 + i..38 + i], 37 + i, &table_a),
            seq(&b[8 + i..9 + i], 8 + i, &table_b),
        ]);
    }
    steps.extend((43..46).map(|p| vec![seq(&a[p..p + 1], p, &table_a)]));
    let mut worst = 0f32;
    for batch in &steps {
        let (want, got) = forward_both(cpu, cuda, batch);
        worst = worst.max(relative_diff(&got, &want, vocab));
    }
    worst
}

#[test]
fn a_mixture_of_experts_in_its_q8_0_blocks_decodes_as_from_bf16_weights() {
    if !gpu() {
        return;
    }
    let path = repo_root().join("gpu-runner/engine/tests/fixtures/tiny/qwen3_moe/model.q8_0.gguf");
    let artifacts = model::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let vocab = artifacts.config.vocab_size;
    // The experts in the file's Q8_0 blocks (the grouped Q8_0 product) against the same
    // blocks expanded to bf16 at load (the grouped bf16 product): the same weights but for
    // bf16's rounding of each d·q.
    let mut bf16 = cuda_with(&artifacts, CudaWeights::Bf16);
    let mut blocks = cuda_with(&artifacts, CudaWeights::Quantized);
    assert!(
        blocks.weight_bytes() < bf16.weight_bytes() * 2 / 3,
        "the experts stay in their blocks: {} bytes against bf16's {}",
        blocks.weight_bytes(),
        bf16.weight_bytes()
    );
    let worst = chunked_prefill_then_decodes_diff(&mut bf16, &mut blocks, vocab);
    eprintln!("qwen3_moe Q8_0 blocks vs bf16: max relative |Δ logit| {worst:.4}");
    assert!(worst <= RELATIVE_TOLERANCE, "{worst}");
}

/// A LoRA fixture over tiny model `base`, held in f16 as runners serve adapters.
fn lora_fixture(name: &str, base: &ModelArtifacts) -> LoraAdapter {
    let dir = repo_root()
        .join("gpu-runner/engine/tests/fixtures/tiny/lora")
        .join(name);
    peft::load_as(&dir, name, &base.config, LoraPrecision::F16)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The largest relative |Δ logit| between two backends over three sequences, each with
/// its own adapter (or the base), run together: one step of three prompt chunks, two steps
/// of decodes, then a step of one sequence's second chunk beside the others' decodes.
fn mixed_adapter_steps_diff(
    want: &mut impl Backend,
    got: &mut impl Backend,
    adapters: [Option<&LoraAdapter>; 3],
    vocab: usize,
) -> f32 {
    let seqs: Vec<Vec<u32>> = (0..3u32)
        .map(|s| {
            (0..20u32)
                .map(|i| (i * 29 + s * 7 + 3) % vocab as u32)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..3u32).map(|s| table(s * 10, 40)).collect();
    let slice = |s: usize, from: usize, to: usize, logits| SeqSlice {
        adapter: adapters[s],
        tokens: &seqs[s][from..to],
        start_pos: from,
        block_table: &tables[s],
        logits,
    };
    let steps: Vec<Vec<SeqSlice<'_>>> = vec![
        vec![
            slice(0, 0, 5, LogitsMode::All),
            slice(1, 0, 7, LogitsMode::All),
            slice(2, 0, 3, LogitsMode::All),
        ],
        vec![
            slice(0, 5, 6, LogitsMode::Last),
            slice(1, 7, 8, LogitsMode::Last),
            slice(2, 3, 4, LogitsMode::Last),
        ],
        vec![
            slice(0, 6, 7, LogitsMode::Last),
            slice(1, 8, 9, LogitsMode::Last),
            slice(2, 4, 5, LogitsMode::Last),
        ],
        vec![
            slice(0, 7, 8, LogitsMode::Last),
            slice(1, 9, 15, LogitsMode::All),
            slice(2, 5, 6, LogitsMode::Last),
        ],
    ];
    let mut worst = 0f32;
    for step in &steps {
        let (a, b) = forward_both(want, got, step);
        worst = worst.max(relative_diff(&b, &a, vocab));
    }
    worst
}

#[test]
fn lora_adapters_mixed_with_the_base_in_one_step_match_the_cpu_backend() {
    if !gpu() {
        return;
    }
    // Every target (q/k/v/o/gate/up/down) and ranks 4 and 8 over Llama; attention with
    // rank-stabilised scaling and the feed-forward over Qwen3.
    for (name, fixtures) in [
        ("llama", [None, Some("llama_all_r8"), Some("llama_qv_r4")]),
        (
            "qwen3",
            [Some("qwen3_attn_r8_rslora"), None, Some("qwen3_mlp_r4")],
        ),
    ] {
        let artifacts = tiny(name);
        let vocab = artifacts.config.vocab_size;
        let loaded: Vec<Option<LoraAdapter>> = fixtures
            .iter()
            .map(|f| f.map(|f| lora_fixture(f, &artifacts)))
            .collect();
        let adapters = [loaded[0].as_ref(), loaded[1].as_ref(), loaded[2].as_ref()];
        let (mut cpu, mut cuda) = backends(&artifacts);
        let worst = mixed_adapter_steps_diff(&mut cpu, &mut cuda, adapters, vocab);
        eprintln!("{name} with adapters {fixtures:?}: max relative |Δ logit| {worst:.4}");
        assert!(worst <= RELATIVE_TOLERANCE, "{name}: {worst}");
        // The adapters matter: without them the logits are far past the tolerance.
        let (_, mut plain) = backends(&artifacts);
        let (_, mut adapted) = backends(&artifacts);
        let moved = adapter_rows_moved(&mut plain, &mut adapted, adapters, vocab);
        eprintln!("{name}: the adapters move the logits by {moved:.4}");
        assert!(
            moved > 4.0 * RELATIVE_TOLERANCE,
            "{name}: the adapters changed nothing"
        );
    }
}

/// How far the adapters move the logits: `base` runs the steps without adapters, `adapted`
/// with them.
fn adapter_rows_moved(
    base: &mut CudaBackend,
    adapted: &mut CudaBackend,
    adapters: [Option<&LoraAdapter>; 3],
    vocab: usize,
) -> f32 {
    let prompt: Vec<u32> = (0..9u32).map(|i| (i * 29 + 3) % vocab as u32).collect();
    let blocks = table(0, prompt.len());
    let mut moved = 0f32;
    for adapter in adapters.into_iter().flatten() {
        let run = |cuda: &mut CudaBackend, adapter| {
            cuda.forward(&[SeqSlice {
                adapter,
                tokens: &prompt,
                start_pos: 0,
                block_table: &blocks,
                logits: LogitsMode::All,
            }])
            .expect("forward")
        };
        let (plain, with) = (run(base, None), run(adapted, Some(adapter)));
        moved = moved.max(relative_diff(&with, &plain, vocab));
    }
    moved
}

#[test]
fn a_mixed_batch_gives_each_sequence_its_own_logits() {
    if !gpu() {
        return;
    }
    // A dense model, and mixtures of experts (the sequences' tokens routed together).
    for name in ["qwen2", "qwen3_moe", "gpt_oss"] {
        let worst = mixed_batch_against_alone(name);
        eprintln!("{name}: mixed batch vs alone: max relative |Δ logit| {worst:.5}");
        assert!(
            worst <= 0.01,
            "{name}: batched logits differ from solo ones by {worst}"
        );
    }
}

/// The largest relative |Δ logit| between three sequences run together in mixed steps
/// (prefill chunks beside decodes) and each alone, on tiny model `name`.
fn mixed_batch_against_alone(name: &str) -> f32 {
    let artifacts = tiny(name);
    let vocab = artifacts.config.vocab_size;
    let prompts: Vec<Vec<u32>> = [5usize, 13, 2]
        .iter()
        .enumerate()
        .map(|(s, &len)| {
            (0..len as u32)
                .map(|i| (i * 11 + 3 * s as u32 + 1) % vocab as u32)
                .collect()
        })
        .collect();
    // Alone: each sequence in its own fresh backend.
    let mut alone = Vec::new();
    for p in &prompts {
        let (_, mut cuda) = backends(&artifacts);
        let blocks = table(0, p.len());
        alone.push(
            cuda.forward(&[SeqSlice {
                adapter: None,
                tokens: p,
                start_pos: 0,
                block_table: &blocks,
                logits: LogitsMode::All,
            }])
            .expect("forward alone"),
        );
    }
    // Together: sequence 0 and 2 prefilled in one step, sequence 1 in two chunks, the
    // second of which shares a step with decodes of the others' last tokens.
    let (_, mut cuda) = backends(&artifacts);
    let tables: Vec<Vec<u32>> = vec![table(0, 16), table(10, 16), table(20, 16)];
    let first = cuda
        .forward(&[
            SeqSlice {
                adapter: None,
                tokens: &prompts[0][..4],
                start_pos: 0,
                block_table: &tables[0],
                logits: LogitsMode::All,
            },
            SeqSlice {
                adapter: None,
                tokens: &prompts[1][..6],
                start_pos: 0,
                block_table: &tables[1],
                logits: LogitsMode::All,
            },
            SeqSlice {
                adapter: None,
                tokens: &prompts[2][..1],
                start_pos: 0,
                block_table: &tables[2],
                logits: LogitsMode::All,
            },
        ])
        .expect("first step");
    let second = cuda
        .forward(&[
            SeqSlice {
                adapter: None,
                tokens: &prompts[0][4..],
                start_pos: 4,
                block_table: &tables[0],
                logits: LogitsMode::Last,
            },
            SeqSlice {
                adapter: None,
                tokens: &prompts[1][6..],
                start_pos: 6,
                block_table: &tables[1],
                logits: LogitsMode::All,
            },
            SeqSlice {
                adapter: None,
                tokens: &prompts[2][1..],
                start_pos: 1,
                block_table: &tables[2],
                logits: LogitsMode::Last,
            },
        ])
        .expect("second step");
    let row = |v: &[f32], r: usize| v[r * vocab..(r + 1) * vocab].to_vec();
    let mut worst = 0f32;
    // First step rows: seq0 positions 0..4, seq1 0..6, seq2 0.
    for p in 0..4 {
        worst = worst.max(relative_diff(&row(&first, p), &row(&alone[0], p), vocab));
    }
    for p in 0..6 {
        worst = worst.max(relative_diff(
            &row(&first, 4 + p),
            &row(&alone[1], p),
            vocab,
        ));
    }
    worst = worst.max(relative_diff(&row(&first, 10), &row(&alone[2], 0), vocab));
    // Second step rows: seq0 last (4), seq1 positions 6..13, seq2 last (1).
    worst = worst.max(relative_diff(&row(&second, 0), &row(&alone[0], 4), vocab));
    for p in 6..13 {
        worst = worst.max(relative_diff(
            &row(&second, 1 + p - 6),
            &row(&alone[1], p),
            vocab,
        ));
    }
    worst = worst.max(relative_diff(&row(&second, 8), &row(&alone[2], 1), vocab));
    worst
}

/// The default model's file, when there is a GPU to run it on and the file is here. On the
/// emulated driver a test that runs the default model takes minutes, so there only with
/// `FALLOW_TEST_EMULATOR=all`; the tiny fixtures run every path of the backend there.
fn default_model_path_on_gpu() -> Option<PathBuf> {
    model_path_on_gpu(&SMOLLM2)
}

/// `reference`'s file where the suite runs on a GPU, or on the emulated driver with
/// `FALLOW_TEST_EMULATOR=all` (real models take minutes there: a GPU's tier, not CI's).
fn model_path_on_gpu(reference: &Reference) -> Option<PathBuf> {
    if !gpu() {
        return None;
    }
    if runs_on() == Some(Runs::Emulated)
        && std::env::var("FALLOW_TEST_EMULATOR").as_deref() != Ok("all")
    {
        eprintln!(
            "NOT RUN: {} on the emulated driver, a GPU's test (gpu-check.sh runs it; \
             FALLOW_TEST_EMULATOR=all here)",
            reference.name
        );
        return None;
    }
    model_file(reference)
}

/// The default model's artifacts, where [`default_model_path_on_gpu`] gives its file.
fn default_model_on_gpu() -> Option<ModelArtifacts> {
    let path = default_model_path_on_gpu()?;
    Some(model::open(&path).expect("default model"))
}

/// `artifacts` allowed a context of 4096 tokens (a tiny fixture's 256 is a number in its
/// config; its weights and RoPE serve any position), for the long-context comparisons.
fn with_long_context(mut artifacts: ModelArtifacts) -> ModelArtifacts {
    artifacts.config.context_length = artifacts.config.context_length.max(4096);
    artifacts
}

/// The models a comparison of two configurations of the backend runs on: every tiny
/// architecture, then the default model where [`default_model_on_gpu`] gives it.
fn every_model() -> Vec<(String, ModelArtifacts)> {
    if !gpu() {
        return Vec::new();
    }
    let mut models: Vec<(String, ModelArtifacts)> = ["llama", "qwen2", "qwen3", "gemma3"]
        .into_iter()
        .map(|name| (name.to_string(), tiny(name)))
        .collect();
    models.extend(default_model_on_gpu().map(|m| ("the default model".to_string(), m)));
    models
}

/// `len` token ids spread over the vocabulary (distinct enough to be no repeated phrase).
fn spread_prompt(len: u32, vocab: u32) -> Vec<u32> {
    (0..len).map(|i| (i * 7919 + 13) % vocab).collect()
}

fn default_model() -> Option<PathBuf> {
    model_file(&SMOLLM2)
}

/// A model llama.cpp's exact-math fixture was made from: its GGUF (in `models/`, or
/// `FALLOW_MODELS_DIR`) and the fixture.
struct Reference {
    name: &'static str,
    file: &'static str,
    fixture: &'static str,
    /// How `scripts/fetch-models.sh` fetches it.
    fetch: &'static str,
}

/// The default model.
const SMOLLM2: Reference = Reference {
    name: "SmolLM2",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    fixture: "smollm2_logits_f32.json",
    fetch: "scripts/fetch-models.sh",
};

/// Gemma 3 270M: sliding-window layers, q/k norms, sandwich norms, GELU, a 262144-token
/// vocabulary, K-quant blocks.
const GEMMA3: Reference = Reference {
    name: "Gemma 3 270M",
    file: "gemma-3-270m-Q4_K_M.gguf",
    fixture: "gemma3_logits_f32.json",
    fetch: "scripts/fetch-models.sh --gemma",
};

fn model_file(reference: &Reference) -> Option<PathBuf> {
    let dir = std::env::var("FALLOW_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("models"));
    let path = dir.join(reference.file);
    if path.exists() {
        Some(path)
    } else {
        skip_for_want_of(&format!("{} ({})", path.display(), reference.fetch));
        None
    }
}

/// One case of llama.cpp's exact-math fixture (`smollm2_logits_f32.json`, …: the GGUF's
/// weights dequantized to f32, f32 activations and KV cache). The CUDA backend computes
/// with the same dequantized weights (rounded to bf16) and bf16 activations, so this is its
/// reference; the CPU backend quantizes activations like llama.cpp's quantized run and
/// follows `smollm2_logits.json` instead (the two llama.cpp variants differ by up to ~2
/// logits and take different greedy paths; see the fixtures README). The int8-x products
/// round activations as llama.cpp's quantized run does, but are no closer to that run than
/// to this one (SmolLM2: mean |Δ logprob| 0.185 against 0.171, its noise and ours being
/// independent), so they follow this one too, within `INT8_X`'s bounds.
struct Case {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    /// Per greedy step: llama.cpp's top-1/top-2 gap and its top-5 `(id, logprob)`.
    gaps: Vec<f32>,
    top: Vec<Vec<(u32, f32)>>,
}

fn exact_cases(reference: &Reference) -> Vec<Case> {
    let path = repo_root()
        .join("gpu-runner/engine/tests/fixtures")
        .join(reference.fixture);
    let text = std::fs::read_to_string(&path).expect("fixture is committed");
    let json: serde_json::Value = serde_json::from_str(&text).expect("fixture parses");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let steps = c["steps"].as_array().expect("steps");
            Case {
                prompt_ids: ids(&c["prompt_ids"]),
                greedy_ids: ids(&c["greedy_ids"]),
                gaps: steps
                    .iter()
                    .map(|s| s["gap"].as_f64().expect("gap") as f32)
                    .collect(),
                top: steps
                    .iter()
                    .map(|s| {
                        s["top"]
                            .as_array()
                            .expect("top")
                            .iter()
                            .map(|t| {
                                (
                                    t[0].as_u64().expect("id") as u32,
                                    t[1].as_f64().expect("lp") as f32,
                                )
                            })
                            .collect()
                    })
                    .collect(),
            }
        })
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let norm = max + sum.ln() as f32;
    row.iter().map(|&x| x - norm).collect()
}

/// Steps compared per prompt.
const STEPS: usize = 16;

#[test]
fn the_default_model_follows_llama_cpp_exact_math_for_16_teacher_forced_steps() {
    let Some(path) = default_model_path_on_gpu() else {
        return;
    };
    let artifacts = model::open(&path).expect("model opens");
    // Prefills of many tokens: bf16 weights, or the file's blocks expanded per product.
    for storage in [CudaWeights::Bf16, CudaWeights::Quantized] {
        follows_llama_cpp_exact_math(&SMOLLM2, &artifacts, storage);
    }
}

#[test]
fn gemma_3_follows_llama_cpp_exact_math_for_16_teacher_forced_steps() {
    // On the emulated driver too (about a minute; CI runs it): Gemma's file is too large to
    // carry to the GPU machine, so this is where its kernels meet a real Gemma 3.
    if !gpu() {
        return;
    }
    let Some(path) = model_file(&GEMMA3) else {
        return;
    };
    let artifacts = model::open(&path).expect("model opens");
    // Prompts shorter than the 512-token window: every layer attends to all of them.
    for storage in [CudaWeights::Bf16, CudaWeights::Quantized] {
        follows_llama_cpp_exact_math(&GEMMA3, &artifacts, storage);
    }
}

/// `reference`'s prompts, each with its first greedy tokens, prefilled through the CUDA
/// backend: at each step the logprobs of llama.cpp's top 5 within `NEAR_TIE`, and the argmax
/// llama.cpp's token unless it was near a tie there.
fn follows_llama_cpp_exact_math(
    reference: &Reference,
    artifacts: &ModelArtifacts,
    storage: CudaWeights,
) {
    follows_llama_cpp(
        reference,
        &EXACT,
        &format!("{storage:?}"),
        artifacts.config.vocab_size,
        |case| {
            let mut cuda = cuda_with(artifacts, storage);
            // Prompt + the first STEPS-1 greedy tokens in one prefill, all positions' logits:
            // row prompt_len-1+i predicts greedy_ids[i].
            let mut tokens = case.prompt_ids.clone();
            tokens.extend(&case.greedy_ids[..STEPS - 1]);
            let blocks = table(0, tokens.len());
            let logits = cuda
                .forward(&[SeqSlice {
                    adapter: None,
                    tokens: &tokens,
                    start_pos: 0,
                    block_table: &blocks,
                    logits: LogitsMode::All,
                }])
                .expect("forward");
            let vocab = artifacts.config.vocab_size;
            logits[(case.prompt_ids.len() - 1) * vocab..].to_vec()
        },
    );
}

/// As [`follows_llama_cpp_exact_math`], but each greedy token fed back as a decode step (the
/// decode products, not the prefill's expansion and cuBLAS), the products reading x as `x`
/// (int8 x within `INT8_X`'s bounds).
fn decoding_follows_llama_cpp(
    reference: &Reference,
    artifacts: &ModelArtifacts,
    storage: CudaWeights,
    x: QuantX,
) {
    let what = format!("{storage:?}, decoded, x as {x:?}");
    let bounds = match x {
        QuantX::Bf16 => &EXACT,
        QuantX::Int8 => &INT8_X,
    };
    follows_llama_cpp(
        reference,
        bounds,
        &what,
        artifacts.config.vocab_size,
        |case| {
            let mut cuda = cuda_with(artifacts, storage);
            read_x_as(&mut cuda, x);
            assert_eq!(cuda.mmq_formats_rejected(), [], "{what}");
            let len = case.prompt_ids.len() + STEPS;
            let blocks = table(0, len);
            let mut rows = cuda
                .forward(&[SeqSlice {
                    adapter: None,
                    tokens: &case.prompt_ids,
                    start_pos: 0,
                    block_table: &blocks,
                    logits: LogitsMode::Last,
                }])
                .expect("prefill");
            for i in 0..STEPS - 1 {
                let token = [case.greedy_ids[i]];
                rows.extend(
                    cuda.forward(&[SeqSlice {
                        adapter: None,
                        tokens: &token,
                        start_pos: case.prompt_ids.len() + i,
                        block_table: &blocks,
                        logits: LogitsMode::Last,
                    }])
                    .expect("decode step"),
                );
            }
            rows
        },
    );
}

/// How closely a path must follow llama.cpp's exact math: its greedy token may differ only
/// where llama.cpp's top-1/top-2 gap is below `near_tie`; the logprobs of llama.cpp's top 5
/// within `worst` each and `mean` on average.
struct Follows {
    near_tie: f32,
    worst: f32,
    mean: f32,
}

/// bf16 x: the CPU suite's bounds (the mean implied by the worst).
const EXACT: Follows = Follows {
    near_tie: NEAR_TIE,
    worst: NEAR_TIE,
    mean: NEAR_TIE,
};

/// int8 x: every product rounds x to 8 bits per group of 32 first, as llama.cpp's own
/// quantized run does (which sits up to ~2 logits from its exact math: fixtures README).
/// Measured on the emulated driver, decoding the files' own blocks after prompts of 5 to 73
/// tokens prefilled mostly through the int8 tensor-core products (mmq.cu): SmolLM2 (Q4_1,
/// Q8_0) worst 1.16, mean 0.196, 13 near-tie flips in 144 steps; Gemma 3 (Q4_K, Q5_0, Q6_K,
/// Q8_0) 1.61, 0.165, 8 flips (with bf16-x prompts, before mmq.cu: 1.48 / 0.171 and 1.02 /
/// 0.126). A wrong scale or offset moves them by whole logits.
const INT8_X: Follows = Follows {
    near_tie: 1.0,
    worst: 2.0,
    mean: 0.25,
};

/// Checks `step_logits(case)` (STEPS rows: row i predicts greedy_ids[i]) of every prompt of
/// `reference` against llama.cpp within `bounds`.
fn follows_llama_cpp(
    reference: &Reference,
    bounds: &Follows,
    what: &str,
    vocab: usize,
    step_logits: impl Fn(&Case) -> Vec<f32>,
) {
    let (mut worst_lp, mut sum_lp, mut compared) = (0f32, 0f64, 0usize);
    let mut flips = 0;
    for (case_no, case) in exact_cases(reference).iter().enumerate() {
        let logits = step_logits(case);
        for i in 0..STEPS {
            let lp = log_softmax(&logits[i * vocab..(i + 1) * vocab]);
            for &(id, want) in &case.top[i] {
                let diff = (lp[id as usize] - want).abs();
                worst_lp = worst_lp.max(diff);
                sum_lp += f64::from(diff);
                compared += 1;
            }
            let ours = fallow_engine::sampler::argmax(&lp);
            if ours != case.greedy_ids[i] {
                assert!(
                    case.gaps[i] < bounds.near_tie,
                    "{} ({what}) prompt {case_no}, step {i}: CUDA picked {ours}, llama.cpp {} \
                     with a gap of {}",
                    reference.name,
                    case.greedy_ids[i],
                    case.gaps[i]
                );
                flips += 1;
            }
        }
    }
    let mean_lp = (sum_lp / compared.max(1) as f64) as f32;
    eprintln!(
        "{} ({what}) vs llama.cpp f32: |Δ logprob| over llama.cpp's top-5 max {worst_lp:.4}, \
         mean {mean_lp:.4}; {flips} near-tie flips in {STEPS} steps of every prompt",
        reference.name
    );
    assert!(
        worst_lp <= bounds.worst && mean_lp <= bounds.mean,
        "{} ({what}): top-5 logprobs differ by {worst_lp} (mean {mean_lp})",
        reference.name
    );
}

#[test]
fn the_default_model_decoding_its_q4_1_blocks_follows_llama_cpp_with_x_as_int8_and_as_bf16() {
    // The default model's own Q4_1 (and Q8_0 head) blocks.
    decoding_its_blocks_follows_llama_cpp_with_either_x(&SMOLLM2);
}

#[test]
fn gemma_3_decoding_its_k_quant_blocks_follows_llama_cpp_with_x_as_int8_and_as_bf16() {
    // A real K-quant model (its Q4_K_M file: Q4_K, Q5_0, Q6_K and Q8_0 blocks; minutes on the
    // emulated driver).
    decoding_its_blocks_follows_llama_cpp_with_either_x(&GEMMA3);
}

/// Decode steps of `reference`'s file, its blocks kept as stored, on a GPU or with
/// FALLOW_TEST_EMULATOR=all: the int8-x products of QuantX::Int8 and, beside them, the
/// bf16-x ones.
fn decoding_its_blocks_follows_llama_cpp_with_either_x(reference: &Reference) {
    let Some(path) = model_path_on_gpu(reference) else {
        return;
    };
    let artifacts = model::open(&path).expect("model opens");
    for x in [QuantX::Int8, QuantX::Bf16] {
        decoding_follows_llama_cpp(reference, &artifacts, CudaWeights::Quantized, x);
    }
}

/// Logits of `steps` teacher-forced decode steps of `sequences` sequences (fixed tokens, so
/// that two storages cannot take different paths), and the weights' bytes on the device.
fn teacher_forced_decodes(
    artifacts: &ModelArtifacts,
    storage: CudaWeights,
    sequences: u32,
    steps: usize,
) -> (Vec<f32>, usize) {
    teacher_forced_decodes_after(artifacts, storage, |_| {}, sequences, steps)
}

/// As [`teacher_forced_decodes`], the backend first set up by `setup`.
fn teacher_forced_decodes_after(
    artifacts: &ModelArtifacts,
    storage: CudaWeights,
    setup: impl FnOnce(&mut CudaBackend),
    sequences: u32,
    steps: usize,
) -> (Vec<f32>, usize) {
    let vocab = artifacts.config.vocab_size as u32;
    let tables: Vec<Vec<u32>> = (0..sequences).map(|s| table(s * 16, 40)).collect();
    let mut cuda = cuda_with(artifacts, storage);
    setup(&mut cuda);
    let mut all = Vec::new();
    for pos in 0..steps {
        let tokens: Vec<u32> = (0..sequences)
            .map(|s| (s * 977 + pos as u32 * 131 + 5) % vocab)
            .collect();
        let logits = cuda
            .forward(&decode_step(&tokens, pos, &tables))
            .expect("decode step");
        all.extend(logits);
    }
    (all, cuda.weight_bytes())
}

#[test]
fn decode_steps_from_quantized_blocks_match_decode_from_bf16_weights() {
    let Some(artifacts) = default_model_on_gpu() else {
        return;
    };
    let vocab = artifacts.config.vocab_size;
    // Three sequences: the GEMV path.
    let run = |storage| teacher_forced_decodes(&artifacts, storage, 3, 16);
    let (bf16, bf16_bytes) = run(CudaWeights::Bf16);
    let (blocks, block_bytes) = run(CudaWeights::Quantized);
    let diff = relative_diff(&blocks, &bf16, vocab);
    eprintln!(
        "quantized blocks ({block_bytes} B) vs bf16 ({bf16_bytes} B) decode logits: max \
         relative |Δ| {diff:.5}"
    );
    assert!(block_bytes < bf16_bytes, "the blocks are smaller");
    // bf16 rounds every weight (2^-9 relative); the blocks are read exactly.
    assert!(diff <= 0.03, "quantized and bf16 decodes differ by {diff}");
}

fn generate_all(device: Device, prompts: &[Vec<u32>], path: &std::path::Path) -> Vec<Vec<u32>> {
    let options = LoadOptions {
        device,
        max_num_seqs: 8,
        // Small steps: prompts are prefilled in chunks next to other sequences' decodes.
        max_batched_tokens: 32,
        kv_cache_bytes: 64 << 20,
        cuda: suite_options(CudaWeights::Bf16),
        ..LoadOptions::default()
    };
    let mut loaded = load(path, &options).expect("model loads");
    for (i, prompt) in prompts.iter().enumerate() {
        loaded
            .engine
            .add_request(EngineRequest {
                id: i as u64,
                prompt: prompt.clone(),
                sampling: Sampling {
                    max_tokens: Some(STEPS as u32),
                    temperature: 0.0,
                    ignore_eos: true,
                    ..Sampling::default()
                },
                n: 1,
                priority: 0,
                resume: None,
                adapter: None,
            })
            .expect("request accepted");
    }
    let mut out = vec![Vec::new(); prompts.len()];
    while loaded.engine.has_work() {
        for o in loaded.engine.step().expect("step") {
            out[o.request_id as usize].extend(&o.token_ids);
        }
    }
    out
}

#[test]
fn the_engine_on_cuda_generates_llama_cpp_exact_greedy_tokens_for_concurrent_requests() {
    for reference in [&SMOLLM2, &GEMMA3] {
        if let Some(path) = model_path_on_gpu(reference) {
            generates_llama_cpp_greedy_tokens(reference, &path);
        }
    }
}

/// The engine on CUDA, given every prompt of `reference`'s fixture at once, generates
/// llama.cpp's greedy tokens up to llama.cpp's first near tie.
fn generates_llama_cpp_greedy_tokens(reference: &Reference, path: &std::path::Path) {
    let cases = exact_cases(reference);
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt_ids.clone()).collect();
    // Eight at a time with 32-token steps: chunked prefill beside decodes, greedy tokens
    // picked on the device.
    let got = generate_all(Device::Cuda(0), &prompts, path);
    let name = reference.name;
    for (i, (case, ours)) in cases.iter().zip(&got).enumerate() {
        assert_eq!(
            ours.len(),
            STEPS,
            "{name} request {i} generated {} tokens",
            ours.len()
        );
        // Free-running paths are compared up to llama.cpp's first near tie.
        let comparable = case.gaps[..STEPS]
            .iter()
            .position(|&g| g < NEAR_TIE)
            .unwrap_or(STEPS);
        let same = ours
            .iter()
            .zip(&case.greedy_ids)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!("{name} request {i}: {same} identical tokens, {comparable} before a near tie");
        assert!(
            same >= comparable,
            "{name} request {i}: diverged at {same}, before llama.cpp's first near tie at \
             {comparable}"
        );
    }
}

#[test]
fn greedy_tokens_picked_on_the_device_are_the_argmax_of_the_logits() {
    if !gpu() {
        return;
    }
    let artifacts = tiny("gemma3");
    let prompts: [Vec<u32>; 3] = [vec![5, 9, 2], vec![7], vec![1, 2, 3, 4, 5, 6]];
    let tables = [table(0, 8), table(10, 8), table(20, 8)];
    let batch = |mode: LogitsMode| -> Vec<SeqSlice<'_>> {
        prompts
            .iter()
            .zip(&tables)
            .enumerate()
            .map(|(i, (p, t))| SeqSlice {
                adapter: None,
                tokens: p,
                start_pos: 0,
                block_table: t,
                // Sequence 1 always wants its logits: the two kinds of row mix.
                logits: if i == 1 { LogitsMode::Last } else { mode },
            })
            .collect()
    };
    let (_, mut a) = backends(&artifacts);
    let (_, mut b) = backends(&artifacts);
    let logits = a.forward(&batch(LogitsMode::Last)).expect("logits");
    let step = b
        .forward_step(&batch(LogitsMode::Argmax), &mut NoMasks)
        .expect("argmax");
    let vocab = artifacts.config.vocab_size;
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    let want: Vec<u32> = [rows[0], rows[2]]
        .iter()
        .map(|r| fallow_engine::sampler::argmax(r))
        .collect();
    let picked: Vec<u32> = step.picked.iter().map(|p| p.token).collect();
    assert_eq!(picked, want);
    assert_eq!(step.logits, rows[1].to_vec());
}

#[test]
fn tokens_drawn_on_the_device_are_the_host_definitions_draws_from_the_same_logits() {
    if !gpu() {
        return;
    }
    let artifacts = tiny("llama");
    let vocab = artifacts.config.vocab_size;
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|s| vec![s + 1, 2 * s + 3, 7]).collect();
    let tables: Vec<Vec<u32>> = (0..6u32).map(|s| table(s * 4, 8)).collect();
    let knobs = [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 0.9, 0.0),
        (1.0, 20, 1.0, 0.0),
        (1.5, 0, 1.0, 0.05),
        (0.9, 40, 0.8, 0.02),
        (1.0, 1, 1.0, 0.0),
    ];
    let mut mismatches = 0;
    for (round, u) in [0.05f32, 0.5, 0.93].into_iter().enumerate() {
        let draws: Vec<TokenDraw> = knobs
            .iter()
            .map(|&(temperature, top_k, top_p, min_p)| TokenDraw {
                temperature,
                top_k,
                top_p,
                min_p,
                u: (u + round as f32 * 0.01).min(0.99),
                // Some rows report logprobs too.
                logprobs: (top_k > 10).then_some(5),
            })
            .collect();
        let batch = |draw: bool| -> Vec<SeqSlice<'_>> {
            prompts
                .iter()
                .zip(&tables)
                .zip(&draws)
                .map(|((p, t), d)| SeqSlice {
                    adapter: None,
                    tokens: p,
                    start_pos: 0,
                    block_table: t,
                    logits: if draw {
                        LogitsMode::Draw(*d)
                    } else {
                        LogitsMode::Last
                    },
                })
                .collect()
        };
        let (_, mut a) = backends(&artifacts);
        let (_, mut b) = backends(&artifacts);
        let logits = a.forward(&batch(false)).expect("logits");
        let step = b.forward_step(&batch(true), &mut NoMasks).expect("draws");
        let want: Vec<Sampled> = logits
            .chunks_exact(vocab)
            .zip(&draws)
            .map(|(row, d)| d.draw(row))
            .collect();
        // exp on the device and on the host may round a weight differently: a draw landing
        // within that rounding of a boundary may pick the neighbour. Count, do not demand.
        for (g, w) in step.picked.iter().zip(&want) {
            if g.token != w.token {
                mismatches += 1;
                continue;
            }
            if let (Some(gl), Some(wl)) = (g.logprob, w.logprob) {
                assert!((gl - wl).abs() < 1e-3, "logprob {gl} vs {wl}");
            }
            assert_eq!(g.top.len(), w.top.len(), "as many alternatives");
            for ((gt, glp), (wt, wlp)) in g.top.iter().zip(&w.top) {
                assert_eq!(gt, wt, "the same alternatives");
                assert!(
                    (glp - wlp).abs() < 1e-3,
                    "alternative logprob {glp} vs {wlp}"
                );
            }
        }
    }
    eprintln!("device draws differing from the host definition: {mismatches} of 18");
    assert!(mismatches <= 1, "{mismatches} of 18 device draws differ");
}

#[test]
fn masked_draws_on_the_device_pick_what_the_host_picks_under_the_same_masks() {
    if !gpu() {
        return;
    }
    let artifacts = tiny("llama");
    let vocab = artifacts.config.vocab_size;
    let words = vocab.div_ceil(32);
    // Three constrained sequences (two greedy, one sampled) and one plain draw; masks
    // allowing every third token, a handful, and all but the first 64.
    let thirds: Vec<u32> = (0..words).map(|_| 0x4924_9249).collect();
    let handful: Vec<u32> = (0..words)
        .map(|w| if w % 3 == 1 { 0x0101 } else { 0 })
        .collect();
    let tail: Vec<u32> = (0..words)
        .map(|w| if w < 2 { 0 } else { u32::MAX })
        .collect();
    let masks: [&[u32]; 3] = [&thirds, &handful, &tail];
    let draws = [
        TokenDraw::GREEDY,
        TokenDraw {
            temperature: 0.9,
            top_p: 0.95,
            u: 0.37,
            logprobs: Some(3),
            ..TokenDraw::GREEDY
        },
        TokenDraw::GREEDY,
        TokenDraw {
            temperature: 1.0,
            u: 0.61,
            ..TokenDraw::GREEDY
        },
    ];
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|s| vec![s + 1, 2 * s + 3, 7]).collect();
    let tables: Vec<Vec<u32>> = (0..4u32).map(|s| table(s * 4, 16)).collect();
    let (_, mut a) = backends(&artifacts);
    let (_, mut b) = backends(&artifacts);
    let mut mismatches = 0;
    // The prompts, then single-token steps (a CUDA graph of the masked kind is captured on
    // the second and replayed after), teacher-forced so that both backends see the same.
    for step in 0..5usize {
        let batch = |drawn: bool| -> Vec<SeqSlice<'_>> {
            (0..4)
                .map(|s| SeqSlice {
                    adapter: None,
                    tokens: if step == 0 {
                        &prompts[s][..]
                    } else {
                        std::slice::from_ref(&prompts[s][(s + step) % 3])
                    },
                    start_pos: if step == 0 { 0 } else { 2 + step },
                    block_table: &tables[s],
                    logits: match (drawn, s) {
                        (false, _) => LogitsMode::Last,
                        (true, 3) => LogitsMode::Draw(draws[3]),
                        (true, _) => LogitsMode::DrawMasked(draws[s]),
                    },
                })
                .collect()
        };
        let logits = a.forward(&batch(false)).expect("logits");
        let out = b
            .forward_step(&batch(true), &mut ReadyMasks(masks.to_vec()))
            .expect("masked draws");
        assert_eq!(out.picked.len(), 4);
        for (s, row) in logits.chunks_exact(vocab).enumerate() {
            let mut masked = row.to_vec();
            if let Some(mask) = masks.get(s) {
                mask_disallowed(&mut masked, mask);
            }
            let want = draws[s].draw(&masked);
            let got = &out.picked[s];
            if let Some(mask) = masks.get(s) {
                let t = got.token as usize;
                assert!(
                    mask[t / 32] >> (t % 32) & 1 == 1,
                    "step {step} seq {s}: {t} is masked"
                );
            }
            if draws[s].temperature == 0.0 {
                assert_eq!(
                    got.token, want.token,
                    "step {step} seq {s}: greedy under a mask"
                );
            } else if got.token != want.token {
                // exp rounds differently on the device (see the unmasked draws' test).
                mismatches += 1;
            }
        }
    }
    assert!(mismatches <= 1, "{mismatches} of 10 sampled draws differ");
}

#[test]
fn the_gemv_kernel_and_cublas_give_the_same_decode_logits() {
    if !gpu() {
        return;
    }
    let artifacts = tiny("llama");
    let vocab = artifacts.config.vocab_size;
    let prompts: Vec<Vec<u32>> = (0..5u32).map(|s| vec![s + 1, 2 * s + 3, 7]).collect();
    let tables: Vec<Vec<u32>> = (0..5u32).map(|s| table(s * 4, 8)).collect();
    let run = |gemv: usize| -> Vec<f32> {
        let (_, mut cuda) = backends(&artifacts);
        cuda.update_options(|o| o.debug.gemv_max_rows = Some(gemv))
            .expect("a row count");
        // Prefill (15 rows: cuBLAS either way), then one decode step of 5 rows.
        let prefill: Vec<SeqSlice<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqSlice {
                adapter: None,
                tokens: &p[..2],
                start_pos: 0,
                block_table: t,
                logits: LogitsMode::None,
            })
            .collect();
        cuda.forward(&prefill).expect("prefill");
        let decode: Vec<SeqSlice<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqSlice {
                adapter: None,
                tokens: &p[2..],
                start_pos: 2,
                block_table: t,
                logits: LogitsMode::Last,
            })
            .collect();
        cuda.forward(&decode).expect("decode")
    };
    let diff = relative_diff(&run(8), &run(0), vocab);
    eprintln!("GEMV vs cuBLAS decode logits: max relative |Δ| {diff:.6}");
    // Different summation orders, then bf16 rounding of the next layers' inputs.
    assert!(diff <= 1e-2, "GEMV and cuBLAS differ by {diff}");
}

/// The logits of decode steps of 1, 2, … rows (a row per table, each sequence prefilled with
/// `prompt`; sequence s joins the decodes at step s + 1) with every GEMV forced to `variant`:
/// every GEMV product of the model at each row count.
fn staggered_decodes(
    artifacts: &ModelArtifacts,
    variant: &str,
    prompt: &[u32],
    tables: &[Vec<u32>],
) -> Vec<f32> {
    let mut cuda = cuda_with(artifacts, CudaWeights::Bf16);
    cuda.update_options(|o| o.debug.gemv = Some(variant.to_string()))
        .expect("a variant");
    for table in tables {
        cuda.forward(&[SeqSlice {
            adapter: None,
            tokens: prompt,
            start_pos: 0,
            block_table: table,
            logits: LogitsMode::None,
        }])
        .expect("prefill");
    }
    let mut all = Vec::new();
    for rows in 1..=tables.len() {
        let tokens: Vec<u32> = (0..rows as u32).map(|s| s * 11 + 5).collect();
        let step: Vec<SeqSlice<'_>> = tokens
            .iter()
            .zip(tables)
            .enumerate()
            .map(|(s, (token, table))| SeqSlice {
                adapter: None,
                tokens: std::slice::from_ref(token),
                start_pos: prompt.len() + rows - 1 - s,
                block_table: table,
                logits: LogitsMode::Last,
            })
            .collect();
        all.extend(cuda.forward(&step).expect("decode"));
    }
    all
}

#[test]
fn every_gemv_variant_gives_the_same_decode_logits_and_the_tensor_cores_close_ones() {
    let Some(artifacts) = default_model_on_gpu() else {
        return;
    };
    let vocab = artifacts.config.vocab_size as u32;
    let prompt = spread_prompt(40, vocab);
    let tables: Vec<Vec<u32>> = (0..3u32).map(|s| table(s * 16, 60)).collect();
    let run = |variant: &str| staggered_decodes(&artifacts, variant, &prompt, &tables);
    let reference = run("w8u4");
    let variants = [
        "w4u4", "w4u8", "w8u8", "w16u4", "w16u8", "w4u4p", "w4u8p", "w8u4p", "w8u8p", "w16u4p",
        "w16u8p", "w4u4r", "w4u8r", "w8u4r", "w8u8r", "w16u4r", "w16u8r",
    ];
    // And two with L2 kept asked for the rows ahead of their loads (hints: the same sums).
    let ahead = ["w8u4:2048", "w16u8r:8192"];
    for variant in variants.into_iter().chain(ahead) {
        // Each lane sums the same chunks in the same order in every variant.
        assert!(run(variant) == reference, "{variant} differs from w8u4");
    }
    // The tensor-core GEMV sums in the hardware's order: close to those logits, not them.
    for variant in ["m4s2", "m8s4", "m8s4k", "m4s2k:2048"] {
        let diff = relative_diff(&run(variant), &reference, vocab as usize);
        eprintln!("{variant} vs w8u4: max relative |Δ logit| {diff:.6}");
        assert!(diff <= 1e-2, "{variant} differs from w8u4 by {diff}");
    }
}

/// On every tiny architecture (every input width a whole number of 32-input steps), decode
/// steps of 1 to 3 sequences through the tensor-core GEMV — a tile per warp, and one tile per
/// block split over K — give the CUDA-core GEMV's logits to f32 summation order and the bf16
/// roundings after it (the GLU-output form and the fused norms included; at these widths
/// the sums of bf16 products are exact in f32, so the emulator gives the same logits).
#[test]
fn tensor_core_gemvs_decode_every_tiny_architecture_as_the_cuda_cores_do() {
    if !gpu() {
        return;
    }
    for name in ["llama", "qwen2", "qwen3", "gemma3"] {
        let artifacts = tiny(name);
        let vocab = artifacts.config.vocab_size;
        let prompt = spread_prompt(12, vocab as u32);
        let tables: Vec<Vec<u32>> = (0..3u32).map(|s| table(s * 4, 24)).collect();
        let run = |variant: &str| staggered_decodes(&artifacts, variant, &prompt, &tables);
        let reference = run("w8u4");
        for variant in ["m8s4", "m4s2k"] {
            let diff = relative_diff(&run(variant), &reference, vocab);
            eprintln!("{name}: {variant} vs w8u4 decode logits: max relative |Δ| {diff:.6}");
            assert!(
                diff <= 1e-2,
                "{name}: {variant} differs from w8u4 by {diff}"
            );
        }
    }
}

#[test]
fn decode_steps_replayed_from_cuda_graphs_equal_eager_ones() {
    if !gpu() {
        return;
    }
    // A dense model, and mixtures of experts (routed on the device inside the graph).
    for name in ["qwen3", "qwen3_moe", "gpt_oss"] {
        graphs_replay_eager_decodes(name);
    }
}

/// Two sequences of tiny model `name` decoding 80 greedy steps give the same logits from
/// CUDA graphs as from eager launches.
fn graphs_replay_eager_decodes(name: &str) {
    let artifacts = tiny(name);
    let run = |graphs: bool| -> Vec<f32> {
        let (_, mut cuda) = backends(&artifacts);
        cuda.update_options(|o| o.debug.graphs = graphs)
            .expect("graphs on or off");
        // Two sequences decoding 80 steps: past 64 positions their block tables outgrow the
        // first captured width (16 blocks of 4), so a second graph is captured on the way.
        let tables = [table(0, 96), table(100, 96)];
        let mut tokens = [3u32, 11u32];
        let mut all = Vec::new();
        for pos in 0..80 {
            let logits = cuda
                .forward(&decode_step(&tokens, pos, &tables))
                .expect("decode step");
            let vocab = artifacts.config.vocab_size;
            for s in 0..2 {
                tokens[s] = fallow_engine::sampler::argmax(&logits[s * vocab..(s + 1) * vocab]);
            }
            all.extend(logits);
        }
        if graphs {
            assert!(
                cuda.graphs_captured() >= 2,
                "{} graphs captured: a failed capture runs eagerly",
                cuda.graphs_captured()
            );
        }
        all
    };
    let eager = run(false);
    let replayed = run(true);
    assert!(
        eager == replayed,
        "{name}: graph replay differs from eager launches (max |Δ| {})",
        eager
            .iter()
            .zip(&replayed)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
    );
}

#[test]
fn long_context_decodes_split_over_the_keys_equal_unsplit_ones() {
    for (name, artifacts) in every_model() {
        let artifacts = with_long_context(artifacts);
        let vocab = artifacts.config.vocab_size;
        // 2000 cached tokens: one decoding sequence is 3 attention blocks per token on
        // SmolLM2 (9 query heads, 3 KV heads), 2 on the tiny models, so the plan splits its
        // keys over many more.
        let prompt = spread_prompt(2000, vocab as u32);
        let blocks = table(0, prompt.len() + 8);
        let run = |split: bool| -> Vec<f32> {
            let mut cuda = cuda_with_pool(&artifacts, blocks.len());
            cuda.update_options(|o| o.debug.split_attention = split)
                .expect("split or not");
            cuda.forward(&[SeqSlice {
                adapter: None,
                tokens: &prompt,
                start_pos: 0,
                block_table: &blocks,
                logits: LogitsMode::None,
            }])
            .expect("prefill");
            let mut all = Vec::new();
            let mut token = 1u32;
            for step in 0..4 {
                let logits = cuda
                    .forward(&[SeqSlice {
                        adapter: None,
                        tokens: std::slice::from_ref(&token),
                        start_pos: prompt.len() + step,
                        block_table: &blocks,
                        logits: LogitsMode::Last,
                    }])
                    .expect("decode");
                token = fallow_engine::sampler::argmax(&logits);
                all.extend(logits);
            }
            all
        };
        let diff = relative_diff(&run(true), &run(false), vocab);
        eprintln!(
            "{name}: split-K vs whole attention, 2000-token context: max relative |Δ logit| {diff:.6}"
        );
        // The same sums in another order, rounded to bf16 once more at the merge.
        assert!(
            diff <= 1e-2,
            "{name}: split and unsplit attention differ by {diff}"
        );
    }
}

#[test]
fn tensor_core_prefill_attention_matches_the_f32_kernel_over_a_long_prompt() {
    for (name, artifacts) in every_model() {
        let artifacts = with_long_context(artifacts);
        let vocab = artifacts.config.vocab_size as u32;
        // 1500 tokens in two chunks (the second attends to a cached prefix of 1000), then
        // teacher-forced decodes that read what every layer's prefill attention produced.
        let prompt = spread_prompt(1500, vocab);
        let blocks = table(0, prompt.len() + 8);
        let steps = |backend: &mut dyn Backend| -> Vec<f32> {
            let mut all = Vec::new();
            for (start, end, logits) in [(0, 1000, LogitsMode::None), (1000, 1500, LogitsMode::All)]
            {
                all.extend(
                    backend
                        .forward(&[SeqSlice {
                            adapter: None,
                            tokens: &prompt[start..end],
                            start_pos: start,
                            block_table: &blocks,
                            logits,
                        }])
                        .expect("prefill chunk"),
                );
            }
            for step in 0..4u32 {
                let token = [(step * 31 + 2) % vocab];
                all.extend(
                    backend
                        .forward(&[SeqSlice {
                            adapter: None,
                            tokens: &token,
                            start_pos: prompt.len() + step as usize,
                            block_table: &blocks,
                            logits: LogitsMode::Last,
                        }])
                        .expect("decode"),
                );
            }
            all
        };
        let run = |kernel: PrefillChoice| -> Vec<f32> {
            let mut cuda = cuda_with_pool(&artifacts, blocks.len());
            cuda.update_options(|o| o.debug.prefill = kernel)
                .expect("the heads fit both");
            steps(&mut cuda)
        };
        let tensor = run(PrefillChoice::TensorCores);
        let f32_kernel = run(PrefillChoice::F32);
        let diff = relative_diff(&tensor, &f32_kernel, vocab as usize);
        // An independent reference: the CPU backend (f32 attention over an f32 cache; on the
        // default model, activations quantized to 8 bits as llama.cpp does).
        let mut cpu = CpuBackend::with_kv_dtype(&artifacts, blocks.len(), BLOCK_SIZE, KvDtype::F32)
            .expect("cpu backend");
        let cpu_logits = steps(&mut cpu);
        let (tensor_cpu, f32_cpu) = (
            relative_diff(&tensor, &cpu_logits, vocab as usize),
            relative_diff(&f32_kernel, &cpu_logits, vocab as usize),
        );
        eprintln!(
            "{name}: tensor-core vs f32 prefill attention, 1500 tokens: max relative |Δ logit| {diff:.6} (against the CPU backend: tensor cores {tensor_cpu:.6}, f32 {f32_cpu:.6})"
        );
        // Q is multiplied to ~16 bits either way; P rounded to bf16 and another summation
        // order. So the tensor cores are no further from the CPU backend than the f32 kernel
        // (a kernel that attends to the wrong keys is far off)...
        assert!(
            tensor_cpu <= 1.25 * f32_cpu + 1e-3,
            "{name}: tensor cores {tensor_cpu} from the CPU backend, the f32 kernel {f32_cpu}"
        );
        // ...and the two differ by 1e-2 at most where logits move little with their inputs
        // (the random tiny models), and on a trained model (the default model: scores in the
        // tens, 30 layers of residual stream, a 1500-token prompt; 0.038 on an H200) by under
        // half of what separates the f32 kernel from the CPU backend there (0.115).
        let bound = 1e-2f32.max(f32_cpu / 2.0);
        assert!(
            diff <= bound,
            "{name}: the prefill kernels differ by {diff} (bound {bound})"
        );
    }
}

#[test]
fn decode_steps_padded_to_a_graph_bucket_equal_unpadded_eager_ones() {
    if !gpu() {
        return;
    }
    let artifacts = tiny("llama");
    let vocab = artifacts.config.vocab_size;
    // 12 sequences: padded to the 16-row graph, whose GEMMs go through cuBLAS.
    let tables: Vec<Vec<u32>> = (0..12u32).map(|s| table(s * 16, 40)).collect();
    let run = |graphs: bool| -> Vec<f32> {
        let (_, mut cuda) = backends(&artifacts);
        cuda.update_options(|o| o.debug.graphs = graphs)
            .expect("graphs on or off");
        let mut all = Vec::new();
        // Teacher-forced: the same tokens whatever the logits, so that a near tie cannot
        // send the two runs down different paths. Step 0 runs eagerly, step 1 captures,
        // the rest replay.
        for pos in 0..6 {
            let tokens: Vec<u32> = (0..12u32)
                .map(|s| (s * 31 + pos as u32 * 7 + 1) % vocab as u32)
                .collect();
            let logits = cuda
                .forward(&decode_step(&tokens, pos, &tables))
                .expect("decode step");
            all.extend(logits);
        }
        assert_eq!(
            cuda.graphs_captured(),
            usize::from(graphs),
            "the 16-row graph"
        );
        all
    };
    let diff = relative_diff(&run(true), &run(false), vocab);
    eprintln!("padded graph vs eager, 12 sequences: max relative |Δ logit| {diff:.6}");
    // cuBLAS may pick other kernels for 16 rows than for 12 (another summation order).
    assert!(diff <= 1e-2, "padded graph replay differs by {diff}");
}

/// A prefill (cuBLAS, tiled prefill attention), then a step mixing one sequence's decode
/// with another's prompt, then decodes of both (GEMV, graphs captured and replayed), then of
/// one alone (batch 1), teacher-forced so that every configuration takes the same path: all
/// their logits.
fn prefill_mixed_step_and_decodes(cuda: &mut CudaBackend, vocab: u32) -> Vec<f32> {
    cuda.update_options(|o| o.debug.graphs = true)
        .expect("graphs on");
    let all = mixed_steps(cuda, vocab);
    // Two-sequence and one-sequence decodes: a graph each.
    assert_eq!(cuda.graphs_captured(), 2, "graphs captured");
    all
}

/// [`prefill_mixed_step_and_decodes`]'s steps on any backend: all their logits.
fn mixed_steps(backend: &mut dyn Backend, vocab: u32) -> Vec<f32> {
    let cuda = backend;
    let prompt_a = spread_prompt(200, vocab);
    let prompt_b: Vec<u32> = (0..50u32).map(|i| (i * 104_729 + 5) % vocab).collect();
    let (table_a, table_b) = (table(0, 240), table(64, 90));
    let mut all = Vec::new();
    all.extend(
        cuda.forward(&[SeqSlice {
            adapter: None,
            tokens: &prompt_a,
            start_pos: 0,
            block_table: &table_a,
            logits: LogitsMode::Last,
        }])
        .expect("prefill"),
    );
    let next = [1u32];
    all.extend(
        cuda.forward(&[
            SeqSlice {
                adapter: None,
                tokens: &next,
                start_pos: prompt_a.len(),
                block_table: &table_a,
                logits: LogitsMode::Last,
            },
            SeqSlice {
                adapter: None,
                tokens: &prompt_b,
                start_pos: 0,
                block_table: &table_b,
                logits: LogitsMode::Last,
            },
        ])
        .expect("mixed step"),
    );
    for step in 0..8u32 {
        let tokens = [(step * 31 + 2) % vocab, (step * 17 + 3) % vocab];
        all.extend(
            cuda.forward(&[
                SeqSlice {
                    adapter: None,
                    tokens: &tokens[..1],
                    start_pos: prompt_a.len() + 1 + step as usize,
                    block_table: &table_a,
                    logits: LogitsMode::Last,
                },
                SeqSlice {
                    adapter: None,
                    tokens: &tokens[1..],
                    start_pos: prompt_b.len() + step as usize,
                    block_table: &table_b,
                    logits: LogitsMode::Last,
                },
            ])
            .expect("decode step"),
        );
    }
    for step in 0..4u32 {
        let token = [(step * 13 + 7) % vocab];
        all.extend(
            cuda.forward(&[SeqSlice {
                adapter: None,
                tokens: &token,
                start_pos: prompt_a.len() + 9 + step as usize,
                block_table: &table_a,
                logits: LogitsMode::Last,
            }])
            .expect("single decode step"),
        );
    }
    all
}

/// The mean |a - b| over two runs' logits.
fn mean_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "logit count");
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .sum::<f64>()
        / a.len().max(1) as f64
}

/// Asserts two runs' logits are the same bits.
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert!(
        a == b,
        "{what} (max |Δ| {})",
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    );
}

#[test]
fn early_started_launches_compute_exactly_what_plain_launches_do() {
    for (name, artifacts) in every_model() {
        let vocab = artifacts.config.vocab_size as u32;
        let run = |early: bool| -> Option<Vec<f32>> {
            let mut cuda = cuda_with(&artifacts, CudaWeights::Bf16);
            cuda.update_options(|o| o.debug.early_start = early)
                .expect("early starts on or off");
            if cuda.early_start() != early {
                eprintln!("SKIPPED: this device has no programmatic dependent launch (sm_90+)");
                return None;
            }
            Some(prefill_mixed_step_and_decodes(&mut cuda, vocab))
        };
        let Some(early) = run(true) else { return };
        let plain = run(false).expect("plain launches");
        // The same kernels doing the same sums: only when their blocks start differs.
        assert_same_bits(
            &early,
            &plain,
            &format!("{name}: early-started launches differ from plain ones"),
        );
    }
}

/// [`prefill_mixed_step_and_decodes`] on [`every_model`] with a fusion `on` and off: the
/// same bits either way.
fn assert_fusion_keeps_the_bits(on: impl Fn(&mut CudaDebug, bool), what: &str) {
    for (name, artifacts) in every_model() {
        let vocab = artifacts.config.vocab_size as u32;
        let run = |fused: bool| {
            let mut cuda = cuda_with(&artifacts, CudaWeights::Bf16);
            cuda.update_options(|o| on(&mut o.debug, fused))
                .expect("fused or not");
            prefill_mixed_step_and_decodes(&mut cuda, vocab)
        };
        assert_same_bits(&run(true), &run(false), &format!("{name}: {what}"));
    }
}

#[test]
fn decode_gemvs_ending_their_sub_blocks_compute_exactly_what_add_rms_norm_launches_do() {
    // The residual add and norm in the output and down GEMVs' last blocks (decode steps)
    // sum in the order the 1024-thread add_rms_norm does, whatever the GEMV's block size.
    assert_fusion_keeps_the_bits(
        |d, on| d.fused_norm = on,
        "GEMV-fused norms differ from add_rms_norm",
    );
}

#[test]
fn decode_attention_preparing_its_own_heads_computes_exactly_what_qkv_prepare_launches_do() {
    // Decode-only steps: bias, RoPE and the KV store in the attention blocks, with
    // qkv_prepare's arithmetic; the prefill and the mixed step launch qkv_prepare either way.
    assert_fusion_keeps_the_bits(
        |d, on| d.fused_rope = on,
        "attention-prepared heads differ from qkv_prepare",
    );
}

#[test]
fn a_gate_up_gemv_writing_the_activation_computes_exactly_what_the_gated_down_gemv_does() {
    // Decode steps: act(gate)·up from the gate/up GEMV's own sums (paired rows per block),
    // then a plain down GEMV; off, the down GEMV activates the [gate | up] rows it stages.
    assert_fusion_keeps_the_bits(
        |d, on| d.fused_glu = on,
        "the gate/up GEMV's activation differs from the gated down GEMV's",
    );
}

#[test]
fn decode_gemvs_splitting_their_sub_block_ends_compute_within_bf16_rounding_of_the_whole_ends() {
    // Split: the output and down GEMVs add their rows to the residual stream and write them
    // times the next norm's weight, their last block each row's 1/rms, and the next GEMV
    // scales its sums by it (no add_rms_norm launch, no block walking whole rows). The same
    // norm, rounded to bf16 before it is applied rather than after: close, not the bits —
    // except for Gemma 3, whose post-norms keep every end whole.
    for (name, artifacts) in every_model() {
        let vocab = artifacts.config.vocab_size;
        let run = |split: bool| {
            let mut cuda = cuda_with(&artifacts, CudaWeights::Bf16);
            cuda.update_options(|o| o.split_norm = split)
                .expect("split or whole ends");
            prefill_mixed_step_and_decodes(&mut cuda, vocab as u32)
        };
        let (split, whole) = (run(true), run(false));
        let post_norms = artifacts.weights.layers[0].post_attn_norm.is_some();
        if post_norms {
            assert_same_bits(&split, &whole, &format!("{name}: no split with post-norms"));
            continue;
        }
        let diff = relative_diff(&split, &whole, vocab);
        // Neither rounding is the better one: on average the split ends' logits are as far
        // from the CPU backend's (f32 throughout) as the whole ends' are. (The worst logit is
        // a poor judge of that: over these few rows it moves ±30 % either way.)
        let mut cpu = CpuBackend::with_kv_dtype(&artifacts, NUM_BLOCKS, BLOCK_SIZE, KvDtype::F32)
            .expect("cpu backend");
        let exact = mixed_steps(&mut cpu, vocab as u32);
        let (split_off, whole_off) = (mean_abs_diff(&split, &exact), mean_abs_diff(&whole, &exact));
        let (split_worst, whole_worst) = (
            relative_diff(&split, &exact, vocab),
            relative_diff(&whole, &exact, vocab),
        );
        eprintln!(
            "{name}: split vs whole ends: max relative |Δ| {diff:.6}; from the CPU backend: \
             mean |Δ| split {split_off:.7}, whole {whole_off:.7}; max relative |Δ| split \
             {split_worst:.6}, whole {whole_worst:.6}"
        );
        assert!(
            diff > 0.0,
            "{name}: the split ends changed nothing (did they run?)"
        );
        // They move the logits less than bf16 already moves them from f32 (on SmolLM2 a
        // quarter as much; the tiny models' bf16 error is smaller than 1e-2).
        assert!(
            diff <= whole_worst.max(1e-2),
            "{name}: split sub-block ends differ by {diff}, the whole ones from the CPU \
             backend by {whole_worst}"
        );
        assert!(
            split_off <= 1.15 * whole_off,
            "{name}: split ends {split_off} from the CPU backend on average, whole ones \
             {whole_off}"
        );
    }
}

#[test]
fn decode_products_given_to_cublas_compute_what_their_gemvs_do() {
    // Timing at load may give any decode-sized product to cuBLAS: the step then runs it
    // unfused (no activation written by the gate/up GEMV, no norm in a GEMV's last block)
    // beside GEMVs that still fuse. cuBLAS sums in its own order: close, not the bits. Each
    // product's output is rounded to bf16, so an order that flips one rounding carries
    // through the layers: on an H200 (2026-12-04) the default model's `o` product differed
    // by 1.13 % (its `qkv` by 0.80 %), the tiny models by 0; 2 % bounds that with room.
    for (name, artifacts) in every_model() {
        let vocab = artifacts.config.vocab_size;
        let run = |product: Option<&str>| {
            let mut cuda = cuda_with(&artifacts, CudaWeights::Bf16);
            if let Some(product) = product {
                cuda.decode_through_cublas(product).expect("a product");
            }
            prefill_mixed_step_and_decodes(&mut cuda, vocab as u32)
        };
        let gemvs = run(None);
        for product in ["qkv", "o", "gate_up", "down", "lm_head"] {
            let diff = relative_diff(&run(Some(product)), &gemvs, vocab);
            eprintln!("{name}: {product} through cuBLAS vs a GEMV: max relative |Δ| {diff:.6}");
            assert!(
                diff <= 2e-2,
                "{name}: {product} through cuBLAS differs by {diff}"
            );
        }
    }
}

#[test]
fn dropping_a_cuda_model_gives_its_device_memory_back() {
    if !gpu() {
        return;
    }
    let Some(path) = default_model() else { return };
    let options = LoadOptions {
        device: Device::Cuda(0),
        kv_cache_bytes: 256 << 20,
        cuda: suite_options(CudaWeights::Bf16),
        ..LoadOptions::default()
    };
    let free = || device::probe(0).expect("probe").free_bytes;
    // The first load also compiles and keeps the kernels: measure from after it.
    drop(load(&path, &options).expect("load"));
    let before = free();
    for round in 0..2 {
        let model = load(&path, &options).expect("load");
        let taken = before.saturating_sub(free());
        assert!(
            taken as u64 >= model.resident_bytes * 9 / 10,
            "round {round}: the model takes {taken} bytes, it says {}",
            model.resident_bytes
        );
        drop(model);
        let kept = before.saturating_sub(free());
        eprintln!("round {round}: {taken} bytes while loaded, {kept} kept after the drop");
        assert!(
            kept < 64 << 20,
            "round {round}: {kept} bytes not given back"
        );
    }
}

/// `rows` × `cols` f32 weights, uniform in ±1.5/√cols, from `seed`.
fn random_matrix(rows: usize, cols: usize, seed: u64) -> QMatrix {
    let a = 1.5 / (cols as f32).sqrt();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
        })
        .collect();
    QMatrix::from_f32(rows, cols, &values).expect("f32 matrix")
}

/// A Llama as wide as K-quant super-blocks (hidden 256, FFN 512, four 64-wide heads over two
/// KV heads; the tiny fixtures' 64 columns are too narrow for Q4_K): two layers of random f32
/// weights, an untied LM head, the tiny Llama's vocabulary and RoPE; `store` turns each
/// matrix into what the model keeps (itself, or its blocks).
fn wide_llama(store: impl Fn(QMatrix) -> QMatrix) -> ModelArtifacts {
    let tiny = tiny("llama");
    let mut config = tiny.config.clone();
    (config.hidden, config.ffn) = (256, 512);
    (config.n_heads, config.n_kv_heads, config.head_dim) = (4, 2, 64);
    config.tie_embeddings = false;
    let (hidden, ffn, q_dim, kv_dim) = (config.hidden, config.ffn, config.q_dim(), config.kv_dim());
    let mut seed = 0u64;
    let mut matrix = |rows: usize, cols: usize| {
        seed += 1;
        store(random_matrix(rows, cols, seed))
    };
    let norm = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| 0.8 + 0.4 * ((i * 37 % 11) as f32 / 10.0))
            .collect()
    };
    let layers = (0..config.n_layers)
        .map(|_| LayerWeights {
            attn_norm: norm(hidden),
            wq: matrix(q_dim, hidden),
            wk: matrix(kv_dim, hidden),
            wv: matrix(kv_dim, hidden),
            wo: matrix(hidden, q_dim),
            bq: None,
            bk: None,
            bv: None,
            bo: None,
            sinks: None,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: norm(hidden),
            ffn: FeedForward::Dense(DenseFfn {
                gate: matrix(ffn, hidden),
                up: matrix(ffn, hidden),
                down: matrix(hidden, ffn),
            }),
            post_ffn_norm: None,
        })
        .collect();
    let weights = Weights {
        // Gathered as bf16 on the device whatever the storage: kept as f32 in both models.
        token_embd: random_matrix(config.vocab_size, hidden, 0),
        output_norm: norm(hidden),
        output: Some(matrix(config.vocab_size, hidden)),
        rope_freq_factors: None,
        layers,
    };
    ModelArtifacts {
        config,
        weights: std::sync::Arc::new(weights),
        vocab: tiny.vocab,
        chat_template: tiny.chat_template,
        eos_ids: tiny.eos_ids,
    }
}

#[test]
fn float_weights_quantized_to_q4_k_at_load_compute_the_exact_math_of_those_blocks() {
    if !gpu() {
        return;
    }
    let floats = wide_llama(|m| m);
    let blocks = wide_llama(|m| m.quantized(GgmlType::Q4K).expect("whole super-blocks"));
    let vocab = floats.config.vocab_size;
    // Every matrix's rows are whole super-blocks, so Q4_K at load stores them all as Q4_K: the
    // same blocks the host quantized, so the same logits as the device reading those blocks.
    let at_load = teacher_forced_decodes(&floats, CudaWeights::Q4K, 3, 6);
    let host_blocks = teacher_forced_decodes(&blocks, CudaWeights::Quantized, 3, 6);
    assert_eq!(
        at_load.0, host_blocks.0,
        "Q4_K at load and the host's Q4_K blocks"
    );
    let bf16 = cuda_with(&floats, CudaWeights::Bf16).weight_bytes();
    eprintln!("Q4_K at load: {} bytes of matrices, bf16 {bf16}", at_load.1);
    // 144 bytes per 256 weights (the bf16 embedding table aside).
    assert!(at_load.1 * 2 < bf16, "{} vs {bf16}", at_load.1);

    // Against the CPU backend on the blocks' values as f32 (exact math; its own K-quant
    // kernels would quantize the activations to 8 bits): a prompt in two chunks (the
    // expansion to bf16 and cuBLAS) and decodes (the Q4_K GEMV). Measured on the emulator:
    // 0.019, where bf16 weights against f32 ones give 0.015; a wrong group min gives 0.59.
    let mut cpu = values_on_the_cpu(GgmlType::Q4K);
    let mut cuda = cuda_with(&floats, CudaWeights::Q4K);
    let worst = chunked_prefill_then_decodes_diff(&mut cpu, &mut cuda, vocab);
    eprintln!("Q4_K at load vs the exact math of its blocks: max relative |Δ| {worst:.4}");
    assert!(worst <= RELATIVE_TOLERANCE, "{worst}");
}

/// The CPU backend on the values of `wide_llama`'s matrices quantized to `t` (as the CUDA
/// backend quantizes them at load), as f32 (the blocks' exact math; its own quantized
/// kernels would quantize the activations to 8 bits).
fn values_on_the_cpu(t: GgmlType) -> CpuBackend {
    let exact = wide_llama(|m| {
        let q = m.quantized(t).expect("whole blocks");
        QMatrix::from_f32(q.rows, q.cols, &q.dequantize_all()).expect("f32")
    });
    CpuBackend::with_kv_dtype(&exact, NUM_BLOCKS, BLOCK_SIZE, KvDtype::F32).expect("cpu backend")
}

#[test]
fn quantized_products_reading_x_as_int8_stay_close_to_the_exact_math_of_their_blocks() {
    if !gpu() {
        return;
    }
    // Two ways the blocks come: quantized at load (the K-quant and Q8_0 storages), and as
    // a file's blocks kept as they are (the default model's Q4_1; Q6_K, beside Q4_K in every
    // Q4_K_M file).
    let at_load = |storage| (wide_llama(|m| m), storage);
    let as_stored = |t| {
        (
            wide_llama(|m| m.quantized(t).expect("whole blocks")),
            CudaWeights::Quantized,
        )
    };
    for (t, (model, storage)) in [
        (GgmlType::Q4K, at_load(CudaWeights::Q4K)),
        (GgmlType::Q8_0, at_load(CudaWeights::Q8_0)),
        (GgmlType::Q4_1, as_stored(GgmlType::Q4_1)),
        (GgmlType::Q6K, as_stored(GgmlType::Q6K)),
    ] {
        let vocab = model.config.vocab_size;
        // Every product rounds x to 8 bits per group of 32 (integer dot products): the
        // decodes' GEMVs, and the int8 tensor-core products of the prompt's chunks of 9 and
        // 14 tokens.
        let mut cpu = values_on_the_cpu(t);
        let mut cuda = cuda_with(&model, storage);
        read_x_as(&mut cuda, QuantX::Int8);
        // Every format's tensor-core product agreed with its expansion on this device.
        assert_eq!(cuda.mmq_formats_rejected(), [], "{t:?}");
        let worst = chunked_prefill_then_decodes_diff(&mut cpu, &mut cuda, vocab);
        eprintln!(
            "{t:?} ({storage:?}), x as int8, vs the exact math of its blocks: max relative |Δ| \
             {worst:.4}"
        );
        assert!(worst <= INT8_X_TOLERANCE, "{t:?}: {worst}");
        // The int8 products ran: decode logits near, not equal to, those of bf16 x — for
        // 3 sequences (the GEMVs) and for 12 (the tensor-core products, where bf16 x expands
        // the blocks for cuBLAS).
        for (sequences, steps) in [(3, 6), (12, 3)] {
            let decodes = |setup: fn(&mut CudaBackend)| {
                teacher_forced_decodes_after(&model, storage, setup, sequences, steps).0
            };
            let with_int8 = decodes(|c| read_x_as(c, QuantX::Int8));
            let diff = relative_diff(&with_int8, &decodes(|_| {}), vocab);
            eprintln!(
                "{t:?}: decode logits of {sequences} sequences, x as int8 vs bf16: max \
                 relative |Δ| {diff:.5}"
            );
            assert!(
                diff > 0.0 && diff <= INT8_X_TOLERANCE,
                "{t:?}, {sequences}: {diff}"
            );
        }
    }
}

#[test]
fn with_x_as_int8_each_shape_is_timed_both_ways_and_its_products_take_the_faster() {
    if !gpu() {
        return;
    }
    let model = wide_llama(|m| m);
    let (storage, vocab) = (CudaWeights::Q4K, model.config.vocab_size);
    // 12 sequences: past the GEMVs, products of the tensor cores' or the expansion's.
    let decodes = |setup: &mut dyn FnMut(&mut CudaBackend)| {
        teacher_forced_decodes_after(&model, storage, setup, 12, 3).0
    };
    let int8 = |mode: MmqMode| {
        move |c: &mut CudaBackend| {
            c.update_options(|o| {
                o.quant_x = QuantX::Int8;
                o.debug.mmq = mode;
            })
            .expect("int8 x and its products' mode");
        }
    };
    let bf16_x = decodes(&mut |_| {});
    let mut never = int8(MmqMode::Never);
    let mut always = int8(MmqMode::Always);
    let (never, always) = (decodes(&mut never), decodes(&mut always));
    // Never: every product expands the blocks for cuBLAS, reading x as bf16.
    assert_eq!(
        never, bf16_x,
        "mmq=never still ran the tensor-core products"
    );
    assert!(relative_diff(&always, &bf16_x, vocab) > 0.0);

    let mut timings = Vec::new();
    let timed = decodes(&mut |c: &mut CudaBackend| {
        int8(MmqMode::Timed)(c);
        timings = c.mmq_timings();
    });
    // Every matrix's shape (QKV, output, gate/up, down, LM head) at 16 and 64 token rows.
    let (hidden, ffn, q_dim, kv_dim) = (256, 512, 256, 128);
    for (rows, cols) in [
        (q_dim + 2 * kv_dim, hidden),
        (hidden, q_dim),
        (2 * ffn, hidden),
        (hidden, ffn),
        (vocab, hidden),
    ] {
        for batch in [16, 64] {
            let t = timings
                .iter()
                .find(|t| (t.shape.rows, t.shape.cols, t.shape.batch) == (rows, cols, batch))
                .unwrap_or_else(|| panic!("{rows}x{cols} at {batch} not timed: {timings:?}"));
            assert_eq!(t.shape.format, GgmlType::Q4K);
            assert!(t.tensor_cores_ms > 0.0 && t.expanded_ms > 0.0, "{t:?}");
        }
    }
    // The 12 sequences follow the timings at 16 rows: where one way won every shape, the
    // logits are that way's.
    let at_16: Vec<bool> = timings
        .iter()
        .filter(|t| t.shape.batch == 16)
        .map(|t| t.tensor_cores_win())
        .collect();
    eprintln!("int8 tensor cores faster at 16 rows: {at_16:?} ({timings:?})");
    if at_16.iter().all(|&w| w) {
        assert_eq!(timed, always);
    } else if at_16.iter().all(|&w| !w) {
        assert_eq!(timed, never);
    } else {
        assert!(relative_diff(&timed, &bf16_x, vocab) <= INT8_X_TOLERANCE);
    }
}

#[test]
fn float_weights_quantized_to_q8_0_at_load_stay_close_to_bf16() {
    if !gpu() {
        return;
    }
    for name in ["llama", "qwen3", "gemma3"] {
        let artifacts = tiny(name);
        let vocab = artifacts.config.vocab_size;
        let run = |storage| teacher_forced_decodes(&artifacts, storage, 2, 12).0;
        let diff = relative_diff(&run(CudaWeights::Q8_0), &run(CudaWeights::Bf16), vocab);
        eprintln!("{name}: Q8_0 at load vs bf16 decode logits, max relative |Δ| {diff:.5}");
        assert!(diff <= RELATIVE_TOLERANCE, "{name}: {diff}");
    }
}
