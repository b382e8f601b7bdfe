#!/usr/bin/env bash
# Converts the PEFT LoRA fixtures that llama.cpp can represent (no rank-stabilised scaling)
# to llama.cpp's GGUF adapter format, with llama.cpp's own converter:
#
#   scripts/make_gguf_lora_fixtures.sh LLAMA_CPP_DIR [PYTHON]
#
# LLAMA_CPP_DIR is a llama.cpp source tree, e.g. the `vendor/llama.cpp` of the PyPI
# `llama-cpp-python` sdist (0.3.36 was used); PYTHON has torch, transformers and numpy
# (the venv of scripts/make_lora_fixtures.py). Each adapter is written as f32 next to its
# PEFT files, as `adapter.gguf`; the PEFT reference logits serve both. The tiny Llama base
# is converted too (`llama/model.f32.gguf`, its Q/K rows interleaved as llama.cpp stores
# them), so that adapters are also checked over a GGUF base; its tiny BPE is declared
# `gpt-2`, as in scripts/make_moe_gguf_fixtures.py (only token ids are fed).
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
PYTHONPATH="$llama_cpp/gguf-py" "$python" - "$llama_cpp" "$fixtures/llama" <<'EOF'
import os
import sys

llama_cpp, model = sys.argv[1], sys.argv[2]
sys.path[:0] = [llama_cpp, os.path.join(llama_cpp, "gguf-py")]
import convert_hf_to_gguf
from conversion.base import TextModel

TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
out = os.path.join(model, "model.f32.gguf")
sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--outfile", out, model]
convert_hf_to_gguf.main()
EOF
