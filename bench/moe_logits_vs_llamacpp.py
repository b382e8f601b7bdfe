#!/usr/bin/env python3
"""Fallow's next-token distribution on a large MoE GGUF against llama.cpp's, through the
whole stack: a `fallow dev` on loopback (fresh database) serves the file, and
llama-cpp-python evaluates the same prompts. A benchmark-time check for the files of
`bench/make_random_moe_gguf.py`, which are too big to commit as fixtures.

    python bench/moe_logits_vs_llamacpp.py --model OUTDIR/moe-1b.q8_0.gguf [--prompts 8]

Needs Postgres and Redis as `./infra/dev.sh` runs them, `target/release/fallow`, and a Python
with llama-cpp-python 0.3.36 and httpx. For each prompt (synthetic token ids, as
`fallow bench engine` makes them) it compares the first generated position: the top-1
token, and each of Fallow's top-5 log-probabilities against llama.cpp's for that token,
within `--tolerance` (0.5, as `llama_cpp_conformance.rs` allows the quantized dense models).
Exits 1 when a prompt disagrees beyond a near tie.
"""

import argparse
import math
import os
import socket
import subprocess
import sys
import time
import uuid

import httpx
import llama_cpp
import numpy as np

PG = os.environ.get("FALLOW_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("FALLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/")


def prompt_ids(n_tokens, seq, vocab):
    # The same synthetic prompts as `fallow bench engine` and bench/llamacpp_bench.py.
    return [(t * 7919 + seq * 104_729 + 13) % vocab for t in range(n_tokens)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(fallow, model, name):
    db = f"fallow_moe_check_{uuid.uuid4().hex[:10]}"
    subprocess.run(["psql", PG, "-qc", f'CREATE DATABASE "{db}"'], check=True)
    port = free_port()
    url = f"{PG.rsplit('/', 1)[0]}/{db}"
    proc = subprocess.Popen(
        [fallow, "dev", "--listen", f"127.0.0.1:{port}", "--database-url", url, "--redis-url",
         REDIS, "--model", f"{name}={model}", "--no-auth"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/v1/models", timeout=2).json().get("data"):
                return proc, base, db
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit("fallow did not become ready")


def llama_logprobs(llm, ids):
    """llama.cpp's log-probabilities of every token after `ids`."""
    llm.reset()
    llm.eval(ids)
    row = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
    return row - (row.max() + math.log(np.exp(row - row.max()).sum()))


def pieces(llm):
    """Token text → ids (several ids may share a text), as Fallow names tokens."""
    by_text = {}
    for i in range(llm.n_vocab()):
        by_text.setdefault(llm.detokenize([i]).decode("utf-8", "replace"), []).append(i)
    return by_text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--fallow", default="target/release/fallow")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--tolerance", type=float, default=0.5)
    args = ap.parse_args()

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=256, n_threads=2, logits_all=True,
                          verbose=False)
    vocab = llm.n_vocab()
    by_text = pieces(llm)
    proc, base, db = serve(args.fallow, args.model, "moe")
    failures, worst = 0, 0.0
    try:
        for p in range(args.prompts):
            ids = prompt_ids(args.prompt_tokens, p, vocab)
            logp = llama_logprobs(llm, ids)
            order = np.argsort(-logp)
            gap = logp[order[0]] - logp[order[1]]
            r = httpx.post(f"{base}/v1/completions", timeout=300, json={
                "model": "moe", "prompt": ids, "max_tokens": 1, "temperature": 0,
                "logprobs": 5})
            r.raise_for_status()
            got = r.json()["choices"][0]["logprobs"]["top_logprobs"][0]
            # Each of Fallow's top 5 against llama.cpp's log-probability of that token.
            diffs = [min(abs(lp - logp[i]) for i in by_text.get(t, [])) if t in by_text
                     else float("inf") for t, lp in got.items()]
            worst = max([worst, *diffs])
            top1 = max(got, key=got.get)
            same_top = int(order[0]) in by_text.get(top1, [])
            ok = (same_top or gap < args.tolerance) and max(diffs) <= args.tolerance
            failures += not ok
            print(f"prompt {p}: top-1 {top1!r}, llama.cpp's {'same' if same_top else 'differs'} "
                  f"(gap {gap:.3f}), max |Δ logprob| over Fallow's top 5 {max(diffs):.4f}"
                  f"{'' if ok else '  DISAGREES'}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["psql", PG, "-qc", f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'])
    print(f"worst |Δ logprob| {worst:.4f}; {failures} of {args.prompts} prompts disagree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
