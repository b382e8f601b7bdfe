#!/usr/bin/env bash
# Converts the PEFT LoRA fixtures that llama.cpp can represent (no rank-stabilised scaling)
# to llama.cpp's GGUF adapter format, with llama.cpp's own converter:
#
#   scripts/make_gguf_lora_fixtures.sh LLAMA_CPP_DIR [PYTHON]
#
# LLAMA_CPP_DIR is a llama.cpp source tree, e.g. the `vendor/llama.cpp` of the PyPI
# `llama-cpp-python` sdist (0.3.36 was used); PYTHON has torch, transformers and numpy
# (the venv of scripts/make_lora_fixtures.py). Each adapter is written as f32 next to its
# PEFT files, as `adapter.gguf`; the PEFT reference logits serve both.
set -euo pipefail
llama_cpp="${1:?usage: $0 LLAMA_CPP_DIR [PYTHON]}"
python="${2:-python3}"
fixtures="$(cd "$(dirname "$0")/.." && pwd)/gpu-runner/engine/tests/fixtures/tiny"
for adapter in llama_qv_r4 llama_all_r8 qwen3_mlp_r4; do
  base="${adapter%%_*}"
  PYTHONPATH="$llama_cpp/gguf-py" "$python" "$llama_cpp/convert_lora_to_gguf.py" \
    --base "$fixtures/$base" --outtype f32 \
    --outfile "$fixtures/lora/$adapter/adapter.gguf" "$fixtures/lora/$adapter"
done
