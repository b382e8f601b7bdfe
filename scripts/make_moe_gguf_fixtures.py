#!/usr/bin/env python3
"""Converts the tiny MoE checkpoints (qwen3_moe, mixtral, qwen2_moe, gpt_oss, gpt_oss_mxfp4
under gpu-runner/engine/tests/fixtures/tiny/) to GGUF with llama.cpp's own converter, and records
llama.cpp's logits on each GGUF. gpu-runner/engine/tests/moe_vs_llama_cpp.rs checks Fallow
against them.

    /work/tinyvenv/bin/python scripts/make_moe_gguf_fixtures.py LLAMA_CPP_DIR [model ...]

LLAMA_CPP_DIR is the `vendor/llama.cpp` of the PyPI `llama-cpp-python` sdist (0.3.36 was
used), and the Python running this has that llama-cpp-python installed (built from the same
sdist: `pip install llama_cpp_python-0.3.36.tar.gz`), plus torch and transformers.

Written next to each checkpoint:
- `model.q8_0.gguf` and/or `model.f32.gguf` (see OUTTYPES):
  `convert_hf_to_gguf.py --outtype q8_0 | f32`.
- `model.mxfp4.gguf` (gpt_oss_mxfp4): `--outtype f32`, under which the converter still
  repacks gpt-oss's MXFP4 experts into GGUF's MXFP4 (ggml type 39) and widens the rest
  to f32, so the experts are the only quantized tensors.
  The tiny byte-level BPE is unknown to the converter's pre-tokenizer table, so it is
  declared `gpt-2` (only token ids are fed to either engine, so this cannot matter).
- `llama_cpp.json`: for each GGUF, llama.cpp's logits at every position of the three
  `reference.json` sequences (one batched evaluation, f32 KV cache, 2 threads), rounded to
  4 decimals.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "gpu-runner", "engine", "tests", "fixtures", "tiny")
# The f32 file checks the converter's layout tightly; Q8_0 the quantized expert path.
# (Mixtral's f32 file would add 1 MB for what qwen3_moe's already shows.)
OUTTYPES = {
    "qwen3_moe": ["f32", "q8_0"],
    "mixtral": ["q8_0"],
    "qwen2_moe": ["f32"],
    # gpt-oss's names and keys (experts split and transposed, sinks, biases, YaRN).
    "gpt_oss": ["f32"],
    # The experts as llama.cpp's converter repacks the HF MXFP4 blocks (type 39).
    "gpt_oss_mxfp4": ["mxfp4"],
}
# A file's `--outtype`, where its name says something else.
CONVERTER_OUTTYPE = {"mxfp4": "f32"}


def convert(llama_cpp: str, model_dir: str, outtype: str) -> str:
    sys.path[:0] = [llama_cpp, os.path.join(llama_cpp, "gguf-py")]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    out = os.path.join(model_dir, f"model.{outtype}.gguf")
    argv = sys.argv
    outtype = CONVERTER_OUTTYPE.get(outtype, outtype)
    sys.argv = ["convert_hf_to_gguf.py", "--outtype", outtype, "--outfile", out, model_dir]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv
    return out


def llama_cpp_logits(gguf: str, sequences: list) -> list:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=gguf,
        n_ctx=64,
        n_batch=64,
        n_threads=2,
        logits_all=True,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        flash_attn=False,
        verbose=False,
    )
    out = []
    for ids in sequences:
        llm.reset()
        llm.eval(ids)
        rows = llm.scores[: len(ids)]
        out.append([[round(float(x), 4) for x in row] for row in rows])
    return out


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    llama_cpp_dir = os.path.abspath(sys.argv[1])
    wanted = set(sys.argv[2:])
    import llama_cpp

    for name, outtypes in OUTTYPES.items():
        if wanted and name not in wanted:
            continue
        model_dir = os.path.join(TINY, name)
        with open(os.path.join(model_dir, "reference.json")) as f:
            sequences = json.load(f)["sequences"]
        record = {
            "generator": {
                "script": "scripts/make_moe_gguf_fixtures.py",
                "llama_cpp_python": llama_cpp.__version__,
                "kv_cache_type": "f32",
                "n_threads": 2,
                "logit_rounding": 4,
            },
            "sequences": sequences,
            "logits": {},
        }
        for outtype in outtypes:
            gguf = convert(llama_cpp_dir, model_dir, outtype)
            record["logits"][os.path.basename(gguf)] = llama_cpp_logits(gguf, sequences)
        with open(os.path.join(model_dir, "llama_cpp.json"), "w") as f:
            json.dump(record, f, separators=(",", ":"))
            f.write("\n")
        print(f"{name}: {sorted(record['logits'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
