#!/usr/bin/env python3
"""Builds the tiny Hugging Face model directories under gpu-runner/engine/tests/fixtures/tiny/.

Each directory is a complete HF checkpoint with random weights: config.json, safetensors
weights (single file or two shards + model.safetensors.index.json), tokenizer.json,
tokenizer_config.json (with a ChatML chat template) and generation_config.json, plus a
reference.json of what Hugging Face transformers computes on it. The Rust test
gpu-runner/engine/tests/safetensors_vs_transformers.rs checks Fallow's engine against those numbers.

Models (all: hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16, FFN 128):

| dir     | class            | weights                    | what it exercises                        |
|---------|------------------|----------------------------|------------------------------------------|
| llama   | LlamaForCausalLM | F32, one file, untied head | llama3 RoPE scaling, BOS via post-processor |
| qwen2   | Qwen2ForCausalLM | BF16, one file, tied head  | Q/K/V biases, legacy v4-style config.json |
| qwen3   | Qwen3ForCausalLM | F32, 2 shards, tied head   | per-head Q/K RMSNorm, sharded checkpoint  |
| gemma3  | Gemma3ForCausalLM| F16, one file, tied head   | sliding window 5 + global layer, linear RoPE scaling on the global layer only, two RoPE bases, (1 + w) norms, sandwich norms, GELU, embedding scale, query_pre_attn_scalar, final logit softcap (no attention softcap: real Gemma 3 has none, and transformers 5 ignores it for Gemma 3) |
| qwen3_moe | Qwen3MoeForCausalLM | F32, one file, untied | 8 experts of width 32, top-2, `norm_topk_prob` |
| qwen2_moe | Qwen2MoeForCausalLM | F32, one file, untied | 4 experts of width 32, top-2, not renormalised, a shared expert of width 64 with its sigmoid gate, Q/K/V biases |
| gpt_oss_mxfp4 | GptOssForCausalLM | BF16 + MXFP4 experts | gpt_oss with experts of width 64 as MXFP4 blocks/scales (quantization_config mxfp4), reference on transformers' dequantisation |
| gpt_oss | GptOssForCausalLM | BF16, one file, untied | 8 biased experts of width 32 (transposed, gate/up interleaved), top-2 of a biased router, clamped SwiGLU (limit 1.5, so it bites), Q/K/V/O biases, attention sinks, sliding window 5 then a full layer, YaRN (x32 over 4096, truncate false) |
| mixtral | MixtralForCausalLM | BF16, one file, untied     | 4 experts of width 128, top-2, `block_sparse_moe.experts.E.w1/w2/w3` names |

Weights are drawn with fan-in scaling (not transformers' std 0.02 init) so logits are O(1..10)
and a wrong RoPE, bias or norm moves them well beyond the test tolerance.

reference.json (per model):
- "sequences": 3 fixed token-id lists, "logits": for each, the logits at every position
  (float32 transformers, eager attention, rounded to 4 decimals), "greedy": the 8 greedy
  next tokens after each sequence, "greedy_min_margin": the smallest top-1/top-2 logit gap
  seen while choosing them (so a tolerance can be judged against it).
- "encode": texts and the ids transformers' tokenizer gives (`tokenizer(text).input_ids`).
- "chat": a conversation and transformers' `apply_chat_template(..., tokenize=False,
  add_generation_prompt=True)` rendering of it.
For the BF16 and F16 models the reference is float32 transformers run on those weights upcast
to float32 — exactly what a backend that widens 16-bit weights and computes in f32 does.

Setup (only PyPI needed; the PyPI torch wheel is large but works on CPU):

    python3 -m venv /work/tinyvenv
    /work/tinyvenv/bin/pip install torch transformers safetensors numpy tokenizers
    /work/tinyvenv/bin/python scripts/make_tiny_models.py [model ...]   # all, or only those named

Generated with torch 2.15.0, transformers 5.24.0, tokenizers 0.23.3 (recorded in each
reference.json under "generator"). Rerunning with the same versions rewrites the same files.
"""

import json
import os
import shutil
import sys

import torch
import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "gpu-runner", "engine", "tests", "fixtures", "tiny")
SEED = 20261129
VOCAB_TARGET = 320
N_GREEDY = 8

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]

CHATML = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "Water boils at one hundred degrees at sea level, and freezes at zero.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "In 1969, the first humans walked on the Moon; the world watched on television.",
    "Photosynthesis is the process by which plants turn light into sugar.",
    "List three colours: red, green and blue. Then list three more: cyan, magenta, yellow.",
    "Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.",
    "A tokenizer splits text into pieces; a model predicts the next piece from the ones before.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14159 2.71828",
] * 4

ENCODE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello! What is the capital of France?",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "naïve café — 東京 🙂",
]

CHAT = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def build_tokenizer(with_bos: bool) -> Tokenizer:
    """A byte-level BPE trained on CORPUS; `with_bos` adds Llama 3's BOS post-processor."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if with_bos:
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str, with_bos: bool) -> None:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>" if with_bos else None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out_dir)
    # transformers 5 may write the template to chat_template.jinja; keep it (also) in
    # tokenizer_config.json, where most published checkpoints carry it.
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHATML
    cfg["add_bos_token"] = with_bos
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    jinja = os.path.join(out_dir, "chat_template.jinja")
    if os.path.exists(jinja):
        os.remove(jinja)


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Fan-in-scaled weights, norms around 1, visible biases."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith((".bias", "_proj_bias")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".sinks"):
                # Sink logits of the size of attention scores: a head's sink takes a real
                # share of its softmax, so leaving it out moves the logits.
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")) and \
                    isinstance(model, GptOssForCausalLM):
                # gpt-oss stores experts for x @ W: fan-in is the middle dimension.
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif name.endswith((".mlp.gate.weight", "block_sparse_moe.gate.weight",
                               ".mlp.router.weight")):
                # Router logits of a few units: top-2 choices stay well apart, and a
                # wrong route changes the output far beyond the tolerance.
                p.copy_(3.0 * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif p.dim() in (2, 3):
                # Fan-in is the last dimension (3-D: transformers 5's stacked experts).
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            else:
                raise ValueError(f"unexpected parameter {name}")


def common_config(vocab: int) -> dict:
    return dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=vocab,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        pad_token_id=0,
        eos_token_id=2,
    )


def greedy(model, ids: list) -> tuple:
    """N_GREEDY greedy tokens by full recomputation, and the smallest top-2 gap."""
    seq = list(ids)
    margin = float("inf")
    for _ in range(N_GREEDY):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, -1]
        top = torch.topk(logits, 2).values
        margin = min(margin, float(top[0] - top[1]))
        seq.append(int(torch.argmax(logits)))
    return seq[len(ids):], margin


def reference(model_dir: str, sequences: list, tok_ids: list) -> dict:
    """Reloads the saved directory with transformers (as a user would) and records outputs."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    model = model.float().eval()
    logits, greedies, margins = [], [], []
    for ids in sequences:
        with torch.no_grad():
            out = model(torch.tensor([ids])).logits[0]
        logits.append([[round(float(x), 4) for x in row] for row in out])
        g, m = greedy(model, ids)
        greedies.append(g)
        margins.append(m)
    routed = routed_experts(model, sequences)
    tok = AutoTokenizer.from_pretrained(model_dir)
    encode = [{"text": t, "ids": tok(t)["input_ids"]} for t in ENCODE_TEXTS]
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return {
        "generator": {
            "script": "scripts/make_tiny_models.py",
            "seed": SEED,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "attn_implementation": "eager",
            "compute_dtype": "float32",
            "logit_rounding": 4,
        },
        "vocab_size": model.config.vocab_size,
        "sequences": sequences,
        "logits": logits,
        "greedy": greedies,
        "greedy_min_margin": min(margins),
        "encode": encode,
        "chat": {"messages": CHAT, "add_generation_prompt": True, "rendered": rendered},
        "tokenizer_ids": tok_ids,
        **routed,
    }


def routed_experts(model, sequences: list) -> dict:
    """For MoE models, the experts transformers' router picks: per sequence, per position,
    per routed layer, the top-k expert ids best first (ties never occur with these weights).
    Empty for dense models."""
    top_k = getattr(model.config, "num_experts_per_tok", None)
    if not top_k:
        return {}
    per_seq = []
    for ids in sequences:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_router_logits=True)
        layers = [torch.topk(torch.softmax(l.float(), dim=-1), top_k, dim=-1).indices
                  for l in out.router_logits]
        per_seq.append([[[int(e) for e in layer[pos]] for layer in layers]
                        for pos in range(len(ids))])
    return {"routed_experts": per_seq}


def to_legacy_config(model_dir: str) -> None:
    """Rewrites config.json the way transformers 4.x wrote it (top-level `rope_theta`,
    `rope_scaling`, `torch_dtype`), which is how most published checkpoints look."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = rope.pop("rope_theta", 10000.0)
    kind = rope.pop("rope_type", "default")
    cfg["rope_scaling"] = None if kind == "default" else {"rope_type": kind, **rope}
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def make(name, cls, cfg_cls, extra_cfg, dtype, shards, with_bos, legacy, tok, gen):
    if WANTED and name not in WANTED:
        return
    out_dir = os.path.join(OUT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    vocab = tok.get_vocab_size()
    config = cfg_cls(**{**common_config(vocab), **extra_cfg})
    if with_bos:
        config.bos_token_id = tok.token_to_id("<|begin_of_text|>")
    model = cls(config).eval()
    randomize(model, gen)
    model = model.to(dtype)
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    shard_size = total // 2 + 4096 if shards == 2 else "50GB"
    model.save_pretrained(out_dir, max_shard_size=shard_size)
    model.generation_config.eos_token_id = [2, 0]
    model.generation_config.save_pretrained(out_dir)
    save_tokenizer(tok, out_dir, with_bos)
    if legacy:
        to_legacy_config(out_dir)

    st = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
    assert len(st) == shards, f"{name}: wanted {shards} safetensors files, got {st}"
    rng = torch.Generator().manual_seed(SEED + 1)
    encoded = tok.encode(ENCODE_TEXTS[0]).ids
    sequences = [
        encoded,
        [5, 77, 200],
        [int(x) for x in torch.randint(0, vocab, (24,), generator=rng)],
    ]
    ref = reference(out_dir, sequences, encoded)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: vocab {vocab}, {size // 1024} KiB, files {sorted(os.listdir(out_dir))}, "
          f"greedy margin {ref['greedy_min_margin']:.4f}")


def make_gpt_oss_mxfp4(extra_cfg: dict, tok, gen) -> None:
    """gpt_oss_mxfp4: gpt-oss with its experts in MXFP4 as the published checkpoints store
    them (`*_blocks` [E, rows, cols/32, 16] u8, two E2M1 codes a byte, low nibble first;
    `*_scales` [E, rows, cols/32] u8, E8M0 with bias 127; rows are outputs, gate and up
    alternating), random codes and scales. The reference is transformers run on its own
    dequantisation of them (`convert_moe_packed_tensors`), the rest of the model as gpt_oss.
    `make_moe_gguf_fixtures.py gpt_oss_mxfp4` then converts it to `model.mxfp4.gguf`, its
    experts repacked by llama.cpp's converter as GGUF MXFP4 (ggml type 39)."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    name = "gpt_oss_mxfp4"
    if WANTED and name not in WANTED:
        return
    out_dir = os.path.join(OUT, name)
    plain_dir = out_dir + ".plain"
    for d in (out_dir, plain_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    vocab = tok.get_vocab_size()
    config = GptOssConfig(**{**common_config(vocab), **extra_cfg})
    model = GptOssForCausalLM(config).eval()
    randomize(model, gen)
    packed = {}
    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            experts = block.mlp.experts
            for proj in ("gate_up_proj", "down_proj"):
                param = getattr(experts, proj)  # [E, in, out]
                e, cols, rows = param.shape
                blocks = torch.randint(0, 256, (e, rows, cols // 32, 16), generator=gen,
                                       dtype=torch.uint8)
                # Scales around 2^-4: values of about the fan-in-scaled weights' size.
                scales = torch.randint(121, 125, (e, rows, cols // 32), generator=gen,
                                       dtype=torch.uint8)
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                prefix = f"model.layers.{layer}.mlp.experts.{proj}"
                packed[f"{prefix}_blocks"] = blocks
                packed[f"{prefix}_scales"] = scales
    model = model.to(torch.bfloat16)
    model.save_pretrained(plain_dir)
    model.generation_config.eos_token_id = [2, 0]
    model.generation_config.save_pretrained(plain_dir)
    save_tokenizer(tok, plain_dir, False)
    to_legacy_config(plain_dir)
    rng = torch.Generator().manual_seed(SEED + 1)
    sequences = [
        tok.encode(ENCODE_TEXTS[0]).ids,
        [5, 77, 200],
        [int(x) for x in torch.randint(0, vocab, (24,), generator=rng)],
    ]
    ref = reference(plain_dir, sequences, sequences[0])
    # The same directory with the experts' matrices replaced by their MXFP4 blocks.
    for f in os.listdir(plain_dir):
        if f != "model.safetensors":
            shutil.copy(os.path.join(plain_dir, f), out_dir)
    tensors = load_file(os.path.join(plain_dir, "model.safetensors"))
    for key in list(tensors):
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            del tensors[key]
    tensors.update(packed)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(plain_dir)
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: {size // 1024} KiB, greedy margin {ref['greedy_min_margin']:.4f}")


WANTED = set(sys.argv[1:])


def main() -> int:
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    # Later models draw from their own generators, so each can be remade alone
    # (`make_tiny_models.py qwen3_moe mixtral`) with the same weights.
    moe_gen = torch.Generator().manual_seed(SEED + 41)
    plain = build_tokenizer(with_bos=False)
    with_bos = build_tokenizer(with_bos=True)
    assert plain.get_vocab_size() == VOCAB_TARGET, plain.get_vocab_size()
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        # Small so that, with head_dim 16, one frequency is kept, one is blended and the
        # rest are divided by `factor` (at 128K-context values all 8 would be kept).
        "original_max_position_embeddings": 32,
    }
    make("llama", LlamaForCausalLM, LlamaConfig,
         {"rope_theta": 500000.0, "rope_scaling": llama3, "tie_word_embeddings": False},
         torch.float32, 1, True, False, with_bos, gen)
    make("qwen2", Qwen2ForCausalLM, Qwen2Config,
         {"rope_theta": 1000000.0, "tie_word_embeddings": True},
         torch.bfloat16, 1, False, True, plain, gen)
    make("qwen3", Qwen3ForCausalLM, Qwen3Config,
         {"rope_theta": 1000000.0, "tie_word_embeddings": True},
         torch.float32, 2, False, False, plain, gen)
    make("gemma3", Gemma3ForCausalLM, Gemma3TextConfig,
         {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0},
          "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5,
          "query_pre_attn_scalar": 32, "attn_logit_softcapping": None,
          "final_logit_softcapping": 30.0, "tie_word_embeddings": True},
         torch.float16, 1, True, False, with_bos, gen)
    make("qwen3_moe", Qwen3MoeForCausalLM, Qwen3MoeConfig,
         {"num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "norm_topk_prob": True, "rope_theta": 1000000.0, "tie_word_embeddings": False},
         torch.float32, 1, False, False, plain, moe_gen)
    make("mixtral", MixtralForCausalLM, MixtralConfig,
         {"num_local_experts": 4, "num_experts_per_tok": 2, "rope_theta": 1000000.0,
          "tie_word_embeddings": False, "sliding_window": None},
         torch.bfloat16, 1, True, False, with_bos, moe_gen)
    make("qwen2_moe", Qwen2MoeForCausalLM, Qwen2MoeConfig,
         {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "shared_expert_intermediate_size": 64, "norm_topk_prob": False,
          "rope_theta": 1000000.0, "tie_word_embeddings": False},
         torch.float32, 1, False, False, plain, torch.Generator().manual_seed(SEED + 42))
    gpt_oss = {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
          # Small, so the clamp bites on these activations (gpt-oss ships 7.0).
          "swiglu_limit": 1.5,
          "attention_bias": True,
          "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5,
          # gpt-oss's YaRN: with head_dim 16 two pairs are kept, three blended, three
          # divided by 32, and cos/sin scaled by 1 + 0.1 ln 32.
          "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                              "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                              "original_max_position_embeddings": 4096},
          "max_position_embeddings": 131072, "tie_word_embeddings": False}
    make("gpt_oss", GptOssForCausalLM, GptOssConfig, gpt_oss,
         torch.bfloat16, 1, False, True, plain, torch.Generator().manual_seed(SEED + 43))
    # Experts of width 64, so every MXFP4 row holds two blocks.
    make_gpt_oss_mxfp4({**gpt_oss, "intermediate_size": 64}, plain,
                       torch.Generator().manual_seed(SEED + 44))
    return 0


if __name__ == "__main__":
    sys.exit(main())
