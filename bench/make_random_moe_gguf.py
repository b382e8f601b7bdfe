#!/usr/bin/env python3
"""Writes a random-weight Qwen3-MoE GGUF of about 1.3 B parameters (8 experts, top-2), then
has llama.cpp quantize it, for `bench/compare_llamacpp.sh` (speed) and
`bench/moe_logits_vs_llamacpp.py` (agreement). Generated at benchmark time, never committed.

    python bench/make_random_moe_gguf.py OUTDIR [--types q4_k_m,q8_0] [--layers 16]

The Python needs llama-cpp-python 0.3.36 (for llama.cpp's quantizer), numpy, and the
`gguf` package of the same llama.cpp (PYTHONPATH=<llama.cpp>/gguf-py, or `pip install gguf`).

Shape (per layer): hidden 1024, 16 query heads and 4 KV heads of 64, per-head Q/K norms,
8 experts of width 2816, top-2 with renormalised weights; 16 layers; the tokenizer (and
vocabulary of 49152) of SmolLM2, copied from models/SmolLM2-135M-Instruct.Q4_1.gguf, so both
engines load it as an ordinary model. That is ~1.25 B parameters in all, ~0.35 B active per
token. Weights are N(0, 1/fan_in); the router is 3× larger so that routes are decisive.

Writes OUTDIR/moe-1b.f16.gguf, then OUTDIR/moe-1b.<type>.gguf for each type.
"""

import argparse
import os
import sys

import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 1024, 16, 4, 64
EXPERTS, TOP_K, EXPERT_FFN = 8, 2, 2816
SEED = 20261206
TOKENIZER_FROM = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
FTYPES = {"q8_0": 7, "q4_k_m": 15}


def copy_tokenizer(writer, gguf):
    """Every `tokenizer.*` key of an existing GGUF, values and types as they are."""
    from gguf import GGUFValueType

    for field in gguf.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            values = [field.contents(i) for i in range(len(field.data))]
            writer.add_key_value(field.name, values, kind, sub_type=sub)
        else:
            writer.add_key_value(field.name, field.contents(), kind)


def write_f16(path: str, layers: int, tokenizer_from: str) -> None:
    from gguf import GGUFReader, GGUFWriter

    source = GGUFReader(tokenizer_from)
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(SEED)

    def matrix(*shape, scale=1.0):
        fan_in = shape[-1]
        return (rng.standard_normal(shape, dtype=np.float32) * (scale / fan_in**0.5)).astype(
            np.float16
        )

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w = GGUFWriter(path, "qwen3moe")
    w.add_name("random Qwen3-MoE for benchmarks")
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(layers)
    w.add_feed_forward_length(EXPERT_FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_file_type(1)  # mostly F16
    copy_tokenizer(w, source)

    w.add_tensor("token_embd.weight", matrix(vocab, HIDDEN, scale=HIDDEN**0.5))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(HIDDEN))
        w.add_tensor(b + "attn_q.weight", matrix(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(b + "attn_k.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(b + "attn_v.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(b + "attn_output.weight", matrix(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(b + "attn_q_norm.weight", norm(HEAD_DIM))
        w.add_tensor(b + "attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(b + "ffn_norm.weight", norm(HIDDEN))
        w.add_tensor(b + "ffn_gate_inp.weight", matrix(EXPERTS, HIDDEN, scale=3.0).astype(np.float32))
        w.add_tensor(b + "ffn_gate_exps.weight", matrix(EXPERTS, EXPERT_FFN, HIDDEN))
        w.add_tensor(b + "ffn_up_exps.weight", matrix(EXPERTS, EXPERT_FFN, HIDDEN))
        w.add_tensor(b + "ffn_down_exps.weight", matrix(EXPERTS, HIDDEN, EXPERT_FFN))
    w.add_tensor("output_norm.weight", norm(HIDDEN))
    w.add_tensor("output.weight", matrix(vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: str, dst: str, ftype: int) -> None:
    import llama_cpp as L

    params = L.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = os.cpu_count() or 2
    rc = L.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        sys.exit(f"llama.cpp could not quantize {src} to {dst} (rc {rc})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--types", default="q4_k_m,q8_0")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--tokenizer-from", default=TOKENIZER_FROM)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    f16 = os.path.join(args.outdir, "moe-1b.f16.gguf")
    if not os.path.exists(f16):
        write_f16(f16 + ".tmp", args.layers, args.tokenizer_from)
        os.replace(f16 + ".tmp", f16)
    for t in filter(None, args.types.split(",")):
        out = os.path.join(args.outdir, f"moe-1b.{t}.gguf")
        if not os.path.exists(out):
            quantize(f16, out, FTYPES[t])
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
