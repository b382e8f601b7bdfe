#!/usr/bin/env bash
# Fallow's engine against llama.cpp, same machine, same run, interleaved, as ratios.
#
# Usage: bench/compare_llamacpp.sh [--model M.gguf]... [--rounds N] [--threads T] [--best]
#
# Each figure is the median of the rounds; with --best, the speeds are each side's best round
# instead (for a shared VM whose neighbours slow single runs by up to half: interference only
# ever slows a run, so the best round is the least disturbed one). RSS is always the median.
#
# The peer is llama-cpp-python 0.3.36 from PyPI (it builds llama.cpp 0c1e57098), installed into
# the git-ignored venv .cache/bench-venv on first use (~6 min). LLAMACPP_PYTHON=/path/to/python
# uses an interpreter that already has it instead; LLAMACPP_CMAKE_ARGS goes to its build as
# CMAKE_ARGS (a VM that lists AMX in /proc/cpuinfo without enabling it kills llama.cpp's
# native build with SIGILL: build it with -DGGML_NATIVE=OFF and the ISA flags, see
# docs/performance.md). This is a benchmark, not a test: CI does not run it. See
# docs/performance.md for what each figure means.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=()
ROUNDS=3
THREADS=2
STAT=median
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODELS+=("$2"); shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --best) STAT=best; shift ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ ${#MODELS[@]} -eq 0 ]] && MODELS=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
for m in "${MODELS[@]}"; do
  [[ -f "$m" ]] || { echo "model not found: $m" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 2; }

PY="${LLAMACPP_PYTHON:-}"
if [[ -z "$PY" ]]; then
  VENV=.cache/bench-venv
  if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    echo "installing llama-cpp-python==0.3.36 into $VENV (builds llama.cpp, several minutes)" >&2
    python3 -m venv "$VENV"
    CMAKE_ARGS="${LLAMACPP_CMAKE_ARGS:-}" "$VENV/bin/pip" install --quiet --no-cache-dir \
      'llama-cpp-python==0.3.36' numpy
  fi
  PY="$VENV/bin/python"
fi

cargo build --release --bin fallow >&2
FALLOW=target/release/fallow

# Both engines get exactly THREADS threads: the CPU worker team for ours (FALLOW_CPU_THREADS),
# n_threads(_batch) and OpenMP for the peer.
export FALLOW_CPU_THREADS="$THREADS" RAYON_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS"

RAW=$(mktemp)
LOG=$(mktemp)
trap 'rm -f "$RAW" "$LOG"' EXIT

# One measurement of each side. Each prints "<side> <figure> <round> <model> <key>=<value>...".
peer() { # model figure round conc prompt gen
  /usr/bin/time -f "rss_kb=%M" "$PY" bench/llamacpp_bench.py --model "$1" --threads "$THREADS" \
    --concurrency "$4" --prompt-tokens "$5" --gen-tokens "$6" >"$LOG" 2>&1 \
    || { cat "$LOG" >&2; exit 1; }
  local kv result rss
  # Models with sliding-window layers (Gemma 3) have two caches, hence the sum.
  kv=$(sed -n 's/^llama_kv_cache: size = *\([0-9.]*\) MiB.*/\1/p' "$LOG" | paste -sd+ | bc)
  result=$(sed -n 's/^RESULT //p' "$LOG")
  rss=$(sed -n 's/^rss_kb=//p' "$LOG")
  echo "peer $2 $3 $1 $result rss_kb=$rss kv_mib=$kv" | tee -a "$RAW" >&2
  PEER_KV_MIB=$(python3 -c "import math; print(max(1, math.ceil(float('${kv:-1}'))))")
}
ours() { # model figure round conc prompt gen kv_mib
  local mib="$7" have
  until /usr/bin/time -f "rss_kb=%M" "$FALLOW" bench engine --model "$1" --concurrency "$4" \
    --prompt-tokens "$5" --gen-tokens "$6" --kv-cache-mib "$mib" >"$LOG" 2>&1; do
    # The peer's cache can be smaller than ours for the same tokens (llama.cpp keeps only the
    # window for sliding-window layers); then give ours the least that holds the run.
    have=$(sed -n 's/.*exceeds the KV cache of \([0-9]*\) tokens.*/\1/p' "$LOG")
    [[ -n "$have" && "$have" -gt 0 && "$mib" -lt 65536 ]] || { cat "$LOG" >&2; exit 1; }
    mib=$(python3 -c "import math; print(math.ceil($mib * ($4 * ($5 + $6 + 16)) / $have) + 1)")
  done
  local row rss
  row=$(awk -v c="$4" '$1 == c && $2 == "none" { print "prefill_tps="$3" decode_tps="$4" aggregate_tps="$5 }' "$LOG")
  rss=$(sed -n 's/^rss_kb=//p' "$LOG")
  echo "ours $2 $3 $1 $row rss_kb=$rss kv_mib=$mib" | tee -a "$RAW" >&2
}

FIGURES=("decode 1 16 128" "prefill 1 512 1" "streams16 16 16 128")
for model in "${MODELS[@]}"; do
  for ((r = 1; r <= ROUNDS; r++)); do
    for f in "${FIGURES[@]}"; do
      read -r fig conc prompt gen <<<"$f"
      # The peer runs first in each pair only so ours can be given the same KV cache size
      # (llama.cpp's context for this run), which makes peak RSS comparable.
      peer "$model" "$fig" "$r" "$conc" "$prompt" "$gen"
      ours "$model" "$fig" "$r" "$conc" "$prompt" "$gen" "$PEER_KV_MIB"
    done
  done
done

python3 - "$RAW" "$THREADS" "$ROUNDS" "$STAT" <<'EOF'
import statistics, sys
from collections import defaultdict

raw, threads, rounds, stat = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
vals = defaultdict(list)  # (model, side, figure, key) -> values over rounds
for line in open(raw):
    side, fig, _round, model, *kvs = line.split()
    for kv in kvs:
        k, _, v = kv.partition("=")
        if v:
            vals[(model, side, fig, k)].append(float(v))

def med(model, side, fig, key):
    xs = vals.get((model, side, fig, key))
    if not xs:
        return float("nan")
    return max(xs) if stat == "best" and key.endswith("_tps") else statistics.median(xs)

rows = [
    ("single-stream decode tok/s (128 after 16)", "decode", "decode_tps", 1, ">= 1.0x"),
    ("prompt processing tok/s (512 tokens)", "prefill", "prefill_tps", 1, ">= 1.0x"),
    ("16 streams: aggregate tok/s incl. prefill", "streams16", "aggregate_tps", 1, ">= 2.0x"),
    ("16 streams: decode-only tok/s", "streams16", "decode_tps", 1, "(info)"),
    ("peak RSS MiB, 1 stream", "decode", "rss_kb", 1 / 1024, "<= 1.2x"),
    ("peak RSS MiB, 16 streams", "streams16", "rss_kb", 1 / 1024, "<= 1.2x"),
]
for model in dict.fromkeys(k[0] for k in vals):
    how = "best speeds, median RSS" if stat == "best" else "median"
    print(f"\n{model}  ({threads} threads, {how} of {rounds} interleaved rounds)")
    print(f"| {'figure':<42} | {'ours':>8} | {'llama.cpp':>9} | {'ratio':>6} | {'target':<7} | met |")
    print(f"|{'-' * 44}|{'-' * 10}|{'-' * 11}|{'-' * 8}|{'-' * 9}|-----|")
    for label, fig, key, scale, target in rows:
        o, p = med(model, "ours", fig, key) * scale, med(model, "peer", fig, key) * scale
        ratio = o / p if p else float("nan")
        if target.startswith(">="):
            met = "yes" if ratio >= float(target.split()[1][:-1]) else "no"
        elif target.startswith("<="):
            met = "yes" if ratio <= float(target.split()[1][:-1]) else "no"
        else:
            met = ""
        print(f"| {label:<42} | {o:>8.1f} | {p:>9.1f} | {ratio:>5.2f}x | {target:<7} | {met:<3} |")
EOF
