#!/usr/bin/env bash
# One pass of GPU checks for Fallow's CUDA backend, sized for a single short run on the lent
# GPU machine (no network, no Rust toolchain there):
#   a. environment: nvidia-smi, the CUDA 13 libraries cudarc opens (LD_LIBRARY_PATH)
#   b. the prebuilt cargo test executables in .gpu/tests/, on device cuda (the runner's
#      kernel tests through the driver first, FALLOW_KERNEL_TESTS=driver); the conformance
#      suite's tiny fixtures come with the working tree, gpt-oss's among them
#   c. `fallow generate` with SmolLM2-135M on cuda and on cpu; its decode speed with bf16
#      and with quantized (the file's blocks) weights (c2; also with x as int8,
#      FALLOW_CUDA_QUANT_X=int8), under a JSON schema (c3), and sampled
#      with top-p 0.9 (c4), and over 1, 4 and 16 LoRA adapters (c5)
#   d. a random-weight Llama-3.1-8B shaped bf16 checkpoint (make_random_llama.py)
#   e. the GPU's memory read bandwidth (bandwidth.py)
#   f. `fallow bench engine` on that checkpoint (f3: per-kernel GPU time, FALLOW_CUDA_DEBUG=profile;
#      f15: batch 1 and 8 with the sub-block ends split with the next product,
#      --cuda-split-norm;
#      f5: batch 1 without early starts, FALLOW_CUDA_DEBUG=no-early-start; f7: batch 1 with
#      add_rms_norm and qkv_prepare launches, FALLOW_CUDA_DEBUG=no-fused-norm,no-fused-rope;
#      f8: batch 1 and 8 without L2 prefetches before the waits, FALLOW_CUDA_DEBUG=no-l2-prefetch;
#      f9: batch 1 and 8 with the activation in the down GEMV, FALLOW_CUDA_DEBUG=no-fused-glu;
#      f10: batch 1 and 8 with attention split only past 256 keys, FALLOW_CUDA_DEBUG=split-min-keys=256;
#      f11: batch 1 and 8 with the GEMV chosen among CUDA-core variants, FALLOW_CUDA_DEBUG=no-tensor-gemv;
#      f12: batch 1 and 8 with no decode-sized product given to cuBLAS, FALLOW_CUDA_DEBUG=no-gemv-cublas;
#      f6: a 4096-token
#      prompt's prefill, attention on tensor cores vs f32; f4: its matrices quantized to Q8_0
#      at load; f13: to Q4_K at load, batch 1, 8 and 64; f14: Q4_K and Q8_0 reading x as int8,
#      FALLOW_CUDA_QUANT_X=int8, batch 64 on the int8 tensor cores; f2: without CUDA graphs)
#   g. transformers generate() on it (hf_bench.py)
#   h. a summary: Fallow vs transformers, and batch 1 against the bandwidth roofline
#   i. a random-weight Qwen3-30B-A3B shaped checkpoint with 4 layers (128 experts, 8 per
#      token), decode with its experts in bf16 and in Q8_0 (the grouped expert products);
#      GPU_CHECK_ONLY=moe runs only a., b. and i.
#
#   bash gpu-runner/scripts/gpu-check.sh        (from anywhere; it runs in the repo root)
#
# Needs .gpu/fallow (release binary), .gpu/tests/ (test executables), .gpu/models/.
# Every step runs under `timeout` and records its status; a failing step never stops the
# next. The whole run keeps within GPU_CHECK_BUDGET_S seconds: a step gets the smaller of
# its own limit and what is left, and is skipped when too little is.
# Output, in $OUT (default /tmp/gpu-check-out; at most 8 flat files): gpu-check.log
# (everything), summary.txt, steps.tsv, fallow-bench.log, fallow-profile.log, hf-bench.log,
# moe-bench.log.
#
# The default model (94 MiB) is over one call's 64 MiB transfer limit, so it may arrive in
# parts over two calls to the same warm machine: `.gpu/models/*.part-*` (first call) and
# `.gpu-b/*.part-*` (second call); `assemble_model` joins them (checked against
# .gpu*/models.sha256) into $WORK/models. GPU_CHECK_ONLY=model runs only a.–c.
#
# Tunables (environment): GPU_CHECK_BUDGET_S (450), GPU_CHECK_TESTS_BUDGET_S (180, all tests
# together), FALLOW_RANDOM_LAYERS (32), PYTHON (python3), LLAMA_DIR (/tmp/llama8b).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"

OUT="${OUT:-/tmp/gpu-check-out}"
WORK=/tmp/gpu-check # scratch files, kept out of $OUT
PY="${PYTHON:-python3}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"
TESTS_BUDGET_S="${GPU_CHECK_TESTS_BUDGET_S:-180}"
RESERVE_S=15 # kept back for the summary
MIN_STEP_S=10
LLAMA_DIR="${LLAMA_DIR:-/tmp/llama8b}"
MODELS_DIR="$ROOT/.gpu/models"
SMOL="$MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
FALLOW="$ROOT/.gpu/fallow"
START_S=$SECONDS

section() {
  printf '\n==================== %s  [t=%ss] ====================\n' "$1" "$((SECONDS - START_S))"
}

# record NAME STATUS: one line of steps.tsv, echoed.
record() {
  printf '%s\t%s\n' "$1" "$2" >>"$OUT/steps.tsv"
  printf -- '--> %s: %s\n' "$1" "$2"
}

# Seconds of the budget left for steps (the summary's reserve excluded).
budget_left() {
  echo $((BUDGET_S - (SECONDS - START_S) - RESERVE_S))
}

# run_step NAME LIMIT_S LOG CMD...: runs CMD (no stdin) under `timeout` for the smaller of
# LIMIT_S and the budget left, its stdout also into LOG ("-": nowhere); records the status.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left
  left=$(budget_left)
  if ((limit > left)); then limit=$left; fi
  section "$name"
  if ((limit < MIN_STEP_S)); then
    record "$name" "SKIPPED (budget: ${left}s left)"
    return 0
  fi
  printf '$'
  printf ' %q' "$@"
  printf '  # timeout %ss\n' "$limit"
  local t0=$SECONDS rc=0
  if [ "$log" = - ]; then
    timeout -k 10 "$limit" "$@" </dev/null || rc=$?
  else
    timeout -k 10 "$limit" "$@" </dev/null | tee "$log" || rc=$?
  fi
  local dt=$((SECONDS - t0))
  case $rc in
    0) record "$name" "OK (${dt}s)" ;;
    124 | 137) record "$name" "TIMEOUT after ${dt}s (limit ${limit}s)" ;;
    *) record "$name" "FAILED rc=$rc (${dt}s)" ;;
  esac
}

# first_lib NAME ROOT...: the first file or link called NAME.so.13, else NAME.so.13.*.
first_lib() {
  local name=$1 pat found
  shift
  for pat in "$name.so.13" "$name.so.13.*"; do
    found=$(find "$@" \( -type f -o -type l \) -name "$pat" 2>/dev/null | head -n 1 || true)
    if [ -n "$found" ]; then
      echo "$found"
      return 0
    fi
  done
}

# a. The libraries cudarc dlopens by name: libcuda.so(.1), libcublas.so.13 (which needs
# libcublasLt.so.13), libnvrtc.so.13 (which opens libnvrtc-builtins.so.13.x).
step_environment() {
  section "a. environment"
  local rc=0
  timeout 30 nvidia-smi || rc=$?
  if ((rc != 0)); then record "a. nvidia-smi" "FAILED rc=$rc"; else record "a. nvidia-smi" "OK"; fi
  timeout 10 nvcc --version 2>/dev/null | tail -n 2 || echo "nvcc: not found"
  df -h /tmp | tail -n 1 || true
  free -g | head -n 2 || true
  # Binaries may travel gzipped (the transfer limit).
  local gz
  for gz in "$ROOT"/.gpu/*.gz "$ROOT"/.gpu/tests/*.gz; do
    if [ -f "$gz" ]; then gunzip -f "$gz"; fi
  done
  chmod +x "$FALLOW" "$ROOT"/.gpu/tests/* 2>/dev/null || true
  ls -la "$ROOT/.gpu" "$ROOT/.gpu/tests" "$MODELS_DIR" 2>&1 || true

  # Where pip's CUDA wheels (torch's dependencies) live, then the system toolkit.
  local roots=() dir
  mapfile -t roots < <(timeout 60 "$PY" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null || true)
  for dir in /opt/torch/.venv /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib; do
    if [ -d "$dir" ]; then roots+=("$dir"); fi
  done
  echo "searching: ${roots[*]:-(nothing)}"

  local links=/tmp/cudalibs dirs=() lib found
  mkdir -p "$links"
  for lib in libcublas libcublasLt libnvrtc libnvrtc-builtins libcudart; do
    found=""
    # (With no roots, find would search the working directory.)
    if ((${#roots[@]} > 0)); then found=$(first_lib "$lib" "${roots[@]}"); fi
    if [ -z "$found" ]; then
      echo "  $lib.so.13: NOT FOUND"
      continue
    fi
    echo "  $lib.so.13: $found"
    dirs+=("$(dirname "$found")")
    # Only a versioned file (libX.so.13.y.z): the name cudarc opens is a link here.
    if [ "$(basename "$found")" != "$lib.so.13" ]; then
      ln -sf "$found" "$links/$lib.so.13"
      dirs+=("$links")
    fi
  done
  # libcuda comes with the driver; containers often have only libcuda.so.1.
  if [ -d /usr/local/nvidia/lib64 ]; then dirs+=(/usr/local/nvidia/lib64); fi
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so '; then
    found=$(find /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 -name 'libcuda.so.1' 2>/dev/null | head -n 1 || true)
    if [ -n "$found" ]; then
      ln -sf "$found" "$links/libcuda.so"
      dirs+=("$links")
    fi
  fi
  local joined="" d
  for d in "${dirs[@]}"; do
    case ":$joined:" in *":$d:"*) ;; *) joined="${joined:+$joined:}$d" ;; esac
  done
  export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

  # Open them as cudarc will (by name), and have NVRTC compile a kernel (builtins found).
  rc=0
  timeout 60 "$PY" - <<'EOF' || rc=$?
import ctypes as c
ok = True
def load(name):
    global ok
    try:
        return c.CDLL(name)
    except OSError as e:
        ok = False
        print(f"  {name}: FAILED {e}")
cuda = load("libcuda.so.1")
if cuda:
    v = c.c_int()
    r = cuda.cuInit(0)
    cuda.cuDriverGetVersion(c.byref(v))
    print(f"  libcuda.so.1: cuInit={r} driver CUDA {v.value // 1000}.{v.value % 1000 // 10}")
    ok &= r == 0
blas = load("libcublas.so.13")
if blas:
    v = c.c_int()
    blas.cublasGetProperty(0, c.byref(v)); major = v.value
    blas.cublasGetProperty(1, c.byref(v))
    print(f"  libcublas.so.13: {major}.{v.value}")
nvrtc = load("libnvrtc.so.13")
if nvrtc:
    ma, mi = c.c_int(), c.c_int()
    nvrtc.nvrtcVersion(c.byref(ma), c.byref(mi))
    prog = c.c_void_p()
    src = b'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }'
    nvrtc.nvrtcCreateProgram(c.byref(prog), src, b"k.cu", 0, None, None)
    opts = (c.c_char_p * 1)(b"--gpu-architecture=compute_90")
    r = nvrtc.nvrtcCompileProgram(prog, 1, opts)
    n = c.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, c.byref(n))
    log = c.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    print(f"  libnvrtc.so.13: {ma.value}.{mi.value}, compile of a test kernel: {'OK' if r == 0 else 'FAILED ' + log.value.decode(errors='replace')}")
    ok &= r == 0
raise SystemExit(0 if ok else 1)
EOF
  if ((rc != 0)); then record "a. CUDA libraries" "FAILED rc=$rc"; else record "a. CUDA libraries" "OK"; fi
}

# The directory cargo would run a test executable in (its package root): an integration
# test `NAME-hash` comes from DIR/tests/NAME.rs, a unit-test binary is named after its crate.
crate_dir_of() {
  local stem=$1 toml
  for toml in Cargo.toml */Cargo.toml */*/Cargo.toml; do
    local dir
    dir=$(dirname "$toml")
    if [ -f "$dir/tests/$stem.rs" ] || grep -q "^name = \"${stem//_/-}\"" "$toml" 2>/dev/null; then
      echo "$ROOT/$dir"
      return 0
    fi
  done
  echo "$ROOT"
}

# b. Each prebuilt test executable, on the GPU.
step_tests() {
  # Tests that read env!("CARGO_MANIFEST_DIR") carry the build machine's path (/work/main).
  if [ ! -e /work/main ] && [ "$ROOT" != /work/main ] && mkdir -p /work 2>/dev/null; then
    ln -s "$ROOT" /work/main && echo "linked /work/main -> $ROOT (compile-time paths of the tests)"
  fi
  local tests_end=$((SECONDS + TESTS_BUDGET_S)) t found=0
  # The engine's unit tests first (fallow_engine-*: its kernel tests only, each kernel
  # against its plain reference, launched through the driver on the GPU; quick, and they
  # name a kernel the hardware computes wrongly), then the suites; not again in the
  # second call, which runs the tests that need the default model.
  local exes=()
  for t in "$ROOT"/.gpu/tests/fallow_engine-*; do
    if [ "${GPU_CHECK_ONLY:-}" != model ]; then exes+=("$t"); fi
  done
  for t in "$ROOT"/.gpu/tests/*; do
    case $(basename "$t") in fallow_engine-*) ;; *) exes+=("$t") ;; esac
  done
  for t in "${exes[@]}"; do
    if [ ! -f "$t" ] || [ ! -x "$t" ]; then continue; fi
    found=1
    local name stem dir limit=120 filter=() kernel_env=()
    name=$(basename "$t")
    stem=${name%-*}
    dir=$(crate_dir_of "$stem")
    if [ "$stem" = fallow_engine ]; then
      limit=90 filter=(cuda::emu::kernel_tests) kernel_env=(FALLOW_KERNEL_TESTS=driver)
    fi
    if ((tests_end - SECONDS < limit)); then limit=$((tests_end - SECONDS)); fi
    (cd "$dir" && run_step "b. test $stem${filter:+ ${filter[*]}}" "$limit" - \
      env FALLOW_MODELS_DIR="$MODELS_DIR" FALLOW_REPO_DIR="$ROOT" CARGO_MANIFEST_DIR="$dir" \
      "${kernel_env[@]}" RUST_BACKTRACE=1 "$t" "${filter[@]}" --test-threads=1 --nocapture)
  done
  if ((found == 0)); then
    section "b. tests"
    record "b. tests" "SKIPPED (no executables in .gpu/tests)"
  fi
}

# The default model from its parts, when it came split (see the header).
assemble_model() {
  section "assemble default model"
  if [ -f "$SMOL" ]; then
    record "assemble model" "OK (whole file carried)"
    return 0
  fi
  local parts=() p
  for p in "$ROOT"/.gpu/models/*.part-* "$ROOT"/.gpu-b/*.part-*; do
    if [ -f "$p" ]; then parts+=("$p"); fi
  done
  if ((${#parts[@]} == 0)); then
    record "assemble model" "SKIPPED (no parts)"
    return 0
  fi
  mapfile -t parts < <(printf '%s\n' "${parts[@]}" | awk -F'.part-' '{print $NF "\t" $0}' | sort | cut -f2)
  mkdir -p "$WORK/models"
  local joined
  joined="$WORK/models/$(basename "$SMOL")"
  cat "${parts[@]}" >"$joined"
  local want have
  want=$(cat "$ROOT"/.gpu*/models.sha256 2>/dev/null | head -n 1 | cut -d' ' -f1 || true)
  have=$(sha256sum "$joined" | cut -d' ' -f1)
  echo "parts: ${parts[*]}"
  echo "sha256 $have (want ${want:-unknown})"
  if [ -n "$want" ] && [ "$want" = "$have" ]; then
    MODELS_DIR="$WORK/models"
    SMOL="$joined"
    record "assemble model" "OK (${#parts[@]} parts)"
  else
    rm -f "$joined"
    record "assemble model" "FAILED (checksum; parts ${#parts[@]})"
  fi
}

# c. The same greedy chat completion on cuda and on cpu.
step_generate() {
  if [ ! -f "$SMOL" ]; then
    section "c. generate"
    record "c. generate" "SKIPPED (no $SMOL)"
    return 0
  fi
  local dev
  for dev in cuda cpu; do
    run_step "c. generate --device $dev" 90 "$WORK/generate-$dev.txt" \
      "$FALLOW" generate --model "$SMOL" --device "$dev" --chat \
      --prompt "What is the capital of France?" --max-tokens 32 --temperature 0
  done
  # The two need not agree: the CPU backend rounds activations to Q8_1 as llama.cpp does (on
  # this prompt llama.cpp itself answers "L'Étoile, la Marseillaise, …"), while CUDA's bf16
  # weights compute as f32 math does. So CUDA's text is checked against the f32 reference's
  # greedy text (transformers-style math on the same weights, in the fixtures), which it
  # must begin; the CPU's is shown (its logits are checked against llama.cpp's in the suite).
  section "c. generate: cuda vs the f32 reference"
  for dev in cuda cpu; do
    echo "--- $dev:"
    cat "$WORK/generate-$dev.txt" 2>/dev/null || true
    echo
  done
  local reference=gpu-runner/engine/tests/fixtures/smollm2_logits_f32.json
  if [ -s "$WORK/generate-cuda.txt" ] && "$PY" - "$reference" "$WORK/generate-cuda.txt" <<'PY'
import json, sys
expected = json.load(open(sys.argv[1]))["cases"][0]["greedy_text"]
got = open(sys.argv[2]).read().strip()
print(f"f32 reference: {expected[:80]!r}")
sys.exit(0 if got and expected.startswith(got) else 1)
PY
  then
    record "c. generate cuda vs the f32 reference" "MATCHES"
  else
    record "c. generate cuda vs the f32 reference" "DIFFERENT (or missing)"
  fi
  # The GGUF's matrices as bf16 against its own Q4_1/Q8_0 blocks (dequantizing GEMV):
  # decode tok/s of each, side by side in the log.
  local storage
  for storage in bf16 quantized; do
    run_step "c2. SmolLM2 bench, $storage weights" 60 "$WORK/smol-bench-$storage.log" \
      "$FALLOW" bench engine --model "$SMOL" --device cuda --cuda-weights "$storage" \
      --concurrency 1,8,64 --prompt-tokens 32 --gen-tokens 64 --kv-cache-mib 2048
  done
  # Its own blocks again, the decode products reading x rounded to int8 (Q4_1 · q8 __dp4a).
  run_step "c2. SmolLM2 bench, quantized weights, x as int8" 60 "$WORK/smol-bench-int8.log" \
    env FALLOW_CUDA_QUANT_X=int8 "$FALLOW" bench engine --model "$SMOL" --device cuda \
    --cuda-weights quantized --concurrency 1,8,64 --prompt-tokens 32 --gen-tokens 64 \
    --kv-cache-mib 2048
  # JSON-schema constrained decoding (masks applied on the GPU) against unconstrained.
  run_step "c3. SmolLM2 bench, JSON schema" 60 "$WORK/smol-bench-json.log" \
    "$FALLOW" bench engine --model "$SMOL" --device cuda --concurrency 1,16 \
    --prompt-tokens 32 --gen-tokens 64 --kv-cache-mib 2048 --json-schema bench/schema.json
  # Many LoRA adapters over the base: 16 streams of the base alone, then over 1, 4 and 16
  # different random rank-8 adapters (the BGMV deltas, steps run unfused and eagerly).
  run_step "c5. SmolLM2 bench, LoRA adapters" 90 "$WORK/smol-bench-lora.log" \
    "$FALLOW" bench engine --model "$SMOL" --device cuda --concurrency 16 \
    --prompt-tokens 32 --gen-tokens 64 --kv-cache-mib 2048 --loras 1,4,16
  # Sampled decoding with top-p (the threshold searched among gathered tokens on the GPU)
  # against c2's greedy decoding of the same model.
  run_step "c4. SmolLM2 bench, top-p sampling" 60 "$WORK/smol-bench-sampled.log" \
    "$FALLOW" bench engine --model "$SMOL" --device cuda --concurrency 1,8 \
    --prompt-tokens 32 --gen-tokens 64 --kv-cache-mib 2048 --temperature 0.8 --top-p 0.9
}

# i. A Qwen3-30B-A3B shaped random checkpoint, 4 layers of its 48 (about 6 GB): its mixture
# of experts at the real expert count and width, decoding at batch 1 and 8 with the expert
# banks in bf16 and in Q8_0 (bf16 x through both grouped products).
step_moe() {
  local dir="${MOE_DIR:-/tmp/qwen3moe}"
  run_step "i. make random Qwen3-30B-A3B (4 layers)" 150 - \
    "$PY" gpu-runner/scripts/make_random_llama.py "$dir" --qwen3-moe --layers 4
  if [ ! -f "$dir/done.json" ]; then
    record "i. MoE bench" "SKIPPED (no model in $dir)"
    return 0
  fi
  run_step "i. MoE bench, bf16 and Q8_0 experts" 150 "$OUT/moe-bench.log" \
    bash -c 'for s in bf16 q8_0; do "$0" bench engine --model "$1" --device cuda \
      --cuda-weights $s --concurrency 1,8 --prompt-tokens 32 --gen-tokens 64 \
      --kv-cache-mib 4096 2>&1 || exit; done' "$FALLOW" "$dir"
}

main() {
  echo "gpu-check: $(date -u +%FT%TZ), repo $ROOT, budget ${BUDGET_S}s, output $OUT"
  if [ "${GPU_CHECK_ONLY:-}" = moe ]; then
    step_environment
    step_tests
    step_moe
    echo "gpu-check: GPU_CHECK_ONLY=moe, done in $((SECONDS - START_S))s"
    ! grep -qE $'\t(FAILED|TIMEOUT)' "$OUT/steps.tsv"
    return
  fi
  step_environment
  assemble_model
  step_tests
  step_generate
  if [ "${GPU_CHECK_ONLY:-}" = model ]; then
    timeout 30 "$PY" gpu-runner/scripts/bandwidth.py summary --steps "$OUT/steps.tsv" \
      --smol-bf16-log "$WORK/smol-bench-bf16.log" --smol-quant-log "$WORK/smol-bench-quantized.log" \
      --smol-int8-log "$WORK/smol-bench-int8.log" \
      --smol-json-log "$WORK/smol-bench-json.log" --smol-sampled-log "$WORK/smol-bench-sampled.log" \
      --out "$OUT/summary.txt" || echo "summary: FAILED rc=$?"
    echo "gpu-check: GPU_CHECK_ONLY=model, done in $((SECONDS - START_S))s"
    if grep -qE $'\t(FAILED|TIMEOUT)' "$OUT/steps.tsv"; then return 1; fi
    return 0
  fi

  # f. at concurrency $3 (1 or 1,8) under the settings that follow ("NAME=value" ...), into
  # $WORK/$2: one A/B step against f.
  bench_with() {
    local title=$1 log=$2 concurrency=$3
    shift 3
    run_step "$title" 90 "$WORK/$log" env "$@" "$FALLOW" bench engine --model "$LLAMA_DIR" \
      --device cuda --concurrency "$concurrency" --prompt-tokens 32 --gen-tokens 128 \
      --kv-cache-mib 8192
  }
  run_step "d. make random Llama-3.1-8B" 240 - "$PY" gpu-runner/scripts/make_random_llama.py "$LLAMA_DIR"
  run_step "e. bandwidth" 60 "$WORK/bandwidth.txt" "$PY" gpu-runner/scripts/bandwidth.py
  local have_model=1
  if [ ! -f "$LLAMA_DIR/done.json" ]; then have_model=0; fi
  if ((have_model)); then
    # (stderr too: the GEMV variants timed at load are logged there, and the step clock's
    # table, GPU vs host time per step, printed when the model is dropped; the summary lists
    # both.)
    run_step "f. fallow bench engine" 240 "$OUT/fallow-bench.log" \
      bash -c 'FALLOW_CUDA_DEBUG=step-clock "$0" bench engine --model "$1" --device cuda --concurrency 1,8,64 \
        --prompt-tokens 32 --gen-tokens 128 --kv-cache-mib 8192 2>&1' "$FALLOW" "$LLAMA_DIR"
    run_step "g. HF transformers bench" 180 "$OUT/hf-bench.log" \
      "$PY" gpu-runner/scripts/hf_bench.py "$LLAMA_DIR" --batches 1,8,64 --prompt-tokens 32 --gen-tokens 128
    # Per launch GPU time (CUDA events, graphs off) at batch 1 and 64: which kernels keep
    # batch 1 from the roofline (GEMM rows show the weight GB/s they reach).
    # (The table goes to stderr when the model is dropped: folded into the log.)
    run_step "f3. per-kernel profile" 90 "$OUT/fallow-profile.log" \
      bash -c 'FALLOW_CUDA_DEBUG=profile "$0" bench engine --model "$1" --device cuda \
        --concurrency 1,64 --prompt-tokens 32 --gen-tokens 32 --kv-cache-mib 8192 2>&1' \
      "$FALLOW" "$LLAMA_DIR"
    # Batch 1 and 8 with the sub-block ends split between the output/down GEMVs and the next
    # product (their rows added to the residual stream and the 1/rms folded into the next
    # GEMV's sums): no add_rms_norm launch (an 8B's 4096-wide rows take one), no block walking
    # whole rows. Opt-in until this measures it (within bf16 rounding, not the same bits).
    bench_with "f15. fallow bench engine, split sub-block ends" "fallow-bench-split-norm.log" 1,8 FALLOW_CUDA_SPLIT_NORM=true
    # Batch 1 and 8 with decode attention split only past 256 keys (before session 13: one
    # block per KV head at short contexts) instead of 64 (split-min-keys=256).
    bench_with "f10. fallow bench engine, attention split from 256 keys" "fallow-bench-split256.log" 1,8 FALLOW_CUDA_DEBUG=split-min-keys=256
    # Batch 1 and 8 with the GEMV timed among the CUDA-core variants only: what the
    # tensor-core GEMV (m16n8k16 tiles) wins where the summary's choices name it.
    bench_with "f11. fallow bench engine, CUDA-core GEMVs only" "fallow-bench-cuda-cores.log" 1,8 FALLOW_CUDA_DEBUG=no-tensor-gemv
    # Batch 1 and 8 with every decode-sized bf16 product a GEMV (cuBLAS not timed against
    # them): what cuBLAS wins where the summary lists products given to it.
    bench_with "f12. fallow bench engine, GEMVs only" "fallow-bench-gemv-only.log" 1,8 FALLOW_CUDA_DEBUG=no-gemv-cublas
    # Batch 1 and 8 with no weights asked into L2 before a GEMV's wait (and no KV rows before
    # the attention's): what the prefetches win while attention and norms leave memory idle.
    bench_with "f8. fallow bench engine, no L2 prefetch" "fallow-bench-no-prefetch.log" 1,8 FALLOW_CUDA_DEBUG=no-l2-prefetch
    # Batch 1 and 8 with the down GEMV activating the [gate | up] rows it stages instead of
    # the gate/up GEMV writing the activation (same bits): what the paired rows win.
    bench_with "f9. fallow bench engine, activation in the down GEMV" "fallow-bench-gated-down.log" 1,8 FALLOW_CUDA_DEBUG=no-fused-glu
    # Batch 1 with every kernel launched only once the previous one has finished (no
    # programmatic dependent launch): what early starts win at the roofline's end.
    bench_with "f5. fallow bench engine, plain launches" "fallow-bench-plain.log" 1 FALLOW_CUDA_DEBUG=no-early-start
    # Batch 1 with add_rms_norm and qkv_prepare launched instead of done in the output and
    # down GEMVs' last blocks and in the attention blocks: what the fusions win (same bits).
    bench_with "f7. fallow bench engine, separate norm and RoPE launches" "fallow-bench-separate-norm.log" 1 FALLOW_CUDA_DEBUG=no-fused-norm,no-fused-rope
    # One long prompt, prefill attention on the tensor cores (the default) and on the f32
    # kernel: attention grows with the square of the prompt, so it dominates long prefills.
    run_step "f6. long-prompt prefill, tensor cores vs f32" 120 - \
      bash -c 'for k in mma f32; do FALLOW_CUDA_DEBUG=prefill=$k "$0" bench engine --model "$1" \
        --device cuda --concurrency 1 --prompt-tokens 4096 --gen-tokens 4 --kv-cache-mib 8192 \
        > "$2/prefill-$k.log" || exit; done' "$FALLOW" "$LLAMA_DIR" "$WORK"
    # The same model's matrices quantized to Q8_0 at load (about half the bytes per step):
    # against f., does the dequantizing GEMV turn fewer bytes into more tokens/s?
    run_step "f4. fallow bench engine, Q8_0 weights" 150 "$WORK/fallow-bench-q8_0.log" \
      "$FALLOW" bench engine --model "$LLAMA_DIR" --device cuda --cuda-weights q8_0 \
      --concurrency 1,8,64 --prompt-tokens 32 --gen-tokens 128 --kv-cache-mib 8192
    # Quantized to Q4_K at load (0.28 of bf16's bytes): the K-quant GEMV (16-byte loads of
    # super-blocks in the bf16 GEMV's loop) at decode sizes; at 64 the blocks expanded to
    # bf16 for cuBLAS.
    run_step "f13. fallow bench engine, Q4_K weights" 150 "$WORK/fallow-bench-q4_k.log" \
      "$FALLOW" bench engine --model "$LLAMA_DIR" --device cuda --cuda-weights q4_k \
      --concurrency 1,8,64 --prompt-tokens 32 --gen-tokens 128 --kv-cache-mib 8192
    # Q4_K and Q8_0 at load with the products reading x rounded to int8 per group of 32
    # (integer dot products: about a fifth of the instructions per weight of f13.'s; Q8_0's
    # are pure __dp4a), against f13. and f4.; at 64 the int8 tensor-core products (mmq.cu,
    # ~0.56 bytes per Q4_K weight) against f13.'s and f4.'s expansion for cuBLAS (~4.6),
    # where the load's timing of the two (logged on stderr, listed by the summary) found
    # them faster.
    run_step "f14. fallow bench engine, Q4_K and Q8_0 weights, x as int8" 210 - \
      bash -c 'for s in q4_k q8_0; do FALLOW_CUDA_QUANT_X=int8 "$0" bench engine --model "$1" \
        --device cuda --cuda-weights $s --concurrency 1,8,64 --prompt-tokens 32 --gen-tokens 128 \
        --kv-cache-mib 8192 > "$2/fallow-bench-$s-int8.log" 2>&1 || exit; done' "$FALLOW" "$LLAMA_DIR" "$WORK"
    run_step "f2. fallow bench engine, no CUDA graphs" 120 "$WORK/fallow-bench-nographs.log" \
      env FALLOW_CUDA_DEBUG=no-graphs "$FALLOW" bench engine --model "$LLAMA_DIR" --device cuda \
      --concurrency 1,8 --prompt-tokens 32 --gen-tokens 128 --kv-cache-mib 8192
  else
    section "f./g. benchmarks"
    record "f. fallow bench engine" "SKIPPED (no model in $LLAMA_DIR)"
    record "g. HF transformers bench" "SKIPPED (no model in $LLAMA_DIR)"
  fi

  step_moe

  section "h. summary"
  local bw
  bw=$(sed -n 's/^bandwidth_gbs=//p' "$WORK/bandwidth.txt" 2>/dev/null | tail -n 1 || true)
  timeout 30 "$PY" gpu-runner/scripts/bandwidth.py summary \
    --fallow-log "$OUT/fallow-bench.log" --hf-log "$OUT/hf-bench.log" \
    --bytes-per-step "$LLAMA_DIR/bytes_per_step.txt" ${bw:+--bandwidth-gbs "$bw"} \
    --steps "$OUT/steps.tsv" --q8-log "$WORK/fallow-bench-q8_0.log" \
    --q4k-log "$WORK/fallow-bench-q4_k.log" --q4k-int8-log "$WORK/fallow-bench-q4_k-int8.log" \
    --q8-int8-log "$WORK/fallow-bench-q8_0-int8.log" \
    --smol-bf16-log "$WORK/smol-bench-bf16.log" --smol-quant-log "$WORK/smol-bench-quantized.log" \
      --smol-int8-log "$WORK/smol-bench-int8.log" \
    --smol-json-log "$WORK/smol-bench-json.log" --smol-sampled-log "$WORK/smol-bench-sampled.log" \
    --plain-log "$WORK/fallow-bench-plain.log" --split-norm-log "$WORK/fallow-bench-split-norm.log" \
    --separate-norm-log "$WORK/fallow-bench-separate-norm.log" \
    --no-prefetch-log "$WORK/fallow-bench-no-prefetch.log" \
    --gated-down-log "$WORK/fallow-bench-gated-down.log" --split256-log "$WORK/fallow-bench-split256.log" \
    --cuda-cores-log "$WORK/fallow-bench-cuda-cores.log" \
    --gemv-only-log "$WORK/fallow-bench-gemv-only.log" \
    --prefill-mma-log "$WORK/prefill-mma.log" \
    --prefill-f32-log "$WORK/prefill-f32.log" --out "$OUT/summary.txt" ||
    echo "summary: FAILED rc=$?" | tee "$OUT/summary.txt"
  echo
  echo "gpu-check: done in $((SECONDS - START_S))s; files in $OUT: $(cd "$OUT" && echo *)"
  # Non-zero when any step failed or timed out (skips do not count).
  ! grep -qE $'\t(FAILED|TIMEOUT)' "$OUT/steps.tsv"
}

mkdir -p "$OUT" "$WORK"
rm -rf "$OUT/steps.tsv" "$OUT/summary.txt" "$OUT/fallow-bench.log" "$OUT/fallow-profile.log" \
  "$OUT/hf-bench.log" "$OUT/moe-bench.log" "${WORK:?}"/*
main 2>&1 | tee "$OUT/gpu-check.log"
