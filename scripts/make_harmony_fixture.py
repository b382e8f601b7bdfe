#!/usr/bin/env python3
"""Builds gpu-runner/engine/tests/fixtures/tiny/gpt_oss_harmony/ from tiny/gpt_oss/: the same
random gpt-oss layers behind a vocabulary laid out like o200k_harmony, so a real stack can
serve a gpt-oss model end to end (tests/e2e/test_gpt_oss.py).

No transformers reference is made: the layers are gpt_oss's, already checked against
transformers; only the vocabulary and its two matrices change.

- tokenizer.json: gpt_oss's byte-level BPE without its ChatML specials (ids shift down by 4,
  0..315), then harmony's special tokens in o200k_harmony's order, as added tokens only (as in
  the published tokenizer): 316 + (real id − 199998), `<|startoftext|>` 316 … `<|call|>` 330,
  the gaps and the tail `<|reserved_NNNNNN|>` named by their real ids; vocabulary 336.
- tokenizer_config.json: gpt-oss's real chat template (the copy committed as engine test data)
  and its special tokens.
- config.json, generation_config.json: gpt_oss's, with the vocabulary and ids moved
  (`eos_token_id` [`<|return|>`, `<|endoftext|>`, `<|call|>`] as gpt-oss publishes).
- model.safetensors: gpt_oss's tensors, with `embed_tokens` and `lm_head` drawn anew
  ([336, 64] BF16, normal with their std, numpy seed 41).

Needs only numpy (`/work/tinyvenv/bin/python scripts/make_harmony_fixture.py`); rerunning it
rewrites identical files.
"""

import json
import shutil
import struct
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "gpu-runner" / "engine" / "tests" / "fixtures" / "tiny"
SOURCE = TINY / "gpt_oss"
OUT = TINY / "gpt_oss_harmony"
TEMPLATE = ROOT / "gpu-runner" / "engine" / "src" / "tokenizer" / "testdata" / "gpt_oss_chat_template.jinja"

CHATML_SPECIALS = 4  # gpt_oss's <|endoftext|>, <|im_start|>, <|im_end|>, <|begin_of_text|>
FIRST_SPECIAL = 199998  # o200k_harmony's <|startoftext|>
NAMED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}
SPECIALS = 20  # 199998 ..= 200017
SEED = 41


def special_id(real: int, base: int) -> int:
    return base + real - FIRST_SPECIAL


def tokenizer(base_json: dict) -> tuple[dict, int]:
    tok = json.loads(json.dumps(base_json))
    vocab = {t: i - CHATML_SPECIALS for t, i in tok["model"]["vocab"].items()
             if i >= CHATML_SPECIALS}
    tok["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    base = len(vocab)
    tok["added_tokens"] = [
        {"id": special_id(real, base),
         "content": NAMED.get(real, f"<|reserved_{real}|>"),
         "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for real in range(FIRST_SPECIAL, FIRST_SPECIAL + SPECIALS)
    ]
    return tok, base


def read_safetensors(path: Path) -> tuple[dict, dict]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        assert t["dtype"] == "BF16", name
        start, end = t["data_offsets"]
        data = np.frombuffer(raw[8 + n + start:8 + n + end], dtype="<u2")
        tensors[name] = data.reshape(t["shape"])
    return tensors, meta


def write_safetensors(path: Path, tensors: dict, meta: dict) -> None:
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        blob = np.ascontiguousarray(tensors[name], dtype="<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << 16).view("<f4")


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = x.astype("<f4").view("<u4")
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    tok, base = tokenizer(json.loads((SOURCE / "tokenizer.json").read_text()))
    vocab = base + SPECIALS
    ids = {name: special_id(real, base) for real, name in NAMED.items()}
    (OUT / "tokenizer.json").write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n")

    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": TEMPLATE.read_text(),
    }, indent=2) + "\n")

    config = json.loads((SOURCE / "config.json").read_text())
    config.update(vocab_size=vocab, bos_token_id=ids["<|startoftext|>"],
                  eos_token_id=ids["<|return|>"], pad_token_id=ids["<|endoftext|>"])
    (OUT / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (OUT / "generation_config.json").write_text(json.dumps({
        "bos_token_id": ids["<|startoftext|>"],
        "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }, indent=2) + "\n")

    tensors, meta = read_safetensors(SOURCE / "model.safetensors")
    rng = np.random.default_rng(SEED)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        std = float(bf16_to_f32(tensors[name]).std())
        hidden = tensors[name].shape[1]
        tensors[name] = f32_to_bf16(rng.normal(0.0, std, (vocab, hidden)).astype("<f4"))
    write_safetensors(OUT / "model.safetensors", tensors, meta)
    shutil.copymode(SOURCE / "model.safetensors", OUT / "model.safetensors")


if __name__ == "__main__":
    main()
