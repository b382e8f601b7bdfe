#!/usr/bin/env python3
"""Generate llama.cpp reference fixtures for Fallow's engine correctness tests.

This is a developer tool, NOT part of the test run: the JSON it writes under
`gpu-runner/engine/tests/fixtures/` is committed, and the Rust tests only read it.
Rerun it when a fixture needs to change (new corpus string, new model).

How to run (from any cwd):

    # 1. the models (git-ignored, cached under <repo>/models/)
    scripts/fetch-models.sh --gemma

    # 2. a reference venv with llama-cpp-python built from source (CPU only;
    #    ~6 min on 2 busy cores; needs a C/C++ compiler, pip fetches cmake).
    #    jinja2 and numpy come with it.
    python3 -m venv /work/refvenv
    CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=ON" \
        /work/refvenv/bin/pip install llama-cpp-python==0.3.36

    # 3. the fixtures (minutes per model on 2 cores; --only quantized|f32
    #    regenerates just one variant)
    /work/refvenv/bin/python scripts/make_fixtures.py --model smollm2
    /work/refvenv/bin/python scripts/make_fixtures.py --model gemma3

Output per model `<m>` (schema documented in gpu-runner/engine/tests/fixtures/README.md):
    <m>_tokenize.json  -- tokenizer ids for a corpus, plus per-id byte pieces
    <m>_logits.json    -- chat prompts: top-20 logits at the first generated
                          position and a 32-token greedy path with per-step
                          top-5 logprobs (teacher forced), llama.cpp as-is
    <m>_logits_f32.json -- the same for the GGUF dequantized to F32 with an
                          f32 KV cache: exact math on the quantized weights
                          (see VARIANTS below for why both exist)

Reference settings: n_ctx=2048, n_threads=2, f16 KV cache (f32 for the _f32
variant), flash attention off, CPU backend, logits_all=True. Everything that
could influence the numbers is written into each file's "generator" object.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path

try:
    import llama_cpp
    import numpy as np
    from llama_cpp._utils import suppress_stdout_stderr
except ImportError as err:  # pragma: no cover - tool guidance only
    sys.exit(f"error: {err}; run this with the reference venv's python (see the docstring)")

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIR = REPO_ROOT / "gpu-runner" / "tests" / "fixtures"

# llama-cpp-python pins llama.cpp as a git submodule; the sdist carries no
# usable build-info, so we record the commit its CHANGELOG/submodule names.
LLAMA_CPP_COMMITS = {"0.3.36": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}

N_CTX = 2048
N_THREADS = 2
SEED = 1234
GREEDY_STEPS = 32
TOP_FIRST = 20
TOP_STEP = 5
# Tokens re-evaluated per greedy step; wide enough that llama.cpp picks its
# batched (matrix-matrix) kernels rather than the single-token ones.
REEVAL_WINDOW = 16
DECIMALS = 5

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Two references per model. llama.cpp multiplies quantized weights with
# activations it quantizes to 8 bits (Q8_1/Q8_K), and its single-token and
# batched kernels round differently: on SmolLM2 Q4_1 the two paths disagree by
# up to ~1.5 logits, and both sit up to ~2.3 logits from exact f32 math on the
# same weights. So besides "what llama.cpp computes" we also record "what the
# quantized weights compute exactly": the same GGUF dequantized to F32 by
# llama_model_quantize (lossless: every weight keeps its dequantized value),
# run with an f32 KV cache; its batched and single-token paths agree to ~3e-5.
VARIANTS = {
    "quantized": {"suffix": "", "weights": "as stored in the GGUF", "kv": "f16"},
    "f32": {
        "suffix": "_f32",
        "weights": "dequantized to F32 from the GGUF via llama_model_quantize(ftype=ALL_F32, allow_requantize, pure)",
        "kv": "f32",
    },
}

MODELS = {
    "smollm2": {
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    "gemma3": {
        "file": "gemma-3-270m-Q4_K_M.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
}

# Chosen to hit the tokenizer's sharp edges: byte fallback, pre-tokenizer
# splits on digits/whitespace/punctuation, special tokens embedded in text
# (both ChatML and Gemma markers, so each model sees the other's as plain
# text), and the empty string.
TOKENIZE_CORPUS = [
    "",
    "Hello",
    "Hello, world!",
    " Hello",
    "  Hello  world  ",
    "hello\n\nworld\n",
    "   ",
    "\n",
    "\t",
    "trailing space ",
    "multiple     spaces   between",
    "12345 3.14159 1,000,000",
    "0 1 22 333 4444 55555 666666",
    "-42 +7 1e-9 0xFF 3/4 50%",
    "The quick brown fox jumps over the lazy dog.",
    "I'm can't won't they'll we've she'd",
    "ALL CAPS and MiXeD cAsE",
    "naïve café résumé über straße",
    "Привет, мир!",
    "Γειά σου Κόσμε",
    "こんにちは世界",
    "你好，世界！今天天气很好。",
    "안녕하세요 세계",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧‍👦 family",
    "🦀 Rust 🐍 Python",
    "math: ∑ ∫ √ ∞ ≠ ≤ → λ",
    "def add(a, b):\n\treturn a + b\n",
    "fn main() {\n    println!(\"hi\");\n}\n",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    '{"key": [1, 2.5, null], "ok": true}',
    "https://example.com/path?q=1&r=two#frag",
    "user@example.com",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos",
    "<|endoftext|>",
    "text <|im_end|> more <eos> end",
    "Mixed: 中文 English 123 😀 <|im_end|>\ttab",
    "\u200bzero\u00a0width\u200dand nbsp",
    "a" * 64,
]

# add_bos=True for a subset is enough to pin down the BOS/EOS policy.
ADD_BOS_CASES = ["", "Hello", "Hello, world!", "こんにちは世界", "<|im_start|>user\nhi<|im_end|>"]

# Strings whose per-id byte pieces we record (multi-byte UTF-8 split across
# tokens is exactly what an incremental detokenizer must get right).
PIECE_CASES = [
    "Hello, world!",
    "  Hello  world  ",
    "naïve café",
    "こんにちは世界",
    "emoji 😀🎉👍🏽",
    "مرحبا",
    "def f():\n\treturn 1\n",
    "<|im_start|>user\nhi<|im_end|>",
    "<start_of_turn>model\nok<end_of_turn>",
]

# Plain completions without a chat template: the Gemma 3 270M GGUF is the
# base (pretrained) model with no chat template, so only these give it text
# it continues sensibly. Tokenized with add_bos=True (the model's BOS policy).
RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a short poem about the ocean."}],
    [{"role": "user", "content": "Explain what a hash map is in one paragraph."}],
    [
        {"role": "system", "content": "You are a pirate. Always answer like a pirate."},
        {"role": "user", "content": "How do I make a cup of tea?"},
    ],
    [{"role": "user", "content": "List three prime numbers greater than 100 and explain why they are prime."}],
    [
        {"role": "user", "content": "Hi! My name is Ada."},
        {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
        {"role": "user", "content": "What is my name, and what is 17 * 3?"},
    ],
    [{"role": "user", "content": "Translate 'good morning' into Japanese, French and Arabic."}],
]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rnd(x: float) -> float:
    return round(float(x), DECIMALS)


def generator_info(llm: "llama_cpp.Llama", variant: str = "quantized") -> dict:
    version = getattr(llama_cpp, "__version__", "unknown")
    info = llama_cpp.llama_print_system_info()
    return {
        "tool": "scripts/make_fixtures.py",
        "llama_cpp_python": version,
        "llama_cpp_commit": LLAMA_CPP_COMMITS.get(version, "unknown"),
        "backend": "cpu",
        "system_info": info.decode("utf-8", "replace").strip() if isinstance(info, bytes) else str(info),
        "machine": platform.machine(),
        "n_ctx": N_CTX,
        "n_threads": N_THREADS,
        "n_batch": llm.n_batch,
        "seed": SEED,
        "weights": VARIANTS[variant]["weights"],
        "kv_cache_type": VARIANTS[variant]["kv"],
        "flash_attn": False,
        "logits_all": True,
        "greedy_path": "argmax of batched (prompt + path so far) evaluation, so every step's top-1 is its token",
    }


def model_header(name: str, llm: "llama_cpp.Llama") -> dict:
    """Identifies the source GGUF (main() verified its hash), also for the f32 variant."""
    meta = llm.metadata
    return {
        "model": name,
        "model_file": MODELS[name]["file"],
        "model_sha256": MODELS[name]["sha256"],
        "n_vocab": llm.n_vocab(),
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "add_bos_token": meta.get("tokenizer.ggml.add_bos_token"),
        "add_eos_token": meta.get("tokenizer.ggml.add_eos_token"),
        "tokenizer_model": meta.get("tokenizer.ggml.model"),
        "tokenizer_pre": meta.get("tokenizer.ggml.pre"),
    }


def load(path: Path, kv_f32: bool = False) -> "llama_cpp.Llama":
    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if kv_f32 else {}
    return llama_cpp.Llama(
        model_path=str(path),
        **kv,
        n_ctx=N_CTX,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        seed=SEED,
        logits_all=True,
        flash_attn=False,
        n_gpu_layers=0,
        verbose=False,
    )


def token_piece(llm: "llama_cpp.Llama", token: int, special: bool) -> bytes:
    """Raw llama_token_to_piece (lstrip=0), unlike Llama.detokenize which
    drops a leading space after BOS."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    size = 256
    buf = (ctypes.c_char * size)()
    n = llama_cpp.llama_token_to_piece(vocab, llama_cpp.llama_token(token), buf, size, 0, special)
    if n < 0:
        raise RuntimeError(f"piece of token {token} is longer than {size} bytes")
    return bytes(buf[:n])


def tokenize_fixture(name: str, llm: "llama_cpp.Llama") -> dict:
    cases = []
    for text in TOKENIZE_CORPUS:
        cases.append({"text": text, "add_bos": False, "ids": llm.tokenize(text.encode(), add_bos=False, special=True)})
    for text in ADD_BOS_CASES:
        cases.append({"text": text, "add_bos": True, "ids": llm.tokenize(text.encode(), add_bos=True, special=True)})
    pieces = []
    for text in PIECE_CASES:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        pieces.append(
            {
                "text": text,
                "ids": ids,
                "pieces": [list(token_piece(llm, t, special=False)) for t in ids],
                "pieces_special": [list(token_piece(llm, t, special=True)) for t in ids],
            }
        )
    return {
        **model_header(name, llm),
        "generator": generator_info(llm),
        "tokenize_call": "tokenize(text.encode('utf-8'), add_bos=<add_bos>, special=True)",
        "cases": cases,
        "pieces": pieces,
    }


def jinja_render(template: str, messages: list, bos: str, eos: str) -> str | None:
    """Renders the GGUF chat template the way HF transformers does; None if
    jinja2 is unavailable so we fall back to the hand-written format."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, bos_token=bos, eos_token=eos, add_generation_prompt=True
    )


def manual_prompt(name: str, messages: list) -> str:
    """The documented prompt format, used to cross-check the template."""
    if name == "smollm2":
        msgs = messages
        if msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": SMOLLM2_DEFAULT_SYSTEM}] + msgs
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
        return body + "<|im_start|>assistant\n"
    # Gemma 3 has no system role: the template folds it into the first user turn.
    out = "<bos>"
    pending_system = ""
    for m in messages:
        if m["role"] == "system":
            pending_system = m["content"] + "\n\n"
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out += f"<start_of_turn>{role}\n{pending_system}{m['content']}<end_of_turn>\n"
        pending_system = ""
    return out + "<start_of_turn>model\n"


def render_prompt(name: str, llm: "llama_cpp.Llama", messages: list) -> tuple[str, str]:
    manual = manual_prompt(name, messages)
    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        return manual, "manual"
    bos = token_piece(llm, llm.token_bos(), special=True).decode("utf-8")
    eos = token_piece(llm, llm.token_eos(), special=True).decode("utf-8")
    rendered = jinja_render(template, messages, bos, eos)
    if rendered is None:
        return manual, "manual"
    if rendered != manual:
        print(f"warning: template render differs from manual format:\n{rendered!r}\n{manual!r}", file=sys.stderr)
    return rendered, "gguf_chat_template"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    # Stable sort on -logit so ties break toward the lower id, deterministically.
    return np.argsort(-logits.astype(np.float64), kind="stable")[:k]


def greedy_batched(llm: "llama_cpp.Llama", prompt_ids: list) -> list:
    """Greedy path under batched evaluation: each step rewinds the last
    REEVAL_WINDOW tokens out of the KV cache and re-evaluates them as one
    batch, so the new token's logits come from the batched kernels. Those rows
    do not depend on the batch's length, so the final teacher-forced pass
    reproduces these argmaxes (chat_case checks it) and the fixture is
    self-consistent, unlike a one-token-per-call decode whose kernel flips
    near-ties."""
    llm.reset()
    llm.eval(prompt_ids)
    path: list = []
    for _ in range(GREEDY_STEPS):
        path.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        seq = prompt_ids + path
        keep = max(0, len(seq) - REEVAL_WINDOW)
        llm.n_tokens = keep  # Llama.eval drops KV entries from n_tokens on
        llm.eval(seq[keep:])
    return path


def incremental_rows(llm: "llama_cpp.Llama", prompt_ids: list, path: list) -> np.ndarray:
    """Logits of the same path fed one token per decode call, like a server
    decodes; only used to report how far llama.cpp's two kernels disagree."""
    llm.reset()
    llm.eval(prompt_ids)
    for tok in path[:-1]:
        llm.eval([tok])
    n = len(prompt_ids)
    return np.array(llm.scores[n - 1 : n - 1 + len(path)], dtype=np.float32)


def step_record(row: np.ndarray, tok: int) -> dict:
    lp = log_softmax(row)
    order = top_k(row, TOP_STEP)
    return {
        "token": tok,
        "logit": rnd(row[tok]),
        "logprob": rnd(lp[tok]),
        "gap": rnd(row[order[0]] - row[order[1]]),
        "top": [[int(j), rnd(lp[j])] for j in order],
    }


def chat_case(name: str, llm: "llama_cpp.Llama", messages: list) -> dict:
    prompt, source = render_prompt(name, llm, messages)
    # The rendered prompt already carries any BOS as text (Gemma's "<bos>").
    prompt_ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    return prompt_case(llm, messages, prompt, source, prompt_ids)


def raw_case(llm: "llama_cpp.Llama", text: str) -> dict:
    prompt_ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    return prompt_case(llm, None, text, "raw_add_bos", prompt_ids)


def prompt_case(llm: "llama_cpp.Llama", messages: list | None, prompt: str, source: str, prompt_ids: list) -> dict:
    path = greedy_batched(llm, prompt_ids)
    inc = incremental_rows(llm, prompt_ids, path)

    # Teacher forcing: one batched evaluation of prompt + greedy path.
    llm.reset()
    llm.eval(prompt_ids + path)
    n = len(prompt_ids)
    rows = np.array(llm.scores[n - 1 : n - 1 + len(path)], dtype=np.float32)
    mismatched = [i for i, tok in enumerate(path) if int(np.argmax(rows[i])) != tok]
    if mismatched:
        raise RuntimeError(f"teacher-forced argmax differs from the greedy path at steps {mismatched}")

    first_lp = log_softmax(rows[0])
    top_first = [
        {"id": int(i), "logit": rnd(rows[0][i]), "logprob": rnd(first_lp[i])} for i in top_k(rows[0], TOP_FIRST)
    ]
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eog = [i for i, t in enumerate(path) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    return {
        "messages": messages,
        "prompt": prompt,
        "prompt_source": source,
        "prompt_ids": prompt_ids,
        "top_first": top_first,
        "greedy_ids": path,
        "greedy_text": llm.detokenize(path, special=True).decode("utf-8", "replace"),
        "first_eog_step": eog[0] if eog else None,
        "steps": [step_record(rows[i], tok) for i, tok in enumerate(path)],
        "incremental_max_abs_logit_diff": rnd(np.abs(inc - rows).max()),
        "incremental_argmax_mismatch_steps": [i for i, tok in enumerate(path) if int(np.argmax(inc[i])) != tok],
    }


def logits_fixture(name: str, llm: "llama_cpp.Llama", variant: str) -> dict:
    return {
        **model_header(name, llm),
        "variant": variant,
        "generator": generator_info(llm, variant),
        "greedy_steps": GREEDY_STEPS,
        "cases": [chat_case(name, llm, msgs) for msgs in CHATS] + [raw_case(llm, t) for t in RAW_PROMPTS],
    }


def dequantize_to_f32(src: Path, dst: Path) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = N_THREADS
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.pure = True
    params.quantize_output_tensor = True
    params.output_tensor_type = llama_cpp.GGML_TYPE_F32
    params.token_embedding_type = llama_cpp.GGML_TYPE_F32
    # llama_model_quantize logs every tensor to stderr; keep the tool's output readable.
    with suppress_stdout_stderr():
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to F32 failed with {rc}")


def write_json(path: Path, data: dict) -> None:
    text = json.dumps(data, ensure_ascii=False, indent=1)
    path.write_text(text + "\n", encoding="utf-8")
    size = path.stat().st_size
    print(f"wrote {path} ({size} bytes)")
    if size > 1_000_000:
        sys.exit(f"error: {path} is {size} bytes; fixtures must stay under 1 MB")


def logits_path(args: argparse.Namespace, variant: str) -> Path:
    return args.out / f"{args.model}_logits{VARIANTS[variant]['suffix']}.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--model-path", type=Path, help="GGUF file (default: <repo>/models/<file>)")
    parser.add_argument("--out", type=Path, default=FIXTURE_DIR)
    parser.add_argument(
        "--only",
        choices=["quantized", "f32"],
        help="write only <model>_tokenize.json + <model>_logits.json (quantized) or only <model>_logits_f32.json",
    )
    args = parser.parse_args()

    spec = MODELS[args.model]
    path = args.model_path or REPO_ROOT / "models" / spec["file"]
    if not path.is_file():
        sys.exit(f"error: {path} not found; run scripts/fetch-models.sh{' --gemma' if args.model == 'gemma3' else ''}")
    actual = sha256_file(path)
    if actual != spec["sha256"]:
        sys.exit(f"error: {path} has sha256 {actual}, expected {spec['sha256']}")

    args.out.mkdir(parents=True, exist_ok=True)
    if args.only != "f32":
        llm = load(path)
        write_json(args.out / f"{args.model}_tokenize.json", tokenize_fixture(args.model, llm))
        write_json(logits_path(args, "quantized"), logits_fixture(args.model, llm, "quantized"))
        llm.close()
    if args.only == "quantized":
        return
    with tempfile.TemporaryDirectory() as tmp:
        f32_path = Path(tmp) / f"{args.model}-f32.gguf"
        dequantize_to_f32(path, f32_path)
        llm = load(f32_path, kv_f32=True)
        write_json(logits_path(args, "f32"), logits_fixture(args.model, llm, "f32"))
        llm.close()


if __name__ == "__main__":
    main()
