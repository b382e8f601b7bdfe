#!/usr/bin/env python3
"""Hugging Face transformers generate() throughput, the baseline for `fallow bench engine`.

    python3 gpu-runner/scripts/hf_bench.py MODELDIR --batches 1,8,64 --prompt-tokens 32 --gen-tokens 128

Loads MODELDIR with AutoModelForCausalLM (bf16, CUDA, sdpa attention). Per batch size B:
random prompt ids (B x prompt_tokens), one short warm-up generate, then
- a timed generate of 1 token (≈ the prefill, what the first token costs), and
- a timed greedy generate of exactly gen_tokens new tokens (min_new_tokens = max_new_tokens),
and prints one parsable line:

    hf batch=B decode_tok_s=X total_s=Y prefill_s=P decode_only_tok_s=Z

decode_tok_s = B * gen_tokens / total_s INCLUDES the prefill (as Fallow's "aggregate tok/s");
decode_only_tok_s = B * (gen_tokens - 1) / (total_s - prefill_s) leaves it out (as Fallow's
"decode tok/s", which counts the tokens after each sequence's first over the time after
every first token).
"""

import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b.strip()]

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    print(f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    t0 = time.time()
    kwargs = {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}
    try:
        # Straight onto the GPU (needs accelerate in some transformers versions).
        model = AutoModelForCausalLM.from_pretrained(args.model, device_map="cuda", **kwargs)
    except Exception as e:
        print(f"device_map='cuda' failed ({type(e).__name__}: {e}); loading on the CPU first", flush=True)
        model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs).to("cuda")
    model.eval()
    torch.cuda.synchronize()
    print(f"loaded {args.model} in {time.time() - t0:.1f} s", flush=True)

    vocab = model.config.vocab_size
    eos = model.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos
    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def generate(ids, new_tokens):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        assert out.shape == (ids.shape[0], ids.shape[1] + new_tokens), out.shape
        return dt

    status = 0
    for b in batches:
        try:
            ids = torch.randint(0, vocab, (b, args.prompt_tokens), generator=gen).to("cuda")
            generate(ids, 4)  # warm-up: kernels, allocator, cuBLAS handles
            prefill = generate(ids, 1)
            total = generate(ids, args.gen_tokens)
        except Exception as e:  # one batch size failing (e.g. OOM) must not hide the others
            print(f"hf batch={b} error={type(e).__name__}: {e}", flush=True)
            status = 1
            torch.cuda.empty_cache()
            continue
        decode_only = b * (args.gen_tokens - 1) / max(total - prefill, 1e-9)
        print(
            f"hf batch={b} decode_tok_s={b * args.gen_tokens / total:.1f} total_s={total:.3f} "
            f"prefill_s={prefill:.4f} decode_only_tok_s={decode_only:.1f}",
            flush=True,
        )
    print(f"(decode_tok_s includes the prefill of {args.prompt_tokens} prompt tokens per sequence)")
    return status


if __name__ == "__main__":
    sys.exit(main())
