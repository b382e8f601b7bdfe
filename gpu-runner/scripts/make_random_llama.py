#!/usr/bin/env python3
"""Writes a Llama-3.1-8B-shaped Hugging Face model directory with random BF16 weights.

    python3 gpu-runner/scripts/make_random_llama.py OUTDIR [--layers N] [--seed S] [--qwen3-moe]

With --qwen3-moe the shape is Qwen3-30B-A3B's instead (Qwen3MoeForCausalLM: 128 experts of
768, 8 per token, q/k norms, head_dim 128), a matrix per expert as the published checkpoint
has them; give it few --layers (each is about 1.2 GB), as gpu-check.sh's MoE step does.

For benchmarking Fallow's CUDA backend against transformers without downloading the real
checkpoint: the shapes, dtype, tensor names, sharding and config.json are those of
meta-llama/Llama-3.1-8B(-Instruct), so each decode step reads as many bytes as the real model.

Files written:
- config.json, generation_config.json: Llama 3.1 8B's (eos ids of the Instruct model).
- model-0000K-of-0000N.safetensors (shards of at most 5 GB) + model.safetensors.index.json.
  Weights ~ N(0, 0.02), RMSNorm weights 1.0, untied lm_head.
- tokenizer.json: a small byte-level BPE (the 256 byte tokens plus merges learned from a few
  sentences), padded with never-produced filler tokens up to id 127999, then Llama 3's 256
  special tokens at their real ids 128000..128255, so it spans the model's 128256 ids.
- tokenizer_config.json (bos/eos tokens, a Llama 3 style chat template).
- bytes_per_step.txt: bytes of weights one decode step reads (every layer matrix and norm,
  the final norm and lm_head; not the embedding table, of which a step reads one row).

The weights are drawn on the GPU with torch (on the CPU if CUDA is unavailable; without
torch at all, with Python's own generator, which only suits tiny --hidden-size test shapes)
and written tensor by tensor straight into the shard files, so host memory stays at one
tensor. Rerunning with the same arguments over a complete directory does nothing
(see `done.json`); --force rewrites it.

Environment: FALLOW_RANDOM_LAYERS overrides the default number of layers (32).
"""

import argparse
import array
import ctypes
import json
import os
import random
import struct
import sys
import time

# Llama-3.1-8B (config.json of meta-llama/Llama-3.1-8B-Instruct, transformers 4.43).
BOS_ID = 128000
EOS_IDS = [128001, 128008, 128009]
VOCAB = 128256
FIRST_SPECIAL = 128000

SHARD_MAX_BYTES = 5 * 10**9  # transformers' max_shard_size="5GB"
STD = 0.02
BF16_BYTES = 2

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# A few sentences to learn BPE merges from (the vocabulary only has to be valid).
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "Water boils at one hundred degrees at sea level, and freezes at zero.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "A tokenizer splits text into pieces; a model predicts the next piece from the ones before.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
] * 8


def llama3_special_tokens():
    """Llama 3's 256 special tokens, in id order from 128000."""
    names = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    reserved = 3
    while len(names) < VOCAB - FIRST_SPECIAL:
        names.append(f"<|reserved_special_token_{reserved}|>")
        reserved += 1
    return names


# Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B): (hidden, heads, kv heads, head_dim,
# experts, experts per token, expert width).
QWEN3_MOE = (2048, 32, 4, 128, 128, 8, 768)


def qwen3_moe_config(layers, hidden, heads, kv_heads, head_dim, experts, top_k, expert_ffn):
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "bos_token_id": BOS_ID,
        "decoder_sparse_step": 1,
        "eos_token_id": EOS_IDS,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": expert_ffn,
        "norm_topk_prob": True,
        "num_attention_heads": heads,
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def attention_plan(p, hidden, q, kv, qk_norm=0):
    """Layer prefix p's norms and attention (with q/k norms of width qk_norm, if any)."""
    plan = [
        (p + "input_layernorm.weight", (hidden,), True),
        (p + "self_attn.q_proj.weight", (q, hidden), False),
        (p + "self_attn.k_proj.weight", (kv, hidden), False),
        (p + "self_attn.v_proj.weight", (kv, hidden), False),
    ]
    if qk_norm:
        plan += [
            (p + "self_attn.q_norm.weight", (qk_norm,), True),
            (p + "self_attn.k_norm.weight", (qk_norm,), True),
        ]
    return plan + [
        (p + "self_attn.o_proj.weight", (hidden, q), False),
        (p + "post_attention_layernorm.weight", (hidden,), True),
    ]


def qwen3_moe_plan(layers, hidden, heads, kv_heads, head_dim, experts, top_k, expert_ffn):
    """The tensor plan of a Qwen3-MoE model (see tensor_plan)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    plan = [("model.embed_tokens.weight", (VOCAB, hidden), False)]
    for i in range(layers):
        p = f"model.layers.{i}."
        plan += attention_plan(p, hidden, q, kv, qk_norm=head_dim)
        plan.append((p + "mlp.gate.weight", (experts, hidden), False))
        for e in range(experts):
            x = f"{p}mlp.experts.{e}."
            plan += [
                (x + "gate_proj.weight", (expert_ffn, hidden), False),
                (x + "up_proj.weight", (expert_ffn, hidden), False),
                (x + "down_proj.weight", (hidden, expert_ffn), False),
            ]
    plan += [("model.norm.weight", (hidden,), True), ("lm_head.weight", (VOCAB, hidden), False)]
    return plan


def config_json(layers, hidden, inter, heads, kv_heads):
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_IDS,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def tensor_plan(layers, hidden, inter, heads, kv_heads):
    """[(name, shape, is_norm)] in file order: embedding, layer by layer, final norm, head."""
    head_dim = hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    plan = [("model.embed_tokens.weight", (VOCAB, hidden), False)]
    for i in range(layers):
        p = f"model.layers.{i}."
        plan += attention_plan(p, hidden, q, kv)
        plan += [
            (p + "mlp.gate_proj.weight", (inter, hidden), False),
            (p + "mlp.up_proj.weight", (inter, hidden), False),
            (p + "mlp.down_proj.weight", (hidden, inter), False),
        ]
    plan += [("model.norm.weight", (hidden,), True), ("lm_head.weight", (VOCAB, hidden), False)]
    return plan


def nbytes(shape):
    n = BF16_BYTES
    for d in shape:
        n *= d
    return n


def shard(plan, max_bytes=SHARD_MAX_BYTES):
    """Greedy packing of the plan, in order, into shards of at most max_bytes."""
    shards, cur, size = [], [], 0
    for entry in plan:
        b = nbytes(entry[1])
        if cur and size + b > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(entry)
        size += b
    if cur:
        shards.append(cur)
    return shards


def safetensors_header(entries):
    """The 8-byte length + JSON header of a shard holding `entries` back to back."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        end = offset + nbytes(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned, as safetensors does
    return struct.pack("<Q", len(raw)) + raw


class TorchSource:
    """Draws each tensor on the GPU and hands its bytes over through one pinned buffer."""

    def __init__(self, torch, seed, max_bytes):
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            print("warning: CUDA unavailable, drawing weights on the CPU (slow)", flush=True)
        torch.manual_seed(seed)
        pin = self.device == "cuda"
        self.staging = torch.empty(max_bytes, dtype=torch.uint8, pin_memory=pin)

    def write(self, f, shape, is_norm):
        torch = self.torch
        t = torch.empty(shape, dtype=torch.bfloat16, device=self.device)
        if is_norm:
            t.fill_(1.0)
        else:
            t.normal_(0.0, STD)
        n = t.numel() * BF16_BYTES
        host = self.staging[:n]
        host.copy_(t.reshape(-1).view(torch.uint8))
        # Writes straight from the pinned buffer, without a bytes copy.
        f.write((ctypes.c_char * n).from_address(host.data_ptr()))


class PythonSource:
    """Without torch: bf16 as the top half of float32 normals (truncated). Slow: tiny shapes."""

    def __init__(self, seed):
        print("warning: torch not found, drawing weights with Python's random (slow)", flush=True)
        self.rng = random.Random(seed)

    def write(self, f, shape, is_norm):
        n = nbytes(shape) // BF16_BYTES
        chunk = 1 << 20
        while n > 0:
            m = min(n, chunk)
            vals = [1.0] * m if is_norm else [self.rng.gauss(0.0, STD) for _ in range(m)]
            halves = array.array("H", array.array("f", vals).tobytes())
            if sys.byteorder != "little":
                raise SystemExit("big-endian hosts are not supported")
            f.write(halves[1::2].tobytes())
            n -= m


def write_weights(out, plan, source, max_shard_bytes):
    shards = shard(plan, max_shard_bytes)
    total = sum(nbytes(s) for _, s, _ in plan)
    weight_map = {}
    for k, entries in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        t0 = time.time()
        with open(os.path.join(out, fname), "wb") as f:
            f.write(safetensors_header(entries))
            for name, shape, is_norm in entries:
                source.write(f, shape, is_norm)
                weight_map[name] = fname
        size = sum(nbytes(s) for _, s, _ in entries)
        dt = time.time() - t0
        print(f"  {fname}: {size / 1e9:.2f} GB in {dt:.1f} s ({size / 1e9 / max(dt, 1e-9):.2f} GB/s)", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    write_json(os.path.join(out, "model.safetensors.index.json"), index)
    return total


def tokenizer_json():
    """A byte-level BPE spanning ids 0..VOCAB-1 (see the module doc)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    # Fillers up to the first special id: valid entries that no merge ever produces.
    used = set(vocab.values())
    for i in range(FIRST_SPECIAL):
        if i not in used:
            vocab[f"<filler_{i}>"] = i
    specials = llama3_special_tokens()
    data["added_tokens"] = [
        {
            "id": FIRST_SPECIAL + i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, s in enumerate(specials)
    ]
    bos = specials[0]
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [BOS_ID], "tokens": [bos]}},
    }
    raw = json.dumps(data, ensure_ascii=False)
    check_tokenizer(Tokenizer.from_str(raw))
    return raw


def check_tokenizer(tok):
    """The ids the config names must be the tokens the tokenizer_config names."""
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB, tok.get_vocab_size()
    assert tok.token_to_id("<|begin_of_text|>") == BOS_ID
    assert [tok.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")] == EOS_IDS
    text = "What is the capital of France? naïve café 🙂"
    enc = tok.encode(text)
    assert enc.ids[0] == BOS_ID and all(i < FIRST_SPECIAL for i in enc.ids[1:]), enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=True) == text


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=int(os.environ.get("FALLOW_RANDOM_LAYERS", "32")))
    ap.add_argument("--seed", type=int, default=0)
    # Test-only shape overrides (the defaults are Llama 3.1 8B's).
    ap.add_argument("--hidden-size", type=int, default=4096)
    ap.add_argument("--intermediate-size", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--max-shard-bytes", type=int, default=SHARD_MAX_BYTES)
    ap.add_argument("--qwen3-moe", action="store_true", help="Qwen3-30B-A3B's shape instead")
    ap.add_argument("--force", action="store_true", help="rewrite a complete directory")
    args = ap.parse_args()

    if args.qwen3_moe:
        dims = (args.layers, *QWEN3_MOE)
        make_config, make_plan = qwen3_moe_config, qwen3_moe_plan
    else:
        dims = (args.layers, args.hidden_size, args.intermediate_size, args.heads, args.kv_heads)
        make_config, make_plan = config_json, tensor_plan
    out = args.outdir
    done_path = os.path.join(out, "done.json")
    stamp = {"dims": list(dims), "seed": args.seed, "max_shard_bytes": args.max_shard_bytes}
    if not args.force and os.path.isfile(done_path):
        with open(done_path) as f:
            if json.load(f) == stamp:
                print(f"{out}: already complete ({stamp}), nothing to do")
                return 0
    os.makedirs(out, exist_ok=True)
    if os.path.exists(done_path):
        os.remove(done_path)
    # A previous run with other dims may have left more shards than this one writes.
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            os.remove(os.path.join(out, name))

    t_start = time.time()
    config = make_config(*dims)
    write_json(os.path.join(out, "config.json"), config)
    write_json(
        os.path.join(out, "generation_config.json"),
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_IDS, "transformers_version": "4.43.0.dev0"},
    )
    t0 = time.time()
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write(tokenizer_json())
    write_json(
        os.path.join(out, "tokenizer_config.json"),
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": True,
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    print(f"tokenizer: {time.time() - t0:.1f} s", flush=True)

    plan = make_plan(*dims)
    max_bytes = max(nbytes(s) for _, s, _ in plan)
    try:
        import torch
    except ImportError:
        torch = None
    source = TorchSource(torch, args.seed, max_bytes) if torch else PythonSource(args.seed)
    t0 = time.time()
    total = write_weights(out, plan, source, args.max_shard_bytes)
    dt = time.time() - t0
    print(f"weights: {total / 1e9:.2f} GB in {dt:.1f} s", flush=True)

    # One decode step reads every matrix and norm but only one embedding row (untied head),
    # and of a mixture of experts only the chosen experts (top_k of them per layer).
    per_step = total - nbytes(plan[0][1])
    if args.qwen3_moe:
        experts, top_k = QWEN3_MOE[4], QWEN3_MOE[5]
        expert_bytes = sum(nbytes(s) for n, s, _ in plan if ".mlp.experts." in n)
        per_step -= expert_bytes * (experts - top_k) // experts
    with open(os.path.join(out, "bytes_per_step.txt"), "w") as f:
        f.write(f"{per_step}\n")
    write_json(done_path, stamp)
    params = total // BF16_BYTES
    print(
        f"wrote {out}: {params / 1e9:.3f} B parameters, {total / 1e9:.2f} GB, "
        f"bytes_per_step={per_step} ({per_step / 1e9:.3f} GB), total {time.time() - t_start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
