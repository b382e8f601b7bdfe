#!/usr/bin/env python3
"""Builds the PEFT LoRA adapter fixtures under gpu-runner/engine/tests/fixtures/tiny/lora/.

Each adapter is a standard PEFT directory, exactly what `PeftModel.save_pretrained(dir)`
writes (adapter_config.json + adapter_model.safetensors; PEFT's generated README.md model
card is removed), trained on nothing: its lora_A / lora_B weights are seeded random values,
large enough that the adapter clearly moves the logits. Next to them, reference.json holds
what transformers + peft compute with the adapter applied to its tiny base model
(gpu-runner/engine/tests/fixtures/tiny/{llama,qwen3,gemma3}/, written by
scripts/make_tiny_models.py). Fallow's LoRA tests check the engine against those numbers.

Adapters (all: lora_dropout 0, bias "none", task_type CAUSAL_LM, no modules_to_save):

| name                 | base   | target_modules                 | r | alpha | rslora | scaling        |
|----------------------|--------|--------------------------------|---|-------|--------|----------------|
| llama_qv_r4          | llama  | q_proj, v_proj                 | 4 | 8     | no     | 8/4 = 2        |
| llama_all_r8         | llama  | q, k, v, o, gate, up, down     | 8 | 16    | no     | 16/8 = 2       |
| llama_mlp_r8_rslora  | llama  | gate_proj, up_proj, down_proj  | 8 | 16    | yes    | 16/sqrt(8)     |
| qwen3_attn_r8_rslora | qwen3  | q_proj, k_proj, v_proj, o_proj | 8 | 16    | yes    | 16/sqrt(8)     |
| qwen3_mlp_r4         | qwen3  | gate_proj, up_proj, down_proj  | 4 | 4     | no     | 4/4 = 1        |
| gemma3_qo_r4         | gemma3 | q_proj, o_proj                 | 4 | 8     | no     | 8/4 = 2        |

For a targeted linear y = W x, PEFT computes y = W x + scaling * B (A x), with A of shape
[r, in_features] and B of shape [out_features, r]; the script checks its logits against that
formula merged into a plain copy of the base model. A is drawn N(0, 1) / sqrt(in_features)
and B N(0, 1) * s / sqrt(r), with s per adapter (chosen so the adapted logits differ from
the base's by at least 0.5 somewhere, and switching off any one target module's LoRA moves
them by at least 0.05 — both asserted — while staying finite and no larger than
max(20, 1.25 x the base's own largest logit): the llama base's logits are O(5), the tied
qwen3 base's reach ~57, gemma3's are soft-capped at 30).

reference.json (per adapter, compact JSON, logits rounded to 4 decimals):
- "generator": versions, dtype (float32 compute, 16-bit bases upcast), eager attention.
- "base", "r", "lora_alpha", "use_rslora", "target_modules", "scaling".
- "sequences": the base model's 3 reference sequences (from its reference.json).
- "logits": per sequence {"positions": [...], "rows": [[vocab floats], ...]}: every
  position of the shortest sequence, the last 4 positions of the others (each sequence run
  alone, full forward, no cache).
- "max_abs_diff_from_base": the largest |adapted - base| logit over all positions of all
  three sequences.

Setup (only PyPI needed; the PyPI torch wheel is large but works on CPU):

    python3 -m venv /work/tinyvenv
    /work/tinyvenv/bin/pip install torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 \
        peft==0.21.2 safetensors numpy
    /work/tinyvenv/bin/python scripts/make_lora_fixtures.py

Generated with torch 2.15.0, transformers 5.24.0, peft 0.21.2, safetensors 0.8.0 (recorded in
each reference.json under "generator"). Rerunning with the same versions rewrites the same
files (PEFT keeps target_modules as a set, so the script rewrites adapter_config.json with
them in the table's order; otherwise that file is as PEFT writes it). The script first checks
that each base still reproduces its own reference.json within 1e-3.
"""

import copy
import json
import os
import shutil
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors import safe_open
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_REL = os.path.join("gpu-runner", "engine", "tests", "fixtures", "tiny")
TINY = os.path.join(ROOT, TINY_REL)
OUT = os.path.join(TINY, "lora")
SEED = 20261207
TAIL = 4  # positions kept for all but the shortest sequence
MIN_DIFF = 0.5
MIN_PER_TARGET = 0.05  # each target module's LoRA alone must move the logits this much
MAX_LOGIT = 20.0

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]

# name, base, target_modules, r, lora_alpha, use_rslora, s (B's std * sqrt(r))
ADAPTERS = [
    ("llama_qv_r4", "llama", ["q_proj", "v_proj"], 4, 8, False, 1.0),
    ("llama_all_r8", "llama", ATTN + MLP, 8, 16, False, 0.25),
    ("llama_mlp_r8_rslora", "llama", MLP, 8, 16, True, 0.25),
    ("qwen3_attn_r8_rslora", "qwen3", ATTN, 8, 16, True, 0.025),
    ("qwen3_mlp_r4", "qwen3", MLP, 4, 4, False, 0.1),
    ("gemma3_qo_r4", "gemma3", ["q_proj", "o_proj"], 4, 8, False, 0.1),
]


def load_base(base: str):
    """The base as transformers loads it, widened to float32 (as make_tiny_models.py does).
    Loaded by its repo-relative path so adapter_config.json's base_model_name_or_path is
    that path, not one that depends on where the checkout lives."""
    model = AutoModelForCausalLM.from_pretrained(
        os.path.join(TINY_REL, base), attn_implementation="eager"
    )
    return model.float().eval()


def full_logits(model, sequences: list) -> list:
    out = []
    for ids in sequences:
        with torch.no_grad():
            out.append(model(torch.tensor([ids])).logits[0].float())
    return out


def randomize_lora(model, seed: int, s: float, r: int) -> int:
    """Overwrites every lora_A / lora_B weight (PEFT starts B at zero) in parameter order."""
    torch.manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape) * (s / r ** 0.5))
            else:
                continue
            n += 1
    return n


def per_target_effect(model, targets: list, sequences: list, adapted: list) -> dict:
    """For each target module name, how far the logits move when only that module's LoRA
    is switched off (its B zeroed, then restored), so an engine that skips one fails."""
    effect = {}
    for t in targets:
        saved = {n: p.detach().clone() for n, p in model.named_parameters()
                 if f".{t}.lora_B." in n}
        assert saved, t
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n in saved:
                params[n].zero_()
            without = full_logits(model, sequences)
            for n, v in saved.items():
                params[n].copy_(v)
        effect[t] = max(float((a - w).abs().max()) for a, w in zip(adapted, without))
    return effect


def manual_merge_logits(base_model, adapter_dir: str, scaling: float, sequences: list) -> list:
    """Logits of a plain copy of the base with W += scaling * B @ A for each saved pair,
    read back from adapter_model.safetensors (checks names, shapes and the scaling)."""
    merged = copy.deepcopy(base_model)
    params = dict(merged.named_parameters())
    with safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        assert all(k.startswith("base_model.model.") for k in keys), keys
        a_keys = [k for k in keys if k.endswith(".lora_A.weight")]
        assert len(a_keys) * 2 == len(keys), keys
        with torch.no_grad():
            for ka in a_keys:
                module = ka[len("base_model.model."):-len(".lora_A.weight")]
                a = f.get_tensor(ka)
                b = f.get_tensor(module.join(["base_model.model.", ".lora_B.weight"]))
                w = params[module + ".weight"]
                assert a.shape == (a.shape[0], w.shape[1]) and b.shape == (w.shape[0], a.shape[0])
                w.add_(scaling * (b @ a))
    return full_logits(merged, sequences)


def rows(t: torch.Tensor) -> list:
    return [[round(float(x), 4) for x in row] for row in t]


def make(name, base, targets, r, alpha, rslora, s, seed) -> dict:
    out_dir = os.path.join(OUT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    with open(os.path.join(TINY, base, "reference.json")) as f:
        base_ref = json.load(f)
    sequences = base_ref["sequences"]

    base_model = load_base(base)
    base_logits = full_logits(base_model, sequences)
    # The environment reproduces the base's own reference (same bound as its Rust test).
    base_err = max(float((t - torch.tensor(ref)).abs().max())
                   for t, ref in zip(base_logits, base_ref["logits"]))
    assert base_err < 1e-3, f"{name}: base {base} differs from its reference.json by {base_err}"

    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        use_rslora=rslora,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(load_base(base), config).eval()
    n = randomize_lora(model, seed, s, r)
    n_layers = base_model.config.num_hidden_layers
    assert n == 2 * len(targets) * n_layers, (name, n)
    scaling = alpha / r ** 0.5 if rslora else alpha / r
    for module in model.modules():
        if hasattr(module, "scaling") and isinstance(module.scaling, dict):
            assert abs(module.scaling["default"] - scaling) < 1e-12, module.scaling

    adapted = full_logits(model, sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(adapted, base_logits))
    peak = max(float(a.abs().max()) for a in adapted)
    base_peak = max(float(b.abs().max()) for b in base_logits)
    assert all(torch.isfinite(a).all() for a in adapted), name
    assert diff >= MIN_DIFF, f"{name}: adapter moves logits by only {diff}"
    # The tied-embedding qwen3 base already reaches |logit| ~57 (gemma3 is soft-capped at 30):
    # the adapter may not push logits past MAX_LOGIT or 1.25x the base's own peak.
    assert peak <= max(MAX_LOGIT, 1.25 * base_peak), f"{name}: logits reach {peak} (base {base_peak})"

    effect = per_target_effect(model, targets, sequences, adapted)
    weakest = min(effect, key=effect.get)
    assert effect[weakest] >= MIN_PER_TARGET, f"{name}: {weakest} alone moves logits by {effect}"
    assert max(float((a - b).abs().max()) for a, b in zip(full_logits(model, sequences), adapted)) == 0

    model.save_pretrained(out_dir, safe_serialization=True)
    card = os.path.join(out_dir, "README.md")
    if os.path.exists(card):
        os.remove(card)
    files = sorted(os.listdir(out_dir))
    assert files == ["adapter_config.json", "adapter_model.safetensors"], files
    # PEFT keeps target_modules as a set, so its JSON order follows string hashing and
    # changes from run to run: rewrite it in the table's order, otherwise as PEFT writes it.
    cfg_path = os.path.join(out_dir, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    assert sorted(cfg["target_modules"]) == sorted(targets), cfg["target_modules"]
    cfg["target_modules"] = targets
    with open(cfg_path, "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True))
    os.chmod(os.path.join(out_dir, "adapter_model.safetensors"), 0o644)

    merged = manual_merge_logits(base_model, out_dir, scaling, sequences)
    merge_err = max(float((a - m).abs().max()) for a, m in zip(adapted, merged))
    assert merge_err < 1e-4, f"{name}: PEFT vs W + scaling*B@A differ by {merge_err}"

    shortest = min(range(len(sequences)), key=lambda i: len(sequences[i]))
    logits = []
    for i, (ids, t) in enumerate(zip(sequences, adapted)):
        positions = list(range(len(ids))) if i == shortest else list(range(len(ids) - TAIL, len(ids)))
        logits.append({"positions": positions, "rows": rows(t[positions])})

    ref = {
        "generator": {
            "script": "scripts/make_lora_fixtures.py",
            "seed": seed,
            "init_scale": s,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "compute_dtype": "float32",
            "attn_implementation": "eager",
            "logit_rounding": 4,
        },
        "base": base,
        "r": r,
        "lora_alpha": alpha,
        "use_rslora": rslora,
        "target_modules": targets,
        "scaling": scaling,
        "sequences": sequences,
        "logits": logits,
        "max_abs_diff_from_base": round(diff, 4),
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: base {base}, scaling {scaling:.4f}, s {s}, max |adapted - base| {diff:.4f}, "
          f"max |logit| {peak:.2f} (base {base_peak:.2f}), weakest target {weakest} "
          f"{effect[weakest]:.4f}, PEFT vs manual merge {merge_err:.1e}, {size // 1024} KiB")
    return ref


def main() -> int:
    os.chdir(ROOT)
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT, exist_ok=True)
    for i, (name, base, targets, r, alpha, rslora, s) in enumerate(ADAPTERS):
        make(name, base, targets, r, alpha, rslora, s, SEED + i)
    return 0


if __name__ == "__main__":
    sys.exit(main())
