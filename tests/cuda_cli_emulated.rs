//! The `fallow` CLI's CUDA paths — `generate` and `bench engine` with `--device cuda`, as the
//! GPU check (`gpu-runner/scripts/gpu-check.sh`) runs them: the per-kernel profiler, sampled
//! and JSON-schema constrained decoding, Q8_0 weights, plain launches and the fusions off —
//! run to the end on the emulated CUDA driver (`cuda::emulator`, the kernels on the CPU),
//! preloaded into the binary. What this catches before a GPU does: a CUDA path of the CLI that
//! fails or hangs. Skipped where a real NVIDIA driver is here (the GPU check runs these there),
//! or NVRTC or a C++ compiler is missing.

use std::path::PathBuf;
use std::process::{Command, Output};

use fallow_engine::backend::cuda::{device, emu, kernels};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tiny(name: &str) -> String {
    repo()
        .join("gpu-runner/engine/tests/fixtures/tiny")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// `LD_PRELOAD` for the emulated driver, or `None` (with the reason printed) where this test
/// cannot run.
fn emulated_driver() -> Option<String> {
    if device::driver_available() {
        eprintln!("SKIPPED: a real NVIDIA driver is here (gpu-check.sh runs the CLI on it)");
        return None;
    }
    if !kernels::nvrtc_available() {
        fallow_protocol::testing::skip_for_want_of(
            "NVRTC to build the kernels for the emulated driver",
        );
        return None;
    }
    let [driver, blas] = emu::driver_libraries().expect("the emulated driver builds")?;
    Some(format!("{}:{}", driver.display(), blas.display()))
}

/// `fallow` with `args` on the emulated driver and `env`; its output, once it succeeded.
fn fallow(preload: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(args)
        .env("LD_PRELOAD", preload)
        .envs(env.iter().copied())
        .output()
        .expect("fallow runs");
    assert!(
        out.status.success(),
        "fallow {args:?} with {env:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Environment variables for one run.
type Env<'a> = Vec<(&'a str, &'a str)>;

/// Whether `env`'s `FALLOW_CUDA_DEBUG` list names `switch`.
fn debugs(env: &[(&str, &str)], switch: &str) -> bool {
    env.iter().any(|(name, list)| {
        *name == "FALLOW_CUDA_DEBUG" && list.split(',').any(|s| s.trim() == switch)
    })
}

/// The bench table's rows as (concurrency, constraint, generated tokens).
fn bench_rows(stdout: &[u8]) -> Vec<(usize, String, usize)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let concurrency = f.first()?.parse().ok()?;
            let generated = f.get(6)?.parse().ok()?;
            Some((concurrency, f.get(1)?.to_string(), generated))
        })
        .collect()
}

#[test]
fn generate_on_cuda_streams_tokens_from_the_emulated_gpu() {
    let Some(preload) = emulated_driver() else {
        return;
    };
    let out = fallow(
        &preload,
        &[("FALLOW_CUDA_DEBUG", "gemv=w8u4")],
        &[
            "generate",
            "--model",
            &tiny("llama"),
            "--prompt",
            "hello there",
            "--max-tokens",
            "8",
            "--device",
            "cuda",
        ],
    );
    assert!(!out.stdout.is_empty(), "no text generated");
}

#[test]
fn bench_engine_on_cuda_serves_the_base_and_many_lora_adapters_side_by_side() {
    let Some(preload) = emulated_driver() else {
        return;
    };
    // c5.: each of 4 sequences over its own random adapter, beside the base alone.
    let out = fallow(
        &preload,
        &[("FALLOW_CUDA_DEBUG", "gemv=w8u4,quick-tuning")],
        &[
            "bench",
            "engine",
            "--model",
            &tiny("qwen3"),
            "--device",
            "cuda",
            "--concurrency",
            "4",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "8",
            "--kv-cache-mib",
            "64",
            "--loras",
            "1,4",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for row in ["lora x1", "lora x4", "4 adapters/base"] {
        assert!(stdout.contains(row), "no `{row}` row in\n{stdout}");
    }
}

#[test]
fn bench_engine_on_cuda_runs_every_configuration_the_gpu_check_measures() {
    let Some(preload) = emulated_driver() else {
        return;
    };
    let schema = repo().join("bench/schema.json");
    let bench = |model: &str, extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "bench",
            "engine",
            "--model",
            model,
            "--device",
            "cuda",
            "--concurrency",
            "1,8",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "12",
            "--kv-cache-mib",
            "64",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect()
    };
    let gemma = tiny("gemma3");
    let qwen = tiny("qwen3");
    let moe = tiny("qwen3_moe");
    let schema = schema.to_string_lossy().into_owned();
    let runs: Vec<(Env, Vec<String>)> = vec![
        // f.: the GEMV variants (and cuBLAS) timed at load, sampled decoding, the step clock
        // (graphs on).
        (
            vec![("FALLOW_CUDA_DEBUG", "step-clock,quick-tuning")],
            bench(&gemma, &["--temperature", "0.8"]),
        ),
        // f3: every launch timed, graphs off; the table goes to stderr at the end.
        (
            vec![("FALLOW_CUDA_DEBUG", "profile,gemv=w8u4")],
            bench(&gemma, &[]),
        ),
        // f4 and c3: Q8_0 weights, JSON-schema constrained decoding.
        (
            vec![("FALLOW_CUDA_DEBUG", "gemv=w8u4")],
            bench(
                &qwen,
                &["--cuda-weights", "q8_0", "--json-schema", schema.as_str()],
            ),
        ),
        // f13 and f14: Q4_K at load (the tiny model's rows are narrower than a super-block:
        // Q8_0), x read as int8 (Q8_0's integer products; the tensor-core products timed
        // against the expansion at load).
        (
            vec![
                ("FALLOW_CUDA_DEBUG", "gemv=w8u4,quick-tuning"),
                ("FALLOW_CUDA_QUANT_X", "int8"),
            ],
            bench(&qwen, &["--cuda-weights", "q4_k"]),
        ),
        // f5, f7, f8, f9 and f10: plain launches, the fusions off, no L2 prefetches,
        // attention split only from 256 keys, no graphs.
        (
            vec![(
                "FALLOW_CUDA_DEBUG",
                "gemv=w8u4,no-early-start,no-fused-norm,no-fused-rope,no-l2-prefetch,\
                 no-fused-glu,split-min-keys=256,no-graphs",
            )],
            bench(&qwen, &[]),
        ),
        // f15: the sub-block ends split with the next product, every launch timed (the
        // profile names the splitting and the scaled products; one GEMV variant, not timed
        // at load: the emulated cuBLAS, timed, would take products from the GEMVs, and with
        // them the splits).
        (
            vec![("FALLOW_CUDA_DEBUG", "profile,gemv=w8u4")],
            bench(&qwen, &["--cuda-split-norm"]),
        ),
        // f11 and f12: the GEMV timed among the CUDA-core variants only, and cuBLAS not
        // timed against it.
        (
            vec![(
                "FALLOW_CUDA_DEBUG",
                "no-tensor-gemv,no-gemv-cublas,quick-tuning",
            )],
            bench(&qwen, &[]),
        ),
        // i.: a mixture of experts with its expert banks in bf16 (graphs on) and in Q8_0
        // (every launch timed: the profile names the grouped Q8_0 products).
        (vec![("FALLOW_CUDA_DEBUG", "gemv=w8u4")], bench(&moe, &[])),
        (
            vec![("FALLOW_CUDA_DEBUG", "profile,gemv=w8u4")],
            bench(&moe, &["--cuda-weights", "q8_0"]),
        ),
    ];
    for (env, args) in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = fallow(&preload, env, &args);
        let rows = bench_rows(&out.stdout);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.lines().any(|l| l.starts_with("loaded in ")),
            "{args:?}: no load time in\n{stdout}"
        );
        for concurrency in [1, 8] {
            assert!(
                rows.iter()
                    .any(|(c, constraint, generated)| *c == concurrency
                        && constraint == "none"
                        && *generated == concurrency * 12),
                "{args:?}: no full row for {concurrency} sequences in {rows:?}"
            );
        }
        if args.contains(&"--json-schema") {
            assert!(rows.iter().any(|(_, constraint, _)| constraint == "json"));
        }
        if debugs(env, "step-clock") {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("CUDA step clock")
                    && stderr.contains("decode n=1 ")
                    && stderr.contains("decode n=8 "),
                "no step clock for the decode steps of 1 and 8 sequences:\n{stderr}"
            );
        }
        if debugs(env, "no-gemv-cublas") {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("GEMV variants timed")
                    && !stderr.contains("cuBLAS multiplies faster")
                    && !stderr.contains(": m4s")
                    && !stderr.contains(": m8s"),
                "a tensor-core GEMV or cuBLAS chosen for a decode product:\n{stderr}"
            );
        }
        if env.contains(&("FALLOW_CUDA_QUANT_X", "int8")) {
            // What the summary lists for f14: each shape's int8 tensor-core product timed
            // against the expansion at load.
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("int8 tensor-core products timed")
                    && stderr.contains("expanded for cuBLAS"),
                "no timing of the int8 tensor-core products at load:\n{stderr}"
            );
        }
        if args.contains(&"--cuda-split-norm") {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                [
                    "gemm o+split",
                    "gemm down+split",
                    "gemm qkv+scale",
                    "gate_up+act+scale"
                ]
                .iter()
                .all(|product| stderr.contains(product)),
                "no split sub-block ends in the profile:\n{stderr}"
            );
        }
        if debugs(env, "profile") {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("paged_attention") && stderr.contains("gemm lm_head"),
                "no per-kernel profile:\n{stderr}"
            );
            if args.contains(&moe.as_str()) {
                assert!(
                    ["moe_route", "moe_sort", "moe_gemv_q8_0", "moe_combine"]
                        .iter()
                        .all(|kernel| stderr.contains(kernel)),
                    "no grouped Q8_0 expert products in the profile:\n{stderr}"
                );
            }
        }
    }
}

#[test]
fn a_retired_cuda_variable_is_refused_with_its_replacement() {
    // No emulated driver needed: the options are parsed before any model is opened.
    let out = Command::new(env!("CARGO_BIN_EXE_fallow"))
        .env("FALLOW_CUDA_GRAPHS", "0")
        .args(["generate", "--model", &tiny("llama"), "--prompt", "hi"])
        .output()
        .expect("fallow runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a stale variable must not be ignored"
    );
    assert!(
        stderr.contains("FALLOW_CUDA_GRAPHS is no longer read: use FALLOW_CUDA_DEBUG=no-graphs"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_debug_switch_is_refused_with_the_known_ones() {
    let out = Command::new(env!("CARGO_BIN_EXE_fallow"))
        .args(["generate", "--model", &tiny("llama"), "--prompt", "hi"])
        .args(["--cuda-debug", "no-graph"])
        .output()
        .expect("fallow runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--cuda-debug") && stderr.contains("no-graphs"),
        "{stderr}"
    );
}
