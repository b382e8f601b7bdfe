#!/usr/bin/env python3
"""The llama.cpp half of `bench/compare_llamacpp.sh`.

Drives llama.cpp through llama-cpp-python's low-level C API, so that each figure is measured
the way `fallow bench engine` measures ours: the same synthetic prompt token ids, greedy
sampling on the host, `ignore_eos` (the step loop never stops early), and one `llama_decode`
per engine step. The high-level `Llama` class is not used because it cannot batch several
sequences and it hides how many tokens were really generated.

Prints one line `RESULT <key>=<value> ...` that the shell script parses.
"""

import argparse
import ctypes
import sys
import time

import llama_cpp as L
import numpy as np


def prompt_ids(n_tokens: int, seq: int, vocab: int) -> list[int]:
    # The same distinct synthetic prompts as `fallow bench engine` (src/commands/bench.rs).
    return [(t * 7919 + seq * 104_729 + 13) % vocab for t in range(n_tokens)]


class Peer:
    """One llama.cpp model and context, with a reusable batch."""

    def __init__(self, model_path: str, threads: int, n_ctx: int, n_batch: int, n_seq: int):
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            sys.exit(f"llama.cpp could not load {model_path}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            sys.exit("llama.cpp could not create a context")
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(n_batch, 0, n_seq)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """Decodes (token, pos, seq, wants_logits) entries in one `llama_decode` call."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if logits else 0
        b.n_tokens = len(entries)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            sys.exit(f"llama_decode failed with {rc}")

    def argmax(self, batch_index: int) -> int:
        # `llama_get_logits_ith` takes the entry's index in the batch, not in the outputs.
        ptr = L.llama_get_logits_ith(self.ctx, batch_index)
        return int(np.ctypeslib.as_array(ptr, shape=(self.vocab,)).argmax())


def run_streams(peer: Peer, streams: int, prompt_tokens: int, gen_tokens: int) -> dict:
    """Prefills `streams` sequences in one batch, then decodes them together greedily.

    Each step decodes one token per sequence in a single `llama_decode`, which is what
    llama-server does with `-np streams` when all slots are busy.
    """
    entries = []
    for s in range(streams):
        ids = prompt_ids(prompt_tokens, s, peer.vocab)
        for p, tok in enumerate(ids):
            entries.append((tok, p, s, p == prompt_tokens - 1))
    started = time.perf_counter()
    peer.decode(entries)
    last = [peer.argmax(s * prompt_tokens + prompt_tokens - 1) for s in range(streams)]
    prefill_done = time.perf_counter()
    generated = streams
    for step in range(1, gen_tokens):
        pos = prompt_tokens + step - 1
        peer.decode([(last[s], pos, s, True) for s in range(streams)])
        last = [peer.argmax(s) for s in range(streams)]
        generated += streams
    finished = time.perf_counter()
    total = finished - started
    prefill = prefill_done - started
    return {
        "prefill_tps": streams * prompt_tokens / prefill,
        "decode_tps": (generated - streams) / max(finished - prefill_done, 1e-9),
        "aggregate_tps": generated / total,
        "generated": generated,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=128)
    args = ap.parse_args()

    per_seq = args.prompt_tokens + args.gen_tokens + 16
    n_ctx = max(512, args.concurrency * per_seq)
    n_batch = max(512, args.concurrency * args.prompt_tokens)
    peer = Peer(args.model, args.threads, n_ctx, n_batch, args.concurrency)
    # One short warm-up so first-touch page faults of the mapped weights are not timed.
    peer.decode([(t, p, 0, p == 7) for p, t in enumerate(prompt_ids(8, 999, peer.vocab))])
    L.llama_memory_clear(L.llama_get_memory(peer.ctx), True)

    r = run_streams(peer, args.concurrency, args.prompt_tokens, args.gen_tokens)
    expected = args.concurrency * args.gen_tokens
    if r["generated"] != expected:
        sys.exit(f"generated {r['generated']} tokens, expected {expected}")
    print(
        "RESULT "
        + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
    )
    L.llama_batch_free(peer.batch)
    L.llama_free(peer.ctx)
    L.llama_model_free(peer.model)


if __name__ == "__main__":
    main()
